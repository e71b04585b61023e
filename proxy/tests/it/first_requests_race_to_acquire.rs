//! Goal: the first requests for a new stream, arriving together at one proxy, acquire it once:
//! a read that finds no stream (NO_SUCH_STREAM) must not make a concurrent write that creates
//! the stream fail with a redirect to this same proxy. Found in CI by
//! `cluster_stopped_bookie_ack_gap` (a reader started before the writer's first record, and a
//! write got "the owner is an earlier session of this same proxy").
//! Method: real bookies, one stream manager over the embedded store with a 2 ms delay on
//! stream reads (a ZooKeeper round trip; without it the failed read's acquisition is over
//! before a write can wait on it); per round a fresh stream name, one read that starts first
//! and then writes with `create_if_missing`, all concurrent. Every write must
//! succeed; the read may only fail with `NoSuchStream`.
//! The mechanism: a failed acquisition dropped the stream's slot from the manager's table
//! while another request was already initialising that same slot, so the next request
//! started a second acquisition, which found the first one's lease and reported it as another
//! owner.

use crate::common;

use std::time::Duration;

use quire_client::ReadPosition;
use quire_proxy::Error;

const ROUNDS: u32 = 30;
const WRITES: u64 = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_read_does_not_split_a_concurrent_acquisition() {
    let (c, store) = common::cluster_revocable().await;
    *store.read_stream_delay.lock().unwrap() = Duration::from_millis(2);
    let p = common::proxy(&c, common::small_config()).await;
    let streams = p.streams.clone();
    for round in 0..ROUNDS {
        let name = format!("race-{round}");
        let reader = {
            let (s, name) = (streams.clone(), name.clone());
            tokio::spawn(async move {
                s.read(&name, ReadPosition::Head, 10, 1 << 20, Duration::ZERO)
                    .await
            })
        };
        let mut writes = Vec::new();
        for i in 0..WRITES {
            let (s, name) = (streams.clone(), name.clone());
            writes.push(tokio::spawn(async move {
                // Spread over the reader's acquisition attempt and the writers' one.
                tokio::time::sleep(Duration::from_micros(i * 400)).await;
                // One txid for all: concurrent appends reach the stream in any order.
                s.append(&name, vec![(1, common::payload(i))], true).await
            }));
        }
        match reader.await.unwrap() {
            Ok(_) | Err(Error::NoSuchStream { .. }) => {}
            Err(e) => panic!("round {round}: the read failed with {e}"),
        }
        for (i, w) in writes.into_iter().enumerate() {
            if let Err(e) = w.await.unwrap() {
                panic!("round {round}: write {i} failed: {e}");
            }
        }
    }
    p.streams.shutdown().await.unwrap();
}

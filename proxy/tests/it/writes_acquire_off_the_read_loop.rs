//! Goal: a write whose stream must first be acquired (metadata read, lease, recovery: hundreds
//! of ms to seconds under load) does not hold back its connection: later frames on the same
//! connection, for streams owned here or being acquired, are read and served meanwhile, while
//! the writes to one stream still reach it, and are answered, in frame order
//! (docs/proxy-protocol.md, "Write"); a drain still answers every write it read.
//! Method: three real bookies, the embedded metadata store wrapped so that a test can hold the
//! reads of chosen stream records at a gate (`Revocable::hold`/`open`): an acquisition of such a
//! stream stops at its first step, counted in `acquisitions_under_way`, until the test opens
//! the gate. Raw TCP connections send pipelined write frames and read the answers.

use crate::common;

use std::time::Duration;

use common::raw::{frame, Raw, BOUND};
use common::revocable::Revocable;
use quire_client::protocol::{Request, Response};
use quire_client::{Dlsn, ProxyClient};
use quire_proxy::{Error, ErrorCode, StreamManager};

/// A write frame of one record (txid `txid`, payload `common::payload(txid)`) to `stream`,
/// creating it if missing.
fn write(request_id: u64, stream: &str, txid: u64) -> Vec<u8> {
    frame(
        request_id,
        &Request::Write {
            stream: stream.into(),
            create_if_missing: true,
            compress: false,
            records: vec![(txid, common::payload(txid))],
        },
    )
}

/// The DLSN of a successful one-record write's answer; panics on any other answer.
fn written(answer: &(u64, Response)) -> Dlsn {
    match answer {
        (
            _,
            Response::Write {
                count: 1,
                first_dlsn,
                last_dlsn,
            },
        ) => {
            assert_eq!(first_dlsn, last_dlsn);
            *first_dlsn
        }
        other => panic!("expected a one-record write answer, got {other:?}"),
    }
}

/// Waits, polling within [`BOUND`], until `streams` has `n` acquisitions under way.
async fn wait_acquiring(streams: &StreamManager, n: i64) {
    let deadline = tokio::time::Instant::now() + BOUND;
    while streams.acquisitions_under_way() != n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} acquisitions under way after {BOUND:?}, expected {n}",
            streams.acquisitions_under_way()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A proxy over a gated store, with `owned` acquired (one write to it answered on `s`, request
/// id 2, txid 1).
async fn setup(
    owned: &str,
) -> (
    common::Cluster,
    std::sync::Arc<Revocable>,
    common::Proxy,
    Raw,
) {
    let (c, store) = common::cluster_revocable().await;
    let p = common::proxy_on(c.store.clone(), common::small_config()).await;
    let mut s = Raw::greeted(p.server.local_addr()).await;
    s.send(&write(2, owned, 1)).await.unwrap();
    let first = s.next().await.expect("the first write is answered");
    assert_eq!(first.0, 2);
    written(&first);
    assert!(p.streams.is_owned_here(owned));
    (c, store, p, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_waiting_for_its_stream_does_not_hold_back_the_connection() {
    // Method: hold the acquisition of "slow"; on one connection send a write to "slow", then
    // ten writes to the owned stream. The ten must be answered, in order, while "slow" is
    // still being acquired (a frame loop that submits "slow" inline reads none of them until
    // the gate opens, and the wait for their answers runs out); then open the gate: the write
    // to "slow" is answered too, and every record reads back.
    let (_c, store, p, mut s) = setup("owned").await;
    store.hold("slow");
    let mut frames = write(3, "slow", 1);
    for i in 0..10 {
        frames.extend(write(4 + i, "owned", 2 + i));
    }
    s.send(&frames).await.unwrap();
    let mut last = None;
    for i in 0..10 {
        let answer = s.next_within(BOUND).await.unwrap_or_else(|_| {
            panic!("write {i} to an owned stream not answered within {BOUND:?} while another stream's acquisition is held: the acquisition holds the connection's frame loop")
        });
        let answer = answer.expect("the proxy closed the connection");
        assert_eq!(answer.0, 4 + i, "the owned stream's answers in frame order");
        let dlsn = written(&answer);
        assert!(last.is_none_or(|l| l < dlsn));
        last = Some(dlsn);
    }
    assert_eq!(
        p.streams.acquisitions_under_way(),
        1,
        "the write to \"slow\" is still acquiring its stream"
    );
    assert!(!p.streams.is_owned_here("slow"));
    store.open("slow");
    let answer = s.next().await.expect("the proxy closed the connection");
    assert_eq!(answer.0, 3);
    written(&answer);

    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    common::assert_reads_back(
        &common::read_all(&client, "slow").await,
        &common::batch(1, 1),
    );
    common::assert_reads_back(
        &common::read_all(&client, "owned").await,
        &common::batch(1, 11),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pipelined_writes_to_a_stream_being_acquired_keep_frame_order() {
    // Method: hold the acquisition of "fresh"; send 300 write frames at once: 200 to "fresh"
    // (txids 1..=200) interleaved with 100 to the owned stream. The owned stream's 100
    // answers come while "fresh" is held (so every frame has been read, and the writes to
    // "fresh" wait in order behind the first). Open the gate and at once send 50 more writes
    // to "fresh" (some may find it owned and take the inline path, behind those still
    // waiting). All 250 answers to "fresh" must come in frame order with growing DLSNs, and
    // the stream must read back as txids 1..=250 in that order.
    let (_c, store, p, mut s) = setup("owned").await;
    store.hold("fresh");
    let mut frames = Vec::new();
    let mut fresh_ids = Vec::new();
    let (mut fresh_txid, mut owned_txid) = (0, 1);
    for i in 0..300u64 {
        let id = 3 + i;
        if i % 3 == 2 {
            owned_txid += 1;
            frames.extend(write(id, "owned", owned_txid));
        } else {
            fresh_txid += 1;
            frames.extend(write(id, "fresh", fresh_txid));
            fresh_ids.push(id);
        }
    }
    s.send(&frames).await.unwrap();
    let owned = s.take(100).await;
    for (k, answer) in owned.iter().enumerate() {
        assert_eq!(
            answer.0,
            3 + 3 * k as u64 + 2,
            "only the owned stream is answered"
        );
        written(answer);
    }
    assert_eq!(p.streams.acquisitions_under_way(), 1);

    store.open("fresh");
    let mut more = Vec::new();
    for i in 0..50u64 {
        let id = 1000 + i;
        fresh_txid += 1;
        more.extend(write(id, "fresh", fresh_txid));
        fresh_ids.push(id);
    }
    s.send(&more).await.unwrap();
    let answers = s.take(fresh_ids.len()).await;
    let ids: Vec<u64> = answers.iter().map(|a| a.0).collect();
    assert_eq!(ids, fresh_ids, "answers to \"fresh\" in frame order");
    let dlsns: Vec<Dlsn> = answers.iter().map(written).collect();
    assert!(
        dlsns.windows(2).all(|w| w[0] < w[1]),
        "DLSNs grow in frame order"
    );

    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    let got = common::read_all(&client, "fresh").await;
    common::assert_reads_back(&got, &common::batch(1, 250));
    let at: Vec<Dlsn> = got.iter().map(|r| r.0).collect();
    assert_eq!(at, dlsns, "each record where its answer said");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_to_several_streams_being_acquired_acquire_at_once() {
    // Method: hold the acquisitions of eight streams and send one write to each on one
    // connection. All eight acquisitions must be under way at once (a frame loop that
    // submits each write inline has one under way at most); open the gates: all are answered.
    let (_c, store, p, mut s) = setup("owned").await;
    let names: Vec<String> = (0..8).map(|i| format!("many-{i}")).collect();
    let mut frames = Vec::new();
    for (i, name) in names.iter().enumerate() {
        store.hold(name);
        frames.extend(write(3 + i as u64, name, 1));
    }
    s.send(&frames).await.unwrap();
    wait_acquiring(&p.streams, 8).await;
    for name in &names {
        store.open(name);
    }
    let mut answers = s.take(8).await;
    answers.sort_by_key(|a| a.0);
    for (i, answer) in answers.iter().enumerate() {
        assert_eq!(answer.0, 3 + i as u64);
        written(answer);
    }
    assert_eq!(p.streams.owned_stream_count(), 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_answers_writes_still_being_submitted() {
    // Method: hold the acquisition of "late"; on one connection send three writes to "late"
    // around one to the owned stream, and wait for the owned stream's answer (every frame has
    // been read). Drain the proxy; once its stream manager refuses new work, open the gate.
    // The connection must answer every write, the three to "late" in frame order (each
    // written, or refused with a code that says it was not written: SERVICE_UNAVAILABLE or a
    // redirect), then end with the drain's connection-level SERVICE_UNAVAILABLE (request id 0)
    // and close. A proxy started afterwards reads back every acknowledged record.
    let (c, store, p, mut s) = setup("kept").await;
    store.hold("late");
    let mut frames = write(3, "late", 1);
    frames.extend(write(4, "late", 2));
    frames.extend(write(5, "kept", 2));
    frames.extend(write(6, "late", 3));
    s.send(&frames).await.unwrap();
    let kept = s.next().await.expect("the proxy closed the connection");
    assert_eq!(kept.0, 5);
    written(&kept);
    assert_eq!(p.streams.acquisitions_under_way(), 1);

    let common::Proxy { streams, server } = p;
    let drain = {
        let streams = streams.clone();
        tokio::spawn(async move {
            let r = server.drain(&streams).await;
            drop(server);
            r
        })
    };
    // The drain has begun once the manager refuses a write to a stream it does not own.
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        match streams.append("probe", common::batch(1, 1), false).await {
            Err(Error::ShuttingDown) => break,
            Err(Error::NoSuchStream { .. }) => {}
            other => panic!("unexpected answer to the probe: {other:?}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the drain did not begin"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    store.open("late");

    let frames = s.until_closed().await;
    let (last, answers) = frames.split_last().expect("the drain's last answer");
    assert!(
        matches!(
            last,
            (
                0,
                Response::Error {
                    code: ErrorCode::ServiceUnavailable,
                    ..
                }
            )
        ),
        "the drain's connection-level answer comes last: {frames:?}"
    );
    let ids: Vec<u64> = answers.iter().map(|a| a.0).collect();
    assert_eq!(
        ids,
        [3, 4, 6],
        "every write to \"late\" answered, in frame order"
    );
    let mut acked = Vec::new();
    for (answer, txid) in answers.iter().zip(1..) {
        match answer {
            (_, Response::Write { .. }) => {
                written(answer);
                acked.push((txid, common::payload(txid)));
            }
            (_, Response::Error { code, .. }) => assert!(
                matches!(
                    code,
                    ErrorCode::ServiceUnavailable | ErrorCode::StreamOwnedElsewhere
                ),
                "{answer:?}"
            ),
            other => panic!("{other:?}"),
        }
    }
    eprintln!("writes to \"late\": {answers:?}");
    tokio::time::timeout(BOUND, drain)
        .await
        .expect("the drain ends")
        .unwrap()
        .unwrap();
    drop(streams);

    let next = common::proxy_on(c.store.clone(), common::small_config()).await;
    let client = ProxyClient::connect(next.server.local_addr())
        .await
        .unwrap();
    common::assert_reads_back(
        &common::read_all(&client, "kept").await,
        &common::batch(1, 2),
    );
    if !acked.is_empty() {
        common::assert_reads_back(&common::read_all(&client, "late").await, &acked);
    }
}

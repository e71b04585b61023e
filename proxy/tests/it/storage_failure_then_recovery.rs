//! Goal: when the bookies cannot take a write, the proxy answers STORAGE_ERROR (the writer is
//! dead, as in DistributedLog), and once the bookies are back the next write recovers the
//! abandoned segment and succeeds; every acknowledged record reads back exactly once, in order,
//! and a failed write's records appear at most once, in order.
//! Method: three real bookies (E=3, Qw=3, Qa=2); shut down two of them, write (fails), restart
//! them on the same addresses and directories, write again, read everything back.

use crate::common;

use std::time::Duration;

use quire_bookie::Bookie;
use quire_client::{ProxyClient, ReadPosition};
use quire_metadata::SegmentState;
use quire_proxy::ErrorCode;

fn restart(c: &common::Cluster, i: usize, addr: std::net::SocketAddr) -> Bookie {
    Bookie::start(quire_testkit::bookies::small_bookie_config(
        c.dir.path(),
        i,
        addr,
    ))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_failure_kills_the_writer_until_recovery() {
    let mut c = common::cluster().await;
    let p = common::proxy(&c, common::small_config()).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    let good: Vec<(u64, Vec<u8>)> = (0..100).map(|i| (i, common::payload(i))).collect();
    client.write("fragile", good.clone(), true).await.unwrap();

    // Two of three bookies go away: no entry can reach Qa = 2.
    let addrs: Vec<_> = c.bookies.iter().map(|b| b.addr()).collect();
    let b2 = c.bookies.pop().unwrap();
    let b1 = c.bookies.pop().unwrap();
    tokio::task::spawn_blocking(move || {
        b2.shutdown().unwrap();
        b1.shutdown().unwrap();
    })
    .await
    .unwrap();
    let failed: Vec<(u64, Vec<u8>)> = (100..110).map(|i| (i, common::payload(i))).collect();
    let e = client
        .write("fragile", failed.clone(), false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Storage, "{e}");
    eprintln!("write with two bookies down failed as expected: {e}");

    // Reads of what was acknowledged still work from the remaining bookie.
    let b = client
        .read("fragile", ReadPosition::Head, 1000, 1 << 20, Duration::ZERO)
        .await
        .unwrap();
    assert!(b.records.len() >= 100);

    // The bookies come back on the same addresses and directories.
    let (a1, a2) = (addrs[1], addrs[2]);
    let back1 = restart(&c, 1, a1);
    let back2 = restart(&c, 2, a2);
    c.bookies.push(back1);
    c.bookies.push(back2);

    // The next write recovers the abandoned segment and lands in a new one.
    let later: Vec<(u64, Vec<u8>)> = (200..250).map(|i| (i, common::payload(i))).collect();
    let mut result = None;
    for _ in 0..50 {
        match client.write("fragile", later.clone(), false).await {
            Ok(w) => {
                result = Some(w);
                break;
            }
            Err(e) => {
                assert!(matches!(e.code(), ErrorCode::Storage), "{e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    eprintln!("write after restart: {result:?}");
    let w = result.expect("writes resume once the bookies are back");
    assert!(w.first_dlsn.segment_seq_no >= 2);

    let mut got = Vec::new();
    let mut pos = ReadPosition::Head;
    loop {
        let b = client
            .read("fragile", pos, 1000, 1 << 20, Duration::ZERO)
            .await
            .unwrap();
        if b.records.is_empty() {
            break;
        }
        got.extend(b.records);
        pos = b.next;
    }
    assert!(got.windows(2).all(|w| w[0].0 < w[1].0));
    let data: Vec<(u64, Vec<u8>)> = got.into_iter().map(|(_, t, d)| (t, d)).collect();
    // Acknowledged records first, then an in-order prefix of the failed write (possibly empty),
    // then the later write.
    assert_eq!(data[..100], good[..]);
    assert_eq!(data[data.len() - 50..], later[..]);
    let middle = &data[100..data.len() - 50];
    assert!(middle.len() <= failed.len());
    assert_eq!(middle, &failed[..middle.len()]);
    let meta = c.store.read_stream("fragile").await.unwrap().value;
    assert_eq!(
        meta.segments
            .iter()
            .filter(|s| s.state == SegmentState::InProgress)
            .count(),
        1
    );
}

//! Goal: the client splits a write larger than the frame limit into several requests that land
//! in order, and one connection carries many concurrent requests (pipelined, matched by
//! request id) without mixing up answers.
//! Method: real bookies behind a proxy; one write of 8 maximal records (about 8.3 MB, above the
//! 5 MiB frame limit), read back; then 24 concurrent writes and reads from one shared client.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use quire_client::{ProxyClient, ReadPosition, RECORD_SIZE_BYTES_MAX};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_writes_split_and_requests_pipeline() {
    let c = common::cluster().await;
    let p = common::proxy(&c, common::small_config()).await;
    let client = Arc::new(ProxyClient::connect(p.server.local_addr()).await.unwrap());

    let big: Vec<(u64, Vec<u8>)> = (0..8u64)
        .map(|i| (i, vec![i as u8; RECORD_SIZE_BYTES_MAX]))
        .collect();
    let total: usize = big.iter().map(|r| r.1.len()).sum();
    assert!(total > client.frame_size_bytes_max() as usize);
    let w = client.write("big", big.clone(), true).await.unwrap();
    assert_eq!(w.count, 8);
    let mut got = Vec::new();
    let mut pos = ReadPosition::Head;
    while got.len() < 8 {
        let b = client
            .read("big", pos, 8, 4 << 20, Duration::ZERO)
            .await
            .unwrap();
        assert!(!b.records.is_empty());
        got.extend(b.records.into_iter().map(|(_, t, d)| (t, d)));
        pos = b.next;
    }
    assert!(got == big, "large records differ");

    // 24 concurrent requests on one connection, over 4 streams.
    let mut tasks = Vec::new();
    for i in 0..24u64 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let stream = format!("p{}", i % 4);
            let records: Vec<(u64, Vec<u8>)> = (0..10)
                .map(|k| (7, format!("{i}-{k}").into_bytes()))
                .collect();
            let w = client.write(&stream, records, true).await.unwrap();
            assert_eq!(w.count, 10);
            let b = client
                .read(
                    &stream,
                    ReadPosition::Dlsn(w.first_dlsn),
                    10,
                    1 << 20,
                    Duration::ZERO,
                )
                .await
                .unwrap();
            let texts: Vec<String> = b
                .records
                .iter()
                .map(|r| String::from_utf8(r.2.clone()).unwrap())
                .collect();
            assert_eq!(
                texts,
                (0..10).map(|k| format!("{i}-{k}")).collect::<Vec<_>>(),
                "a write's records stay together"
            );
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for s in 0..4 {
        let b = client
            .read(
                &format!("p{s}"),
                ReadPosition::Head,
                1000,
                1 << 20,
                Duration::ZERO,
            )
            .await
            .unwrap();
        assert_eq!(b.records.len(), 60);
    }
    let mut names = client.list_streams().await.unwrap();
    names.sort();
    assert_eq!(names, vec!["big", "p0", "p1", "p2", "p3"]);
}

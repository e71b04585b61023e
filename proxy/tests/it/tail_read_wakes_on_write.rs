//! Goal: a reader at the end of a stream waits for new records instead of returning empty, wakes
//! as soon as a write is acknowledged, and returns empty only when its wait runs out.
//! Method: real bookies behind a proxy; one client blocks in `read` with a 20 s wait at the
//! tail while another writes after 300 ms; measure the wake-up; then a short wait times out.

use crate::common;

use std::time::{Duration, Instant};

use quire_client::{ProxyClient, ReadPosition};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_read_wakes_on_new_write() {
    let c = common::cluster().await;
    let p = common::proxy(&c, common::small_config()).await;
    let addr = p.server.local_addr();
    let client = ProxyClient::connect(addr).await.unwrap();
    let w = client
        .write("tail", vec![(1, b"first".to_vec())], true)
        .await
        .unwrap();
    let b = client
        .read("tail", ReadPosition::Head, 10, 1 << 20, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(b.records.len(), 1);
    assert_eq!(b.records[0].0, w.last_dlsn);
    let tail = b.next;

    // A read at the tail on a fresh (empty) stream-less position waits; a write wakes it.
    let reader = tokio::spawn(async move {
        let rc = ProxyClient::connect(addr).await.unwrap();
        let start = Instant::now();
        let b = rc
            .read("tail", tail, 10, 1 << 20, Duration::from_secs(20))
            .await
            .unwrap();
        (b, start.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let w2 = client
        .write(
            "tail",
            vec![(2, b"second".to_vec()), (3, b"third".to_vec())],
            false,
        )
        .await
        .unwrap();
    let (b, waited) = reader.await.unwrap();
    assert!(
        waited >= Duration::from_millis(250),
        "returned before the write: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(5),
        "did not wake promptly: {waited:?}"
    );
    assert!(!b.records.is_empty());
    assert_eq!(b.records[0].1, 2);
    assert_eq!(b.records[0].2, b"second");
    assert!(b.records.last().unwrap().0 <= w2.last_dlsn);

    // Nothing more arrives: the read returns empty after its wait, positioned where it asked.
    let end = client
        .read("tail", b.next, 10, 1 << 20, Duration::ZERO)
        .await
        .unwrap();
    let end_pos = if end.records.is_empty() {
        b.next
    } else {
        end.next
    };
    let start = Instant::now();
    let e = client
        .read("tail", end_pos, 10, 1 << 20, Duration::from_millis(300))
        .await
        .unwrap();
    assert!(e.records.is_empty());
    assert_eq!(e.next, end_pos);
    assert!(start.elapsed() >= Duration::from_millis(250));

    // A reader waiting across a segment roll: fill the segment so the next write rolls it.
    let big: Vec<(u64, Vec<u8>)> = (0..40).map(|i| (10 + i, vec![7u8; 4000])).collect();
    let wb = client.write("tail", big, false).await.unwrap();
    let all = drain(&client, end_pos).await;
    assert_eq!(all.last().unwrap().0, wb.last_dlsn);
    let after = ReadPosition::Dlsn(quire_client::Dlsn::new(
        wb.last_dlsn.segment_seq_no,
        wb.last_dlsn.entry_id + 1,
        0,
    ));
    let reader = tokio::spawn(async move {
        let rc = ProxyClient::connect(addr).await.unwrap();
        rc.read("tail", after, 10, 1 << 20, Duration::from_secs(20))
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let wn = client
        .write("tail", vec![(100, b"next segment".to_vec())], false)
        .await
        .unwrap();
    let b = reader.await.unwrap();
    assert_eq!(b.records.len(), 1);
    assert_eq!(b.records[0].0, wn.last_dlsn);
    assert_eq!(b.records[0].2, b"next segment");
}

async fn drain(
    client: &ProxyClient,
    mut pos: ReadPosition,
) -> Vec<(quire_client::Dlsn, u64, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let b = client
            .read("tail", pos, 1000, 1 << 20, Duration::ZERO)
            .await
            .unwrap();
        if b.records.is_empty() {
            return out;
        }
        out.extend(b.records);
        pos = b.next;
    }
}

//! Goal: after a proxy dies with a segment in progress, a new proxy on the same metadata and
//! bookies recovers that segment (fences and closes its ledger, marks it Completed with the
//! right end), writes into a new segment, and every acknowledged record reads back exactly
//! once, in order.
//! Method: real bookies; write through proxy A (several segments, the last one left open),
//! drop A's server and stream manager without shutdown (a crash as far as the metadata and
//! bookies can tell), start proxy B, read everything, write more, read everything again; then
//! a clean shutdown of B leaves no segment in progress.

use crate::common;
use crate::common::read_all;

use quire_client::ProxyClient;
use quire_metadata::SegmentState;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_recovers_in_progress_segment_and_reads_back_once() {
    let c = common::cluster().await;
    let mut expected: Vec<(u64, Vec<u8>)> = Vec::new();

    // Proxy A: about 200 KiB, so several segments roll and the last one stays open.
    {
        let a = common::proxy(&c, common::small_config()).await;
        let client = ProxyClient::connect(a.server.local_addr()).await.unwrap();
        for batch in 0..6u64 {
            let records: Vec<(u64, Vec<u8>)> = (0..120)
                .map(|k| (batch * 1000 + k, common::payload(batch * 1000 + k)))
                .collect();
            client.write("crashy", records.clone(), true).await.unwrap();
            expected.extend(records);
        }
        let meta = c.store.read_stream("crashy").await.unwrap().value;
        assert_eq!(
            meta.segments.last().unwrap().state,
            SegmentState::InProgress,
            "the test needs an open segment"
        );
        // Crash: drop everything without shutdown.
        drop(client);
        drop(a);
    }
    // The dropped proxy's stream task gives the lease up (as a dead process's ZooKeeper session
    // would), leaving the segment in progress.
    common::wait_unowned(&c.store, "crashy").await;
    let before = c.store.read_stream("crashy").await.unwrap().value;
    let open_seq = before.segments.last().unwrap().seq_no;

    // Proxy B on the same store and bookies.
    let b = common::proxy(&c, common::small_config()).await;
    assert_eq!(b.streams.recover_all().await.unwrap(), 1);
    let meta = c.store.read_stream("crashy").await.unwrap().value;
    assert!(
        meta.segments
            .iter()
            .all(|s| s.state == SegmentState::Completed),
        "recovered eagerly"
    );
    let client = ProxyClient::connect(b.server.local_addr()).await.unwrap();
    let got = read_all(&client, "crashy").await;
    let data: Vec<(u64, Vec<u8>)> = got.iter().map(|(_, t, d)| (*t, d.clone())).collect();
    assert_eq!(data.len(), expected.len());
    assert!(data == expected, "records differ after recovery");
    assert!(
        got.windows(2).all(|w| w[0].0 < w[1].0),
        "DLSNs strictly increase"
    );

    let meta = c.store.read_stream("crashy").await.unwrap().value;
    assert!(meta
        .segments
        .iter()
        .all(|s| s.state == SegmentState::Completed));
    let recovered = meta.segments.iter().find(|s| s.seq_no == open_seq).unwrap();
    let in_it = got
        .iter()
        .filter(|r| r.0.segment_seq_no == open_seq)
        .count() as u64;
    assert_eq!(recovered.record_count, in_it);
    assert_eq!(recovered.last_txid, Some(expected.last().unwrap().0));
    assert_eq!(meta.max_txid, Some(expected.last().unwrap().0));

    // txids keep their order across the restart.
    let e = client
        .write("crashy", vec![(1, b"old".to_vec())], false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), quire_proxy::ErrorCode::TxidOutOfOrder, "{e}");

    // New writes go into a new segment after the recovered one.
    let more: Vec<(u64, Vec<u8>)> = (0..50)
        .map(|k| (9000 + k, common::payload(9000 + k)))
        .collect();
    let w = client.write("crashy", more.clone(), false).await.unwrap();
    assert!(w.first_dlsn.segment_seq_no > open_seq);
    expected.extend(more);
    let got = read_all(&client, "crashy").await;
    let data: Vec<(u64, Vec<u8>)> = got.iter().map(|(_, t, d)| (*t, d.clone())).collect();
    assert!(data == expected, "records differ after the second round");

    // A clean shutdown completes the open segment.
    b.streams.shutdown().await.unwrap();
    let meta = c.store.read_stream("crashy").await.unwrap().value;
    assert!(meta
        .segments
        .iter()
        .all(|s| s.state == SegmentState::Completed));
    assert_eq!(
        meta.segments.iter().map(|s| s.record_count).sum::<u64>(),
        expected.len() as u64
    );
    let e = b
        .streams
        .append("crashy", vec![(9999, b"late".to_vec())], false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), quire_proxy::ErrorCode::ServiceUnavailable);
}

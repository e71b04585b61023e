//! Goal: records written through the proxy across several segments read back identical, in
//! order, with strictly increasing DLSNs, from the head and from a middle DLSN; segments roll
//! by size and completed segments carry their record counts.
//! Method: three real bookies, the embedded store, 64 KiB segments and 8 KiB entries; 3,000
//! records (about 900 KiB) in bulk writes through `ProxyClient`, then paged reads served by
//! the bookies (tail cache off).

mod common;

use std::time::Duration;

use quire_metadata::SegmentState;
use quire_proxy::{Dlsn, ProxyClient, ReadPosition};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_span_segments_and_read_back_in_order() {
    let c = common::cluster().await;
    // No tail cache: every read goes to the bookies.
    let p = common::proxy(
        &c,
        quire_proxy::StreamConfig {
            tail_cache_bytes_max: 0,
            ..common::small_config()
        },
    )
    .await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    client.create_stream("logs/app").await.unwrap();
    assert_eq!(
        client.list_streams().await.unwrap(),
        vec!["logs/app".to_string()]
    );

    let total = 3000u64;
    let mut last = None;
    for chunk in (0..total).collect::<Vec<_>>().chunks(500) {
        // txids repeat in pairs: non-decreasing is allowed.
        let records = chunk.iter().map(|&i| (i / 2, common::payload(i))).collect();
        let w = client.write("logs/app", records, false).await.unwrap();
        assert_eq!(w.count, chunk.len() as u64);
        assert!(w.first_dlsn <= w.last_dlsn);
        if let Some(prev) = last {
            assert!(w.first_dlsn > prev, "DLSNs increase across writes");
        }
        last = Some(w.last_dlsn);
    }

    // Page through everything from the head.
    let mut got = Vec::new();
    let mut pos = ReadPosition::Head;
    while (got.len() as u64) < total {
        let b = client
            .read("logs/app", pos, 700, 64 * 1024, Duration::ZERO)
            .await
            .unwrap();
        assert!(!b.records.is_empty(), "stalled after {} records", got.len());
        got.extend(b.records);
        pos = b.next;
    }
    assert_eq!(got.len() as u64, total);
    for (i, (dlsn, txid, data)) in got.iter().enumerate() {
        assert_eq!(*txid, i as u64 / 2);
        assert_eq!(*data, common::payload(i as u64), "record {i}");
        if i > 0 {
            assert!(*dlsn > got[i - 1].0, "DLSN order at {i}");
        }
    }
    assert_eq!(got[0].0, Dlsn::INITIAL);
    assert_eq!(got.last().unwrap().0, last.unwrap());
    // Nothing past the end.
    let b = client
        .read("logs/app", pos, 10, 1 << 20, Duration::ZERO)
        .await
        .unwrap();
    assert!(b.records.is_empty());
    assert_eq!(b.next, pos);

    // Several segments, sequence numbers 1..n, all but the last completed with counts.
    let meta = c.store.read_stream("logs/app").await.unwrap().value;
    assert!(
        meta.segments.len() >= 4,
        "expected several segments, got {}",
        meta.segments.len()
    );
    for (k, s) in meta.segments.iter().enumerate() {
        assert_eq!(s.seq_no, k as u64 + 1);
    }
    let completed: Vec<_> = meta
        .segments
        .iter()
        .filter(|s| s.state == SegmentState::Completed)
        .collect();
    assert!(completed.len() >= meta.segments.len() - 1);
    let counted: u64 = completed.iter().map(|s| s.record_count).sum();
    let in_segments: Vec<u64> = meta
        .segments
        .iter()
        .map(|s| {
            got.iter()
                .filter(|r| r.0.segment_seq_no == s.seq_no)
                .count() as u64
        })
        .collect();
    for s in &completed {
        assert_eq!(
            s.record_count,
            in_segments[s.seq_no as usize - 1],
            "segment {}",
            s.seq_no
        );
    }
    assert!(counted <= total);

    // From a middle DLSN (the first record of the third segment, and a mid-entry slot).
    for start in [
        got.iter().position(|r| r.0.segment_seq_no == 3).unwrap(),
        1234,
    ] {
        let b = client
            .read(
                "logs/app",
                ReadPosition::Dlsn(got[start].0),
                50,
                1 << 20,
                Duration::ZERO,
            )
            .await
            .unwrap();
        assert_eq!(b.records.len(), 50);
        assert_eq!(b.records[..], got[start..start + 50]);
        assert_eq!(b.next, ReadPosition::Dlsn(next_of(&got, start + 49)));
    }
}

/// The DLSN just after record `i` as the reader reports it: the next slot, or the next entry.
fn next_of(got: &[(Dlsn, u64, Vec<u8>)], i: usize) -> Dlsn {
    let d = got[i].0;
    match got.get(i + 1) {
        Some((n, _, _)) if n.segment_seq_no == d.segment_seq_no && n.entry_id == d.entry_id => *n,
        _ => Dlsn::new(d.segment_seq_no, d.entry_id + 1, 0),
    }
}

//! Goal: records written through the proxy across several segments read back identical, in
//! order, with strictly increasing DLSNs, from the head and from a middle DLSN; segments roll
//! by size and completed segments carry their record counts.
//! A segment whose roll cannot start the next segment (fewer writable bookies than the
//! ensemble) keeps taking writes up to its bound and rolls once it can (issue 23, item 3).
//! Method: three real bookies, the embedded store, 64 KiB segments and 8 KiB entries; 3,000
//! records (about 900 KiB) in bulk writes through `ProxyClient`, then paged reads served by
//! the bookies (tail cache off).

use crate::common;

use std::time::Duration;

use quire_client::{Dlsn, ProxyClient, ReadPosition};
use quire_metadata::SegmentState;

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

/// The proxy's stream-layer metrics as Prometheus text.
fn metrics_text(streams: &quire_proxy::StreamManager) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(streams.metrics_collector());
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roll_without_a_new_ensemble_keeps_writing_to_the_segment() {
    // Goal (issue 23, item 3): with E=3 on three bookies, once one bookie's registration is
    // gone (it expired; the bookie itself still serves the open ledger) no ledger can be
    // created, so the stream must not roll: its segment keeps taking writes past its 64 KiB
    // roll point, up to the configured 128 KiB overshoot, beyond which writes are refused
    // with a clear STORAGE_ERROR that wrote nothing; the deferral shows in the metrics, and
    // once the bookie is registered again the segment rolls by itself (lifecycle tick) and
    // writes go on into a new segment. Every acknowledged record reads back.
    // Method: in-process bookies registered in the embedded store; the registration is
    // removed and put back through the store, as a session expiry and a re-registration do.
    let c = common::cluster().await;
    let config = quire_proxy::StreamConfig {
        segment_roll_overshoot_bytes_max: 128 * 1024,
        lifecycle_check_interval: Duration::from_millis(100),
        ..common::small_config()
    };
    let p = common::proxy(&c, config).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    client.create_stream("e3").await.unwrap();
    let mut acked = Vec::new();
    let mut next = 0u64;
    let (recs, r) = write_next(&client, &mut next, 50).await;
    r.unwrap();
    acked.extend(recs);

    let away = c.store.list_bookies().await.unwrap().remove(0);
    c.store.unregister_bookie(&away.id).await.unwrap();
    // About 420 KiB in writes of 40 records (~12 KiB): the first ~190 KiB (64 KiB roll point
    // plus 128 KiB) are taken by the open segment, the rest are refused.
    let mut refused = None;
    for _ in 0..35 {
        let (recs, r) = write_next(&client, &mut next, 40).await;
        match r {
            Ok(w) => {
                assert!(refused.is_none(), "a write was taken after one was refused");
                assert_eq!(
                    w.first_dlsn.segment_seq_no, 1,
                    "no roll without a new ensemble"
                );
                acked.extend(recs);
            }
            Err(e) => {
                assert_eq!(e.code(), quire_proxy::ErrorCode::Storage, "{e}");
                refused.get_or_insert(e.to_string());
            }
        }
    }
    let info = client.describe_stream("e3").await.unwrap();
    let seg = &info.metadata.segments[0];
    assert!(
        info.metadata.segments.len() == 1 && seg.state == quire_client::SegmentState::InProgress,
        "the segment must not roll while no new segment can be started; first refusal: {refused:?}; segments: {:?}",
        info.metadata.segments
    );
    let refused = refused.expect("writes past the overshoot bound are refused");
    assert!(
        refused.contains("no new segment can be started") && refused.contains("not enough bookies"),
        "{refused}"
    );
    assert!(
        seg.length_bytes >= 64 * 1024 + 128 * 1024 && seg.length_bytes < 64 * 1024 + 160 * 1024,
        "the segment grew past its roll point up to the bound: {} bytes",
        seg.length_bytes
    );
    assert_eq!(seg.record_count, acked.len() as u64);
    let m = metrics_text(&p.streams);
    assert!(
        m.contains("quire_proxy_segment_roll_deferred_total 1\n"),
        "{m}"
    );
    assert!(
        m.contains("quire_proxy_segments_past_roll_point 1\n"),
        "{m}"
    );

    // The bookie registers again: the segment rolls without waiting for a write.
    c.store.register_bookie(away).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let info = client.describe_stream("e3").await.unwrap();
        if info.metadata.segments[0].state == quire_client::SegmentState::Completed {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no roll within 15 s of the bookie's return"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m = metrics_text(&p.streams);
    assert!(
        m.contains("quire_proxy_segments_past_roll_point 0\n"),
        "{m}"
    );
    let (recs, r) = write_next(&client, &mut next, 40).await;
    let w = r.unwrap();
    assert_eq!(w.first_dlsn.segment_seq_no, 2);
    acked.extend(recs);
    let got = common::read_all(&client, "e3").await;
    assert_eq!(got.len(), acked.len());
    for (g, a) in got.iter().zip(&acked) {
        assert_eq!((g.1, &g.2), (a.0, &a.1));
    }
    p.streams.shutdown().await.unwrap();
}

/// Writes the next `n` records (txid = index) to stream `e3`; returns them with the answer.
async fn write_next(
    client: &ProxyClient,
    next: &mut u64,
    n: u64,
) -> (
    Vec<(u64, Vec<u8>)>,
    quire_proxy::Result<quire_client::WriteResult>,
) {
    let records: Vec<(u64, Vec<u8>)> = (*next..*next + n)
        .map(|i| (i, common::payload(i)))
        .collect();
    *next += n;
    (records.clone(), client.write("e3", records, false).await)
}

//! Goal: the proxy's lifecycle sweep (issue 9) finds and deletes orphan ledger metadata, the
//! kind a crash in the middle of a deletion or of a segment start leaves behind (ledgers
//! labelled with a stream whose record no longer lists them, or with a stream that no longer
//! exists), only for streams no other proxy owns, never touching unlabelled ledgers or listed
//! segments; the bookies' garbage collection then reclaims the orphans' entries. And the sweep
//! applies retention and completes abandoned segments on streams no request has touched since
//! the proxy started, then gives those streams back.
//! Method: three real bookies in-process with GC every second, the embedded store, proxies on
//! 127.0.0.1 with `ProxyClient`; orphans are made by changing the metadata exactly as the
//! crashed step would have left it (the record updated without the ledger deletes, a labelled
//! ledger created and written but never added, a stream record deleted without its ledgers).

use crate::common;
use crate::common::read_all;

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use quire_client::ProxyClient;
use quire_ledger::{BookKeeper, LedgerOptions};
use quire_metadata::{MetadataStore, SegmentState, TruncationPoint};
use quire_proxy::{StreamConfig, LEDGER_LABEL_SEGMENT, LEDGER_LABEL_STREAM};
use quire_wire::LedgerId;

async fn write(client: &ProxyClient, stream: &str, first: u64, n: u64) {
    let mut t = first;
    while t < first + n {
        let k = 10.min(first + n - t);
        let recs: Vec<(u64, Vec<u8>)> = (t..t + k).map(|i| (i, common::payload(i))).collect();
        client.write(stream, recs, true).await.unwrap();
        t += k;
    }
}

async fn exists(store: &dyn MetadataStore, id: u64) -> bool {
    match store.read_ledger(LedgerId(id)).await {
        Ok(_) => true,
        Err(quire_metadata::Error::NotFound { .. }) => false,
        Err(e) => panic!("read ledger {id}: {e}"),
    }
}

/// Creates a ledger as a segment start does (labelled `stream` unless `None`), writes `n`
/// entries of 4 KiB to it and closes it; returns its id.
async fn written_ledger(c: &common::Cluster, stream: Option<&str>, n: usize) -> u64 {
    let bk = BookKeeper::new(c.store.clone(), quire_ledger::ClientConfig::default());
    let mut custom = BTreeMap::new();
    if let Some(s) = stream {
        custom.insert(LEDGER_LABEL_STREAM.to_string(), s.to_string());
        custom.insert(LEDGER_LABEL_SEGMENT.to_string(), "99".to_string());
    }
    let w = bk
        .create_ledger(LedgerOptions {
            ensemble_size: 3,
            write_quorum: 3,
            ack_quorum: 2,
            password: b"quire".to_vec(),
            custom,
        })
        .await
        .unwrap();
    let adds: Vec<_> = (0..n).map(|i| w.add(vec![i as u8; 4096])).collect();
    for a in adds {
        a.await.unwrap();
    }
    w.close().await.unwrap();
    w.id().0
}

fn config() -> StreamConfig {
    StreamConfig {
        lifecycle_sweep_interval: None,
        ..common::small_config()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_ledger_metadata_is_swept_and_reclaimed_by_the_bookies() {
    let c = common::cluster_with_gc().await;
    let p = common::proxy(&c, config()).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    write(&client, "s", 1, 1000).await;
    write(&client, "gone", 1, 150).await;
    write(&client, "other", 1, 10).await;
    p.streams.shutdown().await.unwrap();
    drop(client);
    drop(p);
    for s in ["s", "gone", "other"] {
        common::wait_unowned(&c.store, s).await;
    }

    // 1. A retention step that crashed after its stream-record update: the first two
    //    segments are off the record (truncation point moved), their ledgers still there.
    let v = c.store.read_stream("s").await.unwrap();
    let mut meta = v.value.clone();
    assert!(meta.segments.len() >= 4, "{} segments", meta.segments.len());
    let dropped: Vec<u64> = meta.segments.drain(..2).map(|s| s.ledger_id).collect();
    meta.truncated_before = Some(TruncationPoint {
        segment_seq_no: meta.segments[0].seq_no,
        entry_id: 0,
        slot_index: 0,
    });
    c.store.update_stream(&meta, v.version).await.unwrap();
    let kept: Vec<u64> = meta.segments.iter().map(|s| s.ledger_id).collect();
    // 2. A segment start that crashed after creating (and here even writing) its ledger and
    //    before adding it to the record.
    let unrecorded = written_ledger(&c, Some("s"), 8).await;
    // 3. A stream deletion that crashed after deleting the record.
    let gone = c.store.read_stream("gone").await.unwrap();
    let gone_ledgers: Vec<u64> = gone.value.segments.iter().map(|s| s.ledger_id).collect();
    c.store.delete_stream("gone", gone.version).await.unwrap();
    // Not orphans: a ledger of another ledger client (no label), and one labelled with a
    // stream another proxy owns (that owner sweeps it, nobody else).
    let unlabelled = written_ledger(&c, None, 8).await;
    let other_owner = common::proxy(&c, config()).await;
    let other_client = ProxyClient::connect(other_owner.server.local_addr())
        .await
        .unwrap();
    write(&other_client, "other", 100, 5).await;
    let others_orphan = written_ledger(&c, Some("other"), 1).await;

    let mut orphans: BTreeSet<u64> = dropped.iter().copied().collect();
    orphans.insert(unrecorded);
    orphans.extend(&gone_ledgers);
    let before = common::settled_entry_log_bytes(&c).await;

    let p = common::proxy(&c, config()).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    let report = p.streams.sweep().await.unwrap();
    assert_eq!(
        report.orphan_ledgers_deleted,
        orphans.iter().copied().collect::<Vec<_>>(),
        "{report:?}"
    );
    assert_eq!(report.streams_owned_elsewhere, 1, "{report:?}");
    assert_eq!(report.streams_acquired, 1, "{report:?}");
    for id in &orphans {
        assert!(!exists(&*c.store, *id).await, "orphan ledger {id} stays");
    }
    for id in kept.iter().chain([&unlabelled, &others_orphan]) {
        assert!(exists(&*c.store, *id).await, "ledger {id} was deleted");
    }
    // The stream the sweep acquired was given back; its records are exactly those of the
    // listed segments.
    assert_eq!(c.store.stream_owner("s").await.unwrap(), None);
    let got = read_all(&client, "s").await;
    let first_seq = meta.segments[0].seq_no;
    assert!(!got.is_empty() && got.iter().all(|r| r.0.segment_seq_no >= first_seq));
    assert_eq!(
        got.len() as u64,
        meta.segments.iter().map(|s| s.record_count).sum::<u64>()
    );

    // Every bookie's GC finds the orphans gone and drops their entries.
    common::wait_until_reclaimed(&c, &before, orphans.clone()).await;
    assert!(
        read_all(&client, "s").await == got,
        "records after bookie GC"
    );

    // A second sweep finds nothing more; the owner of "other" sweeps its orphan.
    let again = p.streams.sweep().await.unwrap();
    assert!(again.orphan_ledgers_deleted.is_empty(), "{again:?}");
    let theirs = other_owner.streams.sweep().await.unwrap();
    assert_eq!(theirs.orphan_ledgers_deleted, vec![others_orphan]);
    assert!(exists(&*c.store, unlabelled).await);
    assert_eq!(read_all(&other_client, "other").await.len(), 15);
    p.streams.shutdown().await.unwrap();
    other_owner.streams.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_sweep_applies_retention_to_streams_no_request_touched() {
    // Goal: retention and the completion of an abandoned segment happen on streams this proxy
    // never served a request for (issue 9: "retention runs only on streams a proxy owns"),
    // and the sweep gives those streams back. Method: one proxy writes two streams without
    // retention, stops cleanly for one and is dropped (a crash of its stream task) for the
    // other; a second proxy with 100 KiB size retention and a 1 s sweep gets no request.
    let c = common::cluster().await;
    let p = common::proxy(&c, config()).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    write(&client, "idle", 1, 800).await;
    let segments_before = c.store.read_stream("idle").await.unwrap().value.segments;
    assert!(segments_before.len() >= 4, "{}", segments_before.len());
    drop(client);
    p.streams.shutdown().await.unwrap();
    drop(p);
    common::wait_unowned(&c.store, "idle").await;
    // "crashed": its owner is dropped without a shutdown, so its segment stays in progress.
    let p = common::proxy(&c, config()).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    write(&client, "crashed", 1, 50).await;
    drop(client);
    drop(p);
    common::wait_unowned(&c.store, "crashed").await;
    let crashed = c.store.read_stream("crashed").await.unwrap().value;
    assert_eq!(
        crashed.segments.last().unwrap().state,
        SegmentState::InProgress
    );

    let limit = 100 * 1024;
    let p = common::proxy(
        &c,
        StreamConfig {
            retention_size_bytes: Some(limit),
            lifecycle_sweep_interval: Some(Duration::from_secs(1)),
            ..common::small_config()
        },
    )
    .await;
    let start = Instant::now();
    loop {
        let idle = c.store.read_stream("idle").await.unwrap().value;
        let crashed = c.store.read_stream("crashed").await.unwrap().value;
        let idle_bytes: u64 = idle.segments.iter().map(|s| s.length_bytes).sum();
        let done = idle.segments[0].seq_no > 1
            && idle_bytes <= limit
            && crashed
                .segments
                .iter()
                .all(|s| s.state == SegmentState::Completed)
            && c.store.stream_owner("idle").await.unwrap().is_none()
            && c.store.stream_owner("crashed").await.unwrap().is_none();
        if done {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the sweep did not apply retention and give the streams back: idle {:?}, crashed {:?}",
            idle.segments,
            crashed.segments
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The deleted segments' ledgers are gone; what is left reads back from the first kept
    // segment on.
    let idle = c.store.read_stream("idle").await.unwrap().value;
    for s in &segments_before {
        assert_eq!(
            exists(&*c.store, s.ledger_id).await,
            s.seq_no >= idle.segments[0].seq_no,
            "ledger {}",
            s.ledger_id
        );
    }
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    let got = read_all(&client, "idle").await;
    assert_eq!(
        got.len() as u64,
        idle.segments.iter().map(|s| s.record_count).sum::<u64>()
    );
    assert!(got
        .iter()
        .all(|r| r.0.segment_seq_no >= idle.segments[0].seq_no));
    assert_eq!(read_all(&client, "crashed").await.len(), 50);
    // Used by a request now: the next sweeps keep it owned.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        c.store.stream_owner("idle").await.unwrap().as_deref(),
        Some(p.server.local_addr().to_string().as_str())
    );
    p.streams.shutdown().await.unwrap();
}

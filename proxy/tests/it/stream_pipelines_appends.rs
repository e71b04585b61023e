//! Goal: one stream takes many appends at once (DistributedLog's write proxy: many outstanding
//! writes per stream, batched into entries, acknowledged in order) without giving up its
//! invariants: (1) concurrent single-record appends are all acknowledged, each task sees its
//! DLSNs strictly grow, DLSNs are unique, everything reads back once in DLSN order, and appends
//! queued together share entries; (2) when another client fences the open ledger while appends
//! are in flight, appends fail with OWNERSHIP_LOST from the failure point on, nothing the fenced
//! ledger does not hold is acknowledged, and every acknowledged record reads back once.
//! Method: three real bookies in-process, the stream manager called from 50 tokio tasks at once;
//! (2) `recover_ledger` from a second BookKeeper client on the open segment's ledger.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quire_client::{Dlsn, ReadPosition};
use quire_ledger::BookKeeper;
use quire_metadata::SegmentState;
use quire_proxy::{Error, StreamConfig, StreamManager};
use quire_wire::LedgerId;

const TASKS: u64 = 50;

/// Everything readable in `stream`, through the stream manager.
async fn read_all(streams: &StreamManager, stream: &str) -> Vec<(Dlsn, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pos = ReadPosition::Head;
    loop {
        let b = streams
            .read(stream, pos, 500, 1 << 20, Duration::ZERO)
            .await
            .unwrap();
        if b.records.is_empty() {
            return out;
        }
        out.extend(b.records);
        pos = b.next;
    }
}

/// Payload of append `i` of task `t`: the pair in its first 16 bytes, then filler (~1 KiB).
fn payload(t: u64, i: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(1024);
    p.extend_from_slice(&t.to_le_bytes());
    p.extend_from_slice(&i.to_le_bytes());
    p.extend((0..1008u64).map(|k| (t * 131 + i * 7 + k) as u8));
    p
}

fn key_of(p: &[u8]) -> (u64, u64) {
    (
        u64::from_le_bytes(p[0..8].try_into().unwrap()),
        u64::from_le_bytes(p[8..16].try_into().unwrap()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_single_record_appends_are_pipelined_and_batched() {
    let c = common::cluster().await;
    // 256 KiB segments: the 2 MiB written rolls several segments while appends are in flight.
    let config = StreamConfig {
        segment_size_bytes_max: 256 * 1024,
        entry_size_bytes_target: 8 * 1024,
        ..StreamConfig::default()
    };
    let p = common::proxy(&c, config).await;
    p.streams.create_stream("many").await.unwrap();
    const PER_TASK: u64 = 40;

    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let streams = p.streams.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in 0..PER_TASK {
                // One txid for all: concurrent writers have no txid order among them.
                let w = streams
                    .append("many", vec![(1, payload(t, i))], false)
                    .await
                    .unwrap();
                assert_eq!(w.count, 1);
                assert_eq!(w.first_dlsn, w.last_dlsn);
                got.push(w.first_dlsn);
            }
            got
        }));
    }
    let mut acked: HashMap<(u64, u64), Dlsn> = HashMap::new();
    for (t, task) in tasks.into_iter().enumerate() {
        let dlsns = task.await.unwrap();
        assert!(
            dlsns.windows(2).all(|w| w[0] < w[1]),
            "task {t}: DLSNs grow in reply order"
        );
        for (i, d) in dlsns.into_iter().enumerate() {
            acked.insert((t as u64, i as u64), d);
        }
    }
    let total = (TASKS * PER_TASK) as usize;
    assert_eq!(acked.len(), total);
    let unique: HashSet<Dlsn> = acked.values().copied().collect();
    assert_eq!(unique.len(), total, "every record has its own DLSN");

    let got = read_all(&p.streams, "many").await;
    assert_eq!(
        got.len(),
        total,
        "every acknowledged record reads back, once"
    );
    assert!(
        got.windows(2).all(|w| w[0].0 < w[1].0),
        "read back in DLSN order"
    );
    for (dlsn, txid, data) in &got {
        assert_eq!(*txid, 1);
        let key = key_of(data);
        assert_eq!(*data, payload(key.0, key.1), "payload intact");
        assert_eq!(
            acked.get(&key),
            Some(dlsn),
            "record {key:?} is where its reply said"
        );
    }
    // Batching: fewer entries than records.
    let entries: HashSet<(u64, u64)> = got
        .iter()
        .map(|(d, _, _)| (d.segment_seq_no, d.entry_id))
        .collect();
    eprintln!("{total} records in {} entries", entries.len());
    assert!(
        entries.len() < total,
        "appends queued together share entries ({} entries for {total} records)",
        entries.len()
    );
    // The segment metadata agrees: completed segments account for their entries and records.
    let meta = c.store.read_stream("many").await.unwrap().value;
    assert!(
        meta.segments.len() > 1,
        "segments rolled while appends were in flight"
    );
    let mut records_in_completed = 0;
    for s in meta
        .segments
        .iter()
        .filter(|s| s.state == SegmentState::Completed)
    {
        let in_seg = entries.iter().filter(|(seq, _)| *seq == s.seq_no).count() as u64;
        assert_eq!(
            s.last_entry.map_or(0, |l| l + 1),
            in_seg,
            "segment {} entries",
            s.seq_no
        );
        records_in_completed += s.record_count;
    }
    let in_completed = got
        .iter()
        .filter(|(d, _, _)| {
            meta.segments
                .iter()
                .any(|s| s.seq_no == d.segment_seq_no && s.state == SegmentState::Completed)
        })
        .count();
    assert_eq!(records_in_completed as usize, in_completed);
    p.streams.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_mid_pipeline_fails_later_appends_and_acknowledges_nothing_past_it() {
    let c = common::cluster().await;
    // One segment for the whole run (default 256 MiB), small entries.
    let config = StreamConfig {
        entry_size_bytes_target: 8 * 1024,
        ..StreamConfig::default()
    };
    let p = common::proxy(&c, config).await;
    p.streams.create_stream("fenced").await.unwrap();
    p.streams
        .append("fenced", vec![(1, payload(999, 0))], false)
        .await
        .unwrap();
    let open = c
        .store
        .read_stream("fenced")
        .await
        .unwrap()
        .value
        .segments
        .last()
        .unwrap()
        .clone();
    assert_eq!(open.state, SegmentState::InProgress);

    let acked_count = Arc::new(AtomicU64::new(0));
    let fenced = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (streams, acked_count, fenced) =
            (p.streams.clone(), acked_count.clone(), fenced.clone());
        tasks.push(tokio::spawn(async move {
            // (index, submitted after the fence, result)
            let mut results = Vec::new();
            for i in 0.. {
                let after = fenced.load(Ordering::SeqCst);
                let r = streams
                    .append("fenced", vec![(1, payload(t, i))], false)
                    .await;
                if r.is_ok() {
                    acked_count.fetch_add(1, Ordering::SeqCst);
                }
                results.push((i, after, r));
                if after || i >= 2_000 {
                    break;
                }
            }
            results
        }));
    }
    // Fence once the pipeline is busy.
    while acked_count.load(Ordering::SeqCst) < 300 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let other = BookKeeper::new(c.store.clone(), quire_ledger::ClientConfig::default());
    let lm = other
        .recover_ledger(LedgerId(open.ledger_id))
        .await
        .unwrap();
    fenced.store(true, Ordering::SeqCst);
    let fence_last = lm
        .last_entry
        .expect("entries were written before the fence");

    let mut acked: HashMap<(u64, u64), Dlsn> = HashMap::new();
    let mut failed: HashSet<(u64, u64)> = HashSet::new();
    let mut lost = 0;
    for (t, task) in tasks.into_iter().enumerate() {
        let t = t as u64;
        let results = task.await.unwrap();
        let mut last_ok: Option<Dlsn> = None;
        let mut failed_in_task = false;
        for (i, after, r) in results {
            match r {
                Ok(w) => {
                    let d = w.first_dlsn;
                    assert!(
                        last_ok.is_none_or(|l| l < d),
                        "task {t}: DLSNs grow in reply order"
                    );
                    last_ok = Some(d);
                    if d.segment_seq_no == open.seq_no {
                        assert!(!after, "task {t} append {i}: submitted after the fence, acknowledged in the fenced segment");
                        assert!(!failed_in_task, "task {t} append {i}: acknowledged in the fenced segment after an earlier append failed");
                        assert!(d.entry_id <= fence_last, "task {t} append {i}: acknowledged at {d}, past the fenced ledger's end {fence_last}");
                    } else {
                        assert!(d.segment_seq_no > open.seq_no);
                    }
                    acked.insert((t, i), d);
                }
                Err(e) => {
                    assert!(
                        matches!(e, Error::OwnershipLost { .. }),
                        "task {t} append {i}: {e}"
                    );
                    lost += 1;
                    failed_in_task = true;
                    failed.insert((t, i));
                }
            }
        }
    }
    eprintln!(
        "{} acknowledged, {lost} failed with OWNERSHIP_LOST, fenced at entry {fence_last}",
        acked.len()
    );
    assert!(lost > 0, "appends in flight at the fence fail");

    // Every acknowledged record reads back once, where its reply said; a failed append may
    // appear (the recovery kept its entry) but only after every acknowledged record of the
    // fenced segment.
    let got = read_all(&p.streams, "fenced").await;
    assert!(
        got.windows(2).all(|w| w[0].0 < w[1].0),
        "read back in DLSN order"
    );
    let mut seen = HashSet::new();
    let mut first_failed_in_fenced: Option<Dlsn> = None;
    let mut last_acked_in_fenced: Option<Dlsn> = None;
    for (dlsn, _, data) in &got {
        let key = key_of(data);
        if key == (999, 0) {
            continue;
        }
        assert!(seen.insert(key), "record {key:?} read twice");
        if let Some(d) = acked.get(&key) {
            assert_eq!(d, dlsn, "record {key:?} is where its reply said");
            if dlsn.segment_seq_no == open.seq_no {
                last_acked_in_fenced = Some(*dlsn);
            }
        } else {
            assert!(failed.contains(&key), "record {key:?} was never submitted");
            assert_eq!(
                dlsn.segment_seq_no, open.seq_no,
                "a failed append can only be in the fenced segment"
            );
            first_failed_in_fenced.get_or_insert(*dlsn);
        }
    }
    for key in acked.keys() {
        assert!(seen.contains(key), "acknowledged record {key:?} is missing");
    }
    if let (Some(f), Some(a)) = (first_failed_in_fenced, last_acked_in_fenced) {
        assert!(
            a < f,
            "an acknowledged record ({a}) follows a failed one ({f}) in the fenced segment"
        );
    }
    let meta = c.store.read_stream("fenced").await.unwrap().value;
    let seg = meta
        .segments
        .iter()
        .find(|s| s.seq_no == open.seq_no)
        .unwrap();
    if seg.state == SegmentState::Completed {
        assert_eq!(
            seg.last_entry, lm.last_entry,
            "the segment ends where the recovery closed the ledger"
        );
    }
    p.streams.shutdown().await.unwrap();
}

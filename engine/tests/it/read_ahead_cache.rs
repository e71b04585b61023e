//! Goal: a sequential catch-up reader of a ledger whose entries are only in the entry logs
//! (after a checkpoint) is served mostly from the read cache filled by read-ahead: few large
//! entry-log reads instead of one per entry; the data is exact; the read cache stays within
//! its byte bound; and with read-ahead off every read goes to the entry log (the counters can
//! tell the difference).
//! Method: a real engine; 300 entries of 1 KiB in one ledger interleaved with another ledger,
//! a checkpoint, a reopen (so the write cache is empty), then reads 0..300 in order and the
//! `read_stats` counters.

use crate::common::{config, payload, run, tempdir, KEY};
use quire_engine::{Engine, ReadStats};

const N: u64 = 300;

fn scan(read_ahead_entries: usize, read_cache_bytes_max: usize) -> ReadStats {
    let dir = tempdir();
    let mut cfg = config(dir.path());
    cfg.read_ahead_entries = read_ahead_entries;
    cfg.read_cache_bytes_max = read_cache_bytes_max;
    let mut stats = ReadStats::default();
    let out = std::sync::Arc::new(std::sync::Mutex::new(ReadStats::default()));
    let o = out.clone();
    run(move || async move {
        let engine = Engine::open(cfg.clone()).await.unwrap();
        for e in 0..N {
            engine
                .add_entry(1, e, KEY, e.checked_sub(1), payload(1, e, 1024), false)
                .await
                .unwrap();
            engine
                .add_entry(2, e, KEY, None, payload(2, e, 512), false)
                .await
                .unwrap();
        }
        engine.checkpoint().await.unwrap();
        engine.close().await.unwrap();
        let engine = Engine::open(cfg).await.unwrap();
        assert_eq!(
            engine.write_cache_bytes(),
            0,
            "everything is in the entry logs"
        );
        for e in 0..N {
            assert_eq!(
                engine.read_entry(1, Some(e)).await.unwrap(),
                payload(1, e, 1024),
                "entry {e}"
            );
            let s = engine.read_stats();
            assert!(
                s.read_cache_bytes as usize <= read_cache_bytes_max.max(1024),
                "read cache over its bound: {s:?}"
            );
        }
        *o.lock().unwrap() = engine.read_stats();
        engine.close().await.unwrap();
    });
    std::mem::swap(&mut stats, &mut out.lock().unwrap());
    stats
}

#[test]
fn sequential_scan_is_served_from_read_cache() {
    let s = scan(100, 8 << 20);
    assert_eq!(
        s.read_cache_hits + s.entry_log_reads + s.write_cache_hits,
        N,
        "{s:?}"
    );
    assert_eq!(s.write_cache_hits, 0, "{s:?}");
    // 1 KiB entries, 100 per read-ahead (1 MiB span bound not reached): 3 reads.
    assert!(s.entry_log_reads <= 4, "too many entry-log reads: {s:?}");
    assert!(s.read_cache_hits >= N - 4, "{s:?}");
    assert!(s.entries_read_ahead >= N - 4, "{s:?}");
}

#[test]
fn read_cache_bound_is_kept_and_reads_stay_exact() {
    // A cache of 16 KiB holds ~15 entries: read-ahead shrinks to half of it (~7 entries),
    // reads stay correct, the bound holds (checked after every read inside `scan`), and most
    // reads are still hits.
    let s = scan(100, 16 << 10);
    assert_eq!(s.read_cache_hits + s.entry_log_reads, N, "{s:?}");
    assert!(s.read_cache_bytes <= 16 << 10, "{s:?}");
    assert!(s.read_cache_hits > N / 2, "{s:?}");
    assert!(s.entry_log_reads < N / 2, "{s:?}");
}

#[test]
fn without_read_ahead_every_read_hits_the_entry_log() {
    let s = scan(0, 8 << 20);
    assert_eq!(s.entry_log_reads, N, "{s:?}");
    assert_eq!(s.entries_read_ahead, 0, "{s:?}");
}

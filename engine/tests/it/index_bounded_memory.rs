//! The index's memory stays bounded however many entries it holds, every entry still reads
//! back, and deleted ledgers' and moved entries' index entries leave the disk at merges.

use std::rc::Rc;
use std::time::Duration;

use crate::common::{payload, KEY};
use glommio::{LocalExecutorBuilder, Placement};
use quire_engine::sim_disk::SimStorage;
use quire_engine::{Engine, EngineConfig};

const CACHE_BYTES: usize = 256 << 10;
/// What the index may hold beyond its block cache: segment headers and top keys.
const OVERHEAD_BYTES: usize = 16 << 10;

fn config() -> EngineConfig {
    let mut c = EngineConfig::new("/sim/journal".into(), "/sim/ledgers".into());
    c.journal_file_size_bytes = 8 << 20;
    c.group_commit_wait_max = Duration::ZERO;
    c.write_cache_bytes_max = 64 << 20;
    c.checkpoint_interval = Duration::from_secs(3600);
    c.background_write_bytes_per_second = 0;
    c.index_cache_bytes_max = CACHE_BYTES;
    // Reads go to the index and the entry logs, not to the read cache.
    c.read_ahead_entries = 0;
    c.read_cache_bytes_max = 1;
    c.minor_compaction_interval = Duration::ZERO;
    c.major_compaction_interval = Duration::ZERO;
    c
}

fn run<Fut: std::future::Future<Output = ()> + 'static>(f: impl FnOnce() -> Fut + Send + 'static) {
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(f)
        .expect("spawn executor")
        .join()
        .expect("executor panicked");
}

/// Adds entries `from..to` of each of `ledgers`, `window` adds in flight at a time.
async fn add_range(engine: &Rc<Engine<SimStorage>>, ledgers: &[u64], from: u64, to: u64) {
    let window = 2000u64;
    let mut e = from;
    while e < to {
        let end = (e + window / ledgers.len() as u64).min(to);
        let mut tasks = Vec::new();
        for entry in e..end {
            for &ledger in ledgers {
                let engine = engine.clone();
                tasks.push(glommio::spawn_local(async move {
                    engine
                        .add_entry(
                            ledger,
                            entry,
                            KEY,
                            entry.checked_sub(1),
                            payload(ledger, entry, 12),
                            false,
                        )
                        .await
                        .unwrap_or_else(|err| panic!("add {ledger}/{entry}: {err}"));
                }));
            }
        }
        for t in tasks {
            t.await;
        }
        e = end;
    }
}

#[test]
fn half_a_million_entries_fit_a_bounded_index_and_all_read_back() {
    // Goal: the index's resident bytes (segment headers, top keys, block cache) stay under
    // index_cache_bytes_max plus a small fixed overhead, however many entries it holds, and
    // every entry still reads back through it. Method: 500,000 entries in 10 ledgers over ten
    // checkpoints (merges run in between); after each checkpoint, after reading every entry,
    // and after a reopen, check `index_stats().memory_bytes` against the bound. For scale: the
    // in-memory map this replaced held ≥ 48 bytes per entry (24 MB here).
    run(|| async {
        let storage = SimStorage::new(11);
        let engine = Engine::open_with(config(), storage.clone()).await.unwrap();
        let ledgers: Vec<u64> = (1..=10).collect();
        let per_ledger = 50_000u64;
        let rounds = 10u64;
        let bound = CACHE_BYTES + OVERHEAD_BYTES;
        let mut peak = 0u64;
        for r in 0..rounds {
            let from = r * per_ledger / rounds;
            add_range(&engine, &ledgers, from, from + per_ledger / rounds).await;
            engine.checkpoint().await.unwrap();
            let s = engine.index_stats();
            peak = peak.max(s.memory_bytes);
            assert!(
                s.memory_bytes as usize <= bound,
                "after checkpoint {r}: {s:?}"
            );
        }
        // The background merger catches up (it runs in the engine's low-share queue).
        let mut waited = 0;
        while engine.index_stats().segments > 4 && waited < 400 {
            glommio::timer::sleep(Duration::from_millis(50)).await;
            waited += 1;
        }
        let s = engine.index_stats();
        eprintln!("after 500,000 adds: {s:?}");
        assert!(
            s.segments <= 4 && s.merges >= 2,
            "background merges keep few segments: {s:?}"
        );
        assert!(s.memory_bytes as usize <= bound, "{s:?}");
        engine.merge_index().await.unwrap();
        let s = engine.index_stats();
        assert!(s.merges > 0, "no merge ran: {s:?}");
        assert_eq!(s.segments, 1, "merge_index merges everything: {s:?}");
        // Every entry reads back, through lookups whose blocks mostly miss the small cache.
        for entry in 0..per_ledger {
            for &ledger in &ledgers {
                let got = engine.read_entry(ledger, Some(entry)).await.unwrap();
                assert_eq!(got, payload(ledger, entry, 12), "{ledger}/{entry}");
            }
        }
        let s = engine.index_stats();
        eprintln!("after reading every entry: {s:?}");
        assert!(s.memory_bytes as usize <= bound, "{s:?}");
        assert!(
            s.cache_misses > 1000,
            "the cache bound was never met: {s:?}"
        );
        peak = peak.max(s.memory_bytes);
        engine.close().await.unwrap();

        let storage = SimStorage::from_image(&storage.durable_image(), 12);
        let engine = Engine::open_with(config(), storage).await.unwrap();
        for entry in (0..per_ledger).step_by(997) {
            for &ledger in &ledgers {
                let got = engine.read_entry(ledger, Some(entry)).await.unwrap();
                assert_eq!(got, payload(ledger, entry, 12));
            }
        }
        let s = engine.index_stats();
        assert!(s.memory_bytes as usize <= bound, "after reopen: {s:?}");
        eprintln!("peak index memory {peak} bytes for 500,000 entries (bound {bound})");
    });
}

#[test]
fn merges_drop_deleted_ledgers_and_moved_entries() {
    // Goal: after ledgers are deleted and entry logs compacted, a merge leaves exactly one
    // location per live entry on disk: none of the deleted ledgers, no old location of a moved
    // entry. Method: 4 ledgers over 6 checkpoints, delete 2, compact everything, merge; the
    // segments then hold exactly the survivors' entry count; all survivors read back, also
    // after a reopen.
    run(|| async {
        let mut cfg = config();
        cfg.entry_log_size_bytes_max = 64 << 10;
        let storage = SimStorage::new(5);
        let engine = Engine::open_with(cfg.clone(), storage.clone())
            .await
            .unwrap();
        let ledgers = [1u64, 2, 3, 4];
        for r in 0..6u64 {
            add_range(&engine, &ledgers, r * 500, (r + 1) * 500).await;
            engine.checkpoint().await.unwrap();
        }
        let before = engine.index_stats();
        assert_eq!(before.segment_entries, 4 * 3000, "{before:?}");
        let run = engine.collect_garbage(&[2, 3]).await.unwrap();
        assert_eq!(run.ledgers_deleted, 2);
        let compacted = engine.compact_entry_logs(0.99).await.unwrap();
        assert!(compacted.entries_relocated > 0, "{compacted:?}");
        engine.merge_index().await.unwrap();
        let s = engine.index_stats();
        assert_eq!(s.segments, 1, "{s:?}");
        assert_eq!(
            s.segment_entries,
            2 * 3000,
            "deleted or stale locations left: {s:?}"
        );
        for &ledger in &[1u64, 4] {
            for entry in 0..3000 {
                assert_eq!(
                    engine.read_entry(ledger, Some(entry)).await.unwrap(),
                    payload(ledger, entry, 12)
                );
            }
        }
        engine.verify_index().await.unwrap();
        engine.close().await.unwrap();
        let storage = SimStorage::from_image(&storage.durable_image(), 6);
        let engine = Engine::open_with(cfg, storage).await.unwrap();
        assert_eq!(engine.index_stats().segment_entries, 2 * 3000);
        let check = engine.verify_index().await.unwrap();
        assert_eq!(check.locations, 2 * 3000);
        assert!(engine.ledger_state(2).is_none() && engine.ledger_state(3).is_none());
    });
}

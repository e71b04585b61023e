//! Cost of the on-disk index against the in-memory map it replaced, in the same run.
//!
//! `cargo bench -p quire-engine --bench index` (env `QUIRE_INDEX_BENCH_ENTRIES`, default
//! 500,000; `QUIRE_INDEX_BENCH_LOOKUPS`, default 200,000).
//!
//! 1. Lookups: an engine on the real disk (O_DIRECT files in /tmp) gets N entries in 100
//!    ledgers over 10 checkpoints, merges run; then the same uniformly random (ledger, entry)
//!    keys are looked up in the engine's index (`Engine::index_lookup`, block cache of 16 MiB
//!    and of 1 MiB) and in a `HashMap<ledger, BTreeMap<entry, Location>>` holding the same
//!    keys, the structure of the previous in-memory index. Reported: ns per lookup and the
//!    ratio new / old, plus the index's resident bytes next to the map's estimated ones.
//! 2. Checkpoint index step: for one checkpoint's worth of locations (N / 10), writing a
//!    segment file (sorted blocks, block index, synced, directory synced) against appending a
//!    version 1 segment to `index.qix` and syncing it, alternated over 10 rounds; median ratio.
//!    The whole `Engine::checkpoint` time of the first phase is printed too.

// A benchmark's stopwatch is the real clock, whatever clock the code under test reads
// (quire_clock seam, clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use quire_engine::format::{Location, StoredLedger};
use quire_engine::io::{DmaStorage, Storage};
use quire_engine::{Engine, EngineConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const LEDGERS: u64 = 100;
const ROUNDS: u64 = 10;
const KEY: [u8; 20] = [7; 20];

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

async fn fill(engine: &Rc<Engine>, n: u64) -> Vec<Duration> {
    let per_ledger = n / LEDGERS;
    let mut checkpoints = Vec::new();
    for r in 0..ROUNDS {
        let from = r * per_ledger / ROUNDS;
        let to = (r + 1) * per_ledger / ROUNDS;
        let mut e = from;
        while e < to {
            let end = (e + 20).min(to);
            let mut tasks = Vec::new();
            for entry in e..end {
                for ledger in 1..=LEDGERS {
                    let engine = engine.clone();
                    tasks.push(glommio::spawn_local(async move {
                        engine
                            .add_entry(
                                ledger,
                                entry,
                                KEY,
                                entry.checked_sub(1),
                                vec![1u8; 16],
                                false,
                            )
                            .await
                            .expect("add");
                    }));
                }
            }
            for t in tasks {
                t.await;
            }
            e = end;
        }
        let t = Instant::now();
        engine.checkpoint().await.expect("checkpoint");
        checkpoints.push(t.elapsed());
    }
    engine.merge_index().await.expect("merge");
    checkpoints
}

fn keys(n: u64, count: u64, seed: u64) -> Vec<(u64, u64)> {
    let per_ledger = n / LEDGERS;
    let mut rng = StdRng::seed_from_u64(seed);
    (0..count)
        .map(|_| (rng.gen_range(1..=LEDGERS), rng.gen_range(0..per_ledger)))
        .collect()
}

async fn lookups(n: u64, count: u64, cache: usize) {
    let dir = tempfile::Builder::new()
        .prefix("quire-index-bench-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let mut cfg = EngineConfig::new(dir.path().join("j"), dir.path().join("l"));
    cfg.checkpoint_interval = Duration::from_secs(3600);
    cfg.write_cache_bytes_max = 512 << 20;
    cfg.index_cache_bytes_max = cache;
    cfg.journal_file_size_bytes = 64 << 20;
    let engine = Engine::open(cfg).await.expect("open");
    let cps = fill(&engine, n).await;
    let stats = engine.index_stats();
    let per_ledger = n / LEDGERS;
    let mut old: HashMap<u64, BTreeMap<u64, Location>> = HashMap::new();
    for ledger in 1..=LEDGERS {
        let m = old.entry(ledger).or_default();
        for entry in 0..per_ledger {
            m.insert(
                entry,
                Location {
                    log_id: 1 + entry / 10_000,
                    offset: 4096 + entry * 64,
                    data_len: 16,
                },
            );
        }
    }
    let ks = keys(n, count, 42);
    // Warm both once over a prefix (the cache gets what fits), then measure alternately.
    for &(l, e) in ks.iter().take(10_000) {
        engine
            .index_lookup(l, e)
            .await
            .expect("lookup")
            .expect("present");
    }
    let mut new_ns = Vec::new();
    let mut old_ns = Vec::new();
    for chunk in ks.chunks((count / 10).max(1) as usize) {
        let t = Instant::now();
        for &(l, e) in chunk {
            let loc = engine.index_lookup(l, e).await.expect("lookup");
            assert!(loc.is_some(), "{l}/{e} missing");
        }
        new_ns.push(t.elapsed().as_nanos() as f64 / chunk.len() as f64);
        let t = Instant::now();
        let mut found = 0u64;
        for &(l, e) in chunk {
            found += u64::from(std::hint::black_box(old.get(&l).and_then(|m| m.get(&e))).is_some());
        }
        assert_eq!(found, chunk.len() as u64);
        old_ns.push(t.elapsed().as_nanos() as f64 / chunk.len() as f64);
    }
    let after = engine.index_stats();
    let (new, oldm) = (median(new_ns), median(old_ns));
    // The old map: per entry a BTreeMap slot (8-byte key, 24-byte location) and node overhead.
    let old_bytes = n * 48;
    println!(
        "index lookup, {n} entries, cache {} KiB: new {new:.0} ns, old map {oldm:.0} ns, ratio {:.1}; \
         segments {}, index resident {} KiB (old map ≥ {} KiB), cache hits {} misses {}",
        cache >> 10,
        new / oldm,
        stats.segments,
        after.memory_bytes >> 10,
        old_bytes >> 10,
        after.cache_hits,
        after.cache_misses,
    );
    let ms: Vec<String> = cps
        .iter()
        .map(|d| format!("{:.1}", d.as_secs_f64() * 1e3))
        .collect();
    println!(
        "  whole checkpoints of {} entries each (entry logs + index + mark), ms: {}",
        n / ROUNDS,
        ms.join(" ")
    );
    engine.close().await.expect("close");
}

async fn checkpoint_index_step(n: u64) {
    let dir = tempfile::Builder::new()
        .prefix("quire-index-bench-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let storage = DmaStorage;
    storage.prepare_dir(dir.path()).await.expect("prepare");
    let per = n / ROUNDS;
    let per_ledger = per / LEDGERS;
    let mut locations = Vec::with_capacity(per as usize);
    for ledger in 1..=LEDGERS {
        for entry in 0..per_ledger {
            locations.push((
                ledger,
                entry,
                Location {
                    log_id: 3,
                    offset: 4096 + (ledger * per_ledger + entry) * 64,
                    data_len: 16,
                },
            ));
        }
    }
    let ledgers: Vec<(u64, StoredLedger)> = (1..=LEDGERS)
        .map(|l| {
            (
                l,
                StoredLedger {
                    fenced: false,
                    master_key: Some(KEY),
                    fence_keys: Vec::new(),
                    lac: Some(per_ledger - 2),
                    last_entry: Some(per_ledger - 1),
                },
            )
        })
        .collect();
    let legacy = storage
        .open(&dir.path().join("index.qix"), true)
        .await
        .expect("open legacy");
    let mut at = 4096u64;
    let mut ratios = Vec::new();
    let (mut new_ms, mut old_ms) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let t = Instant::now();
        quire_engine::bench::write_segment(&storage, dir.path(), round + 1, &locations, &ledgers)
            .await
            .expect("segment");
        let new = t.elapsed().as_secs_f64();
        let t = Instant::now();
        at += quire_engine::bench::append_legacy_segment(&legacy, at, &locations, &ledgers)
            .await
            .expect("legacy");
        let old = t.elapsed().as_secs_f64();
        ratios.push(new / old);
        new_ms.push(new * 1e3);
        old_ms.push(old * 1e3);
    }
    println!(
        "checkpoint index step, {per} locations: segment file {:.2} ms, index.qix append {:.2} ms (medians), \
         median ratio {:.2}",
        median(new_ms),
        median(old_ms),
        median(ratios)
    );
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let n = env_u64("QUIRE_INDEX_BENCH_ENTRIES", 500_000);
    let count = env_u64("QUIRE_INDEX_BENCH_LOOKUPS", 200_000);
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(8 << 20)
        .spawn(move || async move {
            for cache in [16usize << 20, 1 << 20] {
                lookups(n, count, cache).await;
            }
            checkpoint_index_step(n).await;
        })
        .expect("spawn executor")
        .join()
        .expect("executor panicked");
}

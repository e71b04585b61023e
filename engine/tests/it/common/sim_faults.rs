//! Helpers of the seeded storage-fault tests on the simulated disk (storage_faults, scrub):
//! the engine configuration they share, the seeds they run and the executor each seed gets.

use std::collections::BTreeMap;
use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};
use quire_engine::EngineConfig;

/// What was acknowledged: (ledger, entry) -> payload.
pub type Acked = BTreeMap<(u64, u64), Vec<u8>>;

/// How many seeds each test runs: `QUIRE_FAULT_SEEDS`, else 8.
pub fn seeds() -> u64 {
    std::env::var("QUIRE_FAULT_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
}

/// Small journal files and entry logs, so a few entries span several; no timed checkpoints.
pub fn cfg() -> EngineConfig {
    let mut c = EngineConfig::new("/sim/journal".into(), "/sim/ledgers".into());
    c.journal_file_size_bytes = 64 << 10;
    c.group_commit_wait_max = Duration::ZERO;
    // Checkpoints only when a test asks.
    c.checkpoint_interval = Duration::from_secs(3600);
    c.write_cache_bytes_max = 1 << 20;
    c.entry_log_size_bytes_max = 1 << 20;
    c.background_write_bytes_per_second = 0;
    c
}

/// Runs `f(seed)` on a fresh executor for every seed; panics naming the first failing seed.
pub fn each_seed<F, Fut>(name: &str, f: F)
where
    F: Fn(u64) -> Fut + Send + Clone + 'static,
    Fut: std::future::Future<Output = Result<String, String>> + 'static,
{
    for seed in 0..seeds() {
        let f = f.clone();
        let out = LocalExecutorBuilder::new(Placement::Unbound)
            .io_memory(1 << 20)
            .spawn(move || async move { f(seed).await })
            .expect("spawn executor")
            .join();
        match out {
            Ok(Ok(note)) => eprintln!("{name} seed {seed}: {note}"),
            Ok(Err(e)) => panic!("{name} seed {seed} (QUIRE_FAULT_SEEDS): {e}"),
            Err(e) => panic!("{name} seed {seed}: the engine panicked: {e:?}"),
        }
    }
}

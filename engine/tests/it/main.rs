//! The engine's integration tests (real O_DIRECT files and the crash-simulating disk of the
//! `sim-disk` feature), one module per behaviour, linked into one test binary. `common` holds the
//! shared executor and payload helpers.

// Integration tests run real processes, runtimes and sockets and wait on real deadlines: they
// read the real clock, not the quire_clock seam (clippy.toml, ARCHITECTURE.md).
#![allow(clippy::disallowed_methods)]

mod add_and_read;
mod bounded_add_queue_and_open_logs;
mod common;
mod crash_gc;
mod crash_sim;
mod fence_during_write_cache_wait;
mod fencing;
mod full_disk;
mod gc_on_disk;
mod golden_formats;
mod group_commit;
mod index_bounded_memory;
mod index_migration;
mod index_rebuild;
mod journal_precreate_and_throttle;
mod journal_reuse;
mod ledger_keys_and_re_adds;
mod long_poll_lac;
mod read_ahead_cache;
mod restart_replays_journal;
mod scrub;
mod storage_faults;
mod stress_rolls_checkpoints;
mod torn_tail_and_corruption;
mod write_cache_back_pressure;

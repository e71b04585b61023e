//! The `quire` command's integration tests: real ZooKeeper, `quire bookie`, `quire proxy` and
//! `quire sandbox` processes on loopback, loop-mounted small disks, libfaketime. One module per
//! behaviour, linked into one test binary. The cluster harness, the raw bookie wire client and the
//! history checker are `quire_testkit::harness` (its `harness` feature).

// Integration tests run real processes, runtimes and sockets and wait on real deadlines: they
// read the real clock, not the quire_clock seam (clippy.toml, ARCHITECTURE.md).
#![allow(clippy::disallowed_methods)]

mod bookie_info_command;
mod cluster_autorecovery;
mod cluster_balanced_ownership;
mod cluster_bookie_lifecycle_and_admin;
mod cluster_bookie_memory_and_connection_limits;
mod cluster_bookie_read_only_on_full_disk;
mod cluster_bookie_refuses_strangers;
mod cluster_decommission;
mod cluster_exactly_once;
mod cluster_failures;
mod cluster_fault_points;
mod cluster_follower_reads;
mod cluster_ledger_id_squatting;
mod cluster_ledger_keys;
mod cluster_load_balance;
mod cluster_many_streams;
mod cluster_metrics_endpoints;
mod cluster_move_window;
mod cluster_operator_commands;
mod cluster_proxy_limits;
mod cluster_proxy_memory_bounded;
mod cluster_proxy_tokens;
mod cluster_reads_without_recovery;
mod cluster_region_clients;
mod cluster_region_placement;
mod cluster_restarted_bookie_registers_after_replay;
mod cluster_scrub_repairs_rot;
mod cluster_slow_bookie;
mod cluster_stalled_bookie_reregisters;
mod cluster_stopped_bookie_ack_gap;
mod cluster_stream_lifecycle;
mod cluster_stream_placement;
mod cluster_stream_positions;
mod cluster_tls;
mod cluster_zk_acls;
mod proxy_drain_and_rolling_load;
mod sandbox_bookie_read_only_on_full_disk;
mod sandbox_cli_formats;
mod sandbox_crash_points;
mod sandbox_delete_frees_space;
mod sandbox_loghub_round_trip;
mod sandbox_metrics;
mod sandbox_refuses_bad_flags;
mod sandbox_refuses_inconsistent_data_dir;
mod sandbox_stream_lifecycle;
mod sandbox_survives_sigkill;
mod source_structure;

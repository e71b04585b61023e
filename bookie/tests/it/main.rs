//! The bookie's integration tests (real bookies on loopback, raw wire clients), one module per
//! behaviour, linked into one test binary. `common` holds the shared wire helpers.

// Integration tests run real processes, runtimes and sockets and wait on real deadlines: they
// read the real clock, not the quire_clock seam (clippy.toml, ARCHITECTURE.md).
#![allow(clippy::disallowed_methods)]

mod bad_input_gets_error_or_close;
mod bookies_on_a_shared_host;
mod cluster_secret_handshake;
mod common;
mod corrupt_index_segment_rebuilt_at_start;
mod cross_executor_wakes;
mod entries_survive_shutdown_and_restart;
mod fenced_ledger_and_master_key;
mod gc_deletes_only_ledgers_the_metadata_side_names;
mod handshake_then_add_read_lac;
mod key_binds_only_for_ledgers_the_metadata_side_knows;
mod long_poll_over_the_wire;
mod metrics_and_bookie_info;
mod pipelined_adds_answered_by_request_id;
mod port_limits_and_timeouts;
mod shutdown_answers_in_flight_and_restart_checks;
mod two_shards_one_connection;

//! The proxy's integration tests, one module per behaviour, linked into one test binary (a
//! binary per file cost a release link each). `common` holds the shared cluster harness.

// Integration tests run real processes, runtimes and sockets and wait on real deadlines: they
// read the real clock, not the quire_clock seam (clippy.toml, ARCHITECTURE.md).
#![allow(clippy::disallowed_methods)]

mod bad_requests_get_error_codes;
mod catch_up_reads_run_apart;
mod client_handshake_errors_name_the_peer;
mod client_splits_large_writes_and_pipelines;
mod common;
mod connection_limits_and_timeouts;
mod drain_tells_clients_what_it_did_not_read;
mod first_requests_race_to_acquire;
mod lifecycle_sweep;
mod protocol_garbage_and_oversized_frames;
mod proxy_restart_recovers_in_progress_segment;
mod reserved_txid_is_refused;
mod storage_failure_then_recovery;
mod stream_ledger_secrets;
mod stream_ownership_lost;
mod stream_ownership_redirect_and_takeover;
mod stream_pipelines_appends;
mod stream_spans_segments_and_reads_back;
mod stream_truncate_delete_retention;
mod tail_read_wakes_on_write;
mod tls_on_the_proxy_port;
mod txid_guard_refuses_far_ahead_txids;
mod write_answers_keep_request_order;
mod writes_acquire_off_the_read_loop;
mod zk_owner_session_expiry_moves_stream;

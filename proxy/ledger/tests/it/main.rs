//! The ledger client's integration tests against real bookies, one module per behaviour, linked into
//! one test binary.

// Integration tests run real processes, runtimes and sockets and wait on real deadlines: they
// read the real clock, not the quire_clock seam (clippy.toml, ARCHITECTURE.md).
#![allow(clippy::disallowed_methods)]

mod black_holed_bookie_and_bursts;
mod ensemble_change;
mod ensemble_change_on_read_only_bookie;
mod idle_connections_closed_by_bookies;
mod many_long_polls_share_the_read_lane;
mod quarantine_ends_on_reregistration;
mod quorum_striping_and_recovery;
mod reads_go_around_a_stalled_bookie;
mod replicate_fragment;
mod speculative_reads;
mod tls_to_bookies;

//! quire-autorecovery's integration tests: the auditor, the replication worker, decommission
//! and the daemon, on the embedded metadata store with real in-process bookies (one shard,
//! O_DIRECT files under a temporary directory, 127.0.0.1).

// Integration tests run real processes, runtimes and sockets and wait on real deadlines: they
// read the real clock, not the quire_clock seam (clippy.toml, ARCHITECTURE.md).
#![allow(clippy::disallowed_methods)]

mod auditor;
mod common;
mod daemon;
mod decommission;
mod worker;

//! The metadata store's integration tests (embedded store, ZooKeeper store), linked into one test
//! binary.

// Integration tests run real processes, runtimes and sockets and wait on real deadlines: they
// read the real clock, not the quire_clock seam (clippy.toml, ARCHITECTURE.md).
#![allow(clippy::disallowed_methods)]

mod embedded_autorecovery_records;
mod embedded_store_persists_and_compares;
mod golden_records;
mod zookeeper_store;

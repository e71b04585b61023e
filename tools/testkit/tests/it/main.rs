//! The test kit's own tests (its ZooKeeper server and TCP relay), linked into one test binary.

// Integration tests run real processes, runtimes and sockets and wait on real deadlines: they
// read the real clock, not the quire_clock seam (clippy.toml, ARCHITECTURE.md).
#![allow(clippy::disallowed_methods)]

mod tcp_relay;
mod zookeeper_server;

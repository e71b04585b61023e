//! The perf crate's integration tests, linked into one test binary.

// Integration tests run real processes, runtimes and sockets and wait on real deadlines: they
// read the real clock, not the quire_clock seam (clippy.toml, ARCHITECTURE.md).
#![allow(clippy::disallowed_methods)]

mod common_workload;
mod glommio_park;
mod open_loop;
mod slo_and_report;

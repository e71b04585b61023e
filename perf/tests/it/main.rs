//! The perf crate's integration tests, linked into one test binary.

mod common_workload;
mod glommio_park;
mod open_loop;
mod slo_and_report;

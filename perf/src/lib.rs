//! `quire-perf`: the latency-SLO harness (issue 4).
//!
//! It drives a running Quire cluster (the sandbox or a real one) through its proxy with
//! **open-loop** load: record `i` has an intended send time `start + i / rate`, fixed before the
//! run, and its latency is measured from that intended time, not from when it was actually sent.
//! A stall in the cluster (or in the harness) therefore shows up in the latency of every record
//! that should have been sent during it, instead of silently lowering the offered rate
//! ("coordinated omission", Gil Tene's term).
//!
//! Every latency figure comes from an HdrHistogram ([`hist`]); warm-up records are excluded.
//! A raw-device baseline ([`baseline`]) measured in the same run gives the disk's own durable
//! 4 KiB append latency and sequential write bandwidth, and the headline figures are reported as
//! ratios to it ([`report::derive_metrics`]), because the machine is shared and absolute times
//! move while same-run ratios hold. SLO files ([`slo`]) bound those figures; the binary prints a
//! verdict per SLO and exits non-zero when one fails.
//!
//! Modules holding the harness's own arithmetic ([`hist`], [`schedule`], [`slo`], [`report`],
//! [`plot`], [`payload`]) are pure and unit-tested; [`loadgen`] runs the open-loop schedule over
//! any async send function; [`workloads`] binds it to `quire_client::ProxyClient`.
//!
//! [`common_workload`] is the other harness (`quire-perf workload`): the replicated-log
//! workload shared with ../shared/bench (NATS, etcd, ...), its [`record`] layout, and CPU and
//! host figures from [`procfs`], one JSON line per mode.

pub mod baseline;
pub mod client;
pub mod common_workload;
pub mod hist;
pub mod loadgen;
pub mod payload;
pub mod plot;
pub mod procfs;
pub mod progress;
pub mod record;
pub mod report;
pub mod schedule;
pub mod slo;
pub mod workloads;

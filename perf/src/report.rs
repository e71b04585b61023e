//! Results of a run, the metrics derived from them (ratios to the same run's raw-device
//! baseline), the JSON report and the human summary.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::baseline::BaselineResult;
use crate::hist::Summary;
use crate::loadgen::OpenLoopReport;
use crate::slo::{Outcome, Verdict};

/// Format tag of the JSON report.
pub const REPORT_FORMAT: &str = "quire-perf/1";

const MIB: f64 = 1024.0 * 1024.0;

/// Every metric a run can produce, with its meaning. SLO files may name only these.
pub const METRICS: &[(&str, &str)] = &[
    ("baseline.append_p99_ms", "raw durable 4 KiB append p99 (mean of the start and end baselines), ms"),
    ("baseline.seq_write_mib_per_s", "raw sequential O_DIRECT write bandwidth (mean of start and end), MiB/s"),
    ("tail_write.p99_ms", "tail-write latency p99 at the fixed rate, ms"),
    ("tail_write.p99_ratio_to_raw_append_p99", "tail-write p99 ÷ raw durable-append p99"),
    ("throughput.sustained_records_per_s", "highest rate whose p99 stayed within throughput_p99_ms_max, records/s"),
    ("throughput.sustained_mib_per_s", "that rate in payload MiB/s"),
    (
        "throughput.ratio_to_raw_seq_bw_per_copy",
        "sustained payload bandwidth ÷ (raw sequential bandwidth ÷ write amplification, 6 = Qw 3 × journal + entry log)",
    ),
    ("tail_read.delivery_p99_ms", "append → tailing reader delivery latency p99, from the intended send time, ms"),
    ("tail_read.write_p99_ms", "tail-write p99 of the same run, ms"),
    ("tail_read.delivery_p99_minus_write_p99_ms", "delivery p99 − write p99 of the same run, ms"),
    ("catch_up.mib_per_s", "catch-up read of a backlog from the head, payload MiB/s"),
    ("catch_up.records_per_s", "catch-up read, records/s"),
    ("catch_up.ratio_to_raw_seq_bw", "catch-up read bandwidth ÷ raw sequential write bandwidth"),
    ("isolation.alone_p99_ms", "tail-write p99 with no reader, ms"),
    ("isolation.with_scan_p99_ms", "tail-write p99 while a catch-up reader scans the backlog, ms"),
    ("isolation.p99_increase_fraction", "with-scan p99 ÷ alone p99 − 1 (0.25 = 25% higher)"),
];

/// One step of the throughput search.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ThroughputStep {
    /// The open-loop run at this rate.
    pub run: OpenLoopReport,
    /// p99 within the bound, no error, nothing censored.
    pub passed: bool,
}

/// The maximum sustainable durable throughput search.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ThroughputReport {
    /// The p99 bound each step is held to, ms.
    pub p99_ms_max: f64,
    /// Steps in the order run.
    pub steps: Vec<ThroughputStep>,
    /// Highest passing rate, records/s (0 when none passed).
    pub sustained_records_per_s: f64,
    /// Payload bytes per record.
    pub record_size_bytes: usize,
    /// Divisor of the raw bandwidth for the per-copy ratio.
    pub write_amplification: f64,
}

/// Tail-read delivery: a writer at a fixed rate and readers tailing the stream.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TailReadReport {
    /// The writer's open-loop run.
    pub write: OpenLoopReport,
    /// Delivery latency: reader receipt − intended send time (warm-up excluded).
    pub delivery: Summary,
    /// Its percentile distribution `(quantile, ms)`, for plots.
    pub delivery_distribution: Vec<(f64, f64)>,
    /// Records delivered to the readers (warm-up included).
    pub delivered: u64,
    /// Recorded records never delivered before the readers stopped; each is in `delivery` at
    /// a lower bound (stop time − intended time).
    pub delivery_censored: u64,
    /// Records acknowledged to the writer (warm-up included).
    pub acknowledged: u64,
}

/// Catch-up read throughput over a backlog.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CatchUpReport {
    /// Records in the backlog.
    pub backlog_records: u64,
    /// Payload bytes in the backlog.
    pub backlog_bytes: u64,
    /// Time to write the backlog, seconds.
    pub fill_seconds: f64,
    /// Time to read it from the head, seconds.
    pub scan_seconds: f64,
    /// Records read.
    pub records_read: u64,
    /// Latency of each read call.
    pub read_call: Summary,
}

impl CatchUpReport {
    /// Payload bytes read per second.
    pub fn bytes_per_s(&self) -> f64 {
        if self.scan_seconds > 0.0 {
            self.backlog_bytes as f64
                * (self.records_read as f64 / self.backlog_records.max(1) as f64)
                / self.scan_seconds
        } else {
            0.0
        }
    }
}

/// Tail-write latency alone, then during a catch-up scan.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct IsolationReport {
    /// Tail writes with no reader.
    pub alone: OpenLoopReport,
    /// Tail writes while the scanner reads the backlog as fast as it can.
    pub with_scan: OpenLoopReport,
    /// The scanner's bandwidth meanwhile, payload bytes/s.
    pub scan_bytes_per_s: f64,
}

/// Everything one run measured; a workload not run is `None`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RunResults {
    /// Raw-device baseline before the workloads.
    pub baseline_start: Option<BaselineResult>,
    /// Raw-device baseline after the workloads.
    pub baseline_end: Option<BaselineResult>,
    /// Tail-write latency at the fixed rate.
    pub tail_write: Option<OpenLoopReport>,
    /// Maximum sustainable durable throughput.
    pub throughput: Option<ThroughputReport>,
    /// Tail-read delivery latency.
    pub tail_read: Option<TailReadReport>,
    /// Catch-up read throughput.
    pub catch_up: Option<CatchUpReport>,
    /// Isolation of tail writes from a catch-up scan.
    pub isolation: Option<IsolationReport>,
}

/// The disk's figures the ratios divide by: the mean of the baselines taken.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Reference {
    /// Raw durable-append p99, ms.
    pub append_p99_ms: f64,
    /// Raw sequential bandwidth, bytes/s.
    pub seq_write_bytes_per_s: f64,
}

/// The reference from whichever baselines exist (mean of both when both do).
pub fn reference(
    start: Option<&BaselineResult>,
    end: Option<&BaselineResult>,
) -> Option<Reference> {
    let taken: Vec<&BaselineResult> = [start, end].into_iter().flatten().collect();
    if taken.is_empty() {
        return None;
    }
    let n = taken.len() as f64;
    Some(Reference {
        append_p99_ms: taken.iter().map(|b| b.append.p99_ms).sum::<f64>() / n,
        seq_write_bytes_per_s: taken.iter().map(|b| b.seq_write_bytes_per_s).sum::<f64>() / n,
    })
}

/// `a / b`, or `None` when `b` is not a positive finite number.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b.is_finite() && b > 0.0 && a.is_finite()).then(|| a / b)
}

/// The flat metrics of a run (names from [`METRICS`]); a metric whose inputs are missing is
/// absent.
pub fn derive_metrics(r: &RunResults) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    let mut put = |k: &str, v: Option<f64>| {
        debug_assert!(
            METRICS.iter().any(|(n, _)| *n == k),
            "{k} is not in METRICS"
        );
        if let Some(v) = v {
            m.insert(k.to_string(), v);
        }
    };
    let reference = reference(r.baseline_start.as_ref(), r.baseline_end.as_ref());
    put("baseline.append_p99_ms", reference.map(|b| b.append_p99_ms));
    put(
        "baseline.seq_write_mib_per_s",
        reference.map(|b| b.seq_write_bytes_per_s / MIB),
    );
    if let Some(t) = &r.tail_write {
        put("tail_write.p99_ms", Some(t.latency.p99_ms));
        put(
            "tail_write.p99_ratio_to_raw_append_p99",
            reference.and_then(|b| ratio(t.latency.p99_ms, b.append_p99_ms)),
        );
    }
    if let Some(t) = &r.throughput {
        let bytes = t.sustained_records_per_s * t.record_size_bytes as f64;
        put(
            "throughput.sustained_records_per_s",
            Some(t.sustained_records_per_s),
        );
        put("throughput.sustained_mib_per_s", Some(bytes / MIB));
        put(
            "throughput.ratio_to_raw_seq_bw_per_copy",
            reference.and_then(|b| ratio(bytes, b.seq_write_bytes_per_s / t.write_amplification)),
        );
    }
    if let Some(t) = &r.tail_read {
        put("tail_read.delivery_p99_ms", Some(t.delivery.p99_ms));
        put("tail_read.write_p99_ms", Some(t.write.latency.p99_ms));
        put(
            "tail_read.delivery_p99_minus_write_p99_ms",
            Some(t.delivery.p99_ms - t.write.latency.p99_ms),
        );
    }
    if let Some(c) = &r.catch_up {
        put("catch_up.mib_per_s", Some(c.bytes_per_s() / MIB));
        put(
            "catch_up.records_per_s",
            (c.scan_seconds > 0.0).then(|| c.records_read as f64 / c.scan_seconds),
        );
        put(
            "catch_up.ratio_to_raw_seq_bw",
            reference.and_then(|b| ratio(c.bytes_per_s(), b.seq_write_bytes_per_s)),
        );
    }
    if let Some(i) = &r.isolation {
        put("isolation.alone_p99_ms", Some(i.alone.latency.p99_ms));
        put(
            "isolation.with_scan_p99_ms",
            Some(i.with_scan.latency.p99_ms),
        );
        put(
            "isolation.p99_increase_fraction",
            ratio(i.with_scan.latency.p99_ms, i.alone.latency.p99_ms).map(|x| x - 1.0),
        );
    }
    m
}

/// Metrics computed from a run with failed writes, writes not acknowledged by the drain
/// deadline, or records never delivered: an overloaded run, whose latencies are partly lower
/// bounds, so differences and ratios of them prove nothing. An SLO on such a metric fails.
pub fn overloaded_metrics(r: &RunResults) -> BTreeSet<String> {
    let bad = |o: &OpenLoopReport| o.censored > 0 || o.errors > 0;
    let mut prefixes = Vec::new();
    if r.tail_write.as_ref().is_some_and(bad) {
        prefixes.push("tail_write.");
    }
    if r.tail_read
        .as_ref()
        .is_some_and(|t| bad(&t.write) || t.delivery_censored > 0)
    {
        prefixes.push("tail_read.");
    }
    if r.isolation
        .as_ref()
        .is_some_and(|i| bad(&i.alone) || bad(&i.with_scan))
    {
        prefixes.push("isolation.");
    }
    METRICS
        .iter()
        .map(|(m, _)| *m)
        .filter(|m| prefixes.iter().any(|p| m.starts_with(p)))
        .map(str::to_string)
        .collect()
}

/// The JSON report.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// Always [`REPORT_FORMAT`].
    pub format: String,
    /// Wall-clock start, milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// The settings of the run (command-line options).
    pub config: serde_json::Value,
    /// What each workload measured.
    pub results: RunResults,
    /// The baseline figures the ratios divide by.
    pub reference: Option<Reference>,
    /// Flat metrics, the SLOs' inputs.
    pub metrics: BTreeMap<String, f64>,
    /// Metrics from overloaded runs ([`overloaded_metrics`]); their SLOs fail.
    pub overloaded_metrics: BTreeSet<String>,
    /// Verdict per SLO.
    pub slo: Vec<Outcome>,
    /// No SLO failed.
    pub passed: bool,
}

fn open_loop_line(out: &mut String, label: &str, r: &OpenLoopReport) {
    let _ = writeln!(
        out,
        "  {label:<22} {:>8.0} rec/s  {}",
        r.rate_records_per_s, r.latency
    );
    if r.errors > 0 || r.censored > 0 {
        let _ = writeln!(
            out,
            "  {:<22} warning: {} errors, {} not acknowledged in time (recorded at a lower bound){}",
            "",
            r.errors,
            r.censored,
            r.first_error.as_deref().map(|e| format!("; first error: {e}")).unwrap_or_default()
        );
    }
}

/// The human summary printed on stdout.
pub fn human_summary(report: &Report) -> String {
    let mut out = String::new();
    let r = &report.results;
    let _ = writeln!(
        out,
        "quire-perf results (latencies from the intended send time; warm-up excluded)"
    );
    for (label, b) in [
        ("baseline (start)", &r.baseline_start),
        ("baseline (end)", &r.baseline_end),
    ] {
        if let Some(b) = b {
            let _ = writeln!(
                out,
                "  {label:<22} {}: {}  ({:.0} ops/s)",
                b.sync_mode, b.append, b.append_ops_per_s
            );
            let _ = writeln!(
                out,
                "  {:<22} sequential {} KiB O_DIRECT writes: {:.1} MiB/s",
                "",
                b.seq_block_size_bytes / 1024,
                b.seq_write_bytes_per_s / MIB
            );
        }
    }
    if let Some(t) = &r.tail_write {
        open_loop_line(&mut out, "tail-write", t);
    }
    if let Some(t) = &r.throughput {
        for s in &t.steps {
            open_loop_line(
                &mut out,
                if s.passed {
                    "throughput step ok"
                } else {
                    "throughput step over"
                },
                &s.run,
            );
        }
        let _ = writeln!(
            out,
            "  {:<22} sustained {:.0} rec/s ({:.2} MiB/s) with p99 <= {} ms",
            "throughput",
            t.sustained_records_per_s,
            t.sustained_records_per_s * t.record_size_bytes as f64 / MIB,
            t.p99_ms_max
        );
    }
    if let Some(t) = &r.tail_read {
        open_loop_line(&mut out, "tail-read (writer)", &t.write);
        let _ = writeln!(
            out,
            "  {:<22} delivery {}  ({} delivered, {} acknowledged)",
            "tail-read (reader)", t.delivery, t.delivered, t.acknowledged
        );
        if t.delivery_censored > 0 {
            let _ = writeln!(
                out,
                "  {:<22} warning: {} records never delivered (recorded at a lower bound)",
                "", t.delivery_censored
            );
        }
    }
    if let Some(c) = &r.catch_up {
        let _ = writeln!(
            out,
            "  {:<22} {} records ({:.0} MiB) read in {:.2} s: {:.1} MiB/s; read call {}",
            "catch-up",
            c.records_read,
            c.backlog_bytes as f64 / MIB,
            c.scan_seconds,
            c.bytes_per_s() / MIB,
            c.read_call
        );
    }
    if let Some(i) = &r.isolation {
        open_loop_line(&mut out, "isolation (alone)", &i.alone);
        open_loop_line(&mut out, "isolation (with scan)", &i.with_scan);
        let _ = writeln!(
            out,
            "  {:<22} scanner read {:.1} MiB/s meanwhile",
            "",
            i.scan_bytes_per_s / MIB
        );
    }
    let _ = writeln!(out, "metrics:");
    for (k, v) in &report.metrics {
        let _ = writeln!(out, "  {k:<46} {v:.3}");
    }
    let _ = writeln!(out, "SLOs:");
    for o in &report.slo {
        let bound = match (o.slo.min, o.slo.max) {
            (Some(lo), Some(hi)) => format!("in [{lo}, {hi}]"),
            (Some(lo), None) => format!(">= {lo}"),
            (None, Some(hi)) => format!("<= {hi}"),
            (None, None) => String::new(),
        };
        let value = o
            .value
            .map_or_else(|| "-".to_string(), |v| format!("{v:.3}"));
        let value = if o.overloaded {
            format!("{value} (overloaded run: latencies partly lower bounds)")
        } else {
            value
        };
        let _ = writeln!(
            out,
            "  {:<13} {}: {} = {value} (want {bound})",
            o.verdict.to_string(),
            o.slo.name,
            o.slo.metric
        );
    }
    let failed = report
        .slo
        .iter()
        .filter(|o| o.verdict == Verdict::Fail)
        .count();
    let _ = writeln!(
        out,
        "{}",
        if failed == 0 {
            "all SLOs met".to_string()
        } else {
            format!("{failed} SLO(s) FAILED")
        }
    );
    out
}

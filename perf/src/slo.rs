//! SLO files: which figure of a run must stay within which bound.
//!
//! ```toml
//! # Optional: the p99 bound the throughput search holds each rate to, as a multiple of the
//! # same run's raw durable-append p99 (or, with throughput_p99_ms_max, in milliseconds).
//! throughput_p99_ratio_to_raw_append_p99_max = 2.0
//!
//! [[slo]]
//! name = "tail-write p99 at 2000 records/s <= 2x raw durable-append p99"
//! metric = "tail_write.p99_ratio_to_raw_append_p99"
//! max = 2.0
//! ```
//!
//! Each `[[slo]]` names one metric of [`crate::report::METRICS`] (the workload is its prefix)
//! and a `min`, a `max`, or both (inclusive). A metric the run did not measure (its workload
//! was not selected, or it failed) gets the verdict "not measured", which is not a failure.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::report::METRICS;

/// One SLO: a metric and its bounds.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Slo {
    /// What a person reads in the verdict.
    pub name: String,
    /// Metric name, e.g. `tail_write.p99_ratio_to_raw_append_p99`.
    pub metric: String,
    /// Lowest passing value (inclusive).
    #[serde(default)]
    pub min: Option<f64>,
    /// Highest passing value (inclusive).
    #[serde(default)]
    pub max: Option<f64>,
}

/// A parsed SLO file.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SloFile {
    /// The p99 (ms) each step of the throughput search must stay within; overrides the ratio.
    #[serde(default)]
    pub throughput_p99_ms_max: Option<f64>,
    /// The p99 bound of the throughput search as a multiple of the same run's raw
    /// durable-append p99 (used when the run has a baseline and no absolute bound is given).
    #[serde(default)]
    pub throughput_p99_ratio_to_raw_append_p99_max: Option<f64>,
    /// The SLOs, in file order.
    #[serde(default, rename = "slo")]
    pub slos: Vec<Slo>,
}

/// Why an SLO file was refused.
#[derive(Debug, Clone, PartialEq)]
pub struct SloError(pub String);

impl std::fmt::Display for SloError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SloError {}

/// Parses and checks an SLO file.
///
/// # Errors
/// [`SloError`] naming the problem: TOML syntax, an unknown key, no SLO at all, an SLO without
/// `min` or `max`, a bound that is not a finite number, `min` above `max`, an unknown metric
/// (the message lists the known ones), two SLOs with the same name, a non-positive
/// `throughput_p99_ms_max`.
pub fn parse(text: &str) -> Result<SloFile, SloError> {
    let file: SloFile =
        toml::from_str(text).map_err(|e| SloError(format!("SLO file is not valid: {e}")))?;
    if file.slos.is_empty() {
        return Err(SloError("SLO file names no [[slo]]".into()));
    }
    for (key, v) in [
        ("throughput_p99_ms_max", file.throughput_p99_ms_max),
        (
            "throughput_p99_ratio_to_raw_append_p99_max",
            file.throughput_p99_ratio_to_raw_append_p99_max,
        ),
    ] {
        if let Some(v) = v {
            if !v.is_finite() || v <= 0.0 {
                return Err(SloError(format!(
                    "{key} must be a positive number, not {v}"
                )));
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    for s in &file.slos {
        if !seen.insert(s.name.as_str()) {
            return Err(SloError(format!("two SLOs are named {:?}", s.name)));
        }
        if !METRICS.iter().any(|(m, _)| *m == s.metric) {
            let known: Vec<&str> = METRICS.iter().map(|(m, _)| *m).collect();
            return Err(SloError(format!(
                "SLO {:?}: unknown metric {:?}; known metrics: {}",
                s.name,
                s.metric,
                known.join(", ")
            )));
        }
        if s.min.is_none() && s.max.is_none() {
            return Err(SloError(format!(
                "SLO {:?} has neither min nor max",
                s.name
            )));
        }
        for v in [s.min, s.max].into_iter().flatten() {
            if !v.is_finite() {
                return Err(SloError(format!(
                    "SLO {:?}: bound {v} is not a finite number",
                    s.name
                )));
            }
        }
        if let (Some(lo), Some(hi)) = (s.min, s.max) {
            if lo > hi {
                return Err(SloError(format!(
                    "SLO {:?}: min {lo} is above max {hi}",
                    s.name
                )));
            }
        }
    }
    Ok(file)
}

/// The verdict on one SLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Within bounds.
    Pass,
    /// Outside bounds.
    Fail,
    /// The run has no value for the metric.
    NotMeasured,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::NotMeasured => "NOT MEASURED",
        })
    }
}

/// An SLO with the run's value and the verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// The SLO.
    #[serde(flatten)]
    pub slo: Slo,
    /// The metric's value in this run, if measured.
    pub value: Option<f64>,
    /// The metric comes from an overloaded run (see `report::overloaded_metrics`).
    pub overloaded: bool,
    /// Pass, fail, or not measured.
    pub verdict: Verdict,
}

/// The verdict of `slo` against a value (`None` when not measured). A NaN value fails.
pub fn verdict(slo: &Slo, value: Option<f64>) -> Verdict {
    let Some(v) = value else {
        return Verdict::NotMeasured;
    };
    let above_min = slo.min.is_none_or(|lo| v >= lo);
    let below_max = slo.max.is_none_or(|hi| v <= hi);
    if v.is_finite() && above_min && below_max {
        Verdict::Pass
    } else {
        Verdict::Fail
    }
}

/// The throughput search's p99 bound when neither the command line nor the SLO file sets one,
/// ms: an absolute bound a replicated write (E=3 Qw=3 Qa=2 on loopback) meets at low load on
/// the development machine (2-15 ms measured; perf/README.md, "Default search bound"). The old
/// default, 2 x the raw fdatasync p99 (about 0.5 ms), no replicated write meets.
pub const THROUGHPUT_P99_MS_DEFAULT: f64 = 20.0;

/// The p99 bound (ms) of the throughput search: `cli_ms` if given, else the file's
/// `throughput_p99_ms_max`, else its ratio × `raw_append_p99_ms` (when the run has a baseline),
/// else `fallback_ms`.
pub fn throughput_p99_bound_ms(
    file: &SloFile,
    cli_ms: Option<f64>,
    raw_append_p99_ms: Option<f64>,
    fallback_ms: f64,
) -> f64 {
    cli_ms
        .or(file.throughput_p99_ms_max)
        .or_else(|| {
            file.throughput_p99_ratio_to_raw_append_p99_max
                .zip(raw_append_p99_ms)
                .map(|(r, p)| r * p)
        })
        .unwrap_or(fallback_ms)
}

/// Verdicts of every SLO of `file` against `metrics`, in file order. A measured metric named in
/// `overloaded` fails whatever its value: it was computed from lower bounds.
pub fn evaluate(
    file: &SloFile,
    metrics: &BTreeMap<String, f64>,
    overloaded: &BTreeSet<String>,
) -> Vec<Outcome> {
    file.slos
        .iter()
        .map(|s| {
            let value = metrics.get(&s.metric).copied();
            let over = value.is_some() && overloaded.contains(&s.metric);
            let verdict = if over {
                Verdict::Fail
            } else {
                verdict(s, value)
            };
            Outcome {
                slo: s.clone(),
                value,
                overloaded: over,
                verdict,
            }
        })
        .collect()
}

/// True when no outcome failed.
pub fn all_passed(outcomes: &[Outcome]) -> bool {
    outcomes.iter().all(|o| o.verdict != Verdict::Fail)
}

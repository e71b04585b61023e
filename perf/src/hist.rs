//! Latency histograms: an HdrHistogram of nanoseconds, summarised in milliseconds (the SLO
//! reports) or microseconds (the common workload's JSON lines, `summary_us`).

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Lowest value the histogram tells apart from zero: 1 ns (the common workload's bounds, see
/// the shared reference workload.md: 1 ns to 1 h, 3 significant digits).
pub const LOWEST_DISCERNIBLE_NS: u64 = 1;
/// Highest value recorded exactly: one hour, in nanoseconds. Larger values are clamped to it.
pub const HIGHEST_TRACKABLE_NS: u64 = 3_600 * 1_000_000_000;
/// Significant decimal digits kept (0.1% relative precision).
pub const SIGNIFICANT_DIGITS: u8 = 3;

/// Quantiles shown in every summary.
pub const SUMMARY_QUANTILES: [f64; 4] = [0.50, 0.90, 0.99, 0.999];

/// A latency histogram: values in nanoseconds, 3 significant digits, 1 ns to 1 h.
#[derive(Clone)]
pub struct LatencyHistogram {
    h: Histogram<u64>,
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("count", &self.h.len())
            .finish()
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        let h = Histogram::new_with_bounds(
            LOWEST_DISCERNIBLE_NS,
            HIGHEST_TRACKABLE_NS,
            SIGNIFICANT_DIGITS,
        )
        .expect("constant bounds are valid");
        Self { h }
    }

    /// Records one latency; values above one hour are clamped to one hour.
    pub fn record(&mut self, latency: Duration) {
        self.record_n(latency, 1);
    }

    /// Records `n` samples of the same latency (a write of `n` records acknowledged at once).
    pub fn record_n(&mut self, latency: Duration, n: u64) {
        let ns = u64::try_from(latency.as_nanos())
            .unwrap_or(u64::MAX)
            .min(HIGHEST_TRACKABLE_NS);
        self.h.saturating_record_n(ns, n);
    }

    /// Adds every sample of `other`.
    pub fn add(&mut self, other: &LatencyHistogram) {
        self.h
            .add(&other.h)
            .expect("histograms with the same bounds always add");
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.h.len()
    }

    /// Records one latency given in nanoseconds; values above one hour are clamped to one hour.
    pub fn record_ns(&mut self, ns: u64) {
        self.h.saturating_record(ns.min(HIGHEST_TRACKABLE_NS));
    }

    /// The common workload's latency object: `{n, mean, p50, p90, p99, p999, max}`, every value
    /// but `n` in microseconds rounded to 0.1 µs; `p999` is the value at quantile 0.999. An empty
    /// histogram gives `{"n": 0}` (no percentiles to report).
    pub fn summary_us(&self) -> serde_json::Value {
        let h = &self.h;
        if h.is_empty() {
            return serde_json::json!({ "n": 0 });
        }
        let us = |ns: f64| (ns / 100.0).round() / 10.0;
        let q = |x: f64| us(h.value_at_quantile(x) as f64);
        serde_json::json!({
            "n": h.len(),
            "mean": us(h.mean()),
            "p50": q(0.50),
            "p90": q(0.90),
            "p99": q(0.99),
            "p999": q(0.999),
            "max": us(h.max() as f64),
        })
    }

    /// Value at quantile `q` (0..=1), in milliseconds; 0 when empty. HdrHistogram reports the
    /// highest value equivalent to the sample at that rank (within 0.1%).
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.h.is_empty() {
            return 0.0;
        }
        ns_to_ms(self.h.value_at_quantile(q.clamp(0.0, 1.0)))
    }

    /// The standard summary: count, mean, p50, p90, p99, p99.9, max.
    pub fn summary(&self) -> Summary {
        if self.h.is_empty() {
            return Summary::default();
        }
        Summary {
            count: self.h.len(),
            mean_ms: self.h.mean() / 1e6,
            p50_ms: self.quantile_ms(0.50),
            p90_ms: self.quantile_ms(0.90),
            p99_ms: self.quantile_ms(0.99),
            p999_ms: self.quantile_ms(0.999),
            max_ms: ns_to_ms(self.h.max()),
        }
    }

    /// The percentile distribution for plotting: `(quantile, milliseconds)` at quantiles
    /// `1 - 10^(-k/10)` for k = 0, 1, ... up to the last quantile with at least one sample beyond
    /// it (so a curve never claims more resolution than it has), followed by the maximum at
    /// quantile `1 - 1/(2·count)`.
    pub fn distribution(&self) -> Vec<(f64, f64)> {
        let n = self.h.len();
        if n == 0 {
            return Vec::new();
        }
        let mut out = Vec::new();
        for k in 0..=60 {
            let q = 1.0 - 10f64.powf(-(k as f64) / 10.0);
            // Ranks beyond the last sample say nothing new.
            if (1.0 - q) * (n as f64) < 1.0 - 1e-9 {
                break;
            }
            out.push((q, self.quantile_ms(q)));
        }
        out.push((1.0 - 0.5 / n as f64, ns_to_ms(self.h.max())));
        out
    }
}

fn ns_to_ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Count and percentiles of one latency histogram, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Summary {
    /// Samples (warm-up excluded).
    pub count: u64,
    /// Arithmetic mean.
    pub mean_ms: f64,
    /// 50th percentile.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest sample.
    pub max_ms: f64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "n={} p50={:.3} p90={:.3} p99={:.3} p99.9={:.3} max={:.3} ms",
            self.count, self.p50_ms, self.p90_ms, self.p99_ms, self.p999_ms, self.max_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: percentiles of a known input are what the definition says (within HdrHistogram's
    // 0.1% precision). Method: record 1..=1000 ms once each; the p-th percentile of that set is
    // p·10 ms.
    #[test]
    fn percentiles_of_a_uniform_ramp() {
        let mut h = LatencyHistogram::new();
        for ms in 1..=1000u64 {
            h.record(Duration::from_millis(ms));
        }
        let s = h.summary();
        assert_eq!(s.count, 1000);
        let close = |got: f64, want: f64| (got - want).abs() <= want * 0.001 + 1e-9;
        assert!(close(s.p50_ms, 500.0), "p50 {}", s.p50_ms);
        assert!(close(s.p90_ms, 900.0), "p90 {}", s.p90_ms);
        assert!(close(s.p99_ms, 990.0), "p99 {}", s.p99_ms);
        assert!(close(s.p999_ms, 999.0), "p99.9 {}", s.p999_ms);
        assert!(close(s.max_ms, 1000.0), "max {}", s.max_ms);
        assert!(close(s.mean_ms, 500.5), "mean {}", s.mean_ms);
    }

    // Goal: one outlier among many fast samples moves p99.9 and max but not p99 — the reason
    // every figure is a high percentile and not a mean. Method: 999 samples of 1 ms and one of
    // 2 s.
    #[test]
    fn a_single_outlier_shows_in_max_only() {
        let mut h = LatencyHistogram::new();
        h.record_n(Duration::from_millis(1), 999);
        h.record(Duration::from_secs(2));
        let s = h.summary();
        assert!((s.p99_ms - 1.0).abs() < 0.002, "p99 {}", s.p99_ms);
        assert!(
            (s.p999_ms - 1.0).abs() < 0.002,
            "p99.9 is rank 999 of 1000: {}",
            s.p999_ms
        );
        assert!((s.max_ms - 2000.0).abs() < 2.0, "max {}", s.max_ms);
    }

    // Goal: an empty histogram summarises to zeros instead of panicking, and huge values are
    // clamped rather than lost. Method: summary of nothing; record 2 h and read the max.
    #[test]
    fn empty_and_clamped() {
        let h = LatencyHistogram::new();
        assert_eq!(h.summary(), Summary::default());
        assert!(h.distribution().is_empty());
        let mut h = LatencyHistogram::new();
        h.record(Duration::from_secs(7200));
        assert_eq!(h.count(), 1);
        assert!((h.summary().max_ms - 3_600_000.0).abs() < 3_600.0);
    }

    // Goal: the plotted distribution is monotone and stops where the data stops. Method: 1000
    // samples give quantiles up to 0.999 (k = 30) and then the max point.
    #[test]
    fn distribution_is_monotone_and_bounded() {
        let mut h = LatencyHistogram::new();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us * 10));
        }
        let d = h.distribution();
        assert_eq!(d.len(), 31 + 1, "k = 0..=30, then the max");
        for w in d.windows(2) {
            assert!(w[0].0 < w[1].0 && w[0].1 <= w[1].1, "{w:?}");
        }
        assert!((d.last().unwrap().1 - 10.0).abs() < 0.01);
    }

    // Goal: the common workload's latency object has exactly its field names, in microseconds
    // at 0.1 µs resolution, and nanosecond inputs keep their precision (lowest bound 1 ns).
    // Method: 1000 samples of 1..=1000 µs plus 0.25 µs; an empty histogram gives only n.
    #[test]
    fn summary_in_microseconds() {
        let mut h = LatencyHistogram::new();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        h.record_ns(250);
        let v = h.summary_us();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        let mut want = vec!["n", "mean", "p50", "p90", "p99", "p999", "max"];
        want.sort();
        let mut got = keys.clone();
        got.sort();
        assert_eq!(got, want);
        assert_eq!(v["n"], 1001);
        let close = |k: &str, want: f64| {
            let got = v[k].as_f64().unwrap();
            assert!(
                (got - want).abs() <= want * 0.001 + 0.1,
                "{k}: {got} vs {want}"
            );
        };
        close("p50", 500.0);
        close("p90", 900.0);
        close("p99", 990.0);
        close("p999", 999.0);
        close("max", 1000.0);
        close("mean", 500.0);
        let mut small = LatencyHistogram::new();
        small.record_ns(250);
        assert_eq!(
            small.summary_us()["p50"],
            0.3,
            "250 ns is kept, rounded to 0.1 us"
        );
        assert_eq!(
            LatencyHistogram::new().summary_us(),
            serde_json::json!({"n": 0})
        );
    }

    // Goal: adding histograms is the union of their samples. Method: two halves of a ramp.
    #[test]
    fn add_merges_samples() {
        let mut a = LatencyHistogram::new();
        let mut b = LatencyHistogram::new();
        for ms in 1..=50u64 {
            a.record(Duration::from_millis(ms));
            b.record(Duration::from_millis(ms + 50));
        }
        a.add(&b);
        assert_eq!(a.count(), 100);
        assert!((a.summary().p50_ms - 50.0).abs() < 0.05);
    }
}

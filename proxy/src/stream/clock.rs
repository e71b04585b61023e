//! The metadata store's clock as this proxy sees it, so that segment ages never rest on this
//! process's wall clock alone.
//!
//! A segment's completion time is recorded by whichever proxy completed it, and time-based
//! retention compares it with "now" on whichever proxy owns the stream later: two clocks. A
//! proxy whose clock runs an hour ahead would take every segment another proxy completed for an
//! hour older than it is (issue 23, item 4). The metadata store has one clock for everyone: each
//! compare-and-set of a stream record returns the time the store applied it
//! ([`quire_metadata::Stamped`], ZooKeeper's `mtime`, the leader's clock). Every such update
//! gives a sample of this proxy's offset from the store: the store's stamp lies between the
//! proxy's clock readings before and after the call, so the offset (proxy minus store) lies in
//! `[before - stamp, after - stamp]`. The stream layer then
//!
//! * records completion times on the store's clock, at the latest value the bounds allow, and
//! * measures "now" on the store's clock at the earliest value they allow,
//!
//! so an age is never overestimated by more than the clock drift since the last sample, whatever
//! either proxy's clock says. Without a sample the ages of segments another proxy completed are
//! unknown and time retention keeps them (the writer takes a sample first, `lifecycle.rs`).
//! A skew above [`SKEW_WARN_MS`] is logged (at most once a minute) and the estimate is exported
//! as `quire_proxy_metadata_clock_skew_seconds`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A skew whose bounds both lie beyond this (either way) is logged as a warning.
pub(super) const SKEW_WARN_MS: i64 = 1000;

/// How long a sample stays good for aging segments; older, the writer takes a new one first.
/// Clocks drift by milliseconds per hour, but an operator may step one at any time.
pub(super) const SAMPLE_MAX_AGE: Duration = Duration::from_secs(60);

/// How often the skew warning may repeat.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// One comparison of this proxy's clock with the store's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    /// Bounds of (this proxy's clock − the store's clock), milliseconds.
    skew_lo_ms: i64,
    skew_hi_ms: i64,
    taken: Instant,
}

/// The process-wide estimate of this proxy's clock offset from the metadata store's.
#[derive(Debug, Default)]
pub(super) struct StoreClock {
    sample: Mutex<Option<Sample>>,
    last_warning: Mutex<Option<Instant>>,
}

impl StoreClock {
    /// Notes one update: this proxy's wall clock read `before_ms` before the call and
    /// `after_ms` after it, and the store stamped the update `store_ms` (`None`: the store keeps
    /// no clock of its own, so there is no other clock to disagree with: offset 0).
    pub(super) fn record(&self, before_ms: u64, after_ms: u64, store_ms: Option<u64>) {
        let (lo, hi) = match store_ms {
            Some(s) => (
                before_ms as i64 - s as i64,
                after_ms.max(before_ms) as i64 - s as i64,
            ),
            None => (0, 0),
        };
        let now = quire_clock::now();
        *self.sample.lock().expect("clock lock") = Some(Sample {
            skew_lo_ms: lo,
            skew_hi_ms: hi,
            taken: now,
        });
        if lo > SKEW_WARN_MS || hi < -SKEW_WARN_MS {
            let mut last = self.last_warning.lock().expect("clock lock");
            if last.is_none_or(|t| now.duration_since(t) >= WARN_EVERY) {
                *last = Some(now);
                tracing::warn!(
                    skew_ms = (lo + hi) / 2,
                    skew_lo_ms = lo,
                    skew_hi_ms = hi,
                    "this proxy's wall clock disagrees with the metadata store's (positive: the proxy is ahead); segment ages are taken on the store's clock, fix the clock (NTP)"
                );
            }
        }
    }

    /// The latest estimate of (this proxy's clock − the store's), milliseconds: the middle of
    /// its bounds. `None` before the first update.
    pub(super) fn skew_ms(&self) -> Option<i64> {
        self.sample()
            .map(|s| s.skew_lo_ms + (s.skew_hi_ms - s.skew_lo_ms) / 2)
    }

    /// True when a sample younger than [`SAMPLE_MAX_AGE`] exists.
    pub(super) fn fresh(&self) -> bool {
        self.sample()
            .is_some_and(|s| quire_clock::elapsed(s.taken) < SAMPLE_MAX_AGE)
    }

    /// Now on the store's clock, at the earliest the last sample allows (ages measured from it
    /// are never too large); `None` without a fresh sample.
    pub(super) fn store_now_earliest_ms(&self, own_now_ms: u64) -> Option<u64> {
        let s = self
            .sample()
            .filter(|s| quire_clock::elapsed(s.taken) < SAMPLE_MAX_AGE)?;
        Some(shift(own_now_ms, s.skew_hi_ms))
    }

    /// Now on the store's clock at the latest the last sample allows (a completion time
    /// recorded with it never makes a segment look older than it is); this proxy's own clock
    /// without a sample.
    pub(super) fn store_now_latest_ms(&self, own_now_ms: u64) -> u64 {
        self.sample()
            .map_or(own_now_ms, |s| shift(own_now_ms, s.skew_lo_ms))
    }

    fn sample(&self) -> Option<Sample> {
        *self.sample.lock().expect("clock lock")
    }
}

/// `own_ms − skew_ms`, within `u64`.
fn shift(own_ms: u64, skew_ms: i64) -> u64 {
    if skew_ms >= 0 {
        own_ms.saturating_sub(skew_ms as u64)
    } else {
        own_ms.saturating_add(skew_ms.unsigned_abs())
    }
}

/// What the stream layer counts across streams, for the proxy's metrics.
#[derive(Debug, Default)]
pub(super) struct LayerStats {
    /// The metadata store's clock as seen from here.
    pub(super) clock: StoreClock,
    /// Segment rolls deferred because no new segment could be started
    /// (`quire_proxy_segment_roll_deferred_total`).
    pub(super) rolls_deferred: AtomicU64,
    /// Streams whose open segment is past its roll point now
    /// (`quire_proxy_segments_past_roll_point`).
    pub(super) past_roll_point: AtomicI64,
    /// Followers running (`quire_proxy_followers`, `follower.rs`).
    pub(super) followers: AtomicI64,
    /// Follower reads of an entry found in / missing from the follower's cache
    /// (`quire_proxy_follower_cache_hits_total`, `_misses_total`).
    pub(super) follower_cache_hits: AtomicU64,
    pub(super) follower_cache_misses: AtomicU64,
    /// Bytes held by the followers' caches (`quire_proxy_follower_cache_bytes`).
    pub(super) follower_cache_bytes: AtomicI64,
    /// Streams this proxy gave up because their preferred owner is another live proxy
    /// (`quire_proxy_streams_released_for_balance_total`, `placement.rs`).
    pub(super) released_for_balance: AtomicU64,
    /// Records and payload bytes of the writes handed to streams this proxy owns, since start:
    /// the load it publishes in the proxy registry (`placement.rs`).
    pub(super) written_records: AtomicU64,
    pub(super) written_bytes: AtomicU64,
    /// This proxy's capacity weight in thousandths minus the full weight, so that the default
    /// 0 is the full weight (`quire_proxy_balance_weight`, `placement.rs`).
    pub(super) weight_shed_milli: AtomicI64,
    /// Stream acquisitions under way now: lease, recovery and task start of a stream a
    /// request found unowned here (`quire_proxy_acquisitions_under_way`, `registry.rs`); what
    /// this proxy publishes in the registry for back-pressure (`balance.rs`).
    pub(super) acquiring: AtomicI64,
    /// Stream acquisitions completed since start (`quire_proxy_acquisitions_total`).
    pub(super) acquired: AtomicU64,
}

impl LayerStats {
    /// Counts a write of `records` records and `bytes` payload bytes handed to an owned stream.
    pub(super) fn count_written(&self, records: u64, bytes: u64) {
        self.written_records.fetch_add(records, Ordering::Relaxed);
        self.written_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// Counts one stream as past its roll point for as long as it lives.
#[derive(Debug)]
pub(super) struct PastRollPoint(std::sync::Arc<LayerStats>);

impl PastRollPoint {
    pub(super) fn new(stats: std::sync::Arc<LayerStats>) -> Self {
        stats.rolls_deferred.fetch_add(1, Ordering::Relaxed);
        stats.past_roll_point.fetch_add(1, Ordering::Relaxed);
        Self(stats)
    }
}

impl Drop for PastRollPoint {
    fn drop(&mut self) {
        self.0.past_roll_point.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The stream layer's metrics, read from [`LayerStats`] at scrape time:
/// `quire_proxy_metadata_clock_skew_seconds` (this proxy's wall clock minus the metadata
/// store's, from the last stream update; 0 before the first), `quire_proxy_segment_roll_deferred_total`
/// `quire_proxy_segments_past_roll_point` and `quire_proxy_streams_released_for_balance_total`.
#[derive(Debug)]
pub(super) struct LayerMetrics(pub(super) std::sync::Arc<LayerStats>);

impl prometheus_client::collector::Collector for LayerMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> std::result::Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let s = &self.0;
        let skew = ConstGauge::new(s.clock.skew_ms().unwrap_or(0) as f64 / 1000.0);
        skew.encode(encoder.encode_descriptor(
            "quire_proxy_metadata_clock_skew_seconds",
            "This proxy's wall clock minus the metadata store's (ZooKeeper's), measured at each stream metadata update; segment ages are taken on the store's clock",
            None,
            skew.metric_type(),
        )?)?;
        let deferred = ConstCounter::new(s.rolls_deferred.load(Ordering::Relaxed));
        deferred.encode(encoder.encode_descriptor(
            "quire_proxy_segment_roll_deferred",
            "Segment rolls deferred because no new segment could be started (no ensemble of writable bookies); the segment kept taking writes",
            None,
            deferred.metric_type(),
        )?)?;
        let past = ConstGauge::new(s.past_roll_point.load(Ordering::Relaxed));
        past.encode(encoder.encode_descriptor(
            "quire_proxy_segments_past_roll_point",
            "Streams whose open segment is past its size or time roll point because its roll is deferred",
            None,
            past.metric_type(),
        )?)?;
        let moved = ConstCounter::new(s.released_for_balance.load(Ordering::Relaxed));
        moved.encode(encoder.encode_descriptor(
            "quire_proxy_streams_released_for_balance",
            "Streams this proxy released (segment completed, lease given up) because their preferred owner by rendezvous hashing is another live proxy",
            None,
            moved.metric_type(),
        )?)?;
        let full = i64::from(quire_metadata::PROXY_WEIGHT_FULL);
        let weight = s.weight_shed_milli.load(Ordering::Relaxed) + full;
        let weight = ConstGauge::new(weight as f64 / full as f64);
        weight.encode(encoder.encode_descriptor(
            "quire_proxy_balance_weight",
            "This proxy's capacity weight in load-aware placement, 1 unless its write load is above balance_load_threshold_percent of the live proxies' mean",
            None,
            weight.metric_type(),
        )?)?;
        let gauges = [
            ("quire_proxy_followers", "Streams this proxy follows for reads without owning them (one bookie read stream each)", &s.followers),
            ("quire_proxy_follower_cache_bytes", "Entry bytes held by the followers' caches", &s.follower_cache_bytes),
        ];
        for (name, help, v) in gauges {
            let g = ConstGauge::new(v.load(Ordering::Relaxed));
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        let counters = [
            (
                "quire_proxy_follower_cache_hits",
                "Entries follower reads took from the follower's cache",
                &s.follower_cache_hits,
            ),
            (
                "quire_proxy_follower_cache_misses",
                "Entries follower reads had to fetch from the bookies",
                &s.follower_cache_misses,
            ),
        ];
        for (name, help, v) in counters {
            let c = ConstCounter::new(v.load(Ordering::Relaxed));
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR_MS: u64 = 3_600_000;

    #[test]
    fn an_hour_ahead_is_measured_and_taken_out() {
        // Goal: a proxy whose clock runs an hour ahead of the store measures the skew within
        // the call's duration, and its "now" and completion stamps land on the store's clock,
        // bracketing the true time. Method: a store stamp between before and after readings
        // an hour ahead of it.
        let c = StoreClock::default();
        assert_eq!(c.skew_ms(), None);
        assert!(!c.fresh());
        assert_eq!(c.store_now_earliest_ms(5 * HOUR_MS), None);
        assert_eq!(c.store_now_latest_ms(5 * HOUR_MS), 5 * HOUR_MS);
        let store = 100 * HOUR_MS;
        c.record(store + HOUR_MS - 3, store + HOUR_MS + 5, Some(store));
        assert!(c.fresh());
        assert_eq!(c.skew_ms(), Some(HOUR_MS as i64 + 1));
        let own_now = store + HOUR_MS + 10_000;
        assert_eq!(c.store_now_earliest_ms(own_now), Some(store + 10_000 - 5));
        assert_eq!(c.store_now_latest_ms(own_now), store + 10_000 + 3);
    }

    #[test]
    fn a_clock_behind_and_a_store_without_time() {
        // Goal: a negative skew shifts forward; a store that keeps no time counts as agreeing.
        let c = StoreClock::default();
        c.record(1_000, 1_010, Some(61_000));
        assert_eq!(c.skew_ms(), Some(-59_995));
        assert_eq!(c.store_now_earliest_ms(2_000), Some(61_990));
        c.record(1_000, 1_010, None);
        assert_eq!(c.skew_ms(), Some(0));
        assert_eq!(c.store_now_earliest_ms(2_000), Some(2_000));
    }

    #[test]
    fn a_sample_goes_stale_after_a_minute_and_the_warning_repeats_once_a_minute() {
        // Goal: a sample ages out at SAMPLE_MAX_AGE (then ages of other proxies' segments are
        // unknown again, while completion stamps keep the last offset), and the skew warning
        // repeats at most every WARN_EVERY. Method: the quire_clock seam's manual clock for
        // this thread, advanced past each bound instead of sleeping a minute.
        let clock = quire_clock::ManualClock::install();
        let c = StoreClock::default();
        let store = 100 * HOUR_MS;
        c.record(store + HOUR_MS, store + HOUR_MS, Some(store));
        let warned = |c: &StoreClock| *c.last_warning.lock().unwrap();
        let first = warned(&c).expect("an hour's skew is logged");

        // Half a minute later: a new sample, but no second warning yet.
        clock.advance(WARN_EVERY / 2);
        c.record(store + HOUR_MS, store + HOUR_MS, Some(store));
        assert_eq!(warned(&c), Some(first));

        clock.advance(SAMPLE_MAX_AGE - Duration::from_millis(1));
        assert!(c.fresh());
        assert_eq!(c.store_now_earliest_ms(store + HOUR_MS), Some(store));
        clock.advance(Duration::from_millis(1));
        assert!(!c.fresh(), "a minute old: stale");
        assert_eq!(c.store_now_earliest_ms(store + HOUR_MS), None);
        assert_eq!(c.store_now_latest_ms(store + HOUR_MS), store);

        // A new sample is fresh again, and more than a minute after the first warning it warns.
        c.record(store + HOUR_MS, store + HOUR_MS, Some(store));
        assert!(c.fresh());
        assert_eq!(warned(&c), Some(first + WARN_EVERY / 2 + SAMPLE_MAX_AGE));
    }
}

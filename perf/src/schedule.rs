//! The open-loop schedule: when each record is meant to be sent.
//!
//! Record `i` (counting from 0) is due at `start + i / rate`. The times are fixed before the run
//! and do not depend on how fast the cluster answers; a record sent late is still measured from
//! its due time ([`latency_from_intended`]), so the harness cannot hide a stall by slowing down.

use std::time::{Duration, Instant};

/// A fixed-rate schedule of intended send times.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    start: Instant,
    rate_per_s: f64,
}

impl Schedule {
    /// A schedule of `rate_per_s` sends per second starting at `start`.
    ///
    /// # Errors
    /// A message if the rate is not a finite number above zero.
    pub fn new(start: Instant, rate_per_s: f64) -> Result<Self, String> {
        if !rate_per_s.is_finite() || rate_per_s <= 0.0 {
            return Err(format!(
                "rate must be a finite number of sends per second above 0, not {rate_per_s}"
            ));
        }
        Ok(Self { start, rate_per_s })
    }

    /// Sends per second.
    pub fn rate_per_s(&self) -> f64 {
        self.rate_per_s
    }

    /// Time of the first send.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Offset of send `i` from the start: `i / rate`, rounded to the nanosecond. Computed from
    /// `i` directly, never by adding intervals, so no rounding error accumulates.
    pub fn offset(&self, i: u64) -> Duration {
        Duration::from_nanos((i as f64 * 1e9 / self.rate_per_s).round() as u64)
    }

    /// Intended send time of send `i`.
    pub fn intended(&self, i: u64) -> Instant {
        self.start + self.offset(i)
    }

    /// Number of sends whose intended time falls in `[start, start + span)`: `ceil(span · rate)`.
    pub fn count_within(&self, span: Duration) -> u64 {
        let x = span.as_secs_f64() * self.rate_per_s;
        // Guard against 2000.0000000002 turning into 2001.
        let r = x.round();
        if (x - r).abs() < 1e-6 {
            r as u64
        } else {
            x.ceil() as u64
        }
    }
}

/// Sets the calling thread's timer slack to 1 ns (`prctl(PR_SET_TIMERSLACK)`), so that its
/// sleeps end within microseconds of their deadline instead of up to the default 50 µs later.
/// The common workload's pacing rule asks for it; a thread that paces sends calls this once.
///
/// # Errors
/// The OS error if the kernel refuses (it does not on Linux for an unprivileged thread).
pub fn tighten_timer_slack() -> std::io::Result<()> {
    // SAFETY: PR_SET_TIMERSLACK takes an integer and changes only this thread's timer slack; no
    // memory is passed.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Sleeps the calling thread until `deadline` with the kernel's high-resolution timers
/// (`std::thread::sleep`, i.e. `nanosleep`), not with tokio's 1 ms timer wheel; returns at once
/// if the deadline has passed. With [`tighten_timer_slack`] called on the thread, it wakes within
/// a few microseconds of the deadline on an idle machine.
pub fn precise_sleep_until(deadline: Instant) {
    let wait = deadline.saturating_duration_since(quire_clock::now());
    if !wait.is_zero() {
        std::thread::sleep(wait);
    }
}

/// Latency of a send that completed at `completed` and was due at `intended`. A completion
/// before the due time (a clock oddity, or a send issued early) counts as zero.
pub fn latency_from_intended(intended: Instant, completed: Instant) -> Duration {
    completed.saturating_duration_since(intended)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: intended times are start + i/rate exactly, without drift over a long run. Method:
    // at 2000/s, send 0 is at start, send 1 at 0.5 ms, send 7,200,000 (one hour) at exactly 3600 s.
    #[test]
    fn intended_times_are_exact() {
        let t0 = quire_clock::now();
        let s = Schedule::new(t0, 2000.0).unwrap();
        assert_eq!(s.intended(0), t0);
        assert_eq!(s.offset(1), Duration::from_micros(500));
        assert_eq!(s.offset(2000), Duration::from_secs(1));
        assert_eq!(s.offset(7_200_000), Duration::from_secs(3600));
        // A rate that does not divide a second: 3/s → 333,333,333 ns, 666,666,667 ns, 1 s.
        let s = Schedule::new(t0, 3.0).unwrap();
        assert_eq!(s.offset(1), Duration::from_nanos(333_333_333));
        assert_eq!(s.offset(2), Duration::from_nanos(666_666_667));
        assert_eq!(s.offset(3), Duration::from_secs(1));
    }

    // Goal: the number of sends in a span is rate × span, rounded up only for a true fraction.
    // Method: whole and fractional products.
    #[test]
    fn counts_within_a_span() {
        let s = Schedule::new(quire_clock::now(), 2000.0).unwrap();
        assert_eq!(s.count_within(Duration::from_secs(10)), 20_000);
        assert_eq!(s.count_within(Duration::from_millis(1)), 2);
        assert_eq!(s.count_within(Duration::ZERO), 0);
        let s = Schedule::new(quire_clock::now(), 3.0).unwrap();
        assert_eq!(
            s.count_within(Duration::from_millis(500)),
            2,
            "sends at 0 and 333 ms"
        );
        let s = Schedule::new(quire_clock::now(), 0.1).unwrap();
        assert_eq!(s.count_within(Duration::from_secs(10)), 1);
    }

    // Goal: the precise sleep never returns before its deadline and returns at once for a past
    // one. Method: sleep until 2 ms from now (after tightening the slack) and check the clock;
    // a deadline in the past returns without sleeping (no upper bound is asserted: the machine
    // is shared).
    #[test]
    fn precise_sleep_waits_until_the_deadline() {
        tighten_timer_slack().expect("PR_SET_TIMERSLACK");
        let deadline = quire_clock::now() + Duration::from_millis(2);
        precise_sleep_until(deadline);
        assert!(quire_clock::now() >= deadline);
        let past = quire_clock::now();
        precise_sleep_until(past - Duration::from_millis(1));
    }

    // Goal: a rate of zero, below zero or NaN is refused with a message, not a panic later.
    #[test]
    fn bad_rates_are_refused() {
        for r in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(Schedule::new(quire_clock::now(), r).is_err(), "{r}");
        }
    }

    // Goal: latency is measured from the intended time, so a late send carries its lateness.
    // Method: a send due at t0 that completes 3 ms after t0 + 100 ms (sent 100 ms late) has
    // latency 103 ms; a completion before the due time counts as zero.
    #[test]
    fn latency_counts_from_the_intended_time() {
        let t0 = quire_clock::now();
        let sent_late = t0 + Duration::from_millis(100);
        let done = sent_late + Duration::from_millis(3);
        assert_eq!(latency_from_intended(t0, done), Duration::from_millis(103));
        assert_eq!(latency_from_intended(done, t0), Duration::ZERO);
    }
}

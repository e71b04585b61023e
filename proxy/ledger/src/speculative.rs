//! The adaptive speculative read timeout (BookKeeper `speculativeReadTimeout`,
//! `maxSpeculativeReadTimeout`, `speculativeReadTimeoutBackoffMultiplier`; issue 30 item 3).
//!
//! A read asks the first replica of its read order; when no answer has come within this
//! timeout, it asks the next one too while the first is still outstanding, and the first good
//! answer wins (`reader.rs`). The timeout is
//! `min(max, max(floor, p99 of recent read latency) × backoff)`:
//! * the latency window holds the last [`WINDOW`] winning answers of this client's plain reads
//!   (from the request to that replica to its answer), so that a client far from every replica
//!   (another region) does not speculate on each read, while on a near cluster the floor rules;
//! * `backoff` doubles each time a read speculated and the replica asked first still answered
//!   first (the speculation was wasted load), up to where the timeout reaches `max`, and goes
//!   back to 1 when a speculative replica wins, as BookKeeper backs its timeout off by its
//!   multiplier (2) up to `maxSpeculativeReadTimeout`. BookKeeper starts each read at its first
//!   timeout again; here the backoff is the client's, so it halves after every
//!   [`RECOMPUTE_EVERY`] reads with no wasted speculation: a timeout backed off past a slow
//!   replica's latency (where it no longer speculates, so no speculation can win and reset
//!   it) comes back down.
//!
//! A floor of zero turns speculation off (BookKeeper: `speculativeReadTimeout = 0`).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

/// Winning read latencies kept for the p99.
pub(crate) const WINDOW: usize = 256;
/// Latencies needed before the p99 counts (below it, the floor alone).
const SAMPLES_MIN: usize = 32;
/// The p99 is recomputed once per this many latencies (a sort of the window).
const RECOMPUTE_EVERY: u32 = 16;

/// The timeout after which a read asks one more replica; shared by every read of a client.
#[derive(Debug)]
pub(crate) struct SpeculativeTimeout {
    floor: Duration,
    max: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    window: VecDeque<Duration>,
    since_recompute: u32,
    p99: Duration,
    backoff: u32,
    /// A speculation was wasted since the last recompute (the backoff does not decay then).
    wasted: bool,
    current: Duration,
}

impl SpeculativeTimeout {
    /// `floor`: the initial and least timeout, zero for no speculation; `max`: the greatest
    /// (raised to `floor` if below).
    pub(crate) fn new(floor: Duration, max: Duration) -> Self {
        let max = max.max(floor);
        Self {
            floor,
            max,
            state: Mutex::new(State {
                window: VecDeque::with_capacity(WINDOW),
                since_recompute: 0,
                p99: Duration::ZERO,
                backoff: 1,
                wasted: false,
                current: floor,
            }),
        }
    }

    /// The timeout for the next speculation; `None` when speculation is off.
    pub(crate) fn current(&self) -> Option<Duration> {
        if self.floor.is_zero() {
            return None;
        }
        self.state.lock().ok().map(|s| s.current)
    }

    /// Records the latency of a read's winning answer.
    pub(crate) fn observe(&self, latency: Duration) {
        if self.floor.is_zero() {
            return;
        }
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        if s.window.len() == WINDOW {
            s.window.pop_front();
        }
        s.window.push_back(latency);
        s.since_recompute += 1;
        if s.since_recompute >= RECOMPUTE_EVERY {
            s.since_recompute = 0;
            s.p99 = p99(&s.window);
            if !s.wasted {
                s.backoff = (s.backoff / 2).max(1);
            }
            s.wasted = false;
            s.current = self.timeout(s.p99, s.backoff);
        }
    }

    /// Records a read that speculated: `helped` when a replica asked speculatively answered
    /// first, otherwise the speculation was wasted and the timeout backs off (×2).
    pub(crate) fn speculated(&self, helped: bool) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        if helped {
            s.backoff = 1;
        } else {
            s.wasted = true;
            if self.timeout(s.p99, s.backoff) < self.max {
                s.backoff = s.backoff.saturating_mul(2);
            }
        }
        s.current = self.timeout(s.p99, s.backoff);
    }

    fn timeout(&self, p99: Duration, backoff: u32) -> Duration {
        self.floor
            .max(p99)
            .saturating_mul(backoff)
            .clamp(self.floor, self.max)
    }
}

/// The 99th percentile of `window` (nearest rank), zero below [`SAMPLES_MIN`] samples.
fn p99(window: &VecDeque<Duration>) -> Duration {
    if window.len() < SAMPLES_MIN {
        return Duration::ZERO;
    }
    let mut v: Vec<Duration> = window.iter().copied().collect();
    let rank = (v.len() * 99).div_ceil(100) - 1;
    *v.select_nth_unstable(rank).1
}

#[cfg(test)]
mod tests {
    //! Goal: the timeout starts at the floor, follows the p99 of winning latencies above the
    //! floor, doubles when speculation is wasted up to the maximum, returns when it helps, and
    //! zero turns it off. Method: feed latencies and outcomes, read the timeout.

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn off_when_the_floor_is_zero() {
        let t = SpeculativeTimeout::new(Duration::ZERO, 100 * MS);
        t.observe(5 * MS);
        t.speculated(false);
        assert_eq!(t.current(), None);
    }

    #[test]
    fn starts_at_the_floor_and_follows_the_p99_above_it() {
        let t = SpeculativeTimeout::new(10 * MS, 1000 * MS);
        assert_eq!(t.current(), Some(10 * MS));
        // Fast reads: the floor rules.
        for _ in 0..WINDOW {
            t.observe(MS);
        }
        assert_eq!(t.current(), Some(10 * MS));
        // A far cluster: 99 % of reads at 30 ms, a few at 500 ms; the p99 is 30 ms.
        for i in 0..WINDOW {
            t.observe(if i % 128 == 0 { 500 * MS } else { 30 * MS });
        }
        assert_eq!(t.current(), Some(30 * MS));
        // Slower than the maximum: capped.
        for _ in 0..WINDOW {
            t.observe(5000 * MS);
        }
        assert_eq!(t.current(), Some(1000 * MS));
    }

    #[test]
    fn backs_off_when_wasted_and_returns_when_it_helps() {
        let t = SpeculativeTimeout::new(10 * MS, 70 * MS);
        let steps = [
            (false, 20),
            (false, 40),
            (false, 70),
            (false, 70),
            (true, 10),
            (false, 20),
        ];
        for (helped, want_ms) in steps {
            t.speculated(helped);
            assert_eq!(t.current(), Some(want_ms * MS), "after helped={helped}");
        }
    }

    #[test]
    fn the_backoff_decays_while_nothing_is_wasted() {
        let t = SpeculativeTimeout::new(10 * MS, 1000 * MS);
        for _ in 0..3 {
            t.speculated(false);
        }
        assert_eq!(t.current(), Some(80 * MS));
        // Reads that did not speculate (the timeout is above the slow replica now): the
        // backoff halves once per RECOMPUTE_EVERY of them, after the period of the wastes.
        for want in [80, 40, 20, 10, 10] {
            for _ in 0..RECOMPUTE_EVERY {
                t.observe(MS);
            }
            assert_eq!(t.current(), Some(want * MS));
        }
        // A waste within a recompute period keeps the backoff that period.
        t.speculated(false);
        for _ in 0..RECOMPUTE_EVERY {
            t.observe(MS);
        }
        assert_eq!(t.current(), Some(20 * MS));
    }

    #[test]
    fn p99_nearest_rank() {
        let w: VecDeque<Duration> = (1..=100).map(|i| i * MS).collect();
        assert_eq!(p99(&w), 99 * MS);
        let few: VecDeque<Duration> = (1..=10).map(|i| i * MS).collect();
        assert_eq!(p99(&few), Duration::ZERO);
    }
}

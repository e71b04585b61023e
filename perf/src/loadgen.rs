//! The open-loop driver: issues sends on a fixed [`Schedule`] and measures each one from its
//! intended time, whatever the send function is.
//!
//! * Send `i` is issued at its intended time, or at once if that time has passed (the driver
//!   never skips a send and never waits for an earlier send to finish). Intended times are
//!   kept by a thread sleeping on the kernel's high-resolution timers, not by tokio's
//!   millisecond timer wheel, so the driver itself adds tens of microseconds, not a
//!   millisecond.
//! * Its latency is `completion − intended`, so a send issued late (because the runtime stalled,
//!   or because `in_flight_max` sends were already outstanding) carries its lateness.
//! * Sends due in the warm-up span are issued but not recorded.
//! * When the schedule is over, the driver waits at most `drain_timeout` for sends still
//!   outstanding; every send not acknowledged by then, issued or not, is recorded as
//!   "censored" at `deadline − intended`, a lower bound of its true latency, and the run is
//!   marked as such. Overload therefore raises the percentiles instead of hiding.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::hist::{LatencyHistogram, Summary};
use crate::progress::Counters;
use crate::schedule::{latency_from_intended, Schedule};

/// Due send indices queued from the ticker thread to the dispatcher at most.
const DUE_QUEUE_MAX: usize = 4096;

/// Settings of one open-loop run.
#[derive(Debug, Clone, Copy)]
pub struct OpenLoopConfig {
    /// Sends per second.
    pub rate_per_s: f64,
    /// Span at the start whose sends are not recorded.
    pub warmup: Duration,
    /// Span recorded, after the warm-up.
    pub duration: Duration,
    /// Sends outstanding at most; the next send waits (and is measured late) beyond it.
    pub in_flight_max: usize,
    /// Longest wait for outstanding sends after the last intended send time.
    pub drain_timeout: Duration,
    /// Samples each send stands for (records per write call), for the histogram's weights.
    pub records_per_send: u64,
}

/// What one open-loop run measured.
#[derive(Debug, Clone)]
pub struct OpenLoopResult {
    /// Latency of recorded sends, weighted by `records_per_send`, including censored ones.
    pub hist: LatencyHistogram,
    /// Sends the schedule held (warm-up included).
    pub scheduled: u64,
    /// Sends issued.
    pub sent: u64,
    /// Sends acknowledged.
    pub completed: u64,
    /// Sends that failed (not recorded in the histogram).
    pub errors: u64,
    /// First failure's message.
    pub first_error: Option<String>,
    /// Recorded sends not acknowledged before the drain deadline (recorded at a lower bound).
    pub censored: u64,
    /// Largest delay between a send's intended time and its issue.
    pub dispatch_late_max: Duration,
    /// From the first intended send time to the last acknowledgement (or the deadline).
    pub elapsed: Duration,
    /// The schedule's start: intended time of send 0.
    pub start: Instant,
}

/// The serialisable summary of an [`OpenLoopResult`].
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct OpenLoopReport {
    /// Offered records per second.
    pub rate_records_per_s: f64,
    /// Latency summary (records, warm-up excluded).
    pub latency: Summary,
    /// Sends scheduled, issued, acknowledged, failed, censored.
    pub scheduled: u64,
    /// Sends issued.
    pub sent: u64,
    /// Sends acknowledged.
    pub completed: u64,
    /// Sends that failed.
    pub errors: u64,
    /// First failure's message.
    pub first_error: Option<String>,
    /// Sends still outstanding at the drain deadline.
    pub censored: u64,
    /// Largest issue delay behind the schedule, milliseconds.
    pub dispatch_late_max_ms: f64,
    /// Percentile distribution `(quantile, ms)` for plots ([`LatencyHistogram::distribution`]).
    pub distribution: Vec<(f64, f64)>,
}

impl OpenLoopResult {
    /// The serialisable summary; `records_per_send` converts the send rate to records.
    pub fn report(&self, cfg: &OpenLoopConfig) -> OpenLoopReport {
        OpenLoopReport {
            rate_records_per_s: cfg.rate_per_s * cfg.records_per_send as f64,
            latency: self.hist.summary(),
            scheduled: self.scheduled,
            sent: self.sent,
            completed: self.completed,
            errors: self.errors,
            first_error: self.first_error.clone(),
            censored: self.censored,
            dispatch_late_max_ms: self.dispatch_late_max.as_secs_f64() * 1e3,
            distribution: self.hist.distribution(),
        }
    }
}

struct Shared {
    hist: Mutex<LatencyHistogram>,
    done: Vec<AtomicBool>,
    completed: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    last_completion: Mutex<Option<Instant>>,
}

/// Runs `send(i, intended_i)` on the schedule `cfg` describes, starting shortly after the call,
/// and returns the measurements. `send` resolves to `Err(message)` on failure.
///
/// # Panics
/// If `cfg.rate_per_s` is not a positive finite number.
pub async fn run_open_loop<F, Fut>(
    cfg: OpenLoopConfig,
    counters: Option<Arc<Counters>>,
    send: F,
) -> OpenLoopResult
where
    F: Fn(u64, Instant) -> Fut,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let start = quire_clock::now() + Duration::from_millis(20);
    let schedule = Schedule::new(start, cfg.rate_per_s).expect("rate checked by the caller");
    let warm = schedule.count_within(cfg.warmup);
    let total = schedule.count_within(cfg.warmup + cfg.duration);
    let shared = Arc::new(Shared {
        hist: Mutex::new(LatencyHistogram::new()),
        done: (0..total).map(|_| AtomicBool::new(false)).collect(),
        completed: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        first_error: Mutex::new(None),
        last_completion: Mutex::new(None),
    });
    let permits = Arc::new(Semaphore::new(cfg.in_flight_max.max(1)));
    let deadline = schedule.intended(total) + cfg.drain_timeout;
    let mut tasks = JoinSet::new();
    let sent = AtomicU64::new(0);
    let mut late_max = Duration::ZERO;
    let weight = cfg.records_per_send.max(1);

    // tokio's timers fire on a 1 ms wheel, so sleeping until each intended time would issue
    // sends up to 1 ms late and charge the harness's own timer to the cluster. A ticker thread
    // sleeps with the kernel's high-resolution timers instead and hands each due index over.
    // Bounded: when sends are held back (`in_flight_max`), the ticker waits too instead of
    // queueing indices without limit; the held-back sends are still measured from their
    // intended times.
    let (due_tx, mut due_rx) = tokio::sync::mpsc::channel::<u64>(DUE_QUEUE_MAX);
    let ticker = std::thread::Builder::new()
        .name("quire-perf-ticker".into())
        .spawn(move || {
            // Without it each wake-up may come up to 50 µs (the default timer slack) late.
            let _ = crate::schedule::tighten_timer_slack();
            for i in 0..total {
                crate::schedule::precise_sleep_until(schedule.intended(i));
                if due_tx.blocking_send(i).is_err() {
                    return;
                }
            }
        })
        .expect("cannot start the open-loop ticker thread");
    let dispatch = async {
        while let Some(i) = due_rx.recv().await {
            let intended = schedule.intended(i);
            let permit = permits
                .clone()
                .acquire_owned()
                .await
                .expect("semaphore never closed");
            late_max = late_max.max(quire_clock::now().saturating_duration_since(intended));
            let fut = send(i, intended);
            let shared = shared.clone();
            let task_counters = counters.clone();
            tasks.spawn(async move {
                let counters = task_counters;
                let r = fut.await;
                let now = quire_clock::now();
                drop(permit);
                match r {
                    Ok(()) => {
                        if i >= warm {
                            shared
                                .hist
                                .lock()
                                .expect("hist lock")
                                .record_n(latency_from_intended(intended, now), weight);
                        }
                        shared.completed.fetch_add(1, Ordering::Relaxed);
                        if let Some(c) = &counters {
                            c.done.fetch_add(1, Ordering::Relaxed);
                        }
                        let mut last = shared.last_completion.lock().expect("last lock");
                        *last = Some(last.map_or(now, |l| l.max(now)));
                    }
                    Err(e) => {
                        shared.errors.fetch_add(1, Ordering::Relaxed);
                        if let Some(c) = &counters {
                            c.errors.fetch_add(1, Ordering::Relaxed);
                        }
                        shared
                            .first_error
                            .lock()
                            .expect("error lock")
                            .get_or_insert(e);
                    }
                }
                shared.done[i as usize].store(true, Ordering::Release);
            });
            sent.fetch_add(1, Ordering::Relaxed);
            if let Some(c) = &counters {
                c.sent.fetch_add(1, Ordering::Relaxed);
            }
            // Reap finished tasks so the set does not grow with the run.
            while tasks.try_join_next().is_some() {}
        }
    };
    tokio::select! {
        () = dispatch => {}
        () = tokio::time::sleep_until(deadline.into()) => {}
    }
    // The ticker stops at its next send once the receiver is gone.
    drop(due_rx);
    let _ = ticker.join();
    loop {
        match tokio::time::timeout_at(deadline.into(), tasks.join_next()).await {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(_) => break,
        }
    }
    tasks.abort_all();
    let cut = quire_clock::now();
    let mut censored = 0;
    {
        let mut hist = shared.hist.lock().expect("hist lock");
        for i in warm..total {
            if !shared.done[i as usize].load(Ordering::Acquire) {
                censored += 1;
                hist.record_n(latency_from_intended(schedule.intended(i), cut), weight);
            }
        }
    }
    let end = if censored > 0 {
        cut
    } else {
        shared
            .last_completion
            .lock()
            .expect("last lock")
            .unwrap_or(cut)
    };
    let hist = shared.hist.lock().expect("hist lock").clone();
    let first_error = shared.first_error.lock().expect("error lock").clone();
    OpenLoopResult {
        hist,
        scheduled: total,
        sent: sent.load(Ordering::Relaxed),
        completed: shared.completed.load(Ordering::Relaxed),
        errors: shared.errors.load(Ordering::Relaxed),
        first_error,
        censored,
        dispatch_late_max: late_max,
        elapsed: end.saturating_duration_since(start),
        start,
    }
}

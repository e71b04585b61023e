//! The open-loop driver over a local async send function (no cluster): intended send times,
//! latency from the intended time when sends are late, warm-up exclusion, censoring at the
//! drain deadline. Assertions are lower bounds and counts, which a slow or noisy machine cannot
//! break (a slower machine only makes the measured latencies larger).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quire_perf::loadgen::{run_open_loop, OpenLoopConfig};
use quire_perf::schedule::Schedule;

fn cfg(rate: f64, warmup_ms: u64, duration_ms: u64) -> OpenLoopConfig {
    OpenLoopConfig {
        rate_per_s: rate,
        warmup: Duration::from_millis(warmup_ms),
        duration: Duration::from_millis(duration_ms),
        in_flight_max: 10_000,
        drain_timeout: Duration::from_secs(10),
        records_per_send: 1,
    }
}

// Goal: each send is issued with its own intended time from the fixed schedule, all of them are
// issued, and warm-up sends are not recorded. Method: 1000/s for 20 ms warm-up + 80 ms; the send
// function records the intended times it was given; they must be exactly 1 ms apart, 100 of them,
// and the histogram holds the 80 recorded ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issues_every_send_at_its_intended_time_and_skips_warmup() {
    let seen: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let r = run_open_loop(cfg(1000.0, 20, 80), None, move |i, intended| {
        s2.lock().unwrap().push((i, intended));
        async { Ok(()) }
    })
    .await;
    assert_eq!(r.scheduled, 100);
    assert_eq!(r.sent, 100);
    assert_eq!(r.completed, 100);
    assert_eq!(r.hist.count(), 80, "20 warm-up sends excluded");
    assert_eq!((r.errors, r.censored), (0, 0));
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_by_key(|s| s.0);
    let t0 = seen[0].1;
    let sched = Schedule::new(t0, 1000.0).unwrap();
    for (i, t) in &seen {
        assert_eq!(*t, sched.intended(*i), "send {i}");
    }
}

// Goal: open loop means a slow answer does not delay the next send. Method: every send takes
// 50 ms; at 1000/s for 100 ms, sends overlap, so at some point many are outstanding at once, and
// every latency is at least 50 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_answers_do_not_slow_the_sender() {
    let outstanding = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let (o2, p2) = (outstanding.clone(), peak.clone());
    let r = run_open_loop(cfg(1000.0, 0, 100), None, move |_, _| {
        let (o, p) = (o2.clone(), p2.clone());
        async move {
            let n = o.fetch_add(1, Ordering::SeqCst) + 1;
            p.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            o.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        }
    })
    .await;
    assert_eq!(r.completed, 100);
    assert!(
        peak.load(Ordering::SeqCst) > 10,
        "sends overlapped: peak {}",
        peak.load(Ordering::SeqCst)
    );
    assert!(r.hist.summary().p50_ms >= 50.0 * 0.999);
}

// Goal: a stall that delays the sender itself is charged to the sends it delayed: they are
// measured from their intended time, not from when they finally went out (coordinated omission
// corrected). Method: on a single-threaded runtime, send 10 blocks the whole runtime for 200 ms
// (std::thread::sleep inside the send function, i.e. before its future exists), so sends 11..
// are issued late. At 1000/s, send 11 was due 1 ms after send 10 and answers instantly, so its
// measured latency must be at least 199 ms; the run's max reflects the stall and the driver
// reports how late it dispatched.
#[tokio::test(flavor = "current_thread")]
async fn late_sends_are_measured_from_their_intended_time() {
    let r = run_open_loop(cfg(1000.0, 0, 50), None, move |i, _| {
        if i == 10 {
            std::thread::sleep(Duration::from_millis(200));
        }
        async { Ok(()) }
    })
    .await;
    assert_eq!(r.completed, 50);
    let s = r.hist.summary();
    assert!(s.max_ms >= 199.0 * 0.999, "max {}", s.max_ms);
    // Sends 11..=49 (39 of 50) were all due before the stall ended: p50 includes the stall.
    assert!(s.p50_ms >= 150.0, "p50 {}", s.p50_ms);
    assert!(
        r.dispatch_late_max >= Duration::from_millis(150),
        "late {:?}",
        r.dispatch_late_max
    );
}

// Goal: sends never acknowledged before the drain deadline are not dropped from the figures:
// each is recorded at a lower bound (deadline − intended) and counted as censored. Method: send
// 3 of 10 never completes; the drain timeout is 100 ms, so its recorded latency is >= 100 ms
// and p99/max show it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacknowledged_sends_are_censored_not_lost() {
    let mut c = cfg(1000.0, 0, 10);
    c.drain_timeout = Duration::from_millis(100);
    let r = run_open_loop(c, None, move |i, _| async move {
        if i == 3 {
            std::future::pending::<()>().await;
        }
        Ok(())
    })
    .await;
    assert_eq!((r.completed, r.censored), (9, 1));
    assert_eq!(r.hist.count(), 10);
    assert!(r.hist.summary().max_ms >= 100.0 * 0.999);
}

// Goal: failed sends are counted, their first message kept, and they are left out of the
// latency histogram. Method: odd sends fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_counted_apart() {
    let r = run_open_loop(cfg(1000.0, 0, 10), None, move |i, _| async move {
        if i % 2 == 1 {
            Err(format!("boom {i}"))
        } else {
            Ok(())
        }
    })
    .await;
    assert_eq!((r.completed, r.errors, r.censored), (5, 5, 0));
    assert_eq!(r.hist.count(), 5);
    assert!(r.first_error.unwrap().starts_with("boom"));
}

// Goal: a write call carrying several records weighs as that many records. Method: 10 sends of
// 4 records each give 40 samples.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_weighted_by_records() {
    let mut c = cfg(1000.0, 0, 10);
    c.records_per_send = 4;
    let r = run_open_loop(c, None, |_, _| async { Ok(()) }).await;
    assert_eq!(r.hist.count(), 40);
    assert_eq!(r.report(&c).rate_records_per_s, 4000.0);
}

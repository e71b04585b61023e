//! The common replicated-log workload (the team's shared reference workload.md, v1) against a Quire
//! proxy, so that Quire's figures tabulate one to one with those ../shared/bench measures for
//! other systems (`quire-perf workload`, see perf/README.md "The common workload").
//!
//! Four modes, each on a fresh stream (created by a marker record before its clock starts):
//!
//! * `latency`: one producer, one append outstanding, paced at `rate`: append `i` is sent when
//!   it is due (`t0 + i/rate`) and the previous one is acknowledged. Reports the service time
//!   (append call to ack) and the time from the schedule, and the achieved rate.
//! * `latency-open`: appends issued at their due times without waiting for acks, in order, at
//!   most `outstanding` unacknowledged (beyond that the send waits and is late). The
//!   from-schedule latency is the headline figure (free of coordinated omission).
//! * `throughput`: `inflight` appends outstanding at all times, submitted in order.
//! * `tail`: a tailing reader positioned just after the marker (only new records) while the
//!   `latency-open` producer runs; end-to-end latency = receive time − the record's stamp.
//!
//! Timing (all modes): `warmup` unmeasured, then `duration` measured; a record belongs to the
//! measured window when its append is called inside it. Paced modes use an absolute schedule
//! kept by a thread sleeping with `nanosleep` at 1 ns timer slack; a late send never moves
//! later ones, and the producer stops at `t0 + warmup + duration` even when behind. After the
//! end, acks and deliveries get `drain`; what is still missing then is reported, not waited
//! for.
//!
//! Ordered submission: every append of a mode goes over one `ProxyClient` connection, and each
//! write future is polled once by the producer before the next is made. A write's first poll
//! queues its frame on the connection's writer (a FIFO lock) or writes it, so frames leave in
//! call order; the proxy applies one connection's writes in frame order. The rest of the write
//! (waiting for the ack) runs in a task of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use quire_client::{Dlsn, ProxyClient, ReadPosition};
use serde_json::{json, Value};

use crate::hist::LatencyHistogram;
use crate::procfs::{self, CpuTicks};
use crate::record;
use crate::schedule::{precise_sleep_until, tighten_timer_slack, Schedule};

/// The four modes, in the order the workload runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Synchronous appends at `rate`.
    Latency,
    /// Open-loop appends at `rate`, up to `outstanding` unacknowledged.
    LatencyOpen,
    /// `inflight` appends always outstanding.
    Throughput,
    /// Open-loop appends at `rate` with a tailing reader.
    Tail,
}

impl Mode {
    /// Every mode, in the workload's order.
    pub const ALL: [Mode; 4] = [
        Mode::Latency,
        Mode::LatencyOpen,
        Mode::Throughput,
        Mode::Tail,
    ];

    /// The name in the JSON line's `mode` field.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Latency => "latency",
            Mode::LatencyOpen => "latency-open",
            Mode::Throughput => "throughput",
            Mode::Tail => "tail",
        }
    }
}

/// The workload's parameters (`params` of the JSON line).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Record size in bytes (at least the 16-byte header).
    pub size: usize,
    /// Records per second of the paced modes.
    pub rate: u64,
    /// Measured span.
    pub duration: Duration,
    /// Unmeasured span before it.
    pub warmup: Duration,
    /// Appends outstanding in `throughput`.
    pub inflight: usize,
    /// Unacknowledged appends at most in `latency-open` and `tail`.
    pub outstanding: usize,
    /// Grace for acks and deliveries after the end.
    pub drain: Duration,
}

impl Default for Params {
    /// The workload's defaults: 1024 B, 1000/s, 20 s after 5 s, 256 in flight, 1024
    /// outstanding, 5 s drain.
    fn default() -> Self {
        Self {
            size: 1024,
            rate: 1000,
            duration: Duration::from_secs(20),
            warmup: Duration::from_secs(5),
            inflight: 256,
            outstanding: 1024,
            drain: Duration::from_secs(5),
        }
    }
}

impl Params {
    /// The JSON line's `params`: `{size, rate, duration_s, warmup_s, inflight, outstanding,
    /// drain_s}` (bytes, records/s, seconds, counts).
    pub fn json(&self) -> Value {
        json!({
            "size": self.size,
            "rate": self.rate,
            "duration_s": self.duration.as_secs_f64(),
            "warmup_s": self.warmup.as_secs_f64(),
            "inflight": self.inflight,
            "outstanding": self.outstanding,
            "drain_s": self.drain.as_secs_f64(),
        })
    }

    /// The window of a run whose clock starts at `t0`.
    pub fn window(&self, t0: Instant) -> Window {
        let warm_end = t0 + self.warmup;
        let end = warm_end + self.duration;
        Window {
            t0,
            warm_end,
            end,
            drain_end: end + self.drain,
        }
    }
}

/// The time marks of one run.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Start: record 0 is due.
    pub t0: Instant,
    /// End of the warm-up, start of the measured window.
    pub warm_end: Instant,
    /// End of the measured window; no append is called from here on.
    pub end: Instant,
    /// End of the drain: nothing is waited for after it.
    pub drain_end: Instant,
}

impl Window {
    /// Whether an append called at `sent` is measured: `warm_end <= sent < end`.
    pub fn measured(&self, sent: Instant) -> bool {
        sent >= self.warm_end && sent < self.end
    }
}

/// Achieved rate: measured sends over the measured span, records/s.
pub fn achieved_rate(measured: u64, duration: Duration) -> f64 {
    measured as f64 / duration.as_secs_f64().max(1e-9)
}

/// Throughput figures `(records_per_s, mb_per_s)`: acks completed in the window over its
/// length, and that times the record size in 10^6 bytes.
pub fn throughput_rates(acked_in_window: u64, duration: Duration, size: usize) -> (f64, f64) {
    let rps = achieved_rate(acked_in_window, duration);
    (rps, rps * size as f64 / 1e6)
}

/// Polls `f` exactly once and says whether it finished.
async fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *f).poll(cx))).await
}

type WriteFut = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

fn write_future(client: &Arc<ProxyClient>, stream: &Arc<str>, seq: u64, size: usize) -> WriteFut {
    let (c, s) = (client.clone(), stream.clone());
    // The stamp is taken here, just before the append call; the txid is the sequence number
    // (non-decreasing along the stream, as DistributedLog requires).
    let payload = record::encode(seq, record::mono_ns(), size);
    Box::pin(async move {
        c.write(&s, vec![(seq, payload)], false)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
}

/// CPU time of the processes under test (and of this harness) over a mode's measured window.
#[derive(Debug, Clone)]
pub struct CpuWatch {
    pids: Vec<u32>,
    ticks_per_s: u64,
}

/// One reading of every watched process and of this one.
#[derive(Debug, Clone)]
pub struct CpuSample {
    at: Instant,
    pids: Vec<Result<CpuTicks, String>>,
    own: Option<CpuTicks>,
}

impl CpuWatch {
    /// Watches `pids` (their whole thread groups).
    pub fn new(pids: Vec<u32>) -> Self {
        Self {
            pids,
            ticks_per_s: procfs::clock_ticks_per_s(),
        }
    }

    /// Reads `/proc/PID/stat` of every watched process and of this one.
    pub fn sample(&self) -> CpuSample {
        CpuSample {
            at: quire_clock::now(),
            pids: self
                .pids
                .iter()
                .map(|p| procfs::read_cpu_ticks(&p.to_string()).map_err(|e| e.to_string()))
                .collect(),
            own: procfs::read_cpu_ticks("self").ok(),
        }
    }

    /// Samples at `w.warm_end` and `w.end` on a thread of its own.
    pub fn watch(&self, w: Window) -> std::thread::JoinHandle<(CpuSample, CpuSample)> {
        let me = self.clone();
        std::thread::spawn(move || {
            precise_sleep_until(w.warm_end);
            let a = me.sample();
            precise_sleep_until(w.end);
            (a, me.sample())
        })
    }

    /// The JSON line's `cpu`: `{pids, seconds, per_record_ms, window_s, cores, per_pid:
    /// [{pid, seconds}], client_seconds, client_per_record_ms}`: CPU seconds (user + system,
    /// every thread) the watched processes used between the two samples, in all and per
    /// acknowledged measured record (`acked`) in milliseconds, the samples' distance in
    /// seconds, `seconds / window_s` (cores busy on average), and the same for this harness.
    /// `seconds` and `per_record_ms` are `null` when no pid is watched or one could not be read
    /// (its `error` says why); `per_record_ms` is `null` when nothing was acknowledged.
    pub fn json(&self, a: &CpuSample, b: &CpuSample, acked: u64) -> Value {
        let window = b.at.saturating_duration_since(a.at).as_secs_f64();
        let per_record = |s: f64| (acked > 0).then(|| s * 1e3 / acked as f64);
        let mut total = Some(0.0);
        let mut per_pid = Vec::new();
        for (i, pid) in self.pids.iter().enumerate() {
            match (&a.pids[i], &b.pids[i]) {
                (Ok(x), Ok(y)) => {
                    let s = procfs::cpu_seconds(*x, *y, self.ticks_per_s);
                    total = total.map(|t| t + s);
                    per_pid.push(json!({"pid": pid, "seconds": s}));
                }
                (Err(e), _) | (_, Err(e)) => {
                    total = None;
                    per_pid.push(json!({"pid": pid, "seconds": null, "error": e}));
                }
            }
        }
        if self.pids.is_empty() {
            total = None;
        }
        let client = match (a.own, b.own) {
            (Some(x), Some(y)) => Some(procfs::cpu_seconds(x, y, self.ticks_per_s)),
            _ => None,
        };
        json!({
            "pids": self.pids,
            "seconds": total,
            "per_record_ms": total.and_then(per_record),
            "window_s": window,
            "cores": total.map(|t| t / window.max(1e-9)),
            "per_pid": per_pid,
            "client_seconds": client,
            "client_per_record_ms": client.and_then(per_record),
        })
    }
}

/// Outcome of a paced producer (`latency`, `latency-open`, the producer of `tail`).
#[derive(Debug, Default)]
pub struct Paced {
    /// Ack service time (append call to ack) of measured records.
    pub ack: LatencyHistogram,
    /// Ack time minus due time of measured records.
    pub ack_from_schedule: LatencyHistogram,
    /// Appends called, warm-up included.
    pub sent: u64,
    /// Appends called inside the measured window.
    pub measured: u64,
    /// Sequence number of the first measured append.
    pub first_measured_seq: Option<u64>,
    /// Appends that failed (an error answer or a lost connection).
    pub failed: u64,
    /// The first failure's message.
    pub first_error: Option<String>,
    /// Appends still unacknowledged at the drain end.
    pub unacked_after_drain: u64,
    /// Most appends unacknowledged at once.
    pub max_outstanding: usize,
}

#[derive(Default)]
struct PacedState {
    out: Paced,
    outstanding: usize,
}

struct Completion {
    measured: bool,
    sent: Instant,
    due: Instant,
    done: Instant,
    result: Result<(), String>,
}

impl PacedState {
    fn complete(&mut self, c: Completion) {
        match c.result {
            Ok(()) if c.measured => {
                self.out
                    .ack
                    .record(c.done.saturating_duration_since(c.sent));
                self.out
                    .ack_from_schedule
                    .record(c.done.saturating_duration_since(c.due));
            }
            Ok(()) => {}
            Err(e) => {
                self.out.failed += 1;
                self.out.first_error.get_or_insert(e);
            }
        }
    }
}

/// The producer gives up after this many failed appends (the run is reported with them).
const FAILURES_MAX: u64 = 1000;

/// Runs a paced producer on the calling (non-runtime) thread: append `seq` is due at
/// `w.t0 + seq / rate`; with `limit == 1` each append waits for the previous ack
/// (synchronous), else up to `limit` are unacknowledged (open loop). `handle` runs the acks.
pub fn paced_producer(
    handle: &tokio::runtime::Handle,
    client: &Arc<ProxyClient>,
    stream: &str,
    p: &Params,
    w: Window,
    limit: usize,
) -> Paced {
    let _ = tighten_timer_slack();
    let stream: Arc<str> = Arc::from(stream);
    let schedule = Schedule::new(w.t0, p.rate as f64).expect("rate checked above 0");
    let shared = Arc::new((Mutex::new(PacedState::default()), Condvar::new()));
    let limit = limit.max(1);
    for seq in 0u64.. {
        let due = schedule.intended(seq);
        if due >= w.end {
            break;
        }
        precise_sleep_until(due);
        if limit > 1 {
            // Wait for a free slot (a late send is measured from its due time).
            let (lock, cv) = &*shared;
            let mut st = lock.lock().expect("paced lock");
            while st.outstanding >= limit && quire_clock::now() < w.drain_end {
                let left = w.drain_end.saturating_duration_since(quire_clock::now());
                st = cv.wait_timeout(st, left).expect("paced lock").0;
            }
            if st.outstanding >= limit {
                break;
            }
        }
        if quire_clock::now() >= w.end {
            break; // behind schedule: still stop on time
        }
        let fut = write_future(client, &stream, seq, p.size);
        let sent = quire_clock::now();
        let measured = w.measured(sent);
        {
            let mut st = shared.0.lock().expect("paced lock");
            st.out.sent += 1;
            if measured {
                st.out.measured += 1;
                st.out.first_measured_seq.get_or_insert(seq);
            }
            st.outstanding += 1;
            st.out.max_outstanding = st.out.max_outstanding.max(st.outstanding);
        }
        let finish = {
            let shared = shared.clone();
            move |result: Result<(), String>| {
                let done = quire_clock::now();
                let (lock, cv) = &*shared;
                let mut st = lock.lock().expect("paced lock");
                st.outstanding -= 1;
                st.complete(Completion {
                    measured,
                    sent,
                    due,
                    done,
                    result,
                });
                cv.notify_all();
            }
        };
        if limit == 1 {
            match handle.block_on(tokio::time::timeout_at(w.drain_end.into(), fut)) {
                Ok(r) => finish(r),
                Err(_) => break, // counted as unacknowledged below
            }
        } else {
            let mut fut = fut;
            match handle.block_on(poll_once(&mut fut)) {
                Poll::Ready(r) => finish(r),
                Poll::Pending => {
                    handle.spawn(async move { finish(fut.await) });
                }
            }
        }
        if shared.0.lock().expect("paced lock").out.failed >= FAILURES_MAX {
            break;
        }
    }
    let (lock, cv) = &*shared;
    let mut st = lock.lock().expect("paced lock");
    while st.outstanding > 0 && quire_clock::now() < w.drain_end {
        let left = w.drain_end.saturating_duration_since(quire_clock::now());
        st = cv.wait_timeout(st, left).expect("paced lock").0;
    }
    let mut out = std::mem::take(&mut st.out);
    out.unacked_after_drain = st.outstanding as u64;
    // Acks arriving later still find `outstanding` to decrement; they change nothing reported.
    out
}

/// Outcome of the throughput mode.
#[derive(Debug, Default)]
pub struct Throughput {
    /// Ack latency (submit to ack) of appends submitted inside the window.
    pub ack: LatencyHistogram,
    /// Acks completed inside the window.
    pub acked_in_window: u64,
    /// Appends submitted, warm-up included.
    pub sent: u64,
    /// Failed appends.
    pub failed: u64,
    /// The first failure's message.
    pub first_error: Option<String>,
    /// Appends still unacknowledged at the drain end.
    pub abandoned_after_drain: u64,
    /// Most appends outstanding at once.
    pub max_inflight: usize,
}

/// `p.inflight` appends outstanding from `w.t0` until `w.end`, submitted in order, each
/// replaced as soon as it is acknowledged; then up to `w.drain_end` for the last acks.
pub async fn throughput(
    client: &Arc<ProxyClient>,
    stream: &str,
    p: &Params,
    w: Window,
) -> Throughput {
    let stream: Arc<str> = Arc::from(stream);
    let mut out = Throughput::default();
    let mut set: tokio::task::JoinSet<(Instant, Instant, Result<(), String>)> =
        tokio::task::JoinSet::new();
    let mut seq = 0u64;
    tokio::time::sleep_until(w.t0.into()).await;
    let account =
        |out: &mut Throughput, sent: Instant, done: Instant, r: Result<(), String>| match r {
            Ok(()) => {
                if done >= w.warm_end && done < w.end {
                    out.acked_in_window += 1;
                }
                if w.measured(sent) {
                    out.ack.record(done.saturating_duration_since(sent));
                }
            }
            Err(e) => {
                out.failed += 1;
                out.first_error.get_or_insert(e);
            }
        };
    loop {
        while set.len() < p.inflight && quire_clock::now() < w.end && out.failed < FAILURES_MAX {
            let mut fut = write_future(client, &stream, seq, p.size);
            let sent = quire_clock::now();
            seq += 1;
            out.sent += 1;
            match poll_once(&mut fut).await {
                Poll::Ready(r) => account(&mut out, sent, quire_clock::now(), r),
                Poll::Pending => {
                    set.spawn(async move {
                        let r = fut.await;
                        (sent, quire_clock::now(), r)
                    });
                }
            }
        }
        out.max_inflight = out.max_inflight.max(set.len());
        if set.is_empty() {
            if quire_clock::now() >= w.end || out.failed >= FAILURES_MAX {
                break;
            }
            continue;
        }
        match tokio::time::timeout_at(w.drain_end.into(), set.join_next()).await {
            Ok(Some(Ok((sent, done, r)))) => account(&mut out, sent, done, r),
            Ok(Some(Err(e))) => account(&mut out, w.end, w.end, Err(format!("ack task: {e}"))),
            Ok(None) | Err(_) => break,
        }
    }
    out.abandoned_after_drain = set.len() as u64;
    // The abandoned appends are on the wire already; their tasks may finish in the background.
    set.detach_all();
    out
}

/// What the tailing reader saw.
#[derive(Debug, Default)]
pub struct TailSeen {
    /// Per sequence number: 0 = not received, else end-to-end latency in ns + 1.
    pub e2e_plus_one: Vec<u64>,
    /// Distinct records received.
    pub unique: u64,
    /// Records received again.
    pub duplicates: u64,
    /// Deliveries whose sequence number is below the previous delivery's.
    pub out_of_order: u64,
    /// Records that are not this run's (short, or a sequence number beyond the schedule).
    pub unexpected: u64,
    /// Failed reads.
    pub reader_errors: u64,
    /// The first failure's message.
    pub first_reader_error: Option<String>,
}

impl TailSeen {
    /// Accounts one delivered record received at `now_ns` (CLOCK_MONOTONIC).
    pub fn deliver(&mut self, payload: &[u8], now_ns: u64, last_seq: &mut Option<u64>) {
        let Some((stamp, seq)) = record::decode(payload) else {
            self.unexpected += 1;
            return;
        };
        let Some(slot) = usize::try_from(seq)
            .ok()
            .and_then(|i| self.e2e_plus_one.get_mut(i))
        else {
            self.unexpected += 1;
            return;
        };
        if *slot != 0 {
            self.duplicates += 1;
            return;
        }
        *slot = now_ns.saturating_sub(stamp) + 1;
        self.unique += 1;
        if last_seq.is_some_and(|l| seq < l) {
            self.out_of_order += 1;
        }
        *last_seq = Some(seq);
    }

    /// End-to-end histogram and missing count over the measured sequence numbers
    /// `first..end`.
    pub fn measured(&self, first: u64, end: u64) -> (LatencyHistogram, u64) {
        let mut h = LatencyHistogram::new();
        let mut missing = 0;
        let end = (end as usize).min(self.e2e_plus_one.len());
        let first = (first as usize).min(end);
        for &v in &self.e2e_plus_one[first..end] {
            if v == 0 {
                missing += 1;
            } else {
                h.record_ns(v - 1);
            }
        }
        (h, missing)
    }
}

/// Reads `stream` from `from` with long polls (200 ms) until `stop` is set and every one of
/// `expected` records arrived, or `deadline`.
async fn tail_reader(
    reader: Arc<ProxyClient>,
    stream: String,
    from: ReadPosition,
    capacity: usize,
    expected: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    deadline: Instant,
) -> TailSeen {
    let mut seen = TailSeen {
        e2e_plus_one: vec![0; capacity],
        ..TailSeen::default()
    };
    let mut pos = from;
    let mut last_seq = None;
    loop {
        if stop.load(Ordering::Acquire) && seen.unique >= expected.load(Ordering::Acquire) {
            break;
        }
        let read = reader.read(&stream, pos, 4096, 4 << 20, Duration::from_millis(200));
        match tokio::time::timeout_at(deadline.into(), read).await {
            Err(_) => break,
            Ok(Ok(batch)) => {
                let now = record::mono_ns();
                for (_, _, p) in &batch.records {
                    seen.deliver(p, now, &mut last_seq);
                }
                pos = batch.next;
            }
            Ok(Err(e)) => {
                seen.reader_errors += 1;
                seen.first_reader_error.get_or_insert(e.to_string());
                if seen.reader_errors >= 100 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    seen
}

/// Connections and settings of a workload run against one proxy.
pub struct Target {
    /// The proxy address.
    pub proxy: String,
    /// The appends' connection.
    pub writer: Arc<ProxyClient>,
    /// The tailing reader's connection.
    pub reader: Arc<ProxyClient>,
    /// Stream names are `<prefix>-<mode>`.
    pub prefix: String,
    /// CPU accounting of the processes under test.
    pub cpu: CpuWatch,
}

impl Target {
    /// Connects the writer and reader connections.
    ///
    /// # Errors
    /// If the proxy cannot be reached or refuses the handshake.
    pub async fn connect(proxy: &str, prefix: String, cpu_pids: Vec<u32>) -> Result<Self> {
        let connect = || async {
            crate::client::connect(proxy)
                .await
                .with_context(|| format!("cannot connect to the proxy at {proxy}"))
        };
        Ok(Self {
            proxy: proxy.to_string(),
            writer: Arc::new(connect().await?),
            reader: Arc::new(connect().await?),
            prefix,
            cpu: CpuWatch::new(cpu_pids),
        })
    }

    /// Creates the mode's stream with a marker record (shorter than a record header, so no
    /// reader takes it for one); returns its name and the marker's DLSN. Creating the stream
    /// and its first segment here keeps both out of the measured run.
    async fn fresh_stream(&self, mode: Mode) -> Result<(String, Dlsn)> {
        let name = format!("{}-{}", self.prefix, mode.name());
        let w = self
            .writer
            .write(&name, vec![(0, b"marker".to_vec())], true)
            .await
            .with_context(|| format!("cannot create stream {name}"))?;
        Ok((name, w.last_dlsn))
    }

    /// Runs one mode and returns its JSON figures (`count`, `errors` and the mode's own
    /// fields; the caller adds `peer`, `mode`, `label`, `unix_time`, `peer_info`, `host`).
    ///
    /// # Errors
    /// If the stream cannot be created, or a task of the run panicked.
    pub async fn run(&self, mode: Mode, p: &Params) -> Result<(Value, String)> {
        let (stream, marker) = self.fresh_stream(mode).await?;
        let w = p.window(quire_clock::now() + Duration::from_millis(50));
        let cpu = self.cpu.watch(w);
        let handle = tokio::runtime::Handle::current();
        let mut v = match mode {
            Mode::Latency | Mode::LatencyOpen => {
                let limit = if mode == Mode::Latency {
                    1
                } else {
                    p.outstanding
                };
                let (client, s, p2) = (self.writer.clone(), stream.clone(), *p);
                let r = tokio::task::spawn_blocking(move || {
                    paced_producer(&handle, &client, &s, &p2, w, limit)
                })
                .await
                .context("paced producer thread")?;
                paced_json(p, &r, limit)
            }
            Mode::Throughput => throughput_json(p, &throughput(&self.writer, &stream, p, w).await),
            Mode::Tail => {
                let capacity = Schedule::new(w.t0, p.rate as f64)
                    .expect("rate checked above 0")
                    .count_within(p.warmup + p.duration) as usize
                    + 1;
                let expected = Arc::new(AtomicU64::new(u64::MAX));
                let stop = Arc::new(AtomicBool::new(false));
                let from = ReadPosition::Dlsn(Dlsn::new(
                    marker.segment_seq_no,
                    marker.entry_id,
                    marker.slot_index + 1,
                ));
                let reader = tokio::spawn(tail_reader(
                    self.reader.clone(),
                    stream.clone(),
                    from,
                    capacity,
                    expected.clone(),
                    stop.clone(),
                    w.drain_end,
                ));
                let (client, s, p2, limit) =
                    (self.writer.clone(), stream.clone(), *p, p.outstanding);
                let prod = tokio::task::spawn_blocking(move || {
                    paced_producer(&handle, &client, &s, &p2, w, limit)
                })
                .await
                .context("paced producer thread")?;
                expected.store(prod.sent, Ordering::Release);
                stop.store(true, Ordering::Release);
                let seen = reader.await.context("tail reader task")?;
                tail_json(p, &prod, &seen)
            }
        };
        let (a, b) = cpu
            .join()
            .map_err(|_| anyhow::anyhow!("CPU sampler thread panicked"))?;
        let acked = acked_measured(&v);
        v["cpu"] = self.cpu.json(&a, &b, acked);
        Ok((v, stream))
    }
}

/// Acknowledged records of the measured window, the CPU figures' divisor: the ack histogram's
/// count in the paced modes and tail, the acks completed in the window in throughput.
fn acked_measured(v: &Value) -> u64 {
    if v.get("records_per_s").is_some() {
        v["count"].as_u64().unwrap_or(0)
    } else {
        v["ack_us"]["n"].as_u64().unwrap_or(0)
    }
}

/// The figures of `latency` (limit 1) and `latency-open`: `count` (measured sends), `acked`,
/// `errors` (failed + unacknowledged at the drain end, so that a run with either is not
/// clean), `failed`, `unacked_after_drain`, `first_error`, `achieved_rate` (records/s),
/// `outstanding_limit`, `max_outstanding`, `ack_us`, `ack_from_schedule_us`.
pub fn paced_json(p: &Params, r: &Paced, limit: usize) -> Value {
    json!({
        "params": p.json(),
        "count": r.measured,
        "acked": r.ack.count(),
        "errors": r.failed + r.unacked_after_drain,
        "failed": r.failed,
        "unacked_after_drain": r.unacked_after_drain,
        "first_error": r.first_error,
        "achieved_rate": achieved_rate(r.measured, p.duration),
        "outstanding_limit": limit,
        "max_outstanding": r.max_outstanding,
        "ack_us": r.ack.summary_us(),
        "ack_from_schedule_us": r.ack_from_schedule.summary_us(),
    })
}

/// The figures of `throughput`: `count` (acks in the window), `errors` (failed appends),
/// `first_error`, `abandoned_after_drain`, `max_inflight`, `records_per_s`, `mb_per_s`
/// (10^6 B/s of payload), `ack_us`.
pub fn throughput_json(p: &Params, r: &Throughput) -> Value {
    let (rps, mbps) = throughput_rates(r.acked_in_window, p.duration, p.size);
    json!({
        "params": p.json(),
        "count": r.acked_in_window,
        "errors": r.failed,
        "first_error": r.first_error,
        "abandoned_after_drain": r.abandoned_after_drain,
        "max_inflight": r.max_inflight,
        "records_per_s": rps,
        "mb_per_s": mbps,
        "ack_us": r.ack.summary_us(),
    })
}

/// The figures of `tail`: `count` (measured records delivered), `published` (appends called),
/// `achieved_rate`, `errors` = `publish_errors` (failed + unacknowledged appends),
/// `first_publish_error`, `received_total`, `missing_measured`, `duplicates`, `out_of_order`,
/// `unexpected`, `reader_errors`, `first_reader_error`, `e2e_us` (stamp to receipt), `ack_us`.
pub fn tail_json(p: &Params, prod: &Paced, seen: &TailSeen) -> Value {
    let first = prod.first_measured_seq.unwrap_or(prod.sent);
    let (e2e, missing) = seen.measured(first, prod.sent);
    let publish_errors = prod.failed + prod.unacked_after_drain;
    json!({
        "params": p.json(),
        "count": e2e.count(),
        "published": prod.sent,
        "achieved_rate": achieved_rate(prod.measured, p.duration),
        "errors": publish_errors,
        "publish_errors": publish_errors,
        "unacked_after_drain": prod.unacked_after_drain,
        "first_publish_error": prod.first_error,
        "received_total": seen.unique,
        "missing_measured": missing,
        "duplicates": seen.duplicates,
        "out_of_order": seen.out_of_order,
        "unexpected": seen.unexpected,
        "reader_errors": seen.reader_errors,
        "first_reader_error": seen.first_reader_error,
        "e2e_us": e2e.summary_us(),
        "ack_us": prod.ack.summary_us(),
    })
}

/// What an ack means for Quire, for `peer_info.durability`.
pub const DURABILITY: &str = "ack after the record's entry is in the journals of an ack quorum \
    (Qa) of the ledger's write set (Qw of E bookies), each bookie answering only after the \
    O_DIRECT journal write and fdatasync of the batch holding it (BookKeeper's add rule)";

/// `{ensemble_size, write_quorum, ack_quorum, ledgers, source}` of `stream`'s ledgers, read
/// from a sandbox's embedded metadata store file (`DIR/metadata/metadata.json`); an `error`
/// field instead when it cannot be read or names no ledger for the stream.
pub fn quorum_from_sandbox(dir: &std::path::Path, stream: &str) -> Value {
    let path = dir.join("metadata").join("metadata.json");
    let doc: Value = match std::fs::read(&path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(d) => d,
        Err(e) => return json!({"error": format!("{}: {e}", path.display())}),
    };
    // Each map value is `[document, version]`, as the embedded store keeps it.
    let segments = doc["streams"][stream][0]["segments"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut quorums = Vec::new();
    for seg in &segments {
        let Some(id) = seg["ledger_id"].as_u64() else {
            continue;
        };
        let l = &doc["ledgers"][id.to_string()][0];
        quorums.push((
            l["ensemble_size"].as_u64(),
            l["write_quorum"].as_u64(),
            l["ack_quorum"].as_u64(),
        ));
    }
    match quorums.first() {
        Some(&(e, w, a)) if quorums.iter().all(|q| *q == (e, w, a)) => json!({
            "ensemble_size": e, "write_quorum": w, "ack_quorum": a,
            "ledgers": quorums.len(), "source": path.display().to_string(),
        }),
        Some(_) => json!({"error": "the stream's ledgers have different quorums",
                          "source": path.display().to_string()}),
        None => json!({"error": format!("no ledger of stream {stream} in {}", path.display())}),
    }
}

fn ms(v: &Value, key: &str, q: &str) -> String {
    v[key][q]
        .as_f64()
        .map_or("-".to_string(), |us| format!("{:.3}", us / 1e3))
}

/// One line of the human table (milliseconds): the mode's headline latency (latency: service
/// time; latency-open: from schedule; throughput: ack; tail: end to end).
pub fn human_row(mode: &str, v: &Value) -> String {
    let key = match mode {
        "latency" => "ack_us",
        "latency-open" => "ack_from_schedule_us",
        "tail" => "e2e_us",
        _ => "ack_us",
    };
    let rate = v["records_per_s"]
        .as_f64()
        .or(v["achieved_rate"].as_f64())
        .unwrap_or(0.0);
    let cpu = |k: &str, prec: usize| {
        v["cpu"][k]
            .as_f64()
            .map_or("-".to_string(), |x| format!("{x:.prec$}"))
    };
    let extra = match mode {
        "tail" => format!(
            " missing={} dup={} ooo={} reader_err={}",
            v["missing_measured"], v["duplicates"], v["out_of_order"], v["reader_errors"]
        ),
        "throughput" => format!(" abandoned={}", v["abandoned_after_drain"]),
        _ => format!(" unacked={}", v["unacked_after_drain"]),
    };
    format!(
        "{mode:<13} {:>7} {:>5} {:>9.1} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7} {:>9}{extra}",
        v["count"].to_string(),
        v["errors"].to_string(),
        rate,
        ms(v, key, "p50"),
        ms(v, key, "p90"),
        ms(v, key, "p99"),
        ms(v, key, "p999"),
        ms(v, key, "max"),
        cpu("seconds", 2),
        cpu("per_record_ms", 4),
    )
}

/// The human table's header line.
pub const HUMAN_HEADER: &str = "mode            count   err    rec/s   p50 ms   p90 ms   p99 ms p99.9 ms    max ms   cpu s cpu ms/rec";

#[cfg(test)]
mod tests {
    use super::*;

    /// Within HdrHistogram's 3 significant digits.
    fn near(v: &Value, want: f64) {
        let got = v.as_f64().unwrap();
        assert!((got - want).abs() <= want * 1e-3 + 0.1, "{got} vs {want}");
    }

    fn keys(v: &Value) -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    }

    // Goal: the measured window is [t0 + warmup, t0 + warmup + duration) and the drain ends
    // `drain` later; defaults are the workload's. Method: marks of a default window.
    #[test]
    fn window_marks() {
        let p = Params::default();
        assert_eq!(
            (p.size, p.rate, p.inflight, p.outstanding),
            (1024, 1000, 256, 1024)
        );
        let t0 = quire_clock::now();
        let w = p.window(t0);
        assert_eq!(w.warm_end - t0, Duration::from_secs(5));
        assert_eq!(w.end - t0, Duration::from_secs(25));
        assert_eq!(w.drain_end - t0, Duration::from_secs(30));
        assert!(!w.measured(t0 + Duration::from_millis(4999)));
        assert!(w.measured(t0 + Duration::from_secs(5)));
        assert!(w.measured(t0 + Duration::from_millis(24_999)));
        assert!(!w.measured(t0 + Duration::from_secs(25)));
        // At 1000/s the schedule holds 25,000 sends before the end, 20,000 in the window.
        let s = Schedule::new(t0, 1000.0).unwrap();
        assert_eq!(s.count_within(p.warmup + p.duration), 25_000);
        assert_eq!(s.intended(5000), w.warm_end);
    }

    // Goal: rates are records over the measured seconds, MB/s in 10^6 bytes. Method: 20,000
    // records in 20 s of 1 KiB records.
    #[test]
    fn rates_and_units() {
        assert_eq!(achieved_rate(19_800, Duration::from_secs(20)), 990.0);
        let (rps, mbps) = throughput_rates(200_000, Duration::from_secs(20), 1024);
        assert_eq!(rps, 10_000.0);
        assert!((mbps - 10.24).abs() < 1e-9);
    }

    // Goal: the JSON lines carry exactly the field names of workload.md (plus documented
    // extras) with latencies in microseconds. Method: build each mode's figures from known
    // outcomes and compare key sets and values.
    #[test]
    fn json_field_names_and_units() {
        let p = Params::default();
        let pj = p.json();
        for k in [
            "size",
            "rate",
            "duration_s",
            "warmup_s",
            "inflight",
            "outstanding",
        ] {
            assert!(pj.get(k).is_some(), "params.{k}");
        }
        assert_eq!(pj["duration_s"], 20.0);
        let mut r = Paced {
            sent: 25_000,
            measured: 20_000,
            first_measured_seq: Some(5000),
            max_outstanding: 3,
            ..Paced::default()
        };
        for _ in 0..20_000 {
            r.ack.record(Duration::from_micros(500));
            r.ack_from_schedule.record(Duration::from_micros(700));
        }
        let v = paced_json(&p, &r, 1024);
        assert_eq!(
            keys(&v),
            [
                "achieved_rate",
                "ack_from_schedule_us",
                "ack_us",
                "acked",
                "count",
                "errors",
                "failed",
                "first_error",
                "max_outstanding",
                "outstanding_limit",
                "params",
                "unacked_after_drain"
            ]
        );
        assert_eq!(v["count"], 20_000);
        assert_eq!(v["achieved_rate"], 1000.0);
        near(&v["ack_us"]["p50"], 500.0); // microseconds, 0.1% precision
        near(&v["ack_from_schedule_us"]["p999"], 700.0);
        assert_eq!(
            keys(&v["ack_us"]),
            ["max", "mean", "n", "p50", "p90", "p99", "p999"]
        );

        let mut t = Throughput {
            acked_in_window: 100_000,
            ..Throughput::default()
        };
        t.ack.record(Duration::from_millis(3));
        let v = throughput_json(&p, &t);
        for k in [
            "records_per_s",
            "mb_per_s",
            "ack_us",
            "abandoned_after_drain",
            "count",
            "errors",
        ] {
            assert!(v.get(k).is_some(), "throughput.{k}");
        }
        assert_eq!(v["records_per_s"], 5000.0);
        near(&v["ack_us"]["p50"], 3000.0);

        let mut seen = TailSeen {
            e2e_plus_one: vec![0; 10],
            ..TailSeen::default()
        };
        let mut last = None;
        for seq in [0u64, 1, 2, 4, 3, 3, 5, 6, 7, 8] {
            seen.deliver(
                &record::encode(seq, 1_000, 64),
                1_000 + 2_000_000,
                &mut last,
            );
        }
        seen.deliver(b"marker", 0, &mut last);
        seen.deliver(&record::encode(99, 0, 64), 0, &mut last);
        let prod = Paced {
            sent: 10,
            measured: 8,
            first_measured_seq: Some(2),
            ..Paced::default()
        };
        let v = tail_json(&p, &prod, &seen);
        for k in [
            "e2e_us",
            "ack_us",
            "published",
            "missing_measured",
            "duplicates",
            "out_of_order",
            "reader_errors",
            "count",
            "errors",
            "publish_errors",
        ] {
            assert!(v.get(k).is_some(), "tail.{k}");
        }
        assert_eq!(v["missing_measured"], 1, "seq 9 never arrived");
        assert_eq!(v["duplicates"], 1);
        assert_eq!(v["out_of_order"], 1, "3 after 4");
        assert_eq!(v["unexpected"], 2);
        assert_eq!(v["count"], 7, "seqs 2..=8 delivered in the window");
        near(&v["e2e_us"]["p50"], 2000.0); // 2 ms in microseconds
    }

    // Goal: CPU accounting divides the watched processes' CPU seconds by the acknowledged
    // records and reports ms per record; an unreadable pid makes the total null with its
    // error, never a made-up number. Method: two hand-made samples 20 s apart.
    #[test]
    fn cpu_json_arithmetic() {
        let watch = CpuWatch {
            pids: vec![10, 11],
            ticks_per_s: 100,
        };
        let t = quire_clock::now();
        let tick = |u, s| CpuTicks { utime: u, stime: s };
        let a = CpuSample {
            at: t,
            pids: vec![Ok(tick(100, 100)), Ok(tick(0, 0))],
            own: Some(tick(0, 0)),
        };
        let b = CpuSample {
            at: t + Duration::from_secs(20),
            pids: vec![Ok(tick(1100, 300)), Ok(tick(200, 0))],
            own: Some(tick(150, 50)),
        };
        let v = watch.json(&a, &b, 20_000);
        assert_eq!(v["seconds"], 14.0);
        assert_eq!(v["per_record_ms"], 0.7);
        assert_eq!(v["window_s"], 20.0);
        assert_eq!(v["cores"], 0.7);
        assert_eq!(v["client_seconds"], 2.0);
        assert_eq!(v["client_per_record_ms"], 0.1);
        assert_eq!(v["per_pid"][0]["seconds"], 12.0);
        let gone = CpuSample {
            pids: vec![Ok(tick(1100, 300)), Err("cannot read /proc/11/stat".into())],
            ..b.clone()
        };
        let v = watch.json(&a, &gone, 20_000);
        assert!(v["seconds"].is_null() && v["per_record_ms"].is_null());
        assert_eq!(v["per_pid"][1]["error"], "cannot read /proc/11/stat");
        let v = watch.json(&a, &b, 0);
        assert!(v["per_record_ms"].is_null(), "nothing acknowledged");
        let none = CpuWatch {
            pids: vec![],
            ticks_per_s: 100,
        };
        let e = CpuSample {
            at: t,
            pids: vec![],
            own: None,
        };
        assert!(none.json(&e, &e, 5)["seconds"].is_null());
    }

    // Goal: the quorum is read from the sandbox's metadata file for the stream's ledgers.
    // Method: a file in the embedded store's shape.
    #[test]
    fn quorum_from_a_sandbox_metadata_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("metadata")).unwrap();
        let doc = json!({
            "ledgers": {"7": [{"ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2}, 0]},
            "streams": {"s": [{"segments": [{"seq_no": 1, "ledger_id": 7}]}, 1]},
        });
        std::fs::write(
            dir.path().join("metadata/metadata.json"),
            serde_json::to_vec(&doc).unwrap(),
        )
        .unwrap();
        let q = quorum_from_sandbox(dir.path(), "s");
        assert_eq!(
            (&q["ensemble_size"], &q["write_quorum"], &q["ack_quorum"]),
            (&json!(3), &json!(3), &json!(2))
        );
        assert!(quorum_from_sandbox(dir.path(), "other")["error"].is_string());
        assert!(quorum_from_sandbox(&dir.path().join("nope"), "s")["error"].is_string());
    }
}

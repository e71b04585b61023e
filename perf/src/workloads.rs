//! The workloads, driven through the proxy client (`quire_client::ProxyClient`).
//!
//! Writes go out over several connections (the client pipelines requests on one connection,
//! and the proxy submits a connection's writes in frame order, so more connections only spread
//! the socket work); readers get connections of their own. Each workload writes to streams of
//! its own, named `<prefix>-<workload>-<n>`, created by a marker record written before the
//! measured run (which also opens the first segment, so segment creation is not measured).
//! Every record carries the same txid (the run's start time in ms): concurrent writes from
//! several connections reach the stream in no fixed order, and equal txids are in order by the
//! DistributedLog rule (non-decreasing).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use quire_client::{ProxyClient, ReadPosition};

use crate::hist::LatencyHistogram;
use crate::loadgen::{run_open_loop, OpenLoopConfig, OpenLoopReport, OpenLoopResult};
use crate::payload;
use crate::progress::Progress;
use crate::report::{
    CatchUpReport, IsolationReport, TailReadReport, ThroughputReport, ThroughputStep,
};
use crate::schedule::Schedule;

/// Shape of an open-loop write load.
#[derive(Debug, Clone, Copy)]
pub struct LoadShape {
    /// Records per second.
    pub rate_records_per_s: f64,
    /// Unrecorded span at the start.
    pub warmup: Duration,
    /// Recorded span.
    pub duration: Duration,
    /// Payload bytes per record.
    pub record_size_bytes: usize,
    /// Records per write call.
    pub batch: usize,
    /// Streams written (round robin).
    pub streams: usize,
    /// Write calls outstanding at most.
    pub in_flight_max: usize,
    /// Longest wait for outstanding writes after the schedule ends.
    pub drain_timeout: Duration,
}

impl LoadShape {
    fn open_loop(&self) -> OpenLoopConfig {
        OpenLoopConfig {
            rate_per_s: self.rate_records_per_s / self.batch as f64,
            warmup: self.warmup,
            duration: self.duration,
            in_flight_max: self.in_flight_max,
            drain_timeout: self.drain_timeout,
            records_per_send: self.batch as u64,
        }
    }

    fn total(&self) -> Duration {
        self.warmup + self.duration
    }
}

/// A backlog stream written for the catch-up and isolation workloads.
#[derive(Debug, Clone)]
pub struct Backlog {
    /// Stream name.
    pub stream: String,
    /// Records written (the marker excluded).
    pub records: u64,
    /// Payload bytes written.
    pub bytes: u64,
    /// Time taken to write it, seconds.
    pub fill_seconds: f64,
}

/// Connections to one proxy and the run's clock base.
pub struct Cluster {
    writers: Vec<Arc<ProxyClient>>,
    reader: Arc<ProxyClient>,
    scanner: Arc<ProxyClient>,
    /// Where the scanner's connection and its loop run (see `--scanner-nice`).
    scan_runtime: tokio::runtime::Handle,
    base: Instant,
    progress: Arc<Progress>,
    prefix: String,
    txid: u64,
    streams_made: AtomicU64,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Opens `connections` writer connections and two reader connections to the proxy at `addr`;
    /// the isolation run's scanner connects and runs on `scan_runtime`.
    /// Stream names start with `prefix`; every record carries txid `txid`.
    ///
    /// # Errors
    /// If the proxy cannot be reached or refuses the handshake.
    pub async fn connect(
        addr: &str,
        connections: usize,
        prefix: String,
        txid: u64,
        progress: Arc<Progress>,
        scan_runtime: tokio::runtime::Handle,
    ) -> Result<Self> {
        let mut writers = Vec::new();
        for _ in 0..connections.max(1) {
            writers.push(Arc::new(
                crate::client::connect(addr)
                    .await
                    .with_context(|| format!("cannot connect to the proxy at {addr}"))?,
            ));
        }
        let reader = Arc::new(
            crate::client::connect(addr)
                .await
                .with_context(|| format!("cannot connect to the proxy at {addr}"))?,
        );
        let scan_addr = addr.to_string();
        let scanner = Arc::new(
            scan_runtime
                .spawn(async move { crate::client::connect(&scan_addr).await })
                .await
                .context("scanner connect task")?
                .with_context(|| format!("cannot connect to the proxy at {addr}"))?,
        );
        Ok(Self {
            writers,
            reader,
            scanner,
            scan_runtime,
            base: quire_clock::now(),
            progress,
            prefix,
            txid,
            streams_made: AtomicU64::new(0),
        })
    }

    /// Creates `n` fresh streams for `what`, each holding one marker record; returns their names
    /// and the markers' positions.
    async fn fresh_streams(&self, what: &str, n: usize) -> Result<Vec<(String, ReadPosition)>> {
        let mut out = Vec::new();
        for _ in 0..n.max(1) {
            let k = self.streams_made.fetch_add(1, Ordering::Relaxed);
            let name = format!("{}-{what}-{k}", self.prefix);
            let w = self.writers[0]
                .write(
                    &name,
                    vec![(self.txid, b"quire-perf marker".to_vec())],
                    true,
                )
                .await
                .with_context(|| format!("cannot create stream {name}"))?;
            out.push((name, ReadPosition::Dlsn(w.last_dlsn)));
        }
        Ok(out)
    }

    /// Open-loop writes of `shape` round robin over `streams` and the writer connections.
    async fn open_loop_writes(&self, streams: &[String], shape: &LoadShape) -> OpenLoopResult {
        let names = streams;
        let streams: Arc<Vec<String>> = Arc::new(streams.to_vec());
        let writers = self.writers.clone();
        let (base, txid, batch, size) = (
            self.base,
            self.txid,
            shape.batch.max(1),
            shape.record_size_bytes,
        );
        let send = move |i: u64, intended: Instant| {
            let client = writers[(i % writers.len() as u64) as usize].clone();
            let streams = streams.clone();
            let ns = intended.saturating_duration_since(base).as_nanos() as u64;
            let records: Vec<(u64, Vec<u8>)> = (0..batch as u64)
                .map(|k| (txid, payload::encode(i * batch as u64 + k, ns, size)))
                .collect();
            async move {
                let stream = &streams[(i % streams.len() as u64) as usize];
                client
                    .write(stream, records, false)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        };
        let r = run_open_loop(shape.open_loop(), Some(self.progress_counters()), send).await;
        self.barrier(names).await;
        r
    }

    /// Waits until every write issued so far to `streams` has been applied: one marker write per
    /// (connection, stream), each queued behind that connection's earlier writes, and a stream
    /// applies its writes in submission order. Writes abandoned at a drain deadline are still
    /// queued in the proxy; without this, their load would spill into the next workload. Gives
    /// up after two minutes with a warning.
    async fn barrier(&self, streams: &[String]) {
        self.progress.phase(
            "waiting for writes still queued in the cluster",
            Duration::from_secs(1),
        );
        let mut tasks = tokio::task::JoinSet::new();
        for w in &self.writers {
            for s in streams {
                let (w, s, txid) = (w.clone(), s.clone(), self.txid);
                tasks.spawn(async move {
                    w.write(&s, vec![(txid, b"quire-perf barrier".to_vec())], false)
                        .await
                });
            }
        }
        let all = async {
            while let Some(r) = tasks.join_next().await {
                if let Ok(Err(e)) = r {
                    return Err(e.to_string());
                }
            }
            Ok(())
        };
        match tokio::time::timeout(Duration::from_secs(120), all).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self
                .progress
                .println(&format!("  warning: barrier write failed: {e}")),
            Err(_) => self
                .progress
                .println("  warning: writes still queued after 2 minutes; going on"),
        }
    }

    fn progress_counters(&self) -> Arc<crate::progress::Counters> {
        self.progress.counters.clone()
    }

    /// Tail-write latency at a fixed rate.
    ///
    /// # Errors
    /// If the streams cannot be created.
    pub async fn tail_write(&self, shape: &LoadShape, label: &str) -> Result<OpenLoopReport> {
        self.progress.phase(
            &format!("{label} at {:.0} rec/s", shape.rate_records_per_s),
            shape.total(),
        );
        let streams: Vec<String> = self
            .fresh_streams("tail-write", shape.streams)
            .await?
            .into_iter()
            .map(|s| s.0)
            .collect();
        let r = self.open_loop_writes(&streams, shape).await;
        Ok(r.report(&shape.open_loop()))
    }

    /// The maximum sustainable durable throughput: the highest rate whose p99 stays within
    /// `p99_ms_max` with no error and nothing censored. Doubles from `start_rate` until a step
    /// fails or `max_rate` is reached, then bisects `refine_steps` times between the last pass
    /// (or 0) and the first failure. Each step writes fresh streams; after a failed step the
    /// harness pauses `settle` so the backlog it left drains before the next.
    ///
    /// # Errors
    /// If the streams cannot be created.
    #[allow(clippy::too_many_arguments)]
    pub async fn throughput(
        &self,
        shape: &LoadShape,
        start_rate: f64,
        max_rate: f64,
        refine_steps: u32,
        p99_ms_max: f64,
        write_amplification: f64,
        settle: Duration,
    ) -> Result<ThroughputReport> {
        let mut steps = Vec::new();
        let mut pass: Option<f64> = None;
        let mut fail: Option<f64> = None;
        let mut rate = start_rate;
        // Double while steps pass; if the first step fails, halve until one passes (at most 8
        // times), so the bisection below has a passing lower end whenever one exists.
        loop {
            let ok = self
                .throughput_step(shape, rate, p99_ms_max, &mut steps, settle)
                .await?;
            if ok {
                pass = Some(rate);
                if fail.is_some() || rate * 2.0 > max_rate {
                    break;
                }
                rate *= 2.0;
            } else {
                fail = Some(fail.map_or(rate, |f: f64| f.min(rate)));
                if pass.is_some() || steps.len() > 8 || rate / 2.0 < 1.0 {
                    break;
                }
                rate = (rate / 2.0).round();
            }
        }
        if let Some(hi) = fail {
            let mut lo = pass.unwrap_or(0.0);
            let mut hi = hi;
            for _ in 0..refine_steps {
                let mid = ((lo + hi) / 2.0).round();
                if mid <= lo || mid >= hi || mid < 1.0 {
                    break;
                }
                if self
                    .throughput_step(shape, mid, p99_ms_max, &mut steps, settle)
                    .await?
                {
                    lo = mid;
                    pass = Some(mid);
                } else {
                    hi = mid;
                }
            }
        }
        Ok(ThroughputReport {
            p99_ms_max,
            steps,
            sustained_records_per_s: pass.unwrap_or(0.0),
            record_size_bytes: shape.record_size_bytes,
            write_amplification,
        })
    }

    async fn throughput_step(
        &self,
        shape: &LoadShape,
        rate: f64,
        p99_ms_max: f64,
        steps: &mut Vec<ThroughputStep>,
        settle: Duration,
    ) -> Result<bool> {
        let shape = LoadShape {
            rate_records_per_s: rate,
            ..*shape
        };
        self.progress.phase(
            &format!("throughput step at {rate:.0} rec/s"),
            shape.total(),
        );
        let streams: Vec<String> = self
            .fresh_streams("throughput", shape.streams)
            .await?
            .into_iter()
            .map(|s| s.0)
            .collect();
        let run = self
            .open_loop_writes(&streams, &shape)
            .await
            .report(&shape.open_loop());
        let passed = run.errors == 0
            && run.censored == 0
            && run.latency.count > 0
            && run.latency.p99_ms <= p99_ms_max;
        self.progress.println(&format!(
            "  throughput step {rate:.0} rec/s: p99 {:.3} ms -> {}",
            run.latency.p99_ms,
            if passed { "ok" } else { "over" }
        ));
        steps.push(ThroughputStep { run, passed });
        if !passed {
            tokio::time::sleep(settle).await;
        }
        Ok(passed)
    }

    /// Tail-read delivery latency: open-loop writes at the fixed rate while one reader per
    /// stream tails it with long-poll reads; delivery latency is receipt time − intended send
    /// time (carried in the payload), warm-up records excluded.
    ///
    /// # Errors
    /// If the streams cannot be created or a read fails.
    pub async fn tail_read(&self, shape: &LoadShape) -> Result<TailReadReport> {
        self.progress.phase(
            &format!("tail-read at {:.0} rec/s", shape.rate_records_per_s),
            shape.total(),
        );
        let streams = self.fresh_streams("tail-read", shape.streams).await?;
        let sched = Schedule::new(
            quire_clock::now(),
            shape.rate_records_per_s / shape.batch as f64,
        )
        .map_err(anyhow::Error::msg)?;
        let warm_seq = sched.count_within(shape.warmup) * shape.batch as u64;
        let expected = Arc::new(AtomicU64::new(u64::MAX));
        let delivered = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let total_seq = sched.count_within(shape.total()) * shape.batch as u64;
        let seen: Arc<Vec<AtomicBool>> =
            Arc::new((0..total_seq).map(|_| AtomicBool::new(false)).collect());
        let mut readers = Vec::new();
        for (name, from) in &streams {
            let (client, name, from, base) = (self.reader.clone(), name.clone(), *from, self.base);
            let (expected, delivered, stop, counters, seen) = (
                expected.clone(),
                delivered.clone(),
                stop.clone(),
                self.progress_counters(),
                seen.clone(),
            );
            readers.push(tokio::spawn(async move {
                let mut hist = LatencyHistogram::new();
                let mut pos = from;
                while !stop.load(Ordering::Relaxed)
                    && delivered.load(Ordering::Relaxed) < expected.load(Ordering::Relaxed)
                {
                    let batch = client
                        .read(&name, pos, 4096, 4 << 20, Duration::from_millis(200))
                        .await?;
                    let now = quire_clock::now();
                    for (_, _, p) in &batch.records {
                        if let Some((seq, ns)) = payload::decode(p) {
                            delivered.fetch_add(1, Ordering::Relaxed);
                            counters.read.fetch_add(1, Ordering::Relaxed);
                            if let Some(flag) = seen.get(seq as usize) {
                                flag.store(true, Ordering::Relaxed);
                            }
                            if seq >= warm_seq {
                                hist.record(
                                    now.saturating_duration_since(base + Duration::from_nanos(ns)),
                                );
                            }
                        }
                    }
                    pos = batch.next;
                }
                Ok::<_, quire_client::Error>(hist)
            }));
        }
        let names: Vec<String> = streams.iter().map(|s| s.0.clone()).collect();
        let write = self.open_loop_writes(&names, shape).await;
        let acknowledged = write.completed * shape.batch as u64;
        expected.store(acknowledged, Ordering::Relaxed);
        // Readers get a grace period to catch up with what was acknowledged.
        let grace = tokio::time::sleep(Duration::from_secs(5));
        tokio::pin!(grace);
        let mut delivery = LatencyHistogram::new();
        let joined = futures_join(readers);
        tokio::pin!(joined);
        tokio::select! {
            r = &mut joined => {
                for h in r? { delivery.add(&h); }
            }
            () = &mut grace => {
                stop.store(true, Ordering::Relaxed);
                for h in joined.await? { delivery.add(&h); }
            }
        }
        // Records never delivered (written late, or lost) count at a lower bound, like
        // censored writes; a write that failed is not expected to be delivered.
        let cut = quire_clock::now();
        let sends = Schedule::new(write.start, shape.rate_records_per_s / shape.batch as f64)
            .map_err(anyhow::Error::msg)?;
        let mut delivery_censored = 0;
        if write.errors == 0 {
            for seq in warm_seq..total_seq {
                if !seen[seq as usize].load(Ordering::Relaxed) {
                    delivery_censored += 1;
                    delivery.record(
                        cut.saturating_duration_since(sends.intended(seq / shape.batch as u64)),
                    );
                }
            }
        }
        Ok(TailReadReport {
            write: write.report(&shape.open_loop()),
            delivery: delivery.summary(),
            delivery_distribution: delivery.distribution(),
            delivered: delivered.load(Ordering::Relaxed),
            delivery_censored,
            acknowledged,
        })
    }

    /// Writes a backlog of about `bytes` payload bytes to a fresh stream, closed loop (batches of
    /// 256 records, 4 batches in flight), as fast as the cluster takes it.
    ///
    /// # Errors
    /// If a write fails.
    pub async fn fill_backlog(&self, bytes: u64, record_size_bytes: usize) -> Result<Backlog> {
        let records = bytes.div_ceil(record_size_bytes as u64);
        self.progress.phase(
            &format!("writing a {} MiB backlog", bytes >> 20),
            Duration::from_secs(bytes / (8 << 20) + 1),
        );
        let (stream, _) = self.fresh_streams("backlog", 1).await?.remove(0);
        let started = quire_clock::now();
        let batch = 256u64;
        let mut next = 0u64;
        let mut tasks = tokio::task::JoinSet::new();
        let counters = self.progress_counters();
        while next < records || !tasks.is_empty() {
            while next < records && tasks.len() < 4 {
                let n = batch.min(records - next);
                let recs: Vec<(u64, Vec<u8>)> = (next..next + n)
                    .map(|s| (self.txid, payload::encode(s, 0, record_size_bytes)))
                    .collect();
                let (client, stream, counters) = (
                    self.writers[(next / batch) as usize % self.writers.len()].clone(),
                    stream.clone(),
                    counters.clone(),
                );
                counters.sent.fetch_add(n, Ordering::Relaxed);
                tasks.spawn(async move {
                    let r = client.write(&stream, recs, false).await;
                    counters.done.fetch_add(n, Ordering::Relaxed);
                    r
                });
                next += n;
            }
            if let Some(r) = tasks.join_next().await {
                r.context("backlog writer task")?
                    .with_context(|| format!("backlog write to {stream} failed"))?;
            }
        }
        Ok(Backlog {
            stream,
            records,
            bytes: records * record_size_bytes as u64,
            fill_seconds: quire_clock::elapsed(started).as_secs_f64(),
        })
    }

    /// Reads the whole backlog from the head as fast as one reader can (read calls of up to
    /// 4096 records / 4 MiB, no wait), on its own connection.
    ///
    /// # Errors
    /// If a read fails, or the stream ends before the backlog was read.
    pub async fn catch_up(&self, backlog: &Backlog) -> Result<CatchUpReport> {
        self.progress.phase(
            &format!("catch-up read of {} records", backlog.records),
            Duration::from_secs(backlog.bytes / (16 << 20) + 1),
        );
        let counters = self.progress_counters();
        let mut calls = LatencyHistogram::new();
        let started = quire_clock::now();
        let mut pos = ReadPosition::Head;
        let mut read = 0u64;
        while read < backlog.records {
            let t = quire_clock::now();
            let batch = self
                .scanner
                .read(&backlog.stream, pos, 4096, 4 << 20, Duration::ZERO)
                .await
                .context("catch-up read")?;
            calls.record(quire_clock::elapsed(t));
            if batch.records.is_empty() {
                bail!(
                    "stream {} ended after {read} of {} backlog records",
                    backlog.stream,
                    backlog.records
                );
            }
            let n = batch
                .records
                .iter()
                .filter(|r| payload::decode(&r.2).is_some())
                .count() as u64;
            read += n;
            counters.read.fetch_add(n, Ordering::Relaxed);
            pos = batch.next;
        }
        Ok(CatchUpReport {
            backlog_records: backlog.records,
            backlog_bytes: backlog.bytes,
            fill_seconds: backlog.fill_seconds,
            scan_seconds: quire_clock::elapsed(started).as_secs_f64(),
            records_read: read,
            read_call: calls.summary(),
        })
    }

    /// Isolation: tail-write latency alone, then again while a reader scans `backlog` from the
    /// head over and over as fast as it can.
    ///
    /// # Errors
    /// If the streams cannot be created or a scan read fails.
    pub async fn isolation(&self, shape: &LoadShape, backlog: &Backlog) -> Result<IsolationReport> {
        let alone = self
            .tail_write(shape, "isolation: tail-write alone")
            .await?;
        self.progress.phase(
            &format!(
                "isolation: tail-write at {:.0} rec/s during a catch-up scan",
                shape.rate_records_per_s
            ),
            shape.total(),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let scanned = Arc::new(AtomicU64::new(0));
        let scanner = {
            let (client, stream, stop, scanned, counters) = (
                self.scanner.clone(),
                backlog.stream.clone(),
                stop.clone(),
                scanned.clone(),
                self.progress_counters(),
            );
            self.scan_runtime.spawn(async move {
                let started = quire_clock::now();
                let mut pos = ReadPosition::Head;
                while !stop.load(Ordering::Relaxed) {
                    let batch = client
                        .read(&stream, pos, 4096, 4 << 20, Duration::ZERO)
                        .await?;
                    if batch.records.is_empty() {
                        pos = ReadPosition::Head;
                        continue;
                    }
                    let bytes: usize = batch.records.iter().map(|r| r.2.len()).sum();
                    scanned.fetch_add(bytes as u64, Ordering::Relaxed);
                    counters
                        .read
                        .fetch_add(batch.records.len() as u64, Ordering::Relaxed);
                    pos = batch.next;
                }
                Ok::<f64, quire_client::Error>(quire_clock::elapsed(started).as_secs_f64())
            })
        };
        // Let the scan get going before the measured writes start.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let streams: Vec<String> = self
            .fresh_streams("isolation", shape.streams)
            .await?
            .into_iter()
            .map(|s| s.0)
            .collect();
        let with_scan = self
            .open_loop_writes(&streams, shape)
            .await
            .report(&shape.open_loop());
        stop.store(true, Ordering::Relaxed);
        let seconds = scanner
            .await
            .context("scanner task")?
            .context("catch-up scan during the isolation run")?;
        Ok(IsolationReport {
            alone,
            with_scan,
            scan_bytes_per_s: scanned.load(Ordering::Relaxed) as f64 / seconds.max(1e-9),
        })
    }
}

/// Awaits every reader task and collects their histograms (the first error wins).
async fn futures_join(
    tasks: Vec<tokio::task::JoinHandle<Result<LatencyHistogram, quire_client::Error>>>,
) -> Result<Vec<LatencyHistogram>> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.context("tail reader task")?.context("tail read")?);
    }
    Ok(out)
}

//! Fan-out benchmark (issue 29 "How it is checked", first bullet): N tailing readers of one
//! stream written at a fixed rate, spread round robin over three proxies, on a multi-process
//! cluster on loopback (a real ZooKeeper, three `quire bookie` and three `quire proxy`
//! processes started by the test kit, E=3 Qw=3 Qa=2).
//!
//! Per phase (one fresh stream each; phases interleaved, e.g. N = 1, 1000, 1, 1000):
//! - one writer (a client on a thread and runtime of its own, connected to the first proxy)
//!   writes a marker record (the stream gets its owner, read back with `DESCRIBE_STREAM`, and
//!   its first segment), then N readers, each a `ProxyClient` of its own (its own TCP connection), start
//!   tailing from the head with long-poll reads (1 s wait); reader `i` is connected to the
//!   `i`-th proxy after the owner, round robin, so N = 1 is one reader on a non-owner proxy (a
//!   follower) and larger N put a third of the readers on the owner;
//! - once every reader has the marker, the writer writes `--rate` records/s of one `--size`-byte
//!   record per write for `--secs` s, open loop; each payload carries its sequence number and
//!   its intended send time (`quire_perf::payload`), so delivery latency = receipt time − the
//!   intended send time (records of the first `--warmup` s are counted but not timed);
//! - every reader must receive every acknowledged record exactly once and in order: DLSNs
//!   strictly increasing, no sequence number twice, the set of sequence numbers equal to the
//!   writer's acknowledged ones;
//! - bookie read requests (`bookkeeper_server_READ_ENTRY_REQUEST_count` +
//!   `..._READ_ENTRY_LONG_POLL_REQUEST_count`, the bookies' `/metrics`) over the write window,
//!   per second; the CPU seconds of this process (the load generator: writer and readers), of
//!   the proxies and of the bookies over the same window (`/proc/PID/stat`).
//!
//! Prints one line per phase, then per N the mean p50/p99 over its phases and the ratios
//! p99(N)/p99(first N of `--readers`) and the same for bookie reads/s. Run:
//! `cargo run --release -p quire-perf --example fan_out -- --readers 1,1000 --rounds 2`
//! (needs `target/release/quire`: `cargo build --release -p quire`; or set QUIRE_TEST_BIN).

// A benchmark's stopwatch is the real clock, whatever clock the code under test reads
// (quire_clock seam, clippy.toml); the harness waits on real processes.
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use quire_client::{ClientConfig, Dlsn, ProxyClient, ReadPosition};
use quire_perf::{payload, procfs};
use quire_testkit::harness::cluster::{Cluster, Proc};
use quire_testkit::harness::{http_get, metric_sum};

#[derive(Parser)]
struct Args {
    /// Reader counts, one phase each per round, in this order.
    #[arg(long, value_delimiter = ',', default_value = "1,1000")]
    readers: Vec<usize>,
    /// Records per second written (one record per write).
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Record payload bytes (at least the 20-byte benchmark header).
    #[arg(long, default_value_t = 100)]
    size: usize,
    /// Seconds of writing per phase.
    #[arg(long, default_value_t = 20)]
    secs: u64,
    /// Seconds at the start of each phase whose records are not timed.
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// Rounds of the `--readers` list.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Seconds the readers get, after the last write, to receive everything.
    #[arg(long, default_value_t = 60)]
    grace: u64,
    /// Worker threads of the load generator's runtime.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

/// The cluster: its processes and the metrics addresses of its bookies and proxies.
struct Bed {
    _cluster: Cluster,
    bookies: Vec<Proc>,
    proxies: Vec<Proc>,
    bookie_metrics: Vec<String>,
    proxy_metrics: Vec<String>,
}

fn loopback_port() -> String {
    format!("127.0.0.1:{}", quire_testkit::free_port())
}

fn start_bed() -> Bed {
    let cluster = Cluster::start();
    let mut bookies = Vec::new();
    let mut bookie_metrics = Vec::new();
    for i in 0..3 {
        let m = loopback_port();
        bookies.push(cluster.start_bookie_with(
            i,
            quire_testkit::free_port(),
            &["--metrics-listen", &m],
        ));
        bookie_metrics.push(m);
    }
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let mut proxies = Vec::new();
    let mut proxy_metrics = Vec::new();
    for _ in 0..3 {
        let m = loopback_port();
        proxies.push(cluster.start_proxy_e3(&["--metrics-listen", &m, "--follower-reads", "true"]));
        proxy_metrics.push(m);
    }
    Bed {
        _cluster: cluster,
        bookies,
        proxies,
        bookie_metrics,
        proxy_metrics,
    }
}

/// Sum over `addrs` of the metric `name` (the samples whose labels include `labels`).
fn metrics_sum_with(addrs: &[String], name: &str, labels: &[(&str, &str)]) -> f64 {
    addrs
        .iter()
        .map(|a| {
            let (status, text) = http_get(a, "/metrics");
            assert_eq!(status, 200, "metrics of {a}");
            metric_sum(&text, name, labels)
        })
        .sum()
}

/// Sum over `addrs` of the metric `name` (every label set).
fn metrics_sum(addrs: &[String], name: &str) -> f64 {
    metrics_sum_with(addrs, name, &[])
}

/// Bookie read requests answered so far: entry reads and long-poll LAC reads.
fn bookie_reads(bed: &Bed) -> f64 {
    metrics_sum(
        &bed.bookie_metrics,
        "bookkeeper_server_READ_ENTRY_REQUEST_count",
    ) + metrics_sum(
        &bed.bookie_metrics,
        "bookkeeper_server_READ_ENTRY_LONG_POLL_REQUEST_count",
    )
}

/// CPU seconds (user + system, every thread) of process `pid` (`"self"`: this one) so far,
/// from `/proc/PID/stat`; 0 if it cannot be read.
fn cpu_secs(pid: &str) -> f64 {
    procfs::read_cpu_ticks(pid).map_or(0.0, |t| {
        t.total() as f64 / procfs::clock_ticks_per_s().max(1) as f64
    })
}

/// Counters sampled at the start and the end of a write window.
#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    bookie_reads: f64,
    /// Bookie add requests (each entry is added to Qw = 3 bookies).
    bookie_adds: f64,
    /// Read requests the proxies answered.
    proxy_reads: f64,
    cache_hits: f64,
    cache_misses: f64,
    gen_cpu: f64,
    proxy_cpu: f64,
    bookie_cpu: f64,
}

fn sample(bed: &Bed) -> Sample {
    Sample {
        at: Instant::now(),
        bookie_reads: bookie_reads(bed),
        bookie_adds: metrics_sum(
            &bed.bookie_metrics,
            "bookkeeper_server_ADD_ENTRY_REQUEST_count",
        ),
        proxy_reads: metrics_sum_with(
            &bed.proxy_metrics,
            "quire_proxy_requests_total",
            &[("op", "read")],
        ),
        cache_hits: metrics_sum(&bed.proxy_metrics, "quire_proxy_follower_cache_hits_total"),
        cache_misses: metrics_sum(
            &bed.proxy_metrics,
            "quire_proxy_follower_cache_misses_total",
        ),
        gen_cpu: cpu_secs("self"),
        proxy_cpu: bed
            .proxies
            .iter()
            .map(|p| cpu_secs(&p.pid().to_string()))
            .sum(),
        bookie_cpu: bed
            .bookies
            .iter()
            .map(|p| cpu_secs(&p.pid().to_string()))
            .sum(),
    }
}

/// What one reader saw.
struct ReaderOutcome {
    /// The reader's proxy is the stream's owner.
    on_owner: bool,
    hist: Histogram<u64>,
    /// Benchmark records received (duplicates included).
    received: u64,
    duplicates: u64,
    /// Records whose DLSN was not above the previous record's.
    out_of_order: u64,
    /// Sequence numbers received, one bit each.
    seen: Vec<u64>,
    error: Option<String>,
}

/// What every reader shares: when to stop and what the run expects.
struct Shared {
    stream: String,
    base: Instant,
    warm_seq: u64,
    total_seq: u64,
    /// Readers that received the marker record (are tailing).
    ready: AtomicUsize,
    /// Benchmark records acknowledged (`u64::MAX` until the writer finished).
    expected: AtomicU64,
    stop: AtomicBool,
}

/// Tails the stream from its head until it received `expected` benchmark records or is told to
/// stop.
async fn tail(client: Arc<ProxyClient>, on_owner: bool, s: Arc<Shared>) -> ReaderOutcome {
    let mut out = ReaderOutcome {
        on_owner,
        hist: Histogram::new(3).expect("histogram"),
        received: 0,
        duplicates: 0,
        out_of_order: 0,
        seen: vec![0; (s.total_seq as usize).div_ceil(64)],
        error: None,
    };
    let mut pos = ReadPosition::Head;
    let mut last: Option<Dlsn> = None;
    let mut marked = false;
    while !s.stop.load(Ordering::Relaxed) && out.received < s.expected.load(Ordering::Relaxed) {
        let batch = match client
            .read(&s.stream, pos, 4096, 4 << 20, Duration::from_secs(1))
            .await
        {
            Ok(b) => b,
            Err(e) => {
                out.error = Some(e.to_string());
                break;
            }
        };
        let now = Instant::now();
        for (dlsn, _, p) in &batch.records {
            if last.is_some_and(|l| *dlsn <= l) {
                out.out_of_order += 1;
            }
            last = Some(*dlsn);
            let Some((seq, ns)) = payload::decode(p) else {
                if !marked {
                    marked = true;
                    s.ready.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            };
            out.received += 1;
            let (word, bit) = ((seq / 64) as usize, 1u64 << (seq % 64));
            match out.seen.get_mut(word) {
                Some(w) if *w & bit != 0 => out.duplicates += 1,
                Some(w) => *w |= bit,
                None => out.out_of_order += 1,
            }
            if seq >= s.warm_seq {
                let lat = now.saturating_duration_since(s.base + Duration::from_nanos(ns));
                let _ = out.hist.record((lat.as_micros() as u64).max(1));
            }
        }
        pos = batch.next;
    }
    out
}

/// The writer's side of a phase: acknowledged sequence numbers and the write latencies.
struct Written {
    acked: Vec<u64>,
    ack_hist: Histogram<u64>,
    /// How late each write was sent after its scheduled time (µs): the writer's own lag.
    lag_hist: Histogram<u64>,
    errors: u64,
}

/// Open loop: `rate` one-record writes per second for `secs`, payload `seq` due at its
/// scheduled time.
async fn write_paced(writer: Arc<ProxyClient>, s: Arc<Shared>, args: (u64, u64, usize)) -> Written {
    let (rate, secs, size) = args;
    let acked = Arc::new(Mutex::new(Written {
        acked: vec![0; (s.total_seq as usize).div_ceil(64)],
        ack_hist: Histogram::new(3).expect("histogram"),
        lag_hist: Histogram::new(3).expect("histogram"),
        errors: 0,
    }));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for seq in 0..rate * secs {
        let at = t0 + Duration::from_nanos(seq * 1_000_000_000 / rate);
        tokio::time::sleep_until(at.into()).await;
        let ns = at.duration_since(s.base).as_nanos() as u64;
        let (writer, s, acked) = (writer.clone(), s.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            let lag = at.elapsed().as_micros() as u64;
            // One txid for every record: writes in flight at once may reach the owner in any
            // order, and txids only must not decrease.
            let record = vec![(1, payload::encode(seq, ns, size))];
            let r = writer.write(&s.stream, record, true).await;
            let mut w = acked.lock().expect("acked lock");
            let _ = w.lag_hist.record(lag.max(1));
            match r {
                Ok(_) => {
                    w.acked[(seq / 64) as usize] |= 1 << (seq % 64);
                    let us = at.elapsed().as_micros() as u64;
                    let _ = w.ack_hist.record(us.max(1));
                }
                Err(e) => {
                    eprintln!("write {seq}: {e}");
                    w.errors += 1;
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("write task");
    }
    Arc::try_unwrap(acked)
        .ok()
        .expect("writes done")
        .into_inner()
        .expect("acked lock")
}

/// A request to the writer thread: create and open a stream (answered with its owner's
/// address), or write a phase's records.
enum Job {
    Open(String),
    Write(Arc<Shared>, (u64, u64, usize)),
}

enum Done {
    Opened(String),
    Written(Written),
}

type JobSender = tokio::sync::mpsc::UnboundedSender<(Job, tokio::sync::oneshot::Sender<Done>)>;

/// Starts the writer on a thread and runtime of its own, with a client connected to `addr`, so
/// that its sends are not queued behind the readers' tasks: the load generator's lag then shows
/// in the readers' receipt times only (and the writer's lag is measured on its own).
fn start_writer(addr: String) -> JobSender {
    let (tx, mut rx) =
        tokio::sync::mpsc::unbounded_channel::<(Job, tokio::sync::oneshot::Sender<Done>)>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("writer runtime");
        rt.block_on(async move {
            let writer = Arc::new(
                ProxyClient::connect_with(&addr, ClientConfig::default())
                    .await
                    .expect("connect the writer"),
            );
            while let Some((job, reply)) = rx.recv().await {
                let done = match job {
                    Job::Open(stream) => Done::Opened(open_stream(&writer, &stream).await),
                    Job::Write(s, shape) => {
                        Done::Written(write_paced(writer.clone(), s, shape).await)
                    }
                };
                let _ = reply.send(done);
            }
        });
    });
    tx
}

async fn ask(writer: &JobSender, job: Job) -> Done {
    let (tx, rx) = tokio::sync::oneshot::channel();
    writer.send((job, tx)).expect("writer thread");
    rx.await.expect("writer answer")
}

/// Creates `stream`, writes its marker record (the stream gets an owner and a first segment)
/// and returns the owner's address.
async fn open_stream(writer: &ProxyClient, stream: &str) -> String {
    writer.create_stream(stream).await.expect("create stream");
    writer
        .write(stream, vec![(0, b"marker".to_vec())], true)
        .await
        .expect("marker write");
    writer
        .describe_stream(stream)
        .await
        .expect("describe")
        .owner
        .unwrap_or_default()
}

/// One phase's figures.
struct PhaseResult {
    n: usize,
    p50_ms: f64,
    p99_ms: f64,
    bookie_reads_per_s: f64,
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// Runs one phase with `n` readers (clients `clients[..n]`, client `i` on proxy `(owner + 1 +
/// i) % 3`); prints its line.
async fn phase(
    args: &Args,
    bed: &Bed,
    (writer, clients): (&JobSender, &[Vec<Arc<ProxyClient>>]),
    tag: &str,
    n: usize,
) -> PhaseResult {
    let stream = format!("perf/fan-out/{tag}");
    let Done::Opened(owner_addr) = ask(writer, Job::Open(stream.clone())).await else {
        unreachable!("the writer answers an open with the owner")
    };
    let owner = bed
        .proxies
        .iter()
        .position(|p| p.addr == owner_addr)
        .unwrap_or(0);
    let total_seq = args.rate * args.secs;
    let shared = Arc::new(Shared {
        stream: stream.clone(),
        base: Instant::now(),
        warm_seq: args.rate * args.warmup,
        total_seq,
        ready: AtomicUsize::new(0),
        expected: AtomicU64::new(u64::MAX),
        stop: AtomicBool::new(false),
    });
    let mut per_proxy = [0usize; 3];
    let readers: Vec<_> = (0..n)
        .map(|i| {
            let proxy = (owner + 1 + i) % 3;
            per_proxy[proxy] += 1;
            let client = clients[proxy][i / 3].clone();
            tokio::spawn(tail(client, proxy == owner, shared.clone()))
        })
        .collect();
    let ready_by = Instant::now() + Duration::from_secs(120);
    while shared.ready.load(Ordering::Relaxed) < n && Instant::now() < ready_by {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready = shared.ready.load(Ordering::Relaxed);
    let before = sample(bed);
    let shape = (args.rate, args.secs, args.size);
    let Done::Written(written) = ask(writer, Job::Write(shared.clone(), shape)).await else {
        unreachable!("the writer answers a write with what it wrote")
    };
    let after = sample(bed);
    let acked_count: u64 = written
        .acked
        .iter()
        .map(|w| u64::from(w.count_ones()))
        .sum();
    shared.expected.store(acked_count, Ordering::Relaxed);
    let grace = tokio::spawn({
        let (s, secs) = (shared.clone(), args.grace);
        async move {
            tokio::time::sleep(Duration::from_secs(secs)).await;
            s.stop.store(true, Ordering::Relaxed);
        }
    });
    let mut all = Histogram::<u64>::new(3).expect("histogram");
    let mut owner_hist = Histogram::<u64>::new(3).expect("histogram");
    let mut follower_hist = Histogram::<u64>::new(3).expect("histogram");
    let (mut complete, mut missing, mut dups, mut disorder, mut errors) = (0, 0u64, 0, 0, 0);
    for r in readers {
        let r = r.await.expect("reader task");
        all.add(&r.hist).expect("merge");
        if r.on_owner {
            owner_hist.add(&r.hist).expect("merge");
        } else {
            follower_hist.add(&r.hist).expect("merge");
        }
        let same = r.seen == written.acked;
        let lacking: u64 = written
            .acked
            .iter()
            .zip(&r.seen)
            .map(|(a, s)| u64::from((a & !s).count_ones()))
            .sum();
        missing += lacking;
        dups += r.duplicates;
        disorder += r.out_of_order;
        errors += u64::from(r.error.is_some());
        if let Some(e) = &r.error {
            eprintln!("reader error: {e}");
        }
        if same && r.duplicates == 0 && r.out_of_order == 0 && r.received == acked_count {
            complete += 1;
        }
    }
    grace.abort();
    let window = after.at.duration_since(before.at).as_secs_f64();
    let reads_per_s = (after.bookie_reads - before.bookie_reads) / window;
    let entries = (after.bookie_adds - before.bookie_adds) / 3.0;
    let proxy_reads = after.proxy_reads - before.proxy_reads;
    // Proxies that follow the stream for this phase's readers (the owner serves its own).
    let following = (0..3).filter(|&p| p != owner && per_proxy[p] > 0).count();
    let part = |h: &Histogram<u64>| {
        if h.is_empty() {
            "-".to_string()
        } else {
            format!("{:.1}/{:.1}", ms(h, 0.5), ms(h, 0.99))
        }
    };
    println!(
        "{tag}: N={n} (per proxy {per_proxy:?}, owner proxy {owner}, {ready} tailing at start) \
         written {acked_count}/{total_seq} ({} errors, ack p99 {:.1} ms, send lag p99 {:.1} ms) | \
         delivery p50 {:.2} ms p99 {:.2} ms p99.9 {:.2} ms max {:.0} ms \
         (owner p50/p99 {}, followers {}) | complete readers {complete}/{n}, \
         missing {missing}, duplicates {dups}, out of order {disorder}, reader errors {errors} | \
         bookie reads {reads_per_s:.0}/s ({:.0}/s per following proxy, {following} following; \
         {entries:.0} entries written: {:.2} bookie reads per entry per following proxy), \
         follower cache hits {:.0} misses {:.0} | proxy reads {:.0}/s, {:.1} records per read | \
         CPU s over {window:.1} s: load generator {:.1}, proxies {:.1}, bookies {:.1} | load {}",
        written.errors,
        ms(&written.ack_hist, 0.99),
        ms(&written.lag_hist, 0.99),
        ms(&all, 0.5),
        ms(&all, 0.99),
        ms(&all, 0.999),
        all.max() as f64 / 1000.0,
        part(&owner_hist),
        part(&follower_hist),
        reads_per_s / following.max(1) as f64,
        (after.bookie_reads - before.bookie_reads) / entries.max(1.0) / following.max(1) as f64,
        after.cache_hits - before.cache_hits,
        after.cache_misses - before.cache_misses,
        proxy_reads / window,
        (acked_count * n as u64) as f64 / proxy_reads.max(1.0),
        after.gen_cpu - before.gen_cpu,
        after.proxy_cpu - before.proxy_cpu,
        after.bookie_cpu - before.bookie_cpu,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim(),
    );
    PhaseResult {
        n,
        p50_ms: ms(&all, 0.5),
        p99_ms: ms(&all, 0.99),
        bookie_reads_per_s: reads_per_s,
    }
}

/// Connects `per_proxy` clients to each proxy (each its own connection, no failover list).
async fn connect_all(bed: &Bed, per_proxy: usize) -> Vec<Vec<Arc<ProxyClient>>> {
    let mut out = Vec::new();
    for p in &bed.proxies {
        let mut clients = Vec::new();
        for chunk in 0..per_proxy.div_ceil(50) {
            let k = 50.min(per_proxy - chunk * 50);
            let batch: Vec<_> = (0..k)
                .map(|_| {
                    let addr = p.addr.clone();
                    tokio::spawn(async move {
                        ProxyClient::connect_with(&addr, ClientConfig::default()).await
                    })
                })
                .collect();
            for c in batch {
                clients.push(Arc::new(c.await.expect("task").expect("connect")));
            }
        }
        out.push(clients);
    }
    out
}

async fn run(args: Args, bed: &Bed) {
    let n_max = args.readers.iter().copied().max().unwrap_or(1);
    let clients = connect_all(bed, n_max.div_ceil(3).max(1)).await;
    // The writer has a connection of its own, to the first proxy (which takes the stream when
    // nothing else places it).
    let writer = start_writer(bed.proxies[0].addr.clone());
    println!(
        "fan-out: {} rec/s of {} B for {} s per phase (warm-up {} s), readers {:?} x {} rounds, \
         {} clients per proxy",
        args.rate,
        args.size,
        args.secs,
        args.warmup,
        args.readers,
        args.rounds,
        clients[0].len()
    );
    let run_id = quire_clock::unix_ms();
    let mut results = Vec::new();
    for round in 0..args.rounds {
        for &n in &args.readers {
            let tag = format!("{run_id}-r{round}-n{n}");
            results.push(phase(&args, bed, (&writer, &clients), &tag, n).await);
        }
    }
    let mean = |n: usize, f: fn(&PhaseResult) -> f64| {
        let v: Vec<f64> = results.iter().filter(|r| r.n == n).map(f).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let base = args.readers[0];
    let (p99_base, reads_base) = (
        mean(base, |r| r.p99_ms),
        mean(base, |r| r.bookie_reads_per_s),
    );
    let mut seen = Vec::new();
    for &n in &args.readers {
        if seen.contains(&n) {
            continue;
        }
        seen.push(n);
        println!(
            "N={n}: mean delivery p50 {:.2} ms p99 {:.2} ms, p99/p99(N={base}) {:.2}; bookie reads \
             {:.0}/s, /(N={base}) {:.2}",
            mean(n, |r| r.p50_ms),
            mean(n, |r| r.p99_ms),
            mean(n, |r| r.p99_ms) / p99_base.max(f64::MIN_POSITIVE),
            mean(n, |r| r.bookie_reads_per_s),
            mean(n, |r| r.bookie_reads_per_s) / reads_base.max(f64::MIN_POSITIVE)
        );
    }
}

fn main() {
    let args = Args::parse();
    assert!(
        args.size >= payload::PAYLOAD_HEADER_SIZE_BYTES,
        "--size below the payload header"
    );
    assert!(args.warmup < args.secs, "--warmup must be below --secs");
    if std::env::var_os("QUIRE_TEST_BIN").is_none() {
        // The example runs from target/release/examples; the `quire` binary sits one up.
        let exe = std::env::current_exe().expect("own path");
        let bin = exe
            .parent()
            .and_then(|d| d.parent())
            .map(|d| d.join("quire"))
            .expect("target directory");
        std::env::set_var("QUIRE_TEST_BIN", bin);
    }
    let bed = start_bed();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(args, &bed));
    drop(rt);
    for p in bed.proxies {
        p.stop();
    }
    for b in bed.bookies {
        b.stop();
    }
}

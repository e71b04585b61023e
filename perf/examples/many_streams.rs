//! Many streams over balanced proxies (issue 29, "How it is checked", second and third
//! bullets): `--streams` streams, each written once a second through a multi-process cluster
//! on loopback (a real ZooKeeper, three `quire bookie`, `--proxies` `quire proxy` processes
//! with balanced ownership on), then optionally a fourth proxy joining and one being drained
//! under that load.
//!
//! Method:
//! - **Set-up** through the test kit (`quire_testkit::harness::cluster`): ZooKeeper, three
//!   one-shard bookies, the proxies (E=3 Qw=3 Qa=2, `--balance-moves-per-sec`), waited for
//!   in the proxy registry. Each proxy's RSS (`/proc/PID/status` VmRSS) is read idle.
//! - **Creation**: every stream gets one record (txid 1, create-if-missing), 64 writes in
//!   flight, through clients homed round robin on the proxies (each follows redirects to the
//!   stream's preferred owner). The creation rate is reported.
//! - **Load**: one task per stream writes one `--size`-byte record a second, the streams'
//!   starts spread evenly over the second; open loop with a queue of one per stream (a write
//!   is sent at its scheduled time, or at once when the previous one came back late; latency
//!   counts from the scheduled time, so a stall is not hidden). `--clients-per-proxy` clients
//!   per proxy, each with the other proxies as fail-over (`ClientConfig::proxies`).
//! - **Measured window** (`--secs`, after `--warmup-secs`): acknowledgements and failures,
//!   write latency p50/p99/max, each proxy's owned streams (its registry record) and the
//!   spread against the mean, each proxy's RSS against idle per owned stream, and ZooKeeper
//!   requests per stream per minute: the change of `zk_packets_received` in the server's
//!   `mntr` answer over the window (every packet from every client: proxies, bookies and
//!   this program's registry reads; session pings included), and the same rate measured for
//!   `--idle-secs` before any stream existed, so the streams' own share is the difference.
//! - **Join and drain** (`--join-drain`): a proxy is started; the time until every proxy
//!   owns its share (±20 % of streams / proxies, by the registry records) is reported. Then
//!   proxy 1 gets SIGTERM (it drains); the time until it left the registry and the others own
//!   every stream, each within ±20 % of its share. Writers keep writing throughout.
//! - **End**: the longest gap between two acknowledgements of one stream (max over streams)
//!   per phase, and a read-back of `--check` streams (evenly spaced; 0: all) with the test
//!   kit's checker (`check_stream`: every acknowledged record once, at its DLSN, DLSNs
//!   increasing, every replica present).
//!
//! Run with perf/many-streams-cluster.sh (it builds the binaries and keeps the output), or:
//! `QUIRE_TEST_BIN=target/release/quire cargo run --release -p quire-perf --example
//! many_streams -- --streams 10000 --join-drain`.

// A benchmark's stopwatch is the real clock (quire_clock seam, clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use quire_client::{ClientConfig, ProxyClient};
use quire_metadata::MetadataStore;
use quire_testkit::harness::checker::{check_stream, Acked};
use quire_testkit::harness::cluster::{Cluster, Proc};

#[derive(Parser)]
struct Args {
    /// Streams, each written once a second.
    #[arg(long, default_value_t = 10_000)]
    streams: usize,
    /// Proxies at the start.
    #[arg(long, default_value_t = 3)]
    proxies: usize,
    /// Each proxy's `--balance-moves-per-sec`.
    #[arg(long, default_value_t = 100)]
    moves_per_sec: u32,
    /// Client connections homed on each proxy.
    #[arg(long, default_value_t = 4)]
    clients_per_proxy: usize,
    /// Record payload bytes.
    #[arg(long, default_value_t = 100)]
    size: usize,
    /// Seconds of load before the measured window.
    #[arg(long, default_value_t = 15)]
    warmup_secs: u64,
    /// Seconds of the measured window.
    #[arg(long, default_value_t = 60)]
    secs: u64,
    /// Then start one more proxy and drain proxy 1, under the same load.
    #[arg(long)]
    join_drain: bool,
    /// Seconds of load after the drain settled.
    #[arg(long, default_value_t = 10)]
    tail_secs: u64,
    /// Seconds of ZooKeeper traffic measured before any stream exists (the fixed share).
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
    /// Streams read back with the checker at the end (evenly spaced); 0: all.
    #[arg(long, default_value_t = 300)]
    check: usize,
    /// Each proxy's `--drain-timeout-ms` (the proxy's default: 30 s). A drain hands its
    /// streams over at the pace the others acquire them, so at thousands of streams it needs
    /// longer; what is still owned at the timeout is closed and acquired on demand.
    #[arg(long, default_value_t = 30_000)]
    drain_timeout_ms: u64,
}

/// The phases the writers' figures are kept apart by.
const PHASES: [&str; 4] = ["warmup", "measured", "join", "drain"];
const WARMUP: usize = 0;
const MEASURED: usize = 1;
const JOIN: usize = 2;
const DRAIN: usize = 3;

fn name(i: usize) -> String {
    format!("ms-{i:05}")
}

/// What all writers share: the phase, per-phase latency histograms (µs) and counts.
struct Shared {
    phase: AtomicUsize,
    stop: AtomicBool,
    hist: Vec<Mutex<Histogram<u64>>>,
    acks: Vec<AtomicU64>,
    failures: Vec<AtomicU64>,
    first_errors: Mutex<Vec<String>>,
    /// Failures per phase and kind (the message with the stream name and addresses cut).
    error_kinds: Mutex<HashMap<(usize, String), u64>>,
}

/// One stream's writer's own record: what was acknowledged, and its longest gap between two
/// acknowledgements per phase (the gap is charged to the phase of the later one).
struct StreamLog {
    name: String,
    acked: Vec<Acked>,
    max_gap: [Duration; 4],
}

fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// `zk_packets_received` from the server's `mntr` four-letter word.
fn zk_packets_received(zk: &str) -> u64 {
    let mut s = std::net::TcpStream::connect(zk).expect("connect to ZooKeeper");
    s.write_all(b"mntr").expect("send mntr");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read mntr");
    text.lines()
        .find_map(|l| l.strip_prefix("zk_packets_received"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no zk_packets_received in mntr: {text}"))
}

/// Owned streams per registered proxy (their registry records, rewritten every second). A
/// ZooKeeper read that fails (it can time out on a loaded machine) is tried again, up to 10
/// times a second apart.
async fn owned(store: &dyn MetadataStore) -> HashMap<String, u64> {
    let mut tries = 0;
    loop {
        match store.list_proxies().await {
            Ok(list) => {
                return list
                    .into_iter()
                    .map(|p| (p.address, p.owned_streams))
                    .collect()
            }
            Err(e) if tries < 10 => {
                eprintln!("list proxies (trying again): {e}");
                tries += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => panic!("list proxies: {e}"),
        }
    }
}

/// Whether `addrs` are exactly the registered proxies and each owns `n / addrs.len()` ±20 %.
fn balanced(owned: &HashMap<String, u64>, addrs: &[String], n: usize) -> bool {
    let mean = n as f64 / addrs.len() as f64;
    owned.len() == addrs.len()
        && addrs.iter().all(|a| {
            owned
                .get(a)
                .is_some_and(|&o| (o as f64 - mean).abs() <= 0.2 * mean)
        })
        && owned.values().sum::<u64>() == n as u64
}

async fn client_for(home: &str, all: &[String]) -> Arc<ProxyClient> {
    let config = ClientConfig {
        proxies: all.iter().filter(|a| *a != home).cloned().collect(),
        ..ClientConfig::default()
    };
    Arc::new(
        ProxyClient::connect_with(home, config)
            .await
            .unwrap_or_else(|e| panic!("connect to {home}: {e}")),
    )
}

/// Writes one record to each stream (creating it), `inflight` at a time; returns the
/// acknowledged creation records.
async fn create_all(clients: &[Arc<ProxyClient>], n: usize, inflight: usize) -> Vec<Acked> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for k in 0..inflight {
        let (clients, next) = (clients.to_vec(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return out;
                }
                let s = name(i);
                let payload = format!("{s} create").into_bytes();
                let c = &clients[(i + k) % clients.len()];
                let w = c
                    .write(&s, vec![(1, payload.clone())], true)
                    .await
                    .unwrap_or_else(|e| panic!("creating {s}: {e}"));
                out.push((i, (w.first_dlsn, payload)));
            }
        }));
    }
    let mut acked = vec![None; n];
    for t in tasks {
        for (i, a) in t.await.expect("creator") {
            acked[i] = Some(a);
        }
    }
    acked.into_iter().map(|a| a.expect("created")).collect()
}

/// Stream `i`'s writer: one record a second from `t0 + i/n s` until `shared.stop`.
async fn write_stream(
    i: usize,
    n: usize,
    size: usize,
    client: Arc<ProxyClient>,
    shared: Arc<Shared>,
    t0: tokio::time::Instant,
    created: Acked,
) -> StreamLog {
    let s = name(i);
    let offset = Duration::from_nanos((i as u64 * 1_000_000_000) / n as u64);
    let mut log = StreamLog {
        name: s.clone(),
        acked: vec![created],
        max_gap: [Duration::ZERO; 4],
    };
    let mut last_ack: Option<Instant> = None;
    let pad = "x".repeat(size.saturating_sub(s.len() + 12));
    for k in 0u64.. {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let at = t0 + offset + Duration::from_secs(k);
        tokio::time::sleep_until(at).await;
        let seq = k + 2; // above the creation record's txid 1
        let payload = format!("{s} {seq:09} {pad}").into_bytes();
        let res = client.write(&s, vec![(seq, payload.clone())], false).await;
        let phase = shared.phase.load(Ordering::Relaxed);
        match res {
            Ok(w) => {
                let now = Instant::now();
                let us = (now - at.into_std()).as_micros() as u64;
                let _ = shared.hist[phase].lock().unwrap().record(us.max(1));
                shared.acks[phase].fetch_add(1, Ordering::Relaxed);
                if let Some(prev) = last_ack {
                    log.max_gap[phase] = log.max_gap[phase].max(now - prev);
                }
                last_ack = Some(now);
                log.acked.push((w.first_dlsn, payload));
            }
            Err(e) => {
                shared.failures[phase].fetch_add(1, Ordering::Relaxed);
                let text = e.to_string();
                let mut first = shared.first_errors.lock().unwrap();
                if first.len() < 10 {
                    first.push(format!("{} {s}: {text}", PHASES[phase]));
                }
                drop(first);
                *shared
                    .error_kinds
                    .lock()
                    .unwrap()
                    .entry((phase, error_kind(&text, &s)))
                    .or_default() += 1;
            }
        }
    }
    log
}

/// An error message with the stream name, addresses and numbers cut, to count failures by kind.
fn error_kind(text: &str, stream: &str) -> String {
    let t = text.replace(stream, "S");
    let mut out = String::new();
    let mut digits = false;
    for c in t.chars().take(120) {
        if c.is_ascii_digit() || (digits && c == '.') || (digits && c == ':') {
            if !digits {
                out.push('#');
            }
            digits = true;
        } else {
            digits = false;
            out.push(c);
        }
    }
    out
}

fn pct(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// Prints one phase's write figures.
fn report_phase(shared: &Shared, phase: usize, secs: f64) {
    let h = shared.hist[phase].lock().unwrap();
    println!(
        "writes {}: acked {} failed {} ({:.0}/s) p50 {:.1} ms p99 {:.1} ms max {:.1} ms",
        PHASES[phase],
        shared.acks[phase].load(Ordering::Relaxed),
        shared.failures[phase].load(Ordering::Relaxed),
        shared.acks[phase].load(Ordering::Relaxed) as f64 / secs.max(1e-9),
        pct(&h, 0.5),
        pct(&h, 0.99),
        h.max() as f64 / 1000.0
    );
}

/// Prints each proxy's owned streams and the spread around the mean.
fn report_spread(what: &str, owned: &HashMap<String, u64>, n: usize) {
    let mean = n as f64 / owned.len().max(1) as f64;
    let mut worst = 0.0f64;
    let mut addrs: Vec<_> = owned.keys().collect();
    addrs.sort();
    for a in addrs {
        let o = owned[a] as f64;
        worst = worst.max((o - mean).abs() / mean);
        println!(
            "{what}: {a} owns {o} (mean {mean:.0}, {:+.1} %)",
            (o / mean - 1.0) * 100.0
        );
    }
    println!(
        "{what}: total owned {} of {n}, widest spread ±{:.1} % (target ±20 %)",
        owned.values().sum::<u64>(),
        worst * 100.0
    );
}

/// Polls the registry until `addrs` own a balanced share each (or `limit` passes); returns
/// the time taken.
fn wait_balanced(
    rt: &tokio::runtime::Runtime,
    store: &dyn MetadataStore,
    addrs: &[String],
    n: usize,
    limit: Duration,
) -> Option<Duration> {
    let t = Instant::now();
    loop {
        let o = rt.block_on(owned(store));
        if balanced(&o, addrs, n) {
            return Some(t.elapsed());
        }
        if t.elapsed() > limit {
            report_spread("not balanced", &o, n);
            return None;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// One proxy of the cluster with the run's balancing and drain flags.
fn start_proxy(cluster: &Cluster, args: &Args) -> Proc {
    let moves = args.moves_per_sec.to_string();
    let drain = args.drain_timeout_ms.to_string();
    cluster.start_proxy_e3(&[
        "--balance-moves-per-sec",
        &moves,
        "--drain-timeout-ms",
        &drain,
    ])
}

fn start_cluster(args: &Args) -> (Cluster, Vec<Proc>, Vec<Proc>) {
    let cluster = Cluster::start();
    let bookies: Vec<Proc> = (0..3)
        .map(|i| cluster.start_bookie(i, quire_testkit::free_port()))
        .collect();
    let proxies: Vec<Proc> = (0..args.proxies)
        .map(|_| start_proxy(&cluster, args))
        .collect();
    (cluster, bookies, proxies)
}

fn main() {
    let args = Args::parse();
    if std::env::var_os("QUIRE_TEST_BIN").is_none() {
        // target/release/examples/many_streams → target/release/quire
        let exe = std::env::current_exe().expect("exe path");
        let bin = exe.parent().and_then(|d| d.parent()).expect("target dir");
        std::env::set_var("QUIRE_TEST_BIN", bin.join("quire"));
    }
    let n = args.streams;
    let (cluster, _bookies, mut proxies) = start_cluster(&args);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let store = rt.block_on(cluster.zk_store());
    let mut addrs: Vec<String> = proxies.iter().map(|p| p.addr.clone()).collect();
    let reg = Instant::now();
    while rt.block_on(owned(&store)).len() < addrs.len() {
        assert!(
            reg.elapsed() < Duration::from_secs(30),
            "proxies never registered"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(3)); // every proxy sees the others live
    let rss_idle: Vec<u64> = proxies.iter().map(|p| rss_kib(p.pid())).collect();
    // ZooKeeper's traffic with no stream: sessions' pings, the proxies' registry ticks, the
    // bookies' and auditor's own reads.
    let zk = cluster.zookeeper();
    let (i0, t) = (zk_packets_received(&zk), Instant::now());
    std::thread::sleep(Duration::from_secs(args.idle_secs));
    let idle_per_min = (zk_packets_received(&zk) - i0) as f64 / (t.elapsed().as_secs_f64() / 60.0);
    println!(
        "streams {n}, proxies {}, moves/s {}, clients/proxy {}, size {} B, drain timeout {} ms; load {}",
        args.proxies,
        args.moves_per_sec,
        args.clients_per_proxy,
        args.size,
        args.drain_timeout_ms,
        loadavg()
    );

    let clients: Vec<Arc<ProxyClient>> = rt.block_on(async {
        let mut v = Vec::new();
        for j in 0..args.proxies * args.clients_per_proxy {
            v.push(client_for(&addrs[j % addrs.len()], &addrs).await);
        }
        v
    });
    let t = Instant::now();
    let created = rt.block_on(create_all(&clients, n, 64));
    let create_secs = t.elapsed().as_secs_f64();
    println!(
        "created {n} streams in {create_secs:.1} s ({:.0} streams/s); load {}",
        n as f64 / create_secs,
        loadavg()
    );

    let shared = Arc::new(Shared {
        phase: AtomicUsize::new(WARMUP),
        stop: AtomicBool::new(false),
        hist: (0..4)
            .map(|_| Mutex::new(Histogram::new(3).unwrap()))
            .collect(),
        acks: (0..4).map(|_| AtomicU64::new(0)).collect(),
        failures: (0..4).map(|_| AtomicU64::new(0)).collect(),
        first_errors: Mutex::default(),
        error_kinds: Mutex::default(),
    });
    let t0 = tokio::time::Instant::now() + Duration::from_millis(500);
    let writers: Vec<_> = created
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let client = clients[i % clients.len()].clone();
            rt.spawn(write_stream(i, n, args.size, client, shared.clone(), t0, c))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(args.warmup_secs));
    report_phase(&shared, WARMUP, args.warmup_secs as f64);

    // The measured window.
    let p0 = zk_packets_received(&zk);
    shared.phase.store(MEASURED, Ordering::SeqCst);
    let w0 = Instant::now();
    let load0 = loadavg();
    std::thread::sleep(Duration::from_secs(args.secs));
    let p1 = zk_packets_received(&zk);
    let window = w0.elapsed().as_secs_f64();
    let load1 = loadavg();
    let own = rt.block_on(owned(&store));
    report_phase(&shared, MEASURED, window);
    report_spread("spread", &own, n);
    for (k, p) in proxies.iter().enumerate() {
        let r = rss_kib(p.pid());
        let o = own.get(&p.addr).copied().unwrap_or(0);
        println!(
            "rss {}: idle {} KiB, loaded {} KiB, +{} KiB for {o} owned streams = {:.1} KiB/stream",
            p.addr,
            rss_idle[k],
            r,
            r.saturating_sub(rss_idle[k]),
            r.saturating_sub(rss_idle[k]) as f64 / o.max(1) as f64
        );
    }
    let per_min = (p1 - p0) as f64 / (window / 60.0);
    println!(
        "zookeeper: {} packets received in {window:.1} s = {per_min:.0}/min = {:.2} requests per stream per minute; with no stream {idle_per_min:.0}/min; the streams' own share {:.2} per stream per minute",
        p1 - p0,
        per_min / n as f64,
        (per_min - idle_per_min) / n as f64
    );
    println!("load during the window: start {load0}; end {load1}");

    if args.join_drain {
        join_and_drain(
            &args,
            &cluster,
            &rt,
            &store,
            &shared,
            &mut proxies,
            &mut addrs,
        );
    }
    shared.stop.store(true, Ordering::SeqCst);
    let logs: Vec<StreamLog> = writers
        .into_iter()
        .map(|w| rt.block_on(w).expect("writer"))
        .collect();
    for (k, ph) in PHASES.iter().enumerate() {
        let worst = logs
            .iter()
            .max_by_key(|l| l.max_gap[k])
            .map(|l| (l.name.as_str(), l.max_gap[k]));
        if let Some((s, g)) = worst.filter(|w| w.1 > Duration::ZERO) {
            println!("longest gap between acks of one stream, {ph}: {g:.2?} ({s})");
        }
    }
    for e in shared.first_errors.lock().unwrap().iter() {
        println!("error: {e}");
    }
    let mut kinds: Vec<_> = shared
        .error_kinds
        .lock()
        .unwrap()
        .clone()
        .into_iter()
        .collect();
    kinds.sort();
    for ((phase, kind), count) in kinds {
        println!("errors {}: {count} × {kind}", PHASES[phase]);
    }
    check(&args, &rt, &store, &addrs[0], &logs);
}

/// A proxy joins, then proxy 1 is drained, both under the running load.
fn join_and_drain(
    args: &Args,
    cluster: &Cluster,
    rt: &tokio::runtime::Runtime,
    store: &dyn MetadataStore,
    shared: &Shared,
    proxies: &mut Vec<Proc>,
    addrs: &mut Vec<String>,
) {
    let n = args.streams;
    let limit = Duration::from_secs(180);
    shared.phase.store(JOIN, Ordering::SeqCst);
    let t = Instant::now();
    let joined = start_proxy(cluster, args);
    let started = t.elapsed();
    addrs.push(joined.addr.clone());
    proxies.push(joined);
    let took = wait_balanced(rt, store, addrs, n, limit);
    println!(
        "join: {} started in {started:.1?}; every proxy within ±20 % of {} after {took:.1?} from the start; load {}",
        addrs[addrs.len() - 1],
        n / addrs.len(),
        loadavg()
    );
    report_spread("after join", &rt.block_on(owned(store)), n);
    let join_secs = t.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(5));
    report_phase(shared, JOIN, join_secs + 5.0);

    shared.phase.store(DRAIN, Ordering::SeqCst);
    let t = Instant::now();
    let mut drained = proxies.remove(1);
    let gone = addrs.remove(1);
    // SIGTERM, then wait for the exit however long the drain timeout lets it take.
    // SAFETY: kill(2) on our own child, not yet reaped.
    let rc = unsafe { libc::kill(drained.pid(), libc::SIGTERM) };
    assert_eq!(rc, 0, "SIGTERM to the drained proxy");
    let status = drained.wait_exit();
    assert!(status.success(), "the drained proxy exited with {status}");
    let exited = t.elapsed();
    let took = wait_balanced(rt, store, addrs, n, limit);
    println!(
        "drain: {gone} exited {exited:.1?} after SIGTERM; the others own every stream, each within ±20 % of {}, after {took:.1?}; load {}",
        n / addrs.len(),
        loadavg()
    );
    report_spread("after drain", &rt.block_on(owned(store)), n);
    let drain_secs = t.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(args.tail_secs));
    report_phase(shared, DRAIN, drain_secs + args.tail_secs as f64);
}

/// Reads back `--check` streams (or all) with the test kit's checker.
fn check(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    store: &dyn MetadataStore,
    proxy: &str,
    logs: &[StreamLog],
) {
    let step = logs.len().checked_div(args.check).unwrap_or(1).max(1);
    let t = Instant::now();
    let (mut streams, mut records) = (0, 0);
    for l in logs.iter().step_by(step) {
        let report = rt.block_on(check_stream(proxy, store, &l.name, &l.acked, &[]));
        streams += 1;
        records += l.acked.len();
        assert!(report.records.len() >= l.acked.len());
    }
    println!(
        "checker: {streams} streams, {records} acknowledged records all read back once at their DLSNs, replicas present ({:.1} s)",
        t.elapsed().as_secs_f64()
    );
}

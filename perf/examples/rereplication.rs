//! Re-replication benchmark (issue 11): the rate at which a lost bookie's fragment is copied to
//! a replacement (`BookKeeper::replicate_fragment`, what a replication worker runs), and the
//! tail-write latency of a ledger writer on the same bookies while the copy runs, against the
//! same writer with no copy running, alternated in one run.
//!
//! Set-up: a real ZooKeeper (quire-testkit) and four `quire bookie` processes (one shard each,
//! autorecovery off so that only this program copies). Bookies A, B and C start first and
//! `ROUNDS` closed ledgers of `MIB` MiB each (entries of `ENTRY_BYTES`, E=3 Qw=3 Qa=2) are
//! written on them; then D starts and A is SIGKILLed and its registration left to expire. Per
//! round: a baseline phase (the tail writer alone for `BASELINE_SECS`), then a copy phase
//! (the round's ledger's only fragment copied from B and C to D while the tail writer runs).
//! The tail writer is an open loop: 1 KiB adds at 1,000/s (the common workload's rate) on an
//! E=3 Qw=3 Qa=2 ledger, which can only be on B, C and D: the copy's sources and its target.
//! Latency counts from each add's scheduled time, so a stall is not hidden by the loop
//! waiting. The copy and the writer use separate clients on separate runtimes, as a worker in
//! a bookie and a proxy would.
//!
//! Run with perf/rereplication.sh (it builds the `quire` binary and sets QUIRE_BIN). Settings
//! from the environment: QUIRE_REREP_BENCH_MIB (default 128), QUIRE_REREP_BENCH_ENTRY_BYTES
//! (default 16384), QUIRE_REREP_BENCH_ROUNDS (default 3), QUIRE_REREP_BENCH_BASELINE_SECS
//! (default 10), QUIRE_REREP_BENCH_RATE_BYTES (the copy's `replication_rate_bytes`, default 0:
//! unlimited), QUIRE_REREP_BENCH_DIR (where the bookies' directories go, default /tmp; an
//! ext4 or xfs disk, O_DIRECT does not work on tmpfs).

// A benchmark's stopwatch is the real clock, whatever clock the code under test reads
// (quire_clock seam, clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use quire_ledger::{BookKeeper, ClientConfig, LedgerOptions};
use quire_metadata::{BookieId, MetadataStore, ZkStore};
use quire_testkit::{free_port, ZooKeeperServer};

const ZK_ROOT: &str = "/quire-rereplication-bench";
const SESSION_TIMEOUT: Duration = Duration::from_secs(4);
const TAIL_RATE_PER_SEC: u64 = 1_000;
const TAIL_ENTRY_BYTES: usize = 1024;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn options() -> LedgerOptions {
    LedgerOptions {
        ensemble_size: 3,
        write_quorum: 3,
        ack_quorum: 2,
        password: b"rereplication-bench".to_vec(),
        custom: Default::default(),
    }
}

/// A `quire bookie` child, SIGKILLed on drop.
struct BookieProc {
    child: Child,
    id: BookieId,
}

impl BookieProc {
    fn start(bin: &str, zk: &str, dir: &Path, secret_file: &Path, name: &str) -> BookieProc {
        let port = free_port();
        let root = dir.join(name);
        let mut child = Command::new(bin)
            .args(["bookie", "--zookeeper", zk, "--zk-root", ZK_ROOT])
            .args(["--zk-session-timeout-ms", "4000"])
            .arg("--journal-dir")
            .arg(root.join("journal"))
            .arg("--ledger-dir")
            .arg(root.join("ledgers"))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--shards", "1"])
            .args(["--autorecovery-enabled", "false"])
            .arg("--cluster-secret-file")
            .arg(secret_file)
            // The bench's disk is shared with other work; only a full one may stop it.
            .args(["--disk-usage-threshold", "1.0"])
            .env("QUIRE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin} bookie: {e}"));
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.starts_with("quire bookie: ") => break,
                Some(Ok(_)) => {}
                _ => panic!("bookie {name} exited before it served"),
            }
        }
        // Keep draining its stdout so that it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        BookieProc {
            child,
            id: BookieId(format!("127.0.0.1:{port}")),
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for BookieProc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

async fn client(zk: &str, config: ClientConfig) -> (Arc<dyn MetadataStore>, BookKeeper) {
    let store: Arc<dyn MetadataStore> = Arc::new(
        ZkStore::connect(zk, ZK_ROOT, SESSION_TIMEOUT)
            .await
            .expect("connect to ZooKeeper"),
    );
    let bk = BookKeeper::new(store.clone(), config);
    (store, bk)
}

async fn wait_registered(store: &dyn MetadataStore, want: impl Fn(&[BookieId]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ids: Vec<BookieId> = store
            .list_bookies()
            .await
            .expect("list bookies")
            .into_iter()
            .map(|b| b.id)
            .collect();
        if want(&ids) {
            return;
        }
        assert!(Instant::now() < deadline, "bookies registered: {ids:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes a closed ledger of `bytes` in entries of `entry_bytes`, 64 adds in flight.
async fn big_ledger(bk: &BookKeeper, bytes: u64, entry_bytes: usize) -> quire_wire::LedgerId {
    let w = bk.create_ledger(options()).await.expect("create ledger");
    let entries = bytes.div_ceil(entry_bytes as u64);
    let mut in_flight = std::collections::VecDeque::new();
    for e in 0..entries {
        let payload: Vec<u8> = (0..entry_bytes).map(|j| (e as usize ^ j) as u8).collect();
        in_flight.push_back(w.add(payload));
        if in_flight.len() >= 64 {
            in_flight.pop_front().unwrap().await.expect("add");
        }
    }
    for a in in_flight {
        a.await.expect("add");
    }
    w.close().await.expect("close");
    w.id()
}

/// The open-loop tail writer: adds at [`TAIL_RATE_PER_SEC`] until `stop` turns true (or
/// `max` passes). Returns each add's scheduled time and its latency from that time, in
/// microseconds.
async fn tail_writer(
    bk: BookKeeper,
    stop: tokio::sync::watch::Receiver<bool>,
    max: Duration,
) -> Vec<(Instant, u64)> {
    let w = Arc::new(bk.create_ledger(options()).await.expect("tail ledger"));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, u64)>();
    let interval = Duration::from_micros(1_000_000 / TAIL_RATE_PER_SEC);
    let start = tokio::time::Instant::now();
    let mut i: u32 = 0;
    loop {
        if *stop.borrow() || start.elapsed() >= max {
            break;
        }
        let scheduled = start + interval * i;
        tokio::time::sleep_until(scheduled).await;
        let add = w.add(vec![0x42; TAIL_ENTRY_BYTES]);
        let tx = tx.clone();
        tokio::spawn(async move {
            add.await.expect("tail add");
            let _ = tx.send((scheduled.into_std(), scheduled.elapsed().as_micros() as u64));
        });
        i += 1;
    }
    drop(tx);
    let mut latencies = Vec::new();
    while let Some(l) = rx.recv().await {
        latencies.push(l);
    }
    w.close().await.expect("close tail ledger");
    latencies
}

/// The latencies of the adds scheduled at or after `from` and before `to`.
fn histogram(latencies: &[(Instant, u64)], from: Instant, to: Instant) -> Histogram<u64> {
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
    for &(at, us) in latencies {
        if at >= from && at < to {
            hist.saturating_record(us);
        }
    }
    hist
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let bin = std::env::var("QUIRE_BIN")
        .expect("set QUIRE_BIN to the quire binary (perf/rereplication.sh does)");
    let mib = env_u64("QUIRE_REREP_BENCH_MIB", 128);
    let entry_bytes = env_u64("QUIRE_REREP_BENCH_ENTRY_BYTES", 16384) as usize;
    let rounds = env_u64("QUIRE_REREP_BENCH_ROUNDS", 3) as usize;
    let baseline = Duration::from_secs(env_u64("QUIRE_REREP_BENCH_BASELINE_SECS", 10));
    let base_dir = PathBuf::from(std::env::var("QUIRE_REREP_BENCH_DIR").unwrap_or("/tmp".into()));
    let dir = tempfile::Builder::new()
        .prefix("quire-rereplication-bench-")
        .tempdir_in(&base_dir)
        .expect("bench dir");
    let zk_server = ZooKeeperServer::start();
    let zk = zk_server.connect_string();
    // Bookies admit only holders of the cluster secret; the clients below hold it.
    let secret = quire_testkit::cluster_secret::ClusterSecret::generate().expect("secret");
    let secret_file = quire_testkit::cluster_secret::write_cluster_secret(dir.path(), &secret);
    let copy_rt = runtime();
    let tail_rt = runtime();
    // The first bookie initializes the cluster's znodes; clients connect after.
    let mut a = BookieProc::start(&bin, &zk, dir.path(), &secret_file, "a");
    let b = BookieProc::start(&bin, &zk, dir.path(), &secret_file, "b");
    let c = BookieProc::start(&bin, &zk, dir.path(), &secret_file, "c");
    // The copier paces its writes like a worker with `replication_rate_bytes` set.
    let rate = env_u64("QUIRE_REREP_BENCH_RATE_BYTES", 0);
    let (store, copier) = copy_rt.block_on(client(
        &zk,
        ClientConfig {
            replication_rate_bytes_per_sec: (rate > 0).then_some(rate),
            cluster_secret: Some(secret),
            ..ClientConfig::default()
        },
    ));
    copy_rt.block_on(wait_registered(&*store, |ids| ids.len() == 3));
    if rate > 0 {
        println!("copies paced to {rate} bytes/s (replication_rate_bytes)");
    }
    println!("writing {rounds} closed ledgers of {mib} MiB in {entry_bytes}-byte entries on bookies a, b, c");
    let ledgers: Vec<_> = (0..rounds)
        .map(|_| copy_rt.block_on(big_ledger(&copier, mib << 20, entry_bytes)))
        .collect();
    let d = BookieProc::start(&bin, &zk, dir.path(), &secret_file, "d");
    a.kill();
    let lost = a.id.clone();
    copy_rt.block_on(wait_registered(&*store, |ids| {
        ids.len() == 3 && !ids.contains(&lost)
    }));
    let (_, writer_bk) = tail_rt.block_on(client(
        &zk,
        ClientConfig {
            cluster_secret: Some(secret),
            ..ClientConfig::default()
        },
    ));
    println!(
        "bookie a ({lost}) lost; copies go from b ({}) and c ({}) to d ({})",
        b.id, c.id, d.id
    );
    println!("round  phase     secs   MiB/s   tail p50 ms  p99 ms  p99.9 ms  max ms  adds");
    let (mut rates, mut ratios) = (Vec::new(), Vec::new());
    for (round, ledger) in ledgers.iter().enumerate() {
        // Baseline: the tail writer alone.
        let (_never, stop) = tokio::sync::watch::channel(false);
        let base = tail_rt.block_on(tail_writer(writer_bk.clone(), stop, baseline));
        let base = histogram(&base, Instant::now() - 2 * baseline, Instant::now());
        println!(
            "{round:>5}  baseline  {:>4.1}  {:>6}  {:>11.2}  {:>6.2}  {:>8.2}  {:>6.2}  {}",
            baseline.as_secs_f64(),
            "-",
            ms(base.value_at_quantile(0.5)),
            ms(base.value_at_quantile(0.99)),
            ms(base.value_at_quantile(0.999)),
            ms(base.max()),
            base.len()
        );
        // Copy phase: the tail writer runs until the copy is done.
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let tail = tail_rt.spawn(tail_writer(
            writer_bk.clone(),
            stop,
            Duration::from_secs(3600),
        ));
        // Let the tail writer's ledger be created and settle before the copy starts.
        std::thread::sleep(Duration::from_millis(500));
        let started = Instant::now();
        let done = copy_rt
            .block_on(copier.replicate_fragment(*ledger, 0, &lost, &Default::default()))
            .expect("re-replication");
        let took = started.elapsed();
        let _ = stop_tx.send(true);
        // Only the adds scheduled while the copy ran.
        let during = histogram(
            &tail_rt.block_on(tail).expect("tail writer"),
            started,
            started + took,
        );
        let rate = done.bytes_copied as f64 / (1 << 20) as f64 / took.as_secs_f64();
        let ratio = during.value_at_quantile(0.99) as f64 / base.value_at_quantile(0.99) as f64;
        println!(
            "{round:>5}  copy      {:>4.1}  {:>6.1}  {:>11.2}  {:>6.2}  {:>8.2}  {:>6.2}  {}   ({} entries to {}; p99 ratio {ratio:.2})",
            took.as_secs_f64(),
            rate,
            ms(during.value_at_quantile(0.5)),
            ms(during.value_at_quantile(0.99)),
            ms(during.value_at_quantile(0.999)),
            ms(during.max()),
            during.len(),
            done.entries_copied,
            done.to
        );
        assert_eq!(done.to, d.id, "the only possible target is d");
        rates.push(rate);
        ratios.push(ratio);
    }
    println!(
        "median re-replication rate {:.1} MiB/s; median tail p99 during copy / baseline {:.2}",
        median(rates),
        median(ratios)
    );
    drop((b, c, d));
    zk_server.stop();
}

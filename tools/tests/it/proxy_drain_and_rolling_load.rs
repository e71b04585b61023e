//! A proxy's SIGTERM drain under a live writer and tailing reader, and the load that the
//! Ansible deployment test (`ansible/ci/deploy-test.sh`) runs against a deployed cluster during
//! `rolling-restart.yml`.
//!
//! Both use one load driver: a writer that keeps appending loghub lines (one write in flight at
//! a time, so acknowledgement order is the stream's order) and moves to the next proxy when one
//! stops serving, and a tailing reader that does the same. At the end the shared checker reads
//! the stream back and checks every acknowledged record is there exactly once, where it was
//! acknowledged, in order, with identical replicas; the reader's view must be the same
//! sequence.

use quire_testkit::harness::cluster::runtime;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quire_client::{Dlsn, ProxyClient, ReadPosition};
use quire_metadata::{ZkDigest, ZkStore};
use quire_proxy::ErrorCode;
use quire_testkit::harness::checker::{check_stream_with, Acked, Replicas};
use quire_testkit::harness::cluster::{Cluster, SESSION_TIMEOUT_MS};

/// Loghub lines to write, cycled: every sample file, split at LF, empty lines left out.
fn loghub_lines() -> Vec<Vec<u8>> {
    let mut lines = Vec::new();
    for f in quire_testkit::harness::loghub_files() {
        let bytes = std::fs::read(&f).expect("read loghub file");
        lines.extend(
            bytes
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .take(2000)
                .map(|l| l.to_vec()),
        );
    }
    assert!(!lines.is_empty());
    lines
}

/// The writer's progress, shared with the test and the reader.
#[derive(Debug, Default)]
struct Progress {
    /// Writes acknowledged so far.
    acked: usize,
    /// DLSN of the last acknowledged record.
    last: Option<Dlsn>,
}

/// Waits (up to 60 s) until `n` writes are acknowledged; panics with `what` otherwise.
fn wait_acked(progress: &Mutex<Progress>, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let acked = progress.lock().unwrap().acked;
        if acked >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {acked} of {n} acknowledgements within 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How a failed write was classified (what the client saw).
#[derive(Debug, Default)]
struct Failures {
    /// `SERVICE_UNAVAILABLE`: the proxy was draining and did not write the record.
    unavailable: usize,
    /// The connection failed (proxy gone, or closed before answering: outcome unknown).
    io: usize,
    /// A redirect could not be followed (the owner was stopping), or any other error.
    other: usize,
    /// The first few messages, for the report.
    samples: Vec<String>,
}

/// What the writer saw.
struct WriterReport {
    acked: Vec<Acked>,
    /// Latency of each acknowledged write, with the acknowledgement time.
    latencies: Vec<(Instant, Duration)>,
    failures: Failures,
    /// Acknowledgements per proxy address.
    per_proxy: Vec<(String, usize)>,
}

/// One proxy client per address, connected on first use and dropped after a failure, so that
/// a restarted proxy is reached afresh.
struct Clients {
    addrs: Vec<String>,
    clients: Vec<Option<Arc<ProxyClient>>>,
}

impl Clients {
    fn new(addrs: &[String]) -> Self {
        Self {
            addrs: addrs.to_vec(),
            clients: vec![None; addrs.len()],
        }
    }

    async fn get(&mut self, i: usize) -> Result<Arc<ProxyClient>, quire_proxy::Error> {
        if let Some(c) = &self.clients[i] {
            return Ok(c.clone());
        }
        // With TLS when QUIRE_TLS_CA_FILE is set (the deployment test's TLS cluster).
        let c =
            Arc::new(quire_testkit::harness::checker::connect_proxy(self.addrs[i].as_str()).await?);
        self.clients[i] = Some(c.clone());
        Ok(c)
    }

    fn forget(&mut self, i: usize) {
        self.clients[i] = None;
    }
}

/// Appends one record per write (payload `w{seq:09} {loghub line}`, txid seq + 1: every
/// attempt a new record, so that a write whose outcome is unknown is never resent as the same
/// record) until `stop` is set, moving to the next proxy after any failure. With `interval`,
/// a write starts at most every `interval` (a slower write starts the next at once), which
/// keeps the history the checker reads back small.
async fn writer(
    addrs: Vec<String>,
    stream: String,
    lines: Arc<Vec<Vec<u8>>>,
    stop: Arc<AtomicBool>,
    progress: Arc<Mutex<Progress>>,
    interval: Option<Duration>,
) -> WriterReport {
    let mut clients = Clients::new(&addrs);
    let mut cur = 0usize;
    let mut seq: u64 = 0;
    let mut report = WriterReport {
        acked: Vec::new(),
        latencies: Vec::new(),
        failures: Failures::default(),
        per_proxy: addrs.iter().map(|a| (a.clone(), 0)).collect(),
    };
    while !stop.load(Ordering::SeqCst) {
        let line = &lines[(seq as usize) % lines.len()];
        let mut payload = format!("w{seq:09} ").into_bytes();
        payload.extend_from_slice(line);
        let txid = seq + 1;
        seq += 1;
        let t0 = Instant::now();
        let result = match clients.get(cur).await {
            Ok(c) => c.write(&stream, vec![(txid, payload.clone())], true).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(r) => {
                report.latencies.push((Instant::now(), t0.elapsed()));
                report.acked.push((r.first_dlsn, payload));
                report.per_proxy[cur].1 += 1;
                let mut p = progress.lock().unwrap();
                p.acked += 1;
                p.last = Some(r.first_dlsn);
            }
            Err(e) => {
                let f = &mut report.failures;
                match &e {
                    quire_proxy::Error::Remote {
                        code: ErrorCode::ServiceUnavailable,
                        ..
                    } => f.unavailable += 1,
                    // A connection lost under a write: its outcome is unknown.
                    quire_proxy::Error::Io { .. }
                    | quire_proxy::Error::WriteOutcomeUnknown {
                        code: ErrorCode::Internal,
                        ..
                    } => f.io += 1,
                    _ => f.other += 1,
                }
                if f.samples.len() < 8 {
                    f.samples.push(format!("{}: {e}", addrs[cur]));
                }
                clients.forget(cur);
                cur = (cur + 1) % addrs.len();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        if let Some(i) = interval {
            tokio::time::sleep_until((t0 + i).into()).await;
        }
    }
    report
}

/// Tails `stream` from its head until `stop` is set and it has read up to `progress` (the
/// writer's last acknowledged DLSN), moving to the next proxy after any failure. Returns every
/// record read, in order; panics if DLSNs do not grow or it cannot catch up within 60 s.
async fn tail_reader(
    addrs: Vec<String>,
    stream: String,
    stop: Arc<AtomicBool>,
    progress: Arc<Mutex<Progress>>,
) -> (Vec<(Dlsn, Vec<u8>)>, usize) {
    let mut clients = Clients::new(&addrs);
    let mut cur = addrs.len() - 1;
    let mut from = ReadPosition::Head;
    let mut out: Vec<(Dlsn, Vec<u8>)> = Vec::new();
    let mut errors = 0usize;
    let mut stopped_at: Option<Instant> = None;
    loop {
        if stop.load(Ordering::SeqCst) {
            let goal = progress.lock().unwrap().last;
            let done = match goal {
                None => true,
                Some(g) => out.last().is_some_and(|(d, _)| *d >= g),
            };
            if done {
                return (out, errors);
            }
            let t = *stopped_at.get_or_insert_with(Instant::now);
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the tailing reader did not reach {goal:?} within 60 s of the writer stopping (last read {:?})",
                out.last().map(|r| r.0)
            );
        }
        let result = match clients.get(cur).await {
            Ok(c) => {
                c.read(&stream, from, 1024, 1 << 20, Duration::from_millis(500))
                    .await
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(batch) => {
                for (dlsn, _, payload) in batch.records {
                    if let Some((last, _)) = out.last() {
                        assert!(dlsn > *last, "the tailing reader saw {dlsn} after {last}");
                    }
                    out.push((dlsn, payload));
                }
                from = batch.next;
            }
            Err(quire_proxy::Error::Remote {
                code: ErrorCode::NoSuchStream,
                ..
            }) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(_) => {
                errors += 1;
                clients.forget(cur);
                cur = (cur + 1) % addrs.len();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Milliseconds, one decimal.
fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// Checks the writer's and reader's histories against the stream read back, and prints the
/// writer's latency figures over the window `from..` (p50, p99, max, longest gap between two
/// acknowledgements). `replicas`: what closed ledgers must hold (the checker's check 3).
/// Returns the records the checker read back, in stream order.
#[allow(clippy::too_many_arguments)]
async fn check_and_report(
    label: &str,
    check_proxy: &str,
    store: &ZkStore,
    stream: &str,
    w: &WriterReport,
    (read, reader_errors): (&[(Dlsn, Vec<u8>)], usize),
    window_start: Instant,
    replicas: Replicas,
) -> Vec<(Dlsn, Vec<u8>)> {
    // One write in flight at a time: acknowledgement order is the stream's order.
    for pair in w.acked.windows(2) {
        assert!(
            pair[0].0 < pair[1].0,
            "acknowledged {} before {}: out of order",
            pair[0].0,
            pair[1].0
        );
    }
    let report = check_stream_with(check_proxy, store, stream, &w.acked, &[], replicas).await;
    if !report.under_replicated.is_empty() {
        println!(
            "{label}: {} entries of closed ledgers on Qa but not all of their write set (first: {})",
            report.under_replicated.len(),
            report.under_replicated[0]
        );
    }
    assert!(
        read.len() <= report.records.len() && report.records[..read.len()] == *read,
        "the tailing reader's {} records are not a prefix of the {} read back",
        read.len(),
        report.records.len()
    );
    let mut lat: Vec<Duration> = w
        .latencies
        .iter()
        .filter(|(t, _)| *t >= window_start)
        .map(|(_, d)| *d)
        .collect();
    lat.sort();
    let pct = |p: f64| -> Duration {
        if lat.is_empty() {
            return Duration::ZERO;
        }
        lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1]
    };
    let mut gap = Duration::ZERO;
    let mut prev = window_start;
    for (t, _) in w.latencies.iter().filter(|(t, _)| *t >= window_start) {
        gap = gap.max(t.saturating_duration_since(prev));
        prev = *t;
    }
    let f = &w.failures;
    println!(
        "{label}: {} writes acknowledged ({} in the window), checker read {} records and compared {} entries ({} replicas); \
         tailing reader read {} records ({} errors, followed); failed writes: {} SERVICE_UNAVAILABLE, {} connection, {} other; \
         per proxy {:?}",
        w.acked.len(),
        lat.len(),
        report.records.len(),
        report.entries_checked,
        report.replicas_read,
        read.len(),
        reader_errors,
        f.unavailable,
        f.io,
        f.other,
        w.per_proxy
    );
    println!(
        "{label}: writer latency in the window: p50 {} ms, p99 {} ms, max {} ms; longest gap between acknowledgements {} ms",
        ms(pct(0.50)),
        ms(pct(0.99)),
        ms(pct(1.0)),
        ms(gap)
    );
    for s in &f.samples {
        println!("{label}: failed write: {s}");
    }
    report.records
}

#[test]
fn sigterm_drain_hands_streams_to_the_other_proxy() {
    // Goal: SIGTERM makes a proxy finish its writes in flight, complete its segment, release
    // the stream's lease and exit 0, so that a writer that was using it continues on another
    // proxy at once and nothing acknowledged is lost or duplicated.
    // Method: ZooKeeper, 3 bookies, proxies P1 and P2 (real processes). A writer appends
    // loghub lines through P1 (falling over to P2 on failure) while a reader tails through P2.
    // After 300 acknowledgements, freeze two bookies (SIGSTOP) so that the next write waits at
    // P1, SIGTERM P1, check it is still running 0.5 s later, unfreeze the bookies, and require
    // exit status 0, its "drained" line, that the held write was acknowledged by P1 and that no
    // write was cut off by a closed connection; then 300 more acknowledgements (through P2). Check: the shared checker (every
    // acknowledged record once, in order, identical replicas), the reader's records equal the
    // read-back prefix, and P2 wrote into a new segment (P1's records all in the first one).
    let cluster = Cluster::start();
    let bookies: Vec<_> = (0..3)
        .map(|i| cluster.start_bookie(i, quire_testkit::free_port()))
        .collect();
    // The drain without balanced ownership (on by default; its hand-over is tested in
    // cluster_balanced_ownership.rs): P1 owns the stream as the first proxy asked.
    let no_balance = ["--balance-moves-per-sec", "0"];
    let mut p1 = cluster.start_proxy(
        quire_testkit::free_port(),
        &["--drain-timeout-ms", "20000", no_balance[0], no_balance[1]],
    );
    let p2 = cluster.start_proxy(quire_testkit::free_port(), &no_balance);
    let addrs = vec![p1.addr.clone(), p2.addr.clone()];
    let stream = "drain-test".to_string();
    let lines = Arc::new(loghub_lines());
    let rt = runtime();
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(Mutex::new(Progress::default()));
    let w = rt.spawn(writer(
        addrs.clone(),
        stream.clone(),
        lines,
        stop.clone(),
        progress.clone(),
        None,
    ));
    // The reader starts once P1 owns the stream: a read through P2 of a stream nobody owns
    // yet (between P1's create and its lease, a few ZooKeeper round trips) acquires it for P2,
    // and the writer's requests then all go to P2 and P1 drains nothing (seen on a loaded run).
    wait_acked(&progress, 1, "the writer made no progress through P1");
    let r = rt.spawn(tail_reader(
        vec![p2.addr.clone()],
        stream.clone(),
        stop.clone(),
        progress.clone(),
    ));
    let store = rt.block_on(async {
        ZkStore::connect(
            &cluster.zookeeper(),
            &cluster.zk_root,
            Duration::from_millis(SESSION_TIMEOUT_MS),
        )
        .await
        .unwrap()
    });
    wait_acked(&progress, 300, "the writer made no progress through P1");
    let window_start = Instant::now();
    // Hold a write in flight across the SIGTERM: with two of the three bookies frozen no add
    // reaches Qa=2, so the write sent next waits at P1. The drain must finish it.
    bookies[0].pause();
    bookies[1].pause();
    std::thread::sleep(Duration::from_millis(300));
    let acked_before_term = progress.lock().unwrap().acked;
    // SAFETY: kill(2) on our own, not yet reaped child.
    assert_eq!(unsafe { libc::kill(p1.pid(), libc::SIGTERM) }, 0);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        p1.child.try_wait().unwrap().is_none(),
        "P1 exited while a write was still in flight"
    );
    bookies[0].resume();
    bookies[1].resume();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = p1.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "P1 did not exit within 30 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let p1_stderr = p1.stderr.clone();
    assert!(
        status.success(),
        "P1 exited with {status}: {}",
        p1_stderr.lock().unwrap()
    );
    let drained_line = p1_stderr.lock().unwrap().clone();
    assert!(
        drained_line.contains("drained in"),
        "P1 did not report a completed drain: {drained_line}"
    );
    let after = progress.lock().unwrap().acked;
    wait_acked(
        &progress,
        after + 300,
        "the writer did not continue on P2 after P1 drained",
    );
    stop.store(true, Ordering::SeqCst);
    let wr = rt.block_on(w).unwrap();
    let (read, reader_errors) = rt.block_on(r).unwrap();
    assert!(
        wr.per_proxy[0].1 >= 300 && wr.per_proxy[1].1 >= 300,
        "{:?}",
        wr.per_proxy
    );
    // The write held in flight across the SIGTERM was answered by P1 (acknowledged), not cut
    // off with the connection.
    assert_eq!(
        wr.per_proxy[0].1,
        acked_before_term + 1,
        "P1 acknowledged {} writes, {acked_before_term} before SIGTERM: the write in flight was not finished",
        wr.per_proxy[0].1
    );
    assert_eq!(
        wr.failures.io, 0,
        "a write was cut off: {:?}",
        wr.failures.samples
    );
    rt.block_on(check_and_report(
        "drain",
        &p2.addr,
        &store,
        &stream,
        &wr,
        (&read, reader_errors),
        window_start,
        Replicas::WholeWriteSet,
    ));
    // P1's records all lie in the first segment; P2 wrote into a later one.
    let meta = rt
        .block_on(quire_metadata::MetadataStore::read_stream(&store, &stream))
        .unwrap()
        .value;
    assert!(meta.segments.len() >= 2, "{:?}", meta.segments);
    let p1_acked: Vec<&Acked> = wr
        .acked
        .iter()
        .filter(|(d, _)| d.segment_seq_no == meta.segments[0].seq_no)
        .collect();
    assert_eq!(
        p1_acked.len(),
        wr.per_proxy[0].1,
        "P2 wrote into P1's segment"
    );
    p2.stop();
}

/// Reads a required environment variable of the deployment load test.
fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: this test is run by ansible/ci/deploy-test.sh against a deployed cluster")
    })
}

fn wait_for_file(path: &Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} did not appear within {limit:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "run by ansible/ci/deploy-test.sh against the cluster it deploys (needs QUIRE_LOAD_* variables)"]
fn deployed_cluster_under_rolling_restart() {
    // Goal: a writer and a tailing reader keep going through the deployed proxies while
    // rolling-restart.yml restarts every bookie and proxy, and nothing acknowledged is lost,
    // duplicated or reordered; report the writer's p99 and longest gap during the restart.
    // Method: QUIRE_LOAD_PROXIES (comma-separated host:port), QUIRE_LOAD_ZOOKEEPER,
    // QUIRE_LOAD_ZK_ROOT, QUIRE_LOAD_CONTROL (a directory), QUIRE_LOAD_RATE (writes per
    // second, default 200); the cluster's secrets as the quire CLI takes them: QUIRE_TLS_*,
    // QUIRE_BOOKIE_TLS_*, QUIRE_TOKEN, QUIRE_ZK_AUTH_FILE. The writer starts; after 200
    // acknowledgements this test creates CONTROL/ready; the deploy script then runs the
    // rolling restart and creates CONTROL/stop; the window measured is ready..stop. Then the
    // shared checker and the reader check run as in the drain test.
    let addrs: Vec<String> = env("QUIRE_LOAD_PROXIES")
        .split(',')
        .map(str::to_string)
        .collect();
    let zookeeper = env("QUIRE_LOAD_ZOOKEEPER");
    let zk_root = env("QUIRE_LOAD_ZK_ROOT");
    let control = PathBuf::from(env("QUIRE_LOAD_CONTROL"));
    let stream = format!("deploy-load-{}", std::process::id());
    let lines = Arc::new(loghub_lines());
    let rt = runtime();
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(Mutex::new(Progress::default()));
    // QUIRE_LOAD_RATE writes per second at most (default 200): the checker reads every replica
    // of every entry back, one connection each, so an unpaced writer's history takes minutes.
    let rate: f64 = std::env::var("QUIRE_LOAD_RATE")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|r: &f64| *r > 0.0)
        .unwrap_or(200.0);
    let w = rt.spawn(writer(
        addrs.clone(),
        stream.clone(),
        lines,
        stop.clone(),
        progress.clone(),
        Some(Duration::from_secs_f64(1.0 / rate)),
    ));
    let r = rt.spawn(tail_reader(
        addrs.clone(),
        stream.clone(),
        stop.clone(),
        progress.clone(),
    ));
    wait_acked(
        &progress,
        200,
        "no 200 acknowledgements through the deployed proxies",
    );
    let window_start = Instant::now();
    std::fs::write(control.join("ready"), b"").unwrap();
    wait_for_file(&control.join("stop"), Duration::from_secs(900));
    stop.store(true, Ordering::SeqCst);
    let wr = rt.block_on(w).unwrap();
    let (read, reader_errors) = rt.block_on(r).unwrap();
    // A cluster with ZooKeeper ACLs: its digest identity, where `quire` admin commands find it.
    let digest = std::env::var_os("QUIRE_ZK_AUTH_FILE").map(|path| {
        let text = std::fs::read_to_string(&path).expect("read QUIRE_ZK_AUTH_FILE");
        ZkDigest::parse(&text).expect("QUIRE_ZK_AUTH_FILE holds user:password")
    });
    let store = rt.block_on(async {
        ZkStore::connect_with_auth(
            &zookeeper,
            &zk_root,
            Duration::from_secs(10),
            digest.as_ref(),
        )
        .await
        .unwrap()
    });
    rt.block_on(check_and_report(
        "rolling-restart",
        &addrs[0],
        &store,
        &stream,
        &wr,
        (&read, reader_errors),
        window_start,
        Replicas::WholeWriteSet,
    ));
}

/// The unix time in milliseconds of `t`, given one (Instant, unix ms) pair taken together.
fn unix_ms_of(t: Instant, base: (Instant, u128)) -> u128 {
    base.1 + t.saturating_duration_since(base.0).as_millis()
}

/// One record per line, `DLSN<TAB>payload as hex`: how the remote readers hand their view to
/// the writer's process.
fn record_lines(records: &[(Dlsn, Vec<u8>)]) -> String {
    let mut out = String::new();
    for (dlsn, payload) in records {
        let hex: String = payload.iter().map(|b| format!("{b:02x}")).collect();
        out.push_str(&format!("{dlsn}\t{hex}\n"));
    }
    out
}

#[test]
#[ignore = "run by ansible/ci/regions-soak.sh against the multi-region bed (needs QUIRE_LOAD_* variables)"]
fn deployed_regions_soak() {
    // Goal: on the multi-region test bed (ansible/ci/regions-bed.sh), a writer and tailing
    // readers in two regions keep going while a region is cut off and another partitioned,
    // and every acknowledged record is read back exactly once, in order, by every reader.
    // Method: QUIRE_LOAD_ROLE = writer (default) or reader; QUIRE_LOAD_STREAM names the
    // stream; QUIRE_LOAD_PROXIES lists the proxies the writer tries in order; its own tailing
    // reader tries QUIRE_LOAD_READ_PROXIES (default: the same list), starting at the last one.
    // The cluster's secrets as in deployed_cluster_under_rolling_restart. The writer creates
    // CONTROL/ready after 200 acknowledgements and stops at CONTROL/stop; it then writes
    // CONTROL/last (the last acknowledged DLSN) and CONTROL/acks (the unix ms of every
    // acknowledgement, one a line, for the soak script's resume times), runs the shared
    // checker, and waits (up to 180 s) for CONTROL/reader-NAME of every NAME in
    // QUIRE_LOAD_REMOTE_READERS: each must be a prefix of the records read back that reaches
    // the last acknowledged DLSN. A reader (QUIRE_LOAD_READER_NAME) tails from the head
    // through QUIRE_LOAD_READ_PROXIES (last first) until CONTROL/last, then writes its view
    // to CONTROL/reader-NAME.
    let control = PathBuf::from(env("QUIRE_LOAD_CONTROL"));
    let stream = env("QUIRE_LOAD_STREAM");
    let list = |var: &str| -> Vec<String> { env(var).split(',').map(str::to_string).collect() };
    let read_addrs = if std::env::var_os("QUIRE_LOAD_READ_PROXIES").is_some() {
        list("QUIRE_LOAD_READ_PROXIES")
    } else {
        list("QUIRE_LOAD_PROXIES")
    };
    let rt = runtime();
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(Mutex::new(Progress::default()));
    if std::env::var("QUIRE_LOAD_ROLE").as_deref() == Ok("reader") {
        let name = env("QUIRE_LOAD_READER_NAME");
        let r = rt.spawn(tail_reader(
            read_addrs,
            stream,
            stop.clone(),
            progress.clone(),
        ));
        wait_for_file(&control.join("stop"), Duration::from_secs(3600));
        wait_for_file(&control.join("last"), Duration::from_secs(120));
        let last: Dlsn = std::fs::read_to_string(control.join("last"))
            .unwrap()
            .trim()
            .parse()
            .expect("CONTROL/last holds a DLSN");
        progress.lock().unwrap().last = Some(last);
        stop.store(true, Ordering::SeqCst);
        let (read, errors) = rt.block_on(r).unwrap();
        println!(
            "regions-soak: reader {name}: {} records up to {last} ({errors} errors, followed)",
            read.len()
        );
        let tmp = control.join(format!(".reader-{name}"));
        std::fs::write(&tmp, record_lines(&read)).unwrap();
        std::fs::rename(tmp, control.join(format!("reader-{name}"))).unwrap();
        return;
    }
    let addrs = list("QUIRE_LOAD_PROXIES");
    let rate: f64 = std::env::var("QUIRE_LOAD_RATE")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|r: &f64| *r > 0.0)
        .unwrap_or(200.0);
    let base = (
        Instant::now(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    );
    let w = rt.spawn(writer(
        addrs.clone(),
        stream.clone(),
        Arc::new(loghub_lines()),
        stop.clone(),
        progress.clone(),
        Some(Duration::from_secs_f64(1.0 / rate)),
    ));
    let r = rt.spawn(tail_reader(
        read_addrs,
        stream.clone(),
        stop.clone(),
        progress.clone(),
    ));
    wait_acked(&progress, 200, "no 200 acknowledgements on the bed");
    let window_start = Instant::now();
    std::fs::write(control.join("ready"), b"").unwrap();
    wait_for_file(&control.join("stop"), Duration::from_secs(3600));
    stop.store(true, Ordering::SeqCst);
    let wr = rt.block_on(w).unwrap();
    let last = wr.acked.last().expect("acknowledged writes").0;
    std::fs::write(control.join("last"), format!("{last}\n")).unwrap();
    let acks: String = wr
        .latencies
        .iter()
        .map(|(t, _)| format!("{}\n", unix_ms_of(*t, base)))
        .collect();
    std::fs::write(control.join("acks"), acks).unwrap();
    let (read, reader_errors) = rt.block_on(r).unwrap();
    let digest = std::env::var_os("QUIRE_ZK_AUTH_FILE").map(|path| {
        let text = std::fs::read_to_string(&path).expect("read QUIRE_ZK_AUTH_FILE");
        ZkDigest::parse(&text).expect("QUIRE_ZK_AUTH_FILE holds user:password")
    });
    let store = rt.block_on(async {
        ZkStore::connect_with_auth(
            &env("QUIRE_LOAD_ZOOKEEPER"),
            &env("QUIRE_LOAD_ZK_ROOT"),
            Duration::from_secs(10),
            digest.as_ref(),
        )
        .await
        .unwrap()
    });
    // Closed ledgers are held to BookKeeper's promise after recovery (Qa of each write set):
    // a bookie of a region cut off misses the adds acknowledged without it before its writer
    // replaced it (from LAC + 1), and neither recovery nor the bed's autorecovery (its auditor
    // waits lost_bookie_recovery_delay_secs, longer than the cut) copies them back here.
    let records = rt.block_on(check_and_report(
        "regions-soak",
        &addrs[0],
        &store,
        &stream,
        &wr,
        (&read, reader_errors),
        window_start,
        Replicas::AckQuorum,
    ));
    let all = record_lines(&records);
    let names = std::env::var("QUIRE_LOAD_REMOTE_READERS").unwrap_or_default();
    for name in names.split(',').filter(|n| !n.is_empty()) {
        let path = control.join(format!("reader-{name}"));
        wait_for_file(&path, Duration::from_secs(180));
        let view = std::fs::read_to_string(&path).unwrap();
        let n = view.lines().count();
        assert!(
            all.starts_with(&view),
            "reader {name}'s {n} records are not a prefix of the {} read back",
            records.len()
        );
        let reached = view
            .lines()
            .last()
            .and_then(|l| l.split('\t').next())
            .and_then(|d| d.parse::<Dlsn>().ok());
        assert!(
            reached.is_some_and(|d| d >= last),
            "reader {name} stopped at {reached:?}, before the last acknowledged {last}"
        );
        println!(
            "regions-soak: reader {name} read {n} records, each once and in order, up to {last}"
        );
    }
}

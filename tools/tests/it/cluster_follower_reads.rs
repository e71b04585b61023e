//! Issue 29, item 1: reads from any proxy. A proxy that does not own a stream serves its reads
//! from the bookies through one follower per stream (following the LAC with long polls, its own
//! cache), instead of redirecting readers to the owner.
//!
//! Method: real ZooKeeper, three `quire bookie` and three `quire proxy` processes on loopback,
//! SIGKILL; the history checker (issue 28) checks every write's outcome and every reader's view
//! against the final log; bookie read requests are counted from the bookies' `/metrics`.

use quire_testkit::harness::cluster::runtime;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quire_client::{ClientConfig, Dlsn, ProxyClient, ReadPosition};
use quire_testkit::harness::cluster::Cluster;
use quire_testkit::harness::recorded;
use quire_testkit::harness::{checker::Acked, http_get};
use quire_testkit::history::History;

/// Small segments, so that a few hundred records roll several times.
/// Small segments, follower reads, and ownership by the first proxy asked (the tests rely on
/// which proxy owns the stream; balanced ownership, on by default, is tested in
/// cluster_balanced_ownership.rs).
const SMALL_SEGMENTS: [&str; 6] = [
    "--segment-size-bytes",
    "2048",
    "--follower-reads",
    "true",
    "--balance-moves-per-sec",
    "0",
];

/// The sum of the samples of the metric lines starting with `prefix` in `/metrics` of `addr`.
fn metric_sum(addr: &str, prefix: &str) -> f64 {
    let (status, text) = http_get(addr, "/metrics");
    assert_eq!(status, 200);
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .collect();
    assert!(!values.is_empty(), "no {prefix} in the metrics of {addr}");
    values.iter().sum()
}

/// Writes one record per request, `{prefix}-{n:08}` with a fresh `n` per attempt, until
/// `count` are acknowledged, retrying refused or failed attempts (the owner may be dead and its
/// lease not yet expired) for up to 60 s. Recorded in `history`.
async fn write_until_acked(
    history: &Arc<History>,
    client: &ProxyClient,
    stream: &str,
    prefix: &str,
    first: usize,
    count: usize,
) -> Vec<Acked> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut acked = Vec::new();
    let mut n = first;
    while acked.len() < count {
        let payload = format!("{prefix}-{n:08}").into_bytes();
        n += 1;
        let op = history.write_invoked(prefix, vec![(1, payload.clone())], None);
        match client.write(stream, vec![(1, payload.clone())], true).await {
            Ok(w) => {
                history.write_done(
                    op,
                    quire_testkit::history::Outcome::Ok {
                        first: w.first_dlsn.into(),
                        last: w.last_dlsn.into(),
                    },
                );
                acked.push((w.first_dlsn, payload));
            }
            Err(e) => {
                history.write_done(op, recorded::outcome_of_error(&e));
                assert!(Instant::now() < deadline, "writes kept failing: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    acked
}

#[test]
fn readers_on_non_owners_see_every_record_once_across_roll_truncation_owner_kill_and_seal() {
    // Goal: tailing readers connected only to proxies B and C, which do not own the stream,
    // receive every record exactly once and in order (history checker) while the stream rolls
    // segments, is truncated, its owner A is SIGKILLed and B takes the stream over, and it is
    // sealed (each reader reaches the end of stream); their proxies never redirect a tailing
    // read (a read with a wait);
    // C follows the stream (one follower) and counts its cache hits.
    let cluster = Cluster::start();
    let bookies: Vec<_> = (0..3)
        .map(|i| cluster.start_bookie(i, quire_testkit::free_port()))
        .collect();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let a = cluster.start_proxy_e3(&SMALL_SEGMENTS);
    let b = cluster.start_proxy_e3(&SMALL_SEGMENTS);
    let c_metrics = format!("127.0.0.1:{}", quire_testkit::free_port());
    let mut c_flags = SMALL_SEGMENTS.to_vec();
    c_flags.extend(["--metrics-listen", &c_metrics]);
    let c = cluster.start_proxy_e3(&c_flags);
    const STREAM: &str = "fr/tail";
    let rt = runtime();
    let history = Arc::new(History::new());
    let (ca, cb, cc) = rt.block_on(async {
        let alone = ClientConfig::default();
        (
            Arc::new(ProxyClient::connect(&a.addr).await.unwrap()),
            Arc::new(
                ProxyClient::connect_with(&b.addr, alone.clone())
                    .await
                    .unwrap(),
            ),
            Arc::new(ProxyClient::connect_with(&c.addr, alone).await.unwrap()),
        )
    });
    // A owns the stream from its first write.
    let mut acked = rt.block_on(write_until_acked(&history, &ca, STREAM, "a", 0, 1));
    let stop = Arc::new(AtomicBool::new(false));
    let tails: Vec<_> = [("tail-b", &cb), ("tail-c", &cc), ("tail-c2", &cc)]
        .into_iter()
        .map(|(name, client)| {
            rt.spawn(recorded::tail(
                history.clone(),
                client.clone(),
                STREAM.into(),
                name.into(),
                stop.clone(),
            ))
        })
        .collect();
    acked.extend(rt.block_on(write_until_acked(&history, &ca, STREAM, "a", 1, 299)));
    // Truncate at the 101st record, through the owner, once the readers are past it: a reader
    // behind the point would be refused, as it should be.
    wait_records_read(&history, &["tail-b", "tail-c", "tail-c2"], 101);
    rt.block_on(async {
        let point: Dlsn = acked[100].0;
        let op = history.truncate_invoked(point.into());
        ca.truncate(STREAM, point).await.unwrap();
        history.done(op);
    });
    acked.extend(rt.block_on(write_until_acked(&history, &ca, STREAM, "a", 300, 100)));
    // The owner dies; B takes the stream at the next write (once A's lease expires).
    a.kill();
    acked.extend(rt.block_on(write_until_acked(&history, &cb, STREAM, "b", 0, 200)));
    rt.block_on(async {
        let op = history.seal_invoked();
        cb.seal_stream(STREAM).await.unwrap();
        history.done(op);
    });
    // The tailing readers (reads with a wait) were all served by C's follower so far.
    assert_eq!(
        metric_sum(&c_metrics, "quire_proxy_redirects_total{op=\"read\"}"),
        0.0,
        "C redirected no tailing read"
    );
    // A read from the head through C starts at the truncation point; one from before it is
    // refused; a read at the tail of the sealed stream says end of stream.
    rt.block_on(async {
        let head = cc
            .read(STREAM, ReadPosition::Head, 1, 1 << 20, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(head.records[0].0, acked[100].0);
        let before = cc
            .read(
                STREAM,
                ReadPosition::Dlsn(acked[0].0),
                1,
                1 << 20,
                Duration::ZERO,
            )
            .await;
        assert!(before.is_err(), "a read before the truncation point");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let end = cc
                .read(STREAM, ReadPosition::Tail, 1, 1 << 20, Duration::ZERO)
                .await
                .unwrap();
            if end.end_of_stream {
                break;
            }
            assert!(Instant::now() < deadline, "C never saw the seal");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    stop.store(true, Ordering::Release);
    let counts: Vec<usize> = tails.into_iter().map(|t| rt.block_on(t).unwrap()).collect();
    let log = rt.block_on(recorded::final_log(&c.addr, STREAM));
    assert_eq!(
        log.len(),
        acked.len() - 100,
        "the final log after truncation"
    );
    history.check(&log).assert_clean();
    for n in &counts {
        assert_eq!(*n, acked.len(), "each reader read every record once");
    }
    // Reads without a wait that found nothing past their position on C's follower were
    // answered by the owner: at most one in the loop waiting for the seal (the client then
    // reads the stream from the owner) and one in the read-back (a new client).
    let redirected = metric_sum(&c_metrics, "quire_proxy_redirects_total{op=\"read\"}");
    assert!(
        redirected <= 2.0,
        "C redirected only reads without a wait at its end: {redirected} read redirects"
    );
    assert_eq!(metric_sum(&c_metrics, "quire_proxy_followers "), 1.0);
    assert!(metric_sum(&c_metrics, "quire_proxy_follower_cache_hits_total") > 0.0);
    for p in [b, c] {
        p.stop();
    }
    for bk in bookies {
        bk.stop();
    }
}

/// Waits (up to 60 s) until each of `readers` has been returned at least `n` records in
/// `history`.
fn wait_records_read(history: &History, readers: &[&str], n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let read: Vec<usize> = readers.iter().map(|r| history.records_read(r)).collect();
        if read.iter().all(|&k| k >= n) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "readers {readers:?} read {read:?} records in 60 s, not {n} each"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Bookie read requests (reads and long polls) answered by `bookies` so far.
fn bookie_reads(bookies: &[String]) -> f64 {
    bookies
        .iter()
        .map(|m| {
            metric_sum(m, "bookkeeper_server_READ_ENTRY_REQUEST_count")
                + metric_sum(m, "bookkeeper_server_READ_ENTRY_LONG_POLL_REQUEST_count")
        })
        .sum()
}

/// Tails `stream` through `client` with `readers` readers while `records` are written through
/// `writer`; returns the bookie read requests it cost.
fn tail_cost(
    rt: &tokio::runtime::Runtime,
    bookies: &[String],
    writer: &Arc<ProxyClient>,
    reader: &Arc<ProxyClient>,
    stream: &str,
    readers: usize,
) -> f64 {
    const RECORDS: usize = 300;
    let history = Arc::new(History::new());
    rt.block_on(write_until_acked(&history, writer, stream, "w", 0, 1));
    let stop = Arc::new(AtomicBool::new(false));
    let tails: Vec<_> = (0..readers)
        .map(|i| {
            rt.spawn(recorded::tail(
                history.clone(),
                reader.clone(),
                stream.into(),
                format!("r{i}"),
                stop.clone(),
            ))
        })
        .collect();
    // Every reader is at the tail (has read the one record) before the writes start: no
    // catch-up reads.
    let names: Vec<String> = (0..readers).map(|i| format!("r{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    wait_records_read(&history, &names, 1);
    let before = bookie_reads(bookies);
    rt.block_on(async {
        for i in 1..RECORDS {
            write_until_acked(&history, writer, stream, "w", i, 1).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    wait_records_read(&history, &names, RECORDS);
    stop.store(true, Ordering::Release);
    for t in tails {
        assert_eq!(
            rt.block_on(t).unwrap(),
            RECORDS,
            "every reader got every record"
        );
    }
    bookie_reads(bookies) - before
}

#[test]
fn many_readers_on_one_follower_cost_one_bookie_read_stream() {
    // Goal: N readers of one stream on a non-owner proxy share one follower: the bookie read
    // requests they cost are about those of one reader, not N times as many (a count).
    // Method: a writer through A writes 300 records one by one to a stream tailed through B by
    // 1 reader, then to another stream tailed by 24; the bookies' READ_ENTRY and long-poll
    // request counts are compared.
    let cluster = Cluster::start();
    let (procs, bookies): (Vec<_>, Vec<String>) = (0..3)
        .map(|i| {
            let m = format!("127.0.0.1:{}", quire_testkit::free_port());
            let p =
                cluster.start_bookie_with(i, quire_testkit::free_port(), &["--metrics-listen", &m]);
            (p, m)
        })
        .unzip();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let a = cluster.start_proxy_e3(&["--follower-reads", "true"]);
    let b = cluster.start_proxy_e3(&["--follower-reads", "true"]);
    let rt = runtime();
    let (ca, cb) = rt.block_on(async {
        (
            Arc::new(ProxyClient::connect(&a.addr).await.unwrap()),
            Arc::new(ProxyClient::connect(&b.addr).await.unwrap()),
        )
    });
    let one = tail_cost(&rt, &bookies, &ca, &cb, "fr/one", 1);
    let many = tail_cost(&rt, &bookies, &ca, &cb, "fr/many", 24);
    eprintln!("bookie read requests: 1 reader {one}, 24 readers {many}");
    assert!(one > 0.0, "the follower reads from the bookies");
    assert!(
        many <= one * 2.0 + 50.0,
        "24 readers cost {many} bookie reads against {one} for one reader"
    );
    a.stop();
    b.stop();
    for p in procs {
        p.stop();
    }
}

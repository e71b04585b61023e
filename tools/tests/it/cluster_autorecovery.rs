//! Autorecovery (issue 11) on a real cluster: five `quire bookie` processes, each running the
//! autorecovery daemon inside (the default), a proxy writing E=3 Qw=3 Qa=2 streams, real
//! ZooKeeper, real SIGKILLs. Ends with the shared checker (every acknowledged record once and
//! in order, byte-identical replicas on each write set) and a check over every ledger: no
//! fragment names a dead bookie, and every entry is on each bookie of its write set,
//! byte-identical.

use quire_testkit::harness::cluster::runtime;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quire_client::ProxyClient;
use quire_metadata::{BookieId, LedgerState, MetadataStore, ZkStore};
use quire_testkit::harness::checker::{check_stream, read_entry, write_records, Acked};
use quire_testkit::harness::cluster::{Cluster, Proc, SESSION_TIMEOUT_MS};
use quire_wire::LedgerId;

/// Short autorecovery delays, so that a lost bookie is acted on within seconds.
const AUTORECOVERY_FLAGS: &[&str] = &[
    "--lost-bookie-recovery-delay-secs",
    "2",
    "--open-ledger-rereplication-grace-period-ms",
    "3000",
    "--autorecovery-poll-interval-ms",
    "250",
];

const STREAMS: [&str; 4] = ["ar/s0", "ar/s1", "ar/s2", "ar/s3"];

fn status(cluster: &Cluster) -> serde_json::Value {
    serde_json::from_str(&cluster.admin_ok(&["autorecovery", "status", "--json"])).unwrap()
}

fn auditor(cluster: &Cluster) -> Option<String> {
    status(cluster)["auditor"].as_str().map(str::to_string)
}

/// Writes `range` to every stream; a write that fails (a stream whose segment autorecovery
/// fenced answers `OWNERSHIP_LOST` once) is retried from the record after the last
/// acknowledged one, up to three times per stream.
async fn write_all(
    client: &Arc<ProxyClient>,
    range: std::ops::Range<usize>,
    acked: &mut [Vec<Acked>; 4],
) {
    for (s, stream) in STREAMS.iter().enumerate() {
        let mut left = range.len();
        for attempt in 0..4 {
            // Each attempt writes new payloads: a failed write may still have landed, and
            // an acknowledged payload must appear exactly once.
            let from = range.start + 100_000 * attempt;
            let (got, err) = write_records(client, stream, stream, from..from + left).await;
            left -= got.len();
            acked[s].extend(got);
            match err {
                None => break,
                Some(e) => assert!(attempt < 3, "writes to {stream} keep failing: {e}"),
            }
        }
    }
}

/// Waits until no ledger is marked under-replicated and no ledger's metadata names `dead`.
/// Returns whether a mark was ever seen (the auditor marked something).
async fn wait_replicated(store: &ZkStore, dead: &BookieId, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut saw_mark = false;
    loop {
        let marks = store.list_under_replicated().await.unwrap();
        saw_mark |= marks
            .iter()
            .any(|(_, m)| m.value.missing_bookies.contains(dead));
        let mut naming = Vec::new();
        for id in store.list_ledgers().await.unwrap() {
            let Ok(meta) = store.read_ledger(id).await else {
                continue;
            };
            if meta
                .value
                .fragments
                .iter()
                .any(|f| f.bookies.contains(dead))
            {
                naming.push(id.0);
            }
        }
        if marks.is_empty() && naming.is_empty() {
            return saw_mark;
        }
        assert!(
            Instant::now() < deadline,
            "after {within:?}: ledgers {naming:?} still name {dead}; marks: {marks:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every ledger: each fragment names `E` distinct live bookies; every entry of a closed
/// ledger, and of the fragments of an open one that have an end, is on each bookie of its
/// write set, byte-identical. Returns the entries checked.
async fn check_every_ledger(store: &ZkStore, live: &HashSet<BookieId>) -> usize {
    let mut checked = 0;
    for id in store.list_ledgers().await.unwrap() {
        let meta = store.read_ledger(id).await.unwrap().value;
        for f in &meta.fragments {
            let distinct: HashSet<&BookieId> = f.bookies.iter().collect();
            assert_eq!(
                distinct.len(),
                usize::from(meta.ensemble_size),
                "ledger {id}: {f:?}"
            );
            for b in &f.bookies {
                assert!(
                    live.contains(b),
                    "ledger {id} fragment {} names {b}, not a live bookie",
                    f.first_entry
                );
            }
        }
        let end = match meta.state {
            LedgerState::Closed => meta.last_entry,
            _ if meta.fragments.len() > 1 => {
                Some(meta.fragments.last().unwrap().first_entry.saturating_sub(1))
            }
            _ => None,
        };
        let Some(end) = end else { continue };
        for entry in 0..=end {
            let f = meta.fragment_for(quire_wire::EntryId(entry));
            let mut first: Option<(String, Vec<u8>)> = None;
            for pos in quire_ledger::quorum::write_set(entry, meta.ensemble_size, meta.write_quorum)
            {
                let b = &f.bookies[pos].0;
                let bytes = read_entry(b, id.0, entry)
                    .unwrap_or_else(|e| panic!("ledger {id} entry {entry} on {b}: {e}"))
                    .unwrap_or_else(|| {
                        panic!(
                            "ledger {id} ({:?}) entry {entry} is missing on {b}",
                            meta.state
                        )
                    });
                match &first {
                    None => first = Some((b.clone(), bytes)),
                    Some((other, want)) => assert!(
                        *want == bytes,
                        "ledger {id} entry {entry}: replica on {b} differs from the one on {other}"
                    ),
                }
            }
            checked += 1;
        }
    }
    checked
}

/// A proxy writing E=3 Qw=3 Qa=2 with small segments, so that each stream has several ledgers.
fn start_proxy(cluster: &Cluster) -> Proc {
    cluster.start_proxy_e3(&["--segment-size-bytes", "1500", "--entry-size-bytes", "200"])
}

/// The shared checker on every stream of [`STREAMS`].
async fn check_streams(proxy: &str, store: &ZkStore, acked: &[Vec<Acked>; 4]) {
    for (s, stream) in STREAMS.iter().enumerate() {
        let report = check_stream(proxy, store, stream, &acked[s], &[]).await;
        assert!(report.records.len() >= acked[s].len());
    }
}

/// `n` bookies on free ports with `flags`, once all are registered: their ports, their ids and
/// the processes (`None` once killed).
fn start_bookies(
    cluster: &Cluster,
    n: usize,
    flags: impl Fn(usize) -> Vec<String>,
) -> (Vec<u16>, Vec<BookieId>, Vec<Option<Proc>>) {
    let ports: Vec<u16> = (0..n).map(|_| quire_testkit::free_port()).collect();
    let ids: Vec<BookieId> = ports
        .iter()
        .map(|p| BookieId(format!("127.0.0.1:{p}")))
        .collect();
    let bookies = (0..n)
        .map(|i| {
            let f = flags(i);
            let f: Vec<&str> = f.iter().map(String::as_str).collect();
            Some(cluster.start_bookie_with(i, ports[i], &f))
        })
        .collect();
    cluster.wait_bookies(&format!("{n} bookies"), |l| {
        l.contains(&format!("{n} bookies registered"))
    });
    (ports, ids, bookies)
}

fn kill(bookies: &mut [Option<Proc>], ids: &[BookieId], victim: &BookieId) {
    let i = ids.iter().position(|b| b == victim).unwrap();
    bookies[i].take().expect("bookie alive").kill();
}

#[test]
fn a_lost_bookies_ledgers_are_copied_back_and_a_new_auditor_takes_over() {
    // Goal: (1) after a bookie is SIGKILLed for good, autorecovery (running inside the other
    // bookies) marks its ledgers under-replicated once its registration has been gone for the
    // delay, and the replication workers bring every ledger back to three replicas on live
    // bookies: closed ledgers' fragments are copied, streams still being written are left to
    // their writers' ensemble changes, and idle open segments are recovered after the grace
    // period; (2) when the auditor's own bookie is SIGKILLed, another bookie becomes auditor
    // within about a session timeout and the dead auditor's ledgers are copied back too.
    // Method: 5 bookies, a proxy (E=3 Qw=3 Qa=2, small segments so each stream has several
    // ledgers), 4 streams; SIGKILL a bookie that is not the auditor while two streams are being
    // written; wait until no mark is left and no ledger names it; check every ledger entry by
    // entry on every bookie of its write set, then the shared checker on each stream; then
    // SIGKILL the auditor's bookie and do it all again. Without autorecovery the closed
    // ledgers keep naming the dead bookie and `wait_replicated` fails.
    let cluster = Cluster::start();
    let metrics: Vec<String> = (0..5)
        .map(|_| format!("127.0.0.1:{}", quire_testkit::free_port()))
        .collect();
    let (_, ids, mut bookies) = start_bookies(&cluster, 5, |i| {
        let mut flags: Vec<String> = AUTORECOVERY_FLAGS.iter().map(|f| f.to_string()).collect();
        flags.extend(["--metrics-listen".to_string(), metrics[i].clone()]);
        flags
    });
    let proxy = start_proxy(&cluster);
    let rt = runtime();
    let client = rt.block_on(async { Arc::new(ProxyClient::connect(&proxy.addr).await.unwrap()) });
    let mut acked: [Vec<Acked>; 4] = Default::default();
    rt.block_on(write_all(&client, 0..300, &mut acked));

    // Exactly one auditor, one of the five candidates (one per bookie).
    let deadline = Instant::now() + Duration::from_secs(30);
    let first_auditor = loop {
        let st = status(&cluster);
        let candidates = st["candidates"].as_array().unwrap().len();
        if let (Some(a), 5) = (st["auditor"].as_str(), candidates) {
            break a.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no auditor among 5 candidates: {st}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(ids.iter().any(|b| b.0 == first_auditor), "{first_auditor}");

    // (1) A bookie other than the auditor dies while s0 and s1 are being written; it is in
    // the ensemble of s3's open segment, which stays idle, so that segment's ledger is
    // recovered by autorecovery after the grace period (its writer never meets the dead
    // bookie, so no ensemble change moves it away).
    let idle_ledger = rt.block_on(async {
        let store = cluster.zk_store().await;
        let meta = store.read_stream(STREAMS[3]).await.unwrap().value;
        LedgerId(meta.segments.last().unwrap().ledger_id)
    });
    let idle_ensemble = rt.block_on(async {
        let store = cluster.zk_store().await;
        let meta = store.read_ledger(idle_ledger).await.unwrap().value;
        assert_eq!(meta.state, LedgerState::Open);
        meta.fragments.last().unwrap().bookies.clone()
    });
    let victim = idle_ensemble
        .iter()
        .find(|b| b.0 != first_auditor)
        .unwrap()
        .clone();
    // Past the proxy's LAC advance delay (200 ms), s3's writer has sent its last control
    // entry and stays idle.
    std::thread::sleep(Duration::from_millis(1000));
    let writer = {
        let client = client.clone();
        rt.spawn(async move {
            let mut more = Vec::new();
            for stream in &STREAMS[..2] {
                let (got, err) = write_records(&client, stream, stream, 300..700).await;
                assert!(err.is_none(), "write to {stream} failed: {err:?}");
                more.push(got);
            }
            more
        })
    };
    std::thread::sleep(Duration::from_millis(30));
    kill(&mut bookies, &ids, &victim);
    let more = rt.block_on(writer).unwrap();
    for (s, got) in more.into_iter().enumerate() {
        acked[s].extend(got);
    }
    let mut live: HashSet<BookieId> = ids.iter().filter(|b| **b != victim).cloned().collect();
    rt.block_on(async {
        let store = cluster.zk_store().await;
        // A mark for a ledger deleted meanwhile (no metadata): a worker drops it
        // (`wait_replicated` waits for every mark to go).
        store
            .mark_under_replicated(LedgerId(999_999), std::slice::from_ref(&victim))
            .await
            .unwrap();
        let saw_mark = wait_replicated(&store, &victim, Duration::from_secs(120)).await;
        assert!(saw_mark, "the auditor never marked a ledger of {victim}");
        let idle = store.read_ledger(idle_ledger).await.unwrap().value;
        assert_eq!(
            idle.state,
            LedgerState::Closed,
            "the idle open segment's ledger was recovered: {idle:?}"
        );
        let s3 = store.read_stream(STREAMS[3]).await.unwrap().value;
        assert_eq!(
            s3.segments.last().unwrap().ledger_id,
            idle_ledger.0,
            "no write went to s3 meanwhile"
        );
        let entries = check_every_ledger(&store, &live).await;
        assert!(entries > 0);
    });
    // The workers' metrics count what they copied; the gauges show nothing left.
    let (mut bytes, mut fragments, mut marked) = (0.0, 0.0, 0.0);
    for (i, addr) in metrics.iter().enumerate() {
        if bookies[i].is_none() {
            continue;
        }
        let (code, text) = quire_testkit::harness::http_get(addr, "/metrics");
        assert_eq!(code, 200);
        bytes += quire_testkit::harness::metric_sum(
            &text,
            "replication_worker_NUM_BYTES_WRITTEN_total",
            &[],
        );
        fragments += quire_testkit::harness::metric_sum(
            &text,
            "replication_worker_NUM_FRAGMENTS_REPLICATED_total",
            &[],
        );
        marked +=
            quire_testkit::harness::metric_sum(&text, "auditor_NUM_UNDER_REPLICATED_LEDGERS", &[]);
    }
    assert!(
        bytes > 0.0 && fragments >= 1.0,
        "bytes {bytes}, fragments {fragments}"
    );
    assert_eq!(marked, 0.0);
    let listed = cluster.admin_ok(&["ledger", "list", "--under-replicated", "--json"]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&listed).unwrap(),
        serde_json::json!([])
    );
    assert_eq!(auditor(&cluster).as_deref(), Some(first_auditor.as_str()));

    // The streams go on (an idle stream whose segment autorecovery fenced rolls to a new one).
    rt.block_on(write_all(&client, 2000..2100, &mut acked));

    // (2) The auditor's bookie dies: another takes over and copies its ledgers back.
    let dead_auditor = BookieId(first_auditor.clone());
    kill(&mut bookies, &ids, &dead_auditor);
    live.remove(&dead_auditor);
    let killed_at = Instant::now();
    let new_auditor = loop {
        match auditor(&cluster) {
            Some(a) if a != first_auditor => break a,
            _ => {}
        }
        assert!(
            killed_at.elapsed() < Duration::from_millis(SESSION_TIMEOUT_MS * 5),
            "no other auditor within {} ms",
            SESSION_TIMEOUT_MS * 5
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("new auditor {new_auditor} after {:?}", killed_at.elapsed());
    assert!(
        live.contains(&BookieId(new_auditor.clone())),
        "{new_auditor}"
    );
    rt.block_on(async {
        let store = cluster.zk_store().await;
        wait_replicated(&store, &dead_auditor, Duration::from_secs(120)).await;
        assert!(check_every_ledger(&store, &live).await > 0);
    });
    rt.block_on(write_all(&client, 3000..3100, &mut acked));
    rt.block_on(async {
        let store = cluster.zk_store().await;
        check_streams(&proxy.addr, &store, &acked).await;
    });
    proxy.stop();
    for b in bookies.into_iter().flatten() {
        b.stop();
    }
}

#[test]
fn a_decommissioned_bookie_is_named_nowhere_and_loses_its_cookie_while_writes_go_on() {
    // Goal: `quire bookie decommission` retires a bookie that is still up while two streams
    // are written: every ledger that names it is re-replicated (open segments recovered after
    // the grace period, their writers moving to new segments), no acknowledged record is lost,
    // the command reports progress and ends with no ledger naming the bookie and its cookie
    // deleted, and a second run says it is decommissioned already.
    // Method: 4 bookies with autorecovery off (`--autorecovery-enabled false`) and one
    // standalone `quire autorecovery` daemon instead, a proxy (E=3 Qw=3 Qa=2, small segments);
    // records written to two streams throughout, retried with new payloads after a failed
    // write; then the checks over every ledger and the shared checker.
    let cluster = Cluster::start();
    let (_, ids, bookies) = start_bookies(&cluster, 4, |_| {
        vec!["--autorecovery-enabled".into(), "false".into()]
    });
    let daemon = cluster.start_autorecovery(AUTORECOVERY_FLAGS);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = status(&cluster);
        let candidates = st["candidates"].as_array().unwrap().clone();
        if candidates.len() == 1
            && st["auditor"]
                .as_str()
                .is_some_and(|a| a.starts_with("autorecovery-"))
        {
            break;
        }
        assert!(candidates.len() <= 1, "bookies run no daemon: {st}");
        assert!(
            Instant::now() < deadline,
            "the standalone daemon is not the auditor: {st}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let proxy = start_proxy(&cluster);
    let rt = runtime();
    let client = rt.block_on(async { Arc::new(ProxyClient::connect(&proxy.addr).await.unwrap()) });
    let mut acked: [Vec<Acked>; 4] = Default::default();
    rt.block_on(write_all(&client, 0..200, &mut acked));
    // The bookie to retire: one in the ensemble of s0's open segment.
    let retired = rt.block_on(async {
        let store = cluster.zk_store().await;
        let meta = store.read_stream(STREAMS[0]).await.unwrap().value;
        let ledger = LedgerId(meta.segments.last().unwrap().ledger_id);
        store.read_ledger(ledger).await.unwrap().value.fragments[0].bookies[0].clone()
    });

    // Writers on s0 and s1 until told to stop.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = STREAMS[..2]
        .iter()
        .map(|stream| {
            let (client, stop) = (client.clone(), stop.clone());
            rt.spawn(async move {
                let (mut got, mut failures, mut next) = (Vec::new(), 0, 10_000);
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let (a, err) = write_records(&client, stream, stream, next..next + 20).await;
                    next += 20;
                    got.extend(a);
                    if err.is_some() {
                        failures += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                (got, failures)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let out = cluster.admin_ok(&[
        "bookie",
        "decommission",
        &retired.0,
        "--timeout-secs",
        "120",
    ]);
    assert!(out.contains("ledgers still name"), "progress shown: {out}");
    assert!(
        out.contains("bytes copied off it so far"),
        "progress shown: {out}"
    );
    assert!(out.contains("decommissioned"), "{out}");
    // The workers' copies reached the decommission record (issue 27 item 3).
    assert!(out.contains("bytes copied off it)"), "{out}");
    assert!(!out.contains("(0 bytes copied off it)"), "{out}");
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for (s, w) in writers.into_iter().enumerate() {
        let (got, failures) = rt.block_on(w).unwrap();
        assert!(
            got.len() > 40,
            "writes went on: {} acknowledged, {failures} failed",
            got.len()
        );
        acked[s].extend(got);
    }
    let again = cluster.admin(&["bookie", "decommission", &retired.0]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("no cookie"));

    rt.block_on(async {
        let store = cluster.zk_store().await;
        assert!(matches!(
            store.read_cookie(&retired).await,
            Err(quire_metadata::Error::NotFound { .. })
        ));
        let live: HashSet<BookieId> = ids.iter().filter(|b| **b != retired).cloned().collect();
        assert!(check_every_ledger(&store, &live).await > 0);
        check_streams(&proxy.addr, &store, &acked).await;
    });
    proxy.stop();
    daemon.stop();
    for b in bookies.into_iter().flatten() {
        b.stop();
    }
}

/// Waits until a mark naming `bookie` was seen and then no mark is left.
async fn wait_marked_then_cleared(store: &ZkStore, bookie: &BookieId, within: Duration) {
    let deadline = Instant::now() + within;
    let mut saw_mark = false;
    loop {
        let marks = store.list_under_replicated().await.unwrap();
        saw_mark |= marks
            .iter()
            .any(|(_, m)| m.value.missing_bookies.contains(bookie));
        // A mark can be made and cleared between two polls; a wiped bookie that holds every
        // entry of its closed ledgers again was marked and repaired.
        if marks.is_empty()
            && (saw_mark || closed_entries_missing_on(store, bookie).await.is_empty())
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "after {within:?}: marked for {bookie}: {saw_mark}; marks: {marks:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `(ledger, entry)` of every entry of a closed ledger that `bookie` should hold and lacks.
async fn closed_entries_missing_on(store: &ZkStore, bookie: &BookieId) -> Vec<(u64, u64)> {
    let mut missing = Vec::new();
    for id in store.list_ledgers().await.unwrap() {
        let Ok(meta) = store.read_ledger(id).await else {
            continue;
        };
        let (LedgerState::Closed, Some(end)) = (meta.value.state, meta.value.last_entry) else {
            continue;
        };
        let meta = meta.value;
        for entry in 0..=end {
            let f = meta.fragment_for(quire_wire::EntryId(entry));
            let holds =
                quire_ledger::quorum::write_set(entry, meta.ensemble_size, meta.write_quorum)
                    .into_iter()
                    .any(|pos| f.bookies[pos] == *bookie);
            if holds && read_entry(&bookie.0, id.0, entry).unwrap().is_none() {
                missing.push((id.0, entry));
            }
        }
    }
    missing
}

#[test]
fn a_wiped_bookie_that_registers_again_gets_its_replicas_back() {
    // Goal: a bookie whose disks are wiped and which registers again under the same id (its
    // cookie deleted with `quire bookie delete-cookie`) is found by the auditor's periodic
    // replica check (BookKeeper's `LedgerChecker`), and the workers copy back to it every entry
    // it should hold; nothing acknowledged is lost.
    // Method: 4 bookies running autorecovery with a periodic check every 2 s and a lost-bookie
    // delay of 10 minutes (so that the bookie's absence alone never triggers a copy to another
    // bookie), a proxy (E=3 Qw=3 Qa=2, small segments), 4 streams written; a bookie is SIGKILLed,
    // its directories emptied; it then refuses to start (its cookie is in ZooKeeper) until the
    // cookie is deleted; restarted on the same port. Waits for a mark naming it and then none,
    // then checks every entry of every ledger on every bookie of its write set, and the shared
    // checker on each stream. Without the periodic replica check no mark is ever made and the
    // wait fails; without the in-place copy the mark is never cleared (or entries stay
    // missing).
    let cluster = Cluster::start();
    let flags = [
        "--lost-bookie-recovery-delay-secs",
        "600",
        "--auditor-periodic-check-interval-secs",
        "2",
        "--autorecovery-poll-interval-ms",
        "250",
    ];
    let (ports, ids, mut bookies) = start_bookies(&cluster, 4, |_| {
        flags.iter().map(|f| f.to_string()).collect()
    });
    let proxy = start_proxy(&cluster);
    let rt = runtime();
    let client = rt.block_on(async { Arc::new(ProxyClient::connect(&proxy.addr).await.unwrap()) });
    let mut acked: [Vec<Acked>; 4] = Default::default();
    rt.block_on(write_all(&client, 0..300, &mut acked));
    // The victim: a bookie of s0's first (closed) segment.
    let victim = rt.block_on(async {
        let store = cluster.zk_store().await;
        let meta = store.read_stream(STREAMS[0]).await.unwrap().value;
        let first = LedgerId(meta.segments.first().unwrap().ledger_id);
        let ledger = store.read_ledger(first).await.unwrap().value;
        assert_eq!(ledger.state, LedgerState::Closed, "s0's first segment");
        ledger.fragments[0].bookies[0].clone()
    });
    let i = ids.iter().position(|b| *b == victim).unwrap();
    let running = cluster.admin(&["bookie", "delete-cookie", &victim.0]);
    assert!(
        !running.status.success()
            && String::from_utf8_lossy(&running.stderr).contains("is registered"),
        "a running bookie's cookie is not deleted: {running:?}"
    );
    kill(&mut bookies, &ids, &victim);
    for dir in [cluster.journal_dir(i), cluster.ledger_dir(i)] {
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
    }
    // Its registration (an ephemeral node) goes with its session.
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let refused = cluster.bookie_refuses(i, ports[i]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("cookie"), "refusal names the cookie: {said}");
    cluster.admin_ok(&["bookie", "delete-cookie", &victim.0]);
    bookies[i] = Some(cluster.start_bookie_with(i, ports[i], &flags));
    cluster.wait_bookies("4 bookies", |l| l.contains("4 bookies registered"));

    let all: HashSet<BookieId> = ids.iter().cloned().collect();
    rt.block_on(async {
        let store = cluster.zk_store().await;
        wait_marked_then_cleared(&store, &victim, Duration::from_secs(120)).await;
        assert!(check_every_ledger(&store, &all).await > 0);
    });
    // The segments that were open when the bookie was wiped lack entries on it too; they
    // close as the streams roll, and a later periodic check finds them.
    rt.block_on(write_all(&client, 1000..1100, &mut acked));
    rt.block_on(async {
        let store = cluster.zk_store().await;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let missing = closed_entries_missing_on(&store, &victim).await;
            if missing.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "closed ledgers' entries still missing on {victim}: {missing:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        check_streams(&proxy.addr, &store, &acked).await;
    });
    proxy.stop();
    for b in bookies.into_iter().flatten() {
        b.stop();
    }
}

#[test]
fn a_worker_killed_mid_copy_changes_nothing_and_the_next_one_copies_it_all() {
    // Goal: a replication worker SIGKILLed while it copies a ledger leaves the metadata as it
    // was and the mark in place; its lock goes with its ZooKeeper session, and another worker
    // then copies the ledger completely (what the first one wrote to the target is found
    // byte-identical and kept) and replaces the lost bookie.
    // Method: 4 bookies with autorecovery off and one standalone `quire autorecovery` daemon;
    // a closed E=3 Qw=3 Qa=2 ledger of 96 entries of 512 KiB written with the ledger client;
    // one of its bookies SIGKILLed, so the only possible target is the fourth bookie. The
    // daemon is SIGKILLed as soon as the target holds the ledger's first entry; the metadata
    // and the mark are checked, then a second daemon started; then every entry is checked on
    // every bookie of its write set.
    let cluster = Cluster::start();
    let (_, ids, mut bookies) = start_bookies(&cluster, 4, |_| {
        vec!["--autorecovery-enabled".into(), "false".into()]
    });
    let rt = runtime();
    const ENTRIES: u64 = 96;
    let payload = |e: u64| -> Vec<u8> {
        (0..512 * 1024)
            .map(|j: u64| (e.wrapping_mul(31) ^ j) as u8)
            .collect()
    };
    let (ledger, before) = rt.block_on(async {
        let store: Arc<dyn MetadataStore> = Arc::new(cluster.zk_store().await);
        let bk = quire_ledger::BookKeeper::new(
            store.clone(),
            quire_ledger::ClientConfig {
                cluster_secret: Some(cluster.secret),
                ..quire_ledger::ClientConfig::default()
            },
        );
        let w = bk.create_ledger(e3_options()).await.unwrap();
        let mut adds = Vec::new();
        for e in 0..ENTRIES {
            adds.push(w.add(payload(e)));
        }
        for a in adds {
            a.await.unwrap();
        }
        w.close().await.unwrap();
        let meta = store.read_ledger(w.id()).await.unwrap();
        (w.id(), meta)
    });
    let ensemble = before.value.fragments[0].bookies.clone();
    let victim = ensemble[0].clone();
    let target = ids.iter().find(|b| !ensemble.contains(b)).unwrap().clone();
    kill(&mut bookies, &ids, &victim);
    let daemon = cluster.start_autorecovery(AUTORECOVERY_FLAGS);
    let deadline = Instant::now() + Duration::from_secs(60);
    while read_entry(&target.0, ledger.0, 0).unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the worker never started copying"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    daemon.kill();
    let copied = (0..ENTRIES)
        .filter(|&e| read_entry(&target.0, ledger.0, e).unwrap().is_some())
        .count();
    eprintln!("the first worker was killed with {copied} of {ENTRIES} entries on the target");
    rt.block_on(async {
        let store = cluster.zk_store().await;
        let now = store.read_ledger(ledger).await.unwrap();
        assert_eq!(now.version, before.version, "metadata unchanged");
        assert_eq!(now.value, before.value);
        let mark = store.read_under_replicated(ledger).await.unwrap();
        assert!(mark.value.missing_bookies.contains(&victim), "{mark:?}");
    });
    assert!(
        (copied as u64) < ENTRIES,
        "the whole ledger was on the target before the kill"
    );
    let daemon = cluster.start_autorecovery(AUTORECOVERY_FLAGS);
    let live: HashSet<BookieId> = ids.iter().filter(|b| **b != victim).cloned().collect();
    rt.block_on(async {
        let store = cluster.zk_store().await;
        wait_replicated(&store, &victim, Duration::from_secs(120)).await;
        let meta = store.read_ledger(ledger).await.unwrap().value;
        assert_eq!(meta.fragments[0].bookies[0], target);
        assert!(check_every_ledger(&store, &live).await >= ENTRIES as usize);
    });
    for e in 0..ENTRIES {
        let got = read_entry(&target.0, ledger.0, e).unwrap().unwrap();
        assert!(got.ends_with(&payload(e)), "entry {e} on the target");
    }
    daemon.stop();
    for b in bookies.into_iter().flatten() {
        b.stop();
    }
}

#[test]
fn the_auditors_bookie_killed_while_a_recovery_runs_another_auditor_finishes_it() {
    // Goal: the auditor's bookie SIGKILLed while a lost bookie's ledgers are being copied back
    // (marks still present): another bookie's daemon becomes auditor, marks the dead
    // auditor's ledgers too, and the workers finish both recoveries.
    // Method: 5 bookies with autorecovery inside and copies paced to 20 KB/s
    // (`--replication-rate-bytes`), so that a recovery lasts seconds; a proxy (E=3 Qw=3 Qa=2,
    // small segments), 4 streams written, then the proxy stopped (its drain completes every
    // segment: an open ledger with two of its three bookies dead could not be recovered, by
    // BookKeeper's rule that fencing must cover every write set's Qw − Qa + 1 bookies); a bookie
    // other than the auditor SIGKILLed; as soon as a mark names it, the auditor's bookie is
    // SIGKILLed too. Then: a new auditor, no mark left and no ledger naming either dead bookie,
    // every entry on every live bookie of its write set, and the shared checker on every
    // stream through a new proxy.
    let cluster = Cluster::start();
    let (_, ids, mut bookies) = start_bookies(&cluster, 5, |_| {
        let mut flags: Vec<String> = AUTORECOVERY_FLAGS.iter().map(|f| f.to_string()).collect();
        flags.extend(["--replication-rate-bytes".to_string(), "20000".to_string()]);
        flags
    });
    let proxy = start_proxy(&cluster);
    let rt = runtime();
    let client = rt.block_on(async { Arc::new(ProxyClient::connect(&proxy.addr).await.unwrap()) });
    let mut acked: [Vec<Acked>; 4] = Default::default();
    rt.block_on(write_all(&client, 0..300, &mut acked));
    drop(client);
    proxy.stop();
    let deadline = Instant::now() + Duration::from_secs(30);
    let first_auditor = loop {
        if let Some(a) = auditor(&cluster) {
            break BookieId(a);
        }
        assert!(Instant::now() < deadline, "no auditor");
        std::thread::sleep(Duration::from_millis(200));
    };
    let victim = ids.iter().find(|b| **b != first_auditor).unwrap().clone();
    kill(&mut bookies, &ids, &victim);
    rt.block_on(async {
        let store = cluster.zk_store().await;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let marks = store.list_under_replicated().await.unwrap();
            if marks
                .iter()
                .any(|(_, m)| m.value.missing_bookies.contains(&victim))
            {
                eprintln!(
                    "{} ledgers marked for {victim}; killing the auditor",
                    marks.len()
                );
                break;
            }
            assert!(Instant::now() < deadline, "no mark for {victim}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    kill(&mut bookies, &ids, &first_auditor);
    let killed_at = Instant::now();
    loop {
        match auditor(&cluster) {
            Some(a) if a != first_auditor.0 => {
                eprintln!("new auditor {a} after {:?}", killed_at.elapsed());
                break;
            }
            _ => {}
        }
        assert!(
            killed_at.elapsed() < Duration::from_millis(SESSION_TIMEOUT_MS * 5),
            "no other auditor"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let live: HashSet<BookieId> = ids
        .iter()
        .filter(|b| **b != victim && **b != first_auditor)
        .cloned()
        .collect();
    rt.block_on(async {
        let store = cluster.zk_store().await;
        wait_replicated(&store, &victim, Duration::from_secs(180)).await;
        wait_replicated(&store, &first_auditor, Duration::from_secs(180)).await;
        assert!(check_every_ledger(&store, &live).await > 0);
    });
    let proxy = start_proxy(&cluster);
    let client = rt.block_on(async { Arc::new(ProxyClient::connect(&proxy.addr).await.unwrap()) });
    rt.block_on(write_all(&client, 1000..1100, &mut acked));
    rt.block_on(async {
        let store = cluster.zk_store().await;
        check_streams(&proxy.addr, &store, &acked).await;
    });
    proxy.stop();
    for b in bookies.into_iter().flatten() {
        b.stop();
    }
}

/// A ledger of E=3 Qw=3 Qa=2.
fn e3_options() -> quire_ledger::LedgerOptions {
    quire_ledger::LedgerOptions {
        ensemble_size: 3,
        write_quorum: 3,
        ack_quorum: 2,
        password: b"pw".to_vec(),
        custom: Default::default(),
    }
}

/// Overwrites every stored copy of `entry` found in the entry logs (`*.qel`) under `dir` with
/// random bytes, synced (a damaged medium); returns how many it found.
fn damage_entry_log_copies(dir: &std::path::Path, entry: &[u8]) -> usize {
    use rand::RngCore;
    use std::io::{Seek, SeekFrom, Write};
    let mut found = 0;
    for f in std::fs::read_dir(dir).unwrap() {
        let path = f.unwrap().path();
        if path.is_dir() {
            found += damage_entry_log_copies(&path, entry);
            continue;
        }
        if path.extension().is_none_or(|x| x != "qel") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let Some(at) = bytes.windows(entry.len()).position(|w| w == entry) else {
            continue;
        };
        let mut noise = vec![0u8; entry.len()];
        rand::thread_rng().fill_bytes(&mut noise);
        let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.seek(SeekFrom::Start(at as u64)).unwrap();
        file.write_all(&noise).unwrap();
        file.sync_all().unwrap();
        found += 1;
    }
    found
}

#[test]
fn issue23_item6_damaged_replicas_a_read_finds_are_marked_and_repaired_in_place() {
    // Goal (issue 23 item 6): entry-log records of 66 entries on one bookie overwritten with
    // random bytes are answered with an I/O error (never "no such entry"); reads through the
    // ledger client go around them and mark the ledger under-replicated with that bookie
    // named; autorecovery inside the bookies copies the good bytes back in place, and then
    // every replica of every entry reads back byte-identical.
    // Method: 3 `quire bookie` processes with autorecovery (periodic check off and a lost-bookie
    // delay of 10 minutes: only the reads' report can start a repair), real ZooKeeper; a closed
    // ledger (E=3 Qw=3 Qa=2) of 100 entries written with the ledger client; one bookie stopped
    // cleanly (its entries checkpointed into entry logs), 66 of its records overwritten in its
    // ledger directory, restarted; every entry read with `LedgerReader`. Without the reads'
    // report nothing is ever marked; without the repair of an existing damaged copy the mark
    // stays or the copies stay damaged.
    const ENTRIES: u64 = 100;
    const DAMAGED: std::ops::Range<u64> = 20..86;
    let cluster = Cluster::start();
    let flags = [
        "--lost-bookie-recovery-delay-secs",
        "600",
        "--auditor-periodic-check-interval-secs",
        "0",
        "--autorecovery-poll-interval-ms",
        "250",
    ];
    let (ports, ids, mut bookies) = start_bookies(&cluster, 3, |_| {
        flags.iter().map(|f| f.to_string()).collect()
    });
    let rt = runtime();
    let store = Arc::new(rt.block_on(cluster.zk_store()));
    let bk = quire_ledger::BookKeeper::new(
        store.clone(),
        quire_ledger::ClientConfig {
            cluster_secret: Some(cluster.secret),
            ..quire_ledger::ClientConfig::default()
        },
    );
    let payload =
        |i: u64| format!("entry {i} of the ledger whose replicas get damaged").into_bytes();
    let id = rt.block_on(async {
        let w = bk.create_ledger(e3_options()).await.unwrap();
        let adds: Vec<_> = (0..ENTRIES).map(|i| w.add(payload(i))).collect();
        for a in adds {
            a.await.unwrap();
        }
        w.close().await.unwrap();
        w.id()
    });
    // Every bookie holds every entry (the close waited for the adds in flight).
    let good: Vec<Vec<u8>> = (0..ENTRIES)
        .map(|e| {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let copies: Vec<_> = ids
                    .iter()
                    .map(|b| read_entry(&b.0, id.0, e).unwrap())
                    .collect();
                if copies.iter().all(|c| c.is_some() && *c == copies[0]) {
                    break copies[0].clone().unwrap();
                }
                assert!(Instant::now() < deadline, "entry {e} not on every bookie");
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .collect();
    let victim = 1;
    bookies[victim].take().unwrap().stop();
    for e in DAMAGED {
        assert_eq!(
            damage_entry_log_copies(&cluster.ledger_dir(victim), &good[e as usize]),
            1,
            "entry {e}'s record in the victim's entry logs"
        );
    }
    bookies[victim] = Some(cluster.start_bookie_with(victim, ports[victim], &flags));
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let answer = read_entry(&ids[victim].0, id.0, DAMAGED.start);
    assert!(
        matches!(&answer, Err(e) if e.contains("IoError")),
        "a damaged record is an I/O error, never no such entry: {answer:?}"
    );

    rt.block_on(async {
        // Watch the marks from before the reads: the mark may be made and cleared quickly.
        let watcher = {
            let store = store.clone();
            let victim = ids[victim].clone();
            tokio::spawn(async move {
                loop {
                    let marks = store.list_under_replicated().await.unwrap();
                    if marks.iter().any(|(l, m)| {
                        *l == id
                            && (m.value.gaps_on.contains(&victim)
                                || m.value.missing_bookies.contains(&victim))
                    }) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        let reader = bk.open_ledger(id).await.unwrap();
        for e in 0..ENTRIES {
            assert_eq!(reader.read(quire_wire::EntryId(e)).await.unwrap(), payload(e));
        }
        tokio::time::timeout(Duration::from_secs(30), watcher)
            .await
            .expect("the ledger is marked under-replicated naming the damaged bookie")
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let marks = store.list_under_replicated().await.unwrap();
            let damaged: Vec<u64> = (0..ENTRIES)
                .filter(|&e| {
                    ids.iter()
                        .any(|b| read_entry(&b.0, id.0, e).ok().flatten().as_ref() != Some(&good[e as usize]))
                })
                .collect();
            if marks.is_empty() && damaged.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "after 60 s: marks {marks:?}; entries not byte-identical on every bookie: {damaged:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    for b in bookies.into_iter().flatten() {
        b.stop();
    }
}

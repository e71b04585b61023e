//! The scrubber (issue 28 item 5) on a real cluster: three `quire bookie` processes with
//! autorecovery inside, a proxy writing E=3 Qw=3 Qa=2, real ZooKeeper; a byte of an entry is
//! flipped inside one bookie's entry log on disk.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quire_client::ProxyClient;
use quire_metadata::{LedgerState, MetadataStore};
use quire_testkit::harness::checker::{check_stream, read_entry, write_padded_records, Acked};
use quire_testkit::harness::cluster::{runtime, Cluster};
use quire_testkit::harness::{http_get, metric_sum};
use quire_wire::LedgerId;

const STREAM: &str = "scrub/s0";

/// The entry log under `dir` holding `needle`, and the offset of `needle` in it.
fn find_in_entry_logs(dir: &Path, needle: &[u8]) -> Option<(PathBuf, usize)> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(found) = find_in_entry_logs(&p, needle) {
                return Some(found);
            }
        } else if p.extension().is_some_and(|x| x == "qel") {
            let bytes = std::fs::read(&p).ok()?;
            if let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
                return Some((p, at));
            }
        }
    }
    None
}

/// Polls `f` every 100 ms until it answers `Some`, for at most `within`.
fn wait_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "after {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_rotten_entry_is_found_by_the_scrubber_and_copied_back_from_another_replica() {
    // Goal: a byte flipped inside a stored entry of one bookie's entry log is found by that
    // bookie's scrub pass (metric), the bookie marks the ledger under-replicated, autorecovery
    // copies the entry back from another replica (repaired metric), the entry reads back right
    // from that bookie, and the stream loses nothing. Method: 3 bookies scrubbing every second
    // unpaced, checkpointing every 200 ms; a proxy with small segments; write 40 records; take
    // entry 0 of the stream's first (closed) ledger, find its bytes in bookie 0's entry logs,
    // flip one, wait for the metrics, read it from bookie 0, run the shared checker. Without
    // the scrubber no metric moves and the entry stays unreadable on bookie 0.
    let cluster = Cluster::start();
    let metrics: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", quire_testkit::free_port()))
        .collect();
    let ports: Vec<u16> = (0..3).map(|_| quire_testkit::free_port()).collect();
    let _bookies: Vec<_> = (0..3)
        .map(|i| {
            cluster.start_bookie_with(
                i,
                ports[i],
                &[
                    "--scrub-interval-secs",
                    "1",
                    "--scrub-rate-bytes-per-sec",
                    "0",
                    "--checkpoint-interval-ms",
                    "200",
                    "--autorecovery-poll-interval-ms",
                    "250",
                    "--metrics-listen",
                    &metrics[i],
                ],
            )
        })
        .collect();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let proxy = cluster.start_proxy_e3(&["--segment-size-bytes", "1500"]);
    let rt = runtime();
    let acked: Vec<Acked> = rt.block_on(async {
        let client = Arc::new(ProxyClient::connect(&proxy.addr).await.unwrap());
        // About 4.6 KB: the first segments (1500 bytes) are closed.
        let (acked, err) = write_padded_records(&client, STREAM, STREAM, 0..40, 100).await;
        assert!(err.is_none(), "{err:?}");
        acked
    });
    let store = rt.block_on(cluster.zk_store());
    let ledger = rt.block_on(async {
        let meta = store.read_stream(STREAM).await.unwrap().value;
        let id = LedgerId(meta.segments[0].ledger_id);
        let l = store.read_ledger(id).await.unwrap().value;
        assert_eq!(l.state, LedgerState::Closed, "first segment's ledger");
        id.0
    });
    let bookie0 = format!("127.0.0.1:{}", ports[0]);
    let entry = read_entry(&bookie0, ledger, 0)
        .unwrap()
        .expect("entry 0 on bookie 0");
    // Checkpointed into an entry log within a few hundred ms.
    let (log, at) = wait_for("entry 0 in an entry log", Duration::from_secs(20), || {
        find_in_entry_logs(&cluster.ledger_dir(0), &entry)
    });
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .read(true)
            .open(&log)
            .unwrap();
        let mut b = [0u8; 1];
        let pos = (at + entry.len() / 2) as u64;
        f.read_exact_at(&mut b, pos).unwrap();
        f.write_all_at(&[b[0] ^ 0x10], pos).unwrap();
        f.sync_all().unwrap();
    }
    let scrape = || http_get(&metrics[0], "/metrics").1;
    let found = wait_for(
        "the scrubber reports the damage",
        Duration::from_secs(30),
        || {
            let v = metric_sum(&scrape(), "bookie_scrub_damaged_entries_found_total", &[]);
            (v >= 1.0).then_some(v)
        },
    );
    let repaired = wait_for(
        "the damaged entry repaired",
        Duration::from_secs(60),
        || {
            let v = metric_sum(&scrape(), "bookie_scrub_repaired_entries_total", &[]);
            (v >= 1.0).then_some(v)
        },
    );
    assert_eq!(
        read_entry(&bookie0, ledger, 0).unwrap().as_deref(),
        Some(&entry[..]),
        "entry 0 of ledger {ledger} read back from bookie 0 after the repair"
    );
    let text = scrape();
    assert_eq!(metric_sum(&text, "bookie_scrub_damaged_entries", &[]), 0.0);
    assert!(metric_sum(&text, "bookie_scrub_passes_total", &[]) >= 2.0);
    let scrub = scrub_info(&bookie0, &cluster.secret_file);
    let report = rt.block_on(check_stream(&proxy.addr, &store, STREAM, &acked, &[]));
    assert!(report.records.len() >= acked.len());
    eprintln!(
        "found {found}, repaired {repaired}, ledger {ledger}, {}; scrub info {scrub}",
        log.display()
    );
}

/// `quire bookie info ADDR --json`'s `scrub` object once it shows the repair (the shard
/// publishes its figures every 500 ms), checked against what the pass found: one damaged
/// entry found, repaired, its ledger reported, passes with start and end times, entries and
/// bytes checked; and the text output's scrub lines.
fn scrub_info(addr: &str, secret_file: &Path) -> serde_json::Value {
    let run = |json: bool| {
        let mut cmd = std::process::Command::new(quire_testkit::harness::quire_bin());
        cmd.args(["bookie", "info", addr, "--cluster-secret-file"])
            .arg(secret_file);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().expect("run quire bookie info");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let v = wait_for(
        "bookie info shows the repair",
        Duration::from_secs(10),
        || {
            let v: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
            (v["scrub"]["repaired"].as_u64() >= Some(1)).then_some(v)
        },
    );
    let s = &v["scrub"];
    assert!(s["damaged_found"].as_u64() >= Some(1), "{s}");
    assert_eq!(s["damaged_now"], 0, "{s}");
    assert!(s["ledgers_reported"].as_u64() >= Some(1), "{s}");
    assert!(s["passes"].as_u64() >= Some(2), "{s}");
    assert!(s["entries_scanned"].as_u64() >= Some(1), "{s}");
    assert!(s["bytes_scanned"].as_u64() >= Some(1), "{s}");
    let shard = &s["shards"][0];
    assert_eq!(shard["enabled"], true, "{s}");
    let (start, end) = (
        shard["last_pass_start_ms"].as_u64().unwrap(),
        shard["last_pass_end_ms"].as_u64().unwrap(),
    );
    assert!(start > 0 && end >= start, "{s}");
    assert!(shard["last_pass_entries"].as_u64() >= Some(1), "{s}");
    let text = run(false);
    assert!(
        text.lines()
            .any(|l| l.starts_with("scrub: ") && l.contains(" repaired;")),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("scrub shard 0: ")),
        "{text}"
    );
    s.clone()
}

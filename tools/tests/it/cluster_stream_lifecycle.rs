//! Goal: the stream admin commands work the same against a ZooKeeper cluster as against the
//! sandbox, through any proxy: `quire stream truncate` sent to a proxy that does not own the
//! stream is carried out by the owner (redirect), leaves exactly the records from the point on
//! readable and deletes the whole segments before it with their ledgers' znodes; `quire stream
//! delete` removes the stream and every segment's ledger znode; size retention set with `quire
//! stream retention` deletes the oldest segments; `quire stream list` and `show` agree. After
//! each of truncation, retention and deletion, every bookie's garbage collection tombstones
//! the deleted ledgers, its entry-log bytes go down, no bookie serves an entry of them any
//! more, and the kept records still read back exactly. Orphan ledger metadata that a crashed
//! deletion leaves (the stream record gone, its ledgers not) is found and deleted by a proxy's
//! lifecycle sweep, and then reclaimed by the bookies the same way.
//! Method: real ZooKeeper (quire-testkit), three `quire bookie` and two `quire proxy` children,
//! records written with `ProxyClient`, admin commands as `quire` child processes, ledger
//! metadata read back from ZooKeeper with `ZkStore`.
//! A proxy whose wall clock runs an hour ahead (libfaketime on a real `quire proxy`) and takes
//! a stream over deletes by time retention only the segments old by the metadata store's
//! clock, not the ones another proxy completed seconds ago (issue 23, item 4).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quire_metadata::{MetadataStore, ZkStore};
use quire_testkit::harness::checker::{read_all, write_records};
use quire_testkit::harness::cluster::{Cluster, SESSION_TIMEOUT_MS};
use quire_testkit::harness::wire::{Answer, Wire};
use quire_testkit::reclaim;
use quire_wire::bookie::Status;
use quire_wire::LedgerId;

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Every bookie's ledger directory.
fn ledger_dirs(cluster: &Cluster) -> Vec<PathBuf> {
    (0..3).map(|i| cluster.ledger_dir(i)).collect()
}

/// Every bookie's entry-log bytes once checkpoints (every 200 ms) have moved the written
/// entries into entry logs: the same figures on three readings 500 ms apart.
fn settled(cluster: &Cluster) -> Vec<u64> {
    reclaim::settled_entry_log_bytes(
        &ledger_dirs(cluster),
        Duration::from_millis(500),
        3,
        Duration::from_secs(30),
    )
}

/// Waits until every bookie's GC has tombstoned `deleted` and its entry-log bytes went below
/// `before`; then asks every bookie directly for the first entry of each deleted ledger: none
/// may still serve it (`NoSuchLedger`).
fn reclaimed(cluster: &Cluster, ports: &[u16], before: &[u64], deleted: &BTreeSet<u64>) {
    assert!(!deleted.is_empty());
    reclaim::wait_until_reclaimed(
        &ledger_dirs(cluster),
        before,
        deleted,
        Duration::from_secs(30),
    );
    for port in ports {
        let mut w = Wire::connect(&format!("127.0.0.1:{port}"));
        for id in deleted {
            assert_eq!(
                w.read(*id, 0),
                Answer::Failed(Status::NoSuchLedger),
                "bookie :{port} still serves deleted ledger {id}"
            );
        }
    }
}

fn ledgers_of(doc: &serde_json::Value) -> Vec<(u64, u64)> {
    doc["metadata"]["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["seq_no"].as_u64().unwrap(),
                s["ledger_id"].as_u64().unwrap(),
            )
        })
        .collect()
}

async fn exists(store: &ZkStore, id: u64) -> bool {
    match store.read_ledger(LedgerId(id)).await {
        Ok(_) => true,
        Err(quire_metadata::Error::NotFound { .. }) => false,
        Err(e) => panic!("read ledger {id}: {e}"),
    }
}

#[test]
fn truncate_delete_and_retention_on_a_zookeeper_cluster() {
    let cluster = Cluster::start();
    // GC every second with a major compaction due at each run, 16 KiB entry logs, 200 ms
    // checkpoints: only whole non-current entry logs are deleted or compacted (about 40 KiB
    // are written per bookie, all in one current log at the 1 GiB default), and the deleted
    // ledgers' entries share logs with kept ones (see sandbox_stream_lifecycle.rs).
    let gc_flags = [
        "--gc-interval-secs",
        "1",
        "--major-compaction-interval-secs",
        "1",
        "--entry-log-size-bytes",
        "16384",
        "--checkpoint-interval-ms",
        "200",
    ];
    let ports: Vec<u16> = (0..3).map(|_| quire_testkit::free_port()).collect();
    let _bookies: Vec<_> = (0..3)
        .map(|i| cluster.start_bookie_with(i, ports[i], &gc_flags))
        .collect();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    // Ownership by the first proxy asked is what this test relies on (balanced ownership, on
    // by default, is tested in cluster_balanced_ownership.rs).
    let flags = [
        "--segment-size-bytes",
        "4096",
        "--entry-size-bytes",
        "1024",
        "--balance-moves-per-sec",
        "0",
    ];
    let a = cluster.start_proxy(quire_testkit::free_port(), &flags);
    let b = cluster.start_proxy(quire_testkit::free_port(), &flags);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let store = rt.block_on(async {
        ZkStore::connect(
            &cluster.zookeeper(),
            &cluster.zk_root,
            Duration::from_millis(SESSION_TIMEOUT_MS),
        )
        .await
        .unwrap()
    });
    let client =
        rt.block_on(async { Arc::new(quire_client::ProxyClient::connect(&a.addr).await.unwrap()) });
    let (acked, err) = rt.block_on(write_records(&client, "zk/t", "t", 0..1000));
    assert!(err.is_none(), "{err:?}");

    // Truncate through B, which does not own the stream: A does it.
    let doc = json(&cluster.stream_admin_ok(&b.addr, &["stream", "show", "zk/t", "--json"]));
    assert_eq!(doc["owner"], a.addr.as_str());
    let segs = ledgers_of(&doc);
    assert!(segs.len() >= 4, "{doc}");
    let point = acked[700].0;
    let before_truncate = settled(&cluster);
    let out = cluster.stream_admin_ok(&b.addr, &["stream", "truncate", "zk/t", &point.to_string()]);
    let whole = segs
        .iter()
        .filter(|(seq, _)| *seq < point.segment_seq_no)
        .count();
    assert!(
        out.contains(&format!(
            "truncated before {point}: {whole} segments deleted"
        )),
        "{out}"
    );
    let got = rt.block_on(read_all(&a.addr, "zk/t"));
    let mut expected: Vec<_> = acked.iter().filter(|(d, _)| *d >= point).cloned().collect();
    expected.sort();
    assert!(got == expected, "records after truncation");
    rt.block_on(async {
        for (seq, id) in &segs {
            assert_eq!(
                exists(&store, *id).await,
                *seq >= point.segment_seq_no,
                "ledger {id}"
            );
        }
    });
    // Every bookie's GC finds the truncated segments' ledgers gone from ZooKeeper and drops
    // their entries: its entry logs shrink, and the kept records still read back exactly.
    let truncated: BTreeSet<u64> = segs
        .iter()
        .filter(|(seq, _)| *seq < point.segment_seq_no)
        .map(|(_, id)| *id)
        .collect();
    reclaimed(&cluster, &ports, &before_truncate, &truncated);
    assert!(
        rt.block_on(read_all(&a.addr, "zk/t")) == expected,
        "records after bookie GC"
    );

    // Size retention through B as well; then the bookies reclaim the retained-away segments.
    // Another stream's records first, enough to roll every bookie's current entry log: the
    // log being appended to is never reclaimed, and the segments retention is about to delete
    // may still sit in it.
    let (filler, err) = rt.block_on(write_records(&client, "zk/filler", "f", 0..3000));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(filler.len(), 3000);
    let before_retention = settled(&cluster);
    let mut retained_away = BTreeSet::new();
    cluster.stream_admin_ok(
        &b.addr,
        &["stream", "retention", "zk/t", "--size-bytes", "3000"],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let after_retention: Vec<_> = loop {
        let doc = json(&cluster.stream_admin_ok(&a.addr, &["stream", "show", "zk/t", "--json"]));
        let completed: u64 = doc["metadata"]["segments"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["state"] == "Completed")
            .map(|s| s["length_bytes"].as_u64().unwrap())
            .sum();
        if completed <= 3000 {
            // When the last write rolled its segment and no record followed, the stream has no
            // open segment (the spare ledger is given back), and every completed segment is
            // over the limit: retention deletes them all.
            let first = ledgers_of(&doc).first().map_or(u64::MAX, |k| k.0);
            let got = rt.block_on(read_all(&a.addr, "zk/t"));
            let after_retention: Vec<_> = expected
                .iter()
                .filter(|(d, _)| d.segment_seq_no >= first)
                .cloned()
                .collect();
            assert!(got == after_retention, "records after size retention");
            rt.block_on(async {
                for (seq, id) in &segs {
                    assert_eq!(exists(&store, *id).await, *seq >= first, "ledger {id}");
                }
            });
            retained_away.extend(
                segs.iter()
                    .filter(|(seq, _)| *seq >= point.segment_seq_no && *seq < first)
                    .map(|(_, id)| *id),
            );
            break after_retention;
        }
        assert!(
            Instant::now() < deadline,
            "size retention did not act: {doc}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };

    reclaimed(&cluster, &ports, &before_retention, &retained_away);
    let got = rt.block_on(read_all(&a.addr, "zk/t"));
    assert!(
        after_retention.ends_with(&got) && got.is_empty() == after_retention.is_empty(),
        "records after bookie GC of retention"
    );

    // Delete through B; the stream and every ledger znode go; the name is free again. More
    // records first (without retention, which would delete them meanwhile), so that the
    // stream's entries fill entry logs the bookies can delete once it is gone.
    cluster.stream_admin_ok(
        &b.addr,
        &["stream", "retention", "zk/t", "--size-bytes", "default"],
    );
    let (more, err) = rt.block_on(write_records(&client, "zk/t", "more", 0..2000));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(more.len(), 2000);
    let doc = json(&cluster.stream_admin_ok(&a.addr, &["stream", "show", "zk/t", "--json"]));
    let kept = ledgers_of(&doc);
    let before_delete = settled(&cluster);
    let out = cluster.stream_admin_ok(&b.addr, &["stream", "delete", "zk/t"]);
    assert!(out.contains("stream zk/t deleted"), "{out}");
    let list = cluster.stream_admin_ok(&b.addr, &["stream", "list"]);
    assert!(!list.lines().any(|l| l == "zk/t"), "{list}");
    rt.block_on(async {
        for (_, id) in &kept {
            assert!(!exists(&store, *id).await, "ledger {id} still in ZooKeeper");
        }
        assert!(matches!(
            store.read_stream("zk/t").await,
            Err(quire_metadata::Error::NotFound { .. })
        ));
    });
    // The last segment may hold no entry on a bookie (never written to it); the completed
    // ones are on every bookie (E = Qw = 3).
    let completed: BTreeSet<u64> = doc["metadata"]["segments"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "Completed" && s["record_count"].as_u64().unwrap() > 0)
        .map(|s| s["ledger_id"].as_u64().unwrap())
        .collect();
    reclaimed(&cluster, &ports, &before_delete, &completed);
    let (again, err) = rt.block_on(write_records(&client, "zk/t", "again", 0..5));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(
        again.iter().map(|a| a.0).min(),
        Some(quire_client::Dlsn::new(1, 0, 0))
    );
    assert_eq!(rt.block_on(read_all(&a.addr, "zk/t")).len(), 5);

    // Orphan ledger metadata, as a stream deletion that crashed after deleting the stream's
    // record leaves it: the ledgers stay in ZooKeeper with nothing referring to them. A proxy
    // with a 1 s lifecycle sweep finds them by their `quire.stream` label, deletes them under
    // the stream's lock, and every bookie's GC then reclaims them. The stream is written
    // through its own proxy, which stops cleanly (segments completed, lease released); then
    // another stream's records roll the bookies' current entry logs past it.
    let c = cluster.start_proxy(quire_testkit::free_port(), &flags);
    let c_client =
        rt.block_on(async { Arc::new(quire_client::ProxyClient::connect(&c.addr).await.unwrap()) });
    let (crashed, err) = rt.block_on(write_records(&c_client, "zk/crashed", "c", 0..3000));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(crashed.len(), 3000);
    drop(c_client);
    c.stop();
    let (filler, err) = rt.block_on(write_records(&client, "zk/filler", "g", 3000..6000));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(filler.len(), 3000);
    let orphans: BTreeSet<u64> = rt.block_on(async {
        let v = store.read_stream("zk/crashed").await.unwrap();
        assert!(v.value.segments.len() >= 4, "{:?}", v.value.segments);
        assert!(v
            .value
            .segments
            .iter()
            .all(|s| s.state == quire_metadata::SegmentState::Completed));
        store.delete_stream("zk/crashed", v.version).await.unwrap();
        v.value.segments.iter().map(|s| s.ledger_id).collect()
    });
    let before_sweep = settled(&cluster);
    let mut sweeping = flags.to_vec();
    sweeping.extend(["--lifecycle-sweep-secs", "1"]);
    let _sweeper = cluster.start_proxy(quire_testkit::free_port(), &sweeping);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<u64> = rt.block_on(async {
            let mut left = Vec::new();
            for id in &orphans {
                if exists(&store, *id).await {
                    left.push(*id);
                }
            }
            left
        });
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sweep left orphan ledgers {left:?} in ZooKeeper"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    reclaimed(&cluster, &ports, &before_sweep, &orphans);
    // Kept streams are untouched.
    assert_eq!(rt.block_on(read_all(&a.addr, "zk/t")).len(), 5);
    assert_eq!(rt.block_on(read_all(&a.addr, "zk/filler")).len(), 6000);
}

/// libfaketime, which the clock-skew test runs a proxy under (Debian package `libfaketime`,
/// installed by `.ci/run`).
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

#[test]
fn a_proxy_an_hour_ahead_deletes_no_young_segment() {
    // Goal (issue 23, item 4): retention ages segments on the metadata store's clock, so a
    // proxy whose clock is an hour ahead that takes over a stream with 600 s time retention
    // deletes the segment that is really older than that and none of the segments another
    // proxy completed seconds ago; it detects the skew (a warning, and
    // `quire_proxy_metadata_clock_skew_seconds` near 3600). Method: proxy A (true clock)
    // writes several 4 KiB segments and stops cleanly; the test moves the first segment's
    // completion time two hours back (by ZooKeeper's clock, through `ZkStore`); proxy B runs
    // under libfaketime at +1 h (monotonic clock untouched) and takes the stream with a write.
    // B must delete segment 1, keep every other one, and serve their records.
    assert!(
        std::path::Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: apt-get install libfaketime (.ci/run installs it)"
    );
    let cluster = Cluster::start();
    let _bookies: Vec<_> = (0..3)
        .map(|i| cluster.start_bookie(i, quire_testkit::free_port()))
        .collect();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let flags = [
        "--segment-size-bytes",
        "4096",
        "--entry-size-bytes",
        "1024",
        "--retention-time-secs",
        "600",
        // Ownership by the first proxy asked (balanced ownership, on by default, is tested in
        // cluster_balanced_ownership.rs).
        "--balance-moves-per-sec",
        "0",
    ];
    let a = cluster.start_proxy(quire_testkit::free_port(), &flags);
    let rt = quire_testkit::harness::cluster::runtime();
    let client =
        rt.block_on(async { Arc::new(quire_client::ProxyClient::connect(&a.addr).await.unwrap()) });
    let (acked, err) = rt.block_on(quire_testkit::harness::checker::write_padded_records(
        &client,
        "skew/s",
        "s",
        0..150,
        200,
    ));
    assert!(err.is_none(), "{err:?}");
    drop(client);
    a.stop();
    let store = rt.block_on(cluster.zk_store());
    let seqs = rt.block_on(async {
        let v = store.read_stream("skew/s").await.unwrap();
        let mut meta = v.value;
        assert!(
            meta.segments.len() >= 4
                && meta
                    .segments
                    .iter()
                    .all(|s| s.state == quire_metadata::SegmentState::Completed),
            "A completed several segments: {:?}",
            meta.segments
        );
        let two_hours_ago = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
            - 2 * 3600 * 1000;
        meta.segments[0].completion_time_ms = Some(two_hours_ago);
        store.update_stream(&meta, v.version).await.unwrap();
        meta.segments.iter().map(|s| s.seq_no).collect::<Vec<_>>()
    });

    let metrics_port = quire_testkit::free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let mut b_flags = flags.to_vec();
    b_flags.extend(["--metrics-listen", &metrics_addr]);
    let b = cluster.start_proxy_env(
        quire_testkit::free_port(),
        &b_flags,
        &[
            ("LD_PRELOAD", LIBFAKETIME),
            ("FAKETIME", "+1h"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    let client =
        rt.block_on(async { Arc::new(quire_client::ProxyClient::connect(&b.addr).await.unwrap()) });
    let (more, err) = rt.block_on(write_records(&client, "skew/s", "b", 0..1));
    assert!(err.is_none(), "{err:?}");
    // Segment 1 is two hours old by ZooKeeper's clock: B deletes it (its lifecycle check runs
    // every second). On its own clock every segment of A's is an hour old.
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        let m = rt.block_on(store.read_stream("skew/s")).unwrap().value;
        if m.segments[0].seq_no != seqs[0] {
            break m.segments[0].seq_no;
        }
        assert!(
            Instant::now() < deadline,
            "B never deleted the segment that is old by the store's clock: {:?}",
            m.segments
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        first, seqs[1],
        "B deleted segments A completed seconds ago (ages taken on B's clock, an hour ahead)"
    );
    let (_, text) = quire_testkit::harness::http_get(&metrics_addr, "/metrics");
    let skew =
        quire_testkit::harness::metric_sum(&text, "quire_proxy_metadata_clock_skew_seconds", &[]);
    assert!((3590.0..3610.0).contains(&skew), "skew {skew}: {text}");
    assert!(
        b.stderr
            .lock()
            .unwrap()
            .contains("wall clock disagrees with the metadata store"),
        "B logs the skew"
    );
    // A few more lifecycle checks (one a second) must not delete more: a negative check, so
    // it can only wait.
    std::thread::sleep(Duration::from_millis(3500));
    let m = rt.block_on(store.read_stream("skew/s")).unwrap().value;
    assert_eq!(m.segments[0].seq_no, seqs[1], "{:?}", m.segments);
    let got = rt.block_on(read_all(&b.addr, "skew/s"));
    let mut expected: Vec<_> = acked
        .iter()
        .chain(&more)
        .filter(|(d, _)| d.segment_seq_no >= seqs[1])
        .cloned()
        .collect();
    expected.sort();
    assert!(got == expected, "the kept segments' records read back");
    b.stop();
}

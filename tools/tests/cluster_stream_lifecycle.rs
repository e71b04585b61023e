//! Goal: the stream admin commands work the same against a ZooKeeper cluster as against the
//! sandbox, through any proxy: `quire stream truncate` sent to a proxy that does not own the
//! stream is carried out by the owner (redirect), leaves exactly the records from the point on
//! readable and deletes the whole segments before it with their ledgers' znodes; `quire stream
//! delete` removes the stream and every segment's ledger znode; size retention set with `quire
//! stream retention` deletes the oldest segments; `quire stream list` and `show` agree.
//! Method: real ZooKeeper (quire-testkit), three `quire bookie` and two `quire proxy` children,
//! records written with `ProxyClient`, admin commands as `quire` child processes, ledger
//! metadata read back from ZooKeeper with `ZkStore`.

mod common;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::checker::{read_all, write_records};
use common::cluster::{Cluster, SESSION_TIMEOUT_MS};
use quire_metadata::{MetadataStore, ZkStore};
use quire_wire::LedgerId;

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Bytes of entry-log files (`entrylog-*.qel`, docs/format/entry-log.md) under bookie `i`'s
/// ledger directory (one subdirectory per shard).
fn entry_log_bytes(cluster: &Cluster, i: usize) -> u64 {
    fn sum(dir: &std::path::Path) -> u64 {
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let meta = e.metadata().unwrap();
            if meta.is_dir() {
                n += sum(&e.path());
            } else if name.starts_with("entrylog-") && name.ends_with(".qel") {
                n += meta.len();
            }
        }
        n
    }
    sum(&cluster.ledger_dir(i))
}

/// Every bookie's entry-log bytes once checkpoints have moved every acknowledged entry into
/// entry logs: the same non-zero figures on three readings 500 ms apart (checkpoints every
/// 200 ms).
fn settled_entry_log_bytes(cluster: &Cluster) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let read = || {
        (0..3)
            .map(|i| entry_log_bytes(cluster, i))
            .collect::<Vec<_>>()
    };
    let mut last = read();
    let mut same = 0;
    while same < 2 {
        assert!(
            Instant::now() < deadline,
            "entry logs did not settle: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
        let now = read();
        same = if now == last && now.iter().all(|&b| b > 0) {
            same + 1
        } else {
            0
        };
        last = now;
    }
    last
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
    let _bookies: Vec<_> = (0..3)
        .map(|i| cluster.start_bookie_with(i, quire_testkit::free_port(), &gc_flags))
        .collect();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let flags = ["--segment-size-bytes", "4096", "--entry-size-bytes", "1024"];
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
        rt.block_on(async { Arc::new(quire_proxy::ProxyClient::connect(&a.addr).await.unwrap()) });
    let (acked, err) = rt.block_on(write_records(&client, "zk/t", "t", 0..1000));
    assert!(err.is_none(), "{err:?}");

    // Truncate through B, which does not own the stream: A does it.
    let doc = json(&cluster.stream_admin_ok(&b.addr, &["stream", "show", "zk/t", "--json"]));
    assert_eq!(doc["owner"], a.addr.as_str());
    let segs = ledgers_of(&doc);
    assert!(segs.len() >= 4, "{doc}");
    let point = acked[700].0;
    let before_truncate = settled_entry_log_bytes(&cluster);
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
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now: Vec<u64> = (0..3).map(|i| entry_log_bytes(&cluster, i)).collect();
        if now.iter().zip(&before_truncate).all(|(n, b)| n < b) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "entry-log bytes did not go down on every bookie within 30 s: before {before_truncate:?}, now {now:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        rt.block_on(read_all(&a.addr, "zk/t")) == expected,
        "records after bookie GC"
    );

    // Size retention through B as well.
    cluster.stream_admin_ok(
        &b.addr,
        &["stream", "retention", "zk/t", "--size-bytes", "3000"],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let doc = json(&cluster.stream_admin_ok(&a.addr, &["stream", "show", "zk/t", "--json"]));
        let completed: u64 = doc["metadata"]["segments"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["state"] == "Completed")
            .map(|s| s["length_bytes"].as_u64().unwrap())
            .sum();
        if completed <= 3000 {
            let kept = ledgers_of(&doc);
            let first = kept[0].0;
            let got = rt.block_on(read_all(&a.addr, "zk/t"));
            let expected: Vec<_> = expected
                .iter()
                .filter(|(d, _)| d.segment_seq_no >= first)
                .cloned()
                .collect();
            assert!(got == expected, "records after size retention");
            rt.block_on(async {
                for (seq, id) in &segs {
                    assert_eq!(exists(&store, *id).await, *seq >= first, "ledger {id}");
                }
            });
            break;
        }
        assert!(
            Instant::now() < deadline,
            "size retention did not act: {doc}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Delete through B; the stream and every ledger znode go; the name is free again.
    let doc = json(&cluster.stream_admin_ok(&a.addr, &["stream", "show", "zk/t", "--json"]));
    let kept = ledgers_of(&doc);
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
    let (again, err) = rt.block_on(write_records(&client, "zk/t", "again", 0..5));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(
        again.iter().map(|a| a.0).min(),
        Some(quire_proxy::Dlsn::new(1, 0, 0))
    );
    assert_eq!(rt.block_on(read_all(&a.addr, "zk/t")).len(), 5);
}

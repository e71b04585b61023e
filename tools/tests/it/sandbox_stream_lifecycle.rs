//! Goal: the stream admin commands of issue 9 work end to end on a real sandbox: `quire stream
//! truncate` makes everything before the DLSN unreadable and deletes the whole segments before
//! it, `quire stream delete` removes a stream that is being written and frees its name, and
//! `quire stream retention` by size and by time deletes the oldest completed segments; after
//! each, the records still readable are exactly the expected suffix, no older record is, and
//! the embedded store holds the ledger metadata of the remaining segments and nothing else.
//! After truncation, size retention, time retention and deletion alike, every bookie's garbage
//! collection tombstones the deleted ledgers and its entry-log bytes go down, and the kept
//! records still read back exactly (`quire_testkit::reclaim`).
//! After the truncate, once every bookie's GC dropped the deleted segments' ledgers, the
//! sandbox's `/metrics` shows it per bookie: GC runs > 0, ledgers deleted >= the 2 deleted
//! segments (E = Qw = 3: every bookie held both), bytes reclaimed > 0, and live bytes no more
//! than the entry-log bytes. `quire stream show` prints the stream's last txid (text and JSON).
//! Method: a `quire sandbox` child (3 bookies, small segments, 1 s time rolling, a cluster
//! default size retention too large to matter), `quire write` / `quire read` / `quire stream`
//! child processes, and the sandbox's `metadata.json` read between steps.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use quire_testkit::harness::*;
use quire_testkit::reclaim;

fn lines(prefix: &str, n: usize) -> Vec<Vec<u8>> {
    // 100-byte records, so that a few thousand span several 64 KiB segments.
    (0..n)
        .map(|i| format!("{prefix}-{i:06}-{}", "x".repeat(90)).into_bytes())
        .collect()
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn joined(recs: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in recs {
        out.extend_from_slice(r);
        out.push(b'\n');
    }
    out
}

fn ok(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn show(sandbox: &Sandbox, stream: &str) -> serde_json::Value {
    serde_json::from_str(&ok(sandbox.quire(&["stream", "show", stream, "--json"]))).unwrap()
}

fn segments(doc: &serde_json::Value) -> Vec<serde_json::Value> {
    doc["metadata"]["segments"].as_array().unwrap().clone()
}

/// Ledger ids with metadata in the sandbox's embedded store.
fn stored_ledgers(sandbox: &Sandbox) -> BTreeSet<u64> {
    let path = sandbox.data_dir.join("metadata/metadata.json");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    doc["ledgers"]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.parse().unwrap())
        .collect()
}

/// The ledger ids of every segment of every stream.
fn referenced_ledgers(sandbox: &Sandbox) -> BTreeSet<u64> {
    let names = ok(sandbox.quire(&["stream", "list"]));
    let mut out = BTreeSet::new();
    for name in names.lines() {
        for s in segments(&show(sandbox, name)) {
            out.insert(s["ledger_id"].as_u64().unwrap());
        }
    }
    out
}

/// Records of the stream's current segments (the proxy owns them all, so the open one counts
/// what is acknowledged).
fn records_kept(doc: &serde_json::Value) -> usize {
    segments(doc)
        .iter()
        .map(|s| s["record_count"].as_u64().unwrap() as usize)
        .sum()
}

fn read(sandbox: &Sandbox, stream: &str) -> Vec<u8> {
    ok(sandbox.quire(&["read", stream])).into_bytes()
}

/// Each bookie's ledger directory (`bookie-{i}/ledgers`, one subdirectory per shard).
fn ledger_dirs(sandbox: &Sandbox) -> Vec<PathBuf> {
    (1..=3)
        .map(|i| sandbox.data_dir.join(format!("bookie-{i}/ledgers")))
        .collect()
}

/// Every bookie's entry-log bytes once checkpoints (every 200 ms) have moved the written
/// entries into entry logs: the same figures on three readings 500 ms apart.
fn settled(sandbox: &Sandbox) -> Vec<u64> {
    reclaim::settled_entry_log_bytes(
        &ledger_dirs(sandbox),
        Duration::from_millis(500),
        3,
        Duration::from_secs(30),
    )
}

/// Waits until every bookie's GC has tombstoned `deleted` and its entry-log bytes went below
/// `before` (whole logs deleted, shared ones compacted).
fn reclaimed(sandbox: &Sandbox, before: &[u64], deleted: &BTreeSet<u64>) {
    assert!(!deleted.is_empty());
    reclaim::wait_until_reclaimed(
        &ledger_dirs(sandbox),
        before,
        deleted,
        Duration::from_secs(30),
    );
}

/// Ledger ids of the stream's segments numbered below `seq`.
fn ledgers_before(doc: &serde_json::Value, seq: u64) -> BTreeSet<u64> {
    segments(doc)
        .iter()
        .filter(|s| s["seq_no"].as_u64().unwrap() < seq)
        .map(|s| s["ledger_id"].as_u64().unwrap())
        .collect()
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: not within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn truncate_delete_and_retention_through_the_cli() {
    let dir = temp_dir();
    let mut flags = SMALL_SEGMENTS.to_vec();
    // Bookie GC every second with a major compaction due at each run, 64 KiB entry logs and
    // 200 ms checkpoints. Why: only whole entry logs other than the one being appended to are
    // deleted or compacted, and with the 1 GiB default every entry of this test would sit in
    // each bookie's single current log, so its disk use could never go down; and the deleted
    // ledgers' entries share logs with kept ones, so those logs shrink only by compaction.
    flags.extend([
        "--gc-interval-secs",
        "1",
        "--major-compaction-interval-secs",
        "1",
        "--entry-log-size-bytes",
        "65536",
        "--checkpoint-interval-ms",
        "200",
    ]);
    flags.extend([
        "--segment-roll-secs",
        "1",
        "--retention-size-bytes",
        "1000000000000",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let sandbox = Sandbox::start(&dir.path().join("s"), &flags);
    let maddr = sandbox
        .metrics_addr
        .clone()
        .expect("the sandbox prints its metrics address");

    // Truncate.
    let t = lines("t", 3000);
    let before_ms = unix_ms();
    ok(sandbox.quire_stdin(&["write", "t"], &joined(&t)));
    let after_ms = unix_ms();
    let doc = show(&sandbox, "t");
    // The last txid (what the txid guard compares the next write with): `quire write` gives
    // records wall-clock milliseconds, so it lies within the write's time.
    let last_txid = doc["last_txid"].as_u64().expect("last_txid");
    assert!((before_ms..=after_ms).contains(&last_txid), "{doc}");
    let text = ok(sandbox.quire(&["stream", "show", "t"]));
    assert!(
        text.contains(&format!("last txid: {last_txid}\n")),
        "{text}"
    );
    let segs = segments(&doc);
    assert!(segs.len() >= 4, "{doc}");
    let before_3: usize = segs
        .iter()
        .take_while(|s| s["seq_no"].as_u64().unwrap() < 3)
        .map(|s| s["record_count"].as_u64().unwrap() as usize)
        .sum();
    let truncated = ledgers_before(&doc, 3);
    let before_truncate = settled(&sandbox);
    let out = ok(sandbox.quire(&["stream", "truncate", "t", "3:0:0"]));
    assert!(
        out.contains("truncated before 3:0:0: 2 segments deleted"),
        "{out}"
    );
    assert!(
        read(&sandbox, "t") == joined(&t[before_3..]),
        "read after truncate"
    );
    let out = sandbox.quire(&["read", "t", "--from", "2:0:0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("TRUNCATED (511)"),
        "{err}"
    );
    let out = sandbox.quire(&["stream", "truncate", "t", "99:0:0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("beyond its end"),
        "{err}"
    );
    let out = ok(sandbox.quire(&["stream", "truncate", "t", "1:0:0"]));
    assert!(out.contains("already truncated before 3:0:0"), "{out}");
    let text = ok(sandbox.quire(&["stream", "show", "t"]));
    assert!(text.contains("truncated before: 3:0:0"), "{text}");
    assert!(
        text.contains("1000000000000 bytes (cluster default)"),
        "{text}"
    );
    assert_eq!(stored_ledgers(&sandbox), referenced_ledgers(&sandbox));
    // Every bookie's GC finds the two deleted ledgers gone from the metadata store and drops
    // their entries: its entry logs shrink (whole logs deleted, shared ones compacted), while
    // the read below the truncation point still returns exactly the kept suffix.
    reclaimed(&sandbox, &before_truncate, &truncated);
    assert!(
        read(&sandbox, "t") == joined(&t[before_3..]),
        "read after bookie GC"
    );
    // The same GC as the bookies' metrics show it (published every 500 ms, hence the wait).
    let gc_figures = |text: &str, bookie: &str| {
        let l = [("bookie", bookie)];
        (
            metric_sum(text, "bookie_gc_runs_total", &l),
            metric_sum(text, "bookie_DELETED_LEDGER_TOTAL_total", &l),
            metric_sum(text, "bookie_RECLAIMED_DELETION_SPACE_BYTES_total", &l)
                + metric_sum(text, "bookie_RECLAIMED_COMPACTION_SPACE_BYTES_total", &l),
        )
    };
    let mut text = String::new();
    wait_for("the bookies' GC metrics show the truncate", || {
        let (status, body) = http_get(&maddr, "/metrics");
        assert_eq!(status, 200);
        text = body;
        (1..=3).all(|b| {
            let (runs, deleted, reclaimed) = gc_figures(&text, &format!("bookie-{b}"));
            runs > 0.0 && deleted >= 2.0 && reclaimed > 0.0
        })
    });
    for b in 1..=3 {
        let label = format!("bookie-{b}");
        let l = [("bookie", label.as_str())];
        assert_eq!(
            metric_sum(&text, "bookie_gc_failed_runs_total", &l),
            0.0,
            "{label}"
        );
        let log_bytes = metric_sum(&text, "bookie_ACTIVE_ENTRY_LOG_SPACE_BYTES", &l);
        let live = metric_sum(&text, "bookie_entry_log_live_bytes", &l);
        assert!(
            log_bytes > 0.0 && live > 0.0 && live <= log_bytes,
            "{label}: {live} live bytes in {log_bytes} entry-log bytes"
        );
        assert!(metric_sum(&text, "bookie_ACTIVE_ENTRY_LOG_TOTAL", &l) >= 1.0);
    }

    // Delete while a writer is writing, then reuse the name.
    let d = lines("d", 20_000);
    let writer = {
        let addr = sandbox.addr.clone();
        let input = joined(&d);
        std::thread::spawn(move || {
            use std::io::Write;
            let mut child = std::process::Command::new(quire_bin())
                .args(["write", "d", "--proxy", &addr])
                .env_remove("QUIRE_PROXY")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            // The writer may stop early (its batch failed after the delete): a broken pipe.
            let _ = child.stdin.take().unwrap().write_all(&input);
            child.wait_with_output().unwrap()
        })
    };
    wait_for("stream d exists", || {
        ok(sandbox.quire(&["stream", "list"]))
            .lines()
            .any(|l| l == "d")
    });
    let out = ok(sandbox.quire(&["stream", "delete", "d"]));
    assert!(out.contains("stream d deleted"), "{out}");
    // `quire write` sends every batch with the create flag, so batches after the delete
    // recreate the stream from scratch: it then holds a suffix of the input starting at a
    // later batch, from segment 1, and none of the records from before the delete.
    // A batch queued behind the delete fails with NO_SUCH_STREAM (documented), which ends
    // `quire write`; otherwise it finished.
    let w = writer.join().unwrap();
    let err = String::from_utf8_lossy(&w.stderr);
    assert!(
        w.status.success() || err.contains("NO_SUCH_STREAM"),
        "{err}"
    );
    let listed = ok(sandbox.quire(&["stream", "list"]));
    if listed.lines().any(|l| l == "d") {
        let doc = show(&sandbox, "d");
        assert_eq!(segments(&doc)[0]["seq_no"], 1, "{doc}");
        let got = read(&sandbox, "d");
        let n = got.iter().filter(|&&b| b == b'\n').count();
        assert!(n < d.len(), "records from before the delete survived it");
        assert!(
            got == joined(&d[d.len() - n..]),
            "the recreated stream is a suffix of the input"
        );
        ok(sandbox.quire(&["stream", "delete", "d"]));
    }
    let out = sandbox.quire(&["stream", "show", "d"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("NO_SUCH_STREAM"));
    assert_eq!(stored_ledgers(&sandbox), referenced_ledgers(&sandbox));
    let again = lines("again", 10);
    let out = ok(sandbox.quire_stdin(&["write", "d"], &joined(&again)));
    assert!(
        out.starts_with("wrote 10 records to d: first 1:0:0, last 1:0:9"),
        "{out}"
    );
    assert!(read(&sandbox, "d") == joined(&again));

    // Retention by size: the per-stream override wins over the cluster default. The stream
    // is written first under the (too large to matter) default, so that the bookies' entry
    // logs can be measured before retention deletes anything.
    let z = lines("z", 5000);
    ok(sandbox.quire_stdin(&["write", "z"], &joined(&z)));
    let out = sandbox.quire(&["stream", "retention", "z", "--size-bytes", "0"]);
    assert!(!out.status.success());
    let written = show(&sandbox, "z");
    assert_eq!(segments(&written)[0]["seq_no"], 1, "{written}");
    let before_retention = settled(&sandbox);
    let out = ok(sandbox.quire(&["stream", "retention", "z", "--size-bytes", "100000"]));
    assert!(
        out.contains("retention size: 100000 bytes (stream)"),
        "{out}"
    );
    wait_for("size retention", || {
        let completed: u64 = segments(&show(&sandbox, "z"))
            .iter()
            .filter(|s| s["state"] == "Completed")
            .map(|s| s["length_bytes"].as_u64().unwrap())
            .sum();
        completed <= 100_000
    });
    let doc = show(&sandbox, "z");
    let kept = records_kept(&doc);
    assert!(kept < z.len() && kept > 0, "{doc}");
    assert!(
        read(&sandbox, "z") == joined(&z[z.len() - kept..]),
        "read after size retention"
    );
    let out = sandbox.quire(&["read", "z", "--from", "1:0:0"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("TRUNCATED"));
    // Retention updates the stream record first and deletes the ledgers' metadata after.
    wait_for("retained-away ledgers' metadata deleted", || {
        stored_ledgers(&sandbox) == referenced_ledgers(&sandbox)
    });
    let first_kept = segments(&doc)[0]["seq_no"].as_u64().unwrap();
    reclaimed(
        &sandbox,
        &before_retention,
        &ledgers_before(&written, first_kept),
    );
    assert!(
        read(&sandbox, "z") == joined(&z[z.len() - kept..]),
        "read after bookie GC"
    );

    // Delete (of a stream not being written): its ledgers' metadata goes with it, then every
    // bookie's GC drops their entries.
    let x = lines("x", 3000);
    ok(sandbox.quire_stdin(&["write", "x"], &joined(&x)));
    let doc = show(&sandbox, "x");
    let all_x = ledgers_before(&doc, u64::MAX);
    assert!(all_x.len() >= 4, "{doc}");
    let before_delete = settled(&sandbox);
    let out = ok(sandbox.quire(&["stream", "delete", "x"]));
    assert!(out.contains("stream x deleted"), "{out}");
    assert!(stored_ledgers(&sandbox).is_disjoint(&all_x));
    reclaimed(&sandbox, &before_delete, &all_x);
    let out = sandbox.quire(&["read", "x"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("NO_SUCH_STREAM"));
    for (name, recs) in [("t", &t[before_3..]), ("z", &z[z.len() - kept..])] {
        assert!(
            read(&sandbox, name) == joined(recs),
            "{name} after deleting x"
        );
    }

    // Retention by time, with time rolling: the first records (about 100 KB, more than one
    // 64 KiB entry log, so that a whole log can go) fill two segments by size and the last
    // rolls by itself (1 s); the next records are written 3 s later; with 15 s retention the
    // first segments go while the last stays (15 s leave time to measure the entry logs in
    // between).
    ok(sandbox.quire(&["write", "a"]));
    ok(sandbox.quire(&["stream", "retention", "a", "--time-secs", "15"]));
    let a1 = lines("a1", 1000);
    ok(sandbox.quire_stdin(&["write", "a"], &joined(&a1)));
    wait_for("time roll", || {
        segments(&show(&sandbox, "a"))
            .iter()
            .all(|s| s["state"] == "Completed")
    });
    let rolled = segments(&show(&sandbox, "a")).len();
    assert!(rolled >= 2, "{rolled} segments");
    std::thread::sleep(Duration::from_secs(3));
    // Idle: no further (empty) segment was started.
    assert_eq!(segments(&show(&sandbox, "a")).len(), rolled);
    let a2 = lines("a2", 100);
    ok(sandbox.quire_stdin(&["write", "a"], &joined(&a2)));
    let a_doc = show(&sandbox, "a");
    let a2_seq = segments(&a_doc).last().unwrap()["seq_no"].as_u64().unwrap();
    let expiring = ledgers_before(&a_doc, a2_seq);
    assert_eq!(expiring.len(), rolled);
    let before_expiry = settled(&sandbox);
    assert_eq!(
        segments(&show(&sandbox, "a"))[0]["seq_no"],
        1,
        "segment 1 expired before the entry logs were measured"
    );
    wait_for("time retention", || {
        segments(&show(&sandbox, "a"))[0]["seq_no"]
            .as_u64()
            .unwrap()
            == a2_seq
    });
    assert!(
        read(&sandbox, "a") == joined(&a2),
        "read after time retention"
    );
    // Retention updates the stream record first and deletes the ledgers' metadata after.
    wait_for("retained-away ledgers' metadata deleted", || {
        stored_ledgers(&sandbox) == referenced_ledgers(&sandbox)
    });
    reclaimed(&sandbox, &before_expiry, &expiring);
    assert!(read(&sandbox, "a") == joined(&a2), "read after bookie GC");
    let out = ok(sandbox.quire(&["stream", "retention", "a", "--time-secs", "default"]));
    assert!(out.contains("retention time: none"), "{out}");
    sandbox.stop();
}

//! Goal: deleting a stream on a sandbox with the default entry-log settings gives its space back
//! within two GC intervals (issue 27 item 4): at least 90 % of the bytes its replicas took in
//! the bookies' ledger directories. Before, nothing came back from the entry log being appended
//! to until it rolled (1 GiB per shard), so all of it stayed.
//! Method: a `quire sandbox` child (3 bookies, default entry-log size and roll floor; GC every
//! 3 s and checkpoints every second, so that the replicas reach the entry logs quickly); 12 MB
//! of records written with `quire write`; the disk use (allocated blocks) of every file under
//! the ledger directories measured before the write, once it settled after it, and after
//! `quire stream delete`, polled until the bytes come back or two GC intervals passed.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use quire_testkit::harness::*;

const GC_INTERVAL: Duration = Duration::from_secs(3);

/// Bytes allocated to every file under `dir`, recursively (what `du` counts).
fn disk_use(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .map(|e| e.unwrap())
        .map(|e| {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                disk_use(&e.path())
            } else {
                m.blocks() * 512
            }
        })
        .sum()
}

/// The disk use of every bookie's ledger directory together.
fn ledger_dirs_use(data_dir: &Path) -> u64 {
    (1..=3)
        .map(|i| disk_use(&data_dir.join(format!("bookie-{i}/ledgers"))))
        .sum()
}

fn ok(out: std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn deleting_a_stream_frees_its_replicas_bytes_within_two_gc_intervals() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::start(
        dir.path(),
        &[
            "--gc-interval-secs",
            &GC_INTERVAL.as_secs().to_string(),
            "--checkpoint-interval-ms",
            "1000",
        ],
    );
    let baseline = ledger_dirs_use(dir.path());
    let mut records = Vec::with_capacity(12 << 20);
    for i in 0..12_000 {
        records.extend_from_slice(format!("{i:08}-{}\n", "y".repeat(1014)).as_bytes());
    }
    ok(sandbox.quire_stdin(&["write", "gc/big"], &records));
    // Settled: the replicas are checkpointed into the entry logs (two equal readings).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = 0;
    let peak = loop {
        std::thread::sleep(Duration::from_millis(1500));
        let now = ledger_dirs_use(dir.path());
        if now == last && now > baseline + (12 << 20) {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "never settled: {baseline} -> {now}"
        );
        last = now;
    };
    let replicas = peak - baseline;
    ok(sandbox.quire(&["stream", "delete", "gc/big"]));
    let deleted_at = Instant::now();
    let freed = loop {
        let freed = peak.saturating_sub(ledger_dirs_use(dir.path()));
        if freed * 10 >= replicas * 9 {
            break freed;
        }
        assert!(
            deleted_at.elapsed() < 2 * GC_INTERVAL,
            "after two GC intervals {freed} of the replicas' {replicas} bytes are free \
             (ledger directories {baseline} -> {peak} -> {})",
            peak - freed
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "freed {freed} of {replicas} bytes in {:?}",
        deleted_at.elapsed()
    );
    sandbox.stop();
}

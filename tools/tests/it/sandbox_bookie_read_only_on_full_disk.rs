//! Goal: in the sandbox, a bookie whose ledger disk fills turns read-only and the stream layer
//! writes on: every record written before, during and after the transition is acknowledged and
//! reads back exactly once and in order, and segment ledgers created afterwards never name the
//! read-only bookie (here both its read-only registration and the proxy client's quarantine of
//! a bookie that refused adds keep it out); a sandbox restarted on the full disk registers it
//! read-only from the start and places no new ledger on it (only its registration can say so:
//! the new client never saw it fail); once space is freed it is registered writable and takes
//! adds.
//! Method: `quire sandbox` with 4 bookies (E=3, Qw=3, Qa=2), 2 KiB segments so that they roll
//! often, and a 200 ms disk check; bookie 1's ledger directory is a 32 MiB loop-mounted ext4
//! image (needs root, as engine/tests/it/full_disk.rs), filled to 100 % mid-test. Records go
//! through `ProxyClient`; the transition is seen as an add answered `ReadOnly` on bookie 1's
//! wire protocol (a probe ledger no segment uses); ensembles are read from the sandbox's
//! `metadata.json` (docs/format/metadata.md).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quire_client::ProxyClient;
use quire_metadata::LedgerMetadata;
use quire_testkit::harness::checker::{read_all, write_records};
use quire_testkit::harness::wire::{Answer, Wire};
use quire_testkit::harness::{temp_dir, Sandbox};
use quire_testkit::loop_mount::{fill_file, LoopMount};
use quire_wire::bookie::Status;

/// A ledger id no segment gets in this test (the sandbox hands ids out from 1): a writable
/// bookie refuses adds to it (no metadata), a read-only one answers `ReadOnly` first.
const PROBE_LEDGER: u64 = 1 << 60;
/// A guard against a hang, not a timing check.
const WAIT_MAX: Duration = Duration::from_secs(60);

/// Every ledger's metadata in the sandbox's metadata store, by ledger id.
fn ledgers(data_dir: &Path) -> BTreeMap<u64, LedgerMetadata> {
    let text = std::fs::read(data_dir.join("metadata/metadata.json")).expect("metadata.json");
    let doc: serde_json::Value = serde_json::from_slice(&text).expect("metadata.json is JSON");
    doc["ledgers"]
        .as_object()
        .expect("ledgers map")
        .iter()
        .map(|(id, v)| {
            let meta: LedgerMetadata =
                serde_json::from_value(v[0].clone()).expect("ledger metadata");
            (id.parse().expect("ledger id"), meta)
        })
        .collect()
}

#[test]
fn stream_writes_go_around_a_bookie_whose_disk_fills() {
    let dir = temp_dir();
    let data = dir.path().join("sandbox");
    // The whole sandbox on a disk of its own, so that the host disk's usage (shared, not this
    // test's to control) never turns a bookie read-only; bookie 1's ledgers on a small one
    // inside it.
    let _sandbox_mount = LoopMount::new_at(512 << 20, &data);
    let mount = LoopMount::new_at(32 << 20, &data.join("bookie-1/ledgers"));
    // 2 KiB segments: a hundred-odd records each, so that many segments roll in the test.
    let flags = [
        "--bookies",
        "4",
        "--disk-check-interval-ms",
        "200",
        // Thresholds: the filled loop disk reaches 100 %, the sandbox's own stays far below.
        "--disk-usage-threshold",
        "0.99",
        "--disk-usage-lwm-threshold",
        "0.98",
        "--segment-size-bytes",
        "2048",
        "--entry-size-bytes",
        "1024",
        "--journal-file-size-bytes",
        "4194304",
    ];
    let sandbox = Sandbox::start(&data, &flags);
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("sandbox.json")).unwrap()).unwrap();
    let bookie1 = record["bookies"][0].as_str().unwrap().to_string();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = Arc::new(rt.block_on(ProxyClient::connect(&sandbox.addr)).unwrap());
    let mut acked = Vec::new();
    let (a, err) = rt.block_on(write_records(&client, "s", "before", 0..400));
    assert!(err.is_none(), "write before the disk filled: {err:?}");
    acked.extend(a);

    fill_file(&mount.path().join("filler"));
    let mut probe = Wire::connect_with(
        &bookie1,
        &quire_testkit::harness::sandbox_cluster_secret(&data),
    );
    let deadline = Instant::now() + WAIT_MAX;
    let mut entry = 0;
    loop {
        match probe.add(PROBE_LEDGER, entry, false) {
            Answer::Failed(Status::ReadOnly) => break,
            // The read-only check comes first; a writable bookie refuses the probe, whose
            // ledger the metadata store lacks (docs/protocol.md §Add, "When a key binds").
            other => assert_eq!(
                other,
                Answer::Failed(Status::Unauthorized),
                "probe add on bookie 1"
            ),
        }
        entry += 1;
        assert!(Instant::now() < deadline, "bookie 1 never turned read-only");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The registration follows the state asynchronously; a ledger created in that short
    // window may still name bookie 1 (then its first adds are refused and it is replaced), so
    // the check below starts at ledgers created after more writes.
    let (a, err) = rt.block_on(write_records(&client, "s", "during", 0..200));
    assert!(
        err.is_none(),
        "write while bookie 1 turns read-only: {err:?}"
    );
    acked.extend(a);
    let first_after = ledgers(&data).keys().max().copied().unwrap_or(0) + 1;
    let (a, err) = rt.block_on(write_records(&client, "s", "after", 0..600));
    assert!(err.is_none(), "write with bookie 1 read-only: {err:?}");
    acked.extend(a);

    let all = ledgers(&data);
    let later: Vec<(&u64, &LedgerMetadata)> = all.range(first_after..).collect();
    assert!(
        !later.is_empty(),
        "segments rolled after bookie 1 turned read-only"
    );
    for (id, meta) in &later {
        for f in &meta.fragments {
            assert!(
                f.bookies.iter().all(|b| b.0 != bookie1),
                "ledger {id}, created after bookie 1 turned read-only, names it: {:?}",
                meta.fragments
            );
        }
    }

    // Everything acknowledged reads back, once, in DLSN order, at its acknowledged DLSN
    // (writes in flight together may be acknowledged in any order).
    let read = rt.block_on(read_all(&sandbox.addr, "s"));
    acked.sort_by_key(|(d, _)| *d);
    assert_eq!(read.len(), acked.len(), "records read back");
    assert!(
        read == acked,
        "records read back differ from those acknowledged"
    );

    drop(probe);
    drop(client);

    // A sandbox started on the full disk: bookie 1 starts read-only and is registered so, and
    // it must not be placed in a new ledger. With E = 4 of 4 bookies no new ledger can be
    // placed at all, so a write to a new stream fails; once space is freed the sandbox marks
    // bookie 1 writable and the same write goes through, with bookie 1 in the ensemble. (A
    // client that saw a bookie fail sorts it last when placing, so this cannot be shown in
    // the first sandbox, whose client saw bookie 1's ReadOnly answers.) The recovery of
    // stream s's open segment at start fences and re-adds on the read-only bookie 1.
    sandbox.kill();
    let mut flags4 = flags.to_vec();
    flags4.extend(["--ensemble-size", "4"]);
    let sandbox = Sandbox::start(&data, &flags4);
    let client = Arc::new(rt.block_on(ProxyClient::connect(&sandbox.addr)).unwrap());
    let (a, err) = rt.block_on(write_records(&client, "t", "full", 0..1));
    assert!(
        a.is_empty() && err.is_some(),
        "a new E=4 ledger was placed with bookie 1 read-only"
    );
    eprintln!(
        "write to a new stream with bookie 1 read-only: {}",
        err.unwrap()
    );
    let read = rt.block_on(read_all(&sandbox.addr, "s"));
    assert!(read == acked, "stream s after the restart on the full disk");

    std::fs::remove_file(mount.path().join("filler")).unwrap();
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let (a, err) = rt.block_on(write_records(&client, "t", "freed", 0..1));
        if err.is_none() {
            assert_eq!(a.len(), 1);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "bookie 1 never became writable again: {err:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (a, err) = rt.block_on(write_records(&client, "t", "more", 0..100));
    assert!(
        err.is_none() && a.len() == 100,
        "writes after freeing space: {err:?}"
    );
    let newest = ledgers(&data).into_iter().next_back().expect("a ledger").1;
    assert!(
        newest.fragments[0].bookies.iter().any(|b| b.0 == bookie1),
        "the E=4 ledger uses bookie 1: {:?}",
        newest.fragments
    );
    drop(client);
    drop(rt);
    sandbox.stop();
    drop(mount);
}

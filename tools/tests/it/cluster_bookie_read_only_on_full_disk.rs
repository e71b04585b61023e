//! Goal: read-only mode of a real `quire bookie` process (BookKeeper's `diskUsageThreshold`,
//! `LedgerDirsMonitor`, `available/readonly` registration). When its ledger disk passes the
//! usage threshold the bookie moves its registration to `readonly/`, answers adds (to an
//! existing or a new ledger) `ReadOnly`, and keeps serving reads, fences and recovery adds; a
//! bookie whose disk is completely full starts again after a crash, comes up read-only and
//! serves reads; once space is freed it is writable again, registered under `available/`, and
//! takes adds.
//! Method: real ZooKeeper (quire-testkit), one `quire bookie` child on 127.0.0.1 whose ledger
//! directory is a 32 MiB loop-mounted ext4 image (needs root, as engine/tests/it/full_disk.rs) and
//! whose disk monitor measures every 200 ms; its journal is on a 64 MiB image of its own. The image is filled to
//! 100 % by a filler file, and the filler removed later. Requests go over the bookie wire
//! protocol; the registration is read with `quire bookie list --json`.

use std::time::{Duration, Instant};

use quire_metadata::MetadataStore;
use quire_testkit::harness::cluster::Cluster;
use quire_testkit::harness::wire::{
    create_ledger_metadata, entry_bytes, entry_with_payload, Answer, Wire, KEY,
};
use quire_testkit::loop_mount::{fill_file, LoopMount};
use quire_wire::bookie::{Request, Status};
use quire_wire::LedgerId;

/// A guard against a hang, not a timing check.
const WAIT_MAX: Duration = Duration::from_secs(60);

/// The `read_only` flag of the only registered bookie, `None` while none is registered.
fn registered_read_only(cluster: &Cluster) -> Option<bool> {
    let text = cluster.admin_ok(&["bookie", "list", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    listed.as_array()?.first()?["read_only"].as_bool()
}

fn wait_for(what: &str, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT_MAX;
    while !pred() {
        assert!(Instant::now() < deadline, "never saw: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Thresholds: the filled loop disk reaches 100 %; the journal's holds a few 4 MiB files.
const DISK_FLAGS: [&str; 6] = [
    "--disk-check-interval-ms",
    "200",
    "--disk-usage-threshold",
    "0.99",
    "--disk-usage-lwm-threshold",
    "0.98",
];

/// Bookie 0's disks: a 32 MiB ledger disk and a 64 MiB journal disk of its own, so that the
/// host disk's usage (shared, not this test's to control) never decides the bookie's mode;
/// and a free port with its address.
fn small_disks(cluster: &Cluster) -> (LoopMount, LoopMount, u16, String) {
    let mount = LoopMount::new_at(32 << 20, &cluster.ledger_dir(0));
    let journal_mount = LoopMount::new_at(64 << 20, &cluster.journal_dir(0));
    let port = quire_testkit::free_port();
    (mount, journal_mount, port, format!("127.0.0.1:{port}"))
}

#[test]
fn full_ledger_disk_makes_the_bookie_read_only_until_space_is_freed() {
    let cluster = Cluster::start();
    let (mount, _journal_mount, port, addr) = small_disks(&cluster);
    let flags = DISK_FLAGS;
    let bookie = cluster.start_bookie_with(0, port, &flags);
    wait_for("the bookie registered writable", || {
        registered_read_only(&cluster) == Some(false)
    });
    // The bookie binds keys only for ledgers the metadata store holds.
    let rt = quire_testkit::harness::cluster::runtime();
    rt.block_on(async {
        let store = cluster.zk_store().await;
        for id in [1, 2] {
            create_ledger_metadata(&store, id, std::slice::from_ref(&addr)).await;
        }
    });

    let mut w = Wire::connect(&addr);
    for e in 0..10 {
        assert_eq!(w.add(1, e, false), Answer::Ok, "add 1/{e} on a roomy disk");
    }

    // Past the threshold (here: 100 %): read-only, registered under readonly/.
    let filler = mount.path().join("filler");
    fill_file(&filler);
    wait_for("the registration moved to readonly/", || {
        registered_read_only(&cluster) == Some(true)
    });
    assert_eq!(w.add(1, 10, false), Answer::Failed(Status::ReadOnly));
    assert_eq!(
        w.add(2, 0, false),
        Answer::Failed(Status::ReadOnly),
        "new ledger"
    );
    for e in 0..10 {
        assert_eq!(w.read(1, e), Answer::Data(entry_bytes(1, e)), "read 1/{e}");
    }
    // Recovery must work on a read-only bookie: fences and recovery adds are served.
    let fenced = w.call(&Request::Fence {
        ledger: LedgerId(1),
        master_key: KEY,
    });
    assert_eq!(fenced, Answer::Ok, "fence on a read-only bookie");
    assert_eq!(
        w.add(1, 10, true),
        Answer::Ok,
        "recovery add on a read-only bookie"
    );
    assert_eq!(w.add(1, 11, false), Answer::Failed(Status::ReadOnly));
    drop(w);

    // A crash on the full disk, then a start on it: read-only from the start, reads served.
    bookie.kill();
    // The killed incarnation's ephemeral registration lasts until its session expires; a new
    // one waits for that only up to about the session timeout, so let it expire first.
    wait_for("the killed bookie's registration expired", || {
        registered_read_only(&cluster).is_none()
    });
    let bookie = cluster.start_bookie_with(0, port, &flags);
    wait_for("the restarted bookie registered read-only", || {
        registered_read_only(&cluster) == Some(true)
    });
    let mut w = Wire::connect(&addr);
    for e in 0..=10 {
        assert_eq!(
            w.read(1, e),
            Answer::Data(entry_bytes(1, e)),
            "read 1/{e} after restart"
        );
    }
    assert_eq!(w.add(2, 0, false), Answer::Failed(Status::ReadOnly));

    // Space freed: writable again, registered under available/, adds taken.
    std::fs::remove_file(&filler).expect("remove filler");
    wait_for("the registration moved back to available/", || {
        registered_read_only(&cluster) == Some(false)
    });
    for e in 0..10 {
        assert_eq!(
            w.add(2, e, false),
            Answer::Ok,
            "add 2/{e} after freeing space"
        );
    }
    for e in 0..10 {
        assert_eq!(w.read(2, e), Answer::Data(entry_bytes(2, e)));
    }
    assert_eq!(
        w.add(1, 12, false),
        Answer::Failed(Status::Fenced),
        "the fence survived the crash"
    );
    drop(w);
    bookie.stop();
    drop(mount);
}

/// Entry `entry` of `ledger` with a 60 KiB payload, so that few adds fill a small disk.
fn big_entry(ledger: u64, entry: u64) -> Vec<u8> {
    entry_with_payload(
        ledger,
        entry,
        &vec![(ledger * 31 + entry) as u8 | 1; 60 << 10],
    )
}

/// Ledgers written over the wire in the item-1 test: ids allocated from the metadata store's
/// counter, with metadata while they are written (the bookie binds keys only for ledgers the
/// metadata store holds) that is deleted after, so once the bookie's GC has seen them in two
/// runs the metadata side answers "deleted", as for the ledgers of deleted or truncated
/// streams.
const FILLING_LEDGERS: u64 = 8;

/// Goal (issue 23 item 1): a bookie whose ledger disk its own entries filled to 100 %, and
/// which restarted on that full disk, frees the space of deleted ledgers by itself and becomes
/// writable again (registration back under `available/`, adds taken) once usage is below the
/// low-water mark: no file removed by hand (BookKeeper #1316, Redpanda #2166).
/// Method: one `quire bookie` (real ZooKeeper) with a 32 MiB loop-mounted ledger disk, 256 KiB
/// entry logs and 200 ms checkpoints; adds of 60 KiB entries to 8 ledgers until it answers
/// `ReadOnly` (threshold 0.99), then a filler takes the last free blocks (100 %). Crash, restart
/// on the full disk with a 1 s GC interval: it comes up read-only, and its GC finds the 8
/// ledgers gone from the metadata store (their metadata was deleted after the fill).
#[test]
fn full_bookie_frees_space_of_deleted_ledgers_and_turns_writable() {
    let cluster = Cluster::start();
    let (mount, _journal_mount, port, addr) = small_disks(&cluster);
    let mut flags = DISK_FLAGS.to_vec();
    flags.extend([
        "--entry-log-size-bytes",
        "262144",
        "--checkpoint-interval-ms",
        "200",
    ]);
    let rt = quire_testkit::harness::cluster::runtime();
    let ids: Vec<u64> = rt.block_on(async {
        let store = cluster.zk_store().await;
        let mut ids = Vec::new();
        for _ in 0..=FILLING_LEDGERS {
            let id = store.allocate_ledger_id().await.expect("allocate").0;
            create_ledger_metadata(&store, id, std::slice::from_ref(&addr)).await;
            ids.push(id);
        }
        ids
    });
    assert_eq!(ids, (1..=FILLING_LEDGERS + 1).collect::<Vec<u64>>());
    let bookie = cluster.start_bookie_with(0, port, &flags);
    wait_for("the bookie registered writable", || {
        registered_read_only(&cluster) == Some(false)
    });

    // The bookie's own entries fill its ledger disk.
    let mut w = Wire::connect(&addr);
    let mut added = 0u64;
    'fill: for entry in 0.. {
        for ledger in 1..=FILLING_LEDGERS {
            let data = big_entry(ledger, entry);
            let answer = w.call(&Request::Add {
                recovery: false,
                master_key: KEY,
                entry: &data,
            });
            match answer {
                Answer::Ok => added += 1,
                Answer::Failed(Status::ReadOnly) => break 'fill,
                // The journal shares the small disk: a journal roll can hit ENOSPC before the
                // usage check turns the bookie read-only; that add fails with IoError and the
                // failed write turns the bookie read-only at once (bookie/src/disk.rs).
                Answer::Failed(Status::IoError) => break 'fill,
                other => panic!("add {ledger}/{entry}: {other:?}"),
            }
            assert!(added < 10_000, "the 32 MiB disk never filled");
        }
    }
    eprintln!("{added} adds of 60 KiB before the bookie turned read-only");
    assert!(added > 100, "the disk filled before the bookie got going");
    fill_file(&mount.path().join("filler"));
    drop(w);
    // The filling ledgers are deleted from the metadata store (as a deleted stream's are).
    rt.block_on(async {
        let store = cluster.zk_store().await;
        for id in 1..=FILLING_LEDGERS {
            let v = store.read_ledger(LedgerId(id)).await.expect("read").version;
            store.delete_ledger(LedgerId(id), v).await.expect("delete");
        }
    });

    // A crash, and a restart on the 100 % full disk.
    bookie.kill();
    wait_for("the killed bookie's registration expired", || {
        registered_read_only(&cluster).is_none()
    });
    let mut gc_flags = flags.clone();
    gc_flags.extend(["--gc-interval-secs", "1"]);
    let bookie = cluster.start_bookie_with(0, port, &gc_flags);
    wait_for("the restarted bookie registered read-only", || {
        registered_read_only(&cluster) == Some(true)
    });
    let mut w = Wire::connect(&addr);
    assert_eq!(
        w.read(1, 0),
        Answer::Data(big_entry(1, 0)),
        "read on the full disk"
    );

    // Its GC deletes the ledgers and frees their entry logs: writable again.
    wait_for("the GC deleted the ledgers that filled the disk", || {
        w.read(1, 0) == Answer::Failed(Status::NoSuchLedger)
    });
    wait_for("the registration moved back to available/", || {
        registered_read_only(&cluster) == Some(false)
    });
    for e in 0..10 {
        assert_eq!(
            w.add(FILLING_LEDGERS + 1, e, false),
            Answer::Ok,
            "add {e} after the GC freed space"
        );
    }
    drop(w);
    bookie.stop();
    drop(mount);
}

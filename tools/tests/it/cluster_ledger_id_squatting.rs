//! Goal (issue 24 item 2): ledger ids nobody can squat or fill. A client admitted to the bookie
//! port (today: anyone on a port without TLS), written from docs/protocol.md, tries
//! - squatting: one entry with its own key added to each of the next ledger ids (they are
//!   handed out in order) on every bookie, as normal and as recovery adds, plus a fence;
//! - filling: large entries under ids at or above the id counter and at or above 2^62;
//!
//! and a legitimate writer must not notice: a ledger's first adds, pipelined, reach a bookie
//! right after its metadata was created and are accepted in order.
//!
//! Method: real ZooKeeper (quire-testkit), `quire bookie` and `quire proxy` children on
//! 127.0.0.1, the stranger's requests sent with `quire_testkit::harness::wire::Wire`, records written and read
//! with `ProxyClient`, ledger metadata read and created with `ZkStore`, the bookie's ledger
//! count read with `quire bookie info --json`, its disk use summed from the blocks of its files.

use quire_testkit::harness::cluster::runtime;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quire_metadata::MetadataStore;
use quire_testkit::harness::checker::{read_all, write_records};
use quire_testkit::harness::cluster::{Cluster, Proc};
use quire_testkit::harness::wire::{create_ledger_metadata, entry_with_payload, Answer, Wire, KEY};
use quire_wire::bookie::{Request, Status};
use quire_wire::{EntryId, LedgerId, MasterKey};

/// The stranger's master key.
const STRANGER: MasterKey = MasterKey([0xee; 20]);
/// A guard against a hang, not a timing check: a stalled stream never answers.
const WRITE_MAX: Duration = Duration::from_secs(90);

fn stranger_add(w: &mut Wire, ledger: u64, entry: u64, payload: &[u8], recovery: bool) -> Answer {
    let data = entry_with_payload(ledger, entry, payload);
    w.call(&Request::Add {
        recovery,
        master_key: STRANGER,
        entry: &data,
    })
}

fn stranger_fence(w: &mut Wire, ledger: u64) -> Answer {
    w.call(&Request::Fence {
        ledger: LedgerId(ledger),
        master_key: STRANGER,
    })
}

/// Blocks allocated under `dir` (all files, recursively), in bytes.
fn disk_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        total += if m.is_dir() {
            disk_bytes(&e.path())
        } else {
            m.blocks() * 512
        };
    }
    total
}

/// `quire bookie info ADDR --json`'s ledger count, once the shards published it (500 ms);
/// `secret_file` is the cluster's secret, which the command proves to the bookie.
fn ledger_count(addr: &str, secret_file: &std::path::Path) -> u64 {
    std::thread::sleep(Duration::from_millis(1200));
    let out = std::process::Command::new(quire_testkit::harness::quire_bin())
        .args(["bookie", "info", addr, "--json"])
        .env("QUIRE_CLUSTER_SECRET_FILE", secret_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["ledgers"].as_u64().unwrap()
}

fn start_bookies(cluster: &Cluster, ports: &[u16]) -> Vec<Proc> {
    let procs = ports
        .iter()
        .enumerate()
        .map(|(i, &port)| cluster.start_bookie(i, port))
        .collect();
    let want = format!("{} bookies registered", ports.len());
    cluster.wait_bookies(&want, |l| l.contains(&want));
    procs
}

#[test]
fn squatted_future_ledger_ids_do_not_block_streams() {
    // Small segments: each stream rolls to new ledgers while it is written.
    let proxy_flags = ["--segment-size-bytes", "2048", "--entry-size-bytes", "512"];
    let cluster = Cluster::start();
    let ports: Vec<u16> = (0..3).map(|_| quire_testkit::free_port()).collect();
    let bookies = start_bookies(&cluster, &ports);
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let rt = runtime();
    let zk = rt.block_on(cluster.zk_store());

    // The stranger guesses the next ids (here read from the counter; they are sequential).
    let next = rt.block_on(zk.next_ledger_id()).unwrap().0;
    let squatted = next..next + 40;
    let mut answers = Vec::new();
    for addr in &addrs {
        let mut w = Wire::connect(addr);
        for id in squatted.clone() {
            for recovery in [false, true] {
                let a = stranger_add(&mut w, id, 0, b"squatter's entry", recovery);
                answers.push((
                    addr.clone(),
                    id,
                    if recovery { "recovery add" } else { "add" },
                    a,
                ));
            }
            answers.push((addr.clone(), id, "fence", stranger_fence(&mut w, id)));
        }
    }

    // A legitimate proxy writes five streams across many rolls.
    let proxy = cluster.start_proxy_e3(&proxy_flags);
    let client = rt.block_on(async {
        Arc::new(
            quire_client::ProxyClient::connect(&proxy.addr)
                .await
                .unwrap(),
        )
    });
    let names: Vec<String> = (0..5).map(|s| format!("squat/s{s}")).collect();
    let mut acked: Vec<Vec<_>> = Vec::new();
    for name in &names {
        let (a, err) = rt
            .block_on(async {
                tokio::time::timeout(WRITE_MAX, write_records(&client, name, "a", 0..400)).await
            })
            .unwrap_or_else(|_| panic!("writes to {name} stalled"));
        assert!(
            err.is_none(),
            "{name}: {} of 400 legitimate writes acknowledged, then {err:?}",
            a.len()
        );
        acked.push(a);
    }
    drop(client);

    // Restart every bookie and the proxy: the open segments are recovered, and writing goes on.
    proxy.stop();
    for b in bookies {
        b.stop();
    }
    let _bookies = start_bookies(&cluster, &ports);
    let proxy = cluster.start_proxy_e3(&proxy_flags);
    let client = rt.block_on(async {
        Arc::new(
            quire_client::ProxyClient::connect(&proxy.addr)
                .await
                .unwrap(),
        )
    });
    let mut ok_after_restart = 0;
    for (name, a) in names.iter().zip(acked.iter_mut()) {
        let (more, err) = rt
            .block_on(async {
                tokio::time::timeout(WRITE_MAX, write_records(&client, name, "b", 0..20)).await
            })
            .unwrap_or_else(|_| panic!("writes to {name} after the restart stalled"));
        assert!(
            err.is_none(),
            "{name} after the restart: {} of 20 legitimate writes acknowledged, then {err:?}",
            more.len()
        );
        ok_after_restart += more.len();
        a.extend(more);
    }
    assert_eq!(ok_after_restart, 100, "legitimate writes after the restart");

    let mut ids = Vec::new();
    for (name, a) in names.iter().zip(&acked) {
        let meta = rt.block_on(zk.read_stream(name)).unwrap().value;
        ids.extend(meta.segments.iter().map(|s| s.ledger_id));
        let mut got = rt.block_on(read_all(&proxy.addr, name));
        let mut expected = a.clone();
        got.sort();
        expected.sort();
        assert!(got == expected, "records of {name}");
    }
    let used = ids.iter().filter(|id| squatted.contains(id)).count();
    assert!(
        used >= 20,
        "the segments used {used} of the squatted ids: {ids:?}"
    );

    // What the stranger was told: no key binds for a ledger the metadata store lacks.
    for (addr, id, what, answer) in &answers {
        let want = match *what {
            "fence" => Status::NoSuchLedger,
            _ => Status::Unauthorized,
        };
        assert_eq!(
            *answer,
            Answer::Failed(want),
            "{what} of ledger {id} on {addr}"
        );
    }
    // And none of its entries is anywhere: the ledgers hold the writer's entry 0.
    for id in ids.iter().filter(|id| squatted.contains(id)) {
        let meta = rt.block_on(zk.read_ledger(LedgerId(*id))).unwrap().value;
        for b in &meta.fragments[0].bookies {
            let mut w = Wire::connect(&b.0);
            if let Answer::Data(d) = w.read(*id, 0) {
                assert!(
                    !d.windows(9).any(|x| x == b"squatter'"),
                    "the stranger's entry 0 of ledger {id} is on {}",
                    b.0
                );
            }
        }
    }
}

#[test]
fn unallocated_ledger_ids_cannot_fill_a_bookie() {
    let cluster = Cluster::start();
    let port = quire_testkit::free_port();
    let addr = format!("127.0.0.1:{port}");
    let bookie = start_bookies(&cluster, &[port]);
    let rt = runtime();
    let zk = rt.block_on(cluster.zk_store());
    let next = rt.block_on(zk.next_ledger_id()).unwrap().0;
    let ids: Vec<u64> = (next..next + 100)
        .chain((1u64 << 62)..(1u64 << 62) + 100)
        .chain([u64::MAX - 1, i64::MAX as u64])
        .collect();
    let dir = cluster.dir.path().join("bookie-0");
    let before = disk_bytes(&dir);

    // 60 KiB entries: 404 ids × 2 entries would be 47 MiB if they were stored.
    let payload = vec![0x5a; 60 << 10];
    let mut w = Wire::connect(&addr);
    for &id in &ids {
        for entry in 0..2 {
            let recovery = entry == 1;
            assert_eq!(
                stranger_add(&mut w, id, entry, &payload, recovery),
                Answer::Failed(Status::Unauthorized),
                "add {id}/{entry} (recovery {recovery})"
            );
        }
        assert_eq!(
            stranger_fence(&mut w, id),
            Answer::Failed(Status::NoSuchLedger),
            "fence {id}"
        );
    }
    let after = disk_bytes(&dir);
    assert!(
        after <= before + (1 << 20),
        "bookie disk use grew from {before} to {after} bytes"
    );
    assert_eq!(
        ledger_count(&addr, &cluster.secret_file),
        0,
        "ledgers on the bookie"
    );

    // Nothing comes back after a restart either (the journal holds no record of them).
    for b in bookie {
        b.stop();
    }
    let _bookie = start_bookies(&cluster, &[port]);
    let mut w = Wire::connect(&addr);
    for &id in &ids {
        assert_eq!(
            w.read(id, 0),
            Answer::Failed(Status::NoSuchLedger),
            "read {id}/0"
        );
        assert_eq!(
            w.call(&Request::ReadLac {
                ledger: LedgerId(id)
            }),
            Answer::Failed(Status::NoSuchLedger),
            "LAC of {id}"
        );
    }
    assert_eq!(
        ledger_count(&addr, &cluster.secret_file),
        0,
        "ledgers on the restarted bookie"
    );
}

#[test]
fn first_adds_right_after_metadata_creation_are_accepted() {
    // Also measures (prints, asserts nothing about time) what the metadata read costs the
    // first adds of a new ledger: a pipelined batch of 8 first adds, against the next batch of
    // 8 of the same ledger, whose key is bound.
    let cluster = Cluster::start();
    let port = quire_testkit::free_port();
    let addr = format!("127.0.0.1:{port}");
    let _bookie = start_bookies(&cluster, &[port]);
    let rt = runtime();
    let zk = rt.block_on(cluster.zk_store());
    let mut w = Wire::connect(&addr);
    let mut first_batch = Vec::new();
    let mut next_batch = Vec::new();
    for round in 0..20 {
        let id = rt.block_on(zk.allocate_ledger_id()).unwrap().0;
        rt.block_on(create_ledger_metadata(&zk, id, std::slice::from_ref(&addr)));
        for (batch, times) in [(0..8u64, &mut first_batch), (8..16, &mut next_batch)] {
            let data: Vec<Vec<u8>> = batch
                .clone()
                .map(|e| entry_with_payload(id, e, format!("entry {e}").as_bytes()))
                .collect();
            let reqs: Vec<Request<'_>> = data
                .iter()
                .map(|d| Request::Add {
                    recovery: false,
                    master_key: KEY,
                    entry: d,
                })
                .collect();
            let t = Instant::now();
            let answers = w.call_pipelined(&reqs);
            times.push(t.elapsed());
            assert!(
                answers.iter().all(|a| *a == Answer::Ok),
                "round {round}, adds {batch:?} of ledger {id}: {answers:?}"
            );
        }
        for e in 0..16u64 {
            assert_eq!(
                w.read(id, e),
                Answer::Data(entry_with_payload(id, e, format!("entry {e}").as_bytes())),
                "ledger {id} entry {e}"
            );
        }
        // The bound key is the metadata's: a stranger's add is refused, the writer's fence
        // (recovery's, with the key from the metadata) works and cuts the writer off.
        let stranger = entry_with_payload(id, 16, b"x");
        assert_eq!(
            w.call(&Request::Add {
                recovery: true,
                master_key: STRANGER,
                entry: &stranger
            }),
            Answer::Failed(Status::Unauthorized)
        );
        assert_eq!(
            w.call(&Request::Fence {
                ledger: LedgerId(id),
                master_key: KEY
            }),
            Answer::Ok
        );
        assert_eq!(w.add(id, 16, false), Answer::Failed(Status::Fenced));
    }

    // A fence that arrives before any add (recovery of a ledger this bookie never got an entry
    // of) is admitted with the metadata's key, and the ledger's first add then finds it fenced.
    let id = rt.block_on(zk.allocate_ledger_id()).unwrap().0;
    rt.block_on(create_ledger_metadata(&zk, id, std::slice::from_ref(&addr)));
    assert_eq!(
        w.call(&Request::Read {
            ledger: LedgerId(id),
            entry: Some(EntryId(0)),
            fence: Some(STRANGER),
        }),
        Answer::Failed(Status::Unauthorized),
        "fencing read with another key"
    );
    assert_eq!(
        w.call(&Request::Read {
            ledger: LedgerId(id),
            entry: Some(EntryId(0)),
            fence: Some(KEY),
        }),
        Answer::Failed(Status::NoSuchEntry),
        "fencing read with the ledger's key"
    );
    assert_eq!(w.add(id, 0, false), Answer::Failed(Status::Fenced));
    assert_eq!(
        w.add(id, 0, true),
        Answer::Ok,
        "recovery add after the fence"
    );

    // One add at a time: entry 0 of a new ledger (one metadata read first) against entry 1.
    let mut first_add = Vec::new();
    let mut next_add = Vec::new();
    for _ in 0..40 {
        let id = rt.block_on(zk.allocate_ledger_id()).unwrap().0;
        rt.block_on(create_ledger_metadata(&zk, id, std::slice::from_ref(&addr)));
        for (e, times) in [(0, &mut first_add), (1, &mut next_add)] {
            let t = Instant::now();
            assert_eq!(w.add(id, e, false), Answer::Ok);
            times.push(t.elapsed());
        }
    }

    for v in [
        &mut first_batch,
        &mut next_batch,
        &mut first_add,
        &mut next_add,
    ] {
        v.sort();
    }
    eprintln!(
        "latency of 8 pipelined adds, median of 20 ledgers: first adds of a new ledger (one metadata read) {:?}, next 8 (key bound) {:?}; max {:?} vs {:?}",
        first_batch[10], next_batch[10], first_batch[19], next_batch[19]
    );
    eprintln!(
        "latency of one add, median of 40 ledgers: entry 0 of a new ledger {:?}, entry 1 {:?}; 90th percentile {:?} vs {:?}",
        first_add[20], next_add[20], first_add[36], next_add[36]
    );
}

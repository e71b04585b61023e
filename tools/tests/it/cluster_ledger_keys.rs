//! Goal: real ledger keys (issue 12), tried by a stranger who reaches the bookie ports with a
//! client written from docs/protocol.md:
//! - every ledger's master key comes from its stream's secret (not the former constant
//!   SHA-1("ledger" ‖ "quire")), so a forged re-add with the constant key is `Unauthorized`;
//!   even with the real key (read from the metadata) a re-add of an acknowledged entry with
//!   other bytes is `EntryMismatch` on every replica, the same bytes are accepted again, and
//!   after a proxy restart (which recovers the open segment, re-adding its entries with the
//!   same bytes) every acknowledged record reads back as written;
//! - fencing the next 30 ledger ids on every bookie with a stranger's key does not stall the
//!   new segments that get those ids (the bookies answer `NoSuchLedger`: they fence only
//!   ledgers the metadata store holds, docs/protocol.md §Add "When a key binds").
//!
//! Method: real ZooKeeper (quire-testkit), three `quire bookie` and one `quire proxy` child
//! (E = Qw = 3, so every bookie holds every entry), records written and read with
//! `ProxyClient`, metadata read with `ZkStore`, the stranger's requests sent with
//! `quire_testkit::harness::wire::Wire`.

use quire_testkit::harness::cluster::runtime;

use std::sync::Arc;
use std::time::Duration;

use quire_metadata::MetadataStore;
use quire_testkit::harness::checker::{read_all, write_records};
use quire_testkit::harness::cluster::{Cluster, Proc};
use quire_testkit::harness::wire::{Answer, Wire};
use quire_wire::bookie::{Request, Status};
use quire_wire::entry::{encode_entry, verify_entry};
use quire_wire::{LedgerId, MasterKey};

/// A guard against a hang, not a timing check: a stalled stream never answers.
const WRITE_MAX: Duration = Duration::from_secs(60);

/// ZooKeeper, three bookies and a proxy (E = Qw = 3, Qa = 2, plus `proxy_flags`); the bookies'
/// processes and addresses.
fn cluster_with_proxy(proxy_flags: &[&str]) -> (Cluster, Vec<(Proc, String)>, Proc) {
    let cluster = Cluster::start();
    let bookies: Vec<_> = (0..3)
        .map(|i| {
            let port = quire_testkit::free_port();
            (cluster.start_bookie(i, port), format!("127.0.0.1:{port}"))
        })
        .collect();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let proxy = cluster.start_proxy_e3(proxy_flags);
    (cluster, bookies, proxy)
}

fn add(w: &mut Wire, key: MasterKey, entry: &[u8], recovery: bool) -> Answer {
    w.call(&Request::Add {
        recovery,
        master_key: key,
        entry,
    })
}

/// Entry `entry` of `ledger` as `w`'s bookie answers it, asked again for up to 10 s while the
/// answer is not the entry: with Qa < Qw a record is acknowledged once Qa bookies stored it, and
/// the last bookie of the write set may still be storing it (its first add of a ledger also
/// waits for the metadata store to confirm the ledger's key).
fn read_when_stored(w: &mut Wire, ledger: u64, entry: u64) -> Answer {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let answer = w.read(ledger, entry);
        if matches!(answer, Answer::Data(_)) || std::time::Instant::now() >= deadline {
            return answer;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_stranger_cannot_forge_an_acknowledged_entry() {
    let (cluster, _bookies, proxy) = cluster_with_proxy(&[]);
    let rt = runtime();
    let client = rt.block_on(async {
        Arc::new(
            quire_client::ProxyClient::connect(&proxy.addr)
                .await
                .unwrap(),
        )
    });
    let (acked, err) = rt.block_on(write_records(&client, "keys/s", "r", 0..40));
    assert!(err.is_none(), "{err:?}");
    drop(client);

    let zk = rt.block_on(cluster.zk_store());
    let stream = rt.block_on(zk.read_stream("keys/s")).unwrap().value;
    let secret = stream
        .ledger_secret()
        .unwrap()
        .expect("a new stream has a ledger secret");
    assert_eq!(secret.len(), quire_ledger::LEDGER_SECRET_BYTES);
    let id = stream.segments[0].ledger_id;
    let meta = rt.block_on(zk.read_ledger(LedgerId(id))).unwrap().value;
    let real_key = meta.master_key().unwrap();
    let old_constant = quire_ledger::master_key(b"quire");
    assert_ne!(real_key, old_constant, "not the former constant key");
    assert_eq!(
        real_key,
        quire_ledger::ledger_master_key(&secret, LedgerId(id)),
        "the key is derived from the stream's secret and the ledger id"
    );

    for bookie in &meta.fragments[0].bookies {
        let mut w = Wire::connect(&bookie.0);
        for entry in [0, 1] {
            let original = match read_when_stored(&mut w, id, entry) {
                Answer::Data(original) => original,
                other => panic!(
                    "bookie {} lacks entry {entry} of ledger {id} after 10 s: {other:?}; \
                     fragments {:?}",
                    bookie.0, meta.fragments
                ),
            };
            let (header, payload) = verify_entry(&original).unwrap();
            let mut other = payload.to_vec();
            other[0] ^= 0x20;
            let forged = encode_entry(header, &other);
            for recovery in [false, true] {
                assert_eq!(
                    add(&mut w, old_constant, &forged, recovery),
                    Answer::Failed(Status::Unauthorized),
                    "forged re-add with the constant key on {} (recovery {recovery})",
                    bookie.0
                );
                assert_eq!(
                    add(&mut w, real_key, &forged, recovery),
                    Answer::Failed(Status::EntryMismatch),
                    "forged re-add with the real key on {} (recovery {recovery})",
                    bookie.0
                );
            }
            assert_eq!(
                add(&mut w, real_key, &original, true),
                Answer::Ok,
                "the same bytes again (a recovery re-add) on {}",
                bookie.0
            );
            assert_eq!(w.read(id, entry), Answer::Data(original));
        }
    }

    // A proxy restart recovers the open segment (fence, re-add the same bytes, close) and
    // every acknowledged record reads back as written.
    proxy.kill();
    let proxy = cluster.start_proxy_e3(&[]);
    let mut got = rt.block_on(read_all(&proxy.addr, "keys/s"));
    let mut expected = acked;
    got.sort();
    expected.sort();
    assert!(got == expected, "records after the proxy restart");
}

#[test]
fn pre_fenced_ledger_ids_do_not_stall_new_segments() {
    // Small segments: each stream rolls to new ledgers while it is written.
    let (cluster, bookies, proxy) =
        cluster_with_proxy(&["--segment-size-bytes", "2048", "--entry-size-bytes", "512"]);
    let rt = runtime();
    let zk = rt.block_on(cluster.zk_store());
    // Ledger ids are handed out in order: the next ones are above this one.
    let first = rt.block_on(zk.allocate_ledger_id()).unwrap().0;
    let fenced_ids = first + 1..=first + 30;
    let stranger = MasterKey([0xee; 20]);
    for (_, addr) in &bookies {
        let mut w = Wire::connect(addr);
        for id in fenced_ids.clone() {
            assert_eq!(
                w.call(&Request::Fence {
                    ledger: LedgerId(id),
                    master_key: stranger,
                }),
                Answer::Failed(Status::NoSuchLedger),
                "pre-fence ledger {id} on {addr}: no key binds for a ledger the metadata store lacks"
            );
        }
    }
    let client = rt.block_on(async {
        Arc::new(
            quire_client::ProxyClient::connect(&proxy.addr)
                .await
                .unwrap(),
        )
    });
    let mut written = Vec::new();
    for s in 0..5 {
        let name = format!("fenced/s{s}");
        let (acked, err) = rt
            .block_on(async {
                tokio::time::timeout(WRITE_MAX, write_records(&client, &name, "r", 0..400)).await
            })
            .unwrap_or_else(|_| panic!("writes to {name} stalled"));
        assert!(err.is_none(), "{name}: {err:?}");
        written.push((name, acked));
    }
    let mut ids = Vec::new();
    for (name, acked) in &written {
        let meta = rt.block_on(zk.read_stream(name)).unwrap().value;
        ids.extend(meta.segments.iter().map(|s| s.ledger_id));
        let mut got = rt.block_on(read_all(&proxy.addr, name));
        let mut expected = acked.clone();
        got.sort();
        expected.sort();
        assert!(got == expected, "records of {name}");
    }
    let pre_fenced = ids.iter().filter(|id| fenced_ids.contains(id)).count();
    assert!(
        pre_fenced >= 10,
        "the new segments used {pre_fenced} of the pre-fenced ids: {ids:?}"
    );
}

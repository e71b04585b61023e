//! The ZooKeeper metadata store against a real standalone ZooKeeper (quire-testkit starts one per
//! test on a free loopback port, one server start per test): records and CAS, bookie
//! registration, stream locks and session expiry, autorecovery's marks, locks and election,
//! reconnects (reads in flight, a session with thousands of watches).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use quire_metadata::*;
use quire_testkit::{TcpRelay, ZooKeeperServer};
use quire_wire::LedgerId;

const SESSION: Duration = Duration::from_secs(6);
/// Upper bound for waiting on something that must happen; never a latency assertion.
const PATIENCE: Duration = Duration::from_secs(60);

fn stream(name: &str) -> StreamMetadata {
    StreamMetadata {
        name: name.into(),
        segments: vec![],
        max_txid: None,
        creation_time_ms: 1,
        truncated_before: None,
        retention: RetentionOverride::default(),
        ledger_secret_hex: None,
        sealed: false,
        compression: None,
        limits: None,
        home_region: None,
        placement: None,
    }
}

fn ledger(bookies: &[&str]) -> LedgerMetadata {
    LedgerMetadata {
        format_version: LEDGER_METADATA_FORMAT_VERSION,
        ensemble_size: bookies.len() as u8,
        write_quorum: 2,
        ack_quorum: 2,
        state: LedgerState::Open,
        fragments: vec![Fragment {
            first_entry: 0,
            bookies: bookies.iter().map(|b| BookieId(b.to_string())).collect(),
        }],
        last_entry: None,
        length_bytes: 0,
        digest_type: DigestType::Crc32c,
        master_key_hex: "00".repeat(20),
        creation_time_ms: 7,
        custom: BTreeMap::new(),
    }
}

fn cookie(bookie: &str, instance: &str, journal: &str) -> Cookie {
    Cookie {
        format_version: COOKIE_FORMAT_VERSION,
        bookie: BookieId(bookie.into()),
        instance_id: instance.into(),
        journal_dir: journal.into(),
        ledger_dirs: vec!["/data/l0".into()],
    }
}

async fn connect(zk: &ZooKeeperServer, root: &str) -> ZkStore {
    ZkStore::connect(&zk.connect_string(), root, SESSION)
        .await
        .expect("connect to ZooKeeper")
}

/// Goal: every record method of the trait behaves as the trait says against real ZooKeeper:
/// layout creation (concurrent first use) and the layout version check, instance id, cookies,
/// ledger ids (never repeated across two clients, explicit ids skipped), ledger and stream CRUD
/// with compare-and-set conflicts, and stream names with '/'.
/// Method: two stores on one root race to create the layout, then drive every method and check
/// results and error variants; finally corrupt the layout version through the raw client and
/// check that a new store refuses it.
#[tokio::test]
async fn records_compare_and_set_and_layout_version() {
    let zk = ZooKeeperServer::start();
    let (a, b) = tokio::join!(connect(&zk, "/quire/c1"), connect(&zk, "/quire/c1"));

    // Instance id: created once, same for both clients.
    let id = a.instance_id().await.unwrap();
    assert_eq!(id.len(), 32);
    assert_eq!(b.instance_id().await.unwrap(), id);

    // Cookies: create, duplicate create refused, CAS update, stale CAS refused.
    let bk = "127.0.0.1:3181";
    assert!(matches!(
        a.read_cookie(&BookieId(bk.into())).await,
        Err(Error::NotFound { .. })
    ));
    let v0 = a.write_cookie(&cookie(bk, &id, "/j1"), None).await.unwrap();
    assert!(matches!(
        b.write_cookie(&cookie(bk, &id, "/j1"), None).await,
        Err(Error::AlreadyExists { .. })
    ));
    let v1 = b
        .write_cookie(&cookie(bk, &id, "/j2"), Some(v0))
        .await
        .unwrap();
    assert!(v1 > v0);
    assert!(matches!(
        a.write_cookie(&cookie(bk, &id, "/j3"), Some(v0)).await,
        Err(Error::BadVersion { .. })
    ));
    let read = a.read_cookie(&BookieId(bk.into())).await.unwrap();
    assert_eq!((read.value.journal_dir.as_str(), read.version), ("/j2", v1));
    assert!(matches!(
        a.write_cookie(&cookie("bad/id", &id, "/j"), None).await,
        Err(Error::Invalid {
            what: "bookie id",
            ..
        })
    ));

    // Ledger ids: two clients allocate concurrently; no id is handed out twice.
    let (ids_a, ids_b) = tokio::join!(
        async {
            let mut v = Vec::new();
            for _ in 0..40 {
                v.push(a.allocate_ledger_id().await.unwrap());
            }
            v
        },
        async {
            let mut v = Vec::new();
            for _ in 0..40 {
                v.push(b.allocate_ledger_id().await.unwrap());
            }
            v
        }
    );
    let all: BTreeSet<u64> = ids_a.iter().chain(&ids_b).map(|l| l.0).collect();
    assert_eq!(all.len(), 80, "a ledger id was handed out twice");
    assert!(!all.contains(&0), "ledger ids start at 1");
    let max = *all.iter().max().unwrap();

    // A ledger created with an explicit id just above the counter is skipped by allocation.
    let meta = ledger(&["b1", "b2", "b3"]);
    let v0 = a.create_ledger(LedgerId(max + 1), &meta).await.unwrap();
    assert!(matches!(
        b.create_ledger(LedgerId(max + 1), &meta).await,
        Err(Error::AlreadyExists { .. })
    ));
    assert_eq!(b.allocate_ledger_id().await.unwrap(), LedgerId(max + 2));

    // Many allocations of one store at once share compare-and-sets (id_gen.rs): still no id
    // twice, and the counter ends just past the last id handed out (none reserved ahead).
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let a = a.clone();
        set.spawn(async move { a.allocate_ledger_id().await.unwrap().0 });
    }
    let mut many = BTreeSet::new();
    while let Some(id) = set.join_next().await {
        assert!(many.insert(id.unwrap()), "a ledger id was handed out twice");
    }
    assert_eq!(many.first(), Some(&(max + 3)));
    assert_eq!(many.last(), Some(&(max + 202)));
    assert_eq!(a.next_ledger_id().await.unwrap(), LedgerId(max + 203));

    // Ledger metadata: read, CAS update, stale update refused with the found version, delete.
    let r = b.read_ledger(LedgerId(max + 1)).await.unwrap();
    assert_eq!((r.value.clone(), r.version), (meta.clone(), v0));
    let mut closed = meta.clone();
    closed.state = LedgerState::Closed;
    closed.last_entry = Some(9);
    let v1 = a
        .update_ledger(LedgerId(max + 1), &closed, v0)
        .await
        .unwrap();
    match b.update_ledger(LedgerId(max + 1), &meta, v0).await {
        Err(Error::BadVersion {
            expected, found, ..
        }) => assert_eq!((expected, found), (v0.0, v1.0)),
        other => panic!("stale ledger update: {other:?}"),
    }
    assert_eq!(
        b.read_ledger(LedgerId(max + 1)).await.unwrap().value,
        closed
    );
    let mut bad = meta.clone();
    bad.ack_quorum = 3;
    assert!(matches!(
        a.create_ledger(LedgerId(max + 5), &bad).await,
        Err(Error::Invalid { .. })
    ));
    assert!(matches!(
        a.delete_ledger(LedgerId(max + 1), v0).await,
        Err(Error::BadVersion { .. })
    ));
    a.delete_ledger(LedgerId(max + 1), v1).await.unwrap();
    assert!(matches!(
        b.read_ledger(LedgerId(max + 1)).await,
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        b.update_ledger(LedgerId(max + 1), &meta, v1).await,
        Err(Error::NotFound { .. })
    ));
    // A deleted ledger's id is not handed out again.
    assert!(a.allocate_ledger_id().await.unwrap().0 > max + 2);

    // Streams, including names with '/' (one znode each, encoded).
    for name in ["logs/app-1", "logs/app-2", "plain"] {
        a.create_stream(&stream(name)).await.unwrap();
    }
    assert!(matches!(
        b.create_stream(&stream("plain")).await,
        Err(Error::AlreadyExists { .. })
    ));
    assert!(matches!(
        b.create_stream(&stream("/abs")).await,
        Err(Error::Invalid { .. })
    ));
    assert_eq!(
        b.list_streams().await.unwrap(),
        vec!["logs/app-1", "logs/app-2", "plain"]
    );
    let s = b.read_stream("logs/app-1").await.unwrap();
    assert_eq!(s.value, stream("logs/app-1"));
    let mut grown = s.value.clone();
    grown.max_txid = Some(42);
    let sv1 = b.update_stream(&grown, s.version).await.unwrap();
    assert!(matches!(
        a.update_stream(&stream("logs/app-1"), s.version).await,
        Err(Error::BadVersion { .. })
    ));
    assert_eq!(
        a.read_stream("logs/app-1").await.unwrap().value.max_txid,
        Some(42)
    );
    assert!(matches!(
        a.delete_stream("logs/app-1", s.version).await,
        Err(Error::BadVersion { .. })
    ));
    a.delete_stream("logs/app-1", sv1).await.unwrap();
    assert!(matches!(
        a.read_stream("logs/app-1").await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(a.list_streams().await.unwrap(), vec!["logs/app-2", "plain"]);
    subscriptions_cas_and_go_with_their_stream(&a, &b).await;

    // Ledger listing across buckets, and removal of emptied buckets: only once the id counter
    // is past the whole bucket (no allocation can go there again); a bucket a ledger is
    // created in again is created again.
    let l = connect(&zk, "/quire/l1").await;
    let meta = ledger(&["b1", "b2", "b3"]);
    let ids = [5u64, 9_999, 10_000, 10_001, 25_000];
    for id in ids {
        l.create_ledger(LedgerId(id), &meta).await.unwrap();
    }
    assert_eq!(
        l.list_ledgers().await.unwrap(),
        ids.iter().map(|&i| LedgerId(i)).collect::<Vec<_>>()
    );
    let buckets = |l: &ZkStore| {
        let l = l.client().clone();
        async move {
            let mut b = l.list_children("/quire/l1/ledgers").await.unwrap();
            b.sort();
            b
        }
    };
    assert_eq!(buckets(&l).await.len(), 3);
    // The counter is at 1: emptying bucket 0 keeps it.
    for id in [5, 9_999] {
        let v = l.read_ledger(LedgerId(id)).await.unwrap().version;
        l.delete_ledger(LedgerId(id), v).await.unwrap();
    }
    assert_eq!(
        buckets(&l).await.len(),
        3,
        "bucket 0 removed below the counter"
    );
    // Counter past bucket 1 (ids 10 000..19 999): emptying it removes it; bucket 2 stays.
    l.client()
        .set_data("/quire/l1/idgen/ledger", b"20000", None)
        .await
        .unwrap();
    let v = l.read_ledger(LedgerId(10_000)).await.unwrap().version;
    l.delete_ledger(LedgerId(10_000), v).await.unwrap();
    assert_eq!(
        buckets(&l).await.len(),
        3,
        "a bucket with a ledger left was removed"
    );
    let v = l.read_ledger(LedgerId(10_001)).await.unwrap().version;
    l.delete_ledger(LedgerId(10_001), v).await.unwrap();
    assert_eq!(
        buckets(&l).await,
        vec![
            "0000000000000000".to_string(),
            "0000000000000002".to_string()
        ]
    );
    assert_eq!(l.list_ledgers().await.unwrap(), vec![LedgerId(25_000)]);
    // An explicit id in the removed bucket creates it again.
    l.create_ledger(LedgerId(10_002), &meta).await.unwrap();
    assert_eq!(
        l.list_ledgers().await.unwrap(),
        vec![LedgerId(10_002), LedgerId(25_000)]
    );
    drop(l);

    // Layout version: a root written by an unknown layout version is refused.
    let c = connect(&zk, "/quire/c2").await;
    c.client()
        .set_data("/quire/c2/LAYOUT", br#"{"layout_version":99}"#, None)
        .await
        .unwrap();
    match ZkStore::connect(&zk.connect_string(), "/quire/c2", SESSION).await {
        Err(Error::Corrupt { path, reason }) => {
            assert_eq!(path, "/quire/c2/LAYOUT");
            assert!(reason.contains("99"), "{reason}");
        }
        other => panic!("unknown layout version accepted: {other:?}"),
    }
    assert!(matches!(
        ZkStore::connect(&zk.connect_string(), "quire", SESSION).await,
        Err(Error::Invalid { .. })
    ));
    drop((a, b, c));
    zk.stop();
}

/// Goal: a restarted bookie's registration waits for its previous incarnation's node to go
/// away for as long as ZooKeeper may keep it: up to a tick (at most half the session timeout)
/// past the session timeout, since sessions expire in tick buckets (found by the chaos runner:
/// a bookie SIGKILLed and restarted at once exited with "held by another live ZooKeeper
/// session" when it waited one timeout plus a second).
/// Method: session A (4 s timeout) registers a bookie; session B registers it too and waits;
/// A's node is kept for 1.5 × the timeout (6 s), then A closes; B's registration must succeed.
#[tokio::test]
async fn a_restarted_bookie_waits_out_its_old_registration() {
    let zk = ZooKeeperServer::start();
    let timeout = Duration::from_secs(4);
    let a = ZkStore::connect(&zk.connect_string(), "/quire", timeout)
        .await
        .unwrap();
    let b = ZkStore::connect(&zk.connect_string(), "/quire", timeout)
        .await
        .unwrap();
    let info = BookieInfo {
        id: BookieId("127.0.0.1:3181".into()),
        rack: None,
        region: None,
        read_only: false,
    };
    a.register_bookie(info.clone()).await.unwrap();
    let again = tokio::spawn(async move { b.register_bookie(info).await.map(|()| b) });
    tokio::time::sleep(timeout * 3 / 2).await;
    assert!(!again.is_finished(), "B waits while A's node exists");
    drop(a);
    let b = again
        .await
        .unwrap()
        .expect("the registration succeeds once the old node is gone");
    assert_eq!(b.list_bookies().await.unwrap().len(), 1);
    drop(b);
    zk.stop();
}

/// Goal: bookie registrations are ephemeral (BookKeeper `available/` and `readonly/`): another
/// client sees them, a switch to read-only moves the node, unregister removes it, and closing
/// the registering client's session removes its registrations. A registration's epoch stays
/// while the same session re-registers in place and changes with a move to read-only and with
/// a registration from a new session (a restarted bookie).
/// Method: client A registers two bookies, client B lists them; A switches one to read-only;
/// A is dropped (its session closes) and B waits until the list is empty; client C registers
/// the same bookie again.
#[tokio::test]
async fn bookie_registrations_are_ephemeral() {
    let zk = ZooKeeperServer::start();
    let a = connect(&zk, "/quire").await;
    let b = connect(&zk, "/quire").await;
    let info = |id: &str, read_only| BookieInfo {
        id: BookieId(id.into()),
        rack: Some("r1".into()),
        region: None,
        read_only,
    };

    a.register_bookie(info("127.0.0.1:3182", false))
        .await
        .unwrap();
    a.register_bookie(info("127.0.0.1:3181", false))
        .await
        .unwrap();
    assert_eq!(
        b.list_bookies().await.unwrap(),
        vec![info("127.0.0.1:3181", false), info("127.0.0.1:3182", false)]
    );
    let epoch_of = |regs: &[BookieRegistration], id: &str| {
        regs.iter()
            .find(|r| r.info.id.0 == id)
            .and_then(|r| r.epoch)
            .expect("a registration with an epoch")
    };
    let first = b.list_bookie_registrations().await.unwrap();
    let first_epoch = epoch_of(&first, "127.0.0.1:3181");
    assert_ne!(first_epoch, epoch_of(&first, "127.0.0.1:3182"));
    a.register_bookie(info("127.0.0.1:3181", false))
        .await
        .unwrap();
    assert_eq!(
        epoch_of(
            &b.list_bookie_registrations().await.unwrap(),
            "127.0.0.1:3181"
        ),
        first_epoch,
        "re-registering in place keeps the registration"
    );

    // Re-registering from the same session replaces; going read-only moves the node.
    a.register_bookie(info("127.0.0.1:3181", true))
        .await
        .unwrap();
    assert_eq!(
        b.list_bookies().await.unwrap(),
        vec![info("127.0.0.1:3181", true), info("127.0.0.1:3182", false)]
    );
    let read_only_epoch = epoch_of(
        &b.list_bookie_registrations().await.unwrap(),
        "127.0.0.1:3181",
    );
    assert_ne!(
        read_only_epoch, first_epoch,
        "a move to read-only is a new registration"
    );
    assert!(b
        .client()
        .check_stat("/quire/bookies/available/127.0.0.1:3181")
        .await
        .unwrap()
        .is_none());
    assert!(b
        .client()
        .check_stat("/quire/bookies/readonly/127.0.0.1:3181")
        .await
        .unwrap()
        .is_some());

    // Unregister.
    b.unregister_bookie(&BookieId("127.0.0.1:3182".into()))
        .await
        .unwrap();
    assert!(matches!(
        b.unregister_bookie(&BookieId("127.0.0.1:3182".into()))
            .await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(
        b.list_bookies().await.unwrap(),
        vec![info("127.0.0.1:3181", true)]
    );

    // Closing A's session removes its registration; B sees it go.
    let mut a_lost = a.session_lost();
    drop(a);
    tokio::time::timeout(PATIENCE, async {
        while !b.list_bookies().await.unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("registration of a closed session must disappear");
    tokio::time::timeout(PATIENCE, a_lost.wait_for(|lost| *lost))
        .await
        .expect("session_lost flips on close")
        .unwrap();

    // The bookie "restarts": a new session registers it again, under a new epoch.
    let c = connect(&zk, "/quire").await;
    c.register_bookie(info("127.0.0.1:3181", false))
        .await
        .unwrap();
    let again = b.list_bookie_registrations().await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].info, info("127.0.0.1:3181", false));
    let restarted_epoch = epoch_of(&again, "127.0.0.1:3181");
    assert!(
        restarted_epoch != first_epoch && restarted_epoch != read_only_epoch,
        "a new session's registration has a new epoch"
    );
    drop((b, c));
    zk.stop();
}

/// Goal: stream ownership follows DistributedLog's ephemeral-sequential lock: of two racing
/// clients exactly one wins and the other learns the owner; the winner's lease flips `lost`
/// when its session expires, after which the other client can acquire; release works and
/// `stream_owner` reports the holder.
/// Method: A and B race `try_acquire_stream` concurrently; A talks to ZooKeeper through a
/// loopback relay (`TcpRelay`), which the test then cuts so that A's session expires (the server
/// deletes A's ephemeral nodes; A's client gives up reconnecting); wait for A's lease and
/// `session_lost` to flip, then B acquires, releases, and acquires again.
#[tokio::test]
async fn stream_lock_race_and_session_expiry() {
    let zk = ZooKeeperServer::start();
    let a_relay = TcpRelay::start(zk.connect_string().parse().unwrap());
    let a = ZkStore::connect(&a_relay.connect_string(), "/quire", SESSION)
        .await
        .expect("connect to ZooKeeper through the relay");
    let b = connect(&zk, "/quire").await;
    let name = "logs/locked";
    assert_eq!(b.stream_owner(name).await.unwrap(), None);

    let (ra, rb) = tokio::join!(
        a.try_acquire_stream(name, "proxy-a"),
        b.try_acquire_stream(name, "proxy-b")
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let (lease, loser_saw) = match (ra, rb) {
        (Ok(lease), Err(owner)) => {
            assert_eq!(owner, "proxy-a");
            (lease, "a")
        }
        (Err(owner), Ok(lease)) => {
            assert_eq!(owner, "proxy-b");
            (lease, "b")
        }
        (ra, rb) => panic!("exactly one must win: {ra:?} / {rb:?}"),
    };
    // Make A the holder for the expiry part: if B won, B releases and A takes it.
    let lease = if loser_saw == "b" {
        assert_eq!(
            a.stream_owner(name).await.unwrap().as_deref(),
            Some("proxy-b")
        );
        b.release_stream(lease).await.unwrap();
        a.try_acquire_stream(name, "proxy-a")
            .await
            .unwrap()
            .expect("A acquires after B released")
    } else {
        lease
    };
    assert_eq!(
        b.stream_owner(name).await.unwrap().as_deref(),
        Some("proxy-a")
    );
    assert_eq!(
        b.try_acquire_stream(name, "proxy-b")
            .await
            .unwrap()
            .err()
            .as_deref(),
        Some("proxy-a")
    );
    assert!(!*lease.lost.borrow());
    // Only the holder's lock child remains (the losers deleted theirs).
    let dir = format!("/quire/locks/{}", encode_stream_name(name));
    assert_eq!(b.client().list_children(&dir).await.unwrap().len(), 1);

    // Expire A's session: cut A off from the server. The server expires the session after its
    // timeout (deleting A's ephemeral nodes), and A's client, unable to reconnect, reports it
    // expired after 1.4 × the timeout.
    let mut a_lost = a.session_lost();
    let mut lost = lease.lost.clone();
    assert!(!*a_lost.borrow());
    a_relay.cut();
    tokio::time::timeout(PATIENCE, a_lost.wait_for(|l| *l))
        .await
        .expect("A's session must be lost")
        .unwrap();
    tokio::time::timeout(PATIENCE, lost.wait_for(|l| *l))
        .await
        .expect("lease must flip lost")
        .unwrap();
    assert!(matches!(
        a.list_bookies().await,
        Err(Error::ZooKeeper { .. })
    ));

    // The lock child went with A's session: B can acquire now.
    let b_lease = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Ok(l) = b.try_acquire_stream(name, "proxy-b").await.unwrap() {
                return l;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("B acquires after A's session expired");
    assert_eq!(
        b.stream_owner(name).await.unwrap().as_deref(),
        Some("proxy-b")
    );
    // Releasing A's dead lease is a no-op, not an error, and does not touch B's lock.
    a.release_stream(lease).await.unwrap();
    assert_eq!(
        b.stream_owner(name).await.unwrap().as_deref(),
        Some("proxy-b")
    );

    // Deleting the lock child by hand (an operator) flips the lease too.
    let mut b_lost = b_lease.lost.clone();
    b.client().delete(&b_lease.token, None).await.unwrap();
    tokio::time::timeout(PATIENCE, b_lost.wait_for(|l| *l))
        .await
        .expect("lease flips on node deletion")
        .unwrap();
    b.release_stream(b_lease).await.unwrap();
    assert_eq!(b.stream_owner(name).await.unwrap(), None);
    drop((a, b));
    zk.stop();
}

#[tokio::test]
async fn autorecovery_marks_locks_and_auditor_election() {
    // Goal: under-replication marks gather bookies and keep their first ctime, and are removed
    // only at the version read (a mark extended meanwhile stays); a replication lock is held
    // by one worker at a time and dies with its session; the lowest election node is the
    // auditor and the next candidate takes over when the auditor's session closes.
    let zk = ZooKeeperServer::start();
    let a = connect(&zk, "/ur").await;
    let b = connect(&zk, "/ur").await;
    let (x, y) = (BookieId("x:1".into()), BookieId("y:1".into()));
    let id = LedgerId(123_456);
    assert!(a.list_under_replicated().await.unwrap().is_empty());
    a.mark_under_replicated(id, std::slice::from_ref(&x))
        .await
        .unwrap();
    let m1 = a.read_under_replicated(id).await.unwrap();
    b.mark_under_replicated(id, &[y.clone(), x.clone()])
        .await
        .unwrap();
    let m2 = a.read_under_replicated(id).await.unwrap();
    assert_eq!(m2.value.missing_bookies, vec![x.clone(), y.clone()]);
    assert_eq!(m2.value.ctime_ms, m1.value.ctime_ms);
    assert_ne!(m2.version, m1.version);
    b.mark_under_replicated(id, std::slice::from_ref(&y))
        .await
        .unwrap();
    assert_eq!(
        a.read_under_replicated(id).await.unwrap().version,
        m2.version
    );
    assert!(matches!(
        a.clear_under_replicated(id, m1.version).await,
        Err(Error::BadVersion { .. })
    ));
    // A writer's report goes to `gaps_on` (through the trait, as the ledger client calls it),
    // leaves `missing_bookies` and the ctime alone, and is idempotent.
    let z = BookieId("z:1".into());
    assert!(b
        .report_under_replicated(id, std::slice::from_ref(&z))
        .await
        .unwrap());
    let m3 = a.read_under_replicated(id).await.unwrap();
    assert_eq!(m3.value.missing_bookies, vec![x.clone(), y.clone()]);
    assert_eq!(m3.value.gaps_on, vec![z.clone()]);
    assert_eq!(m3.value.ctime_ms, m1.value.ctime_ms);
    b.report_under_replicated(id, std::slice::from_ref(&z))
        .await
        .unwrap();
    assert_eq!(
        a.read_under_replicated(id).await.unwrap().version,
        m3.version
    );
    a.mark_under_replicated(LedgerId(7), std::slice::from_ref(&x))
        .await
        .unwrap();
    let listed: Vec<LedgerId> = b
        .list_under_replicated()
        .await
        .unwrap()
        .into_iter()
        .map(|(l, _)| l)
        .collect();
    assert_eq!(listed, vec![LedgerId(7), id]);

    // One worker at a time.
    let la = a.try_lock_under_replicated(id, "A").await.unwrap().unwrap();
    assert!(b
        .try_lock_under_replicated(id, "B")
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        b.autorecovery_state().await.unwrap().locks,
        vec![(id, "A".to_string())]
    );
    a.release_replication_lock(la).await.unwrap();
    let _lb = b.try_lock_under_replicated(id, "B").await.unwrap().unwrap();

    // The election.
    let ca = a.join_auditor_election("A").await.unwrap();
    let cb = b.join_auditor_election("B").await.unwrap();
    tokio::time::timeout(PATIENCE, ca.wait_until_elected())
        .await
        .unwrap()
        .unwrap();
    assert!(!cb.is_elected().await.unwrap());
    assert_eq!(
        b.autorecovery_state().await.unwrap().candidates,
        vec!["A".to_string(), "B".to_string()]
    );
    drop(ca);
    drop(a); // closes A's session: its node goes at once
    tokio::time::timeout(PATIENCE, cb.wait_until_elected())
        .await
        .unwrap()
        .unwrap();
    assert!(cb.is_elected().await.unwrap());

    // B's lock dies with B's session; another worker claims the ledger and clears the mark.
    drop(cb);
    drop(b);
    let c = connect(&zk, "/ur").await;
    let lc = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(l) = c.try_lock_under_replicated(id, "C").await.unwrap() {
                return l;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap();
    c.clear_under_replicated(id, m3.version).await.unwrap();
    c.release_replication_lock(lc).await.unwrap();
    let left: Vec<LedgerId> = c
        .list_under_replicated()
        .await
        .unwrap()
        .into_iter()
        .map(|(l, _)| l)
        .collect();
    assert_eq!(left, vec![LedgerId(7)]);
    assert_eq!(
        c.autorecovery_state().await.unwrap().candidates,
        Vec::<String>::new()
    );
}

fn sub(seq: u64) -> Subscription {
    Subscription {
        committed: TruncationPoint {
            segment_seq_no: seq,
            entry_id: 0,
            slot_index: 0,
        },
        commit_time_ms: 9,
    }
}

/// Subscriptions under the stream's node (issue 26 item 2): create, compare-and-set, sorted
/// listing, delete; a stream delete that loses its compare-and-set keeps them, one that wins
/// takes them along (one multi).
async fn subscriptions_cas_and_go_with_their_stream(a: &ZkStore, b: &ZkStore) {
    let s = "logs/app-2";
    assert!(matches!(
        a.write_subscription("nope", "x", &sub(1), None).await,
        Err(Error::NotFound { kind: "stream", .. })
    ));
    let v0 = a
        .write_subscription(s, "billing", &sub(1), None)
        .await
        .unwrap();
    assert!(matches!(
        b.write_subscription(s, "billing", &sub(1), None).await,
        Err(Error::AlreadyExists { .. })
    ));
    let v1 = b
        .write_subscription(s, "billing", &sub(2), Some(v0))
        .await
        .unwrap();
    assert!(matches!(
        a.write_subscription(s, "billing", &sub(3), Some(v0)).await,
        Err(Error::BadVersion { .. })
    ));
    a.write_subscription(s, "audit", &sub(1), None)
        .await
        .unwrap();
    let r = a.read_subscription(s, "billing").await.unwrap();
    assert_eq!((r.value, r.version), (sub(2), v1));
    assert_eq!(
        b.list_subscriptions(s).await.unwrap(),
        vec![
            ("audit".to_string(), sub(1)),
            ("billing".to_string(), sub(2))
        ]
    );
    assert!(matches!(
        a.read_subscription(s, "bad/name").await,
        Err(Error::Invalid { .. })
    ));
    a.delete_subscription(s, "audit").await.unwrap();
    assert!(matches!(
        a.delete_subscription(s, "audit").await,
        Err(Error::NotFound { .. })
    ));
    let st = a.read_stream(s).await.unwrap();
    assert!(matches!(
        a.delete_stream(s, Version(st.version.0 + 1)).await,
        Err(Error::BadVersion { .. })
    ));
    assert_eq!(a.list_subscriptions(s).await.unwrap().len(), 1);
    a.delete_stream(s, st.version).await.unwrap();
    a.create_stream(&stream(s)).await.unwrap();
    assert!(a.list_subscriptions(s).await.unwrap().is_empty());
}

/// Goal: a lock node this very session left behind (a lease dropped, or given up while the
/// delete failed on a lost connection) does not keep the stream from its own proxy, while a
/// node of another session with the same owner (a restarted proxy's earlier session) and a
/// lease still held are respected. Found by the chaos runner (seed 250541322692507): a live
/// proxy answered "owned by <itself>" for a stream for over a minute.
/// Method: through A's own client, create a lock child holding "proxy-a" (the orphan); A must
/// still acquire the stream. Then, while A holds it, A's second try is refused; after A drops
/// its lease without releasing it, A acquires again. Finally B's session creates a child
/// holding "proxy-a": A must see the stream owned (by "proxy-a") and leave it alone.
#[tokio::test]
async fn an_orphaned_lock_node_of_the_same_session_is_reaped() {
    let zk = ZooKeeperServer::start();
    let a = connect(&zk, "/quire").await;
    let b = connect(&zk, "/quire").await;
    let name = "logs/orphan";
    let dir = format!("/quire/locks/{}", encode_stream_name(name));
    let child = format!("{dir}/lock-");
    let ephemeral_seq = zookeeper_client::CreateMode::EphemeralSequential
        .with_acls(zookeeper_client::Acls::anyone_all());
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let _ = a.client().create("/quire/locks", b"", &persistent).await;
    let _ = a.client().create(&dir, b"", &persistent).await;
    a.client()
        .create(&child, b"proxy-a", &ephemeral_seq)
        .await
        .expect("the orphan");

    let lease = a
        .try_acquire_stream(name, "proxy-a")
        .await
        .unwrap()
        .expect("A acquires past its own orphan");
    assert_eq!(a.client().list_children(&dir).await.unwrap().len(), 1);
    // Held: not an orphan.
    assert_eq!(
        a.try_acquire_stream(name, "proxy-a")
            .await
            .unwrap()
            .err()
            .as_deref(),
        Some("proxy-a")
    );
    // Dropped without a release: its node stays, an orphan once its watch ends.
    drop(lease);
    let again = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Ok(l) = a.try_acquire_stream(name, "proxy-a").await.unwrap() {
                return l;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("A acquires again after dropping its lease");
    a.release_stream(again).await.unwrap();

    // Another session's node with the same owner name is that session's until it ends.
    b.client()
        .create(&child, b"proxy-a", &ephemeral_seq)
        .await
        .expect("B's node");
    assert_eq!(
        a.try_acquire_stream(name, "proxy-a")
            .await
            .unwrap()
            .err()
            .as_deref(),
        Some("proxy-a")
    );
    assert_eq!(b.client().list_children(&dir).await.unwrap().len(), 1);
}

/// Goal: a read that meets a connection loss while the session lives is sent again once the
/// client has reconnected, instead of failing with `ConnectionLoss` (BookKeeper's
/// `ZooKeeperClient` retries reads the same way): an ensemble change's bookie list or a ledger
/// read during a ZooKeeper server restart must not fail the write it serves (the regions soak:
/// a region cut dropped a proxy's ZooKeeper connection and its ensemble change failed at once).
/// Method: a store with a 20 s session through a loopback relay; hold the relay's requests so
/// that a ledger read and a bookie listing are in flight, shut every relayed connection down
/// (the client fails what it had sent with a connection loss), let connections through again,
/// and require both reads to answer, on the same session. Without the retry both fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_in_flight_at_a_connection_loss_are_sent_again() {
    use quire_testkit::relay::Direction;
    let zk = ZooKeeperServer::start();
    let relay = TcpRelay::start(zk.connect_string().parse().unwrap());
    let store = ZkStore::connect(&relay.connect_string(), "/quire", Duration::from_secs(20))
        .await
        .expect("connect to ZooKeeper");
    let id = store.allocate_ledger_id().await.unwrap();
    store
        .create_ledger(id, &ledger(&["127.0.0.1:3181", "127.0.0.1:3182"]))
        .await
        .unwrap();
    let session = store.client().session().id();
    relay.stall(Direction::ToServer, true);
    let reads = {
        let store = store.clone();
        tokio::spawn(async move {
            let (ledger, bookies) = tokio::join!(store.read_ledger(id), store.list_bookies());
            (ledger, bookies)
        })
    };
    // The reads are in flight once the stalled relay holds their request bytes (the ledger
    // read's first: `join!` sends it first); a cut before that would leave them to be sent
    // after the reconnect, which needs no retry.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while relay.held_bytes(Direction::ToServer) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reads never reached the relay"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    relay.cut();
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.stall(Direction::ToServer, false);
    relay.heal();
    let (ledger, bookies) = tokio::time::timeout(PATIENCE, reads)
        .await
        .unwrap()
        .unwrap();
    let ledger = ledger.expect("the ledger read in flight answers once reconnected");
    assert_eq!(ledger.value.fragments[0].bookies.len(), 2);
    assert!(bookies.expect("the bookie listing answers").is_empty());
    assert_eq!(store.client().session().id(), session, "the same session");
    assert!(!*store.session_lost().borrow());
    drop(store);
    zk.stop();
}

/// Goal: a session that watches more znodes than one SetWatches packet carries survives a
/// disconnection shorter than its timeout (issue 29: a proxy owning thousands of streams, one
/// data watch per stream lock, lost its ZooKeeper connection, logged "recv response with xid -8
/// but no pending request", then "session expired", and exited with its streams while the
/// server still held its session).
/// Method: a store with a 20 s session through a loopback relay takes the locks of 3,000
/// streams, whose lock paths add up to more than 128 KiB, the size at which the client splits
/// the watches it re-arms on reconnect into several SetWatches packets (as the Java client does,
/// ZOOKEEPER-706), each answered with xid -8. Cut the relay until the client sees the
/// disconnection, heal it, and require: a write answers on the same session, no lease and not
/// the session is lost, and a lock node deleted afterwards by another session flips its lease
/// (its watch was re-armed). Without the fix the second xid -8 reply fails every reconnect, and
/// the client declares the session expired 1.4 × its timeout after the cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_with_many_watches_survives_a_reconnect() {
    /// The client's (and the Java client's) split point for SetWatches packets.
    const SET_WATCHES_PACKET_BYTES: usize = 128 * 1024;
    const STREAMS: usize = 3_000;
    let zk = ZooKeeperServer::start();
    let relay = TcpRelay::start(zk.connect_string().parse().unwrap());
    let store = ZkStore::connect(&relay.connect_string(), "/quire", Duration::from_secs(20))
        .await
        .expect("connect to ZooKeeper through the relay");
    let other = connect(&zk, "/quire").await;

    // Take the locks, a bounded number in flight at a time.
    let mut leases = Vec::with_capacity(STREAMS);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..STREAMS {
        if tasks.len() >= 64 {
            leases.push(tasks.join_next().await.unwrap().unwrap());
        }
        let store = store.clone();
        tasks.spawn(async move {
            let name = format!("tenant-{}/stream-{i:05}", i % 7);
            store
                .try_acquire_stream(&name, "proxy-a")
                .await
                .unwrap()
                .expect("nobody else holds it")
        });
    }
    while let Some(lease) = tasks.join_next().await {
        leases.push(lease.unwrap());
    }
    let watched_bytes: usize = leases.iter().map(|l| l.token.len()).sum();
    assert!(
        watched_bytes > SET_WATCHES_PACKET_BYTES,
        "{watched_bytes} bytes of watched paths fit one SetWatches packet; the test needs more"
    );

    let session = store.client().session_id();
    let mut states = store.client().state_watcher();
    relay.cut();
    tokio::time::timeout(PATIENCE, async {
        while states.changed().await != zookeeper_client::SessionState::Disconnected {}
    })
    .await
    .expect("the client sees the cut");
    relay.heal();

    // A write on the same session: the client reconnected and serves requests again.
    tokio::time::timeout(PATIENCE, async {
        loop {
            match store
                .client()
                .create(
                    "/quire-reconnected",
                    b"",
                    &zookeeper_client::CreateMode::Persistent
                        .with_acls(zookeeper_client::Acls::anyone_all()),
                )
                .await
            {
                Ok(_) => break,
                Err(zookeeper_client::Error::ConnectionLoss) => {
                    // Sent while still reconnecting; the session may well live on.
                    assert!(!*store.session_lost().borrow(), "the session was lost");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("the write after the reconnect failed: {e}"),
            }
        }
    })
    .await
    .expect("a write answers after the reconnect");
    assert_eq!(store.client().session_id(), session, "the same session");
    assert!(!*store.session_lost().borrow());
    assert!(leases.iter().all(|l| !*l.lost.borrow()), "no lease is lost");

    // The watches were re-armed: a lock node deleted by another session flips its lease.
    let victim = &leases[STREAMS / 2];
    let mut lost = victim.lost.clone();
    other.client().delete(&victim.token, None).await.unwrap();
    tokio::time::timeout(PATIENCE, lost.wait_for(|l| *l))
        .await
        .expect("the lease of the deleted lock node flips")
        .unwrap();
    assert!(
        leases
            .iter()
            .filter(|l| l.token != victim.token)
            .all(|l| !*l.lost.borrow()),
        "only the deleted node's lease is lost"
    );
    drop((leases, store, other));
    zk.stop();
}

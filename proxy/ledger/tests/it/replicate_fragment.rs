//! Goal: re-replication of one fragment (`BookKeeper::replicate_fragment`, BookKeeper's
//! `LedgerFragmentReplicator`) against real bookies: a lost bookie's entries of a closed
//! ledger, one of them at the largest entry size the client accepts, are copied byte for byte
//! to a bookie outside the ensemble and the bookie is replaced in the metadata; an entry the
//! replacement already holds identically is kept; one it holds with other bytes (a divergent
//! replica) fails the copy without overwriting it and without changing the metadata; the last
//! fragment of an open ledger is refused (its end is unknown); a copy racing the writer's own
//! ensemble change and close resolves the compare-and-set conflicts and leaves every fragment
//! whole.
//! Method: real one-shard bookies on 127.0.0.1 with O_DIRECT files in a temporary directory,
//! the embedded metadata store; `Bookie::shutdown` plus unregistration is the lost bookie;
//! replicas are read back and planted over the bookie wire protocol.

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use quire_bookie::Bookie;
use quire_ledger::{BookKeeper, ClientConfig, Error, LedgerOptions};
use quire_metadata::{BookieId, EmbeddedStore, LedgerState, MetadataStore};
use quire_testkit::bookies::start_registered_bookies;
use quire_wire::bookie::{decode_response, encode_request, Request, Response, Status};
use quire_wire::entry::{encode_entry, EntryHeader};
use quire_wire::frame::{decode_frame, FRAME_SIZE_BYTES_MAX_DEFAULT};
use quire_wire::{EntryId, LedgerId, MasterKey};

/// One request over a fresh connection (after the handshake); the decoded answer, owned.
fn call(addr: &str, req: &Request<'_>) -> Result<Option<Vec<u8>>, Status> {
    let mut conn = TcpStream::connect(addr).unwrap();
    let mut out = Vec::new();
    encode_request(
        &mut out,
        1,
        &Request::Hello {
            version_min: 1,
            version_max: 1,
        },
    );
    encode_request(&mut out, 2, req);
    conn.write_all(&out).unwrap();
    let mut buf = Vec::new();
    let mut frames = Vec::new();
    while frames.len() < 2 {
        if let Some((_, used)) = decode_frame(&buf, FRAME_SIZE_BYTES_MAX_DEFAULT).unwrap() {
            frames.push(buf.drain(..used).collect::<Vec<u8>>());
            continue;
        }
        let mut chunk = vec![0u8; 1 << 16];
        let n = conn.read(&mut chunk).unwrap();
        assert!(n > 0, "bookie closed the connection");
        buf.extend_from_slice(&chunk[..n]);
    }
    let (frame, _) = decode_frame(&frames[1], FRAME_SIZE_BYTES_MAX_DEFAULT)
        .unwrap()
        .unwrap();
    match decode_response(&frame).unwrap() {
        Response::Read { data, .. } => Ok(Some(data.to_vec())),
        Response::Add { .. } => Ok(None),
        Response::Failed { status, .. } => Err(status),
        other => panic!("unexpected answer {other:?}"),
    }
}

fn read(addr: &str, ledger: LedgerId, entry: u64) -> Option<Vec<u8>> {
    match call(
        addr,
        &Request::Read {
            ledger,
            entry: Some(EntryId(entry)),
            fence: None,
        },
    ) {
        Ok(data) => data,
        Err(Status::NoSuchEntry | Status::NoSuchLedger) => None,
        Err(s) => panic!("read of {ledger}/{entry} from {addr}: {s:?}"),
    }
}

fn plant(addr: &str, key: MasterKey, bytes: &[u8]) {
    call(
        addr,
        &Request::Add {
            recovery: true,
            master_key: key,
            entry: bytes,
        },
    )
    .unwrap();
}

fn options() -> LedgerOptions {
    LedgerOptions {
        ensemble_size: 3,
        write_quorum: 3,
        ack_quorum: 2,
        password: b"pw".to_vec(),
        custom: BTreeMap::new(),
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    store: Arc<dyn MetadataStore>,
    bookies: Vec<Option<Bookie>>,
    bk: BookKeeper,
}

async fn setup(n: usize) -> Setup {
    let dir = tempfile::Builder::new()
        .prefix("quire-rereplicate-")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let store = EmbeddedStore::open(&dir.path().join("meta")).unwrap();
    let bookies = start_registered_bookies(dir.path(), n, &store).await;
    let store: Arc<dyn MetadataStore> = Arc::new(store);
    let bk = BookKeeper::new(store.clone(), ClientConfig::default());
    Setup {
        _dir: dir,
        store,
        bookies: bookies.into_iter().map(Some).collect(),
        bk,
    }
}

impl Setup {
    /// Stops the bookie `id` and removes its registration: a lost bookie.
    async fn lose(&mut self, id: &BookieId) {
        let i = self
            .bookies
            .iter()
            .position(|b| b.as_ref().is_some_and(|b| b.addr().to_string() == id.0))
            .unwrap();
        let b = self.bookies[i].take().unwrap();
        tokio::task::spawn_blocking(move || b.shutdown().unwrap())
            .await
            .unwrap();
        self.store.unregister_bookie(id).await.unwrap();
    }

    fn spares(&self, ensemble: &[BookieId]) -> Vec<String> {
        self.bookies
            .iter()
            .flatten()
            .map(|b| b.addr().to_string())
            .filter(|a| !ensemble.iter().any(|e| e.0 == *a))
            .collect()
    }
}

/// Writes `payloads` to a new ledger and closes it.
async fn closed_ledger(bk: &BookKeeper, payloads: &[Vec<u8>]) -> LedgerId {
    let w = bk.create_ledger(options()).await.unwrap();
    let adds: Vec<_> = payloads.iter().map(|p| w.add(p.clone())).collect();
    for a in adds {
        a.await.unwrap();
    }
    w.close().await.unwrap();
    w.id()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_bookies_entries_are_copied_and_the_bookie_replaced() {
    let mut s = setup(5).await;
    // The largest payload the ledger client takes in one entry travels like any other.
    let big = vec![0x5a; quire_proxy_entry_max()];
    let mut payloads: Vec<Vec<u8>> = (0..40).map(|i| format!("entry-{i}").into_bytes()).collect();
    payloads.insert(17, big);
    let id = closed_ledger(&s.bk, &payloads).await;
    let before = s.store.read_ledger(id).await.unwrap();
    let ensemble = before.value.fragments[0].bookies.clone();
    let lost = ensemble[1].clone();
    s.lose(&lost).await;

    let done =
        s.bk.replicate_fragment(id, 0, &lost, &HashSet::new())
            .await
            .unwrap();
    assert_eq!(done.position, 1);
    assert_eq!(done.entries_copied, payloads.len() as u64);
    assert_eq!(done.entries_present, 0);
    assert!(!ensemble.contains(&done.to), "{:?}", done.to);
    let after = s.store.read_ledger(id).await.unwrap().value;
    let mut want = ensemble.clone();
    want[1] = done.to.clone();
    assert_eq!(after.fragments[0].bookies, want);
    assert_eq!(after.state, LedgerState::Closed);
    assert_eq!(after.last_entry, before.value.last_entry);
    let mut bytes = 0;
    for e in 0..payloads.len() as u64 {
        let copy = read(&done.to.0, id, e).expect("copied");
        let source = read(&ensemble[0].0, id, e).unwrap();
        assert_eq!(copy, source, "entry {e}");
        bytes += copy.len() as u64;
    }
    assert_eq!(done.bytes_copied, bytes);
    // The ledger reads back through the client, entry by entry.
    let reader = s.bk.open_ledger(id).await.unwrap();
    for (e, p) in payloads.iter().enumerate() {
        assert_eq!(&reader.read(EntryId(e as u64)).await.unwrap(), p);
    }
    // Done: the fragment no longer holds the lost bookie.
    assert!(matches!(
        s.bk.replicate_fragment(id, 0, &lost, &HashSet::new()).await,
        Err(Error::Recovery { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_divergent_replica_is_never_overwritten_and_an_identical_one_is_kept() {
    // Five bookies: the ensemble of three and two spares, one of them kept out of the choice
    // (`avoid`), so the other is the only possible target.
    let mut s = setup(5).await;
    let payloads: Vec<Vec<u8>> = (0..10).map(|i| format!("p{i}").into_bytes()).collect();
    let id = closed_ledger(&s.bk, &payloads).await;
    let before = s.store.read_ledger(id).await.unwrap();
    let ensemble = before.value.fragments[0].bookies.clone();
    let key = before.value.master_key().unwrap();
    let mut spares = s.spares(&ensemble);
    let spare = spares.pop().unwrap();
    let avoid: HashSet<BookieId> = [BookieId(spares.pop().unwrap())].into_iter().collect();
    // The spare already holds entry 0 as it should, and entry 5 with other (well-formed) bytes.
    let good = read(&ensemble[0].0, id, 0).unwrap();
    plant(&spare, key, &good);
    let original = read(&ensemble[0].0, id, 5).unwrap();
    let header = quire_wire::entry::peek_header(&original).unwrap();
    let forged = encode_entry(
        EntryHeader {
            ledger: id,
            entry: EntryId(5),
            lac: header.lac,
            length_bytes: header.length_bytes,
        },
        b"not what was written",
    );
    plant(&spare, key, &forged);
    let lost = ensemble[2].clone();
    s.lose(&lost).await;

    let err =
        s.bk.replicate_fragment(id, 0, &lost, &avoid)
            .await
            .unwrap_err();
    assert!(
        matches!(&err, Error::DivergentReplica { entry: 5, bookie, .. } if *bookie == spare),
        "{err}"
    );
    assert_eq!(read(&spare, id, 5).unwrap(), forged, "not overwritten");
    let now = s.store.read_ledger(id).await.unwrap();
    assert_eq!(now.version, before.version, "metadata unchanged");
    assert_eq!(now.value, before.value);

    // With the divergent replica gone from the picture (a ledger without it), an identical
    // replica already there counts as present, not copied again.
    let id2 = closed_ledger(&s.bk, &payloads).await;
    let meta2 = s.store.read_ledger(id2).await.unwrap().value;
    let lost2 = meta2.fragments[0].bookies[0].clone();
    let target2: Vec<String> = s.spares(&meta2.fragments[0].bookies);
    assert_eq!(target2.len(), 1);
    // Each ledger has its own master key (derived from the writer's secret and its id).
    plant(
        &target2[0],
        meta2.master_key().unwrap(),
        &read(&meta2.fragments[0].bookies[1].0, id2, 3).unwrap(),
    );
    s.lose(&lost2).await;
    let done =
        s.bk.replicate_fragment(id2, 0, &lost2, &HashSet::new())
            .await
            .unwrap();
    assert_eq!(done.to.0, target2[0]);
    assert_eq!((done.entries_present, done.entries_copied), (1, 9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_fragment_of_an_open_ledger_is_refused() {
    let s = setup(4).await;
    let w = s.bk.create_ledger(options()).await.unwrap();
    w.add(b"x".to_vec()).await.unwrap();
    let meta = s.store.read_ledger(w.id()).await.unwrap();
    let lost = meta.value.fragments[0].bookies[0].clone();
    let err =
        s.bk.replicate_fragment(w.id(), 0, &lost, &HashSet::new())
            .await
            .unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{err}");
    assert_eq!(
        s.store.read_ledger(w.id()).await.unwrap().version,
        meta.version
    );
}

/// The largest entry the proxy writes (`quire_client::record_set::ENTRY_SIZE_BYTES_MAX`,
/// 1 MiB − 4 KiB; this crate cannot depend on the proxy's).
fn quire_proxy_entry_max() -> usize {
    1024 * 1024 - 4 * 1024
}

/// Every entry of `meta`'s fragments with a known end is on each bookie of its write set that
/// is not in `dead`, identical to the payload written; returns the bookies of `dead` still named.
fn check_fragments(
    meta: &quire_metadata::LedgerMetadata,
    id: LedgerId,
    dead: &HashSet<BookieId>,
    payloads: &[Vec<u8>],
) -> HashSet<BookieId> {
    let mut named_dead = HashSet::new();
    for (i, f) in meta.fragments.iter().enumerate() {
        let Some((first, last)) = quire_ledger::fragment_range(meta, i).unwrap() else {
            continue;
        };
        for e in first..=last {
            for pos in quire_ledger::quorum::write_set(e, meta.ensemble_size, meta.write_quorum) {
                let b = &f.bookies[pos];
                if dead.contains(b) {
                    named_dead.insert(b.clone());
                    continue;
                }
                let got = read(&b.0, id, e)
                    .unwrap_or_else(|| panic!("ledger {id} entry {e} missing on {b}: {meta:?}"));
                assert!(
                    got.ends_with(&payloads[e as usize]),
                    "ledger {id} entry {e} on {b} has other bytes"
                );
            }
        }
    }
    named_dead
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_replication_racing_the_writers_ensemble_change_and_close_leaves_every_fragment_whole() {
    // Goal: re-replication of a fragment of a ledger still being written, racing the writer's
    // own ensemble change (another bookie fails meanwhile) and the writer's close: both
    // compare-and-set updates of the metadata land (a lost race re-reads and checks again),
    // and no fragment names a live bookie that lacks its entries.
    // Method: per round a ledger written in three parts: after the first part
    // bookie A of the ensemble is lost, so the writer moves to a second fragment; then the
    // copy of A's first fragment starts while a task loses bookie B of the current fragment,
    // writes the third part (a second ensemble change) and closes the ledger. Four rounds with
    // different head starts for the copy (eleven bookies: each round loses two). Afterwards A is named nowhere, every live bookie
    // named holds its entries, and once B's fragment is copied too no fragment names a dead
    // bookie.
    let mut s = setup(11).await;
    let mut dead: HashSet<BookieId> = HashSet::new();
    for (round, head_start_ms) in [(0u64, 0u64), (1, 3), (2, 10), (3, 30)] {
        // A first fragment of 200 entries of 32 KiB: its copy takes long enough that the
        // writer's ensemble change and close land while it runs, before its compare-and-set.
        let payloads: Vec<Vec<u8>> = (0..300)
            .map(|i| format!("round-{round}-entry-{i}-{}", "x".repeat(32 << 10)).into_bytes())
            .collect();
        let w = Arc::new(s.bk.create_ledger(options()).await.unwrap());
        let id = w.id();
        for p in &payloads[..200] {
            w.add(p.clone()).await.unwrap();
        }
        let a = s.store.read_ledger(id).await.unwrap().value.fragments[0].bookies[0].clone();
        s.lose(&a).await;
        dead.insert(a.clone());
        for p in &payloads[200..250] {
            w.add(p.clone()).await.unwrap();
        }
        let meta = s.store.read_ledger(id).await.unwrap().value;
        assert!(
            meta.fragments.len() >= 2,
            "the writer moved off {a}: {meta:?}"
        );
        assert!(!meta.fragments.last().unwrap().bookies.contains(&a));
        // B: a bookie of the current fragment, stopped by the racing task.
        let b = meta.fragments.last().unwrap().bookies[1].clone();
        let bi = s
            .bookies
            .iter()
            .position(|x| x.as_ref().is_some_and(|x| x.addr().to_string() == b.0))
            .unwrap();
        let b_bookie = s.bookies[bi].take().unwrap();
        dead.insert(b.clone());
        let started = std::time::Instant::now();
        let copy = {
            let bk = s.bk.clone();
            let a = a.clone();
            // B is about to die: not a target (a copy to a bookie that dies fails, rightly).
            let avoid = HashSet::from([b.clone()]);
            tokio::spawn(async move { bk.replicate_fragment(id, 0, &a, &avoid).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(head_start_ms)).await;
        let racer = {
            let (w, store, b) = (w.clone(), s.store.clone(), b.clone());
            let tail: Vec<Vec<u8>> = payloads[250..].to_vec();
            tokio::spawn(async move {
                tokio::task::spawn_blocking(move || b_bookie.shutdown().unwrap())
                    .await
                    .unwrap();
                store.unregister_bookie(&b).await.unwrap();
                let adds: Vec<_> = tail.into_iter().map(|p| w.add(p)).collect();
                for a in adds {
                    a.await.unwrap();
                }
                w.close().await.unwrap();
                started.elapsed()
            })
        };
        let copied = copy.await.unwrap().expect("re-replication of fragment 0");
        let copy_took = started.elapsed();
        let racer_took = racer.await.unwrap();
        eprintln!(
            "round {round}: copy done after {copy_took:?}, writer closed after {racer_took:?}"
        );
        let meta = s.store.read_ledger(id).await.unwrap().value;
        assert_eq!(meta.state, LedgerState::Closed);
        assert_eq!(meta.last_entry, Some(299));
        assert_eq!(meta.fragments[0].bookies[0], copied.to);
        assert!(
            meta.fragments.iter().all(|f| !f.bookies.contains(&a)),
            "{a} still named: {meta:?}"
        );
        // B is still named where it held entries (nothing copied them yet): copy them, then
        // nothing dead is named and every replica is whole.
        let named_dead = check_fragments(&meta, id, &dead, &payloads);
        let mut named: Vec<(u64, BookieId)> = meta
            .fragments
            .iter()
            .flat_map(|f| {
                f.bookies
                    .iter()
                    .filter(|x| named_dead.contains(*x))
                    .map(|x| (f.first_entry, x.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        named.sort();
        for (first_entry, x) in named {
            s.bk.replicate_fragment(id, first_entry, &x, &HashSet::new())
                .await
                .unwrap_or_else(|e| panic!("fragment {first_entry} of {x}: {e}"));
        }
        let meta = s.store.read_ledger(id).await.unwrap().value;
        assert!(check_fragments(&meta, id, &dead, &payloads).is_empty());
    }
}

/// Issue 23 item 2: entry 5 of an open ledger (E=W=3, Qa=2) is stored by two bookies with
/// different bytes, P and Q, neither acknowledged, and the third lacks it (a buggy second
/// writer with the ledger's key: raw normal adds). Recovery (fencing reads in write-set order
/// 2, 0, 1, so position 0's copy is met first) must not close the ledger while a bookie holds
/// other bytes: it re-adds one copy and the bookie holding the other replaces it, so that
/// every replica reads back byte-identical. `first` is the copy at position 0.
async fn recovery_repairs_a_divergent_replica(p_at_position_0: bool) {
    // Three bookies, so that no bookie outside the ensemble can replace the divergent one.
    let s = setup(3).await;
    let w = s.bk.create_ledger(options()).await.unwrap();
    for i in 0..5u64 {
        w.add(format!("acked-{i}").into_bytes()).await.unwrap();
    }
    let id = w.id();
    let meta = s.store.read_ledger(id).await.unwrap().value;
    let ensemble = meta.fragments[0].bookies.clone();
    let key = meta.master_key().unwrap();
    // Entry 4 reached Qa; the third bookie may not hold it yet.
    let entry_4 = ensemble.iter().find_map(|b| read(&b.0, id, 4)).unwrap();
    let before = quire_wire::entry::peek_header(&entry_4).unwrap();
    let copy = |payload: &[u8]| {
        encode_entry(
            EntryHeader {
                ledger: id,
                entry: EntryId(5),
                lac: Some(EntryId(4)),
                length_bytes: before.length_bytes + payload.len() as u64,
            },
            payload,
        )
    };
    let (p, q) = (copy(b"P: one writer's entry 5"), copy(b"Q: the other's"));
    let (at0, at1) = if p_at_position_0 { (&p, &q) } else { (&q, &p) };
    for (pos, bytes) in [(0, at0), (1, at1)] {
        call(
            &ensemble[pos].0,
            &Request::Add {
                recovery: false,
                master_key: key,
                entry: bytes,
            },
        )
        .unwrap();
    }
    assert_eq!(read(&ensemble[2].0, id, 5), None);

    let closed = s.bk.recover_ledger(id).await.unwrap();
    assert_eq!(closed.state, LedgerState::Closed);
    assert_eq!(closed.last_entry, Some(5));
    let replicas: Vec<Option<Vec<u8>>> = ensemble.iter().map(|b| read(&b.0, id, 5)).collect();
    // Neither copy was confirmed (one bookie each): the first met in write-set order wins.
    assert!(
        replicas.iter().all(|r| r.as_ref() == Some(at0)),
        "replicas of entry 5 differ after recovery: {:?}",
        replicas
            .iter()
            .map(|r| r
                .as_ref()
                .map(|b| String::from_utf8_lossy(&b[36..]).into_owned()))
            .collect::<Vec<_>>()
    );
    let header = quire_wire::entry::peek_header(at0).unwrap();
    assert_eq!(closed.length_bytes, header.length_bytes);
    let reader = s.bk.open_ledger(id).await.unwrap();
    assert_eq!(reader.read(EntryId(5)).await.unwrap(), at0[36..].to_vec());
    for i in 0..5u64 {
        assert_eq!(
            reader.read(EntryId(i)).await.unwrap(),
            format!("acked-{i}").into_bytes()
        );
    }
    drop(w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue23_item2_recovery_repairs_a_divergent_replica_reading_p_first() {
    recovery_repairs_a_divergent_replica(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue23_item2_recovery_repairs_a_divergent_replica_reading_q_first() {
    recovery_repairs_a_divergent_replica(false).await;
}

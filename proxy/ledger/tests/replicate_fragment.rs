//! Goal: re-replication of one fragment (`BookKeeper::replicate_fragment`, BookKeeper's
//! `LedgerFragmentReplicator`) against real bookies: a lost bookie's entries of a closed
//! ledger, one of them at the largest entry size the client accepts, are copied byte for byte
//! to a bookie outside the ensemble and the bookie is replaced in the metadata; an entry the
//! replacement already holds identically is kept; one it holds with other bytes (a divergent
//! replica) fails the copy without overwriting it and without changing the metadata; the last
//! fragment of an open ledger is refused (its end is unknown).
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
    plant(
        &target2[0],
        key,
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

/// The largest entry the proxy writes (`quire_proxy::record_set::ENTRY_SIZE_BYTES_MAX`,
/// 1 MiB − 4 KiB; this crate cannot depend on the proxy's).
fn quire_proxy_entry_max() -> usize {
    1024 * 1024 - 4 * 1024
}

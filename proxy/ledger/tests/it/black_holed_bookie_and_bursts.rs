//! Goal: two defects of the ledger client's connection handling (issue 12, item 5).
//! - The pool must not hold its table lock across a connect (TCP connect and handshake, up to
//!   the request timeout): one black-holed bookie would stall every lookup of every bookie.
//!   Here a read of a ledger on healthy bookies completes while a connect to a black hole made
//!   through the same client is still pending.
//! - A connection's send queue must not be bounded by a number of frames (it was 8,192): a
//!   burst of small adds to healthy bookies failed as "bookie unreachable", which makes a writer
//!   replace a healthy bookie. Here 10,000 adds sent at once all succeed, with no ensemble
//!   change.
//!
//! Method: three real bookies (E=3, Qw=3, Qa=2) on loopback. The black hole is a listener that
//!   accepts and never answers, named in place of one bookie by a rewrite of a closed ledger's
//!   metadata; the stall is shown by order (the healthy reads finish while the black-holed read
//!   has not), with a 60 s request timeout as the only clock. The burst runs on a
//!   current-thread runtime, so no connection task can send a frame while the adds are queued:
//!   every frame of the burst is in the queue at once, deterministically.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quire_ledger::{BookKeeper, ClientConfig, LedgerOptions};
use quire_metadata::{BookieId, EmbeddedStore, MetadataStore};
use quire_testkit::bookies::start_registered_bookies;
use quire_wire::EntryId;

fn opts() -> LedgerOptions {
    LedgerOptions {
        ensemble_size: 3,
        write_quorum: 3,
        ack_quorum: 2,
        password: b"pw".to_vec(),
        custom: BTreeMap::new(),
    }
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("quire-pool-")
        .tempdir_in(std::env::temp_dir())
        .unwrap()
}

/// A client whose requests time out only after a minute: long enough that a black-holed
/// handshake stays pending for the whole check, and that a slow machine never times out.
fn patient_config() -> ClientConfig {
    ClientConfig {
        request_timeout: Duration::from_secs(60),
        ..ClientConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_bookie_does_not_stall_other_lookups() {
    let dir = tempdir();
    let store = EmbeddedStore::open(&dir.path().join("meta")).unwrap();
    let bookies = start_registered_bookies(dir.path(), 3, &store).await;
    let store: Arc<dyn MetadataStore> = Arc::new(store);
    let writer_client = BookKeeper::new(store.clone(), ClientConfig::default());
    let mut ids = Vec::new();
    for _ in 0..2 {
        let w = writer_client.create_ledger(opts()).await.unwrap();
        for i in 0..3u32 {
            w.add(format!("entry {i}").into_bytes()).await.unwrap();
        }
        w.close().await.unwrap();
        ids.push(w.id());
    }
    // Ensemble position 1 of the first ledger becomes a black hole: it accepts connections
    // (keeping them) and never answers.
    let hole = std::net::TcpListener::bind(("127.0.0.1", quire_testkit::free_port())).unwrap();
    hole.set_nonblocking(true).unwrap();
    let hole = tokio::net::TcpListener::from_std(hole).unwrap();
    let hole_addr = hole.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let hole_task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = hole.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            held.push(socket);
        }
    });
    let current = store.read_ledger(ids[0]).await.unwrap();
    let mut meta = current.value.clone();
    meta.fragments[0].bookies[1] = BookieId(hole_addr);
    store
        .update_ledger(ids[0], &meta, current.version)
        .await
        .unwrap();

    // One client for both readers: they share its connection pool.
    let client = BookKeeper::new(store.clone(), patient_config());
    let holed = client.open_ledger(ids[0]).await.unwrap();
    let healthy = client.open_ledger(ids[1]).await.unwrap();
    // Entry 1's write set starts at position 1: the black hole is asked first.
    let stuck = tokio::spawn(async move { holed.read(EntryId(1)).await });
    // Wait for the event, not for a time: the black hole accepted the connection, so the
    // stuck read is inside its connect (the handshake) now.
    while accepted.load(Ordering::SeqCst) == 0 {
        assert!(
            !stuck.is_finished(),
            "the read of the black hole ended early"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for e in 0..3u64 {
        assert_eq!(
            healthy.read(EntryId(e)).await.unwrap(),
            format!("entry {e}").into_bytes()
        );
    }
    assert!(
        !stuck.is_finished(),
        "the healthy reads finished only after the black-holed connect gave up"
    );
    stuck.abort();
    hole_task.abort();
    drop(bookies);
}

#[tokio::test]
async fn a_burst_of_small_adds_is_not_a_bookie_failure() {
    const ADDS: u32 = 10_000;
    let dir = tempdir();
    let store = EmbeddedStore::open(&dir.path().join("meta")).unwrap();
    let bookies = start_registered_bookies(dir.path(), 3, &store).await;
    let store: Arc<dyn MetadataStore> = Arc::new(store);
    let client = BookKeeper::new(store.clone(), patient_config());
    let w = client.create_ledger(opts()).await.unwrap();
    // `add` puts the entry in each bookie's send queue before it returns, and nothing awaits
    // in this loop: each connection holds all 10,000 frames at once (the old bound was 8,192).
    let adds: Vec<_> = (0..ADDS).map(|i| w.add(i.to_le_bytes().to_vec())).collect();
    for (i, add) in adds.into_iter().enumerate() {
        add.await
            .unwrap_or_else(|e| panic!("add {i} of the burst failed: {e}"));
    }
    w.close().await.unwrap();
    let meta = store.read_ledger(w.id()).await.unwrap().value;
    assert_eq!(meta.fragments.len(), 1, "an ensemble change: {meta:?}");
    assert_eq!(meta.last_entry, Some(u64::from(ADDS) - 1));
    let reader = client.open_ledger(w.id()).await.unwrap();
    for i in (0..ADDS).step_by(997) {
        assert_eq!(
            reader.read(EntryId(u64::from(i))).await.unwrap(),
            i.to_le_bytes().to_vec()
        );
    }
    drop(bookies);
}

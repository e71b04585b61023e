//! Goal: a replica that stalls (accepts TCP but never answers) costs a reader one request
//! timeout per quarantine period, not one per entry: after the first timeout the client asks
//! the other replicas of each write set first.
//! Method: write 30 entries to three real bookies (E=3, Qw=3, Qa=2) and close the ledger; then
//! rewrite its metadata so that one ensemble position names a listener that accepts connections
//! and never answers; read all 30 entries with a 300 ms request timeout and count the
//! connections that listener accepted. Without the quarantine every entry whose write set
//! starts at that position (10 of 30) would connect to it again.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quire_ledger::{BookKeeper, ClientConfig, LedgerOptions};
use quire_metadata::{BookieId, EmbeddedStore, MetadataStore};
use quire_testkit::bookies::start_registered_bookies;
use quire_wire::EntryId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_replica_is_asked_last_after_its_first_timeout() {
    let dir = tempfile::Builder::new()
        .prefix("quire-stall-")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let store = EmbeddedStore::open(&dir.path().join("meta")).unwrap();
    let bookies = start_registered_bookies(dir.path(), 3, &store).await;
    let store: Arc<dyn MetadataStore> = Arc::new(store);
    let writer_client = BookKeeper::new(store.clone(), ClientConfig::default());
    let opts = LedgerOptions {
        ensemble_size: 3,
        write_quorum: 3,
        ack_quorum: 2,
        password: b"pw".to_vec(),
        custom: BTreeMap::new(),
    };
    let writer = writer_client.create_ledger(opts).await.unwrap();
    for i in 0..30u32 {
        writer.add(format!("entry {i}").into_bytes()).await.unwrap();
    }
    writer.close().await.unwrap();

    // A listener that accepts and never answers, counting connections; it keeps the sockets.
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole_addr = hole.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = hole.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            held.push(socket);
        }
    });
    let current = store.read_ledger(writer.id()).await.unwrap();
    let mut meta = current.value.clone();
    meta.fragments[0].bookies[1] = BookieId(hole_addr);
    store
        .update_ledger(writer.id(), &meta, current.version)
        .await
        .unwrap();

    let config = ClientConfig {
        request_timeout: Duration::from_millis(300),
        ..ClientConfig::default()
    };
    let reader = BookKeeper::new(store.clone(), config)
        .open_ledger(writer.id())
        .await
        .unwrap();
    for e in 0..30u64 {
        assert_eq!(
            reader.read(EntryId(e)).await.unwrap(),
            format!("entry {e}").into_bytes()
        );
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "the stalled replica was asked again after timing out"
    );
    drop(bookies);
}

//! Goal: a writer whose connections the bookies closed for being idle (the bookie port's
//! `idle_timeout`, issue 12) goes on writing on new connections: no add fails and no ensemble
//! change happens, although there is no spare bookie to change to.
//! Method: three real one-shard bookies on 127.0.0.1 with a 1 s idle timeout, the embedded
//! metadata store, an E=3 Qw=3 Qa=2 ledger; adds, a pause of 2.5 s (past the idle timeout, so
//! the bookies close the writer's connections), more adds. Without the writer reconnecting,
//! every add after the pause fails on all three bookies, no replacement exists, and the
//! writer fails.

use std::sync::Arc;
use std::time::Duration;

use quire_bookie::Bookie;
use quire_ledger::{BookKeeper, ClientConfig, LedgerOptions};
use quire_metadata::{EmbeddedStore, MetadataStore};
use quire_testkit::bookies::{small_bookie_config, start_registered_bookie};
use quire_wire::EntryId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_goes_on_after_bookies_close_its_idle_connections() {
    let dir = tempfile::Builder::new()
        .prefix("quire-idle-")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let store = EmbeddedStore::open(&dir.path().join("meta")).unwrap();
    let mut bookies: Vec<Bookie> = Vec::new();
    for i in 0..3 {
        let mut c = small_bookie_config(dir.path(), i, "127.0.0.1:0".parse().unwrap());
        c.idle_timeout = Duration::from_secs(1);
        bookies.push(start_registered_bookie(c, &store).await);
    }
    let store: Arc<dyn MetadataStore> = Arc::new(store);
    let bk = BookKeeper::new(store.clone(), ClientConfig::default());
    let w = bk
        .create_ledger(LedgerOptions {
            ensemble_size: 3,
            write_quorum: 3,
            ack_quorum: 2,
            password: b"pw".to_vec(),
            custom: Default::default(),
        })
        .await
        .unwrap();
    for i in 0..5u64 {
        assert_eq!(
            w.add(format!("before-{i}").into_bytes()).await.unwrap(),
            EntryId(i)
        );
    }
    // Past the idle timeout: each bookie closes the writer's connection.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for i in 5..10u64 {
        let got = w.add(format!("after-{i}").into_bytes()).await;
        assert_eq!(got.unwrap(), EntryId(i), "add {i} after the pause");
    }
    assert_eq!(w.ensemble_changes(), 0, "no ensemble change");
    let meta = w.close().await.unwrap();
    assert_eq!(meta.last_entry, Some(9));
    assert_eq!(meta.fragments.len(), 1);
    for b in bookies {
        tokio::task::spawn_blocking(move || b.shutdown())
            .await
            .unwrap()
            .unwrap();
    }
}

//! Goal: parked long polls must not starve plain entry reads. Since long polls ride the pooled
//! read-lane connection (one per bookie), every parked poll is an in-flight request on that
//! connection, and a bookie stops reading a connection at `IN_FLIGHT_REQUESTS_PER_CONNECTION_MAX`
//! (1024) in-flight requests. A client with that many tailing readers parked (one per ledger
//! tailed, as a DistributedLog proxy with many tailed streams has) must still be able to read
//! entries of any ledger.
//! Method: three real bookies (one shard each) on 127.0.0.1 with O_DIRECT journals under /tmp,
//! the embedded metadata store, one E3/Qw2/Qa2 ledger with two entries. 1100 long polls past
//! LAC 0 are started (they park, nothing new is written), then a plain read of entry 0 is
//! made; it must return the entry, not time out behind the parked polls.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use quire_ledger::{BookKeeper, ClientConfig, LedgerOptions};
use quire_metadata::{EmbeddedStore, MetadataStore};
use quire_testkit::bookies::start_registered_bookies;
use quire_wire::EntryId;

const PARKED_POLLS: usize = 1100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_goes_through_beside_many_parked_long_polls() {
    let dir = tempfile::Builder::new()
        .prefix("quire-ledger-lp-many-")
        .tempdir_in("/tmp")
        .unwrap();
    let store = EmbeddedStore::open(&dir.path().join("meta")).unwrap();
    let bookies = start_registered_bookies(dir.path(), 3, &store).await;
    let store: Arc<dyn MetadataStore> = Arc::new(store);
    let bk = BookKeeper::new(store, ClientConfig::default());
    let opts = LedgerOptions {
        ensemble_size: 3,
        write_quorum: 2,
        ack_quorum: 2,
        password: b"pw".to_vec(),
        custom: BTreeMap::new(),
    };
    let writer = bk.create_ledger(opts).await.unwrap();
    writer.add(b"zero".to_vec()).await.unwrap();
    writer.add(b"one".to_vec()).await.unwrap();
    let reader = bk.open_ledger(writer.id()).await.unwrap();

    let mut polls = Vec::new();
    for _ in 0..PARKED_POLLS {
        let r = reader.clone();
        polls.push(tokio::spawn(async move {
            r.read_lac_long_poll(Some(EntryId(0)), Duration::from_secs(30))
                .await
        }));
    }
    // Let the polls reach the bookies (setup only; nothing below depends on how long it took).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        polls.iter().all(|p| !p.is_finished()),
        "the polls must park (nothing was written past LAC 0)"
    );

    let read = reader.read(EntryId(0)).await;
    assert_eq!(
        read.as_deref().ok(),
        Some(&b"zero"[..]),
        "a plain read beside {PARKED_POLLS} parked long polls failed: {read:?}"
    );
    for p in polls {
        p.abort();
    }
    drop(bookies);
}

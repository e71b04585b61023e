//! Goal (issue 30 item 3): a replica that is slow but alive does not make every read whose
//! write set starts at it wait for its answer: after the speculative timeout the reader asks
//! the next replica too, and the first good answer wins; reads stay byte-identical. With
//! speculation off no read is speculative. A replica labelled far from the reader (another
//! rack) is asked last, so that it is never waited for at all.
//! Method: three real bookies (E=3, Qw=3, Qa=2) on 127.0.0.1, 60 entries written and the
//! ledger closed; then the ledger metadata names, at ensemble position 0, a TCP relay in front
//! of that bookie that holds every chunk 100 ms each way (a real bookie behind real TCP, made
//! slow). Entries e with e mod 3 = 0 have position 0 first in their write set. The assertions
//! count the client's speculative reads (`BookKeeper::speculative_reads`), never a time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use quire_ledger::{BookKeeper, ClientConfig, LedgerOptions, SpeculativeReads};
use quire_metadata::{BookieId, BookieInfo, EmbeddedStore, MetadataStore};
use quire_testkit::bookies::start_registered_bookies;
use quire_testkit::TcpRelay;
use quire_wire::{EntryId, LedgerId};

const ENTRIES: u64 = 60;

fn payload(e: u64) -> Vec<u8> {
    format!("entry {e} of the speculative read test").into_bytes()
}

/// A closed ledger of [`ENTRIES`] entries whose position 0 is behind a relay delaying 100 ms
/// each way; returns what the test must keep alive and the ledger id.
async fn slow_first_position(
    dir: &std::path::Path,
) -> (
    Arc<dyn MetadataStore>,
    Vec<quire_bookie::Bookie>,
    TcpRelay,
    LedgerId,
) {
    let store = EmbeddedStore::open(&dir.join("meta")).unwrap();
    let bookies = start_registered_bookies(dir, 3, &store).await;
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
    for e in 0..ENTRIES {
        writer.add(payload(e)).await.unwrap();
    }
    writer.close().await.unwrap();

    let current = store.read_ledger(writer.id()).await.unwrap();
    let mut meta = current.value.clone();
    let target = meta.fragments[0].bookies[0].0.parse().unwrap();
    let relay = TcpRelay::start(target);
    relay.delay(Some(Duration::from_millis(100)));
    meta.fragments[0].bookies[0] = BookieId(relay.connect_string());
    store
        .update_ledger(writer.id(), &meta, current.version)
        .await
        .unwrap();
    (store, bookies, relay, writer.id())
}

fn reader_config(speculative_ms: u64) -> ClientConfig {
    ClientConfig {
        speculative_read_timeout: Duration::from_millis(speculative_ms),
        // Below the slow replica's 200 ms round trip: even backed off, speculation helps.
        max_speculative_read_timeout: Duration::from_millis(100),
        ..ClientConfig::default()
    }
}

async fn read_all(client: &BookKeeper, ledger: LedgerId, entries: u64) {
    let reader = client.open_ledger(ledger).await.unwrap();
    for e in 0..entries {
        assert_eq!(
            reader.read(EntryId(e)).await.unwrap(),
            payload(e),
            "entry {e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_speculate_past_a_slow_replica_and_stay_correct() {
    let dir = tempfile::Builder::new()
        .prefix("quire-spec-")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let (store, bookies, _relay, ledger) = slow_first_position(dir.path()).await;

    let on = BookKeeper::new(store.clone(), reader_config(20));
    read_all(&on, ledger, ENTRIES).await;
    let counts = on.speculative_reads();
    // Every entry whose write set starts at the slow replica was answered by the next one,
    // asked speculatively (loaded machines may speculate on a few more, harmlessly).
    assert!(
        counts.won >= ENTRIES / 3,
        "{counts:?}: the reads that asked the slow replica first waited for it"
    );
    assert!(counts.sent >= counts.won, "{counts:?}");

    // Speculation off (timeout 0, as BookKeeper): the same reads wait for the slow replica.
    let off = BookKeeper::new(store.clone(), reader_config(0));
    read_all(&off, ledger, 15).await;
    assert_eq!(off.speculative_reads(), SpeculativeReads::default());
    drop(bookies);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_in_another_rack_is_asked_last() {
    let dir = tempfile::Builder::new()
        .prefix("quire-near-")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let (store, bookies, relay, ledger) = slow_first_position(dir.path()).await;
    // The registry's labels: the two direct bookies in rack r1, the slow one in rack r2.
    let meta = store.read_ledger(ledger).await.unwrap().value;
    for (i, b) in meta.fragments[0].bookies.iter().enumerate() {
        let rack = if i == 0 { "r2" } else { "r1" };
        store
            .register_bookie(BookieInfo {
                id: b.clone(),
                rack: Some(rack.into()),
                region: None,
                read_only: false,
            })
            .await
            .unwrap();
    }
    assert_eq!(meta.fragments[0].bookies[0].0, relay.connect_string());

    let near = BookKeeper::new(
        store.clone(),
        ClientConfig {
            rack: Some("r1".into()),
            ..reader_config(50)
        },
    );
    // The first read starts the listing of the registry's labels in the background; entry 1
    // starts at a near replica, so it does not speculate either way.
    read_all(&near, ledger, 2).await;
    wait_for_labels(&near, 3).await;
    let before = near.speculative_reads();
    read_all(&near, ledger, ENTRIES).await;
    let after = near.speculative_reads();
    assert_eq!(
        after.won, before.won,
        "with the labels known, the far replica is asked last and never waited for"
    );

    // `reorder_read_sequence` off (BookKeeper `reorderReadSequenceEnabled = false`): the same
    // client asks each write set in its order, so every entry whose write set starts at the
    // far replica waits for it until speculation asks the next one.
    let write_set = BookKeeper::new(
        store.clone(),
        ClientConfig {
            rack: Some("r1".into()),
            placement: quire_ledger::placement::PlacementSettings {
                reorder_read_sequence: false,
                ..Default::default()
            },
            ..reader_config(50)
        },
    );
    // With the switch off a read looks up no labels (and starts no listing): nothing to wait for.
    read_all(&write_set, ledger, 2).await;
    assert_eq!(write_set.known_bookie_labels(), 0);
    read_all(&write_set, ledger, ENTRIES).await;
    let counts = write_set.speculative_reads();
    assert!(
        counts.won >= ENTRIES / 3,
        "{counts:?}: in write-set order the far replica is asked first for a third of the entries"
    );
    drop(bookies);
}

/// Waits (10 s at most) until `client`'s background listing of the registry has brought the
/// labels of `bookies` bookies.
async fn wait_for_labels(client: &BookKeeper, bookies: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while client.known_bookie_labels() < bookies {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the client listed {} bookies' labels in 10 s, not {bookies}",
            client.known_bookie_labels()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

//! Goal: the embedded store's autorecovery records behave as ZooKeeper's: marks grow by
//! compare-and-set, keep their first time, survive a reopen and are removed only at the version
//! read; decommissions survive a reopen; replication locks and auditor candidates are
//! exclusive and end with their holder (the process, or the candidate's handle).
//! Method: real files in a temporary directory; reopen the store from the same directory.

use quire_metadata::*;
use quire_wire::LedgerId;

fn b(s: &str) -> BookieId {
    BookieId(s.into())
}

#[tokio::test]
async fn marks_and_decommissions_persist_and_compare() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    let l = LedgerId(7);
    store.mark_under_replicated(l, &[b("x:1")]).await.unwrap();
    let first = store.read_under_replicated(l).await.unwrap();
    store
        .mark_under_replicated(l, &[b("a:1"), b("x:1")])
        .await
        .unwrap();
    let grown = store.read_under_replicated(l).await.unwrap();
    assert_eq!(grown.value.missing_bookies, vec![b("a:1"), b("x:1")]);
    assert_eq!(grown.value.ctime_ms, first.value.ctime_ms);
    assert_ne!(grown.version, first.version);
    // The same bookies again change nothing.
    store.mark_under_replicated(l, &[b("a:1")]).await.unwrap();
    assert_eq!(store.read_under_replicated(l).await.unwrap(), grown);
    assert!(matches!(
        store.clear_under_replicated(l, first.version).await,
        Err(Error::BadVersion { .. })
    ));
    assert!(store.start_decommission(&b("d:1")).await.unwrap());
    assert!(!store.start_decommission(&b("d:1")).await.unwrap());
    drop(store);

    let store = EmbeddedStore::open(dir.path()).unwrap();
    let list = store.list_under_replicated().await.unwrap();
    assert_eq!(list, vec![(l, grown.clone())]);
    assert_eq!(store.decommissioning().await.unwrap(), vec![b("d:1")]);
    // Workers' copies add up on the record (the decommission's progress); none under way for
    // another bookie is not an error.
    store
        .record_decommission_copy(&b("d:1"), 100, 2)
        .await
        .unwrap();
    store
        .record_decommission_copy(&b("d:1"), 50, 1)
        .await
        .unwrap();
    store
        .record_decommission_copy(&b("e:1"), 7, 1)
        .await
        .unwrap();
    let records = store.decommissions().await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(
        (records[0].1.bytes_copied, records[0].1.entries_copied),
        (150, 3)
    );
    assert!(records[0].1.start_ms > 0);
    store
        .clear_under_replicated(l, grown.version)
        .await
        .unwrap();
    store
        .clear_under_replicated(l, grown.version)
        .await
        .unwrap();
    assert!(matches!(
        store.read_under_replicated(l).await,
        Err(Error::NotFound { .. })
    ));
    store.end_decommission(&b("d:1")).await.unwrap();
    drop(store);
    let store = EmbeddedStore::open(dir.path()).unwrap();
    assert!(store.list_under_replicated().await.unwrap().is_empty());
    assert!(store.decommissioning().await.unwrap().is_empty());
}

#[tokio::test]
async fn locks_and_candidates_are_exclusive_and_end_with_their_holder() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    let l = LedgerId(3);
    let lock = store
        .try_lock_under_replicated(l, "w1")
        .await
        .unwrap()
        .unwrap();
    assert!(store
        .try_lock_under_replicated(l, "w2")
        .await
        .unwrap()
        .is_none());
    let state = store.autorecovery_state().await.unwrap();
    assert_eq!(state.locks, vec![(l, "w1".to_string())]);
    store.release_replication_lock(lock.clone()).await.unwrap();
    let second = store
        .try_lock_under_replicated(l, "w2")
        .await
        .unwrap()
        .unwrap();
    // A stale handle does not free another worker's lock.
    store.release_replication_lock(lock).await.unwrap();
    assert!(store
        .try_lock_under_replicated(l, "w3")
        .await
        .unwrap()
        .is_none());
    store.release_replication_lock(second).await.unwrap();

    let a = store.join_auditor_election("a").await.unwrap();
    let c = store.join_auditor_election("c").await.unwrap();
    assert!(a.is_elected().await.unwrap());
    assert!(!c.is_elected().await.unwrap());
    assert_eq!(
        store.autorecovery_state().await.unwrap().candidates,
        vec!["a".to_string(), "c".to_string()]
    );
    let waiting = tokio::spawn(async move {
        c.wait_until_elected().await.unwrap();
        c
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "c waits while a is the auditor");
    drop(a);
    let c = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.name(), "c");
    assert!(c.is_elected().await.unwrap());
    assert!(!*store.session_lost().borrow());
    drop(store);
    // The document holds no lock or candidate: a new process starts with none.
    let store = EmbeddedStore::open(dir.path()).unwrap();
    assert!(store
        .try_lock_under_replicated(l, "w9")
        .await
        .unwrap()
        .is_some());
}

#[test]
fn a_decommission_record_of_an_older_build_reads_with_zero_counts() {
    // Goal: the start time alone (a JSON number, what older builds wrote in ZooKeeper and the
    // embedded document) reads as a record; the record reads back as written.
    let old: Decommission = serde_json::from_str("1700000000000").unwrap();
    assert_eq!(
        old,
        Decommission {
            start_ms: 1_700_000_000_000,
            bytes_copied: 0,
            entries_copied: 0
        }
    );
    let new = Decommission {
        start_ms: 5,
        bytes_copied: 6,
        entries_copied: 7,
    };
    let text = serde_json::to_string(&new).unwrap();
    assert_eq!(serde_json::from_str::<Decommission>(&text).unwrap(), new);
}

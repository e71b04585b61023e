//! Goal: the replication worker copies a lost bookie's fragment to a replacement and removes
//! the mark; copies back in place what a registered bookie lacks; leaves a mark extended
//! meanwhile; removes a deleted ledger's mark; and two workers never hold one ledger.
//! Method: `Worker::work_once` / `claim` and `worker::replicate_ledger` against real bookies
//! and the embedded store.

use std::sync::Arc;

use quire_autorecovery::worker::replicate_ledger;
use quire_autorecovery::{AutorecoveryMetrics, Outcome, Worker};
use quire_metadata::{BookieId, MetadataStore, UnderReplicationStore};
use quire_wire::LedgerId;

use crate::common::{cluster, options, Cluster};

fn worker(name: &str) -> (Worker, AutorecoveryMetrics) {
    let metrics = AutorecoveryMetrics::default();
    (
        Worker::new(name.into(), options(), metrics.clone()),
        metrics,
    )
}

/// A closed ledger of `entries` on 3 of `c`'s bookies, one of them lost and marked.
async fn lost_and_marked(c: &mut Cluster, entries: u64) -> (LedgerId, BookieId) {
    let id = c.closed_ledger(entries).await;
    let lost = c.meta(id).await.fragments[0].bookies[0].clone();
    c.lose(&lost).await;
    c.store
        .mark_under_replicated(id, std::slice::from_ref(&lost))
        .await
        .unwrap();
    (id, lost)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_copies_a_lost_bookies_fragment_to_a_replacement_and_clears_the_mark() {
    let mut c = cluster(4).await;
    let (id, lost) = lost_and_marked(&mut c, 30).await;
    let (mut w, metrics) = worker("w1");
    let (done, outcome) = w.work_once(&*c.store, &c.bk).await.unwrap().unwrap();
    assert_eq!(done, id);
    assert_eq!(outcome.unwrap(), Outcome::Done);
    let meta = c.meta(id).await;
    assert!(!meta.fragments[0].bookies.contains(&lost), "{meta:?}");
    assert_eq!(meta.fragments[0].bookies.len(), 3);
    assert!(c.store.list_under_replicated().await.unwrap().is_empty());
    assert_eq!(metrics.fragments_replicated.get(), 1);
    assert_eq!(metrics.entries_written.get(), 30);
    assert!(c.store.autorecovery_state().await.unwrap().locks.is_empty());
    c.assert_readable(id, 30).await;
    assert!(w.work_once(&*c.store, &c.bk).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_copies_back_in_place_what_a_registered_bookie_lacks() {
    let c = cluster(4).await;
    let id = c.closed_ledger(20).await;
    let meta = c.store.read_ledger(id).await.unwrap();
    let empty = c.spares(&meta.value.fragments[0].bookies)[0].clone();
    let mut changed = meta.value.clone();
    changed.fragments[0].bookies[1] = empty.clone();
    c.store
        .update_ledger(id, &changed, meta.version)
        .await
        .unwrap();
    c.store
        .mark_under_replicated(id, std::slice::from_ref(&empty))
        .await
        .unwrap();
    let (mut w, metrics) = worker("w1");
    let (_, outcome) = w.work_once(&*c.store, &c.bk).await.unwrap().unwrap();
    assert_eq!(outcome.unwrap(), Outcome::Done);
    assert_eq!(metrics.fragments_repaired.get(), 1);
    assert_eq!(metrics.entries_written.get(), 20);
    assert_eq!(
        c.meta(id).await.fragments[0].bookies,
        changed.fragments[0].bookies
    );
    let probe = std::collections::HashSet::from([empty]);
    assert!(c
        .bk
        .bookies_missing_entries(id, &probe)
        .await
        .unwrap()
        .is_empty());
    assert!(c.store.list_under_replicated().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_extended_meanwhile_stays_for_another_pass() {
    let mut c = cluster(4).await;
    let (id, lost) = lost_and_marked(&mut c, 10).await;
    let stale = c.store.read_under_replicated(id).await.unwrap();
    // The auditor adds a bookie while the worker holds the old mark.
    let other = BookieId("127.0.0.1:9".into());
    c.store
        .mark_under_replicated(id, std::slice::from_ref(&other))
        .await
        .unwrap();
    let metrics = AutorecoveryMetrics::default();
    let outcome = replicate_ledger(&*c.store, &c.bk, id, &stale, &options(), &metrics)
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Done);
    assert!(!c.meta(id).await.fragments[0].bookies.contains(&lost));
    let kept = c.store.read_under_replicated(id).await.unwrap();
    assert_eq!(kept.value.missing_bookies.len(), 2, "{kept:?}");
    // The next pass, on the mark as it is now, removes it.
    let (mut w, _) = worker("w1");
    let (_, outcome) = w.work_once(&*c.store, &c.bk).await.unwrap().unwrap();
    assert_eq!(outcome.unwrap(), Outcome::Done);
    assert!(c.store.list_under_replicated().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_ledgers_mark_is_removed() {
    let mut c = cluster(4).await;
    let (id, _) = lost_and_marked(&mut c, 5).await;
    let meta = c.store.read_ledger(id).await.unwrap();
    c.store.delete_ledger(id, meta.version).await.unwrap();
    let (mut w, metrics) = worker("w1");
    let (_, outcome) = w.work_once(&*c.store, &c.bk).await.unwrap().unwrap();
    assert_eq!(outcome.unwrap(), Outcome::Done);
    assert!(c.store.list_under_replicated().await.unwrap().is_empty());
    assert_eq!(metrics.entries_written.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_never_hold_one_ledger() {
    let c = cluster(3).await;
    let id = c.closed_ledger(1).await;
    let bookie = c.meta(id).await.fragments[0].bookies[0].clone();
    c.store.mark_under_replicated(id, &[bookie]).await.unwrap();
    let (mut a, _) = worker("a");
    let (mut b, _) = worker("b");
    let held = a.claim(&*c.store).await.unwrap().expect("a claims it");
    assert!(b.claim(&*c.store).await.unwrap().is_none(), "b must not");
    let state = c.store.autorecovery_state().await.unwrap();
    assert_eq!(state.locks, vec![(id, "a".to_string())]);
    c.store.release_replication_lock(held.lock).await.unwrap();
    let again = b.claim(&*c.store).await.unwrap().expect("b claims it now");
    c.store.release_replication_lock(again.lock).await.unwrap();

    // Eight workers at once: exactly one gets it.
    let store = Arc::clone(&c.store);
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let (mut w, _) = worker(&format!("w{i}"));
                w.claim(&*store).await.unwrap().map(|claim| claim.lock)
            })
        })
        .collect();
    let mut holders = 0;
    for t in tasks {
        holders += usize::from(t.await.unwrap().is_some());
    }
    assert_eq!(holders, 1);
}

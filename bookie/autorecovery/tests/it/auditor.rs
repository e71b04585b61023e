//! Goal: the auditor marks the ledgers of a lost bookie only once its registration has been
//! gone for the delay, and only the ledgers that name it; the periodic check marks a ledger a
//! registered bookie lacks the entries of: one whose metadata names an empty bookie, and a bookie
//! wiped and started again on its address, whose replicas a worker then copies back in place.
//! Method: `Auditor::audit_once` polls against real bookies and the embedded store.

use std::time::Duration;

use quire_autorecovery::auditor::AuditPass;
use quire_autorecovery::Auditor;
use quire_metadata::{MetadataStore, UnderReplicationStore};

use crate::common::{cluster, options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_bookies_ledgers_are_marked_after_the_delay_and_not_before() {
    let mut c = cluster(4).await;
    let mut ledgers = Vec::new();
    for _ in 0..4 {
        ledgers.push(c.closed_ledger(10).await);
    }
    // A delay long enough that a loaded machine does not reach it between the early polls.
    let mut opts = options();
    opts.lost_bookie_recovery_delay = Duration::from_millis(1_500);
    let mut auditor = Auditor::new(opts);
    let first = auditor.audit_once(&*c.store, &c.bk).await.unwrap();
    assert!(first.full_check, "the first poll is a check: {first:?}");
    assert_eq!(first.marked, 0, "every replica is there");

    let lost = c.meta(ledgers[0]).await.fragments[0].bookies[1].clone();
    c.lose(&lost).await;
    let early = auditor.audit_once(&*c.store, &c.bk).await.unwrap();
    assert_eq!(
        early,
        AuditPass::default(),
        "nothing walked within the delay"
    );
    assert!(c.store.list_under_replicated().await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(500)).await;
    auditor.audit_once(&*c.store, &c.bk).await.unwrap();
    assert!(
        c.store.list_under_replicated().await.unwrap().is_empty(),
        "still within the 1.5 s delay"
    );

    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let pass = auditor.audit_once(&*c.store, &c.bk).await.unwrap();
    assert!(pass.walked && !pass.full_check, "{pass:?}");
    let marks = c.store.list_under_replicated().await.unwrap();
    let mut naming = 0;
    for id in &ledgers {
        let names = c.meta(*id).await.fragments[0].bookies.contains(&lost);
        let mark = marks.iter().find(|(m, _)| m == id);
        match (names, mark) {
            (true, Some((_, m))) => {
                assert_eq!(m.value.missing_bookies, vec![lost.clone()]);
                naming += 1;
            }
            (false, None) => {}
            other => panic!("ledger {id}: names the lost bookie / marked: {other:?}"),
        }
    }
    assert_eq!(pass.marked, naming);
    // Published once: the next poll walks nothing.
    let again = auditor.audit_once(&*c.store, &c.bk).await.unwrap();
    assert!(!again.walked, "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_check_marks_a_ledger_a_registered_bookie_lacks() {
    let c = cluster(4).await;
    let id = c.closed_ledger(20).await;
    // A bookie that lacks the entries its fragment gives it, though registered: as one wiped
    // and started again under its id. Here the spare is written into the ensemble instead.
    let meta = c.store.read_ledger(id).await.unwrap();
    let spare = c.spares(&meta.value.fragments[0].bookies)[0].clone();
    let mut changed = meta.value.clone();
    changed.fragments[0].bookies[2] = spare.clone();
    c.store
        .update_ledger(id, &changed, meta.version)
        .await
        .unwrap();

    // Without the periodic check (after the first poll's), nothing reads replicas.
    let mut opts = options();
    opts.periodic_check_interval = Some(Duration::from_millis(300));
    let mut auditor = Auditor::new(opts);
    let pass = auditor.audit_once(&*c.store, &c.bk).await.unwrap();
    assert!(pass.full_check && pass.marked == 1, "{pass:?}");
    let mark = c.store.read_under_replicated(id).await.unwrap();
    assert_eq!(mark.value.missing_bookies, vec![spare.clone()]);
    c.store
        .clear_under_replicated(id, mark.version)
        .await
        .unwrap();
    let quiet = auditor.audit_once(&*c.store, &c.bk).await.unwrap();
    assert!(!quiet.walked, "the next check is not due yet: {quiet:?}");
    tokio::time::sleep(Duration::from_millis(350)).await;
    let due = auditor.audit_once(&*c.store, &c.bk).await.unwrap();
    assert!(due.full_check && due.marked == 1, "{due:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_bookie_registered_again_is_found_and_its_replicas_copied_back() {
    use quire_autorecovery::{AutorecoveryMetrics, Outcome, Worker};
    use quire_testkit::bookies::{small_bookie_config, start_registered_bookie};

    let mut c = cluster(3).await;
    let id = c.closed_ledger(25).await;
    let wiped = c.meta(id).await.fragments[0].bookies[1].clone();
    c.lose(&wiped).await;
    // The same address on empty directories (index 9: directories no bookie used).
    let addr = wiped.0.parse().unwrap();
    let config = small_bookie_config(c.dir(), 9, addr);
    let again = start_registered_bookie(config, &*c.store).await;
    c.bookies.push(Some(again));

    let mut auditor = Auditor::new(options());
    let pass = auditor.audit_once(&*c.store, &c.bk).await.unwrap();
    assert!(pass.full_check && pass.marked == 1, "{pass:?}");
    let mark = c.store.read_under_replicated(id).await.unwrap();
    assert_eq!(mark.value.missing_bookies, vec![wiped.clone()]);

    let metrics = AutorecoveryMetrics::default();
    let mut w = Worker::new("w".into(), options(), metrics.clone());
    let (_, outcome) = w.work_once(&*c.store, &c.bk).await.unwrap().unwrap();
    assert_eq!(outcome.unwrap(), Outcome::Done);
    assert_eq!(metrics.entries_written.get(), 25);
    assert!(c.meta(id).await.fragments[0].bookies.contains(&wiped));
    assert!(c.store.list_under_replicated().await.unwrap().is_empty());
    let probe = std::collections::HashSet::from([wiped]);
    assert!(c
        .bk
        .bookies_missing_entries(id, &probe)
        .await
        .unwrap()
        .is_empty());
}

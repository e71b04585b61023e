//! Goal: a whole daemon (`run_daemon`: election, auditor, worker) on the embedded store
//! brings a lost bookie's ledger back to full replication by itself, and stops on request.
//! Method: real bookies, one bookie stopped and unregistered, the daemon watched through the
//! ledger's metadata.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quire_autorecovery::{run_daemon, AutorecoveryMetrics};
use quire_metadata::UnderReplicationStore;

use crate::common::{cluster, options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_replaces_a_lost_bookie_by_itself() {
    let mut c = cluster(4).await;
    let id = c.closed_ledger(12).await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let store = Arc::clone(&c.store);
    let metrics = AutorecoveryMetrics::default();
    let connect = move || {
        let store = Arc::clone(&store);
        async move { Ok(store) }
    };
    let daemon = tokio::spawn(run_daemon(
        connect,
        "d1".into(),
        options(),
        metrics.clone(),
        stop_rx,
    ));
    // Let the auditor learn the bookies before one goes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lost = c.meta(id).await.fragments[0].bookies[2].clone();
    c.lose(&lost).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.meta(id).await.fragments[0].bookies.contains(&lost) {
        assert!(Instant::now() < deadline, "the lost bookie is still named");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    while !c.store.list_under_replicated().await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the mark stays");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metrics.fragments_replicated.get(), 1);
    let state = c.store.autorecovery_state().await.unwrap();
    assert_eq!(state.candidates, vec!["d1".to_string()]);
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), daemon)
        .await
        .unwrap()
        .unwrap();
    // Its candidacy ended with it.
    assert!(c
        .store
        .autorecovery_state()
        .await
        .unwrap()
        .candidates
        .is_empty());
    c.assert_readable(id, 12).await;
}

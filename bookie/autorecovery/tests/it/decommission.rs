//! Goal: a decommission moves every replica of the bookie away with a worker running, then
//! deletes its cookie; when no bookie can take a fragment (every writable bookie is in its
//! ensemble) a new decommission is refused up front with the reason and changes nothing, and
//! one already under way says so and stops at its timeout with the count of ledgers still
//! naming the bookie, keeping the cookie and the decommission record so that a second run
//! resumes.
//! Method: `decommission::decommission` with a `Worker` running beside it, real bookies, the
//! embedded store.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use quire_autorecovery::decommission::{
    decommission, DecommissionError, DecommissionOptions, Progress,
};
use quire_autorecovery::{AutorecoveryMetrics, Worker};
use quire_metadata::{MetadataStore, UnderReplicationStore};

use crate::common::{cluster, options, Cluster};

/// A worker running in the background until the returned handle is aborted.
fn spawn_worker(c: &Cluster) -> tokio::task::JoinHandle<()> {
    let store = Arc::clone(&c.store);
    let bk = c.bk.clone();
    tokio::spawn(async move {
        let w = Worker::new("w".into(), options(), AutorecoveryMetrics::default());
        w.run(&*store, &bk).await;
    })
}

fn fast(timeout_ms: u64) -> DecommissionOptions {
    DecommissionOptions {
        timeout: Some(Duration::from_millis(timeout_ms)),
        poll_interval: Duration::from_millis(100),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decommission_moves_every_replica_then_deletes_the_cookie() {
    let c = cluster(4).await;
    let id = c.closed_ledger(15).await;
    let retired = c.meta(id).await.fragments[0].bookies[1].clone();
    c.write_cookie(&retired).await;
    let worker = spawn_worker(&c);
    let seen = Mutex::new(Vec::new());
    let mut report = |p: Progress| seen.lock().unwrap().push(p);
    decommission(&*c.store, &retired, fast(60_000), &mut report)
        .await
        .unwrap();
    worker.abort();
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen[0], Progress::Started { fresh: true });
    assert!(
        seen.iter()
            .any(|p| matches!(p, Progress::Remaining { ledgers: 1, .. })),
        "{seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|p| matches!(p, Progress::NoReplacement { .. })),
        "{seen:?}"
    );
    assert!(!c.meta(id).await.fragments[0].bookies.contains(&retired));
    assert!(matches!(
        c.store.read_cookie(&retired).await,
        Err(quire_metadata::Error::NotFound { .. })
    ));
    assert!(c.store.decommissioning().await.unwrap().is_empty());
    c.assert_readable(id, 15).await;
    let mut ignore = |_| {};
    let again = decommission(&*c.store, &retired, fast(1_000), &mut ignore).await;
    assert!(
        matches!(again, Err(DecommissionError::NoCookie(_))),
        "{again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decommission_no_bookie_can_satisfy_says_so_and_stops_at_its_timeout() {
    let c = cluster(3).await;
    let id = c.closed_ledger(5).await;
    let retired = c.meta(id).await.fragments[0].bookies[0].clone();
    c.write_cookie(&retired).await;
    let worker = spawn_worker(&c);
    let mut ignore = |_| {};
    let refused = decommission(&*c.store, &retired, fast(1_500), &mut ignore).await;
    match refused {
        Err(e @ DecommissionError::NoRoom { .. }) => assert!(
            e.to_string().starts_with(&format!(
                "ledger {id}'s ensemble needs 3 bookies; 2 writable bookies remain besides {retired}"
            )),
            "{e}"
        ),
        other => panic!("expected NoRoom, got {other:?}"),
    }
    assert!(c.store.decommissioning().await.unwrap().is_empty());
    let listed = c.store.list_bookies().await.unwrap();
    assert!(listed.iter().any(|b| b.id == retired && !b.read_only));
    // One under way already (started while there was room): a resume is checked again, and
    // refused with the same reason; the decommission stays under way (record kept).
    assert!(c.store.start_decommission(&retired).await.unwrap());
    let result = decommission(&*c.store, &retired, fast(1_500), &mut ignore).await;
    worker.abort();
    match result {
        Err(e @ DecommissionError::ResumeRefused { .. }) => {
            let why = e.to_string();
            assert!(
                why.contains(&format!("2 writable bookies remain besides {retired}")),
                "{why}"
            );
        }
        other => panic!("expected ResumeRefused, got {other:?}"),
    }
    // Nothing lost: the ensemble is unchanged, the cookie and the record stay for a resume.
    assert!(c.meta(id).await.fragments[0].bookies.contains(&retired));
    assert!(c.store.read_cookie(&retired).await.is_ok());
    assert_eq!(c.store.decommissioning().await.unwrap(), vec![retired]);
    c.assert_readable(id, 5).await;
}

//! One autorecovery daemon: an auditor candidate and a replication worker sharing one metadata
//! session, started over with a new session when it is lost or a part fails.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use quire_ledger::{BookKeeper, ClientConfig};
use quire_metadata::{MetadataStore, UnderReplicationStore};
use tokio::sync::watch;

use crate::{auditor, AutorecoveryMetrics, AutorecoveryOptions, Worker};

/// How long the daemon waits before connecting again after a failure.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

/// Runs an autorecovery daemon (auditor candidate and replication worker) as `name` until
/// `stop` turns true. `connect` opens a new metadata session (a `ZkStore` in a cluster); the
/// daemon calls it again, after a one-second pause, whenever the session is lost
/// ([`UnderReplicationStore::session_lost`]) or the auditor fails, so that its election
/// candidacy and worker locks always belong to a live session (BookKeeper's
/// `AutoRecoveryMain` restarts its components the same way).
pub async fn run_daemon<S, C, F>(
    connect: C,
    name: String,
    options: AutorecoveryOptions,
    metrics: AutorecoveryMetrics,
    mut stop: watch::Receiver<bool>,
) where
    S: UnderReplicationStore,
    C: Fn() -> F + Send,
    F: Future<Output = anyhow::Result<Arc<S>>> + Send,
{
    loop {
        if *stop.borrow() {
            return;
        }
        let store = tokio::select! {
            _ = stop.changed() => return,
            r = connect() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "autorecovery cannot connect to the metadata store; retrying");
                    tokio::select! {
                        _ = stop.changed() => return,
                        () = tokio::time::sleep(RECONNECT_PAUSE) => continue,
                    }
                }
            },
        };
        let Some(ended) = run_session(store, &name, &options, &metrics, &mut stop).await else {
            return;
        };
        tracing::warn!(%name, "autorecovery starts over with a new session: {ended}");
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(RECONNECT_PAUSE) => {}
        }
    }
}

/// Runs the auditor candidate and the worker on one session until it ends (why, as a
/// sentence) or `stop` turns (`None`).
async fn run_session<S: UnderReplicationStore>(
    store: Arc<S>,
    name: &str,
    options: &AutorecoveryOptions,
    metrics: &AutorecoveryMetrics,
    stop: &mut watch::Receiver<bool>,
) -> Option<String> {
    let metadata: Arc<dyn MetadataStore> = store.clone();
    let bk = BookKeeper::new(
        metadata,
        ClientConfig {
            replication_rate_bytes_per_sec: options.replication_rate_bytes,
            tls: options.bookie_tls.clone(),
            cluster_secret: options.cluster_secret,
            placement: options.placement.clone(),
            ..ClientConfig::default()
        },
    );
    let mut lost = store.session_lost();
    let worker = Worker::new(name.to_string(), options.clone(), metrics.clone());
    let ended = tokio::select! {
        _ = stop.changed() => return None,
        _ = lost.wait_for(|l| *l) => "metadata session lost".to_string(),
        r = auditor::run(&*store, &bk, name, options, metrics) => {
            format!("auditor stopped: {:#}", r.err().unwrap_or_else(|| anyhow::anyhow!("no error")))
        }
        () = worker.run(&*store, &bk) => "worker stopped".to_string(),
    };
    Some(ended)
}

//! `quire bookie decommission`: retire a bookie that is still up. Its replicas are copied to
//! other bookies by autorecovery, then its cookie is deleted; the logic is autorecovery's
//! ([`crate::autorecovery::decommission`]), since its workers do the copying. A running bookie
//! follows its decommission record ([`follow`]): out of the registry while one is under way,
//! back in once it is cancelled.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use anyhow::{Context, Result};
use quire_metadata::{BookieInfo, MetadataStore, ZkStore};

pub use crate::autorecovery::DecommissionArgs;

/// Runs `quire bookie decommission`.
pub fn run(args: DecommissionArgs) -> Result<()> {
    crate::autorecovery::decommission(args)
}

/// A ZooKeeper watch on the decommission records ([`ZkStore::watch_decommissions`]), or a
/// retry delay when it could not be set.
pub(crate) type RecordWatch = Pin<Box<dyn Future<Output = ()> + Send>>;

/// How long a bookie waits before trying again to set the watch on its decommission record.
const WATCH_RETRY: Duration = Duration::from_secs(1);

/// Arms the watch on the decommission records, then [`follow`]s the bookie's record as it is
/// now (a change after the read fires the watch, so none is missed). When the watch cannot
/// be set or the record not followed, the result is a [`WATCH_RETRY`] delay, after which the
/// caller arms it again (what the one-second poll this replaces did on every tick).
pub(crate) async fn arm_and_follow(store: &ZkStore, info: &BookieInfo) -> RecordWatch {
    let watch = match store.watch_decommissions().await {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(bookie = %info.id, error = %e, "cannot watch the decommission records; trying again in 1 s");
            Box::pin(tokio::time::sleep(WATCH_RETRY))
        }
    };
    match follow(store, info).await {
        Ok(()) => watch,
        Err(e) => {
            tracing::warn!(bookie = %info.id, error = %format!("{e:#}"), "cannot follow the decommission record; trying again in 1 s");
            Box::pin(tokio::time::sleep(WATCH_RETRY))
        }
    }
}

/// Keeps the bookie's registration in line with its decommission record: while a
/// decommission of it is under way it stays out of the registry (no new ledger picks it; it
/// goes on serving the ledgers it is in), also after a session expiry re-registered it; once
/// the decommission is cancelled (`quire bookie decommission --cancel`) it registers again as
/// `info` says. A bookie whose cookie is gone (a finished decommission) stays out.
///
/// # Errors
/// ZooKeeper's.
pub(crate) async fn follow(store: &ZkStore, info: &BookieInfo) -> Result<()> {
    let id = &info.id;
    let leaving = store.decommissioning().await?.contains(id);
    let registered = store.list_bookies().await?.iter().any(|b| b.id == *id);
    if leaving && registered {
        match store.unregister_bookie(id).await {
            Ok(()) | Err(quire_metadata::Error::NotFound { .. }) => {}
            Err(e) => return Err(e).context("unregister"),
        }
        eprintln!(
            "quire bookie: {id}: being decommissioned: out of the registry (it goes on serving)"
        );
    } else if !leaving && !registered {
        match store.read_cookie(id).await {
            Ok(_) => {
                store
                    .register_bookie(info.clone())
                    .await
                    .context("register")?;
                eprintln!("quire bookie: {id} registered again: no decommission under way");
            }
            // Decommissioned: its cookie is deleted, it is to be stopped.
            Err(quire_metadata::Error::NotFound { .. }) => {}
            Err(e) => return Err(e).context("read the cookie"),
        }
    }
    Ok(())
}

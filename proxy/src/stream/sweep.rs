//! The lifecycle sweep: a periodic pass of each proxy over every stream in the metadata store,
//! so that retention, the completion of segments left in progress, and the deletion of orphan
//! ledger metadata also happen on streams no request has touched since this proxy started.
//!
//! DistributedLog runs retention only inside a log's writer (after its rolls) and leaves idle
//! logs and leaked ledgers to operator tools (`dlog tool truncate`, `audit_ledgers`); its write
//! proxies own a stream only while it is written. A log service that runs for years needs disk
//! use to level off without an operator, so each Quire proxy sweeps every
//! [`StreamConfig::lifecycle_sweep_interval`](super::StreamConfig::lifecycle_sweep_interval):
//!
//! * a stream this proxy owns: its stream task checks the time roll and retention (as at every
//!   tick) and deletes the orphan ledgers of the stream (below);
//! * a stream nobody owns: the proxy acquires it (taking the lease and recovering a segment a
//!   crashed owner left in progress, i.e. completing it), runs the same step, and gives the
//!   stream up again unless a request used it meanwhile, so idle streams do not all end up
//!   owned by whichever proxy sweeps first;
//! * a stream another proxy owns: skipped, its owner sweeps it;
//! * a stream that no longer exists but still has ledgers labelled with its name: the proxy
//!   takes the stream's lock (so nobody creates and writes the name meanwhile), checks that the
//!   stream is still absent, deletes those ledgers' metadata and releases the lock.
//!
//! **Orphan ledgers.** Every segment's ledger is labelled with its stream at creation
//! (`quire.stream` in the ledger metadata's `custom`). A deletion updates the stream record
//! first and deletes the ledgers' metadata after (`lifecycle.rs`), and a segment start creates
//! the ledger before adding it to the record, so a crash between the two steps leaves ledger
//! metadata no segment refers to, which bookie garbage collection would keep forever. The
//! owner deletes a labelled ledger only when the stream record it just rewrote by
//! compare-and-set does not list it: the rewrite makes any earlier owner's pending segment start
//! fail (its compare-and-set finds a newer version, `OwnershipLost`), so an unlisted ledger can
//! never become listed afterwards. The rules of deletion hold as elsewhere: only the owner
//! deletes, a failed or stale metadata update deletes nothing, and a ledger whose metadata
//! cannot be read stays. Ledgers without the label (made by other ledger clients) are never
//! touched.
//!
//! Cost: one listing of the ledger buckets and one metadata read per ledger per sweep, plus
//! one compare-and-set per stream with orphans.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

use tokio::sync::oneshot;

use super::command::Command;
use super::labels::{delete_labelled_ledger, LEDGER_LABEL_STREAM};
use super::registry::Registry;
use crate::error::{Error, FromMetadata, Result};

/// What one [`StreamManager::sweep`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// Streams whose lifecycle step this proxy ran (owned, or acquired for the sweep).
    pub streams_checked: usize,
    /// Streams nobody owned that the sweep acquired (and gave up again unless used).
    pub streams_acquired: usize,
    /// Streams skipped because another proxy owns them.
    pub streams_owned_elsewhere: usize,
    /// Ledgers whose orphan metadata was deleted, ascending.
    pub orphan_ledgers_deleted: Vec<u64>,
}

/// One lifecycle sweep over every stream in the metadata store (see the module docs and
/// [`super::StreamManager::sweep`]).
pub(super) async fn sweep(registry: &Registry) -> Result<SweepReport> {
    registry.check_running()?;
    let names: BTreeSet<String> = registry.list_streams().await?.into_iter().collect();
    let labelled = labelled_ledgers(registry).await?;
    let mut report = SweepReport::default();
    let mut all = names.clone();
    all.extend(labelled.keys().cloned());
    for name in &all {
        if registry.is_shutting_down() {
            break;
        }
        let candidates = labelled.get(name).cloned().unwrap_or_default();
        let r = if names.contains(name) {
            sweep_stream(registry, name, candidates, &mut report).await
        } else {
            sweep_deleted_stream(registry, name, candidates, &mut report).await
        };
        if let Err(e) = r {
            tracing::warn!(stream = %name, error = %e, "lifecycle sweep of the stream failed");
        }
    }
    report.orphan_ledgers_deleted.sort_unstable();
    if !report.orphan_ledgers_deleted.is_empty() || report.streams_acquired > 0 {
        tracing::info!(
            checked = report.streams_checked,
            acquired = report.streams_acquired,
            orphans_deleted = ?report.orphan_ledgers_deleted,
            "lifecycle sweep"
        );
    }
    Ok(report)
}

/// Ledger ids by the stream named in their label; unlabelled ledgers and ledgers whose
/// metadata cannot be read (deleted meanwhile, or a failed read) are left out.
async fn labelled_ledgers(registry: &Registry) -> Result<BTreeMap<String, Vec<u64>>> {
    let ids = registry
        .metadata
        .list_ledgers()
        .await
        .map_err(|e| Error::from_metadata("", "list ledgers", e))?;
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for id in ids {
        match registry.metadata.read_ledger(id).await {
            Ok(v) => {
                if let Some(stream) = v.value.custom.get(LEDGER_LABEL_STREAM) {
                    out.entry(stream.clone()).or_default().push(id.0);
                }
            }
            Err(quire_metadata::Error::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(ledger = id.0, error = %e, "lifecycle sweep: cannot read ledger metadata; skipped");
            }
        }
    }
    Ok(out)
}

/// The sweep of one stream that exists: through its owner task if nobody else owns it.
async fn sweep_stream(
    registry: &Registry,
    name: &str,
    candidates: Vec<u64>,
    report: &mut SweepReport,
) -> Result<()> {
    let owned_here = registry.owned(name).is_some();
    if !owned_here {
        let owner = registry
            .metadata
            .stream_owner(name)
            .await
            .map_err(|e| Error::from_metadata(name, "read stream owner", e))?;
        if owner.is_some() {
            report.streams_owned_elsewhere += 1;
            return Ok(());
        }
    }
    let handle = match registry.stream(name, false, false).await {
        Ok(h) => h,
        Err(Error::OwnedElsewhere { .. }) => {
            report.streams_owned_elsewhere += 1;
            return Ok(());
        }
        // This proxy owns its `owned_streams_max` streams: the stream's sweep waits for a
        // proxy with room (or for its next owner).
        Err(Error::TooManyStreams { .. }) => return Ok(()),
        // This proxy's region is marked unavailable: a proxy of another region sweeps it.
        Err(Error::RegionUnavailable { .. }) => return Ok(()),
        // Deleted meanwhile: its labelled ledgers are handled by the next sweep.
        Err(Error::NoSuchStream { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    // Requests counted so far, this sweep's own acquisition included: a later request
    // keeps the stream owned.
    let release_unless_used = (!owned_here).then(|| handle.shared.requests.load(Ordering::SeqCst));
    if !owned_here {
        report.streams_acquired += 1;
    }
    let (reply, rx) = oneshot::channel();
    registry
        .send_command(
            &handle,
            Command::Sweep {
                orphan_candidates: candidates,
                release_unless_used,
                reply,
            },
        )
        .await?;
    let done = rx.await.map_err(|_| Error::OwnershipLost {
        stream: name.to_string(),
        reason: handle
            .lost_reason()
            .unwrap_or_else(|| "the stream task ended".into()),
    })??;
    report.streams_checked += 1;
    report.orphan_ledgers_deleted.extend(done.orphans_deleted);
    Ok(())
}

/// Ledgers labelled with a stream that does not exist: deleted under the stream's lock,
/// once the stream is confirmed absent with the lock held.
async fn sweep_deleted_stream(
    registry: &Registry,
    name: &str,
    candidates: Vec<u64>,
    report: &mut SweepReport,
) -> Result<()> {
    if candidates.is_empty() || quire_metadata::validate_stream_name(name).is_err() {
        return Ok(());
    }
    let lease = match registry
        .metadata
        .try_acquire_stream(name, &registry.identity)
        .await
    {
        Ok(Ok(lease)) => lease,
        Ok(Err(_owner)) => {
            report.streams_owned_elsewhere += 1;
            return Ok(());
        }
        Err(e) => return Err(Error::from_metadata(name, "acquire stream lease", e)),
    };
    let absent = matches!(
        registry.metadata.read_stream(name).await,
        Err(quire_metadata::Error::NotFound { .. })
    );
    if absent {
        for id in candidates {
            if *lease.lost.borrow() {
                break;
            }
            if delete_labelled_ledger(&*registry.metadata, name, id).await {
                report.orphan_ledgers_deleted.push(id);
            }
        }
    }
    if let Err(e) = registry.metadata.release_stream(lease).await {
        tracing::warn!(stream = %name, error = %e, "releasing the stream lease after a sweep failed");
    }
    Ok(())
}

/// Runs [`sweep`] every `interval` until the manager is dropped or shuts down.
/// The first sweep comes one interval after the start.
pub(super) async fn sweep_loop(registry: Weak<Registry>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(r) = registry.upgrade() else { return };
        match sweep(&r).await {
            Ok(_) => {}
            Err(Error::ShuttingDown) => return,
            Err(e) => tracing::warn!(error = %e, "lifecycle sweep failed"),
        }
    }
}

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

use quire_wire::LedgerId;
use tokio::sync::oneshot;

use super::writer::{Command, Writer};
use super::StreamManager;
use crate::error::{Error, FromMetadata, Result};

/// The `custom` key of a segment's ledger metadata that names its stream.
pub const LEDGER_LABEL_STREAM: &str = "quire.stream";
/// The `custom` key of a segment's ledger metadata that holds its segment sequence number.
pub const LEDGER_LABEL_SEGMENT: &str = "quire.segment_seq_no";

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

/// What the stream task reports for its part of a sweep.
pub(super) struct StreamSweep {
    pub(super) orphans_deleted: Vec<u64>,
}

impl StreamManager {
    /// One lifecycle sweep over every stream in the metadata store (see the module docs of
    /// `stream::sweep`): retention and time rolls on streams this proxy owns or that nobody
    /// owns, and deletion of orphan ledger metadata (ledgers labelled with a stream whose
    /// record does not list them, or with a stream that no longer exists). Runs by itself
    /// every [`super::StreamConfig::lifecycle_sweep_interval`]; callable at any time.
    ///
    /// # Errors
    /// `Metadata` when the streams or ledgers cannot be listed; `ShuttingDown`. A failure on
    /// one stream is logged and the sweep goes on with the next.
    pub async fn sweep(&self) -> Result<SweepReport> {
        self.check_running()?;
        let names: BTreeSet<String> = self.list_streams().await?.into_iter().collect();
        let labelled = self.labelled_ledgers().await?;
        let mut report = SweepReport::default();
        let mut all = names.clone();
        all.extend(labelled.keys().cloned());
        for name in &all {
            if self.shutting_down.load(Ordering::SeqCst) {
                break;
            }
            let candidates = labelled.get(name).cloned().unwrap_or_default();
            let r = if names.contains(name) {
                self.sweep_stream(name, candidates, &mut report).await
            } else {
                self.sweep_deleted_stream(name, candidates, &mut report)
                    .await
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
    async fn labelled_ledgers(&self) -> Result<BTreeMap<String, Vec<u64>>> {
        let ids = self
            .metadata
            .list_ledgers()
            .await
            .map_err(|e| Error::from_metadata("", "list ledgers", e))?;
        let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for id in ids {
            match self.metadata.read_ledger(id).await {
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

    async fn sweep_stream(
        &self,
        name: &str,
        candidates: Vec<u64>,
        report: &mut SweepReport,
    ) -> Result<()> {
        let owned_here = self
            .streams
            .lock()
            .expect("streams lock")
            .get(name)
            .and_then(|c| c.get().cloned())
            .is_some_and(|h| h.lost_reason().is_none());
        if !owned_here {
            let owner = self
                .metadata
                .stream_owner(name)
                .await
                .map_err(|e| Error::from_metadata(name, "read stream owner", e))?;
            if owner.is_some() {
                report.streams_owned_elsewhere += 1;
                return Ok(());
            }
        }
        let handle = match self.stream(name, false, false).await {
            Ok(h) => h,
            Err(Error::OwnedElsewhere { .. }) => {
                report.streams_owned_elsewhere += 1;
                return Ok(());
            }
            // Deleted meanwhile: its labelled ledgers are handled by the next sweep.
            Err(Error::NoSuchStream { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        // Requests counted so far, this sweep's own acquisition included: a later request
        // keeps the stream owned.
        let release_unless_used =
            (!owned_here).then(|| handle.shared.requests.load(Ordering::SeqCst));
        if !owned_here {
            report.streams_acquired += 1;
        }
        let (reply, rx) = oneshot::channel();
        self.send_command(
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
        &self,
        name: &str,
        candidates: Vec<u64>,
        report: &mut SweepReport,
    ) -> Result<()> {
        if candidates.is_empty() || quire_metadata::validate_stream_name(name).is_err() {
            return Ok(());
        }
        let lease = match self.metadata.try_acquire_stream(name, &self.identity).await {
            Ok(Ok(lease)) => lease,
            Ok(Err(_owner)) => {
                report.streams_owned_elsewhere += 1;
                return Ok(());
            }
            Err(e) => return Err(Error::from_metadata(name, "acquire stream lease", e)),
        };
        let absent = matches!(
            self.metadata.read_stream(name).await,
            Err(quire_metadata::Error::NotFound { .. })
        );
        if absent {
            for id in candidates {
                if *lease.lost.borrow() {
                    break;
                }
                if delete_labelled_ledger(&*self.metadata, name, id).await {
                    report.orphan_ledgers_deleted.push(id);
                }
            }
        }
        if let Err(e) = self.metadata.release_stream(lease).await {
            tracing::warn!(stream = %name, error = %e, "releasing the stream lease after a sweep failed");
        }
        Ok(())
    }
}

/// Deletes ledger `id`'s metadata if it is still labelled with `stream`; true once it is gone
/// (also when someone else deleted it). A failed read or delete leaves it (logged).
pub(super) async fn delete_labelled_ledger(
    metadata: &dyn quire_metadata::MetadataStore,
    stream: &str,
    id: u64,
) -> bool {
    for _ in 0..3 {
        let v = match metadata.read_ledger(LedgerId(id)).await {
            Ok(v) => v,
            Err(quire_metadata::Error::NotFound { .. }) => return true,
            Err(e) => {
                tracing::warn!(stream, ledger = id, error = %e, "cannot read an orphan ledger's metadata; it stays");
                return false;
            }
        };
        if v.value.custom.get(LEDGER_LABEL_STREAM).map(String::as_str) != Some(stream) {
            return false;
        }
        match metadata.delete_ledger(LedgerId(id), v.version).await {
            Ok(()) | Err(quire_metadata::Error::NotFound { .. }) => {
                tracing::info!(stream, ledger = id, "deleted orphan ledger metadata");
                return true;
            }
            Err(quire_metadata::Error::BadVersion { .. }) => continue,
            Err(e) => {
                tracing::warn!(stream, ledger = id, error = %e, "cannot delete an orphan ledger's metadata; it stays");
                return false;
            }
        }
    }
    false
}

/// Runs [`StreamManager::sweep`] every `interval` until the manager is dropped or shuts down.
/// The first sweep comes one interval after the start.
pub(super) async fn sweep_loop(manager: Weak<StreamManager>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(m) = manager.upgrade() else { return };
        match m.sweep().await {
            Ok(_) => {}
            Err(Error::ShuttingDown) => return,
            Err(e) => tracing::warn!(error = %e, "lifecycle sweep failed"),
        }
    }
}

impl Writer {
    /// The stream task's part of a sweep: the lifecycle tick (time roll, retention), then the
    /// orphan ledgers among `candidates` (labelled with this stream, unlisted in its record)
    /// are deleted after the record is rewritten by compare-and-set. Returns the answer and
    /// whether the task goes on.
    pub(super) async fn sweep(&mut self, candidates: Vec<u64>) -> (Result<StreamSweep>, bool) {
        if !self.on_tick().await {
            let reason = self
                .shared
                .lost
                .lock()
                .expect("lost lock")
                .clone()
                .unwrap_or_default();
            return (
                Err(Error::OwnershipLost {
                    stream: self.name.clone(),
                    reason,
                }),
                false,
            );
        }
        // The spare ledger a roll made ready is this writer's own, not an orphan.
        let listed: BTreeSet<u64> = self
            .meta
            .value
            .segments
            .iter()
            .map(|s| s.ledger_id)
            .chain(self.spare.as_ref().map(|s| s.ledger.id().0))
            .collect();
        let orphans: Vec<u64> = candidates
            .into_iter()
            .filter(|id| !listed.contains(id))
            .collect();
        if orphans.is_empty() || !self.healthy {
            return (
                Ok(StreamSweep {
                    orphans_deleted: Vec::new(),
                }),
                true,
            );
        }
        if let Err(e) = self.check_ownership() {
            let go_on = self.lifecycle_failure_keep(&e).await;
            return (Err(e), go_on);
        }
        // Rewrite the record (same content, new version): an earlier owner that created one of
        // these ledgers and has not yet added it to the record now fails its compare-and-set.
        let same = self.meta.value.clone();
        match self.cas_stream(same).await {
            Ok(()) => {}
            Err(e) => {
                let e = self.stream_update_err("sweep orphan ledgers", e);
                let go_on = self.lifecycle_failure_keep(&e).await;
                return (Err(e), go_on);
            }
        }
        let mut deleted = Vec::new();
        for id in orphans {
            if delete_labelled_ledger(&*self.metadata, &self.name, id).await {
                deleted.push(id);
            }
        }
        (
            Ok(StreamSweep {
                orphans_deleted: deleted,
            }),
            true,
        )
    }
}

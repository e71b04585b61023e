//! Stream ownership (DistributedLog's per-stream write lock, taken without waiting as its proxy
//! does with `lockTimeoutSeconds=0`): acquiring a stream (lease, recovery, stream task), the
//! handle of one acquisition, noticing that the lease is lost, and giving the stream up.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use quire_metadata::validate_stream_name;
use tokio::sync::{mpsc, watch};

use super::tail_cache::{TailCache, TailState};
use super::writer::{Command, Writer};
use super::{StreamManager, StreamShared};
use crate::error::{Error, FromMetadata, Result};

/// Why the lease says ownership is gone, if it does.
fn lease_lost_reason(lost: &watch::Receiver<bool>) -> Option<String> {
    if *lost.borrow() {
        Some("the ownership lease was lost (session expired or lease released)".into())
    } else if lost.has_changed().is_err() {
        Some("the metadata store dropped the ownership lease".into())
    } else {
        None
    }
}

static PLACEHOLDER_IDENTITY_SEQ: AtomicU64 = AtomicU64::new(1);

/// The identity leases are taken under: `owner_address`, or when it is empty a placeholder
/// `unadvertised-<pid>-<n>` unique within the process (see [`super::StreamConfig::owner_address`]).
pub(super) fn owner_identity(owner_address: &str) -> String {
    if owner_address.is_empty() {
        format!(
            "unadvertised-{}-{}",
            std::process::id(),
            PLACEHOLDER_IDENTITY_SEQ.fetch_add(1, Ordering::Relaxed)
        )
    } else {
        owner_address.to_string()
    }
}

/// Resolves once the lease says ownership is gone; never without a lease.
pub(super) async fn lease_lost(lost: &mut Option<watch::Receiver<bool>>) -> String {
    let Some(rx) = lost.as_mut() else {
        return std::future::pending().await;
    };
    match rx.wait_for(|l| *l).await {
        Ok(_) => "the ownership lease was lost (session expired or lease released)".into(),
        Err(_) => "the metadata store dropped the ownership lease".into(),
    }
}

/// A stream acquired by this proxy: the way to its task and to its readers' view.
pub(crate) struct StreamHandle {
    pub(super) name: String,
    pub(super) commands: mpsc::Sender<Command>,
    pub(super) tail: watch::Receiver<TailState>,
    pub(super) shared: Arc<StreamShared>,
    /// The lease's `lost` flag, to notice a loss before the task does.
    pub(super) lease_lost: watch::Receiver<bool>,
}

impl StreamHandle {
    /// Why this acquisition of the stream is over, if it is.
    pub(super) fn lost_reason(&self) -> Option<String> {
        if let Some(r) = self.shared.lost.lock().expect("lost lock").clone() {
            return Some(r);
        }
        lease_lost_reason(&self.lease_lost)
    }
}

impl StreamManager {
    /// The handle of `name`, acquiring the stream (taking its lease, recovering its
    /// in-progress segments and starting its task) the first time, and again after ownership
    /// was lost. With `report_loss`, a loss no request has been told about yet is returned as
    /// `OwnershipLost` once (so a writer learns that its stream moved) before acquiring again.
    pub(super) async fn stream(
        &self,
        name: &str,
        create_if_missing: bool,
        report_loss: bool,
    ) -> Result<Arc<StreamHandle>> {
        for _ in 0..3 {
            self.check_running()?;
            let cell = self
                .streams
                .lock()
                .expect("streams lock")
                .entry(name.to_string())
                .or_default()
                .clone();
            let result = cell
                .get_or_try_init(|| self.acquire(name, create_if_missing))
                .await
                .cloned();
            let handle = match result {
                Ok(h) => h,
                Err(e) => {
                    // Do not keep entries for names that failed (unknown or invalid streams,
                    // streams owned elsewhere), but only when no other request holds the entry:
                    // one waiting on it may be initialising it right now (a write creating the
                    // stream this read did not find), and a request arriving after a removal
                    // would start a second acquisition that finds the first one's lease and
                    // answers with a redirect to this same proxy. Clones are made only under
                    // the table's lock, so with ours dropped under it the count is exact.
                    let mut streams = self.streams.lock().expect("streams lock");
                    drop(cell);
                    if streams
                        .get(name)
                        .is_some_and(|c| c.get().is_none() && Arc::strong_count(c) == 1)
                    {
                        streams.remove(name);
                    }
                    return Err(e);
                }
            };
            let Some(reason) = handle.lost_reason() else {
                handle.shared.requests.fetch_add(1, Ordering::SeqCst);
                return Ok(handle);
            };
            // This acquisition is over: forget it, so the next attempt acquires afresh.
            {
                let mut streams = self.streams.lock().expect("streams lock");
                if streams.get(name).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                    streams.remove(name);
                }
            }
            // A deleted stream is not a lost one: acquire afresh (finding no stream, or
            // creating a new one); nor is one given back after a sweep.
            if report_loss
                && !handle.shared.deleted.load(Ordering::SeqCst)
                && !handle.shared.released.load(Ordering::SeqCst)
                && !handle.shared.loss_reported.swap(true, Ordering::SeqCst)
            {
                return Err(Error::OwnershipLost {
                    stream: name.to_string(),
                    reason,
                });
            }
        }
        Err(Error::OwnershipLost {
            stream: name.to_string(),
            reason: "ownership was lost again right after each acquisition".into(),
        })
    }

    async fn acquire(&self, name: &str, create_if_missing: bool) -> Result<Arc<StreamHandle>> {
        validate_stream_name(name).map_err(|e| Error::from_metadata(name, "acquire stream", e))?;
        let meta = match self.metadata.read_stream(name).await {
            Ok(m) => m,
            Err(quire_metadata::Error::NotFound { .. }) if create_if_missing => {
                match self.create_stream(name).await {
                    Ok(()) | Err(Error::StreamExists { .. }) => {}
                    Err(e) => return Err(e),
                }
                self.metadata
                    .read_stream(name)
                    .await
                    .map_err(|e| Error::from_metadata(name, "read stream", e))?
            }
            Err(e) => return Err(Error::from_metadata(name, "read stream", e)),
        };
        // The write lock, without waiting (DistributedLog proxy: lockTimeoutSeconds=0).
        let lease = match self.metadata.try_acquire_stream(name, &self.identity).await {
            Ok(Ok(lease)) => lease,
            Ok(Err(owner)) => {
                return Err(Error::OwnedElsewhere {
                    stream: name.to_string(),
                    owner,
                })
            }
            Err(e) => return Err(Error::from_metadata(name, "acquire stream lease", e)),
        };
        let lease_lost = lease.lost.clone();
        let (tail_tx, tail_rx) = watch::channel(TailState::from_metadata(&meta.value));
        let shared = Arc::new(StreamShared::default());
        let mut writer = Writer {
            name: name.to_string(),
            metadata: self.metadata.clone(),
            bookkeeper: self.bookkeeper.clone(),
            config: self.config.clone(),
            last_txid: meta.value.max_txid,
            meta,
            current: None,
            healthy: true,
            closed: false,
            tail: tail_tx,
            shared: shared.clone(),
            lease: Some(lease),
            entries: VecDeque::new(),
            appends: VecDeque::new(),
            appends_base: 0,
            acked: None,
            completed_at: std::collections::HashMap::new(),
            unrecovered: None,
            spare: None,
            roll_deferred: None,
            layer: self.layer.clone(),
        };
        // Published for `describe` also while a failed recovery leaves it at the stored value.
        writer.set_last_txid(writer.last_txid);
        if let Err(e) = writer.recover().await {
            // A segment whose ledger cannot be recovered now (a bookie of its write quorum down
            // with no replacement) does not keep the stream from being served: its entries up
            // to the LAC the live bookies hold are readable, appends are answered with the
            // recovery's error, and the task retries recovery (see `Unrecovered`).
            if writer.unrecovered.is_none() {
                writer.release_lease().await;
                return Err(e);
            }
            tracing::warn!(stream = name, error = %e, "serving the stream without recovering its in-progress segment");
        }
        let (tx, rx) = mpsc::channel(self.config.append_queue_max);
        match &self.runtime {
            Some(rt) => drop(rt.spawn(writer.run(rx))),
            None => drop(tokio::spawn(writer.run(rx))),
        }
        tracing::info!(stream = name, owner = %self.identity, "acquired stream");
        Ok(Arc::new(StreamHandle {
            name: name.to_string(),
            commands: tx,
            tail: tail_rx,
            shared,
            lease_lost,
        }))
    }
}

impl Writer {
    /// Gives the lease back to the metadata store (a no-op if it was already lost).
    pub(super) async fn release_lease(&mut self) {
        if let Some(lease) = self.lease.take() {
            if let Err(e) = self.metadata.release_stream(lease).await {
                tracing::warn!(stream = %self.name, error = %e, "releasing the stream lease failed");
            }
        }
    }

    /// Gives a stream acquired only for a lifecycle sweep back (nothing is open or queued):
    /// the lease is released and this acquisition ends without a loss to report; the next
    /// request acquires the stream afresh.
    pub(super) async fn release_after_sweep(&mut self) {
        self.release_lease().await;
        self.shared.released.store(true, Ordering::SeqCst);
        self.shared.loss_reported.store(true, Ordering::SeqCst);
        *self.shared.lost.lock().expect("lost lock") =
            Some("the stream was given up after a lifecycle sweep".into());
        tracing::debug!(stream = %self.name, "released the stream after a lifecycle sweep");
    }

    /// Ownership is gone: drop the ledger writer and cached state without completing the
    /// segment (the next owner recovers it), give the lease up and mark the stream lost.
    pub(super) async fn lose(&mut self, reason: String) {
        tracing::warn!(stream = %self.name, %reason, "giving up stream ownership");
        self.current = None;
        self.healthy = false;
        self.roll_deferred = None;
        *self.shared.cache.lock().expect("cache lock") = TailCache::default();
        self.shared.readers.lock().expect("readers lock").clear();
        self.release_lease().await;
        *self.shared.lost.lock().expect("lost lock") = Some(reason);
    }

    /// `OwnershipLost` if the lease says ownership is gone (DistributedLog
    /// `checkOwnershipAndReacquire` before every transmit and segment start).
    pub(super) fn check_ownership(&self) -> Result<()> {
        let reason = match &self.lease {
            None => Some("this proxy holds no lease for the stream".to_string()),
            Some(l) => lease_lost_reason(&l.lost),
        };
        match reason {
            Some(reason) => Err(Error::OwnershipLost {
                stream: self.name.clone(),
                reason,
            }),
            None => Ok(()),
        }
    }

    /// A failed compare-and-set of the stream's metadata: another writer changed it.
    pub(super) fn stream_update_err(&self, op: &'static str, e: quire_metadata::Error) -> Error {
        match e {
            quire_metadata::Error::BadVersion { expected, found, .. } => Error::OwnershipLost {
                stream: self.name.clone(),
                reason: format!("{op}: the stream's metadata was changed by another writer (version {found}, expected {expected})"),
            },
            other => self.meta_err(op, other),
        }
    }
}

//! Stream ownership (DistributedLog's per-stream write lock, taken without waiting as its proxy
//! does with `lockTimeoutSeconds=0`): the lease a stream task holds ([`Ownership`]), the
//! handle of one acquisition, noticing that the lease is lost, and giving the stream up.
//! Acquiring a stream is `registry.rs`'s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use quire_metadata::{MetadataStore, StreamLease};
use tokio::sync::{mpsc, watch};

use super::command::Command;
use super::shared::StreamShared;
use super::tail_cache::{TailCache, TailState};
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

/// The stream's lease while this proxy's task holds it (DistributedLog's write lock), owned
/// by the stream task: checked before every append and segment start, watched while idle,
/// given back on close, after a sweep-only acquisition, or when ownership is lost.
pub(super) struct Ownership {
    name: String,
    metadata: Arc<dyn MetadataStore>,
    shared: Arc<StreamShared>,
    /// `None` once given back or lost.
    lease: Option<StreamLease>,
}

impl Ownership {
    /// The ownership of `name` under `lease`, just taken.
    pub(super) fn new(
        name: &str,
        metadata: Arc<dyn MetadataStore>,
        shared: Arc<StreamShared>,
        lease: StreamLease,
    ) -> Self {
        Self {
            name: name.to_string(),
            metadata,
            shared,
            lease: Some(lease),
        }
    }

    /// The lease's `lost` flag to watch (see [`lease_lost`]); `None` without a lease.
    pub(super) fn lost_watch(&self) -> Option<watch::Receiver<bool>> {
        self.lease.as_ref().map(|l| l.lost.clone())
    }

    /// Gives the lease back to the metadata store (a no-op if it was already lost).
    pub(super) async fn release(&mut self) {
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
        self.release().await;
        self.shared.released.store(true, Ordering::SeqCst);
        self.shared.loss_reported.store(true, Ordering::SeqCst);
        *self.shared.lost.lock().expect("lost lock") =
            Some("the stream was given up after a lifecycle sweep".into());
        tracing::debug!(stream = %self.name, "released the stream after a lifecycle sweep");
    }

    /// Gives a stream up for balance (`placement.rs`; its segment was completed): the readers'
    /// cached state is dropped, the lease released, and this acquisition ends without a loss
    /// to report; requests are redirected to `to`.
    pub(super) async fn release_moved(&mut self, to: &str) {
        *self.shared.cache.lock().expect("cache lock") = TailCache::default();
        self.shared.readers.lock().expect("readers lock").clear();
        self.release().await;
        self.shared.released.store(true, Ordering::SeqCst);
        self.shared.loss_reported.store(true, Ordering::SeqCst);
        *self.shared.lost.lock().expect("lost lock") =
            Some(format!("the stream was released to {to} for balance"));
        tracing::info!(stream = %self.name, %to, "released the stream for balance");
    }

    /// Ownership is gone: drop the readers' cached state, give the lease up and mark this
    /// acquisition lost with `reason` (the caller dropped its ledger writer first, without
    /// completing the segment: the next owner recovers it).
    pub(super) async fn give_up(&mut self, reason: String) {
        tracing::warn!(stream = %self.name, %reason, "giving up stream ownership");
        *self.shared.cache.lock().expect("cache lock") = TailCache::default();
        self.shared.readers.lock().expect("readers lock").clear();
        self.release().await;
        *self.shared.lost.lock().expect("lost lock") = Some(reason);
    }

    /// The stream was deleted: drop the readers' cached state and `describe`'s view, give the
    /// lease up and end this acquisition, so that later requests find no stream (or create a
    /// new one).
    pub(super) async fn end_deleted(&mut self) {
        *self.shared.cache.lock().expect("cache lock") = Default::default();
        self.shared.readers.lock().expect("readers lock").clear();
        *self.shared.view.lock().expect("view lock") = Default::default();
        self.shared.deleted.store(true, Ordering::SeqCst);
        self.release().await;
        *self.shared.lost.lock().expect("lost lock") = Some("the stream was deleted".into());
    }

    /// Why this acquisition ended (`OwnershipLost` with the recorded reason).
    pub(super) fn lost_error(&self) -> Error {
        let reason = self
            .shared
            .lost
            .lock()
            .expect("lost lock")
            .clone()
            .unwrap_or_default();
        Error::OwnershipLost {
            stream: self.name.clone(),
            reason,
        }
    }

    /// `OwnershipLost` if the lease says ownership is gone (DistributedLog
    /// `checkOwnershipAndReacquire` before every transmit and segment start).
    pub(super) fn check(&self) -> Result<()> {
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

    /// A failed compare-and-set of the stream's metadata: `BadVersion` means another writer
    /// changed it (`OwnershipLost`); anything else is the store's error for `op`.
    pub(super) fn update_err(&self, op: &'static str, e: quire_metadata::Error) -> Error {
        match e {
            quire_metadata::Error::BadVersion { expected, found, .. } => Error::OwnershipLost {
                stream: self.name.clone(),
                reason: format!("{op}: the stream's metadata was changed by another writer (version {found}, expected {expected})"),
            },
            other => Error::from_metadata(&self.name, op, other),
        }
    }
}

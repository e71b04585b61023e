//! The records autorecovery keeps beside the ledgers (BookKeeper's
//! `LedgerUnderreplicationManager` and `LedgerAuditorManager`), as one interface so that the
//! auditor, the replication workers and decommission (crate `quire-autorecovery`) run on
//! ZooKeeper in a cluster and on the embedded store in tests and the sandbox:
//!
//! * under-replication marks ([`UnderReplication`], one per ledger, persistent, changed by
//!   compare-and-set),
//! * the replication workers' per-ledger locks ([`ReplicationLock`], ending with their holder),
//! * the bookies being decommissioned (persistent),
//! * the auditor election (one candidate per daemon, the earliest is the auditor).
//!
//! [`ZkStore`](crate::ZkStore) keeps them as znodes (`docs/format/zookeeper-layout.md`,
//! "Autorecovery"); [`EmbeddedStore`](crate::EmbeddedStore) keeps marks and decommissions in
//! its document and locks and candidates in memory, for the process's lifetime (its
//! "session").

use async_trait::async_trait;
use quire_wire::LedgerId;
use tokio::sync::watch;

use crate::{
    AutorecoveryState, BookieId, Decommission, LedgerMetadata, MetadataStore, ReplicationLock,
    Result, UnderReplication, Version, Versioned,
};

/// The autorecovery records of a metadata store. Errors as [`MetadataStore`]'s (`Io` or
/// `ZooKeeper`), plus the ones listed per method.
#[async_trait]
pub trait UnderReplicationStore: MetadataStore {
    /// Marks `ledger` under-replicated because of `bookies` (BookKeeper
    /// `markLedgerUnderreplicated`): creates its mark, or adds the bookies to an existing one
    /// by compare-and-set (its `ctime_ms` stays). Idempotent. `Corrupt` for an unreadable mark.
    async fn mark_under_replicated(&self, ledger: LedgerId, bookies: &[BookieId]) -> Result<()>;
    /// Reads one ledger's mark; `NotFound` when it is not marked.
    async fn read_under_replicated(&self, ledger: LedgerId) -> Result<Versioned<UnderReplication>>;
    /// Every marked ledger with its mark, by ascending ledger id (BookKeeper
    /// `listLedgersToRereplicate`).
    async fn list_under_replicated(&self) -> Result<Vec<(LedgerId, Versioned<UnderReplication>)>>;
    /// Removes a ledger's mark if it is still at `expected` (BookKeeper
    /// `markLedgerReplicated`); `BadVersion` when it was extended meanwhile (it stays). A mark
    /// already gone is not an error.
    async fn clear_under_replicated(&self, ledger: LedgerId, expected: Version) -> Result<()>;
    /// Claims a marked ledger for the worker `owner`; `None` when another worker holds it. The
    /// lock ends with [`UnderReplicationStore::release_replication_lock`] or its holder's
    /// session.
    async fn try_lock_under_replicated(
        &self,
        ledger: LedgerId,
        owner: &str,
    ) -> Result<Option<ReplicationLock>>;
    /// Releases a worker's claim; a lock already gone is not an error.
    async fn release_replication_lock(&self, lock: ReplicationLock) -> Result<()>;
    /// Records that `bookie` is being decommissioned (workers then treat its replicas as lost
    /// even while it is registered); `false` when it already was. `Invalid` for a bad id.
    async fn start_decommission(&self, bookie: &BookieId) -> Result<bool>;
    /// The bookies being decommissioned, sorted.
    async fn decommissioning(&self) -> Result<Vec<BookieId>>;
    /// Ends a decommission; one not started is not an error. `Invalid` for a bad id.
    async fn end_decommission(&self, bookie: &BookieId) -> Result<()>;
    /// The decommissions under way with their records, sorted by bookie. `Corrupt` for an
    /// unreadable record.
    async fn decommissions(&self) -> Result<Vec<(BookieId, Decommission)>>;
    /// Adds what a worker copied off `bookie` (a fragment's `bytes` and `entries`) to its
    /// decommission record, by compare-and-set; no decommission under way is not an error.
    async fn record_decommission_copy(
        &self,
        bookie: &BookieId,
        bytes: u64,
        entries: u64,
    ) -> Result<()>;
    /// Deletes a bookie's cookie at `expected` (BookKeeper `cookie_delete`); `NotFound`,
    /// `BadVersion`, `Invalid`.
    async fn delete_cookie(&self, bookie: &BookieId, expected: Version) -> Result<()>;
    /// Enters the auditor election as `name` (BookKeeper `AuditorElector`).
    async fn join_auditor_election(&self, name: &str) -> Result<Box<dyn AuditorElection>>;
    /// The candidates in election order and the ledgers workers hold now.
    async fn autorecovery_state(&self) -> Result<AutorecoveryState>;
    /// Turns `true` when this handle's session ends (its locks and candidacy with it): a
    /// daemon then starts over with a new handle. The embedded store's never ends.
    fn session_lost(&self) -> watch::Receiver<bool>;
}

/// One auditor candidate's place in the election: the candidate is the auditor while it is
/// the earliest one still in (ZooKeeper's leader-election recipe, as BookKeeper's).
#[async_trait]
pub trait AuditorElection: Send + Sync {
    /// The identity the candidate entered with.
    fn name(&self) -> &str;
    /// Waits until this candidate is the auditor. An error (its place is gone, the session
    /// ended) means it must enter again with a new session.
    async fn wait_until_elected(&self) -> Result<()>;
    /// Whether this candidate is still in and the earliest.
    async fn is_elected(&self) -> Result<bool>;
}

#[async_trait]
impl UnderReplicationStore for crate::ZkStore {
    async fn mark_under_replicated(&self, ledger: LedgerId, bookies: &[BookieId]) -> Result<()> {
        crate::ZkStore::mark_under_replicated(self, ledger, bookies).await
    }
    async fn read_under_replicated(&self, ledger: LedgerId) -> Result<Versioned<UnderReplication>> {
        crate::ZkStore::read_under_replicated(self, ledger).await
    }
    async fn list_under_replicated(&self) -> Result<Vec<(LedgerId, Versioned<UnderReplication>)>> {
        crate::ZkStore::list_under_replicated(self).await
    }
    async fn clear_under_replicated(&self, ledger: LedgerId, expected: Version) -> Result<()> {
        crate::ZkStore::clear_under_replicated(self, ledger, expected).await
    }
    async fn try_lock_under_replicated(
        &self,
        ledger: LedgerId,
        owner: &str,
    ) -> Result<Option<ReplicationLock>> {
        crate::ZkStore::try_lock_under_replicated(self, ledger, owner).await
    }
    async fn release_replication_lock(&self, lock: ReplicationLock) -> Result<()> {
        crate::ZkStore::release_replication_lock(self, lock).await
    }
    async fn start_decommission(&self, bookie: &BookieId) -> Result<bool> {
        crate::ZkStore::start_decommission(self, bookie).await
    }
    async fn decommissioning(&self) -> Result<Vec<BookieId>> {
        crate::ZkStore::decommissioning(self).await
    }
    async fn end_decommission(&self, bookie: &BookieId) -> Result<()> {
        crate::ZkStore::end_decommission(self, bookie).await
    }
    async fn decommissions(&self) -> Result<Vec<(BookieId, Decommission)>> {
        crate::ZkStore::decommissions(self).await
    }
    async fn record_decommission_copy(
        &self,
        bookie: &BookieId,
        bytes: u64,
        entries: u64,
    ) -> Result<()> {
        crate::ZkStore::record_decommission_copy(self, bookie, bytes, entries).await
    }
    async fn delete_cookie(&self, bookie: &BookieId, expected: Version) -> Result<()> {
        crate::ZkStore::delete_cookie(self, bookie, expected).await
    }
    async fn join_auditor_election(&self, name: &str) -> Result<Box<dyn AuditorElection>> {
        Ok(Box::new(
            crate::ZkStore::join_auditor_election(self, name).await?,
        ))
    }
    async fn autorecovery_state(&self) -> Result<AutorecoveryState> {
        crate::ZkStore::autorecovery_state(self).await
    }
    fn session_lost(&self) -> watch::Receiver<bool> {
        crate::ZkStore::session_lost(self)
    }
}

#[async_trait]
impl AuditorElection for crate::AuditorCandidate {
    fn name(&self) -> &str {
        crate::AuditorCandidate::name(self)
    }
    async fn wait_until_elected(&self) -> Result<()> {
        crate::AuditorCandidate::wait_until_elected(self).await
    }
    async fn is_elected(&self) -> Result<bool> {
        crate::AuditorCandidate::is_elected(self).await
    }
}

/// A decommission under way as `quire autorecovery status` and `quire cluster status` show it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PendingDecommission {
    /// The bookie being decommissioned.
    pub bookie: BookieId,
    /// Its record (start, bytes and entries copied so far).
    #[serde(flatten)]
    pub record: Decommission,
    /// Ledgers whose metadata still names it (a walk of every ledger's metadata).
    pub ledgers_left: usize,
    /// Whether it is registered now (a bookie leaves the registry while it is decommissioned).
    pub registered: bool,
}

/// Every decommission under way with its progress, sorted by bookie: the records, how many
/// ledgers still name each bookie (one read of every ledger's metadata, as the decommission's
/// own pass), and whether it is registered. A ledger deleted during the walk is skipped.
///
/// # Errors
/// The store's.
pub async fn pending_decommissions(
    store: &dyn UnderReplicationStore,
) -> Result<Vec<PendingDecommission>> {
    let records = store.decommissions().await?;
    if records.is_empty() {
        return Ok(Vec::new());
    }
    let registered = store.list_bookies().await?;
    let mut left = vec![0usize; records.len()];
    walk_ledgers(store, |_, meta| {
        for (i, (bookie, _)) in records.iter().enumerate() {
            if meta.fragments.iter().any(|f| f.bookies.contains(bookie)) {
                left[i] += 1;
            }
        }
    })
    .await?;
    Ok(records
        .into_iter()
        .zip(left)
        .map(|((bookie, record), ledgers_left)| PendingDecommission {
            registered: registered.iter().any(|b| b.id == bookie),
            bookie,
            record,
            ledgers_left,
        })
        .collect())
}

/// Reads every ledger's metadata once, in id order, and hands each to `visit`; a ledger
/// deleted between the listing and its read is skipped. The one walk behind a decommission's
/// up-front check, its passes and the status commands' pending counts.
///
/// # Errors
/// The store's (listing, or reading a ledger that exists).
pub async fn walk_ledgers<S: MetadataStore + ?Sized>(
    store: &S,
    mut visit: impl FnMut(LedgerId, &LedgerMetadata) + Send,
) -> Result<()> {
    for ledger in store.list_ledgers().await? {
        match store.read_ledger(ledger).await {
            Ok(v) => visit(ledger, &v.value),
            Err(crate::Error::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Adds `bookies` to a mark's bookie list `list`, kept sorted and duplicate-free (the same rule
/// in both stores); whether it grew.
pub(crate) fn add_sorted(list: &mut Vec<BookieId>, bookies: &[BookieId]) -> bool {
    let before = list.len();
    list.extend(bookies.iter().cloned());
    list.sort();
    list.dedup();
    list.len() != before
}

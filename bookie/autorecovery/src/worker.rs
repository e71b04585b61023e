//! The replication worker (BookKeeper `ReplicationWorker`): claims one marked ledger at a time
//! with a lock ([`UnderReplicationStore::try_lock_under_replicated`]), and for every fragment
//! naming a listed bookie that is still unregistered (or being decommissioned) copies the
//! fragment's entries to a replacement ([`BookKeeper::replicate_fragment`]: verified, recovery
//! adds, then the ensemble by compare-and-set); a listed bookie that is registered and lacks
//! entries gets them copied back in place ([`BookKeeper::repair_fragment_in_place`]); then it
//! removes the mark by compare-and-set (a mark the auditor extended meanwhile stays for another
//! pass). The last fragment of a ledger that is not closed is left to its writer for
//! `open_ledger_grace` after the mark was made, then the ledger is recovered (fenced and
//! closed) first, as BookKeeper does. A deleted ledger's mark is simply removed. A failed
//! ledger is retried after [`REREPLICATE_BACKOFF`] (BookKeeper `rwRereplicateBackoffMs`).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use quire_ledger::BookKeeper;
use quire_metadata::{
    BookieId, Fragment, LedgerMetadata, LedgerState, ReplicationLock, UnderReplication,
    UnderReplicationStore, Versioned,
};
use quire_wire::LedgerId;

use crate::{is_not_found, AutorecoveryMetrics, AutorecoveryOptions, REREPLICATE_BACKOFF};

/// What one claim of a ledger came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing left to copy; the mark is removed (unless the auditor extended it meanwhile),
    /// or the ledger was deleted and its mark removed.
    Done,
    /// The last fragment of an open ledger is in its grace period, or a reported bookie is
    /// away: the ledger is left alone until then.
    Deferred(Instant),
}

/// A claimed ledger: its lock and its mark as read under the lock.
#[derive(Debug)]
pub struct Claim {
    /// The worker's lock on the ledger (release it with
    /// [`UnderReplicationStore::release_replication_lock`]).
    pub lock: ReplicationLock,
    /// The mark, read after the lock was taken.
    pub mark: Versioned<UnderReplication>,
}

/// One replication worker: its identity on locks and the ledgers it leaves alone for now.
#[derive(Debug)]
pub struct Worker {
    name: String,
    options: AutorecoveryOptions,
    metrics: AutorecoveryMetrics,
    /// Ledgers this worker leaves alone until the given time (failed, or in a grace period).
    later: HashMap<LedgerId, Instant>,
}

impl Worker {
    /// A worker named `name` (its identity on the locks it takes).
    pub fn new(name: String, options: AutorecoveryOptions, metrics: AutorecoveryMetrics) -> Self {
        Self {
            name,
            options,
            metrics,
            later: HashMap::new(),
        }
    }

    /// Handles one marked ledger after another, waiting `poll_interval` when there is none;
    /// never returns (the daemon drops it when its session ends).
    pub async fn run(mut self, store: &dyn UnderReplicationStore, bk: &BookKeeper) {
        loop {
            match self.work_once(store, bk).await {
                Ok(Some(_)) => {}
                Ok(None) => tokio::time::sleep(self.options.poll_interval).await,
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "cannot look for under-replicated ledgers");
                    tokio::time::sleep(self.options.poll_interval).await;
                }
            }
        }
    }

    /// Claims one marked ledger, re-replicates it and releases the lock. `None` when no
    /// ledger could be claimed; a failed ledger is `Some` with the error logged and the
    /// ledger left alone for [`REREPLICATE_BACKOFF`].
    ///
    /// # Errors
    /// The marks cannot be listed or a lock taken (nothing was claimed).
    pub async fn work_once(
        &mut self,
        store: &dyn UnderReplicationStore,
        bk: &BookKeeper,
    ) -> Result<Option<(LedgerId, Result<Outcome>)>> {
        let Some(Claim { lock, mark }) = self.claim(store).await? else {
            return Ok(None);
        };
        let id = lock.ledger;
        let outcome = replicate_ledger(store, bk, id, &mark, &self.options, &self.metrics).await;
        if let Err(e) = store.release_replication_lock(lock).await {
            tracing::warn!(ledger = id.0, error = %e, "cannot release the replication lock; it goes with the session");
        }
        match &outcome {
            Ok(Outcome::Done) => {
                self.later.remove(&id);
            }
            Ok(Outcome::Deferred(until)) => {
                self.later.insert(id, *until);
            }
            Err(e) => {
                tracing::warn!(ledger = id.0, error = %format!("{e:#}"), "re-replication failed; retrying later");
                self.later
                    .insert(id, quire_clock::now() + REREPLICATE_BACKOFF);
            }
        }
        Ok(Some((id, outcome)))
    }

    /// Claims one marked ledger this worker does not leave alone for now (in random order, so
    /// that workers spread out); `None` when every one is held by another worker or none is
    /// marked.
    ///
    /// # Errors
    /// The store's.
    pub async fn claim(&mut self, store: &dyn UnderReplicationStore) -> Result<Option<Claim>> {
        use rand::seq::SliceRandom;
        let mut marks = store.list_under_replicated().await?;
        self.metrics
            .under_replicated_ledgers
            .set(marks.len() as i64);
        let now = quire_clock::now();
        self.later
            .retain(|id, until| *until > now && marks.iter().any(|(m, _)| m == id));
        marks.retain(|(id, _)| !self.later.contains_key(id));
        marks.shuffle(&mut quire_clock::rng());
        for (id, _) in marks {
            let Some(lock) = store.try_lock_under_replicated(id, &self.name).await? else {
                continue;
            };
            // Read the mark again under the lock: a worker that held it before may have
            // removed it.
            match store.read_under_replicated(id).await {
                Ok(mark) => return Ok(Some(Claim { lock, mark })),
                Err(quire_metadata::Error::NotFound { .. }) => {
                    store.release_replication_lock(lock).await?;
                }
                Err(e) => {
                    store.release_replication_lock(lock).await?;
                    return Err(e.into());
                }
            }
        }
        Ok(None)
    }
}

/// The bookies of a mark, sorted by what the worker does about them.
struct MarkView {
    /// Listed bookies not registered, or being decommissioned: replaced.
    lost: HashSet<BookieId>,
    /// Listed or reported bookies registered now: their missing entries are copied back.
    present: HashSet<BookieId>,
    /// Reported bookies not registered now (restarting, or stopped): left until they return;
    /// if one never does, the auditor marks it lost.
    away: Vec<BookieId>,
    /// The lost ones being decommissioned: what is copied off them goes on their record.
    leaving: HashSet<BookieId>,
}

async fn view_of(store: &dyn UnderReplicationStore, mark: &UnderReplication) -> Result<MarkView> {
    let registered: HashSet<BookieId> = store
        .list_bookies()
        .await?
        .into_iter()
        .map(|b| b.id)
        .collect();
    let decommissioning: HashSet<BookieId> = store.decommissioning().await?.into_iter().collect();
    let lost: HashSet<BookieId> = mark
        .missing_bookies
        .iter()
        .filter(|b| !registered.contains(*b) || decommissioning.contains(*b))
        .cloned()
        .collect();
    let listed = || mark.missing_bookies.iter().chain(&mark.gaps_on);
    let present = listed()
        .filter(|b| !lost.contains(*b) && registered.contains(*b))
        .cloned()
        .collect();
    let away = listed()
        .filter(|b| !lost.contains(*b) && !registered.contains(*b))
        .cloned()
        .collect();
    let leaving = lost.intersection(&decommissioning).cloned().collect();
    Ok(MarkView {
        lost,
        present,
        away,
        leaving,
    })
}

/// One claimed ledger's work in progress.
struct Job<'a> {
    store: &'a dyn UnderReplicationStore,
    bk: &'a BookKeeper,
    id: LedgerId,
    mark: &'a Versioned<UnderReplication>,
    options: &'a AutorecoveryOptions,
    metrics: &'a AutorecoveryMetrics,
    /// When to look again, if some part is left for later.
    deferred: Option<Instant>,
}

/// Re-replicates every fragment of `id` that names a bookie of the mark's `missing_bookies`
/// still unregistered (or being decommissioned), and copies back, in place, the entries a
/// registered bookie of the mark lacks (the periodic check's finding or a writer's report),
/// checking every entry of every fragment that names it; then removes the mark at the version
/// `mark` was read at.
///
/// # Errors
/// The store's, a recovery's or a copy's (the mark stays; the worker retries later).
pub async fn replicate_ledger(
    store: &dyn UnderReplicationStore,
    bk: &BookKeeper,
    id: LedgerId,
    mark: &Versioned<UnderReplication>,
    options: &AutorecoveryOptions,
    metrics: &AutorecoveryMetrics,
) -> Result<Outcome> {
    let mut job = Job {
        store,
        bk,
        id,
        mark,
        options,
        metrics,
        deferred: None,
    };
    let view = view_of(store, &mark.value).await?;
    let meta = match store.read_ledger(id).await {
        Ok(v) => v.value,
        Err(quire_metadata::Error::NotFound { .. }) => return job.deleted().await,
        Err(e) => return Err(e.into()),
    };
    let Some(meta) = job.settle_open_ledger(meta, &view.lost).await? else {
        return job.deleted().await;
    };
    let in_place = job.in_place_fragments(&meta, &view.present);
    let todo = lost_fragments(&meta, &view.lost);
    if !job.repair_in_place(in_place).await? || !job.replace_lost(todo, &view).await? {
        return job.deleted().await;
    }
    job.finish(&view.away).await
}

impl Job<'_> {
    fn defer_until(&mut self, until: Instant) {
        self.deferred = Some(self.deferred.map_or(until, |d| d.min(until)));
    }

    /// The ledger is gone: its mark goes too.
    async fn deleted(&self) -> Result<Outcome> {
        tracing::info!(
            ledger = self.id.0,
            "under-replicated ledger was deleted; mark removed"
        );
        self.store
            .clear_under_replicated(self.id, self.mark.version)
            .await?;
        Ok(Outcome::Done)
    }

    /// An open ledger whose last fragment names a lost bookie: within the grace period after
    /// the mark, left to its writer (deferred); after it, recovered first (fenced and closed,
    /// BookKeeper's rule) and its metadata read again. `None` when the ledger was deleted.
    async fn settle_open_ledger(
        &mut self,
        meta: LedgerMetadata,
        lost: &HashSet<BookieId>,
    ) -> Result<Option<LedgerMetadata>> {
        let names_lost = |f: &Fragment| f.bookies.iter().any(|b| lost.contains(b));
        if meta.state == LedgerState::Closed || !meta.fragments.last().is_some_and(names_lost) {
            return Ok(Some(meta));
        }
        let grace = self.options.open_ledger_grace.as_millis() as u64;
        let grace_end_ms = self.mark.value.ctime_ms.saturating_add(grace);
        let now = quire_clock::unix_ms();
        if now < grace_end_ms {
            self.defer_until(quire_clock::now() + Duration::from_millis(grace_end_ms - now));
            return Ok(Some(meta));
        }
        tracing::info!(
            ledger = self.id.0,
            "open ledger past its grace period: recovering it first"
        );
        match self.bk.recover_ledger(self.id).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(e).context("recovery before re-replication"),
        }
        Ok(Some(self.store.read_ledger(self.id).await?.value))
    }

    /// The fragments to check entry by entry on a registered bookie of the mark (a wiped one
    /// the periodic check found, or one a writer reported after adds to it failed): a writer's
    /// gaps can lie anywhere in a fragment, where the periodic check's first/last probe does
    /// not look. An open ledger whose last fragment names one is left until its writer closes
    /// it (or a recovery does): that fragment's end is not known yet, and the writer is
    /// likely alive.
    fn in_place_fragments(
        &mut self,
        meta: &LedgerMetadata,
        present: &HashSet<BookieId>,
    ) -> Vec<(u64, BookieId)> {
        let open = meta.state != LedgerState::Closed;
        let names_present = |f: &Fragment| f.bookies.iter().any(|b| present.contains(b));
        if open && meta.fragments.last().is_some_and(names_present) {
            self.defer_until(quire_clock::now() + self.options.open_ledger_grace);
            return Vec::new();
        }
        sealed_fragments(meta)
            .flat_map(|f| {
                f.bookies
                    .iter()
                    .filter(|b| present.contains(*b))
                    .map(|b| (f.first_entry, b.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Copies back in place what each `(first_entry, bookie)` lacks; `false` when the ledger
    /// turned out deleted.
    async fn repair_in_place(&self, fragments: Vec<(u64, BookieId)>) -> Result<bool> {
        for (first_entry, bookie) in fragments {
            match self
                .bk
                .repair_fragment_in_place(self.id, first_entry, &bookie)
                .await
            {
                Ok(done) => {
                    self.metrics.bytes_written.inc_by(done.bytes_copied);
                    self.metrics.entries_written.inc_by(done.entries_copied);
                    self.metrics.fragments_repaired.inc();
                }
                Err(e) if is_not_found(&e) => return Ok(false),
                Err(e) => {
                    let id = self.id;
                    return Err(e).with_context(|| {
                        format!("ledger {id}: fragment from entry {first_entry}, copying back to {bookie}")
                    });
                }
            }
        }
        Ok(true)
    }

    /// Replaces each `(first_entry, lost bookie)`; `false` when the ledger turned out deleted.
    /// A copy off a bookie being decommissioned is added to its record (its progress).
    async fn replace_lost(&self, fragments: Vec<(u64, BookieId)>, view: &MarkView) -> Result<bool> {
        for (first_entry, bookie) in fragments {
            match self
                .bk
                .replicate_fragment(self.id, first_entry, &bookie, &view.lost)
                .await
            {
                Ok(done) => {
                    self.metrics.bytes_written.inc_by(done.bytes_copied);
                    self.metrics.entries_written.inc_by(done.entries_copied);
                    self.metrics.fragments_replicated.inc();
                    if view.leaving.contains(&bookie) {
                        self.record_decommission_copy(
                            &bookie,
                            done.bytes_copied,
                            done.entries_copied,
                        )
                        .await;
                    }
                }
                Err(e) if is_not_found(&e) => return Ok(false),
                Err(e) => {
                    // A deleted ledger can fail the copy before its metadata read says so.
                    if let Err(quire_metadata::Error::NotFound { .. }) =
                        self.store.read_ledger(self.id).await
                    {
                        return Ok(false);
                    }
                    let id = self.id;
                    return Err(e).with_context(|| {
                        format!("ledger {id}: fragment from entry {first_entry}, bookie {bookie}")
                    });
                }
            }
        }
        Ok(true)
    }

    /// Adds a copy to the decommission record of `bookie`; a failure only loses that figure.
    async fn record_decommission_copy(&self, bookie: &BookieId, bytes: u64, entries: u64) {
        if let Err(e) = self
            .store
            .record_decommission_copy(bookie, bytes, entries)
            .await
        {
            tracing::warn!(ledger = self.id.0, %bookie, error = %e, "cannot add a copy to the decommission record");
        }
    }

    /// Defers, or removes the mark by compare-and-set (a mark extended meanwhile stays).
    async fn finish(mut self, away: &[BookieId]) -> Result<Outcome> {
        let id = self.id;
        if !away.is_empty() {
            tracing::info!(ledger = id.0, bookies = ?away, "reported bookies not registered; their gaps are copied back when they return");
            self.defer_until(quire_clock::now() + self.options.open_ledger_grace);
        }
        if let Some(until) = self.deferred {
            tracing::info!(
                ledger = id.0,
                "open ledger's last fragment left to its writer, or a reported bookie away; retried later"
            );
            return Ok(Outcome::Deferred(until));
        }
        match self
            .store
            .clear_under_replicated(id, self.mark.version)
            .await
        {
            Ok(()) => tracing::info!(ledger = id.0, "ledger fully replicated; mark removed"),
            Err(quire_metadata::Error::BadVersion { .. }) => {
                tracing::info!(
                    ledger = id.0,
                    "mark extended meanwhile; it stays for another pass"
                )
            }
            Err(e) => return Err(e.into()),
        }
        Ok(Outcome::Done)
    }
}

/// The fragments whose end is known: all of a closed ledger's, all but the last of an open one.
fn sealed_fragments(meta: &LedgerMetadata) -> impl Iterator<Item = &Fragment> {
    let last = meta.fragments.len().saturating_sub(1);
    let closed = meta.state == LedgerState::Closed;
    meta.fragments
        .iter()
        .enumerate()
        .filter(move |(i, _)| closed || *i < last)
        .map(|(_, f)| f)
}

/// The sealed fragments' positions on lost bookies, as `(first_entry, bookie)`.
fn lost_fragments(meta: &LedgerMetadata, lost: &HashSet<BookieId>) -> Vec<(u64, BookieId)> {
    sealed_fragments(meta)
        .flat_map(|f| {
            f.bookies
                .iter()
                .filter(|b| lost.contains(*b))
                .map(|b| (f.first_entry, b.clone()))
                .collect::<Vec<_>>()
        })
        .collect()
}

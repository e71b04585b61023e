//! Re-replication of one ledger fragment (BookKeeper `LedgerFragmentReplicator`, what its
//! replication workers run): the entries a lost bookie held in a fragment are copied from the
//! surviving replicas of each entry's write set to a replacement bookie chosen by
//! [`crate::placement`], each verified against its digest before it is written and written as
//! a recovery add; only once every entry is on the replacement is the bookie replaced in the
//! fragment's ensemble, by compare-and-set of the ledger metadata. A copy interrupted at any
//! point leaves the metadata as it was, so the next attempt starts over.
//!
//! A replica already on the replacement (from an interrupted earlier attempt) is kept when it
//! is byte-identical to the source and reported as a divergent replica otherwise: a copy
//! never overwrites a readable replica that differs from its source. A replica the target
//! cannot read back (it answers `IoError`: a damaged entry-log record) is written again, and
//! the bookie lets the recovery add take its place (docs/protocol.md §Add).
//!
//! A bookie that is still in the ensemble but lacks entries (wiped, then registered again with
//! a new cookie) is found by [`BookKeeper::bookies_missing_entries`] (BookKeeper's
//! `LedgerChecker`) and gets them back by [`BookKeeper::repair_fragment_in_place`]: the same
//! copy, with the bookie itself as the target and no metadata change.

use std::collections::HashSet;
use std::sync::Arc;

use quire_metadata::{BookieId, Fragment, LedgerMetadata, LedgerState};
use quire_wire::bookie::Status;
use quire_wire::entry::verify_expected;
use quire_wire::{EntryId, LedgerId, MasterKey};

use crate::conn::{self, Lane, Reply};
use crate::{placement, quorum, BookKeeper, Error};

/// Entries copied at once within a fragment (BookKeeper `rereplicationEntryBatchSize`, 10).
const ENTRIES_IN_FLIGHT_MAX: usize = 16;

/// Paces re-replication writes to a byte rate (BookKeeper `replicationRateByBytes`): each
/// write reserves its bytes' share of a second after the reservations before it and waits
/// until its reservation starts. Idle time is not saved up for a later burst.
#[derive(Debug)]
pub(crate) struct BytePace {
    bytes_per_sec: u64,
    /// When the next reservation may start; `None` before the first.
    next: std::sync::Mutex<Option<std::time::Instant>>,
}

impl BytePace {
    /// A pace of `bytes_per_sec` (at least 1).
    pub(crate) fn new(bytes_per_sec: u64) -> BytePace {
        BytePace {
            bytes_per_sec: bytes_per_sec.max(1),
            next: std::sync::Mutex::new(None),
        }
    }

    /// Reserves `bytes` at `now`; returns how long to wait before writing them.
    fn reserve(&self, now: std::time::Instant, bytes: u64) -> std::time::Duration {
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let start = next.map_or(now, |n| n.max(now));
        *next = Some(
            start + std::time::Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec as f64),
        );
        start - now
    }

    /// Waits until `bytes` may be written.
    pub(crate) async fn wait(&self, bytes: u64) {
        let wait = self.reserve(quire_clock::now(), bytes);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// What [`BookKeeper::replicate_fragment`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FragmentReplicated {
    /// The ledger.
    pub ledger: LedgerId,
    /// First entry of the fragment.
    pub first_entry: u64,
    /// Last entry of the fragment (`None`: the fragment holds no entry).
    pub last_entry: Option<u64>,
    /// Ensemble position replaced.
    pub position: usize,
    /// The bookie replaced.
    pub from: BookieId,
    /// The bookie that holds its entries now.
    pub to: BookieId,
    /// Entries written to `to`.
    pub entries_copied: u64,
    /// Entries `to` already held, byte-identical (an earlier, interrupted attempt).
    pub entries_present: u64,
    /// Entry bytes (header and payload) written to `to`.
    pub bytes_copied: u64,
}

/// The entries a fragment holds: `Ok(None)` when it holds none.
///
/// # Errors
/// `Invalid` for the last fragment of a ledger that is not closed: its end is not known yet
/// (the ledger must be recovered first, as BookKeeper's replication worker does).
pub fn fragment_range(meta: &LedgerMetadata, index: usize) -> Result<Option<(u64, u64)>, Error> {
    let f = meta
        .fragments
        .get(index)
        .ok_or_else(|| Error::Invalid(format!("no fragment at index {index}")))?;
    let end = match meta.fragments.get(index + 1) {
        Some(next) => next.first_entry.checked_sub(1),
        None if meta.state == LedgerState::Closed => meta.last_entry,
        None => {
            return Err(Error::Invalid(format!(
                "the last fragment (from entry {}) of a ledger that is not closed has no end yet",
                f.first_entry
            )))
        }
    };
    Ok(end
        .filter(|&e| e >= f.first_entry)
        .map(|e| (f.first_entry, e)))
}

/// Outcome of copying one entry.
enum Copied {
    Written(u64),
    AlreadyThere,
}

impl BookKeeper {
    /// Re-replicates the fragment of ledger `id` that starts at `first_entry`: the entries
    /// `lost` holds there (entries e whose write set `(e + i) mod E, i < Qw` includes its
    /// position) are read from the other bookies of their write sets (then from `lost` itself,
    /// which may still serve, e.g. one being decommissioned), digest-verified, and written as
    /// recovery adds to a replacement: a writable registered bookie outside the fragment's
    /// ensemble, not quarantined and not in `avoid`, chosen by [`placement::choose_replacement`]
    /// under the ledger's own placement (the stream's, recorded in its custom metadata when
    /// it was made under one; else the client's settings), in that placement's regions.
    /// Then `lost` is replaced by it in that fragment by compare-and-set, provided the fragment
    /// still starts at `first_entry`, still holds `lost` at that position and still ends where
    /// it did (a lost race re-reads and checks again).
    ///
    /// The fragment must have a known end: not the last fragment of a ledger that is not
    /// closed ([`fragment_range`]). A fragment with no entry is replaced without copying.
    ///
    /// # Errors
    /// `Metadata` (`NotFound` when the ledger was deleted); `Invalid` when no fragment starts
    /// at `first_entry` or it has no end yet; `Recovery` when the fragment no longer holds
    /// `lost` or changed its end (someone else replaced it), or no replacement bookie exists
    /// (`NotEnoughBookies`) or none keeps the placement policy's enforced rule (`Placement`);
    /// `NoSuchEntry` when no replica holds an entry; `DivergentReplica`;
    /// a bookie error of the replacement. The metadata is unchanged on every error.
    pub async fn replicate_fragment(
        &self,
        id: LedgerId,
        first_entry: u64,
        lost: &BookieId,
        avoid: &HashSet<BookieId>,
    ) -> Result<FragmentReplicated, Error> {
        let (meta, fragment, range, position) = self.locate(id, first_entry, lost).await?;
        let target = self
            .choose_target(id, &meta, &fragment, lost, avoid)
            .await?;
        // The copy, a bounded number of entries at a time.
        let mut done = FragmentReplicated {
            ledger: id,
            first_entry,
            last_entry: range.map(|(_, last)| last),
            position,
            from: lost.clone(),
            to: target.clone(),
            entries_copied: 0,
            entries_present: 0,
            bytes_copied: 0,
        };
        self.copy_position(&meta, &fragment, range, position, &target, &mut done)
            .await?;
        self.swap_fragment_bookie(id, first_entry, range, position, lost, &target)
            .await?;
        tracing::info!(
            ledger = id.0,
            first_entry,
            position,
            from = %lost,
            to = %target,
            entries = done.entries_copied,
            bytes = done.bytes_copied,
            "fragment re-replicated"
        );
        Ok(done)
    }

    /// The replacement for `lost` in `fragment` (BookKeeper's placement policy via
    /// [`placement::choose_replacement`], with the ledger's placement, so autorecovery and
    /// decommission keep the rule the ledger was placed by: [`placement::LedgerPlacement`]):
    /// reachable, in the placement's regions, not in the fragment, not
    /// quarantined, not in `avoid`; an unreachable candidate is quarantined and the next one
    /// tried.
    ///
    /// # Errors
    /// `NotEnoughBookies` when no candidate is left; `Placement` when candidates exist but
    /// none keeps the enforced rule; `Invalid` when `lost` is not in the fragment; `Metadata`
    /// for a recorded placement that does not parse; the registration listing's errors.
    async fn choose_target(
        &self,
        id: LedgerId,
        meta: &LedgerMetadata,
        fragment: &Fragment,
        lost: &BookieId,
        avoid: &HashSet<BookieId>,
    ) -> Result<BookieId, Error> {
        let registered = self.registered_bookies().await?;
        let position = fragment
            .bookies
            .iter()
            .position(|b| b == lost)
            .ok_or_else(|| Error::Invalid(format!("{lost} is not in the fragment")))?;
        let slots: Vec<Option<BookieId>> = fragment.bookies.iter().cloned().map(Some).collect();
        let shape = (meta.ensemble_size, meta.write_quorum, meta.ack_quorum);
        let rule =
            placement::LedgerPlacement::of_ledger(&self.inner.config.placement, &meta.custom)?;
        let mut exclude: HashSet<BookieId> = fragment.bookies.iter().cloned().collect();
        exclude.extend(self.quarantined());
        exclude.extend(avoid.iter().cloned());
        exclude.extend(rule.outside(&registered));
        loop {
            let pick = placement::choose_replacement(
                &rule.settings,
                shape,
                &registered,
                &slots,
                position,
                &exclude,
                &mut quire_clock::rng(),
            )?;
            let Some(b) = pick else {
                return Err(Error::NotEnoughBookies {
                    needed: usize::from(meta.ensemble_size) + 1,
                    available: registered.iter().filter(|b| !b.read_only).count(),
                });
            };
            exclude.insert(b.clone());
            match self.conn(&b, Lane::Tail).await {
                Ok(_) => return Ok(b),
                Err(err) => {
                    tracing::warn!(ledger = id.0, bookie = %b, "re-replication target unreachable: {err}");
                    self.quarantine(&b);
                }
            }
        }
    }

    /// The metadata step: position `position` of the fragment from `first_entry` becomes
    /// `target`, by compare-and-set (read again after a `BadVersion`), while the fragment is
    /// still the one copied (same entries, still holding `lost` there, not holding `target`).
    ///
    /// # Errors
    /// `Recovery` when the fragment changed; the store's errors.
    async fn swap_fragment_bookie(
        &self,
        id: LedgerId,
        first_entry: u64,
        range: Option<(u64, u64)>,
        position: usize,
        lost: &BookieId,
        target: &BookieId,
    ) -> Result<(), Error> {
        loop {
            let current = self.inner.metadata.read_ledger(id).await?;
            let now = &current.value;
            let conflict = |reason: String| Error::Recovery {
                ledger: id.0,
                reason: format!(
                    "fragment from entry {first_entry} changed during re-replication: {reason}"
                ),
            };
            let Some(i) = fragment_index(now, first_entry) else {
                return Err(conflict("it is gone".into()));
            };
            let f = &now.fragments[i];
            if f.bookies.get(position) != Some(lost) {
                return Err(conflict(format!(
                    "position {position} holds {:?} now",
                    f.bookies.get(position).map(|b| b.0.as_str())
                )));
            }
            if f.bookies.contains(target) {
                return Err(conflict(format!("{target} joined its ensemble")));
            }
            match fragment_range(now, i) {
                Ok(r) if r == range => {}
                other => {
                    return Err(conflict(format!(
                        "its entries were {range:?}, now {other:?}"
                    )))
                }
            }
            let mut next = now.clone();
            next.fragments[i].bookies[position] = target.clone();
            match self
                .inner
                .metadata
                .update_ledger(id, &next, current.version)
                .await
            {
                Ok(_) => return Ok(()),
                Err(quire_metadata::Error::BadVersion { .. }) => continue,
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// Ledger `id`'s metadata, its fragment starting at `first_entry`, that fragment's entries
    /// ([`fragment_range`]) and the position of `bookie` in it.
    ///
    /// # Errors
    /// `Metadata`; `Invalid` when no fragment starts at `first_entry` or it has no end yet;
    /// `Recovery` when the fragment does not hold `bookie`.
    async fn locate(
        &self,
        id: LedgerId,
        first_entry: u64,
        bookie: &BookieId,
    ) -> Result<(LedgerMetadata, Fragment, Option<(u64, u64)>, usize), Error> {
        let meta = self.inner.metadata.read_ledger(id).await?.value;
        let index = fragment_index(&meta, first_entry).ok_or_else(|| {
            Error::Invalid(format!(
                "ledger {id} has no fragment from entry {first_entry}"
            ))
        })?;
        let range = fragment_range(&meta, index)?;
        let fragment = meta.fragments[index].clone();
        let position = fragment
            .bookies
            .iter()
            .position(|b| b == bookie)
            .ok_or_else(|| Error::Recovery {
                ledger: id.0,
                reason: format!("fragment from entry {first_entry} does not hold bookie {bookie}"),
            })?;
        Ok((meta, fragment, range, position))
    }

    /// Copies to `target` every entry of `range` whose write set includes `position` of
    /// `fragment`, [`ENTRIES_IN_FLIGHT_MAX`] at a time, counting into `done`.
    async fn copy_position(
        &self,
        meta: &LedgerMetadata,
        fragment: &Fragment,
        range: Option<(u64, u64)>,
        position: usize,
        target: &BookieId,
        done: &mut FragmentReplicated,
    ) -> Result<(), Error> {
        let Some((first, last)) = range else {
            return Ok(());
        };
        let id = done.ledger;
        let key = meta.master_key()?;
        let (e, w) = (meta.ensemble_size, meta.write_quorum);
        let entries: Vec<u64> = (first..=last)
            .filter(|&entry| quorum::write_set(entry, e, w).contains(&position))
            .collect();
        let ensemble = Arc::new(fragment.bookies.clone());
        for batch in entries.chunks(ENTRIES_IN_FLIGHT_MAX) {
            let mut tasks = tokio::task::JoinSet::new();
            for &entry in batch {
                let client = self.clone();
                let ensemble = ensemble.clone();
                let target = target.clone();
                tasks.spawn(async move {
                    client
                        .copy_entry(id, key, EntryId(entry), &ensemble, position, e, w, &target)
                        .await
                });
            }
            while let Some(joined) = tasks.join_next().await {
                match joined.map_err(|j| Error::Invalid(j.to_string()))? {
                    Ok(Copied::Written(n)) => {
                        done.entries_copied += 1;
                        done.bytes_copied += n;
                    }
                    Ok(Copied::AlreadyThere) => done.entries_present += 1,
                    Err(err) => {
                        tasks.abort_all();
                        return Err(err);
                    }
                }
            }
        }
        Ok(())
    }

    /// The bookies of ledger `id` that lack entries they should hold (BookKeeper's
    /// `LedgerChecker`, as its auditor's periodic check runs it): for each fragment with a
    /// known end ([`fragment_range`]) and each bookie of its ensemble in `probe`, the first and
    /// the last entry of the fragment that bookie's position holds are read from it; a bookie
    /// that answers `NoSuchEntry` or `NoSuchLedger` for either is listed with the fragment's
    /// first entry. A bookie that does not answer is not listed: that it is down is the
    /// registry's business, not evidence of a lost replica. Returns `(first_entry, bookie)`.
    ///
    /// # Errors
    /// `Metadata` (`NotFound` when the ledger is gone).
    pub async fn bookies_missing_entries(
        &self,
        id: LedgerId,
        probe: &HashSet<BookieId>,
    ) -> Result<Vec<(u64, BookieId)>, Error> {
        let meta = self.inner.metadata.read_ledger(id).await?.value;
        let timeout = self.inner.config.request_timeout;
        let (e, w) = (meta.ensemble_size, meta.write_quorum);
        let mut missing = Vec::new();
        for (index, fragment) in meta.fragments.iter().enumerate() {
            let Ok(Some((first, last))) = fragment_range(&meta, index) else {
                continue;
            };
            for (position, bookie) in fragment.bookies.iter().enumerate() {
                if !probe.contains(bookie) {
                    continue;
                }
                let holds = |entry: &u64| quorum::write_set(*entry, e, w).contains(&position);
                let Some(lo) = (first..=last).find(holds) else {
                    continue;
                };
                let hi = (first..=last).rev().find(holds).unwrap_or(lo);
                for entry in [lo, hi] {
                    match self.read_from(bookie, id, EntryId(entry), timeout).await {
                        Ok(Some(_)) => {}
                        Ok(None) => {
                            missing.push((fragment.first_entry, bookie.clone()));
                            break;
                        }
                        Err(err) => {
                            tracing::debug!(ledger = id.0, bookie = %bookie, entry, "replica check skipped: {err}");
                            break;
                        }
                    }
                }
            }
        }
        Ok(missing)
    }

    /// Copies back to `bookie`, which is still in the fragment of ledger `id` starting at
    /// `first_entry`, every entry of that fragment it should hold and lacks (a wiped bookie
    /// that registered again with a new cookie) or cannot read back (a damaged copy, answered
    /// `IoError`): each read from the other replicas of its write set, digest-verified and
    /// written as a recovery add, as [`BookKeeper::replicate_fragment`] does; an entry it
    /// holds identically is kept. The metadata is not changed: the bookie keeps its place in
    /// the ensemble.
    ///
    /// # Errors
    /// `Metadata` (`NotFound` when the ledger was deleted); `Invalid` when no fragment starts
    /// at `first_entry` or it has no end yet; `Recovery` when the fragment does not hold
    /// `bookie`; `NoSuchEntry` when no replica holds an entry; `DivergentReplica` when
    /// `bookie` holds other bytes; a bookie error.
    pub async fn repair_fragment_in_place(
        &self,
        id: LedgerId,
        first_entry: u64,
        bookie: &BookieId,
    ) -> Result<FragmentReplicated, Error> {
        let (meta, fragment, range, position) = self.locate(id, first_entry, bookie).await?;
        let mut done = FragmentReplicated {
            ledger: id,
            first_entry,
            last_entry: range.map(|(_, last)| last),
            position,
            from: bookie.clone(),
            to: bookie.clone(),
            entries_copied: 0,
            entries_present: 0,
            bytes_copied: 0,
        };
        self.copy_position(&meta, &fragment, range, position, bookie, &mut done)
            .await?;
        tracing::info!(
            ledger = id.0,
            first_entry,
            position,
            bookie = %bookie,
            entries = done.entries_copied,
            bytes = done.bytes_copied,
            "fragment's missing entries copied back"
        );
        Ok(done)
    }

    /// Copies one entry to `target`: read from the write set's other replicas (the position
    /// being replaced last), verified, compared with what `target` may already hold, written
    /// as a recovery add.
    #[allow(clippy::too_many_arguments)]
    async fn copy_entry(
        &self,
        id: LedgerId,
        key: MasterKey,
        entry: EntryId,
        ensemble: &[BookieId],
        replaced: usize,
        e: u8,
        w: u8,
        target: &BookieId,
    ) -> Result<Copied, Error> {
        let timeout = self.inner.config.request_timeout;
        let mut order: Vec<usize> = quorum::write_set(entry.0, e, w)
            .into_iter()
            .filter(|&p| p != replaced)
            .collect();
        order.push(replaced);
        let mut source: Option<Vec<u8>> = None;
        let mut reasons = Vec::new();
        for pos in order {
            let b = &ensemble[pos];
            match self.read_from(b, id, entry, timeout).await {
                Ok(Some(data)) => match verify_expected(&data, id, entry) {
                    Ok(_) => {
                        source = Some(data);
                        break;
                    }
                    Err(err) => reasons.push(format!("{b}: corrupt replica: {err}")),
                },
                Ok(None) => reasons.push(format!("{b}: no such entry")),
                Err(err) => reasons.push(err.to_string()),
            }
        }
        let Some(source) = source else {
            tracing::warn!(
                ledger = id.0,
                entry = entry.0,
                "no replica to copy from: {}",
                reasons.join("; ")
            );
            return Err(Error::NoSuchEntry {
                ledger: id.0,
                entry: entry.0,
            });
        };
        match self.read_from(target, id, entry, timeout).await {
            Ok(Some(there)) if there == source => return Ok(Copied::AlreadyThere),
            Ok(Some(_)) => {
                return Err(Error::DivergentReplica {
                    ledger: id.0,
                    entry: entry.0,
                    bookie: target.0.clone(),
                })
            }
            Ok(None) => {}
            // The target cannot read its copy back (a damaged entry-log record): the recovery
            // add below takes its place (docs/protocol.md §Add, "Replacing a stored entry").
            Err(Error::Bookie {
                status: Status::IoError,
                message,
                ..
            }) => {
                tracing::warn!(ledger = id.0, entry = entry.0, bookie = %target, "copy unreadable on the target ({message}); writing it again");
            }
            Err(e) => return Err(e),
        }
        let len = source.len() as u64;
        if let Some(pace) = &self.inner.replication_pace {
            pace.wait(len).await;
        }
        let c = self.conn(target, Lane::Tail).await?;
        let reply = c
            .call_add(timeout, conn::add_request(key, &source, true))
            .await?;
        match reply {
            Reply::Add => Ok(Copied::Written(len)),
            // The target stores (or was storing) the entry with other bytes, written between
            // the read above and this add: the same divergent replica, and the bookie refused
            // to overwrite it (docs/protocol.md §Add).
            Reply::Failed {
                status: Status::EntryMismatch,
                ..
            } => Err(Error::DivergentReplica {
                ledger: id.0,
                entry: entry.0,
                bookie: target.0.clone(),
            }),
            Reply::Failed { status, message } => Err(Error::Bookie {
                bookie: target.0.clone(),
                status,
                message,
            }),
            other => Err(Error::Invalid(format!(
                "unexpected reply to an add: {other:?}"
            ))),
        }
    }

    /// One entry's stored bytes from one bookie, `None` when it has no such entry or ledger.
    async fn read_from(
        &self,
        bookie: &BookieId,
        id: LedgerId,
        entry: EntryId,
        timeout: std::time::Duration,
    ) -> Result<Option<Vec<u8>>, Error> {
        let c = self.conn(bookie, Lane::Read).await?;
        match c
            .call(timeout, conn::read_request(id, Some(entry), None))
            .await?
        {
            Reply::Read { data } => Ok(Some(data)),
            Reply::Failed {
                status: Status::NoSuchEntry | Status::NoSuchLedger,
                ..
            } => Ok(None),
            Reply::Failed { status, message } => Err(Error::Bookie {
                bookie: bookie.0.clone(),
                status,
                message,
            }),
            other => Err(Error::Invalid(format!(
                "unexpected reply to a read: {other:?}"
            ))),
        }
    }
}

fn fragment_index(meta: &LedgerMetadata, first_entry: u64) -> Option<usize> {
    meta.fragments
        .iter()
        .position(|f| f.first_entry == first_entry)
}

#[cfg(test)]
mod tests {
    use super::BytePace;
    use std::time::Duration;

    #[test]
    fn pace_spaces_writes_by_their_bytes_and_does_not_save_up_idle_time() {
        let pace = BytePace::new(1000);
        let t0 = quire_clock::now();
        assert_eq!(pace.reserve(t0, 500), Duration::ZERO);
        assert_eq!(pace.reserve(t0, 500), Duration::from_millis(500));
        assert_eq!(pace.reserve(t0, 1000), Duration::from_secs(1));
        // Reserved through t0 + 2 s; at t0 + 1.5 s the next write waits half a second.
        assert_eq!(
            pace.reserve(t0 + Duration::from_millis(1500), 10),
            Duration::from_millis(500)
        );
        // Long idle: no credit, the next write goes at once and the one after waits its share.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(pace.reserve(later, 2000), Duration::ZERO);
        assert_eq!(pace.reserve(later, 1), Duration::from_secs(2));
    }
}

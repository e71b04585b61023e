//! Ledger recovery (BookKeeper open-with-recovery, `LedgerRecoveryOp`): mark IN_RECOVERY,
//! fence the last ensemble until the answers cover every write set, read forward from the LAC
//! with fencing reads, re-add each entry found to its whole write set, stop at the first entry
//! Qw - Qa + 1 bookies deny, and close by compare-and-set. A bookie that fails a re-add is
//! replaced as in a writer's ensemble change (BookKeeper's recovery adds go through the
//! recovering handle, which changes its ensemble while IN_RECOVERY), so a missing bookie does
//! not stop recovery while another bookie can take its place.

use std::collections::HashSet;
use std::sync::Arc;

use quire_metadata::{BookieId, Fragment, LedgerMetadata, LedgerState, Version};
use quire_wire::bookie::{self, Request, Status};
use quire_wire::entry::{verify_expected, EntryHeader};
use quire_wire::{EntryId, LedgerId, MasterKey};

use crate::conn::{self, Lane, Reply};
use crate::reader::ReadOutcome;
use crate::{placement, quorum, BookKeeper, Error, LedgerReader};

impl BookKeeper {
    /// Recovers and closes a ledger (BookKeeper open-with-recovery, `LedgerRecoveryOp`).
    ///
    /// Marks it IN_RECOVERY, fences the last ensemble (waiting until the answers cover every
    /// write set, i.e. Qw − Qa + 1 per write set), reads forward from the highest LAC with
    /// fencing reads, re-adds each recovered entry to its full write set as a recovery add,
    /// stops at the first entry that Qw − Qa + 1 bookies of its write set deny, and closes the
    /// ledger by compare-and-set. Concurrent recoverers converge: they find the same end, and
    /// whoever loses the final compare-and-set adopts the winner's identical result.
    ///
    /// Each entry past the LAC is read from every bookie of its write set. When replicas
    /// hold different copies (neither confirmed: a buggy second writer with the ledger's key),
    /// the copy that could have been confirmed is re-added, or with none the one most bookies
    /// hold (the first in write-set order among equals); the re-add repairs the bookies holding
    /// another copy (docs/protocol.md §Add, "Replacing a stored entry"), so that the ledger is
    /// never closed while a replica recovery read holds other bytes (DESIGN.md §9 invariant 4).
    ///
    /// A bookie of the last ensemble that fails a re-add (down, timed out, refusing) is
    /// replaced: a writable bookie outside the ensemble and not quarantined takes its position
    /// in a fragment starting at the entry being re-added (written by compare-and-set while the
    /// ledger is IN_RECOVERY), and the entry is re-added there. Entries are still read from
    /// the ensembles that wrote them.
    ///
    /// # Errors
    /// `Recovery` if too few bookies answer to decide, or a re-add cannot reach Qa and no
    /// replacement bookie exists, or two different copies of an entry could each have been
    /// confirmed, or a bookie found holding other bytes refuses the repair and no bookie can
    /// replace it (the message names the bookies and why; the ledger stays IN_RECOVERY and a
    /// later call starts over); `Metadata`; or the close found a different
    /// end written by someone else.
    pub async fn recover_ledger(&self, id: LedgerId) -> Result<LedgerMetadata, Error> {
        let outcome = self.recover_ledger_once(id).await;
        crate::metrics::metrics().recovered(outcome.is_ok());
        outcome
    }

    /// [`Self::recover_ledger`] without its count in the metrics.
    async fn recover_ledger_once(&self, id: LedgerId) -> Result<LedgerMetadata, Error> {
        loop {
            let current = self.inner.metadata.read_ledger(id).await?;
            let (mut meta, mut version) = (current.value, current.version);
            if meta.state == LedgerState::Closed {
                return Ok(meta);
            }
            if meta.state == LedgerState::Open {
                meta.state = LedgerState::InRecovery;
                match self.inner.metadata.update_ledger(id, &meta, version).await {
                    Ok(v) => version = v,
                    Err(quire_metadata::Error::BadVersion { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            let (last_entry, length_bytes) = self.recover_end(id, &mut meta, &mut version).await?;
            meta.state = LedgerState::Closed;
            meta.last_entry = last_entry.map(|e| e.0);
            meta.length_bytes = length_bytes;
            match self.inner.metadata.update_ledger(id, &meta, version).await {
                Ok(_) => return Ok(meta),
                Err(quire_metadata::Error::BadVersion { .. }) => {
                    let now = self.inner.metadata.read_ledger(id).await?.value;
                    if now.state == LedgerState::Closed {
                        if now.last_entry == meta.last_entry {
                            return Ok(now);
                        }
                        return Err(Error::Recovery {
                            ledger: id.0,
                            reason: format!(
                                "closed concurrently at last entry {:?}, this recovery found {:?}",
                                now.last_entry, meta.last_entry
                            ),
                        });
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Finds the end of a ledger under recovery (BookKeeper `LedgerRecoveryOp`): fences the
    /// last ensemble, takes the length at the highest LAC the bookies report, then reads
    /// forward, re-adding each entry found, until one is proven missing. Returns the last
    /// entry and the ledger's length in bytes.
    ///
    /// # Errors
    /// `Recovery` when fencing does not cover the ensemble or an entry can be neither found
    /// nor proven missing; the errors of reads and re-adds.
    async fn recover_end(
        &self,
        id: LedgerId,
        meta: &mut LedgerMetadata,
        version: &mut Version,
    ) -> Result<(Option<EntryId>, u64), Error> {
        let key = meta.master_key()?;
        let fragment = meta
            .fragments
            .last()
            .ok_or_else(|| Error::Invalid("ledger without fragments".into()))?
            .clone();
        let lac = self.fence_last_ensemble(id, key, meta, &fragment).await?;
        let length_bytes = self.length_at(id, key, meta, lac).await?;
        let first = lac.map_or(fragment.first_entry, |l| l.0 + 1);
        self.read_forward(id, key, meta, version, first, lac, length_bytes)
            .await
    }

    /// Fences the ledger on every bookie of its last ensemble; returns the highest LAC they
    /// report (at least the entry before the fragment).
    ///
    /// # Errors
    /// `Recovery` when the bookies that answered do not cover every write set's
    /// `Qw - Qa + 1` (BookKeeper's fencing quorum).
    async fn fence_last_ensemble(
        &self,
        id: LedgerId,
        key: MasterKey,
        meta: &LedgerMetadata,
        fragment: &Fragment,
    ) -> Result<Option<EntryId>, Error> {
        let (e, w, a) = (meta.ensemble_size, meta.write_quorum, meta.ack_quorum);
        let timeout = self.inner.config.request_timeout;
        let mut calls = Vec::new();
        for b in &fragment.bookies {
            let client = self.clone();
            let b = b.clone();
            calls.push(tokio::spawn(async move {
                let c = client.conn(&b, Lane::Tail).await?;
                c.call(timeout, move |out, rid| {
                    bookie::encode_request(
                        out,
                        rid,
                        &Request::Fence {
                            ledger: id,
                            master_key: key,
                        },
                    )
                })
                .await
            }));
        }
        let mut answered = vec![false; usize::from(e)];
        let mut lac: Option<EntryId> = fragment.first_entry.checked_sub(1).map(EntryId);
        let mut reasons = Vec::new();
        for (i, call) in calls.into_iter().enumerate() {
            match call
                .await
                .map_err(|j| Error::Invalid(j.to_string()))
                .and_then(|r| r)
            {
                Ok(Reply::Fence { lac: l }) => {
                    answered[i] = true;
                    lac = lac.max(l);
                }
                Ok(Reply::Failed {
                    status: Status::NoSuchLedger,
                    ..
                }) => answered[i] = true,
                Ok(Reply::Failed { status, message }) => {
                    reasons.push(format!("{}: {status:?} {message}", fragment.bookies[i]))
                }
                Ok(other) => reasons.push(format!("{}: unexpected {other:?}", fragment.bookies[i])),
                Err(err) => reasons.push(err.to_string()),
            }
        }
        if !quorum::covers(&answered, e, w, a) {
            return Err(Error::Recovery {
                ledger: id.0,
                reason: format!("fencing did not cover the ensemble: {}", reasons.join("; ")),
            });
        }
        Ok(lac)
    }

    /// The ledger's length up to the LAC: the header of the LAC entry (if any) carries the
    /// cumulative length.
    ///
    /// # Errors
    /// `Recovery` when the LAC entry is missing on every replica; read errors.
    async fn length_at(
        &self,
        id: LedgerId,
        key: MasterKey,
        meta: &LedgerMetadata,
        lac: Option<EntryId>,
    ) -> Result<u64, Error> {
        let Some(l) = lac else {
            return Ok(0);
        };
        let reader = LedgerReader {
            client: self.clone(),
            id,
            meta: meta.clone(),
        };
        match reader.read_raw(l, Some(key)).await? {
            ReadOutcome::Found(bytes) => Ok(header_of(&bytes, id, l)?.length_bytes),
            ReadOutcome::Missing => Err(Error::Recovery {
                ledger: id.0,
                reason: format!("LAC entry {l} is missing on every replica"),
            }),
        }
    }

    /// Reads forward from entry `first` with fencing reads from every replica, re-adding what
    /// is found (and repairing replicas that hold other bytes), until an entry is proven
    /// missing (denied by `Qw - Qa + 1` replicas). Returns the last entry and the length.
    ///
    /// # Errors
    /// `Recovery` when an entry can be neither found nor proven missing, or its copies
    /// disagree beyond repair; re-add errors.
    #[allow(clippy::too_many_arguments)]
    async fn read_forward(
        &self,
        id: LedgerId,
        key: MasterKey,
        meta: &mut LedgerMetadata,
        version: &mut Version,
        first: u64,
        mut last: Option<EntryId>,
        mut length_bytes: u64,
    ) -> Result<(Option<EntryId>, u64), Error> {
        let mut next = first;
        loop {
            let entry = EntryId(next);
            let found = self.read_replicas(meta, id, entry, key).await;
            let chosen = choose_copy(&found.copies, found.unknown.len(), meta.ack_quorum).map_err(
                |reason| Error::Recovery {
                    ledger: id.0,
                    reason: format!("entry {entry}: {reason}"),
                },
            )?;
            let Some(i) = chosen else {
                if found.denials >= usize::from(meta.write_quorum - meta.ack_quorum + 1) {
                    break;
                }
                return Err(Error::Recovery {
                    ledger: id.0,
                    reason: format!(
                        "entry {entry}: no replica returned it and {} denied it, too few to prove it missing: {}",
                        found.denials,
                        found.unknown.join("; ")
                    ),
                });
            };
            let (bytes, _) = found.copies[i].clone();
            let divergent: Vec<usize> = found
                .copies
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .flat_map(|(_, (_, holders))| holders.iter().copied())
                .collect();
            if !divergent.is_empty() {
                tracing::warn!(ledger = id.0, entry = next, positions = ?divergent, "replicas hold other bytes for an unconfirmed entry; recovery repairs them");
            }
            length_bytes = header_of(&bytes, id, entry)?.length_bytes;
            self.recovery_add(meta, version, id, key, entry, bytes, &divergent)
                .await?;
            // Fault point (docs/fault-points.md): a crash inside recovery's write-back, after
            // this entry's re-add and before the next one or the close.
            quire_faults::crash("ledger.recovery.write_back");
            last = Some(entry);
            next += 1;
        }
        Ok((last, length_bytes))
    }

    /// Reads `entry` with fencing reads from every bookie of its write set at once: each
    /// distinct verified copy with the positions holding it (in write-set order of their first
    /// holder), the denials, and why the other positions gave neither. A copy that fails its
    /// digest, or an `IoError` answer, is reported as a damaged replica.
    async fn read_replicas(
        &self,
        meta: &LedgerMetadata,
        id: LedgerId,
        entry: EntryId,
        key: MasterKey,
    ) -> Replicas {
        let fragment = meta.fragment_for(entry).clone();
        let timeout = self.inner.config.request_timeout;
        let positions = quorum::write_set(entry.0, meta.ensemble_size, meta.write_quorum);
        let mut calls = Vec::new();
        for &pos in &positions {
            let client = self.clone();
            let b = fragment.bookies[pos].clone();
            calls.push(tokio::spawn(async move {
                let c = client.conn(&b, Lane::Tail).await?;
                c.call(timeout, conn::read_request(id, Some(entry), Some(key)))
                    .await
            }));
        }
        let mut found = Replicas::default();
        for (pos, call) in positions.into_iter().zip(calls) {
            let b = &fragment.bookies[pos];
            let reply = call
                .await
                .map_err(|j| Error::Invalid(j.to_string()))
                .and_then(|r| r);
            match reply {
                Ok(Reply::Read { data }) => match verify_expected(&data, id, entry) {
                    Ok(_) => match found.copies.iter_mut().find(|(c, _)| *c == data) {
                        Some((_, holders)) => holders.push(pos),
                        None => found.copies.push((data, vec![pos])),
                    },
                    Err(e) => {
                        self.damaged_replica(id, entry, b, &e.to_string());
                        found.unknown.push(format!("{b}: corrupt copy: {e}"));
                    }
                },
                Ok(Reply::Failed {
                    status: Status::NoSuchEntry | Status::NoSuchLedger,
                    ..
                }) => found.denials += 1,
                Ok(Reply::Failed { status, message }) => {
                    if status == Status::IoError {
                        self.damaged_replica(id, entry, b, &message);
                    }
                    found.unknown.push(format!("{b}: {status:?} {message}"));
                }
                Ok(other) => found.unknown.push(format!("{b}: unexpected {other:?}")),
                Err(e) => {
                    if matches!(e, Error::Timeout { .. } | Error::BookieUnreachable { .. }) {
                        self.quarantine(b);
                    }
                    found.unknown.push(e.to_string());
                }
            }
        }
        found
    }

    /// Re-adds `entry` to its whole write set as a recovery add; a bookie that fails it is
    /// replaced (see [`BookKeeper::recover_ledger`]) and the entry re-added there. Succeeds once
    /// Qa bookies of the (possibly new) write set hold it and no bookie left in the write set
    /// holds other bytes for it: `divergent` names the positions the reads found holding other
    /// bytes, to which the re-add is a repair (the bookie replaces an unconfirmed copy of a
    /// fenced ledger, docs/protocol.md §Add); one that still refuses it (`EntryMismatch`) or
    /// does not answer must be replaced, or recovery fails (the ledger stays IN_RECOVERY).
    #[allow(clippy::too_many_arguments)]
    async fn recovery_add(
        &self,
        meta: &mut LedgerMetadata,
        version: &mut Version,
        id: LedgerId,
        key: MasterKey,
        entry: EntryId,
        bytes: Vec<u8>,
        divergent: &[usize],
    ) -> Result<(), Error> {
        let bytes = Arc::new(bytes);
        let mut acked: Vec<usize> = Vec::new();
        let mut todo: Vec<usize> =
            quorum::write_set(entry.0, meta.ensemble_size, meta.write_quorum);
        let mut reasons = Vec::new();
        // Bookies that failed this entry, never chosen again as its replacement.
        let mut failed: HashSet<BookieId> = HashSet::new();
        // Positions known to hold other bytes, neither repaired nor replaced yet.
        let mut divergent: HashSet<usize> = divergent.iter().copied().collect();
        // Each pass re-adds to the positions still missing; at most one pass per position
        // replaced, bounded by the bookies registered.
        loop {
            let fragment = meta.fragment_for(entry).clone();
            let outcomes = self.recovery_add_to(&fragment, &todo, key, &bytes).await;
            let mut failing = Vec::new();
            for (pos, outcome) in todo.iter().copied().zip(outcomes) {
                match outcome {
                    Ok(Reply::Add) => {
                        acked.push(pos);
                        divergent.remove(&pos);
                    }
                    other => {
                        if matches!(
                            other,
                            Ok(Reply::Failed {
                                status: Status::EntryMismatch,
                                ..
                            })
                        ) {
                            divergent.insert(pos);
                        }
                        let reason = match other {
                            Ok(r) => format!("{r:?}"),
                            Err(e) => e.to_string(),
                        };
                        let b = fragment.bookies[pos].clone();
                        tracing::warn!(ledger = id.0, entry = entry.0, bookie = %b, "recovery add failed: {reason}");
                        reasons.push(format!("{b}: {reason}"));
                        self.quarantine(&b);
                        failed.insert(b);
                        failing.push(pos);
                    }
                }
            }
            if failing.is_empty() && divergent.is_empty() {
                return Ok(());
            }
            let replaced = if failing.is_empty() {
                None
            } else {
                self.recovery_replace(meta, version, id, entry, &failing, &failed)
                    .await?
            };
            match replaced {
                Some(replaced) => {
                    for pos in &replaced {
                        divergent.remove(pos);
                    }
                    todo = replaced;
                }
                None if !divergent.is_empty() => {
                    let fragment = meta.fragment_for(entry);
                    let names: Vec<&str> = divergent
                        .iter()
                        .map(|&p| fragment.bookies[p].0.as_str())
                        .collect();
                    return Err(Error::Recovery {
                        ledger: id.0,
                        reason: format!(
                            "bookie(s) {} hold other bytes for entry {entry}, could not be repaired and no bookie can replace them; not closing over a divergent replica: {}",
                            names.join(", "),
                            reasons.join("; ")
                        ),
                    });
                }
                None if acked.len() >= usize::from(meta.ack_quorum) => return Ok(()),
                None => {
                    return Err(Error::Recovery {
                        ledger: id.0,
                        reason: format!(
                            "re-adding entry {entry} reached {} of {} acks and no bookie outside the ensemble can replace the failed one(s): {}",
                            acked.len(),
                            meta.ack_quorum,
                            reasons.join("; ")
                        ),
                    });
                }
            }
        }
    }

    /// Sends `entry`'s bytes as a recovery add to the bookies at `positions` of `fragment`;
    /// the answers, in the same order.
    async fn recovery_add_to(
        &self,
        fragment: &Fragment,
        positions: &[usize],
        key: MasterKey,
        bytes: &Arc<Vec<u8>>,
    ) -> Vec<Result<Reply, Error>> {
        let timeout = self.inner.config.request_timeout;
        let mut calls = Vec::new();
        for &pos in positions {
            let client = self.clone();
            let b = fragment.bookies[pos].clone();
            let bytes = bytes.clone();
            calls.push(tokio::spawn(async move {
                let c = client.conn(&b, Lane::Tail).await?;
                c.call_add(timeout, crate::conn::add_request(key, &bytes, true))
                    .await
            }));
        }
        let mut out = Vec::with_capacity(calls.len());
        for call in calls {
            out.push(
                call.await
                    .map_err(|j| Error::Invalid(j.to_string()))
                    .and_then(|r| r),
            );
        }
        out
    }

    /// The replacements for `failing` positions of `last` (BookKeeper's placement policy via
    /// [`placement::choose_replacement`], with the ledger's recorded placement, else the
    /// client's settings): writable bookies outside the ensemble, in the placement's regions,
    /// not quarantined and not in `failed`, that it can connect to; an
    /// unreachable one is quarantined and the next tried. A position with none gets none.
    ///
    /// # Errors
    /// The registry listing's; `Metadata` for a recorded placement that does not parse.
    async fn pick_recovery_replacements(
        &self,
        meta: &LedgerMetadata,
        last: &Fragment,
        id: LedgerId,
        failing: &[usize],
        failed: &HashSet<BookieId>,
    ) -> Result<Vec<(usize, BookieId)>, Error> {
        let registered = self.inner.metadata.list_bookies().await?;
        let rule =
            placement::LedgerPlacement::of_ledger(&self.inner.config.placement, &meta.custom)?;
        let mut exclude: HashSet<BookieId> = last.bookies.iter().cloned().collect();
        exclude.extend(self.quarantined());
        exclude.extend(failed.iter().cloned());
        exclude.extend(rule.outside(&registered));
        let mut slots: Vec<Option<BookieId>> = last.bookies.iter().cloned().map(Some).collect();
        for &p in failing {
            slots[p] = None;
        }
        let shape = (meta.ensemble_size, meta.write_quorum, meta.ack_quorum);
        let mut chosen: Vec<(usize, BookieId)> = Vec::new();
        for &pos in failing {
            loop {
                // The thread-local generator must not live across the await below.
                let pick = placement::choose_replacement(
                    &rule.settings,
                    shape,
                    &registered,
                    &slots,
                    pos,
                    &exclude,
                    &mut quire_clock::rng(),
                );
                let b = match pick {
                    Ok(Some(b)) => b,
                    Ok(None) => break,
                    Err(err) => {
                        tracing::warn!(
                            ledger = id.0,
                            position = pos,
                            "no recovery replacement: {err}"
                        );
                        break;
                    }
                };
                exclude.insert(b.clone());
                match self.conn(&b, Lane::Tail).await {
                    Ok(_) => {
                        slots[pos] = Some(b.clone());
                        chosen.push((pos, b));
                        break;
                    }
                    Err(err) => {
                        tracing::warn!(ledger = id.0, bookie = %b, "recovery replacement unreachable: {err}");
                        self.quarantine(&b);
                    }
                }
            }
        }
        Ok(chosen)
    }

    /// Replaces the bookies at `failing` positions of the last fragment for entries from
    /// `entry` on: picks writable bookies outside the ensemble, not quarantined and not in
    /// `failed`, that it can connect to, and writes the fragment by compare-and-set while the
    /// ledger is IN_RECOVERY. Returns the positions replaced, or `None` when no position could
    /// be (nothing is written then).
    ///
    /// # Errors
    /// `Metadata`; `Recovery` when another recoverer changed or closed the ledger meanwhile.
    async fn recovery_replace(
        &self,
        meta: &mut LedgerMetadata,
        version: &mut Version,
        id: LedgerId,
        entry: EntryId,
        failing: &[usize],
        failed: &HashSet<BookieId>,
    ) -> Result<Option<Vec<usize>>, Error> {
        let last = meta
            .fragments
            .last()
            .ok_or_else(|| Error::Invalid("ledger without fragments".into()))?
            .clone();
        if last.first_entry > entry.0 {
            return Err(Error::Recovery {
                ledger: id.0,
                reason: format!(
                    "entry {entry} being recovered lies before the last fragment (from {})",
                    last.first_entry
                ),
            });
        }
        let chosen = self
            .pick_recovery_replacements(meta, &last, id, failing, failed)
            .await?;
        if chosen.is_empty() {
            return Ok(None);
        }
        let mut bookies = last.bookies.clone();
        for (pos, b) in &chosen {
            bookies[*pos] = b.clone();
        }
        let mut next = meta.clone();
        if last.first_entry == entry.0 {
            next.fragments.last_mut().expect("checked above").bookies = bookies;
        } else {
            next.fragments.push(Fragment {
                first_entry: entry.0,
                bookies,
            });
        }
        assert_eq!(
            next.state,
            LedgerState::InRecovery,
            "only a ledger in recovery"
        );
        match self.inner.metadata.update_ledger(id, &next, *version).await {
            Ok(v) => {
                for (pos, b) in &chosen {
                    tracing::info!(ledger = id.0, position = pos, from = %last.bookies[*pos], to = %b, first_entry = entry.0, "ensemble change during recovery");
                }
                *meta = next;
                *version = v;
                Ok(Some(chosen.into_iter().map(|(p, _)| p).collect()))
            }
            Err(quire_metadata::Error::BadVersion { .. }) => Err(Error::Recovery {
                ledger: id.0,
                reason: format!(
                    "the ledger's metadata changed during recovery (another recoverer?) while replacing a bookie for entry {entry}"
                ),
            }),
            Err(e) => Err(e.into()),
        }
    }
}

/// What the fencing reads of one entry found on its write set ([`BookKeeper::read_replicas`]).
#[derive(Default)]
struct Replicas {
    /// Each distinct verified copy and the write-set positions holding it.
    copies: Vec<(Vec<u8>, Vec<usize>)>,
    /// Bookies that answered "no such entry" or "no such ledger".
    denials: usize,
    /// Why each remaining bookie gave neither a copy nor a denial.
    unknown: Vec<String>,
}

/// Which of an unconfirmed entry's distinct `copies` (each with its holders) recovery re-adds,
/// when `unknown` bookies of the write set gave no answer; `None` when there is no copy.
///
/// A copy could have been confirmed only if Qa bookies stored it: if its holders plus the
/// unknown bookies reach Qa. Exactly one such copy is chosen (it may be the confirmed one, and
/// the others cannot be); with none, the copy most bookies hold, the first in write-set order
/// among equals, so that concurrent recoverers that read the same replicas choose alike.
///
/// # Errors
/// Two or more copies could each have been confirmed (only with Qw ≥ 2·Qa, or with bookies
/// that did not answer): recovery cannot tell which, and must not choose.
fn choose_copy(
    copies: &[(Vec<u8>, Vec<usize>)],
    unknown: usize,
    ack_quorum: u8,
) -> Result<Option<usize>, String> {
    let could_be_confirmed: Vec<usize> = (0..copies.len())
        .filter(|&i| copies[i].1.len() + unknown >= usize::from(ack_quorum))
        .collect();
    match could_be_confirmed.as_slice() {
        [] => Ok((0..copies.len()).min_by_key(|&i| std::cmp::Reverse(copies[i].1.len()))),
        [one] => Ok(Some(*one)),
        many => Err(format!(
            "{} different copies (held at positions {:?}) could each have been confirmed with {unknown} bookie(s) unanswered; not choosing",
            many.len(),
            many.iter().map(|&i| &copies[i].1).collect::<Vec<_>>()
        )),
    }
}

fn header_of(bytes: &[u8], ledger: LedgerId, entry: EntryId) -> Result<EntryHeader, Error> {
    verify_expected(bytes, ledger, entry)
        .map(|(h, _)| h)
        .map_err(|e| Error::Corrupt {
            ledger: ledger.0,
            entry: entry.0,
            bookie: "(verified after read)".into(),
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::choose_copy;

    #[test]
    fn the_copy_that_could_have_been_confirmed_is_chosen_and_two_such_copies_fail() {
        let (p, q) = (b"P".to_vec(), b"Q".to_vec());
        // E=W=3, A=2: P on one bookie, Q on another, the third denies: neither was confirmed;
        // the first in write-set order wins a tie.
        assert_eq!(
            choose_copy(&[(p.clone(), vec![2]), (q.clone(), vec![0])], 0, 2),
            Ok(Some(0))
        );
        // P on two bookies may have been confirmed, Q on one cannot have been.
        assert_eq!(
            choose_copy(&[(q.clone(), vec![0]), (p.clone(), vec![1, 2])], 0, 2),
            Ok(Some(1))
        );
        // With a bookie unanswered, both could have been: no choice.
        assert!(choose_copy(&[(p.clone(), vec![0]), (q.clone(), vec![1])], 1, 2).is_err());
        // W=4, A=2: two copies on two bookies each.
        assert!(choose_copy(&[(p, vec![0, 1]), (q, vec![2, 3])], 0, 2).is_err());
        assert_eq!(choose_copy(&[], 3, 2), Ok(None));
    }
}

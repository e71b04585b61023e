//! Ensemble change (BookKeeper `LedgerHandle.ensembleChangeLoop`, changing immediately as
//! BookKeeper does without `delayEnsembleChange`): replacements for the failed positions of a
//! writer's ensemble are chosen by [`crate::placement`], a fragment starting at LAC + 1 is
//! written by compare-and-set while the ledger is OPEN, and the pending adds are re-sent to the
//! replacements. Success is held back while a change runs.

use std::collections::HashSet;
use std::sync::Arc;

use quire_metadata::{BookieId, BookieInfo, Fragment, LedgerMetadata, LedgerState, Version};
use quire_wire::EntryId;

use crate::conn::{self, Lane};
use crate::writer::WriterShared;
use crate::{placement, quorum, Error};

impl WriterShared {
    /// The ensemble change loop (BookKeeper `ensembleChangeLoop`): one pass per batch of failed
    /// positions, until none is left; failures arriving during a pass are taken by the next.
    pub(crate) async fn change_ensemble(self: Arc<Self>) {
        loop {
            let failing: Vec<(usize, BookieId)> = {
                let Ok(mut st) = self.state.lock() else {
                    return;
                };
                if st.failed.is_some() || st.failing.is_empty() {
                    st.changing = false;
                    self.release(&mut st);
                    self.lac_tx.send_modify(|_| {});
                    return;
                }
                st.failing
                    .iter()
                    .map(|&p| (p, st.ensemble[p].bookie.clone()))
                    .collect()
            };
            if let Err(err) = self.change_pass(&failing).await {
                tracing::warn!(ledger = self.id.0, "ensemble change failed: {err}");
                if let Ok(mut st) = self.state.lock() {
                    if st.failed.is_none() {
                        self.fail(&mut st, err);
                    }
                    st.changing = false;
                    self.lac_tx.send_modify(|_| {});
                }
                return;
            }
        }
    }

    /// One pass: choose replacements for `failing` (position, bookie), connect to them, update
    /// the metadata by compare-and-set, then swap them in and re-send the pending adds.
    async fn change_pass(self: &Arc<Self>, failing: &[(usize, BookieId)]) -> Result<(), Error> {
        let (ensemble, lac, meta, version) = {
            let st = self
                .state
                .lock()
                .map_err(|_| Error::Invalid("writer state poisoned".into()))?;
            (
                st.ensemble
                    .iter()
                    .map(|s| s.bookie.clone())
                    .collect::<Vec<_>>(),
                st.lac,
                st.meta.0.clone(),
                st.meta.1,
            )
        };
        let registered = self.client.registered_bookies().await?;
        let chosen = self
            .choose_replacements(&registered, &ensemble, failing)
            .await;
        // A fragment from LAC + 1 (success is held back, so the LAC cannot move during the
        // pass).
        let first = lac.map_or(0, |l| l.0 + 1);
        let updated = if chosen.is_empty() {
            None
        } else {
            Some(
                self.write_fragment(meta, version, first, failing, &chosen)
                    .await?,
            )
        };
        self.swap_in(&registered, failing, chosen, updated, lac)
    }

    /// Placement: a reachable replacement for each failed position (BookKeeper's placement
    /// policy via [`placement::choose_replacement`], with the ledger's placement: the
    /// stream's own when it was made under one, else the client's settings), none of the
    /// ensemble's bookies, none outside the placement's regions, nor a quarantined one; an unreachable candidate is quarantined and
    /// the next one tried. The failed bookies are quarantined too. A position with no
    /// candidate left, or none the enforced policy accepts (logged), gets none.
    async fn choose_replacements(
        &self,
        registered: &[BookieInfo],
        ensemble: &[BookieId],
        failing: &[(usize, BookieId)],
    ) -> Vec<Replacement> {
        let client = &self.client;
        let mut exclude: HashSet<BookieId> = ensemble.iter().cloned().collect();
        exclude.extend(client.quarantined());
        exclude.extend(self.placement.outside(registered));
        let mut slots: Vec<Option<BookieId>> = ensemble.iter().cloned().map(Some).collect();
        for (p, _) in failing {
            slots[*p] = None;
        }
        let mut chosen: Vec<Replacement> = Vec::new();
        for (pos, _) in failing {
            loop {
                let pick = placement::choose_replacement(
                    &self.placement.settings,
                    self.quorum,
                    registered,
                    &slots,
                    *pos,
                    &exclude,
                    &mut quire_clock::rng(),
                );
                let b = match pick {
                    Ok(Some(b)) => b,
                    Ok(None) => break,
                    Err(err) => {
                        tracing::warn!(ledger = self.id.0, position = pos, "no replacement: {err}");
                        break;
                    }
                };
                exclude.insert(b.clone());
                match client.conn(&b, Lane::Tail).await {
                    Ok(c) => {
                        slots[*pos] = Some(b.clone());
                        chosen.push((*pos, b, c));
                        break;
                    }
                    Err(err) => {
                        tracing::warn!(ledger = self.id.0, bookie = %b, "replacement unreachable: {err}");
                        client.quarantine(&b);
                    }
                }
            }
        }
        for (_, b) in failing {
            client.quarantine(b);
        }
        chosen
    }

    /// The metadata step: the last fragment gets the replacements from entry `first` (a new
    /// fragment, or the last one rewritten when it starts there), by compare-and-set, read
    /// again after a `BadVersion`; only while the ledger is OPEN and the failed bookies are
    /// still in the last fragment. Returns the new metadata and its version.
    ///
    /// # Errors
    /// `Fenced` (IN_RECOVERY), `Closed`, `WriterFailed` (the fragments moved under the
    /// writer), `Invalid`, the store's errors.
    async fn write_fragment(
        &self,
        mut meta: LedgerMetadata,
        mut version: Version,
        first: u64,
        failing: &[(usize, BookieId)],
        chosen: &[Replacement],
    ) -> Result<(LedgerMetadata, Version), Error> {
        let metadata = &self.client.inner.metadata;
        loop {
            let next = self.next_fragments(&meta, first, failing, chosen)?;
            match metadata.update_ledger(self.id, &next, version).await {
                Ok(v) => return Ok((next, v)),
                Err(quire_metadata::Error::BadVersion { .. }) => {
                    let now = metadata.read_ledger(self.id).await?;
                    (meta, version) = (now.value, now.version);
                }
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// `meta` with the replacements in its last fragment from entry `first`, after checking
    /// that the ledger is OPEN and the last fragment still holds the failed bookies.
    ///
    /// # Errors
    /// As [`WriterShared::write_fragment`], but the store's.
    fn next_fragments(
        &self,
        meta: &LedgerMetadata,
        first: u64,
        failing: &[(usize, BookieId)],
        chosen: &[Replacement],
    ) -> Result<LedgerMetadata, Error> {
        match meta.state {
            LedgerState::Open => {}
            LedgerState::InRecovery => return Err(Error::Fenced { ledger: self.id.0 }),
            LedgerState::Closed => return Err(Error::Closed { ledger: self.id.0 }),
        }
        let last = meta
            .fragments
            .last()
            .ok_or_else(|| Error::Invalid("ledger without fragments".into()))?;
        if last.first_entry > first {
            return Err(Error::WriterFailed {
                ledger: self.id.0,
                entry: first,
                reason: format!(
                    "last fragment starts at {} beyond LAC + 1 = {first}",
                    last.first_entry
                ),
            });
        }
        for (pos, old) in failing {
            if last.bookies.get(*pos) != Some(old) {
                return Err(Error::WriterFailed {
                    ledger: self.id.0,
                    entry: first,
                    reason: format!(
                        "ensemble changed under the writer: position {pos} no longer holds {old}"
                    ),
                });
            }
        }
        let mut bookies = last.bookies.clone();
        for (pos, b, _) in chosen {
            bookies[*pos] = b.clone();
        }
        let mut next = meta.clone();
        if last.first_entry == first {
            next.fragments.last_mut().expect("checked above").bookies = bookies;
        } else {
            next.fragments.push(Fragment {
                first_entry: first,
                bookies,
            });
        }
        Ok(next)
    }

    /// Swaps the replacements in and re-sends every pending add they now hold; the failed
    /// positions left without one are marked unreplaceable (their pending entries are
    /// confirmed without them).
    ///
    /// # Errors
    /// `WriterFailed` when an entry can no longer reach the ack quorum.
    fn swap_in(
        self: &Arc<Self>,
        registered: &[BookieInfo],
        failing: &[(usize, BookieId)],
        chosen: Vec<Replacement>,
        updated: Option<(LedgerMetadata, Version)>,
        lac: Option<EntryId>,
    ) -> Result<(), Error> {
        let (e, w, _) = self.quorum;
        let mut st = self
            .state
            .lock()
            .map_err(|_| Error::Invalid("writer state poisoned".into()))?;
        if let Some(m) = updated {
            st.meta = m;
        }
        if st.failed.is_some() {
            return Ok(());
        }
        debug_assert_eq!(
            st.lac, lac,
            "success is held back during an ensemble change"
        );
        let now = quire_clock::now();
        for (pos, _) in failing {
            st.failing.remove(pos);
            st.unreplaceable.insert(*pos, now);
            // Its pending entries will be confirmed without it.
            self.report_missing(&mut st, *pos);
        }
        for (pos, bookie, conn) in chosen {
            tracing::info!(ledger = self.id.0, position = pos, from = %st.ensemble[pos].bookie, to = %bookie, first_entry = lac.map_or(0, |l| l.0 + 1), "ensemble change");
            crate::metrics::metrics().ensemble_changed();
            st.unreplaceable.remove(&pos);
            let slot = &mut st.ensemble[pos];
            slot.bookie = bookie;
            slot.conn = conn;
            slot.generation += 1;
            st.tracker.forget_position(pos);
            let resend: Vec<(u64, crate::writer::EntryBytes)> = st
                .pending
                .iter()
                .filter(|p| quorum::write_set(p.entry, e, w).contains(&pos))
                .map(|p| (p.entry, p.bytes.clone()))
                .collect();
            for (entry, bytes) in resend {
                self.send(&st, entry, &bytes, pos);
            }
            st.ensemble_changes += 1;
        }
        if let Some(entry) = st.tracker.first_quorum_lost() {
            let stuck: Vec<String> = st
                .unreplaceable
                .keys()
                .map(|p| st.ensemble[*p].bookie.0.clone())
                .collect();
            let writable = registered.iter().filter(|b| !b.read_only).count();
            return Err(Error::WriterFailed {
                ledger: self.id.0,
                entry,
                reason: format!(
                    "entry cannot reach Qa: no replacement for failed bookie(s) {} ({writable} writable registered, all in the ensemble or failed recently)",
                    stuck.join(", ")
                ),
            });
        }
        Ok(())
    }
}

/// A failed position's replacement: (position, bookie, its connection).
type Replacement = (usize, BookieId, Arc<conn::Conn>);

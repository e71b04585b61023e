//! Ledger recovery (BookKeeper open-with-recovery, `LedgerRecoveryOp`): mark IN_RECOVERY,
//! fence the last ensemble until the answers cover every write set, read forward from the LAC
//! with fencing reads, re-add each entry found to its whole write set, stop at the first entry
//! Qw - Qa + 1 bookies deny, and close by compare-and-set.

use std::sync::Arc;

use quire_metadata::{LedgerMetadata, LedgerState};
use quire_wire::bookie::{self, Request, Status};
use quire_wire::entry::{verify_expected, EntryHeader};
use quire_wire::{EntryId, LedgerId, MasterKey};

use crate::conn::{Lane, Reply};
use crate::reader::ReadOutcome;
use crate::{quorum, BookKeeper, Error, LedgerReader};

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
    /// # Errors
    /// `Recovery` if too few bookies answer to decide; `Metadata`; or the close found a
    /// different end written by someone else.
    pub async fn recover_ledger(&self, id: LedgerId) -> Result<LedgerMetadata, Error> {
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
            let (last_entry, length_bytes) = self.recover_end(id, &meta).await?;
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

    async fn recover_end(
        &self,
        id: LedgerId,
        meta: &LedgerMetadata,
    ) -> Result<(Option<EntryId>, u64), Error> {
        let key = meta.master_key()?;
        let (e, w, a) = (meta.ensemble_size, meta.write_quorum, meta.ack_quorum);
        let timeout = self.inner.config.request_timeout;
        let fragment = meta
            .fragments
            .last()
            .ok_or_else(|| Error::Invalid("ledger without fragments".into()))?;
        // 1. Fence every bookie of the last ensemble.
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
        // 2. Length so far: the header of the LAC entry (if any) carries the cumulative length.
        let reader = LedgerReader {
            client: self.clone(),
            id,
            meta: meta.clone(),
        };
        let mut length_bytes = 0;
        let mut last = lac;
        if let Some(l) = lac {
            match reader.read_raw(l, Some(key)).await? {
                ReadOutcome::Found(bytes) => {
                    length_bytes = header_of(&bytes, id, l)?.length_bytes;
                }
                ReadOutcome::Missing => {
                    return Err(Error::Recovery {
                        ledger: id.0,
                        reason: format!("LAC entry {l} is missing on every replica"),
                    });
                }
            }
        }
        // 3. Read forward with fencing reads, re-adding what is found, until proven missing.
        let mut next = lac.map_or(fragment.first_entry, |l| l.0 + 1);
        loop {
            match reader.read_raw(EntryId(next), Some(key)).await? {
                ReadOutcome::Missing => break,
                ReadOutcome::Found(bytes) => {
                    length_bytes = header_of(&bytes, id, EntryId(next))?.length_bytes;
                    self.recovery_add(meta, id, key, EntryId(next), bytes)
                        .await?;
                    last = Some(EntryId(next));
                    next += 1;
                }
            }
        }
        Ok((last, length_bytes))
    }

    async fn recovery_add(
        &self,
        meta: &LedgerMetadata,
        id: LedgerId,
        key: MasterKey,
        entry: EntryId,
        bytes: Vec<u8>,
    ) -> Result<(), Error> {
        let fragment = meta.fragment_for(entry);
        let timeout = self.inner.config.request_timeout;
        let bytes = Arc::new(bytes);
        let mut calls = Vec::new();
        for pos in quorum::write_set(entry.0, meta.ensemble_size, meta.write_quorum) {
            let client = self.clone();
            let b = fragment.bookies[pos].clone();
            let bytes = bytes.clone();
            calls.push(tokio::spawn(async move {
                let c = client.conn(&b, Lane::Tail).await?;
                c.call(timeout, move |out, rid| {
                    bookie::encode_request(
                        out,
                        rid,
                        &Request::Add {
                            recovery: true,
                            master_key: key,
                            entry: &bytes,
                        },
                    )
                })
                .await
            }));
        }
        let mut acks = 0;
        let mut reasons = Vec::new();
        for call in calls {
            match call
                .await
                .map_err(|j| Error::Invalid(j.to_string()))
                .and_then(|r| r)
            {
                Ok(Reply::Add) => acks += 1,
                Ok(other) => reasons.push(format!("{other:?}")),
                Err(e) => reasons.push(e.to_string()),
            }
        }
        if acks < usize::from(meta.ack_quorum) {
            return Err(Error::Recovery {
                ledger: id.0,
                reason: format!(
                    "re-adding entry {entry} reached {acks} of {} acks: {}",
                    meta.ack_quorum,
                    reasons.join("; ")
                ),
            });
        }
        Ok(())
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

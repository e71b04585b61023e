//! Read handles (BookKeeper `ReadOnlyLedgerHandle`, opened without recovery): an entry is read
//! from any replica of its write set, replicas quarantined lately last, and is proven missing
//! by Qw - Qa + 1 denials; the LAC is the highest any bookie of the last ensemble reports.

use quire_metadata::LedgerMetadata;
use quire_wire::bookie::{self, Request, Status};
use quire_wire::entry::verify_expected;
use quire_wire::{EntryId, LedgerId, MasterKey};

use crate::conn::{self, Lane, Reply};
use crate::{quorum, BookKeeper, Error};

impl BookKeeper {
    /// Opens a ledger for reading without fencing (BookKeeper `openLedgerNoRecovery`).
    ///
    /// # Errors
    /// `Metadata` (e.g. no such ledger).
    pub async fn open_ledger(&self, id: LedgerId) -> Result<LedgerReader, Error> {
        let meta = self.inner.metadata.read_ledger(id).await?.value;
        Ok(LedgerReader {
            client: self.clone(),
            id,
            meta,
        })
    }
}

pub(crate) enum ReadOutcome {
    Found(Vec<u8>),
    Missing,
}

/// A read handle on a ledger (BookKeeper `ReadOnlyLedgerHandle`).
#[derive(Clone)]
pub struct LedgerReader {
    pub(crate) client: BookKeeper,
    pub(crate) id: LedgerId,
    pub(crate) meta: LedgerMetadata,
}

impl LedgerReader {
    /// The ledger id.
    pub fn id(&self) -> LedgerId {
        self.id
    }

    /// The metadata as read at open.
    pub fn metadata(&self) -> &LedgerMetadata {
        &self.meta
    }

    /// Reads one entry's payload, digest verified, trying each replica of its write set in
    /// turn (BookKeeper reads from the write set, any replica suffices). A replica found
    /// damaged on the way (a digest or position mismatch, or an `IoError` answer) is reported:
    /// the ledger is marked under-replicated with that bookie named
    /// (`MetadataStore::report_under_replicated`), so that autorecovery copies the entry back
    /// in place (issue 23 item 6; BookKeeper leaves this to its auditor's periodic check).
    ///
    /// # Errors
    /// `NoSuchEntry` when enough replicas deny it that it cannot have been acknowledged;
    /// otherwise the last replica's error.
    pub async fn read(&self, entry: EntryId) -> Result<Vec<u8>, Error> {
        match self.read_raw(entry, None).await? {
            ReadOutcome::Found(mut bytes) => {
                bytes.drain(..quire_wire::entry::ENTRY_HEADER_SIZE_BYTES);
                Ok(bytes)
            }
            ReadOutcome::Missing => Err(Error::NoSuchEntry {
                ledger: self.id.0,
                entry: entry.0,
            }),
        }
    }

    /// Reads the verified entry bytes. `Missing` needs Qw − Qa + 1 denials from the write set.
    pub(crate) async fn read_raw(
        &self,
        entry: EntryId,
        fence: Option<MasterKey>,
    ) -> Result<ReadOutcome, Error> {
        let meta = &self.meta;
        let fragment = meta.fragment_for(entry);
        let timeout = self.client.inner.config.request_timeout;
        let mut denials = 0;
        let mut last_err = None;
        // Replicas that timed out or were unreachable lately go last, so a stalled bookie costs
        // one request timeout per quarantine period instead of one per entry (BookKeeper reads
        // around slow bookies the same way, with its speculative reads).
        let quarantined = self.client.quarantined();
        let mut order = quorum::write_set(entry.0, meta.ensemble_size, meta.write_quorum);
        order.sort_by_key(|&pos| quarantined.contains(&fragment.bookies[pos]));
        // Fencing reads belong to recovery, a tail operation; plain reads take the read lane.
        let lane = if fence.is_some() {
            Lane::Tail
        } else {
            Lane::Read
        };
        for pos in order {
            let b = &fragment.bookies[pos];
            let reply = match self.client.conn(b, lane).await {
                Ok(c) => {
                    c.call(timeout, conn::read_request(self.id, Some(entry), fence))
                        .await
                }
                Err(e) => Err(e),
            };
            match reply {
                Ok(Reply::Read { data }) => match verify_expected(&data, self.id, entry) {
                    Ok(_) => return Ok(ReadOutcome::Found(data)),
                    Err(e) => {
                        let reason = e.to_string();
                        self.client.damaged_replica(self.id, entry, b, &reason);
                        last_err = Some(Error::Corrupt {
                            ledger: self.id.0,
                            entry: entry.0,
                            bookie: b.0.clone(),
                            reason,
                        })
                    }
                },
                Ok(Reply::Failed {
                    status: Status::NoSuchEntry | Status::NoSuchLedger,
                    ..
                }) => denials += 1,
                Ok(Reply::Failed { status, message }) => {
                    if status == Status::IoError {
                        // The bookie could not read its copy back ("no such entry" comes only
                        // from its index): a damaged replica, or a bookie going down; either
                        // way autorecovery checks the bookie's copies and repairs what it must.
                        self.client.damaged_replica(self.id, entry, b, &message);
                    }
                    last_err = Some(Error::Bookie {
                        bookie: b.0.clone(),
                        status,
                        message,
                    })
                }
                Ok(other) => last_err = Some(Error::Invalid(format!("unexpected reply {other:?}"))),
                Err(e) => {
                    if matches!(e, Error::Timeout { .. } | Error::BookieUnreachable { .. }) {
                        self.client.quarantine(b);
                    }
                    last_err = Some(e);
                }
            }
        }
        if denials >= usize::from(meta.write_quorum - meta.ack_quorum + 1) {
            return Ok(ReadOutcome::Missing);
        }
        Err(last_err.unwrap_or(Error::NoSuchEntry {
            ledger: self.id.0,
            entry: entry.0,
        }))
    }

    /// The highest LAC any bookie of the last ensemble reports (BookKeeper `readLastConfirmed`).
    ///
    /// # Errors
    /// The last error, if no bookie answered.
    pub async fn read_lac(&self) -> Result<Option<EntryId>, Error> {
        let fragment = self
            .meta
            .fragments
            .last()
            .ok_or_else(|| Error::Invalid("ledger without fragments".into()))?;
        let timeout = self.client.inner.config.request_timeout;
        let mut best = None;
        let mut any = false;
        let mut last_err = None;
        for b in &fragment.bookies {
            let id = self.id;
            let reply = match self.client.conn(b, Lane::Tail).await {
                Ok(c) => {
                    c.call(timeout, move |out, rid| {
                        bookie::encode_request(out, rid, &Request::ReadLac { ledger: id })
                    })
                    .await
                }
                Err(e) => Err(e),
            };
            match reply {
                Ok(Reply::ReadLac { lac, .. }) => {
                    any = true;
                    best = best.max(lac);
                }
                Ok(Reply::Failed {
                    status: Status::NoSuchLedger,
                    ..
                }) => any = true,
                Ok(other) => last_err = Some(Error::Invalid(format!("unexpected reply {other:?}"))),
                Err(e) => last_err = Some(e),
            }
        }
        if any {
            Ok(best)
        } else {
            Err(last_err.unwrap_or(Error::Invalid("empty ensemble".into())))
        }
    }
}

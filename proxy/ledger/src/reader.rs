//! Read handles (BookKeeper `ReadOnlyLedgerHandle`, opened without recovery): an entry is read
//! from any replica of its write set, replicas quarantined lately last, and is proven missing
//! by Qw - Qa + 1 denials; the LAC is the highest any bookie of the last ensemble reports.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Duration;

use quire_metadata::{BookieId, LedgerMetadata};
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

/// One replica's read request under way: its answer and how long it took.
type Attempt = Pin<Box<dyn Future<Output = (Result<Reply, Error>, Duration)> + Send>>;

/// The requests of one read under way (`LedgerReader::read_raw`).
struct Race {
    /// Each asked replica not yet answered: the bookie, whether it was asked speculatively,
    /// and its request.
    inflight: Vec<(BookieId, bool, Attempt)>,
    /// The position in the read order of the next replica to ask.
    next: usize,
    /// Whether this read asked a replica speculatively.
    speculated: bool,
}

enum Event {
    /// The speculative timeout passed with no answer.
    Timer,
    /// A replica answered: the bookie, whether it was asked speculatively, the answer.
    Answer((BookieId, bool, (Result<Reply, Error>, Duration))),
}

impl Race {
    /// Waits for the first answer of a request under way, or for `timer` if given.
    async fn wait(&mut self, mut timer: Option<&mut Pin<Box<tokio::time::Sleep>>>) -> Event {
        std::future::poll_fn(|cx| {
            for i in 0..self.inflight.len() {
                if let Poll::Ready(answer) = self.inflight[i].2.as_mut().poll(cx) {
                    let (b, speculative, _) = self.inflight.swap_remove(i);
                    return Poll::Ready(Event::Answer((b, speculative, answer)));
                }
            }
            if let Some(timer) = timer.as_mut() {
                if timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Event::Timer);
                }
            }
            Poll::Pending
        })
        .await
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
    ///
    /// The replicas are asked in the client's read order (`locality`: closest first, bookies
    /// that failed lately last). A plain read asks the next replica as well when none has
    /// answered within the speculative timeout (`speculative`; BookKeeper's speculative reads),
    /// and at once when one denies the entry or fails; the first good answer wins, and answers
    /// still outstanding then are awaited in the background (a timeout there still quarantines
    /// its bookie). A fencing read (recovery) asks one replica at a time, as BookKeeper's
    /// recovery reads do not speculate.
    pub(crate) async fn read_raw(
        &self,
        entry: EntryId,
        fence: Option<MasterKey>,
    ) -> Result<ReadOutcome, Error> {
        let meta = &self.meta;
        let fragment = meta.fragment_for(entry);
        let replicas: Vec<BookieId> =
            quorum::write_set(entry.0, meta.ensemble_size, meta.write_quorum)
                .into_iter()
                .map(|pos| fragment.bookies[pos].clone())
                .collect();
        let order = self.client.read_order(&replicas);
        if order.is_empty() {
            return Err(Error::Invalid(format!(
                "ledger {} has an empty write set (write quorum 0)",
                self.id
            )));
        }
        // Fencing reads belong to recovery, a tail operation; plain reads take the read lane.
        let lane = if fence.is_some() {
            Lane::Tail
        } else {
            Lane::Read
        };
        let speculation = &self.client.inner.speculation;
        let timeout = if fence.is_none() {
            speculation.current()
        } else {
            None
        };
        let mut race = Race {
            inflight: Vec::with_capacity(order.len()),
            next: 0,
            speculated: false,
        };
        let ask = |race: &mut Race, speculative: bool| {
            let b = &replicas[order[race.next]];
            race.next += 1;
            race.inflight.push((
                b.clone(),
                speculative,
                self.ask(b.clone(), entry, fence, lane),
            ));
        };
        ask(&mut race, false);
        let mut timer = timeout.map(|t| Box::pin(tokio::time::sleep(t)));
        let mut denials = 0;
        let mut last_err = None;
        while !race.inflight.is_empty() {
            let more = race.next < order.len();
            let (b, speculative, (reply, took)) =
                match race.wait(timer.as_mut().filter(|_| more)).await {
                    Event::Timer => {
                        // No answer within the speculative timeout: one more replica.
                        self.count_speculation();
                        race.speculated = true;
                        ask(&mut race, true);
                        if let (Some(timer), Some(t)) = (timer.as_mut(), timeout) {
                            *timer = Box::pin(tokio::time::sleep(t));
                        }
                        continue;
                    }
                    Event::Answer(answer) => answer,
                };
            match reply {
                Ok(Reply::Read { data }) => match verify_expected(&data, self.id, entry) {
                    Ok(_) => {
                        if timeout.is_some() {
                            self.count_win(took, speculative, race.speculated);
                        }
                        // The losers finish in the background: a timeout still quarantines.
                        for (_, _, attempt) in race.inflight.drain(..) {
                            tokio::spawn(attempt);
                        }
                        return Ok(ReadOutcome::Found(data));
                    }
                    Err(e) => last_err = Some(self.damaged(entry, &b, e.to_string())),
                },
                other => match self.failure_of(entry, &b, other) {
                    None => denials += 1,
                    Some(e) => last_err = Some(e),
                },
            }
            // A denial or a failure moves on to the next replica at once.
            if race.next < order.len() {
                ask(&mut race, false);
                if let (Some(timer), Some(t)) = (timer.as_mut(), timeout) {
                    *timer = Box::pin(tokio::time::sleep(t));
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

    /// Counts a speculative request sent (metrics and the client's own count).
    fn count_speculation(&self) {
        self.client
            .inner
            .speculative_sent
            .fetch_add(1, Ordering::Relaxed);
        crate::metrics::metrics().speculative_read_sent();
    }

    /// Feeds a good answer to the speculative timeout: its latency, whether the speculative
    /// replica won, and, when the read speculated, whether that helped.
    fn count_win(&self, took: Duration, speculative: bool, speculated: bool) {
        let speculation = &self.client.inner.speculation;
        speculation.observe(took);
        if speculative {
            self.client
                .inner
                .speculative_won
                .fetch_add(1, Ordering::Relaxed);
            crate::metrics::metrics().speculative_read_won();
        }
        if speculated {
            speculation.speculated(speculative);
        }
    }

    /// A copy that failed its digest or position check: reported for repair, and the error
    /// to give if no replica has a good copy.
    fn damaged(&self, entry: EntryId, b: &BookieId, reason: String) -> Error {
        self.client.damaged_replica(self.id, entry, b, &reason);
        Error::Corrupt {
            ledger: self.id.0,
            entry: entry.0,
            bookie: b.0.clone(),
            reason,
        }
    }

    /// What an answer other than a copy says: `None` for a denial (the replica does not hold
    /// the entry), else the error to give if no replica has a good copy. An `IoError` answer
    /// is reported for repair.
    fn failure_of(
        &self,
        entry: EntryId,
        b: &BookieId,
        reply: Result<Reply, Error>,
    ) -> Option<Error> {
        match reply {
            Ok(Reply::Failed {
                status: Status::NoSuchEntry | Status::NoSuchLedger,
                ..
            }) => None,
            Ok(Reply::Failed { status, message }) => {
                if status == Status::IoError {
                    // The bookie could not read its copy back ("no such entry" comes only
                    // from its index): a damaged replica, or a bookie going down; either
                    // way autorecovery checks the bookie's copies and repairs what it must.
                    self.client.damaged_replica(self.id, entry, b, &message);
                }
                Some(Error::Bookie {
                    bookie: b.0.clone(),
                    status,
                    message,
                })
            }
            Ok(other) => Some(Error::Invalid(format!("unexpected reply {other:?}"))),
            Err(e) => Some(e),
        }
    }

    /// One read request to `bookie`, from its connection to its answer, with the time it took.
    /// A timeout or an unreachable bookie quarantines it (BookKeeper's failure history), so
    /// that later reads ask it last.
    fn ask(
        &self,
        bookie: BookieId,
        entry: EntryId,
        fence: Option<MasterKey>,
        lane: Lane,
    ) -> Attempt {
        let client = self.client.clone();
        let ledger = self.id;
        Box::pin(async move {
            let sent = quire_clock::now();
            let timeout = client.inner.config.request_timeout;
            let reply = match client.conn(&bookie, lane).await {
                Ok(c) => {
                    c.call(timeout, conn::read_request(ledger, Some(entry), fence))
                        .await
                }
                Err(e) => Err(e),
            };
            if matches!(
                reply,
                Err(Error::Timeout { .. } | Error::BookieUnreachable { .. })
            ) {
                client.quarantine(&bookie);
            }
            (reply, quire_clock::elapsed(sent))
        })
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

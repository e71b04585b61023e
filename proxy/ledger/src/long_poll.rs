//! Long-poll reads of the LAC with the next entry piggybacked (BookKeeper's
//! `readLastAddConfirmedAndEntry` over `READ_ENTRY` with `previousLAC` and a timeout,
//! bookkeeper.md §1.3): a tailing reader learns of new entries without polling.
//!
//! Each call asks every bookie of the ledger's last ensemble at once (closest first, in the
//! client's read order: `locality`), on the client's pooled
//! long-poll connection to it (the request parks on the bookie; other polls on the same
//! connection go on, answers being matched by request id, and plain reads have a connection of
//! their own), and returns as soon as one bookie reports a LAC past
//! `previous` together with entry `previous + 1`. If the LAC moved but no bookie that answered
//! holds that entry (with E > Qw not every bookie stores every entry), the entry is read from
//! its write set like any read.

use std::time::Duration;

use quire_metadata::BookieId;
use quire_wire::bookie::{encode_request, Request, LONG_POLL_TIMEOUT_MS_MAX};
use quire_wire::entry::{verify_expected, ENTRY_HEADER_SIZE_BYTES};
use quire_wire::{EntryId, LedgerId};
use tokio::sync::mpsc;

use crate::conn::{Lane, Reply};
use crate::{BookKeeper, Error, LedgerReader};

/// One bookie's answer: its LAC and, if it held it and it verified, entry `previous + 1`'s
/// stored bytes.
struct Answer {
    lac: Option<EntryId>,
    next_entry: Option<Vec<u8>>,
}

impl LedgerReader {
    /// Waits until a bookie of the last ensemble knows a LAC past `previous` (`None`: any LAC),
    /// or `timeout` elapsed, and returns the highest LAC learned and, when it passed
    /// `previous`, the payload of entry `previous + 1` (entry 0 for `None`), digest verified.
    /// On a timeout the answer is the highest LAC the bookies reported (not past `previous`)
    /// and no entry. `timeout` is capped at 60 s (`LONG_POLL_TIMEOUT_MS_MAX`).
    ///
    /// Follows BookKeeper's long-poll read (`READ_ENTRY` with `previousLAC`, timeout and
    /// piggyback); the bookie's LAC is the highest LAC piggybacked on the entries it stores.
    ///
    /// # Errors
    /// The last bookie error when no bookie answered; `Corrupt` if the piggybacked or fetched
    /// entry fails its digest; the errors of [`LedgerReader::read`] when the entry has to be
    /// fetched separately.
    pub async fn read_lac_long_poll(
        &self,
        previous: Option<EntryId>,
        timeout: Duration,
    ) -> Result<(Option<EntryId>, Option<Vec<u8>>), Error> {
        let fragment = self
            .meta
            .fragments
            .last()
            .ok_or_else(|| Error::Invalid("ledger without fragments".into()))?;
        let timeout_ms = u32::try_from(timeout.as_millis())
            .unwrap_or(u32::MAX)
            .min(LONG_POLL_TIMEOUT_MS_MAX);
        let config = &self.client.inner.config;
        // The bookie answers by `timeout`; allow it one request timeout more to get here.
        let deadline = Duration::from_millis(u64::from(timeout_ms)) + config.request_timeout;
        let next = previous.map_or(0, |p| p.0 + 1);
        let (tx, mut rx) = mpsc::channel(fragment.bookies.len());
        // Sent in the read order (BookKeeper `reorderReadLACSequence`): the closest bookies'
        // polls go first and, answering first, usually bring the entry.
        for i in self.client.read_order(&fragment.bookies) {
            let b = &fragment.bookies[i];
            let tx = tx.clone();
            let b = b.clone();
            let ledger = self.id;
            let client = self.client.clone();
            tokio::spawn(async move {
                let r = poll_one(&client, &b, ledger, previous, timeout_ms, deadline).await;
                let _ = tx.send((b, r)).await;
            });
        }
        drop(tx);
        let mut best: Option<EntryId> = None;
        let mut any = false;
        let mut last_err = None;
        while let Some((b, r)) = rx.recv().await {
            match r {
                Ok(a) => {
                    any = true;
                    best = best.max(a.lac);
                    if a.lac > previous {
                        if let Some(bytes) = a.next_entry {
                            let payload = self.payload_of(&b, EntryId(next), bytes)?;
                            return Ok((best, Some(payload)));
                        }
                    }
                }
                Err(e) => last_err = Some(e),
            }
        }
        if !any {
            return Err(last_err.unwrap_or(Error::Invalid("empty ensemble".into())));
        }
        if best > previous {
            // Entry `next` is at most the LAC, so confirmed: it is readable from its write set.
            let payload = self.read(EntryId(next)).await?;
            return Ok((best, Some(payload)));
        }
        Ok((best, None))
    }

    fn payload_of(
        &self,
        bookie: &BookieId,
        entry: EntryId,
        mut bytes: Vec<u8>,
    ) -> Result<Vec<u8>, Error> {
        verify_expected(&bytes, self.id, entry).map_err(|e| Error::Corrupt {
            ledger: self.id.0,
            entry: entry.0,
            bookie: bookie.0.clone(),
            reason: e.to_string(),
        })?;
        bytes.drain(..ENTRY_HEADER_SIZE_BYTES);
        Ok(bytes)
    }
}

/// Sends the long-poll to one bookie on its long-poll connection and waits for the answer, at
/// most `deadline` (the bookie answers by the poll's timeout).
async fn poll_one(
    client: &BookKeeper,
    bookie: &BookieId,
    ledger: LedgerId,
    previous: Option<EntryId>,
    timeout_ms: u32,
    deadline: Duration,
) -> Result<Answer, Error> {
    let conn = client.conn(bookie, Lane::LongPoll).await?;
    let reply = conn
        .call(deadline, move |out, id| {
            encode_request(
                out,
                id,
                &Request::ReadLacLongPoll {
                    ledger,
                    previous_lac: previous,
                    timeout_ms,
                },
            )
        })
        .await?;
    match reply {
        Reply::LongPoll {
            ledger: answered,
            lac,
            next_entry,
        } => {
            if answered != ledger {
                return Err(Error::Invalid(format!(
                    "long-poll answer names ledger {answered}"
                )));
            }
            let next_expected = previous.map_or(0, |p| p.0 + 1);
            let next_entry = match next_entry {
                Some((e, _)) if e.0 != next_expected => {
                    return Err(Error::Invalid(format!(
                        "piggybacked entry {e}, expected {next_expected}"
                    )))
                }
                Some((_, data)) => Some(data),
                None => None,
            };
            Ok(Answer { lac, next_entry })
        }
        Reply::Failed { status, message } => Err(Error::Bookie {
            bookie: bookie.0.clone(),
            status,
            message,
        }),
        other => Err(Error::Invalid(format!(
            "unexpected answer to a long poll: {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    //! Goal: a tailing reader's long-poll parks until the writer's next add moves the LAC, then
    //! returns the new LAC with the next entry's payload; a poll whose LAC already passed answers
    //! at once; a poll with nothing new times out with the unchanged LAC and no entry; a parked
    //! poll does not hold up reads, and polls reuse the pooled connections.
    //! Method: three real bookies (one shard each) on 127.0.0.1 with O_DIRECT journals under
    //! /tmp, the embedded metadata store, a writer and a reader of one E3/Qw2/Qa2 ledger.

    use std::collections::BTreeMap;
    use std::sync::Arc;

    use quire_metadata::{EmbeddedStore, MetadataStore};
    use quire_testkit::bookies::start_registered_bookies;

    use super::*;
    use crate::{BookKeeper, ClientConfig, LedgerOptions};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn long_poll_parks_wakes_piggybacks_and_times_out() {
        let dir = tempfile::Builder::new()
            .prefix("quire-ledger-lp-")
            .tempdir_in("/tmp")
            .unwrap();
        let store = EmbeddedStore::open(&dir.path().join("meta")).unwrap();
        let bookies = start_registered_bookies(dir.path(), 3, &store).await;
        let store: Arc<dyn MetadataStore> = Arc::new(store);
        let bk = BookKeeper::new(store, ClientConfig::default());
        let opts = LedgerOptions {
            ensemble_size: 3,
            write_quorum: 2,
            ack_quorum: 2,
            password: b"pw".to_vec(),
            custom: BTreeMap::new(),
        };
        let writer = bk.create_ledger(opts).await.unwrap();
        writer.add(b"zero".to_vec()).await.unwrap();
        writer.add(b"one".to_vec()).await.unwrap();
        let reader = bk.open_ledger(writer.id()).await.unwrap();

        // Bookies holding entry 1 know LAC 0: answered at once, entry 0 piggybacked.
        let (lac, entry) = reader
            .read_lac_long_poll(None, Duration::from_secs(20))
            .await
            .unwrap();
        assert_eq!(lac, Some(EntryId(0)));
        assert_eq!(entry.as_deref(), Some(&b"zero"[..]));

        // Nothing new past LAC 0 until the writer adds: the poll parks, then wakes.
        let r = reader.clone();
        let poll = tokio::spawn(async move {
            r.read_lac_long_poll(Some(EntryId(0)), Duration::from_secs(20))
                .await
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !poll.is_finished(),
            "the long-poll must park while the LAC stays at 0"
        );
        // Plain reads beside the parked poll still get answers.
        let zero = tokio::time::timeout(Duration::from_secs(5), reader.read(EntryId(0)))
            .await
            .expect("a read beside a parked long poll must not wait for it")
            .unwrap();
        assert_eq!(zero, b"zero");
        assert!(!poll.is_finished());
        writer.add(b"two".to_vec()).await.unwrap();
        let (lac, entry) = poll.await.unwrap().unwrap();
        assert_eq!(lac, Some(EntryId(1)));
        assert_eq!(entry.as_deref(), Some(&b"one"[..]));

        // Nothing past LAC 1: a short poll times out with LAC 1 and no entry.
        let (lac, entry) = reader
            .read_lac_long_poll(Some(EntryId(1)), Duration::from_millis(100))
            .await
            .unwrap();
        assert_eq!(lac, Some(EntryId(1)));
        assert_eq!(entry, None);
        // Three polls and a read went over the pooled connections: one per bookie and lane
        // (adds: 3 bookies; polls: 3; the read of entry 0: the first replica asked answered).
        let lanes = bk.inner.pool.lanes().await;
        let count = |lane: Lane| lanes.iter().filter(|l| **l == lane).count();
        assert_eq!(
            (count(Lane::Tail), count(Lane::LongPoll), count(Lane::Read)),
            (3, 3, 1)
        );
        drop(bookies);
    }
}

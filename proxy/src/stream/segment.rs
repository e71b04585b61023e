//! Log segments (DistributedLog `BKLogWriteHandler`, reduced): a segment is one ledger; the
//! writer starts one by creating its ledger and appending an `InProgress` segment to the stream
//! metadata by compare-and-set, completes it by closing the ledger and marking it `Completed`,
//! and recovers any segment an earlier writer left in progress (fence and close its ledger,
//! read its last entry for the last txid and record count).

use std::collections::BTreeMap;

use std::sync::Arc;

use quire_ledger::{LedgerOptions, LedgerWriter};
use quire_metadata::{SegmentMetadata, SegmentState, StreamMetadata, Versioned};
use quire_wire::{EntryId, LedgerId};

use super::tail_cache::TailState;
use super::writer::Writer;
use super::{storage, writer_storage};
use crate::error::{Error, FromMetadata, Result};
use crate::record_set;

/// The segment being written.
pub(super) struct OpenSegment {
    pub(super) seq_no: u64,
    pub(super) ledger: LedgerWriter,
    /// Entry id the next add gets.
    pub(super) next_entry: u64,
    /// Records added to the segment (acknowledged or in flight).
    pub(super) record_count: u64,
    /// Entry payload bytes added.
    pub(super) size_bytes: u64,
    /// txid of the last record added.
    pub(super) last_txid: u64,
    /// Highest entry acknowledged.
    pub(super) last_acked_entry: Option<u64>,
    /// When it was started, on the monotonic clock (the time roll's reference).
    pub(super) opened_at: std::time::Instant,
    /// Last entry holding records (control entries hold none).
    pub(super) last_data_entry: Option<u64>,
    /// Highest LAC an entry sent so far carried to the bookies.
    pub(super) lac_carried: Option<u64>,
    /// When the last acknowledgement was handled.
    pub(super) last_ack_at: tokio::time::Instant,
}

/// The next segment's ledger, created before the open segment is completed (DistributedLog's
/// ledger allocator), so that a segment is never completed before its successor can be
/// started. The rest of the batch that rolled starts the next segment on it; when no record
/// follows, it is given back (`Writer::discard_spare`). Labelled for its stream like every
/// segment ledger: if the writer dies before the ledger enters the stream record or is given
/// back, the lifecycle sweep deletes it as an orphan.
pub(super) struct SpareLedger {
    pub(super) ledger: LedgerWriter,
    /// The segment sequence number it is labelled with.
    pub(super) seq_no: u64,
    /// The stream secret its master key derives from (new when the stream had none yet).
    pub(super) secret: Vec<u8>,
}

/// The sequence number of a stream's next segment: one past its last segment, and never below
/// the truncation point (whose segments may all have been deleted), so that DLSNs only grow
/// (DistributedLog keeps the max sequence number in the `ledgers` znode for the same reason).
pub(super) fn next_seq_no(meta: &quire_metadata::StreamMetadata) -> u64 {
    let after_last = meta.segments.last().map_or(1, |s| s.seq_no + 1);
    let after_point = meta.truncated_before.map_or(1, |t| {
        if t.entry_id == 0 && t.slot_index == 0 {
            t.segment_seq_no
        } else {
            t.segment_seq_no + 1
        }
    });
    after_last.max(after_point).max(1)
}

impl Writer {
    pub(super) fn meta_err(&self, op: &'static str, e: quire_metadata::Error) -> Error {
        Error::from_metadata(&self.name, op, e)
    }

    /// Takes `meta` as the stream record and shows it to `describe` together with the open
    /// segment's progress, dropping that progress once the record no longer has its segment
    /// in progress (one lock: a describe never sees a roll half done).
    pub(super) fn set_meta(&mut self, meta: Versioned<StreamMetadata>) {
        let mut view = self.shared.view.lock().expect("view lock");
        if let Some((seq, ..)) = view.live {
            if !meta
                .value
                .segments
                .iter()
                .any(|s| s.seq_no == seq && s.state == SegmentState::InProgress)
            {
                view.live = None;
            }
        }
        view.meta = Some(Arc::new(meta.clone()));
        self.meta = meta;
    }

    /// Compare-and-set of the stream record against the version this writer holds; on success
    /// `meta` becomes the writer's record. The store's stamp of the update is compared with
    /// this proxy's clock (`clock.rs`). Errors are the store's.
    pub(super) async fn cas_stream(
        &mut self,
        meta: StreamMetadata,
    ) -> std::result::Result<(), quire_metadata::Error> {
        let before = super::now_ms();
        let stamped = self
            .metadata
            .update_stream_stamped(&meta, self.meta.version)
            .await?;
        self.layer
            .clock
            .record(before, super::now_ms(), stamped.store_time_ms);
        self.set_meta(Versioned {
            value: meta,
            version: stamped.version,
        });
        Ok(())
    }

    /// Makes sure the store's clock was sampled lately (`clock::SAMPLE_MAX_AGE`), by rewriting
    /// the stream record unchanged when it was not (the sweep's rewrite does the same).
    pub(super) async fn sample_store_clock(&mut self) -> Result<()> {
        if self.layer.clock.fresh() {
            return Ok(());
        }
        self.check_ownership()?;
        let same = self.meta.value.clone();
        self.cas_stream(same)
            .await
            .map_err(|e| self.stream_update_err("sample the metadata store's clock", e))
    }

    /// A completion time for the stream record: now on the metadata store's clock, at the
    /// latest the last sample allows (`clock.rs`), so that no proxy's clock makes a segment
    /// look older than it is.
    pub(super) fn completion_time_ms(&self) -> u64 {
        self.layer.clock.store_now_latest_ms(super::now_ms())
    }

    pub(super) fn publish(&self) {
        self.tail
            .send_replace(TailState::from_metadata(&self.meta.value));
        // Keep the in-progress segment's readable end: it is the LAC, not in the metadata.
        if let Some(cur) = &self.current {
            let lac = cur.last_acked_entry;
            let seq = cur.seq_no;
            self.tail.send_modify(|t| {
                if let Some(s) = t.segments.iter_mut().find(|s| s.seq_no == seq) {
                    s.readable_last_entry = lac;
                }
            });
        }
        // A segment left unrecovered is readable up to the LAC its live bookies hold.
        if let Some(u) = &self.unrecovered {
            let (seq, lac) = (u.seq_no, u.readable_last_entry);
            self.tail.send_modify(|t| {
                if let Some(s) = t
                    .segments
                    .iter_mut()
                    .find(|s| s.seq_no == seq && !s.completed)
                {
                    s.readable_last_entry = lac;
                }
            });
        }
    }

    /// Recovers every `InProgress` segment: fence and close its ledger, learn its end from the
    /// last entry, mark it `Completed`. Afterwards the writer is healthy with no open segment.
    ///
    /// A segment whose ledger recovery fails is left `InProgress` (its ledger IN_RECOVERY):
    /// the failure is logged, kept in `self.unrecovered` with the LAC the live bookies report
    /// (readers are served up to it) and the time of the next attempt, which grows from 1 s
    /// to 30 s; until then this method fails at once with the same error.
    pub(super) async fn recover(&mut self) -> Result<()> {
        if let Some(u) = &self.unrecovered {
            if std::time::Instant::now() < u.retry_at {
                return Err(super::writer::same_kind(&u.error));
            }
        }
        self.current = None;
        let fresh = self
            .metadata
            .read_stream(&self.name)
            .await
            .map_err(|e| self.meta_err("read stream", e))?;
        self.set_meta(fresh);
        let mut changed = false;
        let mut meta = self.meta.value.clone();
        for seg in meta
            .segments
            .iter_mut()
            .filter(|s| s.state == SegmentState::InProgress)
        {
            let lm = match self
                .bookkeeper
                .recover_ledger(LedgerId(seg.ledger_id))
                .await
            {
                Ok(lm) => lm,
                Err(e) => return Err(self.recovery_failed(seg.seq_no, seg.ledger_id, e).await),
            };
            let (last_txid, record_count) = match lm.last_entry {
                None => (None, 0),
                Some(last) => {
                    let reader = self
                        .bookkeeper
                        .open_ledger(LedgerId(seg.ledger_id))
                        .await
                        .map_err(|e| storage(&self.name, "open ledger", e))?;
                    let payload = reader
                        .read(EntryId(last))
                        .await
                        .map_err(|e| storage(&self.name, "read last entry", e))?;
                    let set = record_set::decode(&payload).map_err(|e| Error::Storage {
                        stream: self.name.clone(),
                        op: "decode last entry",
                        source: format!("ledger {} entry {last}: {e}", seg.ledger_id).into(),
                    })?;
                    // A data entry's last record, or a control entry's record of it.
                    (
                        set.last_txid(),
                        set.segment_record_index + set.records.len() as u64,
                    )
                }
            };
            tracing::info!(stream = %self.name, seq_no = seg.seq_no, ledger = seg.ledger_id, last_entry = ?lm.last_entry, record_count, "recovered in-progress segment");
            if let Some(u) = self.unrecovered.take() {
                tracing::info!(stream = %self.name, seq_no = u.seq_no, ledger = u.ledger_id, attempts = u.attempts + 1, "segment recovered after failed attempts");
            }
            seg.state = SegmentState::Completed;
            seg.last_entry = lm.last_entry;
            seg.last_txid = last_txid.or(seg.first_txid);
            seg.record_count = record_count;
            seg.length_bytes = lm.length_bytes;
            seg.completion_time_ms = None; // stamped below, on the store's clock
            if let Some(t) = last_txid {
                meta.max_txid = Some(meta.max_txid.map_or(t, |m| m.max(t)));
            }
            changed = true;
        }
        // Completed segments recorded before completion times existed count from now, so that
        // one of them cannot hold time-based retention back forever.
        let unstamped = meta
            .segments
            .iter()
            .any(|s| s.state == SegmentState::Completed && s.completion_time_ms.is_none());
        if unstamped {
            // Completion times are taken on the store's clock: sample it first if need be.
            self.sample_store_clock().await?;
            let now = self.completion_time_ms();
            for seg in meta
                .segments
                .iter_mut()
                .filter(|s| s.state == SegmentState::Completed && s.completion_time_ms.is_none())
            {
                seg.completion_time_ms = Some(now);
            }
            changed = true;
        }
        if changed {
            self.cas_stream(meta)
                .await
                .map_err(|e| self.stream_update_err("complete recovered segment", e))?;
        }
        self.set_last_txid(self.meta.value.max_txid);
        self.healthy = true;
        self.unrecovered = None;
        self.publish();
        Ok(())
    }

    /// A segment's ledger recovery failed: note it (see [`Writer::recover`]), find the LAC the
    /// live bookies hold so that readers can go on up to it, and return the error for the
    /// caller.
    async fn recovery_failed(
        &mut self,
        seq_no: u64,
        ledger_id: u64,
        e: quire_ledger::Error,
    ) -> Error {
        const RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
        const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);
        let previous = self.unrecovered.take().filter(|u| u.seq_no == seq_no);
        // BookKeeper's read-only open without recovery: any LAC a bookie reports was confirmed.
        let lac = match self.bookkeeper.open_ledger(LedgerId(ledger_id)).await {
            Ok(reader) => reader.read_lac().await.map(|l| l.map(|e| e.0)),
            Err(err) => Err(err),
        };
        let readable_last_entry = match lac {
            Ok(l) => l.max(previous.as_ref().and_then(|u| u.readable_last_entry)),
            Err(err) => {
                tracing::warn!(stream = %self.name, seq_no, ledger = ledger_id, error = %err, "cannot read the LAC of an unrecovered segment");
                previous.as_ref().and_then(|u| u.readable_last_entry)
            }
        };
        let (attempts, retry_interval) = match &previous {
            Some(u) => (u.attempts + 1, (u.retry_interval * 2).min(RETRY_MAX)),
            None => (1, RETRY_FIRST),
        };
        tracing::warn!(
            stream = %self.name,
            seq_no,
            ledger = ledger_id,
            error = %e,
            attempts,
            readable_last_entry = ?readable_last_entry,
            retry_in_ms = retry_interval.as_millis() as u64,
            "cannot recover the in-progress segment now; its ledger stays IN_RECOVERY, reads are served up to the LAC the live bookies hold, recovery is retried"
        );
        let err = Error::Storage {
            stream: self.name.clone(),
            op: "recover in-progress segment (retried later; readable up to the bookies' LAC)",
            source: Box::new(e),
        };
        self.unrecovered = Some(super::writer::Unrecovered {
            seq_no,
            ledger_id,
            readable_last_entry,
            error: super::writer::same_kind(&err),
            retry_at: std::time::Instant::now() + retry_interval,
            retry_interval,
            attempts,
        });
        self.healthy = false;
        self.publish();
        err
    }

    /// Creates the ledger of the stream's next segment (labelled with its stream and sequence
    /// number, keyed by the stream's secret).
    ///
    /// # Errors
    /// `OwnershipLost`; `Metadata` for an unreadable secret; `Storage` (op "create ledger")
    /// when the ledger cannot be created, e.g. fewer writable bookies than the ensemble size.
    pub(super) async fn create_segment_ledger(&mut self) -> Result<SpareLedger> {
        self.check_ownership()?;
        // While a segment is open it is the record's last, so this is the one after it.
        let seq_no = next_seq_no(&self.meta.value);
        let mut custom = BTreeMap::new();
        // The labels the lifecycle sweep finds orphan ledgers by (`sweep.rs`).
        custom.insert(super::LEDGER_LABEL_STREAM.to_string(), self.name.clone());
        custom.insert(super::LEDGER_LABEL_SEGMENT.to_string(), seq_no.to_string());
        let c = &self.config;
        // The ledger's master key comes from the stream's secret; a stream made before
        // secrets existed gets one, stored by the compare-and-set that starts the segment
        // (if that fails, the ledger is an orphan the sweep deletes, as for any failed start).
        let stored_secret = self
            .meta
            .value
            .ledger_secret()
            .map_err(|e| self.meta_err("read ledger secret", e))?;
        let secret = match &stored_secret {
            Some(s) => s.clone(),
            None => quire_ledger::new_ledger_secret(),
        };
        let ledger = self
            .bookkeeper
            .create_ledger(LedgerOptions {
                ensemble_size: c.ensemble_size,
                write_quorum: c.write_quorum,
                ack_quorum: c.ack_quorum,
                password: secret.clone(),
                custom,
            })
            .await
            .map_err(|e| storage(&self.name, "create ledger", e))?;
        Ok(SpareLedger {
            ledger,
            seq_no,
            secret,
        })
    }

    /// Starts a new segment on the spare ledger a roll made ready, else on a new one; its
    /// first record has `first_txid`.
    pub(super) async fn open_segment(&mut self, first_txid: u64) -> Result<()> {
        assert!(self.current.is_none(), "one open segment at a time");
        self.check_ownership()?;
        let seq_no = next_seq_no(&self.meta.value);
        let stored_secret = self
            .meta
            .value
            .ledger_secret()
            .map_err(|e| self.meta_err("read ledger secret", e))?;
        let spare = match self.spare.take() {
            Some(s)
                if s.seq_no == seq_no && stored_secret.as_ref().is_none_or(|k| *k == s.secret) =>
            {
                s
            }
            other => {
                if let Some(s) = other {
                    // Not for this segment after all: an orphan the sweep deletes.
                    tracing::debug!(stream = %self.name, ledger = s.ledger.id().0, "spare ledger not used");
                }
                self.create_segment_ledger().await?
            }
        };
        let SpareLedger { ledger, secret, .. } = spare;
        let mut meta = self.meta.value.clone();
        assert!(
            meta.segments
                .iter()
                .all(|s| s.state == SegmentState::Completed),
            "a new segment follows completed ones only"
        );
        meta.segments.push(SegmentMetadata {
            seq_no,
            ledger_id: ledger.id().0,
            state: SegmentState::InProgress,
            first_txid: Some(first_txid),
            last_txid: None,
            last_entry: None,
            record_count: 0,
            length_bytes: 0,
            completion_time_ms: None,
        });
        if stored_secret.is_none() {
            meta.ledger_secret_hex = Some(quire_metadata::encode_hex(&secret));
        }
        self.cas_stream(meta)
            .await
            .map_err(|e| self.stream_update_err("start segment", e))?;
        tracing::debug!(stream = %self.name, seq_no, ledger = ledger.id().0, "started segment");
        self.current = Some(OpenSegment {
            seq_no,
            ledger,
            next_entry: 0,
            record_count: 0,
            size_bytes: 0,
            last_txid: first_txid,
            last_acked_entry: None,
            opened_at: std::time::Instant::now(),
            last_data_entry: None,
            lac_carried: None,
            last_ack_at: tokio::time::Instant::now(),
        });
        self.publish();
        Ok(())
    }

    /// Closes the open segment's ledger and marks the segment `Completed`. Every add must have
    /// been acknowledged.
    pub(super) async fn complete_current(&mut self) -> Result<()> {
        let Some(seg) = self.current.as_ref() else {
            return Ok(());
        };
        let expected_last = seg.next_entry.checked_sub(1);
        assert_eq!(
            seg.last_acked_entry, expected_last,
            "complete a segment only after all its adds"
        );
        let lm = seg
            .ledger
            .close()
            .await
            .map_err(|e| writer_storage(&self.name, "close ledger", e))?;
        if lm.last_entry != expected_last {
            return Err(Error::Storage {
                stream: self.name.clone(),
                op: "close ledger",
                source: format!(
                    "ledger {} closed at {:?}, expected {:?}",
                    seg.ledger.id(),
                    lm.last_entry,
                    expected_last
                )
                .into(),
            });
        }
        let mut meta = self.meta.value.clone();
        let s = meta
            .segments
            .last_mut()
            .expect("the open segment is in the metadata");
        assert_eq!(s.seq_no, seg.seq_no);
        assert_eq!(s.state, SegmentState::InProgress);
        s.state = SegmentState::Completed;
        s.last_entry = lm.last_entry;
        s.last_txid = Some(seg.last_txid);
        s.record_count = seg.record_count;
        s.length_bytes = lm.length_bytes;
        s.completion_time_ms = Some(self.completion_time_ms());
        if seg.record_count > 0 {
            meta.max_txid = Some(
                meta.max_txid
                    .map_or(seg.last_txid, |m| m.max(seg.last_txid)),
            );
        }
        let (seq_no, records) = (seg.seq_no, seg.record_count);
        // The record shows the segment completed and `describe` stops adding its progress in
        // one step (`set_meta`).
        self.cas_stream(meta)
            .await
            .map_err(|e| self.stream_update_err("complete segment", e))?;
        tracing::debug!(stream = %self.name, seq_no, records, "completed segment");
        self.completed_at.insert(seq_no, std::time::Instant::now());
        self.current = None;
        self.roll_deferred = None;
        self.publish();
        Ok(())
    }
}

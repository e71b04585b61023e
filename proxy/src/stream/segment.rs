//! Log segments (DistributedLog `BKLogWriteHandler`, reduced): a segment is one ledger; the
//! writer starts one by creating its ledger and appending an `InProgress` segment to the stream
//! metadata by compare-and-set, completes it by closing the ledger and marking it `Completed`,
//! and recovers any segment an earlier writer left in progress (fence and close its ledger,
//! read its last entry for the last txid and record count).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use quire_ledger::{LedgerOptions, LedgerWriter};
use quire_metadata::{SegmentMetadata, SegmentState};
use quire_wire::{EntryId, LedgerId};

use super::clock::PastRollPoint;
use super::compress;
use super::labels::{delete_labelled_ledger, LEDGER_LABEL_SEGMENT, LEDGER_LABEL_STREAM};
use super::ownership::Ownership;
use super::record::StreamRecord;
use super::shared::{same_kind, storage, writer_storage};
use super::StreamConfig;
use crate::error::{Error, Result};
use crate::record_set;

/// The segments a stream task holds state for: the one being written, the next one's ledger
/// made ready by a roll, a deferred roll, an earlier writer's segment not yet recovered, and
/// when this writer completed each segment. Owned by the stream task (`writer::Writer`).
pub(super) struct Segments {
    pub(super) current: Option<OpenSegment>,
    /// False after a storage or metadata error: recover before the next append.
    pub(super) healthy: bool,
    /// When (monotonic clock) this writer completed each segment, by seq no: time-based
    /// retention goes by it rather than the stored wall-clock completion time where known, so
    /// that a wall-clock jump does not age them.
    pub(super) completed_at: HashMap<u64, Instant>,
    /// An in-progress segment of an earlier writer that could not be recovered yet: reads are
    /// served up to the LAC its live bookies report, appends fail until a retry succeeds.
    pub(super) unrecovered: Option<Unrecovered>,
    /// The next segment's ledger, made ready by a roll (`SpareLedger`).
    pub(super) spare: Option<SpareLedger>,
    /// Set while the open segment is past its roll point because no new segment could be
    /// started.
    pub(super) roll_deferred: Option<RollDeferred>,
}

/// A roll that could not happen: the next segment's ledger could not be created (fewer
/// writable bookies than the ensemble needs). The open segment keeps taking writes up to the
/// configured overshoot past its roll point; the roll is retried every [`ROLL_RETRY`].
pub(super) struct RollDeferred {
    /// When the roll was first due and could not happen.
    since: Instant,
    /// The last attempt's error.
    error: String,
    attempts: u32,
    retry_at: Instant,
    /// Counts the stream in `quire_proxy_segments_past_roll_point` while this lives.
    _counted: PastRollPoint,
}

/// How often a deferred roll is tried again.
const ROLL_RETRY: Duration = Duration::from_secs(1);

/// A segment left in progress by an earlier writer whose ledger recovery failed (a bookie of
/// its write quorum down with no replacement, a bookie too slow to answer). The ledger stays
/// IN_RECOVERY; the stream task retries with a growing interval, and until then serves reads
/// of the segment up to the LAC the live bookies hold (BookKeeper's read-only open without
/// recovery) and answers appends with the recovery's error.
pub(super) struct Unrecovered {
    pub(super) seq_no: u64,
    pub(super) ledger_id: u64,
    /// The LAC its live bookies reported (BookKeeper `readLastAddConfirmed`): readable end.
    pub(super) readable_last_entry: Option<u64>,
    /// Why the last attempt failed (answered to appends until the next attempt).
    pub(super) error: Error,
    /// When the next attempt may run, and the wait after that one if it fails too.
    pub(super) retry_at: Instant,
    pub(super) retry_interval: Duration,
    pub(super) attempts: u32,
}

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
    /// Write time stamped on the last entry holding records (ms since the Unix epoch).
    pub(super) last_write_time_ms: u64,
    /// Entry and slot of the last record added, if any.
    pub(super) last_record: Option<(u64, u32)>,
}

impl OpenSegment {
    /// The write time for the next entry: this proxy's wall clock, but never below the last
    /// one stamped, so that write times never decrease along the stream (positions by time
    /// search them) even when the wall clock steps back.
    pub(super) fn next_write_time_ms(&self) -> u64 {
        super::shared::now_ms().max(self.last_write_time_ms)
    }
}

/// The write time for a stream's next entry when no segment is open: this proxy's wall clock,
/// never below the write times its segments recorded (see [`OpenSegment::next_write_time_ms`]).
pub(super) fn write_time_floor_ms(meta: &quire_metadata::StreamMetadata) -> u64 {
    let recorded = meta
        .segments
        .iter()
        .filter_map(|s| s.last_write_time_ms.or(s.first_write_time_ms))
        .max()
        .unwrap_or(0);
    super::shared::now_ms().max(recorded)
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
    /// The stream's own placement it was made under (`None`: the proxy's); a spare made
    /// before a `SET_PLACEMENT` is not used, so a change applies from the next segment.
    pub(super) placement: Option<quire_metadata::StreamPlacement>,
}

/// What recovery learns from the end of a segment's ledger.
#[derive(Debug, Default)]
struct SegmentEnd {
    last_txid: Option<u64>,
    record_count: u64,
    /// Write time of the last record (version 3 entries only).
    last_write_time_ms: Option<u64>,
    /// Entry and slot of the last record.
    last_record: Option<(u64, u32)>,
    /// The last entry is the end-of-stream marker.
    end_of_stream: bool,
}

/// Entries recovery reads back from the last one to find the last record: a control entry
/// follows a data entry directly, and the end-of-stream marker follows at most one control
/// entry, so the last record is at most two entries before the last one.
const SEGMENT_END_LOOKBACK: u64 = 3;

/// Reads a recovered segment's last entry (and, when that holds no record, the few entries
/// before it) for the record count, last txid, last write time and last record's position.
///
/// # Errors
/// `Storage` when an entry cannot be read or decoded.
async fn read_segment_end(rec: &StreamRecord, ledger_id: u64, last: u64) -> Result<SegmentEnd> {
    let reader = rec
        .bookkeeper
        .open_ledger(LedgerId(ledger_id))
        .await
        .map_err(|e| storage(&rec.name, "open ledger", e))?;
    let mut end = SegmentEnd::default();
    for entry in (last.saturating_sub(SEGMENT_END_LOOKBACK)..=last).rev() {
        let payload = reader
            .read(EntryId(entry))
            .await
            .map_err(|e| storage(&rec.name, "read last entry", e))?;
        let payload = compress::plain_entry(&rec.name, ledger_id, entry, &payload)?;
        let set = record_set::decode(&payload).map_err(|e| Error::Storage {
            stream: rec.name.clone(),
            op: "decode last entry",
            source: format!("ledger {ledger_id} entry {entry}: {e}").into(),
        })?;
        if entry == last {
            // A data entry's last record, or a control entry's record of it.
            end.last_txid = set.last_txid();
            end.record_count = set.segment_record_index + set.records.len() as u64;
            end.end_of_stream = set.end_of_stream;
        }
        if !set.records.is_empty() {
            let slot = u32::try_from(set.records.len() - 1).expect("bounded by entry size");
            end.last_record = Some((entry, slot));
            end.last_write_time_ms = set.write_time_ms;
            break;
        }
        if set.segment_record_index == 0 {
            break; // no record before it in the segment
        }
    }
    Ok(end)
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

impl Segments {
    /// Publishes the record's segments to readers with the open segment's LAC and an
    /// unrecovered segment's readable end (see [`StreamRecord::publish`]).
    pub(super) fn publish(&self, rec: &StreamRecord) {
        rec.publish(
            self.current
                .as_ref()
                .map(|c| (c.seq_no, c.last_acked_entry)),
            self.unrecovered
                .as_ref()
                .map(|u| (u.seq_no, u.readable_last_entry)),
        );
    }

    /// Recovers every `InProgress` segment: fence and close its ledger, learn its end from the
    /// last entry, mark it `Completed`. Afterwards the writer is healthy with no open segment.
    ///
    /// A segment whose ledger recovery fails is left `InProgress` (its ledger IN_RECOVERY):
    /// the failure is logged, kept in `self.unrecovered` with the LAC the live bookies report
    /// (readers are served up to it) and the time of the next attempt, which grows from 1 s
    /// to 30 s; until then this method fails at once with the same error.
    pub(super) async fn recover(&mut self, rec: &mut StreamRecord, own: &Ownership) -> Result<()> {
        if let Some(u) = &self.unrecovered {
            if quire_clock::now() < u.retry_at {
                return Err(same_kind(&u.error));
            }
        }
        self.current = None;
        let fresh = rec
            .metadata
            .read_stream(&rec.name)
            .await
            .map_err(|e| rec.meta_err("read stream", e))?;
        rec.set_meta(fresh);
        let mut changed = false;
        let mut meta = rec.meta.value.clone();
        for seg in meta
            .segments
            .iter_mut()
            .filter(|s| s.state == SegmentState::InProgress)
        {
            let lm = match rec.bookkeeper.recover_ledger(LedgerId(seg.ledger_id)).await {
                Ok(lm) => lm,
                Err(e) => {
                    return Err(self
                        .recovery_failed(rec, seg.seq_no, seg.ledger_id, e)
                        .await)
                }
            };
            let end = match lm.last_entry {
                None => SegmentEnd::default(),
                Some(last) => read_segment_end(rec, seg.ledger_id, last).await?,
            };
            let (last_txid, record_count) = (end.last_txid, end.record_count);
            tracing::info!(stream = %rec.name, seq_no = seg.seq_no, ledger = seg.ledger_id, last_entry = ?lm.last_entry, record_count, "recovered in-progress segment");
            if let Some(u) = self.unrecovered.take() {
                tracing::info!(stream = %rec.name, seq_no = u.seq_no, ledger = u.ledger_id, attempts = u.attempts + 1, "segment recovered after failed attempts");
            }
            seg.state = SegmentState::Completed;
            seg.last_entry = lm.last_entry;
            seg.last_txid = last_txid.or(seg.first_txid);
            seg.record_count = record_count;
            seg.length_bytes = lm.length_bytes;
            seg.completion_time_ms = None; // stamped below, on the store's clock
            seg.last_write_time_ms = end.last_record.and(end.last_write_time_ms);
            seg.last_record_entry = end.last_record.map(|(e, _)| e);
            seg.last_record_slot = end.last_record.map(|(_, k)| k);
            if end.end_of_stream {
                // A seal whose completion did not reach the record: the marker is in the log.
                meta.sealed = true;
            }
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
            rec.sample_store_clock(own).await?;
            let now = rec.completion_time_ms();
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
            rec.cas_stream(meta)
                .await
                .map_err(|e| own.update_err("complete recovered segment", e))?;
        }
        self.healthy = true;
        self.unrecovered = None;
        self.publish(rec);
        Ok(())
    }

    /// A segment's ledger recovery failed: note it (see [`Writer::recover`]), find the LAC the
    /// live bookies hold so that readers can go on up to it, and return the error for the
    /// caller.
    async fn recovery_failed(
        &mut self,
        rec: &StreamRecord,
        seq_no: u64,
        ledger_id: u64,
        e: quire_ledger::Error,
    ) -> Error {
        const RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
        const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);
        let previous = self.unrecovered.take().filter(|u| u.seq_no == seq_no);
        // BookKeeper's read-only open without recovery: any LAC a bookie reports was confirmed.
        let lac = match rec.bookkeeper.open_ledger(LedgerId(ledger_id)).await {
            Ok(reader) => reader.read_lac().await.map(|l| l.map(|e| e.0)),
            Err(err) => Err(err),
        };
        let readable_last_entry = match lac {
            Ok(l) => l.max(previous.as_ref().and_then(|u| u.readable_last_entry)),
            Err(err) => {
                tracing::warn!(stream = %rec.name, seq_no, ledger = ledger_id, error = %err, "cannot read the LAC of an unrecovered segment");
                previous.as_ref().and_then(|u| u.readable_last_entry)
            }
        };
        let (attempts, retry_interval) = match &previous {
            Some(u) => (u.attempts + 1, (u.retry_interval * 2).min(RETRY_MAX)),
            None => (1, RETRY_FIRST),
        };
        tracing::warn!(
            stream = %rec.name,
            seq_no,
            ledger = ledger_id,
            error = %e,
            attempts,
            readable_last_entry = ?readable_last_entry,
            retry_in_ms = retry_interval.as_millis() as u64,
            "cannot recover the in-progress segment now; its ledger stays IN_RECOVERY, reads are served up to the LAC the live bookies hold, recovery is retried"
        );
        let err = Error::Storage {
            stream: rec.name.clone(),
            op: "recover in-progress segment (retried later; readable up to the bookies' LAC)",
            source: Box::new(e),
        };
        self.unrecovered = Some(Unrecovered {
            seq_no,
            ledger_id,
            readable_last_entry,
            error: same_kind(&err),
            retry_at: quire_clock::now() + retry_interval,
            retry_interval,
            attempts,
        });
        self.healthy = false;
        self.publish(rec);
        err
    }

    /// Creates the ledger of the stream's next segment (labelled with its stream and sequence
    /// number, keyed by the stream's secret), placed by the stream's own placement when it has
    /// one (its policy and regions, recorded in the ledger's metadata for every later
    /// replacement, and its quorum when it names one), else the proxy's `[ledger]` settings
    /// and quorum.
    ///
    /// # Errors
    /// `OwnershipLost`; `Metadata` for an unreadable secret; `Storage` (op "create ledger")
    /// when the ledger cannot be created, e.g. fewer writable bookies than the ensemble size,
    /// or a placement whose enforced rule cannot be kept (`placement: ...`).
    pub(super) async fn create_segment_ledger(
        &self,
        rec: &StreamRecord,
        own: &Ownership,
    ) -> Result<SpareLedger> {
        own.check()?;
        // While a segment is open it is the record's last, so this is the one after it.
        let seq_no = next_seq_no(&rec.meta.value);
        let mut custom = BTreeMap::new();
        // The labels the lifecycle sweep finds orphan ledgers by (`sweep.rs`).
        custom.insert(LEDGER_LABEL_STREAM.to_string(), rec.name.clone());
        custom.insert(LEDGER_LABEL_SEGMENT.to_string(), seq_no.to_string());
        let c = &rec.config;
        let placement = rec.meta.value.placement.clone();
        let (ensemble_size, write_quorum, ack_quorum) = match &placement {
            Some(p) => {
                // Read by the ledger client to place this ledger and every later replacement.
                p.record(&mut custom);
                p.quorum
                    .map_or((c.ensemble_size, c.write_quorum, c.ack_quorum), |q| {
                        (q.ensemble_size, q.write_quorum, q.ack_quorum)
                    })
            }
            None => (c.ensemble_size, c.write_quorum, c.ack_quorum),
        };
        // The ledger's master key comes from the stream's secret; a stream made before
        // secrets existed gets one, stored by the compare-and-set that starts the segment
        // (if that fails, the ledger is an orphan the sweep deletes, as for any failed start).
        let stored_secret = rec
            .meta
            .value
            .ledger_secret()
            .map_err(|e| rec.meta_err("read ledger secret", e))?;
        let secret = match &stored_secret {
            Some(s) => s.clone(),
            None => quire_ledger::new_ledger_secret(),
        };
        let ledger = rec
            .bookkeeper
            .create_ledger(LedgerOptions {
                ensemble_size,
                write_quorum,
                ack_quorum,
                password: secret.clone(),
                custom,
            })
            .await
            .map_err(|e| storage(&rec.name, "create ledger", e))?;
        Ok(SpareLedger {
            ledger,
            seq_no,
            secret,
            placement,
        })
    }

    /// Starts a new segment on the spare ledger a roll made ready, else on a new one; its
    /// first record has `first_txid`.
    pub(super) async fn open_segment(
        &mut self,
        rec: &mut StreamRecord,
        own: &Ownership,
        first_txid: u64,
        first_write_time_ms: u64,
    ) -> Result<()> {
        assert!(self.current.is_none(), "one open segment at a time");
        own.check()?;
        let started = quire_clock::now();
        let seq_no = next_seq_no(&rec.meta.value);
        let stored_secret = rec
            .meta
            .value
            .ledger_secret()
            .map_err(|e| rec.meta_err("read ledger secret", e))?;
        let spare = match self.spare.take() {
            Some(s)
                if s.seq_no == seq_no
                    && stored_secret.as_ref().is_none_or(|k| *k == s.secret)
                    && s.placement == rec.meta.value.placement =>
            {
                s
            }
            other => {
                if let Some(s) = other {
                    // Not for this segment after all: an orphan the sweep deletes.
                    tracing::debug!(stream = %rec.name, ledger = s.ledger.id().0, "spare ledger not used");
                }
                self.create_segment_ledger(rec, own).await?
            }
        };
        let SpareLedger { ledger, secret, .. } = spare;
        let mut meta = rec.meta.value.clone();
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
            first_write_time_ms: Some(first_write_time_ms),
            last_write_time_ms: None,
            last_record_entry: None,
            last_record_slot: None,
        });
        if stored_secret.is_none() {
            meta.ledger_secret_hex = Some(quire_metadata::encode_hex(&secret));
        }
        rec.cas_stream(meta)
            .await
            .map_err(|e| own.update_err("start segment", e))?;
        // Fault point (docs/fault-points.md): the writer dies with the new segment's ledger
        // and in-progress record made but no entry added (DistributedLog's empty segment).
        quire_faults::crash("proxy.segment.after_create");
        let ms = quire_clock::elapsed(started).as_millis() as u64;
        tracing::debug!(stream = %rec.name, seq_no, ledger = ledger.id().0, ms, "started segment");
        self.current = Some(OpenSegment {
            seq_no,
            ledger,
            next_entry: 0,
            record_count: 0,
            size_bytes: 0,
            last_txid: first_txid,
            last_acked_entry: None,
            opened_at: quire_clock::now(),
            last_data_entry: None,
            lac_carried: None,
            last_ack_at: tokio::time::Instant::now(),
            last_write_time_ms: first_write_time_ms,
            last_record: None,
        });
        self.publish(rec);
        Ok(())
    }

    /// Closes the open segment's ledger and marks the segment `Completed`. Every add must have
    /// been acknowledged.
    pub(super) async fn complete_current(
        &mut self,
        rec: &mut StreamRecord,
        own: &Ownership,
    ) -> Result<()> {
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
            .map_err(|e| writer_storage(&rec.name, "close ledger", e))?;
        if lm.last_entry != expected_last {
            return Err(Error::Storage {
                stream: rec.name.clone(),
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
        let mut meta = rec.meta.value.clone();
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
        s.completion_time_ms = Some(rec.completion_time_ms());
        if let Some((entry, slot)) = seg.last_record {
            s.last_write_time_ms = Some(seg.last_write_time_ms);
            s.last_record_entry = Some(entry);
            s.last_record_slot = Some(slot);
        }
        if seg.record_count > 0 {
            meta.max_txid = Some(
                meta.max_txid
                    .map_or(seg.last_txid, |m| m.max(seg.last_txid)),
            );
        }
        let (seq_no, records) = (seg.seq_no, seg.record_count);
        // The record shows the segment completed and `describe` stops adding its progress in
        // one step (`set_meta`).
        rec.cas_stream(meta)
            .await
            .map_err(|e| own.update_err("complete segment", e))?;
        tracing::debug!(stream = %rec.name, seq_no, records, "completed segment");
        self.completed_at.insert(seq_no, quire_clock::now());
        self.current = None;
        self.roll_deferred = None;
        self.publish(rec);
        Ok(())
    }

    /// A writer with nothing open, healthy until a failure.
    pub(super) fn new() -> Self {
        Self {
            current: None,
            healthy: true,
            completed_at: HashMap::new(),
            unrecovered: None,
            spare: None,
            roll_deferred: None,
        }
    }

    /// True when a segment left in progress by an earlier writer could not be recovered yet
    /// (the stream is served anyway: see [`Unrecovered`]).
    pub(super) fn serves_unrecovered(&self) -> bool {
        self.unrecovered.is_some()
    }

    /// True when an unrecovered segment's next recovery attempt is due.
    pub(super) fn recovery_retry_due(&self) -> bool {
        self.unrecovered
            .as_ref()
            .is_some_and(|u| quire_clock::now() >= u.retry_at)
    }

    /// The writer is dead after a storage or metadata error: dropping the ledger writer
    /// abandons its pending adds; the segment stays InProgress in the metadata and is
    /// recovered (fenced and closed) before the next append.
    pub(super) fn fail(&mut self) {
        self.current = None;
        self.healthy = false;
        self.roll_deferred = None;
    }

    /// True when the open segment is at its roll point: its size reached, or (holding a
    /// record) its age.
    pub(super) fn roll_due(&self, config: &StreamConfig) -> bool {
        self.current.as_ref().is_some_and(|seg| {
            seg.size_bytes >= config.segment_size_bytes_max
                || (seg.record_count > 0
                    && config
                        .segment_roll_interval
                        .is_some_and(|i| quire_clock::elapsed(seg.opened_at) >= i))
        })
    }

    /// True while a deferred roll waits for its next attempt ([`ROLL_RETRY`]).
    pub(super) fn roll_waits(&self) -> bool {
        self.roll_deferred
            .as_ref()
            .is_some_and(|d| quire_clock::now() < d.retry_at)
    }

    /// Notes a roll that could not happen because the next segment's ledger could not be
    /// created (see `Writer::roll`); counted in `quire_proxy_segment_roll_deferred_total` and,
    /// while it lasts, `quire_proxy_segments_past_roll_point`.
    pub(super) fn defer_roll(&mut self, rec: &StreamRecord, e: &Error) {
        let now = quire_clock::now();
        let retry_at = now + ROLL_RETRY;
        match &mut self.roll_deferred {
            Some(d) => {
                d.attempts += 1;
                d.retry_at = retry_at;
                d.error = e.to_string();
                tracing::debug!(stream = %rec.name, error = %e, attempts = d.attempts, "segment roll still deferred");
            }
            None => {
                let seg = self.current.as_ref().expect("a roll needs an open segment");
                tracing::warn!(
                    stream = %rec.name,
                    seq_no = seg.seq_no,
                    size_bytes = seg.size_bytes,
                    error = %e,
                    "cannot start the next segment; the roll is deferred and the segment keeps taking writes (up to segment_roll_overshoot_bytes / _secs past its roll point)"
                );
                self.roll_deferred = Some(RollDeferred {
                    since: now,
                    error: e.to_string(),
                    attempts: 1,
                    retry_at,
                    _counted: PastRollPoint::new(rec.layer.clone()),
                });
            }
        }
    }

    /// Completes the open segment at a roll (every add acknowledged) and logs how long a
    /// deferred roll waited.
    ///
    /// # Errors
    /// What [`Segments::complete_current`] fails with.
    pub(super) async fn complete_at_roll(
        &mut self,
        rec: &mut StreamRecord,
        own: &Ownership,
    ) -> Result<()> {
        let (seq_no, bytes) = self
            .current
            .as_ref()
            .map_or((0, 0), |c| (c.seq_no, c.size_bytes));
        let deferred = self.roll_deferred.take();
        self.complete_current(rec, own).await?;
        if let Some(d) = deferred {
            tracing::info!(
                stream = %rec.name,
                seq_no,
                size_bytes = bytes,
                deferred_ms = quire_clock::elapsed(d.since).as_millis() as u64,
                attempts = d.attempts,
                "segment rolled after its roll was deferred"
            );
        }
        Ok(())
    }

    /// True when the open segment's roll is deferred and the segment is past its roll point
    /// by [`StreamConfig::segment_roll_overshoot_bytes_max`] or
    /// [`StreamConfig::segment_roll_overshoot_time_max`]: it takes nothing more until it rolls.
    pub(super) fn past_overshoot(&self, c: &StreamConfig) -> bool {
        let (Some(seg), Some(d)) = (&self.current, &self.roll_deferred) else {
            return false;
        };
        let bytes_over = seg.size_bytes.saturating_sub(c.segment_size_bytes_max);
        let due_at = c.segment_roll_interval.map(|i| seg.opened_at + i);
        let time_over = due_at.map(quire_clock::elapsed);
        let over_bytes = bytes_over >= c.segment_roll_overshoot_bytes_max;
        let over_time = time_over.is_some_and(|t| t >= c.segment_roll_overshoot_time_max)
            || quire_clock::elapsed(d.since) >= c.segment_roll_overshoot_time_max;
        over_bytes || over_time
    }

    /// The refusal of a write while [`Segments::past_overshoot`] holds (`Storage`: nothing
    /// written, retry later).
    pub(super) fn overshoot_refusal(&self, rec: &StreamRecord) -> Error {
        let (seg, d) = (
            self.current.as_ref().expect("still open"),
            self.roll_deferred.as_ref().expect("still deferred"),
        );
        Error::Storage {
            stream: rec.name.clone(),
            op: "write past a deferred segment roll",
            source: format!(
                "segment {} holds {} bytes and has waited {} s for its roll, at the bound (segment_roll_overshoot_bytes {}, segment_roll_overshoot_secs {}), and no new segment can be started: {}; nothing of this write was written, retry once enough bookies are writable",
                seg.seq_no,
                seg.size_bytes,
                quire_clock::elapsed(d.since).as_secs(),
                rec.config.segment_roll_overshoot_bytes_max,
                rec.config.segment_roll_overshoot_time_max.as_secs(),
                d.error
            )
            .into(),
        }
    }

    /// Gives a spare ledger back: its metadata is deleted (it was never written). Done when
    /// no segment is open after a batch or a lifecycle check (the next segment creates its
    /// own ledger then), so that no ledger outlives the roll that made it unlisted. Failures
    /// leave an orphan for the sweep.
    pub(super) async fn discard_spare(&mut self, rec: &StreamRecord) {
        if let Some(s) = self.spare.take() {
            let id = s.ledger.id().0;
            drop(s);
            delete_labelled_ledger(&*rec.metadata, &rec.name, id).await;
        }
    }

    /// The position just past the last acknowledged entry of the stream (where the next record
    /// will be readable from at the latest), or `None` if the stream holds no entry.
    pub(super) fn end_position(&self, rec: &StreamRecord) -> Option<crate::dlsn::Dlsn> {
        for s in rec.meta.value.segments.iter().rev() {
            let last = match &self.current {
                Some(c) if c.seq_no == s.seq_no => c.last_acked_entry,
                _ if s.state == SegmentState::Completed => s.last_entry,
                _ => None,
            };
            if let Some(last) = last {
                return Some(crate::dlsn::Dlsn::new(s.seq_no, last + 1, 0));
            }
        }
        None
    }
}

//! The stream task (DistributedLog `BKAsyncLogWriter`, reduced): it owns the stream's writer
//! state, takes appends from the queue, checks their txids, packs their records into record-set
//! entries, sends them without waiting while fewer than `adds_in_flight_max` are outstanding,
//! and answers appends strictly in submission order as their entries are acknowledged; a failed
//! add fails every append still unanswered with the same kind of error.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use quire_ledger::{AddFuture, BookKeeper};
use quire_metadata::{MetadataStore, StreamLease, StreamMetadata, Versioned};
use quire_wire::EntryId;
use tokio::sync::{mpsc, oneshot, watch};

use super::clock::{LayerStats, PastRollPoint};
use super::ownership::lease_lost;
use super::segment::{OpenSegment, SpareLedger};
use super::tail_cache::TailState;
use super::{writer_storage, StreamConfig, StreamShared};
use crate::dlsn::Dlsn;
use crate::error::{Error, Result};
use crate::record_set::{
    self, encoded_record_size_bytes, RECORD_SET_HEADER_SIZE_BYTES, RECORD_SIZE_BYTES_MAX,
};
use crate::types::{RetentionChange, TruncateResult, WriteResult};
use quire_metadata::RetentionOverride;

pub(super) enum Command {
    Append {
        records: Vec<(u64, Vec<u8>)>,
        reply: oneshot::Sender<Result<WriteResult>>,
    },
    Close {
        reply: oneshot::Sender<Result<()>>,
    },
    /// See [`super::StreamManager::truncate`].
    Truncate {
        before: Dlsn,
        reply: oneshot::Sender<Result<TruncateResult>>,
    },
    /// See [`super::StreamManager::delete_stream`].
    Delete {
        reply: oneshot::Sender<Result<u32>>,
    },
    /// See [`super::StreamManager::sweep`]: the lifecycle tick, then the orphan ledgers among
    /// the candidates; with `release_unless_used`, the stream is given up afterwards unless
    /// requests beyond that count used it.
    Sweep {
        orphan_candidates: Vec<u64>,
        release_unless_used: Option<u64>,
        reply: oneshot::Sender<Result<super::sweep::StreamSweep>>,
    },
    /// See [`super::StreamManager::set_retention`].
    SetRetention {
        time_secs: RetentionChange,
        size_bytes: RetentionChange,
        reply: oneshot::Sender<Result<RetentionOverride>>,
    },
}

/// One entry add in flight.
pub(super) struct InFlight {
    pub(super) future: AddFuture,
    pub(super) seq_no: u64,
    pub(super) entry: u64,
    pub(super) ledger_id: u64,
    pub(super) payload: Arc<Vec<u8>>,
    /// Records and payload bytes in the segment up to and including this entry.
    pub(super) records_through: u64,
    pub(super) bytes_through: u64,
}

/// An append waiting for its reply. Appends are answered strictly in submission order.
pub(super) struct PendingAppend {
    pub(super) reply: oneshot::Sender<Result<WriteResult>>,
    /// Set when the append was refused before anything was written (answered in its turn).
    pub(super) refused: Option<Error>,
    pub(super) count: u64,
    pub(super) first: Option<Dlsn>,
    pub(super) last: Option<Dlsn>,
    /// True once every record of the append is in an entry that was sent.
    pub(super) issued: bool,
}

impl PendingAppend {
    fn new(
        reply: oneshot::Sender<Result<WriteResult>>,
        count: u64,
        refused: Option<Error>,
    ) -> Self {
        Self {
            reply,
            refused,
            count,
            first: None,
            last: None,
            issued: false,
        }
    }
}

/// An append's records, `(txid, payload)` each.
type Records = Vec<(u64, Vec<u8>)>;

/// An append's records and where its answer goes.
type QueuedAppend = (Records, oneshot::Sender<Result<WriteResult>>);

/// One record waiting to be packed into the next entry: (append id, txid, payload, last
/// record of its append).
type Packed<'a> = (u64, u64, &'a [u8], bool);

/// Checks an append's txids in record order against the txid before each: `last_txid` (the
/// stream's, `None` before its first record) for the first record, the previous record's for
/// the others. Each must not be below it (DistributedLog's `TRANSACTION_OUT_OF_ORDER` rule) nor
/// more than `txid_jump_max` above it (the txid guard, Quire's own; `None`: no guard). Returns
/// the txid of the last record, the stream's last txid once the append is taken.
///
/// # Errors
/// `TxidOutOfOrder` or `TxidTooFarAhead` for the first record that breaks a rule, naming it by
/// its index in `records`.
pub(super) fn check_txids(
    records: &[(u64, Vec<u8>)],
    last_txid: Option<u64>,
    txid_jump_max: Option<u64>,
) -> Result<Option<u64>> {
    let mut prev = last_txid;
    for (i, (txid, _)) in records.iter().enumerate() {
        if let Some(p) = prev {
            if *txid < p {
                return Err(Error::TxidOutOfOrder {
                    record_index: i,
                    txid: *txid,
                    last_txid: p,
                });
            }
            // A txid far above the one before it would leave the stream refusing every later
            // normal txid as out of order.
            if let Some(jump_max) = txid_jump_max {
                if *txid - p > jump_max {
                    return Err(Error::TxidTooFarAhead {
                        record_index: i,
                        txid: *txid,
                        last_txid: p,
                        txid_jump_max: jump_max,
                    });
                }
            }
        }
        prev = Some(*txid);
    }
    Ok(prev)
}

/// The same kind of error as `e`, for every later append that fails with it.
pub(super) fn same_kind(e: &Error) -> Error {
    match e {
        Error::Storage { stream, op, source } => Error::Storage {
            stream: stream.clone(),
            op,
            source: source.to_string().into(),
        },
        Error::Metadata { stream, op, source } => Error::Metadata {
            stream: stream.clone(),
            op,
            source: source.to_string().into(),
        },
        Error::OwnershipLost { stream, reason } => Error::OwnershipLost {
            stream: stream.clone(),
            reason: reason.clone(),
        },
        Error::NoSuchStream { stream } => Error::NoSuchStream {
            stream: stream.clone(),
        },
        Error::ShuttingDown => Error::ShuttingDown,
        other => Error::Internal(other.to_string()),
    }
}

/// Waits for the oldest add in flight; never resolves when none is.
async fn oldest_add(
    entries: &mut VecDeque<InFlight>,
) -> std::result::Result<EntryId, quire_ledger::Error> {
    match entries.front_mut() {
        Some(f) => (&mut f.future).await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`; never resolves for `None`.
async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A stream's writer state, owned by its task.
pub(super) struct Writer {
    pub(super) name: String,
    pub(super) metadata: Arc<dyn MetadataStore>,
    pub(super) bookkeeper: BookKeeper,
    pub(super) config: Arc<StreamConfig>,
    pub(super) meta: Versioned<StreamMetadata>,
    pub(super) current: Option<OpenSegment>,
    /// Highest txid acknowledged or in flight (the order rule and the txid guard are checked
    /// against it). Set only through [`Writer::set_last_txid`], which publishes it.
    pub(super) last_txid: Option<u64>,
    /// False after a storage or metadata error: recover before the next append.
    pub(super) healthy: bool,
    pub(super) closed: bool,
    pub(super) tail: watch::Sender<TailState>,
    pub(super) shared: Arc<StreamShared>,
    /// The stream's lease while this writer holds it.
    pub(super) lease: Option<StreamLease>,
    /// Entry adds sent and not yet acknowledged, in entry order (all in the open segment).
    pub(super) entries: VecDeque<InFlight>,
    /// Appends taken from the queue and not yet answered, in submission order.
    pub(super) appends: VecDeque<PendingAppend>,
    /// Id of `appends.front()`; ids count every append this writer took.
    pub(super) appends_base: u64,
    /// (segment seq no, entry id) of the last entry acknowledged.
    pub(super) acked: Option<(u64, u64)>,
    /// When (monotonic clock) this writer completed each segment, by seq no: time-based
    /// retention goes by it rather than the stored wall-clock completion time where known, so
    /// that a wall-clock jump does not age them.
    pub(super) completed_at: std::collections::HashMap<u64, std::time::Instant>,
    /// An in-progress segment of an earlier writer that could not be recovered yet: reads are
    /// served up to the LAC its live bookies report, appends fail until a retry succeeds.
    pub(super) unrecovered: Option<Unrecovered>,
    /// The next segment's ledger, made ready by a roll (`SpareLedger`).
    pub(super) spare: Option<SpareLedger>,
    /// Set while the open segment is past its roll point because no new segment could be
    /// started.
    pub(super) roll_deferred: Option<RollDeferred>,
    /// The proxy-wide clock sample and counters.
    pub(super) layer: Arc<LayerStats>,
}

/// A roll that could not happen: the next segment's ledger could not be created (fewer
/// writable bookies than the ensemble needs). The open segment keeps taking writes up to the
/// configured overshoot past its roll point; the roll is retried every [`ROLL_RETRY`].
pub(super) struct RollDeferred {
    /// When the roll was first due and could not happen.
    since: std::time::Instant,
    /// The last attempt's error.
    error: String,
    attempts: u32,
    retry_at: std::time::Instant,
    /// Counts the stream in `quire_proxy_segments_past_roll_point` while this lives.
    _counted: PastRollPoint,
}

/// How often a deferred roll is tried again.
const ROLL_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

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
    pub(super) retry_at: std::time::Instant,
    pub(super) retry_interval: std::time::Duration,
    pub(super) attempts: u32,
}

impl Writer {
    /// The stream task. It takes appends from the queue while fewer than
    /// `adds_in_flight_max` entry adds are outstanding, packs each (with the appends queued
    /// behind it, up to `entry_size_bytes_target`) into entries, sends them at once and takes
    /// the next append without waiting; acknowledgements are handled as they arrive, in entry
    /// order, and each append is answered once the entry holding its last record is
    /// acknowledged (DistributedLog `BKAsyncLogWriter`: many outstanding writes per stream,
    /// transmitted in entries, acknowledged in order).
    pub(super) async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut lost_rx = self.lease.as_ref().map(|l| l.lost.clone());
        let mut stashed: Option<Command> = None;
        enum Event {
            Acked(std::result::Result<EntryId, quire_ledger::Error>),
            Lost(String),
            Command(Option<Command>),
            Tick,
            AdvanceLac,
        }
        let mut tick = tokio::time::interval(self.config.lifecycle_check_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let accepting = self.entries.len() < self.config.adds_in_flight_max;
            let event = match stashed.take() {
                Some(cmd) if accepting => Event::Command(Some(cmd)),
                held => {
                    stashed = held;
                    let take = accepting && stashed.is_none();
                    let advance_at = self.lac_advance_due();
                    // The lifecycle tick goes first: it is ready once per interval, and after
                    // the commands it would starve under a steady stream of appends.
                    tokio::select! {
                        biased;
                        _ = tick.tick() => Event::Tick,
                        r = oldest_add(&mut self.entries) => Event::Acked(r),
                        reason = lease_lost(&mut lost_rx) => Event::Lost(reason),
                        cmd = commands.recv(), if take => Event::Command(cmd),
                        _ = sleep_until_opt(advance_at) => Event::AdvanceLac,
                    }
                }
            };
            match event {
                Event::Acked(r) => {
                    let f = self.entries.pop_front().expect("an add was awaited");
                    if let Err(e) = self.on_acked(f, r) {
                        if !self.on_write_failure(e).await {
                            break;
                        }
                    }
                }
                Event::Lost(reason) => {
                    tracing::warn!(stream = %self.name, %reason, "stream ownership lost");
                    // Adds already sent finish first (their outcome is the bookies' to decide).
                    if self.drain().await {
                        self.lose(reason).await;
                    }
                    break;
                }
                Event::Command(None) => {
                    // The manager is gone without a shutdown: give the lease up so another proxy
                    // can take over; the segment stays in progress for it to recover, as after a
                    // crash.
                    self.drain().await;
                    self.release_lease().await;
                    break;
                }
                Event::Command(Some(Command::Close { reply })) => {
                    if !self.drain().await {
                        let _ = reply.send(Ok(()));
                        break;
                    }
                    let r = if self.healthy {
                        self.complete_current().await
                    } else {
                        Ok(())
                    };
                    self.discard_spare().await;
                    if r.is_err() {
                        self.fail();
                    }
                    self.closed = true;
                    lost_rx = None;
                    self.release_lease().await;
                    let _ = reply.send(r);
                }
                Event::Tick => {
                    if !self.closed && !self.on_tick().await {
                        break;
                    }
                }
                Event::AdvanceLac => {
                    if let Err(e) = self.send_control_entry() {
                        if !self.on_write_failure(e).await {
                            break;
                        }
                    }
                }
                Event::Command(Some(Command::Truncate { before, reply })) => {
                    let (r, go_on) = self.truncate(before).await;
                    let _ = reply.send(r);
                    if !go_on {
                        break;
                    }
                }
                Event::Command(Some(Command::SetRetention {
                    time_secs,
                    size_bytes,
                    reply,
                })) => {
                    let (r, go_on) = self.set_retention(time_secs, size_bytes).await;
                    let _ = reply.send(r);
                    if !go_on {
                        break;
                    }
                }
                Event::Command(Some(Command::Delete { reply })) => {
                    let (r, go_on) = self.delete_stream().await;
                    let _ = reply.send(r);
                    if !go_on {
                        break;
                    }
                }
                Event::Command(Some(Command::Sweep {
                    orphan_candidates,
                    release_unless_used,
                    reply,
                })) => {
                    let (r, go_on) = if self.closed {
                        (Err(Error::ShuttingDown), true)
                    } else {
                        self.sweep(orphan_candidates).await
                    };
                    let ok = r.is_ok();
                    // Give back a stream acquired only for the sweep: nothing queued, nothing
                    // in flight, no segment open and no request since the acquisition. Done
                    // before the sweep is answered, so its caller sees the stream given back.
                    let unused = release_unless_used
                        .is_some_and(|n| self.shared.requests.load(Ordering::SeqCst) == n);
                    if go_on
                        && ok
                        && unused
                        && stashed.is_none()
                        && commands.is_empty()
                        && self.entries.is_empty()
                        && self.appends.is_empty()
                        && self.current.is_none()
                    {
                        self.release_after_sweep().await;
                        let _ = reply.send(r);
                        break;
                    }
                    let _ = reply.send(r);
                    if !go_on {
                        break;
                    }
                }
                Event::Command(Some(Command::Append { records, reply })) => {
                    if self.closed {
                        let _ = reply.send(Err(Error::ShuttingDown));
                        continue;
                    }
                    // Group the appends queued right now, up to about one entry's worth.
                    let target = self.config.entry_size_bytes_target;
                    let mut size: usize = records
                        .iter()
                        .map(|(_, p)| encoded_record_size_bytes(p.len()))
                        .sum();
                    let mut batch = vec![(records, reply)];
                    while size < target {
                        match commands.try_recv() {
                            Ok(Command::Append { records, reply }) => {
                                size += records
                                    .iter()
                                    .map(|(_, p)| encoded_record_size_bytes(p.len()))
                                    .sum::<usize>();
                                batch.push((records, reply));
                            }
                            Ok(other) => {
                                stashed = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    if !self.append_batch(batch).await {
                        break;
                    }
                }
            }
        }
        // After a loss: answer what is queued, then end (dropping the readers' view).
        let reason = self.shared.lost.lock().expect("lost lock").clone();
        if let Some(reason) = reason {
            let deleted = self.shared.deleted.load(Ordering::SeqCst);
            commands.close();
            let mut rest: Vec<Command> = stashed.into_iter().collect();
            while let Some(cmd) = commands.recv().await {
                rest.push(cmd);
            }
            for cmd in rest {
                match cmd {
                    Command::Append { reply, .. } if deleted => {
                        let _ = reply.send(Err(self.gone()));
                    }
                    Command::Append { reply, .. } => {
                        self.shared.loss_reported.store(true, Ordering::SeqCst);
                        let _ = reply.send(Err(Error::OwnershipLost {
                            stream: self.name.clone(),
                            reason: reason.clone(),
                        }));
                    }
                    Command::Close { reply } => {
                        let _ = reply.send(Ok(()));
                    }
                    Command::Truncate { reply, .. } => {
                        let _ = reply.send(Err(self.ended(deleted, &reason)));
                    }
                    Command::SetRetention { reply, .. } => {
                        let _ = reply.send(Err(self.ended(deleted, &reason)));
                    }
                    Command::Delete { reply } => {
                        let _ = reply.send(Err(self.ended(deleted, &reason)));
                    }
                    Command::Sweep { reply, .. } => {
                        let _ = reply.send(Err(self.ended(deleted, &reason)));
                    }
                }
            }
        }
        tracing::debug!(stream = %self.name, "stream task ends");
    }

    /// `NoSuchStream` for this stream.
    pub(super) fn gone(&self) -> Error {
        Error::NoSuchStream {
            stream: self.name.clone(),
        }
    }

    /// The answer to a command that arrived after the task gave the stream up.
    fn ended(&self, deleted: bool, reason: &str) -> Error {
        if deleted {
            self.gone()
        } else {
            Error::OwnershipLost {
                stream: self.name.clone(),
                reason: reason.to_string(),
            }
        }
    }

    /// Sends one answer; an `OwnershipLost` answer counts as the loss being reported.
    fn answer(&self, reply: oneshot::Sender<Result<WriteResult>>, r: Result<WriteResult>) {
        if matches!(r, Err(Error::OwnershipLost { .. })) {
            self.shared.loss_reported.store(true, Ordering::SeqCst);
        }
        let _ = reply.send(r);
    }

    /// Answers the appends at the front of the queue that are done: refused ones, and written
    /// ones whose last entry is acknowledged.
    fn answer_ready(&mut self) {
        while let Some(a) = self.appends.front() {
            let ready = a.refused.is_some()
                || (a.issued
                    && a.last.is_some_and(|l| {
                        self.acked
                            .is_some_and(|k| (l.segment_seq_no, l.entry_id) <= k)
                    }));
            if !ready {
                break;
            }
            let a = self.appends.pop_front().expect("front exists");
            self.appends_base += 1;
            let r = match a.refused {
                Some(e) => Err(e),
                None => Ok(WriteResult {
                    first_dlsn: a.first.expect("issued appends have records"),
                    last_dlsn: a.last.expect("issued appends have records"),
                    count: a.count,
                }),
            };
            self.answer(a.reply, r);
        }
    }

    /// An add failed (or a segment could not be started or completed): every append not yet
    /// answered that was written fails with the same kind of error, nothing after the failure
    /// point is acknowledged. Then the writer is dead (recovered before the next append) or,
    /// for `OwnershipLost`, the stream is given up. Returns false in the latter case.
    pub(super) async fn on_write_failure(&mut self, e: Error) -> bool {
        // Dropping the futures abandons the adds; a failed ledger writer fails them all anyway.
        self.entries.clear();
        let lost = match &e {
            Error::OwnershipLost { reason, .. } => Some(reason.clone()),
            _ => None,
        };
        if lost.is_none() {
            tracing::warn!(stream = %self.name, error = %e, pending = self.appends.len(), "write failed; the writer will recover before the next append");
        }
        while let Some(a) = self.appends.pop_front() {
            self.appends_base += 1;
            let r = match a.refused {
                Some(refused) => Err(refused),
                None => Err(same_kind(&e)),
            };
            self.answer(a.reply, r);
        }
        match lost {
            Some(reason) => {
                self.lose(reason).await;
                false
            }
            None => {
                self.fail();
                true
            }
        }
    }

    /// Waits for every add in flight, answering appends as they complete. Returns false if
    /// ownership was lost meanwhile (the stream is given up).
    pub(super) async fn drain(&mut self) -> bool {
        while !self.entries.is_empty() {
            if let Err(e) = self.complete_oldest().await {
                return self.on_write_failure(e).await;
            }
        }
        true
    }

    /// Waits for the oldest add in flight and handles its outcome.
    async fn complete_oldest(&mut self) -> Result<()> {
        let r = oldest_add(&mut self.entries).await;
        let f = self.entries.pop_front().expect("an add was awaited");
        self.on_acked(f, r)
    }

    /// Handles one add's outcome: on success the entry becomes visible to readers (the
    /// published LAC) and the appends it completes are answered.
    fn on_acked(
        &mut self,
        f: InFlight,
        r: std::result::Result<EntryId, quire_ledger::Error>,
    ) -> Result<()> {
        let acked = r.map_err(|e| writer_storage(&self.name, "add entry", e))?;
        assert_eq!(acked.0, f.entry, "adds are acknowledged in entry order");
        let seg = self
            .current
            .as_mut()
            .expect("an add in flight has an open segment");
        assert_eq!(
            seg.seq_no, f.seq_no,
            "adds in flight belong to the open segment"
        );
        assert!(
            seg.last_acked_entry.is_none_or(|l| l + 1 == f.entry),
            "acknowledgements advance one entry at a time"
        );
        seg.last_acked_entry = Some(f.entry);
        seg.last_ack_at = tokio::time::Instant::now();
        let seq = seg.seq_no;
        self.shared.cache.lock().expect("cache lock").insert(
            (f.ledger_id, f.entry),
            f.payload,
            self.config.tail_cache_bytes_max,
        );
        self.tail.send_modify(|t| {
            if let Some(s) = t.segments.iter_mut().find(|s| s.seq_no == seq) {
                s.readable_last_entry = Some(f.entry);
            }
        });
        self.acked = Some((seq, f.entry));
        self.shared.view.lock().expect("view lock").live =
            Some((seq, f.entry, f.records_through, f.bytes_through));
        self.answer_ready();
        Ok(())
    }

    /// Sets the txid the next append is checked against (order rule and txid guard), and
    /// publishes it for `describe`.
    pub(super) fn set_last_txid(&mut self, last_txid: Option<u64>) {
        self.last_txid = last_txid;
        *self.shared.last_txid.lock().expect("last txid lock") = last_txid;
    }

    /// Takes a group of appends queued together: checks ownership, recovers a dead writer,
    /// checks txids, packs the records into entries and sends them. Does not wait for the adds
    /// (except to stay within `adds_in_flight_max` and at a segment roll). Returns false once the
    /// stream was given up.
    async fn append_batch(&mut self, batch: Vec<QueuedAppend>) -> bool {
        if let Err(e) = self.check_ownership() {
            // Adds already sent finish first; then the stream is given up.
            if self.drain().await {
                if let Error::OwnershipLost { reason, .. } = &e {
                    self.lose(reason.clone()).await;
                }
            }
            for (_, reply) in batch {
                self.answer(reply, Err(same_kind(&e)));
            }
            return false;
        }
        if !self.healthy {
            assert!(
                self.entries.is_empty() && self.appends.is_empty(),
                "a dead writer has nothing in flight"
            );
            if let Err(e) = self.recover().await {
                let lost = match &e {
                    Error::OwnershipLost { reason, .. } => Some(reason.clone()),
                    _ => None,
                };
                for (_, reply) in batch {
                    self.answer(reply, Err(same_kind(&e)));
                }
                if let Some(reason) = lost {
                    self.lose(reason).await;
                    return false;
                }
                return true;
            }
        }
        // A segment past its roll point by the most allowed takes nothing more until it rolls.
        match self.past_roll_bound().await {
            Ok(None) => {}
            Ok(Some(refusal)) => {
                for (records, reply) in batch {
                    self.appends.push_back(PendingAppend::new(
                        reply,
                        records.len() as u64,
                        Some(same_kind(&refusal)),
                    ));
                }
                self.answer_ready();
                return true;
            }
            Err(e) => {
                for (records, reply) in batch {
                    self.appends.push_back(PendingAppend::new(
                        reply,
                        records.len() as u64,
                        Some(same_kind(&e)),
                    ));
                }
                return self.on_write_failure(e).await;
            }
        }
        // Check every append's txids before writing anything; refused appends are answered in
        // their turn and write nothing.
        let mut records_of = Vec::with_capacity(batch.len());
        for (records, reply) in batch {
            let id = self.appends_base + self.appends.len() as u64;
            assert!(
                records
                    .iter()
                    .all(|(_, payload)| payload.len() <= RECORD_SIZE_BYTES_MAX),
                "sizes are checked at submission"
            );
            let (refused, last) =
                match check_txids(&records, self.last_txid, self.config.txid_jump_max) {
                    Ok(last) => (None, last),
                    Err(e) => (Some(e), self.last_txid),
                };
            let count = records.len() as u64;
            if refused.is_none() {
                self.set_last_txid(last);
                records_of.push((id, records));
            }
            self.appends
                .push_back(PendingAppend::new(reply, count, refused));
        }
        match self.write_records(&records_of).await {
            Ok(()) => {
                self.answer_ready();
                // A roll at the batch's last entry leaves its spare unused: give it back
                // rather than hold a ledger no segment lists while the stream may stay idle.
                if self.current.is_none() {
                    self.discard_spare().await;
                }
                true
            }
            Err(e) => self.on_write_failure(e).await,
        }
    }

    /// Packs the records of the given appends (by append id) into entries of up to
    /// `entry_size_bytes_target` bytes and sends them.
    async fn write_records(&mut self, records_of: &[(u64, Records)]) -> Result<()> {
        let target = self.config.entry_size_bytes_target;
        let mut entry: Vec<Packed<'_>> = Vec::new();
        let mut size = RECORD_SET_HEADER_SIZE_BYTES;
        for (id, records) in records_of {
            for (k, (txid, payload)) in records.iter().enumerate() {
                let more = encoded_record_size_bytes(payload.len());
                if !entry.is_empty() && size + more > target {
                    self.send_entry(&entry).await?;
                    entry.clear();
                    size = RECORD_SET_HEADER_SIZE_BYTES;
                }
                entry.push((*id, *txid, payload.as_slice(), k + 1 == records.len()));
                size += more;
            }
        }
        if !entry.is_empty() {
            self.send_entry(&entry).await?;
        }
        Ok(())
    }

    /// Sends one entry (opening a segment first if none is open), gives its records their
    /// DLSNs, then waits as needed: for the oldest add while `adds_in_flight_max` are
    /// outstanding, and for all of them before a segment roll.
    async fn send_entry(&mut self, records: &[Packed<'_>]) -> Result<()> {
        if self.current.is_none() {
            self.open_segment(records[0].1).await?;
        }
        let seg = self.current.as_mut().expect("opened above");
        let payload = Arc::new(record_set::encode(
            seg.record_count,
            records.iter().map(|(_, t, p, _)| (*t, *p)),
        ));
        let entry = seg.next_entry;
        // The LAC this entry carries is at least the writer's LAC read before the add.
        seg.lac_carried = seg.lac_carried.max(seg.ledger.lac().map(|l| l.0));
        let future = seg.ledger.add(payload.as_ref().clone());
        seg.next_entry += 1;
        seg.last_data_entry = Some(entry);
        seg.record_count += records.len() as u64;
        seg.size_bytes += payload.len() as u64;
        seg.last_txid = records[records.len() - 1].1;
        let seq_no = seg.seq_no;
        self.entries.push_back(InFlight {
            future,
            seq_no,
            entry,
            ledger_id: seg.ledger.id().0,
            payload,
            records_through: seg.record_count,
            bytes_through: seg.size_bytes,
        });
        for (slot, (id, _, _, last_of_append)) in records.iter().enumerate() {
            let slot = u32::try_from(slot).expect("records per entry bounded by entry size");
            let dlsn = Dlsn::new(seq_no, entry, slot);
            let a = &mut self.appends[(id - self.appends_base) as usize];
            a.first.get_or_insert(dlsn);
            a.last = Some(dlsn);
            a.issued |= *last_of_append;
        }
        while self.entries.len() >= self.config.adds_in_flight_max {
            self.complete_oldest().await?;
        }
        // The size rule, and the time rule checked here too so that a busy stream rolls on
        // time (the lifecycle tick covers idle ones).
        if self.roll_due() {
            self.roll().await?;
        }
        Ok(())
    }

    /// True when the open segment is at its roll point: its size reached, or (holding a
    /// record) its age.
    pub(super) fn roll_due(&self) -> bool {
        self.current.as_ref().is_some_and(|seg| {
            seg.size_bytes >= self.config.segment_size_bytes_max
                || (seg.record_count > 0
                    && self
                        .config
                        .segment_roll_interval
                        .is_some_and(|i| seg.opened_at.elapsed() >= i))
        })
    }

    /// Rolls the open segment if the next one can be started: its ledger is created first
    /// (kept as the spare the next segment starts on), then every add in flight is awaited and
    /// the segment completed. When the ledger cannot be created (BookKeeper refuses a ledger
    /// with fewer writable bookies than its ensemble), the roll is deferred: the segment stays
    /// open and keeps taking writes, the attempt is repeated after [`ROLL_RETRY`] (here or at
    /// the lifecycle tick), and `quire_proxy_segment_roll_deferred_total` /
    /// `quire_proxy_segments_past_roll_point` count it. Returns whether the segment rolled.
    ///
    /// # Errors
    /// A failed add or completion (`Storage`, `Metadata`, `OwnershipLost`), for
    /// `on_write_failure`.
    pub(super) async fn roll(&mut self) -> Result<bool> {
        if self.spare.is_none() {
            if self
                .roll_deferred
                .as_ref()
                .is_some_and(|d| std::time::Instant::now() < d.retry_at)
            {
                return Ok(false);
            }
            match self.create_segment_ledger().await {
                Ok(spare) => self.spare = Some(spare),
                Err(e @ Error::Storage { .. }) => {
                    self.defer_roll(&e);
                    return Ok(false);
                }
                Err(e) => return Err(e),
            }
        }
        while !self.entries.is_empty() {
            self.complete_oldest().await?;
        }
        let (seq_no, bytes) = self
            .current
            .as_ref()
            .map_or((0, 0), |c| (c.seq_no, c.size_bytes));
        let deferred = self.roll_deferred.take();
        self.complete_current().await?;
        if let Some(d) = deferred {
            tracing::info!(
                stream = %self.name,
                seq_no,
                size_bytes = bytes,
                deferred_ms = d.since.elapsed().as_millis() as u64,
                attempts = d.attempts,
                "segment rolled after its roll was deferred"
            );
        }
        Ok(true)
    }

    /// Notes a roll that could not happen (see [`Writer::roll`]).
    fn defer_roll(&mut self, e: &Error) {
        let now = std::time::Instant::now();
        let retry_at = now + ROLL_RETRY;
        match &mut self.roll_deferred {
            Some(d) => {
                d.attempts += 1;
                d.retry_at = retry_at;
                d.error = e.to_string();
                tracing::debug!(stream = %self.name, error = %e, attempts = d.attempts, "segment roll still deferred");
            }
            None => {
                let seg = self.current.as_ref().expect("a roll needs an open segment");
                tracing::warn!(
                    stream = %self.name,
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
                    _counted: PastRollPoint::new(self.layer.clone()),
                });
            }
        }
    }

    /// Before a write: when the open segment's roll is deferred and the segment is past its
    /// roll point by [`super::StreamConfig::segment_roll_overshoot_bytes_max`] or
    /// [`super::StreamConfig::segment_roll_overshoot_time_max`], the roll is tried once more
    /// (when due) and, if it still cannot happen, the refusal for the write is returned
    /// (`Storage`: nothing written, retry later).
    ///
    /// # Errors
    /// What [`Writer::roll`] fails with.
    async fn past_roll_bound(&mut self) -> Result<Option<Error>> {
        let (Some(seg), Some(_)) = (&self.current, &self.roll_deferred) else {
            return Ok(None);
        };
        let c = &self.config;
        let bytes_over = seg.size_bytes.saturating_sub(c.segment_size_bytes_max);
        let due_at = c.segment_roll_interval.map(|i| seg.opened_at + i);
        let time_over = due_at.map(|t| t.elapsed());
        let over_bytes = bytes_over >= c.segment_roll_overshoot_bytes_max;
        let over_time = time_over.is_some_and(|t| t >= c.segment_roll_overshoot_time_max)
            || self
                .roll_deferred
                .as_ref()
                .is_some_and(|d| d.since.elapsed() >= c.segment_roll_overshoot_time_max);
        if !(over_bytes || over_time) || self.roll().await? {
            return Ok(None);
        }
        let (seg, d) = (
            self.current.as_ref().expect("still open"),
            self.roll_deferred.as_ref().expect("still deferred"),
        );
        Ok(Some(Error::Storage {
            stream: self.name.clone(),
            op: "write past a deferred segment roll",
            source: format!(
                "segment {} holds {} bytes and has waited {} s for its roll, at the bound (segment_roll_overshoot_bytes {}, segment_roll_overshoot_secs {}), and no new segment can be started: {}; nothing of this write was written, retry once enough bookies are writable",
                seg.seq_no,
                seg.size_bytes,
                d.since.elapsed().as_secs(),
                self.config.segment_roll_overshoot_bytes_max,
                self.config.segment_roll_overshoot_time_max.as_secs(),
                d.error
            )
            .into(),
        }))
    }

    /// Gives a spare ledger back: its metadata is deleted (it was never written). Done when
    /// no segment is open after a batch or a lifecycle check (the next segment creates its
    /// own ledger then), so that no ledger outlives the roll that made it unlisted. Failures
    /// leave an orphan for the sweep.
    pub(super) async fn discard_spare(&mut self) {
        if let Some(s) = self.spare.take() {
            let id = s.ledger.id().0;
            drop(s);
            super::sweep::delete_labelled_ledger(&*self.metadata, &self.name, id).await;
        }
    }

    /// When the open segment's last data entry, acknowledged but not yet covered by a LAC that
    /// any entry carried to the bookies, should get a control entry: `lac_advance_delay` after
    /// the last acknowledgement, once nothing is in flight. `None` when nothing is due.
    fn lac_advance_due(&self) -> Option<tokio::time::Instant> {
        let delay = self.config.lac_advance_delay?;
        let seg = self.current.as_ref()?;
        if !self.entries.is_empty() || !self.healthy {
            return None;
        }
        let last = seg.last_data_entry?;
        if seg.last_acked_entry.is_none_or(|a| a < last) || seg.lac_carried >= Some(last) {
            return None;
        }
        Some(seg.last_ack_at + delay)
    }

    /// Sends a control entry (no record, `docs/format/record-set.md` version 2) carrying the
    /// LAC, so that the bookies learn that every data entry so far is confirmed and readers
    /// that cannot ask this writer (another proxy after this one died, reading without
    /// recovery) can read up to the last acknowledged record (DistributedLog writes a control
    /// record for the same reason).
    fn send_control_entry(&mut self) -> Result<()> {
        let seg = self
            .current
            .as_mut()
            .expect("a control entry is due only with an open segment");
        let payload = Arc::new(record_set::encode_control(seg.record_count, seg.last_txid));
        let entry = seg.next_entry;
        seg.lac_carried = seg.lac_carried.max(seg.ledger.lac().map(|l| l.0));
        let future = seg.ledger.add(payload.as_ref().clone());
        seg.next_entry += 1;
        seg.size_bytes += payload.len() as u64;
        tracing::trace!(stream = %self.name, seq_no = seg.seq_no, entry, lac = ?seg.lac_carried, "control entry to advance the LAC");
        self.entries.push_back(InFlight {
            future,
            seq_no: seg.seq_no,
            entry,
            ledger_id: seg.ledger.id().0,
            payload,
            records_through: seg.record_count,
            bytes_through: seg.size_bytes,
        });
        Ok(())
    }

    pub(super) fn fail(&mut self) {
        // Dropping the ledger writer abandons its pending adds; the segment stays InProgress
        // in the metadata and is recovered (fenced and closed) before the next append.
        self.current = None;
        self.healthy = false;
        self.roll_deferred = None;
    }
}

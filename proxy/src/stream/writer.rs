//! The stream task (DistributedLog `BKAsyncLogWriter`, reduced): it owns the stream's writer
//! state, takes appends from the queue, checks their txids, packs their records into record-set
//! entries, sends them without waiting while fewer than `adds_in_flight_max` are outstanding,
//! and answers appends strictly in submission order as their entries are acknowledged; a failed
//! add fails every append still unanswered with the same kind of error.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use quire_ledger::AddFuture;
use quire_wire::EntryId;
use tokio::sync::{mpsc, oneshot, watch};

use super::command::{Command, StreamSweep};
use super::compress;
use super::labels;
use super::lifecycle;
use super::ownership::{lease_lost, Ownership};
use super::producer::{self, ProducerTable, Verdict};
use super::record::StreamRecord;
use super::segment::{self, Segments};
use super::shared::{same_kind, writer_storage};
use crate::dlsn::Dlsn;
use crate::error::{Error, Result};
use crate::protocol::ProducerSeq;
use crate::record_set::{
    self, encoded_record_size_bytes, ProducerRun, PRODUCER_RUN_COUNT_SIZE_BYTES,
    PRODUCER_RUN_SIZE_BYTES, RECORD_SET_HEADER_SIZE_BYTES, RECORD_SIZE_BYTES_MAX,
};
use crate::types::{RetentionChange, TruncateResult, WriteResult};
use quire_metadata::RetentionOverride;

mod seal;

/// One entry add in flight.
pub(super) struct InFlight {
    pub(super) future: AddFuture,
    pub(super) seq_no: u64,
    pub(super) entry: u64,
    pub(super) ledger_id: u64,
    /// The entry as readers decode it: plain even when it is stored LZ4-compressed, so the
    /// tail cache it goes to on acknowledgement holds plain entries and each tail read decodes
    /// without decompressing (`compress::StoredEntry`).
    pub(super) plain: Arc<Vec<u8>>,
    /// Records and payload bytes in the segment up to and including this entry.
    pub(super) records_through: u64,
    pub(super) bytes_through: u64,
    /// For an entry holding records: the slot of its last record and its write time.
    pub(super) last_record: Option<(u32, u64)>,
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
    /// A producer session's write: its numbering as written (after an overlap, from the
    /// first record not yet applied); records packed take `first_seq + k`.
    pub(super) producer: Option<ProducerSeq>,
    /// A producer session's write already applied in full: nothing written, answered at its
    /// turn with the original DLSNs from the dedup table.
    pub(super) duplicate: Option<ProducerSeq>,
    /// The write asked for LZ4 (write flag 0x04): every entry holding one of its records is
    /// stored compressed (`compress.rs`).
    pub(super) compress: bool,
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
            producer: None,
            duplicate: None,
            compress: false,
        }
    }
}

/// An entry's payload as the ledger writer takes it, sharing the `Arc` the in-flight entry
/// (and then the tail cache) holds: the frames to the bookies are written from this one
/// buffer, not from a copy (perf/README.md, "Copies on the write path").
fn shared_bytes(payload: &Arc<Vec<u8>>) -> bytes::Bytes {
    struct Shared(Arc<Vec<u8>>);
    impl AsRef<[u8]> for Shared {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }
    bytes::Bytes::from_owner(Shared(payload.clone()))
}

/// An append's records, `(txid, payload)` each.
type Records = Vec<(u64, Vec<u8>)>;

/// An append's records, its producer session numbering, where its answer goes, and whether
/// it asked for LZ4.
type QueuedAppend = (
    Records,
    Option<ProducerSeq>,
    oneshot::Sender<Result<WriteResult>>,
    bool,
);

/// One record waiting to be packed into the next entry: (append id, txid, payload, last
/// record of its append, index in its append, in a producer session).
type Packed<'a> = (u64, u64, &'a [u8], bool, usize, bool);

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

/// The appends queued right now after `records`, grouped up to about one entry's worth
/// (`target` bytes); a command other than an append is held back in `inputs.stashed`.
fn take_batch(first: QueuedAppend, inputs: &mut Inputs, target: usize) -> Vec<QueuedAppend> {
    let mut size: usize = first
        .0
        .iter()
        .map(|(_, p)| encoded_record_size_bytes(p.len()))
        .sum();
    let mut batch = vec![first];
    while size < target {
        match inputs.commands.try_recv() {
            Ok(Command::Append {
                records,
                producer,
                reply,
                compress,
            }) => {
                size += records
                    .iter()
                    .map(|(_, p)| encoded_record_size_bytes(p.len()))
                    .sum::<usize>();
                batch.push((records, producer, reply, compress));
            }
            Ok(other) => {
                inputs.stashed = Some(other);
                break;
            }
            Err(_) => break,
        }
    }
    batch
}

/// Bytes a record adds to its entry besides its own when it is a producer session's (record
/// index `k` in its write) going into `entry`: a new run when it starts its write's part of
/// the entry, and the run count for the entry's first run.
fn run_bytes(entry: &[Packed<'_>], in_session: bool, k: usize) -> usize {
    if !in_session || (k > 0 && !entry.is_empty()) {
        return 0;
    }
    let mut more = PRODUCER_RUN_SIZE_BYTES;
    if !entry.iter().any(|r| r.5) {
        more += PRODUCER_RUN_COUNT_SIZE_BYTES;
    }
    more
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

/// A stream's writer state, owned by its task: the stream record, the lease, the segments,
/// and the append pipeline (appends taken and not yet answered, entry adds in flight).
pub(super) struct Writer {
    /// The stream record and the handles to read and update it.
    rec: StreamRecord,
    /// The lease this task holds.
    ownership: Ownership,
    /// The open segment, the spare ledger, a deferred roll, an unrecovered segment.
    segments: Segments,
    /// Highest txid acknowledged or in flight (the order rule and the txid guard are checked
    /// against it). Set only through [`Writer::set_last_txid`], which publishes it.
    last_txid: Option<u64>,
    /// True once closed by a shutdown: later appends get `ShuttingDown`.
    closed: bool,
    /// Entry adds sent and not yet acknowledged, in entry order (all in the open segment).
    entries: VecDeque<InFlight>,
    /// Appends taken from the queue and not yet answered, in submission order.
    appends: VecDeque<PendingAppend>,
    /// Id of `appends.front()`; ids count every append this writer took.
    appends_base: u64,
    /// (segment seq no, entry id) of the last entry acknowledged.
    acked: Option<(u64, u64)>,
    /// Producer sessions' dedup state (`producer.rs`), rebuilt from the log after a recovery
    /// before the first session write.
    producers: ProducerTable,
}

/// What woke the stream task.
enum Event {
    /// The oldest add in flight finished.
    Acked(std::result::Result<EntryId, quire_ledger::Error>),
    /// The lease says ownership is gone.
    Lost(String),
    /// A command, or `None` once the manager dropped the queue.
    Command(Option<Command>),
    /// The lifecycle check is due.
    Tick,
    /// A control entry is due to carry the LAC.
    AdvanceLac,
}

/// The stream task's inputs: its command queue (with a command taken from it early and held
/// back while the pipeline is full), the lease's `lost` flag and the lifecycle tick.
struct Inputs {
    commands: mpsc::Receiver<Command>,
    stashed: Option<Command>,
    lost: Option<watch::Receiver<bool>>,
    tick: tokio::time::Interval,
}

impl Writer {
    /// A writer for a stream just acquired, over its record and lease; nothing is recovered
    /// yet (see [`Writer::recover`]). Its last txid is the stored one, published for
    /// `describe` also while a failed recovery leaves it there.
    pub(super) fn new(rec: StreamRecord, ownership: Ownership) -> Self {
        let mut writer = Self {
            last_txid: None,
            rec,
            ownership,
            segments: Segments::new(),
            closed: false,
            entries: VecDeque::new(),
            appends: VecDeque::new(),
            appends_base: 0,
            acked: None,
            producers: ProducerTable::default(),
        };
        writer.set_last_txid(writer.rec.meta.value.max_txid);
        writer
    }

    /// True when a segment left in progress by an earlier writer could not be recovered (see
    /// [`Segments::serves_unrecovered`]).
    pub(super) fn serves_unrecovered(&self) -> bool {
        self.segments.serves_unrecovered()
    }

    /// Gives the lease back (a no-op if it was already lost).
    pub(super) async fn release_lease(&mut self) {
        self.ownership.release().await;
    }

    /// Recovers every `InProgress` segment (see [`Segments::recover`]); afterwards the writer
    /// is healthy with no open segment and its last txid is the record's.
    ///
    /// # Errors
    /// What [`Segments::recover`] fails with.
    pub(super) async fn recover(&mut self) -> Result<()> {
        // What was in flight may or may not be in the log now: the dedup state is read back
        // from it before the next session write.
        self.producers.reset();
        self.segments
            .recover(&mut self.rec, &self.ownership)
            .await?;
        self.set_last_txid(self.rec.meta.value.max_txid);
        Ok(())
    }

    /// The stream task. It takes appends from the queue while fewer than
    /// `adds_in_flight_max` entry adds are outstanding, packs each (with the appends queued
    /// behind it, up to `entry_size_bytes_target`) into entries, sends them at once and takes
    /// the next append without waiting; acknowledgements are handled as they arrive, in entry
    /// order, and each append is answered once the entry holding its last record is
    /// acknowledged (DistributedLog `BKAsyncLogWriter`: many outstanding writes per stream,
    /// transmitted in entries, acknowledged in order).
    pub(super) async fn run(mut self, commands: mpsc::Receiver<Command>) {
        let mut tick = tokio::time::interval(self.rec.config.lifecycle_check_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut inputs = Inputs {
            commands,
            stashed: None,
            lost: self.ownership.lost_watch(),
            tick,
        };
        loop {
            let event = self.next_event(&mut inputs).await;
            if !self.handle(event, &mut inputs).await {
                break;
            }
        }
        self.answer_after_loss(inputs).await;
        tracing::debug!(stream = %self.rec.name, "stream task ends");
    }

    /// Waits for the next event: a held-back command once the pipeline has room, else the
    /// first of the tick, the oldest add, a lease loss, a command (while there is room) and a
    /// due LAC advance.
    async fn next_event(&mut self, inputs: &mut Inputs) -> Event {
        let accepting = self.entries.len() < self.rec.config.adds_in_flight_max;
        match inputs.stashed.take() {
            Some(cmd) if accepting => Event::Command(Some(cmd)),
            held => {
                inputs.stashed = held;
                let take = accepting && inputs.stashed.is_none();
                let advance_at = self.lac_advance_due();
                // The lifecycle tick goes first: it is ready once per interval, and after
                // the commands it would starve under a steady stream of appends.
                tokio::select! {
                    biased;
                    _ = inputs.tick.tick() => Event::Tick,
                    r = oldest_add(&mut self.entries) => Event::Acked(r),
                    reason = lease_lost(&mut inputs.lost) => Event::Lost(reason),
                    cmd = inputs.commands.recv(), if take => Event::Command(cmd),
                    _ = sleep_until_opt(advance_at) => Event::AdvanceLac,
                }
            }
        }
    }

    /// Handles one event; returns false once the task ends.
    async fn handle(&mut self, event: Event, inputs: &mut Inputs) -> bool {
        match event {
            Event::Acked(r) => {
                let f = self.entries.pop_front().expect("an add was awaited");
                match self.on_acked(f, r) {
                    Ok(()) => true,
                    Err(e) => self.on_write_failure(e).await,
                }
            }
            Event::Lost(reason) => {
                tracing::warn!(stream = %self.rec.name, %reason, "stream ownership lost");
                // Adds already sent finish first (their outcome is the bookies' to decide).
                if self.drain().await {
                    self.lose(reason).await;
                }
                false
            }
            Event::Command(None) => {
                // The manager is gone without a shutdown: give the lease up so another proxy
                // can take over; the segment stays in progress for it to recover, as after a
                // crash.
                self.drain().await;
                self.ownership.release().await;
                false
            }
            Event::Tick => self.closed || self.on_tick().await,
            Event::AdvanceLac => match self.send_control_entry() {
                Ok(()) => true,
                Err(e) => self.on_write_failure(e).await,
            },
            Event::Command(Some(cmd)) => self.handle_command(cmd, inputs).await,
        }
    }

    /// Handles one command from the queue; returns false once the task ends.
    async fn handle_command(&mut self, cmd: Command, inputs: &mut Inputs) -> bool {
        match cmd {
            Command::Close { reply } => self.close(reply, inputs).await,
            Command::Release { reply } => self.release_moved(reply, inputs).await,
            Command::Truncate { before, reply } => {
                let (r, go_on) = self.truncate(before).await;
                let _ = reply.send(r);
                go_on
            }
            Command::SetRetention {
                time_secs,
                size_bytes,
                keep_for_subscriptions,
                reply,
            } => {
                let (r, go_on) = self
                    .set_retention(time_secs, size_bytes, keep_for_subscriptions)
                    .await;
                let _ = reply.send(r);
                go_on
            }
            Command::SetCompression { compression, reply } => {
                let (rec, own) = (&mut self.rec, &self.ownership);
                let r = lifecycle::set_compression(rec, own, compression).await;
                let (r, go_on) = self.lifecycle_answer(r).await;
                let _ = reply.send(r);
                go_on
            }
            Command::SetLimits { limits, reply } => {
                let (rec, own) = (&mut self.rec, &self.ownership);
                let r = lifecycle::set_limits(rec, own, limits).await;
                let (r, go_on) = self.lifecycle_answer(r).await;
                let _ = reply.send(r);
                go_on
            }
            Command::SetPlacement { placement, reply } => {
                let (rec, own) = (&mut self.rec, &self.ownership);
                let r = lifecycle::set_placement(rec, own, placement).await;
                let (r, go_on) = self.lifecycle_answer(r).await;
                let _ = reply.send(r);
                go_on
            }
            Command::Delete { reply } => {
                let (r, go_on) = self.delete_stream().await;
                let _ = reply.send(r);
                go_on
            }
            Command::Seal { reply } => {
                let (r, go_on) = self.seal().await;
                let _ = reply.send(r);
                go_on
            }
            Command::Sweep {
                orphan_candidates,
                release_unless_used,
                reply,
            } => {
                self.sweep_command(orphan_candidates, release_unless_used, reply, inputs)
                    .await
            }
            Command::Append {
                records,
                producer,
                reply,
                compress,
            } => {
                if self.closed {
                    let _ = reply.send(Err(Error::ShuttingDown));
                    return true;
                }
                if self.rec.meta.value.sealed {
                    // DistributedLog `EndOfStreamException`: nothing after the marker.
                    let _ = reply.send(Err(self.end_of_stream_error()));
                    return true;
                }
                let batch = take_batch(
                    (records, producer, reply, compress),
                    inputs,
                    self.rec.config.entry_size_bytes_target,
                );
                self.append_batch(batch).await
            }
        }
    }

    /// A shutdown's close: every add in flight is awaited, the open segment completed, the
    /// spare given back and the lease released; the task then answers `ShuttingDown`.
    /// Returns false once the task ends (ownership was lost while draining).
    async fn close(&mut self, reply: oneshot::Sender<Result<()>>, inputs: &mut Inputs) -> bool {
        if !self.drain().await {
            let _ = reply.send(Ok(()));
            return false;
        }
        let r = if self.segments.healthy {
            self.segments
                .complete_current(&mut self.rec, &self.ownership)
                .await
        } else {
            Ok(())
        };
        self.segments.discard_spare(&self.rec).await;
        if r.is_err() {
            self.fail();
        }
        self.closed = true;
        inputs.lost = None;
        self.ownership.release().await;
        let _ = reply.send(r);
        true
    }

    /// The balancer's release (`Command::Release`): as [`Writer::close`], then the lease is
    /// given up as moved to `StreamShared::moved_to` and the task ends (false). During a
    /// shutdown the close already happened: nothing to do.
    async fn release_moved(
        &mut self,
        reply: oneshot::Sender<Result<()>>,
        inputs: &mut Inputs,
    ) -> bool {
        let to = self.rec.shared.moved_to.lock().expect("moved lock").clone();
        let Some(to) = to.filter(|_| !self.closed) else {
            let _ = reply.send(Ok(()));
            return true;
        };
        if !self.drain().await {
            let _ = reply.send(Ok(()));
            return false;
        }
        let r = if self.segments.healthy {
            self.segments
                .complete_current(&mut self.rec, &self.ownership)
                .await
        } else {
            Ok(())
        };
        self.segments.discard_spare(&self.rec).await;
        if r.is_err() {
            self.fail();
        }
        inputs.lost = None;
        self.ownership.release_moved(&to).await;
        let _ = reply.send(r);
        false
    }

    /// A sweep command: the stream task's part of the sweep, then, for a stream acquired only
    /// for it, the stream is given back when nothing is queued, in flight or open and no
    /// request came since the acquisition (before the sweep is answered, so that its caller
    /// sees the stream given back). Returns false once the task ends.
    async fn sweep_command(
        &mut self,
        candidates: Vec<u64>,
        release_unless_used: Option<u64>,
        reply: oneshot::Sender<Result<StreamSweep>>,
        inputs: &Inputs,
    ) -> bool {
        let (r, go_on) = if self.closed {
            (Err(Error::ShuttingDown), true)
        } else {
            self.sweep(candidates).await
        };
        let ok = r.is_ok();
        let unused = release_unless_used
            .is_some_and(|n| self.rec.shared.requests.load(Ordering::SeqCst) == n);
        if go_on
            && ok
            && unused
            && inputs.stashed.is_none()
            && inputs.commands.is_empty()
            && self.entries.is_empty()
            && self.appends.is_empty()
            && self.segments.current.is_none()
        {
            self.ownership.release_after_sweep().await;
            let _ = reply.send(r);
            return false;
        }
        let _ = reply.send(r);
        go_on
    }

    /// After a loss: answers what is queued (the stream moved, or was deleted), then the task
    /// ends (dropping the readers' view).
    async fn answer_after_loss(&mut self, mut inputs: Inputs) {
        let reason = self.rec.shared.lost.lock().expect("lost lock").clone();
        let Some(reason) = reason else {
            return;
        };
        let deleted = self.rec.shared.deleted.load(Ordering::SeqCst);
        let moved = self.rec.shared.moved_to.lock().expect("moved lock").clone();
        inputs.commands.close();
        let mut rest: Vec<Command> = inputs.stashed.into_iter().collect();
        while let Some(cmd) = inputs.commands.recv().await {
            rest.push(cmd);
        }
        for cmd in rest {
            match cmd {
                Command::Append { reply, .. } if deleted => {
                    let _ = reply.send(Err(self.rec.gone()));
                }
                Command::Append { reply, .. } if moved.is_some() => {
                    // Never sent to a bookie: the client resends it to the new owner.
                    let _ = reply.send(Err(self.ended(false, &reason)));
                }
                Command::Append { reply, .. } => {
                    self.rec.shared.loss_reported.store(true, Ordering::SeqCst);
                    let _ = reply.send(Err(Error::OwnershipLost {
                        stream: self.rec.name.clone(),
                        reason: reason.clone(),
                    }));
                }
                Command::Close { reply } | Command::Release { reply } => {
                    let _ = reply.send(Ok(()));
                }
                Command::Truncate { reply, .. } => {
                    let _ = reply.send(Err(self.ended(deleted, &reason)));
                }
                Command::SetRetention { reply, .. } => {
                    let _ = reply.send(Err(self.ended(deleted, &reason)));
                }
                Command::SetCompression { reply, .. } => {
                    let _ = reply.send(Err(self.ended(deleted, &reason)));
                }
                Command::SetLimits { reply, .. } => {
                    let _ = reply.send(Err(self.ended(deleted, &reason)));
                }
                Command::SetPlacement { reply, .. } => {
                    let _ = reply.send(Err(self.ended(deleted, &reason)));
                }
                Command::Delete { reply } => {
                    let _ = reply.send(Err(self.ended(deleted, &reason)));
                }
                Command::Seal { reply } => {
                    let _ = reply.send(Err(self.ended(deleted, &reason)));
                }
                Command::Sweep { reply, .. } => {
                    let _ = reply.send(Err(self.ended(deleted, &reason)));
                }
            }
        }
    }

    /// The answer to a command that arrived after the task gave the stream up.
    fn ended(&self, deleted: bool, reason: &str) -> Error {
        let moved = self.rec.shared.moved_to.lock().expect("moved lock").clone();
        if deleted {
            self.rec.gone()
        } else if let Some(owner) = moved {
            // Released for balance (`placement.rs`): nothing of the command was done.
            Error::OwnedElsewhere {
                stream: self.rec.name.clone(),
                owner,
            }
        } else {
            Error::OwnershipLost {
                stream: self.rec.name.clone(),
                reason: reason.to_string(),
            }
        }
    }

    /// Sends one answer; an `OwnershipLost` answer counts as the loss being reported.
    fn answer(&self, reply: oneshot::Sender<Result<WriteResult>>, r: Result<WriteResult>) {
        if matches!(r, Err(Error::OwnershipLost { .. })) {
            self.rec.shared.loss_reported.store(true, Ordering::SeqCst);
        }
        let _ = reply.send(r);
    }

    /// Answers the appends at the front of the queue that are done: refused ones, and written
    /// ones whose last entry is acknowledged.
    fn answer_ready(&mut self) {
        while let Some(a) = self.appends.front() {
            let ready = a.refused.is_some()
                || a.duplicate.is_some()
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
            let r = match (a.refused, a.duplicate) {
                (Some(e), _) => Err(e),
                (None, Some(p)) => self
                    .producers
                    .duplicate_answer(&self.rec.name, p, a.count)
                    .map(|(first_dlsn, last_dlsn)| WriteResult {
                        first_dlsn,
                        last_dlsn,
                        count: a.count,
                    }),
                (None, None) => Ok(WriteResult {
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
            tracing::warn!(stream = %self.rec.name, error = %e, pending = self.appends.len(), "write failed; the writer will recover before the next append");
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
        let acked = r.map_err(|e| writer_storage(&self.rec.name, "add entry", e))?;
        assert_eq!(acked.0, f.entry, "adds are acknowledged in entry order");
        let seg = self
            .segments
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
        self.rec.shared.cache.lock().expect("cache lock").insert(
            (f.ledger_id, f.entry),
            f.plain,
            self.rec.config.tail_cache_bytes_max,
        );
        self.rec.tail.send_modify(|t| {
            if let Some(s) = t.segments.iter_mut().find(|s| s.seq_no == seq) {
                s.readable_last_entry = Some(f.entry);
            }
        });
        self.acked = Some((seq, f.entry));
        {
            let mut view = self.rec.shared.view.lock().expect("view lock");
            view.live = Some((seq, f.entry, f.records_through, f.bytes_through));
            if let Some((slot, time)) = f.last_record {
                view.live_last_record = Some((seq, f.entry, slot, time));
            }
        }
        self.answer_ready();
        Ok(())
    }

    /// Sets the txid the next append is checked against (order rule and txid guard), and
    /// publishes it for `describe`.
    pub(super) fn set_last_txid(&mut self, last_txid: Option<u64>) {
        self.last_txid = last_txid;
        *self.rec.shared.last_txid.lock().expect("last txid lock") = last_txid;
    }

    /// Takes a group of appends queued together: checks ownership, recovers a dead writer,
    /// checks txids, packs the records into entries and sends them. Does not wait for the adds
    /// (except to stay within `adds_in_flight_max` and at a segment roll). Returns false once the
    /// stream was given up.
    async fn append_batch(&mut self, batch: Vec<QueuedAppend>) -> bool {
        if let Err(e) = self.ownership.check() {
            // Adds already sent finish first; then the stream is given up.
            if self.drain().await {
                if let Error::OwnershipLost { reason, .. } = &e {
                    self.lose(reason.clone()).await;
                }
            }
            for (_, _, reply, _) in batch {
                self.answer(reply, Err(same_kind(&e)));
            }
            return false;
        }
        if !self.segments.healthy {
            assert!(
                self.entries.is_empty() && self.appends.is_empty(),
                "a dead writer has nothing in flight"
            );
            if let Err(e) = self.recover().await {
                let lost = match &e {
                    Error::OwnershipLost { reason, .. } => Some(reason.clone()),
                    _ => None,
                };
                for (_, _, reply, _) in batch {
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
                for (records, _, reply, _) in batch {
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
                for (records, _, reply, _) in batch {
                    self.appends.push_back(PendingAppend::new(
                        reply,
                        records.len() as u64,
                        Some(same_kind(&e)),
                    ));
                }
                return self.on_write_failure(e).await;
            }
        }
        let Some(batch) = self.build_producers(batch).await else {
            return true;
        };
        // Check every append's txids before writing anything; refused appends are answered in
        // their turn and write nothing.
        let mut records_of = Vec::with_capacity(batch.len());
        for (records, producer, reply, compress) in batch {
            assert!(
                records
                    .iter()
                    .all(|(_, payload)| payload.len() <= RECORD_SIZE_BYTES_MAX),
                "sizes are checked at submission"
            );
            let id = self.appends_base + self.appends.len() as u64;
            let (mut pending, records) = self.take_append(records, producer, reply);
            pending.compress = compress;
            if let Some(records) = records {
                records_of.push((id, records));
            }
            self.appends.push_back(pending);
        }
        match self.write_records(&records_of).await {
            Ok(()) => {
                self.answer_ready();
                // A roll at the batch's last entry leaves its spare unused: give it back
                // rather than hold a ledger no segment lists while the stream may stay idle.
                if self.segments.current.is_none() {
                    self.segments.discard_spare(&self.rec).await;
                }
                true
            }
            Err(e) => self.on_write_failure(e).await,
        }
    }

    /// Before a batch holding producer session writes: the dedup table is rebuilt from the
    /// log if a recovery reset it (`producer::read_tail_runs`). Returns the batch, or `None`
    /// when the rebuild failed and every append of the batch was answered with its error
    /// (nothing written; the next session write tries again).
    async fn build_producers(&mut self, batch: Vec<QueuedAppend>) -> Option<Vec<QueuedAppend>> {
        if self.producers.built || batch.iter().all(|(_, p, ..)| p.is_none()) {
            return Some(batch);
        }
        let read =
            producer::read_tail_runs(&self.rec.bookkeeper, &self.rec.name, &self.rec.meta.value)
                .await;
        match read {
            Ok(entries) => {
                tracing::debug!(stream = %self.rec.name, entries = entries.len(), "producer sessions rebuilt from the log tail");
                self.producers.rebuild(&entries);
                Some(batch)
            }
            Err(e) => {
                tracing::warn!(stream = %self.rec.name, error = %e, "cannot rebuild the producer sessions from the log tail");
                for (_, _, reply, _) in batch {
                    self.answer(reply, Err(same_kind(&e)));
                }
                None
            }
        }
    }

    /// Takes one append of a batch: its producer session verdict (`producer.rs`), then its
    /// txids. Returns its pending answer and the records to write (`None`: refused, or a
    /// duplicate that writes nothing). A taken session write advances the session at once,
    /// so that the next write of the session in the same batch follows it.
    fn take_append(
        &mut self,
        mut records: Records,
        producer: Option<ProducerSeq>,
        reply: oneshot::Sender<Result<WriteResult>>,
    ) -> (PendingAppend, Option<Records>) {
        let count = records.len() as u64;
        let verdict = match producer {
            None => Ok(None),
            Some(p) => self
                .producers
                .classify(&self.rec.name, p, records.len())
                .map(Some),
        };
        let mut producer = producer;
        let mut preset_first = None;
        match verdict {
            Err(e) => return (PendingAppend::new(reply, count, Some(e)), None),
            Ok(Some(Verdict::Duplicate)) => {
                let mut pending = PendingAppend::new(reply, count, None);
                pending.duplicate = producer;
                return (pending, None);
            }
            Ok(Some(Verdict::Overlap { applied, first })) => {
                // The applied prefix stays as it is in the log; only the rest is written.
                records.drain(..applied);
                producer = producer.map(|p| ProducerSeq {
                    first_seq: p.first_seq + applied as u64,
                    ..p
                });
                preset_first = Some(first);
            }
            Ok(Some(Verdict::New)) | Ok(None) => {}
        }
        let (refused, last) =
            match check_txids(&records, self.last_txid, self.rec.config.txid_jump_max) {
                Ok(last) => (None, last),
                Err(e) => (Some(e), self.last_txid),
            };
        let mut pending = PendingAppend::new(reply, count, refused);
        if pending.refused.is_some() {
            return (pending, None);
        }
        self.set_last_txid(last);
        if let Some(p) = producer {
            self.producers
                .accept(p.session_id, p.first_seq, records.len());
        }
        pending.producer = producer;
        pending.first = preset_first;
        (pending, Some(records))
    }

    /// Packs the records of the given appends (by append id) into entries of up to
    /// `entry_size_bytes_target` bytes and sends them. An entry holding producer session
    /// records counts its producer runs too (record set v3).
    async fn write_records(&mut self, records_of: &[(u64, Records)]) -> Result<()> {
        let target = self.rec.config.entry_size_bytes_target;
        let mut entry: Vec<Packed<'_>> = Vec::new();
        let mut size = RECORD_SET_HEADER_SIZE_BYTES;
        for (id, records) in records_of {
            let in_session = self.appends[(id - self.appends_base) as usize]
                .producer
                .is_some();
            for (k, (txid, payload)) in records.iter().enumerate() {
                let more = encoded_record_size_bytes(payload.len());
                if !entry.is_empty() && size + more > target {
                    self.send_entry(&entry).await?;
                    entry.clear();
                    size = RECORD_SET_HEADER_SIZE_BYTES;
                }
                size += more + run_bytes(&entry, in_session, k);
                entry.push((
                    *id,
                    *txid,
                    payload.as_slice(),
                    k + 1 == records.len(),
                    k,
                    in_session,
                ));
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
        if self.segments.current.is_none() {
            let first_write_time = segment::write_time_floor_ms(&self.rec.meta.value);
            self.segments
                .open_segment(
                    &mut self.rec,
                    &self.ownership,
                    records[0].1,
                    first_write_time,
                )
                .await?;
        }
        let runs = self.producer_runs(records);
        let compress_entry = compress::stream_compresses(&self.rec)
            || records
                .iter()
                .any(|r| self.appends[(r.0 - self.appends_base) as usize].compress);
        let seg = self.segments.current.as_mut().expect("opened above");
        // The proxy's clock stamps the entry (record set v3), never the client's.
        let write_time = seg.next_write_time_ms();
        let plain = record_set::encode_with_runs(
            seg.record_count,
            write_time,
            &runs,
            records.iter().map(|(_, t, p, ..)| (*t, *p)),
        );
        let compress::StoredEntry {
            stored: payload,
            plain,
        } = compress::stored_entry(plain, compress_entry);
        seg.last_write_time_ms = write_time;
        let entry = seg.next_entry;
        // The LAC this entry carries is at least the writer's LAC read before the add.
        seg.lac_carried = seg.lac_carried.max(seg.ledger.lac().map(|l| l.0));
        let future = seg.ledger.add(shared_bytes(&payload));
        seg.next_entry += 1;
        seg.last_data_entry = Some(entry);
        seg.record_count += records.len() as u64;
        seg.size_bytes += payload.len() as u64;
        seg.last_txid = records[records.len() - 1].1;
        seg.last_record = Some((
            entry,
            u32::try_from(records.len() - 1).expect("records per entry bounded by entry size"),
        ));
        let seq_no = seg.seq_no;
        self.entries.push_back(InFlight {
            future,
            seq_no,
            entry,
            ledger_id: seg.ledger.id().0,
            plain,
            records_through: seg.record_count,
            bytes_through: seg.size_bytes,
            last_record: seg.last_record.map(|(_, slot)| (slot, write_time)),
        });
        for run in &runs {
            self.producers.record_run(run, seq_no, entry);
        }
        for (slot, (id, _, _, last_of_append, ..)) in records.iter().enumerate() {
            let slot = u32::try_from(slot).expect("records per entry bounded by entry size");
            let dlsn = Dlsn::new(seq_no, entry, slot);
            let a = &mut self.appends[(id - self.appends_base) as usize];
            a.first.get_or_insert(dlsn);
            a.last = Some(dlsn);
            a.issued |= *last_of_append;
        }
        while self.entries.len() >= self.rec.config.adds_in_flight_max {
            self.complete_oldest().await?;
        }
        // The size rule, and the time rule checked here too so that a busy stream rolls on
        // time (the lifecycle tick covers idle ones).
        if self.segments.roll_due(&self.rec.config) {
            self.roll().await?;
        }
        Ok(())
    }

    /// The producer runs of an entry about to be sent: consecutive records of one session
    /// write, numbered from the write's `first_seq` by their index in it.
    fn producer_runs(&self, records: &[Packed<'_>]) -> Vec<ProducerRun> {
        let mut runs: Vec<ProducerRun> = Vec::new();
        for (slot, (id, _, _, _, k, in_session)) in records.iter().enumerate() {
            if !in_session {
                continue;
            }
            let p = self.appends[(id - self.appends_base) as usize]
                .producer
                .expect("a session record's append has its numbering");
            let seq = p.first_seq + *k as u64;
            let slot = u32::try_from(slot).expect("records per entry bounded by entry size");
            match runs.last_mut() {
                Some(r)
                    if r.session_id == p.session_id
                        && r.first_slot + r.count == slot
                        && r.first_seq + u64::from(r.count) == seq =>
                {
                    r.count += 1
                }
                _ => runs.push(ProducerRun {
                    session_id: p.session_id,
                    first_seq: seq,
                    first_slot: slot,
                    count: 1,
                }),
            }
        }
        runs
    }

    /// Rolls the open segment if the next one can be started: its ledger is created first
    /// (kept as the spare the next segment starts on), then every add in flight is awaited and
    /// the segment completed. When the ledger cannot be created (BookKeeper refuses a ledger
    /// with fewer writable bookies than its ensemble), the roll is deferred: the segment stays
    /// open and keeps taking writes, the attempt is repeated after `segment::ROLL_RETRY` (here
    /// or at the lifecycle tick), and `quire_proxy_segment_roll_deferred_total` /
    /// `quire_proxy_segments_past_roll_point` count it. Returns whether the segment rolled.
    ///
    /// # Errors
    /// A failed add or completion (`Storage`, `Metadata`, `OwnershipLost`), for
    /// `on_write_failure`.
    pub(super) async fn roll(&mut self) -> Result<bool> {
        if self.segments.spare.is_none() {
            if self.segments.roll_waits() {
                return Ok(false);
            }
            match self
                .segments
                .create_segment_ledger(&self.rec, &self.ownership)
                .await
            {
                Ok(spare) => self.segments.spare = Some(spare),
                Err(e @ Error::Storage { .. }) => {
                    self.segments.defer_roll(&self.rec, &e);
                    return Ok(false);
                }
                Err(e) => return Err(e),
            }
        }
        while !self.entries.is_empty() {
            self.complete_oldest().await?;
        }
        self.segments
            .complete_at_roll(&mut self.rec, &self.ownership)
            .await?;
        Ok(true)
    }

    /// Before a write: when the open segment's roll is deferred and the segment is past its
    /// roll point by the most allowed ([`Segments::past_overshoot`]), the roll is tried once
    /// more (when due) and, if it still cannot happen, the refusal for the write is returned
    /// (`Storage`: nothing written, retry later).
    ///
    /// # Errors
    /// What [`Writer::roll`] fails with.
    async fn past_roll_bound(&mut self) -> Result<Option<Error>> {
        if !self.segments.past_overshoot(&self.rec.config) || self.roll().await? {
            return Ok(None);
        }
        Ok(Some(self.segments.overshoot_refusal(&self.rec)))
    }

    /// When the open segment's last data entry, acknowledged but not yet covered by a LAC that
    /// any entry carried to the bookies, should get a control entry: `lac_advance_delay` after
    /// the last acknowledgement, once nothing is in flight. `None` when nothing is due.
    fn lac_advance_due(&self) -> Option<tokio::time::Instant> {
        let delay = self.rec.config.lac_advance_delay?;
        let seg = self.segments.current.as_ref()?;
        if !self.entries.is_empty() || !self.segments.healthy {
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
        self.send_recordless_entry(
            record_set::encode_control,
            "control entry to advance the LAC",
        );
        Ok(())
    }

    /// Sends an entry that holds no record into the open segment: a control entry or the
    /// end-of-stream marker (`docs/format/record-set.md`), made by `encode` from the segment's
    /// record count, last txid and last write time. Like every add it carries the writer's
    /// LAC. Returns its entry id.
    ///
    /// # Panics
    /// Without an open segment (both callers open or check one first).
    pub(super) fn send_recordless_entry(
        &mut self,
        encode: fn(u64, u64, u64) -> Vec<u8>,
        what: &'static str,
    ) -> u64 {
        let seg = self
            .segments
            .current
            .as_mut()
            .expect("an entry without records is sent only with an open segment");
        let payload = Arc::new(encode(
            seg.record_count,
            seg.last_txid,
            seg.last_write_time_ms,
        ));
        let entry = seg.next_entry;
        seg.lac_carried = seg.lac_carried.max(seg.ledger.lac().map(|l| l.0));
        let future = seg.ledger.add(shared_bytes(&payload));
        seg.next_entry += 1;
        seg.size_bytes += payload.len() as u64;
        tracing::trace!(stream = %self.rec.name, seq_no = seg.seq_no, entry, lac = ?seg.lac_carried, "{what}");
        self.entries.push_back(InFlight {
            future,
            seq_no: seg.seq_no,
            entry,
            ledger_id: seg.ledger.id().0,
            plain: payload,
            records_through: seg.record_count,
            bytes_through: seg.size_bytes,
            last_record: None,
        });
        entry
    }

    /// The writer is dead after a storage or metadata error (see [`Segments::fail`]).
    pub(super) fn fail(&mut self) {
        self.segments.fail();
    }

    /// Ownership is gone: drop the ledger writer and cached state without completing the
    /// segment (the next owner recovers it), give the lease up and mark the stream lost.
    pub(super) async fn lose(&mut self, reason: String) {
        self.segments.fail();
        self.ownership.give_up(reason).await;
    }

    /// The lifecycle check, every `lifecycle_check_interval`: roll the open segment if it holds
    /// a record and is older than `segment_roll_interval`, or retry a deferred roll, retry a
    /// failed recovery when due, then apply retention. Returns false once the stream was given
    /// up.
    pub(super) async fn on_tick(&mut self) -> bool {
        let roll_wanted =
            self.segments.roll_due(&self.rec.config) || self.segments.roll_deferred.is_some();
        if self.segments.healthy && roll_wanted {
            if let Err(e) = self.roll().await {
                return self.on_write_failure(e).await;
            }
        }
        if self.segments.current.is_none() {
            self.segments.discard_spare(&self.rec).await;
        }
        // A segment whose recovery failed is retried when due, without waiting for an append,
        // so that it does not stay IN_RECOVERY once its bookies are back or replaceable.
        if self.segments.recovery_retry_due() {
            if let Err(e) = self.recover().await {
                if !self.lifecycle_failure_keep(&e).await {
                    return false;
                }
            }
        }
        if !self.segments.healthy {
            // A dead writer's view of the metadata may be stale; the next append recovers it.
            return true;
        }
        self.apply_retention().await
    }

    /// Retention by age and size (`lifecycle.rs`): deletes the oldest segments past the
    /// limits. Segments this owner did not complete are aged on the metadata store's clock,
    /// never on this proxy's alone (`clock.rs`): a sample of it is taken first when there is
    /// none. Returns false once the stream was given up.
    async fn apply_retention(&mut self) -> bool {
        if lifecycle::retention_needs_store_clock(&self.rec, &self.segments) {
            if let Err(e) = self.rec.sample_store_clock(&self.ownership).await {
                if !self.lifecycle_failure_keep(&e).await {
                    return false;
                }
            }
        }
        let Some((n, _)) = lifecycle::retention_due(&self.rec, &self.segments) else {
            return true;
        };
        // A stream that keeps what its subscriptions need deletes only segments wholly before
        // the smallest committed position.
        let floor = match lifecycle::subscription_floor(&self.rec).await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(stream = %self.rec.name, error = %e, "retention skipped: cannot list the subscriptions");
                return true;
            }
        };
        let capped = lifecycle::cap_for_subscriptions(&self.rec.meta.value.segments, n, floor);
        let Some((n, point)) = capped else {
            return true;
        };
        let r =
            lifecycle::delete_prefix(&mut self.rec, &mut self.segments, &self.ownership, n, point)
                .await;
        match r {
            Ok(_) => true,
            Err(e) => self.lifecycle_failure(e).await,
        }
    }

    /// A lifecycle step failed: `OwnershipLost` gives the stream up (returns false); any other
    /// error is logged and the writer recovers before its next append.
    async fn lifecycle_failure(&mut self, e: Error) -> bool {
        match e {
            Error::OwnershipLost { reason, .. } => {
                self.lose(reason).await;
                false
            }
            other => {
                tracing::warn!(stream = %self.rec.name, error = %other, "stream lifecycle step failed");
                self.fail();
                true
            }
        }
    }

    /// As `lifecycle_failure`, for an error that is also returned to the caller: `OwnershipLost`
    /// gives the stream up once the adds in flight finish; other errors are logged and the
    /// writer stays as it is. Returns whether the task goes on.
    pub(super) async fn lifecycle_failure_keep(&mut self, e: &Error) -> bool {
        match e {
            Error::OwnershipLost { reason, .. } => {
                // Adds already sent finish first (their outcome is the bookies' to decide).
                if self.drain().await {
                    self.lose(reason.clone()).await;
                }
                false
            }
            Error::Metadata { .. } | Error::Storage { .. } => {
                tracing::warn!(stream = %self.rec.name, error = %e, "stream lifecycle step failed");
                true
            }
            _ => true,
        }
    }

    /// An answer to a lifecycle command, with whether the task goes on: a failure goes through
    /// [`Writer::lifecycle_failure_keep`].
    async fn lifecycle_answer<T>(&mut self, r: Result<T>) -> (Result<T>, bool) {
        match r {
            Ok(v) => (Ok(v), true),
            Err(e) => {
                let go_on = self.lifecycle_failure_keep(&e).await;
                (Err(e), go_on)
            }
        }
    }

    /// See `StreamManager::truncate`: ownership is checked and a dead writer recovered first
    /// (`lifecycle::truncate` does the rest). Returns the answer and whether the task goes on.
    pub(super) async fn truncate(&mut self, before: Dlsn) -> (Result<TruncateResult>, bool) {
        if let Err(e) = self.ownership.check() {
            return self.lifecycle_answer(Err(e)).await;
        }
        if !self.segments.healthy {
            if let Err(e) = self.recover().await {
                return self.lifecycle_answer(Err(e)).await;
            }
        }
        let r =
            lifecycle::truncate(&mut self.rec, &mut self.segments, &self.ownership, before).await;
        self.lifecycle_answer(r).await
    }

    /// See `StreamManager::set_retention`. Returns the answer and whether the task goes on.
    pub(super) async fn set_retention(
        &mut self,
        time_secs: RetentionChange,
        size_bytes: RetentionChange,
        keep_for_subscriptions: Option<bool>,
    ) -> (Result<RetentionOverride>, bool) {
        let (rec, own) = (&mut self.rec, &self.ownership);
        let r =
            lifecycle::set_retention(rec, own, time_secs, size_bytes, keep_for_subscriptions).await;
        self.lifecycle_answer(r).await
    }

    /// See `StreamManager::delete_stream`: adds in flight finish first, then the record goes
    /// (`lifecycle::delete_record`), then the segments' ledgers. Returns the answer and
    /// whether the task goes on (never, once the stream is deleted).
    pub(super) async fn delete_stream(&mut self) -> (Result<u32>, bool) {
        if !self.drain().await {
            return (Err(self.ownership.lost_error()), false);
        }
        match lifecycle::delete_record(&self.rec, &self.ownership).await {
            Ok(true) => {}
            Ok(false) => {
                // Someone else deleted it: this acquisition is over too.
                self.mark_deleted().await;
                return (Err(self.rec.gone()), false);
            }
            Err(e) => return self.lifecycle_answer(Err(e)).await,
        }
        let n = lifecycle::delete_segments(&mut self.rec, &mut self.segments).await;
        self.mark_deleted().await;
        (Ok(n), false)
    }

    /// The stream is gone: drop the segment state and the readers' cached state, give the
    /// lease up, and end this acquisition so that later requests find no stream (or create a
    /// new one).
    async fn mark_deleted(&mut self) {
        self.segments.current = None;
        self.segments.healthy = false;
        self.ownership.end_deleted().await;
        // Readers waiting at the tail wake up and find nothing.
        self.rec.tail.send_replace(Default::default());
    }

    /// The stream task's part of a sweep: the lifecycle tick (time roll, retention), then the
    /// orphan ledgers among `candidates` (labelled with this stream, unlisted in its record)
    /// are deleted after the record is rewritten by compare-and-set. Returns the answer and
    /// whether the task goes on.
    pub(super) async fn sweep(&mut self, candidates: Vec<u64>) -> (Result<StreamSweep>, bool) {
        if !self.on_tick().await {
            return (Err(self.ownership.lost_error()), false);
        }
        let spare = self.segments.spare.as_ref().map(|s| s.ledger.id().0);
        let orphans = labels::orphans(&self.rec.meta.value, spare, candidates);
        if orphans.is_empty() || !self.segments.healthy {
            return (
                Ok(StreamSweep {
                    orphans_deleted: Vec::new(),
                }),
                true,
            );
        }
        let r = self.rewrite_record("sweep orphan ledgers").await;
        if let Err(e) = r {
            return self.lifecycle_answer(Err(e)).await;
        }
        let mut deleted = Vec::new();
        for id in orphans {
            if labels::delete_labelled_ledger(&*self.rec.metadata, &self.rec.name, id).await {
                deleted.push(id);
            }
        }
        (
            Ok(StreamSweep {
                orphans_deleted: deleted,
            }),
            true,
        )
    }

    /// Rewrites the record (same content, new version): an earlier owner that created one of
    /// the orphan ledgers and has not yet added it to the record now fails its
    /// compare-and-set.
    ///
    /// # Errors
    /// `OwnershipLost`, `Metadata`.
    async fn rewrite_record(&mut self, op: &'static str) -> Result<()> {
        self.ownership.check()?;
        let same = self.rec.meta.value.clone();
        self.rec
            .cas_stream(same)
            .await
            .map_err(|e| self.ownership.update_err(op, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the payload an entry's add hands to the ledger writer is the in-flight entry's
    /// own buffer (the one the tail cache keeps), not a copy of it (issue 25 item 6; before,
    /// `payload.as_ref().clone()` copied the record set for `LedgerWriter::add`).
    /// Method: a record set of two records is encoded as `send_entry` does; the `Bytes` made
    /// by `shared_bytes` must start at the `Arc`'s first byte and have its length, and holding
    /// it must keep the `Arc`'s buffer alive (one more strong count) after the writer's own
    /// reference is dropped.
    #[test]
    fn ledger_add_gets_the_in_flight_buffer() {
        let payload = Arc::new(record_set::encode(
            0,
            1,
            [(1u64, &[7u8; 1024][..]), (2, &[9u8; 10][..])],
        ));
        let bytes = shared_bytes(&payload);
        assert_eq!(bytes.as_ptr(), payload.as_ptr());
        assert_eq!(bytes.len(), payload.len());
        assert_eq!(Arc::strong_count(&payload), 2);
        let expected = payload.as_ref().clone();
        drop(payload);
        assert_eq!(&bytes[..], &expected[..]);
    }
}

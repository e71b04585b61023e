//! The stream layer: streams as sequences of log segments, one ledger each (DistributedLog
//! `BKLogWriteHandler` / `BKAsyncLogWriter` / `BKAsyncLogReader`, reduced).
//!
//! * Every stream this proxy touches gets one **stream task** that owns its writer state: the
//!   open segment's [`LedgerWriter`], the stream metadata and its version, the last txid. Appends
//!   are commands sent to that task through a bounded channel and are applied in the order they
//!   were submitted.
//! * **Appends are pipelined** (DistributedLog's write proxy: many outstanding writes per
//!   stream, acknowledged in order): the task packs an append into entries, sends them
//!   (`LedgerWriter::add` assigns the entry id and sends at call time) and takes the next
//!   append without waiting, as long as fewer than [`StreamConfig::adds_in_flight_max`] entry
//!   adds are outstanding. Acknowledgements arrive in entry order; an append is answered once
//!   the entry holding its last record is acknowledged, and appends are answered strictly in
//!   submission order. Appends that are queued together are **batched**: the task takes them
//!   from the queue while they add up to less than [`StreamConfig::entry_size_bytes_target`]
//!   and packs their records into shared entries; each append still gets its own DLSNs and its
//!   own answer.
//! * Records are packed into record sets ([`crate::record_set`]) of up to
//!   [`StreamConfig::entry_size_bytes_target`] bytes, one per entry. A record's DLSN is
//!   (segment seq no, entry id, slot).
//! * An add that fails (storage error, or a fenced ledger: ownership lost) fails every append
//!   not yet answered that has records in flight, with the same kind of error; nothing after
//!   the failure point is acknowledged (the ledger writer fails every later add too).
//! * A segment rolls once its entries add up to [`StreamConfig::segment_size_bytes_max`]:
//!   every outstanding add is awaited (appends arriving meanwhile wait in the queue), the ledger
//!   is closed, the segment is marked `Completed` (last entry, last txid, record count, bytes)
//!   by compare-and-set, and the next entry opens a new segment with the next sequence number.
//! * The first time a stream is touched (read or write), or for all streams at once with
//!   [`StreamManager::recover_all`], any `InProgress` segment left by an
//!   earlier owner is recovered: its ledger is fenced and closed (`recover_ledger`), its last
//!   entry is read to learn the last txid and record count, and it is marked `Completed`. New
//!   writes go into a new segment. The same recovery runs before the next append after a
//!   storage error (the failed writer is dropped, DistributedLog's "writer is dead" rule).
//! * **One writer per stream** (DistributedLog's write lock, `lockTimeoutSeconds=0` as in its
//!   proxy): before a stream task is created, i.e. before this proxy recovers the stream's
//!   in-progress segment or writes to it, it takes the stream's lease in the metadata store
//!   under its identity ([`StreamConfig::owner_address`]). If another proxy holds it, the
//!   request fails at once with [`Error::OwnedElsewhere`] naming the owner, which clients
//!   follow as a redirect. Reads go through the same path: they are served by the owner only
//!   (a non-owner redirects; a read of a stream nobody owns makes this proxy its owner).
//! * Ownership is lost when the lease's `lost` flag rises (session expiry, lease released from
//!   outside), when an add or a close finds the segment's ledger fenced (someone recovered it
//!   under this writer), or when a stream metadata update finds another writer's version. The
//!   writer then drops its ledger writer and cached state without completing the segment
//!   (the next owner recovers it), gives the lease up, fails the current and queued requests
//!   with [`Error::OwnershipLost`] and ends its task. The lease is checked before every append
//!   and every segment start and watched while idle; a loss noticed while idle fails the next
//!   write with `OwnershipLost`. Any later request acquires the stream again (and is redirected
//!   while someone else owns it). As DistributedLog's docs stress, the lease alone is not what
//!   makes this safe: fencing and compare-and-set metadata updates are.
//! * Readers never touch the writer: the stream task publishes the segment list with each
//!   segment's readable end (its last entry once completed, the writer's LAC while in progress)
//!   through a `tokio::sync::watch`, and tail readers sleep on it. Entries just acknowledged are
//!   kept in a bounded cache, so tail reads are served without a bookie round trip.
//!
//! # Threading
//! [`StreamManager`] is shared (`Send + Sync`); use it from any tokio task.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quire_ledger::{AddFuture, BookKeeper, LedgerOptions, LedgerReader, LedgerWriter};
use quire_metadata::{
    validate_stream_name, MetadataStore, SegmentMetadata, SegmentState, StreamLease,
    StreamMetadata, Versioned,
};
use quire_wire::{EntryId, LedgerId};
use tokio::sync::{mpsc, oneshot, watch, OnceCell};

use crate::dlsn::{Dlsn, ReadPosition};
use crate::error::{Error, Result};
use crate::record_set::{
    self, encoded_record_size_bytes, ENTRY_SIZE_BYTES_MAX, RECORD_SET_HEADER_SIZE_BYTES,
    RECORD_SIZE_BYTES_MAX,
};
use crate::types::{ReadBatch, WriteResult};

/// Stream layer settings.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// A segment rolls once its entry payloads reach this many bytes (DistributedLog
    /// `maxLogSegmentBytes`, default 256 MiB).
    pub segment_size_bytes_max: u64,
    /// Records are packed into one entry until it would pass this size; at most
    /// [`ENTRY_SIZE_BYTES_MAX`]. A record larger than the target goes alone into its entry.
    pub entry_size_bytes_target: usize,
    /// Ensemble size E of each segment's ledger (DistributedLog `bkcEnsembleSize`, 3).
    pub ensemble_size: u8,
    /// Write quorum Qw (3).
    pub write_quorum: u8,
    /// Ack quorum Qa (2).
    pub ack_quorum: u8,
    /// Ledger password; its SHA-1 is the master key.
    pub password: Vec<u8>,
    /// Entry adds outstanding per stream (across appends) before the stream task stops taking
    /// appends and waits for the oldest (DistributedLog's outstanding-writes bound).
    pub adds_in_flight_max: usize,
    /// Bytes of recently acknowledged entries kept per stream for tail reads.
    pub tail_cache_bytes_max: usize,
    /// Appends queued per stream before submitters wait.
    pub append_queue_max: usize,
    /// This proxy's identity as a stream owner: the address (`host:port`) clients can reach it
    /// at, recorded in each stream lease it takes and handed to clients in redirects
    /// (DistributedLog's lock client id is the proxy's socket address). Empty (the default):
    /// a unique placeholder `unadvertised-<pid>-<n>` is used, fine for a single proxy but
    /// useless to a redirected client.
    pub owner_address: String,
}

impl Default for StreamConfig {
    fn default() -> Self {
        Self {
            segment_size_bytes_max: 256 * 1024 * 1024,
            entry_size_bytes_target: 256 * 1024,
            ensemble_size: 3,
            write_quorum: 3,
            ack_quorum: 2,
            password: b"quire".to_vec(),
            adds_in_flight_max: 64,
            tail_cache_bytes_max: 8 * 1024 * 1024,
            append_queue_max: 64,
            owner_address: String::new(),
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn storage(stream: &str, op: &'static str, e: quire_ledger::Error) -> Error {
    Error::Storage {
        stream: stream.to_string(),
        op,
        source: Box::new(e),
    }
}

/// A ledger error of the writer: `Fenced` means another writer recovered the segment under
/// this one (BookKeeper `LedgerFencedException`), i.e. ownership is lost.
fn writer_storage(stream: &str, op: &'static str, e: quire_ledger::Error) -> Error {
    match e {
        quire_ledger::Error::Fenced { ledger } => Error::OwnershipLost {
            stream: stream.to_string(),
            reason: format!("{op}: ledger {ledger} was fenced, another writer recovered the segment under this one"),
        },
        other => storage(stream, op, other),
    }
}

/// Why the lease says ownership is gone, if it does.
fn lease_lost_reason(lost: &watch::Receiver<bool>) -> Option<String> {
    if *lost.borrow() {
        Some("the ownership lease was lost (session expired or lease released)".into())
    } else if lost.has_changed().is_err() {
        Some("the metadata store dropped the ownership lease".into())
    } else {
        None
    }
}

static PLACEHOLDER_IDENTITY_SEQ: AtomicU64 = AtomicU64::new(1);

/// What readers know about one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SegmentView {
    seq_no: u64,
    ledger_id: u64,
    /// Last entry a reader may read: the final last entry once completed, else the LAC.
    readable_last_entry: Option<u64>,
    completed: bool,
}

/// The readers' view of a stream, published by its stream task.
#[derive(Debug, Clone, Default)]
struct TailState {
    segments: Vec<SegmentView>,
}

impl TailState {
    fn from_metadata(meta: &StreamMetadata) -> Self {
        let segments = meta
            .segments
            .iter()
            .map(|s| SegmentView {
                seq_no: s.seq_no,
                ledger_id: s.ledger_id,
                readable_last_entry: if s.state == SegmentState::Completed {
                    s.last_entry
                } else {
                    None
                },
                completed: s.state == SegmentState::Completed,
            })
            .collect();
        Self { segments }
    }

    /// The segment and position holding the first readable record at or after `pos`, or
    /// `None` when nothing is readable there yet.
    fn resolve(&self, pos: Dlsn) -> Option<(SegmentView, Dlsn)> {
        let mut pos = pos;
        for seg in &self.segments {
            if seg.seq_no < pos.segment_seq_no {
                continue;
            }
            if seg.seq_no > pos.segment_seq_no {
                pos = Dlsn::new(seg.seq_no, 0, 0);
            }
            match seg.readable_last_entry {
                Some(last) if pos.entry_id <= last => return Some((seg.clone(), pos)),
                _ if seg.completed => continue,
                _ => return None,
            }
        }
        None
    }
}

/// Recently acknowledged entries, by (ledger, entry), bounded by bytes; oldest evicted first.
#[derive(Default)]
struct TailCache {
    entries: BTreeMap<(u64, u64), Arc<Vec<u8>>>,
    size_bytes: usize,
}

impl TailCache {
    fn insert(&mut self, key: (u64, u64), payload: Arc<Vec<u8>>, size_bytes_max: usize) {
        self.size_bytes += payload.len();
        if let Some(old) = self.entries.insert(key, payload) {
            self.size_bytes -= old.len();
        }
        while self.size_bytes > size_bytes_max {
            let Some((_, evicted)) = self.entries.pop_first() else {
                break;
            };
            self.size_bytes -= evicted.len();
        }
    }
}

/// State shared between a stream's task and its readers.
#[derive(Default)]
struct StreamShared {
    cache: Mutex<TailCache>,
    /// Open ledger readers by ledger id, bounded by `READERS_CACHED_MAX`.
    readers: Mutex<HashMap<u64, LedgerReader>>,
    /// Set (with the reason) once the stream task lost ownership and gave the stream up.
    lost: Mutex<Option<String>>,
    /// True once some request was answered with `OwnershipLost` for this acquisition.
    loss_reported: AtomicBool,
}

const READERS_CACHED_MAX: usize = 16;
/// Entries a reader fetches concurrently ahead of the one it decodes.
const READ_AHEAD_ENTRIES_MAX: usize = 4;

enum Command {
    Append {
        records: Vec<(u64, Vec<u8>)>,
        reply: oneshot::Sender<Result<WriteResult>>,
    },
    Close {
        reply: oneshot::Sender<Result<()>>,
    },
}

/// A stream acquired by this proxy: the way to its task and to its readers' view.
pub(crate) struct StreamHandle {
    name: String,
    commands: mpsc::Sender<Command>,
    tail: watch::Receiver<TailState>,
    shared: Arc<StreamShared>,
    /// The lease's `lost` flag, to notice a loss before the task does.
    lease_lost: watch::Receiver<bool>,
}

impl StreamHandle {
    /// Why this acquisition of the stream is over, if it is.
    fn lost_reason(&self) -> Option<String> {
        if let Some(r) = self.shared.lost.lock().expect("lost lock").clone() {
            return Some(r);
        }
        lease_lost_reason(&self.lease_lost)
    }
}

/// The streams this proxy owns.
///
/// # Threading
/// Shared (`Send + Sync`).
pub struct StreamManager {
    metadata: Arc<dyn MetadataStore>,
    bookkeeper: BookKeeper,
    config: Arc<StreamConfig>,
    identity: String,
    streams: Mutex<HashMap<String, Arc<OnceCell<Arc<StreamHandle>>>>>,
    shutting_down: AtomicBool,
    /// The runtime the manager was made on: stream tasks run there even when an acquisition
    /// happens inside a catch-up read on the lower-priority read runtime.
    runtime: Option<tokio::runtime::Handle>,
}

impl std::fmt::Debug for StreamManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamManager")
            .field("identity", &self.identity)
            .field("config", &self.config)
            .finish()
    }
}

impl StreamManager {
    /// Makes a manager over a metadata store and a ledger client. Nothing is read until a
    /// stream is first used. Its owner identity is `config.owner_address` (see there).
    ///
    /// # Panics
    /// If the config breaks E >= Qw >= Qa >= 1 or the entry target is outside
    /// `[RECORD_SET_HEADER_SIZE_BYTES + 12, ENTRY_SIZE_BYTES_MAX]`.
    pub fn new(
        metadata: Arc<dyn MetadataStore>,
        bookkeeper: BookKeeper,
        config: StreamConfig,
    ) -> Arc<Self> {
        assert!(config.ensemble_size >= config.write_quorum, "E >= Qw");
        assert!(config.write_quorum >= config.ack_quorum, "Qw >= Qa");
        assert!(config.ack_quorum >= 1, "Qa >= 1");
        assert!(
            config.entry_size_bytes_target <= ENTRY_SIZE_BYTES_MAX,
            "entry target above the entry limit"
        );
        assert!(
            config.entry_size_bytes_target > RECORD_SET_HEADER_SIZE_BYTES,
            "entry target too small"
        );
        assert!(config.adds_in_flight_max >= 1 && config.append_queue_max >= 1);
        let identity = if config.owner_address.is_empty() {
            format!(
                "unadvertised-{}-{}",
                std::process::id(),
                PLACEHOLDER_IDENTITY_SEQ.fetch_add(1, Ordering::Relaxed)
            )
        } else {
            config.owner_address.clone()
        };
        Arc::new(Self {
            metadata,
            bookkeeper,
            identity,
            config: Arc::new(config),
            streams: Mutex::new(HashMap::new()),
            shutting_down: AtomicBool::new(false),
            runtime: tokio::runtime::Handle::try_current().ok(),
        })
    }

    /// The settings in force.
    pub fn config(&self) -> &StreamConfig {
        &self.config
    }

    /// The identity this manager takes stream leases under (its advertised address).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Creates an empty stream.
    ///
    /// # Errors
    /// `InvalidStreamName`, `StreamExists`, `Metadata`, `ShuttingDown`.
    pub async fn create_stream(&self, name: &str) -> Result<()> {
        self.check_running()?;
        validate_stream_name(name).map_err(|e| Error::from_metadata(name, "create stream", e))?;
        let meta = StreamMetadata {
            name: name.to_string(),
            segments: Vec::new(),
            max_txid: None,
            creation_time_ms: now_ms(),
        };
        self.metadata
            .create_stream(&meta)
            .await
            .map_err(|e| Error::from_metadata(name, "create stream", e))?;
        Ok(())
    }

    /// Names of every stream, sorted.
    ///
    /// # Errors
    /// `Metadata`.
    pub async fn list_streams(&self) -> Result<Vec<String>> {
        self.metadata
            .list_streams()
            .await
            .map_err(|e| Error::from_metadata("", "list streams", e))
    }

    /// Appends `records` (`(txid, payload)`) to `name` and returns once all are durable on the
    /// ack quorum. Appends to one stream are applied in submission order.
    ///
    /// # Errors
    /// Checked before anything is written: `RecordTooLarge` (a payload above
    /// [`RECORD_SIZE_BYTES_MAX`]), `TxidOutOfOrder` (a txid below the previous one or below the
    /// stream's last txid), `BadRequest` (no records), `NoSuchStream` (unless
    /// `create_if_missing`), `InvalidStreamName`, `OwnedElsewhere` (another proxy owns the
    /// stream; redirect), `OwnershipLost` (this proxy lost the stream since its last request;
    /// the next request acquires it again). During the write: `Storage`, `Metadata` or
    /// `OwnershipLost`; then records not acknowledged may or may not be in the log after
    /// recovery.
    pub async fn append(
        &self,
        name: &str,
        records: Vec<(u64, Vec<u8>)>,
        create_if_missing: bool,
    ) -> Result<WriteResult> {
        let rx = self.submit_append(name, records, create_if_missing).await?;
        rx.await.map_err(|_| Error::ShuttingDown)?
    }

    /// Queues an append and returns the receiver of its result. Appends submitted one after
    /// another (each awaited up to here) are applied in that order.
    pub(crate) async fn submit_append(
        &self,
        name: &str,
        records: Vec<(u64, Vec<u8>)>,
        create_if_missing: bool,
    ) -> Result<oneshot::Receiver<Result<WriteResult>>> {
        if records.is_empty() {
            return Err(Error::BadRequest {
                reason: "a write needs at least one record".into(),
            });
        }
        if let Some((i, (_, p))) = records
            .iter()
            .enumerate()
            .find(|(_, (_, p))| p.len() > RECORD_SIZE_BYTES_MAX)
        {
            return Err(Error::RecordTooLarge {
                record_index: i,
                size_bytes: p.len(),
                max_bytes: RECORD_SIZE_BYTES_MAX,
            });
        }
        let handle = self.stream(name, create_if_missing, true).await?;
        let (reply, rx) = oneshot::channel();
        if handle
            .commands
            .send(Command::Append { records, reply })
            .await
            .is_err()
        {
            // The task ended: it lost the stream (or the manager is stopping).
            return Err(match handle.lost_reason() {
                Some(reason) => {
                    handle.shared.loss_reported.store(true, Ordering::SeqCst);
                    Error::OwnershipLost {
                        stream: name.to_string(),
                        reason,
                    }
                }
                None => Error::ShuttingDown,
            });
        }
        Ok(rx)
    }

    /// Reads up to `max_records` records (and about `max_bytes` payload bytes, but at least one
    /// record when one is readable) from `from`, across segment boundaries; in the segment being
    /// written only entries up to the writer's LAC are visible. When nothing is readable at
    /// `from`, waits up to `wait` for a write to make something readable.
    ///
    /// # Errors
    /// `NoSuchStream`, `InvalidStreamName`, `BadRequest` (`max_records` = 0), `Storage`,
    /// `OwnedElsewhere` (reads are served by the stream's owner only).
    pub async fn read(
        &self,
        name: &str,
        from: ReadPosition,
        max_records: u32,
        max_bytes: u32,
        wait: Duration,
    ) -> Result<ReadBatch> {
        if max_records == 0 {
            return Err(Error::BadRequest {
                reason: "max_records must be at least 1".into(),
            });
        }
        let handle = self.stream(name, false, false).await?;
        let deadline = tokio::time::Instant::now() + wait;
        let mut tail = handle.tail.clone();
        let mut pos = match from {
            ReadPosition::Head => Dlsn::new(0, 0, 0),
            ReadPosition::Dlsn(d) => d,
        };
        loop {
            let plan = tail.borrow_and_update().resolve(pos);
            match plan {
                Some((seg, start)) => {
                    let (records, next) = self
                        .read_segment(
                            &handle,
                            &seg,
                            start,
                            max_records as usize,
                            max_bytes as usize,
                        )
                        .await?;
                    if !records.is_empty() {
                        return Ok(ReadBatch {
                            records,
                            next: ReadPosition::Dlsn(next),
                        });
                    }
                    // Only slots past the end of an entry were asked for: move on.
                    pos = next;
                }
                None => {
                    let woke = tokio::time::timeout_at(deadline, tail.changed()).await;
                    match woke {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) | Err(_) => {
                            return Ok(ReadBatch {
                                records: Vec::new(),
                                next: from,
                            })
                        }
                    }
                }
            }
        }
    }

    /// Whether a read of `name` from `from` would fetch its first entry from the bookies (a
    /// catch-up read) rather than take it from the tail cache or wait at the tail. `false` when
    /// the stream is not acquired by this proxy, or its acquisition is over (the read itself then
    /// acquires it or answers with a redirect). The server runs catch-up reads on its
    /// lower-priority read runtime.
    pub fn is_catch_up_read(&self, name: &str, from: ReadPosition) -> bool {
        let handle = {
            let streams = self.streams.lock().expect("streams lock");
            match streams.get(name).and_then(|c| c.get().cloned()) {
                Some(h) => h,
                None => return false,
            }
        };
        if handle.lost_reason().is_some() {
            // The read would acquire the stream afresh: not a catch-up read's business.
            return false;
        }
        let pos = match from {
            ReadPosition::Head => Dlsn::new(0, 0, 0),
            ReadPosition::Dlsn(d) => d,
        };
        let Some((seg, start)) = handle.tail.borrow().resolve(pos) else {
            return false;
        };
        let cache = handle.shared.cache.lock().expect("cache lock");
        !cache.entries.contains_key(&(seg.ledger_id, start.entry_id))
    }

    async fn read_segment(
        &self,
        handle: &StreamHandle,
        seg: &SegmentView,
        start: Dlsn,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<(Vec<(Dlsn, u64, Vec<u8>)>, Dlsn)> {
        let last = seg
            .readable_last_entry
            .expect("resolve returns readable segments only");
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut next = start;
        let mut slot_first = start.slot_index as usize;
        // Read ahead: up to READ_AHEAD_ENTRIES_MAX entries are fetched concurrently, consumed
        // in entry order; fetches not needed are aborted when the batch is full.
        let mut ahead: VecDeque<tokio::task::JoinHandle<Result<Arc<Vec<u8>>>>> = VecDeque::new();
        let mut fetch_next = start.entry_id;
        let abort_all = |ahead: &mut VecDeque<tokio::task::JoinHandle<Result<Arc<Vec<u8>>>>>| {
            for h in ahead.drain(..) {
                h.abort();
            }
        };
        for entry in start.entry_id..=last {
            while fetch_next <= last && ahead.len() < READ_AHEAD_ENTRIES_MAX {
                let (bk, shared, name, ledger, e) = (
                    self.bookkeeper.clone(),
                    handle.shared.clone(),
                    handle.name.clone(),
                    seg.ledger_id,
                    fetch_next,
                );
                ahead.push_back(tokio::spawn(async move {
                    fetch_entry(&bk, &shared, &name, ledger, e).await
                }));
                fetch_next += 1;
            }
            let fetched = ahead
                .pop_front()
                .expect("window holds the current entry")
                .await;
            let payload = match fetched {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => {
                    abort_all(&mut ahead);
                    return Err(e);
                }
                Err(join) => {
                    abort_all(&mut ahead);
                    return Err(Error::Internal(format!("entry fetch task failed: {join}")));
                }
            };
            let set = record_set::decode(&payload).map_err(|e| Error::Storage {
                stream: handle.name.clone(),
                op: "decode record set",
                source: format!("ledger {} entry {entry}: {e}", seg.ledger_id).into(),
            })?;
            let count = set.records.len();
            for (slot, rec) in set.records.iter().enumerate().skip(slot_first) {
                let size = rec.payload.len() + crate::protocol::READ_RECORD_OVERHEAD_BYTES;
                if !out.is_empty() && (out.len() >= max_records || bytes + size > max_bytes) {
                    abort_all(&mut ahead);
                    return Ok((out, next));
                }
                let slot_index = u32::try_from(slot).expect("slot count bounded by entry size");
                out.push((
                    Dlsn::new(seg.seq_no, entry, slot_index),
                    rec.txid,
                    rec.payload.to_vec(),
                ));
                bytes += size;
                next = if slot + 1 < count {
                    Dlsn::new(seg.seq_no, entry, slot_index + 1)
                } else {
                    Dlsn::new(seg.seq_no, entry + 1, 0)
                };
            }
            if slot_first >= count {
                next = Dlsn::new(seg.seq_no, entry + 1, 0);
            }
            slot_first = 0;
            if out.len() >= max_records || bytes >= max_bytes {
                break;
            }
        }
        abort_all(&mut ahead);
        Ok((out, next))
    }

    /// Acquires every stream in the metadata store that no other proxy owns now, recovering
    /// any segment a previous owner left in progress, instead of at each stream's first use.
    /// Returns how many streams were acquired (streams owned elsewhere are skipped).
    ///
    /// # Errors
    /// The first stream that fails to recover (`Storage`, `Metadata`); the ones before it stay
    /// acquired.
    pub async fn recover_all(&self) -> Result<usize> {
        let names = self.list_streams().await?;
        let mut acquired = 0;
        for name in &names {
            match self.stream(name, false, false).await {
                Ok(_) => acquired += 1,
                Err(Error::OwnedElsewhere { .. } | Error::NoSuchStream { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(acquired)
    }

    /// Completes the open segment of every stream (close the ledger, mark it `Completed`),
    /// gives every stream lease up and refuses new requests with `ShuttingDown`. Streams not
    /// closed cleanly are recovered by the next owner anyway; this only saves it the fencing.
    ///
    /// # Errors
    /// The first `Storage` or `Metadata` error met; the other streams are still closed.
    pub async fn shutdown(&self) -> Result<()> {
        self.shutting_down.store(true, Ordering::SeqCst);
        let cells: Vec<_> = self
            .streams
            .lock()
            .expect("streams lock")
            .values()
            .cloned()
            .collect();
        let mut first_err = None;
        for cell in cells {
            let Some(handle) = cell.get() else { continue };
            let (reply, rx) = oneshot::channel();
            if handle.commands.send(Command::Close { reply }).await.is_ok() {
                if let Ok(Err(e)) = rx.await {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn check_running(&self) -> Result<()> {
        if self.shutting_down.load(Ordering::SeqCst) {
            Err(Error::ShuttingDown)
        } else {
            Ok(())
        }
    }

    /// The handle of `name`, acquiring the stream (taking its lease, recovering its
    /// in-progress segments and starting its task) the first time, and again after ownership
    /// was lost. With `report_loss`, a loss no request has been told about yet is returned as
    /// `OwnershipLost` once (so a writer learns that its stream moved) before acquiring again.
    async fn stream(
        &self,
        name: &str,
        create_if_missing: bool,
        report_loss: bool,
    ) -> Result<Arc<StreamHandle>> {
        for _ in 0..3 {
            self.check_running()?;
            let cell = self
                .streams
                .lock()
                .expect("streams lock")
                .entry(name.to_string())
                .or_default()
                .clone();
            let result = cell
                .get_or_try_init(|| self.acquire(name, create_if_missing))
                .await
                .cloned();
            let handle = match result {
                Ok(h) => h,
                Err(e) => {
                    // Do not keep entries for names that failed (unknown or invalid streams,
                    // streams owned elsewhere).
                    let mut streams = self.streams.lock().expect("streams lock");
                    if streams.get(name).is_some_and(|c| c.get().is_none()) {
                        streams.remove(name);
                    }
                    return Err(e);
                }
            };
            let Some(reason) = handle.lost_reason() else {
                return Ok(handle);
            };
            // This acquisition is over: forget it, so the next attempt acquires afresh.
            {
                let mut streams = self.streams.lock().expect("streams lock");
                if streams.get(name).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                    streams.remove(name);
                }
            }
            if report_loss && !handle.shared.loss_reported.swap(true, Ordering::SeqCst) {
                return Err(Error::OwnershipLost {
                    stream: name.to_string(),
                    reason,
                });
            }
        }
        Err(Error::OwnershipLost {
            stream: name.to_string(),
            reason: "ownership was lost again right after each acquisition".into(),
        })
    }

    async fn acquire(&self, name: &str, create_if_missing: bool) -> Result<Arc<StreamHandle>> {
        validate_stream_name(name).map_err(|e| Error::from_metadata(name, "acquire stream", e))?;
        let meta = match self.metadata.read_stream(name).await {
            Ok(m) => m,
            Err(quire_metadata::Error::NotFound { .. }) if create_if_missing => {
                match self.create_stream(name).await {
                    Ok(()) | Err(Error::StreamExists { .. }) => {}
                    Err(e) => return Err(e),
                }
                self.metadata
                    .read_stream(name)
                    .await
                    .map_err(|e| Error::from_metadata(name, "read stream", e))?
            }
            Err(e) => return Err(Error::from_metadata(name, "read stream", e)),
        };
        // The write lock, without waiting (DistributedLog proxy: lockTimeoutSeconds=0).
        let lease = match self.metadata.try_acquire_stream(name, &self.identity).await {
            Ok(Ok(lease)) => lease,
            Ok(Err(owner)) => {
                return Err(Error::OwnedElsewhere {
                    stream: name.to_string(),
                    owner,
                })
            }
            Err(e) => return Err(Error::from_metadata(name, "acquire stream lease", e)),
        };
        let lease_lost = lease.lost.clone();
        let (tail_tx, tail_rx) = watch::channel(TailState::from_metadata(&meta.value));
        let shared = Arc::new(StreamShared::default());
        let mut writer = Writer {
            name: name.to_string(),
            metadata: self.metadata.clone(),
            bookkeeper: self.bookkeeper.clone(),
            config: self.config.clone(),
            last_txid: meta.value.max_txid,
            meta,
            current: None,
            healthy: true,
            closed: false,
            tail: tail_tx,
            shared: shared.clone(),
            lease: Some(lease),
            entries: VecDeque::new(),
            appends: VecDeque::new(),
            appends_base: 0,
            acked: None,
        };
        if let Err(e) = writer.recover().await {
            writer.release_lease().await;
            return Err(e);
        }
        let (tx, rx) = mpsc::channel(self.config.append_queue_max);
        match &self.runtime {
            Some(rt) => drop(rt.spawn(writer.run(rx))),
            None => drop(tokio::spawn(writer.run(rx))),
        }
        tracing::info!(stream = name, owner = %self.identity, "acquired stream");
        Ok(Arc::new(StreamHandle {
            name: name.to_string(),
            commands: tx,
            tail: tail_rx,
            shared,
            lease_lost,
        }))
    }
}

/// One entry's payload: from the tail cache, else from the bookies through a cached reader.
async fn fetch_entry(
    bookkeeper: &BookKeeper,
    shared: &StreamShared,
    name: &str,
    ledger: u64,
    entry: u64,
) -> Result<Arc<Vec<u8>>> {
    if let Some(p) = shared
        .cache
        .lock()
        .expect("cache lock")
        .entries
        .get(&(ledger, entry))
    {
        return Ok(p.clone());
    }
    // A cached reader may predate a change of the ledger's metadata: retry once with a
    // freshly opened one before giving up.
    let mut last_err = None;
    for attempt in 0..2 {
        let cached = if attempt == 0 {
            shared
                .readers
                .lock()
                .expect("readers lock")
                .get(&ledger)
                .cloned()
        } else {
            None
        };
        let reader = match cached {
            Some(r) => r,
            None => {
                let r = bookkeeper
                    .open_ledger(LedgerId(ledger))
                    .await
                    .map_err(|e| storage(name, "open ledger", e))?;
                let mut readers = shared.readers.lock().expect("readers lock");
                if readers.len() >= READERS_CACHED_MAX {
                    readers.clear();
                }
                readers.insert(ledger, r.clone());
                r
            }
        };
        match reader.read(EntryId(entry)).await {
            Ok(p) => return Ok(Arc::new(p)),
            Err(e) => {
                shared.readers.lock().expect("readers lock").remove(&ledger);
                last_err = Some(e);
            }
        }
    }
    Err(storage(
        name,
        "read entry",
        last_err.expect("two failed attempts"),
    ))
}

/// The segment being written.
struct OpenSegment {
    seq_no: u64,
    ledger: LedgerWriter,
    /// Entry id the next add gets.
    next_entry: u64,
    /// Records added to the segment (acknowledged or in flight).
    record_count: u64,
    /// Entry payload bytes added.
    size_bytes: u64,
    /// txid of the last record added.
    last_txid: u64,
    /// Highest entry acknowledged.
    last_acked_entry: Option<u64>,
}

/// One entry add in flight.
struct InFlight {
    future: AddFuture,
    seq_no: u64,
    entry: u64,
    ledger_id: u64,
    payload: Arc<Vec<u8>>,
}

/// An append waiting for its reply. Appends are answered strictly in submission order.
struct PendingAppend {
    reply: oneshot::Sender<Result<WriteResult>>,
    /// Set when the append was refused before anything was written (answered in its turn).
    refused: Option<Error>,
    count: u64,
    first: Option<Dlsn>,
    last: Option<Dlsn>,
    /// True once every record of the append is in an entry that was sent.
    issued: bool,
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

/// The same kind of error as `e`, for every later append that fails with it.
fn same_kind(e: &Error) -> Error {
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

/// A stream's writer state, owned by its task.
struct Writer {
    name: String,
    metadata: Arc<dyn MetadataStore>,
    bookkeeper: BookKeeper,
    config: Arc<StreamConfig>,
    meta: Versioned<StreamMetadata>,
    current: Option<OpenSegment>,
    /// Highest txid acknowledged or in flight (the `max_txid` rule is checked against it).
    last_txid: Option<u64>,
    /// False after a storage or metadata error: recover before the next append.
    healthy: bool,
    closed: bool,
    tail: watch::Sender<TailState>,
    shared: Arc<StreamShared>,
    /// The stream's lease while this writer holds it.
    lease: Option<StreamLease>,
    /// Entry adds sent and not yet acknowledged, in entry order (all in the open segment).
    entries: VecDeque<InFlight>,
    /// Appends taken from the queue and not yet answered, in submission order.
    appends: VecDeque<PendingAppend>,
    /// Id of `appends.front()`; ids count every append this writer took.
    appends_base: u64,
    /// (segment seq no, entry id) of the last entry acknowledged.
    acked: Option<(u64, u64)>,
}

/// Resolves once the lease says ownership is gone; never without a lease.
async fn lease_lost(lost: &mut Option<watch::Receiver<bool>>) -> String {
    let Some(rx) = lost.as_mut() else {
        return std::future::pending().await;
    };
    match rx.wait_for(|l| *l).await {
        Ok(_) => "the ownership lease was lost (session expired or lease released)".into(),
        Err(_) => "the metadata store dropped the ownership lease".into(),
    }
}

impl Writer {
    /// The stream task. It takes appends from the queue while fewer than
    /// `adds_in_flight_max` entry adds are outstanding, packs each (with the appends queued
    /// behind it, up to `entry_size_bytes_target`) into entries, sends them at once and takes
    /// the next append without waiting; acknowledgements are handled as they arrive, in entry
    /// order, and each append is answered once the entry holding its last record is
    /// acknowledged (DistributedLog `BKAsyncLogWriter`: many outstanding writes per stream,
    /// transmitted in entries, acknowledged in order).
    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut lost_rx = self.lease.as_ref().map(|l| l.lost.clone());
        let mut stashed: Option<Command> = None;
        enum Event {
            Acked(std::result::Result<EntryId, quire_ledger::Error>),
            Lost(String),
            Command(Option<Command>),
        }
        loop {
            let accepting = self.entries.len() < self.config.adds_in_flight_max;
            let event = match stashed.take() {
                Some(cmd) if accepting => Event::Command(Some(cmd)),
                held => {
                    stashed = held;
                    let take = accepting && stashed.is_none();
                    tokio::select! {
                        biased;
                        r = oldest_add(&mut self.entries) => Event::Acked(r),
                        reason = lease_lost(&mut lost_rx) => Event::Lost(reason),
                        cmd = commands.recv(), if take => Event::Command(cmd),
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
                    if r.is_err() {
                        self.fail();
                    }
                    self.closed = true;
                    lost_rx = None;
                    self.release_lease().await;
                    let _ = reply.send(r);
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
            commands.close();
            let mut rest: Vec<Command> = stashed.into_iter().collect();
            while let Some(cmd) = commands.recv().await {
                rest.push(cmd);
            }
            for cmd in rest {
                match cmd {
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
                }
            }
        }
        tracing::debug!(stream = %self.name, "stream task ends");
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
    async fn on_write_failure(&mut self, e: Error) -> bool {
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
    async fn drain(&mut self) -> bool {
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
        self.answer_ready();
        Ok(())
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
        // Check every append's txids before writing anything; refused appends are answered in
        // their turn and write nothing.
        let mut records_of = Vec::with_capacity(batch.len());
        for (records, reply) in batch {
            let id = self.appends_base + self.appends.len() as u64;
            let mut refused = None;
            let mut prev = self.last_txid;
            for (i, (txid, payload)) in records.iter().enumerate() {
                assert!(
                    payload.len() <= RECORD_SIZE_BYTES_MAX,
                    "sizes are checked at submission"
                );
                if let Some(p) = prev {
                    if *txid < p {
                        refused = Some(Error::TxidOutOfOrder {
                            record_index: i,
                            txid: *txid,
                            last_txid: p,
                        });
                        break;
                    }
                }
                prev = Some(*txid);
            }
            let count = records.len() as u64;
            if refused.is_none() {
                self.last_txid = prev;
                records_of.push((id, records));
            }
            self.appends
                .push_back(PendingAppend::new(reply, count, refused));
        }
        match self.write_records(&records_of).await {
            Ok(()) => {
                self.answer_ready();
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
        let future = seg.ledger.add(payload.as_ref().clone());
        seg.next_entry += 1;
        seg.record_count += records.len() as u64;
        seg.size_bytes += payload.len() as u64;
        seg.last_txid = records[records.len() - 1].1;
        let seq_no = seg.seq_no;
        let roll = seg.size_bytes >= self.config.segment_size_bytes_max;
        self.entries.push_back(InFlight {
            future,
            seq_no,
            entry,
            ledger_id: seg.ledger.id().0,
            payload,
        });
        for (slot, (id, _, _, last_of_append)) in records.iter().enumerate() {
            let slot = u32::try_from(slot).expect("records per entry bounded by entry size");
            let dlsn = Dlsn::new(seq_no, entry, slot);
            let a = &mut self.appends[(id - self.appends_base) as usize];
            a.first.get_or_insert(dlsn);
            a.last = Some(dlsn);
            a.issued |= *last_of_append;
        }
        while self.entries.len() >= self.config.adds_in_flight_max
            || (roll && !self.entries.is_empty())
        {
            self.complete_oldest().await?;
        }
        if roll {
            self.complete_current().await?;
        }
        Ok(())
    }

    /// Gives the lease back to the metadata store (a no-op if it was already lost).
    async fn release_lease(&mut self) {
        if let Some(lease) = self.lease.take() {
            if let Err(e) = self.metadata.release_stream(lease).await {
                tracing::warn!(stream = %self.name, error = %e, "releasing the stream lease failed");
            }
        }
    }

    /// Ownership is gone: drop the ledger writer and cached state without completing the
    /// segment (the next owner recovers it), give the lease up and mark the stream lost.
    async fn lose(&mut self, reason: String) {
        tracing::warn!(stream = %self.name, %reason, "giving up stream ownership");
        self.current = None;
        self.healthy = false;
        *self.shared.cache.lock().expect("cache lock") = TailCache::default();
        self.shared.readers.lock().expect("readers lock").clear();
        self.release_lease().await;
        *self.shared.lost.lock().expect("lost lock") = Some(reason);
    }

    /// `OwnershipLost` if the lease says ownership is gone (DistributedLog
    /// `checkOwnershipAndReacquire` before every transmit and segment start).
    fn check_ownership(&self) -> Result<()> {
        let reason = match &self.lease {
            None => Some("this proxy holds no lease for the stream".to_string()),
            Some(l) => lease_lost_reason(&l.lost),
        };
        match reason {
            Some(reason) => Err(Error::OwnershipLost {
                stream: self.name.clone(),
                reason,
            }),
            None => Ok(()),
        }
    }

    fn meta_err(&self, op: &'static str, e: quire_metadata::Error) -> Error {
        Error::from_metadata(&self.name, op, e)
    }

    /// A failed compare-and-set of the stream's metadata: another writer changed it.
    fn stream_update_err(&self, op: &'static str, e: quire_metadata::Error) -> Error {
        match e {
            quire_metadata::Error::BadVersion { expected, found, .. } => Error::OwnershipLost {
                stream: self.name.clone(),
                reason: format!("{op}: the stream's metadata was changed by another writer (version {found}, expected {expected})"),
            },
            other => self.meta_err(op, other),
        }
    }

    fn publish(&self) {
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
    }

    fn fail(&mut self) {
        // Dropping the ledger writer abandons its pending adds; the segment stays InProgress
        // in the metadata and is recovered (fenced and closed) before the next append.
        self.current = None;
        self.healthy = false;
    }

    /// Recovers every `InProgress` segment: fence and close its ledger, learn its end from the
    /// last entry, mark it `Completed`. Afterwards the writer is healthy with no open segment.
    async fn recover(&mut self) -> Result<()> {
        self.current = None;
        let fresh = self
            .metadata
            .read_stream(&self.name)
            .await
            .map_err(|e| self.meta_err("read stream", e))?;
        self.meta = fresh;
        let mut changed = false;
        let mut meta = self.meta.value.clone();
        for seg in meta
            .segments
            .iter_mut()
            .filter(|s| s.state == SegmentState::InProgress)
        {
            let lm = self
                .bookkeeper
                .recover_ledger(LedgerId(seg.ledger_id))
                .await
                .map_err(|e| storage(&self.name, "recover ledger", e))?;
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
                    let last_rec = set
                        .records
                        .last()
                        .expect("decode refuses empty record sets");
                    (
                        Some(last_rec.txid),
                        set.segment_record_index + set.records.len() as u64,
                    )
                }
            };
            tracing::info!(stream = %self.name, seq_no = seg.seq_no, ledger = seg.ledger_id, last_entry = ?lm.last_entry, record_count, "recovered in-progress segment");
            seg.state = SegmentState::Completed;
            seg.last_entry = lm.last_entry;
            seg.last_txid = last_txid.or(seg.first_txid);
            seg.record_count = record_count;
            seg.length_bytes = lm.length_bytes;
            if let Some(t) = last_txid {
                meta.max_txid = Some(meta.max_txid.map_or(t, |m| m.max(t)));
            }
            changed = true;
        }
        if changed {
            let version = self
                .metadata
                .update_stream(&meta, self.meta.version)
                .await
                .map_err(|e| self.stream_update_err("complete recovered segment", e))?;
            self.meta = Versioned {
                value: meta,
                version,
            };
        }
        self.last_txid = self.meta.value.max_txid;
        self.healthy = true;
        self.publish();
        Ok(())
    }

    /// Starts a new segment with a fresh ledger; its first record has `first_txid`.
    async fn open_segment(&mut self, first_txid: u64) -> Result<()> {
        assert!(self.current.is_none(), "one open segment at a time");
        self.check_ownership()?;
        let seq_no = self.meta.value.segments.last().map_or(1, |s| s.seq_no + 1);
        let mut custom = BTreeMap::new();
        custom.insert("quire.stream".to_string(), self.name.clone());
        custom.insert("quire.segment_seq_no".to_string(), seq_no.to_string());
        let c = &self.config;
        let ledger = self
            .bookkeeper
            .create_ledger(LedgerOptions {
                ensemble_size: c.ensemble_size,
                write_quorum: c.write_quorum,
                ack_quorum: c.ack_quorum,
                password: c.password.clone(),
                custom,
            })
            .await
            .map_err(|e| storage(&self.name, "create ledger", e))?;
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
        });
        let version = self
            .metadata
            .update_stream(&meta, self.meta.version)
            .await
            .map_err(|e| self.stream_update_err("start segment", e))?;
        self.meta = Versioned {
            value: meta,
            version,
        };
        tracing::debug!(stream = %self.name, seq_no, ledger = ledger.id().0, "started segment");
        self.current = Some(OpenSegment {
            seq_no,
            ledger,
            next_entry: 0,
            record_count: 0,
            size_bytes: 0,
            last_txid: first_txid,
            last_acked_entry: None,
        });
        self.publish();
        Ok(())
    }

    /// Closes the open segment's ledger and marks the segment `Completed`. Every add must have
    /// been acknowledged.
    async fn complete_current(&mut self) -> Result<()> {
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
        if seg.record_count > 0 {
            meta.max_txid = Some(
                meta.max_txid
                    .map_or(seg.last_txid, |m| m.max(seg.last_txid)),
            );
        }
        let version = self
            .metadata
            .update_stream(&meta, self.meta.version)
            .await
            .map_err(|e| self.stream_update_err("complete segment", e))?;
        tracing::debug!(stream = %self.name, seq_no = seg.seq_no, records = seg.record_count, "completed segment");
        self.meta = Versioned {
            value: meta,
            version,
        };
        self.current = None;
        self.publish();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(seq_no: u64, last: Option<u64>, completed: bool) -> SegmentView {
        SegmentView {
            seq_no,
            ledger_id: seq_no * 10,
            readable_last_entry: last,
            completed,
        }
    }

    #[test]
    fn resolve_walks_segments() {
        // Goal: positions map to the first readable record at or after them; method: a table
        // over completed, empty and in-progress segments.
        let t = TailState {
            segments: vec![
                view(1, Some(2), true),
                view(2, None, true),
                view(3, Some(0), false),
            ],
        };
        let at = |s, e, k| {
            t.resolve(Dlsn::new(s, e, k))
                .map(|(seg, p)| (seg.seq_no, p))
        };
        assert_eq!(at(0, 0, 0), Some((1, Dlsn::new(1, 0, 0))));
        assert_eq!(at(1, 2, 5), Some((1, Dlsn::new(1, 2, 5))));
        // Past the end of segment 1, over the empty segment 2, into segment 3.
        assert_eq!(at(1, 3, 0), Some((3, Dlsn::new(3, 0, 0))));
        assert_eq!(at(3, 0, 1), Some((3, Dlsn::new(3, 0, 1))));
        // Beyond the LAC of the in-progress segment, and beyond every segment.
        assert_eq!(at(3, 1, 0), None);
        assert_eq!(at(9, 0, 0), None);
        assert_eq!(TailState::default().resolve(Dlsn::new(0, 0, 0)), None);
    }

    #[test]
    fn tail_cache_is_bounded() {
        // Goal: the cache never holds more than its byte bound and evicts oldest first.
        let mut c = TailCache::default();
        for e in 0..10u64 {
            c.insert((1, e), Arc::new(vec![0; 100]), 350);
            assert!(c.size_bytes <= 350);
        }
        assert_eq!(
            c.entries.keys().copied().collect::<Vec<_>>(),
            vec![(1, 7), (1, 8), (1, 9)]
        );
    }
}

//! The engine: journal writer with group commit, write cache, checkpoint, replay.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io as stdio;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::future;
use glommio::{Latency, Shares, TaskQueueHandle};

use crate::format::{
    self, decode_entry_record, decode_file_header, decode_mark, decode_record, decode_segment,
    encode_entry_record, encode_file_header, encode_mark, encode_record, encode_segment,
    pad_to_block, round_up_block, HeaderCheck, Location, Mark, MarkDecode, Record, RecordDecode,
    StoredLedger, ENTRY_LOG_MAGIC, FILE_HEADER_BYTES, FORMAT_CURRENT, FORMAT_OLDEST_READABLE,
    INDEX_MAGIC, JOURNAL_MAGIC,
};
use crate::io::{DmaStorage, Storage, StorageFile, BLOCK_BYTES};
use crate::read_cache::ReadCache;
use crate::sync::{Completion, Notify, Signal};
use crate::throttle::{Throttle, BULK_CHUNK_BYTES};
use crate::{EngineConfig, Error, LacUpdate, LedgerState, ReadStats};

const MARK_FILE: &str = "checkpoint.qcp";
const MARK_TMP_FILE: &str = "checkpoint.qcp.tmp";
const INDEX_FILE: &str = "index.qix";
/// Bytes of zeros written per request while pre-writing a journal file.
const ZERO_CHUNK_BYTES: usize = 1 << 20;
/// Entry-log bytes buffered before one write during a checkpoint.
const ENTRY_LOG_WRITE_BYTES_MAX: usize = 1 << 20;
/// The next journal file is created in the background once the current one is this full
/// (numerator over 2: half full).
const PRECREATE_AT_FILL_HALVES: u64 = 1;
/// glommio shares of the journal writer's task queue (latency-sensitive).
const JOURNAL_QUEUE_SHARES: usize = 1000;
/// Preemption target of the journal writer's task queue.
const JOURNAL_QUEUE_LATENCY: Duration = Duration::from_millis(1);
/// glommio shares of the engine's background queue (checkpoint, journal pre-creation).
const BACKGROUND_QUEUE_SHARES: usize = 50;

fn journal_name(id: u64) -> String {
    format!("journal-{id:016x}.qj")
}
fn entry_log_name(id: u64) -> String {
    format!("entrylog-{id:016x}.qel")
}
fn parse_id(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let hex = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

fn io_err(
    op: &'static str,
    path: &Path,
    file_offset_bytes: u64,
) -> impl FnOnce(stdio::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io {
        op,
        path,
        file_offset_bytes,
        source,
    }
}

fn corrupt(path: &Path, file_offset_bytes: u64, reason: impl Into<String>) -> Error {
    Error::Corrupt {
        path: path.to_path_buf(),
        file_offset_bytes,
        reason: reason.into(),
    }
}

fn check_header(path: &Path, magic: [u8; 8], b: &[u8], id: u64) -> Result<(), Error> {
    match decode_file_header(magic, b) {
        HeaderCheck::Ok { file_id, .. } if file_id == id => Ok(()),
        HeaderCheck::Ok { file_id, .. } => Err(corrupt(
            path,
            0,
            format!("file header names id {file_id:#x}, file name says {id:#x}"),
        )),
        HeaderCheck::Unsupported(found) => Err(Error::UnsupportedFormat {
            path: path.to_path_buf(),
            found,
            oldest: FORMAT_OLDEST_READABLE,
            newest: FORMAT_CURRENT,
        }),
        HeaderCheck::Bad(reason) => Err(corrupt(path, 0, reason)),
    }
}

/// In-memory state of one ledger.
#[derive(Debug, Clone, Copy, Default)]
struct Ledger {
    master_key: Option<[u8; 20]>,
    fenced: bool,
    lac: Option<u64>,
    last_entry: Option<u64>,
}

impl Ledger {
    fn stored(&self) -> StoredLedger {
        StoredLedger {
            fenced: self.fenced,
            master_key: self.master_key,
            lac: self.lac,
            last_entry: self.last_entry,
        }
    }
}

/// End of the durable journal: where the next batch goes and its first sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct JournalPos {
    file_id: u64,
    offset: u64,
    next_seq: u64,
}

type Cache = BTreeMap<(u64, u64), Rc<Vec<u8>>>;

/// A journal file being created in the background: its id and the task creating it.
type Precreate<F> = (u64, glommio::Task<Result<F, Error>>);

struct State {
    ledgers: HashMap<u64, Ledger>,
    /// Ledgers whose state changed since the last checkpoint snapshot.
    dirty: HashSet<u64>,
    /// The write cache: durable journal entries not yet in an entry log.
    cache: Cache,
    cache_bytes: usize,
    /// The part of the cache a running checkpoint is writing out; still served to readers.
    flushing: Option<Rc<Cache>>,
    /// (ledger → entry → location) of every entry in the entry logs.
    index: HashMap<u64, BTreeMap<u64, Location>>,
    durable: JournalPos,
    mark: Mark,
    /// Set once a journal write or sync failed; the journal is then in an unknown state and
    /// every later add fails (restart and replay to recover). The kind of the first error (e.g.
    /// `StorageFull` for ENOSPC) and its message, both repeated in every later error.
    failed: Option<(stdio::ErrorKind, String)>,
}

struct Pending {
    record: Record,
    bytes: usize,
    enqueued: Instant,
    done: Rc<Completion<Result<(), Error>>>,
}

struct JournalCursor<F> {
    file_id: u64,
    file: Rc<F>,
    pos: u64,
    next_seq: u64,
}

struct EntryLogCursor<F> {
    id: u64,
    file: Rc<F>,
    pos: u64,
}

struct Inner<S: Storage> {
    cfg: EngineConfig,
    storage: S,
    st: RefCell<State>,
    queue: RefCell<VecDeque<Pending>>,
    queue_bytes: Cell<usize>,
    /// Owned by the writer task while it runs (taken out across awaits).
    journal: RefCell<Option<JournalCursor<S::File>>>,
    writer_signal: Signal,
    writer_done: Signal,
    writer_running: Cell<bool>,
    checkpoint_signal: Signal,
    /// Notified whenever a checkpoint ends (either way): adds waiting for write-cache room
    /// look again.
    checkpoint_done: Notify,
    /// Adds that had to wait for write-cache room (observability).
    write_cache_waits: Cell<u64>,
    checkpoint_lock: glommio::sync::Semaphore,
    index_file: Rc<S::File>,
    entry_log: RefCell<Option<EntryLogCursor<S::File>>>,
    next_entry_log_id: Cell<u64>,
    entry_log_readers: RefCell<HashMap<u64, Rc<S::File>>>,
    sync_count: Cell<u64>,
    closed: Cell<bool>,
    /// Per-ledger wake-ups for long-poll LAC reads; an item exists only while someone waits.
    lac_watchers: RefCell<HashMap<u64, Rc<Notify>>>,
    read_cache: RefCell<ReadCache>,
    /// Bumped whenever entry locations change (checkpoint publish), so that a read-ahead that
    /// started before does not insert bytes read from an old location.
    read_cache_gen: Cell<u64>,
    stats: Cell<ReadStats>,
    throttle: Throttle,
    /// The background creation of the next journal file: (its id, the task).
    precreate: RefCell<Option<Precreate<S::File>>>,
    /// Task queue of the checkpointer and of journal pre-creation (`Latency::NotImportant`).
    background_tq: TaskQueueHandle,
}

/// The storage engine of one bookie shard.
///
/// # Threading
/// Shard-local (`!Send`): create and use it on one glommio executor. [`Engine::open`] creates two
/// glommio task queues on that executor: `quire-journal` (latency matters, high shares) for the
/// journal writer, and `quire-engine-background` (not latency sensitive, low shares) for the
/// checkpointer and the background pre-creation of the next journal file.
pub struct Engine<S: Storage = DmaStorage> {
    inner: Rc<Inner<S>>,
}

impl Engine<DmaStorage> {
    /// Opens (creating directories and files if missing) the engine on the real disk and replays
    /// the journal from the checkpoint mark.
    ///
    /// # Errors
    /// `Error::Corrupt` naming the file and byte offset if a journal record that is followed by
    /// durable data is damaged, or if a header, index segment or the mark fails its checksum;
    /// `Error::UnsupportedFormat` for a file version this build does not read; `Error::Io`.
    /// A torn journal tail (the last, never acknowledged batch) is dropped silently.
    pub async fn open(config: EngineConfig) -> Result<Rc<Engine>, Error> {
        Engine::open_with(config, DmaStorage).await
    }
}

impl<S: Storage + 'static> Engine<S> {
    /// Like [`Engine::open`], on any [`Storage`] (e.g. a crash-simulating test disk).
    pub async fn open_with(config: EngineConfig, storage: S) -> Result<Rc<Engine<S>>, Error> {
        assert!(
            config.journal_file_size_bytes >= 2 * BLOCK_BYTES as u64,
            "journal files hold a header and a batch"
        );
        assert!(config.group_commit_bytes_max > 0);
        assert!(
            config.entry_size_bytes_max < u32::MAX as usize / 2,
            "entry sizes fit the u32 length fields"
        );
        let ex = glommio::executor();
        let journal_tq = ex.create_task_queue(
            Shares::Static(JOURNAL_QUEUE_SHARES),
            Latency::Matters(JOURNAL_QUEUE_LATENCY),
            "quire-journal",
        );
        let background_tq = ex.create_task_queue(
            Shares::Static(BACKGROUND_QUEUE_SHARES),
            Latency::NotImportant,
            "quire-engine-background",
        );
        let inner = open_inner(config, storage, background_tq).await?;
        let inner = Rc::new(inner);
        inner.writer_running.set(true);
        let spawn_err = |e: glommio::GlommioError<()>| Error::Io {
            op: "spawn engine task",
            path: inner.cfg.journal_dir.clone(),
            file_offset_bytes: 0,
            source: stdio::Error::other(e.to_string()),
        };
        glommio::spawn_local_into(writer_loop(inner.clone()), journal_tq)
            .map_err(spawn_err)?
            .detach();
        glommio::spawn_local_into(checkpoint_loop(inner.clone()), background_tq)
            .map_err(spawn_err)?
            .detach();
        Ok(Rc::new(Engine { inner }))
    }

    /// Stores entry `entry` of `ledger` and resolves once it is durable in the journal.
    /// `data` is stored verbatim; `lac` is the LAC piggybacked on the entry (the ledger's LAC
    /// becomes the max of all stored ones). The first add or fence of a ledger sets its master key.
    ///
    /// # Durability
    /// Resolves `Ok` only after the journal write and fdatasync covering this add completed.
    /// Concurrent adds share one write and one sync (group commit, BookKeeper journal rules:
    /// `group_commit_wait_max`, `group_commit_bytes_max`).
    /// # Errors
    /// `TooLarge` if `data.len() > entry_size_bytes_max`; `Unauthorized` if the ledger has a
    /// different master key; `Fenced` if the ledger is fenced and `recovery` is false (recovery
    /// adds are allowed on fenced ledgers, as in BookKeeper); `WriteCacheFull` if the write
    /// cache stayed full for `write_cache_wait_max` behind a running checkpoint; `Io` if the
    /// journal failed; `Closed` after [`Engine::close`].
    /// # Full disk
    /// When the next journal file cannot be created (e.g. ENOSPC while pre-writing it), the adds
    /// waiting for that roll fail with `Io` naming the file, the operation and the OS error
    /// (kind `StorageFull` for ENOSPC); the journal itself is intact and the next add retries the
    /// roll, so adds work again once space is freed. A failed journal write or fdatasync instead
    /// fails every later add until the engine is reopened (replay recovers every acknowledged
    /// add). Reads are not affected either way.
    /// # Cancellation
    /// Dropping the future does not withdraw the add; it may still become durable.
    pub async fn add_entry(
        &self,
        ledger: u64,
        entry: u64,
        master_key: [u8; 20],
        lac: Option<u64>,
        data: Vec<u8>,
        recovery: bool,
    ) -> Result<(), Error> {
        let inner = &self.inner;
        if inner.closed.get() {
            return Err(Error::Closed);
        }
        if data.len() > inner.cfg.entry_size_bytes_max {
            return Err(Error::TooLarge {
                size_bytes: data.len(),
                max: inner.cfg.entry_size_bytes_max,
            });
        }
        assert!(
            lac != Some(format::LAC_NONE),
            "LAC u64::MAX is not a valid entry id"
        );
        // Wait for room before the checks: from the fence check to the submission below there
        // is no await, so an add is never acknowledged after a fence of its ledger was answered.
        inner.wait_for_write_cache_room().await?;
        {
            let mut st = inner.st.borrow_mut();
            inner.check_failed(&st)?;
            let l = st.ledgers.entry(ledger).or_default();
            match l.master_key {
                Some(k) if k != master_key => return Err(Error::Unauthorized { ledger }),
                Some(_) => {}
                None => l.master_key = Some(master_key),
            }
            if l.fenced && !recovery {
                return Err(Error::Fenced { ledger });
            }
            st.dirty.insert(ledger);
        }
        let record = Record::Add {
            ledger,
            entry,
            lac,
            recovery,
            master_key,
            data,
        };
        inner.submit(record).await
    }

    /// Reads entry `entry` of `ledger`, or with `None` the last entry this shard holds for it.
    /// Recent entries come from the write cache with no disk I/O; older ones from the entry logs.
    ///
    /// # Errors
    /// `NoSuchLedger` / `NoSuchEntry` only when the index truly lacks it (never because of an
    /// I/O error); `NoSuchEntry { entry: u64::MAX }` for `None` on a ledger with no entries;
    /// `Corrupt` if the stored record fails its CRC32C; `Io`; `Closed`.
    pub async fn read_entry(&self, ledger: u64, entry: Option<u64>) -> Result<Vec<u8>, Error> {
        let inner = &self.inner;
        if inner.closed.get() {
            return Err(Error::Closed);
        }
        let loc = {
            let st = inner.st.borrow();
            let Some(l) = st.ledgers.get(&ledger) else {
                return Err(Error::NoSuchLedger { ledger });
            };
            let entry = match entry {
                Some(e) => e,
                None => l.last_entry.ok_or(Error::NoSuchEntry {
                    ledger,
                    entry: u64::MAX,
                })?,
            };
            let in_write_cache = st
                .cache
                .get(&(ledger, entry))
                .or_else(|| st.flushing.as_ref().and_then(|f| f.get(&(ledger, entry))));
            if let Some(d) = in_write_cache {
                inner.count(|s| s.write_cache_hits += 1);
                return Ok(d.as_ref().clone());
            }
            if let Some(d) = inner.read_cache.borrow().get(&(ledger, entry)) {
                inner.count(|s| s.read_cache_hits += 1);
                return Ok(d.as_ref().clone());
            }
            let Some(entries) = st.index.get(&ledger) else {
                return Err(Error::NoSuchEntry { ledger, entry });
            };
            let Some(loc) = entries.get(&entry) else {
                return Err(Error::NoSuchEntry { ledger, entry });
            };
            (entry, *loc, inner.read_ahead_plan(entries, entry, *loc))
        };
        let (entry, loc, plan) = loc;
        inner.read_entry_log(ledger, entry, loc, &plan).await
    }

    /// Whether entry `entry` of `ledger` would be answered from memory (write cache or read
    /// cache) right now, with no disk I/O. The bookie uses this to put a read in its tail-read or
    /// its catch-up task queue.
    pub fn is_cached(&self, ledger: u64, entry: Option<u64>) -> bool {
        let st = self.inner.st.borrow();
        let entry = match entry {
            Some(e) => e,
            None => match st.ledgers.get(&ledger).and_then(|l| l.last_entry) {
                Some(e) => e,
                None => return true,
            },
        };
        st.cache.contains_key(&(ledger, entry))
            || st
                .flushing
                .as_ref()
                .is_some_and(|f| f.contains_key(&(ledger, entry)))
            || self.inner.read_cache.borrow().contains(&(ledger, entry))
    }

    /// Long-poll read of the LAC (BookKeeper `READ_ENTRY` with `previousLAC` and a timeout,
    /// bookkeeper.md §1.3): waits until this shard's LAC of `ledger` is past `previous`
    /// (`None` = no LAC yet, so any LAC passes it), the ledger is fenced, or `timeout` elapsed,
    /// whichever comes first; then answers with the LAC and, when it passed `previous`, entry
    /// `previous + 1` (entry 0 for `None`) if this shard holds it.
    ///
    /// The waiter is woken by the journal writer when an add or fence of this ledger becomes
    /// durable (a per-ledger watcher; no polling). A ledger this shard has never seen is waited
    /// on like any other (its first add may be on its way), where BookKeeper would answer
    /// `NoSuchLedger`.
    ///
    /// # Errors
    /// `Closed` if the engine is or gets closed while waiting; the piggybacked read's `Io` or
    /// `Corrupt` error. A timeout is not an error: the answer then carries the unchanged LAC.
    /// # Cancellation
    /// Dropping the future unregisters the waiter.
    pub async fn wait_for_lac(
        &self,
        ledger: u64,
        previous: Option<u64>,
        timeout: Duration,
    ) -> Result<LacUpdate, Error> {
        let inner = &self.inner;
        let deadline = Instant::now() + timeout;
        let notify = inner
            .lac_watchers
            .borrow_mut()
            .entry(ledger)
            .or_default()
            .clone();
        let result = loop {
            if inner.closed.get() {
                break Err(Error::Closed);
            }
            let (lac, fenced) = {
                let st = inner.st.borrow();
                st.ledgers
                    .get(&ledger)
                    .map_or((None, false), |l| (l.lac, l.fenced))
            };
            let now = Instant::now();
            if lac > previous || fenced || now >= deadline {
                break Ok((lac, fenced));
            }
            let seen = notify.generation();
            future::or(
                notify.changed_since(seen),
                glommio::timer::sleep(deadline - now),
            )
            .await;
        };
        // The map and this waiter hold the only references: nobody else waits on the ledger.
        if Rc::strong_count(&notify) == 2 {
            inner.lac_watchers.borrow_mut().remove(&ledger);
        }
        drop(notify);
        let (lac, fenced) = result?;
        let mut next_entry = None;
        if lac > previous {
            let next = previous.map_or(0, |p| p + 1);
            match self.read_entry(ledger, Some(next)).await {
                Ok(data) => next_entry = Some((next, data)),
                Err(Error::NoSuchEntry { .. } | Error::NoSuchLedger { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(LacUpdate {
            lac,
            fenced,
            next_entry,
        })
    }

    /// Read-path counters since open (write cache, read cache, entry-log reads, read-ahead).
    pub fn read_stats(&self) -> ReadStats {
        let mut s = self.inner.stats.get();
        s.read_cache_bytes = self.inner.read_cache.borrow().bytes() as u64;
        s
    }

    /// Times a bulk write (checkpoint, journal pre-creation) waited for the rate limit or for a
    /// journal write/sync in flight, since open.
    pub fn background_write_waits(&self) -> u64 {
        self.inner.throttle.waits()
    }

    /// Number of long-poll waiters parked on `ledger` right now (observability and tests).
    pub fn lac_waiters(&self, ledger: u64) -> usize {
        self.inner
            .lac_watchers
            .borrow()
            .get(&ledger)
            .map_or(0, |n| Rc::strong_count(n) - 1)
    }

    /// The state of `ledger`, or `None` if this shard never saw an add or fence for it.
    pub fn ledger_state(&self, ledger: u64) -> Option<LedgerState> {
        let st = self.inner.st.borrow();
        st.ledgers.get(&ledger).map(|l| LedgerState {
            fenced: l.fenced,
            lac: l.lac,
            last_entry: l.last_entry,
        })
    }

    /// Fences `ledger` (BookKeeper fencing read): later normal adds get `Fenced`. Fencing an
    /// unknown ledger creates its state with this master key, as BookKeeper does.
    /// Returns the ledger's LAC once the fence record is durable.
    ///
    /// # Durability
    /// The fence record is journaled; resolves only after it is durable.
    /// # Errors
    /// `Unauthorized` for a different master key; `Io`; `Closed`.
    pub async fn fence(&self, ledger: u64, master_key: [u8; 20]) -> Result<Option<u64>, Error> {
        let inner = &self.inner;
        if inner.closed.get() {
            return Err(Error::Closed);
        }
        {
            let mut st = inner.st.borrow_mut();
            inner.check_failed(&st)?;
            let l = st.ledgers.entry(ledger).or_default();
            match l.master_key {
                Some(k) if k != master_key => return Err(Error::Unauthorized { ledger }),
                Some(_) => {}
                None => l.master_key = Some(master_key),
            }
            l.fenced = true;
            st.dirty.insert(ledger);
        }
        inner.submit(Record::Fence { ledger, master_key }).await?;
        let st = inner.st.borrow();
        Ok(st.ledgers.get(&ledger).and_then(|l| l.lac))
    }

    /// Runs one checkpoint now: write cache → entry log (synced) → index segment and ledger
    /// states (synced) → checkpoint mark (temp file, fsync, rename, fsync dir) → removes journal
    /// files wholly before the mark.
    ///
    /// # Errors
    /// `Io`; `Closed`. On error nothing is lost: the cache keeps the entries and the mark stays.
    pub async fn checkpoint(&self) -> Result<(), Error> {
        if self.inner.closed.get() {
            return Err(Error::Closed);
        }
        self.inner.checkpoint().await
    }

    /// Waits for queued adds to become durable, runs a final checkpoint and stops the
    /// background tasks. Later calls of any method return `Closed`.
    pub async fn close(&self) -> Result<(), Error> {
        let inner = &self.inner;
        if inner.closed.replace(true) {
            return Err(Error::Closed);
        }
        inner.writer_signal.notify();
        let watchers: Vec<Rc<Notify>> = inner.lac_watchers.borrow().values().cloned().collect();
        for w in watchers {
            w.notify_all();
        }
        while inner.writer_running.get() {
            inner.writer_done.wait().await;
        }
        // A pre-creation in progress finishes (a cancelled one would only leave a temp file,
        // which the next open deletes; finishing it keeps the directory tidy).
        let pre = inner.precreate.borrow_mut().take();
        if let Some((id, task)) = pre {
            if let Err(e) = task.await {
                tracing::warn!("background creation of journal {id} failed: {e}");
            }
        }
        let r = inner.checkpoint().await;
        inner.checkpoint_signal.notify();
        r
    }

    /// Number of journal fdatasyncs issued since open (group-commit observability).
    pub fn journal_sync_count(&self) -> u64 {
        self.inner.sync_count.get()
    }

    /// Adds that had to wait for write-cache room since open (see `write_cache_wait_max`).
    pub fn write_cache_waits(&self) -> u64 {
        self.inner.write_cache_waits.get()
    }

    /// Bytes of entry data in the live write cache (not counting a snapshot a checkpoint is
    /// writing).
    pub fn write_cache_bytes(&self) -> usize {
        self.inner.st.borrow().cache_bytes
    }
}

impl<S: Storage> Inner<S> {
    fn journal_path(&self, id: u64) -> PathBuf {
        self.cfg.journal_dir.join(journal_name(id))
    }

    fn check_failed(&self, st: &State) -> Result<(), Error> {
        match &st.failed {
            None => Ok(()),
            Some((kind, msg)) => Err(Error::Io {
                op: "journal write (journal failed earlier)",
                path: self.journal_path(st.durable.file_id),
                file_offset_bytes: st.durable.offset,
                source: stdio::Error::new(*kind, msg.clone()),
            }),
        }
    }

    async fn submit(&self, record: Record) -> Result<(), Error> {
        let bytes = match &record {
            Record::Add { data, .. } => {
                format::RECORD_HEADER_BYTES + format::ADD_FIXED_BYTES + data.len()
            }
            _ => format::RECORD_HEADER_BYTES + format::FENCE_PAYLOAD_BYTES,
        };
        let done = Completion::new();
        self.queue.borrow_mut().push_back(Pending {
            record,
            bytes,
            enqueued: Instant::now(),
            done: done.clone(),
        });
        self.queue_bytes.set(self.queue_bytes.get() + bytes);
        self.writer_signal.notify();
        done.wait().await
    }

    fn count(&self, f: impl FnOnce(&mut ReadStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// The entries after `entry` of the same ledger to read in the same I/O: in the same entry
    /// log, at increasing offsets, within `read_ahead_bytes_max` (and half the read cache) of
    /// `loc`, and at most `read_ahead_entries` of them.
    fn read_ahead_plan(
        &self,
        entries: &BTreeMap<u64, Location>,
        entry: u64,
        loc: Location,
    ) -> Vec<(u64, Location)> {
        let mut plan = Vec::new();
        if self.cfg.read_ahead_entries == 0 {
            return plan;
        }
        let start = loc.offset;
        let mut end =
            loc.offset + (format::ENTRY_RECORD_HEADER_BYTES + loc.data_len as usize) as u64;
        for (&e, &l) in entries.range(entry.saturating_add(1)..) {
            if plan.len() >= self.cfg.read_ahead_entries || l.log_id != loc.log_id || l.offset < end
            {
                break;
            }
            let l_end = l.offset + (format::ENTRY_RECORD_HEADER_BYTES + l.data_len as usize) as u64;
            // Never more than half the read cache, so that read-ahead does not evict itself.
            if l_end - start
                > self
                    .cfg
                    .read_ahead_bytes_max
                    .min(self.cfg.read_cache_bytes_max / 2) as u64
            {
                break;
            }
            end = l_end;
            plan.push((e, l));
        }
        plan
    }

    /// Reads `entry` at `loc` and, in the same I/O, the entries of `plan` (read-ahead), which go
    /// to the read cache with the entry itself.
    async fn read_entry_log(
        &self,
        ledger: u64,
        entry: u64,
        loc: Location,
        plan: &[(u64, Location)],
    ) -> Result<Vec<u8>, Error> {
        let generation = self.read_cache_gen.get();
        let path = self.cfg.ledger_dir.join(entry_log_name(loc.log_id));
        let file = {
            let cached = self.entry_log_readers.borrow().get(&loc.log_id).cloned();
            match cached {
                Some(f) => f,
                None => {
                    let f = Rc::new(self.storage.open(&path, false).await.map_err(io_err(
                        "open entry log",
                        &path,
                        0,
                    ))?);
                    self.entry_log_readers
                        .borrow_mut()
                        .insert(loc.log_id, f.clone());
                    f
                }
            }
        };
        let len = format::ENTRY_RECORD_HEADER_BYTES + loc.data_len as usize;
        let span = plan.last().map_or(len, |(_, l)| {
            (l.offset - loc.offset) as usize
                + format::ENTRY_RECORD_HEADER_BYTES
                + l.data_len as usize
        });
        let b = file.read_at(loc.offset, span).await.map_err(io_err(
            "read entry log",
            &path,
            loc.offset,
        ))?;
        self.count(|s| s.entry_log_reads += 1);
        let data = decode_entry_record(&b[..len.min(b.len())], ledger, entry, loc.data_len)
            .map_err(|r| corrupt(&path, loc.offset, r))?;
        if self.read_cache_gen.get() != generation {
            return Ok(data);
        }
        let mut cache = self.read_cache.borrow_mut();
        cache.insert((ledger, entry), Rc::new(data.clone()));
        let mut ahead = 0u64;
        for &(e, l) in plan {
            let at = (l.offset - loc.offset) as usize;
            let l_len = format::ENTRY_RECORD_HEADER_BYTES + l.data_len as usize;
            let Some(rec) = b.get(at..at + l_len) else {
                break;
            };
            // A damaged neighbour is left out; reading it directly reports the corruption.
            if let Ok(d) = decode_entry_record(rec, ledger, e, l.data_len) {
                cache.insert((ledger, e), Rc::new(d));
                ahead += 1;
            }
        }
        drop(cache);
        self.count(|s| s.entries_read_ahead += ahead);
        Ok(data)
    }

    async fn create_journal_file(&self, id: u64) -> Result<S::File, Error> {
        let path = self.journal_path(id);
        create_journal_file(&self.storage, &self.cfg, &path, id, Some(&self.throttle)).await
    }

    /// Wakes the long-poll waiters of `ledger`, if any.
    fn wake_lac_watchers(&self, ledger: u64) {
        let w = self.lac_watchers.borrow().get(&ledger).cloned();
        if let Some(w) = w {
            w.notify_all();
        }
    }

    /// Starts creating journal file `id` on the background queue unless that is under way.
    fn start_precreate(self: &Rc<Self>, id: u64)
    where
        S: 'static,
    {
        if self
            .precreate
            .borrow()
            .as_ref()
            .is_some_and(|(pid, _)| *pid == id)
            || self.closed.get()
        {
            return;
        }
        let inner = self.clone();
        match glommio::spawn_local_into(
            async move { inner.create_journal_file(id).await },
            self.background_tq,
        ) {
            Ok(task) => *self.precreate.borrow_mut() = Some((id, task)),
            Err(e) => tracing::warn!("cannot start the background creation of journal {id}: {e}"),
        }
    }

    /// The journal file `id` for a roll: the pre-created one when it was started (waiting for it
    /// if it is still being written), else created here.
    async fn next_journal_file(&self, id: u64) -> Result<S::File, Error> {
        let pre = self.precreate.borrow_mut().take();
        if let Some((pid, task)) = pre {
            if pid == id {
                match task.await {
                    Ok(f) => return Ok(f),
                    Err(e) => tracing::warn!(
                        "background creation of journal {id} failed, creating it now: {e}"
                    ),
                }
            }
        }
        self.create_journal_file(id).await
    }

    /// Back-pressure on adds (BookKeeper `DbLedgerStorage`'s write-cache throttle): while a
    /// checkpoint is writing one snapshot of the write cache and the live cache has refilled to
    /// `write_cache_bytes_max`, an add waits for the checkpoint to end, so a shard holds at most
    /// about two caches' worth of entries however fast adds arrive. Gives up after
    /// `write_cache_wait_max` with `WriteCacheFull`.
    async fn wait_for_write_cache_room(&self) -> Result<(), Error> {
        let started = Instant::now();
        let mut counted = false;
        loop {
            let seen = self.checkpoint_done.generation();
            let full = {
                let st = self.st.borrow();
                st.flushing.is_some() && st.cache_bytes >= self.cfg.write_cache_bytes_max
            };
            if !full {
                return Ok(());
            }
            if !counted {
                counted = true;
                self.write_cache_waits.set(self.write_cache_waits.get() + 1);
            }
            let waited = started.elapsed();
            let Some(left) = self.cfg.write_cache_wait_max.checked_sub(waited) else {
                return Err(Error::WriteCacheFull {
                    waited_ms: waited.as_millis() as u64,
                });
            };
            future::or(self.checkpoint_done.changed_since(seen), async {
                glommio::timer::sleep(left).await;
            })
            .await;
        }
    }

    /// Journals one group-commit batch: roll to the next file if it does not fit, write,
    /// fdatasync, then complete every add of the batch.
    async fn write_batch(self: &Rc<Self>, batch: Vec<Pending>)
    where
        S: 'static,
    {
        let mut cursor = self
            .journal
            .borrow_mut()
            .take()
            .expect("journal cursor is present while the writer runs");
        let first_seq = cursor.next_seq;
        let mut body = Vec::new();
        for (i, p) in batch.iter().enumerate() {
            encode_record(&mut body, first_seq + 1 + i as u64, &p.record);
        }
        let mut buf = Vec::with_capacity(body.len() + BLOCK_BYTES);
        let batch_bytes = u32::try_from(
            format::RECORD_HEADER_BYTES + format::BATCH_HEADER_PAYLOAD_BYTES + body.len(),
        )
        .expect("a batch fits u32 bytes");
        encode_record(
            &mut buf,
            first_seq,
            &Record::BatchHeader {
                record_count: batch.len() as u32,
                batch_bytes,
            },
        );
        buf.extend_from_slice(&body);
        drop(body);
        pad_to_block(&mut buf);

        // Set once this batch's bytes start going to the journal: a failure after that leaves the
        // journal in an unknown state, one before (in the roll) leaves it as it was.
        let journal_touched = Cell::new(false);
        let result: Result<(), Error> = async {
            if cursor.pos + buf.len() as u64 > self.cfg.journal_file_size_bytes
                && cursor.pos > FILE_HEADER_BYTES as u64
            {
                let id = cursor.file_id + 1;
                let started = Instant::now();
                let file = self.next_journal_file(id).await?;
                warn_if_slow("journal roll (waiting for the next file)", id, started);
                cursor = JournalCursor {
                    file_id: id,
                    file: Rc::new(file),
                    pos: FILE_HEADER_BYTES as u64,
                    next_seq: cursor.next_seq,
                };
            }
            let path = self.journal_path(cursor.file_id);
            journal_touched.set(true);
            self.throttle.journal_busy(true);
            let started = Instant::now();
            let r = async {
                cursor
                    .file
                    .write_at(cursor.pos, &buf)
                    .await
                    .map_err(io_err("journal write", &path, cursor.pos))?;
                warn_if_slow("journal write", cursor.file_id, started);
                let synced = Instant::now();
                let r = cursor.file.fdatasync().await.map_err(io_err(
                    "journal fdatasync",
                    &path,
                    cursor.pos,
                ));
                warn_if_slow("journal fdatasync", cursor.file_id, synced);
                r
            }
            .await;
            self.throttle.journal_busy(false);
            r
        }
        .await;
        match result {
            Ok(()) => {
                self.sync_count.set(self.sync_count.get() + 1);
                cursor.pos += buf.len() as u64;
                cursor.next_seq = first_seq + 1 + batch.len() as u64;
                let durable = JournalPos {
                    file_id: cursor.file_id,
                    offset: cursor.pos,
                    next_seq: cursor.next_seq,
                };
                let mut dones = Vec::with_capacity(batch.len());
                let mut touched: Vec<u64> = Vec::new();
                {
                    let mut st = self.st.borrow_mut();
                    st.durable = durable;
                    for p in batch {
                        let ledger = match &p.record {
                            Record::Add { ledger, .. } | Record::Fence { ledger, .. } => *ledger,
                            Record::BatchHeader { .. } => {
                                unreachable!("batch headers are not queued")
                            }
                        };
                        if touched.last() != Some(&ledger) {
                            touched.push(ledger);
                        }
                        apply_durable(&mut st, p.record);
                        dones.push(p.done);
                    }
                    if st.cache_bytes > self.cfg.write_cache_bytes_max {
                        self.checkpoint_signal.notify();
                    }
                }
                let precreate_at = self.cfg.journal_file_size_bytes * PRECREATE_AT_FILL_HALVES / 2;
                if cursor.pos >= precreate_at {
                    self.start_precreate(cursor.file_id + 1);
                }
                *self.journal.borrow_mut() = Some(cursor);
                for d in dones {
                    d.complete(Ok(()));
                }
                touched.sort_unstable();
                touched.dedup();
                if !self.lac_watchers.borrow().is_empty() {
                    for ledger in touched {
                        self.wake_lac_watchers(ledger);
                    }
                }
            }
            Err(e) => {
                let (op, path, off, kind, msg) = match &e {
                    Error::Io {
                        op,
                        path,
                        file_offset_bytes,
                        source,
                    } => (
                        *op,
                        path.clone(),
                        *file_offset_bytes,
                        source.kind(),
                        source.to_string(),
                    ),
                    other => (
                        "journal",
                        self.journal_path(cursor.file_id),
                        cursor.pos,
                        stdio::ErrorKind::Other,
                        other.to_string(),
                    ),
                };
                if journal_touched.get() {
                    tracing::error!("journal failed, every later add fails until restart: {e}");
                    self.st.borrow_mut().failed = Some((kind, e.to_string()));
                } else {
                    // The roll to the next file failed (e.g. ENOSPC while pre-writing it): nothing
                    // of this batch reached the journal, the current file is intact, and the next
                    // batch tries the roll again, so adds work again once space is freed.
                    tracing::error!("journal roll failed; the adds queued now fail: {e}");
                }
                *self.journal.borrow_mut() = Some(cursor);
                for p in batch {
                    p.done.complete(Err(Error::Io {
                        op,
                        path: path.clone(),
                        file_offset_bytes: off,
                        source: stdio::Error::new(kind, msg.clone()),
                    }));
                }
                let rest: Vec<Pending> = self.queue.borrow_mut().drain(..).collect();
                self.queue_bytes.set(0);
                for p in rest {
                    p.done.complete(Err(Error::Io {
                        op,
                        path: path.clone(),
                        file_offset_bytes: off,
                        source: stdio::Error::new(kind, msg.clone()),
                    }));
                }
            }
        }
    }

    async fn checkpoint(&self) -> Result<(), Error> {
        let _permit = self
            .checkpoint_lock
            .acquire_permit(1)
            .await
            .map_err(|_| Error::Closed)?;
        // Snapshot, synchronously: the cache holds exactly the records durable up to `durable`.
        let (snapshot, durable, ledgers) = {
            let mut st = self.st.borrow_mut();
            assert!(st.flushing.is_none(), "one checkpoint at a time");
            let snapshot = Rc::new(std::mem::take(&mut st.cache));
            st.cache_bytes = 0;
            st.flushing = Some(snapshot.clone());
            let dirty: Vec<u64> = st.dirty.drain().collect();
            let mut ledgers: Vec<(u64, StoredLedger)> = dirty
                .iter()
                .filter_map(|id| st.ledgers.get(id).map(|l| (*id, l.stored())))
                .collect();
            ledgers.sort_by_key(|(id, _)| *id);
            (snapshot, st.durable, ledgers)
        };
        let result = self.checkpoint_write(&snapshot, durable, &ledgers).await;
        self.checkpoint_done.notify_all();
        let mark_file_id = {
            let mut st = self.st.borrow_mut();
            st.flushing = None;
            match result {
                Ok((locations, mark)) => {
                    self.read_cache_gen.set(self.read_cache_gen.get() + 1);
                    let mut rc = self.read_cache.borrow_mut();
                    for (ledger, entry, loc) in locations {
                        rc.remove(&(ledger, entry));
                        st.index.entry(ledger).or_default().insert(entry, loc);
                    }
                    drop(rc);
                    st.mark = mark;
                    mark.journal_file_id
                }
                Err(e) => {
                    // Put everything back so that nothing is lost; newer cache entries win.
                    for (k, v) in snapshot.iter() {
                        if !st.cache.contains_key(k) {
                            st.cache_bytes += v.len();
                            st.cache.insert(*k, v.clone());
                        }
                    }
                    for (id, _) in ledgers {
                        st.dirty.insert(id);
                    }
                    return Err(e);
                }
            }
        };
        self.remove_old_journals(mark_file_id).await;
        Ok(())
    }

    /// Writes the snapshot to the entry logs, the index segment and then the mark. Returns the
    /// new locations and the new mark; publishes nothing.
    async fn checkpoint_write(
        &self,
        snapshot: &Cache,
        durable: JournalPos,
        ledgers: &[(u64, StoredLedger)],
    ) -> Result<(Vec<(u64, u64, Location)>, Mark), Error> {
        let old_mark = self.st.borrow().mark;
        let moved = durable.file_id != old_mark.journal_file_id
            || durable.offset != old_mark.journal_offset
            || durable.next_seq != old_mark.next_seq;
        if snapshot.is_empty() && ledgers.is_empty() && !moved {
            return Ok((Vec::new(), old_mark));
        }
        // 1. Entry logs, sorted by (ledger, entry) (BTreeMap order), synced.
        let mut locations = Vec::with_capacity(snapshot.len());
        let mut buf: Vec<u8> = Vec::new();
        let mut cursor = self.entry_log.borrow_mut().take();
        let result: Result<(), Error> = async {
            for (&(ledger, entry), data) in snapshot.iter() {
                let rec_len = (format::ENTRY_RECORD_HEADER_BYTES + data.len()) as u64;
                let need_roll = match &cursor {
                    None => true,
                    Some(c) => {
                        let at = c.pos + buf.len() as u64;
                        at + rec_len > self.cfg.entry_log_size_bytes_max
                            && at > FILE_HEADER_BYTES as u64
                    }
                };
                if need_roll {
                    if let Some(c) = cursor.take() {
                        self.flush_entry_log_buf(&c, &mut buf).await.map(|_| ())?;
                        let c = self.sync_entry_log(c).await?;
                        drop(c);
                    }
                    cursor = Some(self.new_entry_log().await?);
                }
                let c = cursor.as_mut().expect("entry log is open");
                let offset = c.pos + buf.len() as u64;
                encode_entry_record(&mut buf, ledger, entry, data);
                locations.push((
                    ledger,
                    entry,
                    Location {
                        log_id: c.id,
                        offset,
                        data_len: data.len() as u32,
                    },
                ));
                if buf.len() >= ENTRY_LOG_WRITE_BYTES_MAX {
                    let c = cursor.as_mut().expect("entry log is open");
                    let n = self.flush_entry_log_buf(c, &mut buf).await?;
                    c.pos += n;
                }
            }
            if let Some(c) = cursor.as_mut() {
                let n = self.flush_entry_log_buf(c, &mut buf).await?;
                c.pos += n;
                let path = self.cfg.ledger_dir.join(entry_log_name(c.id));
                c.file
                    .fdatasync()
                    .await
                    .map_err(io_err("entry log fdatasync", &path, c.pos))?;
            }
            Ok(())
        }
        .await;
        *self.entry_log.borrow_mut() = cursor;
        result?;

        // 2. Index segment with the new locations and the changed ledger states, synced.
        let seg = encode_segment(&locations, ledgers);
        let index_path = self.cfg.ledger_dir.join(INDEX_FILE);
        bulk_write(
            self.index_file.as_ref(),
            old_mark.index_bytes,
            &seg,
            Some(&self.throttle),
        )
        .await
        .map_err(|(at, e)| io_err("index write", &index_path, at)(e))?;
        self.index_file.fdatasync().await.map_err(io_err(
            "index fdatasync",
            &index_path,
            old_mark.index_bytes,
        ))?;

        // 3. The mark: only forward, and only now that entry logs and index are durable.
        let mark = Mark {
            journal_file_id: durable.file_id,
            journal_offset: durable.offset,
            next_seq: durable.next_seq,
            index_bytes: old_mark.index_bytes + seg.len() as u64,
        };
        assert!(
            (mark.journal_file_id, mark.journal_offset)
                >= (old_mark.journal_file_id, old_mark.journal_offset),
            "the checkpoint mark only moves forward"
        );
        assert!(
            mark.next_seq >= old_mark.next_seq,
            "the checkpoint mark only moves forward"
        );
        assert!(mark.index_bytes > old_mark.index_bytes);
        write_mark(&self.storage, &self.cfg.ledger_dir, &mark).await?;
        Ok((locations, mark))
    }

    /// Writes `buf` (padded to a block) at the cursor position; returns the bytes written.
    async fn flush_entry_log_buf(
        &self,
        c: &EntryLogCursor<S::File>,
        buf: &mut Vec<u8>,
    ) -> Result<u64, Error> {
        if buf.is_empty() {
            return Ok(0);
        }
        pad_to_block(buf);
        let path = self.cfg.ledger_dir.join(entry_log_name(c.id));
        bulk_write(c.file.as_ref(), c.pos, buf, Some(&self.throttle))
            .await
            .map_err(|(at, e)| io_err("entry log write", &path, at)(e))?;
        let n = buf.len() as u64;
        buf.clear();
        Ok(n)
    }

    async fn sync_entry_log(
        &self,
        c: EntryLogCursor<S::File>,
    ) -> Result<EntryLogCursor<S::File>, Error> {
        let path = self.cfg.ledger_dir.join(entry_log_name(c.id));
        c.file
            .fdatasync()
            .await
            .map_err(io_err("entry log fdatasync", &path, c.pos))?;
        Ok(c)
    }

    async fn new_entry_log(&self) -> Result<EntryLogCursor<S::File>, Error> {
        let id = self.next_entry_log_id.get();
        self.next_entry_log_id.set(id + 1);
        let path = self.cfg.ledger_dir.join(entry_log_name(id));
        let file =
            self.storage
                .open(&path, true)
                .await
                .map_err(io_err("create entry log", &path, 0))?;
        file.write_at(0, &encode_file_header(ENTRY_LOG_MAGIC, id))
            .await
            .map_err(io_err("entry log header write", &path, 0))?;
        file.fdatasync()
            .await
            .map_err(io_err("entry log fdatasync", &path, 0))?;
        self.storage
            .sync_dir(&self.cfg.ledger_dir)
            .await
            .map_err(io_err("sync ledger dir", &self.cfg.ledger_dir, 0))?;
        let file = Rc::new(file);
        self.entry_log_readers.borrow_mut().insert(id, file.clone());
        Ok(EntryLogCursor {
            id,
            file,
            pos: FILE_HEADER_BYTES as u64,
        })
    }

    /// Deletes journal files wholly before the mark. Failures are logged, not returned: the
    /// files are only garbage now and the next checkpoint retries.
    async fn remove_old_journals(&self, mark_file_id: u64) {
        let names = match self.storage.list(&self.cfg.journal_dir).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("listing {} failed: {e}", self.cfg.journal_dir.display());
                return;
            }
        };
        for name in names {
            if let Some(id) = parse_id(&name, "journal-", ".qj") {
                if id < mark_file_id {
                    let path = self.cfg.journal_dir.join(&name);
                    if let Err(e) = self.storage.remove(&path).await {
                        tracing::warn!("removing {} failed: {e}", path.display());
                    }
                }
            }
        }
    }
}

/// Applies a durable journal record to the in-memory state (writer after sync, and replay).
fn apply_durable(st: &mut State, record: Record) {
    match record {
        Record::Add {
            ledger,
            entry,
            lac,
            master_key,
            data,
            ..
        } => {
            let l = st.ledgers.entry(ledger).or_default();
            if l.master_key.is_none() {
                l.master_key = Some(master_key);
            }
            l.last_entry = l.last_entry.max(Some(entry));
            l.lac = l.lac.max(lac);
            st.dirty.insert(ledger);
            let len = data.len();
            if let Some(old) = st.cache.insert((ledger, entry), Rc::new(data)) {
                st.cache_bytes -= old.len();
            }
            st.cache_bytes += len;
        }
        Record::Fence { ledger, master_key } => {
            let l = st.ledgers.entry(ledger).or_default();
            if l.master_key.is_none() {
                l.master_key = Some(master_key);
            }
            l.fenced = true;
            st.dirty.insert(ledger);
        }
        Record::BatchHeader { .. } => unreachable!("batch headers are not applied"),
    }
}

async fn write_mark<S: Storage>(storage: &S, dir: &Path, mark: &Mark) -> Result<(), Error> {
    let tmp = dir.join(MARK_TMP_FILE);
    let fin = dir.join(MARK_FILE);
    let f = storage
        .open(&tmp, true)
        .await
        .map_err(io_err("create checkpoint mark", &tmp, 0))?;
    f.write_at(0, &encode_mark(mark))
        .await
        .map_err(io_err("checkpoint mark write", &tmp, 0))?;
    f.fdatasync()
        .await
        .map_err(io_err("checkpoint mark fdatasync", &tmp, 0))?;
    drop(f);
    storage
        .rename(&tmp, &fin)
        .await
        .map_err(io_err("checkpoint mark rename", &fin, 0))?;
    storage
        .sync_dir(dir)
        .await
        .map_err(io_err("sync ledger dir", dir, 0))?;
    Ok(())
}

/// Creates a journal file pre-written with zeros: written as `<name>.tmp`, synced, then renamed,
/// so a crash never leaves a half-written file under a journal name.
async fn create_journal_file<S: Storage>(
    storage: &S,
    cfg: &EngineConfig,
    path: &Path,
    id: u64,
    throttle: Option<&Throttle>,
) -> Result<S::File, Error> {
    let tmp = path.with_extension("qj.tmp");
    match storage.remove(&tmp).await {
        Ok(()) => {}
        Err(e) if e.kind() == stdio::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("remove stale journal temp file", &tmp, 0)(e)),
    }
    let f = storage
        .open(&tmp, true)
        .await
        .map_err(io_err("create journal", &tmp, 0))?;
    let size = round_up_block(cfg.journal_file_size_bytes);
    let filled: Result<(), Error> = async {
        let header = encode_file_header(JOURNAL_MAGIC, id);
        f.write_at(0, &header)
            .await
            .map_err(io_err("journal header write", &tmp, 0))?;
        let zeros = vec![0u8; ZERO_CHUNK_BYTES];
        let mut pos = FILE_HEADER_BYTES as u64;
        while pos < size {
            let n = ((size - pos) as usize).min(ZERO_CHUNK_BYTES);
            bulk_write(&f, pos, &zeros[..n], throttle)
                .await
                .map_err(|(at, e)| io_err("journal pre-write zeros", &tmp, at)(e))?;
            pos += n as u64;
        }
        f.fdatasync()
            .await
            .map_err(io_err("journal fdatasync", &tmp, 0))
    }
    .await;
    if let Err(e) = filled {
        // A half-written temp file would keep the space it got (typically the last free space
        // of a full disk, which checkpoints then lack); give it back.
        drop(f);
        if let Err(re) = storage.remove(&tmp).await {
            tracing::warn!("removing {} after a failed creation: {re}", tmp.display());
        }
        return Err(e);
    }
    storage
        .rename(&tmp, path)
        .await
        .map_err(io_err("journal rename", path, 0))?;
    storage.sync_dir(&cfg.journal_dir).await.map_err(io_err(
        "sync journal dir",
        &cfg.journal_dir,
        0,
    ))?;
    Ok(f)
}

/// Writes `data` at `pos` in chunks of at most [`BULK_CHUNK_BYTES`], each admitted by the
/// throttle (rate limit, and never while a journal write or sync is in flight). On error returns
/// the offset of the failed chunk.
async fn bulk_write<F: StorageFile>(
    file: &F,
    pos: u64,
    data: &[u8],
    throttle: Option<&Throttle>,
) -> Result<(), (u64, stdio::Error)> {
    let mut done = 0usize;
    while done < data.len() {
        let n = (data.len() - done).min(BULK_CHUNK_BYTES);
        if let Some(t) = throttle {
            t.admit(n).await;
        }
        let at = pos + done as u64;
        file.write_at(at, &data[done..done + n])
            .await
            .map_err(|e| (at, e))?;
        done += n;
        if let Some(t) = throttle {
            if t.note_written(n) {
                t.admit(0).await;
                file.fdatasync().await.map_err(|e| {
                    let kind = e.kind();
                    (
                        at,
                        stdio::Error::new(kind, format!("intermediate fdatasync: {e}")),
                    )
                })?;
            }
        }
    }
    Ok(())
}

async fn writer_loop<S: Storage + 'static>(inner: Rc<Inner<S>>) {
    loop {
        // Wait for work, or exit once closed and drained.
        loop {
            if !inner.queue.borrow().is_empty() {
                break;
            }
            if inner.closed.get() {
                inner.writer_running.set(false);
                inner.writer_done.notify();
                return;
            }
            inner.writer_signal.wait().await;
        }
        // Group: wait until the oldest add is `group_commit_wait_max` old or enough bytes queued.
        loop {
            if inner.queue_bytes.get() >= inner.cfg.group_commit_bytes_max || inner.closed.get() {
                break;
            }
            let Some(oldest) = inner.queue.borrow().front().map(|p| p.enqueued) else {
                break;
            };
            let age = oldest.elapsed();
            if age >= inner.cfg.group_commit_wait_max {
                break;
            }
            let left = inner.cfg.group_commit_wait_max - age;
            future::or(glommio::timer::sleep(left), inner.writer_signal.wait()).await;
        }
        let batch: Vec<Pending> = {
            let mut q = inner.queue.borrow_mut();
            let mut taken = 0usize;
            let mut batch = Vec::new();
            while let Some(p) = q.front() {
                if !batch.is_empty() && taken + p.bytes > inner.cfg.group_commit_bytes_max {
                    break;
                }
                taken += p.bytes;
                batch.push(q.pop_front().expect("front exists"));
            }
            inner.queue_bytes.set(inner.queue_bytes.get() - taken);
            batch
        };
        if batch.is_empty() {
            continue;
        }
        if inner.st.borrow().failed.is_some() {
            for p in batch {
                let e = inner
                    .check_failed(&inner.st.borrow())
                    .expect_err("journal failed");
                p.done.complete(Err(e));
            }
            continue;
        }
        inner.write_batch(batch).await;
    }
}

async fn checkpoint_loop<S: Storage>(inner: Rc<Inner<S>>) {
    loop {
        future::or(
            glommio::timer::sleep(inner.cfg.checkpoint_interval),
            inner.checkpoint_signal.wait(),
        )
        .await;
        if inner.closed.get() {
            return;
        }
        if let Err(e) = inner.checkpoint().await {
            tracing::error!("background checkpoint failed: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Open and replay
// ---------------------------------------------------------------------------------------------

async fn open_inner<S: Storage>(
    cfg: EngineConfig,
    storage: S,
    background_tq: TaskQueueHandle,
) -> Result<Inner<S>, Error> {
    storage.prepare_dir(&cfg.journal_dir).await.map_err(io_err(
        "prepare journal dir",
        &cfg.journal_dir,
        0,
    ))?;
    storage.prepare_dir(&cfg.ledger_dir).await.map_err(io_err(
        "prepare ledger dir",
        &cfg.ledger_dir,
        0,
    ))?;

    let ledger_names = storage.list(&cfg.ledger_dir).await.map_err(io_err(
        "list ledger dir",
        &cfg.ledger_dir,
        0,
    ))?;
    let mut journal_ids = list_journals(&storage, &cfg).await?;
    let mark_path = cfg.ledger_dir.join(MARK_FILE);
    let index_path = cfg.ledger_dir.join(INDEX_FILE);

    // The mark; a fresh directory pair gets its first journal, index and mark here.
    let mark = if ledger_names.iter().any(|n| n == MARK_FILE) {
        let f = storage.open(&mark_path, false).await.map_err(io_err(
            "open checkpoint mark",
            &mark_path,
            0,
        ))?;
        let b = f.read_at(0, BLOCK_BYTES).await.map_err(io_err(
            "read checkpoint mark",
            &mark_path,
            0,
        ))?;
        match decode_mark(&b) {
            MarkDecode::Ok(m) => m,
            MarkDecode::Unsupported(found) => {
                return Err(Error::UnsupportedFormat {
                    path: mark_path,
                    found,
                    oldest: FORMAT_OLDEST_READABLE,
                    newest: FORMAT_CURRENT,
                })
            }
            MarkDecode::Bad(reason) => return Err(corrupt(&mark_path, 0, reason)),
        }
    } else {
        // No mark means no open ever finished, so no add was ever acknowledged: files left by a
        // crash during the first open are discarded, unless a journal holds a batch (then the
        // mark was lost, e.g. a wiped ledger directory, and guessing would be unsafe).
        for id in std::mem::take(&mut journal_ids) {
            let p = cfg.journal_dir.join(journal_name(id));
            let (_, img) = read_journal(&storage, &p, id).await?;
            if let Some((at, _)) = find_later_batch(&img, FILE_HEADER_BYTES as u64, 0) {
                return Err(corrupt(
                    &mark_path,
                    0,
                    format!(
                        "checkpoint mark is missing but {} holds a batch at byte offset {at}",
                        p.display()
                    ),
                ));
            }
            storage.remove(&p).await.map_err(io_err(
                "remove journal of an unfinished first open",
                &p,
                0,
            ))?;
        }
        if ledger_names.iter().any(|n| n == INDEX_FILE) {
            storage.remove(&index_path).await.map_err(io_err(
                "remove index of an unfinished first open",
                &index_path,
                0,
            ))?;
        }
        let path = cfg.journal_dir.join(journal_name(1));
        drop(create_journal_file(&storage, &cfg, &path, 1, None).await?);
        journal_ids.push(1);
        let f = storage.open(&index_path, true).await.map_err(io_err(
            "create index",
            &index_path,
            0,
        ))?;
        f.write_at(0, &encode_file_header(INDEX_MAGIC, 0))
            .await
            .map_err(io_err("index header write", &index_path, 0))?;
        f.fdatasync()
            .await
            .map_err(io_err("index fdatasync", &index_path, 0))?;
        storage.sync_dir(&cfg.ledger_dir).await.map_err(io_err(
            "sync ledger dir",
            &cfg.ledger_dir,
            0,
        ))?;
        let m = Mark {
            journal_file_id: 1,
            journal_offset: FILE_HEADER_BYTES as u64,
            next_seq: 1,
            index_bytes: FILE_HEADER_BYTES as u64,
        };
        write_mark(&storage, &cfg.ledger_dir, &m).await?;
        m
    };

    // Index and ledger states, up to the committed length.
    let index_file =
        storage
            .open(&index_path, false)
            .await
            .map_err(io_err("open index", &index_path, 0))?;
    let committed = index_file
        .read_at(0, mark.index_bytes as usize)
        .await
        .map_err(io_err("read index", &index_path, 0))?;
    if (committed.len() as u64) < mark.index_bytes {
        return Err(corrupt(
            &index_path,
            committed.len() as u64,
            format!(
                "index is {} bytes but the checkpoint mark commits {}",
                committed.len(),
                mark.index_bytes
            ),
        ));
    }
    check_header(&index_path, INDEX_MAGIC, &committed, 0)?;
    let mut ledgers: HashMap<u64, Ledger> = HashMap::new();
    let mut index: HashMap<u64, BTreeMap<u64, Location>> = HashMap::new();
    let mut at = FILE_HEADER_BYTES;
    while at < committed.len() {
        let seg =
            decode_segment(&committed[at..]).map_err(|r| corrupt(&index_path, at as u64, r))?;
        for (ledger, entry, loc) in seg.locations {
            index.entry(ledger).or_default().insert(entry, loc);
        }
        for (ledger, s) in seg.ledgers {
            ledgers.insert(
                ledger,
                Ledger {
                    master_key: s.master_key,
                    fenced: s.fenced,
                    lac: s.lac,
                    last_entry: s.last_entry,
                },
            );
        }
        at += seg.padded_bytes as usize;
    }

    // Entry logs: never append to an old one (it may hold unindexed bytes past its last sync).
    let next_entry_log_id = ledger_names
        .iter()
        .filter_map(|n| parse_id(n, "entrylog-", ".qel"))
        .max()
        .unwrap_or(0)
        + 1;

    let mut st = State {
        ledgers,
        dirty: HashSet::new(),
        cache: BTreeMap::new(),
        cache_bytes: 0,
        flushing: None,
        index,
        durable: JournalPos {
            file_id: mark.journal_file_id,
            offset: mark.journal_offset,
            next_seq: mark.next_seq,
        },
        mark,
        failed: None,
    };

    // Journal files wholly before the mark are garbage a crash left behind.
    for id in journal_ids.iter().filter(|id| **id < mark.journal_file_id) {
        let p = cfg.journal_dir.join(journal_name(*id));
        storage
            .remove(&p)
            .await
            .map_err(io_err("remove old journal", &p, 0))?;
    }
    journal_ids.retain(|id| *id >= mark.journal_file_id);
    if journal_ids.first() != Some(&mark.journal_file_id) {
        return Err(corrupt(
            &cfg.journal_dir.join(journal_name(mark.journal_file_id)),
            mark.journal_offset,
            "journal file named by the checkpoint mark is missing",
        ));
    }
    let cursor = replay(&storage, &cfg, &journal_ids, &mut st).await?;
    let cfg_read_cache = cfg.read_cache_bytes_max;
    let cfg_rate = cfg.background_write_bytes_per_second;
    let cfg_sync_bytes = cfg.background_sync_bytes;

    Ok(Inner {
        cfg,
        storage,
        st: RefCell::new(st),
        queue: RefCell::new(VecDeque::new()),
        queue_bytes: Cell::new(0),
        journal: RefCell::new(Some(cursor)),
        writer_signal: Signal::default(),
        writer_done: Signal::default(),
        writer_running: Cell::new(false),
        checkpoint_signal: Signal::default(),
        checkpoint_done: Notify::default(),
        write_cache_waits: Cell::new(0),
        checkpoint_lock: glommio::sync::Semaphore::new(1),
        index_file: Rc::new(index_file),
        entry_log: RefCell::new(None),
        next_entry_log_id: Cell::new(next_entry_log_id),
        entry_log_readers: RefCell::new(HashMap::new()),
        sync_count: Cell::new(0),
        closed: Cell::new(false),
        lac_watchers: RefCell::new(HashMap::new()),
        read_cache: RefCell::new(ReadCache::new(cfg_read_cache)),
        read_cache_gen: Cell::new(0),
        stats: Cell::new(ReadStats::default()),
        throttle: Throttle::new(cfg_rate, cfg_sync_bytes),
        precreate: RefCell::new(None),
        background_tq,
    })
}

async fn list_journals<S: Storage>(storage: &S, cfg: &EngineConfig) -> Result<Vec<u64>, Error> {
    let names = storage.list(&cfg.journal_dir).await.map_err(io_err(
        "list journal dir",
        &cfg.journal_dir,
        0,
    ))?;
    let mut ids = Vec::new();
    for name in names {
        if name.ends_with(".qj.tmp") {
            let p = cfg.journal_dir.join(&name);
            storage
                .remove(&p)
                .await
                .map_err(io_err("remove journal temp file", &p, 0))?;
        } else if let Some(id) = parse_id(&name, "journal-", ".qj") {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Why replay stopped inside a file.
enum Stop {
    /// Zeros or end of file at a batch boundary: clean end of this file.
    Clean(u64),
    /// A bad record at `bad_at`; `resume` is where writing would continue (block aligned).
    Bad {
        bad_at: u64,
        resume: u64,
        reason: String,
    },
}

/// Scans one journal file image from `start`, applying good records. Returns where it stopped.
fn scan_file(img: &[u8], start: u64, expected_seq: &mut u64, st: &mut State) -> Stop {
    let mut pos = start as usize;
    loop {
        if pos >= img.len() {
            return Stop::Clean(pos as u64);
        }
        let bad = |at: usize, resume: usize, reason: String| Stop::Bad {
            bad_at: at as u64,
            resume: resume as u64,
            reason,
        };
        let (batch_bytes, count) = match decode_record(&img[pos..]) {
            RecordDecode::Zeros => return Stop::Clean(pos as u64),
            RecordDecode::Short => {
                return bad(
                    pos,
                    pos,
                    "record cut short (file ends inside it or its length is garbled)".into(),
                )
            }
            RecordDecode::Bad(r) => return bad(pos, pos, r),
            RecordDecode::Ok {
                seq,
                record:
                    Record::BatchHeader {
                        record_count,
                        batch_bytes,
                    },
                ..
            } => {
                if seq != *expected_seq {
                    return bad(
                        pos,
                        pos,
                        format!("batch header has seq {seq}, expected {}", *expected_seq),
                    );
                }
                (batch_bytes as usize, record_count)
            }
            RecordDecode::Ok { seq, .. } => {
                return bad(
                    pos,
                    pos,
                    format!("record with seq {seq} where a batch header was expected"),
                );
            }
        };
        let mut seq = *expected_seq + 1;
        let mut records = Vec::with_capacity(count.min(1 << 16) as usize);
        let mut q = pos + format::RECORD_HEADER_BYTES + format::BATCH_HEADER_PAYLOAD_BYTES;
        // A batch is applied only once all of it checks out: a torn batch was never acknowledged,
        // so none of it is kept and writing resumes at its first block.
        for _ in 0..count {
            match decode_record(&img[q..]) {
                RecordDecode::Ok {
                    seq: got,
                    record,
                    len,
                } => {
                    if got != seq {
                        return bad(q, pos, format!("record has seq {got}, expected {seq}"));
                    }
                    if matches!(record, Record::BatchHeader { .. }) {
                        return bad(q, pos, "batch header inside a batch".into());
                    }
                    records.push(record);
                    seq += 1;
                    q += len;
                }
                RecordDecode::Zeros => return bad(q, pos, "zeros inside a batch".into()),
                RecordDecode::Short => {
                    return bad(
                        q,
                        pos,
                        "record cut short (file ends inside it or its length is garbled)".into(),
                    )
                }
                RecordDecode::Bad(r) => return bad(q, pos, r),
            }
        }
        if q != pos + batch_bytes {
            return bad(
                q,
                pos,
                format!(
                    "batch header says {batch_bytes} bytes, records end at {}",
                    q - pos
                ),
            );
        }
        for r in records {
            apply_durable(st, r);
        }
        *expected_seq = seq;
        pos = round_up_block(q as u64) as usize;
    }
}

/// The first block-aligned offset at or after `from` holding a valid batch header with
/// `seq >= min_seq`, if any.
fn find_later_batch(img: &[u8], from: u64, min_seq: u64) -> Option<(u64, u64)> {
    let mut at = round_up_block(from) as usize;
    while at < img.len() {
        if let RecordDecode::Ok {
            seq,
            record: Record::BatchHeader { .. },
            ..
        } = decode_record(&img[at..])
        {
            if seq >= min_seq {
                return Some((at as u64, seq));
            }
        }
        at += BLOCK_BYTES;
    }
    None
}

async fn read_journal<S: Storage>(
    storage: &S,
    path: &Path,
    id: u64,
) -> Result<(S::File, Vec<u8>), Error> {
    let f = storage
        .open(path, false)
        .await
        .map_err(io_err("open journal", path, 0))?;
    let size = f.size().await.map_err(io_err("stat journal", path, 0))?;
    let img = f
        .read_at(0, size as usize)
        .await
        .map_err(io_err("read journal", path, 0))?;
    check_header(path, JOURNAL_MAGIC, &img, id)?;
    Ok((f, img))
}

/// Replays the journal files `ids` (the first is the mark's) into `st`; returns the writer's
/// cursor. Implements the torn-tail vs. corruption rule of journal.md §Recovery.
async fn replay<S: Storage>(
    storage: &S,
    cfg: &EngineConfig,
    ids: &[u64],
    st: &mut State,
) -> Result<JournalCursor<S::File>, Error> {
    let mut expected_seq = st.mark.next_seq;
    for (i, &id) in ids.iter().enumerate() {
        let path = cfg.journal_dir.join(journal_name(id));
        let (file, img) = read_journal(storage, &path, id).await?;
        let start = if i == 0 {
            st.mark.journal_offset
        } else {
            FILE_HEADER_BYTES as u64
        };
        match scan_file(&img, start, &mut expected_seq, st) {
            Stop::Clean(end) => {
                st.durable = JournalPos {
                    file_id: id,
                    offset: end,
                    next_seq: expected_seq,
                };
                if i + 1 == ids.len() {
                    return Ok(JournalCursor {
                        file_id: id,
                        file: Rc::new(file),
                        pos: end,
                        next_seq: expected_seq,
                    });
                }
            }
            Stop::Bad {
                bad_at,
                resume,
                reason,
            } => {
                // Durable data after the bad record means it is not a torn tail.
                let mut later = find_later_batch(&img, bad_at + 1, expected_seq)
                    .map(|(at, seq)| (path.clone(), at, seq));
                if later.is_none() {
                    for &lid in &ids[i + 1..] {
                        let lpath = cfg.journal_dir.join(journal_name(lid));
                        let (_, limg) = read_journal(storage, &lpath, lid).await?;
                        if let Some((at, seq)) =
                            find_later_batch(&limg, FILE_HEADER_BYTES as u64, expected_seq)
                        {
                            later = Some((lpath, at, seq));
                            break;
                        }
                    }
                }
                if let Some((lpath, at, seq)) = later {
                    return Err(corrupt(
                        &path,
                        bad_at,
                        format!(
                            "{reason}; not a torn tail: a durable batch with seq {seq} follows at {}:{at}",
                            lpath.display()
                        ),
                    ));
                }
                tracing::warn!(
                    "journal {}: dropping torn tail at byte offset {bad_at}: {reason}",
                    path.display()
                );
                // Zero the torn bytes so that no stale record can be mistaken for data later.
                let last_nonzero = img
                    .iter()
                    .rposition(|&b| b != 0)
                    .map_or(0, |p| p as u64 + 1);
                let zero_end = round_up_block(last_nonzero.max(resume));
                if zero_end > resume {
                    let zeros = vec![0u8; (zero_end - resume) as usize];
                    file.write_at(resume, &zeros).await.map_err(io_err(
                        "journal zero torn tail",
                        &path,
                        resume,
                    ))?;
                    file.fdatasync()
                        .await
                        .map_err(io_err("journal fdatasync", &path, resume))?;
                }
                for &lid in &ids[i + 1..] {
                    let lpath = cfg.journal_dir.join(journal_name(lid));
                    storage.remove(&lpath).await.map_err(io_err(
                        "remove journal after torn tail",
                        &lpath,
                        0,
                    ))?;
                }
                st.durable = JournalPos {
                    file_id: id,
                    offset: resume,
                    next_seq: expected_seq,
                };
                return Ok(JournalCursor {
                    file_id: id,
                    file: Rc::new(file),
                    pos: resume,
                    next_seq: expected_seq,
                });
            }
        }
    }
    unreachable!("ids is non-empty and the last file returns")
}

/// Journal steps slower than this are logged: they hold every add of the shard back, and a
/// client times out an add after 5 s (BookKeeper reports journal sync latency the same way).
const JOURNAL_SLOW_WARN: Duration = Duration::from_millis(500);

fn warn_if_slow(step: &str, journal_id: u64, started: Instant) {
    let took = started.elapsed();
    if took >= JOURNAL_SLOW_WARN {
        tracing::warn!(
            journal = journal_id,
            took_ms = took.as_millis() as u64,
            "slow {step}"
        );
    }
}

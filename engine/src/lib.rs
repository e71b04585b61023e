//! Storage engine of one Quire bookie shard: journal with group commit, write cache, entry logs,
//! index, checkpoint and replay (DESIGN.md §2; formats in docs/format/).
//!
//! The engine is **shard-local**: an [`Engine`] lives on one glommio executor, is `!Send`, and
//! runs its background tasks (journal writer, checkpointer) on that executor. All file I/O goes
//! through the [`io::Storage`] seam.

use std::path::PathBuf;
use std::time::Duration;

mod checkpoint;
mod engine;
mod entry_log;
mod files;
pub mod format;
mod gc;
mod index;
pub mod io;
mod journal;
mod lac_watch;
mod ledgers;
mod open;
mod read_ahead;
mod read_cache;
mod reserve;
mod scrub;
mod settings;
#[cfg(feature = "sim-disk")]
pub mod sim_disk;
mod sync;
mod throttle;
mod tombstones;
mod write_cache;

pub use engine::Engine;
pub use gc::{GcRun, IndexCheck};
pub use scrub::{DamagedEntry, ScrubPass, ScrubStats, SCRUB_PIECE_LOCATIONS};
pub use settings::{
    CompactionSettings, ConfigError, EngineSettings, ENTRY_LOG_SIZE_BYTES_MIN,
    INDEX_CACHE_BYTES_MIN, JOURNAL_FILE_SIZE_BYTES_MIN, JOURNAL_QUEUE_BYTES_MIN,
};
pub use throttle::BULK_CHUNK_BYTES;

/// One group-commit batch the journal made durable, as reported to a [`JournalObserver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalBatch {
    /// Records in the batch (adds and fences).
    pub records: usize,
    /// Bytes written, block padding included.
    pub bytes: usize,
    /// Time of the journal write (BookKeeper `JOURNAL_FLUSH_LATENCY`).
    pub write: Duration,
    /// Time of the fdatasync that made the batch durable (BookKeeper `JOURNAL_SYNC`).
    pub sync: Duration,
    /// Records still queued for the journal when the batch became durable (BookKeeper
    /// `JOURNAL_QUEUE_SIZE`, sampled once per batch).
    pub queued: usize,
}

/// Receives journal events as they happen, for metrics ([`Engine::set_journal_observer`]).
///
/// Called on the engine's executor by the journal writer, after a batch is durable and before
/// its adds are acknowledged: implementations must be cheap and must not block or await.
pub trait JournalObserver {
    /// A batch became durable.
    fn batch_durable(&self, batch: &JournalBatch);
    /// One add of that batch became durable, `waited` after it was queued for the journal
    /// (BookKeeper `JOURNAL_ADD_ENTRY`: enqueue to durable).
    fn add_durable(&self, waited: Duration);
}

/// Configuration of one engine (one shard). Sizes in bytes, times as durations.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Directory of the journal files (`journal-{id:016x}.qj`). Created if missing.
    pub journal_dir: PathBuf,
    /// Directory of the entry logs, the index and the checkpoint mark. Created if missing.
    pub ledger_dir: PathBuf,
    /// A journal file rolls to the next one once a batch would not fit; new files are
    /// pre-written with zeros to this size (reused ones already have it). Default 64 MiB. Must
    /// be at least 8 KiB.
    pub journal_file_size_bytes: u64,
    /// How many fully checkpointed journal files are kept for reuse (BookKeeper
    /// `journalReuseFiles` with `journalMaxBackups`). A roll renames the oldest of them to the
    /// next id and rewrites its header instead of pre-writing a new file with zeros, so a
    /// shard's journal disk writes each journal byte once rather than twice. Default 4 (256 MiB
    /// per shard at the default file size); 0 deletes files once checkpointed and pre-writes
    /// every new one. Each use of a file gets a new random salt in its header that seals its
    /// records, so a reused file's older bytes, entry data included, never read as records
    /// (docs/format/journal.md §Files, §Header). Measured in perf/README.md, "Journal file
    /// reuse".
    pub journal_reuse_files: usize,
    /// Longest time the oldest queued add waits before its group is written
    /// (BookKeeper `journalMaxGroupWaitMSec`, whose default is 2 ms). Default 0: an idle journal
    /// writes at once, and adds arriving while a write and its sync are in flight form the next
    /// group (group commit without added latency); a positive value holds an idle journal's
    /// first add that long to gather more.
    pub group_commit_wait_max: Duration,
    /// A group is written as soon as this many record bytes are queued
    /// (BookKeeper `journalBufferedWritesThreshold`). Default 512 KiB.
    pub group_commit_bytes_max: usize,
    /// How a journal batch is made durable: `true` writes it with `RWF_DSYNC`, one request that
    /// completes once the batch is durable ([`StorageFile::write_durable_at`]); `false` writes it
    /// and then issues `fdatasync`, two requests, the second handed by io_uring to a worker
    /// thread (BookKeeper's journal: `write` then `force`). Both give the same durability for a
    /// journal that has one write in flight. Default `true`: it measured fewer CPU seconds per
    /// acknowledged add (perf/README.md, "Journal: one durable write per batch").
    pub journal_dsync_writes: bool,
    /// Bytes of entry data in the write cache beyond which a checkpoint starts early. Default 64 MiB.
    pub write_cache_bytes_max: usize,
    /// Longest time an add waits for write-cache room while a checkpoint is writing and the
    /// live cache is full, before it fails with [`Error::WriteCacheFull`] (BookKeeper
    /// `dbStorage_maxThrottleTimeMs`). Default 4 s: below the ledger client's 5 s request
    /// timeout, so the client hears "too many requests" instead of silence.
    pub write_cache_wait_max: Duration,
    /// Record bytes (headers and entry data) queued for the journal writer beyond which an add
    /// waits for the writer to take a batch, at most `write_cache_wait_max`, then fails with
    /// [`Error::JournalQueueFull`]: adds arriving faster than the journal disk writes them
    /// cannot grow the queue without bound (BookKeeper bounds its journal queue,
    /// `journalQueueSize`). Fences are never held back (they are small, and recovery must get
    /// through). An add is admitted while the queue holds at most this many bytes, so the
    /// queue exceeds it by less than one add. Default 64 MiB.
    pub journal_queue_bytes_max: usize,
    /// Entry-log files kept open for reads, besides the log being written; past it the least
    /// recently used is closed and reopened on its next read (BookKeeper `openFileLimit`).
    /// Values below 1 count as 1. Default 256.
    pub entry_log_readers_max: usize,
    /// Time between background checkpoints. Default 10 s (BookKeeper `flushInterval`).
    pub checkpoint_interval: Duration,
    /// An entry log rolls to a new file beyond this size. Default 1 GiB (BookKeeper `logSizeLimit`).
    pub entry_log_size_bytes_max: u64,
    /// Garbage collection also rolls the entry log being appended to (the current one) once it
    /// holds at least this many bytes and less than half of them are live (the rest belongs to
    /// deleted ledgers), then deletes or compacts it in the same run: deleting a ledger gives
    /// its space back within one GC interval whatever `entry_log_size_bytes_max` is
    /// (docs/format/entry-log.md, "Rolling the current log"). BookKeeper leaves the current log
    /// alone until it reaches `logSizeLimit`. 0 turns it off. Default 4 MiB.
    pub entry_log_roll_floor_bytes: u64,
    /// Largest entry accepted by [`Engine::add_entry`]; larger ones get [`Error::TooLarge`].
    /// Default 5 MiB (BookKeeper `nettyMaxFrameSizeBytes`).
    pub entry_size_bytes_max: usize,
    /// On a read that misses the write cache and the read cache, up to this many following
    /// entries of the same ledger (same entry log, contiguous) are read in the same I/O and kept
    /// in the read cache, so a sequential catch-up reader costs few large reads (BookKeeper
    /// `dbStorage_readAheadCacheBatchSize`). 0 disables read-ahead. Default 100.
    pub read_ahead_entries: usize,
    /// Largest span of entry-log bytes one read-ahead reads. Default 1 MiB.
    pub read_ahead_bytes_max: usize,
    /// Bound of the read cache (entries read from entry logs and their read-ahead), in bytes of
    /// entry data; evicted oldest first. Default 64 MiB (BookKeeper
    /// `dbStorage_readAheadCacheMaxSizeMb`).
    pub read_cache_bytes_max: usize,
    /// Rate limit of the engine's bulk writes (checkpoint entry-log and index writes, journal
    /// pre-creation), in bytes per second; 0 = unlimited. Whatever the rate, a bulk chunk is
    /// never submitted while a journal write or sync is in flight. Default 256 MiB/s.
    pub background_write_bytes_per_second: u64,
    /// During bulk writes, the file being written is synced after every this many bulk bytes
    /// (admitted like a bulk chunk), so the data reaches the medium in small pieces instead of
    /// one large flush that a concurrent journal sync would wait behind (BookKeeper
    /// `flushEntrylogBytes`); 0 = only the sync at the end. Default 4 MiB.
    pub background_sync_bytes: u64,
    /// Minor compaction rewrites entry logs whose live bytes are below this fraction of their
    /// size (BookKeeper `minorCompactionThreshold`, default 0.2).
    pub minor_compaction_threshold: f64,
    /// Time between minor compactions, counted from open; zero disables them (BookKeeper
    /// `minorCompactionInterval`, default 3600 s).
    pub minor_compaction_interval: Duration,
    /// Major compaction rewrites entry logs whose live fraction is below this (BookKeeper
    /// `majorCompactionThreshold`, default 0.8; must be above the minor one).
    pub major_compaction_threshold: f64,
    /// Time between major compactions, counted from open; zero disables them (BookKeeper
    /// `majorCompactionInterval`, default 86400 s).
    pub major_compaction_interval: Duration,
    /// Bound of the index block cache, in bytes (4 KiB blocks of index segment files and their
    /// bookkeeping), evicted least recently used first; the index's other resident bytes are a
    /// few hundred per live segment (BookKeeper `dbStorage_rocksDB_blockCacheSize`).
    /// Default 16 MiB.
    pub index_cache_bytes_max: usize,
    /// Bytes of the space reserve kept in the ledger directory (`space-reserve.qrs`, written
    /// with zeros at open and after every garbage-collection run, as far as there is room):
    /// when a write of garbage collection itself (tombstones, compaction, its index segment
    /// and mark) finds the disk full, the reserve is given back and the write retried once, so
    /// a full disk never blocks the work that frees it (docs/format/tombstones.md, "Space
    /// reserve"; BookKeeper keeps room for index files and replay on a full disk,
    /// `minUsableSizeForIndexFileCreation`). Rounded down to 4 KiB; 0 turns it off. Default
    /// 4 MiB.
    pub space_reserve_bytes: u64,
}

impl EngineConfig {
    /// A configuration with the defaults listed on each field.
    pub fn new(journal_dir: PathBuf, ledger_dir: PathBuf) -> Self {
        Self {
            journal_dir,
            ledger_dir,
            journal_file_size_bytes: 64 << 20,
            journal_reuse_files: 4,
            group_commit_wait_max: Duration::ZERO,
            group_commit_bytes_max: 512 << 10,
            journal_dsync_writes: true,
            write_cache_bytes_max: 64 << 20,
            write_cache_wait_max: Duration::from_secs(4),
            journal_queue_bytes_max: 64 << 20,
            entry_log_readers_max: 256,
            checkpoint_interval: Duration::from_secs(10),
            entry_log_size_bytes_max: 1 << 30,
            entry_log_roll_floor_bytes: 4 << 20,
            entry_size_bytes_max: 5 << 20,
            read_ahead_entries: 100,
            read_ahead_bytes_max: 1 << 20,
            read_cache_bytes_max: 64 << 20,
            background_write_bytes_per_second: 256 << 20,
            background_sync_bytes: 4 << 20,
            minor_compaction_threshold: 0.2,
            minor_compaction_interval: Duration::from_secs(3600),
            major_compaction_threshold: 0.8,
            major_compaction_interval: Duration::from_secs(86400),
            index_cache_bytes_max: 16 << 20,
            space_reserve_bytes: 4 << 20,
        }
    }
}

/// What the engine knows about one ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerState {
    /// Set by [`Engine::fence`] with the ledger's bound master key, or when the first add
    /// binds a key that a fence recorded before it (docs/protocol.md §Fence); never cleared.
    /// Normal adds are refused once set. A fence recorded for a key no add bound is not shown
    /// here (it fences only holders of that key).
    pub fenced: bool,
    /// The largest piggybacked LAC among the durable entries of the ledger (BookKeeper keeps
    /// max(LAC field of stored entries)).
    pub lac: Option<u64>,
    /// The largest entry id durably stored for the ledger.
    pub last_entry: Option<u64>,
}

/// The answer to a long-poll read of the LAC ([`Engine::wait_for_lac`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LacUpdate {
    /// The ledger's LAC when the wait ended (`None`: no LAC known yet).
    pub lac: Option<u64>,
    /// Whether the ledger is fenced.
    pub fenced: bool,
    /// Entry `previous + 1` (entry 0 when `previous` was `None`) when the LAC passed
    /// `previous` and this shard holds that entry: the piggybacked next entry of BookKeeper's
    /// long-poll read.
    pub next_entry: Option<(u64, Vec<u8>)>,
}

/// Read-path counters since open (observability of the caches and read-ahead).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Reads answered from the write cache (including a checkpoint in progress).
    pub write_cache_hits: u64,
    /// Reads answered from the read cache.
    pub read_cache_hits: u64,
    /// Reads that went to an entry log (one I/O each, covering the read-ahead).
    pub entry_log_reads: u64,
    /// Entries put in the read cache by read-ahead (not counting the entry asked for).
    pub entries_read_ahead: u64,
    /// Bytes of entry data in the read cache now.
    pub read_cache_bytes: u64,
}

/// Garbage-collection and compaction counters since open, and the entry logs' usage now
/// (BookKeeper's `GarbageCollectorThread` figures: runs, `MAJOR/MINOR_COMPACTION_TOTAL`,
/// `RECLAIMED_{DELETION,COMPACTION}_SPACE_BYTES`, `ACTIVE_ENTRY_LOG_TOTAL`). Bytes are file bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcStats {
    /// Completed [`Engine::collect_garbage`] / [`Engine::compact_entry_logs`] runs.
    pub runs: u64,
    /// Runs that failed (an I/O or corruption error; nothing is lost, the next run retries).
    pub failed_runs: u64,
    /// Ledgers deleted (tombstoned) since open.
    pub ledgers_deleted: u64,
    /// Entry logs deleted because no live entry was left in them.
    pub entry_logs_deleted: u64,
    /// Entry logs deleted after their live entries were copied to a new log (compaction).
    pub entry_logs_compacted: u64,
    /// Current entry logs rolled by garbage collection because most of their bytes were dead
    /// (`EngineConfig::entry_log_roll_floor_bytes`).
    pub entry_logs_rolled: u64,
    /// Live entries copied by compaction.
    pub entries_relocated: u64,
    /// Bytes of entry logs deleted with no live entry.
    pub bytes_reclaimed_by_deletion: u64,
    /// Bytes of compacted entry logs deleted, less the bytes their live entries took again.
    pub bytes_reclaimed_by_compaction: u64,
    /// Minor and major compaction passes run (by schedule or by request).
    pub minor_compactions: u64,
    pub major_compactions: u64,
    /// Entry logs on disk now, their bytes, and the bytes of live entries in them.
    pub entry_logs: u64,
    pub entry_log_bytes: u64,
    pub live_bytes: u64,
    /// Bytes the space reserve holds now (`EngineConfig::space_reserve_bytes` unless a full
    /// disk made garbage collection give it back and there was no room to take it again yet).
    pub reserve_bytes: u64,
}

/// Figures of the index ([`Engine::index_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Live index segment files.
    pub segments: u64,
    /// Locations they hold, counting ones a newer segment overrides (until merged).
    pub segment_entries: u64,
    /// Bytes the index holds in memory now: segment headers, top keys, block cache.
    pub memory_bytes: u64,
    /// Bytes of the block cache now (part of `memory_bytes`).
    pub cache_bytes: u64,
    /// Block-cache hits and misses since open.
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Merges completed and failed since open.
    pub merges: u64,
    pub merge_failures: u64,
    /// Damaged index segments rebuilt from the entry logs since open (docs/format/index.md,
    /// "Damaged segments"; each is also logged at warn level with its path).
    pub segments_rebuilt: u64,
    /// Ledgers those rebuilds gave a rebuilt state (fenced; their state was unreadable).
    pub ledgers_rebuilt: u64,
    /// Entry locations written into the replacement segments.
    pub entries_rebuilt: u64,
    /// Entry-log bytes read by the rebuilds, and their time in milliseconds.
    pub rebuild_entry_log_bytes: u64,
    /// Entry-log files read by the rebuilds (a described segment's rebuild reads only those it
    /// pointed into).
    pub rebuild_entry_logs: u64,
    pub rebuild_ms: u64,
    /// Background rebuilds that failed (retried when a read finds the segment damaged again).
    pub rebuild_failures: u64,
}

/// Errors of the engine. Each message is one line naming the path and byte offset involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed.
    #[error("{op} failed on {path} at byte offset {file_offset_bytes}: {source}", path = .path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        file_offset_bytes: u64,
        source: std::io::Error,
    },
    /// Bytes on disk are not what was written (bad checksum, bad header, garbage before durable
    /// data): a media fault or outside tampering, not a torn tail. The engine refuses to open.
    #[error("corrupt data in {path} at byte offset {file_offset_bytes}: {reason}", path = .path.display())]
    Corrupt {
        path: PathBuf,
        file_offset_bytes: u64,
        reason: String,
    },
    /// A file's format version is outside what this build reads.
    #[error("unsupported format version {found} in {path} (this build reads versions {oldest} to {newest})", path = .path.display())]
    UnsupportedFormat {
        path: PathBuf,
        found: u16,
        oldest: u16,
        newest: u16,
    },
    /// The ledger is fenced (recovery started); a normal add must be treated as failed.
    #[error("ledger {ledger} is fenced")]
    Fenced { ledger: u64 },
    /// The master key differs from the one the ledger's first add bound; or a fence of a
    /// ledger no add bound yet carries one key more than the 16 recorded for it.
    #[error("wrong master key for ledger {ledger}")]
    Unauthorized { ledger: u64 },
    /// This shard already stores (or is storing) the entry with other bytes. A re-add must
    /// carry the same bytes (recovery re-adds do), so an acknowledged entry is never replaced
    /// (BookKeeper would overwrite it). Nothing was stored.
    #[error("entry {entry} of ledger {ledger} is already stored with other bytes")]
    EntryMismatch { ledger: u64, entry: u64 },
    /// This shard has no state at all for the ledger (per the index, after replay).
    #[error("no such ledger {ledger}")]
    NoSuchLedger { ledger: u64 },
    /// The index holds the ledger but not the entry. `entry == u64::MAX` means "the last entry"
    /// of a ledger that has none.
    #[error("no such entry {entry} in ledger {ledger}")]
    NoSuchEntry { ledger: u64, entry: u64 },
    /// The entry is larger than `EngineConfig::entry_size_bytes_max`.
    #[error("entry of {size_bytes} bytes exceeds the maximum of {max} bytes")]
    TooLarge { size_bytes: usize, max: usize },
    /// The write cache stayed full for `write_cache_wait_max` while a checkpoint was writing:
    /// the shard takes adds faster than it can move them to entry logs. Retry later (the
    /// bookie answers `TooManyRequests`).
    #[error("write cache full: no room after waiting {waited_ms} ms for a checkpoint")]
    WriteCacheFull { waited_ms: u64 },
    /// More than `journal_queue_bytes_max` stayed queued for the journal for
    /// `write_cache_wait_max`: adds arrive faster than the journal disk takes them. Nothing was
    /// stored. Retry later (the bookie answers `TooManyRequests`).
    #[error("journal queue full: {queued_bytes} bytes queued after waiting {waited_ms} ms")]
    JournalQueueFull { queued_bytes: usize, waited_ms: u64 },
    /// The ledger was deleted (its tombstone is durable): adds and fences are refused for
    /// good, so no write can re-create a deleted ledger's state (BookKeeper's fenced-then-deleted
    /// ledger that was written again, bookkeeper.md §failure modes 14).
    #[error("ledger {ledger} was deleted")]
    LedgerDeleted { ledger: u64 },
    /// A damaged index segment that covers this ledger (its key range holds the entry asked
    /// for, or its lost ledger-state block may have held the ledger's state) is being rebuilt
    /// from the entry logs in the background: not a negative answer (DESIGN.md §2, "negative
    /// answers are safety-critical"); retry later (the bookie answers `TooManyRequests`).
    /// `None`: a whole-shard operation (verification) that waits for every rebuild.
    #[error("the index of {} is being rebuilt; retry later", .ledger.map_or("this shard".to_string(), |l| format!("ledger {l}")))]
    IndexRebuilding { ledger: Option<u64> },
    /// The engine was closed.
    #[error("engine is closed")]
    Closed,
}

impl Error {
    /// Whether this is an I/O error caused by a full filesystem (ENOSPC, or EDQUOT: quota).
    pub fn is_storage_full(&self) -> bool {
        match self {
            // std maps ENOSPC to StorageFull and EDQUOT to QuotaExceeded.
            Error::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            ),
            _ => false,
        }
    }
}

/// Entry points for `benches/index.rs` only: the index-writing step of a checkpoint in the
/// current format and in the version 1 format it replaced, on the same locations. Not a stable
/// interface.
#[doc(hidden)]
pub mod bench {
    use std::path::Path;

    use crate::format::{encode_segment, Location, StoredLedger};
    use crate::io::{Storage, StorageFile};
    use crate::Error;

    /// Writes index segment file `id` in `dir` (version 2), synced, directory synced: what a
    /// checkpoint now does for its index.
    pub async fn write_segment<S: Storage>(
        storage: &S,
        dir: &Path,
        id: u64,
        locations: &[(u64, u64, Location)],
        ledgers: &[(u64, StoredLedger)],
    ) -> Result<(), Error> {
        let mut w = crate::index::segment::SegmentWriter::create(storage, dir, id, None).await?;
        for &(l, e, loc) in locations {
            w.push(l, e, loc).await?;
        }
        w.finish(ledgers).await?;
        storage
            .sync_dir(dir)
            .await
            .map_err(crate::files::io_err("sync dir", dir, 0))
    }

    /// Appends one version 1 index segment at `at` of `file` and syncs it: what a checkpoint
    /// did for its index before. Returns the bytes written.
    pub async fn append_legacy_segment<F: StorageFile>(
        file: &F,
        at: u64,
        locations: &[(u64, u64, Location)],
        ledgers: &[(u64, StoredLedger)],
    ) -> std::io::Result<u64> {
        let seg = encode_segment(locations, ledgers);
        file.write_at(at, &seg).await?;
        file.fdatasync().await?;
        Ok(seg.len() as u64)
    }
}

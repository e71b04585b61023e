//! Garbage collection and entry-log compaction (BookKeeper's `GarbageCollectorThread`,
//! bookkeeper.md §2.9): deleted ledgers are tombstoned and dropped from the index and the ledger
//! table; entry logs with no live entry are deleted; entry logs whose live fraction is below the
//! minor (0.2) or major (0.8) threshold are compacted: their live entries are copied into a new
//! entry log, it is synced, the new locations are committed (index segment synced, then the
//! mark), and only then is the old log deleted. docs/format/entry-log.md §Garbage collection
//! gives the crash argument.
//!
//! The engine knows nothing of the metadata store: the caller says which ledgers are deleted
//! (the bookie asks the metadata store; a read that fails never counts as "deleted").
//!
//! Runs are one at a time, on the engine's background task queue; their reads and writes are
//! admitted by the bulk throttle (rate limit, and never while a journal write or sync is in
//! flight). Every step that changes locations or deletes a file holds the checkpoint lock, so
//! an entry log a checkpoint is writing is never mistaken for an unreferenced one.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use std::rc::Rc;

use crate::checkpoint::{Checkpointer, MarkKeeper};
use crate::entry_log::{record_bytes, EntryLogCursor, EntryLogs};
use crate::files::{corrupt, io_err};
use crate::format::{decode_entry_record, encode_entry_record, Location, FILE_HEADER_BYTES};
use crate::index::Index;
use crate::io::{Storage, StorageFile};
use crate::lac_watch::LacWatchers;
use crate::ledgers::Ledgers;
use crate::read_ahead::ReadAhead;
use crate::reserve::Reserve;
use crate::sync::Closed;
use crate::throttle::{Throttle, BULK_CHUNK_BYTES};
use crate::tombstones::Tombstones;
use crate::write_cache::WriteCache;
use crate::{EngineConfig, Error, GcStats};

/// Largest span of an old entry log read at once by compaction, in bytes.
const COMPACTION_READ_BYTES_MAX: u64 = 1 << 20;
/// Compaction output buffered before one write, in bytes.
const COMPACTION_WRITE_BYTES_MAX: usize = 1 << 20;

/// Live bytes of one entry log, in total and per ledger (BookKeeper's per-log ledgers map,
/// `EntryLogMetadata`).
#[derive(Debug, Default)]
struct LiveInLog {
    bytes: u64,
    ledgers: HashMap<u64, u64>,
}

/// Entry-log metadata: the live bytes of every entry log, per ledger, kept in memory. Built at
/// open from the index and kept up to date as locations are published, moved and deleted.
#[derive(Default)]
pub(crate) struct LogUsage {
    logs: RefCell<BTreeMap<u64, LiveInLog>>,
}

impl LogUsage {
    /// Counts an indexed entry of `ledger` at `loc` as live.
    pub fn add(&self, ledger: u64, loc: Location) {
        let mut logs = self.logs.borrow_mut();
        let l = logs.entry(loc.log_id).or_default();
        l.bytes += record_bytes(loc);
        *l.ledgers.entry(ledger).or_default() += record_bytes(loc);
    }

    /// Counts the entry of `ledger` at `loc` as dead (moved or rewritten).
    pub fn remove(&self, ledger: u64, loc: Location) {
        let mut logs = self.logs.borrow_mut();
        let Some(l) = logs.get_mut(&loc.log_id) else {
            return;
        };
        let n = record_bytes(loc);
        l.bytes = l.bytes.saturating_sub(n);
        if let Some(b) = l.ledgers.get_mut(&ledger) {
            *b = b.saturating_sub(n);
            if *b == 0 {
                l.ledgers.remove(&ledger);
            }
        }
    }

    /// Counts every entry of `ledger` as dead (a deleted ledger).
    pub fn remove_ledger(&self, ledger: u64) {
        for l in self.logs.borrow_mut().values_mut() {
            if let Some(b) = l.ledgers.remove(&ledger) {
                l.bytes = l.bytes.saturating_sub(b);
            }
        }
    }

    /// Live bytes in log `id`.
    pub fn live(&self, id: u64) -> u64 {
        self.logs.borrow().get(&id).map_or(0, |l| l.bytes)
    }

    /// Ledgers with live entries in log `id`.
    pub fn ledgers_in(&self, id: u64) -> Vec<u64> {
        self.logs
            .borrow()
            .get(&id)
            .map_or_else(Vec::new, |l| l.ledgers.keys().copied().collect())
    }

    /// Ids of every log some index entry points into.
    pub fn referenced_logs(&self) -> Vec<u64> {
        self.logs
            .borrow()
            .iter()
            .filter(|(_, l)| l.bytes > 0)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Forgets log `id` (deleted).
    pub fn forget_log(&self, id: u64) {
        self.logs.borrow_mut().remove(&id);
    }

    /// Takes the figures of `other` (counted again from the index).
    pub fn replace(&self, other: LogUsage) {
        *self.logs.borrow_mut() = other.logs.into_inner();
    }

    /// Live bytes in all logs.
    pub fn total_live(&self) -> u64 {
        self.logs.borrow().values().map(|l| l.bytes).sum()
    }
}

/// What one garbage-collection run did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GcRun {
    /// Ledgers newly tombstoned.
    pub ledgers_deleted: u64,
    /// Entry logs deleted with no live entry.
    pub entry_logs_deleted: u64,
    /// Entry logs compacted (live entries copied, old log deleted).
    pub entry_logs_compacted: u64,
    /// Current entry logs rolled because most of their bytes were dead (then deleted or
    /// compacted in the same run).
    pub entry_logs_rolled: u64,
    /// Live entries copied.
    pub entries_relocated: u64,
    /// File bytes freed, less the bytes the copies took.
    pub bytes_reclaimed: u64,
    /// The compaction threshold applied, if compaction ran (minor, major or requested).
    pub compaction_threshold: Option<f64>,
}

/// What [`crate::Engine::verify_index`] checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexCheck {
    /// Index entries whose record was read back and checked.
    pub locations: u64,
    /// Distinct entry logs they point into.
    pub entry_logs: u64,
}

/// Compaction's output while it copies one entry log: the output log (created or rolled as
/// needed), the bytes buffered for it, the moves so far `(ledger, entry, old, new)` and the
/// bytes copied.
struct Copying<'a, F> {
    output: &'a mut Option<EntryLogCursor<F>>,
    buf: Vec<u8>,
    moved: Vec<(u64, u64, Location, Location)>,
    copied_bytes: u64,
}

/// The end (exclusive) of the run of live entries from `i` read at once: entries whose
/// records end within `COMPACTION_READ_BYTES_MAX` of the first one's start.
fn span_end(live: &[(u64, u64, Location)], i: usize) -> usize {
    let start = live[i].2.offset;
    let mut j = i + 1;
    while j < live.len() {
        let e = live[j].2.offset + record_bytes(live[j].2);
        if e - start > COMPACTION_READ_BYTES_MAX {
            break;
        }
        j += 1;
    }
    j
}

/// Which compaction a run does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Compaction {
    /// Minor or major when its interval has passed since the last one (or open).
    Scheduled,
    /// Now, with this live-fraction threshold (a forced run).
    Threshold(f64),
}

/// Serialisation and figures of the runs.
pub(crate) struct GcState {
    lock: glommio::sync::Semaphore,
    stats: Cell<GcStats>,
    last_minor: Cell<Instant>,
    last_major: Cell<Instant>,
}

impl GcState {
    pub fn new() -> Self {
        let now = quire_clock::now();
        Self {
            lock: glommio::sync::Semaphore::new(1),
            stats: Cell::new(GcStats::default()),
            last_minor: Cell::new(now),
            last_major: Cell::new(now),
        }
    }

    fn count(&self, f: impl FnOnce(&mut GcStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Counters since open (usage figures are filled in by the caller).
    pub fn stats(&self) -> GcStats {
        self.stats.get()
    }
}

/// Garbage collection's context: its own state (run lock, figures, compaction schedule), the
/// tombstone file and the space reserve it alone writes, and handles on what it changes:
/// ledger table, write cache, read-ahead cache, LAC watchers (deletion), entry logs, index and
/// live bytes (compaction), the mark keeper and the checkpointer (to commit relocations under
/// the checkpoint lock). Built by the engine facade.
pub(crate) struct Gc<S: Storage> {
    pub(crate) state: GcState,
    pub(crate) tombstones: Tombstones<S::File>,
    pub(crate) reserve: Reserve,
    pub(crate) storage: Rc<S>,
    pub(crate) cfg: Rc<EngineConfig>,
    pub(crate) closed: Closed,
    pub(crate) marks: Rc<MarkKeeper>,
    pub(crate) checkpointer: Checkpointer<S>,
    pub(crate) ledgers: Rc<Ledgers>,
    pub(crate) write_cache: Rc<WriteCache>,
    pub(crate) read_ahead: Rc<ReadAhead>,
    pub(crate) lac_watchers: Rc<LacWatchers>,
    pub(crate) entry_logs: Rc<EntryLogs<S::File>>,
    pub(crate) index: Rc<Index<S::File>>,
    pub(crate) usage: Rc<LogUsage>,
    pub(crate) throttle: Rc<Throttle>,
}

impl<S: Storage + 'static> Gc<S> {
    /// Figures since open, with the entry logs' size, the live bytes and the reserve now.
    pub fn stats(&self) -> GcStats {
        let mut s = self.state.stats();
        let sizes = self.entry_logs.sizes();
        s.entry_logs = sizes.len() as u64;
        s.entry_log_bytes = sizes.iter().map(|(_, b)| b).sum();
        s.live_bytes = self.usage.total_live();
        s.reserve_bytes = self.reserve.held();
        s
    }

    /// One run: tombstone `deleted`, delete entry logs with no live entry, compact as `compaction`
    /// says. On error nothing is lost (each step commits before the next starts) and the run
    /// counts as failed; the next run retries.
    pub async fn run(&self, deleted: &[u64], compaction: Compaction) -> Result<GcRun, Error> {
        let _run = self
            .state
            .lock
            .acquire_permit(1)
            .await
            .map_err(|_| Error::Closed)?;
        let mut out = GcRun::default();
        if self.index.rebuild_pending() {
            // The live bytes per entry log lack the damaged segment's keys until its rebuild
            // recounts them: a log could look empty that is not. The next run does the work.
            tracing::info!("garbage collection waits for the rebuild of a damaged index segment");
            return Ok(out);
        }
        let r = self.run_locked(deleted, compaction, &mut out).await;
        // Take back the reserve a step gave up, as far as the run freed room (also after a failed
        // run: what it deleted stays deleted).
        if !self.closed.get() {
            if let Err(e) = self.reserve.take(&*self.storage).await {
                tracing::warn!("taking the space reserve again: {e}");
            }
        }
        let gc = &self.state;
        gc.count(|s| {
            s.ledgers_deleted += out.ledgers_deleted;
            s.entry_logs_deleted += out.entry_logs_deleted;
            s.entry_logs_compacted += out.entry_logs_compacted;
            s.entry_logs_rolled += out.entry_logs_rolled;
            s.entries_relocated += out.entries_relocated;
            match r {
                Ok(()) => s.runs += 1,
                Err(_) => s.failed_runs += 1,
            }
        });
        r.map(|()| out)
    }

    async fn run_locked(
        &self,
        deleted: &[u64],
        compaction: Compaction,
        out: &mut GcRun,
    ) -> Result<(), Error> {
        self.delete_ledgers(deleted, out).await?;
        let rolled = self.roll_mostly_dead_current(out).await?;
        self.delete_empty_logs(out).await?;
        if let Some(id) = rolled.filter(|id| self.usage.live(*id) > 0) {
            // Rolled because less than half of it is live: copying that half frees the rest now
            // rather than at the next scheduled compaction.
            self.compact_logs(vec![id], out).await?;
        }
        let threshold = match compaction {
            Compaction::Threshold(t) => Some(t),
            Compaction::Scheduled => self.scheduled_threshold(),
        };
        let Some(threshold) = threshold else {
            return Ok(());
        };
        out.compaction_threshold = Some(threshold);
        if threshold >= self.cfg.major_compaction_threshold {
            self.state.count(|s| s.major_compactions += 1);
        } else {
            self.state.count(|s| s.minor_compactions += 1);
        }
        self.compact(threshold, out).await
    }

    /// The threshold of the compaction due now, if any: major when its interval passed (which also
    /// restarts the minor interval, as in BookKeeper), else minor when its interval passed.
    fn scheduled_threshold(&self) -> Option<f64> {
        let cfg = &*self.cfg;
        let gc = &self.state;
        let now = quire_clock::now();
        let due = |last: &Cell<Instant>, every: std::time::Duration| {
            !every.is_zero() && now.duration_since(last.get()) >= every
        };
        if due(&gc.last_major, cfg.major_compaction_interval) {
            gc.last_major.set(now);
            gc.last_minor.set(now);
            Some(cfg.major_compaction_threshold)
        } else if due(&gc.last_minor, cfg.minor_compaction_interval) {
            gc.last_minor.set(now);
            Some(cfg.minor_compaction_threshold)
        } else {
            None
        }
    }

    /// Tombstones the ledgers of `ids` not already deleted (durably, first), then drops their
    /// state, cached entries, index entries and live bytes.
    async fn delete_ledgers(&self, ids: &[u64], out: &mut GcRun) -> Result<(), Error> {
        let mut fresh: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| !self.ledgers.is_deleted(*id))
            .collect();
        fresh.sort_unstable();
        fresh.dedup();
        if fresh.is_empty() {
            return Ok(());
        }
        // Under the checkpoint lock no snapshot of the write cache is being written, so no
        // checkpoint can publish locations of these ledgers after they are dropped.
        let _cp = self.marks.lock().await?;
        match self.tombstones.append(&*self.storage, &fresh).await {
            // The disk is full: the group goes into the room the reserve kept for it.
            Err(e) if e.is_storage_full() && self.reserve.release(&*self.storage).await? => {
                tracing::warn!("tombstones: {e}; retrying in the space reserve");
                self.tombstones.append(&*self.storage, &fresh).await?
            }
            r => r?,
        }
        for &ledger in &fresh {
            self.ledgers.delete(ledger);
            self.write_cache.remove_ledger(ledger);
            self.read_ahead.remove_ledger(ledger);
            self.usage.remove_ledger(ledger);
        }
        // Their index entries leave the disk at the next merge; reads stop at the ledger table.
        self.index.ledgers_deleted();
        self.lac_watchers.wake_all();
        out.ledgers_deleted += fresh.len() as u64;
        Ok(())
    }

    /// Deletes every entry log no index entry points into, except the one checkpoints append to.
    /// Such a log holds only dead entries, or the unreferenced bytes of a checkpoint or compaction
    /// that crashed before its mark (their entries are in the journal, or still in the old log).
    async fn delete_empty_logs(&self, out: &mut GcRun) -> Result<(), Error> {
        let _cp = self.marks.lock().await?;
        let current = self.entry_logs.current_id();
        let mut removed = 0u64;
        for (id, _) in self.entry_logs.sizes() {
            if Some(id) == current || self.usage.live(id) > 0 {
                continue;
            }
            let size = self.entry_logs.remove(&*self.storage, id).await?;
            self.usage.forget_log(id);
            removed += 1;
            out.entry_logs_deleted += 1;
            out.bytes_reclaimed += size;
            self.state.count(|s| s.bytes_reclaimed_by_deletion += size);
        }
        if removed > 0 {
            self.sync_ledger_dir().await?;
        }
        Ok(())
    }

    /// Rolls the current entry log when it holds at least `entry_log_roll_floor_bytes` and less
    /// than half of its bytes (past the header) are live, so that the dead half of the log
    /// being appended to can be reclaimed without waiting for it to reach
    /// `entry_log_size_bytes_max`. Holding the checkpoint lock, every byte in it is synced and
    /// indexed (docs/format/entry-log.md, "Rolling the current log"). Returns the rolled id.
    async fn roll_mostly_dead_current(&self, out: &mut GcRun) -> Result<Option<u64>, Error> {
        let floor = self.cfg.entry_log_roll_floor_bytes;
        if floor == 0 {
            return Ok(None);
        }
        let _cp = self.marks.lock().await?;
        let Some(id) = self.entry_logs.current_id() else {
            return Ok(None);
        };
        let size = self
            .entry_logs
            .sizes()
            .into_iter()
            .find(|(i, _)| *i == id)
            .map_or(0, |(_, b)| b);
        let capacity = size.saturating_sub(FILE_HEADER_BYTES as u64);
        if size < floor || self.usage.live(id).saturating_mul(2) >= capacity {
            return Ok(None);
        }
        let rolled = self.entry_logs.roll_current();
        if rolled.is_some() {
            out.entry_logs_rolled += 1;
            tracing::info!(
                entry_log = id,
                size,
                live = self.usage.live(id),
                "garbage collection rolled the current entry log: most of it is dead"
            );
        }
        Ok(rolled)
    }

    async fn sync_ledger_dir(&self) -> Result<(), Error> {
        let dir = &self.cfg.ledger_dir;
        self.storage
            .sync_dir(dir)
            .await
            .map_err(io_err("sync ledger dir", dir, 0))
    }

    /// Compacts every entry log (but the current one) whose live fraction is below `threshold`,
    /// emptiest first, into new logs.
    async fn compact(&self, threshold: f64, out: &mut GcRun) -> Result<(), Error> {
        let candidates: Vec<u64> = {
            let _cp = self.marks.lock().await?;
            let current = self.entry_logs.current_id();
            let mut c: Vec<(f64, u64)> = self
                .entry_logs
                .sizes()
                .into_iter()
                .filter(|(id, _)| Some(*id) != current)
                .filter_map(|(id, size)| {
                    let capacity = size.saturating_sub(FILE_HEADER_BYTES as u64);
                    let live = self.usage.live(id);
                    if capacity == 0 || live == 0 {
                        return None;
                    }
                    let fraction = live as f64 / capacity as f64;
                    (fraction < threshold).then_some((fraction, id))
                })
                .collect();
            c.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            c.into_iter().map(|(_, id)| id).collect()
        };
        self.compact_logs(candidates, out).await
    }

    /// Compacts the logs `candidates`, in order, into new logs.
    async fn compact_logs(&self, candidates: Vec<u64>, out: &mut GcRun) -> Result<(), Error> {
        let mut output: Option<EntryLogCursor<S::File>> = None;
        for id in candidates {
            if self.closed.get() {
                return Err(Error::Closed);
            }
            match self.compact_log(id, &mut output, out).await {
                // The disk is full: copy again into a new log, in the room the reserve kept (the
                // bytes the failed copy wrote are unreferenced; a later run deletes or compacts
                // them).
                Err(e) if e.is_storage_full() && self.reserve.release(&*self.storage).await? => {
                    tracing::warn!(
                        "compaction of entry log {id}: {e}; retrying in the space reserve"
                    );
                    output.take();
                    self.compact_log(id, &mut output, out).await?
                }
                r => r?,
            }
        }
        Ok(())
    }

    /// Copies the live entries of log `id` into `output` (created or rolled as needed), syncs
    /// it, commits the new locations, then deletes log `id`.
    async fn compact_log(
        &self,
        id: u64,
        output: &mut Option<EntryLogCursor<S::File>>,
        out: &mut GcRun,
    ) -> Result<(), Error> {
        let live = self.live_in_log(id).await?;
        let path = self.entry_logs.path(id);
        let file = self.entry_logs.reader(&*self.storage, id, &path).await?;
        let mut copy = Copying {
            output,
            buf: Vec::new(),
            moved: Vec::with_capacity(live.len()),
            copied_bytes: 0,
        };
        let mut i = 0;
        while i < live.len() {
            if self.closed.get() {
                return Err(Error::Closed);
            }
            let j = span_end(&live, i);
            let start = live[i].2.offset;
            let b = self.read_for_compaction(&file, &path, &live[i..j]).await?;
            for &(ledger, entry, loc) in &live[i..j] {
                let rec = b.get((loc.offset - start) as usize..).unwrap_or(&[]);
                let data = decode_entry_record(rec, ledger, entry, loc.data_len)
                    .map_err(|r| corrupt(&path, loc.offset, r))?;
                self.copy_entry(&mut copy, ledger, entry, loc, &data)
                    .await?;
            }
            i = j;
        }
        self.sync_output(&mut copy).await?;
        // Fault point (docs/fault-points.md): a crash with the live entries copied and synced
        // but their new locations not committed.
        quire_faults::crash("engine.gc.compact.before_commit");
        self.commit_compaction(id, &copy.moved, copy.copied_bytes, out)
            .await
    }

    /// Compaction, step 1: the live entries of log `id` (from the index), in log order.
    async fn live_in_log(&self, id: u64) -> Result<Vec<(u64, u64, Location)>, Error> {
        let mut live: Vec<(u64, u64, Location)> = Vec::new();
        for ledger in self.usage.ledgers_in(id) {
            for (entry, loc) in self.index.ledger_locations_in_log(ledger, id).await? {
                live.push((ledger, entry, loc));
            }
        }
        live.sort_by_key(|(_, _, l)| l.offset);
        Ok(live)
    }

    /// Compaction, step 2: reads the span of the old log that holds `run` (consecutive live
    /// entries), admitted like bulk writes: rate-limited, never during a journal write/sync.
    async fn read_for_compaction(
        &self,
        file: &S::File,
        path: &std::path::Path,
        run: &[(u64, u64, Location)],
    ) -> Result<Vec<u8>, Error> {
        let start = run[0].2.offset;
        let end = run
            .iter()
            .map(|(_, _, l)| l.offset + record_bytes(*l))
            .max()
            .expect("a run holds an entry");
        let span = (end - start) as usize;
        let mut admitted = 0;
        while admitted < span {
            let n = (span - admitted).min(BULK_CHUNK_BYTES);
            self.throttle.admit(n).await;
            admitted += n;
        }
        file.read_at(start, span).await.map_err(io_err(
            "read entry log for compaction",
            path,
            start,
        ))
    }

    /// Compaction, step 3: appends entry `entry` of `ledger` (now at `loc`) to the output,
    /// rolling to a new log when it would outgrow `entry_log_size_bytes_max`, and writing the
    /// buffer out once it holds `COMPACTION_WRITE_BYTES_MAX`.
    async fn copy_entry(
        &self,
        copy: &mut Copying<'_, S::File>,
        ledger: u64,
        entry: u64,
        loc: Location,
        data: &[u8],
    ) -> Result<(), Error> {
        let logs = &self.entry_logs;
        let rec_len = record_bytes(loc);
        let roll = match copy.output.as_ref() {
            None => true,
            Some(c) => {
                let at = c.pos + copy.buf.len() as u64;
                at + rec_len > self.cfg.entry_log_size_bytes_max && at > FILE_HEADER_BYTES as u64
            }
        };
        if roll {
            if let Some(mut c) = copy.output.take() {
                let n = logs.flush_buf(&c, &mut copy.buf, &self.throttle).await?;
                c.pos += n;
                drop(logs.sync(c).await?);
            }
            *copy.output = Some(logs.create(&*self.storage).await?);
        }
        let c = copy.output.as_mut().expect("compaction output is open");
        let offset = c.pos + copy.buf.len() as u64;
        encode_entry_record(&mut copy.buf, ledger, entry, data);
        copy.copied_bytes += rec_len;
        copy.moved.push((
            ledger,
            entry,
            loc,
            Location {
                log_id: c.id,
                offset,
                data_len: loc.data_len,
            },
        ));
        if copy.buf.len() >= COMPACTION_WRITE_BYTES_MAX {
            let n = logs.flush_buf(c, &mut copy.buf, &self.throttle).await?;
            c.pos += n;
        }
        Ok(())
    }

    /// Compaction, step 4: writes out the buffer and fdatasyncs the output log.
    async fn sync_output(&self, copy: &mut Copying<'_, S::File>) -> Result<(), Error> {
        let logs = &self.entry_logs;
        if let Some(c) = copy.output.as_mut() {
            let n = logs.flush_buf(c, &mut copy.buf, &self.throttle).await?;
            c.pos += n;
            let opath = logs.path(c.id);
            self.throttle.admit(0).await;
            c.file
                .fdatasync()
                .await
                .map_err(io_err("entry log fdatasync", &opath, c.pos))?;
        }
        Ok(())
    }

    /// Compaction, step 5: with the checkpoint lock, commits the moves of entries still where
    /// they were copied from, then deletes log `id` (`copied_bytes` went into the copies).
    async fn commit_compaction(
        &self,
        id: u64,
        moved: &[(u64, u64, Location, Location)],
        copied_bytes: u64,
        out: &mut GcRun,
    ) -> Result<(), Error> {
        let cp = self.marks.lock().await?;
        // Only entries still where they were copied from move: a recovery add may have
        // rewritten one meanwhile, or its ledger may have been deleted.
        let mut still: Vec<(u64, u64, Location, Location)> = Vec::with_capacity(moved.len());
        for &(l, e, old, new) in moved {
            if !self.ledgers.is_deleted(l) && self.index.location(l, e).await? == Some(old) {
                still.push((l, e, old, new));
            }
        }
        self.checkpointer.commit_relocations(&cp, &still).await?;
        let left = self.usage.live(id);
        if left > 0 {
            // Cannot happen (nothing is appended to a log that is not current); keep the log.
            tracing::error!("entry log {id}: {left} live bytes left after compaction; not deleted");
            return Ok(());
        }
        let size = self.entry_logs.remove(&*self.storage, id).await?;
        self.usage.forget_log(id);
        self.sync_ledger_dir().await?;
        drop(cp);
        let reclaimed = size.saturating_sub(copied_bytes);
        out.entry_logs_compacted += 1;
        out.entries_relocated += still.len() as u64;
        out.bytes_reclaimed += reclaimed;
        self.state
            .count(|s| s.bytes_reclaimed_by_compaction += reclaimed);
        Ok(())
    }

    /// Reads back every indexed entry and checks it (see [`crate::Engine::verify_index`]).
    pub async fn verify_index(&self) -> Result<IndexCheck, Error> {
        let _cp = self.marks.lock().await?;
        if self.index.rebuild_pending() {
            return Err(Error::IndexRebuilding { ledger: None });
        }
        let mut all: Vec<(u64, u64, Location)> = Vec::new();
        self.index
            .for_each_location(|l, e, loc| {
                if !self.ledgers.is_deleted(l) {
                    all.push((l, e, loc))
                }
            })
            .await?;
        all.sort_by_key(|(_, _, l)| (l.log_id, l.offset));
        let on_disk: HashMap<u64, u64> = self.entry_logs.sizes().into_iter().collect();
        let mut check = IndexCheck::default();
        let mut last_log = None;
        for (ledger, entry, loc) in all {
            let path = self.entry_logs.path(loc.log_id);
            if !on_disk.contains_key(&loc.log_id) {
                return Err(corrupt(
                    &path,
                    loc.offset,
                    format!("index entry {ledger}/{entry} points into a missing entry log"),
                ));
            }
            self.entry_logs
                .check_record(&*self.storage, ledger, entry, loc)
                .await?;
            check.locations += 1;
            if last_log != Some(loc.log_id) {
                check.entry_logs += 1;
                last_log = Some(loc.log_id);
            }
        }
        Ok(check)
    }
}

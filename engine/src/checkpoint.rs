//! The checkpoint: moves a snapshot of the write cache into the entry logs, writes an index
//! segment file with the new locations and the changed ledger states, then moves the checkpoint
//! mark forward (naming the new segment among the live ones) and retires the journal files
//! wholly before it, kept for reuse or removed (BookKeeper's `SyncThread` checkpoint
//! with `flushInterval`, the `lastMark` written only after entry logs and index are durable).

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use futures_lite::future;

use crate::entry_log::EntryLogs;
use crate::files::{corrupt, io_err};
use crate::format::{
    decode_mark, encode_mark, mark_len, Location, Mark, MarkDecode, StoredLedger,
    FORMAT_OLDEST_READABLE, FORMAT_V3, MARK_SEGMENTS_MAX,
};
use crate::gc::LogUsage;
use crate::index::segment::Segment;
use crate::index::Index;
use crate::io::{Storage, StorageFile, BLOCK_BYTES};
use crate::journal::files::JournalFiles;
use crate::journal::{Journal, JournalPos};
use crate::ledgers::Ledgers;
use crate::read_ahead::ReadAhead;
use crate::sync::{Closed, Signal};
use crate::throttle::Throttle;
use crate::write_cache::{Cache, WriteCache};
use crate::{EngineConfig, Error};

/// Name of the checkpoint mark in the ledger directory.
pub(crate) const MARK_FILE: &str = "checkpoint.qcp";
const MARK_TMP_FILE: &str = "checkpoint.qcp.tmp";

/// The durable mark and the checkpoints' schedule, shared by everything that moves the mark
/// (checkpoints, compaction's relocations, index merges and rebuilds): one holder of the
/// checkpoint lock at a time; checkpoints each interval or on request.
pub(crate) struct MarkKeeper {
    /// Wakes the background checkpointer early (write cache over its bound, close).
    signal: Signal,
    lock: glommio::sync::Semaphore,
    /// The durable mark: replay would start here; it names the live index segments.
    mark: RefCell<Mark>,
    /// Set when a background checkpoint failed for lack of space (ENOSPC, EDQUOT), for
    /// [`crate::Engine::wait_for_storage_full`].
    pub(crate) storage_full: Signal,
}

impl MarkKeeper {
    /// The mark keeper of an engine whose durable mark is `mark`.
    pub fn new(mark: Mark) -> Self {
        Self {
            signal: Signal::default(),
            lock: glommio::sync::Semaphore::new(1),
            mark: RefCell::new(mark),
            storage_full: Signal::default(),
        }
    }

    /// Asks the background checkpointer to run now (or, after close, to exit).
    pub fn request(&self) {
        self.signal.notify();
    }

    /// The durable mark.
    pub fn mark(&self) -> Mark {
        self.mark.borrow().clone()
    }

    /// Records a mark just made durable (the caller holds the checkpoint lock).
    pub fn set_mark(&self, mark: Mark) {
        *self.mark.borrow_mut() = mark;
    }

    /// Takes the checkpoint lock: while it is held no checkpoint runs, so every entry log a
    /// checkpoint wrote is indexed and published, and the mark is this holder's to move
    /// (garbage collection and compaction hold it while they change locations or delete logs).
    pub async fn lock(&self) -> Result<glommio::sync::Permit<'_>, Error> {
        self.lock.acquire_permit(1).await.map_err(|_| Error::Closed)
    }
}

/// The checkpointer's context: the handles a checkpoint reads (write cache, ledger table,
/// journal's durable end) and writes (entry logs, index, mark, journal files to retire), and
/// the figures it keeps current (read-ahead cache, live bytes per entry log). Built by the
/// engine facade; the background checkpointer, `Engine::checkpoint`/`close` and garbage
/// collection (to commit relocations) each hold a copy.
pub(crate) struct Checkpointer<S: Storage> {
    pub(crate) marks: Rc<MarkKeeper>,
    pub(crate) storage: Rc<S>,
    pub(crate) cfg: Rc<EngineConfig>,
    pub(crate) closed: Closed,
    pub(crate) journal: Rc<Journal<S::File>>,
    pub(crate) journal_files: JournalFiles<S>,
    pub(crate) write_cache: Rc<WriteCache>,
    pub(crate) ledgers: Rc<Ledgers>,
    pub(crate) index: Rc<Index<S::File>>,
    pub(crate) entry_logs: Rc<EntryLogs<S::File>>,
    pub(crate) read_ahead: Rc<ReadAhead>,
    pub(crate) usage: Rc<LogUsage>,
    pub(crate) throttle: Rc<Throttle>,
}

impl<S: Storage> Clone for Checkpointer<S> {
    fn clone(&self) -> Self {
        Self {
            marks: self.marks.clone(),
            storage: self.storage.clone(),
            cfg: self.cfg.clone(),
            closed: self.closed.clone(),
            journal: self.journal.clone(),
            journal_files: self.journal_files.clone(),
            write_cache: self.write_cache.clone(),
            ledgers: self.ledgers.clone(),
            index: self.index.clone(),
            entry_logs: self.entry_logs.clone(),
            read_ahead: self.read_ahead.clone(),
            usage: self.usage.clone(),
            throttle: self.throttle.clone(),
        }
    }
}

impl<S: Storage + 'static> Checkpointer<S> {
    /// Commits relocated entries (compaction's moves, each `(ledger, entry, old, new)`) with
    /// the checkpoint lock held: one index segment of the new locations only, synced, then the
    /// mark naming it (journal position unchanged), then publishes them. Before the mark is
    /// written the old locations stay in force, so a crash loses nothing: the copies are
    /// unreferenced bytes in a newer log.
    pub async fn commit_relocations(
        &self,
        _lock: &glommio::sync::Permit<'_>,
        moves: &[(u64, u64, Location, Location)],
    ) -> Result<(), Error> {
        if moves.is_empty() {
            return Ok(());
        }
        let mut locations: Vec<(u64, u64, Location)> =
            moves.iter().map(|m| (m.0, m.1, m.3)).collect();
        // Compaction copies in entry-log order; a segment is sorted by (ledger, entry).
        locations.sort_unstable_by_key(|&(l, e, _)| (l, e));
        let seg = self
            .index
            .write_segment(&*self.storage, &self.throttle, &locations, &[])
            .await?;
        let mark = self
            .marks
            .mark()
            .with_segments(self.segments_with(&seg)?, seg.described());
        // On failure the segment stays: a failed mark write may still have replaced the mark
        // on disk, so only the next open (which knows the mark in force) removes unnamed
        // segments.
        write_mark(&*self.storage, &self.cfg.ledger_dir, &mark).await?;
        self.marks.set_mark(mark);
        self.read_ahead.invalidate(&locations);
        for &(ledger, _, old, new) in moves {
            self.usage.remove(ledger, old);
            self.usage.add(ledger, new);
        }
        self.index.publish(seg);
        Ok(())
    }

    /// The live segment ids with `seg` added as the newest.
    fn segments_with(&self, seg: &Segment<S::File>) -> Result<Vec<u64>, Error> {
        let mut ids = self.index.ids();
        ids.push(seg.id);
        if ids.len() > MARK_SEGMENTS_MAX {
            // Merges keep far fewer; refuse rather than write a mark that cannot hold them.
            return Err(Error::Io {
                op: "checkpoint mark",
                path: self.cfg.ledger_dir.clone(),
                file_offset_bytes: 0,
                source: std::io::Error::other(format!(
                    "{} live index segments, at most {MARK_SEGMENTS_MAX} fit a mark; waiting for merges",
                    ids.len()
                )),
            });
        }
        Ok(ids)
    }

    /// The background checkpointer: one checkpoint every `checkpoint_interval` or on request,
    /// until the engine is closed.
    pub async fn run_loop(self) {
        loop {
            future::or(
                glommio::timer::sleep(self.cfg.checkpoint_interval),
                self.marks.signal.wait(),
            )
            .await;
            if self.closed.get() {
                return;
            }
            if let Err(e) = self.checkpoint().await {
                tracing::error!("background checkpoint failed: {e}");
                if e.is_storage_full() {
                    self.marks.storage_full.notify();
                }
            }
        }
    }

    /// Runs one checkpoint. On error nothing is lost: the write cache gets the snapshot back,
    /// the ledgers stay dirty and the mark stays.
    pub async fn checkpoint(&self) -> Result<(), Error> {
        let cp = &self.marks;
        let _permit = cp.lock.acquire_permit(1).await.map_err(|_| Error::Closed)?;
        let previous_mark_file = cp.mark().journal_file_id;
        // Snapshot, synchronously: the cache holds exactly the records durable up to `durable`.
        let snapshot = self.write_cache.begin_flush();
        // A ledger whose state a damaged index segment lost waits for its rebuild: a state
        // stored now (what the replay applied to an incomplete one) would override the rebuilt
        // one.
        let (ledgers, held): (Vec<_>, Vec<_>) = self
            .ledgers
            .take_dirty()
            .into_iter()
            .partition(|(l, _)| !self.index.state_pending(*l));
        self.ledgers.mark_dirty(held.into_iter().map(|(l, _)| l));
        let durable = self.journal.durable();
        let result = self.checkpoint_write(&snapshot, durable, &ledgers).await;
        self.write_cache.end_flush();
        let mark = match result {
            Ok((locations, rewritten, mark, seg)) => {
                self.read_ahead.invalidate(&locations);
                // Entry-log usage: a recovery add that rewrote an entry leaves its old copy
                // dead.
                for (ledger, old) in rewritten {
                    self.usage.remove(ledger, old);
                }
                for &(ledger, _, loc) in &locations {
                    self.usage.add(ledger, loc);
                }
                self.ledgers.checkpointed(&ledgers);
                cp.set_mark(mark.clone());
                if let Some(seg) = seg {
                    self.index.publish(seg);
                }
                mark
            }
            Err(e) => {
                self.write_cache.restore(&snapshot);
                self.ledgers
                    .mark_dirty(ledgers.into_iter().map(|(id, _)| id));
                return Err(e);
            }
        };
        self.journal_files
            .retire(previous_mark_file, mark.journal_file_id)
            .await;
        // Fault point (docs/fault-points.md): a crash between this checkpoint and the next.
        quire_faults::crash("engine.checkpoint.after");
        Ok(())
    }

    /// Writes the snapshot to the entry logs, the index segment and then the mark. Publishes
    /// nothing.
    async fn checkpoint_write(
        &self,
        snapshot: &Cache,
        durable: JournalPos,
        ledgers: &[(u64, StoredLedger)],
    ) -> Result<Written<S::File>, Error> {
        let old_mark = self.marks.mark();
        let moved = durable.file_id != old_mark.journal_file_id
            || durable.offset != old_mark.journal_offset
            || durable.next_seq != old_mark.next_seq;
        if snapshot.is_empty() && ledgers.is_empty() && !moved {
            return Ok((Vec::new(), Vec::new(), old_mark, None));
        }
        // Entries the index may already hold (recovery adds rewriting them): their old
        // locations, looked up before the new ones are published.
        let mut rewritten = Vec::new();
        for &(ledger, entry) in snapshot.keys() {
            if self.ledgers.may_be_indexed(ledger, entry) {
                if let Some(old) = self.index.location(ledger, entry).await? {
                    rewritten.push((ledger, old));
                }
            }
        }
        // 1. Entry logs, sorted by (ledger, entry) (BTreeMap order), synced.
        let locations = self
            .entry_logs
            .write_snapshot(&*self.storage, snapshot, &self.throttle)
            .await?;

        // 2. Index segment with the new locations and the changed ledger states, synced, the
        //    directory synced (the mark may name it only once its directory entry is durable).
        let seg = if locations.is_empty() && ledgers.is_empty() {
            None
        } else {
            Some(
                self.index
                    .write_segment(&*self.storage, &self.throttle, &locations, ledgers)
                    .await?,
            )
        };
        // The live segments with the new one, each described (SegmentSummary).
        let named = match &seg {
            Some(s) => old_mark.with_segments(self.segments_with(s)?, s.described()),
            None => old_mark.clone(),
        };

        // 3. The mark: only forward, and only now that entry logs and index are durable.
        let mark = Mark {
            journal_file_id: durable.file_id,
            journal_offset: durable.offset,
            next_seq: durable.next_seq,
            legacy_index_bytes: None,
            ..named
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
        // On failure the segment stays (see `commit_relocations`).
        write_mark(&*self.storage, &self.cfg.ledger_dir, &mark).await?;
        Ok((locations, rewritten, mark, seg))
    }
}

/// What a checkpoint wrote: the new locations, the previous locations of the entries it
/// rewrote `(ledger, old)`, the new mark and the new index segment (none if nothing changed).
type Written<F> = (
    Vec<(u64, u64, Location)>,
    Vec<(u64, Location)>,
    Mark,
    Option<Rc<Segment<F>>>,
);

/// Replaces the mark in `dir`: temp file, fdatasync, rename, directory sync.
pub(crate) async fn write_mark<S: Storage>(
    storage: &S,
    dir: &Path,
    mark: &Mark,
) -> Result<(), Error> {
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

/// Reads the mark in `dir`.
///
/// # Errors
/// `Corrupt` for a bad magic or checksum; `UnsupportedFormat`; `Io`.
pub(crate) async fn read_mark<S: Storage>(storage: &S, dir: &Path) -> Result<Mark, Error> {
    let path = dir.join(MARK_FILE);
    let f = storage
        .open(&path, false)
        .await
        .map_err(io_err("open checkpoint mark", &path, 0))?;
    let mut b =
        f.read_at(0, BLOCK_BYTES)
            .await
            .map_err(io_err("read checkpoint mark", &path, 0))?;
    // A version 3 mark of many segments takes more than one block.
    let len = mark_len(&b);
    if len > b.len() {
        b = f
            .read_at(0, len)
            .await
            .map_err(io_err("read checkpoint mark", &path, 0))?;
    }
    match decode_mark(&b) {
        MarkDecode::Ok(m) => Ok(m),
        MarkDecode::Unsupported(found) => Err(Error::UnsupportedFormat {
            path,
            found,
            oldest: FORMAT_OLDEST_READABLE,
            newest: FORMAT_V3,
        }),
        MarkDecode::Bad(reason) => Err(corrupt(&path, 0, reason)),
    }
}

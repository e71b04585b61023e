//! The checkpoint: moves a snapshot of the write cache into the entry logs, appends an index
//! segment with the new locations and the changed ledger states, then moves the checkpoint mark
//! forward and removes the journal files wholly before it (BookKeeper's `SyncThread` checkpoint
//! with `flushInterval`, the `lastMark` written only after entry logs and index are durable).

use std::cell::Cell;
use std::path::Path;
use std::rc::Rc;

use futures_lite::future;

use crate::engine::Inner;
use crate::files::{corrupt, io_err};
use crate::format::{
    decode_mark, encode_mark, encode_segment, Location, Mark, MarkDecode, StoredLedger,
    FORMAT_CURRENT, FORMAT_OLDEST_READABLE,
};
use crate::io::{Storage, StorageFile, BLOCK_BYTES};
use crate::journal::files::remove_old_journals;
use crate::journal::JournalPos;
use crate::sync::Signal;
use crate::write_cache::Cache;
use crate::Error;

/// Name of the checkpoint mark in the ledger directory.
pub(crate) const MARK_FILE: &str = "checkpoint.qcp";
const MARK_TMP_FILE: &str = "checkpoint.qcp.tmp";

/// The mark and the checkpoints' schedule: one checkpoint at a time, each interval or on
/// request.
pub(crate) struct Checkpointer {
    /// Wakes the background checkpointer early (write cache over its bound, close).
    signal: Signal,
    lock: glommio::sync::Semaphore,
    /// The durable mark: replay would start here.
    mark: Cell<Mark>,
    /// Set when a background checkpoint failed for lack of space (ENOSPC, EDQUOT), for
    /// [`crate::Engine::wait_for_storage_full`].
    pub(crate) storage_full: Signal,
}

impl Checkpointer {
    /// The checkpointer of an engine whose durable mark is `mark`.
    pub fn new(mark: Mark) -> Self {
        Self {
            signal: Signal::default(),
            lock: glommio::sync::Semaphore::new(1),
            mark: Cell::new(mark),
            storage_full: Signal::default(),
        }
    }

    /// Asks the background checkpointer to run now (or, after close, to exit).
    pub fn request(&self) {
        self.signal.notify();
    }

    /// Takes the checkpoint lock: while it is held no checkpoint runs, so every entry log a
    /// checkpoint wrote is indexed and published, and the mark is this holder's to move
    /// (garbage collection and compaction hold it while they change locations or delete logs).
    pub async fn lock(&self) -> Result<glommio::sync::Permit<'_>, Error> {
        self.lock.acquire_permit(1).await.map_err(|_| Error::Closed)
    }
}

/// Commits relocated entries (compaction's new locations) with the checkpoint lock held: one
/// index segment of locations only, synced, then the mark with the new index length (journal
/// position unchanged), then publishes them. Before the mark is written the old locations stay
/// in force, so a crash loses nothing: the copies are unreferenced bytes in a newer log.
pub(crate) async fn commit_relocations<S: Storage>(
    inner: &Inner<S>,
    _lock: &glommio::sync::Permit<'_>,
    locations: &[(u64, u64, Location)],
) -> Result<(), Error> {
    if locations.is_empty() {
        return Ok(());
    }
    let cp = &inner.checkpointer;
    let old_mark = cp.mark.get();
    let seg = encode_segment(locations, &[]);
    inner
        .index
        .append_segment(old_mark.index_bytes, &seg, &inner.throttle)
        .await?;
    let mark = Mark {
        index_bytes: old_mark.index_bytes + seg.len() as u64,
        ..old_mark
    };
    write_mark(&inner.storage, &inner.cfg.ledger_dir, &mark).await?;
    cp.mark.set(mark);
    inner.read_ahead.invalidate(locations);
    for &(ledger, entry, loc) in locations {
        if let Some(old) = inner.index.location(ledger, entry) {
            inner.usage.remove(ledger, old);
        }
        inner.usage.add(ledger, loc);
    }
    inner.index.publish(locations);
    Ok(())
}

/// The background checkpointer: one checkpoint every `checkpoint_interval` or on request,
/// until the engine is closed.
pub(crate) async fn checkpoint_loop<S: Storage>(inner: Rc<Inner<S>>) {
    loop {
        future::or(
            glommio::timer::sleep(inner.cfg.checkpoint_interval),
            inner.checkpointer.signal.wait(),
        )
        .await;
        if inner.closed.get() {
            return;
        }
        if let Err(e) = checkpoint(&inner).await {
            tracing::error!("background checkpoint failed: {e}");
            if e.is_storage_full() {
                inner.checkpointer.storage_full.notify();
            }
        }
    }
}

/// Runs one checkpoint. On error nothing is lost: the write cache gets the snapshot back, the
/// ledgers stay dirty and the mark stays.
pub(crate) async fn checkpoint<S: Storage>(inner: &Inner<S>) -> Result<(), Error> {
    let cp = &inner.checkpointer;
    let _permit = cp.lock.acquire_permit(1).await.map_err(|_| Error::Closed)?;
    // Snapshot, synchronously: the cache holds exactly the records durable up to `durable`.
    let snapshot = inner.write_cache.begin_flush();
    let ledgers = inner.ledgers.take_dirty();
    let durable = inner.journal.durable();
    let result = checkpoint_write(inner, &snapshot, durable, &ledgers).await;
    inner.write_cache.end_flush();
    let mark = match result {
        Ok((locations, mark)) => {
            inner.read_ahead.invalidate(&locations);
            // Entry-log usage: a recovery add that rewrote an entry leaves its old copy dead.
            for &(ledger, entry, loc) in &locations {
                if let Some(old) = inner.index.location(ledger, entry) {
                    inner.usage.remove(ledger, old);
                }
                inner.usage.add(ledger, loc);
            }
            inner.index.publish(&locations);
            cp.mark.set(mark);
            mark
        }
        Err(e) => {
            inner.write_cache.restore(&snapshot);
            inner
                .ledgers
                .mark_dirty(ledgers.into_iter().map(|(id, _)| id));
            return Err(e);
        }
    };
    remove_old_journals(&inner.storage, &inner.cfg.journal_dir, mark.journal_file_id).await;
    Ok(())
}

/// Writes the snapshot to the entry logs, the index segment and then the mark. Returns the new
/// locations and the new mark; publishes nothing.
async fn checkpoint_write<S: Storage>(
    inner: &Inner<S>,
    snapshot: &Cache,
    durable: JournalPos,
    ledgers: &[(u64, StoredLedger)],
) -> Result<(Vec<(u64, u64, Location)>, Mark), Error> {
    let old_mark = inner.checkpointer.mark.get();
    let moved = durable.file_id != old_mark.journal_file_id
        || durable.offset != old_mark.journal_offset
        || durable.next_seq != old_mark.next_seq;
    if snapshot.is_empty() && ledgers.is_empty() && !moved {
        return Ok((Vec::new(), old_mark));
    }
    // 1. Entry logs, sorted by (ledger, entry) (BTreeMap order), synced.
    let locations = inner
        .entry_logs
        .write_snapshot(&inner.storage, snapshot, &inner.throttle)
        .await?;

    // 2. Index segment with the new locations and the changed ledger states, synced.
    let seg = encode_segment(&locations, ledgers);
    inner
        .index
        .append_segment(old_mark.index_bytes, &seg, &inner.throttle)
        .await?;

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
    write_mark(&inner.storage, &inner.cfg.ledger_dir, &mark).await?;
    Ok((locations, mark))
}

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
    let b = f
        .read_at(0, BLOCK_BYTES)
        .await
        .map_err(io_err("read checkpoint mark", &path, 0))?;
    match decode_mark(&b) {
        MarkDecode::Ok(m) => Ok(m),
        MarkDecode::Unsupported(found) => Err(Error::UnsupportedFormat {
            path,
            found,
            oldest: FORMAT_OLDEST_READABLE,
            newest: FORMAT_CURRENT,
        }),
        MarkDecode::Bad(reason) => Err(corrupt(&path, 0, reason)),
    }
}

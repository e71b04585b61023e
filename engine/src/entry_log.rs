//! Entry logs: the files a checkpoint writes the write cache into, sorted by (ledger, entry),
//! and the open files reads go to (docs/format/entry-log.md; BookKeeper's entry logger with
//! `logSizeLimit` rolls). A new process never appends to an old log, which may hold unindexed
//! bytes past its last sync.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::files::{corrupt, entry_log_name, io_err};
use crate::format::{
    decode_entry_record, encode_entry_record, encode_file_header, pad_to_block, Location,
    ENTRY_LOG_MAGIC, ENTRY_RECORD_HEADER_BYTES, FILE_HEADER_BYTES,
};
use crate::io::{Storage, StorageFile};
use crate::throttle::{bulk_write, Throttle};
use crate::write_cache::Cache;
use crate::Error;

/// Entry-log bytes buffered before one write during a checkpoint.
const ENTRY_LOG_WRITE_BYTES_MAX: usize = 1 << 20;

/// An entry log being appended to (by checkpoints, or by a compaction run).
pub(crate) struct EntryLogCursor<F> {
    pub id: u64,
    pub file: Rc<F>,
    /// Where the next write goes (block aligned).
    pub pos: u64,
}

/// The entry logs of a ledger directory: the one checkpoints append to and the ones read.
pub(crate) struct EntryLogs<F> {
    dir: PathBuf,
    size_bytes_max: u64,
    /// Taken out by the checkpoint while it writes (one checkpoint at a time).
    current: RefCell<Option<EntryLogCursor<F>>>,
    next_id: Cell<u64>,
    /// Open files by log id, shared by readers and the writer, each with the tick of its last
    /// use: at most `readers_max` besides the log being written, least recently used closed
    /// first (a read still holding a closed file's `Rc` finishes with it).
    readers: RefCell<HashMap<u64, (Rc<F>, u64)>>,
    /// `EngineConfig::entry_log_readers_max`, at least 1.
    readers_max: usize,
    /// Use counter stamped on `readers`.
    tick: Cell<u64>,
    /// Size in bytes of every entry log on disk (its write end), by id: the denominator of a
    /// log's live fraction for garbage collection.
    sizes: RefCell<HashMap<u64, u64>>,
}

impl<F: StorageFile> EntryLogs<F> {
    /// The logs of `dir`; the next one written gets `next_id` (one past the largest there),
    /// and each rolls past `size_bytes_max` (`EngineConfig::entry_log_size_bytes_max`). At most
    /// `readers_max` files (at least 1) besides the one being written stay open for reads
    /// (`EngineConfig::entry_log_readers_max`).
    pub fn new(dir: PathBuf, next_id: u64, size_bytes_max: u64, readers_max: usize) -> Self {
        Self {
            dir,
            size_bytes_max,
            current: RefCell::new(None),
            next_id: Cell::new(next_id),
            readers: RefCell::new(HashMap::new()),
            readers_max: readers_max.max(1),
            tick: Cell::new(0),
            sizes: RefCell::new(HashMap::new()),
        }
    }

    /// Records an entry log found on disk at open, of `size_bytes`, opened as `file`.
    pub fn register_existing(&self, id: u64, size_bytes: u64, file: F) {
        self.sizes.borrow_mut().insert(id, size_bytes);
        self.keep_open(id, Rc::new(file));
    }

    /// Files open for reads now, the log being written included.
    pub fn open_readers(&self) -> usize {
        self.readers.borrow().len()
    }

    /// The next use tick.
    fn next_tick(&self) -> u64 {
        let tick = self.tick.get() + 1;
        self.tick.set(tick);
        tick
    }

    /// Puts `file` in the table as just used and closes the least recently used files beyond
    /// `readers_max`, never `id` itself nor the log being written. O(open files) per call, and
    /// called only when a file is opened, which costs a syscall anyway.
    fn keep_open(&self, id: u64, file: Rc<F>) {
        let tick = self.next_tick();
        let current = self.current_id();
        let mut readers = self.readers.borrow_mut();
        readers.insert(id, (file, tick));
        let bound =
            self.readers_max + usize::from(current.is_some_and(|c| readers.contains_key(&c)));
        while readers.len() > bound {
            let oldest = readers
                .iter()
                .filter(|(k, _)| Some(**k) != current && **k != id)
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| *k);
            let Some(k) = oldest else { break };
            readers.remove(&k);
        }
    }

    /// Every entry log on disk, `(id, size in bytes)`, sorted by id.
    pub fn sizes(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self.sizes.borrow().iter().map(|(k, v)| (*k, *v)).collect();
        v.sort_unstable();
        v
    }

    /// The log checkpoints append to now, if one is open (never garbage collected: it grows).
    /// While a checkpoint runs the cursor is taken out; callers hold the checkpoint lock.
    pub fn current_id(&self) -> Option<u64> {
        self.current.borrow().as_ref().map(|c| c.id)
    }

    /// Stops appending to the current log, if any, and returns its id: the next checkpoint
    /// starts a new one. Callers hold the checkpoint lock, so every byte a checkpoint wrote to
    /// it is synced and indexed (its file was fdatasynced at the end of that checkpoint); from
    /// here on it is an ordinary log that garbage collection may delete or compact.
    pub fn roll_current(&self) -> Option<u64> {
        self.current.borrow_mut().take().map(|c| c.id)
    }

    /// Deletes log `id` (the caller made sure no index entry points into it, and syncs the
    /// directory afterwards). Returns its size in bytes.
    pub async fn remove<S: Storage<File = F>>(&self, storage: &S, id: u64) -> Result<u64, Error> {
        let path = self.path(id);
        storage
            .remove(&path)
            .await
            .map_err(io_err("remove entry log", &path, 0))?;
        // A read holding the open file goes on reading the removed inode (and closes it when
        // done); otherwise close it now, so that its blocks are free when this returns.
        let open = self.readers.borrow_mut().remove(&id);
        if let Some(f) = open.and_then(|(f, _)| Rc::try_unwrap(f).ok()) {
            f.close().await;
        }
        Ok(self.sizes.borrow_mut().remove(&id).unwrap_or(0))
    }

    /// Path of log `id`.
    pub fn path(&self, id: u64) -> PathBuf {
        self.dir.join(entry_log_name(id))
    }

    /// Reads the record of `ledger`/`entry` at `loc` back from disk and checks it (header,
    /// ledger and entry ids, length and checksum: docs/format/entry-log.md).
    ///
    /// # Errors
    /// `Io` when the read fails; `Corrupt` naming the file and offset when the record does not
    /// check.
    pub async fn check_record<S: Storage<File = F>>(
        &self,
        storage: &S,
        ledger: u64,
        entry: u64,
        loc: Location,
    ) -> Result<(), Error> {
        let path = self.path(loc.log_id);
        let f = self.reader(storage, loc.log_id, &path).await?;
        let b = f
            .read_at(loc.offset, record_bytes(loc) as usize)
            .await
            .map_err(io_err("read entry log", &path, loc.offset))?;
        decode_entry_record(&b, ledger, entry, loc.data_len)
            .map(|_| ())
            .map_err(|r| corrupt(&path, loc.offset, r))
    }

    /// The open file of log `id`, opened on first use.
    pub async fn reader<S: Storage<File = F>>(
        &self,
        storage: &S,
        id: u64,
        path: &Path,
    ) -> Result<Rc<F>, Error> {
        let tick = self.next_tick();
        let cached = self.readers.borrow_mut().get_mut(&id).map(|(f, t)| {
            *t = tick;
            f.clone()
        });
        match cached {
            Some(f) => Ok(f),
            None => {
                let f = Rc::new(storage.open(path, false).await.map_err(io_err(
                    "open entry log",
                    path,
                    0,
                ))?);
                // Another read may have opened it during the await: keep that one.
                let opened = self.readers.borrow().get(&id).map(|(f, _)| f.clone());
                if let Some(f) = opened {
                    return Ok(f);
                }
                self.keep_open(id, f.clone());
                Ok(f)
            }
        }
    }

    /// Appends the snapshot's entries in (ledger, entry) order, rolling to a new log past the
    /// size bound, through the bulk throttle; every log written is synced. Returns the new
    /// locations (published by the caller once the index and mark are durable).
    pub async fn write_snapshot<S: Storage<File = F>>(
        &self,
        storage: &S,
        snapshot: &Cache,
        throttle: &Throttle,
    ) -> Result<Vec<(u64, u64, Location)>, Error> {
        let mut locations = Vec::with_capacity(snapshot.len());
        let mut buf: Vec<u8> = Vec::new();
        let mut cursor = self.current.borrow_mut().take();
        let result: Result<(), Error> = async {
            for (&(ledger, entry), data) in snapshot.iter() {
                let rec_len = (ENTRY_RECORD_HEADER_BYTES + data.len()) as u64;
                let need_roll = match &cursor {
                    None => true,
                    Some(c) => {
                        let at = c.pos + buf.len() as u64;
                        at + rec_len > self.size_bytes_max && at > FILE_HEADER_BYTES as u64
                    }
                };
                if need_roll {
                    if let Some(c) = cursor.take() {
                        self.flush_buf(&c, &mut buf, throttle).await.map(|_| ())?;
                        let c = self.sync(c).await?;
                        drop(c);
                    }
                    cursor = Some(self.create(storage).await?);
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
                    let n = self.flush_buf(c, &mut buf, throttle).await?;
                    c.pos += n;
                }
            }
            if let Some(c) = cursor.as_mut() {
                let n = self.flush_buf(c, &mut buf, throttle).await?;
                c.pos += n;
                let path = self.path(c.id);
                c.file
                    .fdatasync()
                    .await
                    .map_err(io_err("entry log fdatasync", &path, c.pos))?;
            }
            Ok(())
        }
        .await;
        *self.current.borrow_mut() = cursor;
        result?;
        Ok(locations)
    }

    /// Writes `buf` (padded to a block) at the cursor position; returns the bytes written.
    pub async fn flush_buf(
        &self,
        c: &EntryLogCursor<F>,
        buf: &mut Vec<u8>,
        throttle: &Throttle,
    ) -> Result<u64, Error> {
        if buf.is_empty() {
            return Ok(0);
        }
        pad_to_block(buf);
        let path = self.path(c.id);
        bulk_write(c.file.as_ref(), c.pos, buf, Some(throttle))
            .await
            .map_err(|(at, e)| io_err("entry log write", &path, at)(e))?;
        let n = buf.len() as u64;
        buf.clear();
        self.sizes.borrow_mut().insert(c.id, c.pos + n);
        Ok(n)
    }

    pub async fn sync(&self, c: EntryLogCursor<F>) -> Result<EntryLogCursor<F>, Error> {
        let path = self.path(c.id);
        c.file
            .fdatasync()
            .await
            .map_err(io_err("entry log fdatasync", &path, c.pos))?;
        Ok(c)
    }

    /// Creates the next log: header written and synced, directory synced.
    pub async fn create<S: Storage<File = F>>(
        &self,
        storage: &S,
    ) -> Result<EntryLogCursor<F>, Error> {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let path = self.path(id);
        let file = storage
            .open(&path, true)
            .await
            .map_err(io_err("create entry log", &path, 0))?;
        file.write_at(0, &encode_file_header(ENTRY_LOG_MAGIC, id))
            .await
            .map_err(io_err("entry log header write", &path, 0))?;
        file.fdatasync()
            .await
            .map_err(io_err("entry log fdatasync", &path, 0))?;
        storage
            .sync_dir(&self.dir)
            .await
            .map_err(io_err("sync ledger dir", &self.dir, 0))?;
        let file = Rc::new(file);
        self.keep_open(id, file.clone());
        self.sizes.borrow_mut().insert(id, FILE_HEADER_BYTES as u64);
        Ok(EntryLogCursor {
            id,
            file,
            pos: FILE_HEADER_BYTES as u64,
        })
    }
}

/// Bytes an entry's record takes in an entry log (header and data, without padding).
pub(crate) fn record_bytes(loc: Location) -> u64 {
    (ENTRY_RECORD_HEADER_BYTES + loc.data_len as usize) as u64
}

//! The read path below the write cache: a read that goes to an entry log also reads the
//! following entries of the same ledger in the same I/O and keeps them in the bounded read
//! cache, and the read-path counters (BookKeeper `DbLedgerStorage`'s read-ahead cache,
//! `dbStorage_readAheadCacheBatchSize` and `dbStorage_readAheadCacheMaxSizeMb`).

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::entry_log::EntryLogs;
use crate::files::{corrupt, io_err};
use crate::format::{decode_entry_record, Location, ENTRY_RECORD_HEADER_BYTES};
use crate::io::{Storage, StorageFile};
use crate::read_cache::ReadCache;
use crate::{Error, ReadStats};

/// The read cache, its invalidation generation and the read-path counters.
pub(crate) struct ReadAhead {
    cache: RefCell<ReadCache>,
    /// Bumped whenever entry locations change (checkpoint publish), so that a read-ahead that
    /// started before does not insert bytes read from an old location.
    generation: Cell<u64>,
    stats: Cell<ReadStats>,
    /// `EngineConfig::read_ahead_entries`.
    entries_max: usize,
    /// `EngineConfig::read_ahead_bytes_max`, and never more than half the read cache, so that
    /// read-ahead does not evict itself.
    span_bytes_max: u64,
}

impl ReadAhead {
    /// A read cache of `cache_bytes_max` bytes of entry data; read-ahead of at most
    /// `entries_max` entries spanning at most `bytes_max` bytes.
    pub fn new(cache_bytes_max: usize, entries_max: usize, bytes_max: usize) -> Self {
        Self {
            cache: RefCell::new(ReadCache::new(cache_bytes_max)),
            generation: Cell::new(0),
            stats: Cell::new(ReadStats::default()),
            entries_max,
            span_bytes_max: bytes_max.min(cache_bytes_max / 2) as u64,
        }
    }

    /// Updates the read-path counters.
    pub fn count(&self, f: impl FnOnce(&mut ReadStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// The counters, with the read cache's current size.
    pub fn stats(&self) -> ReadStats {
        let mut s = self.stats.get();
        s.read_cache_bytes = self.cache.borrow().bytes() as u64;
        s
    }

    /// The entry from the read cache.
    pub fn cached(&self, key: &(u64, u64)) -> Option<Rc<Vec<u8>>> {
        self.cache.borrow().get(key)
    }

    /// Whether the entry is in the read cache.
    pub fn contains(&self, key: &(u64, u64)) -> bool {
        self.cache.borrow().contains(key)
    }

    /// Drops cached copies of entries that moved (a checkpoint published new locations) and
    /// makes read-aheads started before discard what they read.
    pub fn invalidate(&self, locations: &[(u64, u64, Location)]) {
        self.generation.set(self.generation.get() + 1);
        let mut cache = self.cache.borrow_mut();
        for &(ledger, entry, _) in locations {
            cache.remove(&(ledger, entry));
        }
    }

    /// Drops cached entries of a deleted ledger, and makes read-aheads started before discard
    /// what they read.
    pub fn remove_ledger(&self, ledger: u64) {
        self.generation.set(self.generation.get() + 1);
        self.cache.borrow_mut().remove_ledger(ledger);
    }

    /// How many following entries a plan may hold (`EngineConfig::read_ahead_entries`).
    pub fn entries_max(&self) -> usize {
        self.entries_max
    }

    /// The entries of `following` (the ledger's next indexed entries after the one at `loc`, in
    /// entry order) to read in the same I/O: in the same entry log, at increasing offsets,
    /// within the span bound of `loc`, and at most `entries_max`.
    pub fn plan(&self, following: &[(u64, Location)], loc: Location) -> Vec<(u64, Location)> {
        let mut plan = Vec::new();
        if self.entries_max == 0 {
            return plan;
        }
        let start = loc.offset;
        let mut end = loc.offset + (ENTRY_RECORD_HEADER_BYTES + loc.data_len as usize) as u64;
        for &(e, l) in following {
            if plan.len() >= self.entries_max || l.log_id != loc.log_id || l.offset < end {
                break;
            }
            let l_end = l.offset + (ENTRY_RECORD_HEADER_BYTES + l.data_len as usize) as u64;
            if l_end - start > self.span_bytes_max {
                break;
            }
            end = l_end;
            plan.push((e, l));
        }
        plan
    }

    /// Reads `entry` at `loc` and, in the same I/O, the entries of `plan`, which go to the read
    /// cache with the entry itself.
    ///
    /// # Errors
    /// `Corrupt` if the entry's record fails its check (a damaged neighbour is only left out of
    /// the cache); `Io`.
    pub async fn read<S: Storage>(
        &self,
        storage: &S,
        entry_logs: &EntryLogs<S::File>,
        ledger: u64,
        entry: u64,
        loc: Location,
        plan: &[(u64, Location)],
    ) -> Result<Vec<u8>, Error> {
        let generation = self.generation.get();
        let path = entry_logs.path(loc.log_id);
        let file = entry_logs.reader(storage, loc.log_id, &path).await?;
        let len = ENTRY_RECORD_HEADER_BYTES + loc.data_len as usize;
        let span = plan.last().map_or(len, |(_, l)| {
            (l.offset - loc.offset) as usize + ENTRY_RECORD_HEADER_BYTES + l.data_len as usize
        });
        let b = file.read_at(loc.offset, span).await.map_err(io_err(
            "read entry log",
            &path,
            loc.offset,
        ))?;
        self.count(|s| s.entry_log_reads += 1);
        let data = decode_entry_record(&b[..len.min(b.len())], ledger, entry, loc.data_len)
            .map_err(|r| corrupt(&path, loc.offset, r))?;
        if self.generation.get() != generation {
            return Ok(data);
        }
        let mut cache = self.cache.borrow_mut();
        cache.insert((ledger, entry), Rc::new(data.clone()));
        let mut ahead = 0u64;
        for &(e, l) in plan {
            let at = (l.offset - loc.offset) as usize;
            let l_len = ENTRY_RECORD_HEADER_BYTES + l.data_len as usize;
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
}

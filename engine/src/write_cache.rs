//! The write cache: entries durable in the journal but not yet in an entry log, served to
//! readers from memory, and the back-pressure that bounds it (BookKeeper `DbLedgerStorage`'s
//! write cache: a checkpoint swaps it out and writes the snapshot while adds fill a new one;
//! adds wait while both are full, `dbStorage_maxThrottleTimeMs`).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::future;

use crate::sync::Notify;
use crate::Error;

/// Entries by (ledger, entry), in the order an entry log stores them.
pub(crate) type Cache = BTreeMap<(u64, u64), Rc<Vec<u8>>>;

/// The live cache and the snapshot a running checkpoint is writing.
pub(crate) struct WriteCache {
    live: RefCell<Cache>,
    /// Bytes of entry data in `live`.
    live_bytes: Cell<usize>,
    /// The part of the cache a running checkpoint is writing out; still served to readers.
    flushing: RefCell<Option<Rc<Cache>>>,
    /// Notified whenever a checkpoint ends (either way): adds waiting for room look again.
    flush_done: Notify,
    /// Adds that had to wait for room (observability).
    waits: Cell<u64>,
    bytes_max: usize,
    wait_max: Duration,
}

impl WriteCache {
    /// An empty cache bounded by `bytes_max` (`EngineConfig::write_cache_bytes_max`), whose
    /// adds wait at most `wait_max` (`EngineConfig::write_cache_wait_max`).
    pub fn new(bytes_max: usize, wait_max: Duration) -> Self {
        Self {
            live: RefCell::new(BTreeMap::new()),
            live_bytes: Cell::new(0),
            flushing: RefCell::new(None),
            flush_done: Notify::default(),
            waits: Cell::new(0),
            bytes_max,
            wait_max,
        }
    }

    /// Puts a durable entry in the live cache (replacing an older copy).
    pub fn insert(&self, ledger: u64, entry: u64, data: Vec<u8>) {
        let len = data.len();
        let mut bytes = self.live_bytes.get();
        if let Some(old) = self
            .live
            .borrow_mut()
            .insert((ledger, entry), Rc::new(data))
        {
            bytes -= old.len();
        }
        self.live_bytes.set(bytes + len);
    }

    /// Drops every entry of `ledger` from the live cache (a deleted ledger). Called with the
    /// checkpoint lock held, when no snapshot is being written.
    pub fn remove_ledger(&self, ledger: u64) {
        let mut live = self.live.borrow_mut();
        let keys: Vec<(u64, u64)> = live
            .range((ledger, 0)..=(ledger, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        let mut bytes = self.live_bytes.get();
        for k in keys {
            if let Some(d) = live.remove(&k) {
                bytes -= d.len();
            }
        }
        self.live_bytes.set(bytes);
    }

    /// The entry from the live cache or the snapshot being written.
    pub fn get(&self, key: &(u64, u64)) -> Option<Rc<Vec<u8>>> {
        let hit = self.live.borrow().get(key).cloned();
        hit.or_else(|| {
            self.flushing
                .borrow()
                .as_ref()
                .and_then(|f| f.get(key).cloned())
        })
    }

    /// Whether the entry is in the live cache or the snapshot being written.
    pub fn contains(&self, key: &(u64, u64)) -> bool {
        self.live.borrow().contains_key(key)
            || self
                .flushing
                .borrow()
                .as_ref()
                .is_some_and(|f| f.contains_key(key))
    }

    /// Bytes of entry data in the live cache.
    pub fn bytes(&self) -> usize {
        self.live_bytes.get()
    }

    /// Whether the live cache holds more than its bound (a checkpoint should start early).
    pub fn over_bound(&self) -> bool {
        self.live_bytes.get() > self.bytes_max
    }

    /// Adds that had to wait for room since open.
    pub fn waits(&self) -> u64 {
        self.waits.get()
    }

    /// Back-pressure on adds: while a checkpoint is writing one snapshot and the live cache has
    /// refilled to `bytes_max`, an add waits for the checkpoint to end, so a shard holds at most
    /// about two caches' worth of entries however fast adds arrive. Gives up after `wait_max`
    /// with `WriteCacheFull`.
    pub async fn wait_for_room(&self) -> Result<(), Error> {
        let started = quire_clock::now();
        let mut counted = false;
        loop {
            let seen = self.flush_done.generation();
            let full = self.flushing.borrow().is_some() && self.live_bytes.get() >= self.bytes_max;
            if !full {
                return Ok(());
            }
            if !counted {
                counted = true;
                self.waits.set(self.waits.get() + 1);
            }
            let waited = quire_clock::elapsed(started);
            let Some(left) = self.wait_max.checked_sub(waited) else {
                return Err(Error::WriteCacheFull {
                    waited_ms: waited.as_millis() as u64,
                });
            };
            future::or(self.flush_done.changed_since(seen), async {
                glommio::timer::sleep(left).await;
            })
            .await;
        }
    }

    /// Swaps the live cache out for a checkpoint: it becomes the snapshot being written (still
    /// served to readers) and adds fill an empty live cache.
    pub fn begin_flush(&self) -> Rc<Cache> {
        let mut flushing = self.flushing.borrow_mut();
        assert!(flushing.is_none(), "one checkpoint at a time");
        let snapshot = Rc::new(std::mem::take(&mut *self.live.borrow_mut()));
        self.live_bytes.set(0);
        *flushing = Some(snapshot.clone());
        snapshot
    }

    /// Ends the checkpoint's snapshot and wakes the adds waiting for room.
    pub fn end_flush(&self) {
        self.flush_done.notify_all();
        *self.flushing.borrow_mut() = None;
    }

    /// Puts a failed checkpoint's snapshot back so that nothing is lost; newer entries win.
    pub fn restore(&self, snapshot: &Cache) {
        let mut live = self.live.borrow_mut();
        let mut bytes = self.live_bytes.get();
        for (k, v) in snapshot.iter() {
            if !live.contains_key(k) {
                bytes += v.len();
                live.insert(*k, v.clone());
            }
        }
        self.live_bytes.set(bytes);
    }
}

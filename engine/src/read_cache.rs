//! The read cache: entries fetched from the entry logs by catch-up reads and their read-ahead,
//! bounded by bytes and evicted in insertion order (a ring, as BookKeeper's DbLedgerStorage
//! read cache). Shard-local.

use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

/// (ledger, entry).
type Key = (u64, u64);

pub struct ReadCache {
    max_bytes: usize,
    bytes: usize,
    next_seq: u64,
    /// Key → (insertion seq, entry data).
    map: HashMap<Key, (u64, Rc<Vec<u8>>)>,
    /// Insertion order as (insertion seq, key); an item whose seq no longer matches the map
    /// (removed or re-inserted since) is skipped on eviction.
    order: VecDeque<(u64, (u64, u64))>,
}

impl ReadCache {
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            bytes: 0,
            next_seq: 0,
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    pub fn get(&self, key: &(u64, u64)) -> Option<Rc<Vec<u8>>> {
        self.map.get(key).map(|(_, d)| d.clone())
    }

    pub fn contains(&self, key: &(u64, u64)) -> bool {
        self.map.contains_key(key)
    }

    /// Inserts `data` (replacing an older copy) and evicts the oldest entries beyond the bound.
    /// An entry larger than the whole cache is not kept.
    pub fn insert(&mut self, key: (u64, u64), data: Rc<Vec<u8>>) {
        if data.len() > self.max_bytes {
            return;
        }
        self.remove(&key);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.bytes += data.len();
        self.map.insert(key, (seq, data));
        self.order.push_back((seq, key));
        while self.bytes > self.max_bytes {
            let Some((seq, old)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&old).is_some_and(|(s, _)| *s == seq) {
                self.remove(&old);
            }
        }
        // Keep the ring from growing without bound through stale items.
        if self.order.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.order
                .retain(|(seq, k)| map.get(k).is_some_and(|(s, _)| s == seq));
        }
    }

    pub fn remove(&mut self, key: &(u64, u64)) {
        if let Some((_, d)) = self.map.remove(key) {
            self.bytes -= d.len();
        }
    }

    /// Drops every cached entry of `ledger`.
    pub fn remove_ledger(&mut self, ledger: u64) {
        let keys: Vec<Key> = self.map.keys().filter(|k| k.0 == ledger).copied().collect();
        for k in keys {
            self.remove(&k);
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

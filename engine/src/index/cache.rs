//! The index block cache: checked 4 KiB blocks of index segment files by (segment id, block
//! number), least recently used evicted first, bounded by bytes
//! (`EngineConfig::index_cache_bytes_max`; the role of the RocksDB block cache behind BookKeeper
//! `DbLedgerStorage`'s location index). Segment files are immutable, so a cached block is never
//! stale; a removed segment's blocks age out. Shard-local.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use crate::io::BLOCK_BYTES;

/// (segment id, block number in its file).
pub type BlockKey = (u64, u64);

/// Bytes one cached block costs beyond its data: the map slot, the order slot and the `Rc`
/// header (an estimate from the structures' sizes; counted in [`BlockCache::memory_bytes`]).
pub const BLOCK_OVERHEAD_BYTES: usize = 96;

/// Counters of the cache since open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

/// An LRU cache of blocks, bounded by bytes (blocks plus their overhead).
pub struct BlockCache {
    bytes_max: usize,
    bytes: usize,
    tick: u64,
    map: HashMap<BlockKey, (u64, Rc<Vec<u8>>)>,
    /// Last use → key; the first item is the least recently used.
    order: BTreeMap<u64, BlockKey>,
    stats: CacheStats,
}

impl BlockCache {
    /// A cache of at most `bytes_max` bytes; below one block it caches nothing.
    pub fn new(bytes_max: usize) -> Self {
        Self {
            bytes_max,
            bytes: 0,
            tick: 0,
            map: HashMap::new(),
            order: BTreeMap::new(),
            stats: CacheStats::default(),
        }
    }

    fn cost() -> usize {
        BLOCK_BYTES + BLOCK_OVERHEAD_BYTES
    }

    /// The block, marked as used now.
    pub fn get(&mut self, key: BlockKey) -> Option<Rc<Vec<u8>>> {
        self.tick += 1;
        let tick = self.tick;
        match self.map.get_mut(&key) {
            Some((t, b)) => {
                self.order.remove(t);
                *t = tick;
                self.order.insert(tick, key);
                self.stats.hits += 1;
                Some(b.clone())
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Keeps a checked block, evicting the least recently used ones beyond the bound.
    pub fn insert(&mut self, key: BlockKey, block: Rc<Vec<u8>>) {
        if Self::cost() > self.bytes_max {
            return;
        }
        self.tick += 1;
        let tick = self.tick;
        if let Some((t, _)) = self.map.insert(key, (tick, block)) {
            self.order.remove(&t);
        } else {
            self.bytes += Self::cost();
        }
        self.order.insert(tick, key);
        while self.bytes > self.bytes_max {
            let Some((_, k)) = self.order.pop_first() else {
                break;
            };
            self.map.remove(&k);
            self.bytes -= Self::cost();
            self.stats.evictions += 1;
        }
    }

    /// Drops every block of segment `id` (removed by a merge).
    pub fn forget_segment(&mut self, id: u64) {
        let keys: Vec<(BlockKey, u64)> = self
            .map
            .iter()
            .filter(|(k, _)| k.0 == id)
            .map(|(k, (t, _))| (*k, *t))
            .collect();
        for (k, t) in keys {
            self.map.remove(&k);
            self.order.remove(&t);
            self.bytes -= Self::cost();
        }
    }

    /// Bytes the cache holds now, blocks and overhead; never above the bound.
    pub fn memory_bytes(&self) -> usize {
        self.bytes
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used_within_the_byte_bound() {
        // Goal: the cache never holds more than its bound and evicts the least recently used
        // block. Method: a three-block cache, four inserts with a use of the first in between.
        let mut c = BlockCache::new(3 * BlockCache::cost());
        let blk = || Rc::new(vec![0u8; BLOCK_BYTES]);
        c.insert((1, 1), blk());
        c.insert((1, 2), blk());
        c.insert((1, 3), blk());
        assert!(c.get((1, 1)).is_some());
        c.insert((1, 4), blk());
        assert!(c.get((1, 2)).is_none(), "least recently used is evicted");
        assert!(c.get((1, 1)).is_some() && c.get((1, 3)).is_some() && c.get((1, 4)).is_some());
        assert_eq!(c.memory_bytes(), 3 * BlockCache::cost());
        c.forget_segment(1);
        assert_eq!(c.memory_bytes(), 0);
        let mut tiny = BlockCache::new(100);
        tiny.insert((1, 1), blk());
        assert_eq!(tiny.memory_bytes(), 0);
    }
}

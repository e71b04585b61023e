//! Index segment files `index-{id:016x}.qis` (docs/format/index.md): immutable, sorted by
//! (ledger, entry), made of 4 KiB blocks each with its own CRC32C. The blocks form a two-level
//! tree: data blocks of locations, one index block after every run of up to
//! [`DATA_BLOCKS_PER_GROUP`] data blocks holding their first keys, and at the end the top keys
//! (the first key of every group), the only part a reader keeps in memory, then the ledger
//! states. The role of BookKeeper `DbLedgerStorage`'s RocksDB location index (an SST file with a
//! block index), written by us.
//!
//! Layout in blocks: `0` header; for each group g: its data blocks, then its index block; then
//! the top blocks; then the ledger-state blocks.

use super::{u16_at, u32_at, u64_at, Location, StoredLedger};
use super::{
    FLAG_FENCED, FLAG_FENCE_KEY, FLAG_HAS_KEY, FLAG_HAS_LAC, FLAG_HAS_LAST, LEDGER_STATE_BYTES,
};
use crate::io::BLOCK_BYTES;

/// Magic of an index segment file's file header.
pub const INDEX_SEGMENT_FILE_MAGIC: [u8; 8] = *b"QUIREISG";
/// Bytes at the start of every block of a segment file (after the header block): CRC32C of
/// bytes 4..4096 (4), item count u16 (2), zero (2).
pub const BLOCK_HEADER_BYTES: usize = 8;
/// Bytes of one location in a data block: ledger u64, entry u64, log id u64, offset u64,
/// data_len u32.
pub const SEG_LOCATION_BYTES: usize = 36;
/// Bytes of one key in an index or top block: ledger u64, entry u64.
pub const KEY_BYTES: usize = 16;
/// Locations per data block.
pub const LOCATIONS_PER_BLOCK: usize = (BLOCK_BYTES - BLOCK_HEADER_BYTES) / SEG_LOCATION_BYTES;
/// Keys per index or top block; also the data blocks of one group.
pub const KEYS_PER_BLOCK: usize = (BLOCK_BYTES - BLOCK_HEADER_BYTES) / KEY_BYTES;
/// Data blocks in one group (followed by the group's index block).
pub const DATA_BLOCKS_PER_GROUP: u64 = KEYS_PER_BLOCK as u64;
/// Ledger states per ledger-state block.
pub const LEDGERS_PER_BLOCK: usize = (BLOCK_BYTES - BLOCK_HEADER_BYTES) / LEDGER_STATE_BYTES;

/// (ledger, entry): the sort key of a segment.
pub type Key = (u64, u64);

/// Fields of the header block after the shared file header (bytes 32..120).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SegmentHeader {
    pub entry_count: u64,
    pub data_blocks: u64,
    pub ledger_count: u64,
    /// Smallest and largest key (both (0, 0) when `entry_count` is 0).
    pub min_key: Key,
    pub max_key: Key,
}

const SEG_HEADER_AT: usize = 32;
const SEG_HEADER_CRC_AT: usize = SEG_HEADER_AT + 8 * 7;

impl SegmentHeader {
    /// Number of groups (= index blocks = top keys).
    pub fn groups(&self) -> u64 {
        self.data_blocks.div_ceil(DATA_BLOCKS_PER_GROUP)
    }
    /// Number of top blocks.
    pub fn top_blocks(&self) -> u64 {
        self.groups().div_ceil(KEYS_PER_BLOCK as u64)
    }
    /// Number of ledger-state blocks.
    pub fn ledger_blocks(&self) -> u64 {
        self.ledger_count.div_ceil(LEDGERS_PER_BLOCK as u64)
    }
    /// Block number of data block `d` (0-based).
    pub fn data_block_at(&self, d: u64) -> u64 {
        let g = d / DATA_BLOCKS_PER_GROUP;
        1 + g * (DATA_BLOCKS_PER_GROUP + 1) + d % DATA_BLOCKS_PER_GROUP
    }
    /// Block number of the index block of group `g`.
    pub fn index_block_at(&self, g: u64) -> u64 {
        let in_group = (self.data_blocks - g * DATA_BLOCKS_PER_GROUP).min(DATA_BLOCKS_PER_GROUP);
        1 + g * (DATA_BLOCKS_PER_GROUP + 1) + in_group
    }
    /// Block number of the first top block.
    pub fn top_at(&self) -> u64 {
        1 + self.data_blocks + self.groups()
    }
    /// Block number of the first ledger-state block.
    pub fn ledgers_at(&self) -> u64 {
        self.top_at() + self.top_blocks()
    }
    /// Total blocks of the file.
    pub fn total_blocks(&self) -> u64 {
        self.ledgers_at() + self.ledger_blocks()
    }
}

/// Writes the segment fields into a header block that already holds the file header.
pub fn put_segment_header(block: &mut [u8], h: &SegmentHeader) {
    let vals = [
        h.entry_count,
        h.data_blocks,
        h.ledger_count,
        h.min_key.0,
        h.min_key.1,
        h.max_key.0,
        h.max_key.1,
    ];
    for (i, v) in vals.iter().enumerate() {
        let at = SEG_HEADER_AT + i * 8;
        block[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    let crc = crc32c::crc32c(&block[SEG_HEADER_AT..SEG_HEADER_CRC_AT]);
    block[SEG_HEADER_CRC_AT..SEG_HEADER_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Reads the segment fields of a header block (the file header is checked by the caller).
pub fn get_segment_header(block: &[u8]) -> Result<SegmentHeader, String> {
    if block.len() < SEG_HEADER_CRC_AT + 4 {
        return Err(format!("segment header cut short at {} bytes", block.len()));
    }
    let stored = u32_at(block, SEG_HEADER_CRC_AT);
    let computed = crc32c::crc32c(&block[SEG_HEADER_AT..SEG_HEADER_CRC_AT]);
    if stored != computed {
        return Err(format!(
            "segment header CRC32C mismatch: stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    let v = |i: usize| u64_at(block, SEG_HEADER_AT + i * 8);
    let h = SegmentHeader {
        entry_count: v(0),
        data_blocks: v(1),
        ledger_count: v(2),
        min_key: (v(3), v(4)),
        max_key: (v(5), v(6)),
    };
    let want_blocks = h.entry_count.div_ceil(LOCATIONS_PER_BLOCK as u64);
    if h.data_blocks < want_blocks || h.data_blocks > h.entry_count {
        return Err(format!(
            "segment header: {} data blocks cannot hold {} locations",
            h.data_blocks, h.entry_count
        ));
    }
    if h.min_key > h.max_key {
        return Err("segment header: smallest key above largest".into());
    }
    Ok(h)
}

/// Starts a block holding `count` items: zeroed, count set; the CRC is set by [`seal_block`].
fn new_block(count: usize) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_BYTES];
    b[4..6].copy_from_slice(&(count as u16).to_le_bytes());
    b
}

/// Sets the CRC32C of a block (bytes 4..4096 into 0..4).
fn seal_block(b: &mut [u8]) {
    let crc = crc32c::crc32c(&b[4..BLOCK_BYTES]);
    b[0..4].copy_from_slice(&crc.to_le_bytes());
}

/// Checks a block's CRC32C and that its count fits `per_block`; returns the count.
pub fn check_block(b: &[u8], per_block: usize) -> Result<usize, String> {
    if b.len() < BLOCK_BYTES {
        return Err(format!("block cut short at {} bytes", b.len()));
    }
    let stored = u32_at(b, 0);
    let computed = crc32c::crc32c(&b[4..BLOCK_BYTES]);
    if stored != computed {
        return Err(format!(
            "block CRC32C mismatch: stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    let n = u16_at(b, 4) as usize;
    if n > per_block {
        return Err(format!("block holds {n} items, at most {per_block} fit"));
    }
    Ok(n)
}

/// Encodes a data block of `locs` (at most [`LOCATIONS_PER_BLOCK`], sorted).
pub fn encode_data_block(locs: &[(u64, u64, Location)]) -> Vec<u8> {
    debug_assert!(locs.len() <= LOCATIONS_PER_BLOCK);
    let mut b = new_block(locs.len());
    let mut at = BLOCK_HEADER_BYTES;
    for (ledger, entry, loc) in locs {
        b[at..at + 8].copy_from_slice(&ledger.to_le_bytes());
        b[at + 8..at + 16].copy_from_slice(&entry.to_le_bytes());
        b[at + 16..at + 24].copy_from_slice(&loc.log_id.to_le_bytes());
        b[at + 24..at + 32].copy_from_slice(&loc.offset.to_le_bytes());
        b[at + 32..at + 36].copy_from_slice(&loc.data_len.to_le_bytes());
        at += SEG_LOCATION_BYTES;
    }
    seal_block(&mut b);
    b
}

/// Key of location `i` of a checked data block.
pub fn data_key(b: &[u8], i: usize) -> Key {
    let at = BLOCK_HEADER_BYTES + i * SEG_LOCATION_BYTES;
    (u64_at(b, at), u64_at(b, at + 8))
}

/// Location `i` of a checked data block.
pub fn data_location(b: &[u8], i: usize) -> Location {
    let at = BLOCK_HEADER_BYTES + i * SEG_LOCATION_BYTES;
    Location {
        log_id: u64_at(b, at + 16),
        offset: u64_at(b, at + 24),
        data_len: u32_at(b, at + 32),
    }
}

/// Encodes an index or top block of `keys` (at most [`KEYS_PER_BLOCK`]).
pub fn encode_key_block(keys: &[Key]) -> Vec<u8> {
    debug_assert!(keys.len() <= KEYS_PER_BLOCK);
    let mut b = new_block(keys.len());
    let mut at = BLOCK_HEADER_BYTES;
    for (l, e) in keys {
        b[at..at + 8].copy_from_slice(&l.to_le_bytes());
        b[at + 8..at + 16].copy_from_slice(&e.to_le_bytes());
        at += KEY_BYTES;
    }
    seal_block(&mut b);
    b
}

/// Key `i` of a checked index or top block.
pub fn block_key(b: &[u8], i: usize) -> Key {
    let at = BLOCK_HEADER_BYTES + i * KEY_BYTES;
    (u64_at(b, at), u64_at(b, at + 8))
}

/// Whether `s` is written as fence-key records (docs/format/index.md, ledger-state block): no
/// key bound, not fenced for every key, no LAC or last entry, and at least one fence key.
fn is_fence_only(s: &StoredLedger) -> bool {
    s.master_key.is_none()
        && !s.fenced
        && !s.fence_keys.is_empty()
        && s.lac.is_none()
        && s.last_entry.is_none()
}

/// The 56-byte records of `states` (sorted by ledger), as ledger-state blocks hold them: a
/// fence-only state becomes one record per fence key (each a `StoredLedger` holding that one
/// key), consecutive; any other state one record without fence keys. A state with fence keys
/// that cannot be written so (it also has a LAC or a last entry, which no add-less ledger has)
/// is written fenced for every key, the safe reading of it.
pub fn ledger_records(states: &[(u64, StoredLedger)]) -> Vec<(u64, StoredLedger)> {
    let mut out = Vec::with_capacity(states.len());
    for (id, s) in states {
        if is_fence_only(s) {
            for key in &s.fence_keys {
                out.push((
                    *id,
                    StoredLedger {
                        fence_keys: vec![*key],
                        ..StoredLedger::default()
                    },
                ));
            }
        } else {
            let unbound_fences = s.master_key.is_none() && !s.fence_keys.is_empty();
            out.push((
                *id,
                StoredLedger {
                    fenced: s.fenced || unbound_fences,
                    master_key: s.master_key,
                    fence_keys: Vec::new(),
                    lac: s.lac,
                    last_entry: s.last_entry,
                },
            ));
        }
    }
    out
}

/// Groups records read from ledger-state blocks (in file order) back into one state per
/// ledger: consecutive fence-key records of one ledger become one state with all their keys.
/// The inverse of [`ledger_records`].
pub fn join_ledger_records(records: Vec<(u64, StoredLedger)>) -> Vec<(u64, StoredLedger)> {
    let mut out: Vec<(u64, StoredLedger)> = Vec::with_capacity(records.len());
    for (id, r) in records {
        if is_fence_only(&r) {
            if let Some((last_id, last)) = out.last_mut() {
                if *last_id == id && is_fence_only(last) {
                    for k in r.fence_keys {
                        if !last.fence_keys.contains(&k) {
                            last.fence_keys.push(k);
                        }
                    }
                    continue;
                }
            }
        }
        out.push((id, r));
    }
    out
}

/// Encodes a ledger-state block of `records` (at most [`LEDGERS_PER_BLOCK`], made by
/// [`ledger_records`]: each with at most one fence key), 56 bytes each as in the legacy index
/// segment, plus flag bit 4 for a fence-key record.
pub fn encode_ledger_block(records: &[(u64, StoredLedger)]) -> Vec<u8> {
    debug_assert!(records.len() <= LEDGERS_PER_BLOCK);
    let mut b = new_block(records.len());
    let mut at = BLOCK_HEADER_BYTES;
    for (ledger, s) in records {
        assert!(s.fence_keys.len() <= 1, "one fence key per record");
        let mut flags = 0u32;
        let mut key = s.master_key.unwrap_or([0u8; 20]);
        if let Some(k) = s.fence_keys.first() {
            assert!(is_fence_only(s), "a fence-key record holds nothing else");
            // Fenced too, so that a reader that predates bit 4 keeps the ledger fenced.
            flags |= FLAG_FENCED | FLAG_FENCE_KEY;
            key = *k;
        }
        if s.fenced {
            flags |= FLAG_FENCED;
        }
        if s.master_key.is_some() {
            flags |= FLAG_HAS_KEY;
        }
        if s.lac.is_some() {
            flags |= FLAG_HAS_LAC;
        }
        if s.last_entry.is_some() {
            flags |= FLAG_HAS_LAST;
        }
        b[at..at + 8].copy_from_slice(&ledger.to_le_bytes());
        b[at + 8..at + 12].copy_from_slice(&flags.to_le_bytes());
        b[at + 16..at + 36].copy_from_slice(&key);
        b[at + 40..at + 48].copy_from_slice(&s.lac.unwrap_or(0).to_le_bytes());
        b[at + 48..at + 56].copy_from_slice(&s.last_entry.unwrap_or(0).to_le_bytes());
        at += LEDGER_STATE_BYTES;
    }
    seal_block(&mut b);
    b
}

/// The records of a ledger-state block (group them with [`join_ledger_records`]).
///
/// # Errors
/// A bad CRC32C or count; a fence-key record (bit 4) that also claims a bound key, a LAC or a
/// last entry (bits 1 to 3).
pub fn decode_ledger_block(b: &[u8]) -> Result<Vec<(u64, StoredLedger)>, String> {
    let n = check_block(b, LEDGERS_PER_BLOCK)?;
    let mut out = Vec::with_capacity(n);
    let mut at = BLOCK_HEADER_BYTES;
    for i in 0..n {
        let ledger = u64_at(b, at);
        let flags = u32_at(b, at + 8);
        let mut key = [0u8; 20];
        key.copy_from_slice(&b[at + 16..at + 36]);
        let state = if flags & FLAG_FENCE_KEY != 0 {
            if flags & (FLAG_HAS_KEY | FLAG_HAS_LAC | FLAG_HAS_LAST) != 0 {
                return Err(format!(
                    "ledger-state record {i} (ledger {ledger}): fence-key record with flags \
                     {flags:#x}"
                ));
            }
            StoredLedger {
                fence_keys: vec![key],
                ..StoredLedger::default()
            }
        } else {
            StoredLedger {
                fenced: flags & FLAG_FENCED != 0,
                master_key: (flags & FLAG_HAS_KEY != 0).then_some(key),
                fence_keys: Vec::new(),
                lac: (flags & FLAG_HAS_LAC != 0).then(|| u64_at(b, at + 40)),
                last_entry: (flags & FLAG_HAS_LAST != 0).then(|| u64_at(b, at + 48)),
            }
        };
        out.push((ledger, state));
        at += LEDGER_STATE_BYTES;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip_and_detect_flips() {
        // Goal: every block kind decodes to what was encoded, and a flipped byte anywhere in a
        // block fails its CRC. Method: encode full blocks, decode, flip each byte in turn.
        let locs: Vec<(u64, u64, Location)> = (0..LOCATIONS_PER_BLOCK as u64)
            .map(|i| {
                (
                    7,
                    i,
                    Location {
                        log_id: i + 1,
                        offset: 4096 * i,
                        data_len: i as u32,
                    },
                )
            })
            .collect();
        let b = encode_data_block(&locs);
        assert_eq!(check_block(&b, LOCATIONS_PER_BLOCK), Ok(locs.len()));
        for (i, (l, e, loc)) in locs.iter().enumerate() {
            assert_eq!(data_key(&b, i), (*l, *e));
            assert_eq!(data_location(&b, i), *loc);
        }
        for at in (0..BLOCK_BYTES).step_by(97) {
            let mut c = b.clone();
            c[at] ^= 0x40;
            assert!(
                check_block(&c, LOCATIONS_PER_BLOCK).is_err(),
                "flip at {at}"
            );
        }
        let keys: Vec<Key> = (0..KEYS_PER_BLOCK as u64).map(|i| (i, i * 3)).collect();
        let k = encode_key_block(&keys);
        assert_eq!(check_block(&k, KEYS_PER_BLOCK), Ok(keys.len()));
        assert_eq!(block_key(&k, 5), keys[5]);
        let states = vec![(
            3,
            StoredLedger {
                fenced: true,
                master_key: Some([4; 20]),
                fence_keys: Vec::new(),
                lac: Some(9),
                last_entry: None,
            },
        )];
        assert_eq!(
            decode_ledger_block(&encode_ledger_block(&states)),
            Ok(states)
        );
    }

    #[test]
    fn fence_only_keys_round_trip_as_one_record_per_key() {
        // Goal: a ledger fenced before any add bound its key is stored as one record per fence
        // key (flags fenced | bit 4, key in master_key) and read back as one state with all its
        // keys, also when its records straddle two blocks; bit 4 with a bound key is refused.
        // Method: states around a block boundary -> records -> blocks -> records -> states.
        let bound = |id: u64| {
            (
                id,
                StoredLedger {
                    fenced: id.is_multiple_of(2),
                    master_key: Some([id as u8; 20]),
                    fence_keys: Vec::new(),
                    lac: Some(id),
                    last_entry: Some(id + 1),
                },
            )
        };
        let fence_only = |id: u64, keys: &[u8]| {
            (
                id,
                StoredLedger {
                    fence_keys: keys.iter().map(|k| [*k; 20]).collect(),
                    ..StoredLedger::default()
                },
            )
        };
        let mut states: Vec<(u64, StoredLedger)> =
            (0..LEDGERS_PER_BLOCK as u64 - 2).map(bound).collect();
        // Records 71..76: across the boundary between block 0 and block 1.
        states.push(fence_only(1000, &[1, 2, 3, 4, 5]));
        // Fenced for every key (a rebuilt state): one ordinary record.
        states.push((
            1001,
            StoredLedger {
                fenced: true,
                last_entry: Some(7),
                ..StoredLedger::default()
            },
        ));
        states.push(fence_only(1002, &[9]));
        let records = ledger_records(&states);
        assert_eq!(records.len(), states.len() + 4);
        let blocks: Vec<Vec<u8>> = records
            .chunks(LEDGERS_PER_BLOCK)
            .map(encode_ledger_block)
            .collect();
        assert_eq!(blocks.len(), 2);
        // What a reader that predates bit 4 sees: every fence-key record is fenced, no key.
        let at = BLOCK_HEADER_BYTES + (LEDGERS_PER_BLOCK - 1) * LEDGER_STATE_BYTES;
        let flags = u32_at(&blocks[0], at + 8);
        assert_eq!(flags, FLAG_FENCED | FLAG_FENCE_KEY);
        assert_eq!(u64_at(&blocks[0], at), 1000);
        let mut read = Vec::new();
        for b in &blocks {
            read.extend(decode_ledger_block(b).unwrap());
        }
        assert_eq!(read, records);
        assert_eq!(join_ledger_records(read), states);

        // A fence-only state that somehow has a last entry is written fenced for every key.
        let odd = vec![(
            5,
            StoredLedger {
                fence_keys: vec![[1; 20]],
                last_entry: Some(3),
                ..StoredLedger::default()
            },
        )];
        let r = ledger_records(&odd);
        assert_eq!(r.len(), 1);
        assert!(r[0].1.fenced && r[0].1.master_key.is_none() && r[0].1.fence_keys.is_empty());

        // Bit 4 together with "has master key" is refused (CRC valid: written that way).
        let mut b = encode_ledger_block(&[fence_only(3, &[1])]);
        let at = BLOCK_HEADER_BYTES + 8;
        let f = u32_at(&b, at) | FLAG_HAS_KEY;
        b[at..at + 4].copy_from_slice(&f.to_le_bytes());
        seal_block(&mut b);
        assert!(decode_ledger_block(&b).is_err());
    }

    #[test]
    fn group_layout_places_index_blocks_after_their_data_blocks() {
        // Goal: the block arithmetic of the layout is consistent. Method: for a segment of
        // 2.5 groups, every data and index block has a distinct number below the top blocks.
        let h = SegmentHeader {
            entry_count: 0,
            data_blocks: DATA_BLOCKS_PER_GROUP * 2 + DATA_BLOCKS_PER_GROUP / 2,
            ledger_count: 100,
            ..Default::default()
        };
        let mut seen = std::collections::BTreeSet::new();
        for d in 0..h.data_blocks {
            assert!(seen.insert(h.data_block_at(d)));
        }
        for g in 0..h.groups() {
            assert!(seen.insert(h.index_block_at(g)));
        }
        assert_eq!(seen.len() as u64, h.data_blocks + h.groups());
        assert_eq!(*seen.iter().next().unwrap(), 1);
        assert_eq!(*seen.iter().last().unwrap() + 1, h.top_at());
        assert_eq!(h.total_blocks(), h.ledgers_at() + 2);
    }
}

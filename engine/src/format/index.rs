//! Index segments (docs/format/index.md): one per checkpoint, holding the entry locations and
//! the changed ledger states (the role of BookKeeper `DbLedgerStorage`'s location and ledger
//! indexes, as an append-only file).

use super::{pad_to_block, round_up_block, u32_at, u64_at};

/// Magic of the index file header (`index.qix`).
pub const INDEX_MAGIC: [u8; 8] = *b"QUIREIDX";
/// Magic of one index segment (one per checkpoint).
pub const INDEX_SEGMENT_MAGIC: u32 = u32::from_le_bytes(*b"QSEG");

/// Bytes of an index segment header: magic(4) crc(4) body_bytes(8) location_count(4)
/// ledger_count(4) zero(8).
pub const SEGMENT_HEADER_BYTES: usize = 32;
/// Bytes of one location: ledger(8) entry(8) log_id(8) offset(8) data_len(4) zero(4).
pub const LOCATION_BYTES: usize = 40;
/// Bytes of one ledger state: ledger(8) flags(4) zero(4) master_key(20) zero(4) lac(8) last(8).
pub const LEDGER_STATE_BYTES: usize = 56;

pub const FLAG_FENCED: u32 = 1;
pub const FLAG_HAS_KEY: u32 = 2;
pub const FLAG_HAS_LAC: u32 = 4;
pub const FLAG_HAS_LAST: u32 = 8;
/// Index segment files only (`index_segment.rs`): the record carries in `master_key` one key a
/// fence recorded while no add had bound the ledger's key (bit 1 clear, bit 0 set). Such a
/// ledger is stored as one record per fencing key, consecutive. `index.qix` never has it.
pub const FLAG_FENCE_KEY: u32 = 16;

/// Where an entry lives in the entry logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub log_id: u64,
    /// Offset of the entry record header in the entry log.
    pub offset: u64,
    pub data_len: u32,
}

/// Durable per-ledger state as stored in the index.
///
/// `fenced` with `master_key` set: fenced for that key. `fenced` with no key: fenced for every
/// key (a rebuilt state, docs/format/index.md "Damaged segments"). `fence_keys`: the keys
/// fences recorded while no add had bound a key (docs/protocol.md §Fence); empty once a key is
/// bound, at most `FENCE_KEYS_MAX` (16).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredLedger {
    pub fenced: bool,
    pub master_key: Option<[u8; 20]>,
    pub fence_keys: Vec<[u8; 20]>,
    pub lac: Option<u64>,
    pub last_entry: Option<u64>,
}

/// Encodes one segment, padded to a whole number of blocks.
pub fn encode_segment(
    locations: &[(u64, u64, Location)],
    ledgers: &[(u64, StoredLedger)],
) -> Vec<u8> {
    let mut b = vec![0u8; SEGMENT_HEADER_BYTES];
    for (ledger, entry, loc) in locations {
        b.extend_from_slice(&ledger.to_le_bytes());
        b.extend_from_slice(&entry.to_le_bytes());
        b.extend_from_slice(&loc.log_id.to_le_bytes());
        b.extend_from_slice(&loc.offset.to_le_bytes());
        b.extend_from_slice(&loc.data_len.to_le_bytes());
        b.extend_from_slice(&[0u8; 4]);
    }
    for (ledger, s) in ledgers {
        let mut flags = 0u32;
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
        b.extend_from_slice(&ledger.to_le_bytes());
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&[0u8; 4]);
        b.extend_from_slice(&s.master_key.unwrap_or([0u8; 20]));
        b.extend_from_slice(&[0u8; 4]);
        b.extend_from_slice(&s.lac.unwrap_or(0).to_le_bytes());
        b.extend_from_slice(&s.last_entry.unwrap_or(0).to_le_bytes());
    }
    let body = (b.len() - SEGMENT_HEADER_BYTES) as u64;
    b[0..4].copy_from_slice(&INDEX_SEGMENT_MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&body.to_le_bytes());
    b[16..20].copy_from_slice(&(locations.len() as u32).to_le_bytes());
    b[20..24].copy_from_slice(&(ledgers.len() as u32).to_le_bytes());
    let crc = crc32c::crc32c(&b[8..]);
    b[4..8].copy_from_slice(&crc.to_le_bytes());
    pad_to_block(&mut b);
    b
}

/// A decoded index segment.
pub struct Segment {
    pub locations: Vec<(u64, u64, Location)>,
    pub ledgers: Vec<(u64, StoredLedger)>,
    /// Bytes the segment occupies on disk, padding included.
    pub padded_bytes: u64,
}

/// Decodes the segment at the start of `b`.
pub fn decode_segment(b: &[u8]) -> Result<Segment, String> {
    if b.len() < SEGMENT_HEADER_BYTES {
        return Err("index segment header cut short".into());
    }
    if u32_at(b, 0) != INDEX_SEGMENT_MAGIC {
        return Err("bad index segment magic".into());
    }
    let body = u64_at(b, 8);
    let nloc = u32_at(b, 16) as u64;
    let nled = u32_at(b, 20) as u64;
    if nloc * LOCATION_BYTES as u64 + nled * LEDGER_STATE_BYTES as u64 != body {
        return Err(format!(
            "index segment body of {body} bytes does not hold {nloc} locations and {nled} ledgers"
        ));
    }
    let total = SEGMENT_HEADER_BYTES as u64 + body;
    if (b.len() as u64) < total {
        return Err(format!(
            "index segment cut short: {} of {total} bytes",
            b.len()
        ));
    }
    let total = total as usize;
    let stored = u32_at(b, 4);
    let computed = crc32c::crc32c(&b[8..total]);
    if stored != computed {
        return Err(format!(
            "index segment CRC32C mismatch: stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    let mut at = SEGMENT_HEADER_BYTES;
    let mut locations = Vec::with_capacity(nloc as usize);
    for _ in 0..nloc {
        locations.push((
            u64_at(b, at),
            u64_at(b, at + 8),
            Location {
                log_id: u64_at(b, at + 16),
                offset: u64_at(b, at + 24),
                data_len: u32_at(b, at + 32),
            },
        ));
        at += LOCATION_BYTES;
    }
    let mut ledgers = Vec::with_capacity(nled as usize);
    for _ in 0..nled {
        let flags = u32_at(b, at + 8);
        let mut key = [0u8; 20];
        key.copy_from_slice(&b[at + 16..at + 36]);
        ledgers.push((
            u64_at(b, at),
            StoredLedger {
                fenced: flags & FLAG_FENCED != 0,
                master_key: (flags & FLAG_HAS_KEY != 0).then_some(key),
                fence_keys: Vec::new(),
                lac: (flags & FLAG_HAS_LAC != 0).then(|| u64_at(b, at + 40)),
                last_entry: (flags & FLAG_HAS_LAST != 0).then(|| u64_at(b, at + 48)),
            },
        ));
        at += LEDGER_STATE_BYTES;
    }
    Ok(Segment {
        locations,
        ledgers,
        padded_bytes: round_up_block(total as u64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::BLOCK_BYTES;

    #[test]
    fn segment_round_trip() {
        // Goal: index segments decode to what was encoded. Method: encode, decode, compare.
        let locs = vec![(
            1,
            2,
            Location {
                log_id: 3,
                offset: 4096,
                data_len: 10,
            },
        )];
        let leds = vec![(
            1,
            StoredLedger {
                fenced: true,
                master_key: Some([1; 20]),
                fence_keys: Vec::new(),
                lac: None,
                last_entry: Some(2),
            },
        )];
        let b = encode_segment(&locs, &leds);
        assert_eq!(b.len() % BLOCK_BYTES, 0);
        let s = decode_segment(&b).unwrap();
        assert_eq!(s.locations, locs);
        assert_eq!(s.ledgers, leds);
        assert_eq!(s.padded_bytes, b.len() as u64);
    }
}

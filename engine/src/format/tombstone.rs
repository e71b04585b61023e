//! Tombstone groups (docs/format/tombstones.md): the ids of ledgers deleted by one call, in one
//! checksummed, block-padded group of `deleted-ledgers.qdl`.

use super::{pad_to_block, round_up_block, u32_at, u64_at};

/// Magic of the tombstone file header (`deleted-ledgers.qdl`).
pub const TOMBSTONE_MAGIC: [u8; 8] = *b"QUIRETMB";
/// Magic of one tombstone group.
pub const TOMBSTONE_GROUP_MAGIC: u32 = u32::from_le_bytes(*b"QTMB");
/// Bytes of a group header: magic(4) crc(4) count(4) zero(4).
pub const TOMBSTONE_GROUP_HEADER_BYTES: usize = 16;

/// Encodes one group of ledger ids, padded to whole blocks.
pub fn encode_tombstone_group(ids: &[u64]) -> Vec<u8> {
    let mut b = vec![0u8; TOMBSTONE_GROUP_HEADER_BYTES];
    b[0..4].copy_from_slice(&TOMBSTONE_GROUP_MAGIC.to_le_bytes());
    let count = u32::try_from(ids.len()).expect("fewer than 2^32 ledgers per deletion");
    b[8..12].copy_from_slice(&count.to_le_bytes());
    for id in ids {
        b.extend_from_slice(&id.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b[8..]);
    b[4..8].copy_from_slice(&crc.to_le_bytes());
    pad_to_block(&mut b);
    b
}

/// Outcome of decoding the group at the start of a byte slice.
#[derive(Debug, PartialEq, Eq)]
pub enum TombstoneDecode {
    Ok {
        ids: Vec<u64>,
        padded_bytes: usize,
    },
    /// A zero magic: the end of the groups.
    Zeros,
    Bad(String),
}

pub fn decode_tombstone_group(b: &[u8]) -> TombstoneDecode {
    if b.len() < TOMBSTONE_GROUP_HEADER_BYTES {
        return TombstoneDecode::Bad("tombstone group header cut short".into());
    }
    let magic = u32_at(b, 0);
    if magic == 0 && b[..TOMBSTONE_GROUP_HEADER_BYTES].iter().all(|&x| x == 0) {
        return TombstoneDecode::Zeros;
    }
    if magic != TOMBSTONE_GROUP_MAGIC {
        return TombstoneDecode::Bad("bad tombstone group magic".into());
    }
    let count = u32_at(b, 8) as usize;
    let total = TOMBSTONE_GROUP_HEADER_BYTES + 8 * count;
    if b.len() < total {
        return TombstoneDecode::Bad(format!(
            "tombstone group cut short: {} of {total} bytes",
            b.len()
        ));
    }
    let stored = u32_at(b, 4);
    let computed = crc32c::crc32c(&b[8..total]);
    if stored != computed {
        return TombstoneDecode::Bad(format!(
            "tombstone group CRC32C mismatch: stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    let ids = (0..count)
        .map(|i| u64_at(b, TOMBSTONE_GROUP_HEADER_BYTES + 8 * i))
        .collect();
    TombstoneDecode::Ok {
        ids,
        padded_bytes: round_up_block(total as u64) as usize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstone_group_round_trip_and_damage() {
        // Goal: a group decodes to its ids, and a flipped byte or a cut is Bad, zeros are Zeros.
        // Method: encode 1000 ids (two blocks), decode; flip one id byte; cut it; all zeros.
        let ids: Vec<u64> = (0..1000).map(|i| i * 3 + 1).collect();
        let b = encode_tombstone_group(&ids);
        assert_eq!(b.len(), 8192);
        assert_eq!(
            decode_tombstone_group(&b),
            TombstoneDecode::Ok {
                ids: ids.clone(),
                padded_bytes: 8192
            }
        );
        let mut bad = b.clone();
        bad[100] ^= 1;
        assert!(matches!(
            decode_tombstone_group(&bad),
            TombstoneDecode::Bad(_)
        ));
        assert!(matches!(
            decode_tombstone_group(&b[..4096]),
            TombstoneDecode::Bad(_)
        ));
        assert_eq!(decode_tombstone_group(&[0u8; 4096]), TombstoneDecode::Zeros);
    }
}

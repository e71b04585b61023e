//! The checkpoint mark (`checkpoint.qcp`, docs/format/index.md): where replay starts and which
//! index segment files are live (BookKeeper's `lastMark`, plus the role of a manifest). Version
//! 1 named a committed length of the legacy `index.qix` instead; it is read for migration.

use super::{u16_at, u32_at, u64_at, FORMAT_V1, FORMAT_V2};
use crate::io::BLOCK_BYTES;

/// Magic of the checkpoint mark (`checkpoint.qcp`).
pub const MARK_MAGIC: [u8; 8] = *b"QUIRECKP";
/// Most index segment files one mark can name (the block less the fixed fields and the CRC).
pub const MARK_SEGMENTS_MAX: usize = (BLOCK_BYTES - 48 - 4) / 8;

/// The checkpoint mark: where replay starts, and what of the index is committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    pub journal_file_id: u64,
    /// Byte offset in that journal file of the first batch not covered by the checkpoint
    /// (block aligned).
    pub journal_offset: u64,
    /// Sequence number of the first record not covered by the checkpoint.
    pub next_seq: u64,
    /// Version 1 marks only: bytes of the legacy `index.qix` that are committed.
    pub legacy_index_bytes: Option<u64>,
    /// Ids of the live index segment files, oldest first (later ones override earlier ones).
    pub segments: Vec<u64>,
}

const V1_CRC_COVERED: usize = 48;
const V2_CRC_AT: usize = BLOCK_BYTES - 4;

/// Encodes a version 2 mark. Panics if it names more than [`MARK_SEGMENTS_MAX`] segments (the
/// index keeps fewer by merging; the checkpoint checks before).
pub fn encode_mark(m: &Mark) -> Vec<u8> {
    assert!(
        m.segments.len() <= MARK_SEGMENTS_MAX,
        "too many index segments for a mark"
    );
    let mut b = vec![0u8; BLOCK_BYTES];
    b[0..8].copy_from_slice(&MARK_MAGIC);
    b[8..10].copy_from_slice(&FORMAT_V2.to_le_bytes());
    b[16..24].copy_from_slice(&m.journal_file_id.to_le_bytes());
    b[24..32].copy_from_slice(&m.journal_offset.to_le_bytes());
    b[32..40].copy_from_slice(&m.next_seq.to_le_bytes());
    b[40..44].copy_from_slice(&(m.segments.len() as u32).to_le_bytes());
    for (i, id) in m.segments.iter().enumerate() {
        b[48 + i * 8..56 + i * 8].copy_from_slice(&id.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b[..V2_CRC_AT]);
    b[V2_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Encodes a version 1 mark (legacy `index.qix` length): only for tests of the migration.
pub fn encode_mark_v1(m: &Mark) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_BYTES];
    b[0..8].copy_from_slice(&MARK_MAGIC);
    b[8..10].copy_from_slice(&FORMAT_V1.to_le_bytes());
    b[16..24].copy_from_slice(&m.journal_file_id.to_le_bytes());
    b[24..32].copy_from_slice(&m.journal_offset.to_le_bytes());
    b[32..40].copy_from_slice(&m.next_seq.to_le_bytes());
    b[40..48].copy_from_slice(&m.legacy_index_bytes.unwrap_or(0).to_le_bytes());
    let crc = crc32c::crc32c(&b[..V1_CRC_COVERED]);
    b[48..52].copy_from_slice(&crc.to_le_bytes());
    b
}

pub enum MarkDecode {
    Ok(Mark),
    Unsupported(u16),
    Bad(String),
}

pub fn decode_mark(b: &[u8]) -> MarkDecode {
    if b.len() < BLOCK_BYTES {
        return MarkDecode::Bad(format!("checkpoint mark cut short at {} bytes", b.len()));
    }
    if b[0..8] != MARK_MAGIC {
        return MarkDecode::Bad("bad checkpoint mark magic".into());
    }
    let version = u16_at(b, 8);
    let (stored, computed) = match version {
        FORMAT_V1 => (u32_at(b, 48), crc32c::crc32c(&b[..V1_CRC_COVERED])),
        FORMAT_V2 => (u32_at(b, V2_CRC_AT), crc32c::crc32c(&b[..V2_CRC_AT])),
        v => return MarkDecode::Unsupported(v),
    };
    if stored != computed {
        return MarkDecode::Bad(format!(
            "checkpoint mark CRC32C mismatch: stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    let mut m = Mark {
        journal_file_id: u64_at(b, 16),
        journal_offset: u64_at(b, 24),
        next_seq: u64_at(b, 32),
        legacy_index_bytes: None,
        segments: Vec::new(),
    };
    if version == FORMAT_V1 {
        m.legacy_index_bytes = Some(u64_at(b, 40));
        return MarkDecode::Ok(m);
    }
    let n = u32_at(b, 40) as usize;
    if n > MARK_SEGMENTS_MAX {
        return MarkDecode::Bad(format!("checkpoint mark names {n} index segments"));
    }
    m.segments = (0..n).map(|i| u64_at(b, 48 + i * 8)).collect();
    MarkDecode::Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_of_both_versions_decode() {
        // Goal: a v2 mark round-trips with its segment list; a v1 mark still decodes (migration).
        let m = Mark {
            journal_file_id: 3,
            journal_offset: 8192,
            next_seq: 77,
            legacy_index_bytes: None,
            segments: vec![4, 9, 12],
        };
        let MarkDecode::Ok(d) = decode_mark(&encode_mark(&m)) else {
            panic!("v2 mark does not decode");
        };
        assert_eq!(d, m);
        let v1 = Mark {
            legacy_index_bytes: Some(12288),
            segments: Vec::new(),
            ..m
        };
        let MarkDecode::Ok(d) = decode_mark(&encode_mark_v1(&v1)) else {
            panic!("v1 mark does not decode");
        };
        assert_eq!(d, v1);
        let mut bad = encode_mark(&d);
        bad[50] ^= 1;
        assert!(matches!(decode_mark(&bad), MarkDecode::Bad(_)));
    }
}

//! The checkpoint mark (`checkpoint.qcp`, docs/format/index.md): where replay starts and how much
//! of the index is committed (BookKeeper's `lastMark`).

use super::{u16_at, u32_at, u64_at, FORMAT_CURRENT, FORMAT_OLDEST_READABLE};
use crate::io::BLOCK_BYTES;

/// Magic of the checkpoint mark (`checkpoint.qcp`).
pub const MARK_MAGIC: [u8; 8] = *b"QUIRECKP";

/// The checkpoint mark: where replay starts, and how much of the index file is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub journal_file_id: u64,
    /// Byte offset in that journal file of the first batch not covered by the checkpoint
    /// (block aligned).
    pub journal_offset: u64,
    /// Sequence number of the first record not covered by the checkpoint.
    pub next_seq: u64,
    /// Bytes of `index.qix` that are committed (block aligned); later bytes are ignored.
    pub index_bytes: u64,
}

const MARK_CRC_COVERED: usize = 48;

pub fn encode_mark(m: &Mark) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_BYTES];
    b[0..8].copy_from_slice(&MARK_MAGIC);
    b[8..10].copy_from_slice(&FORMAT_CURRENT.to_le_bytes());
    b[16..24].copy_from_slice(&m.journal_file_id.to_le_bytes());
    b[24..32].copy_from_slice(&m.journal_offset.to_le_bytes());
    b[32..40].copy_from_slice(&m.next_seq.to_le_bytes());
    b[40..48].copy_from_slice(&m.index_bytes.to_le_bytes());
    let crc = crc32c::crc32c(&b[..MARK_CRC_COVERED]);
    b[48..52].copy_from_slice(&crc.to_le_bytes());
    b
}

pub enum MarkDecode {
    Ok(Mark),
    Unsupported(u16),
    Bad(String),
}

pub fn decode_mark(b: &[u8]) -> MarkDecode {
    if b.len() < 52 {
        return MarkDecode::Bad(format!("checkpoint mark cut short at {} bytes", b.len()));
    }
    if b[0..8] != MARK_MAGIC {
        return MarkDecode::Bad("bad checkpoint mark magic".into());
    }
    let stored = u32_at(b, 48);
    let computed = crc32c::crc32c(&b[..MARK_CRC_COVERED]);
    if stored != computed {
        return MarkDecode::Bad(format!(
            "checkpoint mark CRC32C mismatch: stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    let version = u16_at(b, 8);
    if !(FORMAT_OLDEST_READABLE..=FORMAT_CURRENT).contains(&version) {
        return MarkDecode::Unsupported(version);
    }
    MarkDecode::Ok(Mark {
        journal_file_id: u64_at(b, 16),
        journal_offset: u64_at(b, 24),
        next_seq: u64_at(b, 32),
        index_bytes: u64_at(b, 40),
    })
}

//! Byte layouts of every durable file (docs/format/*.md). All integers little-endian.
//!
//! This module holds what every file shares (format versions, the one-block file header, the
//! little-endian readers, block padding); each file kind has its own module: `journal_record`
//! (journal.md), `entry_log` (entry-log.md), `index` (index.md segments) and `mark`
//! (checkpoint mark). Their items are re-exported here, so `format::Record` etc. keep their path.
//!
//! Encoders write into plain `Vec<u8>`s; decoders never panic on bad bytes: they return `None`
//! or a reason string, and the caller turns that into `Error::Corrupt` with path and offset.

use crate::io::BLOCK_BYTES;

mod entry_log;
mod index;
mod index_segment;
mod journal_record;
mod mark;
mod tombstone;

pub use entry_log::*;
pub use index::*;
pub use index_segment::*;
pub use journal_record::*;
pub use mark::*;
pub use tombstone::*;

/// Version 1: first format (journal.md, entry-log.md, index.md, checkpoint.md).
pub const FORMAT_V1: u16 = 1;
/// Version 2 of the checkpoint mark only: it names the live index segment files
/// (`index-{id}.qis`, version 1 of their own format), which replace the append-only `index.qix`.
pub const FORMAT_V2: u16 = 2;
/// Version 3 of the checkpoint mark only: each named segment with its summary (key range,
/// ledger-state range, entry logs), so that a missing or unreadable segment is rebuilt in the
/// background (docs/format/index.md).
pub const FORMAT_V3: u16 = 3;
/// Version of the shared file header written by this build (journal, entry log, index
/// segment, tombstone files).
pub const FORMAT_CURRENT: u16 = FORMAT_V1;
/// Oldest version this build reads.
pub const FORMAT_OLDEST_READABLE: u16 = FORMAT_V1;

/// Size of the file header every journal, entry-log and index file starts with (one block).
pub const FILE_HEADER_BYTES: usize = BLOCK_BYTES;
/// Bytes of the file header covered by its CRC: magic(8) version(2) zero(6) file_id(8).
const FILE_HEADER_CRC_COVERED: usize = 24;

/// Builds a one-block file header: magic, version, file id, CRC32C of bytes 0..24 at 24..28.
pub fn encode_file_header(magic: [u8; 8], file_id: u64) -> Vec<u8> {
    let mut b = vec![0u8; FILE_HEADER_BYTES];
    b[0..8].copy_from_slice(&magic);
    b[8..10].copy_from_slice(&FORMAT_CURRENT.to_le_bytes());
    b[16..24].copy_from_slice(&file_id.to_le_bytes());
    let crc = crc32c::crc32c(&b[..FILE_HEADER_CRC_COVERED]);
    b[24..28].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Outcome of checking a file header.
#[derive(Debug, PartialEq, Eq)]
pub enum HeaderCheck {
    Ok {
        version: u16,
        file_id: u64,
    },
    /// Version outside `[FORMAT_OLDEST_READABLE, FORMAT_CURRENT]`.
    Unsupported(u16),
    Bad(String),
}

pub fn decode_file_header(magic: [u8; 8], b: &[u8]) -> HeaderCheck {
    if b.len() < FILE_HEADER_CRC_COVERED + 4 {
        return HeaderCheck::Bad(format!("file header cut short at {} bytes", b.len()));
    }
    if b[0..8] != magic {
        return HeaderCheck::Bad(format!("bad magic {:02x?}", &b[0..8]));
    }
    let stored = u32_at(b, 24);
    let computed = crc32c::crc32c(&b[..FILE_HEADER_CRC_COVERED]);
    if stored != computed {
        return HeaderCheck::Bad(format!(
            "file header CRC32C mismatch: stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    let version = u16_at(b, 8);
    if !(FORMAT_OLDEST_READABLE..=FORMAT_CURRENT).contains(&version) {
        return HeaderCheck::Unsupported(version);
    }
    HeaderCheck::Ok {
        version,
        file_id: u64_at(b, 16),
    }
}

pub fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
pub fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
pub fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Rounds `v` up to a multiple of [`BLOCK_BYTES`].
pub fn round_up_block(v: u64) -> u64 {
    let b = BLOCK_BYTES as u64;
    v.div_ceil(b) * b
}

/// Pads `buf` with zeros to a multiple of [`BLOCK_BYTES`].
pub fn pad_to_block(buf: &mut Vec<u8>) {
    let len = round_up_block(buf.len() as u64) as usize;
    buf.resize(len, 0);
}

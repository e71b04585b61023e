//! Entry-log records (docs/format/entry-log.md): one checksummed record per entry, written by
//! the checkpoint in (ledger, entry) order (BookKeeper's entry logger).

use super::{u32_at, u64_at};

/// Magic of an entry-log file header (`entrylog-{id:016x}.qel`).
pub const ENTRY_LOG_MAGIC: [u8; 8] = *b"QUIREELG";

/// Bytes of an entry-log record header: crc(4) data_len(4) ledger(8) entry(8).
pub const ENTRY_RECORD_HEADER_BYTES: usize = 24;

pub fn encode_entry_record(out: &mut Vec<u8>, ledger: u64, entry: u64, data: &[u8]) {
    let start = out.len();
    let len = u32::try_from(data.len()).expect("entry fits u32 (bounded by entry_size_bytes_max)");
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&ledger.to_le_bytes());
    out.extend_from_slice(&entry.to_le_bytes());
    out.extend_from_slice(data);
    let crc = crc32c::crc32c(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Checks an entry-log record read back from disk and returns its data.
pub fn decode_entry_record(
    b: &[u8],
    ledger: u64,
    entry: u64,
    data_len: u32,
) -> Result<Vec<u8>, String> {
    let total = ENTRY_RECORD_HEADER_BYTES + data_len as usize;
    if b.len() < total {
        return Err(format!(
            "entry record cut short: {} of {total} bytes",
            b.len()
        ));
    }
    let stored = u32_at(b, 0);
    let computed = crc32c::crc32c(&b[4..total]);
    if stored != computed {
        return Err(format!(
            "entry CRC32C mismatch: stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    if u32_at(b, 4) != data_len || u64_at(b, 8) != ledger || u64_at(b, 16) != entry {
        return Err(format!(
            "entry record names ledger {} entry {} len {}, index expected ledger {ledger} entry {entry} len {data_len}",
            u64_at(b, 8),
            u64_at(b, 16),
            u32_at(b, 4)
        ));
    }
    Ok(b[ENTRY_RECORD_HEADER_BYTES..total].to_vec())
}

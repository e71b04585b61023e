//! Journal records (docs/format/journal.md): the batch header, add and fence records that the
//! journal writer appends and replay decodes (BookKeeper's journal entries, one CRC32C each).

use super::{u16_at, u32_at, u64_at};
use crate::io::BLOCK_BYTES;

/// Magic of a journal file header (`journal-{id:016x}.qj`).
pub const JOURNAL_MAGIC: [u8; 8] = *b"QUIREJNL";

/// Bytes of a journal record header: crc(4) payload_len(4) seq(8) kind(2) zero(2) zero(4).
pub const RECORD_HEADER_BYTES: usize = 24;
/// Payload of a batch header: record_count(4) batch_bytes(4).
pub const BATCH_HEADER_PAYLOAD_BYTES: usize = 8;
/// Fixed part of an add payload: ledger(8) entry(8) lac(8) flags(4) master_key(20).
pub const ADD_FIXED_BYTES: usize = 48;
/// Payload of a fence record: ledger(8) master_key(20) zero(4).
pub const FENCE_PAYLOAD_BYTES: usize = 32;
/// Stored in the LAC field of an add record when the add carried no LAC.
pub const LAC_NONE: u64 = u64::MAX;

const _: () = {
    assert!(RECORD_HEADER_BYTES + BATCH_HEADER_PAYLOAD_BYTES <= BLOCK_BYTES);
    assert!(ADD_FIXED_BYTES == 8 + 8 + 8 + 4 + 20);
    assert!(FENCE_PAYLOAD_BYTES == 8 + 20 + 4);
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum RecordKind {
    BatchHeader = 1,
    Add = 2,
    Fence = 3,
}

impl RecordKind {
    fn from_u16(v: u16) -> Option<Self> {
        match v {
            1 => Some(Self::BatchHeader),
            2 => Some(Self::Add),
            3 => Some(Self::Fence),
            _ => None,
        }
    }
}

/// A decoded journal record body (the header's seq is kept by the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    BatchHeader {
        record_count: u32,
        batch_bytes: u32,
    },
    Add {
        ledger: u64,
        entry: u64,
        lac: Option<u64>,
        recovery: bool,
        master_key: [u8; 20],
        data: Vec<u8>,
    },
    Fence {
        ledger: u64,
        master_key: [u8; 20],
    },
}

/// Appends one record (header + payload) to `out`.
pub fn encode_record(out: &mut Vec<u8>, seq: u64, record: &Record) {
    let start = out.len();
    out.resize(start + RECORD_HEADER_BYTES, 0);
    let kind = match record {
        Record::BatchHeader {
            record_count,
            batch_bytes,
        } => {
            out.extend_from_slice(&record_count.to_le_bytes());
            out.extend_from_slice(&batch_bytes.to_le_bytes());
            RecordKind::BatchHeader
        }
        Record::Add {
            ledger,
            entry,
            lac,
            recovery,
            master_key,
            data,
        } => {
            out.extend_from_slice(&ledger.to_le_bytes());
            out.extend_from_slice(&entry.to_le_bytes());
            let lac = match lac {
                Some(v) => {
                    assert!(*v != LAC_NONE, "LAC u64::MAX is reserved for 'no LAC'");
                    *v
                }
                None => LAC_NONE,
            };
            out.extend_from_slice(&lac.to_le_bytes());
            out.extend_from_slice(&u32::from(*recovery).to_le_bytes());
            out.extend_from_slice(master_key);
            out.extend_from_slice(data);
            RecordKind::Add
        }
        Record::Fence { ledger, master_key } => {
            out.extend_from_slice(&ledger.to_le_bytes());
            out.extend_from_slice(master_key);
            out.extend_from_slice(&[0u8; 4]);
            RecordKind::Fence
        }
    };
    let payload_len = out.len() - start - RECORD_HEADER_BYTES;
    let payload_len = u32::try_from(payload_len)
        .expect("record payload fits u32 (bounded by entry_size_bytes_max)");
    out[start + 4..start + 8].copy_from_slice(&payload_len.to_le_bytes());
    out[start + 8..start + 16].copy_from_slice(&seq.to_le_bytes());
    out[start + 16..start + 18].copy_from_slice(&(kind as u16).to_le_bytes());
    let crc = crc32c::crc32c(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Result of decoding one journal record at some offset.
#[derive(Debug)]
pub enum RecordDecode {
    /// The 24 header bytes are all zero: the pre-written zeros after the last record.
    Zeros,
    /// The bytes end before the record does (file cut short).
    Short,
    /// Non-zero bytes that are not a valid record.
    Bad(String),
    Ok {
        seq: u64,
        record: Record,
        len: usize,
    },
}

/// Decodes the record at the start of `b`.
pub fn decode_record(b: &[u8]) -> RecordDecode {
    if b.len() < RECORD_HEADER_BYTES {
        if b.iter().all(|&x| x == 0) {
            return RecordDecode::Zeros;
        }
        return RecordDecode::Short;
    }
    let h = &b[..RECORD_HEADER_BYTES];
    if h.iter().all(|&x| x == 0) {
        return RecordDecode::Zeros;
    }
    let payload_len = u32_at(h, 4) as usize;
    let total = RECORD_HEADER_BYTES + payload_len;
    if b.len() < total {
        // Could be a cut-short file or a garbled length; either way no record is here.
        return RecordDecode::Short;
    }
    let stored = u32_at(h, 0);
    let computed = crc32c::crc32c(&b[4..total]);
    if stored != computed {
        return RecordDecode::Bad(format!(
            "record CRC32C mismatch: stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    let seq = u64_at(h, 8);
    let Some(kind) = RecordKind::from_u16(u16_at(h, 16)) else {
        return RecordDecode::Bad(format!("unknown record kind {}", u16_at(h, 16)));
    };
    let p = &b[RECORD_HEADER_BYTES..total];
    let record = match kind {
        RecordKind::BatchHeader => {
            if p.len() != BATCH_HEADER_PAYLOAD_BYTES {
                return RecordDecode::Bad(format!("batch header payload of {} bytes", p.len()));
            }
            Record::BatchHeader {
                record_count: u32_at(p, 0),
                batch_bytes: u32_at(p, 4),
            }
        }
        RecordKind::Add => {
            if p.len() < ADD_FIXED_BYTES {
                return RecordDecode::Bad(format!("add payload of {} bytes", p.len()));
            }
            let lac = u64_at(p, 16);
            let mut master_key = [0u8; 20];
            master_key.copy_from_slice(&p[28..48]);
            Record::Add {
                ledger: u64_at(p, 0),
                entry: u64_at(p, 8),
                lac: (lac != LAC_NONE).then_some(lac),
                recovery: u32_at(p, 24) & 1 == 1,
                master_key,
                data: p[ADD_FIXED_BYTES..].to_vec(),
            }
        }
        RecordKind::Fence => {
            if p.len() != FENCE_PAYLOAD_BYTES {
                return RecordDecode::Bad(format!("fence payload of {} bytes", p.len()));
            }
            let mut master_key = [0u8; 20];
            master_key.copy_from_slice(&p[8..28]);
            Record::Fence {
                ledger: u64_at(p, 0),
                master_key,
            }
        }
    };
    RecordDecode::Ok {
        seq,
        record,
        len: total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_crc() {
        // Goal: an encoded record decodes to itself, and one flipped bit is caught.
        // Method: encode an add, decode it, flip a payload byte, decode again.
        let mut b = Vec::new();
        let rec = Record::Add {
            ledger: 7,
            entry: 3,
            lac: Some(2),
            recovery: true,
            master_key: [9; 20],
            data: b"hello".to_vec(),
        };
        encode_record(&mut b, 42, &rec);
        match decode_record(&b) {
            RecordDecode::Ok { seq, record, len } => {
                assert_eq!(seq, 42);
                assert_eq!(record, rec);
                assert_eq!(len, b.len());
            }
            other => panic!("decode failed: {other:?}"),
        }
        let n = b.len();
        b[n - 1] ^= 1;
        assert!(matches!(decode_record(&b), RecordDecode::Bad(_)));
        assert!(matches!(decode_record(&[0u8; 64]), RecordDecode::Zeros));
    }
}

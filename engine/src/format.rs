//! Byte layouts of every durable file (docs/format/*.md). All integers little-endian.
//!
//! Encoders write into plain `Vec<u8>`s; decoders never panic on bad bytes: they return `None`
//! or a reason string, and the caller turns that into `Error::Corrupt` with path and offset.

use crate::io::BLOCK_BYTES;

/// Magic of a journal file header (`journal-{id:016x}.qj`).
pub const JOURNAL_MAGIC: [u8; 8] = *b"QUIREJNL";
/// Magic of an entry-log file header (`entrylog-{id:016x}.qel`).
pub const ENTRY_LOG_MAGIC: [u8; 8] = *b"QUIREELG";
/// Magic of the index file header (`index.qix`).
pub const INDEX_MAGIC: [u8; 8] = *b"QUIREIDX";
/// Magic of the checkpoint mark (`checkpoint.qcp`).
pub const MARK_MAGIC: [u8; 8] = *b"QUIRECKP";
/// Magic of one index segment (one per checkpoint).
pub const INDEX_SEGMENT_MAGIC: u32 = u32::from_le_bytes(*b"QSEG");

/// Version 1: first format (journal.md, entry-log.md, index.md, checkpoint.md).
pub const FORMAT_V1: u16 = 1;
/// Version written by this build.
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

// ---------------------------------------------------------------------------------------------
// Journal records (journal.md)
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Entry-log records (entry-log.md)
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Checkpoint mark (checkpoint.md)
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Index segments (index.md)
// ---------------------------------------------------------------------------------------------

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

/// Where an entry lives in the entry logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub log_id: u64,
    /// Offset of the entry record header in the entry log.
    pub offset: u64,
    pub data_len: u32,
}

/// Durable per-ledger state as stored in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoredLedger {
    pub fenced: bool,
    pub master_key: Option<[u8; 20]>,
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

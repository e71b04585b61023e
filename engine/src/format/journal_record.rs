//! Journal records (docs/format/journal.md): the batch header, add and fence records that the
//! journal writer appends and replay decodes (BookKeeper's journal entries, one CRC32C each).

use super::{u16_at, u32_at, u64_at, FILE_HEADER_BYTES, FORMAT_V1};
use crate::io::BLOCK_BYTES;

/// Magic of a journal file header (`journal-{id:016x}.qj`).
pub const JOURNAL_MAGIC: [u8; 8] = *b"QUIREJNL";
/// Journal format version 2: a salt per file use in the header, mixed into every record CRC and
/// carried in every batch header (journal.md §Version history). Version 1 files are still read.
pub const JOURNAL_FORMAT_SALTED: u16 = 2;
/// Bytes of a version 2 journal header covered by its CRC: magic(8) version(2) zero(6)
/// file_id(8) salt(8).
const JOURNAL_HEADER_CRC_COVERED: usize = 32;

/// Bytes of a journal record header: crc(4) payload_len(4) seq(8) kind(2) zero(2) zero(4).
pub const RECORD_HEADER_BYTES: usize = 24;
/// Payload of a batch header: record_count(4) batch_bytes(4) salt(8).
pub const BATCH_HEADER_PAYLOAD_BYTES: usize = 16;
/// Payload of a version 1 batch header: record_count(4) batch_bytes(4).
pub const BATCH_HEADER_PAYLOAD_BYTES_V1: usize = 8;
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

/// How the records of one use of a journal file are sealed. A version 2 file carries a random
/// salt in its header: every record's CRC32C covers the salt before the record's bytes, and
/// every batch header repeats the salt in full. So bytes from an earlier use of a reused file,
/// or bytes a client put into entry data, do not decode as this use's records (a forged batch
/// header must guess all 64 bits). A version 1 file has no salt: plain CRC32C, 8-byte batch
/// header payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalSalt {
    salt: Option<u64>,
    /// CRC32C of the salt's 8 bytes: where every record CRC of this file starts.
    seed: u32,
}

impl JournalSalt {
    /// Records of a version 1 file.
    pub const V1: Self = Self {
        salt: None,
        seed: 0,
    };

    /// Records of a version 2 file whose header holds `salt`.
    pub fn new(salt: u64) -> Self {
        Self {
            salt: Some(salt),
            seed: crc32c::crc32c(&salt.to_le_bytes()),
        }
    }

    /// The salt, `None` for a version 1 file.
    pub fn value(&self) -> Option<u64> {
        self.salt
    }

    /// The CRC32C a record with these bytes (everything after its CRC field) carries.
    pub fn crc(&self, bytes: &[u8]) -> u32 {
        match self.salt {
            None => crc32c::crc32c(bytes),
            Some(_) => crc32c::crc32c_append(self.seed, bytes),
        }
    }

    /// Payload bytes of a batch header in this file.
    pub fn batch_header_payload_bytes(&self) -> usize {
        match self.salt {
            None => BATCH_HEADER_PAYLOAD_BYTES_V1,
            Some(_) => BATCH_HEADER_PAYLOAD_BYTES,
        }
    }
}

/// Builds a version 2 journal file header (one block): magic, version 2, file id, salt, and
/// the CRC32C of bytes 0..32 at 32..36.
pub fn encode_journal_header(file_id: u64, salt: u64) -> Vec<u8> {
    let mut b = vec![0u8; FILE_HEADER_BYTES];
    b[0..8].copy_from_slice(&JOURNAL_MAGIC);
    b[8..10].copy_from_slice(&JOURNAL_FORMAT_SALTED.to_le_bytes());
    b[16..24].copy_from_slice(&file_id.to_le_bytes());
    b[24..32].copy_from_slice(&salt.to_le_bytes());
    let crc = crc32c::crc32c(&b[..JOURNAL_HEADER_CRC_COVERED]);
    b[32..36].copy_from_slice(&crc.to_le_bytes());
    b
}

/// A decoded journal file header.
#[derive(Debug, PartialEq, Eq)]
pub enum JournalHeader {
    Ok {
        file_id: u64,
        salt: JournalSalt,
    },
    /// A version this build does not read (outside 1..=2).
    Unsupported(u16),
    Bad(String),
}

/// Decodes a journal file header of version 1 (the shared file header: CRC32C of bytes 0..24 at
/// 24..28) or 2 (salt at 24..32, CRC32C of bytes 0..32 at 32..36).
pub fn decode_journal_header(b: &[u8]) -> JournalHeader {
    if b.len() < JOURNAL_HEADER_CRC_COVERED + 4 {
        return JournalHeader::Bad(format!("file header cut short at {} bytes", b.len()));
    }
    if b[0..8] != JOURNAL_MAGIC {
        return JournalHeader::Bad(format!("bad magic {:02x?}", &b[0..8]));
    }
    // The CRC's place depends on the version, so both places are checked before the version
    // is believed: a damaged version field is corruption, not an unknown format.
    let crc_ok = |covered: usize| u32_at(b, covered) == crc32c::crc32c(&b[..covered]);
    let (v1_ok, v2_ok) = (crc_ok(24), crc_ok(JOURNAL_HEADER_CRC_COVERED));
    let salt = match u16_at(b, 8) {
        FORMAT_V1 if v1_ok => JournalSalt::V1,
        JOURNAL_FORMAT_SALTED if v2_ok => JournalSalt::new(u64_at(b, 24)),
        v if v1_ok || v2_ok => {
            if v == FORMAT_V1 || v == JOURNAL_FORMAT_SALTED {
                return JournalHeader::Bad(format!("file header CRC32C mismatch (version {v})"));
            }
            return JournalHeader::Unsupported(v);
        }
        _ => return JournalHeader::Bad("file header CRC32C mismatch".into()),
    };
    JournalHeader::Ok {
        file_id: u64_at(b, 16),
        salt,
    }
}

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

/// Appends one record (header + payload) to `out`, sealed with `salt` (the file's).
pub fn encode_record(out: &mut Vec<u8>, seq: u64, record: &Record, salt: &JournalSalt) {
    let start = out.len();
    out.resize(start + RECORD_HEADER_BYTES, 0);
    let kind = match record {
        Record::BatchHeader {
            record_count,
            batch_bytes,
        } => {
            out.extend_from_slice(&record_count.to_le_bytes());
            out.extend_from_slice(&batch_bytes.to_le_bytes());
            if let Some(v) = salt.salt {
                out.extend_from_slice(&v.to_le_bytes());
            }
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
    let crc = salt.crc(&out[start + 4..]);
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

/// Decodes the record at the start of `b`, a record of a file sealed with `salt`.
pub fn decode_record(b: &[u8], salt: &JournalSalt) -> RecordDecode {
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
    let computed = salt.crc(&b[4..total]);
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
            if p.len() != salt.batch_header_payload_bytes() {
                return RecordDecode::Bad(format!("batch header payload of {} bytes", p.len()));
            }
            if let Some(v) = salt.salt {
                if u64_at(p, 8) != v {
                    // Only reachable with a CRC collision: the salt is in the CRC too.
                    return RecordDecode::Bad("batch header of another file use".into());
                }
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

    fn add() -> Record {
        Record::Add {
            ledger: 7,
            entry: 3,
            lac: Some(2),
            recovery: true,
            master_key: [9; 20],
            data: b"hello".to_vec(),
        }
    }

    #[test]
    fn record_round_trip_and_crc() {
        // Goal: an encoded record decodes to itself, in both versions, and one flipped bit is
        // caught. Method: encode an add, decode it, flip a payload byte, decode again.
        for salt in [JournalSalt::V1, JournalSalt::new(0x1234_5678_9abc_def0)] {
            let mut b = Vec::new();
            encode_record(&mut b, 42, &add(), &salt);
            match decode_record(&b, &salt) {
                RecordDecode::Ok { seq, record, len } => {
                    assert_eq!(seq, 42);
                    assert_eq!(record, add());
                    assert_eq!(len, b.len());
                }
                other => panic!("decode failed: {other:?}"),
            }
            let n = b.len();
            b[n - 1] ^= 1;
            assert!(matches!(decode_record(&b, &salt), RecordDecode::Bad(_)));
            assert!(matches!(
                decode_record(&[0u8; 64], &salt),
                RecordDecode::Zeros
            ));
        }
    }

    #[test]
    fn records_of_another_salt_or_version_do_not_decode() {
        // Goal: a record or batch header sealed for one file use never decodes in another
        // (what makes reuse safe: journal.md §Reuse). Method: encode under one salt (and
        // version 1), decode under another.
        let a = JournalSalt::new(1);
        let b = JournalSalt::new(2);
        let header = Record::BatchHeader {
            record_count: 1,
            batch_bytes: 100,
        };
        for rec in [add(), header] {
            for (enc, dec) in [(a, b), (JournalSalt::V1, a), (a, JournalSalt::V1)] {
                let mut buf = Vec::new();
                encode_record(&mut buf, 5, &rec, &enc);
                assert!(
                    matches!(decode_record(&buf, &dec), RecordDecode::Bad(_)),
                    "{rec:?} sealed {enc:?} decoded under {dec:?}"
                );
            }
        }
    }

    #[test]
    fn journal_header_versions() {
        // Goal: version 2 headers round-trip with their salt, version 1 headers read with no
        // salt, damage and unknown versions are refused.
        let h = encode_journal_header(9, 77);
        assert_eq!(
            decode_journal_header(&h),
            JournalHeader::Ok {
                file_id: 9,
                salt: JournalSalt::new(77)
            }
        );
        let v1 = super::super::encode_file_header(JOURNAL_MAGIC, 9);
        assert_eq!(
            decode_journal_header(&v1),
            JournalHeader::Ok {
                file_id: 9,
                salt: JournalSalt::V1
            }
        );
        let mut bad = h.clone();
        bad[27] ^= 1;
        assert!(matches!(decode_journal_header(&bad), JournalHeader::Bad(_)));
        // A flipped version bit is damage; a newer version with its own valid CRC is not.
        let mut flipped = h.clone();
        flipped[8] ^= 1;
        assert!(matches!(
            decode_journal_header(&flipped),
            JournalHeader::Bad(_)
        ));
        let mut v3 = h;
        v3[8] = 3;
        let crc = crc32c::crc32c(&v3[..32]);
        v3[32..36].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_journal_header(&v3), JournalHeader::Unsupported(3));
    }
}

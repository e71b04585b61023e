//! Journal records (docs/format/journal.md): the batch header, add and fence records that the
//! journal writer appends and replay decodes (BookKeeper's journal entries, one CRC32C each).

use super::{u16_at, u32_at, u64_at, FILE_HEADER_BYTES, FORMAT_V1};
use crate::io::BLOCK_BYTES;

/// Magic of a journal file header (`journal-{id:016x}.qj`).
pub const JOURNAL_MAGIC: [u8; 8] = *b"QUIREJNL";
/// Journal format version 2: a salt per file use in the header, mixed into every record CRC and
/// carried in every batch header (journal.md §Version history). Version 1 files are still read.
pub const JOURNAL_FORMAT_SALTED: u16 = 2;
/// Journal format version 3 (written by this build): version 2's records, laid out 504 bytes
/// per 512-byte sector with an 8-byte stamp ending every sector of a batch (journal.md
/// §Sectors), so that replay can tell a batch that reached the medium whole (later damage)
/// from a torn write. Versions 1 and 2 are still read.
pub const JOURNAL_FORMAT_STAMPED: u16 = 3;
/// Bytes of a version 2 or 3 journal header covered by its CRC: magic(8) version(2) zero(6)
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
    /// Version 3: batches are laid out in stamped sectors ([`stamp_batch`]).
    stamped: bool,
}

impl JournalSalt {
    /// Records of a version 1 file.
    pub const V1: Self = Self {
        salt: None,
        seed: 0,
        stamped: false,
    };

    /// Records of a version 2 file whose header holds `salt`.
    pub fn new(salt: u64) -> Self {
        Self {
            salt: Some(salt),
            seed: crc32c::crc32c(&salt.to_le_bytes()),
            stamped: false,
        }
    }

    /// Records of a version 3 file whose header holds `salt`: sealed as in version 2, and
    /// every batch laid out in stamped sectors.
    pub fn stamped(salt: u64) -> Self {
        Self {
            stamped: true,
            ..Self::new(salt)
        }
    }

    /// Whether batches of this file are laid out in stamped sectors (version 3).
    pub fn sectors_stamped(&self) -> bool {
        self.stamped
    }

    /// The format version of the file these records belong to (1, 2 or 3).
    pub fn version(&self) -> u16 {
        match (self.salt, self.stamped) {
            (None, _) => FORMAT_V1,
            (Some(_), false) => JOURNAL_FORMAT_SALTED,
            (Some(_), true) => JOURNAL_FORMAT_STAMPED,
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

/// Builds a version 3 journal file header (one block): magic, version 3, file id, salt, and
/// the CRC32C of bytes 0..32 at 32..36.
pub fn encode_journal_header(file_id: u64, salt: u64) -> Vec<u8> {
    encode_journal_header_version(file_id, salt, JOURNAL_FORMAT_STAMPED)
}

/// Builds a journal file header of `version` 2 or 3 (the same layout; 2 for fixtures and
/// tests of the older format).
pub fn encode_journal_header_version(file_id: u64, salt: u64, version: u16) -> Vec<u8> {
    assert!(
        version == JOURNAL_FORMAT_SALTED || version == JOURNAL_FORMAT_STAMPED,
        "journal header version {version} has no salt"
    );
    let mut b = vec![0u8; FILE_HEADER_BYTES];
    b[0..8].copy_from_slice(&JOURNAL_MAGIC);
    b[8..10].copy_from_slice(&version.to_le_bytes());
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
    /// A version this build does not read (outside 1..=3).
    Unsupported(u16),
    Bad(String),
}

/// Decodes a journal file header of version 1 (the shared file header: CRC32C of bytes 0..24 at
/// 24..28) or 2 or 3 (salt at 24..32, CRC32C of bytes 0..32 at 32..36).
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
        JOURNAL_FORMAT_STAMPED if v2_ok => JournalSalt::stamped(u64_at(b, 24)),
        v if v1_ok || v2_ok => {
            if v == FORMAT_V1 || v == JOURNAL_FORMAT_SALTED || v == JOURNAL_FORMAT_STAMPED {
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

/// Bytes of a stamped sector in a version 3 journal (the device's write unit; a crash keeps or
/// loses whole sectors of the write in flight).
pub const STAMPED_SECTOR_BYTES: usize = 512;
/// Bytes of a sector's stamp, at its end (u64, little-endian).
pub const SECTOR_STAMP_BYTES: usize = 8;
/// Logical batch bytes a stamped sector carries, before its stamp.
pub const SECTOR_DATA_BYTES: usize = STAMPED_SECTOR_BYTES - SECTOR_STAMP_BYTES;
/// Stamped sectors per 4 KiB block.
const SECTORS_PER_BLOCK: usize = BLOCK_BYTES / STAMPED_SECTOR_BYTES;
/// How many bits a stored stamp may differ from the expected one in and still count as
/// stamped: a few flipped bits are rot of the stamp itself, while a stamp of another batch,
/// file use or of zeros differs in about 32 of 64.
pub const STAMP_ROT_BITS_MAX: u32 = 3;

const _: () = assert!(BLOCK_BYTES.is_multiple_of(STAMPED_SECTOR_BYTES));

/// The splitmix64 finalizer: a bijection on u64 whose outputs look independent.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The stamp ending sector `index` (from 0 at the batch's first block) of the batch whose
/// header has seq `first_seq`, in the file use with `salt`. Distinct for every (salt, seq,
/// sector), so a sector of another batch, another use of the file, or zeros does not carry it
/// (but by a 2^-64 chance).
pub fn sector_stamp(salt: u64, first_seq: u64, index: u64) -> u64 {
    mix64(mix64(mix64(salt) ^ first_seq) ^ index)
}

/// Whether a stored stamp counts as the expected one: equal, or off by at most
/// [`STAMP_ROT_BITS_MAX`] bits (the stamp itself rotted).
pub fn stamp_matches(stored: u64, expected: u64) -> bool {
    (stored ^ expected).count_ones() <= STAMP_ROT_BITS_MAX
}

/// Bytes a batch of `logical_len` bytes takes on disk in a version 3 file: whole stamped
/// sectors of [`SECTOR_DATA_BYTES`] each, rounded up to a 4 KiB block (0 for 0).
pub fn stamped_len(logical_len: usize) -> usize {
    let sectors = logical_len.div_ceil(SECTOR_DATA_BYTES);
    sectors.div_ceil(SECTORS_PER_BLOCK) * BLOCK_BYTES
}

/// The on-disk offset, from the batch's start, of logical batch byte `offset`.
pub fn stamped_offset(offset: usize) -> usize {
    offset / SECTOR_DATA_BYTES * STAMPED_SECTOR_BYTES + offset % SECTOR_DATA_BYTES
}

/// Lays out a batch's logical bytes (records as encoded, no padding) for a version 3 file into
/// `out` (replacing its contents): [`SECTOR_DATA_BYTES`] bytes then the stamp
/// [`sector_stamp`]`(salt, first_seq, i)` in every sector `i`, zero-padded and stamped up to a
/// whole 4 KiB block, so every sector of the write carries the stamp. Inverse:
/// [`unstamp_sectors`].
pub fn stamp_batch(logical: &[u8], salt: u64, first_seq: u64, out: &mut Vec<u8>) {
    out.clear();
    out.resize(stamped_len(logical.len()), 0);
    for (i, sector) in out.chunks_exact_mut(STAMPED_SECTOR_BYTES).enumerate() {
        let from = (i * SECTOR_DATA_BYTES).min(logical.len());
        let to = (from + SECTOR_DATA_BYTES).min(logical.len());
        sector[..to - from].copy_from_slice(&logical[from..to]);
        let stamp = sector_stamp(salt, first_seq, i as u64);
        sector[SECTOR_DATA_BYTES..].copy_from_slice(&stamp.to_le_bytes());
    }
}

/// The logical bytes of stamped sectors `stamped` (the inverse of [`stamp_batch`], padding
/// included): the first [`SECTOR_DATA_BYTES`] of every sector, appended to `out`. A trailing
/// part-sector (a file cut short) gives its bytes up to the stamp's place.
pub fn unstamp_sectors(stamped: &[u8], out: &mut Vec<u8>) {
    out.reserve(stamped.len() / STAMPED_SECTOR_BYTES * SECTOR_DATA_BYTES + SECTOR_DATA_BYTES);
    for sector in stamped.chunks(STAMPED_SECTOR_BYTES) {
        out.extend_from_slice(&sector[..sector.len().min(SECTOR_DATA_BYTES)]);
    }
}

/// The stamp stored at the end of sector `index` of `stamped` (a batch's bytes from its first
/// block), `None` past the end.
pub fn stored_stamp(stamped: &[u8], index: usize) -> Option<u64> {
    let end = (index + 1) * STAMPED_SECTOR_BYTES;
    let b = stamped.get(end - SECTOR_STAMP_BYTES..end)?;
    Some(u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// How many sectors from the start of `stamped` in a row carry the stamps of the batch with
/// header seq `first_seq` in the file use with `salt` (each [`stamp_matches`]).
pub fn stamped_run(stamped: &[u8], salt: u64, first_seq: u64) -> usize {
    (0..)
        .take_while(|&i| {
            stored_stamp(stamped, i)
                .is_some_and(|s| stamp_matches(s, sector_stamp(salt, first_seq, i as u64)))
        })
        .count()
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
        // Goal: version 3 (and 2) headers round-trip with their salt, version 1 headers read
        // with no salt, damage and unknown versions are refused.
        let h = encode_journal_header(9, 77);
        assert_eq!(
            decode_journal_header(&h),
            JournalHeader::Ok {
                file_id: 9,
                salt: JournalSalt::stamped(77)
            }
        );
        assert_eq!(
            decode_journal_header(&encode_journal_header_version(9, 77, 2)),
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
        let mut v4 = h;
        v4[8] = 4;
        let crc = crc32c::crc32c(&v4[..32]);
        v4[32..36].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_journal_header(&v4), JournalHeader::Unsupported(4));
    }

    /// A batch's logical bytes: a header and adds of `sizes` data bytes, as the writer encodes.
    fn logical_batch(salt: &JournalSalt, first_seq: u64, sizes: &[usize]) -> Vec<u8> {
        let mut body = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let rec = Record::Add {
                ledger: 1,
                entry: i as u64,
                lac: None,
                recovery: false,
                master_key: [3; 20],
                data: (0..n).map(|x| (x * 7 + i) as u8).collect(),
            };
            encode_record(&mut body, first_seq + 1 + i as u64, &rec, salt);
        }
        let mut b = Vec::new();
        let header = Record::BatchHeader {
            record_count: sizes.len() as u32,
            batch_bytes: (RECORD_HEADER_BYTES + BATCH_HEADER_PAYLOAD_BYTES + body.len()) as u32,
        };
        encode_record(&mut b, first_seq, &header, salt);
        b.extend_from_slice(&body);
        b
    }

    #[test]
    fn stamped_sectors_round_trip_across_sectors_and_blocks() {
        // Goal: the version 3 layout is a pure transform with an exact inverse, every sector of
        // the write (padding too) carries its stamp, and records spanning sectors and blocks
        // decode from the inverse. Method: batches of several sizes (one record inside a
        // sector, one spanning sectors, one spanning blocks), stamp, check sizes and stamps,
        // unstamp, decode every record.
        let salt = JournalSalt::stamped(0x0bad_cafe);
        for sizes in [vec![5], vec![600, 10], vec![9000, 3, 4100]] {
            let logical = logical_batch(&salt, 40, &sizes);
            let mut disk = Vec::new();
            stamp_batch(&logical, 0x0bad_cafe, 40, &mut disk);
            assert_eq!(disk.len(), stamped_len(logical.len()));
            assert_eq!(disk.len() % BLOCK_BYTES, 0);
            assert!(disk.len() - stamped_len(logical.len() - 1) <= BLOCK_BYTES);
            let sectors = disk.len() / STAMPED_SECTOR_BYTES;
            assert_eq!(stamped_run(&disk, 0x0bad_cafe, 40), sectors);
            assert_eq!(stamped_run(&disk, 0x0bad_cafe, 41), 0);
            assert_eq!(stamped_run(&disk, 0x0bad_caff, 40), 0);
            let mut back = Vec::new();
            unstamp_sectors(&disk, &mut back);
            assert_eq!(back.len(), sectors * SECTOR_DATA_BYTES);
            assert_eq!(&back[..logical.len()], &logical[..]);
            assert!(back[logical.len()..].iter().all(|&b| b == 0));
            for (i, &b) in logical.iter().enumerate() {
                assert_eq!(disk[stamped_offset(i)], b, "logical byte {i}");
            }
            let mut q = RECORD_HEADER_BYTES + BATCH_HEADER_PAYLOAD_BYTES;
            for (i, &n) in sizes.iter().enumerate() {
                match decode_record(&back[q..], &salt) {
                    RecordDecode::Ok { seq, len, .. } => {
                        assert_eq!(seq, 41 + i as u64);
                        assert_eq!(len, RECORD_HEADER_BYTES + ADD_FIXED_BYTES + n);
                        q += len;
                    }
                    other => panic!("record {i}: {other:?}"),
                }
            }
            assert!(matches!(
                decode_record(&back[q..], &salt),
                RecordDecode::Zeros
            ));
        }
        assert_eq!(stamped_len(0), 0);
        assert_eq!(stamped_len(1), BLOCK_BYTES);
        assert_eq!(stamped_len(8 * SECTOR_DATA_BYTES), BLOCK_BYTES);
        assert_eq!(stamped_len(8 * SECTOR_DATA_BYTES + 1), 2 * BLOCK_BYTES);
    }

    #[test]
    fn a_stamp_with_a_few_rotten_bits_still_counts_but_another_does_not() {
        // Goal: rot of up to 3 bits in a stamp is still "stamped" (rot, not a torn write),
        // while the stamps of neighbouring seqs, sectors or salts and zeros never are.
        let s = sector_stamp(7, 100, 3);
        assert!(stamp_matches(s, s));
        assert!(stamp_matches(s ^ 0b1011 << 20, s));
        assert!(!stamp_matches(s ^ 0b1111 << 20, s));
        for other in [
            sector_stamp(7, 101, 3),
            sector_stamp(7, 100, 4),
            sector_stamp(8, 100, 3),
            0,
        ] {
            assert!(!stamp_matches(other, s), "{other:#x} vs {s:#x}");
        }
        // Among many neighbours, none comes within the rot tolerance.
        for seq in 0..2000u64 {
            for i in 0..4u64 {
                if (seq, i) != (100, 3) {
                    assert!(!stamp_matches(sector_stamp(7, seq, i), s));
                }
            }
        }
    }
}

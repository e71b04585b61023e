//! The record set: how many small records are packed into one ledger entry.
//!
//! Layout (all integers little-endian; `docs/format/record-set.md`):
//!
//! ```text
//! offset size field
//!  0     1    version              RECORD_SET_FORMAT_V1 = 1
//!  1     4    record_count         u32, >= 1
//!  5     8    segment_record_index u64, position in the segment of the first record (0-based)
//! 13     ..   records, each:  txid u64 | payload_len u32 | payload bytes
//! ```
//!
//! A control entry (version 2, DistributedLog's control record) holds no record: it is written
//! when a stream goes idle so that the LAC it carries makes the entries before it readable
//! without the writer (see [`encode_control`]):
//!
//! ```text
//!  0     1    version              RECORD_SET_FORMAT_V2_CONTROL = 2
//!  1     4    record_count         u32, = 0
//!  5     8    segment_record_index u64, records in the segment before this entry
//! 13     8    last_txid            u64, txid of the segment's last record before this entry
//! ```
//!
//! The entry digest (CRC32C) is added and checked by the ledger layer, so the record set carries
//! no checksum of its own.

use quire_wire::{Reader, WireError};

mod producer;
pub use producer::{
    ProducerRun, PRODUCER_RUNS_MAX, PRODUCER_RUN_COUNT_SIZE_BYTES, PRODUCER_RUN_SIZE_BYTES,
};

/// Version 1: the first layout.
pub const RECORD_SET_FORMAT_V1: u8 = 1;
/// Version 2: a control entry with no record, written to advance the LAC that bookies hold
/// past the last data entry when the stream goes idle (DistributedLog's control record).
pub const RECORD_SET_FORMAT_V2_CONTROL: u8 = 2;
/// Version 3: a header with flags and the packing time; written (in this build) for entries
/// that carry producer runs (flag [`FLAG_PRODUCER_RUNS`]).
pub const RECORD_SET_FORMAT_V3: u8 = 3;
/// Version 3 flag bit 2: producer runs follow the header ([`ProducerRun`]).
pub const FLAG_PRODUCER_RUNS: u8 = 0x04;
/// Bytes of the version 3 header: version, flags, count, segment record index, write time.
pub const RECORD_SET_V3_HEADER_SIZE_BYTES: usize = 22;
/// Oldest version readers accept.
pub const RECORD_SET_FORMAT_OLDEST_READABLE: u8 = RECORD_SET_FORMAT_V1;
/// Version writers produce for entries holding records (control entries are always
/// [`RECORD_SET_FORMAT_V2_CONTROL`]).
pub const RECORD_SET_FORMAT_CURRENT: u8 = RECORD_SET_FORMAT_V1;
/// Newest version readers accept.
pub const RECORD_SET_FORMAT_NEWEST_READABLE: u8 = RECORD_SET_FORMAT_V3;
/// Bytes of a control entry.
pub const CONTROL_ENTRY_SIZE_BYTES: usize = RECORD_SET_HEADER_SIZE_BYTES + 8;

/// Bytes of the record set header.
pub const RECORD_SET_HEADER_SIZE_BYTES: usize = 13;
/// Bytes each record adds besides its payload (txid and length).
pub const RECORD_HEADER_SIZE_BYTES: usize = 12;
/// Largest record payload: 1 MiB − 8 KiB (DistributedLog `MAX_LOGRECORD_SIZE`).
pub const RECORD_SIZE_BYTES_MAX: usize = 1024 * 1024 - 8 * 1024;
/// Largest entry payload, that is, encoded record set: 1 MiB − 4 KiB (DistributedLog
/// `MAX_LOGRECORDSET_SIZE`).
pub const ENTRY_SIZE_BYTES_MAX: usize = 1024 * 1024 - 4 * 1024;

// One maximal record must always fit in one entry on its own.
const _: () = assert!(
    RECORD_SET_HEADER_SIZE_BYTES + RECORD_HEADER_SIZE_BYTES + RECORD_SIZE_BYTES_MAX
        <= ENTRY_SIZE_BYTES_MAX
);
const _: () = assert!(RECORD_SIZE_BYTES_MAX == 1_040_384);

/// Bytes a record takes inside a record set.
pub fn encoded_record_size_bytes(payload_len: usize) -> usize {
    RECORD_HEADER_SIZE_BYTES + payload_len
}

/// Encodes a record set from `(txid, payload)` pairs.
///
/// # Panics
/// If `records` is empty, a payload exceeds [`RECORD_SIZE_BYTES_MAX`] or the set exceeds
/// [`ENTRY_SIZE_BYTES_MAX`]: callers validate and pack before encoding.
pub fn encode<'a, I>(segment_record_index: u64, records: I) -> Vec<u8>
where
    I: IntoIterator<Item = (u64, &'a [u8])>,
    I::IntoIter: Clone,
{
    let iter = records.into_iter();
    let count = iter.clone().count();
    assert!(count >= 1, "a record set holds at least one record");
    let size: usize = RECORD_SET_HEADER_SIZE_BYTES
        + iter
            .clone()
            .map(|(_, p)| encoded_record_size_bytes(p.len()))
            .sum::<usize>();
    assert!(
        size <= ENTRY_SIZE_BYTES_MAX,
        "record set of {size} bytes exceeds the entry limit"
    );
    let mut out = Vec::with_capacity(size);
    out.push(RECORD_SET_FORMAT_CURRENT);
    out.extend_from_slice(
        &u32::try_from(count)
            .expect("count bounded by entry size")
            .to_le_bytes(),
    );
    out.extend_from_slice(&segment_record_index.to_le_bytes());
    for (txid, payload) in iter {
        assert!(
            payload.len() <= RECORD_SIZE_BYTES_MAX,
            "record above the record limit"
        );
        out.extend_from_slice(&txid.to_le_bytes());
        out.extend_from_slice(&u32::try_from(payload.len()).expect("bounded").to_le_bytes());
        out.extend_from_slice(payload);
    }
    assert_eq!(out.len(), size);
    out
}

/// Encodes a version 3 record set carrying producer runs (flag [`FLAG_PRODUCER_RUNS`]):
/// `write_time_ms` is the owning proxy's wall clock when it packed the entry.
///
/// # Panics
/// As [`encode`]; also if `runs` is empty, too many, or does not fit the records.
pub fn encode_with_runs<'a, I>(
    segment_record_index: u64,
    write_time_ms: u64,
    runs: &[ProducerRun],
    records: I,
) -> Vec<u8>
where
    I: IntoIterator<Item = (u64, &'a [u8])>,
    I::IntoIter: Clone,
{
    let iter = records.into_iter();
    let count = iter.clone().count();
    assert!(count >= 1, "a record set holds at least one record");
    assert!(runs
        .iter()
        .all(|r| r.count >= 1 && (r.first_slot + r.count) as usize <= count));
    let size: usize = RECORD_SET_V3_HEADER_SIZE_BYTES
        + PRODUCER_RUN_COUNT_SIZE_BYTES
        + runs.len() * PRODUCER_RUN_SIZE_BYTES
        + iter
            .clone()
            .map(|(_, p)| encoded_record_size_bytes(p.len()))
            .sum::<usize>();
    assert!(
        size <= ENTRY_SIZE_BYTES_MAX,
        "record set of {size} bytes exceeds the entry limit"
    );
    let mut out = Vec::with_capacity(size);
    out.push(RECORD_SET_FORMAT_V3);
    out.push(FLAG_PRODUCER_RUNS);
    out.extend_from_slice(&(count as u32).to_le_bytes());
    out.extend_from_slice(&segment_record_index.to_le_bytes());
    out.extend_from_slice(&write_time_ms.to_le_bytes());
    producer::put_runs(&mut out, runs);
    for (txid, payload) in iter {
        assert!(payload.len() <= RECORD_SIZE_BYTES_MAX);
        out.extend_from_slice(&txid.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(payload);
    }
    assert_eq!(out.len(), size);
    out
}

/// Encodes a control entry: no record, `segment_record_index` records before it in the segment,
/// `last_txid` the txid of the last of them. Readers skip it; segment recovery takes the
/// segment's record count and last txid from it as from a data entry.
pub fn encode_control(segment_record_index: u64, last_txid: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(CONTROL_ENTRY_SIZE_BYTES);
    out.push(RECORD_SET_FORMAT_V2_CONTROL);
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&segment_record_index.to_le_bytes());
    out.extend_from_slice(&last_txid.to_le_bytes());
    assert_eq!(out.len(), CONTROL_ENTRY_SIZE_BYTES);
    out
}

/// One record borrowed from a decoded record set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef<'a> {
    /// The application's transaction id.
    pub txid: u64,
    /// The record's payload.
    pub payload: &'a [u8],
}

/// A decoded record set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSet<'a> {
    /// Position in the segment of the first record.
    pub segment_record_index: u64,
    /// The records, slot 0 first; empty for a control entry.
    pub records: Vec<RecordRef<'a>>,
    /// For a control entry: the txid of the segment's last record before it.
    pub control_last_txid: Option<u64>,
    /// Version 3 with [`FLAG_PRODUCER_RUNS`]: the producer sessions' runs; else empty.
    pub producer_runs: Vec<ProducerRun>,
}

impl RecordSet<'_> {
    /// The txid of the segment's last record up to and including this entry.
    pub fn last_txid(&self) -> Option<u64> {
        self.records
            .last()
            .map(|r| r.txid)
            .or(self.control_last_txid)
    }
}

/// Decodes a record set, checking every length against the buffer.
///
/// # Errors
/// `WireError::InvalidField` for an unknown version, a zero count in a data entry, a non-zero
/// count in a control entry or an oversized record; `Truncated` / `TrailingBytes` when the
/// lengths disagree with the buffer.
pub fn decode(buf: &[u8]) -> Result<RecordSet<'_>, WireError> {
    let mut r = Reader::new(buf, "record set");
    let version = r.u8()?;
    if !(RECORD_SET_FORMAT_OLDEST_READABLE..=RECORD_SET_FORMAT_NEWEST_READABLE).contains(&version) {
        return Err(WireError::InvalidField {
            what: "record set version",
        });
    }
    if version == RECORD_SET_FORMAT_V3 {
        return decode_v3(buf, r);
    }
    let count = r.u32()? as usize;
    if version == RECORD_SET_FORMAT_V2_CONTROL {
        if count != 0 {
            return Err(WireError::InvalidField {
                what: "control entry record count",
            });
        }
        let segment_record_index = r.u64()?;
        let last_txid = r.u64()?;
        r.finish()?;
        return Ok(RecordSet {
            segment_record_index,
            records: Vec::new(),
            control_last_txid: Some(last_txid),
            producer_runs: Vec::new(),
        });
    }
    if count == 0 {
        return Err(WireError::InvalidField {
            what: "record set count",
        });
    }
    // Each record needs at least its 12-byte header: refuse counts the buffer cannot hold before
    // allocating for them.
    if count > buf.len() / RECORD_HEADER_SIZE_BYTES {
        return Err(WireError::InvalidField {
            what: "record set count",
        });
    }
    let segment_record_index = r.u64()?;
    let mut records = Vec::with_capacity(count);
    for _ in 0..count {
        let txid = r.u64()?;
        let payload = r.len_prefixed(RECORD_SIZE_BYTES_MAX)?;
        records.push(RecordRef { txid, payload });
    }
    r.finish()?;
    Ok(RecordSet {
        segment_record_index,
        records,
        control_last_txid: None,
        producer_runs: Vec::new(),
    })
}

/// Decodes the rest of a version 3 set after its version byte.
fn decode_v3<'a>(buf: &'a [u8], mut r: Reader<'a>) -> Result<RecordSet<'a>, WireError> {
    let flags = r.u8()?;
    if flags & !FLAG_PRODUCER_RUNS != 0 {
        return Err(WireError::InvalidField {
            what: "record set flags",
        });
    }
    let count = r.u32()? as usize;
    if count == 0 || count > buf.len() / RECORD_HEADER_SIZE_BYTES {
        return Err(WireError::InvalidField {
            what: "record set count",
        });
    }
    let segment_record_index = r.u64()?;
    let _write_time_ms = r.u64()?;
    let producer_runs = if flags & FLAG_PRODUCER_RUNS != 0 {
        producer::get_runs(&mut r, count)?
    } else {
        Vec::new()
    };
    let mut records = Vec::with_capacity(count);
    for _ in 0..count {
        let txid = r.u64()?;
        let payload = r.len_prefixed(RECORD_SIZE_BYTES_MAX)?;
        records.push(RecordRef { txid, payload });
    }
    r.finish()?;
    Ok(RecordSet {
        segment_record_index,
        records,
        control_last_txid: None,
        producer_runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        // Goal: encode/decode preserve txids, payloads (including empty ones) and the index.
        let recs: Vec<(u64, Vec<u8>)> = vec![(1, b"a".to_vec()), (1, vec![]), (9, vec![7; 1000])];
        let buf = encode(42, recs.iter().map(|(t, p)| (*t, p.as_slice())));
        assert_eq!(buf.len(), 13 + 3 * 12 + 1 + 1000);
        assert_eq!(buf[0], 1);
        let set = decode(&buf).unwrap();
        assert_eq!(set.segment_record_index, 42);
        let back: Vec<(u64, Vec<u8>)> = set
            .records
            .iter()
            .map(|r| (r.txid, r.payload.to_vec()))
            .collect();
        assert_eq!(back, recs);
    }

    #[test]
    fn byte_layout_is_frozen() {
        // Goal: pin the documented layout; method: compare one tiny set byte by byte.
        let buf = encode(2, [(0x0102u64, &b"xy"[..])]);
        let expect: Vec<u8> = [
            &[1u8][..],
            &1u32.to_le_bytes(),
            &2u64.to_le_bytes(),
            &0x0102u64.to_le_bytes(),
            &2u32.to_le_bytes(),
            b"xy",
        ]
        .concat();
        assert_eq!(buf, expect);
    }

    #[test]
    fn maximal_record_fits_one_entry() {
        // Goal: the largest legal record packs alone into a legal entry.
        let big = vec![0u8; RECORD_SIZE_BYTES_MAX];
        let buf = encode(0, [(5, big.as_slice())]);
        assert!(buf.len() <= ENTRY_SIZE_BYTES_MAX);
        assert_eq!(
            decode(&buf).unwrap().records[0].payload.len(),
            RECORD_SIZE_BYTES_MAX
        );
    }

    #[test]
    fn control_entries_round_trip_and_are_checked() {
        // Goal: a control entry has the documented 21 bytes, decodes to no record with its
        // index and last txid, and malformed ones (a count, a cut, trailing bytes) are refused.
        let buf = encode_control(7, 0x0102);
        let expect: Vec<u8> = [
            &[2u8][..],
            &0u32.to_le_bytes(),
            &7u64.to_le_bytes(),
            &0x0102u64.to_le_bytes(),
        ]
        .concat();
        assert_eq!(buf, expect);
        let set = decode(&buf).unwrap();
        assert!(set.records.is_empty());
        assert_eq!(set.segment_record_index, 7);
        assert_eq!(set.last_txid(), Some(0x0102));
        for cut in 0..buf.len() {
            assert!(decode(&buf[..cut]).is_err(), "cut {cut}");
        }
        let mut v = buf.clone();
        v[1] = 1;
        assert!(decode(&v).is_err(), "a control entry holds no record");
        let mut v = buf.clone();
        v.push(0);
        assert!(decode(&v).is_err());
        let data = encode(3, [(9u64, &b"x"[..])]);
        assert_eq!(decode(&data).unwrap().last_txid(), Some(9));
    }

    #[test]
    fn producer_runs_round_trip_and_are_checked() {
        // Goal: a version 3 set with runs has the documented layout (common-s18 record set
        // v3: 22-byte header, flags bit 2, run count u16, 24 bytes a run), decodes to its
        // records and runs, and bad runs (overlap, past the last slot, session 0, empty,
        // unknown flag, every cut) are refused.
        let run = ProducerRun {
            session_id: 5,
            first_seq: 10,
            first_slot: 1,
            count: 2,
        };
        let recs = [(1u64, &b"a"[..]), (2, &b"bc"[..]), (3, &b""[..])];
        let buf = encode_with_runs(7, 99, &[run], recs);
        let expect: Vec<u8> = [
            &[3u8, 4][..],
            &3u32.to_le_bytes(),
            &7u64.to_le_bytes(),
            &99u64.to_le_bytes(),
            &1u16.to_le_bytes(),
            &5u64.to_le_bytes(),
            &10u64.to_le_bytes(),
            &1u32.to_le_bytes(),
            &2u32.to_le_bytes(),
        ]
        .concat();
        assert_eq!(&buf[..expect.len()], &expect[..]);
        let set = decode(&buf).unwrap();
        assert_eq!(set.segment_record_index, 7);
        assert_eq!(set.producer_runs, vec![run]);
        assert_eq!(set.records.len(), 3);
        assert_eq!(set.records[1].payload, b"bc");
        assert_eq!(set.last_txid(), Some(3));
        for cut in 0..buf.len() {
            assert!(decode(&buf[..cut]).is_err(), "cut {cut}");
        }
        let runs_at = RECORD_SET_V3_HEADER_SIZE_BYTES + 2;
        let patch = |at: usize, bytes: &[u8]| {
            let mut v = buf.clone();
            v[at..at + bytes.len()].copy_from_slice(bytes);
            v
        };
        // Session 0; an empty run; a run past the last slot; an unknown flag; no run.
        assert!(decode(&patch(runs_at, &0u64.to_le_bytes())).is_err());
        assert!(decode(&patch(runs_at + 20, &0u32.to_le_bytes())).is_err());
        assert!(decode(&patch(runs_at + 20, &3u32.to_le_bytes())).is_err());
        assert!(decode(&patch(1, &[0x84])).is_err());
        assert!(decode(&patch(runs_at - 2, &0u16.to_le_bytes())).is_err());
        // Overlapping runs.
        let two = [
            run,
            ProducerRun {
                first_slot: 2,
                count: 1,
                ..run
            },
        ];
        let mut v = encode_with_runs(
            7,
            99,
            &[
                run,
                ProducerRun {
                    first_slot: 0,
                    count: 1,
                    ..run
                },
            ],
            recs,
        );
        assert!(decode(&v).is_err(), "runs out of slot order");
        v = encode_with_runs(7, 99, &two[..1], recs);
        assert!(decode(&v).is_ok());
    }

    #[test]
    fn corrupt_sets_are_refused_without_panicking() {
        // Goal: hostile bytes give errors, never panics; method: every truncation, bad version,
        // huge count, trailing bytes, and a length field pointing past the end.
        let buf = encode(0, [(1u64, &b"hello"[..]), (2, &b"world"[..])]);
        for cut in 0..buf.len() {
            assert!(decode(&buf[..cut]).is_err(), "cut {cut}");
        }
        let mut v = buf.clone();
        v[0] = 9;
        assert!(decode(&v).is_err());
        let mut v = buf.clone();
        v[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&v).is_err());
        let mut v = buf.clone();
        v[1..5].copy_from_slice(&0u32.to_le_bytes());
        assert!(decode(&v).is_err());
        let mut v = buf.clone();
        v.push(0);
        assert!(decode(&v).is_err());
        let mut v = buf.clone();
        v[21..25].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&v).is_err());
        // Pseudo-random garbage.
        let mut x: u32 = 12345;
        for len in 0..200 {
            let g: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                    (x >> 24) as u8
                })
                .collect();
            let _ = decode(&g);
        }
    }
}

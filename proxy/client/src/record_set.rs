//! The record set: how many small records are packed into one ledger entry.
//!
//! Layout of version 3, the one writers produce (all integers little-endian;
//! `docs/format/record-set.md`):
//!
//! ```text
//! offset size field
//!  0     1    version              RECORD_SET_FORMAT_V3 = 3
//!  1     1    flags                bit0 LZ4 records section, bit1 end-of-stream marker, bit2
//!                                  producer runs; any other bit set: refused as corrupt
//!  2     4    record_count         u32; >= 1 in a data entry, 0 in a control entry or marker
//!  6     8    segment_record_index u64, position in the segment of the first record (0-based);
//!                                  records in the segment before it for a control entry/marker
//! 14     8    write_time_ms        u64, the owning proxy's wall clock (ms since the Unix epoch)
//!                                  when it packed the entry, never the client's; for a control
//!                                  entry or marker: the write time of the segment's last record
//!                                  before it
//! 22     ..   data entry: records, each  txid u64 | payload_len u32 | payload bytes
//!             control entry or end-of-stream marker (count 0): last_txid u64
//! ```
//!
//! Versions 1 (header `version | record_count u32 | segment_record_index u64`, then records)
//! and 2 (a control entry: `2 | 0u32 | index u64 | last_txid u64`) are still read; they carry
//! no write time ([`RecordSet::write_time_ms`] is `None`).
//!
//! A control entry (DistributedLog's control record) holds no record: it is written when a
//! stream goes idle so that the LAC it carries makes the entries before it readable without the
//! writer (see [`encode_control`]). The end-of-stream marker (DistributedLog's
//! `EndOfStream` record) is the last entry of a sealed stream ([`encode_end_of_stream`]).
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
/// Version 3: flags and the proxy's write time in the header; data entries, control entries
/// and the end-of-stream marker.
pub const RECORD_SET_FORMAT_V3: u8 = 3;
/// Oldest version readers accept.
pub const RECORD_SET_FORMAT_OLDEST_READABLE: u8 = RECORD_SET_FORMAT_V1;
/// Version writers produce, for every entry.
pub const RECORD_SET_FORMAT_CURRENT: u8 = RECORD_SET_FORMAT_V3;
/// Newest version readers accept.
pub const RECORD_SET_FORMAT_NEWEST_READABLE: u8 = RECORD_SET_FORMAT_V3;

/// Version 3 flag: the records section is an LZ4 block.
pub const FLAG_LZ4: u8 = 0x01;
/// Version 3 flag: the entry is the end-of-stream marker (no record; last txid follows).
pub const FLAG_END_OF_STREAM: u8 = 0x02;
/// Version 3 flag: producer runs follow the header ([`ProducerRun`]).
pub const FLAG_PRODUCER_RUNS: u8 = 0x04;
/// Flags this build understands; a set with any other bit is refused as corrupt.
/// [`FLAG_LZ4`] is understood by [`crate::compression::uncompress_entry`], which readers call
/// before [`decode`]; [`decode`] itself refuses a set still compressed.
pub const FLAGS_KNOWN: u8 = FLAG_LZ4 | FLAG_END_OF_STREAM | FLAG_PRODUCER_RUNS;

/// Bytes of the version 3 record set header.
pub const RECORD_SET_HEADER_SIZE_BYTES: usize = 22;
/// Bytes of the version 1 header (still read).
pub const RECORD_SET_HEADER_V1_SIZE_BYTES: usize = 13;
/// Bytes of a control entry or end-of-stream marker (version 3): header and last txid.
pub const CONTROL_ENTRY_SIZE_BYTES: usize = RECORD_SET_HEADER_SIZE_BYTES + 8;
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

/// The fixed part of a record set (version 3; versions 1 and 2 decode into it with flags 0 and
/// no write time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordSetHeader {
    /// Format version (1, 2 or 3).
    pub version: u8,
    /// Version 3 flags ([`FLAG_END_OF_STREAM`]...); 0 for older versions.
    pub flags: u8,
    /// Records in the entry; 0 for a control entry or the end-of-stream marker.
    pub record_count: u32,
    /// Position in the segment of the first record (records before it for count 0).
    pub segment_record_index: u64,
    /// The owning proxy's write time, ms since the Unix epoch (version 3 only).
    pub write_time_ms: Option<u64>,
}

impl RecordSetHeader {
    /// Appends the version 3 header (`version` is ignored: always 3).
    pub fn encode_v3(&self, out: &mut Vec<u8>) {
        out.push(RECORD_SET_FORMAT_V3);
        out.push(self.flags);
        out.extend_from_slice(&self.record_count.to_le_bytes());
        out.extend_from_slice(&self.segment_record_index.to_le_bytes());
        out.extend_from_slice(&self.write_time_ms.unwrap_or(0).to_le_bytes());
    }

    /// Reads a header of any readable version.
    ///
    /// # Errors
    /// `InvalidField` for an unknown version or an unknown flag; `Truncated`.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let version = r.u8()?;
        if !(RECORD_SET_FORMAT_OLDEST_READABLE..=RECORD_SET_FORMAT_NEWEST_READABLE)
            .contains(&version)
        {
            return Err(WireError::InvalidField {
                what: "record set version",
            });
        }
        let flags = if version == RECORD_SET_FORMAT_V3 {
            r.u8()?
        } else {
            0
        };
        if flags & !FLAGS_KNOWN != 0 {
            return Err(WireError::InvalidField {
                what: "record set flags",
            });
        }
        let record_count = r.u32()?;
        let segment_record_index = r.u64()?;
        let write_time_ms = if version == RECORD_SET_FORMAT_V3 {
            Some(r.u64()?)
        } else {
            None
        };
        Ok(Self {
            version,
            flags,
            record_count,
            segment_record_index,
            write_time_ms,
        })
    }
}

/// Encodes a data entry (version 3, flags 0) from `(txid, payload)` pairs, stamped with
/// `write_time_ms` (the proxy's wall clock when it packs the entry).
///
/// # Panics
/// If `records` is empty, a payload exceeds [`RECORD_SIZE_BYTES_MAX`] or the set exceeds
/// [`ENTRY_SIZE_BYTES_MAX`]: callers validate and pack before encoding.
pub fn encode<'a, I>(segment_record_index: u64, write_time_ms: u64, records: I) -> Vec<u8>
where
    I: IntoIterator<Item = (u64, &'a [u8])>,
    I::IntoIter: Clone,
{
    encode_with_runs(segment_record_index, write_time_ms, &[], records)
}

/// [`encode`] with producer runs ([`FLAG_PRODUCER_RUNS`] set when `runs` is not empty): which
/// slots hold which sequence numbers of which producer session.
///
/// # Panics
/// As [`encode`]; also if `runs` are too many or do not fit the records.
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
    let header = RecordSetHeader {
        version: RECORD_SET_FORMAT_V3,
        flags: if runs.is_empty() {
            0
        } else {
            FLAG_PRODUCER_RUNS
        },
        record_count: 0,
        segment_record_index,
        write_time_ms: Some(write_time_ms),
    };
    encode_records(header, runs, records)
}

/// Encodes a version 1 data entry (no flags, no write time), as writers before version 3 did:
/// for tests and tools that check that old entries stay readable.
///
/// # Panics
/// As [`encode`].
pub fn encode_v1<'a, I>(segment_record_index: u64, records: I) -> Vec<u8>
where
    I: IntoIterator<Item = (u64, &'a [u8])>,
    I::IntoIter: Clone,
{
    let header = RecordSetHeader {
        version: RECORD_SET_FORMAT_V1,
        flags: 0,
        record_count: 0,
        segment_record_index,
        write_time_ms: None,
    };
    encode_records(header, &[], records)
}

fn encode_records<'a, I>(mut header: RecordSetHeader, runs: &[ProducerRun], records: I) -> Vec<u8>
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
    let header_size = if header.version == RECORD_SET_FORMAT_V1 {
        RECORD_SET_HEADER_V1_SIZE_BYTES
    } else {
        RECORD_SET_HEADER_SIZE_BYTES
    };
    let runs_size = if runs.is_empty() {
        0
    } else {
        PRODUCER_RUN_COUNT_SIZE_BYTES + runs.len() * PRODUCER_RUN_SIZE_BYTES
    };
    let size: usize = header_size
        + runs_size
        + iter
            .clone()
            .map(|(_, p)| encoded_record_size_bytes(p.len()))
            .sum::<usize>();
    assert!(
        size <= ENTRY_SIZE_BYTES_MAX,
        "record set of {size} bytes exceeds the entry limit"
    );
    header.record_count = u32::try_from(count).expect("count bounded by entry size");
    let mut out = Vec::with_capacity(size);
    if header.version == RECORD_SET_FORMAT_V1 {
        out.push(RECORD_SET_FORMAT_V1);
        out.extend_from_slice(&header.record_count.to_le_bytes());
        out.extend_from_slice(&header.segment_record_index.to_le_bytes());
    } else {
        header.encode_v3(&mut out);
        if !runs.is_empty() {
            producer::put_runs(&mut out, runs);
        }
    }
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

/// Encodes a control entry (version 3, count 0, flags 0): `segment_record_index` records
/// before it in the segment, `last_txid` the txid of the last of them and `last_write_time_ms`
/// its write time. Readers skip it; segment recovery takes the segment's record count, last
/// txid and last write time from it as from a data entry.
pub fn encode_control(
    segment_record_index: u64,
    last_txid: u64,
    last_write_time_ms: u64,
) -> Vec<u8> {
    encode_empty(0, segment_record_index, last_txid, last_write_time_ms)
}

/// Encodes the end-of-stream marker (version 3, count 0, [`FLAG_END_OF_STREAM`]): the last
/// entry of a sealed stream (DistributedLog's `EndOfStream` control record). Fields as in
/// [`encode_control`].
pub fn encode_end_of_stream(
    segment_record_index: u64,
    last_txid: u64,
    last_write_time_ms: u64,
) -> Vec<u8> {
    encode_empty(
        FLAG_END_OF_STREAM,
        segment_record_index,
        last_txid,
        last_write_time_ms,
    )
}

fn encode_empty(flags: u8, index: u64, last_txid: u64, write_time_ms: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(CONTROL_ENTRY_SIZE_BYTES);
    RecordSetHeader {
        version: RECORD_SET_FORMAT_V3,
        flags,
        record_count: 0,
        segment_record_index: index,
        write_time_ms: Some(write_time_ms),
    }
    .encode_v3(&mut out);
    out.extend_from_slice(&last_txid.to_le_bytes());
    assert_eq!(out.len(), CONTROL_ENTRY_SIZE_BYTES);
    out
}

/// Encodes a version 2 control entry, as writers before version 3 did (tests and tools).
pub fn encode_control_v2(segment_record_index: u64, last_txid: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_SET_HEADER_V1_SIZE_BYTES + 8);
    out.push(RECORD_SET_FORMAT_V2_CONTROL);
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&segment_record_index.to_le_bytes());
    out.extend_from_slice(&last_txid.to_le_bytes());
    out
}

/// An entry's payload as read from its ledger, made ready for [`decode`]: an LZ4-compressed
/// one ([`FLAG_LZ4`]) decompressed (bounded by [`ENTRY_SIZE_BYTES_MAX`] before allocating),
/// any other borrowed as it is. Every reader of stream entries calls this, so compression is
/// transparent to them (DistributedLog's `EnvelopedEntry` reader decompresses the same way).
///
/// # Errors
/// `WireError::InvalidField` ("compressed records", "record set header") for a compressed
/// entry that does not decompress to its stated size within the limit: a corrupt entry.
pub fn decode_entry(payload: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, WireError> {
    crate::compression::uncompress_entry(payload, ENTRY_SIZE_BYTES_MAX)
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
    /// The records, slot 0 first; empty for a control entry or the end-of-stream marker.
    pub records: Vec<RecordRef<'a>>,
    /// For a control entry or the marker: the txid of the segment's last record before it.
    pub control_last_txid: Option<u64>,
    /// Version 3: the proxy's write time of the records (for a control entry or the marker:
    /// of the segment's last record before it), ms since the Unix epoch. `None` for versions
    /// 1 and 2, which carry none.
    pub write_time_ms: Option<u64>,
    /// True for the end-of-stream marker ([`FLAG_END_OF_STREAM`]).
    pub end_of_stream: bool,
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

/// Decodes a record set of any readable version, checking every length against the buffer.
/// An entry read from a ledger goes through [`decode_entry`] (or
/// [`crate::compression::uncompress_entry`]) first: a set whose records are still
/// LZ4-compressed ([`FLAG_LZ4`]) is refused here, never misread.
///
/// # Errors
/// `WireError::InvalidField` for an unknown version or flag, a set still compressed, a zero
/// count in a data entry, a non-zero count in a control entry or marker or an oversized
/// record; `Truncated` / `TrailingBytes` when the lengths disagree with the buffer.
pub fn decode(buf: &[u8]) -> Result<RecordSet<'_>, WireError> {
    let mut r = Reader::new(buf, "record set");
    let h = RecordSetHeader::decode(&mut r)?;
    if h.flags & FLAG_LZ4 != 0 {
        return Err(WireError::InvalidField {
            what: "record set still LZ4-compressed",
        });
    }
    let count = h.record_count as usize;
    let empty_kind = h.version == RECORD_SET_FORMAT_V2_CONTROL
        || h.flags & FLAG_END_OF_STREAM != 0
        || (h.version == RECORD_SET_FORMAT_V3 && count == 0);
    if empty_kind {
        if count != 0 || h.flags & FLAG_PRODUCER_RUNS != 0 {
            return Err(WireError::InvalidField {
                what: "control entry record count",
            });
        }
        let last_txid = r.u64()?;
        r.finish()?;
        return Ok(RecordSet {
            segment_record_index: h.segment_record_index,
            records: Vec::new(),
            control_last_txid: Some(last_txid),
            write_time_ms: h.write_time_ms,
            end_of_stream: h.flags & FLAG_END_OF_STREAM != 0,
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
    let producer_runs = if h.flags & FLAG_PRODUCER_RUNS != 0 {
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
        segment_record_index: h.segment_record_index,
        records,
        control_last_txid: None,
        write_time_ms: h.write_time_ms,
        end_of_stream: false,
        producer_runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        // Goal: encode/decode preserve txids, payloads (including empty ones), the index and
        // the write time.
        let recs: Vec<(u64, Vec<u8>)> = vec![(1, b"a".to_vec()), (1, vec![]), (9, vec![7; 1000])];
        let buf = encode(
            42,
            1_700_000_000_123,
            recs.iter().map(|(t, p)| (*t, p.as_slice())),
        );
        assert_eq!(buf.len(), 22 + 3 * 12 + 1 + 1000);
        assert_eq!(buf[0], 3);
        let set = decode(&buf).unwrap();
        assert_eq!(set.segment_record_index, 42);
        assert_eq!(set.write_time_ms, Some(1_700_000_000_123));
        assert!(!set.end_of_stream);
        let back: Vec<(u64, Vec<u8>)> = set
            .records
            .iter()
            .map(|r| (r.txid, r.payload.to_vec()))
            .collect();
        assert_eq!(back, recs);
    }

    #[test]
    fn byte_layout_is_frozen() {
        // Goal: pin the documented layouts (v3 written, v1 still read); method: compare one
        // tiny set byte by byte, and decode a hand-made v1 set.
        let buf = encode(2, 0x0a0b, [(0x0102u64, &b"xy"[..])]);
        let expect: Vec<u8> = [
            &[3u8, 0][..],
            &1u32.to_le_bytes(),
            &2u64.to_le_bytes(),
            &0x0a0bu64.to_le_bytes(),
            &0x0102u64.to_le_bytes(),
            &2u32.to_le_bytes(),
            b"xy",
        ]
        .concat();
        assert_eq!(buf, expect);
        let v1: Vec<u8> = [
            &[1u8][..],
            &1u32.to_le_bytes(),
            &2u64.to_le_bytes(),
            &0x0102u64.to_le_bytes(),
            &2u32.to_le_bytes(),
            b"xy",
        ]
        .concat();
        assert_eq!(encode_v1(2, [(0x0102u64, &b"xy"[..])]), v1);
        let set = decode(&v1).unwrap();
        assert_eq!(set.write_time_ms, None, "v1 carries no write time");
        assert_eq!(set.records, decode(&buf).unwrap().records);
    }

    #[test]
    fn maximal_record_fits_one_entry() {
        // Goal: the largest legal record packs alone into a legal entry.
        let big = vec![0u8; RECORD_SIZE_BYTES_MAX];
        let buf = encode(0, 1, [(5, big.as_slice())]);
        assert!(buf.len() <= ENTRY_SIZE_BYTES_MAX);
        assert_eq!(
            decode(&buf).unwrap().records[0].payload.len(),
            RECORD_SIZE_BYTES_MAX
        );
    }

    #[test]
    fn control_entries_round_trip_and_are_checked() {
        // Goal: a v3 control entry has the documented 30 bytes, decodes to no record with its
        // index, last txid and last write time; v2 ones still decode; malformed ones (a count,
        // a cut, trailing bytes) are refused.
        let buf = encode_control(7, 0x0102, 99);
        let expect: Vec<u8> = [
            &[3u8, 0][..],
            &0u32.to_le_bytes(),
            &7u64.to_le_bytes(),
            &99u64.to_le_bytes(),
            &0x0102u64.to_le_bytes(),
        ]
        .concat();
        assert_eq!(buf, expect);
        let set = decode(&buf).unwrap();
        assert!(set.records.is_empty() && !set.end_of_stream);
        assert_eq!(set.segment_record_index, 7);
        assert_eq!(set.last_txid(), Some(0x0102));
        assert_eq!(set.write_time_ms, Some(99));
        let v2 = encode_control_v2(7, 0x0102);
        assert_eq!(v2.len(), 21);
        let old = decode(&v2).unwrap();
        assert_eq!((old.last_txid(), old.write_time_ms), (Some(0x0102), None));
        for b in [&buf, &v2] {
            for cut in 0..b.len() {
                assert!(decode(&b[..cut]).is_err(), "cut {cut}");
            }
            let mut v = b.to_vec();
            v.push(0);
            assert!(decode(&v).is_err());
        }
        let mut v = v2.clone();
        v[1] = 1;
        assert!(decode(&v).is_err(), "a control entry holds no record");
        let data = encode(3, 5, [(9u64, &b"x"[..])]);
        assert_eq!(decode(&data).unwrap().last_txid(), Some(9));
    }

    #[test]
    fn end_of_stream_marker_round_trips_and_is_checked() {
        // Goal: the marker sets flag bit1, holds no record, carries last txid and write time;
        // a marker with a record count is refused.
        let buf = encode_end_of_stream(12, 77, 1234);
        assert_eq!(buf[1], FLAG_END_OF_STREAM);
        assert_eq!(buf.len(), CONTROL_ENTRY_SIZE_BYTES);
        let set = decode(&buf).unwrap();
        assert!(set.end_of_stream && set.records.is_empty());
        assert_eq!(
            (set.segment_record_index, set.last_txid(), set.write_time_ms),
            (12, Some(77), Some(1234))
        );
        let mut v = buf.clone();
        v[2..6].copy_from_slice(&1u32.to_le_bytes());
        assert!(decode(&v).is_err());
    }

    #[test]
    fn unknown_flags_are_refused() {
        // Goal: a v3 set with a flag this build does not know (reserved bits) is corrupt to
        // it: refused, not misread.
        let buf = encode(0, 1, [(1u64, &b"x"[..])]);
        for bit in 0..8u8 {
            let flag = 1u8 << bit;
            if flag & FLAGS_KNOWN != 0 {
                continue;
            }
            let mut v = buf.clone();
            v[1] = flag;
            assert_eq!(
                decode(&v),
                Err(WireError::InvalidField {
                    what: "record set flags"
                }),
                "flag {flag:#x}"
            );
        }
    }

    #[test]
    fn compressed_entries_decode_through_decode_entry_only() {
        // Goal: an LZ4 entry (flag bit0, now known) decodes to the plain entry's records after
        // `decode_entry`; `decode` on the still-compressed bytes is refused, not misread; a
        // corrupt block and an uncompressed_len above the entry limit are errors.
        let line = b"081109 203615 148 INFO dfs.DataNode$PacketResponder: terminating";
        let recs: Vec<(u64, &[u8])> = (0..100).map(|t| (t, &line[..])).collect();
        let plain = encode(4, 99, recs.iter().copied());
        let packed = crate::compression::compress_entry(&plain).expect("compressible");
        assert_eq!(packed[1], FLAG_LZ4);
        assert_eq!(
            decode(&packed),
            Err(WireError::InvalidField {
                what: "record set still LZ4-compressed"
            })
        );
        let back = decode_entry(&packed).unwrap();
        assert_eq!(decode(&back).unwrap(), decode(&plain).unwrap());
        assert!(matches!(
            decode_entry(&plain).unwrap(),
            std::borrow::Cow::Borrowed(_)
        ));
        // A flipped byte inside the LZ4 block: an error or the declared length, never a panic.
        let at = RECORD_SET_HEADER_SIZE_BYTES + 4;
        for i in at..packed.len() {
            let mut bad = packed.clone();
            bad[i] ^= 0xff;
            if let Ok(p) = decode_entry(&bad) {
                assert_eq!(p.len(), plain.len());
            }
        }
        // A cut block.
        assert!(decode_entry(&packed[..packed.len() - 3]).is_err());
        // uncompressed_len above the entry limit: refused before allocating.
        let mut huge = packed.clone();
        let len = (ENTRY_SIZE_BYTES_MAX as u32).to_le_bytes();
        huge[RECORD_SET_HEADER_SIZE_BYTES..at].copy_from_slice(&len);
        assert_eq!(
            decode_entry(&huge),
            Err(WireError::InvalidField {
                what: "compressed records"
            })
        );
        huge[RECORD_SET_HEADER_SIZE_BYTES..at].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_entry(&huge).is_err());
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
        let runs_at = RECORD_SET_HEADER_SIZE_BYTES + 2;
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
        // huge count, trailing bytes, and a length field pointing past the end, for v3 and v1.
        for (buf, count_at, len_at) in [
            (
                encode(0, 1, [(1u64, &b"hello"[..]), (2, &b"world"[..])]),
                2usize,
                30usize,
            ),
            (
                encode_v1(0, [(1u64, &b"hello"[..]), (2, &b"world"[..])]),
                1,
                21,
            ),
        ] {
            for cut in 0..buf.len() {
                assert!(decode(&buf[..cut]).is_err(), "cut {cut}");
            }
            let mut v = buf.clone();
            v[0] = 9;
            assert!(decode(&v).is_err());
            let mut v = buf.clone();
            v[count_at..count_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
            assert!(decode(&v).is_err());
            let mut v = buf.clone();
            v.push(0);
            assert!(decode(&v).is_err());
            let mut v = buf.clone();
            v[len_at..len_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
            assert!(decode(&v).is_err());
        }
        let mut v = encode_v1(0, [(1u64, &b"x"[..])]);
        v[1..5].copy_from_slice(&0u32.to_le_bytes());
        assert!(decode(&v).is_err(), "a v1 set holds at least one record");
        // Pseudo-random garbage, with each version byte in front.
        let mut x: u32 = 12345;
        for len in 0..400 {
            let mut g: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                    (x >> 24) as u8
                })
                .collect();
            if let Some(first) = g.first_mut() {
                *first = (len % 4) as u8;
            }
            let _ = decode(&g);
        }
    }
}

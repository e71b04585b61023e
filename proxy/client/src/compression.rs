//! LZ4 compression of a record set's records section (record set version 3, flag bit0;
//! `docs/format/record-set.md`). DistributedLog compresses its record sets with LZ4 the same
//! way (`CompressionCodec.Type.LZ4`, flagged in the record set's header); the codec is
//! lz4_flex's block format in its safe, bounds-checked mode.
//!
//! The compressed form of a records section is:
//!
//! ```text
//! 0   uncompressed_len u32   bytes of the records section before compression
//! 4   LZ4 block              (https://github.com/lz4/lz4/blob/dev/doc/lz4_Block_format.md)
//! ```
//!
//! Decompression checks `uncompressed_len` against the caller's limit (the record-set limit)
//! before allocating, and a block that does not decode to exactly that many bytes is refused:
//! bad input is a [`WireError`], never a panic or an unbounded allocation.

use quire_wire::WireError;

/// Record set flag (version 3, byte 1): the records section is LZ4-compressed.
pub const RECORD_SET_FLAG_LZ4: u8 = 0x01;
/// Bytes before the LZ4 block: `uncompressed_len` u32.
pub const COMPRESSED_HEADER_SIZE_BYTES: usize = 4;

/// How a writer stores record sets: as they are, or LZ4-compressed (per write, WRITE flag
/// 0x04, or per stream through the proxy's `[streams] compression` default).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Records stored as they are (the default).
    #[default]
    None,
    /// Records section LZ4-compressed.
    Lz4,
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Compression::None => "none",
            Compression::Lz4 => "lz4",
        })
    }
}

impl std::str::FromStr for Compression {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            other => Err(format!(
                "compression {other:?} is neither \"none\" nor \"lz4\""
            )),
        }
    }
}

/// A stream's compression setting on the wire (`SET_COMPRESSION` request and answer, one
/// byte): 0 = follow the owning proxy's default (`None`), 1 = `none`, 2 = `lz4`.
pub fn setting_byte(setting: Option<Compression>) -> u8 {
    match setting {
        None => 0,
        Some(Compression::None) => 1,
        Some(Compression::Lz4) => 2,
    }
}

/// Reads a [`setting_byte`].
///
/// # Errors
/// `WireError::InvalidField` ("compression setting") for any other byte.
pub fn setting_from_byte(b: u8) -> Result<Option<Compression>, WireError> {
    match b {
        0 => Ok(None),
        1 => Ok(Some(Compression::None)),
        2 => Ok(Some(Compression::Lz4)),
        _ => Err(WireError::InvalidField {
            what: "compression setting",
        }),
    }
}

/// `DESCRIBE_STREAM` answer flag: the stream's own setting is `lz4`.
pub const FLAG_DESCRIBE_COMPRESSION_LZ4: u8 = 0x02;
/// `DESCRIBE_STREAM` answer flag: the stream's own setting is `none`. Neither flag: it follows
/// the owning proxy's default (also every answer of a proxy before per-stream compression).
pub const FLAG_DESCRIBE_COMPRESSION_NONE: u8 = 0x04;

/// The `DESCRIBE_STREAM` answer flags for a stream's setting.
pub fn describe_flags(setting: Option<Compression>) -> u8 {
    match setting {
        None => 0,
        Some(Compression::None) => FLAG_DESCRIBE_COMPRESSION_NONE,
        Some(Compression::Lz4) => FLAG_DESCRIBE_COMPRESSION_LZ4,
    }
}

/// A stream's setting from `DESCRIBE_STREAM` answer flags.
///
/// # Errors
/// `WireError::InvalidField` ("compression flags") when both flags are set.
pub fn setting_from_describe_flags(flags: u8) -> Result<Option<Compression>, WireError> {
    let lz4 = flags & FLAG_DESCRIBE_COMPRESSION_LZ4 != 0;
    match (lz4, flags & FLAG_DESCRIBE_COMPRESSION_NONE != 0) {
        (true, true) => Err(WireError::InvalidField {
            what: "compression flags",
        }),
        (true, false) => Ok(Some(Compression::Lz4)),
        (false, true) => Ok(Some(Compression::None)),
        (false, false) => Ok(None),
    }
}

/// Compresses a records section: `uncompressed_len` u32 then the LZ4 block.
///
/// # Panics
/// If `records` is 4 GiB or more (record sets are bounded far below).
pub fn compress_records(records: &[u8]) -> Vec<u8> {
    let len = u32::try_from(records.len()).expect("a records section is below 4 GiB");
    let bound = lz4_flex::block::get_maximum_output_size(records.len());
    let mut out = vec![0u8; COMPRESSED_HEADER_SIZE_BYTES + bound];
    out[..COMPRESSED_HEADER_SIZE_BYTES].copy_from_slice(&len.to_le_bytes());
    let n = lz4_flex::block::compress_into(records, &mut out[COMPRESSED_HEADER_SIZE_BYTES..])
        .expect("the output holds the LZ4 bound");
    out.truncate(COMPRESSED_HEADER_SIZE_BYTES + n);
    out
}

/// Decompresses what [`compress_records`] made, refusing an `uncompressed_len` above `limit`
/// before allocating.
///
/// # Errors
/// `WireError::InvalidField` ("compressed records") for a length above `limit`, a short
/// header, a block that does not decode, or one that decodes to another length.
pub fn decompress_records(compressed: &[u8], limit: usize) -> Result<Vec<u8>, WireError> {
    let bad = || WireError::InvalidField {
        what: "compressed records",
    };
    let (len, block) = compressed
        .split_first_chunk::<COMPRESSED_HEADER_SIZE_BYTES>()
        .ok_or_else(bad)?;
    let len = u32::from_le_bytes(*len) as usize;
    if len > limit {
        return Err(bad());
    }
    let mut out = vec![0u8; len];
    let n = lz4_flex::block::decompress_into(block, &mut out).map_err(|_| bad())?;
    if n != len {
        return Err(bad());
    }
    Ok(out)
}

/// Record set version whose flags byte (offset 1) can carry [`RECORD_SET_FLAG_LZ4`].
pub const RECORD_SET_FORMAT_V3: u8 = 3;
/// Bytes of the version 3 header: version u8, flags u8, record_count u32,
/// segment_record_index u64, write_time_ms u64.
pub const RECORD_SET_V3_HEADER_SIZE_BYTES: usize = 22;
/// Version 3 flag: producer runs follow the header (their bytes stay uncompressed).
const RECORD_SET_FLAG_PRODUCER_RUNS: u8 = 0x04;
/// Bytes of one producer run (session_id u64, first_seq u64, first_slot u32, count u32).
const PRODUCER_RUN_SIZE_BYTES: usize = 24;

/// Where a version 3 entry's records section starts: after the header and, with flag bit2,
/// the producer runs.
fn records_offset(entry: &[u8]) -> Result<usize, WireError> {
    let bad = || WireError::InvalidField {
        what: "record set header",
    };
    let header = entry
        .get(..RECORD_SET_V3_HEADER_SIZE_BYTES)
        .ok_or_else(bad)?;
    if header[1] & RECORD_SET_FLAG_PRODUCER_RUNS == 0 {
        return Ok(RECORD_SET_V3_HEADER_SIZE_BYTES);
    }
    let count = entry
        .get(RECORD_SET_V3_HEADER_SIZE_BYTES..RECORD_SET_V3_HEADER_SIZE_BYTES + 2)
        .ok_or_else(bad)?;
    let runs = usize::from(u16::from_le_bytes([count[0], count[1]]));
    let end = RECORD_SET_V3_HEADER_SIZE_BYTES + 2 + runs * PRODUCER_RUN_SIZE_BYTES;
    if end > entry.len() {
        return Err(bad());
    }
    Ok(end)
}

/// The LZ4-compressed form of a plain version 3 entry (flag bit0 clear): the header and
/// producer runs as they are, flag bit0 set, the records section compressed. `None` when
/// compression would not make the entry smaller (it is then stored plain: incompressible
/// payloads never grow an entry past the record-set limit), or the entry is not a plain v3 one.
pub fn compress_entry(plain: &[u8]) -> Option<Vec<u8>> {
    if plain.first() != Some(&RECORD_SET_FORMAT_V3)
        || plain.get(1).is_none_or(|f| f & RECORD_SET_FLAG_LZ4 != 0)
    {
        return None;
    }
    let at = records_offset(plain).ok()?;
    let records = compress_records(&plain[at..]);
    if at + records.len() >= plain.len() {
        return None;
    }
    let mut out = Vec::with_capacity(at + records.len());
    out.extend_from_slice(&plain[..at]);
    out[1] |= RECORD_SET_FLAG_LZ4;
    out.extend_from_slice(&records);
    Some(out)
}

/// The entry as record-set decoding reads it: a version 3 entry with flag bit0 comes back
/// with its records section decompressed and the flag cleared (readers see the same records
/// as if it had been written plain); every other entry is borrowed as it is. The uncompressed
/// section may not exceed `entry_limit` less the bytes before it.
///
/// # Errors
/// `WireError::InvalidField` for a header cut short or compressed records that do not decode
/// (a corrupt entry; nothing is allocated beyond the limit).
pub fn uncompress_entry(
    entry: &[u8],
    entry_limit: usize,
) -> Result<std::borrow::Cow<'_, [u8]>, WireError> {
    if entry.first() != Some(&RECORD_SET_FORMAT_V3)
        || entry.get(1).is_none_or(|f| f & RECORD_SET_FLAG_LZ4 == 0)
    {
        return Ok(std::borrow::Cow::Borrowed(entry));
    }
    let at = records_offset(entry)?;
    let records = decompress_records(&entry[at..], entry_limit.saturating_sub(at))?;
    let mut out = Vec::with_capacity(at + records.len());
    out.extend_from_slice(&entry[..at]);
    out[1] &= !RECORD_SET_FLAG_LZ4;
    out.extend_from_slice(&records);
    Ok(std::borrow::Cow::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Incompressible bytes (xorshift64).
    fn noise(n: usize) -> Vec<u8> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect()
    }

    fn records_section(lines: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            out.extend_from_slice(&(i as u64).to_le_bytes());
            out.extend_from_slice(&(l.len() as u32).to_le_bytes());
            out.extend_from_slice(l);
        }
        out
    }

    #[test]
    fn round_trip_and_ratio() {
        // Goal: compress/decompress round-trips repetitive log lines (smaller), random bytes
        // (at most slightly larger) and the empty section.
        let log: Vec<&[u8]> = vec![b"081109 203615 148 INFO dfs.DataNode$PacketResponder: PacketResponder 1 for block blk_38865049064139660 terminating"; 200];
        let section = records_section(&log);
        let c = compress_records(&section);
        assert!(
            c.len() * 5 < section.len(),
            "{} -> {}",
            section.len(),
            c.len()
        );
        assert_eq!(decompress_records(&c, section.len()).unwrap(), section);
        let random = noise(10_000);
        let c = compress_records(&random);
        assert!(c.len() <= random.len() + random.len() / 200 + 32);
        assert_eq!(decompress_records(&c, random.len()).unwrap(), random);
        assert_eq!(
            decompress_records(&compress_records(&[]), 0).unwrap(),
            Vec::<u8>::new()
        );
    }

    #[test]
    fn corrupt_input_is_an_error_never_a_panic() {
        // Goal: a length above the limit is refused before allocating; truncated, flipped and
        // garbage blocks are errors; a block decoding to another length is refused.
        let section = records_section(&[&b"hello hello hello hello"[..]; 50]);
        let c = compress_records(&section);
        assert!(decompress_records(&c, section.len() - 1).is_err());
        let mut huge = c.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decompress_records(&huge, 1 << 20).is_err());
        for cut in 0..c.len() {
            assert!(decompress_records(&c[..cut], 1 << 20).is_err(), "cut {cut}");
        }
        let mut longer = c.clone();
        longer[..4].copy_from_slice(&((section.len() + 1) as u32).to_le_bytes());
        assert!(decompress_records(&longer, 1 << 20).is_err());
        // Every single-byte change either fails or decodes to the declared length.
        for i in 4..c.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut bad = c.clone();
                bad[i] ^= flip;
                if let Ok(out) = decompress_records(&bad, 1 << 20) {
                    assert_eq!(out.len(), section.len());
                }
            }
        }
        let garbage: Vec<u8> = (0..500u32).map(|i| (i * 7919 % 251) as u8).collect();
        let mut g = (400u32).to_le_bytes().to_vec();
        g.extend_from_slice(&garbage);
        let _ = decompress_records(&g, 1 << 20);
        assert_eq!("lz4".parse::<Compression>(), Ok(Compression::Lz4));
        assert!("zstd".parse::<Compression>().is_err());
    }

    /// A plain v3 entry laid out as docs/format/record-set.md says, with `runs` producer runs.
    fn v3_entry(lines: &[&[u8]], runs: u16) -> Vec<u8> {
        let mut e = vec![RECORD_SET_FORMAT_V3, 0];
        e.extend_from_slice(&(lines.len() as u32).to_le_bytes());
        e.extend_from_slice(&7u64.to_le_bytes());
        e.extend_from_slice(&1_765_000_000_000u64.to_le_bytes());
        if runs > 0 {
            e[1] |= RECORD_SET_FLAG_PRODUCER_RUNS;
            e.extend_from_slice(&runs.to_le_bytes());
            e.extend(std::iter::repeat_n(
                0xAB,
                usize::from(runs) * PRODUCER_RUN_SIZE_BYTES,
            ));
        }
        e.extend_from_slice(&records_section(lines));
        e
    }

    #[test]
    fn entries_compress_and_read_back_identical() {
        // Goal: a compressed v3 entry (with and without producer runs) reads back byte for byte
        // as the plain one; incompressible entries and other versions are left alone.
        for runs in [0, 2] {
            let plain = v3_entry(&[&b"GET /index.html 200 1043 Mozilla/5.0"[..]; 300], runs);
            let c = compress_entry(&plain).expect("log lines compress");
            assert!(c.len() * 4 < plain.len());
            assert_eq!(c[1] & RECORD_SET_FLAG_LZ4, RECORD_SET_FLAG_LZ4);
            assert_eq!(&*uncompress_entry(&c, 1 << 20).unwrap(), &plain[..]);
            assert!(compress_entry(&c).is_none(), "already compressed");
            assert!(matches!(
                uncompress_entry(&plain, 1 << 20).unwrap(),
                std::borrow::Cow::Borrowed(_)
            ));
        }
        assert!(compress_entry(&v3_entry(&[&noise(4000)], 0)).is_none());
        let v1 = [1u8, 1, 0, 0, 0];
        assert!(compress_entry(&v1).is_none());
        assert!(compress_entry(&[RECORD_SET_FORMAT_V3]).is_none());
        assert_eq!(&*uncompress_entry(&v1, 1 << 20).unwrap(), &v1[..]);
    }

    #[test]
    fn corrupt_compressed_entries_are_errors() {
        // Goal: a cut header, cut runs, a lying uncompressed length or a cut block: an error.
        let plain = v3_entry(&[&b"hello hello hello"[..]; 100], 1);
        let c = compress_entry(&plain).unwrap();
        // From 2 bytes on (a lone version byte is no compressed entry; decoding refuses it).
        for cut in 2..c.len() {
            assert!(uncompress_entry(&c[..cut], 1 << 20).is_err(), "cut {cut}");
        }
        assert!(
            uncompress_entry(&c, plain.len() - 1).is_err(),
            "above the limit"
        );
        let mut runs = c.clone();
        runs[22..24].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(uncompress_entry(&runs, 1 << 20).is_err());
    }
}

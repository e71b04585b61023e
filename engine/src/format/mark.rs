//! The checkpoint mark (`checkpoint.qcp`, docs/format/index.md): where replay starts and which
//! index segment files are live (BookKeeper's `lastMark`, plus the role of a manifest). Version
//! 1 named a committed length of the legacy `index.qix` instead; it is read for migration.
//! Version 2 named the live segments by id only; version 3 (written by this build) adds each
//! segment's [`SegmentSummary`] (key range, ledger-state range, entry logs), so that a segment
//! that is missing or whose header is unreadable can be rebuilt in the background, from only the
//! entry logs it points into, while every ledger outside it is served (issue 23 item 7).

use std::collections::BTreeMap;

use super::{round_up_block, u16_at, u32_at, u64_at, Key, FORMAT_V1, FORMAT_V2, FORMAT_V3};
use crate::io::BLOCK_BYTES;

/// Magic of the checkpoint mark (`checkpoint.qcp`).
pub const MARK_MAGIC: [u8; 8] = *b"QUIRECKP";
/// Most index segment files one mark can name (what a version 2 mark's one block holds; a
/// version 3 mark of that many segments takes 11 blocks).
pub const MARK_SEGMENTS_MAX: usize = (BLOCK_BYTES - 48 - 4) / 8;
/// Bytes of one segment's record in a version 3 mark.
pub const MARK_V3_SEGMENT_BYTES: usize = 88;

/// What a mark records of one live index segment besides its id, so that the segment's reach is
/// known without reading it (issue 23 item 7: a missing segment, or one whose header is
/// unreadable, is then rebuilt in the background and only the keys and ledgers it covers wait).
/// Taken from the segment's content when it is written; a segment is immutable, so it stays
/// true.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentSummary {
    /// Locations it holds (as its header says).
    pub entry_count: u64,
    /// Smallest and largest key (both (0, 0) when `entry_count` is 0), as its header says.
    pub min_key: Key,
    pub max_key: Key,
    /// Smallest and largest ledger with a ledger-state record in it; `None`: it holds none.
    pub ledgers: Option<(u64, u64)>,
    /// Smallest and largest entry-log id its locations point into; `None` when it holds no
    /// location, or when not known (a segment written by an older build whose mark was
    /// version 2: its rebuild then reads every entry log).
    pub logs: Option<(u64, u64)>,
}

/// The checkpoint mark: where replay starts, and what of the index is committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    pub journal_file_id: u64,
    /// Byte offset in that journal file of the first batch not covered by the checkpoint
    /// (block aligned).
    pub journal_offset: u64,
    /// Sequence number of the first record not covered by the checkpoint.
    pub next_seq: u64,
    /// Version 1 marks only: bytes of the legacy `index.qix` that are committed.
    pub legacy_index_bytes: Option<u64>,
    /// Ids of the live index segment files, oldest first (later ones override earlier ones).
    pub segments: Vec<u64>,
    /// What is known of live segments, by id (version 3). A named segment without one (read
    /// from a version 2 mark and not yet described) is rebuilt at open if it is missing or its
    /// header is unreadable. Entries for ids `segments` does not name are not written.
    pub summaries: BTreeMap<u64, SegmentSummary>,
}

impl Mark {
    /// This mark naming `segments` instead, with `added` (id, summary) described and the
    /// summaries of segments no longer named dropped.
    pub fn with_segments(
        &self,
        segments: Vec<u64>,
        added: impl IntoIterator<Item = (u64, SegmentSummary)>,
    ) -> Mark {
        let mut summaries = self.summaries.clone();
        summaries.extend(added);
        summaries.retain(|id, _| segments.contains(id));
        Mark {
            segments,
            summaries,
            ..self.clone()
        }
    }
}

const V1_CRC_COVERED: usize = 48;
const V2_CRC_AT: usize = BLOCK_BYTES - 4;
const SEGMENTS_AT: usize = 48;

const SUMMARY_KNOWN: u32 = 1;
const SUMMARY_LOGS_KNOWN: u32 = 2;
const SUMMARY_HAS_LEDGERS: u32 = 4;

/// Bytes of a version 3 mark naming `n` segments (whole blocks; the CRC is in the last 4 bytes).
pub fn mark_v3_len(n: usize) -> usize {
    round_up_block((SEGMENTS_AT + n * MARK_V3_SEGMENT_BYTES + 4) as u64) as usize
}

/// Bytes the mark whose first block is `first` takes: more than one block only for a version
/// 3 mark naming more than 46 segments. For a block that does not decode, one block (the
/// decoder then says why).
pub fn mark_len(first: &[u8]) -> usize {
    if first.len() < SEGMENTS_AT || first[0..8] != MARK_MAGIC || u16_at(first, 8) != FORMAT_V3 {
        return BLOCK_BYTES;
    }
    let n = u32_at(first, 40) as usize;
    if n > MARK_SEGMENTS_MAX {
        return BLOCK_BYTES;
    }
    mark_v3_len(n)
}

/// Encodes a version 3 mark. Panics if it names more than [`MARK_SEGMENTS_MAX`] segments (the
/// index keeps fewer by merging; the checkpoint checks before).
pub fn encode_mark(m: &Mark) -> Vec<u8> {
    assert!(
        m.segments.len() <= MARK_SEGMENTS_MAX,
        "too many index segments for a mark"
    );
    let len = mark_v3_len(m.segments.len());
    let mut b = vec![0u8; len];
    b[0..8].copy_from_slice(&MARK_MAGIC);
    b[8..10].copy_from_slice(&FORMAT_V3.to_le_bytes());
    b[16..24].copy_from_slice(&m.journal_file_id.to_le_bytes());
    b[24..32].copy_from_slice(&m.journal_offset.to_le_bytes());
    b[32..40].copy_from_slice(&m.next_seq.to_le_bytes());
    b[40..44].copy_from_slice(&(m.segments.len() as u32).to_le_bytes());
    for (i, id) in m.segments.iter().enumerate() {
        let at = SEGMENTS_AT + i * MARK_V3_SEGMENT_BYTES;
        let r = &mut b[at..at + MARK_V3_SEGMENT_BYTES];
        r[0..8].copy_from_slice(&id.to_le_bytes());
        let Some(s) = m.summaries.get(id) else {
            continue;
        };
        let mut flags = SUMMARY_KNOWN;
        let (lo, hi) = s.ledgers.unwrap_or((0, 0));
        let (llo, lhi) = s.logs.unwrap_or((0, 0));
        if s.ledgers.is_some() {
            flags |= SUMMARY_HAS_LEDGERS;
        }
        if s.logs.is_some() {
            flags |= SUMMARY_LOGS_KNOWN;
        }
        r[8..12].copy_from_slice(&flags.to_le_bytes());
        let vals = [
            s.entry_count,
            s.min_key.0,
            s.min_key.1,
            s.max_key.0,
            s.max_key.1,
            lo,
            hi,
            llo,
            lhi,
        ];
        for (j, v) in vals.iter().enumerate() {
            r[16 + j * 8..24 + j * 8].copy_from_slice(&v.to_le_bytes());
        }
    }
    let crc = crc32c::crc32c(&b[..len - 4]);
    b[len - 4..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Encodes a version 2 mark (ids only): only for tests of the fallback for marks written by an
/// older build.
pub fn encode_mark_v2(m: &Mark) -> Vec<u8> {
    assert!(
        m.segments.len() <= MARK_SEGMENTS_MAX,
        "too many index segments for a mark"
    );
    let mut b = vec![0u8; BLOCK_BYTES];
    b[0..8].copy_from_slice(&MARK_MAGIC);
    b[8..10].copy_from_slice(&FORMAT_V2.to_le_bytes());
    b[16..24].copy_from_slice(&m.journal_file_id.to_le_bytes());
    b[24..32].copy_from_slice(&m.journal_offset.to_le_bytes());
    b[32..40].copy_from_slice(&m.next_seq.to_le_bytes());
    b[40..44].copy_from_slice(&(m.segments.len() as u32).to_le_bytes());
    for (i, id) in m.segments.iter().enumerate() {
        b[48 + i * 8..56 + i * 8].copy_from_slice(&id.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b[..V2_CRC_AT]);
    b[V2_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Encodes a version 1 mark (legacy `index.qix` length): only for tests of the migration.
pub fn encode_mark_v1(m: &Mark) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_BYTES];
    b[0..8].copy_from_slice(&MARK_MAGIC);
    b[8..10].copy_from_slice(&FORMAT_V1.to_le_bytes());
    b[16..24].copy_from_slice(&m.journal_file_id.to_le_bytes());
    b[24..32].copy_from_slice(&m.journal_offset.to_le_bytes());
    b[32..40].copy_from_slice(&m.next_seq.to_le_bytes());
    b[40..48].copy_from_slice(&m.legacy_index_bytes.unwrap_or(0).to_le_bytes());
    let crc = crc32c::crc32c(&b[..V1_CRC_COVERED]);
    b[48..52].copy_from_slice(&crc.to_le_bytes());
    b
}

pub enum MarkDecode {
    Ok(Mark),
    Unsupported(u16),
    Bad(String),
}

/// Decodes a mark of version 1, 2 or 3; `b` holds at least [`mark_len`] of its first block.
pub fn decode_mark(b: &[u8]) -> MarkDecode {
    if b.len() < BLOCK_BYTES {
        return MarkDecode::Bad(format!("checkpoint mark cut short at {} bytes", b.len()));
    }
    if b[0..8] != MARK_MAGIC {
        return MarkDecode::Bad("bad checkpoint mark magic".into());
    }
    let version = u16_at(b, 8);
    let n = u32_at(b, 40) as usize;
    if version != FORMAT_V1 && n > MARK_SEGMENTS_MAX {
        return MarkDecode::Bad(format!("checkpoint mark names {n} index segments"));
    }
    let (stored, computed) = match version {
        FORMAT_V1 => (u32_at(b, 48), crc32c::crc32c(&b[..V1_CRC_COVERED])),
        FORMAT_V2 => (u32_at(b, V2_CRC_AT), crc32c::crc32c(&b[..V2_CRC_AT])),
        FORMAT_V3 => {
            let len = mark_v3_len(n);
            if b.len() < len {
                return MarkDecode::Bad(format!(
                    "checkpoint mark cut short at {} bytes, {n} index segments need {len}",
                    b.len()
                ));
            }
            (u32_at(b, len - 4), crc32c::crc32c(&b[..len - 4]))
        }
        v => return MarkDecode::Unsupported(v),
    };
    if stored != computed {
        return MarkDecode::Bad(format!(
            "checkpoint mark CRC32C mismatch: stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    let mut m = Mark {
        journal_file_id: u64_at(b, 16),
        journal_offset: u64_at(b, 24),
        next_seq: u64_at(b, 32),
        legacy_index_bytes: None,
        segments: Vec::new(),
        summaries: BTreeMap::new(),
    };
    match version {
        FORMAT_V1 => {
            m.legacy_index_bytes = Some(u64_at(b, 40));
        }
        FORMAT_V2 => {
            m.segments = (0..n).map(|i| u64_at(b, 48 + i * 8)).collect();
        }
        _ => {
            for i in 0..n {
                let at = SEGMENTS_AT + i * MARK_V3_SEGMENT_BYTES;
                let r = &b[at..at + MARK_V3_SEGMENT_BYTES];
                let id = u64_at(r, 0);
                m.segments.push(id);
                let flags = u32_at(r, 8);
                if flags & !(SUMMARY_KNOWN | SUMMARY_LOGS_KNOWN | SUMMARY_HAS_LEDGERS) != 0 {
                    return MarkDecode::Bad(format!(
                        "checkpoint mark: unknown flags {flags:#x} for index segment {id}"
                    ));
                }
                if flags & SUMMARY_KNOWN == 0 {
                    continue;
                }
                let v = |j: usize| u64_at(r, 16 + j * 8);
                let s = SegmentSummary {
                    entry_count: v(0),
                    min_key: (v(1), v(2)),
                    max_key: (v(3), v(4)),
                    ledgers: (flags & SUMMARY_HAS_LEDGERS != 0).then_some((v(5), v(6))),
                    logs: (flags & SUMMARY_LOGS_KNOWN != 0).then_some((v(7), v(8))),
                };
                let bad_range = |r: Option<(u64, u64)>| r.is_some_and(|(lo, hi)| lo > hi);
                if s.min_key > s.max_key || bad_range(s.ledgers) || bad_range(s.logs) {
                    return MarkDecode::Bad(format!(
                        "checkpoint mark: index segment {id} has a range whose start is above \
                         its end"
                    ));
                }
                m.summaries.insert(id, s);
            }
        }
    }
    MarkDecode::Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_of_every_version_decode() {
        // Goal: a v3 mark round-trips with its segment list and summaries (also one taking
        // several blocks); a v2 mark decodes without summaries (the fallback for an older
        // build's mark); a v1 mark still decodes (migration); a flipped bit is refused.
        let s = SegmentSummary {
            entry_count: 40,
            min_key: (1, 0),
            max_key: (6, 39),
            ledgers: Some((1, 6)),
            logs: Some((2, 3)),
        };
        let mut m = Mark {
            journal_file_id: 3,
            journal_offset: 8192,
            next_seq: 77,
            legacy_index_bytes: None,
            segments: vec![4, 9, 12],
            summaries: BTreeMap::new(),
        };
        m.summaries.insert(4, s);
        m.summaries.insert(
            9,
            SegmentSummary {
                ledgers: None,
                logs: None,
                ..s
            },
        );
        let MarkDecode::Ok(d) = decode_mark(&encode_mark(&m)) else {
            panic!("v3 mark does not decode");
        };
        assert_eq!(d, m);
        let MarkDecode::Ok(d2) = decode_mark(&encode_mark_v2(&m)) else {
            panic!("v2 mark does not decode");
        };
        assert_eq!(d2.segments, m.segments);
        assert!(d2.summaries.is_empty());
        let big = m.with_segments(
            (100..100 + MARK_SEGMENTS_MAX as u64).collect(),
            (100..100 + MARK_SEGMENTS_MAX as u64).map(|id| (id, s)),
        );
        let b = encode_mark(&big);
        assert_eq!(b.len(), 11 * BLOCK_BYTES);
        assert_eq!(mark_len(&b[..BLOCK_BYTES]), b.len());
        assert!(matches!(decode_mark(&b[..BLOCK_BYTES]), MarkDecode::Bad(_)));
        let MarkDecode::Ok(d3) = decode_mark(&b) else {
            panic!("a mark of 11 blocks does not decode");
        };
        assert_eq!(d3, big);
        let v1 = Mark {
            legacy_index_bytes: Some(12288),
            segments: Vec::new(),
            summaries: BTreeMap::new(),
            ..m.clone()
        };
        let MarkDecode::Ok(d) = decode_mark(&encode_mark_v1(&v1)) else {
            panic!("v1 mark does not decode");
        };
        assert_eq!(d, v1);
        for at in [50, 70, 4000] {
            let mut bad = encode_mark(&m);
            bad[at] ^= 1;
            assert!(matches!(decode_mark(&bad), MarkDecode::Bad(_)), "{at}");
        }
    }
}

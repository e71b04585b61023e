//! What readers see of a stream without touching the writer: the segment list with each
//! segment's readable end (its last entry once completed, the writer's LAC while in progress),
//! published by the stream task through a watch, and the bounded cache of entries just
//! acknowledged, which serves tail reads without a bookie round trip.

use std::collections::BTreeMap;
use std::sync::Arc;

use quire_metadata::{SegmentState, StreamMetadata};

use crate::dlsn::Dlsn;

/// What readers know about one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SegmentView {
    pub(super) seq_no: u64,
    pub(super) ledger_id: u64,
    /// Last entry a reader may read: the final last entry once completed, else the LAC.
    pub(super) readable_last_entry: Option<u64>,
    pub(super) completed: bool,
    /// Records in it (completed segments; 0 while in progress: the owner's progress is in
    /// `StreamShared::view`).
    pub(super) record_count: u64,
    /// txid of its last record (completed segments with records).
    pub(super) last_txid: Option<u64>,
    /// Write time of its last record (completed segments written with record set v3).
    pub(super) last_write_time_ms: Option<u64>,
}

/// The readers' view of a stream, published by its stream task.
#[derive(Debug, Clone, Default)]
pub(super) struct TailState {
    pub(super) segments: Vec<SegmentView>,
    /// Records before this are unreadable (the stream's truncation point).
    pub(super) truncated_before: Option<Dlsn>,
    /// The stream is sealed: nothing follows its end-of-stream marker.
    pub(super) sealed: bool,
}

impl TailState {
    pub(super) fn from_metadata(meta: &StreamMetadata) -> Self {
        let segments = meta
            .segments
            .iter()
            .map(|s| SegmentView {
                seq_no: s.seq_no,
                ledger_id: s.ledger_id,
                readable_last_entry: if s.state == SegmentState::Completed {
                    s.last_entry
                } else {
                    None
                },
                completed: s.state == SegmentState::Completed,
                record_count: s.record_count,
                last_txid: s.last_txid,
                last_write_time_ms: s.last_write_time_ms,
            })
            .collect();
        let truncated_before = meta
            .truncated_before
            .map(|t| Dlsn::new(t.segment_seq_no, t.entry_id, t.slot_index));
        Self {
            segments,
            truncated_before,
            sealed: meta.sealed,
        }
    }

    /// The segment and position holding the first readable record at or after `pos`, or
    /// `None` when nothing is readable there yet.
    pub(super) fn resolve(&self, pos: Dlsn) -> Option<(SegmentView, Dlsn)> {
        let mut pos = pos;
        for seg in &self.segments {
            if seg.seq_no < pos.segment_seq_no {
                continue;
            }
            if seg.seq_no > pos.segment_seq_no {
                pos = Dlsn::new(seg.seq_no, 0, 0);
            }
            match seg.readable_last_entry {
                Some(last) if pos.entry_id <= last => return Some((seg.clone(), pos)),
                _ if seg.completed => continue,
                _ => return None,
            }
        }
        None
    }
}

/// Recently acknowledged entries, by (ledger, entry), bounded by bytes; oldest evicted first.
/// Entries are held plain (never LZ4-compressed: the writer inserts the record set it encoded
/// before compressing it), so tail readers decode them without decompressing, and the bound
/// counts the plain bytes held.
#[derive(Default)]
pub(super) struct TailCache {
    pub(super) entries: BTreeMap<(u64, u64), Arc<Vec<u8>>>,
    pub(super) size_bytes: usize,
}

impl TailCache {
    pub(super) fn insert(&mut self, key: (u64, u64), payload: Arc<Vec<u8>>, size_bytes_max: usize) {
        self.size_bytes += payload.len();
        if let Some(old) = self.entries.insert(key, payload) {
            self.size_bytes -= old.len();
        }
        while self.size_bytes > size_bytes_max {
            let Some((_, evicted)) = self.entries.pop_first() else {
                break;
            };
            self.size_bytes -= evicted.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(seq_no: u64, last: Option<u64>, completed: bool) -> SegmentView {
        SegmentView {
            seq_no,
            ledger_id: seq_no * 10,
            readable_last_entry: last,
            completed,
            record_count: 0,
            last_txid: None,
            last_write_time_ms: None,
        }
    }

    #[test]
    fn resolve_walks_segments() {
        // Goal: positions map to the first readable record at or after them; method: a table
        // over completed, empty and in-progress segments.
        let t = TailState {
            segments: vec![
                view(1, Some(2), true),
                view(2, None, true),
                view(3, Some(0), false),
            ],
            truncated_before: None,
            sealed: false,
        };
        let at = |s, e, k| {
            t.resolve(Dlsn::new(s, e, k))
                .map(|(seg, p)| (seg.seq_no, p))
        };
        assert_eq!(at(0, 0, 0), Some((1, Dlsn::new(1, 0, 0))));
        assert_eq!(at(1, 2, 5), Some((1, Dlsn::new(1, 2, 5))));
        // Past the end of segment 1, over the empty segment 2, into segment 3.
        assert_eq!(at(1, 3, 0), Some((3, Dlsn::new(3, 0, 0))));
        assert_eq!(at(3, 0, 1), Some((3, Dlsn::new(3, 0, 1))));
        // Beyond the LAC of the in-progress segment, and beyond every segment.
        assert_eq!(at(3, 1, 0), None);
        assert_eq!(at(9, 0, 0), None);
        assert_eq!(TailState::default().resolve(Dlsn::new(0, 0, 0)), None);
    }

    #[test]
    fn tail_cache_is_bounded() {
        // Goal: the cache never holds more than its byte bound and evicts oldest first.
        let mut c = TailCache::default();
        for e in 0..10u64 {
            c.insert((1, e), Arc::new(vec![0; 100]), 350);
            assert!(c.size_bytes <= 350);
        }
        assert_eq!(
            c.entries.keys().copied().collect::<Vec<_>>(),
            vec![(1, 7), (1, 8), (1, 9)]
        );
    }
}

//! Stream-level lookups for `describe` (DistributedLog `getFirstDLSN`, `getLastDLSN`,
//! `getLogRecordCount`; the last txid is the record's `max_txid`), computed from a stream
//! record: the stored one, or the owner's with the segment being written filled in from its
//! acknowledged progress (`OwnerView::describe`).
//!
//! What a proxy that does not own the stream knows: the stored record shows the segment being
//! written with no records (its progress lives only in the owner), so its lookups cover the
//! completed segments: the last DLSN, count and last write time lag until that segment
//! completes, exactly as the stored `max_txid` does.

use quire_client::StreamLookups;
use quire_metadata::StreamMetadata;

use crate::dlsn::Dlsn;

/// The lookups of `meta` (see the module docs for what they cover).
pub(super) fn lookups(meta: &StreamMetadata) -> StreamLookups {
    let record_count = meta.segments.iter().map(|s| s.record_count).sum();
    let last = meta.segments.iter().rev().find(|s| s.record_count > 0);
    let last_dlsn = last.and_then(|s| {
        Some(Dlsn::new(
            s.seq_no,
            s.last_record_entry?,
            s.last_record_slot?,
        ))
    });
    // A segment's first entry always holds records (control entries and the end-of-stream
    // marker follow a data entry, or stand alone in a segment that counts no record).
    let first_in_segments = meta
        .segments
        .iter()
        .find(|s| s.record_count > 0)
        .map(|s| Dlsn::new(s.seq_no, 0, 0));
    let point = meta
        .truncated_before
        .map(|t| Dlsn::new(t.segment_seq_no, t.entry_id, t.slot_index));
    let first_dlsn = match (first_in_segments, point) {
        (Some(f), Some(p)) => Some(f.max(p)),
        (f, _) => f,
    }
    // Nothing readable when the point lies past the last record.
    .filter(|f| last_dlsn.is_none_or(|l| *f <= l));
    StreamLookups {
        first_dlsn,
        last_dlsn,
        record_count,
        last_write_time_ms: last.and_then(|s| s.last_write_time_ms),
        sealed: meta.sealed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_metadata::{RetentionOverride, SegmentMetadata, SegmentState, TruncationPoint};

    fn seg(seq_no: u64, records: u64, last: Option<(u64, u32, u64)>) -> SegmentMetadata {
        SegmentMetadata {
            seq_no,
            ledger_id: seq_no,
            state: SegmentState::Completed,
            first_txid: Some(1),
            last_txid: Some(1),
            last_entry: last.map(|l| l.0 + 1),
            record_count: records,
            length_bytes: 0,
            completion_time_ms: None,
            first_write_time_ms: None,
            last_write_time_ms: last.map(|l| l.2),
            last_record_entry: last.map(|l| l.0),
            last_record_slot: last.map(|l| l.1),
        }
    }

    fn stream(segments: Vec<SegmentMetadata>, point: Option<(u64, u64, u32)>) -> StreamMetadata {
        StreamMetadata {
            name: "s".into(),
            segments,
            max_txid: None,
            creation_time_ms: 0,
            truncated_before: point.map(|(s, e, k)| TruncationPoint {
                segment_seq_no: s,
                entry_id: e,
                slot_index: k,
            }),
            retention: RetentionOverride::default(),
            ledger_secret_hex: None,
            sealed: false,
            compression: None,
            limits: None,
            home_region: None,
            placement: None,
        }
    }

    #[test]
    fn lookups_skip_empty_segments_and_follow_the_truncation_point() {
        // Goal: first/last DLSN skip empty segments (a crashed writer's), the count sums the
        // segments, the truncation point moves the first DLSN and past the end leaves none.
        let segs = vec![
            seg(1, 10, Some((3, 1, 100))),
            seg(2, 0, None),
            seg(3, 5, Some((1, 2, 200))),
            seg(4, 0, None),
        ];
        let l = lookups(&stream(segs.clone(), None));
        assert_eq!(l.first_dlsn, Some(Dlsn::new(1, 0, 0)));
        assert_eq!(l.last_dlsn, Some(Dlsn::new(3, 1, 2)));
        assert_eq!(l.record_count, 15);
        assert_eq!(l.last_write_time_ms, Some(200));
        let l = lookups(&stream(segs.clone(), Some((3, 1, 0))));
        assert_eq!(l.first_dlsn, Some(Dlsn::new(3, 1, 0)));
        let l = lookups(&stream(segs, Some((5, 0, 0))));
        assert_eq!(l.first_dlsn, None);
        let l = lookups(&stream(vec![seg(1, 0, None)], None));
        assert_eq!((l.first_dlsn, l.last_dlsn, l.record_count), (None, None, 0));
    }
}

//! Read positions other than a DLSN (DistributedLog's `getDLSNNotLessThanTxId` and its
//! reader positions), found without scanning the stream:
//!
//! 1. the segment, from the segment list readers see (per segment: record count, last txid and
//!    last write time from the metadata; the segment being written from the owner's
//!    acknowledged progress): a binary search over the segments that hold records;
//! 2. the entry, by a binary search over the segment's readable entries that reads one entry
//!    per step (O(log entries) reads; entries come from the tail cache or the bookies). Along
//!    a segment, an entry's last txid, write time and record end index never decrease (control
//!    entries and the end-of-stream marker repeat the last record's txid and write time);
//! 3. the slot inside the entry.
//!
//! A position past the stream's end resolves to the tail (the read then waits for the next
//! record). Positions before the truncation point are moved to it by the reader.

use std::future::Future;
use std::sync::Arc;

use super::tail_cache::{SegmentView, TailState};
use crate::dlsn::{Dlsn, ReadPosition};
use crate::error::{Error, Result};
use crate::record_set::{self, RecordSet};

/// What a search orders entries by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    /// The txid of the segment's last record up to the entry.
    TxId,
    /// The write time (0 for entries written before record set v3 carried one).
    WriteTime,
    /// The segment record index just past the entry's last record.
    RecordEnd,
}

impl Key {
    fn of_entry(self, set: &RecordSet<'_>) -> u64 {
        match self {
            Key::TxId => set.last_txid().unwrap_or(0),
            Key::WriteTime => set.write_time_ms.unwrap_or(0),
            Key::RecordEnd => set.segment_record_index + set.records.len() as u64,
        }
    }

    /// True when every record of the completed segment `s` orders below `target`.
    fn segment_below(self, s: &SegmentView, target: u64) -> bool {
        s.completed
            && match self {
                Key::TxId => s.last_txid.unwrap_or(0) < target,
                Key::WriteTime => s.last_write_time_ms.unwrap_or(0) < target,
                // Last-N picks its segment by counts, not by this.
                Key::RecordEnd => false,
            }
    }
}

/// The DLSN a read from `from` starts at. `live` is the owner's acknowledged progress of the
/// segment being written (seq no, records); `fetch(ledger, entry)` gives an entry's payload.
///
/// # Errors
/// What `fetch` fails with; `Storage` for an entry that does not decode.
pub(super) async fn resolve<F, Fut>(
    name: &str,
    tail: &TailState,
    live: Option<(u64, u64)>,
    from: ReadPosition,
    fetch: F,
) -> Result<Dlsn>
where
    F: Fn(u64, u64) -> Fut,
    Fut: Future<Output = Result<Arc<Vec<u8>>>>,
{
    let search = Search { name, fetch };
    match from {
        ReadPosition::Head => Ok(Dlsn::new(0, 0, 0)),
        ReadPosition::Dlsn(d) => Ok(d),
        ReadPosition::Tail | ReadPosition::LastN(0) => Ok(tail_position(tail)),
        ReadPosition::TxId(t) => search.by_key(tail, Key::TxId, t).await,
        ReadPosition::WriteTime(t) => search.by_key(tail, Key::WriteTime, t).await,
        ReadPosition::LastN(n) => search.last_n(tail, live, n).await,
    }
}

/// The position of the next record to be written, as readers see the stream now: just past
/// the last readable entry (a tail read waits there; `TailState::resolve` moves it into the
/// next segment once the writer rolls).
pub(super) fn tail_position(tail: &TailState) -> Dlsn {
    match tail.segments.last() {
        None => Dlsn::new(0, 0, 0),
        Some(s) => match s.readable_last_entry {
            Some(last) => Dlsn::new(s.seq_no, last + 1, 0),
            None => Dlsn::new(s.seq_no, 0, 0),
        },
    }
}

/// Segments that may hold a readable record: completed ones with records, and the one being
/// written (or left unrecovered) once an entry of it is readable.
fn candidates(tail: &TailState) -> Vec<&SegmentView> {
    tail.segments
        .iter()
        .filter(|s| s.readable_last_entry.is_some() && (!s.completed || s.record_count > 0))
        .collect()
}

struct Search<'a, F> {
    name: &'a str,
    fetch: F,
}

impl<F, Fut> Search<'_, F>
where
    F: Fn(u64, u64) -> Fut,
    Fut: Future<Output = Result<Arc<Vec<u8>>>>,
{
    /// The first record whose `key` is at least `target`, or the tail.
    async fn by_key(&self, tail: &TailState, key: Key, target: u64) -> Result<Dlsn> {
        let segs = candidates(tail);
        let first = segs.partition_point(|s| key.segment_below(s, target));
        for seg in &segs[first..] {
            if let Some(d) = self.in_segment(seg, key, target).await? {
                return Ok(d);
            }
        }
        Ok(tail_position(tail))
    }

    /// The `n`-th record from the end (n ≥ 1), or the head when the stream holds fewer.
    async fn last_n(&self, tail: &TailState, live: Option<(u64, u64)>, n: u64) -> Result<Dlsn> {
        let mut remaining = n;
        for seg in candidates(tail).into_iter().rev() {
            let count = if seg.completed {
                seg.record_count
            } else {
                live.filter(|l| l.0 == seg.seq_no).map_or(0, |l| l.1)
            };
            if count >= remaining {
                // Record index `count - remaining` of this segment: the entry whose record
                // end passes it.
                let index = count - remaining;
                if let Some(d) = self.in_segment(seg, Key::RecordEnd, index + 1).await? {
                    return Ok(d);
                }
                break;
            }
            remaining -= count;
        }
        Ok(Dlsn::new(0, 0, 0))
    }

    /// Binary search over the readable entries of `seg` for the first entry whose key is at
    /// least `target`, then the slot; `None` when no entry of it reaches `target`.
    async fn in_segment(&self, seg: &SegmentView, key: Key, target: u64) -> Result<Option<Dlsn>> {
        let Some(last) = seg.readable_last_entry else {
            return Ok(None);
        };
        let (mut lo, mut hi) = (0u64, last + 1);
        let mut found: Option<Arc<Vec<u8>>> = None;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let payload = (self.fetch)(seg.ledger_id, mid).await?;
            if key.of_entry(&self.decode(seg, mid, &payload)?) < target {
                lo = mid + 1;
            } else {
                hi = mid;
                found = Some(payload);
            }
        }
        if lo > last {
            return Ok(None);
        }
        let payload = match found {
            Some(p) => p,
            None => (self.fetch)(seg.ledger_id, lo).await?,
        };
        let set = self.decode(seg, lo, &payload)?;
        let slot = match key {
            Key::TxId => set.records.iter().position(|r| r.txid >= target),
            Key::WriteTime => Some(0),
            Key::RecordEnd => {
                usize::try_from((target - 1).saturating_sub(set.segment_record_index)).ok()
            }
        }
        .unwrap_or(set.records.len());
        // Past the entry's records (a control entry): the reader moves on to the next entry.
        let slot = u32::try_from(slot).expect("slots bounded by entry size");
        Ok(Some(Dlsn::new(seg.seq_no, lo, slot)))
    }

    fn decode<'p>(
        &self,
        seg: &SegmentView,
        entry: u64,
        payload: &'p [u8],
    ) -> Result<RecordSet<'p>> {
        record_set::decode(payload).map_err(|e| Error::Storage {
            stream: self.name.to_string(),
            op: "decode record set",
            source: format!("ledger {} entry {entry}: {e}", seg.ledger_id).into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::collections::HashMap;

    /// A stream held in memory: ledger id = seq no; entries are record sets.
    struct Log {
        entries: HashMap<(u64, u64), Arc<Vec<u8>>>,
        tail: TailState,
        reads: Cell<u32>,
    }

    /// Builds a log from segments given as entries of (txid, write time) records; an empty
    /// entry list is a crashed writer's empty segment; `open` leaves the last one in progress.
    fn log(segments: &[Vec<Vec<(u64, u64)>>], open: bool) -> Log {
        let mut entries = HashMap::new();
        let mut views = Vec::new();
        for (i, seg) in segments.iter().enumerate() {
            let seq = i as u64 + 1;
            let mut index = 0u64;
            let mut last = (None, None);
            for (e, recs) in seg.iter().enumerate() {
                let payload: Vec<u8> = if recs.is_empty() {
                    let (t, w) = last;
                    record_set::encode_control(index, t.unwrap_or(0), w.unwrap_or(0))
                } else {
                    let set: Vec<(u64, &[u8])> =
                        recs.iter().map(|(t, _)| (*t, &b"p"[..])).collect();
                    let time = recs[0].1;
                    index += recs.len() as u64;
                    last = (recs.last().map(|r| r.0), Some(time));
                    // Records of one entry share its write time.
                    record_set::encode(index - recs.len() as u64, time, set)
                };
                entries.insert((seq, e as u64), Arc::new(payload));
            }
            let completed = !(open && i + 1 == segments.len());
            views.push(SegmentView {
                seq_no: seq,
                ledger_id: seq,
                readable_last_entry: (seg.len() as u64).checked_sub(1),
                completed,
                record_count: if completed { index } else { 0 },
                last_txid: if completed { last.0 } else { None },
                last_write_time_ms: if completed { last.1 } else { None },
            });
        }
        Log {
            entries,
            tail: TailState {
                segments: views,
                truncated_before: None,
                sealed: false,
            },
            reads: Cell::new(0),
        }
    }

    fn at(log: &Log, from: ReadPosition, live: Option<(u64, u64)>) -> Dlsn {
        let fetch = |l: u64, e: u64| {
            log.reads.set(log.reads.get() + 1);
            let p = log.entries.get(&(l, e)).cloned().expect("entry exists");
            async move { Ok(p) }
        };
        let f = resolve("s", &log.tail, live, from, fetch);
        futures_lite_block_on(f).unwrap()
    }

    fn futures_lite_block_on<T>(f: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn txid_and_time_positions_across_segments() {
        // Goal: txid >= T and time >= T find the first such record across segments, over a
        // crashed writer's empty segment (2) and a control entry; past the end gives the tail.
        let l = log(
            &[
                vec![vec![(1, 100), (2, 100)], vec![(3, 110)], vec![]],
                vec![],
                vec![vec![(5, 200)], vec![(5, 210), (7, 210)], vec![(9, 220)]],
            ],
            false,
        );
        assert_eq!(at(&l, ReadPosition::TxId(0), None), Dlsn::new(1, 0, 0));
        assert_eq!(at(&l, ReadPosition::TxId(2), None), Dlsn::new(1, 0, 1));
        assert_eq!(at(&l, ReadPosition::TxId(4), None), Dlsn::new(3, 0, 0));
        assert_eq!(at(&l, ReadPosition::TxId(5), None), Dlsn::new(3, 0, 0));
        assert_eq!(at(&l, ReadPosition::TxId(6), None), Dlsn::new(3, 1, 1));
        assert_eq!(at(&l, ReadPosition::TxId(9), None), Dlsn::new(3, 2, 0));
        assert_eq!(
            at(&l, ReadPosition::TxId(10), None),
            Dlsn::new(3, 3, 0),
            "tail"
        );
        assert_eq!(
            at(&l, ReadPosition::WriteTime(101), None),
            Dlsn::new(1, 1, 0)
        );
        assert_eq!(
            at(&l, ReadPosition::WriteTime(111), None),
            Dlsn::new(3, 0, 0)
        );
        assert_eq!(
            at(&l, ReadPosition::WriteTime(210), None),
            Dlsn::new(3, 1, 0)
        );
        assert_eq!(
            at(&l, ReadPosition::WriteTime(221), None),
            Dlsn::new(3, 3, 0)
        );
        assert_eq!(at(&l, ReadPosition::Tail, None), Dlsn::new(3, 3, 0));
    }

    #[test]
    fn one_txid_everywhere_gives_the_first_record() {
        // Goal: a stream whose records all carry one txid positions txid >= T at its first
        // record, whatever segment the binary search probes first.
        let seg = || (0..40).map(|_| vec![(7, 1), (7, 1)]).collect::<Vec<_>>();
        let l = log(&[seg(), seg(), seg()], false);
        assert_eq!(at(&l, ReadPosition::TxId(7), None), Dlsn::new(1, 0, 0));
        assert_eq!(at(&l, ReadPosition::TxId(8), None), Dlsn::new(3, 40, 0));
    }

    #[test]
    fn search_reads_log_entries_not_the_stream() {
        // Goal: the in-segment search reads O(log entries) entries: 1,000 entries take at
        // most 12 reads (10 probes and the found entry), not a scan.
        let seg: Vec<Vec<(u64, u64)>> = (0..1000u64).map(|i| vec![(i, i)]).collect();
        let l = log(&[seg.clone(), seg], false);
        let d = at(&l, ReadPosition::TxId(777), None);
        assert_eq!(d, Dlsn::new(1, 777, 0));
        assert!(l.reads.get() <= 12, "{} reads", l.reads.get());
    }

    #[test]
    fn last_n_counts_back_over_segments_and_the_open_one() {
        // Goal: last N walks segments from the end, with the open segment's count from the
        // owner's progress; N above the stream gives the head, N = 0 the tail.
        let l = log(
            &[
                vec![vec![(1, 1), (2, 1)], vec![(3, 1)]],
                vec![],
                vec![vec![(4, 1)], vec![(5, 1), (6, 1)]],
            ],
            true,
        );
        let live = Some((3, 3));
        assert_eq!(at(&l, ReadPosition::LastN(1), live), Dlsn::new(3, 1, 1));
        assert_eq!(at(&l, ReadPosition::LastN(3), live), Dlsn::new(3, 0, 0));
        assert_eq!(at(&l, ReadPosition::LastN(4), live), Dlsn::new(1, 1, 0));
        assert_eq!(at(&l, ReadPosition::LastN(5), live), Dlsn::new(1, 0, 1));
        assert_eq!(at(&l, ReadPosition::LastN(6), live), Dlsn::new(1, 0, 0));
        assert_eq!(at(&l, ReadPosition::LastN(60), live), Dlsn::new(0, 0, 0));
        assert_eq!(at(&l, ReadPosition::LastN(0), live), Dlsn::new(3, 2, 0));
        // The open segment: txid positions search it up to its readable end too.
        assert_eq!(at(&l, ReadPosition::TxId(5), live), Dlsn::new(3, 1, 0));
    }
}

//! A stream's data lifecycle, run by its owner's stream task (DistributedLog
//! `BKLogWriteHandler`'s truncation, retention and rolling, reduced): time-based segment rolls,
//! truncation, retention by age and by size, and deletion of the stream.
//!
//! Every deletion follows one order: the stream record is updated (or deleted) first, by
//! compare-and-set against the version this owner last wrote, so that a proxy that lost the
//! stream meanwhile changes and deletes nothing (its update fails with `BadVersion` and it
//! gives the stream up); only then is each removed segment's ledger metadata deleted. Readers
//! stop seeing a segment when the record changes, before its ledger goes. A crash between the
//! two steps leaves ledger metadata no segment refers to (space is not reclaimed for it), never
//! a segment whose ledger is gone.
//!
//! Segments are deleted oldest first and only as a prefix of the segment list (a segment goes
//! only after every older one), never the segment being written.

use std::time::Duration;

use quire_metadata::{RetentionOverride, SegmentMetadata, SegmentState, TruncationPoint};
use quire_wire::LedgerId;

use super::ownership::Ownership;
use super::record::StreamRecord;
use super::segment::Segments;
use super::shared::now_ms;
use crate::dlsn::Dlsn;
use crate::error::{Error, Result};
use crate::types::{RetentionChange, TruncateResult};

fn to_point(d: Dlsn) -> TruncationPoint {
    TruncationPoint {
        segment_seq_no: d.segment_seq_no,
        entry_id: d.entry_id,
        slot_index: d.slot_index,
    }
}

fn from_point(t: TruncationPoint) -> Dlsn {
    Dlsn::new(t.segment_seq_no, t.entry_id, t.slot_index)
}

/// The retention limits in force for one stream: its overrides, else the cluster defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RetentionLimits {
    pub(super) time: Option<Duration>,
    pub(super) size_bytes: Option<u64>,
}

impl RetentionLimits {
    pub(super) fn resolve(
        o: &RetentionOverride,
        default_time: Option<Duration>,
        default_size: Option<u64>,
    ) -> Self {
        Self {
            time: o.time_secs.map(Duration::from_secs).or(default_time),
            size_bytes: o.size_bytes.or(default_size),
        }
    }
}

/// How many segments at the front of `segments` retention deletes: the longest prefix of
/// completed segments each of which is too old or is needed to bring the stream's bytes
/// (`open_segment_bytes` counts the segment being written) within the size limit. A
/// segment's age is `monotonic_age(seq_no)` when the caller knows it (it completed the segment
/// itself), else `store_now_ms` (now on the metadata store's clock, `clock.rs`; `None`: not
/// known) minus its recorded completion time (on the store's clock too), 0 if that lies in the
/// future (a clock that jumped backwards), if either is unknown. Stops at the first segment
/// that stays, so no hole is ever left.
pub(super) fn retention_prefix(
    segments: &[SegmentMetadata],
    open_segment_bytes: u64,
    limits: RetentionLimits,
    store_now_ms: Option<u64>,
    monotonic_age: impl Fn(u64) -> Option<Duration>,
) -> usize {
    if limits.time.is_none() && limits.size_bytes.is_none() {
        return 0;
    }
    let mut remaining: u64 = segments
        .iter()
        .filter(|s| s.state == SegmentState::Completed)
        .map(|s| s.length_bytes)
        .sum::<u64>()
        .saturating_add(open_segment_bytes);
    let mut n = 0;
    for s in segments {
        if s.state != SegmentState::Completed {
            break;
        }
        let age =
            monotonic_age(s.seq_no).unwrap_or_else(|| match (store_now_ms, s.completion_time_ms) {
                (Some(now), Some(t)) => Duration::from_millis(now.saturating_sub(t)),
                _ => Duration::ZERO,
            });
        let too_old = limits.time.is_some_and(|t| age >= t);
        let too_big = limits.size_bytes.is_some_and(|max| remaining > max);
        if !(too_old || too_big) {
            break;
        }
        remaining -= s.length_bytes.min(remaining);
        n += 1;
    }
    n
}

/// Whether retention needs the metadata store's clock: a time limit applies and some completed
/// segment was not completed by this writer (its age comes from its stored completion time,
/// taken on the store's clock, `clock.rs`).
pub(super) fn retention_needs_store_clock(rec: &StreamRecord, segs: &Segments) -> bool {
    let limits = limits_of(rec);
    limits.time.is_some()
        && rec.meta.value.segments.iter().any(|s| {
            s.state == SegmentState::Completed && !segs.completed_at.contains_key(&s.seq_no)
        })
}

/// The retention limits in force for the stream: its overrides over the proxy's defaults.
fn limits_of(rec: &StreamRecord) -> RetentionLimits {
    RetentionLimits::resolve(
        &rec.meta.value.retention,
        rec.config.retention_time,
        rec.config.retention_size_bytes,
    )
}

/// The oldest segments retention deletes now, as (how many, the truncation point past them);
/// `None` when nothing is due.
pub(super) fn retention_due(rec: &StreamRecord, segs: &Segments) -> Option<(usize, Dlsn)> {
    let open_bytes = segs.current.as_ref().map_or(0, |c| c.size_bytes);
    let store_now = rec.layer.clock.store_now_earliest_ms(now_ms());
    let now = quire_clock::now();
    let n = retention_prefix(
        &rec.meta.value.segments,
        open_bytes,
        limits_of(rec),
        store_now,
        |seq| segs.completed_at.get(&seq).map(|t| now - *t),
    );
    if n == 0 {
        return None;
    }
    let last = rec.meta.value.segments[n - 1].seq_no;
    Some((n, Dlsn::new(last + 1, 0, 0)))
}

/// Caps retention's `n` leading segments of `segments` at those wholly before `floor`, the
/// smallest committed position of the stream's subscriptions (`keep_for_subscriptions`): a
/// subscription resumes at its committed DLSN, so its segment and every later one stay.
/// Returns the new count and the truncation point past it; `None` when nothing may go.
pub(super) fn cap_for_subscriptions(
    segments: &[SegmentMetadata],
    n: usize,
    floor: Option<Dlsn>,
) -> Option<(usize, Dlsn)> {
    let n = match floor {
        None => n,
        Some(f) => segments[..n]
            .iter()
            .take_while(|s| s.seq_no < f.segment_seq_no)
            .count(),
    };
    (n > 0).then(|| (n, Dlsn::new(segments[n - 1].seq_no + 1, 0, 0)))
}

/// The smallest committed position of `rec`'s subscriptions, when its retention keeps what
/// they need and it has any; `None` otherwise (retention as without the setting).
///
/// # Errors
/// `Metadata` when the subscriptions cannot be listed (retention then deletes nothing).
pub(super) async fn subscription_floor(rec: &StreamRecord) -> Result<Option<Dlsn>> {
    if !rec.meta.value.retention.keep_for_subscriptions {
        return Ok(None);
    }
    let subs = rec
        .metadata
        .list_subscriptions(&rec.name)
        .await
        .map_err(|e| rec.meta_err("list subscriptions (retention)", e))?;
    Ok(subs.iter().map(|(_, s)| from_point(s.committed)).min())
}

/// Removes the first `n` segments from the stream record and moves the truncation point
/// up to at least `point` (one compare-and-set), then deletes their ledgers' metadata.
/// Returns how many segments were removed.
///
/// # Errors
/// `OwnershipLost` (lease gone or another writer's version: nothing deleted), `Metadata`.
pub(super) async fn delete_prefix(
    rec: &mut StreamRecord,
    segs: &mut Segments,
    own: &Ownership,
    n: usize,
    point: Dlsn,
) -> Result<u32> {
    own.check()?;
    let mut meta = rec.meta.value.clone();
    let removed: Vec<SegmentMetadata> = meta.segments.drain(..n).collect();
    assert!(
        removed.iter().all(|s| s.state == SegmentState::Completed),
        "only completed segments are deleted"
    );
    let point = to_point(point);
    meta.truncated_before = Some(meta.truncated_before.map_or(point, |t| t.max(point)));
    rec.cas_stream(meta)
        .await
        .map_err(|e| own.update_err("truncate stream", e))?;
    segs.publish(rec);
    forget_cached(rec, segs, &removed);
    for s in &removed {
        delete_ledger_metadata(rec, s.ledger_id).await;
    }
    tracing::info!(stream = %rec.name, segments = removed.len(), truncated_before = %from_point(rec.meta.value.truncated_before.expect("set above")), "deleted segments");
    Ok(removed.len() as u32)
}

/// Drops what readers and retention keep of deleted segments: their ledger readers, their
/// cached entries and their completion times.
fn forget_cached(rec: &StreamRecord, segs: &mut Segments, removed: &[SegmentMetadata]) {
    let mut readers = rec.shared.readers.lock().expect("readers lock");
    let mut cache = rec.shared.cache.lock().expect("cache lock");
    for s in removed {
        readers.remove(&s.ledger_id);
        segs.completed_at.remove(&s.seq_no);
        let keys: Vec<_> = cache
            .entries
            .range((s.ledger_id, 0)..=(s.ledger_id, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some(p) = cache.entries.remove(&k) {
                cache.size_bytes -= p.len();
            }
        }
    }
}

/// Deletes one ledger's metadata (BookKeeper `deleteLedger`); bookies reclaim its space in
/// their garbage collection. Failures are logged, not returned: the stream record no longer
/// refers to the ledger, so what is left is unreclaimed space, not a hole.
pub(super) async fn delete_ledger_metadata(rec: &StreamRecord, ledger: u64) {
    for _ in 0..3 {
        let v = match rec.metadata.read_ledger(LedgerId(ledger)).await {
            Ok(v) => v,
            Err(quire_metadata::Error::NotFound { .. }) => return,
            Err(e) => {
                tracing::warn!(stream = %rec.name, ledger, error = %e, "cannot read the metadata of a deleted segment's ledger; it stays");
                return;
            }
        };
        match rec
            .metadata
            .delete_ledger(LedgerId(ledger), v.version)
            .await
        {
            Ok(()) | Err(quire_metadata::Error::NotFound { .. }) => return,
            // Changed since read (e.g. a late close): read again.
            Err(quire_metadata::Error::BadVersion { .. }) => continue,
            Err(e) => {
                tracing::warn!(stream = %rec.name, ledger, error = %e, "cannot delete the metadata of a deleted segment's ledger; it stays");
                return;
            }
        }
    }
    tracing::warn!(stream = %rec.name, ledger, "the metadata of a deleted segment's ledger kept changing; it stays");
}

/// Truncation before `before` on a healthy writer (see `StreamManager::truncate`): nothing
/// when the point in force is at or past it, else the whole segments before it are deleted
/// and the point moves.
///
/// # Errors
/// `BadRequest` (no record, or `before` beyond the end); what [`delete_prefix`] fails with.
pub(super) async fn truncate(
    rec: &mut StreamRecord,
    segs: &mut Segments,
    own: &Ownership,
    before: Dlsn,
) -> Result<TruncateResult> {
    let current = rec.meta.value.truncated_before.map(from_point);
    if let Some(t) = current.filter(|t| before <= *t) {
        return Ok(TruncateResult {
            truncated_before: t,
            segments_deleted: 0,
        });
    }
    let Some(end) = segs.end_position(rec) else {
        return Err(Error::BadRequest {
            reason: format!(
                "cannot truncate stream {:?} before {before}: it holds no record",
                rec.name
            ),
        });
    };
    if before > end {
        return Err(Error::BadRequest {
            reason: format!(
                "cannot truncate stream {:?} before {before}: beyond its end {end} (the position after its last acknowledged entry)",
                rec.name
            ),
        });
    }
    // Whole segments before the point: completed ones with no entry at or after it.
    let n = rec
        .meta
        .value
        .segments
        .iter()
        .take_while(|s| {
            s.state == SegmentState::Completed
                && (s.seq_no < before.segment_seq_no
                    || (s.seq_no == before.segment_seq_no
                        && s.last_entry.is_none_or(|l| l < before.entry_id)))
        })
        .count();
    let deleted = delete_prefix(rec, segs, own, n, before).await?;
    Ok(TruncateResult {
        truncated_before: from_point(
            rec.meta
                .value
                .truncated_before
                .expect("set by delete_prefix"),
        ),
        segments_deleted: deleted,
    })
}

/// Applies a stream's own compression setting (see `StreamManager::set_compression`) by
/// compare-and-set; returns the setting in force. An unchanged setting writes nothing.
///
/// # Errors
/// `OwnershipLost`, `Metadata`.
pub(super) async fn set_compression(
    rec: &mut StreamRecord,
    own: &Ownership,
    compression: Option<quire_metadata::StreamCompression>,
) -> Result<Option<quire_metadata::StreamCompression>> {
    if rec.meta.value.compression == compression {
        return Ok(compression);
    }
    own.check()?;
    let mut meta = rec.meta.value.clone();
    meta.compression = compression;
    rec.cas_stream(meta)
        .await
        .map_err(|e| own.update_err("set compression", e))?;
    Ok(compression)
}

/// Applies a stream's own write limits (see `StreamManager::set_limits`) by compare-and-set;
/// returns the limits in force. Unchanged limits write nothing; limits that are all 0 are
/// stored as none (the proxy's defaults).
///
/// # Errors
/// `OwnershipLost`, `Metadata`.
pub(super) async fn set_limits(
    rec: &mut StreamRecord,
    own: &Ownership,
    limits: Option<quire_metadata::RateLimits>,
) -> Result<Option<quire_metadata::RateLimits>> {
    let limits = limits.filter(|l| !l.is_unlimited());
    if rec.meta.value.limits == limits {
        return Ok(limits);
    }
    own.check()?;
    let mut meta = rec.meta.value.clone();
    meta.limits = limits;
    rec.cas_stream(meta)
        .await
        .map_err(|e| own.update_err("set limits", e))?;
    Ok(limits)
}

/// Applies a stream's own placement (see `StreamManager::set_placement`) by compare-and-set;
/// returns the placement in force. An unchanged placement writes nothing. The next segment's
/// ledger is placed by it (`segment.rs`, `create_segment_ledger`).
///
/// # Errors
/// `OwnershipLost`, `Metadata`.
pub(super) async fn set_placement(
    rec: &mut StreamRecord,
    own: &Ownership,
    placement: Option<quire_metadata::StreamPlacement>,
) -> Result<Option<quire_metadata::StreamPlacement>> {
    if rec.meta.value.placement == placement {
        return Ok(placement);
    }
    own.check()?;
    let mut meta = rec.meta.value.clone();
    meta.placement = placement.clone();
    rec.cas_stream(meta)
        .await
        .map_err(|e| own.update_err("set placement", e))?;
    Ok(placement)
}

/// Applies retention overrides (see `StreamManager::set_retention`) by compare-and-set;
/// returns the overrides in force. An unchanged value writes nothing.
///
/// # Errors
/// `OwnershipLost`, `Metadata`.
pub(super) async fn set_retention(
    rec: &mut StreamRecord,
    own: &Ownership,
    time_secs: RetentionChange,
    size_bytes: RetentionChange,
    keep_for_subscriptions: Option<bool>,
) -> Result<RetentionOverride> {
    let apply = |v: Option<u64>, c: RetentionChange| match c {
        RetentionChange::Keep => v,
        RetentionChange::Set(x) => Some(x),
        RetentionChange::Default => None,
    };
    let mut meta = rec.meta.value.clone();
    meta.retention = RetentionOverride {
        time_secs: apply(meta.retention.time_secs, time_secs),
        size_bytes: apply(meta.retention.size_bytes, size_bytes),
        keep_for_subscriptions: keep_for_subscriptions
            .unwrap_or(meta.retention.keep_for_subscriptions),
    };
    if meta.retention == rec.meta.value.retention {
        return Ok(meta.retention);
    }
    own.check()?;
    let r = meta.retention;
    rec.cas_stream(meta)
        .await
        .map_err(|e| own.update_err("set retention", e))?;
    Ok(r)
}

/// Deletes the stream record by compare-and-set (DistributedLog `delete`: the record first).
/// Returns false when someone else already deleted it.
///
/// # Errors
/// `OwnershipLost` (lease gone or another writer's version: nothing deleted), `Metadata`.
pub(super) async fn delete_record(rec: &StreamRecord, own: &Ownership) -> Result<bool> {
    own.check()?;
    match rec
        .metadata
        .delete_stream(&rec.name, rec.meta.version)
        .await
    {
        Ok(()) => Ok(true),
        Err(quire_metadata::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(own.update_err("delete stream", e)),
    }
}

/// After the record is deleted: the segments' ledgers' metadata (the open segment's ledger
/// writer goes without a close, its ledger is deleted here too) and the spare. Returns how
/// many segments there were.
pub(super) async fn delete_segments(rec: &mut StreamRecord, segs: &mut Segments) -> u32 {
    segs.current = None;
    segs.discard_spare(rec).await;
    let segments = std::mem::take(&mut rec.meta.value.segments);
    for s in &segments {
        delete_ledger_metadata(rec, s.ledger_id).await;
    }
    tracing::info!(stream = %rec.name, segments = segments.len(), "deleted stream");
    segments.len() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(
        seq_no: u64,
        completed: bool,
        bytes: u64,
        completion_ms: Option<u64>,
    ) -> SegmentMetadata {
        SegmentMetadata {
            seq_no,
            ledger_id: seq_no,
            state: if completed {
                SegmentState::Completed
            } else {
                SegmentState::InProgress
            },
            first_txid: None,
            last_txid: None,
            last_entry: Some(0),
            record_count: 1,
            length_bytes: bytes,
            completion_time_ms: completion_ms,
            first_write_time_ms: None,
            last_write_time_ms: None,
            last_record_entry: None,
            last_record_slot: None,
        }
    }

    const HOUR_MS: u64 = 3_600_000;

    #[test]
    fn retention_by_age_deletes_an_oldest_prefix_only() {
        // Goal: time retention deletes the old segments from the front and stops at the first
        // young one (no hole), never the one being written. Method: a table of completion
        // times around a 2 h limit, wall clock only.
        let now = 100 * HOUR_MS;
        let limits = RetentionLimits {
            time: Some(Duration::from_secs(2 * 3600)),
            size_bytes: None,
        };
        let segs = vec![
            seg(1, true, 10, Some(now - 5 * HOUR_MS)),
            seg(2, true, 10, Some(now - 3 * HOUR_MS)),
            seg(3, true, 10, Some(now - HOUR_MS)),
            // Older than 3 but behind it: must wait (no hole).
            seg(4, true, 10, Some(now - 4 * HOUR_MS)),
            seg(5, false, 0, None),
        ];
        assert_eq!(retention_prefix(&segs, 0, limits, Some(now), |_| None), 2);
        // The segment being written is never deleted, however old the rest.
        let all_old = vec![seg(1, true, 10, Some(0)), seg(2, false, 0, None)];
        assert_eq!(
            retention_prefix(&all_old, 0, limits, Some(now), |_| None),
            1
        );
    }

    #[test]
    fn retention_by_size_keeps_the_newest_bytes() {
        // Goal: size retention deletes oldest completed segments while the total (the open
        // segment's bytes included) is above the limit, and no more.
        let limits = RetentionLimits {
            time: None,
            size_bytes: Some(25),
        };
        let segs = vec![
            seg(1, true, 10, Some(0)),
            seg(2, true, 10, Some(0)),
            seg(3, true, 10, Some(0)),
            seg(4, false, 0, None),
        ];
        // 30 bytes completed: dropping segment 1 leaves 20 <= 25.
        assert_eq!(retention_prefix(&segs, 0, limits, Some(0), |_| None), 1);
        // With 12 bytes in the open segment: 42 -> 32 -> 22.
        assert_eq!(retention_prefix(&segs, 12, limits, Some(0), |_| None), 2);
        // Never the open segment, even when it alone is above the limit.
        assert_eq!(retention_prefix(&segs, 100, limits, Some(0), |_| None), 3);
        let none = RetentionLimits {
            time: None,
            size_bytes: None,
        };
        assert_eq!(retention_prefix(&segs, 100, none, Some(0), |_| None), 0);
    }

    #[test]
    fn clock_jumps_neither_stop_nor_rush_retention() {
        // Goal: wall-clock jumps do not change the age of segments this owner completed (the
        // monotonic age wins), and a completion time in the future (clock moved backwards)
        // counts as age 0 instead of wrapping. Method: the same segments judged at a wall
        // clock far behind and far ahead of their completion times.
        let limits = RetentionLimits {
            time: Some(Duration::from_secs(3600)),
            size_bytes: None,
        };
        let t = 200_000 * HOUR_MS;
        let segs = vec![
            seg(1, true, 10, Some(t)),
            seg(2, true, 10, Some(t)),
            seg(3, false, 0, None),
        ];
        // Clock jumped 10 years back: segment 1's monotonic age (2 h) still expires it;
        // segment 2 (no monotonic age, completion in the future) is kept, not wrapped to huge.
        let mono = |seq| (seq == 1).then(|| Duration::from_secs(2 * 3600));
        assert_eq!(
            retention_prefix(&segs, 0, limits, Some(t - 87_600 * HOUR_MS), mono),
            1
        );
        assert_eq!(retention_prefix(&segs, 0, limits, Some(0), |_| None), 0);
        // Clock jumped 10 years ahead: segments this owner completed a minute ago stay.
        let recent = |_| Some(Duration::from_secs(60));
        assert_eq!(
            retention_prefix(&segs, 0, limits, Some(t + 87_600 * HOUR_MS), recent),
            0
        );
    }

    #[test]
    fn without_the_store_clock_no_segment_is_aged_by_wall_clock() {
        // Goal: a segment another proxy completed is not deleted by age while the store's
        // clock is unknown (no proxy's own clock alone decides), but size retention and
        // monotonic ages still apply.
        let limits = RetentionLimits {
            time: Some(Duration::from_secs(60)),
            size_bytes: None,
        };
        let segs = vec![
            seg(1, true, 10, Some(0)),
            seg(2, true, 10, Some(0)),
            seg(3, false, 0, None),
        ];
        assert_eq!(retention_prefix(&segs, 0, limits, None, |_| None), 0);
        let mono = |seq| (seq == 1).then(|| Duration::from_secs(61));
        assert_eq!(retention_prefix(&segs, 0, limits, None, mono), 1);
        let size = RetentionLimits {
            time: None,
            size_bytes: Some(10),
        };
        assert_eq!(retention_prefix(&segs, 0, size, None, |_| None), 1);
    }

    #[test]
    fn subscriptions_cap_retention() {
        // Goal: with a subscription floor, retention deletes only segments wholly before the
        // floor's segment; without one, what retention chose.
        let segs: Vec<SegmentMetadata> = (1..=4u64).map(|s| seg(s, true, 10, None)).collect();
        assert_eq!(
            cap_for_subscriptions(&segs, 3, None),
            Some((3, Dlsn::new(4, 0, 0)))
        );
        assert_eq!(
            cap_for_subscriptions(&segs, 3, Some(Dlsn::new(2, 5, 1))),
            Some((1, Dlsn::new(2, 0, 0)))
        );
        assert_eq!(
            cap_for_subscriptions(&segs, 3, Some(Dlsn::new(1, 0, 0))),
            None
        );
        assert_eq!(
            cap_for_subscriptions(&segs, 2, Some(Dlsn::new(9, 0, 0))),
            Some((2, Dlsn::new(3, 0, 0)))
        );
    }

    #[test]
    fn overrides_win_over_defaults_field_by_field() {
        let o = RetentionOverride {
            time_secs: Some(5),
            size_bytes: None,
            keep_for_subscriptions: false,
        };
        let l = RetentionLimits::resolve(&o, Some(Duration::from_secs(9)), Some(7));
        assert_eq!(l.time, Some(Duration::from_secs(5)));
        assert_eq!(l.size_bytes, Some(7));
    }
}

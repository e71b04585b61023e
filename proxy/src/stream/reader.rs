//! Reads (DistributedLog `BKAsyncLogReader`, reduced): a read follows the segment list the
//! stream task publishes, takes entries from the tail cache or reads them from the bookies
//! through cached ledger readers (a few entries ahead), and waits at the tail for the LAC to move.
//! A stream owned by another proxy is read the same way from this proxy's follower of it
//! (`follower.rs`), which publishes the same view; readers never need the owner.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use quire_ledger::BookKeeper;
use quire_wire::{EntryId, LedgerId};

use tokio::sync::watch;

use super::compress;
use super::follower::{self, Follower};
use super::ownership::StreamHandle;
use super::position;
use super::registry::Registry;
use super::shared::{storage, StreamShared};
use super::tail_cache::{SegmentView, TailState};
use crate::dlsn::{Dlsn, ReadPosition};
use crate::error::{Error, Result};
use crate::protocol::{READ_RECORD_OVERHEAD_BYTES, READ_RECORD_WRITE_TIME_BYTES};
use crate::record_set;
use crate::types::ReadBatch;

const READERS_CACHED_MAX: usize = 16;

/// Entries a reader fetches concurrently ahead of the one it decodes.
const READ_AHEAD_ENTRIES_MAX: usize = 4;

/// Records read from one segment: `(dlsn, txid, payload)`, their write times, where the next
/// read continues, and whether the end-of-stream marker was reached.
struct SegmentRead {
    records: Vec<(Dlsn, u64, Vec<u8>)>,
    write_times_ms: Vec<u64>,
    next: Dlsn,
    end_of_stream: bool,
}

/// Reads up to `max_records` records (and about `max_bytes` payload bytes, but at least one
/// record when one is readable) from `from`, across segment boundaries; in the segment being
/// written only entries up to the writer's LAC are visible. When nothing is readable at
/// `from`, waits up to `wait` for a write to make something readable. Positions other than a
/// DLSN are resolved first (`position.rs`); a read that reaches the end-of-stream marker of a
/// sealed stream answers with what it has and `end_of_stream` set.
///
/// The stream is read from its owner's state when this proxy owns it (or takes it, when nobody
/// does), else from this proxy's follower of it (`follower.rs`); a read without a wait that
/// finds nothing past `from` on the follower is answered by the owner (`OwnedElsewhere`).
///
/// # Errors
/// `NoSuchStream`, `InvalidStreamName`, `BadRequest` (`max_records` = 0), `Storage`,
/// `Metadata`, `Truncated` (an explicit DLSN before the truncation point).
pub(super) async fn read(
    registry: &Registry,
    name: &str,
    from: ReadPosition,
    max_records: u32,
    max_bytes: u32,
    wait: Duration,
) -> Result<ReadBatch> {
    if max_records == 0 {
        return Err(Error::BadRequest {
            reason: "max_records must be at least 1".into(),
        });
    }
    let mut handle = source(registry, name).await?;
    let deadline = tokio::time::Instant::now() + wait;
    let mut tail = handle.tail.clone();
    let mut pos = start(registry, &handle, from).await?;
    loop {
        // Truncation (checked again after every wait, as it may move meanwhile): a read
        // from the head (or a txid, time, tail or last-N position) starts at the point, one
        // from an earlier DLSN is refused rather than silently moved (DistributedLog
        // `AlreadyTruncatedTransactionException`).
        let point = tail.borrow().truncated_before;
        if let Some(t) = point.filter(|t| pos < *t) {
            if let ReadPosition::Dlsn(d) = from {
                return Err(Error::Truncated {
                    stream: name.to_string(),
                    requested: d,
                    truncated_before: t,
                });
            }
            pos = t;
        }
        let plan = tail.borrow_and_update().resolve(pos);
        match plan {
            Some((seg, start)) => {
                let read = read_segment(
                    registry,
                    &handle,
                    &seg,
                    start,
                    max_records as usize,
                    max_bytes as usize,
                )
                .await;
                let got = match read {
                    Ok(r) => r,
                    // The segment was deleted under the read (truncation or retention):
                    // start over, which answers TRUNCATED or moves a head read on.
                    Err(_) if tail.borrow().truncated_before.is_some_and(|t| pos < t) => continue,
                    Err(e) => return Err(e),
                };
                if !got.records.is_empty() || got.end_of_stream {
                    return Ok(ReadBatch {
                        records: got.records,
                        write_times_ms: got.write_times_ms,
                        next: ReadPosition::Dlsn(got.next),
                        end_of_stream: got.end_of_stream,
                    });
                }
                // Only slots past the end of an entry were asked for: move on.
                pos = got.next;
            }
            // Past the end of a sealed stream: nothing will come.
            None if tail.borrow().sealed => return Ok(empty_batch(from, pos, true)),
            None if wait.is_zero() && handle.following => {
                // A follower's end lags the owner's by the entries whose LAC has not reached
                // the bookies yet (up to `lac_advance_delay`), and a new follower has not
                // fetched anything yet: "nothing more now" is the owner's answer to give.
                match registry.stream(name, false, false).await {
                    Ok(h) => {
                        // The owner went away meanwhile and this proxy took the stream.
                        handle = Source::owner(&h);
                        tail = handle.tail.clone();
                    }
                    Err(e) => return Err(e),
                }
            }
            None => {
                if tokio::time::Instant::now() < deadline {
                    crate::metrics::mark_read_waiting();
                }
                let woke = tokio::time::timeout_at(deadline, tail.changed()).await;
                match woke {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) | Err(_) => return Ok(empty_batch(from, pos, false)),
                }
            }
        }
    }
}

/// What a read is served from: a stream task of this proxy (owner) or a follower.
struct Source {
    name: String,
    tail: watch::Receiver<TailState>,
    shared: Arc<StreamShared>,
    /// Served by a follower (another proxy owns the stream).
    following: bool,
}

impl Source {
    fn owner(h: &StreamHandle) -> Self {
        Self {
            name: h.name.clone(),
            tail: h.tail.clone(),
            shared: h.shared.clone(),
            following: false,
        }
    }

    fn follower(f: &Follower) -> Self {
        Self {
            name: f.name.clone(),
            tail: f.tail.clone(),
            shared: f.shared.clone(),
            following: true,
        }
    }
}

/// The owner's state when this proxy owns `name`; else this proxy's live follower of it; else
/// an acquisition (a stream nobody owns is taken, as before follower reads: its in-progress
/// segment left by a dead owner must be recovered before its last records are readable), and
/// when another proxy owns it, a new follower.
async fn source(registry: &Registry, name: &str) -> Result<Source> {
    if registry.owned(name).is_none() {
        if let Some(f) = registry.followers.live(name) {
            return Ok(Source::follower(&f));
        }
    }
    match registry.stream(name, false, false).await {
        Ok(h) => Ok(Source::owner(&h)),
        Err(Error::OwnedElsewhere { .. }) if registry.config.follower_reads => {
            let f = registry
                .followers
                .follow(&registry.follower_context(), name)
                .await?;
            Ok(Source::follower(&f))
        }
        Err(e) => Err(e),
    }
}

/// An answer without records: `next` is the position asked for when it was the head or a
/// DLSN, else the DLSN the position resolved to, so that a tail read resumed from it misses
/// nothing written meanwhile.
fn empty_batch(from: ReadPosition, pos: Dlsn, end_of_stream: bool) -> ReadBatch {
    let next = match from {
        ReadPosition::Head | ReadPosition::Dlsn(_) => from,
        _ => ReadPosition::Dlsn(pos),
    };
    ReadBatch {
        records: Vec::new(),
        write_times_ms: Vec::new(),
        next,
        end_of_stream,
    }
}

/// The DLSN a read from `from` starts at (`position.rs`), against the segments readers see
/// now and the owner's acknowledged progress of the segment being written.
async fn start(registry: &Registry, handle: &Source, from: ReadPosition) -> Result<Dlsn> {
    // Progress first, then the segment list: the list is at least as new as the progress.
    let live = handle
        .shared
        .view
        .lock()
        .expect("view lock")
        .live
        .map(|(seq, _, records, _)| (seq, records));
    let snapshot = handle.tail.borrow().clone();
    let fetch = |ledger: u64, entry: u64| {
        let (bk, shared, name) = (
            registry.bookkeeper.clone(),
            handle.shared.clone(),
            handle.name.clone(),
        );
        async move { fetch_entry(&bk, &shared, &name, ledger, entry).await }
    };
    position::resolve(&handle.name, &snapshot, live, from, fetch).await
}

/// Whether a read of `name` from `from` would fetch its first entry from the bookies (a
/// catch-up read) rather than take it from the tail cache or wait at the tail. `false` when
/// the stream is not acquired by this proxy, or its acquisition is over (the read itself then
/// acquires it or answers with a redirect). The server runs catch-up reads on its
/// lower-priority read runtime.
pub(super) fn is_catch_up_read(registry: &Registry, name: &str, from: ReadPosition) -> bool {
    let Some(handle) = registry.acquired(name) else {
        return false;
    };
    if handle.lost_reason().is_some() {
        // The read would acquire the stream afresh: not a catch-up read's business.
        return false;
    }
    let pos = match from {
        ReadPosition::Head => Dlsn::new(0, 0, 0),
        ReadPosition::Dlsn(d) => d,
        // Found by a search that reads entries itself: not worth predicting here.
        _ => return false,
    };
    let Some((seg, start)) = handle.tail.borrow().resolve(pos) else {
        return false;
    };
    let cache = handle.shared.cache.lock().expect("cache lock");
    !cache.entries.contains_key(&(seg.ledger_id, start.entry_id))
}

/// Entries fetched concurrently ahead of the one being decoded (up to
/// [`READ_AHEAD_ENTRIES_MAX`]), consumed in entry order; fetches not taken are aborted when
/// it is dropped.
struct ReadAhead<'a> {
    registry: &'a Registry,
    handle: &'a Source,
    ledger: u64,
    last: u64,
    fetch_next: u64,
    window: VecDeque<tokio::task::JoinHandle<Result<Arc<Vec<u8>>>>>,
}

impl ReadAhead<'_> {
    /// The next entry's payload.
    async fn next(&mut self) -> Result<Arc<Vec<u8>>> {
        while self.fetch_next <= self.last && self.window.len() < READ_AHEAD_ENTRIES_MAX {
            let (bk, shared, name, ledger, e) = (
                self.registry.bookkeeper.clone(),
                self.handle.shared.clone(),
                self.handle.name.clone(),
                self.ledger,
                self.fetch_next,
            );
            self.window.push_back(tokio::spawn(async move {
                fetch_entry(&bk, &shared, &name, ledger, e).await
            }));
            self.fetch_next += 1;
        }
        let fetched = self
            .window
            .pop_front()
            .expect("window holds the current entry")
            .await;
        match fetched {
            Ok(r) => r,
            Err(join) => Err(Error::Internal(format!("entry fetch task failed: {join}"))),
        }
    }
}

impl Drop for ReadAhead<'_> {
    fn drop(&mut self) {
        for h in self.window.drain(..) {
            h.abort();
        }
    }
}

async fn read_segment(
    registry: &Registry,
    handle: &Source,
    seg: &SegmentView,
    start: Dlsn,
    max_records: usize,
    max_bytes: usize,
) -> Result<SegmentRead> {
    let last = seg
        .readable_last_entry
        .expect("resolve returns readable segments only");
    let mut out = SegmentRead {
        records: Vec::new(),
        write_times_ms: Vec::new(),
        next: start,
        end_of_stream: false,
    };
    let mut bytes = 0usize;
    let mut slot_first = start.slot_index as usize;
    let mut ahead = ReadAhead {
        registry,
        handle,
        ledger: seg.ledger_id,
        last,
        fetch_next: start.entry_id,
        window: VecDeque::new(),
    };
    for entry in start.entry_id..=last {
        let payload = ahead.next().await?;
        let set = record_set::decode(&payload).map_err(|e| Error::Storage {
            stream: handle.name.clone(),
            op: "decode record set",
            source: format!("ledger {} entry {entry}: {e}", seg.ledger_id).into(),
        })?;
        if set.end_of_stream {
            // DistributedLog's reader stops at the marker: nothing follows it.
            out.next = Dlsn::new(seg.seq_no, entry, 0);
            out.end_of_stream = true;
            return Ok(out);
        }
        let full = take_records(
            &mut out,
            &mut bytes,
            (seg.seq_no, entry),
            &set,
            slot_first,
            (max_records, max_bytes),
        );
        if full {
            return Ok(out);
        }
        if slot_first >= set.records.len() {
            out.next = Dlsn::new(seg.seq_no, entry + 1, 0);
        }
        slot_first = 0;
        if out.records.len() >= max_records || bytes >= max_bytes {
            break;
        }
    }
    Ok(out)
}

/// Takes the records of entry `at` (seq no, entry id) from `slot_first` into `out` while the
/// batch has room (`limits`: records, payload bytes; at least one record); returns true once
/// it is full before the entry's end. Records written before record set v3 get write time 0.
fn take_records(
    out: &mut SegmentRead,
    bytes: &mut usize,
    at: (u64, u64),
    set: &record_set::RecordSet<'_>,
    slot_first: usize,
    limits: (usize, usize),
) -> bool {
    let (seq_no, entry) = at;
    let count = set.records.len();
    let write_time = set.write_time_ms.unwrap_or(0);
    for (slot, rec) in set.records.iter().enumerate().skip(slot_first) {
        let size = rec.payload.len() + READ_RECORD_OVERHEAD_BYTES + READ_RECORD_WRITE_TIME_BYTES;
        if !out.records.is_empty() && (out.records.len() >= limits.0 || *bytes + size > limits.1) {
            return true;
        }
        let slot_index = u32::try_from(slot).expect("slot count bounded by entry size");
        out.records.push((
            Dlsn::new(seq_no, entry, slot_index),
            rec.txid,
            rec.payload.to_vec(),
        ));
        out.write_times_ms.push(write_time);
        *bytes += size;
        out.next = if slot + 1 < count {
            Dlsn::new(seq_no, entry, slot_index + 1)
        } else {
            Dlsn::new(seq_no, entry + 1, 0)
        };
    }
    false
}

/// One entry's payload: from the tail cache (which holds entries plain, as the writer made
/// them before compressing: `writer::InFlight::plain`), else from the bookies through a cached
/// reader, decompressed when stored LZ4-compressed (`compress.rs`); callers decode it as it is.
pub(super) async fn fetch_entry(
    bookkeeper: &BookKeeper,
    shared: &StreamShared,
    name: &str,
    ledger: u64,
    entry: u64,
) -> Result<Arc<Vec<u8>>> {
    let hit = shared
        .cache
        .lock()
        .expect("cache lock")
        .entries
        .get(&(ledger, entry))
        .cloned();
    if let Some(fc) = &shared.follower {
        let counter = if hit.is_some() {
            &fc.stats.follower_cache_hits
        } else {
            &fc.stats.follower_cache_misses
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    if let Some(p) = hit {
        return Ok(p);
    }
    // A cached reader may predate a change of the ledger's metadata: retry once with a
    // freshly opened one before giving up.
    let mut last_err = None;
    for attempt in 0..2 {
        let cached = if attempt == 0 {
            shared
                .readers
                .lock()
                .expect("readers lock")
                .get(&ledger)
                .cloned()
        } else {
            None
        };
        let reader = match cached {
            Some(r) => r,
            None => {
                let r = bookkeeper
                    .open_ledger(LedgerId(ledger))
                    .await
                    .map_err(|e| storage(name, "open ledger", e))?;
                let mut readers = shared.readers.lock().expect("readers lock");
                if readers.len() >= READERS_CACHED_MAX {
                    readers.clear();
                }
                readers.insert(ledger, r.clone());
                r
            }
        };
        match reader.read(EntryId(entry)).await {
            Ok(p) => {
                let plain = compress::plain_shared(name, ledger, entry, Arc::new(p))?;
                // A follower's readers share what one of them fetched (catch-up reads).
                follower::cache_insert(shared, (ledger, entry), plain.clone());
                return Ok(plain);
            }
            Err(e) => {
                shared.readers.lock().expect("readers lock").remove(&ledger);
                last_err = Some(e);
            }
        }
    }
    Err(storage(
        name,
        "read entry",
        last_err.expect("two failed attempts"),
    ))
}

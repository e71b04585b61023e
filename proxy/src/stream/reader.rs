//! Reads (DistributedLog `BKAsyncLogReader`, reduced): a read follows the segment list the
//! stream task publishes, takes entries from the tail cache or reads them from the bookies
//! through cached ledger readers (a few entries ahead), and waits at the tail for the LAC to move.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use quire_ledger::BookKeeper;
use quire_wire::{EntryId, LedgerId};

use super::ownership::StreamHandle;
use super::registry::Registry;
use super::shared::{storage, StreamShared};
use super::tail_cache::SegmentView;
use crate::dlsn::{Dlsn, ReadPosition};
use crate::error::{Error, Result};
use crate::record_set;
use crate::types::ReadBatch;

const READERS_CACHED_MAX: usize = 16;

/// Entries a reader fetches concurrently ahead of the one it decodes.
const READ_AHEAD_ENTRIES_MAX: usize = 4;

/// Reads up to `max_records` records (and about `max_bytes` payload bytes, but at least one
/// record when one is readable) from `from`, across segment boundaries; in the segment being
/// written only entries up to the writer's LAC are visible. When nothing is readable at
/// `from`, waits up to `wait` for a write to make something readable.
///
/// # Errors
/// `NoSuchStream`, `InvalidStreamName`, `BadRequest` (`max_records` = 0), `Storage`,
/// `OwnedElsewhere` (reads are served by the stream's owner only).
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
    let handle = registry.stream(name, false, false).await?;
    let deadline = tokio::time::Instant::now() + wait;
    let mut tail = handle.tail.clone();
    let mut pos = match from {
        ReadPosition::Head => Dlsn::new(0, 0, 0),
        ReadPosition::Dlsn(d) => d,
    };
    loop {
        // Truncation (checked again after every wait, as it may move meanwhile): a read
        // from the head starts at the point, one from an earlier DLSN is refused rather
        // than silently moved (DistributedLog `AlreadyTruncatedTransactionException`).
        let point = tail.borrow().truncated_before;
        if let Some(t) = point.filter(|t| pos < *t) {
            match from {
                ReadPosition::Head => pos = t,
                ReadPosition::Dlsn(d) => {
                    return Err(Error::Truncated {
                        stream: name.to_string(),
                        requested: d,
                        truncated_before: t,
                    })
                }
            }
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
                let (records, next) = match read {
                    Ok(r) => r,
                    // The segment was deleted under the read (truncation or retention):
                    // start over, which answers TRUNCATED or moves a head read on.
                    Err(_) if tail.borrow().truncated_before.is_some_and(|t| pos < t) => continue,
                    Err(e) => return Err(e),
                };
                if !records.is_empty() {
                    return Ok(ReadBatch {
                        records,
                        next: ReadPosition::Dlsn(next),
                    });
                }
                // Only slots past the end of an entry were asked for: move on.
                pos = next;
            }
            None => {
                let woke = tokio::time::timeout_at(deadline, tail.changed()).await;
                match woke {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) | Err(_) => {
                        return Ok(ReadBatch {
                            records: Vec::new(),
                            next: from,
                        })
                    }
                }
            }
        }
    }
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
    };
    let Some((seg, start)) = handle.tail.borrow().resolve(pos) else {
        return false;
    };
    let cache = handle.shared.cache.lock().expect("cache lock");
    !cache.entries.contains_key(&(seg.ledger_id, start.entry_id))
}

async fn read_segment(
    registry: &Registry,
    handle: &StreamHandle,
    seg: &SegmentView,
    start: Dlsn,
    max_records: usize,
    max_bytes: usize,
) -> Result<(Vec<(Dlsn, u64, Vec<u8>)>, Dlsn)> {
    let last = seg
        .readable_last_entry
        .expect("resolve returns readable segments only");
    let mut out = Vec::new();
    let mut bytes = 0usize;
    let mut next = start;
    let mut slot_first = start.slot_index as usize;
    // Read ahead: up to READ_AHEAD_ENTRIES_MAX entries are fetched concurrently, consumed
    // in entry order; fetches not needed are aborted when the batch is full.
    let mut ahead: VecDeque<tokio::task::JoinHandle<Result<Arc<Vec<u8>>>>> = VecDeque::new();
    let mut fetch_next = start.entry_id;
    let abort_all = |ahead: &mut VecDeque<tokio::task::JoinHandle<Result<Arc<Vec<u8>>>>>| {
        for h in ahead.drain(..) {
            h.abort();
        }
    };
    for entry in start.entry_id..=last {
        while fetch_next <= last && ahead.len() < READ_AHEAD_ENTRIES_MAX {
            let (bk, shared, name, ledger, e) = (
                registry.bookkeeper.clone(),
                handle.shared.clone(),
                handle.name.clone(),
                seg.ledger_id,
                fetch_next,
            );
            ahead.push_back(tokio::spawn(async move {
                fetch_entry(&bk, &shared, &name, ledger, e).await
            }));
            fetch_next += 1;
        }
        let fetched = ahead
            .pop_front()
            .expect("window holds the current entry")
            .await;
        let payload = match fetched {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                abort_all(&mut ahead);
                return Err(e);
            }
            Err(join) => {
                abort_all(&mut ahead);
                return Err(Error::Internal(format!("entry fetch task failed: {join}")));
            }
        };
        let set = record_set::decode(&payload).map_err(|e| Error::Storage {
            stream: handle.name.clone(),
            op: "decode record set",
            source: format!("ledger {} entry {entry}: {e}", seg.ledger_id).into(),
        })?;
        let count = set.records.len();
        for (slot, rec) in set.records.iter().enumerate().skip(slot_first) {
            let size = rec.payload.len() + crate::protocol::READ_RECORD_OVERHEAD_BYTES;
            if !out.is_empty() && (out.len() >= max_records || bytes + size > max_bytes) {
                abort_all(&mut ahead);
                return Ok((out, next));
            }
            let slot_index = u32::try_from(slot).expect("slot count bounded by entry size");
            out.push((
                Dlsn::new(seg.seq_no, entry, slot_index),
                rec.txid,
                rec.payload.to_vec(),
            ));
            bytes += size;
            next = if slot + 1 < count {
                Dlsn::new(seg.seq_no, entry, slot_index + 1)
            } else {
                Dlsn::new(seg.seq_no, entry + 1, 0)
            };
        }
        if slot_first >= count {
            next = Dlsn::new(seg.seq_no, entry + 1, 0);
        }
        slot_first = 0;
        if out.len() >= max_records || bytes >= max_bytes {
            break;
        }
    }
    abort_all(&mut ahead);
    Ok((out, next))
}

/// One entry's payload: from the tail cache, else from the bookies through a cached reader.
async fn fetch_entry(
    bookkeeper: &BookKeeper,
    shared: &StreamShared,
    name: &str,
    ledger: u64,
    entry: u64,
) -> Result<Arc<Vec<u8>>> {
    if let Some(p) = shared
        .cache
        .lock()
        .expect("cache lock")
        .entries
        .get(&(ledger, entry))
    {
        return Ok(p.clone());
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
            Ok(p) => return Ok(Arc::new(p)),
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

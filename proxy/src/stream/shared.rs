//! State and helpers shared by a stream's task, its readers and the manager: the leaf of the
//! stream layer's module graph (it imports no sibling but `tail_cache`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use quire_ledger::LedgerReader;
use quire_metadata::StreamMetadata;

use super::tail_cache::TailCache;
use crate::error::Error;

/// This proxy's wall clock in milliseconds since the Unix epoch (0 before it).
pub(super) fn now_ms() -> u64 {
    quire_clock::unix_ms()
}

/// A ledger error as the stream layer's `Storage` error for `stream` and `op`.
pub(super) fn storage(stream: &str, op: &'static str, e: quire_ledger::Error) -> Error {
    Error::Storage {
        stream: stream.to_string(),
        op,
        source: Box::new(e),
    }
}

/// A ledger error of the writer: `Fenced` means another writer recovered the segment under
/// this one (BookKeeper `LedgerFencedException`), i.e. ownership is lost.
pub(super) fn writer_storage(stream: &str, op: &'static str, e: quire_ledger::Error) -> Error {
    match e {
        quire_ledger::Error::Fenced { ledger } => Error::OwnershipLost {
            stream: stream.to_string(),
            reason: format!("{op}: ledger {ledger} was fenced, another writer recovered the segment under this one"),
        },
        other => storage(stream, op, other),
    }
}

/// State shared between a stream's task and its readers.
#[derive(Default)]
pub(super) struct StreamShared {
    pub(super) cache: Mutex<TailCache>,
    /// The stream's home region as its record said when this acquisition began (`None`:
    /// no home), for the balancer.
    pub(super) home_region: std::sync::OnceLock<String>,
    /// Open ledger readers by ledger id, bounded by `READERS_CACHED_MAX`.
    pub(super) readers: Mutex<HashMap<u64, LedgerReader>>,
    /// Set (with the reason) once the stream task lost ownership and gave the stream up.
    pub(super) lost: Mutex<Option<String>>,
    /// True once some request was answered with `OwnershipLost` for this acquisition.
    pub(super) loss_reported: AtomicBool,
    /// True once the stream was deleted by this acquisition (then `lost` is set too): later
    /// requests find no stream, or create a new one, instead of hearing `OwnershipLost`.
    pub(super) deleted: AtomicBool,
    /// The owner's view of the stream for `describe`: the record it last wrote and the
    /// acknowledged progress of the segment being written, changed together under one lock.
    pub(super) view: Mutex<OwnerView>,
    /// The stream task's last txid (acknowledged or in flight: what the order rule and the
    /// txid guard compare with), for `describe`; the stored `max_txid` lags behind it until
    /// the open segment completes. Written only through `Writer::set_last_txid`.
    pub(super) last_txid: Mutex<Option<u64>>,
    /// Requests that obtained this acquisition (reads, writes, lifecycle commands, sweeps):
    /// a stream acquired for a sweep is given back only if no request came after it.
    pub(super) requests: AtomicU64,
    /// True once this acquisition was given back after a sweep (then `lost` is set too):
    /// commands that find the task gone acquire the stream afresh.
    pub(super) released: AtomicBool,
    /// Set by the balancer when it asks the task to give the stream to its preferred owner
    /// (`placement.rs`): requests that find the stream released are redirected there.
    pub(super) moved_to: Mutex<Option<String>>,
    /// Set on a follower's state (`follower.rs`), never on an owner's: entries read from the
    /// bookies go into `cache` up to its bound, and cache hits and misses are counted.
    pub(super) follower: Option<FollowerCache>,
    /// Writes handed to this acquisition's task: (records, payload bytes) since it began, and
    /// the counts at the last balancer ticks (`placement.rs`: the hottest stream's load).
    pub(super) written: Mutex<Written>,
}

/// A stream's write counts for its owner's load (see `StreamShared::written`).
#[derive(Default)]
pub(super) struct Written {
    records: u64,
    bytes: u64,
    /// (records, bytes) at the last ticks, oldest first.
    marks: std::collections::VecDeque<(u64, u64)>,
}

impl Written {
    /// Counts a write of `records` records and `bytes` payload bytes.
    pub(super) fn add(&mut self, records: u64, bytes: u64) {
        self.records += records;
        self.bytes += bytes;
    }

    /// Takes a tick's mark, keeping the last `window + 1`, and returns the (bytes, records)
    /// written since the oldest kept.
    pub(super) fn sample(&mut self, window: usize) -> (u64, u64) {
        self.marks.push_back((self.records, self.bytes));
        while self.marks.len() > window + 1 {
            self.marks.pop_front();
        }
        let (r0, b0) = self.marks[0];
        (self.bytes - b0, self.records - r0)
    }
}

/// The cache settings and counters of a follower's [`StreamShared`].
pub(super) struct FollowerCache {
    pub(super) stats: Arc<super::clock::LayerStats>,
    pub(super) bytes_max: usize,
}

/// The owner's view of a stream (see `StreamShared::view`). A describe takes both parts at
/// once, so that a roll (the segment completed in the record, the next one started) is never
/// seen half done: the segment being written always shows its acknowledged counts.
#[derive(Default)]
pub(super) struct OwnerView {
    /// The stream record as the owner last wrote or read it.
    pub(super) meta: Option<Arc<quire_metadata::Versioned<StreamMetadata>>>,
    /// The in-progress segment's (seq no, last acknowledged entry, records, payload bytes).
    pub(super) live: Option<(u64, u64, u64, u64)>,
    /// The in-progress segment's last acknowledged record: (seq no, entry, slot, write time).
    pub(super) live_last_record: Option<(u64, u64, u32, u64)>,
}

impl OwnerView {
    /// `meta` with the segment being written filled in from `live`.
    pub(super) fn describe(
        meta: &mut StreamMetadata,
        live: Option<(u64, u64, u64, u64)>,
        live_last_record: Option<(u64, u64, u32, u64)>,
    ) {
        let Some((seq, entry, records, bytes)) = live else {
            return;
        };
        let last_record = live_last_record.filter(|l| l.0 == seq);
        if let Some(s) = meta
            .segments
            .iter_mut()
            .find(|s| s.seq_no == seq && s.state == quire_metadata::SegmentState::InProgress)
        {
            s.last_entry = Some(entry);
            s.record_count = records;
            s.length_bytes = bytes;
            if let Some((_, e, slot, time)) = last_record {
                s.last_record_entry = Some(e);
                s.last_record_slot = Some(slot);
                s.last_write_time_ms = Some(time);
            }
        }
    }
}

/// The same kind of error as `e`, for every later append that fails with it.
pub(super) fn same_kind(e: &Error) -> Error {
    match e {
        Error::Storage { stream, op, source } => Error::Storage {
            stream: stream.clone(),
            op,
            source: source.to_string().into(),
        },
        Error::Metadata { stream, op, source } => Error::Metadata {
            stream: stream.clone(),
            op,
            source: source.to_string().into(),
        },
        Error::OwnershipLost { stream, reason } => Error::OwnershipLost {
            stream: stream.clone(),
            reason: reason.clone(),
        },
        Error::NoSuchStream { stream } => Error::NoSuchStream {
            stream: stream.clone(),
        },
        Error::ShuttingDown => Error::ShuttingDown,
        other => Error::Internal(other.to_string()),
    }
}

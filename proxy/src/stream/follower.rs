//! Follower reads: a proxy that does not own a stream serves its readers from the bookies
//! (issue 29 item 1; DistributedLog's read-proxy idea). Per stream this proxy keeps at most
//! one [`Follower`], shared by all of its readers of the stream:
//!
//! * it learns the segment list from the metadata store, re-read whenever the stream record
//!   changes (`MetadataStore::wait_stream_changed`: a ZooKeeper data watch), so a roll, a seal,
//!   a truncation or a recovery by a new owner is seen;
//! * in the in-progress segment it follows the LAC with long-poll reads
//!   (`LedgerReader::read_lac_long_poll`, BookKeeper's `readLastAddConfirmedAndEntry`), fetches
//!   each entry up to the LAC once into its own bounded cache, and only then makes it readable:
//!   no reader ever sees an entry past the LAC (DESIGN.md §9, no reader sees a record outside
//!   the final log: BookKeeper's recovery never closes a ledger below its LAC), and readers at
//!   the tail are served from the cache, so N readers cost one bookie read stream;
//! * it publishes the same readers' view as an owner's stream task (`TailState` through a
//!   watch, `StreamShared` with the cache and the in-progress segment's progress for last-N
//!   positions), so `reader.rs` reads the same way from an owner and from a follower;
//! * it stops once no read used it for [`super::StreamConfig::follower_idle_timeout`], or when
//!   the stream is deleted.
//!
//! Completed segments are read from the bookies by the readers themselves (catch-up reads);
//! the entries they fetch go into the follower's cache too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quire_ledger::{BookKeeper, LedgerReader};
use quire_metadata::{MetadataStore, SegmentState, StreamMetadata, Versioned};
use quire_wire::{EntryId, LedgerId};
use tokio::sync::watch;

use super::clock::LayerStats;
use super::compress;
use super::shared::{FollowerCache, StreamShared};
use super::tail_cache::TailState;
use crate::error::{Error, FromMetadata, Result};
use crate::record_set;

/// How long one long poll parks on the bookies; a poll that times out reopens the ledger, so
/// this also bounds how long an ensemble change of the writer goes unnoticed.
const LONG_POLL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one wait for a stream record change lasts before the record is read again anyway
/// (a lost watch, e.g. across a ZooKeeper reconnection, costs at most this).
const RECORD_WATCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause after a failed metadata or bookie request before the next try.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// What a follower needs from the stream layer.
#[derive(Clone)]
pub(super) struct FollowerContext {
    pub(super) metadata: Arc<dyn MetadataStore>,
    pub(super) bookkeeper: BookKeeper,
    pub(super) layer: Arc<LayerStats>,
    pub(super) cache_bytes_max: usize,
    pub(super) idle_timeout: Duration,
    pub(super) runtime: Option<tokio::runtime::Handle>,
    /// Set when the stream layer shuts down: followers stop.
    pub(super) stopping: Arc<AtomicBool>,
}

/// One stream followed by this proxy for its readers.
pub(super) struct Follower {
    pub(super) name: String,
    pub(super) tail: watch::Receiver<TailState>,
    pub(super) shared: Arc<StreamShared>,
    last_use: Mutex<Instant>,
    ended: AtomicBool,
}

impl Follower {
    /// Marks a read as using the follower now (keeps it from idling out).
    fn touch(&self) {
        *self.last_use.lock().expect("last use lock") = quire_clock::now();
    }

    fn idle_for(&self) -> Duration {
        quire_clock::elapsed(*self.last_use.lock().expect("last use lock"))
    }

    /// True once the follower task stopped (idle, stream deleted, shutdown).
    pub(super) fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }
}

/// The followers of this proxy, one per stream at most.
///
/// # Threading
/// Shared; the table is under one mutex, never held across an await.
#[derive(Default)]
pub(super) struct Followers {
    table: Mutex<HashMap<String, Arc<Follower>>>,
    /// Raised by [`Followers::stop`]; every follower task checks it.
    pub(super) stopping: Arc<AtomicBool>,
}

impl Followers {
    /// The live follower of `name`, if there is one (marked as used).
    pub(super) fn live(&self, name: &str) -> Option<Arc<Follower>> {
        let table = self.table.lock().expect("followers lock");
        let f = table.get(name).filter(|f| !f.ended())?.clone();
        f.touch();
        Some(f)
    }

    /// Stops every follower (within one long poll) and refuses to start new ones.
    pub(super) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// The follower of `name`, started (with the stream record read once, so its first
    /// readers see the segments) when there is none.
    ///
    /// # Errors
    /// `NoSuchStream`, `Metadata`.
    pub(super) async fn follow(&self, ctx: &FollowerContext, name: &str) -> Result<Arc<Follower>> {
        if let Some(f) = self.live(name) {
            return Ok(f);
        }
        if self.stopping.load(Ordering::SeqCst) {
            return Err(Error::ShuttingDown);
        }
        let meta = ctx
            .metadata
            .read_stream(name)
            .await
            .map_err(|e| Error::from_metadata(name, "read stream", e))?;
        let mut table = self.table.lock().expect("followers lock");
        if let Some(f) = table.get(name).filter(|f| !f.ended()) {
            f.touch();
            return Ok(f.clone());
        }
        let (tx, rx) = watch::channel(TailState::from_metadata(&meta.value));
        let shared = Arc::new(StreamShared {
            follower: Some(FollowerCache {
                stats: ctx.layer.clone(),
                bytes_max: ctx.cache_bytes_max,
            }),
            ..StreamShared::default()
        });
        let f = Arc::new(Follower {
            name: name.to_string(),
            tail: rx,
            shared,
            last_use: Mutex::new(quire_clock::now()),
            ended: AtomicBool::new(false),
        });
        table.insert(name.to_string(), f.clone());
        drop(table);
        ctx.layer.followers.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            stream = name,
            "following stream for reads (owned elsewhere)"
        );
        let task = run(ctx.clone(), f.clone(), tx, meta);
        match &ctx.runtime {
            Some(rt) => drop(rt.spawn(task)),
            None => drop(tokio::spawn(task)),
        }
        Ok(f)
    }
}

/// Inserts a plain entry into a follower's cache, keeping the cache byte gauge in step.
pub(super) fn cache_insert(shared: &StreamShared, key: (u64, u64), payload: Arc<Vec<u8>>) {
    let Some(fc) = &shared.follower else {
        return;
    };
    let mut cache = shared.cache.lock().expect("cache lock");
    let before = cache.size_bytes;
    cache.insert(key, payload, fc.bytes_max);
    let after = cache.size_bytes;
    fc.stats.follower_cache_bytes.fetch_add(
        i64::try_from(after).unwrap_or(i64::MAX) - i64::try_from(before).unwrap_or(i64::MAX),
        Ordering::Relaxed,
    );
}

/// The in-progress segment being followed: its ledger reader and how far it was fetched.
struct Tailing {
    seq_no: u64,
    ledger: u64,
    reader: Option<LedgerReader>,
    /// Last entry fetched into the cache (all entries up to it are cached or were): the
    /// segment's readable end. Never past a LAC a bookie reported.
    fetched: Option<u64>,
    /// Records in the segment up to `fetched` (for last-N positions).
    records: u64,
}

/// The segment being written, as the stream record shows it: (seq no, ledger).
fn in_progress(meta: &StreamMetadata) -> Option<(u64, u64)> {
    meta.segments
        .last()
        .filter(|s| s.state == SegmentState::InProgress)
        .map(|s| (s.seq_no, s.ledger_id))
}

/// Publishes the readers' view: the record's segments, the in-progress one readable up to
/// what was fetched, and its progress for last-N positions.
fn publish(
    tx: &watch::Sender<TailState>,
    shared: &StreamShared,
    meta: &StreamMetadata,
    t: &Tailing,
) {
    let mut state = TailState::from_metadata(meta);
    let mut live = None;
    if let Some(seg) = state
        .segments
        .iter_mut()
        .find(|s| s.seq_no == t.seq_no && s.ledger_id == t.ledger && !s.completed)
    {
        seg.readable_last_entry = t.fetched;
        if let Some(last) = t.fetched {
            live = Some((t.seq_no, last, t.records, 0));
        }
    }
    shared.view.lock().expect("view lock").live = live;
    tx.send_if_modified(|old| {
        let same = old.segments == state.segments
            && old.truncated_before == state.truncated_before
            && old.sealed == state.sealed;
        *old = state;
        !same
    });
}

/// Waits for the stream record to change, then reads it.
async fn next_record(
    metadata: Arc<dyn MetadataStore>,
    name: String,
    seen: quire_metadata::Version,
) -> std::result::Result<Versioned<StreamMetadata>, quire_metadata::Error> {
    if metadata
        .wait_stream_changed(&name, seen, RECORD_WATCH_TIMEOUT)
        .await
        .is_err()
    {
        tokio::time::sleep(RETRY_PAUSE).await;
    }
    metadata.read_stream(&name).await
}

/// The follower task: keeps the readers' view of `f` current until it idles out or the stream
/// is deleted.
async fn run(
    ctx: FollowerContext,
    f: Arc<Follower>,
    tx: watch::Sender<TailState>,
    mut meta: Versioned<StreamMetadata>,
) {
    let name = f.name.clone();
    let mut t = Tailing {
        seq_no: 0,
        ledger: u64::MAX,
        reader: None,
        fetched: None,
        records: 0,
    };
    let mut record_fut = Box::pin(next_record(
        ctx.metadata.clone(),
        name.clone(),
        meta.version,
    ));
    loop {
        if let Some((seq_no, ledger)) = in_progress(&meta.value) {
            if ledger != t.ledger {
                t = Tailing {
                    seq_no,
                    ledger,
                    reader: None,
                    fetched: None,
                    records: 0,
                };
            }
        }
        publish(&tx, &f.shared, &meta.value, &t);
        if f.idle_for() >= ctx.idle_timeout || ctx.stopping.load(Ordering::SeqCst) {
            break;
        }
        let following = in_progress(&meta.value).is_some_and(|(_, l)| l == t.ledger);
        if following && t.reader.is_none() {
            match ctx.bookkeeper.open_ledger(LedgerId(t.ledger)).await {
                Ok(r) => t.reader = Some(r),
                Err(e) => {
                    tracing::debug!(stream = %name, ledger = t.ledger, error = %e, "follower cannot open the ledger");
                }
            }
        }
        let poll = async {
            match (&t.reader, following) {
                (Some(r), true) => {
                    r.read_lac_long_poll(t.fetched.map(EntryId), LONG_POLL_TIMEOUT)
                        .await
                }
                _ => {
                    // Nothing to follow (no segment in progress, or its ledger cannot be
                    // opened yet): look again after a while.
                    tokio::time::sleep(if following {
                        RETRY_PAUSE
                    } else {
                        LONG_POLL_TIMEOUT
                    })
                    .await;
                    Ok((None, None))
                }
            }
        };
        tokio::select! {
            got = &mut record_fut => {
                match got {
                    Ok(m) => meta = m,
                    Err(quire_metadata::Error::NotFound { .. }) => {
                        tracing::info!(stream = %name, "followed stream was deleted");
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(stream = %name, error = %e, "follower cannot read the stream record");
                        tokio::time::sleep(RETRY_PAUSE).await;
                    }
                }
                record_fut = Box::pin(next_record(ctx.metadata.clone(), name.clone(), meta.version));
            }
            polled = poll => {
                let quiet = !following || advance(&f.shared, &name, &mut t, polled).await;
                // Nothing new for a while: if nobody owns the stream any more (its owner died),
                // stop, so that the next read takes the stream and recovers its last segment
                // (records acknowledged past the LAC the bookies know become readable then).
                if quiet && matches!(ctx.metadata.stream_owner(&name).await, Ok(None)) {
                    tracing::info!(stream = %name, "followed stream has no owner any more");
                    break;
                }
            }
        }
    }
    stopped(&ctx, &f);
    drop(tx);
    tracing::info!(stream = %name, "stopped following stream");
}

/// Marks `f` ended and gives its cache back (the followers gauge and cache bytes with it).
fn stopped(ctx: &FollowerContext, f: &Follower) {
    f.ended.store(true, Ordering::SeqCst);
    ctx.layer.followers.fetch_sub(1, Ordering::Relaxed);
    let held = {
        let mut cache = f.shared.cache.lock().expect("cache lock");
        let held = cache.size_bytes;
        cache.entries.clear();
        cache.size_bytes = 0;
        held
    };
    ctx.layer
        .follower_cache_bytes
        .fetch_sub(i64::try_from(held).unwrap_or(i64::MAX), Ordering::Relaxed);
}

/// Takes a long poll's answer: caches the piggybacked entry and reads the ones after it up to
/// the LAC learned, each once; the readable end moves only over cached entries. Returns true
/// when the poll timed out with nothing new.
async fn advance(
    shared: &StreamShared,
    name: &str,
    t: &mut Tailing,
    polled: std::result::Result<(Option<EntryId>, Option<Vec<u8>>), quire_ledger::Error>,
) -> bool {
    let (lac, first) = match polled {
        Ok((Some(lac), Some(entry))) => (lac.0, entry),
        Ok(_) => {
            // Timed out: reopen, in case the writer changed its ensemble (the old bookies'
            // LAC stops moving).
            t.reader = None;
            return true;
        }
        Err(e) => {
            tracing::debug!(stream = name, ledger = t.ledger, error = %e, "follower long poll failed");
            t.reader = None;
            tokio::time::sleep(RETRY_PAUSE).await;
            return false;
        }
    };
    let mut next = t.fetched.map_or(0, |f| f + 1);
    let mut payload = Some(first);
    while next <= lac {
        let raw = match payload.take() {
            Some(p) => p,
            None => {
                let Some(reader) = &t.reader else {
                    return false;
                };
                match reader.read(EntryId(next)).await {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::debug!(stream = name, ledger = t.ledger, entry = next, error = %e, "follower read failed");
                        t.reader = None;
                        return false;
                    }
                }
            }
        };
        let Ok(plain) = compress::plain_shared(name, t.ledger, next, Arc::new(raw)) else {
            tracing::warn!(
                stream = name,
                ledger = t.ledger,
                entry = next,
                "follower: entry does not decode; not following past it"
            );
            t.reader = None;
            return false;
        };
        if let Ok(set) = record_set::decode(&plain) {
            t.records = set.segment_record_index + set.records.len() as u64;
        }
        cache_insert(shared, (t.ledger, next), plain);
        t.fetched = Some(next);
        next += 1;
    }
    false
}

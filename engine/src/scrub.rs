//! The scrubber (issue 28 item 5; BookKeeper's `ScrubberService` / `LocalConsistencyChecker`
//! run in the background): a pass re-reads every live index segment past the block cache
//! (block CRCs) and every entry-log record the index points to (CRC32C, ledger, entry,
//! length), at a paced rate, and keeps what it found.
//!
//! A pass holds no lock: checkpoints, compaction and reads go on. A record that fails is read
//! again, and counts as damaged only if it fails again while the index still points at it
//! (compaction may have moved it, a recovery add may have replaced it, its ledger may have been
//! deleted). A damaged index segment is noted for the background rebuild from the entry logs
//! (docs/format/index.md, "Damaged segments"), which is its repair. A damaged entry stays
//! damaged on this shard until a recovery add replaces it (docs/protocol.md §Add, "Replacing
//! a stored entry"): until then every read of it answers `Corrupt`, never `NoSuchEntry` nor
//! other bytes, so a ledger client reads another replica. The caller (the bookie) asks for the
//! copy from another replica; the engine knows no other replica.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use crate::entry_log::{record_bytes, EntryLogs};
use crate::format::{decode_entry_record, Location};
use crate::index::Index;
use crate::io::{Storage, StorageFile};
use crate::ledgers::Ledgers;
use crate::read_ahead::ReadAhead;
use crate::sync::Closed;
use crate::Error;

/// Largest span of one entry log read at once by a pass, in bytes.
const SCRUB_READ_BYTES_MAX: u64 = 1 << 20;
/// Damaged index segments one pass notes before it gives up listing locations.
const INDEX_DAMAGE_MAX: u32 = 16;

/// A damaged entry found by the scrubber: where its record is and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedEntry {
    pub ledger: u64,
    pub entry: u64,
    /// The entry log holding the record.
    pub path: std::path::PathBuf,
    /// Offset of the record header in that log, in bytes.
    pub offset: u64,
    /// What the check found (the `Corrupt` or `Io` error's text).
    pub reason: String,
}

/// What one scrub pass found ([`crate::Engine::scrub`]).
#[derive(Debug, Clone, Default)]
pub struct ScrubPass {
    /// Entry-log records read and checked.
    pub entries_scanned: u64,
    /// Entry-log bytes read (records and the gaps between records read in the same span).
    pub bytes_scanned: u64,
    /// Entries whose record failed its checks twice while the index pointed at it.
    pub damaged: Vec<DamagedEntry>,
    /// Index segments found damaged (noted for the background rebuild).
    pub index_segments_damaged: u64,
    /// Entries damaged at the previous pass and found intact (replaced) at this one.
    pub repaired: u64,
    /// Time the pass took, pacing included.
    pub duration: Duration,
}

/// Scrubber figures since open ([`crate::Engine::scrub_stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubStats {
    /// Passes completed.
    pub passes: u64,
    /// Entry-log records checked, all passes.
    pub entries_scanned: u64,
    /// Entry-log bytes read, all passes.
    pub bytes_scanned: u64,
    /// Damaged entries found, counted once per entry until it is repaired.
    pub damaged_found: u64,
    /// Damaged entries at the end of the last pass (not yet repaired).
    pub damaged_now: u64,
    /// Damaged entries later found replaced by an intact copy.
    pub repaired: u64,
    /// Damaged index segments found.
    pub index_segments_damaged: u64,
    /// When the last pass ended.
    pub last_pass_end: Option<SystemTime>,
    /// How long the last pass took.
    pub last_pass_duration: Duration,
}

#[derive(Default)]
struct State {
    stats: ScrubStats,
    /// Damaged entries of the last pass, by (ledger, entry).
    damaged: BTreeMap<(u64, u64), DamagedEntry>,
}

/// The scrubber's context: the index, the entry logs, the ledger table.
pub(crate) struct Scrubber<S: Storage> {
    pub(crate) storage: Rc<S>,
    pub(crate) closed: Closed,
    pub(crate) ledgers: Rc<Ledgers>,
    pub(crate) index: Rc<Index<S::File>>,
    pub(crate) entry_logs: Rc<EntryLogs<S::File>>,
    pub(crate) read_ahead: Rc<ReadAhead>,
    state: RefCell<State>,
    /// One pass at a time.
    running: glommio::sync::Semaphore,
}

/// Paces a pass to `rate` bytes per second (0: unpaced) from `start`.
struct Pace {
    rate: u64,
    start: Instant,
    bytes: u64,
}

impl Pace {
    async fn after(&mut self, bytes: u64) {
        self.bytes += bytes;
        if self.rate == 0 {
            return;
        }
        let due = Duration::from_secs_f64(self.bytes as f64 / self.rate as f64);
        if let Some(wait) = due.checked_sub(quire_clock::elapsed(self.start)) {
            glommio::timer::sleep(wait).await;
        }
    }
}

impl<S: Storage + 'static> Scrubber<S> {
    pub(crate) fn new(
        storage: Rc<S>,
        closed: Closed,
        ledgers: Rc<Ledgers>,
        index: Rc<Index<S::File>>,
        entry_logs: Rc<EntryLogs<S::File>>,
        read_ahead: Rc<ReadAhead>,
    ) -> Self {
        Self {
            storage,
            closed,
            ledgers,
            index,
            entry_logs,
            read_ahead,
            state: RefCell::default(),
            running: glommio::sync::Semaphore::new(1),
        }
    }

    pub(crate) fn stats(&self) -> ScrubStats {
        self.state.borrow().stats.clone()
    }

    pub(crate) fn damaged(&self) -> Vec<DamagedEntry> {
        self.state.borrow().damaged.values().cloned().collect()
    }

    /// One pass at `rate` bytes per second (0: unpaced).
    pub(crate) async fn pass(&self, rate: u64) -> Result<ScrubPass, Error> {
        let _one = self
            .running
            .acquire_permit(1)
            .await
            .map_err(|_| Error::Closed)?;
        let start = quire_clock::now();
        let mut out = ScrubPass::default();
        let all = self.locations(&mut out).await?;
        let mut pace = Pace {
            rate,
            start,
            bytes: 0,
        };
        let mut i = 0;
        while i < all.len() {
            if self.closed.get() {
                return Err(Error::Closed);
            }
            let n = span_len(&all[i..]);
            let bytes = self.check_span(&all[i..i + n], &mut out).await?;
            out.bytes_scanned += bytes;
            pace.after(bytes).await;
            i += n;
        }
        out.duration = quire_clock::elapsed(start);
        self.record(&mut out);
        Ok(out)
    }

    /// Every live (ledger, entry) location, sorted by (log, offset). A damaged index segment
    /// is noted (the index rebuilds it in the background) and left out of a new listing.
    async fn locations(&self, out: &mut ScrubPass) -> Result<Vec<(u64, u64, Location)>, Error> {
        for _ in 0..INDEX_DAMAGE_MAX {
            let mut all = Vec::new();
            let mut listed = self.index.check_non_data_blocks().await;
            if listed.is_ok() {
                listed = self
                    .index
                    .for_each_location(|l, e, loc| {
                        if !self.ledgers.is_deleted(l) {
                            all.push((l, e, loc));
                        }
                    })
                    .await;
            }
            match listed {
                Ok(()) => {
                    all.sort_by_key(|(_, _, loc)| (loc.log_id, loc.offset));
                    return Ok(all);
                }
                Err(e @ Error::Corrupt { .. }) => {
                    tracing::warn!("scrub: damaged index segment: {e}");
                    out.index_segments_damaged += 1;
                    self.state.borrow_mut().stats.index_segments_damaged += 1;
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::IndexRebuilding { ledger: None })
    }

    /// Reads `span` (records of one log, close together) in one read and checks each record;
    /// a failed read or record is checked again on its own. Returns the bytes read.
    async fn check_span(
        &self,
        span: &[(u64, u64, Location)],
        out: &mut ScrubPass,
    ) -> Result<u64, Error> {
        let (first, last) = (span[0].2, span[span.len() - 1].2);
        let len = last.offset + record_bytes(last) - first.offset;
        let path = self.entry_logs.path(first.log_id);
        let read = async {
            let f = self
                .entry_logs
                .reader(&*self.storage, first.log_id, &path)
                .await?;
            f.read_at(first.offset, len as usize)
                .await
                .map_err(crate::files::io_err("read entry log", &path, first.offset))
        }
        .await;
        for &(l, e, loc) in span {
            out.entries_scanned += 1;
            let ok = match &read {
                Ok(b) => {
                    let at = (loc.offset - first.offset) as usize;
                    decode_entry_record(&b[at..], l, e, loc.data_len).is_ok()
                }
                Err(_) => false,
            };
            if !ok {
                self.confirm(l, e, loc, out).await?;
            }
        }
        Ok(len)
    }

    /// Reads one record that failed again; notes it damaged if it fails again while the index
    /// still points at it and its ledger is not deleted.
    async fn confirm(
        &self,
        ledger: u64,
        entry: u64,
        loc: Location,
        out: &mut ScrubPass,
    ) -> Result<(), Error> {
        let path = self.entry_logs.path(loc.log_id);
        let again = self
            .entry_logs
            .check_record(&*self.storage, ledger, entry, loc)
            .await;
        let Err(err) = again else { return Ok(()) };
        let still = self.index.location(ledger, entry).await? == Some(loc);
        if !still || self.ledgers.is_deleted(ledger) {
            return Ok(());
        }
        // A cached copy read before the damage would answer reads, and the repair's read-back
        // of this shard's copy, with intact bytes: the repair would find nothing to copy.
        // Reads answer as the disk does until a recovery add replaces the record.
        self.read_ahead.invalidate(&[(ledger, entry, loc)]);
        tracing::warn!(
            ledger,
            entry,
            entry_log = %path.display(),
            offset = loc.offset,
            "scrub: damaged entry: {err}"
        );
        out.damaged.push(DamagedEntry {
            ledger,
            entry,
            path,
            offset: loc.offset,
            reason: err.to_string(),
        });
        Ok(())
    }

    /// Folds a finished pass into the figures: new damage, and the damage of the previous
    /// pass that is gone (replaced, or its ledger deleted: only the former counts as repaired).
    fn record(&self, out: &mut ScrubPass) {
        let mut st = self.state.borrow_mut();
        let now: BTreeMap<(u64, u64), DamagedEntry> = out
            .damaged
            .iter()
            .map(|d| ((d.ledger, d.entry), d.clone()))
            .collect();
        let new = now.keys().filter(|k| !st.damaged.contains_key(k)).count() as u64;
        out.repaired = st
            .damaged
            .keys()
            .filter(|k| !now.contains_key(k) && !self.ledgers.is_deleted(k.0))
            .count() as u64;
        let s = &mut st.stats;
        s.passes += 1;
        s.entries_scanned += out.entries_scanned;
        s.bytes_scanned += out.bytes_scanned;
        s.damaged_found += new;
        s.repaired += out.repaired;
        s.damaged_now = now.len() as u64;
        s.last_pass_end = Some(quire_clock::system_now());
        s.last_pass_duration = out.duration;
        st.damaged = now;
    }
}

/// How many of `rest` (sorted by log and offset) one read covers: records of the first one's
/// log within [`SCRUB_READ_BYTES_MAX`] of its start, at least one.
fn span_len(rest: &[(u64, u64, Location)]) -> usize {
    let first = rest[0].2;
    rest.iter()
        .take_while(|(_, _, loc)| {
            loc.log_id == first.log_id
                && loc.offset + record_bytes(*loc) - first.offset <= SCRUB_READ_BYTES_MAX
        })
        .count()
        .max(1)
}

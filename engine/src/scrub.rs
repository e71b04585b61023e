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
/// Largest gap between two records one read covers, in bytes: a longer gap ends the read.
/// Records of other ledgers lie between a piece's records (entry logs are written in
/// (ledger, entry) order per checkpoint), and another piece checks them.
const SCRUB_GAP_BYTES_MAX: u64 = 64 << 10;
/// Index locations one piece of a pass holds at most (40 bytes each: 640 KiB). A pass's
/// memory is bounded by this, one read of at most [`SCRUB_READ_BYTES_MAX`], one index block
/// per live segment (the merged scan), and the damaged entries found.
pub const SCRUB_PIECE_LOCATIONS: usize = 16 * 1024;

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
    /// Pieces the pass walked the index in (each at most the piece size of locations).
    pub pieces: u64,
    /// Most index locations the pass held at once (at most the piece size).
    pub locations_held_max: u64,
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
    /// When the pass under way started; `None` when no pass runs.
    pub pass_started: Option<SystemTime>,
    /// When the last completed pass started.
    pub last_pass_start: Option<SystemTime>,
    /// When the last completed pass ended.
    pub last_pass_end: Option<SystemTime>,
    /// How long the last pass took.
    pub last_pass_duration: Duration,
    /// Entry-log records and bytes the last pass checked.
    pub last_pass_entries: u64,
    pub last_pass_bytes: u64,
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

    /// One pass at `rate` bytes per second (0: unpaced), in pieces of at most
    /// `piece_locations` index locations ([`SCRUB_PIECE_LOCATIONS`] by default).
    pub(crate) async fn pass(&self, rate: u64, piece_locations: usize) -> Result<ScrubPass, Error> {
        let _one = self
            .running
            .acquire_permit(1)
            .await
            .map_err(|_| Error::Closed)?;
        let start = quire_clock::now();
        let started = quire_clock::system_now();
        self.state.borrow_mut().stats.pass_started = Some(started);
        let r = self.walk(rate, piece_locations.max(1), start).await;
        self.state.borrow_mut().stats.pass_started = None;
        let mut out = r?;
        out.duration = quire_clock::elapsed(start);
        self.record(&mut out);
        self.state.borrow_mut().stats.last_pass_start = Some(started);
        Ok(out)
    }

    /// The body of a pass: the index's locations in key order, a piece at a time (a cursor
    /// that resumes after the piece's last key, so merges and checkpoints between pieces are
    /// fine); each piece sorted by (log, offset) and read in spans, paced.
    async fn walk(&self, rate: u64, piece: usize, start: Instant) -> Result<ScrubPass, Error> {
        let mut out = ScrubPass::default();
        let mut damage_left = INDEX_DAMAGE_MAX;
        self.check_index_blocks(&mut out, &mut damage_left).await?;
        let mut pace = Pace {
            rate,
            start,
            bytes: 0,
        };
        let mut from: Option<(u64, u64)> = Some((0, 0));
        while let Some(key) = from {
            if self.closed.get() {
                return Err(Error::Closed);
            }
            let mut locs = self.piece(key, piece, &mut out, &mut damage_left).await?;
            out.pieces += 1;
            out.locations_held_max = out.locations_held_max.max(locs.len() as u64);
            from = match locs.last() {
                Some(&(l, e, _)) if locs.len() == piece => next_key(l, e),
                _ => None,
            };
            locs.sort_by_key(|(_, _, loc)| (loc.log_id, loc.offset));
            let mut i = 0;
            while i < locs.len() {
                if self.closed.get() {
                    return Err(Error::Closed);
                }
                let n = span_len(&locs[i..]);
                let bytes = self.check_span(&locs[i..i + n], &mut out).await?;
                out.bytes_scanned += bytes;
                pace.after(bytes).await;
                i += n;
            }
        }
        Ok(out)
    }

    /// Re-reads the index segments' non-data blocks; a damaged segment is noted (the index
    /// rebuilds it in the background) and the check is made again without it.
    async fn check_index_blocks(
        &self,
        out: &mut ScrubPass,
        damage_left: &mut u32,
    ) -> Result<(), Error> {
        loop {
            match self.index.check_non_data_blocks().await {
                Ok(()) => return Ok(()),
                Err(e) => self.index_damage(e, out, damage_left)?,
            }
        }
    }

    /// Up to `max` live (ledger, entry) locations from `from` on, in key order. A damaged
    /// index segment is noted and the piece listed again without it.
    async fn piece(
        &self,
        from: (u64, u64),
        max: usize,
        out: &mut ScrubPass,
        damage_left: &mut u32,
    ) -> Result<Vec<(u64, u64, Location)>, Error> {
        loop {
            let listed = self
                .index
                .locations_from(from, max, |l| !self.ledgers.is_deleted(l))
                .await;
            match listed {
                Ok(v) => return Ok(v),
                Err(e) => self.index_damage(e, out, damage_left)?,
            }
        }
    }

    /// Counts a damaged index segment found by a pass (`Corrupt`); any other error, or more
    /// than [`INDEX_DAMAGE_MAX`] damaged segments in one pass, ends the pass.
    fn index_damage(
        &self,
        e: Error,
        out: &mut ScrubPass,
        damage_left: &mut u32,
    ) -> Result<(), Error> {
        if !matches!(e, Error::Corrupt { .. }) {
            return Err(e);
        }
        if *damage_left == 0 {
            return Err(Error::IndexRebuilding { ledger: None });
        }
        *damage_left -= 1;
        tracing::warn!("scrub: damaged index segment: {e}");
        out.index_segments_damaged += 1;
        self.state.borrow_mut().stats.index_segments_damaged += 1;
        Ok(())
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
        s.last_pass_entries = out.entries_scanned;
        s.last_pass_bytes = out.bytes_scanned;
        st.damaged = now;
    }
}

/// How many of `rest` (sorted by log and offset) one read covers: records of the first one's
/// log within [`SCRUB_READ_BYTES_MAX`] of its start, with no gap over [`SCRUB_GAP_BYTES_MAX`]
/// between two of them (a gap is other ledgers' records, checked in another piece), at least
/// one.
fn span_len(rest: &[(u64, u64, Location)]) -> usize {
    let first = rest[0].2;
    let mut end = first.offset + record_bytes(first);
    let mut n = 1;
    for (_, _, loc) in &rest[1..] {
        let fits = loc.log_id == first.log_id
            && loc.offset >= end
            && loc.offset - end <= SCRUB_GAP_BYTES_MAX
            && loc.offset + record_bytes(*loc) - first.offset <= SCRUB_READ_BYTES_MAX;
        if !fits {
            break;
        }
        end = loc.offset + record_bytes(*loc);
        n += 1;
    }
    n
}

/// The key after (`ledger`, `entry`) in index order; `None` after the last key there can be.
fn next_key(ledger: u64, entry: u64) -> Option<(u64, u64)> {
    match entry.checked_add(1) {
        Some(e) => Some((ledger, e)),
        None => ledger.checked_add(1).map(|l| (l, 0)),
    }
}

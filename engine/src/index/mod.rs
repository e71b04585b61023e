//! The index: where every checkpointed entry lives in the entry logs (the role of BookKeeper
//! `DbLedgerStorage`'s entry location index, an LSM tree in RocksDB), kept on disk in
//! immutable sorted index segment files (`segment.rs`, docs/format/index.md) with a bounded
//! block cache in front (`cache.rs`).
//!
//! Each checkpoint writes the locations it created and the ledger states it changed as a new
//! segment; compaction writes the locations it moved as one too. The checkpoint mark names the
//! live segments, oldest first: a later segment overrides an earlier one for the same (ledger,
//! entry) and the same ledger state. A background merge (`merge.rs`) combines runs of
//! neighbouring segments into one, keeping only the newest location of each entry and dropping
//! deleted ledgers. Entries not yet checkpointed are in the write cache, not here.
//!
//! Memory: per live segment its header and one key per group of 28,815 locations, plus the
//! block cache (`EngineConfig::index_cache_bytes_max`); [`Index::memory_bytes`] counts both.
//! A lookup probes the segments newest first; in each it is a binary search in the top keys,
//! then one index block and one data block (cached or read), never a scan.
//!
//! `legacy.rs` reads the version 1 index (`index.qix`) once, to migrate it (`migrate.rs`).

pub(crate) mod cache;
pub(crate) mod legacy;
pub(crate) mod merge;
pub(crate) mod migrate;
pub(crate) mod rebuild;
pub(crate) mod segment;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::files::{io_err, parse_id};
use crate::format::{Key, Location, Mark, SegmentSummary, StoredLedger};
use crate::io::{Storage, StorageFile};
use crate::ledgers::Ledger;
use crate::sync::Signal;
use crate::throttle::Throttle;
use crate::{Error, IndexStats};

use cache::BlockCache;
use rebuild::{Damage, RebuildReport};
use segment::{parse_segment_name, SegCursor, Segment, SegmentWriter};

/// An open segment and its ledger states.
type LiveWithStates<F> = (Rc<Segment<F>>, Vec<(u64, StoredLedger)>);

/// A segment the mark names, as open found it.
enum Slot<F> {
    /// Every check passed; its ledger states.
    Good(Rc<Segment<F>>, Vec<(u64, StoredLedger)>),
    /// To be rebuilt now: missing, or header or top keys unreadable, and the mark holds no
    /// summary of it (a version 2 mark): the keys and ledgers it covers are unknown, so every
    /// ledger waits for it.
    Damaged(Damage),
    /// Rebuilt in the background while every ledger outside what it covers is served: a
    /// readable header with a bad index or ledger-state block (live with its readable states),
    /// or a missing or unreadable segment the mark describes (a hollow stand-in,
    /// `Segment::hollow`, covering the key range the mark records).
    Deferred(Rc<Segment<F>>, Damage),
}

/// A live segment found damaged and not yet rebuilt (`Index::damaged`).
#[derive(Clone)]
pub(crate) struct Pending {
    /// What the check found (one line).
    pub reason: String,
    /// Found by the open, with the ledger states it lost: their ledgers are refused until the
    /// rebuild gives them a state (the ledger table cannot vouch for them). `None`: found
    /// after open (the ledger table is exact then) or a data block only (no state lost).
    pub open_damage: Option<Damage>,
}

/// The live index segments and the block cache.
pub(crate) struct Index<F> {
    dir: PathBuf,
    /// Live segments, oldest first (the order of the mark).
    segments: RefCell<Vec<Rc<Segment<F>>>>,
    cache: RefCell<BlockCache>,
    next_id: Cell<u64>,
    /// Wakes the background merge.
    pub(crate) merge_signal: Signal,
    /// Set when ledgers were deleted: the next merge takes every segment, so that their
    /// locations leave the disk.
    pub(crate) full_merge_wanted: Cell<bool>,
    /// One merge at a time (the background merger, `Engine::merge_index`).
    pub(crate) merge_lock: glommio::sync::Semaphore,
    stats: Cell<IndexStats>,
    /// Live segments found damaged and not yet rebuilt (by the open, or by a read after it):
    /// rebuilt in the background (`IndexRebuilder::repair`), meanwhile keys in their range and
    /// ledgers whose state they lost answer `IndexRebuilding`.
    damaged: RefCell<BTreeMap<u64, Pending>>,
}

/// Open, step 1: removes the segment files the mark does not name (what a crash left: an
/// unfinished checkpoint, merge or rebuild, a merge's inputs) and a legacy `index.qix` a
/// finished migration left; returns the largest segment id seen (kept damaged files
/// included: an id is never given again).
async fn remove_stale_files<S: Storage>(
    storage: &S,
    dir: &Path,
    names: &[String],
    mark: &Mark,
) -> Result<u64, Error> {
    let mut removed = false;
    let mut max_id = 0;
    for name in names {
        // A kept damaged segment's id is never given again.
        if let Some(id) = parse_id(name, "index-", ".qis.corrupt") {
            max_id = max_id.max(id);
        }
        let stale = match parse_segment_name(name) {
            Some(id) => {
                max_id = max_id.max(id);
                !mark.segments.contains(&id)
            }
            None => name == legacy::INDEX_FILE,
        };
        if stale {
            let p = dir.join(name);
            storage
                .remove(&p)
                .await
                .map_err(io_err("remove stale index file", &p, 0))?;
            removed = true;
        }
    }
    if removed {
        storage
            .sync_dir(dir)
            .await
            .map_err(io_err("sync ledger dir", dir, 0))?;
    }
    Ok(max_id)
}

/// Open, step 2: opens and checks segment `id` the mark names (`known`: the mark's summary of
/// it, if any): good, deferred to the background rebuild (damaged blocks, or missing or
/// unreadable with a summary), or damaged with no summary (rebuilt now).
async fn open_slot<S: Storage>(
    storage: &S,
    dir: &Path,
    id: u64,
    names: &[String],
    known: Option<SegmentSummary>,
) -> Result<Slot<S::File>, Error> {
    let name = segment::segment_name(id);
    let path = dir.join(&name);
    let unreadable = if !names.contains(&name) {
        "the checkpoint mark names this index segment, which is missing".to_string()
    } else {
        match Segment::open(storage, dir, id).await {
            Ok(seg) => return assess_slot(seg, known).await,
            Err(e) => rebuild::corrupt_reason(e)?,
        }
    };
    Ok(match known {
        // Its reach is in the mark: rebuilt in the background, only it waits.
        Some(k) => Slot::Deferred(
            Rc::new(Segment::hollow(id, path.clone(), k)),
            Damage::described(id, path, unreadable, k),
        ),
        // A version 2 mark: nothing says what it covered.
        None => Slot::Damaged(Damage::whole(id, path, unreadable)),
    })
}

/// Checks every block of a readable segment and describes it (its own summary, or the mark's
/// `known` one, which adds the entry logs the header does not name).
async fn assess_slot<F: StorageFile>(
    seg: Segment<F>,
    known: Option<SegmentSummary>,
) -> Result<Slot<F>, Error> {
    let (states, damage) = rebuild::assess(&seg).await?;
    let found = summary_of(&seg, &states, damage.as_ref());
    match (known, found) {
        (Some(k), Some(f)) if same_reach(&k, &f) => seg.describe(k),
        (Some(k), _) if damage.is_some() && same_keys(&k, &seg) => seg.describe(k),
        (k, f) => {
            if k.is_some() {
                tracing::warn!(
                    "index segment {}: the checkpoint mark's summary {k:?} differs from the \
                     segment's own {f:?}; using the segment's",
                    seg.path.display()
                );
            }
            if let Some(f) = f {
                seg.describe(f);
            }
        }
    }
    let mut damage = damage;
    if let Some(d) = &mut damage {
        d.logs = rebuild::logs_to_scan(seg.summary());
    }
    Ok(match damage {
        None => Slot::Good(Rc::new(seg), states),
        Some(d) => Slot::Deferred(Rc::new(seg), d),
    })
}

/// Open, step 3: gives each damaged or deferred slot the ledgers whose state a newer readable
/// segment holds (their states were not lost); returns the damaged ones to rebuild now.
fn note_superseded<F>(slots: &mut [Slot<F>]) -> Vec<Damage> {
    let mut damaged: Vec<Damage> = Vec::new();
    let mut newer: HashSet<u64> = HashSet::new();
    for slot in slots.iter_mut().rev() {
        match slot {
            Slot::Good(_, states) => newer.extend(states.iter().map(|(l, _)| *l)),
            Slot::Damaged(d) => {
                let mut d = d.clone();
                d.superseded = newer.clone();
                damaged.push(d);
            }
            Slot::Deferred(_, d) => {
                d.superseded = newer.clone();
                newer.extend(d.kept_states.iter().map(|(l, _)| *l));
            }
        }
    }
    damaged
}

impl<F: StorageFile> Index<F> {
    /// Opens the segments `mark` names in `dir` and returns them with the ledger states they
    /// hold (later segments override earlier ones), and the mark in force. Segment files the
    /// mark does not name are what a crash left (an unfinished checkpoint, merge or rebuild, a
    /// merge's inputs) and are removed, as is a legacy `index.qix` a finished migration left.
    ///
    /// A named segment whose index or ledger-state blocks fail their check, or that is missing
    /// or whose header or top blocks fail it while the mark holds its summary (version 3), is
    /// left for the background rebuild (`IndexRebuilder::repair`); meanwhile what it covers answers
    /// `IndexRebuilding`. One that is missing or unreadable without a summary (a version 2 mark
    /// written by an older build) is rebuilt now from every entry log (`rebuild.rs`) and
    /// replaced in a new mark; deleted ledgers (`is_deleted`) are left out of a replacement.
    /// The mark returned describes every segment whose summary is known (the open learns those
    /// a version 2 mark lacked from their headers and ledger states), so the next mark written
    /// records them.
    ///
    /// # Errors
    /// `UnsupportedFormat`; `Io`.
    pub async fn open<S: Storage<File = F>>(
        storage: &S,
        dir: &Path,
        mark: &Mark,
        cache_bytes_max: usize,
        is_deleted: &dyn Fn(u64) -> bool,
        entry_size_max: usize,
    ) -> Result<(Self, HashMap<u64, Ledger>, Mark), Error> {
        let names = storage
            .list(dir)
            .await
            .map_err(io_err("list ledger dir", dir, 0))?;
        let max_id = remove_stale_files(storage, dir, &names, mark).await?;
        let mut slots: Vec<Slot<F>> = Vec::with_capacity(mark.segments.len());
        for &id in &mark.segments {
            let known = mark.summaries.get(&id).copied();
            slots.push(open_slot(storage, dir, id, &names, known).await?);
        }
        let index = Index {
            dir: dir.to_path_buf(),
            segments: RefCell::new(Vec::new()),
            cache: RefCell::new(BlockCache::new(cache_bytes_max)),
            next_id: Cell::new(max_id.max(mark.segments.iter().copied().max().unwrap_or(0)) + 1),
            merge_signal: Signal::default(),
            full_merge_wanted: Cell::new(false),
            merge_lock: glommio::sync::Semaphore::new(1),
            stats: Cell::new(IndexStats::default()),
            damaged: RefCell::new(BTreeMap::new()),
        };
        let damaged = note_superseded(&mut slots);
        // What the open learnt of the readable segments, for the mark a rebuild now writes.
        let mark = mark.with_segments(
            mark.segments.clone(),
            slots.iter().filter_map(|s| match s {
                Slot::Good(seg, _) | Slot::Deferred(seg, _) => seg.described(),
                Slot::Damaged(_) => None,
            }),
        );
        let (mark, replacements) = if damaged.is_empty() {
            (mark, HashMap::new())
        } else {
            index
                .rebuild_at_open(storage, &slots, damaged, &mark, is_deleted, entry_size_max)
                .await?
        };
        let (segments, ledgers) = index.install(slots, replacements);
        // Segments a version 2 mark named without summary are described now (the next mark
        // written records them).
        let mark = mark.with_segments(
            mark.segments.clone(),
            segments.iter().filter_map(|s| s.described()),
        );
        *index.segments.borrow_mut() = segments;
        Ok((index, ledgers, mark))
    }

    /// Open, step 4: rebuilds now, from every entry log, the segments a version 2 mark names
    /// that are missing or unreadable (`damaged`), with the ledger states every slot kept, and
    /// writes the mark naming the replacements; returns that mark and the replacements by
    /// damaged segment id.
    async fn rebuild_at_open<S: Storage<File = F>>(
        &self,
        storage: &S,
        slots: &[Slot<F>],
        damaged: Vec<Damage>,
        mark: &Mark,
        is_deleted: &dyn Fn(u64) -> bool,
        entry_size_max: usize,
    ) -> Result<(Mark, HashMap<u64, LiveWithStates<F>>), Error> {
        let mut surviving = BTreeMap::new();
        for slot in slots {
            let states = match slot {
                Slot::Good(_, states) => states,
                Slot::Damaged(d) | Slot::Deferred(_, d) => &d.kept_states,
            };
            for (l, st) in states {
                rebuild::merge_surviving(&mut surviving, *l, st.clone());
            }
        }
        let (reps, mut report) = rebuild::build(
            storage,
            &self.dir,
            damaged,
            &surviving,
            true,
            is_deleted,
            entry_size_max,
            &|| self.take_id(),
        )
        .await?;
        let new_mark = rebuild::commit(storage, &self.dir, mark, &reps, &mut report).await?;
        self.note_rebuild(&report);
        let mut replacements = HashMap::new();
        for r in reps {
            replacements.insert(r.damage.id, (Rc::new(r.segment), r.states));
        }
        Ok((new_mark, replacements))
    }

    /// Open, step 5: the live segments in the mark's order (replacements in their damaged
    /// segments' places, deferred ones noted for the background rebuild) and the ledger table
    /// their states make (later segments override earlier ones).
    fn install(
        &self,
        slots: Vec<Slot<F>>,
        mut replacements: HashMap<u64, LiveWithStates<F>>,
    ) -> (Vec<Rc<Segment<F>>>, HashMap<u64, Ledger>) {
        let mut segments = Vec::with_capacity(slots.len());
        let mut ledgers: HashMap<u64, Ledger> = HashMap::new();
        for slot in slots {
            let (seg, states) = match slot {
                Slot::Good(seg, states) => (seg, states),
                Slot::Damaged(d) => replacements
                    .remove(&d.id)
                    .expect("every damaged segment has a replacement"),
                Slot::Deferred(seg, d) => {
                    tracing::error!(
                        "index segment {} is damaged ({}): rebuilding it from the entry logs in \
                         the background; until then its keys and the ledgers whose state it lost \
                         answer 'being rebuilt'",
                        d.path.display(),
                        d.reason
                    );
                    let states = d.kept_states.clone();
                    let pending = Pending {
                        reason: d.reason.clone(),
                        // A stand-in has no blocks to assess again: its damage is kept.
                        open_damage: (d.lost_states.is_some() || seg.is_hollow()).then_some(d),
                    };
                    self.damaged.borrow_mut().insert(seg.id, pending);
                    (seg, states)
                }
            };
            for (ledger, s) in states {
                ledgers.insert(ledger, Ledger::from_stored(s));
            }
            segments.push(seg);
        }
        (segments, ledgers)
    }

    /// Notes live segment `id`, a data block of which the open's pass over every location found
    /// bad (`reason`), for a rebuild in the background: its ledger states were read and checked,
    /// so only its keys wait.
    pub fn defer_rebuild(&self, id: u64, reason: String) {
        tracing::error!(
            "index segment {}: {reason}: rebuilding it from the entry logs in the background; \
             until then its keys answer 'being rebuilt'",
            self.dir.join(segment::segment_name(id)).display()
        );
        self.damaged.borrow_mut().insert(
            id,
            Pending {
                reason,
                open_damage: None,
            },
        );
        self.merge_signal.notify();
    }

    /// Puts committed replacements in their damaged segments' places and counts the rebuild.
    pub(crate) fn replace_segments(
        &self,
        reps: Vec<rebuild::Replacement<F>>,
        report: &RebuildReport,
    ) {
        self.note_rebuild(report);
        for r in reps {
            let mut segs = self.segments.borrow_mut();
            if let Some(at) = segs.iter().position(|s| s.id == r.damage.id) {
                segs[at] = Rc::new(r.segment);
            }
            self.cache.borrow_mut().forget_segment(r.damage.id);
            self.damaged.borrow_mut().remove(&r.damage.id);
        }
    }

    /// Notes a live segment that failed a check after open (`err` names its path): the
    /// background merger rebuilds it (`IndexRebuilder::repair`). Other errors are ignored.
    pub(crate) fn notice(&self, err: &Error) {
        if let Error::Corrupt { path, .. } = err {
            if let Some(id) = self.live_segment_at(path) {
                let mut damaged = self.damaged.borrow_mut();
                if let std::collections::btree_map::Entry::Vacant(v) = damaged.entry(id) {
                    v.insert(Pending {
                        reason: err.to_string(),
                        open_damage: None,
                    });
                    tracing::error!("index segment {} is damaged: {err}", path.display());
                    self.merge_signal.notify();
                }
            }
        }
    }

    /// A live segment noted as damaged and not yet rebuilt, with what was found, if any.
    pub(crate) fn first_damaged(&self) -> Option<(u64, Pending)> {
        let live = self.ids();
        let mut d = self.damaged.borrow_mut();
        d.retain(|id, _| live.contains(id));
        d.iter().next().map(|(id, p)| (*id, p.clone()))
    }

    /// The damage the open found in live segment `id`, if it is still waiting for its rebuild.
    pub(crate) fn open_damage_of(&self, id: u64) -> Option<Damage> {
        self.damaged
            .borrow()
            .get(&id)
            .and_then(|p| p.open_damage.clone())
    }

    /// The largest entry the intact segments index for each ledger in `lo..=hi` that is not
    /// deleted, in ledger order (one pass over those keys, past the block cache): what a
    /// rebuild that reads only a damaged segment's entry logs learns of entries elsewhere.
    ///
    /// # Errors
    /// `Corrupt` from a bad block (the segment is noted); `Io`.
    pub(crate) async fn last_entries_in(
        &self,
        lo: u64,
        hi: u64,
        is_deleted: &dyn Fn(u64) -> bool,
    ) -> Result<Vec<(u64, u64)>, Error> {
        let r: Result<_, Error> = async {
            let mut out: Vec<(u64, u64)> = Vec::new();
            let mut scan =
                MergedScan::over(self.intact_newest_first(), &self.cache, (lo, 0), false).await?;
            while let Some(((l, e), _)) = scan.next(&self.cache).await? {
                if l > hi {
                    break;
                }
                if is_deleted(l) {
                    continue;
                }
                match out.last_mut() {
                    Some(last) if last.0 == l => last.1 = last.1.max(e),
                    _ => out.push((l, e)),
                }
            }
            Ok(out)
        }
        .await;
        self.checked(r)
    }

    /// Whether a damaged segment is waiting for its rebuild.
    pub(crate) fn rebuild_pending(&self) -> bool {
        self.first_damaged().is_some()
    }

    /// Whether `ledger`'s state may be in a lost ledger-state block of a segment the open found
    /// damaged: then the ledger table cannot answer for it until the rebuild.
    pub(crate) fn state_pending(&self, ledger: u64) -> bool {
        self.damaged.borrow().values().any(|p| {
            p.open_damage.as_ref().is_some_and(|d| {
                d.lost_states
                    .is_some_and(|(lo, hi)| ledger >= lo && ledger <= hi)
                    && !d.superseded.contains(&ledger)
            })
        })
    }

    /// Whether `key` lies in the key range of a damaged segment not yet rebuilt.
    fn in_damaged_range(&self, key: Key) -> bool {
        let damaged = self.damaged.borrow();
        if damaged.is_empty() {
            return false;
        }
        self.segments
            .borrow()
            .iter()
            .any(|s| damaged.contains_key(&s.id) && s.covers(key))
    }

    /// Live segments, newest first, without the damaged ones.
    fn intact_newest_first(&self) -> Vec<Rc<Segment<F>>> {
        let damaged = self.damaged.borrow();
        self.segments
            .borrow()
            .iter()
            .rev()
            .filter(|s| !damaged.contains_key(&s.id))
            .cloned()
            .collect()
    }

    /// Passes a read's result through, noting a damaged segment.
    fn checked<T>(&self, r: Result<T, Error>) -> Result<T, Error> {
        if let Err(e) = &r {
            self.notice(e);
        }
        r
    }

    /// Live segment `id`, if it is live.
    pub(crate) fn live(&self, id: u64) -> Option<Rc<Segment<F>>> {
        self.segments.borrow().iter().find(|s| s.id == id).cloned()
    }

    /// The id of the live segment at `path`, if any.
    pub fn live_segment_at(&self, path: &Path) -> Option<u64> {
        self.segments
            .borrow()
            .iter()
            .find(|s| s.path == path)
            .map(|s| s.id)
    }

    fn note_rebuild(&self, r: &RebuildReport) {
        self.count(|s| {
            s.segments_rebuilt += r.segments;
            s.ledgers_rebuilt += r.ledgers;
            s.entries_rebuilt += r.entries;
            s.rebuild_entry_log_bytes += r.entry_log_bytes;
            s.rebuild_entry_logs += r.entry_logs;
            s.rebuild_ms += r.millis;
        });
    }

    /// Ids of the live segments, oldest first (what the mark names).
    pub fn ids(&self) -> Vec<u64> {
        self.segments.borrow().iter().map(|s| s.id).collect()
    }

    /// Live segments, newest first.
    pub(crate) fn live_newest_first(&self) -> Vec<Rc<Segment<F>>> {
        self.newest_first()
    }

    fn newest_first(&self) -> Vec<Rc<Segment<F>>> {
        self.segments.borrow().iter().rev().cloned().collect()
    }

    /// The current location of entry `entry` of `ledger`, if indexed: the newest segment that
    /// holds it wins.
    ///
    /// # Errors
    /// `Corrupt` if a block read fails its check; `Io`.
    pub async fn location(&self, ledger: u64, entry: u64) -> Result<Option<Location>, Error> {
        // A damaged segment not yet rebuilt may hold this key (its blocks cannot be trusted):
        // not "no such entry", and not an older segment's stale copy.
        if self.in_damaged_range((ledger, entry)) {
            return Err(Error::IndexRebuilding {
                ledger: Some(ledger),
            });
        }
        let r: Result<_, Error> = async {
            for seg in self.intact_newest_first() {
                if let Some(loc) = seg.find(&self.cache, (ledger, entry)).await? {
                    return Ok(Some(loc));
                }
            }
            Ok(None)
        }
        .await;
        self.checked(r)
    }

    /// Up to `max` indexed entries of `ledger` after `entry`, in entry order, with their
    /// locations (read-ahead plans), through the block cache.
    pub async fn following(
        &self,
        ledger: u64,
        entry: u64,
        max: usize,
    ) -> Result<Vec<(u64, Location)>, Error> {
        let mut out = Vec::new();
        if max == 0 || entry == u64::MAX {
            return Ok(out);
        }
        let r: Result<_, Error> = async {
            let mut scan = MergedScan::over(
                self.intact_newest_first(),
                &self.cache,
                (ledger, entry + 1),
                true,
            )
            .await?;
            while out.len() < max {
                match scan.next(&self.cache).await? {
                    // Read-ahead stops where a damaged segment's keys begin.
                    Some(((l, e), loc)) if l == ledger && !self.in_damaged_range((l, e)) => {
                        out.push((e, loc))
                    }
                    _ => break,
                }
            }
            Ok(out)
        }
        .await;
        self.checked(r)
    }

    /// The entries of `ledger` whose current location is in entry log `log_id` (compaction's
    /// live set), read past the block cache.
    pub async fn ledger_locations_in_log(
        &self,
        ledger: u64,
        log_id: u64,
    ) -> Result<Vec<(u64, Location)>, Error> {
        let mut out = Vec::new();
        let r: Result<_, Error> = async {
            let mut scan = MergedScan::start(self, (ledger, 0), false).await?;
            while let Some(((l, e), loc)) = scan.next(&self.cache).await? {
                if l != ledger {
                    break;
                }
                if loc.log_id == log_id {
                    out.push((e, loc));
                }
            }
            Ok(out)
        }
        .await;
        self.checked(r)
    }

    /// Calls `f` with the current location of every indexed entry, in (ledger, entry) order,
    /// reading every live segment once past the block cache (open, `verify_index`, a rebuild's
    /// recount). Damaged segments not yet rebuilt are left out, and so are the keys in their
    /// ranges (an older segment's copy of such a key may be stale).
    pub async fn for_each_location(
        &self,
        mut f: impl FnMut(u64, u64, Location),
    ) -> Result<(), Error> {
        let r: Result<_, Error> = async {
            let mut scan =
                MergedScan::over(self.intact_newest_first(), &self.cache, (0, 0), false).await?;
            while let Some(((l, e), loc)) = scan.next(&self.cache).await? {
                if !self.in_damaged_range((l, e)) {
                    f(l, e, loc);
                }
            }
            Ok(())
        }
        .await;
        self.checked(r)
    }

    /// Up to `max` current locations from key `from` on, in (ledger, entry) order, of the
    /// entries `keep` accepts (called with the ledger), read past the block cache: one piece
    /// of a scrub pass, which resumes after the last key returned. Damaged segments and the
    /// keys in their ranges are left out, as in [`Index::for_each_location`]. Fewer than `max`
    /// means the scan reached the end. Holds at most `max` locations.
    ///
    /// # Errors
    /// `Corrupt` if a block read fails its check (the segment is noted for the rebuild); `Io`.
    pub(crate) async fn locations_from(
        &self,
        from: Key,
        max: usize,
        mut keep: impl FnMut(u64) -> bool,
    ) -> Result<Vec<(u64, u64, Location)>, Error> {
        let r: Result<_, Error> = async {
            let mut out = Vec::with_capacity(max.min(4096));
            let mut scan =
                MergedScan::over(self.intact_newest_first(), &self.cache, from, false).await?;
            while out.len() < max {
                let Some(((l, e), loc)) = scan.next(&self.cache).await? else {
                    break;
                };
                if !self.in_damaged_range((l, e)) && keep(l) {
                    out.push((l, e, loc));
                }
            }
            Ok(out)
        }
        .await;
        self.checked(r)
    }

    /// Re-reads every block but the data blocks of every intact live segment past the block
    /// cache (the scrubber; [`Index::for_each_location`] reads the data blocks). A damaged
    /// segment is noted for the background rebuild, like a read that finds it.
    ///
    /// # Errors
    /// `Corrupt` naming the first damaged block; `Io`.
    pub(crate) async fn check_non_data_blocks(&self) -> Result<(), Error> {
        for seg in self.intact_newest_first() {
            if seg.is_hollow() {
                continue;
            }
            let r = seg.check_non_data_blocks().await;
            self.checked(r)?;
        }
        Ok(())
    }

    /// Writes a new segment of `locations` (sorted by (ledger, entry), each key once) and
    /// `ledgers` (sorted by ledger), synced, with the directory synced; not yet live.
    pub async fn write_segment<S: Storage<File = F>>(
        &self,
        storage: &S,
        throttle: &Throttle,
        locations: &[(u64, u64, Location)],
        ledgers: &[(u64, StoredLedger)],
    ) -> Result<Rc<Segment<F>>, Error> {
        let id = self.take_id();
        let mut w = SegmentWriter::create(storage, &self.dir, id, Some(throttle)).await?;
        for &(ledger, entry, loc) in locations {
            w.push(ledger, entry, loc).await?;
        }
        let seg = w.finish(ledgers).await?;
        self.sync_dir(storage).await?;
        Ok(Rc::new(seg))
    }

    /// A fresh segment id.
    pub fn take_id(&self) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub async fn sync_dir<S: Storage<File = F>>(&self, storage: &S) -> Result<(), Error> {
        storage
            .sync_dir(&self.dir)
            .await
            .map_err(io_err("sync ledger dir", &self.dir, 0))
    }

    /// Removes a segment file that never became live (its checkpoint failed); a failure is
    /// only logged, the next open removes it.
    pub async fn discard<S: Storage<File = F>>(&self, storage: &S, seg: &Segment<F>) {
        if let Err(e) = storage.remove(&seg.path).await {
            tracing::warn!("removing unused index segment {}: {e}", seg.path.display());
        }
    }

    /// Makes a segment the mark now names live (newest), and wakes the merge.
    pub fn publish(&self, seg: Rc<Segment<F>>) {
        self.segments.borrow_mut().push(seg);
        self.merge_signal.notify();
    }

    /// Notes that ledgers were deleted: the next merge rewrites every segment without them.
    pub fn ledgers_deleted(&self) {
        self.full_merge_wanted.set(true);
        self.merge_signal.notify();
    }

    pub(crate) fn count(&self, f: impl FnOnce(&mut IndexStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Bytes the index holds in memory: the open segments' headers and top keys, and the
    /// block cache (at most `index_cache_bytes_max`).
    pub fn memory_bytes(&self) -> usize {
        let segs = self.segments.borrow();
        segs.iter().map(|s| s.memory_bytes()).sum::<usize>()
            + segs.capacity() * std::mem::size_of::<Rc<Segment<F>>>()
            + self.cache.borrow().memory_bytes()
            + std::mem::size_of::<Self>()
    }

    /// Figures of the index now.
    pub fn stats(&self) -> IndexStats {
        let mut s = self.stats.get();
        let segs = self.segments.borrow();
        s.segments = segs.len() as u64;
        s.segment_entries = segs.iter().map(|x| x.header.entry_count).sum();
        s.memory_bytes = self.memory_bytes() as u64;
        let c = self.cache.borrow();
        s.cache_bytes = c.memory_bytes() as u64;
        let cs = c.stats();
        s.cache_hits = cs.hits;
        s.cache_misses = cs.misses;
        s
    }
}

/// What a mark records of `seg`, from its header and the ledger states read by `assess`
/// (entry logs unknown); `None` when a bad ledger-state block hides which ledgers it holds.
fn summary_of<F: StorageFile>(
    seg: &Segment<F>,
    states: &[(u64, StoredLedger)],
    damage: Option<&Damage>,
) -> Option<SegmentSummary> {
    if damage.is_some_and(|d| d.lost_states.is_some()) {
        return None;
    }
    let h = seg.header;
    Some(SegmentSummary {
        entry_count: h.entry_count,
        min_key: h.min_key,
        max_key: h.max_key,
        ledgers: states
            .iter()
            .map(|x| x.0)
            .min()
            .zip(states.iter().map(|x| x.0).max()),
        logs: None,
    })
}

/// Whether two summaries of a segment agree on its keys and ledgers (the mark's may also know
/// its entry logs).
fn same_reach(a: &SegmentSummary, b: &SegmentSummary) -> bool {
    a.entry_count == b.entry_count
        && a.min_key == b.min_key
        && a.max_key == b.max_key
        && a.ledgers == b.ledgers
}

/// Whether the mark's summary agrees with the segment's header on its keys.
fn same_keys<F>(a: &SegmentSummary, seg: &Segment<F>) -> bool {
    let h = seg.header;
    a.entry_count == h.entry_count && a.min_key == h.min_key && a.max_key == h.max_key
}

/// A scan over the live segments in key order from a start key that yields each key once,
/// with its location in the newest segment holding it.
pub(crate) struct MergedScan<F> {
    /// Cursors, newest segment first.
    cursors: Vec<SegCursor<F>>,
}

impl<F: StorageFile> MergedScan<F> {
    pub async fn start(index: &Index<F>, from: Key, cached: bool) -> Result<Self, Error> {
        Self::over(index.newest_first(), &index.cache, from, cached).await
    }

    /// A scan of `segments` (newest first).
    pub async fn over(
        segments: Vec<Rc<Segment<F>>>,
        cache: &RefCell<BlockCache>,
        from: Key,
        cached: bool,
    ) -> Result<Self, Error> {
        let mut cursors = Vec::with_capacity(segments.len());
        for s in segments {
            cursors.push(SegCursor::seek(s, cache, from, cached).await?);
        }
        Ok(Self { cursors })
    }

    /// The next key and its newest location; `None` at the end.
    pub async fn next(
        &mut self,
        cache: &RefCell<BlockCache>,
    ) -> Result<Option<(Key, Location)>, Error> {
        let mut best: Option<(Key, Location)> = None;
        // Cursors are newest first: on equal keys the first one seen wins.
        for c in self.cursors.iter_mut() {
            if let Some((k, loc)) = c.peek(cache).await? {
                if best.is_none_or(|(bk, _)| k < bk) {
                    best = Some((k, loc));
                }
            }
        }
        let Some((key, _)) = best else {
            return Ok(None);
        };
        for c in self.cursors.iter_mut() {
            if c.peek(cache).await?.is_some_and(|(k, _)| k == key) {
                c.advance();
            }
        }
        Ok(best)
    }
}

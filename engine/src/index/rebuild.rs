//! Rebuilding a damaged index segment from the entry logs (docs/format/index.md, "Damaged
//! segments"), so that one bad index file costs a rebuild of the ledgers it covered instead of
//! the whole shard (the index must be rebuildable: every entry record names its ledger and
//! entry). BookKeeper's offline tools `LocationsIndexRebuildOp` (every entry log scanned in id
//! order, a later copy of an entry overriding an earlier one) and `LedgersIndexRebuildOp`
//! (every ledger found is marked fenced, its master key left empty for the next add or fence
//! to set) are the model; here it runs only for the damaged segment's ranges, in the
//! background after the open (at open only for a missing or unreadable segment a version 2
//! mark names, whose ranges are unknown), and reads only the entry logs the segment points into
//! when the checkpoint mark records them (version 3).
//!
//! What a replacement holds, for a damaged segment D at its place in the mark:
//! - locations: for every key in D's key range (the mark's summary of D when its header is
//!   unreadable; all keys without one), the newest copy found in the entry logs read (largest (log id, offset): logs are written in id
//!   order and appended to), deleted ledgers left out. Keys outside what D held are harmless:
//!   a newer segment still overrides them, and an older one never held a newer copy.
//! - ledger states: those of D's readable ledger-state blocks as they were; for the ledgers
//!   whose state may have been lost (a bad ledger-state block's range between its readable
//!   neighbours, or every ledger when D's header is unreadable), a rebuilt state: fenced (a
//!   writer fenced before must never have an add accepted again), the master key and LAC that
//!   any readable segment held for the ledger (a key never changes once bound; a LAC lower
//!   than the true one only makes readers and recovery look further), the last entry as the
//!   largest found in the entry logs and readable states.
//!
//! Order (as a merge's): replacements written, fdatasynced, directory synced; the mark
//! rewritten with each replacement in its damaged segment's place (temp file, fdatasync,
//! rename, directory sync); then each damaged file renamed to `index-{id}.qis.corrupt` (kept
//! for forensics; open never removes it) and the directory synced. A crash before the mark
//! leaves the damaged segment named: the next open rebuilds again and removes the unnamed
//! replacement; after it, the damaged file is unnamed and is removed at open if the rename did
//! not happen.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use std::rc::Rc;

use crate::checkpoint::{write_mark, MarkKeeper};
use crate::files::{io_err, parse_id};
use crate::format::{
    round_up_block, u32_at, u64_at, Key, Location, Mark, SegmentSummary, StoredLedger,
    ENTRY_RECORD_HEADER_BYTES, FILE_HEADER_BYTES, KEYS_PER_BLOCK, LEDGERS_PER_BLOCK,
};
use crate::gc::LogUsage;
use crate::io::{Storage, StorageFile, BLOCK_BYTES};
use crate::ledgers::Ledgers;
use crate::sync::Closed;
use crate::{EngineConfig, Error};

use super::segment::{Segment, SegmentWriter};
use super::Index;

/// Bytes of an entry log read at once by the scan.
const SCAN_READ_BYTES: usize = 4 << 20;

/// Smallest bound on a record's length the scan uses (see `scan_entry_logs`).
const LEN_FLOOR: usize = 16 << 20;

/// Every key, for a segment whose header cannot be read.
const ALL_KEYS: (Key, Key) = ((0, 0), (u64::MAX, u64::MAX));

/// Suffix a damaged segment file gets once its replacement is named by the mark.
pub(crate) const CORRUPT_SUFFIX: &str = ".corrupt";

/// A live segment found damaged, and what of it must be rebuilt.
#[derive(Debug, Clone)]
pub(crate) struct Damage {
    pub id: u64,
    pub path: PathBuf,
    /// What the check found (one line).
    pub reason: String,
    /// Keys (inclusive) whose locations it may have held; `None`: it held none.
    pub keys: Option<(Key, Key)>,
    /// Ledgers (inclusive range) whose state it may have held and that could not be read.
    pub lost_states: Option<(u64, u64)>,
    /// The ledger states read from its good ledger-state blocks, sorted by ledger.
    pub kept_states: Vec<(u64, StoredLedger)>,
    /// Ledgers whose state a newer readable segment holds: that state overrides whatever the
    /// replacement would say, so they get none.
    pub superseded: HashSet<u64>,
    /// The entry logs (inclusive id ranges) that can hold its entries; `None`: not known, every
    /// entry log is read.
    pub logs: Option<Vec<(u64, u64)>>,
}

impl Damage {
    /// A segment that is missing or whose header or top blocks fail their check: nothing of it
    /// can be trusted, so every key and every ledger state is rebuilt.
    pub fn whole(id: u64, path: PathBuf, reason: String) -> Self {
        Self {
            id,
            path,
            reason,
            keys: Some(ALL_KEYS),
            lost_states: Some((0, u64::MAX)),
            kept_states: Vec::new(),
            superseded: HashSet::new(),
            logs: None,
        }
    }

    /// A segment that is missing or whose header or top blocks fail their check, whose reach
    /// the checkpoint mark records (`s`): its key range and the ledgers it held states for are
    /// rebuilt, from the entry logs it pointed into when the mark knows them.
    pub fn described(id: u64, path: PathBuf, reason: String, s: SegmentSummary) -> Self {
        Self {
            id,
            path,
            reason,
            keys: (s.entry_count > 0).then_some((s.min_key, s.max_key)),
            lost_states: s.ledgers,
            kept_states: Vec::new(),
            superseded: HashSet::new(),
            logs: logs_to_scan(Some(s)),
        }
    }
}

/// The entry logs a rebuild of a segment described by `s` reads: none if it holds no
/// location, its entry-log range if known, otherwise (`None`) every one.
pub(crate) fn logs_to_scan(s: Option<SegmentSummary>) -> Option<Vec<(u64, u64)>> {
    let s = s?;
    if s.entry_count == 0 {
        return Some(Vec::new());
    }
    s.logs.map(|r| vec![r])
}

/// Checks what the open of a segment did not: its index blocks and its ledger-state blocks.
/// Returns the states it could read and, if a block is bad, the damage (data blocks are
/// checked by the open's pass over every location, which reports them separately).
///
/// # Errors
/// `Io` only: a failed check is reported as damage.
pub(crate) async fn assess<F: StorageFile>(
    seg: &Segment<F>,
) -> Result<(Vec<(u64, StoredLedger)>, Option<Damage>), Error> {
    let h = seg.header;
    let mut reasons: Vec<String> = Vec::new();
    for g in 0..h.groups() {
        if let Err(e) = seg.read_block(h.index_block_at(g), KEYS_PER_BLOCK).await {
            reasons.push(corrupt_reason(e)?);
        }
    }
    // Ledger-state blocks: each readable one gives its states and the ledger ids it spans.
    let blocks = h.ledger_blocks();
    let mut states: Vec<(u64, StoredLedger)> = Vec::new();
    let mut spans: Vec<Option<(u64, u64)>> = Vec::with_capacity(blocks as usize);
    let mut bad: Vec<usize> = Vec::new();
    for i in 0..blocks {
        let n = h.ledgers_at() + i;
        let decoded = match seg.read_block(n, LEDGERS_PER_BLOCK).await {
            Ok((b, _)) => crate::format::decode_ledger_block(&b).map_err(|r| seg.bad(n, r)),
            Err(e) => Err(e),
        };
        match decoded {
            Ok(s) => {
                spans.push(s.first().map(|f| (f.0, s.last().expect("non-empty").0)));
                states.extend(s);
            }
            Err(e) => {
                reasons.push(corrupt_reason(e)?);
                bad.push(spans.len());
                spans.push(None);
            }
        }
    }
    let mut lost: Option<(u64, u64)> = None;
    for &i in &bad {
        // The lost block's ledgers lie strictly between its readable neighbours' (states are
        // sorted by ledger across blocks).
        let lo = spans[..i]
            .iter()
            .rev()
            .find_map(|s| s.map(|(_, last)| last.saturating_add(1)))
            .unwrap_or(0);
        let hi = spans[i + 1..]
            .iter()
            .find_map(|s| s.map(|(first, _)| first.saturating_sub(1)))
            .unwrap_or(u64::MAX);
        lost = Some(lost.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi))));
    }
    if lost.is_none() && states.len() as u64 != h.ledger_count {
        reasons.push("ledger-state count differs from header".into());
        lost = Some((0, u64::MAX));
    }
    // A fence-only ledger's records (one per key) may continue into a lost neighbouring block:
    // its readable keys may not be all of them, so it comes back fenced for every key, like a
    // ledger whose state was lost (the fence must not be forgotten for the lost keys).
    let mut straddling: HashSet<u64> = HashSet::new();
    for &i in &bad {
        if let Some(Some((_, last))) = i.checked_sub(1).map(|p| spans[p]) {
            straddling.insert(last);
        }
        if let Some(Some((first, _))) = spans.get(i + 1) {
            straddling.insert(*first);
        }
    }
    let mut states = crate::format::join_ledger_records(states);
    for (id, s) in states.iter_mut() {
        if straddling.contains(id) && !s.fence_keys.is_empty() {
            s.fenced = true;
            s.fence_keys.clear();
        }
    }
    if reasons.is_empty() {
        return Ok((states, None));
    }
    let damage = Damage {
        id: seg.id,
        path: seg.path.clone(),
        reason: reasons.join("; "),
        keys: (h.entry_count > 0).then_some((h.min_key, h.max_key)),
        lost_states: lost,
        kept_states: states.clone(),
        superseded: HashSet::new(),
        logs: None,
    };
    Ok((states, Some(damage)))
}

/// The reason of a `Corrupt` error; any other error is returned.
pub(crate) fn corrupt_reason(e: Error) -> Result<String, Error> {
    match e {
        Error::Corrupt { .. } => Ok(e.to_string()),
        e => Err(e),
    }
}

/// What one pass over the entry logs found.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// The newest copy of every key inside a wanted key range, sorted by key.
    pub locations: Vec<(u64, u64, Location)>,
    /// The largest entry id per ledger inside a wanted ledger range.
    pub last_entries: BTreeMap<u64, u64>,
    pub logs: u64,
    pub bytes: u64,
    /// Bytes skipped because a record failed its check (a torn write of a crashed checkpoint or
    /// compaction, or damage in the entry log itself).
    pub unreadable_bytes: u64,
}

/// Reads the entry logs of `dir` (in id order, front to back; only those whose id lies in one of
/// `logs` if given) and collects the records whose key lies in one of `keys` or whose ledger
/// lies in one of `ledgers`. Deleted ledgers are
/// skipped. A record is accepted only if its CRC32C holds and its length is at most
/// `entry_size_max` (or 16 MiB if more); a bad record is skipped by its length field when a
/// record or padding follows it, otherwise the scan resumes at the next 4 KiB boundary (where
/// every checkpoint and compaction write starts).
///
/// # Errors
/// `Io`.
pub(crate) async fn scan_entry_logs<S: Storage>(
    storage: &S,
    dir: &Path,
    keys: &[(Key, Key)],
    ledgers: &[(u64, u64)],
    logs: Option<&[(u64, u64)]>,
    is_deleted: &dyn Fn(u64) -> bool,
    entry_size_max: usize,
) -> Result<Scan, Error> {
    let names = storage
        .list(dir)
        .await
        .map_err(io_err("list ledger dir", dir, 0))?;
    let mut ids: Vec<u64> = names
        .iter()
        .filter_map(|n| parse_id(n, "entrylog-", ".qel"))
        .filter(|id| logs.is_none_or(|r| r.iter().any(|(lo, hi)| id >= lo && id <= hi)))
        .collect();
    ids.sort_unstable();
    let mut scan = Scan::default();
    let want = Wanted {
        keys,
        ledgers,
        is_deleted,
        // A bound on a record's length that garbage must pass before it is read; it does not
        // follow a lowered `entry_size_bytes_max` below what older entries may hold.
        len_max: entry_size_max.max(LEN_FLOOR),
    };
    for id in ids {
        let path = dir.join(crate::files::entry_log_name(id));
        let file = match storage.open(&path, false).await {
            Ok(f) => f,
            // Garbage collection removed it since the listing (at run time): its live entries
            // were committed elsewhere first.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("open entry log", &path, 0)(e)),
        };
        let size = file
            .size()
            .await
            .map_err(io_err("stat entry log", &path, 0))?;
        scan.logs += 1;
        scan.bytes += size;
        scan_log(&file, &path, id, size, &want, &mut scan).await?;
    }
    scan.locations = newest_copies(std::mem::take(&mut scan.locations));
    Ok(scan)
}

/// What a scan collects: records whose key lies in one of `keys` (locations) or whose ledger
/// lies in one of `ledgers` (last entries), of ledgers not deleted, at most `len_max` long.
struct Wanted<'a> {
    keys: &'a [(Key, Key)],
    ledgers: &'a [(u64, u64)],
    is_deleted: &'a dyn Fn(u64) -> bool,
    len_max: usize,
}

impl Wanted<'_> {
    /// Collects the sound record of entry `entry` of `ledger` at `pos` of log `id` into `scan`
    /// if it is wanted.
    fn collect(&self, scan: &mut Scan, id: u64, pos: u64, key: Key, data_len: usize) {
        let (ledger, entry) = key;
        if (self.is_deleted)(ledger) {
            return;
        }
        if self.keys.iter().any(|(lo, hi)| key >= *lo && key <= *hi) {
            scan.locations.push((
                ledger,
                entry,
                Location {
                    log_id: id,
                    offset: pos,
                    data_len: data_len as u32,
                },
            ));
        }
        if self
            .ledgers
            .iter()
            .any(|(lo, hi)| ledger >= *lo && ledger <= *hi)
        {
            let last = scan.last_entries.entry(ledger).or_insert(entry);
            *last = (*last).max(entry);
        }
    }
}

/// Reads `len` bytes of the entry log at `path` from `at`.
async fn read_span<F: StorageFile>(
    file: &F,
    path: &Path,
    at: u64,
    len: usize,
) -> Result<Vec<u8>, Error> {
    file.read_at(at, len)
        .await
        .map_err(io_err("read entry log", path, at))
}

/// Scans entry log `id` (`size` bytes) front to back into `scan` (see [`scan_entry_logs`]).
async fn scan_log<F: StorageFile>(
    file: &F,
    path: &Path,
    id: u64,
    size: u64,
    want: &Wanted<'_>,
    scan: &mut Scan,
) -> Result<(), Error> {
    let mut buf: Vec<u8> = Vec::new();
    let mut buf_at = 0u64;
    let mut pos = FILE_HEADER_BYTES as u64;
    // A bad record skipped on the strength of its length field: (offset, bytes).
    let mut after_bad: Option<(u64, u64)> = None;
    while pos + ENTRY_RECORD_HEADER_BYTES as u64 <= size {
        let need = ENTRY_RECORD_HEADER_BYTES;
        if !covers(buf_at, &buf, pos, need) {
            buf_at = pos - pos % BLOCK_BYTES as u64;
            let len = SCAN_READ_BYTES.min((size - buf_at) as usize);
            buf = read_span(file, path, buf_at, len).await?;
            if !covers(buf_at, &buf, pos, need) {
                break;
            }
        }
        let at = (pos - buf_at) as usize;
        let head = &buf[at..at + need];
        if head.iter().all(|b| *b == 0) {
            // Padding to the end of a write (which also confirms a skipped bad record).
            if let Some((_, n)) = after_bad.take() {
                scan.unreadable_bytes += n;
            }
            pos = round_up_block(pos + 1);
            continue;
        }
        let data_len = u32_at(head, 4) as usize;
        let total = need + data_len;
        let fits = data_len <= want.len_max && pos + total as u64 <= size;
        if fits && !covers(buf_at, &buf, pos, total) {
            buf_at = pos - pos % BLOCK_BYTES as u64;
            let len = SCAN_READ_BYTES
                .max(total + BLOCK_BYTES)
                .min((size - buf_at) as usize);
            buf = read_span(file, path, buf_at, len).await?;
        }
        let at = (pos - buf_at) as usize;
        let ok = fits
            && covers(buf_at, &buf, pos, total)
            && u32_at(&buf, at) == crc32c::crc32c(&buf[at + 4..at + total]);
        if !ok {
            pos = skip_bad(&mut after_bad, fits, pos, total as u64, scan);
            continue;
        }
        if let Some((_, n)) = after_bad.take() {
            scan.unreadable_bytes += n;
        }
        let key = (u64_at(&buf, at + 8), u64_at(&buf, at + 16));
        want.collect(scan, id, pos, key, data_len);
        pos += total as u64;
    }
    if let Some((_, n)) = after_bad {
        scan.unreadable_bytes += n;
    }
    Ok(())
}

/// Where the scan goes on after a record at `pos` (`total` bytes by its length field) failed
/// its check: past it, if its length looks sound and no bad record precedes it (its data
/// rotted; confirmed once a sound record or padding follows), else to the next 4 KiB boundary
/// after the first bad one (its length cannot be trusted either), counting what is skipped.
fn skip_bad(
    after_bad: &mut Option<(u64, u64)>,
    fits: bool,
    pos: u64,
    total: u64,
    scan: &mut Scan,
) -> u64 {
    match after_bad.take() {
        None if fits => {
            *after_bad = Some((pos, total));
            pos + total
        }
        bad => {
            let from = bad.map_or(pos, |(b, _)| b);
            let next = round_up_block(from + 1);
            scan.unreadable_bytes += next - from;
            next
        }
    }
}

/// The newest copy of each key among `locations`: later log, then later offset in it.
fn newest_copies(mut locations: Vec<(u64, u64, Location)>) -> Vec<(u64, u64, Location)> {
    locations.sort_unstable_by_key(|&(l, e, loc)| (l, e, loc.log_id, loc.offset));
    let mut newest: Vec<(u64, u64, Location)> = Vec::with_capacity(locations.len());
    for x in locations {
        match newest.last_mut() {
            Some(last) if (last.0, last.1) == (x.0, x.1) => *last = x,
            _ => newest.push(x),
        }
    }
    newest
}

fn covers(buf_at: u64, buf: &[u8], pos: u64, len: usize) -> bool {
    pos >= buf_at && pos + len as u64 <= buf_at + buf.len() as u64
}

/// What survives of a ledger's state in readable segments, merged: a master key (never
/// changes once bound), the largest LAC and last entry, whether any said fenced.
pub(crate) fn merge_surviving(
    into: &mut BTreeMap<u64, StoredLedger>,
    ledger: u64,
    s: StoredLedger,
) {
    let m = into.entry(ledger).or_default();
    m.fenced |= s.fenced;
    m.master_key = m.master_key.or(s.master_key);
    m.lac = m.lac.max(s.lac);
    m.last_entry = m.last_entry.max(s.last_entry);
    // Fence-only keys matter only while no key is bound (a later state that bound one
    // replaced them); otherwise every key any readable segment recorded still stands.
    if m.master_key.is_some() {
        m.fence_keys.clear();
    } else {
        for k in s.fence_keys {
            if !m.fence_keys.contains(&k) {
                m.fence_keys.push(k);
            }
        }
    }
}

/// The replacement of one damaged segment.
pub(crate) struct Replacement<F> {
    pub damage: Damage,
    pub segment: Segment<F>,
    pub states: Vec<(u64, StoredLedger)>,
    /// Ledgers given a rebuilt state (their state was in an unreadable block).
    pub ledgers_rebuilt: Vec<u64>,
    pub entries: u64,
}

/// What a rebuild did, for the log and the index's counters.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RebuildReport {
    pub segments: u64,
    pub ledgers: u64,
    pub entries: u64,
    pub entry_log_bytes: u64,
    pub entry_logs: u64,
    pub unreadable_bytes: u64,
    pub millis: u64,
    started: Option<Instant>,
}

/// Writes a replacement for every segment of `damaged` from one pass over the entry logs:
/// each written and fdatasynced, then the directory synced; none is named by the mark yet.
/// `surviving` is the state of every ledger known elsewhere ([`merge_surviving`] over the
/// readable segments at open, the ledger table at run time); a ledger whose state was lost gets
/// that state (or an empty one) with its last entry raised to the largest the logs show, and
/// `fenced` when `fence_rebuilt`. `take_id` gives fresh segment ids.
///
/// # Errors
/// `Io` (nothing is committed; the damaged segments stay named).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn build<S: Storage>(
    storage: &S,
    dir: &Path,
    damaged: Vec<Damage>,
    surviving: &BTreeMap<u64, StoredLedger>,
    fence_rebuilt: bool,
    is_deleted: &dyn Fn(u64) -> bool,
    entry_size_max: usize,
    take_id: &dyn Fn() -> u64,
) -> Result<(Vec<Replacement<S::File>>, RebuildReport), Error> {
    let started = quire_clock::now();
    let keys: Vec<(Key, Key)> = damaged.iter().filter_map(|d| d.keys).collect();
    let lost: Vec<(u64, u64)> = damaged.iter().filter_map(|d| d.lost_states).collect();
    // Only the entry logs the damaged segments point into, when every one of them is described
    // (a segment is written after the entries it indexes, so its keys' copies there are the
    // newest it can have named; the ledgers whose state was lost get their last entry from the
    // rest of the index too, `surviving`).
    let logs: Option<Vec<(u64, u64)>> = damaged
        .iter()
        .map(|d| d.logs.clone())
        .collect::<Option<Vec<_>>>()
        .map(|v| v.concat());
    let scan = scan_entry_logs(
        storage,
        dir,
        &keys,
        &lost,
        logs.as_deref(),
        is_deleted,
        entry_size_max,
    )
    .await?;
    let mut out = Vec::with_capacity(damaged.len());
    for d in damaged {
        let locations: Vec<(u64, u64, Location)> = match d.keys {
            Some((lo, hi)) => scan
                .locations
                .iter()
                .filter(|(l, e, _)| (*l, *e) >= lo && (*l, *e) <= hi)
                .copied()
                .collect(),
            None => Vec::new(),
        };
        let (states, ledgers_rebuilt) =
            replacement_states(&d, &scan, surviving, fence_rebuilt, is_deleted);
        let id = take_id();
        let mut w = SegmentWriter::create(storage, dir, id, None).await?;
        for &(l, e, loc) in &locations {
            w.push(l, e, loc).await?;
        }
        let segment = w.finish(&states).await?;
        out.push(Replacement {
            damage: d,
            segment,
            states,
            ledgers_rebuilt,
            entries: locations.len() as u64,
        });
    }
    storage
        .sync_dir(dir)
        .await
        .map_err(io_err("sync ledger dir", dir, 0))?;
    let report = RebuildReport {
        segments: out.len() as u64,
        ledgers: out.iter().map(|r| r.ledgers_rebuilt.len() as u64).sum(),
        entries: out.iter().map(|r| r.entries).sum(),
        entry_log_bytes: scan.bytes,
        entry_logs: scan.logs,
        unreadable_bytes: scan.unreadable_bytes,
        millis: 0,
        started: Some(started),
    };
    Ok((out, report))
}

/// The ledger states of damaged segment `d`'s replacement: its readable states (deleted
/// ledgers left out) and, for each ledger of its lost range that the scan or `surviving`
/// knows (and no newer segment holds), a rebuilt state: what is known elsewhere (master key,
/// LAC) with the last entry the entry logs show, fenced when `fence_rebuilt`. Returns the
/// states and the ledgers rebuilt.
fn replacement_states(
    d: &Damage,
    scan: &Scan,
    surviving: &BTreeMap<u64, StoredLedger>,
    fence_rebuilt: bool,
    is_deleted: &dyn Fn(u64) -> bool,
) -> (Vec<(u64, StoredLedger)>, Vec<u64>) {
    let mut states: BTreeMap<u64, StoredLedger> = d
        .kept_states
        .iter()
        .filter(|(l, _)| !is_deleted(*l))
        .cloned()
        .collect();
    let mut ledgers_rebuilt = Vec::new();
    if let Some((lo, hi)) = d.lost_states {
        let candidates: HashSet<u64> = scan
            .last_entries
            .range(lo..=hi)
            .map(|(l, _)| *l)
            .chain(surviving.range(lo..=hi).map(|(l, _)| *l))
            .filter(|l| !is_deleted(*l) && !states.contains_key(l) && !d.superseded.contains(l))
            .collect();
        let mut candidates: Vec<u64> = candidates.into_iter().collect();
        candidates.sort_unstable();
        for l in candidates {
            // What is known elsewhere (master key, LAC), with the last entry the entry logs
            // show; fenced unless the state known elsewhere is exact.
            let mut rebuilt = surviving.get(&l).cloned().unwrap_or_default();
            rebuilt.fenced |= fence_rebuilt;
            rebuilt.last_entry = rebuilt.last_entry.max(scan.last_entries.get(&l).copied());
            states.insert(l, rebuilt);
            ledgers_rebuilt.push(l);
        }
    }
    (states.into_iter().collect(), ledgers_rebuilt)
}

/// Commits written replacements: the mark (`mark` is the one in force; the caller holds the
/// checkpoint lock at run time) rewritten with each replacement in its damaged segment's place,
/// then the damaged files renamed to `*.corrupt`, the directory synced, and each rebuild logged.
/// Returns the new mark, durable.
///
/// # Errors
/// `Io`; `Corrupt` if the mark no longer names a damaged segment.
pub(crate) async fn commit<S: Storage>(
    storage: &S,
    dir: &Path,
    mark: &Mark,
    reps: &[Replacement<S::File>],
    report: &mut RebuildReport,
) -> Result<Mark, Error> {
    let mut segments = mark.segments.clone();
    for r in reps {
        let Some(at) = segments.iter().position(|id| *id == r.damage.id) else {
            return Err(crate::files::corrupt(
                &r.damage.path,
                0,
                "damaged index segment is no longer named by the checkpoint mark",
            ));
        };
        segments[at] = r.segment.id;
    }
    let new_mark = mark.with_segments(segments, reps.iter().filter_map(|r| r.segment.described()));
    // On failure the replacements stay: the mark on disk may name them (see checkpoint.rs).
    write_mark(storage, dir, &new_mark).await?;
    for r in reps {
        let to = corrupt_path(&r.damage.path);
        // A missing segment has nothing to keep; a failed rename only loses the forensic copy
        // (the file is unnamed now and the next open removes it).
        if let Err(e) = storage.rename(&r.damage.path, &to).await {
            tracing::debug!(
                "keeping {} as {}: {e}",
                r.damage.path.display(),
                to.display()
            );
        }
    }
    storage
        .sync_dir(dir)
        .await
        .map_err(io_err("sync ledger dir", dir, 0))?;
    report.millis = report
        .started
        .map_or(0, |t| quire_clock::elapsed(t).as_millis() as u64);
    for r in reps {
        tracing::warn!(
            segment = %r.damage.path.display(),
            replacement = %r.segment.path.display(),
            entries = r.entries,
            ledgers_rebuilt = r.ledgers_rebuilt.len(),
            ledgers = %ledger_list(&r.ledgers_rebuilt),
            kept_states = r.damage.kept_states.len(),
            entry_log_bytes = report.entry_log_bytes,
            entry_logs = report.entry_logs,
            unreadable_entry_log_bytes = report.unreadable_bytes,
            elapsed_ms = report.millis,
            "index segment damaged ({}): its key range was rebuilt from the entry logs, the \
             ledgers whose state was lost got a rebuilt one; the damaged file is kept as {}",
            r.damage.reason,
            corrupt_path(&r.damage.path).display(),
        );
    }
    Ok(new_mark)
}

/// Where a damaged segment file is kept.
pub(crate) fn corrupt_path(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(CORRUPT_SUFFIX);
    PathBuf::from(s)
}

/// Up to 20 ledger ids for a log line.
fn ledger_list(ids: &[u64]) -> String {
    let head: Vec<String> = ids.iter().take(20).map(|l| l.to_string()).collect();
    if ids.len() > 20 {
        format!("{} … ({} in all)", head.join(","), ids.len())
    } else {
        head.join(",")
    }
}

/// The index rebuilder's context: the index, the ledger table (states of rebuilt ledgers,
/// deleted ledgers), the live bytes per entry log (counted again after a rebuild), the mark
/// keeper (the replacement is named under the checkpoint lock), the closed flag. Built by the
/// engine facade; the merger holds one (it rebuilds before it merges).
pub(crate) struct IndexRebuilder<S: Storage> {
    pub(crate) index: Rc<Index<S::File>>,
    pub(crate) storage: Rc<S>,
    pub(crate) cfg: Rc<EngineConfig>,
    pub(crate) closed: Closed,
    pub(crate) marks: Rc<MarkKeeper>,
    pub(crate) ledgers: Rc<Ledgers>,
    pub(crate) usage: Rc<LogUsage>,
}

impl<S: Storage> Clone for IndexRebuilder<S> {
    fn clone(&self) -> Self {
        Self {
            index: self.index.clone(),
            storage: self.storage.clone(),
            cfg: self.cfg.clone(),
            closed: self.closed.clone(),
            marks: self.marks.clone(),
            ledgers: self.ledgers.clone(),
            usage: self.usage.clone(),
        }
    }
}

impl<S: Storage> IndexRebuilder<S> {
    /// Rebuilds one live segment a read found damaged after open ([`super::Index::notice`]), on
    /// the background queue with the merge lock held (no merge takes it meanwhile): its key range
    /// from the entry logs, its readable ledger states kept, and for ledgers whose state block was
    /// unreadable their state from the ledger table (exact at run time, so not fenced); then, with
    /// the checkpoint lock, the mark, the swap, and the live bytes per entry log counted again from
    /// the index (the replacement may point at a newer copy of an entry than the damaged segment
    /// did). Until it is done, reads that reach the damaged blocks fail with `Corrupt`; other
    /// ledgers are served. Returns whether a segment was rebuilt.
    ///
    /// # Errors
    /// `Io`, `Corrupt` from another damaged segment, `Closed`; nothing is committed before the mark.
    pub async fn repair(&self) -> Result<bool, Error> {
        let index = &self.index;
        let _one = index
            .merge_lock
            .acquire_permit(1)
            .await
            .map_err(|_| Error::Closed)?;
        let Some((id, pending)) = index.first_damaged() else {
            return Ok(false);
        };
        let Some(seg) = index.live(id) else {
            return Ok(false);
        };
        let at_open = pending.open_damage.is_some();
        let (damage, surviving) = self.damage_of(&seg, pending).await?;
        let (reps, report) = build(
            &*self.storage,
            index.dir(),
            vec![damage],
            &surviving,
            at_open,
            &|l: u64| self.ledgers.is_deleted(l),
            self.cfg.entry_size_bytes_max,
            &|| index.take_id(),
        )
        .await?;
        if self.closed.get() {
            for r in &reps {
                index.discard(&*self.storage, &r.segment).await;
            }
            return Err(Error::Closed);
        }
        self.commit_repair(reps, report).await?;
        Ok(true)
    }

    /// Repair, step 1: what live segment `seg` lost (`pending`: as the open or a read found
    /// it), and the states its lost ledgers are rebuilt from.
    ///
    /// Lost ledger states found by the open: the ledger table does not know them (those
    /// ledgers were refused meanwhile), so they come back as a rebuild at open makes them:
    /// what the readable segments hold, fenced. Found after open: the ledger table is exact.
    async fn damage_of(
        &self,
        seg: &Segment<S::File>,
        pending: super::Pending,
    ) -> Result<(Damage, BTreeMap<u64, StoredLedger>), Error> {
        let index = &self.index;
        let id = seg.id;
        let (damage, mut surviving) = match pending.open_damage {
            Some(d) => {
                let mut surviving = BTreeMap::new();
                for s in index.live_newest_first() {
                    if s.id == id {
                        continue;
                    }
                    // Another damaged segment the open found: its readable states only (a
                    // stand-in has none; its own rebuild gives its ledgers theirs).
                    let states = match index.open_damage_of(s.id) {
                        Some(other) => other.kept_states,
                        None => s.ledger_states().await?,
                    };
                    for (l, st) in states {
                        merge_surviving(&mut surviving, l, st);
                    }
                }
                (d, surviving)
            }
            None => {
                let (kept, found) = assess(seg).await?;
                let damage = Damage {
                    id,
                    path: seg.path.clone(),
                    reason: pending.reason,
                    keys: (seg.header.entry_count > 0)
                        .then_some((seg.header.min_key, seg.header.max_key)),
                    lost_states: found.and_then(|d| d.lost_states),
                    kept_states: kept,
                    superseded: HashSet::new(),
                    logs: logs_to_scan(seg.summary()),
                };
                let surviving = if damage.lost_states.is_some() {
                    self.ledgers.stored_states()
                } else {
                    BTreeMap::new()
                };
                (damage, surviving)
            }
        };
        if damage.logs.is_some() {
            // Only the damaged segment's entry logs are read: a ledger whose state was lost may
            // have entries elsewhere (compaction moved them, or a later checkpoint added them).
            // The intact segments index them; its last entry is the largest any of them holds.
            if let Some((lo, hi)) = damage.lost_states {
                for (l, last) in index
                    .last_entries_in(lo, hi, &|l| self.ledgers.is_deleted(l))
                    .await?
                {
                    let s = surviving.entry(l).or_default();
                    s.last_entry = s.last_entry.max(Some(last));
                }
            }
        }
        Ok((damage, surviving))
    }

    /// Repair, step 2: with the checkpoint lock, the mark naming the replacements, the swap,
    /// the rebuilt states into the ledger table, and the live bytes per entry log counted
    /// again from the index once no damaged segment is left.
    async fn commit_repair(
        &self,
        reps: Vec<Replacement<S::File>>,
        mut report: RebuildReport,
    ) -> Result<(), Error> {
        let index = &self.index;
        let _cp = self.marks.lock().await?;
        let mark = commit(
            &*self.storage,
            index.dir(),
            &self.marks.mark(),
            &reps,
            &mut report,
        )
        .await?;
        self.marks.set_mark(mark);
        // The rebuilt states of ledgers refused until now, with what the journal replay added
        // to them (adds, fences), become the table's; the next checkpoint stores them.
        let mut rebuilt: Vec<(u64, crate::format::StoredLedger)> = Vec::new();
        for r in &reps {
            for (l, st) in &r.states {
                if r.ledgers_rebuilt.contains(l) {
                    rebuilt.push((*l, st.clone()));
                }
            }
        }
        index.replace_segments(reps, &report);
        self.ledgers.restore_rebuilt(rebuilt);
        if index.rebuild_pending() {
            // Another damaged segment still waits; its rebuild recounts the live bytes.
            return Ok(());
        }
        let usage = LogUsage::default();
        index
            .for_each_location(|ledger, _, loc| {
                if !self.ledgers.is_deleted(ledger) {
                    usage.add(ledger, loc);
                }
            })
            .await?;
        self.usage.replace(usage);
        Ok(())
    }
}

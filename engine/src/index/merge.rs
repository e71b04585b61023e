//! Background merges of index segments (the compaction of an LSM tree, as RocksDB does for
//! BookKeeper `DbLedgerStorage`'s location index): a run of neighbouring live segments is
//! rewritten as one, keeping for each (ledger, entry) only the newest location (so entries
//! compaction moved lose their old location) and for each ledger only the newest state, and
//! dropping every location and state of a deleted ledger.
//!
//! Which run: the newest segments, extended to older ones while the next older segment is at
//! most [`SIZE_RATIO`] times the size of the run so far, once the run holds at least
//! [`RUN_MIN`] segments (so live segments grow geometrically in size from newest to oldest and
//! their number stays logarithmic in the entries); every segment after ledgers were deleted.
//!
//! Order of a merge (the crash argument, docs/format/index.md): the output is written and
//! synced and the directory synced without any lock (inputs are immutable, and checkpoints go
//! on adding newer segments); then, under the checkpoint lock, a mark naming the output in the
//! run's place is written (temp file, fdatasync, rename, directory sync) and the index switches
//! to it; only then are the inputs removed. A crash before the mark leaves the inputs live and
//! the output unnamed (removed at open); after it, the inputs are unnamed (removed at open).

use std::collections::BTreeMap;
use std::rc::Rc;

use crate::checkpoint::{write_mark, MarkKeeper};
use crate::format::StoredLedger;
use crate::index::rebuild::IndexRebuilder;
use crate::index::segment::{Segment, SegmentWriter};
use crate::index::{Index, MergedScan};
use crate::io::Storage;
use crate::ledgers::Ledgers;
use crate::sync::Closed;
use crate::throttle::Throttle;
use crate::{EngineConfig, Error};

/// A run grows to the next older segment while that one holds at most this many times the
/// run's entries.
pub(crate) const SIZE_RATIO: u64 = 2;
/// Fewest segments a size-driven merge combines.
pub(crate) const RUN_MIN: usize = 4;

/// Size of a segment for the merge policy: its locations and ledger states.
fn weight(s: &Segment<impl Sized>) -> u64 {
    s.header.entry_count + s.header.ledger_count + 1
}

/// The run to merge among `sizes` (oldest first), as a range, if any.
pub(crate) fn pick_run(sizes: &[u64], full: bool) -> Option<std::ops::Range<usize>> {
    let n = sizes.len();
    if full {
        return (n > 0).then_some(0..n);
    }
    let mut start = n;
    let mut acc = 0u64;
    while start > 0 {
        if n - start >= 2 && sizes[start - 1] > acc.saturating_mul(SIZE_RATIO) {
            break;
        }
        start -= 1;
        acc += sizes[start];
    }
    (n - start >= RUN_MIN).then_some(start..n)
}

/// The index merger's context: the index, the ledger table (deleted ledgers are dropped), the
/// mark keeper (a merge names its output in the mark under the checkpoint lock), the bulk
/// throttle its writes go through, the closed flag, and the rebuilder (a damaged segment is
/// rebuilt before any merge takes it as input). Built by the engine facade.
pub(crate) struct IndexMerger<S: Storage> {
    pub(crate) index: Rc<Index<S::File>>,
    pub(crate) storage: Rc<S>,
    pub(crate) cfg: Rc<EngineConfig>,
    pub(crate) closed: Closed,
    pub(crate) marks: Rc<MarkKeeper>,
    pub(crate) ledgers: Rc<Ledgers>,
    pub(crate) throttle: Rc<Throttle>,
    pub(crate) rebuilder: IndexRebuilder<S>,
}

impl<S: Storage + 'static> IndexMerger<S> {
    /// The background merger: runs merges while one is due, waiting for the index's signal in
    /// between, until the engine closes.
    pub async fn run_loop(&self) {
        loop {
            self.index.merge_signal.wait().await;
            loop {
                if self.closed.get() {
                    return;
                }
                // A segment a read found damaged is rebuilt before any merge takes it as input.
                if self.index.first_damaged().is_some() {
                    if let Err(e) = self.rebuilder.repair().await {
                        self.index.count(|s| s.rebuild_failures += 1);
                        tracing::error!("rebuilding a damaged index segment failed: {e}");
                        break;
                    }
                    continue;
                }
                match self.merge_once().await {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        self.index.count(|s| s.merge_failures += 1);
                        tracing::error!("index merge failed: {e}");
                        break;
                    }
                }
            }
        }
    }

    /// One merge if one is due; `Ok(false)` if none is.
    pub async fn merge_once(&self) -> Result<bool, Error> {
        let index = &self.index;
        let _one = index
            .merge_lock
            .acquire_permit(1)
            .await
            .map_err(|_| Error::Closed)?;
        if index.rebuild_pending() {
            // A damaged segment is rebuilt before any merge takes it as input (`IndexMerger::run_loop`).
            return Ok(false);
        }
        let full = index.full_merge_wanted.replace(false);
        let live = index.segments.borrow().clone();
        let sizes: Vec<u64> = live.iter().map(|s| weight(s)).collect();
        let Some(range) = pick_run(&sizes, full) else {
            return Ok(false);
        };
        let run: Vec<Rc<Segment<S::File>>> = live[range].to_vec();
        let out = match self.write_merged(&run).await {
            Ok(o) => o,
            Err(e) => {
                index.notice(&e);
                if full {
                    index.full_merge_wanted.set(true);
                }
                return Err(e);
            }
        };
        if self.closed.get() {
            index.discard(&*self.storage, &out).await;
            return Ok(false);
        }
        {
            let _cp = self.marks.lock().await?;
            let run_ids: Vec<u64> = run.iter().map(|s| s.id).collect();
            let mut ids = index.ids();
            let at = ids
                .iter()
                .position(|id| *id == run_ids[0])
                .expect("only merges remove live segments");
            assert_eq!(
                ids[at..at + run_ids.len()],
                run_ids[..],
                "a merged run stays contiguous"
            );
            ids.splice(at..at + run_ids.len(), [out.id]);
            let mark = self.marks.mark().with_segments(ids, out.described());
            // On failure the output stays: the mark on disk may name it (see checkpoint.rs).
            write_mark(&*self.storage, &self.cfg.ledger_dir, &mark).await?;
            self.marks.set_mark(mark);
            index
                .segments
                .borrow_mut()
                .splice(at..at + run_ids.len(), [Rc::new(out)]);
        }
        // Inputs are unnamed now; removing them is tidying (the next open removes leftovers).
        for s in &run {
            index.cache.borrow_mut().forget_segment(s.id);
            if let Err(e) = self.storage.remove(&s.path).await {
                tracing::warn!("removing merged index segment {}: {e}", s.path.display());
            }
        }
        index.sync_dir(&*self.storage).await?;
        index.count(|s| s.merges += 1);
        Ok(true)
    }

    /// Writes the merge of `run` (oldest first) into a new segment, synced, directory synced.
    async fn write_merged(&self, run: &[Rc<Segment<S::File>>]) -> Result<Segment<S::File>, Error> {
        let index = &self.index;
        let mut states: BTreeMap<u64, StoredLedger> = BTreeMap::new();
        for s in run {
            for (ledger, st) in s.ledger_states().await? {
                states.insert(ledger, st);
            }
        }
        states.retain(|l, _| !self.ledgers.is_deleted(*l));
        let id = index.take_id();
        let mut w =
            SegmentWriter::create(&*self.storage, index.dir(), id, Some(&self.throttle)).await?;
        let newest_first: Vec<_> = run.iter().rev().cloned().collect();
        let mut scan = MergedScan::over(newest_first, &index.cache, (0, 0), false).await?;
        let mut n = 0u64;
        while let Some(((ledger, entry), loc)) = scan.next(&index.cache).await? {
            if self.ledgers.is_deleted(ledger) {
                continue;
            }
            w.push(ledger, entry, loc).await?;
            n += 1;
            if n.is_multiple_of(4096) && self.closed.get() {
                return Err(Error::Closed);
            }
        }
        let states: Vec<(u64, StoredLedger)> = states.into_iter().collect();
        let seg = w.finish(&states).await?;
        index.sync_dir(&*self.storage).await?;
        Ok(seg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_grow_geometrically_and_need_four_segments() {
        // Goal: the policy merges the newest segments once four of similar size gather, pulls
        // in older ones only while they are not much bigger, and merges all when asked.
        assert_eq!(pick_run(&[10, 10, 10], false), None);
        assert_eq!(pick_run(&[10, 10, 10, 10], false), Some(0..4));
        assert_eq!(pick_run(&[1000, 10, 10, 10, 10], false), Some(1..5));
        assert_eq!(pick_run(&[70, 10, 10, 10, 10], false), Some(0..5));
        assert_eq!(pick_run(&[1000, 100, 10], false), None);
        assert_eq!(pick_run(&[1000], true), Some(0..1));
        assert_eq!(pick_run(&[], true), None);
    }
}

//! Pure quorum arithmetic: write sets, ack tracking in entry order, and coverage. No I/O, so the
//! rules can be tested exhaustively with acks arriving in any order.

use std::collections::VecDeque;

/// Ensemble positions that store `entry`: `(entry + i) mod E` for `i < Qw`
/// (BookKeeper `RoundRobinDistributionSchedule`).
pub fn write_set(entry: u64, ensemble_size: u8, write_quorum: u8) -> Vec<usize> {
    assert!(
        ensemble_size >= write_quorum && write_quorum >= 1,
        "quorum shape"
    );
    let e = u64::from(ensemble_size);
    (0..u64::from(write_quorum))
        .map(|i| ((entry + i) % e) as usize)
        .collect()
}

/// Whether a set of answering ensemble positions "covers" the ensemble: every write set has at
/// least `Qw - Qa + 1` members that answered, so no entry can have reached Qa acks without one
/// of them knowing it (BookKeeper's coverage rule for fencing and recovery).
pub fn covers(answered: &[bool], ensemble_size: u8, write_quorum: u8, ack_quorum: u8) -> bool {
    assert_eq!(answered.len(), usize::from(ensemble_size));
    let need = usize::from(write_quorum - ack_quorum + 1);
    (0..u64::from(ensemble_size)).all(|start| {
        write_set(start, ensemble_size, write_quorum)
            .into_iter()
            .filter(|&i| answered[i])
            .count()
            >= need
    })
}

/// The state of one pending add.
#[derive(Debug)]
struct Pending {
    entry: u64,
    acked: Vec<usize>,
    failed: Vec<usize>,
}

/// What an ack or failure did to the writer.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    /// Entries that just became confirmed, in entry order (the new LAC is the last one).
    Confirmed(Vec<u64>),
    /// This entry can no longer reach its ack quorum: more than `Qw - Qa` of its write set
    /// failed.
    QuorumLost(u64),
}

/// Tracks pending adds and releases them strictly in entry order once each has Qa acks
/// (BookKeeper `LedgerHandle.sendAddSuccessCallbacks`).
#[derive(Debug)]
pub struct AckTracker {
    write_quorum: u8,
    ack_quorum: u8,
    pending: VecDeque<Pending>,
    next_entry: u64,
}

impl AckTracker {
    /// Starts tracking at entry `first_entry`.
    pub fn new(write_quorum: u8, ack_quorum: u8, first_entry: u64) -> Self {
        assert!(
            write_quorum >= ack_quorum && ack_quorum >= 1,
            "quorum shape"
        );
        Self {
            write_quorum,
            ack_quorum,
            pending: VecDeque::new(),
            next_entry: first_entry,
        }
    }

    /// Registers the next entry and returns its id.
    pub fn push(&mut self) -> u64 {
        let entry = self.next_entry;
        self.next_entry += 1;
        self.pending.push_back(Pending {
            entry,
            acked: Vec::new(),
            failed: Vec::new(),
        });
        entry
    }

    /// Number of adds not yet confirmed.
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    fn slot(&mut self, entry: u64) -> Option<&mut Pending> {
        let front = self.pending.front()?.entry;
        let index = usize::try_from(entry.checked_sub(front)?).ok()?;
        self.pending.get_mut(index)
    }

    /// Records a durable ack of `entry` from ensemble position `bookie` and releases what became
    /// confirmed. Duplicate acks and acks of entries already confirmed are ignored.
    pub fn ack(&mut self, entry: u64, bookie: usize) -> Progress {
        self.record_ack(entry, bookie);
        Progress::Confirmed(self.take_confirmed())
    }

    /// Records a durable ack without releasing anything: while an ensemble change runs the
    /// writer holds success back (BookKeeper `changingEnsemble`), then calls
    /// [`AckTracker::take_confirmed`].
    pub fn record_ack(&mut self, entry: u64, bookie: usize) {
        if let Some(p) = self.slot(entry) {
            if !p.acked.contains(&bookie) {
                p.acked.push(bookie);
            }
        }
    }

    /// Pops the entries at the head that have Qa acks, in entry order (the new LAC is the last).
    pub fn take_confirmed(&mut self) -> Vec<u64> {
        let mut confirmed = Vec::new();
        while let Some(front) = self.pending.front() {
            if front.acked.len() < usize::from(self.ack_quorum) {
                break;
            }
            confirmed.push(front.entry);
            self.pending.pop_front();
        }
        confirmed
    }

    /// Forgets every ack and failure of ensemble position `bookie` for all pending entries:
    /// the position now names a replacement bookie that has to store them anew (BookKeeper
    /// `PendingAddOp.unsetSuccessAndSendWriteRequest`).
    pub fn forget_position(&mut self, bookie: usize) {
        for p in &mut self.pending {
            p.acked.retain(|&b| b != bookie);
            p.failed.retain(|&b| b != bookie);
        }
    }

    /// The first pending entry that more than `Qw - Qa` bookies of its write set failed, i.e.
    /// that can no longer reach Qa with the current ensemble.
    pub fn first_quorum_lost(&self) -> Option<u64> {
        let tolerated = usize::from(self.write_quorum - self.ack_quorum);
        self.pending
            .iter()
            .find(|p| p.failed.len() > tolerated)
            .map(|p| p.entry)
    }

    /// Records that ensemble position `bookie` failed to store `entry`.
    pub fn fail(&mut self, entry: u64, bookie: usize) -> Progress {
        let tolerated = usize::from(self.write_quorum - self.ack_quorum);
        match self.slot(entry) {
            Some(p) => {
                if !p.failed.contains(&bookie) {
                    p.failed.push(bookie);
                }
                if p.failed.len() > tolerated {
                    Progress::QuorumLost(entry)
                } else {
                    Progress::Confirmed(Vec::new())
                }
            }
            None => Progress::Confirmed(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn striping_with_e3_qw2() {
        // Goal: entry e lands on positions (e + i) mod E (BookKeeper round-robin striping).
        assert_eq!(write_set(0, 3, 2), vec![0, 1]);
        assert_eq!(write_set(1, 3, 2), vec![1, 2]);
        assert_eq!(write_set(2, 3, 2), vec![2, 0]);
        assert_eq!(write_set(3, 3, 2), vec![0, 1]);
        assert_eq!(write_set(7, 3, 3), vec![1, 2, 0]);
    }

    #[test]
    fn acks_out_of_order_confirm_in_order() {
        // Goal: with E=3, Qw=2, Qa=2, acks for later entries arriving first confirm nothing
        // until every earlier entry has its quorum; then they confirm in entry order.
        let mut t = AckTracker::new(2, 2, 0);
        for _ in 0..4 {
            t.push();
        }
        // Entry 3 and 2 fully acked first, then 1, then 0 partially, then 0 fully.
        assert_eq!(t.ack(3, 0), Progress::Confirmed(vec![]));
        assert_eq!(t.ack(3, 1), Progress::Confirmed(vec![]));
        assert_eq!(t.ack(2, 2), Progress::Confirmed(vec![]));
        assert_eq!(t.ack(2, 0), Progress::Confirmed(vec![]));
        assert_eq!(t.ack(1, 1), Progress::Confirmed(vec![]));
        assert_eq!(t.ack(1, 2), Progress::Confirmed(vec![]));
        assert_eq!(t.ack(0, 0), Progress::Confirmed(vec![]));
        assert_eq!(
            t.ack(0, 0),
            Progress::Confirmed(vec![]),
            "a duplicate ack is not a second ack"
        );
        assert_eq!(t.ack(0, 1), Progress::Confirmed(vec![0, 1, 2, 3]));
        assert_eq!(t.pending_count(), 0);
    }

    #[test]
    fn every_ack_permutation_confirms_in_order() {
        // Goal: exhaustively, for 3 entries with E=3, Qw=3, Qa=2, every order of the 9 acks
        // yields confirmations in entry order, each exactly once. Method: enumerate
        // permutations by Heap's algorithm.
        let acks: Vec<(u64, usize)> = (0..3).flat_map(|e| (0..3).map(move |b| (e, b))).collect();
        let mut perm = acks.clone();
        let mut c = vec![0usize; perm.len()];
        let mut checked = 0;
        let mut check = |order: &[(u64, usize)]| {
            let mut t = AckTracker::new(3, 2, 0);
            for _ in 0..3 {
                t.push();
            }
            let mut seen = Vec::new();
            for &(e, b) in order {
                if let Progress::Confirmed(v) = t.ack(e, b) {
                    seen.extend(v);
                }
            }
            assert_eq!(seen, vec![0, 1, 2], "order {order:?}");
            checked += 1;
        };
        check(&perm);
        let mut i = 0;
        while i < perm.len() {
            if c[i] < i {
                if i % 2 == 0 {
                    perm.swap(0, i)
                } else {
                    perm.swap(c[i], i)
                }
                check(&perm);
                c[i] += 1;
                i = 0;
            } else {
                c[i] = 0;
                i += 1;
            }
        }
        assert_eq!(checked, 362_880);
    }

    #[test]
    fn quorum_is_lost_only_past_qw_minus_qa_failures() {
        let mut t = AckTracker::new(3, 2, 0);
        t.push();
        assert_eq!(t.fail(0, 0), Progress::Confirmed(vec![]));
        assert_eq!(t.fail(0, 1), Progress::QuorumLost(0));
    }

    #[test]
    fn forgetting_a_replaced_position_drops_its_acks_and_failures() {
        // Goal: after an ensemble change replaces position 2, acks and failures recorded for it
        // no longer count: an entry needs Qa acks from the bookies that now hold the position.
        // Method: E=3, Qw=3, Qa=2; entry 0 acked by 0 and 2, entry 1 failed by 2 and 1.
        let mut t = AckTracker::new(3, 2, 0);
        t.push();
        t.push();
        t.record_ack(0, 2);
        t.fail(1, 2);
        t.fail(1, 1);
        assert_eq!(t.first_quorum_lost(), Some(1));
        t.forget_position(2);
        assert_eq!(t.first_quorum_lost(), None);
        t.record_ack(0, 0);
        assert_eq!(
            t.take_confirmed(),
            Vec::<u64>::new(),
            "the replaced bookie's ack is gone"
        );
        t.record_ack(0, 2);
        t.record_ack(1, 0);
        t.record_ack(1, 2);
        assert_eq!(t.take_confirmed(), vec![0, 1]);
    }

    #[test]
    fn coverage_needs_qw_minus_qa_plus_one_per_write_set() {
        // E=3, Qw=3, Qa=2: any 2 answers cover; 1 does not.
        assert!(covers(&[true, true, false], 3, 3, 2));
        assert!(!covers(&[true, false, false], 3, 3, 2));
        // E=3, Qw=2, Qa=2: one answer per write set suffices; {0} misses write set {1, 2}.
        assert!(!covers(&[true, false, false], 3, 2, 2));
        assert!(covers(&[true, false, true], 3, 2, 2));
    }
}

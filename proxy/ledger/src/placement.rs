//! Placement of replacement bookies for ensemble changes (BookKeeper
//! `EnsemblePlacementPolicy.replaceBookie`). Pure functions, no I/O.
//!
//! * Default (no rack labels registered): a uniformly random writable bookie
//!   (`DefaultEnsemblePlacementPolicy`).
//! * Rack-aware (some registered bookie carries a `rack` label): prefer a bookie whose rack no
//!   bookie that stays in the ensemble uses; if there is none, any writable bookie (best effort,
//!   like `RackawareEnsemblePlacementPolicy` with `enforceMinNumRacksPerWriteQuorum=false`).
//!   Bookies without a label count as rack [`DEFAULT_RACK`], as in BookKeeper.

use std::collections::HashSet;

use quire_metadata::{BookieId, BookieInfo};
use rand::seq::SliceRandom;
use rand::Rng;

/// Rack of a bookie registered without a label (BookKeeper `NetworkTopology.DEFAULT_RACK`).
pub const DEFAULT_RACK: &str = "/default-rack";

fn rack_of<'a>(registered: &'a [BookieInfo], bookie: &BookieId) -> &'a str {
    registered
        .iter()
        .find(|b| &b.id == bookie)
        .and_then(|b| b.rack.as_deref())
        .unwrap_or(DEFAULT_RACK)
}

/// Picks a bookie to take over a failed ensemble position.
///
/// `registered` is the bookie registry; `keep` the bookies that stay in the ensemble (their
/// racks are "in use"); `exclude` bookies that must not be chosen (the whole current ensemble,
/// bookies that failed recently). Read-only bookies are never chosen. Returns `None` when no
/// bookie qualifies.
pub fn choose_replacement<R: Rng + ?Sized>(
    registered: &[BookieInfo],
    keep: &[BookieId],
    exclude: &HashSet<BookieId>,
    rng: &mut R,
) -> Option<BookieId> {
    let candidates: Vec<&BookieInfo> = registered
        .iter()
        .filter(|b| !b.read_only && !exclude.contains(&b.id) && !keep.contains(&b.id))
        .collect();
    if registered.iter().any(|b| b.rack.is_some()) {
        let used: HashSet<&str> = keep.iter().map(|b| rack_of(registered, b)).collect();
        let fresh: Vec<&BookieInfo> = candidates
            .iter()
            .copied()
            .filter(|b| !used.contains(b.rack.as_deref().unwrap_or(DEFAULT_RACK)))
            .collect();
        if let Some(b) = fresh.choose(rng) {
            return Some(b.id.clone());
        }
    }
    candidates.choose(rng).map(|b| b.id.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn info(id: &str, rack: Option<&str>, read_only: bool) -> BookieInfo {
        BookieInfo {
            id: BookieId(id.into()),
            rack: rack.map(str::to_string),
            read_only,
        }
    }

    #[test]
    fn rack_aware_prefers_an_unused_rack() {
        // Goal: with rack labels, the replacement comes from a rack the rest of the ensemble does
        // not use, whenever such a bookie exists; otherwise any eligible bookie is taken.
        // Method: ensemble {a(r1), b(r2), c(r1)} loses c; spares d(r1), e(r2), f(r3), g(r3,
        // read-only). Over many seeds only f may be chosen. Then without f, d or e is chosen.
        let registered = vec![
            info("a", Some("r1"), false),
            info("b", Some("r2"), false),
            info("c", Some("r1"), false),
            info("d", Some("r1"), false),
            info("e", Some("r2"), false),
            info("f", Some("r3"), false),
            info("g", Some("r3"), true),
        ];
        let keep = vec![BookieId("a".into()), BookieId("b".into())];
        let exclude: HashSet<BookieId> = ["a", "b", "c"]
            .iter()
            .map(|s| BookieId((*s).into()))
            .collect();
        for seed in 0..200 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            assert_eq!(
                choose_replacement(&registered, &keep, &exclude, &mut rng),
                Some(BookieId("f".into()))
            );
        }
        let mut exclude_f = exclude.clone();
        exclude_f.insert(BookieId("f".into()));
        let mut seen = HashSet::new();
        for seed in 0..200 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            seen.insert(
                choose_replacement(&registered, &keep, &exclude_f, &mut rng)
                    .unwrap()
                    .0,
            );
        }
        assert_eq!(seen, ["d", "e"].iter().map(|s| (*s).to_string()).collect());
    }

    #[test]
    fn unlabelled_bookies_share_the_default_rack() {
        // Goal: a bookie without a label is in DEFAULT_RACK, so a labelled spare beats an
        // unlabelled one when the ensemble already has an unlabelled bookie.
        let registered = vec![
            info("a", None, false),
            info("b", Some("r1"), false),
            info("c", None, false),
            info("d", Some("r2"), false),
        ];
        let keep = vec![BookieId("a".into()), BookieId("b".into())];
        let exclude: HashSet<BookieId> = keep.iter().cloned().collect();
        for seed in 0..100 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            assert_eq!(
                choose_replacement(&registered, &keep, &exclude, &mut rng),
                Some(BookieId("d".into()))
            );
        }
    }

    #[test]
    fn random_policy_skips_excluded_and_read_only_and_may_find_nothing() {
        // Goal: without labels every writable, non-excluded bookie can be picked and nothing
        // else; with no such bookie the answer is None.
        let registered = vec![
            info("a", None, false),
            info("b", None, false),
            info("c", None, true),
            info("d", None, false),
            info("e", None, false),
        ];
        let keep = vec![BookieId("a".into())];
        let exclude: HashSet<BookieId> = [BookieId("a".into()), BookieId("b".into())]
            .into_iter()
            .collect();
        let mut seen = HashSet::new();
        for seed in 0..200 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            seen.insert(
                choose_replacement(&registered, &keep, &exclude, &mut rng)
                    .unwrap()
                    .0,
            );
        }
        assert_eq!(seen, ["d", "e"].iter().map(|s| (*s).to_string()).collect());
        let all: HashSet<BookieId> = registered.iter().map(|b| b.id.clone()).collect();
        assert_eq!(
            choose_replacement(&registered, &keep, &all, &mut quire_clock::rng()),
            None
        );
    }
}

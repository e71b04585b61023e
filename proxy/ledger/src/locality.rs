//! Reads by distance (BookKeeper `EnsemblePlacementPolicy.reorderReadSequence`, issue 30 item
//! 3): the order in which a reader asks the replicas of a write set, closest first.
//!
//! A replica's distance from this client is its tier: the same rack (in the same region),
//! then the same region, then other regions; a bookie whose labels this client does not know
//! yet counts as another region's. Bookies that failed recently (quarantined) go after every
//! healthy one, as BookKeeper moves bookies with a failure history to the back
//! (`bookieFailureHistoryExpirationMSec`). Ties keep the write-set order, so that with no
//! labels anywhere the order is the write set's, as before.
//!
//! `[ledger] reorder_read_sequence = false` (BookKeeper `reorderReadSequenceEnabled`) turns the
//! ordering off: replicas are asked in write-set order ([`read_sequence`]).
//!
//! The client's own labels are `ClientConfig::region` / `rack` (the proxy's `[proxy] region` /
//! `rack`); a client with neither orders by failures only. The bookies' labels come from the
//! registry (`BookieInfo`), cached by the client ([`LabelCache`]): refreshed by every listing
//! of the registry the client makes anyway (ledger creation, ensemble changes,
//! re-replication), and, for a client with labels, by a background listing when a read finds
//! the cache older than [`LABELS_REFRESH_INTERVAL`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quire_metadata::{BookieId, BookieInfo};

use crate::placement::{DEFAULT_RACK, DEFAULT_REGION};

/// How old the cached registry labels may get before a read of a client with labels lists the
/// registry again (in the background; the read goes on with the labels it has).
pub const LABELS_REFRESH_INTERVAL: Duration = Duration::from_secs(30);

/// Where a bookie or a client sits: its region and its rack within the region.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Locality {
    /// The region label, [`DEFAULT_REGION`] when none is set.
    pub region: String,
    /// The rack label, [`DEFAULT_RACK`] when none is set.
    pub rack: String,
}

impl Locality {
    /// The locality of labels that may be unset (unset ones take the defaults).
    pub fn new(region: Option<&str>, rack: Option<&str>) -> Self {
        Self {
            region: region.unwrap_or(DEFAULT_REGION).to_string(),
            rack: rack.unwrap_or(DEFAULT_RACK).to_string(),
        }
    }

    /// A registered bookie's locality. The registry carries only the rack today; the region
    /// joins it with `BookieInfo::region` (issue 30 item 1), until then the default region.
    pub fn of_bookie(info: &BookieInfo) -> Self {
        Self::new(info.region.as_deref(), info.rack.as_deref())
    }

    /// How far `other` is from `self`: 0 the same rack of the same region, 1 the same region,
    /// 2 another region.
    pub fn distance(&self, other: &Locality) -> u8 {
        match (self.region == other.region, self.rack == other.rack) {
            (true, true) => 0,
            (true, false) => 1,
            (false, _) => 2,
        }
    }
}

/// One replica as [`read_order`] sees it: its locality if known, and whether it failed lately.
#[derive(Debug, Clone, Copy)]
pub struct Replica<'a> {
    /// The bookie's labels; `None` when the client has not seen them in the registry.
    pub locality: Option<&'a Locality>,
    /// Quarantined: it timed out or was unreachable lately.
    pub failed: bool,
}

/// The order in which to ask `replicas` (a write set, in write-set order): indices into
/// `replicas`, the healthy ones first, each group by distance from `local` (same rack, same
/// region, other regions or unknown), ties in write-set order. With `local` `None` (a client
/// without labels) only failures move a replica back.
pub fn read_order(local: Option<&Locality>, replicas: &[Replica<'_>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..replicas.len()).collect();
    // A stable sort: equal keys keep the write-set order.
    order.sort_by_key(|&i| {
        let r = &replicas[i];
        let distance = match (local, r.locality) {
            (None, _) => 0,
            (Some(me), Some(it)) => me.distance(it),
            (Some(_), None) => 2,
        };
        (r.failed, distance)
    });
    order
}

/// The read sequence a client with `reorder` (`[ledger] reorder_read_sequence`, BookKeeper
/// `reorderReadSequenceEnabled`) uses: [`read_order`] when on; when off the write-set order
/// `0..replicas.len()` as it is, failed or far replicas included (BookKeeper reads the write
/// set unchanged when the switch is off).
pub fn read_sequence(
    reorder: bool,
    local: Option<&Locality>,
    replicas: &[Replica<'_>],
) -> Vec<usize> {
    if reorder {
        read_order(local, replicas)
    } else {
        (0..replicas.len()).collect()
    }
}

/// The registry's labels as this client last listed them (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct LabelCache {
    /// Each registered bookie's locality at the last listing.
    pub(crate) labels: Arc<HashMap<BookieId, Locality>>,
    /// When the registry was last listed; `None`: never.
    pub(crate) listed_at: Option<Instant>,
    /// A background listing started by a read is under way.
    pub(crate) refreshing: bool,
}

impl LabelCache {
    /// Replaces the labels with those of a listing made now.
    pub(crate) fn update(&mut self, listed: &[BookieInfo]) {
        self.labels = Arc::new(
            listed
                .iter()
                .map(|b| (b.id.clone(), Locality::of_bookie(b)))
                .collect(),
        );
        self.listed_at = Some(quire_clock::now());
    }

    /// Whether a read should start a background listing: never listed, or listed longer than
    /// [`LABELS_REFRESH_INTERVAL`] ago, and no listing under way.
    pub(crate) fn wants_refresh(&self) -> bool {
        !self.refreshing
            && self
                .listed_at
                .is_none_or(|at| quire_clock::elapsed(at) >= LABELS_REFRESH_INTERVAL)
    }
}

#[cfg(test)]
mod tests {
    //! Goal: the read order puts the same rack first, then the same region, then other regions
    //! and unknown bookies, quarantined bookies after every healthy one, and keeps the
    //! write-set order among equals; a client without labels keeps the write-set order but for
    //! failures. Method: tables of labelled write sets.

    use super::*;

    fn loc(region: &str, rack: &str) -> Locality {
        Locality::new(Some(region), Some(rack))
    }

    /// One case: its name, the client's labels, the replicas (labels or unknown, failed), the
    /// order expected.
    type Case<'a> = (&'a str, Option<&'a Locality>, Vec<Replica<'a>>, Vec<usize>);

    #[test]
    fn read_order_table() {
        let a1 = loc("a", "r1");
        let a2 = loc("a", "r2");
        let b1 = loc("b", "r1");
        let c9 = loc("c", "r9");
        let dflt = Locality::new(None, None);
        let ok = |l: &'static Locality| Replica {
            locality: Some(l),
            failed: false,
        };
        let bad = |l: &'static Locality| Replica {
            locality: Some(l),
            failed: true,
        };
        let unknown = Replica {
            locality: None,
            failed: false,
        };
        // 'static labels for the table.
        let leak = |l: Locality| -> &'static Locality { Box::leak(Box::new(l)) };
        let (a1, a2, b1, c9, dflt) = (leak(a1), leak(a2), leak(b1), leak(c9), leak(dflt));
        let cases: Vec<Case<'_>> = vec![
            (
                "all local",
                Some(a1),
                vec![ok(a1), ok(a1), ok(a1)],
                vec![0, 1, 2],
            ),
            (
                "same rack before same region before remote",
                Some(a1),
                vec![ok(b1), ok(a2), ok(a1)],
                vec![2, 1, 0],
            ),
            (
                "a rack of the same name in another region is remote",
                Some(a1),
                vec![ok(b1), ok(c9), ok(a2)],
                vec![2, 0, 1],
            ),
            (
                "ties keep the write-set order",
                Some(a1),
                vec![ok(c9), ok(b1), ok(a2), ok(a2)],
                vec![2, 3, 0, 1],
            ),
            (
                "failed last, even when local",
                Some(a1),
                vec![bad(a1), ok(b1), ok(a2)],
                vec![2, 1, 0],
            ),
            (
                "failed ones ordered by distance among themselves",
                Some(a1),
                vec![bad(b1), bad(a1), ok(c9)],
                vec![2, 1, 0],
            ),
            (
                "unknown labels count as remote",
                Some(a1),
                vec![unknown, ok(b1), ok(a2)],
                vec![2, 0, 1],
            ),
            (
                "no client labels: write-set order",
                None,
                vec![ok(b1), ok(a2), ok(a1)],
                vec![0, 1, 2],
            ),
            (
                "no client labels: failures still last",
                None,
                vec![bad(a1), ok(b1), unknown],
                vec![1, 2, 0],
            ),
            (
                "unlabelled cluster, default client: write-set order",
                Some(dflt),
                vec![ok(dflt), ok(dflt), bad(dflt)],
                vec![0, 1, 2],
            ),
            (
                "default client prefers unlabelled bookies (default rack and region)",
                Some(dflt),
                vec![ok(a1), ok(dflt)],
                vec![1, 0],
            ),
            ("empty write set", Some(a1), vec![], vec![]),
        ];
        for (name, local, replicas, want) in cases {
            assert_eq!(read_order(local, &replicas), want, "{name}");
        }
    }

    #[test]
    fn reorder_off_keeps_the_write_set_order() {
        let a1 = loc("a", "r1");
        let b1 = loc("b", "r1");
        let c1 = loc("c", "r1");
        // A write set whose closest replica is last and whose first replica failed lately.
        let replicas = [
            Replica {
                locality: Some(&b1),
                failed: true,
            },
            Replica {
                locality: Some(&c1),
                failed: false,
            },
            Replica {
                locality: None,
                failed: false,
            },
            Replica {
                locality: Some(&a1),
                failed: false,
            },
        ];
        assert_eq!(read_sequence(false, Some(&a1), &replicas), vec![0, 1, 2, 3]);
        assert_eq!(read_sequence(false, None, &replicas), vec![0, 1, 2, 3]);
        assert_eq!(read_sequence(true, Some(&a1), &replicas), vec![3, 1, 2, 0]);
        assert_eq!(
            read_sequence(true, Some(&a1), &replicas),
            read_order(Some(&a1), &replicas)
        );
        assert!(read_sequence(false, Some(&a1), &[]).is_empty());
    }

    #[test]
    fn distance_and_defaults() {
        assert_eq!(Locality::new(None, None), loc(DEFAULT_REGION, DEFAULT_RACK));
        assert_eq!(loc("a", "r1").distance(&loc("a", "r1")), 0);
        assert_eq!(loc("a", "r1").distance(&loc("a", "r2")), 1);
        assert_eq!(loc("a", "r1").distance(&loc("b", "r1")), 2);
        let info = BookieInfo {
            id: BookieId("127.0.0.1:1".into()),
            rack: Some("r7".into()),
            region: None,
            read_only: false,
        };
        assert_eq!(Locality::of_bookie(&info), loc(DEFAULT_REGION, "r7"));
        let info = BookieInfo {
            region: Some("rb".into()),
            ..info
        };
        assert_eq!(Locality::of_bookie(&info), loc("rb", "r7"));
    }

    #[test]
    fn label_cache_refreshes_when_old() {
        let mut cache = LabelCache::default();
        assert!(cache.wants_refresh(), "never listed");
        cache.update(&[BookieInfo {
            id: BookieId("b1".into()),
            rack: None,
            region: None,
            read_only: false,
        }]);
        assert!(!cache.wants_refresh(), "just listed");
        assert_eq!(
            cache.labels.get(&BookieId("b1".into())),
            Some(&Locality::new(None, None))
        );
        cache.listed_at = Some(quire_clock::now() - LABELS_REFRESH_INTERVAL);
        assert!(cache.wants_refresh(), "listed an interval ago");
        cache.refreshing = true;
        assert!(!cache.wants_refresh(), "a listing is under way");
    }
}

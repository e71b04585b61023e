//! Ensemble placement (BookKeeper `EnsemblePlacementPolicy`: `newEnsemble` and
//! `replaceBookie`). Pure functions over the bookie registry, no I/O; the writer, the ensemble
//! change, recovery and re-replication (autorecovery, decommission) call them and connect to
//! what they return.
//!
//! Every bookie has a location: its registered `region` and `rack`, or [`DEFAULT_REGION`] and
//! [`DEFAULT_RACK`] without a label (BookKeeper's `NetworkTopology` defaults). A write set is
//! the Qw consecutive ensemble positions `(s + i) mod E`, `i < Qw` ([`quorum::write_set`]), so
//! an ensemble has E write sets, one per start `s`. The policies ([`Policy`]):
//!
//! * `default` (`DefaultEnsemblePlacementPolicy`): E uniformly random writable bookies. A
//!   replacement prefers a bookie whose rack no bookie that stays uses, if racks are labelled
//!   (the placement Quire had before policies existed).
//! * `rack-aware` (`RackawareEnsemblePlacementPolicy`): every write set spans at least
//!   `min(min_racks_per_write_quorum, Qw)` racks (`minNumRacksPerWriteQuorum`); racks are
//!   told apart by region and name. With `enforce_min_racks`
//!   (`enforceMinNumRacksPerWriteQuorum`) a placement that cannot keep it fails with
//!   [`Error::Placement`]; without, it takes the best spread it finds.
//! * `region-aware` (`RegionAwareEnsemblePlacementPolicy`): the ensemble is spread evenly over
//!   the regions that have writable bookies, racks spread inside each region, under the
//!   durability invariant: **no ack quorum lies in fewer than `min_regions_for_durability`
//!   (m) regions**, i.e. every Qa bookies of every write set touch at least m regions. With the
//!   write set's per-region counts sorted `c1 >= c2 >= ...`, the Qa bookies touching the fewest
//!   regions take the largest regions first, so the exact condition is
//!   `c1 + ... + c(m-1) <= Qa - 1` (for m = 2: no region holds Qa bookies of a write set). It
//!   needs Qa >= m. With `enforce_durability` (DistributedLog's default) a placement that
//!   cannot keep it fails with [`Error::Placement`] naming the regions and their bookies;
//!   without, it takes the best spread it finds.
//!
//! A replacement keeps the same rule for the write sets holding its position, given the
//! bookies that stay; a write set the staying bookies already break (a ledger placed under
//! another policy) is not held against it. A bookie of the ensemble that is no longer
//! registered (down) has no known location and counts as an open position.

use std::collections::{BTreeMap, HashMap, HashSet};

use quire_metadata::{BookieId, BookieInfo, ConfigError, StreamPlacement};
use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::{quorum, Error};

/// Rack of a bookie registered without a label (BookKeeper `NetworkTopology.DEFAULT_RACK`).
pub const DEFAULT_RACK: &str = "/default-rack";

/// Region of a bookie registered without a label (BookKeeper
/// `NetworkTopology.DEFAULT_REGION`).
pub const DEFAULT_REGION: &str = "default-region";

/// Search steps a new ensemble's placement may take before it gives up (the label search is
/// exponential in the worst case; real shapes need a few dozen steps).
const SEARCH_STEPS_MAX: usize = 200_000;

/// The placement policy (`[ledger] placement`, or a stream's own): defined beside the stream
/// and ledger records that carry it.
pub use quire_metadata::PlacementPolicy as Policy;

/// The placement settings: the `[ledger]` table of `quire proxy`, `quire autorecovery` and
/// `quire bookie` (for its autorecovery daemon), and [`crate::ClientConfig::placement`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlacementSettings {
    /// `default`, `rack-aware` or `region-aware` (see the module docs).
    pub placement: Policy,
    /// Racks each write set spans at least under `rack-aware` (BookKeeper
    /// `minNumRacksPerWriteQuorum`, default 2), capped at Qw; 1 to 255.
    pub min_racks_per_write_quorum: u8,
    /// Fail a `rack-aware` placement that cannot keep `min_racks_per_write_quorum` (BookKeeper
    /// `enforceMinNumRacksPerWriteQuorum`, default false: best effort).
    pub enforce_min_racks: bool,
    /// Regions every ack quorum spans at least under `region-aware` (DistributedLog
    /// `minRegionsForDurability`, default 2); 1 to 255.
    pub min_regions_for_durability: u8,
    /// Fail a `region-aware` placement that cannot keep `min_regions_for_durability`
    /// (BookKeeper `enforceDurability`, default true).
    pub enforce_durability: bool,
    /// Reads ask a write set's replicas closest first, recently failed ones last
    /// ([`crate::locality`]; BookKeeper `reorderReadSequenceEnabled`, the placement policy's
    /// `reorderReadSequence`, which also orders the LAC long polls). Default true; false asks
    /// them in write-set order, whatever their distance or failures.
    pub reorder_read_sequence: bool,
}

impl Default for PlacementSettings {
    fn default() -> Self {
        Self {
            placement: Policy::Default,
            min_racks_per_write_quorum: 2,
            enforce_min_racks: false,
            min_regions_for_durability: 2,
            enforce_durability: true,
            reorder_read_sequence: true,
        }
    }
}

impl PlacementSettings {
    /// Checks the keys (prefix the table with [`ConfigError::in_table`]).
    ///
    /// # Errors
    /// `min_racks_per_write_quorum` or `min_regions_for_durability` of 0.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.min_racks_per_write_quorum == 0 {
            return Err(ConfigError::invalid(
                "min_racks_per_write_quorum",
                0,
                "expected 1 to 255",
            ));
        }
        if self.min_regions_for_durability == 0 {
            return Err(ConfigError::invalid(
                "min_regions_for_durability",
                0,
                "expected 1 to 255",
            ));
        }
        Ok(())
    }
}

/// The placement one ledger is placed and replaced by (issue 30 item 2): the client's
/// `[ledger]` settings, or the stream's own placement recorded in the ledger's custom
/// metadata (`quire.placement`, [`StreamPlacement::record`]), whose policy keys replace the
/// client's (`reorder_read_sequence` stays the client's) and whose regions, when named, are
/// the only ones its bookies may come from. A writer creates a ledger by it, and ensemble
/// changes, recovery and re-replication (autorecovery, decommission) read it back from the
/// ledger's metadata, so a replacement keeps the rule the ledger was placed by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerPlacement {
    /// The rule's settings.
    pub settings: PlacementSettings,
    /// The regions the bookies may be in; empty: every region.
    pub regions: Vec<String>,
}

impl LedgerPlacement {
    /// The placement of a ledger whose custom metadata is `custom`: the recorded one applied
    /// over `cluster`, else `cluster` itself.
    ///
    /// # Errors
    /// `Metadata` (`Invalid`) when the recorded placement does not parse or is not valid.
    pub fn of_ledger(
        cluster: &PlacementSettings,
        custom: &BTreeMap<String, String>,
    ) -> Result<Self, Error> {
        let own = StreamPlacement::recorded(custom)?;
        Ok(Self::new(cluster, own.as_ref()))
    }

    /// `own` applied over `cluster` (see the type's docs); `cluster` alone for `None`.
    pub fn new(cluster: &PlacementSettings, own: Option<&StreamPlacement>) -> Self {
        let Some(own) = own else {
            return Self {
                settings: cluster.clone(),
                regions: Vec::new(),
            };
        };
        Self {
            settings: PlacementSettings {
                placement: own.placement,
                min_racks_per_write_quorum: own.min_racks_per_write_quorum,
                enforce_min_racks: own.enforce_min_racks,
                min_regions_for_durability: own.min_regions_for_durability,
                enforce_durability: own.enforce_durability,
                reorder_read_sequence: cluster.reorder_read_sequence,
            },
            regions: own.regions.clone(),
        }
    }

    /// The registered bookies outside the placement's regions (none when it names none),
    /// which the caller adds to the bookies a placement avoids or excludes.
    pub fn outside(&self, registered: &[BookieInfo]) -> HashSet<BookieId> {
        if self.regions.is_empty() {
            return HashSet::new();
        }
        registered
            .iter()
            .filter(|b| !self.regions.contains(&location(b).region))
            .map(|b| b.id.clone())
            .collect()
    }
}

/// A ledger's quorum shape (E, Qw, Qa), E >= Qw >= Qa >= 1.
pub type Shape = (u8, u8, u8);

/// Where a bookie is: (region, rack).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Location {
    pub region: String,
    pub rack: String,
}

/// `info`'s location, with BookKeeper's defaults for a missing label.
pub fn location(info: &BookieInfo) -> Location {
    Location {
        region: info
            .region
            .clone()
            .unwrap_or_else(|| DEFAULT_REGION.to_string()),
        rack: info
            .rack
            .clone()
            .unwrap_or_else(|| DEFAULT_RACK.to_string()),
    }
}

/// The rule every write set must keep, from the settings and the quorum shape.
#[derive(Debug, Clone, Copy)]
struct Rule {
    policy: Policy,
    write_quorum: usize,
    ack_quorum: usize,
    min_racks: usize,
    min_regions: usize,
}

impl Rule {
    fn new(settings: &PlacementSettings, (_, w, a): Shape) -> Self {
        Self {
            policy: settings.placement,
            write_quorum: usize::from(w),
            ack_quorum: usize::from(a),
            min_racks: usize::from(settings.min_racks_per_write_quorum).min(usize::from(w)),
            min_regions: usize::from(settings.min_regions_for_durability),
        }
    }

    fn enforced(&self, settings: &PlacementSettings) -> bool {
        match self.policy {
            Policy::Default => false,
            Policy::RackAware => settings.enforce_min_racks,
            Policy::RegionAware => settings.enforce_durability,
        }
    }

    /// Whether a write set whose known members are at `filled`, with `open` members not
    /// chosen yet, can still keep the rule (and keeps it when `open` is 0). Both checks only
    /// get harder as members are added, so a partial write set that fails can be pruned.
    fn window_ok(&self, filled: &[&Location], open: usize) -> bool {
        match self.policy {
            Policy::Default => true,
            Policy::RackAware => {
                let racks: HashSet<(&str, &str)> = filled
                    .iter()
                    .map(|l| (l.region.as_str(), l.rack.as_str()))
                    .collect();
                racks.len() + open >= self.min_racks
            }
            Policy::RegionAware => {
                let mut counts: HashMap<&str, usize> = HashMap::new();
                for l in filled {
                    *counts.entry(l.region.as_str()).or_default() += 1;
                }
                let mut counts: Vec<usize> = counts.into_values().collect();
                counts.sort_unstable_by(|a, b| b.cmp(a));
                let largest: usize = counts.iter().take(self.min_regions - 1).sum();
                largest < self.ack_quorum
            }
        }
    }

    /// The label the policy spreads: the region under `region-aware`, the rack otherwise.
    fn label(&self, l: &Location) -> Location {
        match self.policy {
            Policy::RegionAware => Location {
                region: l.region.clone(),
                rack: String::new(),
            },
            _ => l.clone(),
        }
    }

    /// The error of a placement (`what`: "placement of a new ensemble", "replacement at
    /// position 2") that cannot keep this rule, with the shape and the bookies per region.
    fn failure(&self, what: &str, shape: Shape, census: String) -> Error {
        Error::Placement(format!(
            "{} {what} (E={}, Qw={}, Qa={}) failed: {}; {census}",
            self.policy,
            shape.0,
            shape.1,
            shape.2,
            self.describe()
        ))
    }

    fn describe(&self) -> String {
        match self.policy {
            Policy::RegionAware => format!(
                "every {} bookies (Qa) of each write set of {} (Qw) must span at least {} regions (min_regions_for_durability)",
                self.ack_quorum, self.write_quorum, self.min_regions
            ),
            _ => format!(
                "each write set of {} (Qw) must span at least {} racks (min_racks_per_write_quorum)",
                self.write_quorum, self.min_racks
            ),
        }
    }
}

/// Positions of the write sets that hold `pos`, each as its positions.
fn windows_with(pos: usize, e: usize, w: usize) -> Vec<Vec<usize>> {
    (0..e)
        .map(|s| quorum::write_set(s as u64, e as u8, w as u8))
        .filter(|ws| ws.contains(&pos))
        .collect()
}

/// Whether the write sets holding `pos` keep `rule` with `slots` (None: open).
fn fits(rule: &Rule, slots: &[Option<Location>], pos: usize) -> bool {
    windows_with(pos, slots.len(), rule.write_quorum)
        .iter()
        .all(|ws| {
            let filled: Vec<&Location> = ws.iter().filter_map(|&p| slots[p].as_ref()).collect();
            rule.window_ok(&filled, ws.len() - filled.len())
        })
}

/// The eligible bookies by location: writable, not in `exclude`.
fn eligible<'a>(
    registered: &'a [BookieInfo],
    exclude: &HashSet<BookieId>,
) -> Vec<(&'a BookieInfo, Location)> {
    registered
        .iter()
        .filter(|b| !b.read_only && !exclude.contains(&b.id))
        .map(|b| (b, location(b)))
        .collect()
}

/// "region r1: 2 bookies, r2: 0" over every registered region, for errors.
fn census(registered: &[BookieInfo], candidates: &[(&BookieInfo, Location)]) -> String {
    let mut by_region: BTreeMap<String, usize> =
        registered.iter().map(|b| (location(b).region, 0)).collect();
    for (_, l) in candidates {
        *by_region.entry(l.region.clone()).or_default() += 1;
    }
    let parts: Vec<String> = by_region.iter().map(|(r, n)| format!("{r}: {n}")).collect();
    format!("writable candidate bookies by region: {}", parts.join(", "))
}

fn check_shape(settings: &PlacementSettings, (e, w, a): Shape) -> Result<(), Error> {
    if !(e >= w && w >= a && a >= 1) {
        return Err(Error::Invalid(format!(
            "need E >= Qw >= Qa >= 1, got E={e} Qw={w} Qa={a}"
        )));
    }
    if settings.placement == Policy::RegionAware
        && settings.enforce_durability
        && a < settings.min_regions_for_durability
    {
        return Err(Error::Placement(format!(
            "region-aware placement: an ack quorum of {a} bookies cannot span min_regions_for_durability = {} regions (set Qa >= {0}, or enforce_durability = false)",
            settings.min_regions_for_durability
        )));
    }
    Ok(())
}

/// Chooses a new ensemble of E bookies for a ledger of shape `shape`, by position (BookKeeper
/// `newEnsemble`): writable registered bookies not in `exclude`, placed by `settings`' policy
/// (module docs).
///
/// # Errors
/// `Invalid` for a bad shape; `NotEnoughBookies` when fewer than E bookies are eligible;
/// `Placement` when the enforced rule cannot be kept, naming the rule and the bookies per
/// region.
pub fn choose_ensemble<R: Rng + ?Sized>(
    settings: &PlacementSettings,
    shape: Shape,
    registered: &[BookieInfo],
    exclude: &HashSet<BookieId>,
    rng: &mut R,
) -> Result<Vec<BookieId>, Error> {
    check_shape(settings, shape)?;
    let e = usize::from(shape.0);
    let mut candidates = eligible(registered, exclude);
    if candidates.len() < e {
        return Err(Error::NotEnoughBookies {
            needed: e,
            available: candidates.len(),
        });
    }
    candidates.shuffle(rng);
    let rule = Rule::new(settings, shape);
    if rule.policy == Policy::Default {
        return Ok(candidates
            .iter()
            .take(e)
            .map(|(b, _)| b.id.clone())
            .collect());
    }
    // The labels (regions, or racks) in a random order, with how many bookies each has.
    let mut supply: Vec<(Location, usize)> = Vec::new();
    for (_, l) in &candidates {
        let label = rule.label(l);
        match supply.iter_mut().find(|(s, _)| *s == label) {
            Some((_, n)) => *n += 1,
            None => supply.push((label, 1)),
        }
    }
    let labels = match search_labels(&rule, e, &supply) {
        Some(labels) => labels,
        None if rule.enforced(settings) => {
            return Err(rule.failure(
                "placement of a new ensemble",
                shape,
                census(registered, &candidates),
            ))
        }
        None => {
            let free = Rule {
                policy: Policy::Default,
                ..rule
            };
            search_labels(&free, e, &supply).expect("enough bookies for any spread")
        }
    };
    Ok(fill_labels(&rule, &labels, &candidates))
}

/// A label per position keeping `rule` on every write set, labels used evenly (the least used
/// label first; ties in `supply`'s random order), at most each label's supply; `None` when
/// none exists within [`SEARCH_STEPS_MAX`] steps.
fn search_labels(rule: &Rule, e: usize, supply: &[(Location, usize)]) -> Option<Vec<Location>> {
    fn go(
        rule: &Rule,
        supply: &[(Location, usize)],
        used: &mut [usize],
        slots: &mut Vec<Option<Location>>,
        pos: usize,
        steps: &mut usize,
    ) -> bool {
        if pos == slots.len() {
            return true;
        }
        let mut order: Vec<usize> = (0..supply.len())
            .filter(|&i| used[i] < supply[i].1)
            .collect();
        order.sort_by_key(|&i| used[i]);
        for i in order {
            *steps += 1;
            if *steps > SEARCH_STEPS_MAX {
                return false;
            }
            slots[pos] = Some(supply[i].0.clone());
            if fits(rule, slots, pos) {
                used[i] += 1;
                if go(rule, supply, used, slots, pos + 1, steps) {
                    return true;
                }
                used[i] -= 1;
            }
            slots[pos] = None;
        }
        false
    }
    let mut used = vec![0; supply.len()];
    let mut slots = vec![None; e];
    let mut steps = 0;
    go(rule, supply, &mut used, &mut slots, 0, &mut steps)
        .then(|| slots.into_iter().map(|s| s.expect("filled")).collect())
}

/// Bookies for the labels, by position: under `region-aware` the racks of a region are taken
/// in turn (racks spread inside each region); otherwise the label is the rack itself.
/// `candidates` are shuffled already.
fn fill_labels(
    rule: &Rule,
    labels: &[Location],
    candidates: &[(&BookieInfo, Location)],
) -> Vec<BookieId> {
    let mut taken: HashSet<&BookieId> = HashSet::new();
    let mut rack_use: HashMap<&Location, usize> = HashMap::new();
    let mut out = Vec::with_capacity(labels.len());
    for label in labels {
        let pick = candidates
            .iter()
            .filter(|(b, l)| !taken.contains(&b.id) && rule.label(l) == *label)
            .min_by_key(|(_, l)| rack_use.get(l).copied().unwrap_or(0))
            .expect("the search respects each label's supply");
        taken.insert(&pick.0.id);
        *rack_use.entry(&pick.1).or_default() += 1;
        out.push(pick.0.id.clone());
    }
    out
}

/// Picks a bookie to take over ensemble position `pos` (BookKeeper `replaceBookie`).
///
/// `ensemble` is the ensemble by position (`None`: a position with no bookie yet, another
/// one being replaced); the bookie at `pos` is the one replaced and is ignored. Candidates are
/// writable registered bookies in neither `ensemble` nor `exclude` (the caller excludes
/// quarantined and unreachable ones). Under `default` the choice is random, preferring a
/// rack no staying bookie uses; under the other policies it keeps the rule on every write set
/// holding `pos` (see the module docs), preferring the least used region, then rack.
///
/// Returns `Ok(None)` when no bookie is eligible at all.
///
/// # Errors
/// `Invalid` for a bad shape or `pos` outside the ensemble; `Placement` when bookies are
/// eligible but none keeps the enforced rule (naming the rule and the bookies per region).
pub fn choose_replacement<R: Rng + ?Sized>(
    settings: &PlacementSettings,
    shape: Shape,
    registered: &[BookieInfo],
    ensemble: &[Option<BookieId>],
    pos: usize,
    exclude: &HashSet<BookieId>,
    rng: &mut R,
) -> Result<Option<BookieId>, Error> {
    check_shape(settings, shape)?;
    if pos >= ensemble.len() || ensemble.len() != usize::from(shape.0) {
        return Err(Error::Invalid(format!(
            "position {pos} of an ensemble of {} (E={})",
            ensemble.len(),
            shape.0
        )));
    }
    let in_ensemble: HashSet<&BookieId> = ensemble.iter().flatten().collect();
    let mut candidates: Vec<(&BookieInfo, Location)> = eligible(registered, exclude)
        .into_iter()
        .filter(|(b, _)| !in_ensemble.contains(&b.id))
        .collect();
    if candidates.is_empty() {
        return Ok(None);
    }
    candidates.shuffle(rng);
    let known: HashMap<&BookieId, Location> =
        registered.iter().map(|b| (&b.id, location(b))).collect();
    let mut slots: Vec<Option<Location>> = ensemble
        .iter()
        .enumerate()
        .map(|(p, b)| {
            b.as_ref()
                .filter(|_| p != pos)
                .and_then(|b| known.get(b).cloned())
        })
        .collect();
    let rule = Rule::new(settings, shape);
    if rule.policy == Policy::Default {
        // Before policies: prefer a rack no staying bookie uses, when racks are labelled.
        let labelled = registered.iter().any(|b| b.rack.is_some());
        let used: HashSet<&str> = slots.iter().flatten().map(|l| l.rack.as_str()).collect();
        let pick = candidates
            .iter()
            .find(|(_, l)| labelled && !used.contains(l.rack.as_str()))
            .unwrap_or(&candidates[0]);
        return Ok(Some(pick.0.id.clone()));
    }
    // The write sets the staying bookies already break are not held against the choice.
    let windows = windows_with(pos, slots.len(), rule.write_quorum);
    let held: Vec<&Vec<usize>> = windows
        .iter()
        .filter(|ws| {
            let filled: Vec<&Location> = ws.iter().filter_map(|&p| slots[p].as_ref()).collect();
            rule.window_ok(&filled, ws.len() - filled.len())
        })
        .collect();
    let keeps = |slots: &[Option<Location>]| {
        held.iter().all(|ws| {
            let filled: Vec<&Location> = ws.iter().filter_map(|&p| slots[p].as_ref()).collect();
            rule.window_ok(&filled, ws.len() - filled.len())
        })
    };
    let region_use = |r: &str| slots.iter().flatten().filter(|l| l.region == r).count();
    let rack_use = |l: &Location| slots.iter().flatten().filter(|s| *s == l).count();
    let mut ranked: Vec<(usize, usize, usize)> = candidates
        .iter()
        .enumerate()
        .map(|(i, (_, l))| match rule.policy {
            Policy::RegionAware => (region_use(&l.region), rack_use(l), i),
            _ => (rack_use(l), 0, i),
        })
        .collect();
    ranked.sort_unstable();
    for &(_, _, i) in &ranked {
        slots[pos] = Some(candidates[i].1.clone());
        if keeps(&slots) {
            return Ok(Some(candidates[i].0.id.clone()));
        }
    }
    if rule.enforced(settings) {
        return Err(rule.failure(
            &format!("replacement at position {pos}"),
            shape,
            census(registered, &candidates),
        ));
    }
    Ok(Some(candidates[ranked[0].2].0.id.clone()))
}

/// Whether `ensemble` (by position, bookies located by `registered`; an unregistered bookie is
/// an open position) keeps `settings`' rule on every write set of shape `shape`: what a
/// placement under that policy guarantees, for checks and tests.
pub fn keeps_rule(
    settings: &PlacementSettings,
    shape: Shape,
    registered: &[BookieInfo],
    ensemble: &[BookieId],
) -> bool {
    let rule = Rule::new(settings, shape);
    let known: HashMap<&BookieId, Location> =
        registered.iter().map(|b| (&b.id, location(b))).collect();
    let slots: Vec<Option<Location>> = ensemble.iter().map(|b| known.get(b).cloned()).collect();
    (0..slots.len()).all(|p| fits(&rule, &slots, p))
}

#[cfg(test)]
#[path = "placement_tests.rs"]
mod tests;

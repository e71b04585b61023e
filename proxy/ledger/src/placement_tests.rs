//! Table tests of the placement policies: topologies of regions and racks, quorum shapes, and
//! the property every placement must keep (or the error), over many random seeds.

use super::*;
use rand::SeedableRng;

fn info(id: &str, region: Option<&str>, rack: Option<&str>, read_only: bool) -> BookieInfo {
    BookieInfo {
        id: BookieId(id.into()),
        rack: rack.map(str::to_string),
        region: region.map(str::to_string),
        read_only,
    }
}

/// `spec` like "a/r1:2 b/r1:1 c/r2:3": region a rack r1 two bookies, ... Ids are
/// `region-rack-i`.
fn topology(spec: &str) -> Vec<BookieInfo> {
    let mut out = Vec::new();
    for part in spec.split_whitespace() {
        let (loc, n) = part.split_once(':').unwrap();
        let (region, rack) = loc.split_once('/').unwrap();
        for i in 0..n.parse::<usize>().unwrap() {
            out.push(info(
                &format!("{region}-{rack}-{i}"),
                Some(region),
                Some(rack),
                false,
            ));
        }
    }
    out
}

fn ids(names: &[&str]) -> HashSet<BookieId> {
    names.iter().map(|s| BookieId((*s).into())).collect()
}

fn region_aware(min_regions: u8, enforce: bool) -> PlacementSettings {
    PlacementSettings {
        placement: Policy::RegionAware,
        min_regions_for_durability: min_regions,
        enforce_durability: enforce,
        ..PlacementSettings::default()
    }
}

fn rack_aware(min_racks: u8, enforce: bool) -> PlacementSettings {
    PlacementSettings {
        placement: Policy::RackAware,
        min_racks_per_write_quorum: min_racks,
        enforce_min_racks: enforce,
        ..PlacementSettings::default()
    }
}

fn regions_of(registered: &[BookieInfo], ensemble: &[BookieId]) -> Vec<String> {
    ensemble
        .iter()
        .map(|b| location(registered.iter().find(|r| &r.id == b).unwrap()).region)
        .collect()
}

/// Brute force of the region invariant: every Qa-subset of every write set touches at least
/// `m` regions (independent of the closed form the policy uses).
fn every_ack_quorum_spans(regions: &[String], (e, w, a): Shape, m: usize) -> bool {
    (0..u64::from(e)).all(|s| {
        let ws: Vec<&String> = quorum::write_set(s, e, w)
            .into_iter()
            .map(|p| &regions[p])
            .collect();
        (0u32..(1 << ws.len()))
            .filter(|mask| mask.count_ones() == u32::from(a))
            .all(|mask| {
                let touched: HashSet<&String> = (0..ws.len())
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| ws[i])
                    .collect();
                touched.len() >= m
            })
    })
}

#[test]
fn region_aware_new_ensembles_keep_the_invariant_or_fail_naming_regions() {
    // Goal: for each topology and shape, a region-aware new ensemble keeps "every ack quorum
    // spans >= m regions" (checked by brute force over Qa-subsets), is spread evenly over the
    // regions, has distinct bookies; or, when no placement can keep it, fails with Placement
    // naming each region's count. Method: 50 seeds per row.
    // (topology, (E, Qw, Qa), m, Some(regions used) or None: Placement expected)
    let table: &[(&str, Shape, u8, Option<usize>)] = &[
        ("a/r1:2 b/r1:2 c/r1:2", (3, 3, 2), 2, Some(3)),
        ("a/r1:2 b/r1:2 c/r1:2", (6, 3, 2), 2, Some(3)),
        ("a/r1:2 b/r1:2 c/r1:2", (4, 2, 2), 2, Some(3)),
        // E=5 cannot give every 3 consecutive positions 3 regions (the cycle does not close).
        ("a/r1:2 b/r1:2 c/r1:2", (5, 3, 2), 2, None),
        ("a/r1:1 a/r2:1 b/r1:2", (3, 3, 3), 2, Some(2)),
        ("a/r1:4 b/r1:4", (4, 3, 3), 2, Some(2)),
        ("a/r1:4 b/r1:4", (4, 2, 2), 2, Some(2)),
        ("a/r1:2 b/r1:2 c/r1:2", (3, 3, 3), 3, Some(3)),
        ("a/r1:3 b/r1:3 c/r1:3", (5, 5, 3), 2, Some(3)),
        // Two regions cannot give Qa=2 of Qw=3 two regions in every pair.
        ("a/r1:4 b/r1:4", (3, 3, 2), 2, None),
        // One region only.
        ("a/r1:6", (3, 3, 2), 2, None),
        // A third region with one bookie cannot carry E=6 of Qw=3, Qa=2 (needs 2 per region).
        ("a/r1:3 b/r1:3 c/r1:1", (6, 3, 2), 2, None),
    ];
    for &(topo, shape, m, want) in table {
        let registered = topology(topo);
        for seed in 0..50 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let got = choose_ensemble(
                &region_aware(m, true),
                shape,
                &registered,
                &HashSet::new(),
                &mut rng,
            );
            match (want, got) {
                (Some(n), Ok(ensemble)) => {
                    let regions = regions_of(&registered, &ensemble);
                    assert!(
                        every_ack_quorum_spans(&regions, shape, usize::from(m)),
                        "{topo} {shape:?}: {regions:?}"
                    );
                    let distinct: HashSet<&String> = regions.iter().collect();
                    assert_eq!(distinct.len(), n, "{topo} {shape:?}: {regions:?}");
                    let counts: Vec<usize> = distinct
                        .iter()
                        .map(|r| regions.iter().filter(|x| x == r).count())
                        .collect();
                    let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                    assert!(hi - lo <= 1, "even spread {topo} {shape:?}: {regions:?}");
                    let unique: HashSet<&BookieId> = ensemble.iter().collect();
                    assert_eq!(unique.len(), ensemble.len());
                    assert!(keeps_rule(
                        &region_aware(m, true),
                        shape,
                        &registered,
                        &ensemble
                    ));
                }
                (None, Err(Error::Placement(msg))) => {
                    assert!(msg.contains("region-aware"), "{msg}");
                    assert!(msg.contains("a: "), "names the regions: {msg}");
                    assert!(
                        msg.contains("regions (min_regions_for_durability)"),
                        "{msg}"
                    );
                }
                (want, got) => panic!("{topo} {shape:?} seed {seed}: want {want:?}, got {got:?}"),
            }
        }
    }
}

#[test]
fn region_aware_without_enforcement_takes_the_best_spread() {
    // Goal: enforce_durability = false places anyway (best effort) where enforced fails, still
    // over both regions; Qa < m fails only when enforced.
    let registered = topology("a/r1:4 b/r1:4");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let ensemble = choose_ensemble(
        &region_aware(2, false),
        (3, 3, 2),
        &registered,
        &HashSet::new(),
        &mut rng,
    )
    .unwrap();
    let regions: HashSet<String> = regions_of(&registered, &ensemble).into_iter().collect();
    assert_eq!(regions.len(), 2);
    let err = choose_ensemble(
        &region_aware(2, true),
        (3, 3, 1),
        &registered,
        &HashSet::new(),
        &mut rng,
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::Placement(ref m) if m.contains("Qa >= 2")),
        "{err}"
    );
    assert!(choose_ensemble(
        &region_aware(2, false),
        (3, 3, 1),
        &registered,
        &HashSet::new(),
        &mut rng,
    )
    .is_ok());
}

#[test]
fn region_aware_spreads_racks_inside_each_region() {
    // Goal: two bookies from one region come from its two racks when it has two.
    let registered = topology("a/r1:3 a/r2:3 b/r1:3 b/r2:3");
    for seed in 0..50 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let ensemble = choose_ensemble(
            &region_aware(2, true),
            (4, 2, 2),
            &registered,
            &HashSet::new(),
            &mut rng,
        )
        .unwrap();
        let locs: HashSet<Location> = ensemble
            .iter()
            .map(|b| location(registered.iter().find(|r| &r.id == b).unwrap()))
            .collect();
        assert_eq!(locs.len(), 4, "one per (region, rack): {ensemble:?}");
    }
}

#[test]
fn rack_aware_new_ensembles_span_racks_per_write_set() {
    // Goal: every write set spans min(min_racks, Qw) racks; with too few racks enforce fails
    // and best effort places anyway; read-only and excluded bookies are never chosen.
    // (topology, shape, min racks, enforce, placed?)
    let table: &[(&str, Shape, u8, bool, bool)] = &[
        ("x/r1:2 x/r2:2 x/r3:2", (3, 3, 2), 3, true, true),
        ("x/r1:2 x/r2:2 x/r3:2", (6, 2, 2), 2, true, true),
        ("x/r1:4 x/r2:4", (5, 3, 2), 2, true, true),
        ("x/r1:4 x/r2:4", (3, 3, 2), 3, true, false),
        ("x/r1:4 x/r2:4", (3, 3, 2), 3, false, true),
        ("x/r1:6", (3, 2, 2), 2, true, false),
        // min racks above Qw is capped at Qw.
        ("x/r1:2 x/r2:2", (4, 2, 2), 5, true, true),
        // The same rack name in two regions is two racks.
        ("x/r1:2 y/r1:2", (4, 2, 2), 2, true, true),
    ];
    for &(topo, shape, min_racks, enforce, ok) in table {
        let mut registered = topology(topo);
        registered.push(info("ro", Some("x"), Some("r9"), true));
        registered.push(info("ex", Some("x"), Some("r8"), false));
        let settings = rack_aware(min_racks, enforce);
        for seed in 0..50 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let got = choose_ensemble(&settings, shape, &registered, &ids(&["ex"]), &mut rng);
            match got {
                Ok(ensemble) => {
                    assert!(ok, "{topo} {shape:?} {min_racks} {enforce}: {ensemble:?}");
                    assert!(!ensemble.iter().any(|b| b.0 == "ro" || b.0 == "ex"));
                    if enforce {
                        assert!(keeps_rule(&settings, shape, &registered, &ensemble));
                    }
                }
                Err(Error::Placement(msg)) => {
                    assert!(!ok, "{topo} {shape:?}: {msg}");
                    assert!(msg.contains("racks (min_racks_per_write_quorum)"), "{msg}");
                }
                Err(other) => panic!("{other}"),
            }
        }
    }
}

#[test]
fn default_policy_takes_any_writable_bookies_and_counts_them() {
    let registered = topology("a/r1:2 b/r1:2");
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let e = choose_ensemble(
        &PlacementSettings::default(),
        (4, 2, 2),
        &registered,
        &HashSet::new(),
        &mut rng,
    )
    .unwrap();
    assert_eq!(e.iter().collect::<HashSet<_>>().len(), 4);
    let err = choose_ensemble(
        &region_aware(2, true),
        (5, 2, 2),
        &registered,
        &HashSet::new(),
        &mut rng,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotEnoughBookies {
                needed: 5,
                available: 4
            }
        ),
        "{err}"
    );
}

fn slots(names: &[Option<&str>]) -> Vec<Option<BookieId>> {
    names
        .iter()
        .map(|n| n.map(|s| BookieId(s.into())))
        .collect()
}

#[test]
fn region_aware_replacements_keep_the_invariant_while_a_region_is_down() {
    // Goal: a replacement keeps every ack quorum in >= m regions given the bookies that stay;
    // with a region down it takes a bookie of another region when the invariant allows it
    // (Qa = Qw = 3: two of three in one region is fine), fails with Placement when it does not
    // (Qa = 2 of Qw = 3 needs three regions) and, not enforced, places anyway.
    // Ensemble a-r1-0, b-r1-0, c-r1-0; region b is down (not registered).
    let registered = topology("a/r1:2 c/r1:2");
    let ensemble = slots(&[Some("a-r1-0"), Some("b-r1-0"), Some("c-r1-0")]);
    let exclude = ids(&["a-r1-0", "b-r1-0", "c-r1-0"]);
    // (shape, enforce, expect a bookie?)
    let table: &[(Shape, bool, bool)] = &[
        ((3, 3, 3), true, true),
        ((3, 3, 2), true, false),
        ((3, 3, 2), false, true),
    ];
    for &(shape, enforce, ok) in table {
        for seed in 0..30 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let got = choose_replacement(
                &region_aware(2, enforce),
                shape,
                &registered,
                &ensemble,
                1,
                &exclude,
                &mut rng,
            );
            match got {
                Ok(Some(b)) => {
                    assert!(ok, "{shape:?} {enforce}: {b}");
                    assert!(b.0 == "a-r1-1" || b.0 == "c-r1-1", "{b}");
                }
                Err(Error::Placement(msg)) => {
                    assert!(!ok, "{shape:?}: {msg}");
                    assert!(msg.contains("position 1"), "{msg}");
                    assert!(msg.contains("a: 1, c: 1"), "{msg}");
                }
                other => panic!("{shape:?} {enforce}: {other:?}"),
            }
        }
    }
    // Region b back with a spare: it is the only choice keeping Qa = 2 in two regions.
    let registered = topology("a/r1:2 b/r1:2 c/r1:2");
    for seed in 0..30 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let got = choose_replacement(
            &region_aware(2, true),
            (3, 3, 2),
            &registered,
            &ensemble,
            1,
            &exclude,
            &mut rng,
        );
        assert_eq!(got.unwrap(), Some(BookieId("b-r1-1".into())));
    }
}

#[test]
fn region_aware_replacement_in_a_wide_ensemble_prefers_the_least_used_region() {
    // Goal: E=6, Qw=3, Qa=2 over regions a b c (a b c a b c); position 4 (region b) fails
    // with b down: the write sets holding it are {2,3,4} c a ?, {3,4,5} a ? c, {4,5,0} ? c a,
    // so neither a nor c keeps Qa=2 in two regions: enforced, it fails; with Qa=3, it takes
    // one. Nothing eligible gives None.
    let registered = topology("a/r1:3 c/r1:3");
    let ensemble = slots(&[
        Some("a-r1-0"),
        Some("b-r1-0"),
        Some("c-r1-0"),
        Some("a-r1-1"),
        Some("b-r1-1"),
        Some("c-r1-1"),
    ]);
    let exclude: HashSet<BookieId> = ensemble.iter().flatten().cloned().collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let err = choose_replacement(
        &region_aware(2, true),
        (6, 3, 2),
        &registered,
        &ensemble,
        4,
        &exclude,
        &mut rng,
    )
    .unwrap_err();
    assert!(matches!(err, Error::Placement(_)), "{err}");
    let got = choose_replacement(
        &region_aware(2, true),
        (6, 3, 3),
        &registered,
        &ensemble,
        4,
        &exclude,
        &mut rng,
    )
    .unwrap()
    .unwrap();
    assert!(got.0 == "a-r1-2" || got.0 == "c-r1-2", "{got}");
    let all: HashSet<BookieId> = registered.iter().map(|b| b.id.clone()).collect();
    assert_eq!(
        choose_replacement(
            &region_aware(2, true),
            (6, 3, 3),
            &registered,
            &ensemble,
            4,
            &all,
            &mut rng,
        )
        .unwrap(),
        None
    );
}

#[test]
fn a_write_set_already_broken_is_not_held_against_a_replacement() {
    // Goal: a ledger placed without regions (all in a) gets a replacement
    // instead of an error: its write set breaks Qa=2 in two regions before the choice.
    let registered = topology("a/r1:4");
    let ensemble = slots(&[Some("a-r1-0"), Some("a-r1-1"), Some("a-r1-2")]);
    let exclude: HashSet<BookieId> = ensemble.iter().flatten().cloned().collect();
    let got = choose_replacement(
        &region_aware(2, true),
        (3, 3, 2),
        &registered,
        &ensemble,
        0,
        &exclude,
        &mut rand::rngs::StdRng::seed_from_u64(0),
    )
    .unwrap();
    assert_eq!(got, Some(BookieId("a-r1-3".into())));
}

#[test]
fn rack_aware_replacement_enforced_or_best_effort() {
    // Goal: E=3 Qw=3 with min 3 racks: the lost rack-r2 bookie is replaced from r2 (the only
    // rack keeping 3); without an r2 spare, enforced fails and best effort takes another.
    let ensemble = slots(&[Some("x-r1-0"), Some("x-r2-0"), Some("x-r3-0")]);
    let exclude: HashSet<BookieId> = ensemble.iter().flatten().cloned().collect();
    let with_spare = topology("x/r1:2 x/r2:2 x/r3:2");
    let without = topology("x/r1:2 x/r2:1 x/r3:2");
    for seed in 0..30 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let s = rack_aware(3, true);
        let got = choose_replacement(&s, (3, 3, 2), &with_spare, &ensemble, 1, &exclude, &mut rng);
        assert_eq!(got.unwrap(), Some(BookieId("x-r2-1".into())));
        let got = choose_replacement(&s, (3, 3, 2), &without, &ensemble, 1, &exclude, &mut rng);
        assert!(matches!(got, Err(Error::Placement(_))), "{got:?}");
        let s = rack_aware(3, false);
        let got = choose_replacement(&s, (3, 3, 2), &without, &ensemble, 1, &exclude, &mut rng);
        assert!(got.unwrap().is_some());
    }
}

#[test]
fn default_replacement_prefers_an_unused_rack() {
    // Goal (the placement before policies): with rack labels, the replacement comes from a
    // rack the staying bookies do not use, whenever one exists; unlabelled bookies share
    // DEFAULT_RACK; read-only and excluded bookies are never chosen.
    let registered = vec![
        info("a", None, Some("r1"), false),
        info("b", None, Some("r2"), false),
        info("c", None, Some("r1"), false),
        info("d", None, Some("r1"), false),
        info("e", None, Some("r2"), false),
        info("f", None, Some("r3"), false),
        info("g", None, Some("r3"), true),
        info("h", None, None, false),
    ];
    let ensemble = slots(&[Some("a"), Some("b"), Some("c")]);
    let exclude = ids(&["a", "b", "c"]);
    let settings = PlacementSettings::default();
    for seed in 0..100 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let got = choose_replacement(
            &settings,
            (3, 2, 2),
            &registered,
            &ensemble,
            2,
            &exclude,
            &mut rng,
        );
        let b = got.unwrap().unwrap();
        assert!(b.0 == "f" || b.0 == "h", "{b}");
    }
    let mut seen = HashSet::new();
    let exclude = ids(&["a", "b", "c", "f", "h"]);
    for seed in 0..100 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let got = choose_replacement(
            &settings,
            (3, 2, 2),
            &registered,
            &ensemble,
            2,
            &exclude,
            &mut rng,
        );
        seen.insert(got.unwrap().unwrap().0);
    }
    assert_eq!(seen, ["d", "e"].iter().map(|s| (*s).to_string()).collect());
}

#[test]
fn settings_parse_and_validate() {
    assert_eq!("region-aware".parse::<Policy>(), Ok(Policy::RegionAware));
    assert!("regional"
        .parse::<Policy>()
        .unwrap_err()
        .contains("rack-aware"));
    let s = PlacementSettings {
        min_regions_for_durability: 0,
        ..PlacementSettings::default()
    };
    assert_eq!(s.validate().unwrap_err().key, "min_regions_for_durability");
    assert!(PlacementSettings::default().validate().is_ok());
}

#[test]
fn a_recorded_stream_placement_replaces_the_cluster_rule_and_keeps_to_its_regions() {
    // Goal (issue 30 item 2): a ledger recorded with its stream's own placement is placed and
    // replaced by it, not by the client's settings: a local stream's ensembles and
    // replacements stay in its one region, a region-aware stream's keep min 2 regions while
    // the cluster's rule is random; a ledger without a record follows the cluster.
    let registered = topology("a/r1:3 b/r1:3 c/r1:3");
    let cluster = PlacementSettings::default();
    let mut custom = BTreeMap::new();
    let none = LedgerPlacement::of_ledger(&cluster, &custom).unwrap();
    assert_eq!(none.settings, cluster);
    assert!(none.outside(&registered).is_empty());

    let local = StreamPlacement {
        regions: vec!["b".into()],
        ..StreamPlacement::default()
    };
    local.record(&mut custom);
    let rule = LedgerPlacement::of_ledger(&cluster, &custom).unwrap();
    let outside = rule.outside(&registered);
    assert_eq!(outside.len(), 6);
    let spread = StreamPlacement {
        placement: Policy::RegionAware,
        ..StreamPlacement::default()
    };
    let wide = LedgerPlacement::new(&cluster, Some(&spread));
    for seed in 0..50 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let e =
            choose_ensemble(&rule.settings, (3, 3, 2), &registered, &outside, &mut rng).unwrap();
        assert_eq!(regions_of(&registered, &e), ["b", "b", "b"], "seed {seed}");
        let slots: Vec<Option<BookieId>> = e.iter().cloned().map(Some).collect();
        let mut exclude: HashSet<BookieId> = e.iter().cloned().collect();
        exclude.extend(outside.iter().cloned());
        // b has 3 bookies, all in the ensemble: no replacement rather than one elsewhere.
        let got = choose_replacement(
            &rule.settings,
            (3, 3, 2),
            &registered,
            &slots,
            1,
            &exclude,
            &mut rng,
        )
        .unwrap();
        assert_eq!(got, None, "seed {seed}");

        let e = choose_ensemble(
            &wide.settings,
            (3, 3, 2),
            &registered,
            &HashSet::new(),
            &mut rng,
        )
        .unwrap();
        let regions = regions_of(&registered, &e);
        assert!(
            every_ack_quorum_spans(&regions, (3, 3, 2), 2),
            "{regions:?}"
        );
    }
    // The read order stays the reader's own.
    let reads_in_order = PlacementSettings {
        reorder_read_sequence: false,
        ..cluster
    };
    assert!(
        !LedgerPlacement::new(&reads_in_order, Some(&spread))
            .settings
            .reorder_read_sequence
    );
}

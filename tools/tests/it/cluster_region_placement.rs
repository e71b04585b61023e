//! Issue 30: region-aware placement with real processes. Goal: with six bookies labelled in
//! three regions (two racks each) and a proxy placing E = Qw = 3, Qa = 2 ledgers region-aware
//! (`min_regions_for_durability` 2, enforced), every ledger's every fragment keeps the
//! invariant "no ack quorum inside one region" (read from the metadata store), also after a
//! bookie of a region stops and the writers' ensembles change; the labels show in `quire
//! bookie list` and `quire proxy list`; and with one region's bookies gone a new ledger is
//! refused rather than placed inside two regions.
//!
//! Method: real ZooKeeper (quire-testkit), six `quire bookie` children with `--region` and
//! `--rack`, one `quire proxy` with `--placement region-aware`, records written with
//! `ProxyClient`, ledgers read with `ZkStore` and checked with
//! `quire_ledger::placement::keeps_rule` (the labels of the bookies as registered at start).

use quire_testkit::harness::cluster::runtime;

use std::sync::Arc;

use quire_ledger::placement::{keeps_rule, PlacementSettings, Policy};
use quire_metadata::{BookieId, BookieInfo, MetadataStore};
use quire_testkit::harness::checker::write_records;
use quire_testkit::harness::cluster::Cluster;

const REGIONS: [&str; 3] = ["ra", "rb", "rc"];

/// Every fragment of every ledger keeps the region rule; returns how many fragments.
async fn check_every_ledger(zk: &quire_metadata::ZkStore, labels: &[BookieInfo]) -> usize {
    let settings = PlacementSettings {
        placement: Policy::RegionAware,
        ..PlacementSettings::default()
    };
    let mut fragments = 0;
    for id in zk.list_ledgers().await.unwrap() {
        let meta = zk.read_ledger(id).await.unwrap().value;
        let shape = (meta.ensemble_size, meta.write_quorum, meta.ack_quorum);
        for f in &meta.fragments {
            assert!(
                keeps_rule(&settings, shape, labels, &f.bookies),
                "ledger {id:?} fragment from {} on {:?} has an ack quorum inside one region",
                f.first_entry,
                f.bookies
            );
            fragments += 1;
        }
    }
    fragments
}

#[test]
fn region_aware_ensembles_keep_every_ack_quorum_in_two_regions() {
    let cluster = Cluster::start();
    let mut bookies = Vec::new();
    let mut labels = Vec::new();
    for i in 0..6 {
        let port = quire_testkit::free_port();
        let (region, rack) = (REGIONS[i / 2], format!("k{}", i % 2));
        bookies.push(Some(cluster.start_bookie_with(
            i,
            port,
            &["--region", region, "--rack", &rack],
        )));
        labels.push(BookieInfo {
            id: BookieId(format!("127.0.0.1:{port}")),
            rack: Some(rack),
            region: Some(region.to_string()),
            read_only: false,
        });
    }
    let list = cluster.wait_bookies("6 bookies", |l| l.contains("6 bookies registered"));
    assert!(list.contains(" region=rb rack=k1"), "{list}");
    let proxy = cluster.start_proxy_e3(&[
        "--placement",
        "region-aware",
        "--region",
        "ra",
        "--rack",
        "k0",
        "--balance-moves-per-sec",
        "1",
    ]);
    let rt = runtime();
    let client = rt.block_on(async {
        Arc::new(
            quire_client::ProxyClient::connect(&proxy.addr)
                .await
                .unwrap(),
        )
    });
    for s in 0..6 {
        let (_, err) = rt.block_on(write_records(&client, &format!("geo/s{s}"), "r", 0..20));
        assert!(err.is_none(), "{err:?}");
    }
    let zk = rt.block_on(cluster.zk_store());
    let before = rt.block_on(check_every_ledger(&zk, &labels));
    assert!(before >= 6, "one ledger per stream at least: {before}");

    // A bookie of region rc stops: the ensembles holding it change to the other rc bookie
    // (the only one keeping Qa = 2 in two regions), and writes go on.
    bookies[4].take().unwrap().stop();
    for s in 0..6 {
        let (_, err) = rt.block_on(write_records(&client, &format!("geo/s{s}"), "q", 0..20));
        assert!(err.is_none(), "{err:?}");
    }
    let after = rt.block_on(check_every_ledger(&zk, &labels));
    assert!(after >= before, "{after} fragments after, {before} before");

    let proxies = cluster.admin_ok(&["proxy", "list"]);
    assert!(proxies.contains(" region=ra rack=k0"), "{proxies}");

    // Region rc gone entirely: a new ledger cannot have every pair of its write set in two
    // regions, so a ledger client placing region-aware refuses it (enforce_durability) instead
    // of placing it in ra and rb only, naming the regions.
    bookies[5].take().unwrap().stop();
    cluster.wait_bookies("4 bookies", |l| l.contains("4 bookies registered"));
    let store: Arc<dyn MetadataStore> = Arc::new(rt.block_on(cluster.zk_store()));
    let bk = quire_ledger::BookKeeper::new(
        store,
        quire_ledger::ClientConfig {
            cluster_secret: Some(cluster.secret),
            placement: PlacementSettings {
                placement: Policy::RegionAware,
                ..PlacementSettings::default()
            },
            ..quire_ledger::ClientConfig::default()
        },
    );
    let refused = rt.block_on(bk.create_ledger(quire_ledger::LedgerOptions {
        ensemble_size: 3,
        write_quorum: 3,
        ack_quorum: 2,
        password: b"geo".to_vec(),
        custom: Default::default(),
    }));
    match refused {
        Err(quire_ledger::Error::Placement(m)) => {
            assert!(m.contains("ra: 2, rb: 2"), "{m}")
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a ledger was placed with an ack quorum inside one region"),
    }
    rt.block_on(check_every_ledger(&zk, &labels));
}

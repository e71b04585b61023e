//! Issue 30 item 2: placement chosen per stream, and autorecovery following it. Goal: on one
//! cluster whose proxy and bookies place randomly (the `[ledger]` default), a stream set to
//! `--regions ra` (local) gets every segment's ensemble inside region ra, a stream set to
//! region-aware (min 2 regions, E = Qw = 3, Qa = 2) gets every ack quorum across two regions,
//! each ledger records the placement it was made under, `stream show` prints it; when a
//! bookie both streams use is decommissioned, the replacements autorecovery chooses keep each
//! ledger's own placement (the local ledger's replacement is ra's spare bookie; with the
//! cluster's random rule it would be one of the three outside ra 3 times out of 4); and a
//! stream whose placement names a region with no bookie fails its first write with the
//! ledger client's error, nothing placed elsewhere.
//!
//! Method: real ZooKeeper (quire-testkit), seven `quire bookie` children labelled ra ×4,
//! rb ×2, rc ×1 (autorecovery inside each, short delays), one `quire proxy` (E=3 Qw=3 Qa=2,
//! no placement flags), `quire stream placement` and `stream show` through the CLI, records
//! written with `ProxyClient`, the streams sealed (their segments completed) before
//! `quire bookie decommission`, ledgers read with `ZkStore` and checked with
//! `quire_ledger::placement::keeps_rule`.

use std::sync::Arc;

use quire_ledger::placement::{keeps_rule, PlacementSettings, Policy};
use quire_metadata::{BookieId, BookieInfo, LedgerMetadata, MetadataStore, StreamPlacement};
use quire_testkit::harness::checker::write_records;
use quire_testkit::harness::cluster::{runtime, Cluster};
use quire_wire::LedgerId;

const LABELS: [(&str, &str); 7] = [
    ("ra", "k0"),
    ("ra", "k0"),
    ("ra", "k1"),
    ("ra", "k1"),
    ("rb", "k0"),
    ("rb", "k1"),
    ("rc", "k0"),
];

const AUTORECOVERY_FLAGS: &[&str] = &[
    "--lost-bookie-recovery-delay-secs",
    "2",
    "--open-ledger-rereplication-grace-period-ms",
    "3000",
    "--autorecovery-poll-interval-ms",
    "250",
];

/// The ledgers of `stream`'s segments, with their metadata.
async fn ledgers(zk: &quire_metadata::ZkStore, stream: &str) -> Vec<(LedgerId, LedgerMetadata)> {
    let meta = zk.read_stream(stream).await.unwrap().value;
    let mut out = Vec::new();
    for s in &meta.segments {
        let id = LedgerId(s.ledger_id);
        out.push((id, zk.read_ledger(id).await.unwrap().value));
    }
    out
}

fn region_of<'a>(labels: &'a [BookieInfo], b: &BookieId) -> &'a str {
    labels
        .iter()
        .find(|l| &l.id == b)
        .and_then(|l| l.region.as_deref())
        .unwrap()
}

/// Every fragment of the local stream's ledgers is in ra; of the wide stream's, keeps the
/// region rule; each ledger records its stream's placement. Returns the bookies they use.
async fn check(
    zk: &quire_metadata::ZkStore,
    labels: &[BookieInfo],
) -> (Vec<BookieId>, Vec<BookieId>) {
    let region_aware = PlacementSettings {
        placement: Policy::RegionAware,
        ..PlacementSettings::default()
    };
    let (mut local, mut wide) = (Vec::new(), Vec::new());
    for (id, meta) in ledgers(zk, "geo/local").await {
        let recorded = StreamPlacement::recorded(&meta.custom).unwrap().unwrap();
        assert_eq!(recorded.regions, ["ra"], "ledger {id:?}");
        for f in &meta.fragments {
            for b in &f.bookies {
                assert_eq!(region_of(labels, b), "ra", "ledger {id:?}: {:?}", f.bookies);
                local.push(b.clone());
            }
        }
    }
    for (id, meta) in ledgers(zk, "geo/wide").await {
        let recorded = StreamPlacement::recorded(&meta.custom).unwrap().unwrap();
        assert_eq!(recorded.placement, Policy::RegionAware, "ledger {id:?}");
        let shape = (meta.ensemble_size, meta.write_quorum, meta.ack_quorum);
        assert_eq!(shape, (3, 3, 2));
        for f in &meta.fragments {
            assert!(
                keeps_rule(&region_aware, shape, labels, &f.bookies),
                "ledger {id:?} fragment from {} on {:?} has an ack quorum inside one region",
                f.first_entry,
                f.bookies
            );
            wide.extend(f.bookies.iter().cloned());
        }
    }
    (local, wide)
}

#[test]
fn each_stream_is_placed_and_re_replicated_by_its_own_placement() {
    let cluster = Cluster::start();
    let mut labels = Vec::new();
    let mut bookies = Vec::new();
    for (i, (region, rack)) in LABELS.iter().enumerate() {
        let port = quire_testkit::free_port();
        let mut flags = vec!["--region", region, "--rack", rack];
        flags.extend_from_slice(AUTORECOVERY_FLAGS);
        bookies.push(cluster.start_bookie_with(i, port, &flags));
        labels.push(BookieInfo {
            id: BookieId(format!("127.0.0.1:{port}")),
            rack: Some(rack.to_string()),
            region: Some(region.to_string()),
            read_only: false,
        });
    }
    cluster.wait_bookies("7 bookies", |l| l.contains("7 bookies registered"));
    let proxy = cluster.start_proxy_e3(&["--region", "ra", "--segment-size-bytes", "1500"]);
    let set = |args: &[&str]| {
        let mut all = vec!["stream", "placement"];
        all.extend_from_slice(args);
        cluster.stream_admin_ok(&proxy.addr, &all)
    };
    let out = set(&["geo/local", "--create", "--regions", "ra"]);
    assert!(
        out.contains("placement: default regions=ra (stream)"),
        "{out}"
    );
    let out = set(&[
        "geo/wide",
        "--create",
        "--policy",
        "region-aware",
        "--min-regions",
        "2",
        "--quorum",
        "3,3,2",
    ]);
    assert!(
        out.contains("region-aware min_regions=2 enforce_durability=true regions=all quorum=3/3/2"),
        "{out}"
    );
    // A placement that breaks its rules is refused before anything is stored.
    let bad = quire_testkit::harness::run_quire(
        &[
            "stream",
            "placement",
            "geo/wide",
            "--policy",
            "region-aware",
            "--min-regions",
            "3",
            "--quorum",
            "3,3,2",
        ],
        &proxy.addr,
        None,
    );
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("cannot span"),
        "{bad:?}"
    );

    let rt = runtime();
    let client = rt.block_on(async {
        Arc::new(
            quire_client::ProxyClient::connect(&proxy.addr)
                .await
                .unwrap(),
        )
    });
    for stream in ["geo/local", "geo/wide"] {
        for round in 0..3 {
            let (_, err) = rt.block_on(write_records(
                &client,
                stream,
                "r",
                round * 20..round * 20 + 20,
            ));
            assert!(err.is_none(), "{stream}: {err:?}");
        }
    }
    let show = cluster.stream_admin_ok(&proxy.addr, &["stream", "show", "geo/local"]);
    assert!(
        show.contains("placement: default regions=ra (stream)"),
        "{show}"
    );
    let zk = rt.block_on(cluster.zk_store());
    let (local, wide) = rt.block_on(check(&zk, &labels));
    // Rolls (1,500-byte segments) are not counted on: one segment each is enough.
    assert!(local.len() >= 3 && wide.len() >= 3, "{local:?} {wide:?}");

    // A region with no bookie: the first segment cannot be placed, and the write fails with
    // the ledger client's error instead of going elsewhere.
    set(&["geo/nowhere", "--create", "--regions", "rz"]);
    let (acked, err) = rt.block_on(write_records(&client, "geo/nowhere", "r", 0..1));
    assert!(acked.is_empty());
    let err = err.expect("no bookie in rz").to_string();
    assert!(err.contains("not enough bookies"), "{err}");

    // Decommission an ra bookie both streams use (the wide one's only ra bookie when it has
    // one), after sealing them so every segment is complete.
    for stream in ["geo/local", "geo/wide"] {
        rt.block_on(client.seal_stream(stream)).unwrap();
    }
    let (local, wide) = rt.block_on(check(&zk, &labels));
    let retired = wide
        .iter()
        .find(|b| region_of(&labels, b) == "ra" && local.contains(b))
        .or_else(|| local.first())
        .unwrap()
        .clone();
    let out = cluster.admin_ok(&[
        "bookie",
        "decommission",
        &retired.0,
        "--timeout-secs",
        "120",
    ]);
    assert!(out.contains("decommissioned"), "{out}");
    let (local, wide) = rt.block_on(check(&zk, &labels));
    assert!(
        !local.contains(&retired) && !wide.contains(&retired),
        "{retired} still named"
    );
    drop(bookies);
}

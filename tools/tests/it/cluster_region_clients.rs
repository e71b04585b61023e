//! Issue 30 item 4, clients per region, with real processes: two regions' proxies on loopback
//! (`--region ra`, `--region rb`) over one ZooKeeper and three bookies.
//!
//! * Home region: a stream created (not acquired) through region ra's proxy and then written
//!   through region rb's proxy is owned by ra's proxy (rb's redirects it home).
//! * `REGION_UNAVAILABLE`: after `quire cluster region unavailable ra`, a client that knows
//!   only ra's proxy is refused a new stream with 519 (nothing created), a stream ra's proxy
//!   owns keeps taking writes there, and `quire write --region-proxies ra=..
//!   --region-proxies rb=..` (ra local) creates its new stream through rb (owned by rb, home
//!   rb), and so does its `CREATE_STREAM` of an empty input. After `quire cluster region available ra` the same command's next new stream is
//!   owned by ra's proxy again.
//! * Return to the local region: a `ProxyClient` with regions ra (local) and rb and a short
//!   `local_region_retry` fails over to rb during the mark; after the back-off it tries ra
//!   again, is refused (519) and stays in rb while the mark holds; right after the mark is
//!   cleared it is still in rb (the back-off has not run out), and once it has, its next new
//!   stream is created through ra (home ra) and its home proxy is ra's again.
//!
//! Method: the test kit's ZooKeeper and processes; owners read from ZooKeeper (the stream
//! leases), records with `ProxyClient` and the `quire` binary.

use std::time::{Duration, Instant};

use quire_client::{ClientConfig, ErrorCode, ProxyClient, RegionProxies};
use quire_metadata::MetadataStore;
use quire_testkit::harness::checker::connect_proxy;
use quire_testkit::harness::cluster::{runtime, wait_proxy_views, Cluster, PROXY_VIEWS_MAX};
use quire_testkit::harness::run_quire;

/// Waits until the registry lists exactly `proxies` and every one of them has read it since
/// ([`wait_proxy_views`]), and checks each record's region.
async fn wait_registered(store: &dyn MetadataStore, proxies: &[(&str, &str)]) {
    let addrs: Vec<&str> = proxies.iter().map(|p| p.0).collect();
    wait_proxy_views(store, &addrs, PROXY_VIEWS_MAX).await;
    let list = store.list_proxies().await.unwrap();
    for (addr, region) in proxies {
        let info = list.iter().find(|p| p.address == *addr).unwrap();
        assert_eq!(info.region.as_deref(), Some(*region), "{info:?}");
    }
}

/// `quire write STREAM` of two records with the given `--region-proxies`; `--proxy` names a
/// dead address to show it is not used.
fn write_by_regions(stream: &str, regions: &[String]) -> std::process::Output {
    write_input_by_regions(stream, regions, b"one\ntwo\n")
}

/// [`write_by_regions`] of `input` (empty: the stream is only created, `CREATE_STREAM`).
fn write_input_by_regions(stream: &str, regions: &[String], input: &[u8]) -> std::process::Output {
    let mut args = vec!["write", stream];
    for r in regions {
        args.extend(["--region-proxies", r.as_str()]);
    }
    run_quire(&args, "127.0.0.1:1", Some(input))
}

fn assert_ok(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn writers_fail_over_from_an_unavailable_region_and_streams_are_owned_at_home() {
    let cluster = Cluster::start();
    let _bookies: Vec<_> = (0..3)
        .map(|i| cluster.start_bookie(i, quire_testkit::free_port()))
        .collect();
    let pa = cluster.start_proxy_e3(&["--region", "ra"]);
    let pb = cluster.start_proxy_e3(&["--region", "rb"]);
    let rt = runtime();
    let store = rt.block_on(cluster.zk_store());
    rt.block_on(wait_registered(
        &store,
        &[(&pa.addr, "ra"), (&pb.addr, "rb")],
    ));
    let owner = |s: &str| rt.block_on(store.stream_owner(s)).unwrap();
    let home = |s: &str| rt.block_on(store.read_stream(s)).unwrap().value.home_region;

    // Home region: created through ra (nobody acquires it), written through rb.
    rt.block_on(async {
        let a = connect_proxy(&pa.addr).await.unwrap();
        a.create_stream("homed").await.unwrap();
        let b = connect_proxy(&pb.addr).await.unwrap();
        b.write("homed", vec![(1, b"x".to_vec())], false)
            .await
            .unwrap();
    });
    assert_eq!(home("homed").as_deref(), Some("ra"));
    assert_eq!(
        owner("homed").as_deref(),
        Some(pa.addr.as_str()),
        "not owned at home"
    );

    // Region ra marked unavailable.
    cluster.admin_ok(&["cluster", "region", "unavailable", "ra"]);
    assert_eq!(
        cluster.admin_ok(&["cluster", "region", "list"]).trim(),
        "ra"
    );
    rt.block_on(async {
        let a = connect_proxy(&pa.addr).await.unwrap();
        let e = a
            .write("refused", vec![(1, b"x".to_vec())], true)
            .await
            .expect_err("a new stream in a marked region");
        assert_eq!(e.code(), ErrorCode::RegionUnavailable, "{e}");
        // A stream ra's proxy owns keeps working there.
        a.write("homed", vec![(2, b"y".to_vec())], false)
            .await
            .unwrap();
    });
    assert!(
        rt.block_on(store.read_stream("refused")).is_err(),
        "refused was created"
    );
    let regions = [format!("ra={}", pa.addr), format!("rb={}", pb.addr)];
    assert_ok(
        &write_by_regions("moved", &regions),
        "write during the mark",
    );
    assert_eq!(owner("moved").as_deref(), Some(pb.addr.as_str()));
    assert_eq!(home("moved").as_deref(), Some("rb"));
    // CREATE_STREAM (empty input) fails over too: the stream's home is rb.
    assert_ok(
        &write_input_by_regions("created", &regions, b""),
        "create during the mark",
    );
    assert_eq!(home("created").as_deref(), Some("rb"));

    // A client that left ra tries it again after its back-off; the mark still holds.
    const RETRY: Duration = Duration::from_secs(10);
    let client = rt
        .block_on(ProxyClient::connect_any(ClientConfig {
            regions: vec![
                RegionProxies {
                    region: "ra".into(),
                    proxies: vec![pa.addr.clone()],
                },
                RegionProxies {
                    region: "rb".into(),
                    proxies: vec![pb.addr.clone()],
                },
            ],
            local_region_retry: RETRY,
            ..ClientConfig::default()
        }))
        .unwrap();
    assert_eq!(client.home_addr(), pa.addr, "ra answers the handshake");
    rt.block_on(client.create_stream("left-1")).unwrap();
    assert_eq!(
        (home("left-1").as_deref(), client.home_addr()),
        (Some("rb"), pb.addr.clone())
    );
    std::thread::sleep(RETRY + Duration::from_millis(300));
    rt.block_on(client.create_stream("left-2")).unwrap();
    let refused_again = Instant::now();
    assert_eq!(
        (home("left-2").as_deref(), client.home_addr()),
        (Some("rb"), pb.addr.clone()),
        "the retry of ra met the mark and went back to rb"
    );

    // The mark cleared: new streams go to the local region again.
    cluster.admin_ok(&["cluster", "region", "available", "ra"]);
    // Within its back-off the client stays where it is.
    rt.block_on(client.create_stream("left-3")).unwrap();
    assert!(
        refused_again.elapsed() < RETRY,
        "too slow to check the back-off"
    );
    assert_eq!(home("left-3").as_deref(), Some("rb"));
    assert_eq!(cluster.admin_ok(&["cluster", "region", "list"]).trim(), "");
    assert_ok(&write_by_regions("back", &regions), "write after the mark");
    assert_eq!(owner("back").as_deref(), Some(pa.addr.as_str()));
    assert_eq!(home("back").as_deref(), Some("ra"));
    // After it, the client is back in ra.
    std::thread::sleep(
        (RETRY + Duration::from_millis(300)).saturating_sub(refused_again.elapsed()),
    );
    rt.block_on(client.create_stream("returned")).unwrap();
    assert_eq!(
        (home("returned").as_deref(), client.home_addr()),
        (Some("ra"), pa.addr.clone())
    );
}

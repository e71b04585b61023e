//! Decommission that finishes or says why (issue 27 item 3), on one real cluster: three
//! `quire bookie` processes (autorecovery inside each, the default), a proxy writing E=3 Qw=3
//! Qa=2 streams, real ZooKeeper; a fourth bookie joins halfway. (A four-bookie decommission that
//! finishes and shows its progress is `cluster_autorecovery`'s decommission test.)

use std::sync::Arc;

use quire_client::ProxyClient;
use quire_metadata::BookieId;
use quire_testkit::harness::checker::write_records;
use quire_testkit::harness::cluster::{runtime, Cluster};

fn status(cluster: &Cluster) -> serde_json::Value {
    serde_json::from_str(&cluster.admin_ok(&["autorecovery", "status", "--json"])).unwrap()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_decommission_without_room_is_refused_and_a_cancelled_one_puts_the_bookie_back() {
    // Goal: on three bookies with E=3 a decommission is refused up front with the reason in one
    // line and changes nothing (the bookie stays registered and writable); with a fourth bookie
    // one starts (the bookie leaves the registry), `autorecovery status` shows it pending, and
    // `--cancel` puts the bookie back: registered again, so that with the fourth bookie gone
    // new streams still get their three bookies. A decommission run again is checked again,
    // and one that would leave fewer writable bookies than the ensemble size of the open
    // ledgers (what the proxies create) is refused though no ledger names the bookie.
    // Method: one stream written (its open segment keeps the decommission from finishing within
    // its 2 s timeout: the writer has it for the 30 s grace period); the commands' output, exit
    // status, `bookie list` and `autorecovery status --json`.
    let cluster = Cluster::start();
    let ports: Vec<u16> = (0..4).map(|_| quire_testkit::free_port()).collect();
    let ids: Vec<BookieId> = ports
        .iter()
        .map(|p| BookieId(format!("127.0.0.1:{p}")))
        .collect();
    let bookies: Vec<_> = (0..3).map(|i| cluster.start_bookie(i, ports[i])).collect();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let proxy = cluster.start_proxy_e3(&[]);
    let rt = runtime();
    let client = rt.block_on(async { Arc::new(ProxyClient::connect(&proxy.addr).await.unwrap()) });
    let (acked, err) = rt.block_on(write_records(&client, "dc/a", "a", 0..20));
    assert!(err.is_none() && acked.len() == 20, "{err:?}");
    let retired = &ids[2];

    // 1. Refused up front (the timeout only keeps a decommission that starts from waiting for
    //    ever).
    let out = cluster.admin(&["bookie", "decommission", &retired.0, "--timeout-secs", "3"]);
    assert!(!out.status.success());
    let reason = format!("ensemble needs 3 bookies; 2 writable bookies remain besides {retired}");
    assert!(stderr(&out).contains(&reason), "{}", stderr(&out));
    let list = cluster.admin_ok(&["bookie", "list"]);
    assert!(list.contains("3 bookies registered, 0 read-only"), "{list}");
    assert!(list.contains(&retired.0), "{list}");
    assert_eq!(status(&cluster)["decommissions"], serde_json::json!([]));

    // 2. With a fourth bookie it starts, the bookie leaves the registry, and it is pending.
    let fourth = cluster.start_bookie(3, ports[3]);
    cluster.wait_bookies("4 bookies", |l| l.contains("4 bookies registered"));
    let out = cluster.admin(&["bookie", "decommission", &retired.0, "--timeout-secs", "2"]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("decommissioning bookie"), "{text}");
    assert!(text.contains("ledgers still name"), "{text}");
    assert!(text.contains("bytes copied off it so far"), "{text}");
    assert!(text.contains("open: left to their writers"), "{text}");
    assert!(stderr(&out).contains("not finished"), "{}", stderr(&out));
    let st = status(&cluster);
    let pending = &st["decommissions"][0];
    assert_eq!(pending["bookie"], retired.0.as_str(), "{st}");
    assert!(pending["ledgers_left"].as_u64().unwrap() >= 1, "{st}");
    assert_eq!(pending["registered"], false, "{st}");
    let text = cluster.admin_ok(&["autorecovery", "status"]);
    assert!(text.contains("decommissions under way: 1"), "{text}");
    assert!(text.contains(&format!("bookie {retired}: ")), "{text}");
    cluster.wait_bookies("3 bookies", |l| {
        l.contains("3 bookies registered") && !l.contains(&retired.0)
    });

    // 2b. Run again with the fourth bookie gone: a resumed decommission is checked again and
    //     refused with the reason, and its record stays.
    fourth.stop();
    cluster.wait_bookies("2 bookies", |l| l.contains("2 bookies registered"));
    let out = cluster.admin(&["bookie", "decommission", &retired.0, "--timeout-secs", "2"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    let reason = format!("2 writable bookies remain besides {retired}");
    assert!(err.contains(&reason), "{err}");
    assert!(err.contains("stays under way"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(
        status(&cluster)["decommissions"][0]["bookie"],
        retired.0.as_str()
    );

    // 3. Cancelled: the bookie registers again, and a second cancel says there is none.
    let out = cluster.admin_ok(&["bookie", "decommission", "--cancel", &retired.0]);
    assert!(out.contains("cancelled"), "{out}");
    cluster.wait_bookies("3 bookies", |l| {
        l.contains("3 bookies registered, 0 read-only") && l.contains(&retired.0)
    });
    assert_eq!(status(&cluster)["decommissions"], serde_json::json!([]));
    let again = cluster.admin(&["bookie", "decommission", "--cancel", &retired.0]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("no decommission"),
        "{}",
        stderr(&again)
    );

    // 4. Without the fourth bookie, a new stream gets the three first ones.
    let (acked, err) = rt.block_on(write_records(&client, "dc/b", "b", 0..10));
    assert!(err.is_none() && acked.len() == 10, "{err:?}");

    // 5. A bookie no ledger names (the fourth, back after the first stopped), when fewer
    //    writable bookies than the open ledgers' ensemble size would remain: refused with the
    //    reason (new ledgers could not be made), and it stays registered. The proxy is killed
    //    first, so that its ledgers stay open with their E=3 and no ensemble change puts the
    //    fourth bookie in one (the old check then refused too).
    proxy.kill();
    let mut bookies = bookies;
    bookies.remove(0).stop();
    cluster.wait_bookies("2 bookies", |l| l.contains("2 bookies registered"));
    let fourth = cluster.start_bookie(3, ports[3]);
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let out = cluster.admin(&["bookie", "decommission", &ids[3].0, "--timeout-secs", "3"]);
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = stderr(&out);
    let reason = "new ledgers need 3 bookies";
    assert!(err.contains(reason), "{err}");
    assert!(
        err.contains(&format!("2 writable bookies remain besides {}", ids[3])),
        "{err}"
    );
    let list = cluster.admin_ok(&["bookie", "list"]);
    assert!(list.contains(&ids[3].0), "{list}");
    assert_eq!(status(&cluster)["decommissions"], serde_json::json!([]));

    fourth.stop();
    for b in bookies {
        b.stop();
    }
}

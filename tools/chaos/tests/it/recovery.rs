//! The runner's wait for a whole cluster (seed 234236409463439's finding): proxies that are
//! down when the schedule's faults are healed (both exited on an expired ZooKeeper session)
//! are started again, and the read-back finds every acknowledged record; a cluster that stays
//! broken is reported as not recovered.

// Real processes and a real-clock deadline for a bookie to expire.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use quire_chaos::cluster::ChaosCluster;
use quire_chaos::workload;
use quire_chaos::Fault;

#[test]
fn proxies_down_after_the_heal_are_started_again_before_the_read_back() {
    let shape = quire_chaos::shape(Duration::from_secs(1), false);
    let mut cc = ChaosCluster::start(shape);
    let rt = quire_testkit::harness::cluster::runtime();
    let proxies = cc.proxy_addrs();
    let stream = "chaos/recovery/plain";
    rt.block_on(async {
        let c = workload::client(&proxies).await.expect("a proxy answers");
        for txid in 1..=5u64 {
            c.write(stream, vec![(txid, vec![txid as u8; 16])], true)
                .await
                .expect("write acknowledged");
        }
    });
    // Both proxies gone at once, as when both sessions expired during a ZooKeeper outage.
    cc.inject(Fault::KillProxy(0));
    cc.inject(Fault::KillProxy(1));
    let refused = rt.block_on(workload::final_log(
        &proxies,
        stream,
        Duration::from_secs(1),
    ));
    assert!(refused.is_err(), "no proxy runs: {refused:?}");

    let lines = cc
        .wait_healthy(Duration::from_secs(60))
        .expect("the cluster is whole again");
    assert_eq!(lines.len(), 2, "both proxies started again: {lines:?}");
    let log = rt
        .block_on(workload::final_log(
            &proxies,
            stream,
            Duration::from_secs(60),
        ))
        .expect("read back from the restarted proxies");
    let txids: Vec<u64> = log.iter().map(|r| r.txid).collect();
    assert_eq!(txids, vec![1, 2, 3, 4, 5]);

    // A bookie cut from ZooKeeper past its session stays unregistered: not whole, and said so.
    cc.inject(Fault::PartitionBookieZk(0));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = cc.cluster.admin(&["bookie", "list"]);
        if String::from_utf8_lossy(&out.stdout).contains("3 bookies registered") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "bookie 0 never expired"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let err = cc
        .wait_healthy(Duration::from_secs(2))
        .expect_err("a bookie is not registered");
    assert!(
        err.starts_with("cluster did not recover within 2s"),
        "{err}"
    );
    cc.heal(Fault::PartitionBookieZk(0));
    cc.wait_healthy(Duration::from_secs(60))
        .expect("whole again after the heal");
}

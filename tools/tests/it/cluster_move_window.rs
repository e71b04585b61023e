//! The balancer's back-pressure (`quire_proxy` stream/balance.rs, issue 29): a proxy releases
//! streams toward a joining one no faster than the joining one acquires them. At 10,000
//! streams three proxies releasing 100 a second each toward a joiner left thousands of streams
//! unowned at once, and their writers waited past the clients' 30 s timeout.

use quire_testkit::harness::cluster::runtime;

use std::time::{Duration, Instant};

use quire_metadata::MetadataStore;
use quire_proxy::stream::placement::preferred_owner;
use quire_testkit::harness::checker::connect_proxy;
use quire_testkit::harness::cluster::Cluster;

const STREAMS: usize = 240;
/// Far above what the window lets through, so that the window is what limits the moves.
const BALANCE: &[&str] = &["--balance-moves-per-sec", "1000"];
/// balance.rs `MOVE_WINDOW`: moves one balancer keeps under way.
const MOVE_WINDOW: usize = 32;

fn name(i: usize) -> String {
    format!("win-{i:04}")
}

/// Streams nobody owns, and streams owned by `addr`, in the metadata store.
async fn count(store: &dyn MetadataStore, addr: &str) -> (usize, usize) {
    let (mut unowned, mut by) = (0, 0);
    for i in 0..STREAMS {
        match store.stream_owner(&name(i)).await.unwrap() {
            None => unowned += 1,
            Some(o) if o == addr => by += 1,
            Some(_) => {}
        }
    }
    (unowned, by)
}

#[test]
fn releases_toward_a_joining_proxy_wait_for_its_acquisitions() {
    // Goal: a proxy whose streams are preferred by a joining proxy keeps at most its window
    // of moves under way (a move lasts until the new owner acquired the stream, or about 2 s
    // for a stream nobody asks for), so the joiner is never handed more than it can take;
    // the share still moves in a bounded time, and the moved streams are served by the
    // joiner. Without the window, 1,000 moves/s released the joiner's whole share (~120
    // streams) in one balancer tick.
    // Method: ZooKeeper, 3 bookies, proxy P0 (real processes, 1,000 moves/s). Create the
    // streams through P0 (it owns them all), start P1, and read every stream's owner from
    // ZooKeeper over and over: streams nobody writes stay unowned once released (P1 acquires
    // on the first request), so the unowned count is the moves under way plus the ones whose
    // wait ended. Within the first 1.5 s of the first release it must not pass the window;
    // all of P1's share must be released within 60 s; writing to 4 of them through P0 then
    // succeeds and leaves them owned by P1.
    let cluster = Cluster::start();
    let _bookies: Vec<_> = (0..3)
        .map(|i| cluster.start_bookie(i, quire_testkit::free_port()))
        .collect();
    let p0 = cluster.start_proxy_e3(BALANCE);
    let rt = runtime();
    let store = rt.block_on(cluster.zk_store());
    rt.block_on(async {
        let client = connect_proxy(&p0.addr).await.unwrap();
        for i in 0..STREAMS {
            let s = name(i);
            client
                .write(&s, vec![(1, s.clone().into_bytes())], true)
                .await
                .unwrap_or_else(|e| panic!("creating {s}: {e}"));
        }
    });
    assert_eq!(rt.block_on(count(&store, &p0.addr)), (0, STREAMS));

    let p1 = cluster.start_proxy_e3(BALANCE);
    let both = [p0.addr.as_str(), p1.addr.as_str()];
    let share: Vec<usize> = (0..STREAMS)
        .filter(|&i| preferred_owner(&name(i), both.iter().copied()) == Some(both[1]))
        .collect();
    assert!(
        share.len() > 2 * MOVE_WINDOW,
        "P1's share {} is too small to show the window",
        share.len()
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut first_release: Option<Instant> = None;
    let mut most_early = 0;
    loop {
        let (unowned, _) = rt.block_on(count(&store, &p1.addr));
        let now = Instant::now();
        if unowned > 0 && first_release.is_none() {
            first_release = Some(now);
        }
        if first_release.is_some_and(|t| now.duration_since(t) < Duration::from_millis(1500)) {
            most_early = most_early.max(unowned);
        }
        if unowned == share.len() {
            eprintln!(
                "P1's share of {} released after {:?} from the first release",
                share.len(),
                first_release.map(|t| now.duration_since(t))
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {unowned} of P1's share of {} released within 60 s",
            share.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("most streams unowned within 1.5 s of the first release: {most_early}");
    assert!(
        most_early <= MOVE_WINDOW,
        "{most_early} streams were released at once toward the joining proxy (window {MOVE_WINDOW})"
    );

    rt.block_on(async {
        let client = connect_proxy(&p0.addr).await.unwrap();
        for &i in share.iter().take(4) {
            let s = name(i);
            client
                .write(&s, vec![(2, s.clone().into_bytes())], false)
                .await
                .unwrap_or_else(|e| panic!("writing {s} after its move: {e}"));
            assert_eq!(
                store.stream_owner(&s).await.unwrap().as_deref(),
                Some(p1.addr.as_str())
            );
        }
    });
}

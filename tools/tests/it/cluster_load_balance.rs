//! Balancing by load (`quire_proxy::stream::placement`, issue 29 item 3): a proxy whose write
//! load is far above the live proxies' mean lowers its capacity weight, so a share of its
//! streams moves to the others through the balancer's release and re-acquire, while writers
//! keep writing: nothing acknowledged is lost and each stream's DLSNs increase.

use quire_testkit::harness::cluster::runtime;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quire_client::Dlsn;
use quire_metadata::MetadataStore;
use quire_proxy::stream::placement::preferred_owner;
use quire_testkit::harness::checker::{check_stream, connect_proxy, Acked};
use quire_testkit::harness::cluster::{wait_proxy_views, Cluster, PROXY_VIEWS_MAX};

/// Hot streams, all placed on the first proxy by the hash.
const HOT: usize = 12;
/// Cold streams, spread by the hash, written once.
const COLD: usize = 30;
/// Payload bytes of each hot record.
const RECORD_BYTES: usize = 1024;
const BALANCE: &[&str] = &[
    "--balance-moves-per-sec",
    "100",
    "--balance-load-threshold-percent",
    "150",
];

/// One registry record as `quire proxy list` shows it: (address, write bytes/s, weight).
fn listed(cluster: &Cluster) -> Vec<(String, u64, String)> {
    let list = cluster.admin_ok(&["proxy", "list"]);
    let field = |l: &str, k: &str| -> Option<String> {
        l.split(' ')
            .find_map(|f| f.strip_prefix(k).map(str::to_string))
    };
    list.lines()
        .filter(|l| l.starts_with("127."))
        .map(|l| {
            let addr = l.split(' ').next().unwrap_or_default().to_string();
            let bytes = field(l, "write_bytes_per_sec=")
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no write_bytes_per_sec in {l}"));
            let weight = field(l, "weight=").unwrap_or_else(|| panic!("no weight in {l}"));
            (addr, bytes, weight)
        })
        .collect()
}

/// What one writer saw: acknowledged records per stream in acknowledgement order, errors,
/// its longest time without an acknowledgement.
#[derive(Default)]
struct WriterReport {
    acked: HashMap<String, Vec<Acked>>,
    errors: Vec<String>,
    longest_pause: Duration,
}

/// Writes one record of [`RECORD_BYTES`] at a time to each of `streams` in turn, without
/// pause (every attempt a new record), through a client homed on `home` that follows
/// redirects, until `stop`.
async fn writer(home: String, streams: Vec<String>, stop: Arc<AtomicBool>) -> WriterReport {
    let mut client = connect_proxy(&home).await.unwrap();
    let mut report = WriterReport::default();
    // Above the creation write's txid 1: txids of a stream never decrease.
    let mut seq: u64 = 1000;
    let mut last_ack = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        for s in &streams {
            seq += 1;
            let mut payload = format!("{s} w{seq:09} ").into_bytes();
            payload.resize(RECORD_BYTES, b'.');
            match client.write(s, vec![(seq, payload.clone())], false).await {
                Ok(r) => {
                    let now = Instant::now();
                    report.longest_pause = report.longest_pause.max(now - last_ack);
                    last_ack = now;
                    report
                        .acked
                        .entry(s.clone())
                        .or_default()
                        .push((r.first_dlsn, payload));
                }
                Err(e) => {
                    report.errors.push(format!("{s}: {e}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    client = connect_proxy(&home).await.unwrap();
                }
            }
        }
    }
    report
}

/// How many of `streams` each proxy owns in the metadata store.
async fn owned_by(store: &dyn MetadataStore, streams: &[String], proxy: &str) -> usize {
    let mut n = 0;
    for s in streams {
        n += usize::from(store.stream_owner(s).await.unwrap().as_deref() == Some(proxy));
    }
    n
}

#[test]
fn a_hot_proxy_sheds_streams_by_load_without_losing_a_write() {
    // Goal: with balancing by load on (threshold 150 %), a proxy whose streams take all the
    // cluster's writes (three times the mean) lowers its weight and at least half of its hot
    // streams move to the other proxies within 60 s; `quire proxy list` shows the loads and
    // the lowered weight; writers writing through the moves lose no acknowledged record, see
    // DLSNs increase and pause less than 10 s.
    // Method: ZooKeeper, 3 bookies, proxies P0..P2 (real processes, 100 moves/s). 12 streams
    // the hash places on P0 and 30 others, created through P0 (each lands on its preferred
    // owner). 4 writers through clients homed on P1 and P2 write 1 KiB records to the 12 hot
    // streams without pause. Poll ZooKeeper's owners until at most 6 hot streams are on P0;
    // keep writing 5 s more; stop; read every hot stream back with the shared checker.
    // With the threshold at 0 (load balancing off) this test fails: all 12 hot streams stay
    // on P0 for the 60 s (checked once by hand).
    let cluster = Cluster::start();
    let _bookies: Vec<_> = (0..3)
        .map(|i| cluster.start_bookie(i, quire_testkit::free_port()))
        .collect();
    let p0 = cluster.start_proxy_e3(BALANCE);
    let p1 = cluster.start_proxy_e3(BALANCE);
    let p2 = cluster.start_proxy_e3(BALANCE);
    let three = [p0.addr.clone(), p1.addr.clone(), p2.addr.clone()];
    let rt = runtime();
    let store = rt.block_on(cluster.zk_store());
    rt.block_on(wait_proxy_views(
        &store,
        &[&three[0], &three[1], &three[2]],
        PROXY_VIEWS_MAX,
    ));

    let on_p0 =
        |s: &String| preferred_owner(s, three.iter().map(String::as_str)) == Some(&*three[0]);
    let hot: Vec<String> = (0..)
        .map(|i| format!("hot-{i:03}"))
        .filter(on_p0)
        .take(HOT)
        .collect();
    let cold: Vec<String> = (0..COLD).map(|i| format!("cold-{i:03}")).collect();
    rt.block_on(async {
        let client = connect_proxy(&three[0]).await.unwrap();
        for s in hot.iter().chain(&cold) {
            client
                .write(s, vec![(1, s.clone().into_bytes())], true)
                .await
                .unwrap_or_else(|e| panic!("creating {s}: {e}"));
        }
    });
    assert_eq!(rt.block_on(owned_by(&store, &hot, &three[0])), HOT);

    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = hot
        .chunks(HOT / 4)
        .enumerate()
        .map(|(k, c)| {
            let home = three[1 + k % 2].clone();
            rt.spawn(writer(home, c.to_vec(), stop.clone()))
        })
        .collect();
    let started = Instant::now();
    let share = |l: &[(String, u64, String)]| {
        let total: u64 = l.iter().map(|p| p.1).sum();
        let p0 = l.iter().find(|p| p.0 == three[0]).map_or(0, |p| p.1);
        p0 as f64 / total.max(1) as f64
    };
    // The first record showing P0's load of the hot writes (the creation writes show as a
    // few bytes/s): P0 may lower its weight in the same tick, but acts on it only a tick
    // later, so nothing has moved yet.
    let before = loop {
        let l = listed(&cluster);
        if l.iter().any(|p| p.0 == three[0] && p.1 > 64 * 1024) {
            break l;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "P0's load never showed: {l:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("before: {before:?}");
    let share_before = share(&before);

    let deadline = started + Duration::from_secs(60);
    let mut lowered = false;
    loop {
        let n = rt.block_on(owned_by(&store, &hot, &three[0]));
        lowered |= listed(&cluster)
            .iter()
            .any(|p| p.0 == three[0] && p.2 != "1.000");
        if n <= HOT / 2 && lowered {
            eprintln!(
                "shed: {n} of {HOT} hot streams left on P0 after {:?}",
                started.elapsed()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "60 s of writing: {n} of {HOT} hot streams still on P0, weight lowered: {lowered}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // The moved streams' load reaches the registry, and the writers go on through it.
    std::thread::sleep(Duration::from_secs(5));
    let after = listed(&cluster);
    eprintln!("after: {after:?}");
    let share_after = share(&after);
    eprintln!(
        "P0's share of write bytes: {share_before:.2} before, {share_after:.2} after, ratio {:.2}",
        share_after / share_before
    );
    assert!(share_before > 0.9, "P0 took only {share_before:.2} before");
    assert!(
        share_after < 0.75,
        "P0 still takes {share_after:.2} of the bytes"
    );
    stop.store(true, Ordering::SeqCst);

    let mut acked: HashMap<String, Vec<Acked>> = HashMap::new();
    let mut longest = Duration::ZERO;
    for w in writers {
        let r = rt.block_on(w).unwrap();
        eprintln!(
            "writer: {} errors {:?}, longest pause {:?}",
            r.errors.len(),
            r.errors.iter().take(4).collect::<Vec<_>>(),
            r.longest_pause
        );
        longest = longest.max(r.longest_pause);
        acked.extend(r.acked);
    }
    assert!(
        longest < Duration::from_secs(10),
        "a writer paused {longest:?}"
    );
    for s in &hot {
        let a = acked.get(s).map(Vec::as_slice).unwrap_or_default();
        assert!(a.len() > 20, "{s}: only {} acknowledged writes", a.len());
        let dlsns: Vec<Dlsn> = a.iter().map(|(d, _)| *d).collect();
        assert!(
            dlsns.windows(2).all(|w| w[0] < w[1]),
            "{s}: DLSNs did not increase"
        );
        rt.block_on(check_stream(&three[0], &store, s, a, &[]));
    }
}

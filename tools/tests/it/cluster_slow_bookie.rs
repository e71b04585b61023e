//! Issue 13, item 1 (Pulsar #14861, BookKeeper #1390): a slow but live bookie.
//!
//! Goal: with E=3 Qw=3 Qa=2 on four bookies, a bookie of the writer's ensemble whose link is
//! throttled to 100 KB/s for 20 s while the stream takes about 2 MB/s: acknowledgements go on
//! (Qa is met by the other two), the writer replaces the slow bookie by an ensemble change
//! rather than buffering for it without end, the proxy's resident memory stays under a bound
//! (documented in perf/README.md, "Slow bookie"), and once the link is back every entry of
//! every fragment with a known end is on its whole write set: the adds already queued for the
//! slow bookie (bounded per connection) arrive late, and what it still lacks is found by
//! autorecovery's periodic check (which marks the old fragment while the link is slow) and
//! copied back to it. The shared checker finds every acknowledged record once and in order.
//! Method: real ZooKeeper, four `quire bookie` processes each registered under the address of
//! a testkit relay in front of it (`--advertised`), a `quire proxy`; the slow link is the
//! relay's throttle. The proxy's RSS is read from /proc every write batch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quire_client::ProxyClient;
use quire_metadata::{BookieId, MetadataStore, ZkStore};
use quire_testkit::harness::checker::{check_stream, entries_missing, write_padded_records, Acked};
use quire_testkit::harness::cluster::{Cluster, Proc, SESSION_TIMEOUT_MS};
use quire_testkit::TcpRelay;
use quire_wire::LedgerId;

const STREAM: &str = "slow/one";
/// Bytes of padding per record: records of about 1 KiB.
const PAD: usize = 1000;
/// Records per batch, and batches per second: about 2 MB/s.
const BATCH: usize = 200;
const BATCHES_PER_SEC: u32 = 10;
/// The proxy's resident memory may grow by at most this much over its size before the slow
/// period (perf/README.md, "Slow bookie", says where the figure comes from).
const RSS_GROWTH_MAX_BYTES: u64 = 256 << 20;

fn rss_bytes(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

#[test]
fn a_slow_bookie_is_replaced_memory_stays_bounded_and_its_missed_entries_come_back() {
    let cluster = Cluster::start();
    let ports: Vec<u16> = (0..4).map(|_| quire_testkit::free_port()).collect();
    let relays: Vec<TcpRelay> = ports
        .iter()
        .map(|p| TcpRelay::start(format!("127.0.0.1:{p}").parse().unwrap()))
        .collect();
    let ids: Vec<BookieId> = relays
        .iter()
        .map(|r| BookieId(r.connect_string()))
        .collect();
    let bookies: Vec<Proc> = (0..4)
        .map(|i| {
            cluster.start_bookie_with(
                i,
                ports[i],
                &[
                    "--advertised",
                    &ids[i].0,
                    "--lost-bookie-recovery-delay-secs",
                    "600",
                    "--auditor-periodic-check-interval-secs",
                    "2",
                    "--autorecovery-poll-interval-ms",
                    "250",
                ],
            )
        })
        .collect();
    cluster.wait_bookies("4 bookies", |l| l.contains("4 bookies registered"));
    let proxy = cluster.start_proxy_e3(&["--segment-size-bytes", "268435456"]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(async { Arc::new(ProxyClient::connect(&proxy.addr).await.unwrap()) });
    let store = rt.block_on(async {
        ZkStore::connect(
            &cluster.zookeeper(),
            &cluster.zk_root,
            Duration::from_millis(SESSION_TIMEOUT_MS),
        )
        .await
        .unwrap()
    });
    let mut acked: Vec<Acked> = Vec::new();
    let mut next = 0usize;
    let mut batch = |acked: &mut Vec<Acked>| {
        let (got, err) = rt.block_on(write_padded_records(
            &client,
            STREAM,
            STREAM,
            next..next + BATCH,
            PAD,
        ));
        next += BATCH;
        assert!(err.is_none(), "a write failed: {err:?}");
        acked.extend(got);
    };
    batch(&mut acked);
    let ledger = rt.block_on(async {
        let meta = store.read_stream(STREAM).await.unwrap().value;
        LedgerId(meta.segments.last().unwrap().ledger_id)
    });
    let ensemble = rt
        .block_on(store.read_ledger(ledger))
        .unwrap()
        .value
        .fragments[0]
        .bookies
        .clone();
    let slow = ensemble[1].clone();
    let slow_relay = &relays[ids.iter().position(|b| *b == slow).unwrap()];
    let rss_before = rss_bytes(proxy.pid());

    slow_relay.throttle(Some(100_000));
    let started = Instant::now();
    let (mut rss_max, mut slowest) = (rss_before, Duration::ZERO);
    while started.elapsed() < Duration::from_secs(20) {
        let t = Instant::now();
        batch(&mut acked);
        slowest = slowest.max(t.elapsed());
        rss_max = rss_max.max(rss_bytes(proxy.pid()));
        let period = Duration::from_secs(1) / BATCHES_PER_SEC;
        std::thread::sleep(period.saturating_sub(t.elapsed()));
    }
    slow_relay.throttle(None);
    let missed = rt.block_on(entries_missing(&store));
    eprintln!("{} replicas missing when the link came back", missed.len());
    for _ in 0..5 {
        batch(&mut acked);
    }
    eprintln!(
        "proxy RSS {} MiB before, at most {} MiB while the bookie was slow; slowest batch of {BATCH} records {slowest:?}",
        rss_before >> 20,
        rss_max >> 20
    );
    assert!(
        rss_max < rss_before + RSS_GROWTH_MAX_BYTES,
        "proxy RSS grew from {} to {} MiB",
        rss_before >> 20,
        rss_max >> 20
    );
    let meta = rt.block_on(store.read_ledger(ledger)).unwrap().value;
    assert!(
        !meta.fragments.last().unwrap().bookies.contains(&slow),
        "the writer replaced the slow bookie {slow}: {meta:?}"
    );

    // Whatever the slow bookie's old fragment still lacks is found by the periodic check and
    // copied back.
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let missing = entries_missing(&store).await;
            if missing.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} replicas still missing, first {:?}",
                missing.len(),
                &missing[..missing.len().min(5)]
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let report = check_stream(&proxy.addr, &store, STREAM, &acked, &[]).await;
        assert!(report.records.len() >= acked.len());
    });
    proxy.stop();
    for b in bookies {
        b.stop();
    }
}

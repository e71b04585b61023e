//! Issue 13, item 1 (Pulsar #14861, BookKeeper #1390 family): a bookie that stops answering
//! must cost at most one add timeout, once, not a stall per entry or per segment; and the
//! entries it missed must come back to it.
//!
//! Goal: with E=3 Qw=3 Qa=2 on exactly three bookies (no replacement exists), one bookie
//! SIGSTOPped for 12 s while a writer keeps 16 writes in flight and a reader scans the stream from
//! its head over and over (reading from the bookies, the stopped one included),
//! acknowledgements never pause for as long as the add timeout (5 s) more than once, and every
//! write is acknowledged. After SIGCONT and the proxy's clean stop, autorecovery (inside the
//! bookies) copies the entries the stopped bookie missed back to it, from the writer's report,
//! and the checker finds every acknowledged record once and in order with every replica equal,
//! the stopped bookie's included.
//! Method: real ZooKeeper, `quire bookie` and `quire proxy` processes, SIGSTOP/SIGCONT; each
//! acknowledgement's arrival time is recorded and the gaps between consecutive ones measured.
//! Segments do not roll during the stop: the stopped bookie's registration expires with its
//! ZooKeeper session, and a new E=3 ledger needs three registered bookies.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quire_client::{ProxyClient, ReadPosition};
use quire_testkit::harness::checker::{check_stream, Acked};
use quire_testkit::harness::cluster::{runtime, Cluster};

const STREAM: &str = "stop/one";
/// The ledger client's add timeout (`ClientConfig::request_timeout`).
const ADD_TIMEOUT: Duration = Duration::from_secs(5);
const AUTORECOVERY_FLAGS: &[&str] = &[
    "--open-ledger-rereplication-grace-period-ms",
    "2000",
    "--autorecovery-poll-interval-ms",
    "250",
];

#[test]
fn a_stopped_bookie_costs_at_most_one_add_timeout() {
    let cluster = Cluster::start();
    let ports: Vec<u16> = (0..3).map(|_| quire_testkit::free_port()).collect();
    // The bookies' autorecovery (on by default) acts on marks within a few seconds, but does
    // not count the stopped bookie as lost (the 60 s default delay is longer than the stop).
    let bookies: Vec<_> = (0..3)
        .map(|i| cluster.start_bookie_with(i, ports[i], AUTORECOVERY_FLAGS))
        .collect();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let proxy = cluster.start_proxy_e3(&[]);
    let rt = runtime();
    let client = rt.block_on(async { Arc::new(ProxyClient::connect(&proxy.addr).await.unwrap()) });
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acks: Arc<Mutex<Vec<(Instant, Acked)>>> = Arc::default();

    // The writer: 16 writes in flight, 512-byte records, each ack timed.
    let writer = {
        let (client, stop, acks) = (client.clone(), stop.clone(), acks.clone());
        rt.spawn(async move {
            let mut in_flight = std::collections::VecDeque::new();
            let mut i = 0u64;
            loop {
                while in_flight.len() < 16 && !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let mut payload = format!("w-{i:08}-").into_bytes();
                    payload.resize(512, b'.');
                    let (c, p) = (client.clone(), payload.clone());
                    in_flight.push_back((
                        payload,
                        tokio::spawn(async move { c.write(STREAM, vec![(1, p)], true).await }),
                    ));
                    i += 1;
                }
                let Some((payload, task)) = in_flight.pop_front() else {
                    return;
                };
                let w = task.await.unwrap().expect("every write is acknowledged");
                acks.lock()
                    .unwrap()
                    .push((Instant::now(), (w.first_dlsn, payload)));
            }
        })
    };
    // The reader: scans from the head again and again, reading from the bookies. It starts
    // once the first write is acknowledged (before that the stream does not exist).
    let reader = {
        let (addr, stop, acks) = (proxy.addr.clone(), stop.clone(), acks.clone());
        rt.spawn(async move {
            while acks.lock().unwrap().is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let c = ProxyClient::connect(&addr).await.unwrap();
            let mut scans = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let mut pos = ReadPosition::Head;
                loop {
                    match c.read(STREAM, pos, 200, 1 << 20, Duration::ZERO).await {
                        Ok(b) if b.records.is_empty() => break,
                        Ok(b) => pos = b.next,
                        Err(e) => panic!("read failed: {e}"),
                    }
                }
                scans += 1;
            }
            scans
        })
    };

    std::thread::sleep(Duration::from_secs(3));
    let stopped_at = Instant::now();
    bookies[2].pause();
    std::thread::sleep(Duration::from_secs(12));
    bookies[2].resume();
    let resumed_at = Instant::now();
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    rt.block_on(writer).unwrap();
    let scans = rt.block_on(reader).unwrap();

    let acks = std::mem::take(&mut *acks.lock().unwrap());
    let times: Vec<Instant> = acks.iter().map(|a| a.0).collect();
    let during = times
        .iter()
        .filter(|t| **t > stopped_at && **t < resumed_at)
        .count();
    let mut gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort();
    let longest: Vec<Duration> = gaps.iter().rev().take(5).copied().collect();
    let long = gaps.iter().filter(|g| **g >= ADD_TIMEOUT / 2).count();
    eprintln!(
        "{} acks ({during} while the bookie was stopped), {scans} scans; longest gaps {longest:?}; {long} gaps of at least {:?}",
        acks.len(),
        ADD_TIMEOUT / 2
    );
    assert!(
        during > 100,
        "writes went on while the bookie was stopped ({during} acks)"
    );
    assert!(
        long <= 1,
        "acknowledgements paused for half the add timeout or more {long} times: {longest:?}"
    );

    let acked: Vec<Acked> = acks.into_iter().map(|a| a.1).collect();
    // The proxy's clean stop closes the segment; the adds that timed out on the stopped bookie
    // were reported by the writer (an under-replication mark naming it), and autorecovery
    // copies them back in place once the ledger is closed. Then every replica is compared,
    // the stopped bookie's included.
    proxy.stop();
    rt.block_on(async {
        let store = cluster.zk_store().await;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let marks = store.list_under_replicated().await.unwrap();
            if marks.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "under-replication marks still there after 60 s: {marks:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    let reader_proxy = cluster.start_proxy_e3(&[]);
    rt.block_on(async {
        let store = cluster.zk_store().await;
        check_stream(&reader_proxy.addr, &store, STREAM, &acked, &[]).await;
    });
    reader_proxy.stop();
    for b in bookies {
        b.stop();
    }
}

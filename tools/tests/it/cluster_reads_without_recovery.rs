//! Issue 13, item 3 (BookKeeper #2612 family): one bookie down must not make acknowledged
//! records unreadable, and a segment whose recovery cannot finish must say so and be retried.
//!
//! Goal: with E=Qw=Qa=3 on exactly three bookies, a writer proxy SIGKILLed after 500
//! acknowledged records and one bookie SIGKILLed too, (a) the stream stays readable through
//! another proxy up to the last acknowledged record, each acknowledged record once and in order,
//! although the in-progress segment cannot be recovered (its re-adds need the dead bookie and no
//! other bookie can replace it); (b) a write meanwhile fails at once with a STORAGE_ERROR that
//! names the recovery, and the ledger is IN_RECOVERY, not closed short; (c) once a fourth bookie
//! registers, the proxy's retry recovers the segment with an ensemble change to it (the ledger is
//! closed, the segment completed) without any request, and writes go on.
//! Method: real ZooKeeper, `quire bookie` and `quire proxy` processes, SIGKILL; the bookies' LAC
//! is polled through the ledger client before the kill, so the kill lands after the writer
//! carried its LAC to the bookies (the control entry); the shared checker reads everything back
//! and compares replicas on the live bookies.

use quire_testkit::harness::cluster::runtime;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quire_client::ProxyClient;
use quire_metadata::{BookieId, LedgerState, MetadataStore, SegmentState, ZkStore};
use quire_proxy::ErrorCode;
use quire_testkit::harness::checker::{check_stream, write_records};
use quire_testkit::harness::cluster::Cluster;
use quire_wire::LedgerId;

async fn store(cluster: &Cluster) -> Arc<ZkStore> {
    Arc::new(cluster.zk_store().await)
}

const STREAM: &str = "rr/one-down";
/// The quorums, and ownership by the first proxy asked, which the test relies on (balanced
/// ownership, on by default, is tested in cluster_balanced_ownership.rs).
const QUORUM: [&str; 8] = [
    "--ensemble-size",
    "3",
    "--write-quorum",
    "3",
    "--ack-quorum",
    "3",
    "--balance-moves-per-sec",
    "0",
];

#[test]
fn stream_stays_readable_with_one_of_three_bookies_down() {
    let cluster = Cluster::start();
    let ports: Vec<u16> = (0..4).map(|_| quire_testkit::free_port()).collect();
    let mut bookies: Vec<_> = (0..3)
        .map(|i| Some(cluster.start_bookie(i, ports[i])))
        .collect();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let writer = cluster.start_proxy(quire_testkit::free_port(), &QUORUM);
    let rt = runtime();
    let client = rt.block_on(async { Arc::new(ProxyClient::connect(&writer.addr).await.unwrap()) });
    let (mut acked, err) = rt.block_on(write_records(&client, STREAM, "a", 0..500));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(acked.len(), 500);
    let last_acked = acked.iter().map(|a| a.0).max().unwrap();
    let store = rt.block_on(store(&cluster));

    // The writer carries its LAC to the bookies once idle (a control entry): wait for that
    // event, so that the kill lands after it (a writer killed before has acknowledged entries
    // that no bookie knows are confirmed; BookKeeper's readers stop at the LAC likewise).
    let ledger = rt.block_on(async {
        let meta = store.read_stream(STREAM).await.unwrap().value;
        let seg = meta.segments.last().unwrap().clone();
        assert_eq!(seg.seq_no, last_acked.segment_seq_no);
        assert_eq!(seg.state, SegmentState::InProgress);
        let bk = quire_ledger::BookKeeper::new(
            store.clone(),
            quire_ledger::ClientConfig {
                cluster_secret: Some(cluster.secret),
                ..Default::default()
            },
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let reader = bk.open_ledger(LedgerId(seg.ledger_id)).await.unwrap();
            let lac = reader.read_lac().await.unwrap();
            if lac.is_some_and(|l| l.0 >= last_acked.entry_id) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the bookies' LAC {lac:?} never covered the last acknowledged entry {}",
                last_acked.entry_id
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seg.ledger_id
    });

    writer.kill();
    bookies[2].take().unwrap().kill();
    let down = BookieId(format!("127.0.0.1:{}", ports[2]));
    let reader_proxy = cluster.start_proxy(quire_testkit::free_port(), &QUORUM);

    // (a) Readable through the other proxy, up to the last acknowledged record (the checker
    // retries while the dead writer's lease lasts).
    rt.block_on(async {
        let report = check_stream(
            &reader_proxy.addr,
            &*store,
            STREAM,
            &acked,
            std::slice::from_ref(&down),
        )
        .await;
        assert_eq!(
            report.records.len(),
            500,
            "nothing beyond what was acknowledged"
        );
        assert_eq!(report.records.last().unwrap().0, last_acked);
    });

    // (b) Writes fail at once and say why; the ledger is left IN_RECOVERY, not closed short.
    rt.block_on(async {
        let c = ProxyClient::connect(&reader_proxy.addr).await.unwrap();
        let started = Instant::now();
        let e = c
            .write(STREAM, vec![(1, b"refused".to_vec())], false)
            .await
            .expect_err("no write while the segment cannot be recovered");
        assert_eq!(e.code(), ErrorCode::Storage, "{e}");
        let text = e.to_string();
        assert!(
            text.contains("recover") && text.contains("replace"),
            "the error names the recovery and the missing replacement: {text}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "answered without waiting on the dead bookie for long ({:?})",
            started.elapsed()
        );
        let lm = store.read_ledger(LedgerId(ledger)).await.unwrap().value;
        assert_eq!(lm.state, LedgerState::InRecovery);
        let seg = store.read_stream(STREAM).await.unwrap().value;
        assert_eq!(seg.segments.last().unwrap().state, SegmentState::InProgress);
    });

    // (c) A fourth bookie makes an ensemble change possible: the proxy's retry completes the
    // recovery by itself, and the stream takes writes again.
    let fourth = cluster.start_bookie(3, ports[3]);
    let new = BookieId(format!("127.0.0.1:{}", ports[3]));
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        let lm = loop {
            let lm = store.read_ledger(LedgerId(ledger)).await.unwrap().value;
            if lm.state == LedgerState::Closed {
                break lm;
            }
            assert!(
                Instant::now() < deadline,
                "the segment was not recovered within 60 s of a replacement bookie appearing: {lm:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let last = lm.fragments.last().unwrap();
        assert!(
            last.bookies.contains(&new) && !last.bookies.contains(&down),
            "recovery replaced the dead bookie: {:?}",
            lm.fragments
        );
        assert!(
            lm.last_entry.is_some_and(|l| l >= last_acked.entry_id),
            "recovery kept every acknowledged entry: {lm:?}"
        );
        let c = Arc::new(ProxyClient::connect(&reader_proxy.addr).await.unwrap());
        let (more, err) = write_records(&c, STREAM, "b", 0..100).await;
        assert!(err.is_none(), "{err:?}");
        acked.extend(more);
        let report = check_stream(
            &reader_proxy.addr,
            &*store,
            STREAM,
            &acked,
            std::slice::from_ref(&down),
        )
        .await;
        assert_eq!(report.records.len(), 600);
    });
    reader_proxy.stop();
    fourth.stop();
    for b in bookies.into_iter().flatten() {
        b.stop();
    }
}

//! Goal (issue 28 item 4, a field scenario that needs per-message fault points): with two of a
//! ledger's three replicas failing the reads of some entries (`IoError`) and never answering
//! LAC reads, a reader still learns the LAC and gets every entry, with its bytes, from the third
//! replica; the faults were really injected on the two bookies and on no other.
//! Method: real ZooKeeper and three `quire bookie` processes, two of them started with
//! `QUIRE_FAULT_POINTS="read=fail:101,entries=3-6;lac=drop"` (docs/fault-points.md); a ledger
//! E=3 Qw=3 Qa=2 written and read through the ledger client (1 s request timeout). Each faulted
//! bookie's stderr must show both faults hit: with the fault points made no-ops the test fails.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quire_ledger::{BookKeeper, ClientConfig, LedgerOptions};
use quire_testkit::harness::cluster::{runtime, Cluster};
use quire_wire::EntryId;

const SPEC: &str = "read=fail:101,entries=3-6;lac=drop";
const TIMEOUT: Duration = Duration::from_secs(1);

fn payload(i: u64) -> Vec<u8> {
    format!("entry {i} {}", "q".repeat(100)).into_bytes()
}

#[test]
fn two_replicas_failing_reads_and_lac_reads_leave_the_third() {
    let started = Instant::now();
    let cluster = Cluster::start();
    let ports: Vec<u16> = (0..3).map(|_| quire_testkit::free_port()).collect();
    let bookies: Vec<_> = (0..3)
        .map(|i| {
            let env: &[(&str, &str)] = if i < 2 {
                &[("QUIRE_FAULT_POINTS", SPEC)]
            } else {
                &[]
            };
            cluster.start_bookie_env(i, ports[i], &[], env)
        })
        .collect();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let rt = runtime();
    rt.block_on(async {
        let store = Arc::new(cluster.zk_store().await);
        let bk = BookKeeper::new(
            store,
            ClientConfig {
                cluster_secret: Some(cluster.secret),
                request_timeout: TIMEOUT,
                ..Default::default()
            },
        );
        let w = bk
            .create_ledger(LedgerOptions {
                ensemble_size: 3,
                write_quorum: 3,
                ack_quorum: 2,
                password: quire_ledger::new_ledger_secret(),
                custom: Default::default(),
            })
            .await
            .unwrap();
        for i in 0..10 {
            w.add(payload(i)).await.unwrap();
        }
        // Open without recovery, as a tailing reader does: its LAC comes from the one replica
        // that answers LAC reads (entry 9 carried LAC 8), after the two others time out. That
        // replica need not be in entry 9's ack quorum, so it may not have entry 9 yet when
        // first asked (LAC 7 on a loaded run): ask again until it has.
        let r = bk.open_ledger(w.id()).await.unwrap();
        let t = Instant::now();
        let mut lac = r.read_lac().await.unwrap().expect("a LAC");
        assert!(
            t.elapsed() >= TIMEOUT,
            "the dropped LAC reads were waited for"
        );
        for _ in 0..20 {
            if lac.0 >= 8 {
                break;
            }
            lac = r.read_lac().await.unwrap().expect("a LAC");
        }
        assert!(lac.0 >= 8, "LAC {lac:?}");
        for i in 0..=lac.0 {
            let got = r.read(EntryId(i)).await.unwrap();
            assert!(got == payload(i), "entry {i} read back with other bytes");
        }
    });
    // The harness's reader thread copies a bookie's stderr lines a moment after the bookie
    // wrote them (and before it answered), and the last failed read comes a millisecond before
    // this check: wait for each line, bounded, rather than read what was copied so far.
    let injected = |b: &quire_testkit::harness::cluster::Proc, op: &str| {
        b.stderr_shows(
            &format!("fault point: request fault injected op={op}"),
            Duration::from_secs(10),
        )
    };
    for (i, b) in bookies.iter().enumerate() {
        if i < 2 {
            let lac = injected(b, "Lac");
            let read = injected(b, "Read");
            let err = b.stderr.lock().unwrap().clone();
            assert!(lac, "bookie {i}: no LAC read dropped: {err}");
            assert!(read, "bookie {i}: no read failed: {err}");
        } else {
            let err = b.stderr.lock().unwrap().clone();
            assert!(
                !err.contains("fault point: request fault injected"),
                "bookie {i} has no fault: {err}"
            );
        }
    }
    eprintln!("fault points test took {:?}", started.elapsed());
}

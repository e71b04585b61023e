//! Goal: a bookie's garbage collection deletes exactly the ledgers the metadata side names as
//! deleted, only ones it held at the previous run, nothing when the question goes unanswered,
//! and a deleted ledger (fenced before) stays refused for adds of any key, also after a restart.
//! Method: one two-shard bookie with a 150 ms GC interval and a 50 ms checkpoint interval; a
//! thread answers its questions: the first one of each shard is dropped unanswered, later ones
//! name ledger 11 (fenced) and 13 (never written here) as deleted. Ledgers 11 and 12 are written
//! over the wire; wait until 11 reads NoSuchLedger, check 12, restart, check again.

use crate::common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{entry, Client, Resp, KEY, OTHER_KEY};
use quire_bookie::{deleted_ledgers_channel, Bookie};
use quire_wire::bookie::Status;

#[test]
fn gc_deletes_only_named_ledgers_and_they_stay_deleted() {
    let dir = common::tempdir();
    let (gc, queries) = deleted_ledgers_channel();
    let asked: Arc<Mutex<Vec<Vec<u64>>>> = Arc::default();
    let asked2 = asked.clone();
    let answerer = std::thread::spawn(move || {
        let mut dropped_first = 0;
        while let Some(q) = futures_lite::future::block_on(queries.next()) {
            asked2.lock().unwrap().push(q.candidates.clone());
            if dropped_first < 2 {
                dropped_first += 1;
                drop(q);
                continue;
            }
            // 13 was never asked about: the bookie must ignore it.
            let deleted: Vec<u64> = [11, 13]
                .into_iter()
                .filter(|l| *l == 13 || q.candidates.contains(l))
                .collect();
            q.answer(deleted);
        }
    });
    let mut config = common::config(dir.path(), 2);
    config.gc_interval = Duration::from_millis(150);
    config.gc_deleted_ledgers = Some(gc.clone());
    config.engine.checkpoint_interval = Duration::from_millis(50);
    let bookie = Bookie::start(config.clone()).expect("bookie starts");
    let (mut c, _) = Client::handshake(bookie.addr());
    for e in 0..20 {
        for ledger in [11, 12] {
            assert_eq!(
                c.add(KEY, &entry(ledger, e), false),
                Resp::Add { ledger, entry: e }
            );
        }
    }
    assert_eq!(c.fence(11, KEY).status(), Status::Ok);

    let deadline = Instant::now() + Duration::from_secs(20);
    while c.read(11, Some(0)).status() != Status::NoSuchLedger {
        assert!(
            Instant::now() < deadline,
            "ledger 11 was not deleted in 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let check = |c: &mut Client| {
        assert_eq!(c.read(11, Some(5)).status(), Status::NoSuchLedger);
        for key in [KEY, OTHER_KEY] {
            for recovery in [false, true] {
                assert_eq!(
                    c.add(key, &entry(11, 20), recovery).status(),
                    Status::Fenced,
                    "an add to deleted ledger 11 (key {key:?}, recovery {recovery})"
                );
            }
        }
        assert_eq!(c.fence(11, KEY).status(), Status::Fenced);
        for e in 0..20 {
            assert_eq!(
                c.read(12, Some(e)),
                Resp::Read {
                    ledger: 12,
                    entry: e,
                    data: entry(12, e)
                }
            );
        }
    };
    check(&mut c);
    {
        let asked = asked.lock().unwrap();
        let all: HashSet<u64> = asked.iter().flatten().copied().collect();
        assert!(all.contains(&11) && all.contains(&12), "asked {asked:?}");
        assert!(
            !all.contains(&13),
            "asked about a ledger it never held: {asked:?}"
        );
    }
    drop(c);
    bookie.shutdown().expect("clean shutdown");

    let mut config = config;
    config.gc_interval = Duration::ZERO;
    config.gc_deleted_ledgers = None;
    let bookie = Bookie::start(config).expect("bookie restarts");
    let (mut c, _) = Client::handshake(bookie.addr());
    check(&mut c);
    drop(c);
    bookie.shutdown().expect("clean shutdown");
    drop(gc);
    answerer.join().expect("answerer thread");
}

//! Goal: bookies whose shards share executors (a `ShardHost`, as the sandbox runs them) serve
//! each its own data, survive a stop and restart of one while the other keeps serving, and
//! the host's threads end once the last bookie using it has stopped.
//!
//! Method: one host with one executor; three bookies of two shards each on it (six shards on
//! one thread); entries added to ledgers on every shard of every bookie over real TCP, read
//! back from the right bookie and refused (NoSuchEntry) by the others; bookie 2 shut down and
//! started again on its directories while bookie 1 keeps answering; then all shut down and
//! the host dropped, which joins its thread (a hang here fails the test by its harness
//! timeout). Entries are distinct per bookie, so a shard that served another bookie's
//! engine would be caught.

use crate::common;

use crate::common::{entry, Client, Resp, KEY};
use quire_bookie::{shard_of, Bookie, ShardHost};
use quire_wire::bookie::Status;

fn ledgers_on_every_shard(base: u64) -> Vec<u64> {
    (0..2)
        .map(|s| {
            (base..base + 100)
                .find(|l| shard_of(*l, 2) == s)
                .expect("a ledger on every shard")
        })
        .collect()
}

fn start_on(host: &ShardHost, dir: &std::path::Path) -> Bookie {
    let mut config = common::config(dir, 2);
    config.host = Some(host.clone());
    Bookie::start(config).expect("bookie on a shared host starts")
}

#[test]
fn bookies_on_a_shared_host_keep_their_own_data() {
    let host = ShardHost::start(1, &[], 4 << 20).expect("host starts");
    let dirs: Vec<_> = (0..3).map(|_| common::tempdir()).collect();
    let mut bookies: Vec<Bookie> = dirs.iter().map(|d| start_on(&host, d.path())).collect();
    // Bookie b holds ledgers 1000 * (b + 1) + ...: disjoint sets.
    let sets: Vec<Vec<u64>> = (0..3)
        .map(|b| ledgers_on_every_shard(1000 * (b + 1)))
        .collect();
    for (b, bookie) in bookies.iter().enumerate() {
        let (mut c, _) = Client::handshake(bookie.addr());
        for &l in &sets[b] {
            for e in 0..4 {
                assert_eq!(
                    c.add(KEY, &entry(l, e), false),
                    Resp::Add {
                        ledger: l,
                        entry: e
                    }
                );
            }
        }
    }
    let check = |bookies: &[Bookie]| {
        for (b, bookie) in bookies.iter().enumerate() {
            let (mut c, _) = Client::handshake(bookie.addr());
            for (o, set) in sets.iter().enumerate() {
                for &l in set {
                    let got = c.read(l, Some(2));
                    if o == b {
                        assert_eq!(
                            got,
                            Resp::Read {
                                ledger: l,
                                entry: 2,
                                data: entry(l, 2)
                            },
                            "bookie {b} ledger {l}"
                        );
                    } else {
                        assert_ne!(got.status(), Status::Ok, "bookie {b} has ledger {l}");
                    }
                }
            }
        }
    };
    check(&bookies);

    // Restart bookie 2 while bookie 1 keeps serving on the same executor.
    let b2 = bookies.remove(1);
    b2.shutdown().expect("bookie 2 stops");
    let (mut c, _) = Client::handshake(bookies[0].addr());
    assert_eq!(
        c.add(KEY, &entry(sets[0][0], 4), false),
        Resp::Add {
            ledger: sets[0][0],
            entry: 4
        }
    );
    drop(c);
    bookies.insert(1, start_on(&host, dirs[1].path()));
    check(&bookies);

    for b in bookies {
        b.shutdown().expect("clean shutdown");
    }
    assert_eq!(host.executors(), 1);
    // The last handle: joins the executor thread, which ends once every shard has closed.
    drop(host);
}

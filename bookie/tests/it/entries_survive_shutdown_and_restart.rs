//! Goal: entries acknowledged before a clean shutdown are readable after a restart on the same
//! directories (with their fence state and LAC), and a restart with another shard count is
//! refused. Method: start, add to ledgers on both shards, fence one, shutdown; start again
//! and read everything back; then try to start with 1 shard and expect a Config error.

use crate::common;

use crate::common::{entry, Client, Resp, KEY};
use quire_bookie::{shard_of, Bookie, Error};
use quire_wire::bookie::Status;

#[test]
fn entries_survive_shutdown_and_restart() {
    let dir = common::tempdir();
    let ledgers: Vec<u64> = (1..20)
        .filter(|l| shard_of(*l, 2) == 0)
        .take(1)
        .chain((1..20).filter(|l| shard_of(*l, 2) == 1).take(1))
        .collect();
    assert_eq!(ledgers.len(), 2);

    let bookie = common::start(dir.path(), 2);
    let (mut c, _) = Client::handshake(bookie.addr());
    for &l in &ledgers {
        for e in 0..5 {
            assert_eq!(
                c.add(KEY, &entry(l, e), false),
                Resp::Add {
                    ledger: l,
                    entry: e
                }
            );
        }
    }
    assert_eq!(
        c.fence(ledgers[0], KEY),
        Resp::Fence {
            ledger: ledgers[0],
            lac: Some(3)
        }
    );
    drop(c);
    bookie.shutdown().expect("clean shutdown");

    let bookie = common::start(dir.path(), 2);
    let (mut c, _) = Client::handshake(bookie.addr());
    for &l in &ledgers {
        for e in 0..5 {
            assert_eq!(
                c.read(l, Some(e)),
                Resp::Read {
                    ledger: l,
                    entry: e,
                    data: entry(l, e)
                }
            );
        }
        assert_eq!(
            c.read_lac(l),
            Resp::ReadLac {
                ledger: l,
                lac: Some(3),
                last_entry: Some(4)
            }
        );
    }
    assert_eq!(
        c.add(KEY, &entry(ledgers[0], 5), false).status(),
        Status::Fenced
    );
    assert_eq!(
        c.add(KEY, &entry(ledgers[1], 5), false),
        Resp::Add {
            ledger: ledgers[1],
            entry: 5
        }
    );
    drop(c);
    bookie.shutdown().expect("clean shutdown");

    match Bookie::start(common::config(dir.path(), 1)) {
        Err(Error::Config(message)) => assert!(message.contains("records 2 shards"), "{message}"),
        other => panic!("expected a shard count error, got {other:?}"),
    }
}

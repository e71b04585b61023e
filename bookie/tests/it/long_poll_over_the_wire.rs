//! Goal: the long-poll opcode over the wire: a parked long-poll does not hold up other
//! requests on its connection; the add that moves the LAC answers it with the next entry
//! piggybacked; a long-poll whose LAC already passed answers at once; one with nothing new
//! times out with the unchanged LAC; a long-poll for a ledger of the other shard is forwarded
//! and woken the same way; and shutdown answers parked long-polls instead of waiting for their
//! timeouts.
//! Method: a real bookie (one and two shards) on 127.0.0.1; the blocking wire client of
//! tests/common pipelines requests on one connection and matches answers by request id.

use crate::common;

use crate::common::{entry, Client, Resp, KEY};
use quire_bookie::shard_of;
use quire_wire::bookie::Request;
use quire_wire::{EntryId, LedgerId};

fn long_poll(ledger: u64, previous: Option<u64>, timeout_ms: u32) -> Request<'static> {
    Request::ReadLacLongPoll {
        ledger: LedgerId(ledger),
        previous_lac: previous.map(EntryId),
        timeout_ms,
    }
}

#[test]
fn parked_long_poll_does_not_block_the_connection_and_wakes_on_add() {
    let dir = common::tempdir();
    let bookie = common::start(dir.path(), 1);
    let (mut c, _) = Client::handshake(bookie.addr());
    let l = 42;
    assert_eq!(
        c.add(KEY, &entry(l, 0), false),
        Resp::Add {
            ledger: l,
            entry: 0
        }
    );
    assert_eq!(
        c.add(KEY, &entry(l, 1), false),
        Resp::Add {
            ledger: l,
            entry: 1
        }
    );

    // LAC 0 is past "none": answered at once with entry 0.
    assert_eq!(
        c.call(&long_poll(l, None, 20_000)),
        Resp::LongPoll {
            ledger: l,
            lac: Some(0),
            fenced: false,
            next_entry: Some((0, entry(l, 0)))
        }
    );

    // Park a long-poll past LAC 0, then run other requests on the same connection: they are
    // answered while the long-poll stays parked.
    let poll_id = c.send(&long_poll(l, Some(0), 20_000));
    assert_eq!(
        c.read(l, Some(1)),
        Resp::Read {
            ledger: l,
            entry: 1,
            data: entry(l, 1)
        }
    );
    assert_eq!(
        c.read_lac(l),
        Resp::ReadLac {
            ledger: l,
            lac: Some(0),
            last_entry: Some(1)
        }
    );
    // The add of entry 2 (LAC 1) answers both the add and the parked long-poll.
    let data = entry(l, 2);
    let add_id = c.send(&Request::Add {
        recovery: false,
        master_key: KEY,
        entry: &data,
    });
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(c.recv().expect("answer"));
    }
    let by_id = |id: u64| {
        got.iter()
            .find(|(h, _)| h.request_id == id)
            .map(|(_, r)| r.clone())
            .unwrap()
    };
    assert_eq!(
        by_id(add_id),
        Resp::Add {
            ledger: l,
            entry: 2
        }
    );
    assert_eq!(
        by_id(poll_id),
        Resp::LongPoll {
            ledger: l,
            lac: Some(1),
            fenced: false,
            next_entry: Some((1, entry(l, 1)))
        }
    );

    // Nothing past LAC 1: a short long-poll times out with LAC 1 and no entry.
    assert_eq!(
        c.call(&long_poll(l, Some(1), 50)),
        Resp::LongPoll {
            ledger: l,
            lac: Some(1),
            fenced: false,
            next_entry: None
        }
    );

    // Shutdown with a long-poll parked for a minute: it is answered (unchanged LAC), and
    // shutdown completes.
    let poll_id = c.send(&long_poll(l, Some(1), 60_000));
    assert_eq!(
        c.read_lac(l),
        Resp::ReadLac {
            ledger: l,
            lac: Some(1),
            last_entry: Some(2)
        }
    );
    let stopper = std::thread::spawn(move || bookie.shutdown());
    let (h, resp) = c
        .recv()
        .expect("the parked long-poll is answered at shutdown");
    assert_eq!(h.request_id, poll_id);
    assert_eq!(
        resp,
        Resp::LongPoll {
            ledger: l,
            lac: Some(1),
            fenced: false,
            next_entry: None
        }
    );
    stopper.join().unwrap().expect("clean shutdown");
}

#[test]
fn long_poll_for_the_other_shard_is_forwarded_and_woken() {
    let dir = common::tempdir();
    let bookie = common::start(dir.path(), 2);
    let ledgers: Vec<u64> = [0usize, 1]
        .iter()
        .map(|s| (1000..).find(|l| shard_of(*l, 2) == *s).unwrap())
        .collect();
    // Several connections, so that both shards accept some: every long-poll below is local on
    // some connections and forwarded on others.
    let mut clients: Vec<Client> = (0..4).map(|_| Client::handshake(bookie.addr()).0).collect();
    for &l in &ledgers {
        assert_eq!(
            clients[0].add(KEY, &entry(l, 0), false),
            Resp::Add {
                ledger: l,
                entry: 0
            }
        );
    }
    let mut parked = Vec::new();
    for (i, c) in clients.iter_mut().enumerate() {
        for &l in &ledgers {
            // LAC is none (only entry 0, which carries no LAC): parks.
            parked.push((i, l, c.send(&long_poll(l, None, 20_000))));
        }
    }
    let mut adder = Client::handshake(bookie.addr()).0;
    for &l in &ledgers {
        assert_eq!(
            adder.add(KEY, &entry(l, 1), false),
            Resp::Add {
                ledger: l,
                entry: 1
            }
        );
    }
    for (i, l, id) in parked {
        let (h, resp) = clients[i].recv().expect("answer");
        let other = ledgers.iter().find(|x| **x != l).copied().unwrap();
        let expect = |l: u64| Resp::LongPoll {
            ledger: l,
            lac: Some(0),
            fenced: false,
            next_entry: Some((0, entry(l, 0))),
        };
        // Answers on one connection may come in either order.
        if h.request_id == id {
            assert_eq!(resp, expect(l));
        } else {
            assert_eq!(resp, expect(other));
        }
    }
    bookie.shutdown().expect("clean shutdown");
}

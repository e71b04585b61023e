//! Goal: with two shards, ledgers owned by either shard are served through one connection,
//! whichever shard accepted it (requests for the other shard are forwarded). Method: pick
//! ledgers that hash to each shard, open several connections (the kernel spreads them over
//! both shards' listeners), and on each one pipeline adds, reads, read-LACs and fences for
//! ledgers of both shards.

use crate::common;

use std::collections::HashMap;

use crate::common::{entry, Client, Resp, KEY};
use quire_bookie::shard_of;
use quire_wire::bookie::Request;
use quire_wire::{EntryId, LedgerId};

#[test]
fn ledgers_on_both_shards_work_through_one_connection() {
    let dir = common::tempdir();
    let bookie = common::start(dir.path(), 2);
    let on0: Vec<u64> = (1000..).filter(|l| shard_of(*l, 2) == 0).take(2).collect();
    let on1: Vec<u64> = (1000..).filter(|l| shard_of(*l, 2) == 1).take(2).collect();

    for (round, pair) in [(0usize, [on0[0], on1[0]]), (1, [on0[1], on1[1]])] {
        // Several connections so that, with high probability, both shards accept at least one.
        for conn in 0..4u64 {
            let (mut c, hello) = Client::handshake(bookie.addr());
            assert!(
                matches!(hello, Resp::Hello { shard_count: 2, .. }),
                "{hello:?}"
            );
            let base = conn * 10;
            let mut expected = HashMap::new();
            for e in base..base + 10 {
                for &l in &pair {
                    let data = entry(l, e);
                    let id = c.send(&Request::Add {
                        recovery: false,
                        master_key: KEY,
                        entry: &data,
                    });
                    expected.insert(
                        id,
                        Resp::Add {
                            ledger: l,
                            entry: e,
                        },
                    );
                }
            }
            while !expected.is_empty() {
                let (h, resp) = c.recv().expect("response");
                assert_eq!(Some(resp), expected.remove(&h.request_id));
            }
            for e in base..base + 10 {
                for &l in &pair {
                    let id = c.send(&Request::Read {
                        ledger: LedgerId(l),
                        entry: Some(EntryId(e)),
                        fence: None,
                    });
                    expected.insert(
                        id,
                        Resp::Read {
                            ledger: l,
                            entry: e,
                            data: entry(l, e),
                        },
                    );
                }
            }
            while !expected.is_empty() {
                let (h, resp) = c.recv().expect("response");
                assert_eq!(Some(resp), expected.remove(&h.request_id));
            }
            for &l in &pair {
                assert_eq!(
                    c.read_lac(l),
                    Resp::ReadLac {
                        ledger: l,
                        lac: Some(base + 8),
                        last_entry: Some(base + 9)
                    },
                    "round {round} conn {conn}"
                );
            }
        }
        let (mut c, _) = Client::handshake(bookie.addr());
        for &l in &pair {
            assert_eq!(
                c.fence(l, KEY),
                Resp::Fence {
                    ledger: l,
                    lac: Some(38)
                }
            );
            assert_eq!(
                c.read(l, None),
                Resp::Read {
                    ledger: l,
                    entry: 39,
                    data: entry(l, 39)
                }
            );
        }
    }
    bookie.shutdown().expect("clean shutdown");
}

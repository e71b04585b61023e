//! Goal: many requests in flight on one connection are each answered exactly once, matched by
//! request id, whatever order they complete in. Method: send 200 adds over three ledgers
//! back-to-back without reading, then collect 200 responses and check that every request id
//! got the Add response for the entry it carried; then read everything back pipelined too.

use crate::common;

use std::collections::HashMap;

use crate::common::{entry, Client, Resp, KEY};
use quire_wire::bookie::Request;
use quire_wire::{EntryId, LedgerId};

#[test]
fn pipelined_adds_and_reads_are_answered_by_request_id() {
    let dir = common::tempdir();
    let bookie = common::start(dir.path(), 1);
    let (mut c, _) = Client::handshake(bookie.addr());

    let mut expected = HashMap::new();
    for i in 0..200u64 {
        let (ledger, e) = (100 + i % 3, i / 3);
        let data = entry(ledger, e);
        let id = c.send(&Request::Add {
            recovery: false,
            master_key: KEY,
            entry: &data,
        });
        expected.insert(id, Resp::Add { ledger, entry: e });
    }
    for _ in 0..200 {
        let (header, resp) = c.recv().expect("response");
        let want = expected
            .remove(&header.request_id)
            .expect("a request id sent once and not yet answered");
        assert_eq!(resp, want);
    }
    assert!(expected.is_empty());

    for i in 0..200u64 {
        let (ledger, e) = (100 + i % 3, i / 3);
        let id = c.send(&Request::Read {
            ledger: LedgerId(ledger),
            entry: Some(EntryId(e)),
            fence: None,
        });
        expected.insert(
            id,
            Resp::Read {
                ledger,
                entry: e,
                data: entry(ledger, e),
            },
        );
    }
    for _ in 0..200 {
        let (header, resp) = c.recv().expect("response");
        assert_eq!(Some(resp), expected.remove(&header.request_id));
    }
    drop(c);
    bookie.shutdown().expect("clean shutdown");
}

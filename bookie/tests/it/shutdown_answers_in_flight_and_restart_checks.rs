//! Goal: `shutdown` answers the requests it already read, closes idle and busy connections
//! instead of waiting for clients, and every add it acknowledged is readable after a restart;
//! a shard whose engine cannot open (corrupt checkpoint mark) makes `start` fail with an
//! engine error naming that shard. Method: pipeline adds on one connection, keep another
//! connection idle, shut down without reading, then read what was acknowledged and check it
//! after a restart; finally flip a byte of shard 1's checkpoint mark and start again.

use crate::common;

use std::collections::HashMap;

use crate::common::{entry, Client, Resp, KEY};
use quire_bookie::{Bookie, Error};
use quire_wire::bookie::{Request, Status};

#[test]
fn shutdown_answers_in_flight_requests_and_acknowledged_adds_survive() {
    let dir = common::tempdir();
    let bookie = common::start(dir.path(), 2);
    let (_idle, _) = Client::handshake(bookie.addr());
    let (mut c, _) = Client::handshake(bookie.addr());
    let mut sent = HashMap::new();
    for e in 0..100u64 {
        let ledger = 300 + e % 2;
        let data = entry(ledger, e / 2);
        let id = c.send(&Request::Add {
            recovery: false,
            master_key: KEY,
            entry: &data,
        });
        sent.insert(id, (ledger, e / 2));
    }
    bookie
        .shutdown()
        .expect("clean shutdown with open connections");

    // A request the reader admitted before the shard's in-flight gate closed succeeds. One
    // whose frame was still being handled when the gate closed (frames received in one socket
    // read are handled one by one, and shutdown can come between them) is refused with the
    // shutdown error (conn.rs); the client cannot tell which side of the gate a request was,
    // so both answers are accepted, and nothing else.
    let mut acked = Vec::new();
    let mut refused = 0;
    while let Some((h, resp)) = c.recv() {
        let (ledger, e) = sent
            .remove(&h.request_id)
            .expect("each request answered at most once");
        match resp {
            Resp::Add { .. } => {
                assert_eq!(resp, Resp::Add { ledger, entry: e });
                acked.push((ledger, e));
            }
            Resp::Failed {
                status: Status::IoError,
                ref message,
                ..
            } if message == "bookie is shutting down" => refused += 1,
            other => panic!("request for entry {e} of ledger {ledger} got {other:?}"),
        }
    }
    assert!(
        !acked.is_empty(),
        "shutdown answered none of the adds in flight with success ({refused} refused)"
    );

    let bookie = common::start(dir.path(), 2);
    let (mut c, _) = Client::handshake(bookie.addr());
    for (ledger, e) in acked {
        assert_eq!(
            c.read(ledger, Some(e)),
            Resp::Read {
                ledger,
                entry: e,
                data: entry(ledger, e)
            }
        );
    }
    drop(c);
    bookie.shutdown().expect("clean shutdown");
}

#[test]
fn start_fails_with_the_engine_error_of_a_corrupt_shard() {
    let dir = common::tempdir();
    let bookie = common::start(dir.path(), 2);
    let (mut c, _) = Client::handshake(bookie.addr());
    for l in 0..8 {
        assert_eq!(
            c.add(KEY, &entry(l, 0), false),
            Resp::Add {
                ledger: l,
                entry: 0
            }
        );
    }
    drop(c);
    bookie.shutdown().expect("clean shutdown");

    let mark = dir.path().join("ledgers/shard-1/checkpoint.qcp");
    let mut bytes = std::fs::read(&mark).expect("shutdown leaves a checkpoint mark");
    // Byte 20 lies in the journal position the mark's CRC32C covers (engine format).
    bytes[20] ^= 0x5a;
    std::fs::write(&mark, &bytes).unwrap();

    match Bookie::start(common::config(dir.path(), 2)) {
        Err(e @ Error::Engine { shard: 1, .. }) => {
            let message = e.to_string();
            assert!(message.contains("checkpoint.qcp"), "{message}");
        }
        other => panic!("expected an engine error from shard 1, got {other:?}"),
    }
}

//! Goal: after the handshake a client can add entries and read them back by id, read the
//! last entry, read the LAC, and fence; unknown ledgers and entries get the negative statuses.
//! Method: one bookie (1 shard) on 127.0.0.1 with a real engine under /tmp; a blocking
//! std::net client sends one request at a time and checks each decoded response.

use crate::common;

use crate::common::{entry, Client, Resp, KEY};
use quire_wire::bookie::Status;

#[test]
fn handshake_then_add_read_read_last_read_lac_fence() {
    let dir = common::tempdir();
    let bookie = common::start(dir.path(), 1);
    let (mut c, hello) = Client::handshake(bookie.addr());
    assert_eq!(
        hello,
        Resp::Hello {
            version: 1,
            shard_count: 1,
            frame_size_bytes_max: quire_wire::frame::FRAME_SIZE_BYTES_MAX_DEFAULT
        }
    );

    let ledger = 42;
    for e in 0..4 {
        assert_eq!(
            c.add(KEY, &entry(ledger, e), false),
            Resp::Add { ledger, entry: e }
        );
    }
    for e in 0..4 {
        assert_eq!(
            c.read(ledger, Some(e)),
            Resp::Read {
                ledger,
                entry: e,
                data: entry(ledger, e)
            }
        );
    }
    // Read of the last entry names the entry id it found.
    assert_eq!(
        c.read(ledger, None),
        Resp::Read {
            ledger,
            entry: 3,
            data: entry(ledger, 3)
        }
    );
    // The LAC is the largest piggybacked one (entry 3 carried LAC 2).
    assert_eq!(
        c.read_lac(ledger),
        Resp::ReadLac {
            ledger,
            lac: Some(2),
            last_entry: Some(3)
        }
    );

    assert_eq!(c.read(ledger, Some(9)).status(), Status::NoSuchEntry);
    assert_eq!(c.read(7, Some(0)).status(), Status::NoSuchLedger);
    assert_eq!(c.read(7, None).status(), Status::NoSuchLedger);
    assert_eq!(c.read_lac(7).status(), Status::NoSuchLedger);

    assert_eq!(
        c.fence(ledger, KEY),
        Resp::Fence {
            ledger,
            lac: Some(2)
        }
    );
    // Reads still work on a fenced ledger.
    assert_eq!(
        c.read(ledger, Some(1)),
        Resp::Read {
            ledger,
            entry: 1,
            data: entry(ledger, 1)
        }
    );

    drop(c);
    bookie.shutdown().expect("clean shutdown");
}

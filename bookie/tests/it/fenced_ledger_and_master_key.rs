//! Goal: a fenced ledger refuses normal adds but accepts recovery adds, a fencing read fences,
//! and a wrong master key is refused for adds and fences. Method: one bookie, one client;
//! check the status of each response.

use crate::common;

use crate::common::{entry, Client, Resp, KEY, OTHER_KEY};
use quire_wire::bookie::{Request, Status};
use quire_wire::{EntryId, LedgerId};

#[test]
fn fenced_ledger_refuses_normal_add_and_accepts_recovery_add() {
    let dir = common::tempdir();
    let bookie = common::start(dir.path(), 1);
    let (mut c, _) = Client::handshake(bookie.addr());
    let ledger = 5;
    assert_eq!(
        c.add(KEY, &entry(ledger, 0), false),
        Resp::Add { ledger, entry: 0 }
    );
    assert_eq!(
        c.add(KEY, &entry(ledger, 1), false),
        Resp::Add { ledger, entry: 1 }
    );
    assert_eq!(
        c.fence(ledger, KEY),
        Resp::Fence {
            ledger,
            lac: Some(0)
        }
    );

    assert_eq!(
        c.add(KEY, &entry(ledger, 2), false).status(),
        Status::Fenced
    );
    assert_eq!(
        c.add(KEY, &entry(ledger, 2), true),
        Resp::Add { ledger, entry: 2 }
    );
    assert_eq!(
        c.read(ledger, Some(2)),
        Resp::Read {
            ledger,
            entry: 2,
            data: entry(ledger, 2)
        }
    );

    // A fencing read of the last entry: fences another ledger and returns its last entry.
    let other = 6;
    assert_eq!(
        c.add(KEY, &entry(other, 0), false),
        Resp::Add {
            ledger: other,
            entry: 0
        }
    );
    let fencing_read = c.call(&Request::Read {
        ledger: LedgerId(other),
        entry: None,
        fence: Some(KEY),
    });
    assert_eq!(
        fencing_read,
        Resp::Read {
            ledger: other,
            entry: 0,
            data: entry(other, 0)
        }
    );
    assert_eq!(c.add(KEY, &entry(other, 1), false).status(), Status::Fenced);
    let fencing_read = c.call(&Request::Read {
        ledger: LedgerId(other),
        entry: Some(EntryId(0)),
        fence: Some(KEY),
    });
    assert_eq!(fencing_read.status(), Status::Ok);
    drop(c);
    bookie.shutdown().expect("clean shutdown");
}

#[test]
fn wrong_master_key_is_unauthorized() {
    let dir = common::tempdir();
    let bookie = common::start(dir.path(), 1);
    let (mut c, _) = Client::handshake(bookie.addr());
    let ledger = 9;
    assert_eq!(
        c.add(KEY, &entry(ledger, 0), false),
        Resp::Add { ledger, entry: 0 }
    );
    assert_eq!(
        c.add(OTHER_KEY, &entry(ledger, 1), false).status(),
        Status::Unauthorized
    );
    assert_eq!(
        c.add(OTHER_KEY, &entry(ledger, 1), true).status(),
        Status::Unauthorized
    );
    assert_eq!(c.fence(ledger, OTHER_KEY).status(), Status::Unauthorized);
    let fencing_read = c.call(&Request::Read {
        ledger: LedgerId(ledger),
        entry: None,
        fence: Some(OTHER_KEY),
    });
    assert_eq!(fencing_read.status(), Status::Unauthorized);
    // The refused requests changed nothing: the ledger is not fenced and entry 1 is absent.
    assert_eq!(c.read(ledger, Some(1)).status(), Status::NoSuchEntry);
    assert_eq!(
        c.add(KEY, &entry(ledger, 1), false),
        Resp::Add { ledger, entry: 1 }
    );
    drop(c);
    bookie.shutdown().expect("clean shutdown");
}

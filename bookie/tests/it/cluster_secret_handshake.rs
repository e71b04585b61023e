//! Goal: a bookie with a cluster secret serves only connections that proved it (issue 24 item
//! 1): a version-1 Hello, a request before `Auth`, and an `Auth` with a proof made from another
//! secret each get their refusal and a closed connection, and none of them changes any state.
//! Method: one real bookie (library, one shard) with a secret; each stranger on a fresh raw
//! connection; then a client with the secret checks that the stranger's ledger does not exist
//! and that the stranger's fence did not fence the legitimate writer's ledger.

use crate::common;

use std::io::Write;

use crate::common::{entry, Client, Resp, KEY, OTHER_KEY};
use quire_wire::auth::ClusterSecret;
use quire_wire::bookie::{Request, Status};
use quire_wire::LedgerId;

fn refused(c: &mut Client, request: &Request<'_>, status: Status) {
    let r = c.call(request);
    assert!(
        matches!(&r, Resp::Failed { status: s, .. } if *s == status),
        "{request:?} got {r:?}"
    );
    assert!(c.recv().is_none(), "the bookie closes after {request:?}");
}

#[test]
fn strangers_are_refused_before_any_state_changes() {
    let dir = common::tempdir();
    let secret = ClusterSecret::generate().unwrap();
    let mut config = common::config(dir.path(), 1);
    config.cluster_secret = Some(secret);
    let bookie = quire_bookie::Bookie::start(config).expect("bookie starts");
    let addr = bookie.addr();

    // The legitimate writer starts ledger 1.
    let mut writer = Client::handshake_with_secret(addr, &secret);
    assert_eq!(
        writer.add(KEY, &entry(1, 0), false),
        Resp::Add {
            ledger: 1,
            entry: 0
        }
    );

    // A version-1 client (no secret) is refused at Hello.
    let mut c = Client::connect(addr);
    refused(
        &mut c,
        &Request::Hello {
            version_min: 1,
            version_max: 1,
        },
        Status::BadVersion,
    );

    // Requests without any handshake: add to a new ledger, read, fence.
    let stranger_entry = entry(2, 0);
    let before_hello = [
        Request::Add {
            recovery: false,
            master_key: OTHER_KEY,
            entry: &stranger_entry,
        },
        Request::Read {
            ledger: LedgerId(1),
            entry: Some(quire_wire::EntryId(0)),
            fence: None,
        },
        Request::Fence {
            ledger: LedgerId(1),
            master_key: OTHER_KEY,
        },
    ];
    for r in &before_hello {
        refused(&mut Client::connect(addr), r, Status::Unauthorized);
    }

    // The same after a version-2 Hello but without Auth.
    for r in &before_hello {
        let mut c = Client::connect(addr);
        let hello = c.call(&Request::Hello {
            version_min: 1,
            version_max: 2,
        });
        assert!(
            matches!(hello, Resp::HelloV2 { version: 2, .. }),
            "{hello:?}"
        );
        refused(&mut c, r, Status::Unauthorized);
    }

    // Hello, then Add pipelined right behind it in one write: still refused.
    let mut c = Client::connect(addr);
    let mut bytes = Vec::new();
    quire_wire::bookie::encode_request(
        &mut bytes,
        1,
        &Request::Hello {
            version_min: 2,
            version_max: 2,
        },
    );
    quire_wire::bookie::encode_request(&mut bytes, 2, &before_hello[0]);
    c.stream().write_all(&bytes).unwrap();
    let (_, hello) = c.recv().expect("hello answer");
    assert!(matches!(hello, Resp::HelloV2 { .. }), "{hello:?}");
    let (_, add) = c.recv().expect("add answer");
    assert!(
        matches!(
            add,
            Resp::Failed {
                status: Status::Unauthorized,
                ..
            }
        ),
        "{add:?}"
    );
    assert!(c.recv().is_none());

    // A proof made with another secret.
    let wrong = ClusterSecret::generate().unwrap();
    let mut c = Client::connect(addr);
    let Resp::HelloV2 { nonce, .. } = c.call(&Request::Hello {
        version_min: 2,
        version_max: 2,
    }) else {
        panic!("no version-2 Hello answer");
    };
    let client_nonce = [9u8; 32];
    refused(
        &mut c,
        &Request::Auth {
            client_nonce,
            proof: wrong.client_proof(&nonce, &client_nonce),
        },
        Status::Unauthorized,
    );
    // A replayed proof: the writer's handshake on another connection cannot be reused, since
    // the bookie's nonce differs on every connection.
    let mut c = Client::connect(addr);
    let Resp::HelloV2 { nonce: other, .. } = c.call(&Request::Hello {
        version_min: 2,
        version_max: 2,
    }) else {
        panic!("no version-2 Hello answer");
    };
    assert_ne!(other, nonce, "every connection gets a new nonce");
    refused(
        &mut c,
        &Request::Auth {
            client_nonce,
            proof: secret.client_proof(&nonce, &client_nonce),
        },
        Status::Unauthorized,
    );

    // Nothing changed: the stranger's ledger does not exist, ledger 1 is not fenced (the
    // writer's next add is taken) and its key is still the writer's.
    let mut check = Client::handshake_with_secret(addr, &secret);
    let r = check.read(2, Some(0));
    assert!(
        matches!(
            r,
            Resp::Failed {
                status: Status::NoSuchLedger,
                ..
            }
        ),
        "{r:?}"
    );
    assert_eq!(
        writer.add(KEY, &entry(1, 1), false),
        Resp::Add {
            ledger: 1,
            entry: 1
        }
    );
    assert_eq!(
        check.read(1, Some(1)),
        Resp::Read {
            ledger: 1,
            entry: 1,
            data: entry(1, 1)
        }
    );
    drop((writer, check));
    bookie.shutdown().unwrap();
}

#[test]
fn a_bookie_without_a_secret_speaks_version_1_only() {
    // Goal: the library default (no secret) is unchanged for version-1 clients, and a client
    // that insists on version 2 learns at Hello that this bookie cannot prove a secret.
    let dir = common::tempdir();
    let bookie = common::start(dir.path(), 1);
    let (mut c, _) = Client::handshake(bookie.addr());
    assert_eq!(
        c.add(KEY, &entry(1, 0), false),
        Resp::Add {
            ledger: 1,
            entry: 0
        }
    );
    let mut c = Client::connect(bookie.addr());
    refused(
        &mut c,
        &Request::Hello {
            version_min: 2,
            version_max: 2,
        },
        Status::BadVersion,
    );
    bookie.shutdown().unwrap();
}

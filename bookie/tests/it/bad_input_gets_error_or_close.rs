//! Goal: hostile or out-of-order input never takes the bookie down: a request before the
//! handshake, a garbage frame, an oversized length and a malformed body each get an error
//! response (or a closed connection), and other connections keep being served. Method: one
//! bookie; for each case open a raw connection, send the bytes, read until close; then check a
//! fresh connection still adds and reads.

use crate::common;

use std::io::Write;
use std::net::SocketAddr;

use crate::common::{entry, Client, Resp, KEY};
use quire_wire::bookie::{Opcode, Request, Status};
use quire_wire::frame::{encode_frame, FrameHeader};
use quire_wire::LedgerId;

/// Sends `bytes` on a fresh connection and returns every response until the bookie closes.
fn responses_until_close(addr: SocketAddr, handshake: bool, bytes: &[u8]) -> Vec<Resp> {
    let mut c = if handshake {
        Client::handshake(addr).0
    } else {
        Client::connect(addr)
    };
    // The bookie may close before reading everything; a failed write is part of the outcome.
    let _ = c.stream().write_all(bytes);
    let mut out = Vec::new();
    while let Some((_, resp)) = c.recv() {
        out.push(resp);
    }
    out
}

fn still_serving(addr: SocketAddr, ledger: u64) {
    let (mut c, _) = Client::handshake(addr);
    assert_eq!(
        c.add(KEY, &entry(ledger, 0), false),
        Resp::Add { ledger, entry: 0 }
    );
    assert_eq!(
        c.read(ledger, Some(0)),
        Resp::Read {
            ledger,
            entry: 0,
            data: entry(ledger, 0)
        }
    );
}

#[test]
fn request_before_hello_is_refused_and_closed() {
    let dir = common::tempdir();
    let bookie = common::start(dir.path(), 1);
    let mut bytes = Vec::new();
    quire_wire::bookie::encode_request(
        &mut bytes,
        3,
        &Request::ReadLac {
            ledger: LedgerId(1),
        },
    );
    let got = responses_until_close(bookie.addr(), false, &bytes);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        matches!(
            &got[0],
            Resp::Failed {
                opcode: Opcode::ReadLac,
                status: Status::BadRequest,
                ..
            }
        ),
        "{got:?}"
    );
    still_serving(bookie.addr(), 1);
    bookie.shutdown().expect("clean shutdown");
}

#[test]
fn garbage_and_oversized_frames_are_refused_and_closed() {
    let dir = common::tempdir();
    let bookie = common::start(dir.path(), 1);
    let addr = bookie.addr();

    // A length below the header size.
    let got = responses_until_close(addr, true, &[3, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef]);
    assert!(
        got.iter().all(|r| r.status() == Status::BadRequest) && got.len() <= 1,
        "{got:?}"
    );

    // A length above the frame limit, followed by a lot of bytes.
    let mut big = u32::MAX.to_le_bytes().to_vec();
    big.extend(std::iter::repeat_n(0xab, 256 * 1024));
    let got = responses_until_close(addr, true, &big);
    assert!(
        got.iter().all(|r| r.status() == Status::TooLarge) && got.len() <= 1,
        "{got:?}"
    );

    // Random bytes before the handshake.
    let noise: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let got = responses_until_close(addr, false, &noise);
    assert!(
        got.iter().all(|r| r.status() != Status::Ok) && got.len() <= 1,
        "{got:?}"
    );

    // A well-framed request with an unknown opcode, and one with a truncated body.
    let mut bad = Vec::new();
    encode_frame(
        &mut bad,
        FrameHeader {
            opcode: 0x7f,
            flags: 0,
            status: 0,
            request_id: 9,
        },
        b"xyz",
    );
    let got = responses_until_close(addr, true, &bad);
    assert!(
        matches!(
            &got[..],
            [Resp::Failed {
                status: Status::BadRequest,
                ..
            }]
        ),
        "{got:?}"
    );
    let mut bad = Vec::new();
    encode_frame(
        &mut bad,
        FrameHeader {
            opcode: Opcode::Read as u8,
            flags: 0,
            status: 0,
            request_id: 9,
        },
        b"short",
    );
    let got = responses_until_close(addr, true, &bad);
    assert!(
        matches!(
            &got[..],
            [Resp::Failed {
                opcode: Opcode::Read,
                status: Status::BadRequest,
                ..
            }]
        ),
        "{got:?}"
    );

    // An add whose entry id is the reserved u64::MAX does not decode (its LAC encoding would
    // overflow): BadRequest, then close, and nothing is stored.
    let mut reserved = Vec::new();
    quire_wire::bookie::encode_request(
        &mut reserved,
        5,
        &Request::Add {
            recovery: false,
            master_key: KEY,
            entry: &entry(3, u64::MAX),
        },
    );
    let got = responses_until_close(addr, true, &reserved);
    assert!(
        matches!(
            &got[..],
            [Resp::Failed {
                status: Status::BadRequest,
                ..
            }]
        ),
        "{got:?}"
    );
    let (mut c, _) = Client::handshake(addr);
    assert_eq!(c.read_lac(3).status(), Status::NoSuchLedger);

    // A second Hello is refused without closing.
    let again = c.call(&Request::Hello {
        version_min: 1,
        version_max: 1,
    });
    assert_eq!(again.status(), Status::BadRequest);
    drop(c);

    // No common version: BadVersion, then close.
    let mut hello = Vec::new();
    quire_wire::bookie::encode_request(
        &mut hello,
        1,
        &Request::Hello {
            version_min: 7,
            version_max: 9,
        },
    );
    let got = responses_until_close(addr, false, &hello);
    assert!(
        matches!(
            &got[..],
            [Resp::Failed {
                status: Status::BadVersion,
                ..
            }]
        ),
        "{got:?}"
    );

    still_serving(addr, 2);
    bookie.shutdown().expect("clean shutdown");
}

#[test]
fn oversized_entry_in_a_valid_frame_is_too_large() {
    // Goal: an entry over the engine's size limit is refused with TooLarge and the connection
    // stays usable. Method: lower entry_size_bytes_max, add a bigger entry, then a small one.
    let dir = common::tempdir();
    let mut config = common::config(dir.path(), 1);
    config.engine.entry_size_bytes_max = 1024;
    let bookie = quire_bookie::Bookie::start(config).expect("bookie starts");
    let (mut c, _) = Client::handshake(bookie.addr());
    let big = quire_wire::entry::encode_entry(
        quire_wire::entry::EntryHeader {
            ledger: LedgerId(4),
            entry: quire_wire::EntryId(0),
            lac: None,
            length_bytes: 4096,
        },
        &[1u8; 4096],
    );
    assert_eq!(c.add(KEY, &big, false).status(), Status::TooLarge);
    assert_eq!(
        c.add(KEY, &entry(4, 0), false),
        Resp::Add {
            ledger: 4,
            entry: 0
        }
    );
    drop(c);
    bookie.shutdown().expect("clean shutdown");
}

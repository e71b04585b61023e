//! Goal: the bookie port's limits (issue 12, item 4): a connection that sends a partial header
//! and never completes its handshake is closed after `handshake_timeout`; a handshaken
//! connection with nothing in flight is closed after `idle_timeout`; connections beyond
//! `connections_max` are closed at once while the ones inside the limit keep working, and a
//! slot freed by a closed connection is usable again.
//! Method: a real one-shard bookie on loopback with short limits; raw TCP clients. A closed
//! connection is seen as EOF (or a reset) on read; the waits are bounded guards, not timings.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::{config, entry, tempdir, Client, Resp, KEY};
use quire_bookie::Bookie;

/// Whether the bookie closed `s` within `within` (EOF or an error other than a timeout).
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let deadline = Instant::now() + within;
    let mut b = [0u8; 256];
    while Instant::now() < deadline {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn partial_handshakes_and_idle_connections_are_closed() {
    let dir = tempdir();
    let mut c = config(dir.path(), 1);
    c.handshake_timeout = Duration::from_millis(500);
    c.idle_timeout = Duration::from_secs(2);
    let bookie = Bookie::start(c).expect("bookie starts");
    let addr = bookie.addr();

    // Three bytes of a frame length, then nothing.
    let mut partial = TcpStream::connect(addr).unwrap();
    partial.write_all(&[40, 0, 0]).unwrap();
    assert!(
        closed_within(&mut partial, Duration::from_secs(20)),
        "a partial header kept its connection open"
    );

    // A handshaken, working connection that then goes quiet.
    let (mut idle, _) = Client::handshake(addr);
    assert_eq!(
        idle.add(KEY, &entry(1, 0), false),
        Resp::Add {
            ledger: 1,
            entry: 0
        }
    );
    let raw = idle.stream();
    assert!(
        !closed_within(raw, Duration::from_millis(500)),
        "closed before its idle timeout"
    );
    assert!(
        closed_within(raw, Duration::from_secs(20)),
        "an idle connection stayed open"
    );
    bookie.shutdown().expect("clean shutdown");
}

#[test]
fn connections_over_the_cap_are_closed_at_once() {
    let dir = tempdir();
    let mut c = config(dir.path(), 1);
    c.connections_max = 4;
    let bookie = Bookie::start(c).expect("bookie starts");
    let addr = bookie.addr();
    let mut inside: Vec<Client> = (0..4).map(|_| Client::handshake(addr).0).collect();
    for _ in 0..3 {
        let mut over = TcpStream::connect(addr).unwrap();
        assert!(
            closed_within(&mut over, Duration::from_secs(20)),
            "a connection over the cap was kept"
        );
    }
    for (i, client) in inside.iter_mut().enumerate() {
        assert_eq!(
            client.add(KEY, &entry(2, i as u64), false),
            Resp::Add {
                ledger: 2,
                entry: i as u64
            },
            "connection {i} inside the cap"
        );
    }
    // Closing one frees its slot.
    drop(inside.pop());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut s = TcpStream::connect(addr).unwrap();
        if !closed_within(&mut s, Duration::from_millis(300)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the freed slot never became usable"
        );
    }
    drop(inside);
    bookie.shutdown().expect("clean shutdown");
}

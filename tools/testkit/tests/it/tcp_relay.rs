//! Goal: `TcpRelay` carries bytes both ways until cut; after `cut` the relayed connection ends
//! and new connections are closed at once, without the target seeing them.
//! Method: a real echo server on 127.0.0.1 behind the relay; echo through it, cut, then check
//! that the old connection reads EOF (or an error) and a new one is closed before any echo.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quire_testkit::TcpRelay;

fn echo_server() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

/// Reads until EOF or error, at most 5 s; returns the bytes read.
fn read_to_end_bounded(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

#[test]
fn relays_until_cut_then_refuses() {
    let (target, accepted) = echo_server();
    let relay = TcpRelay::start(target);
    let mut a = TcpStream::connect(relay.connect_string()).unwrap();
    a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let writer = {
        let mut a = a.try_clone().unwrap();
        let payload = payload.clone();
        std::thread::spawn(move || a.write_all(&payload).unwrap())
    };
    let mut echoed = vec![0u8; payload.len()];
    a.read_exact(&mut echoed).unwrap();
    writer.join().unwrap();
    assert!(echoed == payload, "the relay changed the bytes");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    relay.cut();
    let _ = a.write_all(b"more");
    assert!(
        read_to_end_bounded(&mut a).is_empty(),
        "a cut connection carries nothing more"
    );
    let mut b = TcpStream::connect(relay.connect_string()).unwrap();
    let _ = b.write_all(b"hello");
    assert!(
        read_to_end_bounded(&mut b).is_empty(),
        "no echo after the cut"
    );
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "a connection after the cut never reaches the target"
    );
}

#[test]
fn a_healed_relay_carries_new_connections_again() {
    // Goal: `heal` ends a cut for connections made after it (the chaos runner's partitions
    // end this way); the connection the cut shut down stays closed.
    let (target, accepted) = echo_server();
    let relay = TcpRelay::start(target);
    let mut a = TcpStream::connect(relay.connect_string()).unwrap();
    a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    relay.cut();
    assert!(relay.is_cut());
    let _ = a.write_all(b"cut");
    assert!(
        read_to_end_bounded(&mut a).is_empty(),
        "cut: nothing echoed"
    );
    relay.heal();
    assert!(!relay.is_cut());
    let mut b = TcpStream::connect(relay.connect_string()).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    b.write_all(b"healed").unwrap();
    let mut echoed = [0u8; 6];
    b.read_exact(&mut echoed).unwrap();
    assert_eq!(&echoed, b"healed");
    assert!(accepted.load(Ordering::SeqCst) >= 1);
}

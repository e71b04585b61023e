//! A loopback TCP relay a test can cut, to partition one client from a server on purpose, or
//! throttle, to make a server slow but alive.
//!
//! The client connects to [`TcpRelay::connect_string`] instead of the server; every accepted
//! connection is copied byte for byte to the target in both directions by two threads. After
//! [`TcpRelay::cut`], every relayed connection is shut down and every new one is closed at once,
//! so the client sees its connection drop and cannot get a new one: to the server the client
//! has gone silent; [`TcpRelay::heal`] lets new connections through again. A ZooKeeper session behind a cut relay therefore expires on the server after
//! its negotiated timeout (its ephemeral nodes are deleted), and the `zookeeper-client` crate
//! gives up reconnecting after 1.4 × that timeout and reports `SessionState::Expired`, which is
//! the deterministic way to test what happens when a session expires.
//!
//! [`TcpRelay::throttle`] limits every relayed connection, in each direction, to a number of
//! bytes per second (a slow disk or link behind a live server: BookKeeper #1390, Pulsar
//! #14861); `None` lifts the limit.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

#[derive(Debug, Default)]
struct Shared {
    /// Set by `cut`: live connections were shut down and new ones are closed at once.
    cut: AtomicBool,
    /// Set on drop: the accept loop returns.
    stopping: AtomicBool,
    /// Bytes per second each connection may carry in each direction; 0: unlimited.
    rate_bytes_per_sec: AtomicU64,
    /// Both sockets of every live relayed connection, by connection number (shut down by `cut`
    /// and on drop; removed when the connection ends, so a long test does not run out of
    /// file descriptors).
    sockets: Mutex<std::collections::HashMap<u64, Vec<TcpStream>>>,
    /// Number of the next relayed connection.
    next_connection: AtomicU64,
}

impl Shared {
    fn shut_down_all(&self) {
        let sockets = self.sockets.lock().unwrap_or_else(|p| p.into_inner());
        for s in sockets.values().flatten() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// A relay from a free port of 127.0.0.1 to `target`; stops (and shuts every connection down)
/// when dropped.
#[derive(Debug)]
pub struct TcpRelay {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl TcpRelay {
    /// Starts relaying connections made to a free port of 127.0.0.1 to `target`.
    ///
    /// # Panics
    /// This is a test helper: it panics when 127.0.0.1:0 cannot be bound.
    pub fn start(target: SocketAddr) -> TcpRelay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay on 127.0.0.1:0");
        let addr = listener.local_addr().expect("relay address");
        let shared = Arc::new(Shared::default());
        let acceptor = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("tcp-relay-accept".into())
                .spawn(move || accept_loop(&listener, target, &shared))
                .expect("spawn the relay thread")
        };
        TcpRelay {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// The relay's own address, `127.0.0.1:<port>`.
    pub fn connect_string(&self) -> String {
        self.addr.to_string()
    }

    /// Shuts down every relayed connection and closes every later one as soon as it is
    /// accepted, until [`TcpRelay::heal`].
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        self.shared.shut_down_all();
    }

    /// Ends a [`TcpRelay::cut`]: new connections are relayed again (the ones the cut shut down
    /// stay closed; the client reconnects, as after a healed network partition).
    pub fn heal(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }

    /// Whether the relay is cut now.
    pub fn is_cut(&self) -> bool {
        self.shared.cut.load(Ordering::SeqCst)
    }

    /// Limits every relayed connection, live and later ones, in each direction, to
    /// `bytes_per_sec` (read in chunks of a twentieth of it, each followed by the pause its size
    /// takes at that rate); `None` lifts the limit.
    pub fn throttle(&self, bytes_per_sec: Option<u64>) {
        self.shared
            .rate_bytes_per_sec
            .store(bytes_per_sec.unwrap_or(0), Ordering::SeqCst);
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.shut_down_all();
        // Wake the blocking accept with a connection of our own.
        let _ = TcpStream::connect(self.addr);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, target: SocketAddr, shared: &Arc<Shared>) {
    for incoming in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = incoming else { continue };
        if shared.cut.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(server) = TcpStream::connect(target) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else {
            continue;
        };
        let number = shared.next_connection.fetch_add(1, Ordering::SeqCst);
        {
            let mut sockets = shared.sockets.lock().unwrap_or_else(|p| p.into_inner());
            // A `cut` between the check above and this push must still reach this connection.
            if shared.cut.load(Ordering::SeqCst) {
                let _ = client.shutdown(Shutdown::Both);
                let _ = server.shutdown(Shutdown::Both);
                continue;
            }
            let clones = [&client, &server]
                .iter()
                .filter_map(|s| s.try_clone().ok())
                .collect();
            sockets.insert(number, clones);
        }
        let (up, down) = (shared.clone(), shared.clone());
        std::thread::spawn(move || copy_then_shut(client, server, &up, number));
        std::thread::spawn(move || copy_then_shut(server2, client2, &down, number));
    }
}

/// Copies `from` to `to` until either side ends, then shuts both down (so the other direction's
/// thread ends too).
fn copy_then_shut(mut from: TcpStream, mut to: TcpStream, shared: &Shared, number: u64) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let rate = shared.rate_bytes_per_sec.load(Ordering::SeqCst);
        let chunk = if rate == 0 {
            buf.len()
        } else {
            (rate / 20).clamp(1, buf.len() as u64) as usize
        };
        match from.read(&mut buf[..chunk]) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                if rate > 0 {
                    std::thread::sleep(Duration::from_secs_f64(n as f64 / rate as f64));
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
    shared
        .sockets
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&number);
}

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
//!
//! The finer faults of a network, as a relay of TCP byte streams can play them:
//!
//! - [`TcpRelay::cut_from`]: cut only the connections made by chosen processes (found by the
//!   connecting socket's inode in `/proc/net/tcp` and the processes' `/proc/PID/fd`), so that
//!   one proxy, or one peer bookie, loses a server that every other client still reaches: a
//!   pairwise partition behind a single advertised address.
//! - [`TcpRelay::stall`]: a one-way partition. Bytes in one direction are held (not read from
//!   the sender's socket, so its kernel buffers and then its writes block, as when a link drops
//!   every segment one way and TCP keeps retransmitting), while the other direction flows; lifting
//!   the stall delivers what was held, in order, as TCP does once the link is back.
//! - [`TcpRelay::delay`]: every chunk read is held this long before it is written on: added
//!   latency each way (chunks of one direction are serial, so a busy connection also carries
//!   at most 64 KiB per delay).
//! - [`TcpRelay::lossy`]: packet loss. A byte stream cannot lose bytes without breaking its
//!   framing, so loss is played as TCP shows it to the application: a lost chunk arrives late,
//!   after a retransmission timeout (200 ms, doubled for each loss in a row up to 1.6 s), and
//!   one lost chunk in eight resets the connection (both sockets shut down, as a stack that gave
//!   up retransmitting).

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// One direction of a relayed connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the connecting client to the server behind the relay (requests).
    ToServer,
    /// From the server back to the client (responses).
    ToClient,
}

#[derive(Debug, Default)]
struct Shared {
    /// Set by `cut`: live connections were shut down and new ones are closed at once.
    cut: AtomicBool,
    /// Processes whose connections are cut (`cut_from`); empty: none.
    cut_pids: Mutex<HashSet<u32>>,
    /// Per direction ([`Direction::ToServer`] first), whether its bytes are held.
    stalled: [AtomicBool; 2],
    /// Per direction, bytes read from a sender during a stall and held by the relay, not yet
    /// written on.
    held: [AtomicU64; 2],
    /// Milliseconds each chunk is held before it is written on; 0: none.
    delay_ms: AtomicU64,
    /// Chunks lost per thousand (`lossy`); 0: none.
    loss_permille: AtomicU32,
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

    /// Cuts the connections made by the processes `pids` (live ones are shut down, new ones
    /// closed at once), and only theirs; replaces the set of an earlier call, and an empty
    /// `pids` ends it. A process is matched by the inode of its connecting socket (Linux
    /// `/proc`; the relay runs as the same user as the processes or as root).
    pub fn cut_from(&self, pids: &[u32]) {
        let set: HashSet<u32> = pids.iter().copied().collect();
        *self
            .shared
            .cut_pids
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = set.clone();
        if set.is_empty() {
            return;
        }
        let sockets = self
            .shared
            .sockets
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for pair in sockets.values() {
            if pair.first().is_some_and(|c| connected_from(c, &set)) {
                for s in pair {
                    let _ = s.shutdown(Shutdown::Both);
                }
            }
        }
    }

    /// Holds (`true`) or releases (`false`) the bytes of every relayed connection, live and
    /// later ones, in direction `dir`: a one-way partition (see the module docs).
    pub fn stall(&self, dir: Direction, on: bool) {
        self.shared.stalled[dir as usize].store(on, Ordering::SeqCst);
    }

    /// Bytes of direction `dir` that a stall holds in the relay now (read from the sender, not
    /// yet written on): a test knows from it that a request was sent before it cuts.
    pub fn held_bytes(&self, dir: Direction) -> u64 {
        self.shared.held[dir as usize].load(Ordering::SeqCst)
    }

    /// Holds every chunk, each way, `delay` before writing it on; `None` ends it.
    pub fn delay(&self, delay: Option<Duration>) {
        let ms = delay.map_or(0, |d| d.as_millis() as u64);
        self.shared.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Loses `permille` chunks per thousand, each way (late after a retransmission timeout, and
    /// one loss in eight resets the connection: see the module docs); `None` ends it.
    pub fn lossy(&self, permille: Option<u32>) {
        let p = permille.unwrap_or(0).min(1000);
        self.shared.loss_permille.store(p, Ordering::SeqCst);
    }

    /// Ends every fault of the relay: [`TcpRelay::heal`], [`TcpRelay::cut_from`] of no process,
    /// no stall, throttle, delay or loss.
    pub fn heal_all(&self) {
        self.heal();
        self.cut_from(&[]);
        self.stall(Direction::ToServer, false);
        self.stall(Direction::ToClient, false);
        self.throttle(None);
        self.delay(None);
        self.lossy(None);
    }
}

/// Whether `client` (a socket the relay accepted) was connected by one of `pids`: its peer's
/// socket is found in `/proc/net/tcp` by its address and the relay's, and then among the
/// processes' open files by its inode. `false` when it cannot be told (no `/proc`).
fn connected_from(client: &TcpStream, pids: &HashSet<u32>) -> bool {
    let (Ok(peer), Ok(ours)) = (client.peer_addr(), client.local_addr()) else {
        return false;
    };
    let Some(inode) = socket_inode(peer, ours) else {
        return false;
    };
    let link = format!("socket:[{inode}]");
    pids.iter().any(|pid| {
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"));
        fds.into_iter()
            .flatten()
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == link.as_str()))
    })
}

/// The inode of the IPv4 socket whose local address is `local` and remote address `remote`
/// (`/proc/net/tcp`: addresses as hex of the address's bytes read as a native-endian u32, a
/// colon, the port in hex; the inode is the tenth field).
fn socket_inode(local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    let hex = |a: SocketAddr| match a {
        SocketAddr::V4(v4) => Some(format!(
            "{:08X}:{:04X}",
            u32::from_ne_bytes(v4.ip().octets()),
            v4.port()
        )),
        SocketAddr::V6(_) => None,
    };
    let (l, r) = (hex(local)?, hex(remote)?);
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 9 && f[1] == l && f[2] == r)
            .then(|| f[9].parse().ok())
            .flatten()
    })
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
        if shared.cut.load(Ordering::SeqCst) || from_cut_pid(&client, shared) {
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
        std::thread::spawn(move || {
            copy_then_shut(client, server, &up, number, Direction::ToServer)
        });
        std::thread::spawn(move || {
            copy_then_shut(server2, client2, &down, number, Direction::ToClient)
        });
    }
}

fn from_cut_pid(client: &TcpStream, shared: &Shared) -> bool {
    let pids = shared.cut_pids.lock().unwrap_or_else(|p| p.into_inner());
    !pids.is_empty() && connected_from(client, &pids)
}

/// Waits while direction `dir` is stalled; `false` when the connection ended meanwhile (cut,
/// relay stopping, or the other direction closed it).
fn wait_unstalled(shared: &Shared, number: u64, dir: Direction) -> bool {
    while shared.stalled[dir as usize].load(Ordering::SeqCst) {
        let live = shared
            .sockets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&number);
        if !live || shared.cut.load(Ordering::SeqCst) || shared.stopping.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Plays the loss of one chunk when the dice say so: the retransmission wait, `false` when the
/// connection is to be reset instead. `losses` counts the losses in a row.
fn play_loss(shared: &Shared, rng: &mut u64, losses: &mut u32) -> bool {
    let permille = u64::from(shared.loss_permille.load(Ordering::SeqCst));
    if permille == 0 || splitmix(rng) % 1000 >= permille {
        *losses = 0;
        return true;
    }
    if splitmix(rng).is_multiple_of(8) {
        return false;
    }
    std::thread::sleep(Duration::from_millis(200 << (*losses).min(3)));
    *losses += 1;
    true
}

/// SplitMix64, for the loss dice (seeded per connection and direction).
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Copies `from` to `to` (direction `dir` of connection `number`) until either side ends, then
/// shuts both down (so the other direction's thread ends too).
fn copy_then_shut(
    mut from: TcpStream,
    mut to: TcpStream,
    shared: &Shared,
    number: u64,
    dir: Direction,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut rng = number.wrapping_mul(2).wrapping_add(dir as u64);
    let mut losses = 0;
    loop {
        if !wait_unstalled(shared, number, dir) {
            break;
        }
        let rate = shared.rate_bytes_per_sec.load(Ordering::SeqCst);
        let chunk = if rate == 0 {
            buf.len()
        } else {
            (rate / 20).clamp(1, buf.len() as u64) as usize
        };
        match from.read(&mut buf[..chunk]) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let delay = shared.delay_ms.load(Ordering::SeqCst);
                if delay > 0 {
                    std::thread::sleep(Duration::from_millis(delay));
                }
                // A stall that began while this read waited holds what it read, too.
                let held = shared.stalled[dir as usize].load(Ordering::SeqCst);
                if held {
                    shared.held[dir as usize].fetch_add(n as u64, Ordering::SeqCst);
                }
                let go_on =
                    wait_unstalled(shared, number, dir) && play_loss(shared, &mut rng, &mut losses);
                if held {
                    shared.held[dir as usize].fetch_sub(n as u64, Ordering::SeqCst);
                }
                if !go_on || to.write_all(&buf[..n]).is_err() {
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

#[cfg(test)]
mod tests {
    // Real sockets and a real-clock wait for bytes that must not come.
    #![allow(clippy::disallowed_methods)]

    use super::*;
    use std::time::Instant;

    /// A server on 127.0.0.1 that echoes every connection's bytes back.
    fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut c) = conn else { return };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n @ 1..) = c.read(&mut buf) {
                        if c.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn connect(relay: &TcpRelay) -> TcpStream {
        let c = TcpStream::connect(relay.connect_string()).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(400)))
            .unwrap();
        c
    }

    /// One round trip of `msg`; `None` when nothing came back within the read timeout.
    fn echo(c: &mut TcpStream, msg: &[u8]) -> Option<Vec<u8>> {
        c.write_all(msg).ok()?;
        read_some(c)
    }

    fn read_some(c: &mut TcpStream) -> Option<Vec<u8>> {
        let mut buf = [0u8; 64];
        match c.read(&mut buf) {
            Ok(n) if n > 0 => Some(buf[..n].to_vec()),
            _ => None,
        }
    }

    #[test]
    fn a_one_way_stall_holds_one_direction_and_delivers_it_in_order_when_lifted() {
        // A server that says hello, then records what it receives.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let relay = TcpRelay::start(listener.local_addr().unwrap());
        relay.stall(Direction::ToServer, true);
        let mut c = connect(&relay);
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_millis(400)))
            .unwrap();
        c.write_all(b"request").unwrap();
        assert_eq!(read_some(&mut s), None, "the request is held one way");
        s.write_all(b"hello").unwrap();
        assert_eq!(
            read_some(&mut c).as_deref(),
            Some(&b"hello"[..]),
            "the other way flows"
        );
        relay.stall(Direction::ToServer, false);
        assert_eq!(read_some(&mut s).as_deref(), Some(&b"request"[..]));

        relay.stall(Direction::ToClient, true);
        s.write_all(b"reply").unwrap();
        assert_eq!(read_some(&mut c), None, "the reply is held");
        c.write_all(b"more").unwrap();
        assert_eq!(read_some(&mut s).as_deref(), Some(&b"more"[..]));
        relay.heal_all();
        assert_eq!(read_some(&mut c).as_deref(), Some(&b"reply"[..]));
    }

    #[test]
    fn a_delay_holds_each_chunk_each_way() {
        let relay = TcpRelay::start(echo_server());
        let mut c = connect(&relay);
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        relay.delay(Some(Duration::from_millis(150)));
        let t = Instant::now();
        assert_eq!(echo(&mut c, b"x").as_deref(), Some(&b"x"[..]));
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
        relay.delay(None);
        assert_eq!(echo(&mut c, b"y").as_deref(), Some(&b"y"[..]));
    }

    #[test]
    fn a_cut_from_a_process_cuts_only_its_connections() {
        let relay = TcpRelay::start(echo_server());
        let mut c = connect(&relay);
        assert_eq!(echo(&mut c, b"a").as_deref(), Some(&b"a"[..]));
        // Another process (pid 1 is never this test): this connection is untouched.
        relay.cut_from(&[1]);
        assert_eq!(echo(&mut c, b"b").as_deref(), Some(&b"b"[..]));
        assert_eq!(echo(&mut connect(&relay), b"c").as_deref(), Some(&b"c"[..]));
        // This process: its live connection is shut down and a new one gets nothing.
        relay.cut_from(&[std::process::id()]);
        assert_eq!(echo(&mut c, b"d"), None);
        assert_eq!(echo(&mut connect(&relay), b"e"), None);
        relay.cut_from(&[]);
        assert_eq!(echo(&mut connect(&relay), b"f").as_deref(), Some(&b"f"[..]));
    }

    #[test]
    fn loss_makes_chunks_late_and_resets_connections() {
        let relay = TcpRelay::start(echo_server());
        relay.lossy(Some(1000));
        let mut c = connect(&relay);
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let t = Instant::now();
        let mut echoed = 0;
        for _ in 0..100 {
            match echo(&mut c, b"z") {
                Some(_) => echoed += 1,
                None => break,
            }
        }
        // Every chunk is lost: each one that came back waited a retransmission timeout each
        // way, and one loss in eight resets the connection long before a hundred round trips.
        assert!(echoed < 100, "no reset in 100 round trips");
        assert!(
            t.elapsed() >= Duration::from_millis(400 * echoed),
            "{echoed} echoes in {:?}",
            t.elapsed()
        );
        relay.lossy(None);
        assert_eq!(
            echo(&mut connect(&relay), b"ok").as_deref(),
            Some(&b"ok"[..])
        );
    }
}

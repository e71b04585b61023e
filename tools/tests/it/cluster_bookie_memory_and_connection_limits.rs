//! Goal: a hostile client on loopback can neither grow a bookie's memory with partial frames
//! nor lock other clients out by holding connections (issue 12 item 4). (1) 100 handshaken
//! connections each announcing a 4 MiB frame and sending all of it but the last KiB keep the
//! resident size of the real `quire bookie` process (VmRSS in /proc/PID/status) below its idle
//! size plus `request_pool_bytes` (64 MiB here) plus a 64 MiB margin. (2) 6,000 connections
//! opened from 127.0.0.2 and held leave the bookie with at most `connections_per_ip_max`
//! (1024) of them open, and a client from 127.0.0.1 is still served (handshake, add, read).
//!
//! Method: real ZooKeeper and one `quire bookie` child process (one shard); RLIMIT_NOFILE of
//! the test process (inherited by the bookie) raised to its hard limit, and half of the 6,000
//! connections held by a helper process (this test binary) so that neither needs more than
//! about 3,000 descriptors; raw TCP clients speaking the bookie protocol. The bookie's open descriptors are counted in /proc/PID/fd. Without the
//! pool the bookie zero-fills a 4 MiB buffer per announced frame (over 400 MiB); without the
//! per-address limit it keeps 4096 (`connections_max`) of the 6,000 and the 127.0.0.1 client
//! is closed at once. Any count above `connections_max` tells the per-address limit from the
//! global one; 6,000 keeps room to spare and takes about 20 s of the CI's two cores.

use std::time::{Duration, Instant};

use quire_testkit::harness::cluster::{runtime, Cluster};
use quire_testkit::harness::wire::{create_ledger_metadata, Answer, Wire};
use quire_wire::bookie::{encode_request, Opcode, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const MIB: u64 = 1024 * 1024;
const REQUEST_POOL_BYTES: u64 = 64 * MIB;
const MARGIN_BYTES: u64 = 64 * MIB;
const PARTIAL_FRAMES: usize = 100;
const FRAME_BYTES: usize = 4 << 20;
const HELD_CONNECTIONS: usize = 6_000;
const CONNECTIONS_PER_IP_MAX: usize = 1024;

/// The helper test's name as the test harness knows it: its path in the test binary, without
/// the binary's own crate name (`cluster_bookie_memory_and_connection_limits::hold_connections_helper`).
fn helper_test_name() -> String {
    let module = module_path!();
    let module = module.split_once("::").map_or(module, |(_, m)| m);
    format!("{module}::hold_connections_helper")
}

/// VmRSS of process `pid`, in bytes.
fn rss_bytes(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// Open descriptors of process `pid`.
fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("read fd dir")
        .count()
}

/// Raises the soft RLIMIT_NOFILE of this process (inherited by its children) to the hard one;
/// returns it.
fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read or write the struct we pass, nothing else.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    lim.rlim_cur
}

/// Connections held from 127.0.0.2 by this process; the rest of [`HELD_CONNECTIONS`] are held
/// by a helper process (this binary running [`hold_connections_helper`]), since one process may
/// not open many thousands of descriptors under the hard limit of machines such as CI containers.
const HELD_HERE: usize = HELD_CONNECTIONS / 2;

/// Opens `n` connections from 127.0.0.2 to `target`, at most 512 connecting at once; returns
/// the ones established.
async fn open_from_127_0_0_2(target: std::net::SocketAddr, n: usize) -> Vec<TcpStream> {
    let opened = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        if tasks.len() >= 512 {
            tasks.join_next().await;
        }
        let opened = opened.clone();
        tasks.spawn(async move {
            let s = TcpSocket::new_v4().unwrap();
            s.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            if let Ok(Ok(c)) = tokio::time::timeout(Duration::from_secs(5), s.connect(target)).await
            {
                opened.lock().unwrap().push(c);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let v = std::mem::take(&mut *opened.lock().unwrap());
    v
}

/// Not a test of its own: the helper process of the test below. With `QUIRE_HOLD_TARGET`
/// set it opens `QUIRE_HOLD_COUNT` connections from 127.0.0.2, prints `held N`, and holds
/// them until its stdin closes.
#[test]
#[ignore]
fn hold_connections_helper() {
    let (Ok(target), Ok(count)) = (
        std::env::var("QUIRE_HOLD_TARGET"),
        std::env::var("QUIRE_HOLD_COUNT"),
    ) else {
        return;
    };
    raise_nofile();
    let rt = runtime();
    let held = rt.block_on(open_from_127_0_0_2(
        target.parse().unwrap(),
        count.parse().unwrap(),
    ));
    println!("held {}", held.len());
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
    drop(held);
}

/// One request and its answer's whole frame (length field included).
async fn exchange(sock: &mut TcpStream, request: &Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(&mut out, 1, request);
    sock.write_all(&out).await.unwrap();
    let mut len = [0u8; 4];
    sock.read_exact(&mut len).await.unwrap();
    let mut frame = len.to_vec();
    frame.resize(4 + u32::from_le_bytes(len) as usize, 0);
    sock.read_exact(&mut frame[4..]).await.unwrap();
    frame
}

/// A connection that passed the handshake with the cluster secret (a legitimate client).
async fn handshaken(addr: &str) -> TcpStream {
    use quire_wire::bookie::{decode_response, Response};
    use quire_wire::frame::decode_frame;
    let secret = quire_testkit::harness::test_cluster_secret();
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let hello = exchange(
        &mut sock,
        &Request::Hello {
            version_min: 2,
            version_max: 2,
        },
    )
    .await;
    let (frame, _) = decode_frame(&hello, u32::MAX).unwrap().unwrap();
    let Ok(Response::Hello {
        auth_nonce: Some(server_nonce),
        ..
    }) = decode_response(&frame)
    else {
        panic!("hello refused: {:?}", decode_response(&frame));
    };
    let client_nonce = quire_wire::auth::new_nonce().unwrap();
    let auth = exchange(
        &mut sock,
        &Request::Auth {
            client_nonce,
            proof: secret.client_proof(&server_nonce, &client_nonce),
        },
    )
    .await;
    let (frame, _) = decode_frame(&auth, u32::MAX).unwrap().unwrap();
    assert!(
        matches!(decode_response(&frame), Ok(Response::Auth { .. })),
        "auth refused"
    );
    sock
}

#[test]
fn partial_frames_and_held_connections_leave_the_bookie_bounded_and_serving() {
    let nofile = raise_nofile();
    assert!(nofile as usize > HELD_HERE + 1000, "RLIMIT_NOFILE {nofile}");
    let cluster = Cluster::start();
    let pool = REQUEST_POOL_BYTES.to_string();
    let port = quire_testkit::free_port();
    let bookie = cluster.start_bookie_with(0, port, &["--request-pool-bytes", &pool]);
    cluster.wait_bookies("1 bookie", |l| l.contains("1 bookies registered"));
    let pid = bookie.pid();
    let listen = format!("127.0.0.1:{port}");
    // The bookie binds keys only for ledgers the metadata store holds.
    runtime().block_on(async {
        let store = cluster.zk_store().await;
        for id in [9, 10] {
            create_ledger_metadata(&store, id, std::slice::from_ref(&listen)).await;
        }
    });
    // Warm up: an add and a read on a working connection.
    let mut good = Wire::connect(&listen);
    assert_eq!(good.add(9, 0, false), Answer::Ok);
    assert!(matches!(good.read(9, 0), Answer::Data(_)));
    drop(good);
    let idle = rss_bytes(pid);
    let bound = idle + REQUEST_POOL_BYTES + MARGIN_BYTES;
    let rt = runtime();
    rt.block_on(async {
        // (1) 100 partial 4 MiB frames.
        let mut partial = vec![0u8; FRAME_BYTES - 1024];
        partial[..4].copy_from_slice(&((FRAME_BYTES - 4) as u32).to_le_bytes());
        partial[4] = Opcode::Add as u8;
        let partial = std::sync::Arc::new(partial);
        let mut held = Vec::new();
        for _ in 0..PARTIAL_FRAMES {
            let sock = handshaken(&listen).await;
            let partial = partial.clone();
            held.push(tokio::spawn(async move {
                let mut sock = sock;
                let _ = sock.write_all(&partial).await;
                std::future::pending::<()>().await;
                drop(sock);
            }));
        }
        let start = Instant::now();
        let mut peak = 0;
        while start.elapsed() < Duration::from_secs(8) {
            peak = peak.max(rss_bytes(pid));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "bookie VmRSS idle {} MiB, peak with {PARTIAL_FRAMES} partial frames {} MiB, bound {} MiB",
            idle / MIB,
            peak / MIB,
            bound / MIB
        );
        assert!(
            peak <= bound,
            "bookie VmRSS peaked at {} MiB, above the bound of {} MiB",
            peak / MIB,
            bound / MIB
        );
        for h in held {
            h.abort();
        }

        // (2) 6,000 connections from 127.0.0.2, held.
        let target: std::net::SocketAddr = listen.parse().unwrap();
        let fds_before = open_fds(pid);
        let started = Instant::now();
        let mut helper = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", &helper_test_name(), "--nocapture"])
            .env("QUIRE_HOLD_TARGET", &listen)
            .env("QUIRE_HOLD_COUNT", (HELD_CONNECTIONS - HELD_HERE).to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the helper");
        let held_here = open_from_127_0_0_2(target, HELD_HERE).await;
        // Read the helper's output to its end (so its test harness never writes to a closed
        // pipe); its `held N` line comes through the channel.
        let helper_out = std::io::BufReader::new(helper.stdout.take().unwrap());
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in helper_out.lines().map_while(Result::ok) {
                if let Some(n) = line.strip_prefix("held ").and_then(|n| n.parse::<usize>().ok()) {
                    let _ = held_tx.send(n);
                }
            }
        });
        let held_there = tokio::task::spawn_blocking(move || {
            held_rx
                .recv_timeout(Duration::from_secs(120))
                .expect("the helper reports its connections")
        })
        .await
        .unwrap();
        let connected = held_here.len() + held_there;
        let fds_held = open_fds(pid);
        eprintln!(
            "{connected} of {HELD_CONNECTIONS} connections from 127.0.0.2 established in {:?}; \
             bookie descriptors {fds_before} before, {fds_held} while they are held",
            started.elapsed()
        );
        assert!(connected > CONNECTIONS_PER_IP_MAX * 2, "only {connected} connected");
        assert!(
            fds_held <= fds_before + CONNECTIONS_PER_IP_MAX + 16,
            "the bookie holds {fds_held} descriptors ({fds_before} before)"
        );
        // A client from 127.0.0.1 is served meanwhile.
        let listen2 = listen.clone();
        tokio::task::spawn_blocking(move || {
            let mut w = Wire::connect(&listen2);
            assert_eq!(w.add(10, 0, false), Answer::Ok);
            assert!(matches!(w.read(10, 0), Answer::Data(_)));
        })
        .await
        .expect("a client from 127.0.0.1 is served while 127.0.0.2 holds connections");
        drop(held_here);
        drop(helper.stdin.take());
        let _ = helper.wait();
    });
    bookie.stop();
}

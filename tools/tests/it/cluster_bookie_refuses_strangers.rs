//! Goal: a stranger who reaches a bookie port without the cluster secret can neither add, read
//! nor fence, on a sandbox and on a cluster of `quire bookie` processes (issue 24 item 1), and
//! nothing it sent changes the bookie's state; the cluster's own processes (proxy, admin
//! commands) hold the secret and work; `quire bookie` refuses to start without one.
//!
//! Method: real processes on loopback (a `quire sandbox`; real ZooKeeper and three `quire
//! bookie` processes with a ledger written by a client holding the secret). The stranger is a
//! raw TCP client written from docs/protocol.md: a version-1 Hello then Read, Add (to the next
//! ledger id, with its own key) or Fence; the same without any Hello; a version-2 Hello without
//! Auth; and an Auth whose proof is made from another secret. Each must be answered with a
//! refusal (`BadVersion` or `Unauthorized`) and a closed connection. Then a client with the
//! secret reads the stranger's ledger (none), adds to the fenced-at ledger (still taken) and
//! reads the real entries back. Before the cluster secret, the version-1 stranger's read
//! returned the entry, its add bound its key to the next ledger id, and its fence fenced the
//! writer's ledger.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use quire_testkit::harness::cluster::{run, Cluster};
use quire_testkit::harness::wire::{Answer, Wire};
use quire_wire::auth::ClusterSecret;
use quire_wire::bookie::{decode_response, encode_request, Request, Response, Status};
use quire_wire::frame::decode_frame;
use quire_wire::{EntryId, LedgerId, MasterKey};

/// The stranger's own ledger key.
const STRANGER_KEY: MasterKey = MasterKey([0x66; 20]);

/// A raw client that sends requests one at a time and records what comes back.
struct Stranger {
    conn: TcpStream,
    buf: Vec<u8>,
    next_id: u64,
}

/// One answer the stranger got: its status and the Hello nonce if any.
#[derive(Debug)]
struct Got {
    status: Status,
    nonce: Option<[u8; 32]>,
}

impl Stranger {
    fn connect(addr: &str) -> Stranger {
        let conn = TcpStream::connect(addr).expect("connect");
        conn.set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        Stranger {
            conn,
            buf: Vec::new(),
            next_id: 1,
        }
    }

    /// Sends `request`; its answer, or `None` when the bookie closed instead.
    fn call(&mut self, request: &Request<'_>) -> Option<Got> {
        let mut out = Vec::new();
        encode_request(&mut out, self.next_id, request);
        self.next_id += 1;
        if self.conn.write_all(&out).is_err() {
            return None;
        }
        loop {
            if let Some((frame, used)) = decode_frame(&self.buf, u32::MAX).expect("frame") {
                let status = Status::from_u16(frame.header.status).expect("status");
                let nonce = match decode_response(&frame) {
                    Ok(Response::Hello { auth_nonce, .. }) => auth_nonce,
                    _ => None,
                };
                self.buf.drain(..used);
                return Some(Got { status, nonce });
            }
            let mut chunk = [0u8; 64 * 1024];
            match self.conn.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Whether the bookie closed the connection (EOF or reset) without sending more.
    fn closed(&mut self) -> bool {
        let mut chunk = [0u8; 1024];
        matches!(self.conn.read(&mut chunk), Ok(0) | Err(_)) && self.buf.is_empty()
    }
}

/// Entry 0 of `ledger`, as a writer would build it.
fn entry(ledger: u64, payload: &[u8]) -> Vec<u8> {
    quire_wire::entry::encode_entry(
        quire_wire::entry::EntryHeader {
            ledger: LedgerId(ledger),
            entry: EntryId(0),
            lac: None,
            length_bytes: payload.len() as u64,
        },
        payload,
    )
}

/// Runs every stranger against the bookie at `addr`: `ledger` holds entry 0 of a legitimate
/// writer, `next_ledger` is an id no ledger has yet.
fn strangers_are_refused(addr: &str, ledger: u64, next_ledger: u64) {
    let stranger_entry = entry(next_ledger, b"the stranger's entry");
    let requests = [
        (
            "read",
            Request::Read {
                ledger: LedgerId(ledger),
                entry: Some(EntryId(0)),
                fence: None,
            },
        ),
        (
            "add",
            Request::Add {
                recovery: false,
                master_key: STRANGER_KEY,
                entry: &stranger_entry,
            },
        ),
        (
            "fence",
            Request::Fence {
                ledger: LedgerId(ledger),
                master_key: STRANGER_KEY,
            },
        ),
    ];
    for (what, request) in &requests {
        // A version-1 client, as every client was before the cluster secret.
        let mut s = Stranger::connect(addr);
        let hello = s.call(&Request::Hello {
            version_min: 1,
            version_max: 1,
        });
        let after = s.call(request);
        assert!(
            matches!(
                &hello,
                Some(Got {
                    status: Status::BadVersion,
                    ..
                })
            ) && after.is_none(),
            "bookie {addr}: a version-1 stranger's {what} got Hello {hello:?}, then {after:?}"
        );

        // No Hello at all.
        let mut s = Stranger::connect(addr);
        let got = s.call(request);
        assert!(
            matches!(
                &got,
                Some(Got {
                    status: Status::Unauthorized,
                    ..
                })
            ) && s.closed(),
            "bookie {addr}: a stranger's {what} without Hello got {got:?}"
        );

        // A version-2 Hello, then the request instead of Auth.
        let mut s = Stranger::connect(addr);
        let hello = s.call(&Request::Hello {
            version_min: 2,
            version_max: 2,
        });
        assert!(
            matches!(
                &hello,
                Some(Got {
                    status: Status::Ok,
                    nonce: Some(_)
                })
            ),
            "{hello:?}"
        );
        let got = s.call(request);
        assert!(
            matches!(
                &got,
                Some(Got {
                    status: Status::Unauthorized,
                    ..
                })
            ) && s.closed(),
            "bookie {addr}: a stranger's {what} after Hello without Auth got {got:?}"
        );
    }

    // A proof made from another secret.
    let wrong = ClusterSecret::generate().unwrap();
    let mut s = Stranger::connect(addr);
    let hello = s
        .call(&Request::Hello {
            version_min: 2,
            version_max: 2,
        })
        .expect("hello answer");
    let server_nonce = hello.nonce.expect("a nonce");
    let client_nonce = [1u8; 32];
    let got = s.call(&Request::Auth {
        client_nonce,
        proof: wrong.client_proof(&server_nonce, &client_nonce),
    });
    assert!(
        matches!(
            &got,
            Some(Got {
                status: Status::Unauthorized,
                ..
            })
        ) && s.closed(),
        "bookie {addr}: a wrong proof got {got:?}"
    );
}

/// Entry 0 of `ledger` as stored on `addr`, read with the secret. An add is acknowledged once
/// Qa bookies have it, so a bookie of the write set beyond them may get it a moment later (a
/// loaded machine: "NoSuchEntry" seen once); it is read again for up to 10 s.
fn stored_entry_0(addr: &str, secret: &ClusterSecret, ledger: u64) -> Vec<u8> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match Wire::connect_with(addr, secret).read(ledger, 0) {
            Answer::Data(d) => return d,
            Answer::Failed(Status::NoSuchEntry) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => panic!("bookie {addr}: entry 0 of ledger {ledger}: {other:?}"),
        }
    }
}

/// With the secret: the stranger's ledger does not exist on `addr`, and `ledger` still holds
/// `first` at entry 0.
fn state_unchanged(
    addr: &str,
    secret: &ClusterSecret,
    ledger: u64,
    next_ledger: u64,
    first: &[u8],
) {
    let mut w = Wire::connect_with(addr, secret);
    assert_eq!(
        w.read(next_ledger, 0),
        Answer::Failed(Status::NoSuchLedger),
        "bookie {addr} holds the stranger's ledger {next_ledger}"
    );
    assert_eq!(
        w.read(ledger, 0),
        Answer::Data(first.to_vec()),
        "bookie {addr}, ledger {ledger}"
    );
}

#[test]
fn strangers_on_a_cluster_bookie_port_can_neither_add_read_nor_fence() {
    let cluster = Cluster::start();
    let ports: Vec<u16> = (0..3).map(|_| quire_testkit::free_port()).collect();
    // Bookie 0 serves its metrics, to count the refusals.
    let metrics = format!("127.0.0.1:{}", quire_testkit::free_port());
    let bookies: Vec<_> = ports
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            if i == 0 {
                cluster.start_bookie_with(i, p, &["--metrics-listen", &metrics])
            } else {
                cluster.start_bookie(i, p)
            }
        })
        .collect();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();

    // `quire bookie` without a secret does not start, and says which setting is missing.
    let mut args = cluster.bookie_args(3, quire_testkit::free_port());
    let at = args
        .iter()
        .position(|a| a == "--cluster-secret-file")
        .unwrap();
    args.drain(at..at + 2);
    let out = run(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("missing setting cluster_secret_file"),
        "{err}"
    );

    // A legitimate writer (the secret, E=3 Qw=3 Qa=3): ledger L with entry 0.
    let rt = quire_testkit::harness::cluster::runtime();
    let store: std::sync::Arc<dyn quire_metadata::MetadataStore> =
        std::sync::Arc::new(rt.block_on(cluster.zk_store()));
    let bk = quire_ledger::BookKeeper::new(
        store.clone(),
        quire_ledger::ClientConfig {
            cluster_secret: Some(cluster.secret),
            ..quire_ledger::ClientConfig::default()
        },
    );
    let options = quire_ledger::LedgerOptions {
        ensemble_size: 3,
        write_quorum: 3,
        // Qa = 3: entry 0 is on every bookie once the add returns (the test reads it there).
        ack_quorum: 3,
        password: b"pw".to_vec(),
        custom: Default::default(),
    };
    let payload = b"the writer's entry 0";
    let writer = rt.block_on(bk.create_ledger(options.clone())).unwrap();
    rt.block_on(async { writer.add(payload.to_vec()).await })
        .unwrap();
    let ledger = writer.id().0;
    let next_ledger = ledger + 1;

    let firsts: Vec<Vec<u8>> = addrs
        .iter()
        .map(|a| stored_entry_0(a, &cluster.secret, ledger))
        .collect();
    for addr in &addrs {
        strangers_are_refused(addr, ledger, next_ledger);
    }
    for (addr, first) in addrs.iter().zip(&firsts) {
        state_unchanged(addr, &cluster.secret, ledger, next_ledger, first);
    }
    // Not fenced: the writer goes on. And the next ledger id, which the stranger tried to
    // claim with its key, serves the next writer.
    rt.block_on(async { writer.add(b"entry 1".to_vec()).await })
        .unwrap();
    rt.block_on(writer.close()).unwrap();
    let next = rt.block_on(bk.create_ledger(options)).unwrap();
    rt.block_on(async { next.add(b"the next ledger".to_vec()).await })
        .unwrap();
    eprintln!("ledgers {ledger} and {} written", next.id().0);

    // A client with another secret is refused by the bookies, with a message naming the
    // cause; the admin command with the cluster's secret is answered.
    let (other_file, _) = {
        let dir = cluster.dir.path().join("other");
        let secret = ClusterSecret::generate().unwrap();
        (
            quire_testkit::cluster_secret::write_cluster_secret(&dir, &secret),
            secret,
        )
    };
    let info = |file: Option<&std::path::Path>| {
        let mut a = vec!["bookie".to_string(), "info".into(), addrs[0].clone()];
        if let Some(f) = file {
            a.extend(quire_testkit::cluster_secret::cluster_secret_flags(f));
        }
        run(&a)
    };
    let out = info(Some(&cluster.secret_file));
    assert!(
        out.status.success(),
        "bookie info with the secret: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (what, file) in [
        ("no secret", None),
        ("another secret", Some(other_file.as_path())),
    ] {
        let out = info(file);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("cluster secret"),
            "bookie info with {what}: {err}"
        );
    }

    // Bookie 0 counted each refusal: per request (read, add, fence) a version-1 Hello, no
    // Hello and no Auth, then a wrong proof; and `bookie info` without the secret and with
    // another one.
    let (status, text) = quire_testkit::harness::http_get(&metrics, "/metrics");
    assert_eq!(status, 200);
    assert_eq!(
        quire_testkit::harness::metric_sum(&text, "bookie_AUTH_FAILURES_total", &[]),
        12.0,
        "{text}"
    );

    // The bookies logged the refusals with the stranger's address.
    std::thread::sleep(Duration::from_millis(200));
    for b in &bookies {
        let log = b.stderr.lock().unwrap().clone();
        assert!(
            log.contains("refused a connection without the cluster secret")
                && log.contains("127.0.0.1"),
            "{}: {log}",
            b.name
        );
    }
    drop(bookies);
}

#[test]
fn strangers_on_a_sandbox_bookie_port_can_neither_add_read_nor_fence() {
    use std::os::unix::fs::PermissionsExt;
    let dir = quire_testkit::harness::temp_dir();
    let data = dir.path().join("sandbox");
    let sandbox = quire_testkit::harness::Sandbox::start(&data, &[]);
    // The secret the sandbox made at its first start, private to its owner.
    let secret_file = data.join("secrets/cluster-secret");
    let mode = std::fs::metadata(&secret_file)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "{}", secret_file.display());
    let secret = quire_testkit::harness::sandbox_cluster_secret(&data);

    let out = sandbox.quire_stdin(&["write", "s/secret"], b"first\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The stream's ledger and its ensemble, from the sandbox's metadata.
    let text = std::fs::read(data.join("metadata/metadata.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let ledgers = doc["ledgers"].as_object().unwrap();
    let ledger: u64 = ledgers
        .keys()
        .map(|k| k.parse::<u64>().unwrap())
        .max()
        .unwrap();
    let meta: quire_metadata::LedgerMetadata =
        serde_json::from_value(ledgers[&ledger.to_string()][0].clone()).unwrap();
    let ensemble: Vec<String> = meta.fragments[0]
        .bookies
        .iter()
        .map(|b| b.0.clone())
        .collect();
    let next_ledger = ledger + 1;

    // What a legitimate reader sees at entry 0, read before the strangers come.
    for addr in &ensemble {
        let first = stored_entry_0(addr, &secret, ledger);
        strangers_are_refused(addr, ledger, next_ledger);
        state_unchanged(addr, &secret, ledger, next_ledger, &first);
    }
    // Not fenced: the stream goes on in the same ledger, and reads back whole.
    let out = sandbox.quire_stdin(&["write", "s/secret"], b"second\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = sandbox.quire(&["read", "s/secret"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"first\nsecond\n");
    sandbox.stop();
}

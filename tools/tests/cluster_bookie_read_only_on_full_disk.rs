//! Goal: read-only mode of a real `quire bookie` process (BookKeeper's `diskUsageThreshold`,
//! `LedgerDirsMonitor`, `available/readonly` registration). When its ledger disk passes the
//! usage threshold the bookie moves its registration to `readonly/`, answers adds (to an
//! existing or a new ledger) `ReadOnly`, and keeps serving reads, fences and recovery adds; a
//! bookie whose disk is completely full starts again after a crash, comes up read-only and
//! serves reads; once space is freed it is writable again, registered under `available/`, and
//! takes adds.
//! Method: real ZooKeeper (quire-testkit), one `quire bookie` child on 127.0.0.1 whose ledger
//! directory is a 32 MiB loop-mounted ext4 image (needs root, as engine/tests/full_disk.rs) and
//! whose disk monitor measures every 200 ms; its journal is on /tmp. The image is filled to
//! 100 % by a filler file, and the filler removed later. Requests go over the bookie wire
//! protocol; the registration is read with `quire bookie list --json`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use quire_testkit::loop_mount::{fill_file, LoopMount};
use quire_wire::bookie::{decode_response, encode_request, Request, Response, Status};
use quire_wire::entry::{encode_entry, EntryHeader};
use quire_wire::frame::{decode_frame, FRAME_SIZE_BYTES_MAX_DEFAULT};
use quire_wire::{EntryId, LedgerId, MasterKey};

const KEY: MasterKey = MasterKey([7; 20]);
/// A guard against a hang, not a timing check.
const WAIT_MAX: Duration = Duration::from_secs(60);

/// What a bookie answered, reduced to what the test checks.
#[derive(Debug, PartialEq)]
enum Answer {
    Ok,
    Data(Vec<u8>),
    Failed(Status),
}

/// One handshaken bookie wire connection.
struct Wire {
    conn: TcpStream,
    buf: Vec<u8>,
    next_id: u64,
}

impl Wire {
    fn connect(addr: &str) -> Wire {
        let conn = TcpStream::connect(addr).expect("connect to the bookie");
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut w = Wire {
            conn,
            buf: Vec::new(),
            next_id: 1,
        };
        let hello = w.call(&Request::Hello {
            version_min: 1,
            version_max: 1,
        });
        assert_eq!(hello, Answer::Ok, "handshake");
        w
    }

    fn call(&mut self, req: &Request<'_>) -> Answer {
        let mut out = Vec::new();
        encode_request(&mut out, self.next_id, req);
        self.next_id += 1;
        self.conn.write_all(&out).expect("send");
        loop {
            if let Some((frame, used)) =
                decode_frame(&self.buf, FRAME_SIZE_BYTES_MAX_DEFAULT).expect("frame")
            {
                let answer = match decode_response(&frame).expect("response") {
                    Response::Read { data, .. } => Answer::Data(data.to_vec()),
                    Response::Failed { status, .. } => Answer::Failed(status),
                    _ => Answer::Ok,
                };
                self.buf.drain(..used);
                return answer;
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = self.conn.read(&mut chunk).expect("receive");
            assert!(n > 0, "bookie closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn add(&mut self, ledger: u64, entry: u64, recovery: bool) -> Answer {
        let data = entry_bytes(ledger, entry);
        self.call(&Request::Add {
            recovery,
            master_key: KEY,
            entry: &data,
        })
    }

    fn read(&mut self, ledger: u64, entry: u64) -> Answer {
        self.call(&Request::Read {
            ledger: LedgerId(ledger),
            entry: Some(EntryId(entry)),
            fence: None,
        })
    }
}

fn entry_bytes(ledger: u64, entry: u64) -> Vec<u8> {
    let payload = format!("ledger {ledger} entry {entry} ")
        .repeat(100)
        .into_bytes();
    encode_entry(
        EntryHeader {
            ledger: LedgerId(ledger),
            entry: EntryId(entry),
            lac: entry.checked_sub(1).map(EntryId),
            length_bytes: payload.len() as u64 * (entry + 1),
        },
        &payload,
    )
}

/// The `read_only` flag of the only registered bookie, `None` while none is registered.
fn registered_read_only(cluster: &Cluster) -> Option<bool> {
    let text = cluster.admin_ok(&["bookie", "list", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    listed.as_array()?.first()?["read_only"].as_bool()
}

fn wait_for(what: &str, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT_MAX;
    while !pred() {
        assert!(Instant::now() < deadline, "never saw: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn full_ledger_disk_makes_the_bookie_read_only_until_space_is_freed() {
    let cluster = Cluster::start();
    let mount = LoopMount::new_at(32 << 20, &cluster.ledger_dir(0));
    let port = quire_testkit::free_port();
    let addr = format!("127.0.0.1:{port}");
    let flags = ["--disk-check-interval-ms", "200"];
    let bookie = cluster.start_bookie_with(0, port, &flags);
    wait_for("the bookie registered writable", || {
        registered_read_only(&cluster) == Some(false)
    });

    let mut w = Wire::connect(&addr);
    for e in 0..10 {
        assert_eq!(w.add(1, e, false), Answer::Ok, "add 1/{e} on a roomy disk");
    }

    // Past the threshold (here: 100 %): read-only, registered under readonly/.
    let filler = mount.path().join("filler");
    fill_file(&filler);
    wait_for("the registration moved to readonly/", || {
        registered_read_only(&cluster) == Some(true)
    });
    assert_eq!(w.add(1, 10, false), Answer::Failed(Status::ReadOnly));
    assert_eq!(
        w.add(2, 0, false),
        Answer::Failed(Status::ReadOnly),
        "new ledger"
    );
    for e in 0..10 {
        assert_eq!(w.read(1, e), Answer::Data(entry_bytes(1, e)), "read 1/{e}");
    }
    // Recovery must work on a read-only bookie: fences and recovery adds are served.
    let fenced = w.call(&Request::Fence {
        ledger: LedgerId(1),
        master_key: KEY,
    });
    assert_eq!(fenced, Answer::Ok, "fence on a read-only bookie");
    assert_eq!(
        w.add(1, 10, true),
        Answer::Ok,
        "recovery add on a read-only bookie"
    );
    assert_eq!(w.add(1, 11, false), Answer::Failed(Status::ReadOnly));
    drop(w);

    // A crash on the full disk, then a start on it: read-only from the start, reads served.
    bookie.kill();
    // The killed incarnation's ephemeral registration lasts until its session expires; a new
    // one waits for that only up to about the session timeout, so let it expire first.
    wait_for("the killed bookie's registration expired", || {
        registered_read_only(&cluster).is_none()
    });
    let bookie = cluster.start_bookie_with(0, port, &flags);
    wait_for("the restarted bookie registered read-only", || {
        registered_read_only(&cluster) == Some(true)
    });
    let mut w = Wire::connect(&addr);
    for e in 0..=10 {
        assert_eq!(
            w.read(1, e),
            Answer::Data(entry_bytes(1, e)),
            "read 1/{e} after restart"
        );
    }
    assert_eq!(w.add(2, 0, false), Answer::Failed(Status::ReadOnly));

    // Space freed: writable again, registered under available/, adds taken.
    std::fs::remove_file(&filler).expect("remove filler");
    wait_for("the registration moved back to available/", || {
        registered_read_only(&cluster) == Some(false)
    });
    for e in 0..10 {
        assert_eq!(
            w.add(2, e, false),
            Answer::Ok,
            "add 2/{e} after freeing space"
        );
    }
    for e in 0..10 {
        assert_eq!(w.read(2, e), Answer::Data(entry_bytes(2, e)));
    }
    assert_eq!(
        w.add(1, 12, false),
        Answer::Failed(Status::Fenced),
        "the fence survived the crash"
    );
    drop(w);
    bookie.stop();
    drop(mount);
}

//! Goal (issue 28 item 4): named crash points abort a real process at the chosen step, and the
//! next start repairs what the crash left: (a) a sandbox aborted at 10 % of its bookies'
//! startup journal replay (`crash=engine.replay@0.1`) replays fully on the next start; (b) a
//! sandbox aborted inside recovery's write-back of the in-progress segment left by a SIGKILL
//! (`crash=ledger.recovery.write_back`) recovers the segment on the next start; (c) a sandbox
//! aborted right after a checkpoint (`crash=engine.checkpoint.after`) restarts from its mark.
//! After all three, every acknowledged record is read back once, in order, with its bytes, and writes go on.
//! Method: one `quire sandbox` directory (embedded metadata, bookies and proxy in one process)
//! with checkpoints an hour apart, so that the journal holds every record written; SIGKILL
//! after acknowledged writes; `QUIRE_FAULT_POINTS` set only on the starts that must crash
//! (docs/fault-points.md). A crash point made a no-op fails the test: the sandbox then keeps
//! running and `wait_exit` reports no exit.

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use quire_client::{Position, ProxyClient};
use quire_testkit::harness::cluster::runtime;
use quire_testkit::harness::*;

const FLAGS: &[&str] = &["--checkpoint-interval-ms", "3600000"];
const STREAM: &str = "crash/points";

fn payload(i: u64) -> Vec<u8> {
    format!("record {i:05} {}", "z".repeat(200)).into_bytes()
}

/// Every record of the stream from its head, until a read without waiting returns nothing.
async fn read_all(c: &ProxyClient) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = Position::Head;
    loop {
        let b = c.read_from(STREAM, at, 1000, Duration::ZERO).await.unwrap();
        if b.records.is_empty() {
            return out;
        }
        out.extend(b.records.into_iter().map(|(_, _, p)| p));
        at = b.next;
    }
}

/// Starts `quire sandbox` on `dir` with `flags` and `QUIRE_FAULT_POINTS=spec` and waits (30 s at most) for
/// it to exit by itself; asserts it aborted (SIGABRT) at `point` and returns what it printed.
fn start_expecting_abort_at(
    dir: &std::path::Path,
    flags: &[&str],
    spec: &str,
    point: &str,
) -> String {
    let err_path = dir.join(format!("{point}.stderr"));
    let mut child = Sandbox::command(dir, flags, &[("QUIRE_FAULT_POINTS", spec)])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let err = std::fs::read_to_string(&err_path).unwrap();
    assert_eq!(
        status.and_then(|s| s.signal()),
        Some(libc::SIGABRT),
        "{spec}: the sandbox should abort at {point}, exit {status:?}: {err}"
    );
    assert!(
        err.contains(&format!("crash point {point} reached")),
        "{err}"
    );
    err
}

#[test]
fn crash_points_in_replay_and_recovery_write_back_lose_nothing() {
    let started = Instant::now();
    let dir = temp_dir();
    let rt = runtime();
    let sandbox = Sandbox::start(dir.path(), FLAGS);
    let n = 400u64;
    rt.block_on(async {
        let c = ProxyClient::connect(&sandbox.addr).await.unwrap();
        for i in (0..n).step_by(10) {
            let records = (i..i + 10).map(|k| (k, payload(k))).collect();
            c.write(STREAM, records, true).await.unwrap();
        }
    });
    // The segment stays in progress and every record is in the journal only.
    sandbox.kill();

    // (a) A crash at 10 % of the startup replay.
    let err = start_expecting_abort_at(
        dir.path(),
        FLAGS,
        "crash=engine.replay@0.1",
        "engine.replay",
    );
    assert!(
        err.contains("fault points are ARMED"),
        "the loud warning: {err}"
    );

    // (b) A crash inside recovery's write-back: the sandbox's start recovers the segment the
    // SIGKILL left in progress, re-adding its entries past the bookies' LAC.
    start_expecting_abort_at(
        dir.path(),
        FLAGS,
        "crash=ledger.recovery.write_back",
        "ledger.recovery.write_back",
    );

    // (c) A crash between two checkpoints: the first checkpoint after the start (of what the
    // replay put in the write cache) completes, then the process aborts.
    start_expecting_abort_at(
        dir.path(),
        &["--checkpoint-interval-ms", "200"],
        "crash=engine.checkpoint.after",
        "engine.checkpoint.after",
    );

    // The next start replays fully and recovers the segment: every acknowledged record once,
    // in order, with its bytes; then writes go on after it.
    let sandbox = Sandbox::start(dir.path(), FLAGS);
    rt.block_on(async {
        let c = ProxyClient::connect(&sandbox.addr).await.unwrap();
        let all = read_all(&c).await;
        let expected: Vec<Vec<u8>> = (0..n).map(payload).collect();
        assert_eq!(all.len(), expected.len(), "records read back");
        assert!(all == expected, "the records, once, in order, intact");
        c.write(STREAM, vec![(n, payload(n))], false).await.unwrap();
        let all = read_all(&c).await;
        assert_eq!(all.len() as u64, n + 1);
    });
    sandbox.stop();
    eprintln!("crash points test took {:?}", started.elapsed());
}

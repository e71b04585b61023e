//! Goal: `quire-perf workload` runs all four modes of the common workload against a real
//! `quire sandbox` (3 bookies with O_DIRECT journals, E=3 Qw=3 Qa=2, real TCP on 127.0.0.1)
//! and prints one JSON line per mode with the workload's fields, a clean result and CPU figures
//! of the sandbox process.
//! Method: start the sandbox binary on a temporary ext4 directory, run the quire-perf binary
//! with short durations (1 s warm-up, 2 s measured, 2 s drain, 200 records/s) and `--cpu-pid`
//! of the sandbox, parse stdout and the `--out` file. Assertions are counts and orderings that
//! hold on a slow machine (no timing bound).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `quire` binary of this checkout: `QUIRE_BIN` if set, else built now (same profile as
/// this test) so that the test never runs a stale one.
fn quire_bin() -> PathBuf {
    if let Ok(p) = std::env::var("QUIRE_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>")
        .to_path_buf();
    let mut build = Command::new(env!("CARGO"));
    build
        .args(["build", "-p", "quire", "--bin", "quire"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build -p quire");
    assert!(status.success(), "cargo build -p quire failed");
    profile_dir.join("quire")
}

struct Sandbox {
    child: Child,
    addr: String,
}

impl Sandbox {
    fn start(dir: &std::path::Path) -> Sandbox {
        let mut child = Command::new(quire_bin())
            .arg("sandbox")
            .arg("--data-dir")
            .arg(dir)
            .args(["--listen", "127.0.0.1:0"])
            // The host disk is shared and its usage not the test's to control: only a really
            // full disk may turn a bookie read-only here.
            .args(["--disk-usage-threshold", "1.0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn quire sandbox");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(a) = line.strip_prefix("quire sandbox: proxy listening on ") {
                    let _ = tx.send(a.trim().to_string());
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = loop {
            if let Ok(a) = rx.recv_timeout(Duration::from_millis(100)) {
                break a;
            }
            if let Some(status) = child.try_wait().expect("try_wait") {
                panic!("sandbox exited with {status} before printing its address");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("sandbox did not print its address within 60 s");
            }
        };
        Sandbox { child, addr }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // SIGTERM by pid, then reap; SIGKILL if it has not gone after 20 s.
        // SAFETY: kill(2) on the pid of our own child, which we have not reaped yet.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pct(v: &Value, obj: &str, q: &str) -> f64 {
    v[obj][q]
        .as_f64()
        .unwrap_or_else(|| panic!("{obj}.{q} missing in {}", v["mode"]))
}

#[test]
fn all_four_modes_against_a_real_sandbox() {
    let dir = tempfile::Builder::new()
        .prefix("quire-perf-workload-")
        .tempdir_in(std::env::temp_dir())
        .expect("tempdir");
    let sandbox = Sandbox::start(&dir.path().join("sandbox"));
    let out_file = dir.path().join("lines.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_quire-perf"))
        .args(["workload", "--proxy", &sandbox.addr])
        .args([
            "--warmup",
            "1",
            "--duration",
            "2",
            "--drain",
            "2",
            "--rate",
            "200",
        ])
        .args(["--label", "integration test"])
        .arg("--cpu-pid")
        .arg(sandbox.child.id().to_string())
        .arg("--sandbox-dir")
        .arg(dir.path().join("sandbox"))
        .arg("--out")
        .arg(&out_file)
        .stderr(Stdio::inherit())
        .output()
        .expect("run quire-perf workload");
    let stdout = String::from_utf8(out.stdout).expect("utf-8 stdout");
    assert!(
        out.status.success(),
        "exit {:?}; stdout:\n{stdout}",
        out.status
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("each stdout line is JSON"))
        .collect();
    let modes: Vec<&str> = lines.iter().map(|l| l["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["latency", "latency-open", "throughput", "tail"]);
    let file = std::fs::read_to_string(&out_file).expect("--out file");
    assert_eq!(file.lines().count(), 4, "--out holds the same four lines");
    assert_eq!(file, stdout);

    let mut streams = std::collections::HashSet::new();
    for l in &lines {
        let mode = l["mode"].as_str().unwrap();
        assert_eq!(l["peer"], "quire");
        assert_eq!(l["label"], "integration test");
        assert!(l["unix_time"].as_u64().unwrap() > 1_600_000_000);
        assert_eq!(l["params"]["size"], 1024);
        assert_eq!(l["params"]["rate"], 200);
        assert_eq!(l["params"]["duration_s"], 2.0);
        assert_eq!(l["errors"], 0, "{mode}: {}", l["first_error"]);
        assert_eq!(l["clean"], true, "{mode}");
        assert!(l["count"].as_u64().unwrap() > 0, "{mode}: count");
        assert!(l["peer_info"]["durability"]
            .as_str()
            .unwrap()
            .contains("fdatasync"));
        assert_eq!(l["peer_info"]["quorum"]["ack_quorum"], 2, "{mode}");
        assert_eq!(l["peer_info"]["quorum"]["write_quorum"], 3, "{mode}");
        assert!(l["host"]["cpus"].as_u64().unwrap() >= 1);
        assert!(l["host"]["loadavg_at_end"].is_string());
        let cpu = &l["cpu"];
        assert_eq!(cpu["pids"][0], sandbox.child.id());
        assert!(cpu["seconds"].as_f64().unwrap() > 0.0, "{mode}: {cpu}");
        assert!(
            cpu["per_record_ms"].as_f64().unwrap() > 0.0,
            "{mode}: {cpu}"
        );
        let lat = match mode {
            "latency" | "latency-open" => "ack_from_schedule_us",
            "tail" => "e2e_us",
            _ => "ack_us",
        };
        for obj in ["ack_us", lat] {
            let (p50, p99, max) = (pct(l, obj, "p50"), pct(l, obj, "p99"), pct(l, obj, "max"));
            assert!(
                p50 > 0.0 && p50 <= p99 && p99 <= max,
                "{mode} {obj}: {}",
                l[obj]
            );
        }
        assert!(
            streams.insert(l["stream"].as_str().unwrap().to_string()),
            "one stream per mode"
        );
    }
    let by = |m: &str| lines.iter().find(|l| l["mode"] == m).unwrap();
    // latency: one append outstanding; service time never above the from-schedule time.
    let lat = by("latency");
    assert_eq!(lat["max_outstanding"], 1);
    assert!(pct(lat, "ack_us", "p50") <= pct(lat, "ack_from_schedule_us", "p50"));
    // latency-open: every measured send acknowledged in time.
    let open = by("latency-open");
    assert_eq!(open["unacked_after_drain"], 0);
    assert_eq!(open["acked"], open["count"]);
    // throughput: 256 in flight, every ack accounted for.
    let tp = by("throughput");
    assert_eq!(tp["abandoned_after_drain"], 0);
    assert!(tp["max_inflight"].as_u64().unwrap() <= 256);
    assert!(tp["records_per_s"].as_f64().unwrap() > 0.0);
    let mbps = tp["records_per_s"].as_f64().unwrap() * 1024.0 / 1e6;
    assert!((tp["mb_per_s"].as_f64().unwrap() - mbps).abs() < 1e-9);
    // tail: every measured record delivered exactly once, in order, none foreign.
    let tail = by("tail");
    for k in [
        "missing_measured",
        "duplicates",
        "out_of_order",
        "reader_errors",
        "unexpected",
    ] {
        assert_eq!(tail[k], 0, "tail {k}");
    }
    assert_eq!(tail["received_total"], tail["published"]);
    assert!(tail["count"].as_u64().unwrap() <= tail["published"].as_u64().unwrap());
    drop(sandbox);
}

// Goal: an unreachable proxy is a harness error (exit status 2) with one clear message, not a
// hang or a report of zeros. Method: port 1 on loopback, where nothing listens.
#[test]
fn unreachable_proxy_is_a_harness_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_quire-perf"))
        .args(["workload", "--proxy", "127.0.0.1:1", "--duration", "1"])
        .output()
        .expect("run quire-perf workload");
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "no JSON line");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot connect to the proxy at 127.0.0.1:1"),
        "{err}"
    );
}

// Goal: a `--size` above the proxy's record limit is a harness error (exit status 2) naming the
// limit, found before any mode runs, not a run in which every append fails and which reports a
// line of errors with exit status 1. Method: a real sandbox (record limit 1,040,384 bytes) and
// `--size 2000000`.
#[test]
fn size_above_the_proxy_record_limit_is_a_harness_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let sandbox = Sandbox::start(dir.path());
    let out = Command::new(env!("CARGO_BIN_EXE_quire-perf"))
        .args(["workload", "--proxy", &sandbox.addr, "--modes", "latency"])
        .args(["--size", "2000000", "--duration", "1", "--warmup", "0"])
        .args(["--drain", "1"])
        .output()
        .expect("run quire-perf workload");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty(), "no JSON line");
    assert!(
        err.contains("--size 2000000 is above the proxy's record limit of 1040384 bytes"),
        "{err}"
    );
    drop(sandbox);
}

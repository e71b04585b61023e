//! Goal: `quire bookie info ADDR` asks a real bookie over the bookie protocol and prints its
//! state, shards, ledgers and directories, as text and as `--json`; an unreachable bookie is a
//! one-line error. Method: a real sandbox (its bookies are real bookie servers on 127.0.0.1),
//! one record written so that every bookie holds one ledger, then the command against the
//! first bookie, whose directories the sandbox layout names.

use quire_testkit::harness::*;

use std::process::Command;
use std::time::{Duration, Instant};

/// `quire bookie info ADDR`, with the cluster secret a sandbox made in `data_dir` if given (its
/// bookies admit only holders of it).
fn info(addr: &str, json: bool, data_dir: Option<&std::path::Path>) -> std::process::Output {
    let mut cmd = Command::new(quire_bin());
    cmd.args(["bookie", "info", addr]);
    if let Some(dir) = data_dir {
        cmd.arg("--cluster-secret-file")
            .arg(dir.join("secrets/cluster-secret"));
    }
    if json {
        cmd.arg("--json");
    }
    cmd.output().expect("run quire bookie info")
}

#[test]
fn bookie_info_reports_a_real_bookie() {
    let dir = temp_dir();
    let sandbox = Sandbox::start(dir.path(), &[]);
    let (_, count) = parse_write_output(&sandbox.quire_stdin(&["write", "info-stream"], b"one\n"));
    assert_eq!(count, 1);
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("sandbox.json")).unwrap()).unwrap();
    let addr = record["bookies"][0].as_str().unwrap().to_string();

    // Shards publish their ledger counts every 500 ms.
    let deadline = Instant::now() + Duration::from_secs(10);
    let v = loop {
        let out = info(&addr, true, Some(dir.path()));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if v["ledgers"] == 1 || Instant::now() > deadline {
            break v;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(v["bookie"], addr.as_str());
    assert_eq!(v["state"], "writable");
    assert_eq!(v["shards"], 1);
    assert_eq!(v["ledgers"], 1, "{v}");
    assert_eq!(v["shard_ledgers"], serde_json::json!([1]));
    // No ZooKeeper given (a sandbox has none): the labels are unknown, not "unlabelled".
    assert_eq!(
        (&v["registered"], &v["region"], &v["rack"]),
        (
            &serde_json::Value::Null,
            &serde_json::Value::Null,
            &serde_json::Value::Null
        ),
        "{v}"
    );
    let dirs = v["dirs"].as_array().unwrap();
    assert_eq!(dirs.len(), 2);
    let journal = dir.path().join("bookie-1").join("journal");
    let ledgers = dir.path().join("bookie-1").join("ledgers");
    assert_eq!(dirs[0]["kind"], "journal");
    assert_eq!(dirs[0]["path"], journal.to_str().unwrap());
    assert_eq!(dirs[1]["kind"], "ledger");
    assert_eq!(dirs[1]["path"], ledgers.to_str().unwrap());
    for d in dirs {
        let total = d["total_bytes"].as_u64().unwrap();
        let free = d["free_bytes"].as_u64().unwrap();
        assert!(total > 0 && free <= total, "{d}");
    }
    // The journal directory holds at least one pre-written 64 MiB journal file.
    assert!(
        dirs[0]["used_bytes"].as_u64().unwrap() >= 64 << 20,
        "{}",
        dirs[0]
    );

    let out = info(&addr, false, Some(dir.path()));
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with(&format!("bookie {addr}\nstate: writable\n")),
        "{text}"
    );
    assert!(
        text.contains("\nshards: 1 (ledgers per shard: 1)\nledgers: 1\nlabels: unknown "),
        "{text}"
    );
    assert!(
        text.contains(&format!("journal {}: bookie files ", journal.display())),
        "{text}"
    );
    sandbox.stop();
}

/// Goal: with ZooKeeper flags, `quire bookie info` shows the region and rack the bookie
/// registered with (issue 30 item 1), as `bookie list` does. Method: the test kit's ZooKeeper, one `quire bookie` with `--region` and
/// `--rack`, the command through `Cluster::admin` (which passes `--zookeeper`).
#[test]
fn bookie_info_shows_the_registered_labels() {
    let cluster = quire_testkit::harness::cluster::Cluster::start();
    let port = quire_testkit::free_port();
    let _bookie = cluster.start_bookie_with(0, port, &["--region", "eu", "--rack", "r7"]);
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cluster.admin_ok(&["bookie", "list"]).contains(&addr) {
        assert!(Instant::now() < deadline, "bookie {addr} never registered");
        std::thread::sleep(Duration::from_millis(200));
    }
    let v: serde_json::Value =
        serde_json::from_str(&cluster.admin_ok(&["bookie", "info", &addr, "--json"])).unwrap();
    assert_eq!(v["registered"], true, "{v}");
    assert_eq!(v["region"], "eu", "{v}");
    assert_eq!(v["rack"], "r7", "{v}");
    let text = cluster.admin_ok(&["bookie", "info", &addr]);
    assert!(text.contains("\nlabels: region=eu rack=r7\n"), "{text}");
}

#[test]
fn unreachable_bookie_is_one_line_error() {
    let port = quire_testkit::free_port();
    let out = info(&format!("127.0.0.1:{port}"), false, None);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("cannot connect to bookie 127.0.0.1:{port}")),
        "{err}"
    );
}

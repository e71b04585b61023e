//! Goal: the operator's commands (issue 27 items 2 and 5) on one real cluster: `quire cluster
//! status` exits 0 when healthy and non-zero naming a stopped bookie; `quire config show`
//! merges file, environment and flags and never prints a secret; `quire debug bundle` writes a
//! .tar.gz holding the expected parts; `quire bookie disk-test` prints its figures; `quire
//! stream show` through a proxy that does not own the stream shows the live last txid.
//! Method: ZooKeeper, three `quire bookie` processes (autorecovery inside, as by default) and
//! two proxies; each check runs the `quire` binary and reads its output or archive.

use std::io::Read;
use std::process::Output;
use std::time::{Duration, Instant};

use quire_testkit::harness::cluster::Cluster;

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `quire cluster status` until it exits 0 (the auditor election follows the bookies'
/// start), at most 30 s; returns its output.
fn wait_healthy(cluster: &Cluster) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = cluster.admin(&["cluster", "status"]);
        if out.status.success() {
            return text(&out).0;
        }
        let (o, e) = text(&out);
        assert!(Instant::now() < deadline, "never healthy: {o}{e}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn operator_commands_on_one_cluster() {
    let cluster = Cluster::start();
    let ports: Vec<u16> = (0..3).map(|_| quire_testkit::free_port()).collect();
    let mut bookies: Vec<_> = (0..3)
        .map(|i| Some(cluster.start_bookie(i, ports[i])))
        .collect();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let metrics = format!("127.0.0.1:{}", quire_testkit::free_port());
    // Ownership by the first proxy asked is what this test relies on (balanced ownership, on
    // by default, is tested in cluster_balanced_ownership.rs).
    let e3 = [
        "--ensemble-size",
        "3",
        "--write-quorum",
        "3",
        "--ack-quorum",
        "2",
        "--balance-moves-per-sec",
        "0",
    ];
    let mut owner_flags = e3.to_vec();
    owner_flags.extend(["--metrics-listen", metrics.as_str()]);
    let owner = cluster.start_proxy(quire_testkit::free_port(), &owner_flags);
    let other = cluster.start_proxy(quire_testkit::free_port(), &e3);

    // A live stream written through one proxy; the other is asked about it.
    let records = b"a\nb\nc\nd\ne\n";
    let out = quire_testkit::harness::run_quire(
        &["write", "ops/live", "--txid-from", "1000"],
        &owner.addr,
        Some(records),
    );
    assert!(out.status.success(), "{:?}", text(&out));
    let show = cluster.stream_admin_ok(&other.addr, &["stream", "show", "ops/live"]);
    assert!(
        show.contains("last txid: 1004"),
        "through a non-owner: {show}"
    );
    assert!(
        show.contains(&format!("owner:    {}", owner.addr)),
        "{show}"
    );
    // Its open segment's ledger: the LAC comes from the bookies, not "last entry: none".
    let doc: serde_json::Value = serde_json::from_str(
        &cluster.stream_admin_ok(&other.addr, &["stream", "show", "ops/live", "--json"]),
    )
    .unwrap();
    let open = doc["metadata"]["segments"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    let ledger = open["ledger_id"].as_u64().unwrap().to_string();
    let ledger_text = cluster.admin_ok(&["ledger", "show", &ledger]);
    assert!(
        ledger_text.contains("last add confirmed: ") && !ledger_text.contains("no bookie answered"),
        "the bookies answered: {ledger_text}"
    );
    assert!(!ledger_text.contains("last entry:  none"), "{ledger_text}");
    assert!(
        ledger_text.contains("created:     20"),
        "RFC 3339: {ledger_text}"
    );

    // Healthy: exit 0, every bookie writable, the owner with its stream.
    let status = wait_healthy(&cluster);
    assert!(
        status.starts_with("cluster: healthy (checked at 20"),
        "{status}"
    );
    for p in &ports {
        assert!(
            status.contains(&format!("127.0.0.1:{p} writable")),
            "{status}"
        );
    }
    assert!(
        status.contains(&format!("{}: 1 streams: ops/live", owner.addr)),
        "{status}"
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&cluster.admin(&["cluster", "status", "--json"]).stdout).unwrap();
    assert_eq!(doc["healthy"], true, "{doc}");
    assert_eq!(doc["bookies"].as_array().unwrap().len(), 3, "{doc}");
    assert!(doc["auditor"].is_string(), "{doc}");

    check_config_show(&cluster);
    check_disk_test(&cluster);
    check_debug_bundle(&cluster, &metrics);

    // A stopped bookie: non-zero, named on stdout and stderr, also in the JSON.
    let stopped = format!("127.0.0.1:{}", ports[2]);
    bookies[2].take().unwrap().stop();
    cluster.wait_bookies("bookie 2 gone", |l| !l.contains(&stopped));
    let out = cluster.admin(&["cluster", "status"]);
    let (o, e) = text(&out);
    assert!(!out.status.success(), "{o}");
    assert!(o.contains(&format!("{stopped} down")), "{o}");
    assert!(
        e.contains(&format!("bookie {stopped} is down")) && e.lines().count() == 1,
        "{e}"
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&cluster.admin(&["cluster", "status", "--json"]).stdout).unwrap();
    assert_eq!(doc["healthy"], false, "{doc}");
    let down: Vec<_> = doc["bookies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["state"] == "down")
        .collect();
    assert_eq!(down.len(), 1, "{doc}");
    assert_eq!(down[0]["id"], stopped.as_str());

    owner.stop();
    other.stop();
    for b in bookies.into_iter().flatten() {
        b.stop();
    }
}

/// `quire config show`: file + environment + flags merged; secret contents never printed.
fn check_config_show(cluster: &Cluster) {
    let dir = cluster.dir.path();
    let auth = dir.join("zk-auth");
    std::fs::write(&auth, "quire:hunter2-never-shown\n").unwrap();
    set_mode_600(&auth);
    let tokens = dir.join("tokens.toml");
    let file = dir.join("bookie-show.toml");
    std::fs::write(
        &file,
        format!(
            "listen = \"127.0.0.1:3181\"\ncluster_secret_file = \"{}\"\n[zookeeper]\nservers = \"127.0.0.1:2181\"\nauth_file = \"{}\"\n[bookie]\njournal_dir = \"/j\"\nledger_dir = \"/l\"\nshards = 1\n",
            cluster.secret_file.display(),
            auth.display()
        ),
    )
    .unwrap();
    let secret = std::fs::read_to_string(&cluster.secret_file).unwrap();
    let args = |json: bool| {
        let mut a: Vec<String> = ["config", "show", "--role", "bookie", "--config"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.push(file.display().to_string());
        if json {
            a.push("--json".into());
        }
        a.extend(["--".into(), "--shards".into(), "2".into()]);
        a
    };
    let env = [("QUIRE_ZK_ROOT", "/from-env")];
    let out = quire_testkit::harness::cluster::run_env(&args(false), &env);
    let (o, e) = text(&out);
    assert!(out.status.success(), "{e}");
    assert!(o.contains("shards = 2"), "the flag wins over the file: {o}");
    assert!(
        o.contains("root = \"/from-env\""),
        "the environment counts: {o}"
    );
    assert!(
        o.contains(&cluster.secret_file.display().to_string()),
        "{o}"
    );
    assert!(o.contains("secret keys"), "{o}");
    for s in [secret.trim(), "hunter2-never-shown"] {
        assert!(!o.contains(s) && !e.contains(s), "a secret leaked: {o}{e}");
    }
    let out = quire_testkit::harness::cluster::run_env(&args(true), &env);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["settings"]["bookie"]["shards"], 2, "{doc}");
    assert!(doc["secret_keys"]
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k == "zookeeper.auth_file"));
    assert!(!doc.to_string().contains("hunter2"), "{doc}");
    // A proxy file naming a token file: its path shows, never a token key.
    let hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nname = \"x\"\nsha256 = \"{hash}\"\nread = [\"\"]\nwrite = []\nadmin = []\n"
        ),
    )
    .unwrap();
    let out = quire_testkit::harness::cluster::run(&[
        "config".into(),
        "show".into(),
        "--role".into(),
        "proxy".into(),
        "--".into(),
        "--auth-tokens-file".into(),
        tokens.display().to_string(),
    ]);
    let (o, e) = text(&out);
    assert!(out.status.success(), "{e}");
    assert!(o.contains("auth_tokens_file") && !o.contains(hash), "{o}");
}

fn set_mode_600(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `quire bookie disk-test`: latency and bandwidth figures beside the floor.
fn check_disk_test(cluster: &Cluster) {
    let dir = cluster.dir.path().join("disk-test");
    std::fs::create_dir_all(&dir).unwrap();
    let out = quire_testkit::harness::cluster::run(&[
        "bookie".into(),
        "disk-test".into(),
        "--journal-dir".into(),
        dir.display().to_string(),
        "--ledger-dir".into(),
        dir.display().to_string(),
        "--appends".into(),
        "200".into(),
        "--bytes".into(),
        "8388608".into(),
    ]);
    let (o, e) = text(&out);
    assert!(out.status.success(), "{e}");
    assert!(
        o.contains("durable 4 KiB append") && o.contains(" µs, p99 "),
        "{o}"
    );
    assert_eq!(o.matches(" MB/s   (floor: ").count(), 2, "{o}");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "scratch file left"
    );
}

/// `quire debug bundle`: the archive holds the expected parts, read back with the tar crate.
fn check_debug_bundle(cluster: &Cluster, metrics: &str) {
    let dir = cluster.dir.path();
    let log = dir.join("proxy.log");
    std::fs::write(&log, "line one\nline two\n").unwrap();
    let config = dir.join("bookie-show.toml");
    let archive = dir.join("bundle.tar.gz");
    let journal = cluster.journal_dir(0);
    let a = archive.display().to_string();
    let c = format!("bookie={}", config.display());
    let l = log.display().to_string();
    let d = journal.display().to_string();
    let out = cluster.admin(&[
        "debug",
        "bundle",
        "-o",
        &a,
        "--config",
        &c,
        "--metrics",
        metrics,
        "--log",
        &l,
        "--data-dir",
        &d,
    ]);
    let (o, e) = text(&out);
    assert!(out.status.success(), "{o}{e}");
    let gz = flate2::read::GzDecoder::new(std::fs::File::open(&archive).unwrap());
    let mut parts = std::collections::BTreeMap::new();
    for entry in tar::Archive::new(gz).entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry.path().unwrap().display().to_string();
        let mut body = String::new();
        entry.read_to_string(&mut body).unwrap();
        parts.insert(name, body);
    }
    let get = |name: &str| {
        parts
            .get(&format!("quire-debug/{name}"))
            .unwrap_or_else(|| panic!("no {name} in {:?}", parts.keys()))
    };
    assert!(get("config/bookie-0.toml").contains("shards = 1"));
    assert!(!get("config/bookie-0.toml").contains("hunter2"));
    let m = get(&format!("metrics/{}.txt", metrics.replace(':', "_")));
    assert!(m.contains("quire_proxy"), "{m}");
    assert_eq!(get("logs/0-proxy.log"), "line one\nline two\n");
    assert!(get("listing/0.tsv").contains("path\tsize_bytes\tmodified"));
    assert!(
        get("listing/0.tsv").contains(&d),
        "{}",
        get("listing/0.tsv")
    );
    let clock: serde_json::Value = serde_json::from_str(get("clock.json")).unwrap();
    let offset = clock["zookeeper_offset_ms"]
        .as_i64()
        .expect("a ZooKeeper offset");
    assert!(offset.abs() < 5_000, "same host, same clock: {clock}");
    let status: serde_json::Value = serde_json::from_str(get("cluster-status.json")).unwrap();
    assert_eq!(status["bookies"].as_array().unwrap().len(), 3);
    assert!(get("MANIFEST.txt").contains("quire debug bundle"));
    // The bookie file's directories do not exist here: named in errors.txt, bundle written.
    assert!(
        get("errors.txt").contains("listing /j"),
        "{}",
        get("errors.txt")
    );
}

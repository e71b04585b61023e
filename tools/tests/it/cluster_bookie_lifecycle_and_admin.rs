//! Multi-process cluster tests of the bookie process, its cookies and the admin commands.
//! Real ZooKeeper (quire-testkit), real `quire bookie` / `quire proxy` children on 127.0.0.1,
//! real O_DIRECT directories, real signals.

use quire_testkit::harness::cluster::runtime;
use std::sync::Arc;
use std::time::Duration;

use quire_metadata::ZkStore;
use quire_testkit::harness::checker::{check_stream, write_records};
use quire_testkit::harness::cluster::{Cluster, SESSION_TIMEOUT_MS};

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn bookies_register_refuse_wiped_dirs_and_come_back_after_session_expiry() {
    // Goal: (e) a bookie restarted with an emptied journal or ledger directory refuses to start,
    // with one line naming the directory and why; bookies register and unregister; a bookie
    // whose ZooKeeper session expired registers again; bad config is one clear line.
    // Method: three `quire bookie` processes; SIGTERM one, empty its journal directory, start
    // it again; SIGKILL another, empty its ledger directory, start it again; SIGSTOP the third
    // past the session timeout, watch `quire bookie list` lose and regain it after SIGCONT.
    let cluster = Cluster::start();
    let ports: Vec<u16> = (0..3).map(|_| quire_testkit::free_port()).collect();
    let mut bookies: Vec<_> = (0..3)
        .map(|i| Some(cluster.start_bookie(i, ports[i])))
        .collect();
    let list = cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    for p in &ports {
        assert!(list.contains(&format!("127.0.0.1:{p}")), "{list}");
    }
    let listed = json(&cluster.admin_ok(&["bookie", "list", "--json"]));
    assert_eq!(listed.as_array().unwrap().len(), 3);
    assert_eq!(listed[0]["read_only"], false);

    // Clean stop unregisters; a restart on the same directories matches the cookie.
    bookies[2].take().unwrap().stop();
    cluster.wait_bookies("2 bookies after SIGTERM", |l| {
        l.contains("2 bookies registered")
    });
    bookies[2] = Some(cluster.start_bookie(2, ports[2]));
    cluster.wait_bookies("3 bookies after restart", |l| {
        l.contains("3 bookies registered")
    });

    // Emptied journal directory: refused.
    bookies[2].take().unwrap().stop();
    let journal = cluster.journal_dir(2);
    std::fs::remove_dir_all(&journal).unwrap();
    std::fs::create_dir_all(&journal).unwrap();
    let out = cluster.bookie_refuses(2, ports[2]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(&format!(
            "journal directory {} has no cookie",
            journal.display()
        )),
        "{err}"
    );
    assert!(err.contains("emptied or replaced"), "{err}");
    assert!(
        quire_testkit::harness::cluster::is_empty_dir(&journal),
        "a refused start writes nothing into the directory"
    );

    // Emptied ledger directory after a crash: refused.
    bookies[1].take().unwrap().kill();
    let ledgers = cluster.ledger_dir(1);
    std::fs::remove_dir_all(&ledgers).unwrap();
    let out = cluster.bookie_refuses(1, ports[1]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(&format!(
            "ledger directory {} has no cookie",
            ledgers.display()
        )),
        "{err}"
    );

    // Bookie 0 frozen past its session timeout: its registration goes, and comes back.
    let b0 = bookies[0].as_ref().unwrap();
    let id0 = format!("127.0.0.1:{}", ports[0]);
    b0.pause();
    cluster.wait_bookies("bookie 0 gone after SIGSTOP", |l| !l.contains(&id0));
    b0.resume();
    cluster.wait_bookies("bookie 0 back after SIGCONT", |l| l.contains(&id0));
    assert!(
        b0.stderr_shows("registered again", Duration::from_secs(10)),
        "bookie 0 logs its re-registration"
    );
    bookies[0].take().unwrap().stop();

    // Configuration errors: one line each, non-zero exit.
    let out = quire_testkit::harness::cluster::run(&[
        "bookie".into(),
        "--config".into(),
        "/nonexistent/bookie.toml".into(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.lines().count() == 1, "{err}");
    assert!(
        err.contains("cannot read config file /nonexistent/bookie.toml"),
        "{err}"
    );
    let bad = cluster.dir.path().join("bad.toml");
    std::fs::write(&bad, "zookeeper = \"127.0.0.1:1\"\n\nshards = \"two\"\n").unwrap();
    let out = quire_testkit::harness::cluster::run(&[
        "bookie".into(),
        "--config".into(),
        bad.display().to_string(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.lines().count() == 1, "{err}");
    assert!(err.contains("line 3"), "{err}");
    let out = quire_testkit::harness::cluster::run(&[
        "proxy".into(),
        "--zookeeper".into(),
        "127.0.0.1:1".into(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("missing setting listen"),
        "{err}"
    );
}

#[test]
fn concurrent_ledger_recovers_agree_and_admin_shows_the_stream() {
    // Goal: (d) two `quire ledger recover` of the same ledger at once agree; `quire stream show`
    // and `quire ledger show` describe the stream; nothing acknowledged is lost.
    // Method: 3 bookies, a proxy with E=3 Qw=3 Qa=2; write records, SIGKILL the proxy so the
    // segment's ledger stays open; run two recover processes at once and compare what they
    // print; then read the stream back through a new proxy with the shared checker.
    let cluster = Cluster::start();
    let bookies: Vec<_> = (0..3)
        .map(|i| cluster.start_bookie(i, quire_testkit::free_port()))
        .collect();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let proxy = cluster.start_proxy(
        quire_testkit::free_port(),
        &["--segment-size-bytes", "4096"],
    );
    let rt = runtime();
    let client = rt.block_on(async {
        Arc::new(
            quire_client::ProxyClient::connect(&proxy.addr)
                .await
                .unwrap(),
        )
    });
    let (mut acked, err) = rt.block_on(write_records(&client, "recover/me", "rec", 0..600));
    assert!(err.is_none(), "writes failed: {err:?}");
    assert_eq!(acked.len(), 600);
    // The last write may have filled the segment, which then rolls with no successor until the
    // next write (how records pack into entries varies from run to run): write on, one record
    // at a time, until a segment is in progress (a roll comes about every 150 records).
    let mut show = cluster.stream_admin_ok(&proxy.addr, &["stream", "show", "recover/me"]);
    for k in 0..3 {
        if show.contains("in progress") {
            break;
        }
        let (more, err) = rt.block_on(write_records(&client, "recover/me", "more", k..k + 1));
        assert!(err.is_none(), "writes failed: {err:?}");
        acked.extend(more);
        show = cluster.stream_admin_ok(&proxy.addr, &["stream", "show", "recover/me"]);
    }
    assert!(
        show.contains(&format!("owner:    {}", proxy.addr)),
        "{show}"
    );
    assert!(
        show.contains("completed") && show.contains("in progress"),
        "{show}"
    );
    let doc =
        json(&cluster.stream_admin_ok(&proxy.addr, &["stream", "show", "recover/me", "--json"]));
    proxy.kill();

    let segments = doc["metadata"]["segments"].as_array().unwrap();
    assert!(segments.len() >= 2, "the stream rolled: {doc}");
    let open = segments.last().unwrap();
    assert_eq!(open["state"], "InProgress");
    let ledger = open["ledger_id"].as_u64().unwrap().to_string();
    let before = json(&cluster.admin_ok(&["ledger", "show", &ledger, "--json"]));
    assert_eq!(before["metadata"]["state"], "Open");

    // Two recoveries at once, as separate processes.
    let args: Vec<String> = [
        "ledger",
        "recover",
        &ledger,
        "--json",
        "--zookeeper",
        &cluster.zookeeper(),
        "--zk-root",
        &cluster.zk_root,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let spawn = || {
        std::process::Command::new(quire_testkit::harness::quire_bin())
            .args(&args)
            .env("QUIRE_CLUSTER_SECRET_FILE", &cluster.secret_file)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    let (ma, mb) = (
        json(&String::from_utf8_lossy(&a.stdout))["metadata"].clone(),
        json(&String::from_utf8_lossy(&b.stdout))["metadata"].clone(),
    );
    assert_eq!(ma["state"], "Closed");
    assert_eq!(
        ma["last_entry"], mb["last_entry"],
        "the two recoveries disagree on the last entry"
    );
    assert_eq!(ma["length_bytes"], mb["length_bytes"]);
    let text = cluster.admin_ok(&["ledger", "show", &ledger]);
    assert!(text.contains("state:       Closed"), "{text}");
    assert!(
        text.contains(&format!("last entry:  {}", ma["last_entry"])),
        "{text}"
    );
    let again = cluster.admin_ok(&["ledger", "recover", &ledger]);
    assert!(again.contains("state Closed"), "{again}");

    // Everything acknowledged is there, once, in order, with identical replicas.
    let proxy = cluster.start_proxy(quire_testkit::free_port(), &[]);
    rt.block_on(async {
        let store = ZkStore::connect(
            &cluster.zookeeper(),
            &cluster.zk_root,
            Duration::from_millis(SESSION_TIMEOUT_MS),
        )
        .await
        .unwrap();
        let report = check_stream(&proxy.addr, &store, "recover/me", &acked, &[]).await;
        assert_eq!(report.records.len(), acked.len());
        assert!(
            report.replicas_read >= 3 * report.entries_checked,
            "every entry on its 3 bookies"
        );
    });
    proxy.stop();
    for b in bookies {
        b.stop();
    }
}

//! Goal: `ZooKeeperServer` starts a real server that answers on its port, and `stop` ends the
//! process and frees the port. Method: start, ask `ruok` and `srvr`, stop, then check that the
//! pid is gone (no /proc entry) and that the port refuses connections.

use quire_testkit::{four_letter_word, ZooKeeperServer};

#[test]
fn starts_answers_and_stops_by_pid() {
    let zk = ZooKeeperServer::start();
    assert_eq!(zk.four_letter_word("ruok").unwrap(), "imok");
    let srvr = zk.four_letter_word("srvr").unwrap();
    assert!(srvr.contains("Mode: standalone"), "srvr said: {srvr:?}");
    assert!(zk.connect_string().starts_with("127.0.0.1:"));
    let (pid, port) = (zk.pid().unwrap(), zk.port());
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    zk.stop();
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "server pid {pid} still exists"
    );
    assert!(
        four_letter_word(port, "ruok").is_err(),
        "port {port} still answers"
    );
}

#[test]
fn crashes_and_restarts_on_its_port_with_its_data() {
    // Goal: `crash` SIGKILLs the server (the port refuses), and `restart` brings it back on
    // the same port with the znodes it had (the chaos runner's ZooKeeper restart).
    // Method: create a znode through the port, crash, check the port refuses, restart, check
    // the znode is still there (a new session reads it).
    let mut zk = ZooKeeperServer::start();
    let port = zk.port();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let connect = zk.connect_string();
    rt.block_on(async {
        let client = zookeeper_client::Client::connector()
            .connect(&connect)
            .await
            .unwrap();
        let mode = zookeeper_client::CreateMode::Persistent;
        let acls = zookeeper_client::Acls::anyone_all();
        client
            .create("/kept", b"before", &mode.with_acls(acls))
            .await
            .unwrap();
    });
    let pid = zk.pid().unwrap();
    zk.crash();
    assert!(zk.pid().is_none());
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert!(
        four_letter_word(port, "ruok").is_err(),
        "port {port} answers after the crash"
    );
    zk.restart();
    assert_eq!(zk.port(), port);
    assert_eq!(zk.four_letter_word("ruok").unwrap(), "imok");
    rt.block_on(async {
        let client = zookeeper_client::Client::connector()
            .connect(&connect)
            .await
            .unwrap();
        let (data, _) = client.get_data("/kept").await.unwrap();
        assert_eq!(data, b"before");
    });
    zk.stop();
}

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

//! Goal: `quire bookie` and `quire proxy` processes started with `--metrics-listen` serve
//! `/healthz` (200 while serving) and `/metrics` with their own figures, and `quire bookie
//! info` reads a multi-process bookie. Method: a real ZooKeeper, one `quire bookie` and one
//! `quire proxy` child process on free 127.0.0.1 ports (E=Qw=Qa=1), one record written through
//! the proxy; scrape both endpoints; stop both with SIGTERM.

use quire_testkit::harness::cluster::Cluster;
use quire_testkit::harness::*;

use std::time::{Duration, Instant};

#[test]
fn bookie_and_proxy_processes_serve_metrics_and_health() {
    let cluster = Cluster::start();
    let port = quire_testkit::free_port();
    let bookie_metrics = format!("127.0.0.1:{}", quire_testkit::free_port());
    let bookie = cluster.start_bookie_with(1, port, &["--metrics-listen", &bookie_metrics]);
    // The serving line is printed after /healthz turned 200.
    assert_eq!(http_get(&bookie_metrics, "/healthz").0, 200);

    let proxy_metrics = format!("127.0.0.1:{}", quire_testkit::free_port());
    let proxy = cluster.start_proxy(
        quire_testkit::free_port(),
        &[
            "--ensemble-size",
            "1",
            "--write-quorum",
            "1",
            "--ack-quorum",
            "1",
            "--metrics-listen",
            &proxy_metrics,
        ],
    );
    assert_eq!(http_get(&proxy_metrics, "/healthz").0, 200);
    let out = run_quire(&["write", "m"], &proxy.addr, Some(b"hello\n"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let (status, text) = http_get(&proxy_metrics, "/metrics");
    assert_eq!(status, 200);
    assert_eq!(
        metric_sum(&text, "quire_proxy_requests_total", &[("op", "write")]),
        1.0
    );
    assert_eq!(metric_sum(&text, "quire_proxy_bytes_in_total", &[]), 5.0);
    assert_eq!(metric_sum(&text, "quire_proxy_streams_owned", &[]), 1.0);

    let id = format!("127.0.0.1:{port}");
    let (status, text) = http_get(&bookie_metrics, "/metrics");
    assert_eq!(status, 200);
    let me = [("bookie", id.as_str()), ("success", "true")];
    assert_eq!(
        metric_sum(&text, "bookkeeper_server_ADD_ENTRY_REQUEST_count", &me),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric_sum(&text, "bookie_SERVER_STATUS", &[("bookie", id.as_str())]),
        1.0
    );

    // The ledger appears in the published counts within 500 ms.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = std::process::Command::new(quire_bin())
            .args(["bookie", "info", &id, "--json"])
            .args(cluster.secret_flags())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["state"], "writable");
        if v["ledgers"] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ledger count never reached 1: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    proxy.stop();
    bookie.stop();
}

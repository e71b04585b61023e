//! Goal: `quire bookie` and `quire proxy` processes started with `--metrics-listen` serve
//! `/healthz` (200 while serving) and `/metrics` with their own figures, and `quire bookie
//! info` reads a multi-process bookie; fresh, they already expose every metric the Grafana
//! board (docs/grafana) and the alert rules (ansible/roles/monitoring) name, the request
//! errors at 0 with documented codes, and process and build information; after a write, the
//! per-stream and ledger client series. Method: a real ZooKeeper, one `quire bookie` and one
//! `quire proxy` child process on free 127.0.0.1 ports (E=Qw=Qa=1), both scraped before and
//! after one record written through the proxy; stop both with SIGTERM.

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
    fresh_processes_expose_what_dashboards_and_alerts_name(&bookie_metrics, &proxy_metrics);
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
    // Per stream and the ledger client's (issue 27 item 1).
    let m = [("stream", "m")];
    assert_eq!(
        metric_sum(&text, "quire_proxy_stream_records_total", &m),
        1.0
    );
    assert_eq!(metric_sum(&text, "quire_proxy_stream_bytes_total", &m), 5.0);
    assert_eq!(metric_sum(&text, "quire_proxy_stream_segments", &m), 1.0);
    // The in-progress segment's acknowledged bytes: the record set holding the 5 bytes.
    let retained = metric_sum(&text, "quire_proxy_stream_retained_bytes", &m);
    assert!((5.0..1024.0).contains(&retained), "{retained}\n{text}");
    assert!(metric_sum(&text, "quire_proxy_stream_last_write_seconds", &m) > 1e9);
    let bookie_id = format!("127.0.0.1:{port}");
    let b = [("bookie", bookie_id.as_str())];
    assert_eq!(
        metric_sum(&text, "quire_ledger_add_latency_count", &b),
        1.0,
        "{text}"
    );
    assert_eq!(metric_sum(&text, "quire_ledger_pending_adds", &[]), 0.0);
    assert_eq!(
        metric_sum(&text, "quire_zookeeper_sessions_connected", &[]),
        1.0
    );
    assert_eq!(
        metric_sum(&text, "quire_proxy_connections_accepted_total", &[]),
        1.0
    );

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

/// Every PromQL expression of the Grafana board and the alert rules.
fn dashboard_and_alert_expressions() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let board: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("docs/grafana/quire-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut board_exprs = Vec::new();
    crate::sandbox_metrics::collect_exprs(&board, &mut board_exprs);
    let mut exprs: Vec<(String, String)> = board_exprs
        .into_iter()
        .map(|e| ("grafana".to_string(), e))
        .collect();
    let rules =
        std::fs::read_to_string(root.join("ansible/roles/monitoring/templates/quire-rules.yml.j2"))
            .unwrap();
    for line in rules.lines() {
        if let Some(e) = line.trim().strip_prefix("expr:") {
            exprs.push(("alert rules".into(), e.trim().to_string()));
        }
    }
    exprs
}

/// Issue 27 item 1: a fresh bookie and proxy expose a series of every metric the board and
/// the alert rules read (else a panel says "No data" and an alert never fires on a healthy
/// cluster), the proxy's error counters at 0 with documented code names, and process and
/// build information.
fn fresh_processes_expose_what_dashboards_and_alerts_name(bookie: &str, proxy: &str) {
    let (_, b) = http_get(bookie, "/metrics");
    let (_, p) = http_get(proxy, "/metrics");
    let exposed: std::collections::BTreeSet<&str> = b
        .lines()
        .chain(p.lines())
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let exprs = dashboard_and_alert_expressions();
    assert!(exprs.len() > 30, "{exprs:?}");
    let mut missing = Vec::new();
    for (source, expr) in &exprs {
        for name in crate::sandbox_metrics::metric_names(expr) {
            // `up` is Prometheus's own (1 when the scrape succeeded). The ledger client's
            // per-bookie families and the owned streams' segment counts have a series from the
            // first add to a bookie, the first write to a stream, on: fresh, they must be
            // declared (and have a series after the write, checked in the test above).
            let family = name.trim_end_matches("_bucket").trim_end_matches("_total");
            let per_bookie_or_stream =
                name.starts_with("quire_ledger_add_") || name == "quire_proxy_stream_segments";
            let declared = per_bookie_or_stream && p.contains(&format!("# TYPE {family} "));
            if name != "up" && !exposed.contains(name.as_str()) && !declared {
                missing.push(format!("{name} ({source}: {expr})"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not exposed by a fresh bookie or proxy:\n{}",
        missing.join("\n")
    );
    // Issue 27: the retained bytes of owned streams and GC's rolls of the current entry log.
    assert!(
        p.contains("# TYPE quire_proxy_stream_retained_bytes gauge"),
        "{p}"
    );
    assert!(exposed.contains("bookie_gc_entry_logs_rolled_total"), "{b}");
    for want in [
        "quire_proxy_request_errors_total{op=\"write\",code=\"STORAGE_ERROR\"} 0",
        "quire_proxy_redirects_total{op=\"read\"} 0",
    ] {
        assert!(p.contains(want), "{want} missing:\n{p}");
    }
    for text in [&b, &p] {
        assert!(metric_sum(text, "process_resident_memory_bytes", &[]) > 1e6);
        assert!(metric_sum(text, "process_open_fds", &[]) > 3.0);
        assert_eq!(metric_sum(text, "quire_build_info", &[]), 1.0);
    }
}

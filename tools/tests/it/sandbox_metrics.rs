//! Goal: a sandbox started with `--metrics-listen` serves `/healthz` (200 once it serves) and
//! a `/metrics` whose add and journal-sync histograms count exactly the adds that a short load
//! made, and every metric the Grafana dashboard (docs/grafana/quire-dashboard.json) names is
//! one the processes export.
//!
//! Method: the real `quire sandbox` binary (3 bookies, E=3 Qw=3 Qa=2, O_DIRECT journals) with
//! the endpoint on a free port; N single-record writes, one at a time, through the proxy
//! client. The acknowledged DLSNs name the entries the proxy wrote. Reasoning for the exact
//! figures:
//! * each entry goes to all Qw = 3 bookies of its ensemble (E = Qw = 3), and nothing else is
//!   added (no segment rolls at the default 256 MiB), so once the third copy of the last entry
//!   landed, the bookies' successful `bookkeeper_server_ADD_ENTRY_REQUEST` count is exactly
//!   3 x entries; the answer to the writer needs only Qa = 2, so the scrape is retried until
//!   the third copies are in (bounded);
//! * every successful add request is exactly one journal add on its bookie:
//!   `bookie_journal_JOURNAL_ADD_ENTRY_count` equals it per bookie;
//! * group commit makes at least one and at most one fdatasync per add:
//!   1 <= `bookie_journal_JOURNAL_SYNC_count` <= adds, per bookie;
//! * the proxy counts N write requests, N write latencies and the payload bytes sent.

use quire_testkit::harness::*;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const WRITES: usize = 40;

#[test]
fn sandbox_metrics_count_the_adds_and_cover_the_dashboard() {
    let dir = temp_dir();
    let sandbox = Sandbox::start(dir.path(), &["--metrics-listen", "127.0.0.1:0"]);
    let maddr = sandbox
        .metrics_addr
        .clone()
        .expect("the sandbox prints its metrics address");
    let (status, body) = http_get(&maddr, "/healthz");
    assert_eq!((status, body.as_str()), (200, "ok\n"));

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut entries = BTreeSet::new();
    let mut payload_bytes = 0usize;
    runtime.block_on(async {
        let client = quire_client::ProxyClient::connect(sandbox.addr.as_str())
            .await
            .unwrap();
        for i in 0..WRITES {
            let payload = format!("record {i}").into_bytes();
            payload_bytes += payload.len();
            let w = client
                .write("metrics/stream", vec![(i as u64 + 1, payload)], true)
                .await
                .unwrap();
            assert_eq!(w.count, 1);
            entries.insert((w.first_dlsn.segment_seq_no, w.first_dlsn.entry_id));
        }
    });
    let entries = entries.len() as f64;
    assert!(entries >= 1.0);

    let add_ok = [("success", "true")];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, text) = http_get(&maddr, "/metrics");
        assert_eq!(status, 200);
        let adds = metric_sum(&text, "bookkeeper_server_ADD_ENTRY_REQUEST_count", &add_ok);
        if adds >= 3.0 * entries || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // A scrape is not one snapshot: it may read the journal's histograms before the last add
    // is journaled and the request histograms after it was answered. Once every add was
    // answered, a new scrape sees all of them everywhere.
    let (status, text) = http_get(&maddr, "/metrics");
    assert_eq!(status, 200);
    assert_eq!(
        metric_sum(&text, "bookkeeper_server_ADD_ENTRY_REQUEST_count", &add_ok),
        3.0 * entries,
        "{entries} entries written to 3 bookies each:\n{text}"
    );
    assert_eq!(
        metric_sum(
            &text,
            "bookkeeper_server_ADD_ENTRY_REQUEST_count",
            &[("success", "false")]
        ),
        0.0
    );
    for b in 1..=3 {
        let label = format!("bookie-{b}");
        let bookie = [("bookie", label.as_str())];
        let adds = metric_sum(
            &text,
            "bookkeeper_server_ADD_ENTRY_REQUEST_count",
            &[("bookie", label.as_str()), ("success", "true")],
        );
        assert_eq!(adds, entries, "{label}: every entry has a copy here");
        assert_eq!(
            metric_sum(&text, "bookie_journal_JOURNAL_ADD_ENTRY_count", &bookie),
            adds,
            "{label}: one journal add per add request"
        );
        let syncs = metric_sum(&text, "bookie_journal_JOURNAL_SYNC_count", &bookie);
        assert!(
            syncs >= 1.0 && syncs <= adds,
            "{label}: {syncs} syncs for {adds} adds"
        );
        assert!(metric_sum(&text, "bookie_journal_JOURNAL_SYNC_sum", &bookie) > 0.0);
        let inf = metric_sum(
            &text,
            "bookie_journal_JOURNAL_SYNC_bucket",
            &[("bookie", label.as_str()), ("le", "+Inf")],
        );
        assert_eq!(inf, syncs, "{label}: the +Inf bucket holds every sync");
        assert!(metric_sum(&text, "bookie_dir_used_bytes", &bookie) > 0.0);
    }
    let write = [("op", "write")];
    assert_eq!(
        metric_sum(&text, "quire_proxy_requests_total", &write),
        WRITES as f64
    );
    assert_eq!(
        metric_sum(&text, "quire_proxy_write_latency_count", &[]),
        WRITES as f64
    );
    assert_eq!(
        metric_sum(&text, "quire_proxy_bytes_in_total", &[]),
        payload_bytes as f64
    );
    assert_eq!(metric_sum(&text, "quire_proxy_streams_owned", &[]), 1.0);
    assert!(text.ends_with("# EOF\n"));

    // Every metric the dashboard names is exported.
    let dashboard = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/grafana/quire-dashboard.json");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&dashboard).unwrap()).unwrap();
    let mut exprs = Vec::new();
    collect_exprs(&json, &mut exprs);
    assert!(
        exprs.len() >= 10,
        "the dashboard has its queries: {exprs:?}"
    );
    let mut named = BTreeSet::new();
    for e in &exprs {
        named.extend(metric_names(e));
    }
    assert!(named.len() >= 10, "{named:?}");
    let families: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    for name in &named {
        // A sandbox runs no autorecovery daemon and no ZooKeeper session: those panels are
        // checked against a real bookie and proxy (cluster_metrics_endpoints).
        if NOT_IN_A_SANDBOX.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        let exported = ["", "_total", "_bucket", "_count", "_sum"]
            .iter()
            .any(|suffix| {
                name.strip_suffix(suffix)
                    .is_some_and(|base| families.contains(base))
            });
        assert!(
            exported,
            "the dashboard names {name}, which no process exports"
        );
    }
    sandbox.stop();
}

/// Name prefixes of the metrics a sandbox cannot export (autorecovery's, ZooKeeper sessions').
const NOT_IN_A_SANDBOX: &[&str] = &["auditor_", "replication_worker_", "quire_zookeeper_"];

/// Every `expr` string of a Grafana dashboard.
pub(crate) fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// The metric names a PromQL expression selects: identifiers outside label matchers, string
/// literals, range brackets and `by (...)`/`without (...)` lists, that are not function calls
/// or keywords.
pub(crate) fn metric_names(expr: &str) -> Vec<String> {
    const KEYWORDS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
    ];
    // Aggregation operators may be followed by `by (...)` before their parenthesis.
    const AGGREGATIONS: &[&str] = &[
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
    ];
    let b = expr.as_bytes();
    let mut names = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' => i = skip_to(b, i, b'}'),
            b'[' => i = skip_to(b, i, b']'),
            b'"' => i = skip_to(b, i + 1, b'"'),
            c if c.is_ascii_alphabetic() || c == b'_' || c == b'$' => {
                let start = i;
                while i < b.len()
                    && (b[i].is_ascii_alphanumeric()
                        || b[i] == b'_'
                        || b[i] == b':'
                        || b[i] == b'$')
                {
                    i += 1;
                }
                let word = &expr[start..i];
                let mut j = i;
                while j < b.len() && b[j] == b' ' {
                    j += 1;
                }
                let call = j < b.len() && b[j] == b'(';
                if AGGREGATIONS.contains(&word) {
                    // Not a name, whatever follows.
                } else if KEYWORDS.contains(&word) {
                    if call
                        && (word == "by" || word == "without" || word == "on" || word == "ignoring")
                    {
                        i = skip_to(b, j, b')');
                    }
                } else if !call && !word.starts_with('$') {
                    names.push(word.to_string());
                }
                continue;
            }
            c if c.is_ascii_digit() => {
                // A number (e.g. 0.99, 1e3): not a name.
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                    i += 1;
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    names
}

/// The index just past the first `close` at or after `from` (or the end).
fn skip_to(b: &[u8], from: usize, close: u8) -> usize {
    let mut i = from;
    while i < b.len() && b[i] != close {
        i += 1;
    }
    i + 1
}

#[test]
fn promql_names_are_found() {
    // Goal: the dashboard check above cannot pass by finding no names.
    let e = r#"histogram_quantile(0.99, sum by (le, bookie) (rate(bookie_journal_JOURNAL_SYNC_bucket{success="true",x=~"a b"}[$__rate_interval]))) / on (bookie) foo_total"#;
    assert_eq!(
        metric_names(e),
        vec![
            "bookie_journal_JOURNAL_SYNC_bucket".to_string(),
            "foo_total".to_string()
        ]
    );
    assert_eq!(
        metric_names("1 - a_free / a_total"),
        vec!["a_free", "a_total"]
    );
    assert_eq!(metric_names("min by (bookie) (up)"), vec!["up"]);
}

//! Goal: write rate limits and quotas (issue 29 item 4). Each hard limit answers
//! `OVER_CAPACITY` (517) with nothing written: per stream records/s (`[limits]
//! stream_records_per_sec`) and bytes/s (the stream's own limits, `quire stream limits`), per
//! token (the `[[token]]` entry's `records_per_sec`), per proxy (`proxy_records_per_sec`) and
//! outstanding writes; a soft limit only counts (`quire_proxy_limit_soft_exceeded_total`);
//! `quire stream limits` sets, shows (also in `stream show`, text and JSON) and clears a
//! stream's limits; the `Producer` backs off from `OVER_CAPACITY` and gets its writes in.
//!
//! Method: real ZooKeeper, three `quire bookie` and two `quire proxy` child processes (one with
//! tokens and per-stream defaults, one with a proxy-wide limit); writes with `ProxyClient` and
//! `Producer`, read back with `ProxyClient::read`; limits set with the `quire` CLI.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use quire_client::protocol::Token;
use quire_client::{ClientConfig, Producer, ProducerConfig, ProxyClient, ReadPosition};
use quire_proxy::ErrorCode;
use quire_testkit::harness::cluster::{runtime, Cluster};
use quire_testkit::harness::{http_get, quire_bin};

/// Runs `quire ARGS --proxy ADDR` with `QUIRE_TOKEN=token`; asserts success, returns stdout.
fn quire_ok(args: &[&str], addr: &str, token: &str) -> String {
    let out = Command::new(quire_bin())
        .args(args)
        .args(["--proxy", addr])
        .env("QUIRE_TOKEN", token)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "quire {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn records(first: u64, n: u64, size: usize) -> Vec<(u64, Vec<u8>)> {
    (first..first + n).map(|t| (t, vec![b'x'; size])).collect()
}

/// The `OVER_CAPACITY` error of `r`, with the scope and limit its message names.
fn over_capacity<T: std::fmt::Debug>(r: quire_client::Result<T>, scope_limit: &str) {
    match r {
        Err(e) => {
            assert_eq!(e.code(), ErrorCode::OverCapacity, "{e}");
            assert!(e.to_string().contains(scope_limit), "{e}");
        }
        Ok(v) => panic!("expected OVER_CAPACITY ({scope_limit}), got {v:?}"),
    }
}

async fn count(c: &ProxyClient, stream: &str) -> usize {
    c.read(stream, ReadPosition::Head, 10_000, 16 << 20, Duration::ZERO)
        .await
        .unwrap()
        .records
        .len()
}

/// A refused first write created nothing: the stream does not exist.
async fn absent(c: &ProxyClient, stream: &str) {
    let e = c.describe_stream(stream).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::NoSuchStream, "{e}");
}

fn metric(addr: &str, series: &str) -> f64 {
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200);
    body.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{body}"))
}

#[test]
fn each_limit_refuses_over_capacity_and_writes_nothing() {
    let cluster = Cluster::start();
    let digest = |t: &str| quire_proxy::auth::token_digest_hex(t.as_bytes());
    let tokens = cluster.dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nname = \"ops\"\nsha256 = \"{}\"\nread = [\"\"]\nwrite = [\"\"]\nadmin = [\"\"]\n\n\
             [[token]]\nname = \"tenant\"\nsha256 = \"{}\"\nread = [\"t/\"]\nwrite = [\"t/\"]\nrecords_per_sec = 30\n",
            digest("qt_ops"),
            digest("qt_tenant")
        ),
    )
    .unwrap();
    let _bookies: Vec<_> = (0..3)
        .map(|i| cluster.start_bookie(i, quire_testkit::free_port()))
        .collect();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let metrics = format!("127.0.0.1:{}", quire_testkit::free_port());
    // Each proxy's limits apply to the streams written through it, so each owns what it is
    // asked first: balanced ownership (on by default) is off here.
    let proxy = cluster.start_proxy_e3(&[
        "--auth-tokens-file",
        tokens.to_str().unwrap(),
        "--stream-records-per-sec",
        "100",
        "--metrics-listen",
        &metrics,
        "--balance-moves-per-sec",
        "0",
    ]);
    let wide = cluster.start_proxy_e3(&[
        "--proxy-records-per-sec",
        "20",
        "--balance-moves-per-sec",
        "0",
    ]);
    let (addr, wide_addr) = (proxy.addr.clone(), wide.addr.clone());
    let rt = runtime();
    rt.block_on(async {
        let with = |t: &str| ClientConfig {
            token: Some(Token(t.as_bytes().to_vec())),
            ..ClientConfig::default()
        };
        let ops = Arc::new(
            ProxyClient::connect_with(&addr, with("qt_ops"))
                .await
                .unwrap(),
        );

        // Per stream, records/s from [limits]: a second's worth passes, the next is refused.
        ops.write("s/rec", records(1, 100, 10), true).await.unwrap();
        over_capacity(
            ops.write("s/rec", records(101, 50, 10), true).await,
            "stream limit records",
        );
        assert_eq!(
            count(&ops, "s/rec").await,
            100,
            "nothing of the refused write"
        );

        // Per stream, bytes/s from the stream's own limits, set, shown and cleared by the CLI.
        ops.write("s/bytes", records(1, 1, 10), true).await.unwrap();
        let set = quire_ok(
            &["stream", "limits", "s/bytes", "--bytes-per-sec", "1000"],
            &addr,
            "qt_ops",
        );
        assert!(set.contains("limits: 1000 bytes/s (stream)"), "{set}");
        let show = quire_ok(&["stream", "show", "s/bytes"], &addr, "qt_ops");
        assert!(show.contains("limits: 1000 bytes/s (stream)"), "{show}");
        let json = quire_ok(&["stream", "show", "s/bytes", "--json"], &addr, "qt_ops");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["limits"]["bytes_per_sec"], 1000, "{json}");
        ops.write("s/bytes", records(2, 9, 100), true)
            .await
            .unwrap();
        over_capacity(
            ops.write("s/bytes", records(11, 5, 100), true).await,
            "stream limit bytes",
        );
        assert_eq!(count(&ops, "s/bytes").await, 10);
        let cleared = quire_ok(&["stream", "limits", "s/bytes", "default"], &addr, "qt_ops");
        assert!(cleared.contains("limits: proxy defaults"), "{cleared}");
        ops.write("s/bytes", records(11, 5, 100), true)
            .await
            .unwrap();

        // Per token: 30 records/s over all of the tenant's streams on this proxy.
        let tenant = ProxyClient::connect_with(&addr, with("qt_tenant"))
            .await
            .unwrap();
        tenant.write("t/a", records(1, 30, 10), true).await.unwrap();
        over_capacity(
            tenant.write("t/b", records(1, 10, 10), true).await,
            "token limit records",
        );
        absent(&ops, "t/b").await;

        // Soft: only counted (the first write over the soft rate fills the bucket's debt, the
        // second exceeds it).
        ops.write("s/soft", records(1, 1, 10), true).await.unwrap();
        quire_ok(
            &["stream", "limits", "s/soft", "--soft-records-per-sec", "5"],
            &addr,
            "qt_ops",
        );
        let soft = "quire_proxy_limit_soft_exceeded_total{scope=\"stream\",kind=\"records\"}";
        let before = metric(&metrics, soft);
        ops.write("s/soft", records(2, 20, 10), true).await.unwrap();
        ops.write("s/soft", records(22, 20, 10), true)
            .await
            .unwrap();
        assert_eq!(count(&ops, "s/soft").await, 41);
        assert!(metric(&metrics, soft) > before);

        // Outstanding writes: at most 1 unanswered write to s/out; 20 sent at once.
        ops.write("s/out", records(1, 1, 10), true).await.unwrap();
        quire_ok(
            &["stream", "limits", "s/out", "--outstanding-writes-max", "1"],
            &addr,
            "qt_ops",
        );
        let sends: Vec<_> = (0..20u64)
            .map(|i| {
                let c = ops.clone();
                tokio::spawn(async move { c.write("s/out", records(2 + i, 1, 10), true).await })
            })
            .collect();
        let (mut ok, mut refused) = (0, 0);
        for s in sends {
            match s.await.unwrap() {
                Ok(_) => ok += 1,
                Err(e) if e.code() == ErrorCode::OverCapacity => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(ok >= 1 && refused >= 1, "ok {ok}, refused {refused}");
        assert_eq!(count(&ops, "s/out").await, 1 + ok);
        let refused_series =
            "quire_proxy_limit_refused_total{scope=\"stream\",kind=\"outstanding\"}";
        assert!(metric(&metrics, refused_series) >= refused as f64);

        // Per proxy: 20 records/s on the second proxy, whatever the stream.
        let w = Arc::new(ProxyClient::connect(&wide_addr).await.unwrap());
        w.write("p/a", records(1, 20, 10), true).await.unwrap();
        over_capacity(
            w.write("p/b", records(1, 5, 10), true).await,
            "proxy limit records",
        );
        // The producer backs off and retries: 60 records in writes of 10 all get in (3 s of
        // the proxy's rate).
        w.create_stream("p/c").await.unwrap();
        let mut p = Producer::open(w.clone(), "p/c", ProducerConfig::default())
            .await
            .unwrap();
        for i in 0..6u64 {
            p.write(records(1 + 10 * i, 10, 10)).await.unwrap();
        }
        assert_eq!(count(&w, "p/c").await, 60);
        absent(&w, "p/b").await;
    });
}

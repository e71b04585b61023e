//! Goal: proxy tokens (issue 12 item 2, client part). A proxy started with
//! `--auth-tokens-file` refuses a client without a token or with an unknown one
//! (`UNAUTHENTICATED`, connection closed), and answers a request its token has no right for
//! with `REQUEST_DENIED` (nothing done, the connection stays usable), while each token does what
//! its read, write and admin prefixes allow; `quire token new` makes the file's entries and the
//! CLI sends `QUIRE_TOKEN`.
//!
//! Method: real ZooKeeper, three `quire bookie` and one `quire proxy` child process; tokens made
//! with `quire token new`; requests sent with `ProxyClient` and with `quire write`/`read`.

use std::process::Command;
use std::time::Duration;

use quire_client::protocol::Token;
use quire_client::{ClientConfig, ProxyClient, ReadPosition};
use quire_proxy::{Error, ErrorCode};
use quire_testkit::harness::cluster::{runtime, Cluster};
use quire_testkit::harness::quire_bin;

/// Runs `quire token new ARGS`; returns (token, file entry).
fn new_token(args: &[&str]) -> (String, String) {
    let out = Command::new(quire_bin())
        .args(["token", "new"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stderr)
        .unwrap()
        .lines()
        .last()
        .unwrap()
        .trim()
        .to_string();
    let entry = String::from_utf8(out.stdout).unwrap();
    assert!(
        !entry.contains(&token),
        "the file entry must not hold the token"
    );
    (token, entry)
}

async fn client(addr: &str, token: Option<&str>) -> Result<ProxyClient, Error> {
    let config = ClientConfig {
        token: token.map(|t| Token(t.as_bytes().to_vec())),
        ..ClientConfig::default()
    };
    ProxyClient::connect_with(addr, config).await
}

fn code(r: Result<impl std::fmt::Debug, Error>) -> ErrorCode {
    match r {
        Err(e) => e.code(),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

#[test]
fn each_token_does_what_its_rights_allow_and_nothing_else() {
    let (ingest, e1) = new_token(&["ingest", "--write", "logs/", "--read", "logs/"]);
    let (reader, e2) = new_token(&["reader", "--read", "logs/"]);
    let (ops, e3) = new_token(&["ops", "--admin", "", "--read", ""]);
    let cluster = Cluster::start();
    let tokens = cluster.dir.path().join("tokens.toml");
    std::fs::write(&tokens, format!("{e1}\n{e2}\n{e3}")).unwrap();
    let _bookies: Vec<_> = (0..3)
        .map(|i| cluster.start_bookie(i, quire_testkit::free_port()))
        .collect();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let proxy = cluster.start_proxy_e3(&["--auth-tokens-file", tokens.to_str().unwrap()]);
    let addr = proxy.addr.clone();
    let rt = runtime();
    rt.block_on(async {
        // No token, an unknown token: refused at the handshake.
        assert_eq!(
            code(client(&addr, None).await.map(|_| ())),
            ErrorCode::Unauthenticated
        );
        assert_eq!(
            code(client(&addr, Some("qt_guess")).await.map(|_| ())),
            ErrorCode::Unauthenticated
        );

        let records = |n: u64| {
            (1..=n)
                .map(|t| (t, format!("r{t}").into_bytes()))
                .collect::<Vec<_>>()
        };
        let w = client(&addr, Some(&ingest)).await.unwrap();
        w.write("logs/a", records(20), true).await.unwrap();
        assert_eq!(
            code(w.write("other/x", records(1), true).await),
            ErrorCode::RequestDenied
        );
        assert_eq!(
            code(w.delete_stream("logs/a").await),
            ErrorCode::RequestDenied
        );
        // The connection stays usable after a denial.
        w.write("logs/a", vec![(21, b"r21".to_vec())], false)
            .await
            .unwrap();

        let r = client(&addr, Some(&reader)).await.unwrap();
        let batch = r
            .read("logs/a", ReadPosition::Head, 100, 1 << 20, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(batch.records.len(), 21);
        assert_eq!(
            code(r.write("logs/a", vec![(22, b"x".to_vec())], false).await),
            ErrorCode::RequestDenied
        );
        assert_eq!(
            code(r.create_stream("logs/new").await),
            ErrorCode::RequestDenied
        );

        let o = client(&addr, Some(&ops)).await.unwrap();
        assert_eq!(
            code(o.create_stream("ops/only").await),
            ErrorCode::RequestDenied
        );
        // list streams shows what the token can read.
        let w2 = client(&addr, Some(&ingest)).await.unwrap();
        assert_eq!(
            code(w2.create_stream("ops/only").await),
            ErrorCode::RequestDenied
        );
        assert_eq!(r.list_streams().await.unwrap(), vec!["logs/a".to_string()]);
        let mut all = o.list_streams().await.unwrap();
        all.sort();
        assert_eq!(all, vec!["logs/a".to_string()]);
        o.delete_stream("logs/a").await.unwrap();
    });

    // The CLI sends QUIRE_TOKEN (or --token); without one it fails with one line.
    let cli = |token: Option<&str>, args: &[&str], stdin: &[u8]| {
        use std::io::Write;
        let mut cmd = Command::new(quire_bin());
        cmd.args(args)
            .args(["--proxy", &addr])
            .env_remove("QUIRE_PROXY")
            .env_remove("QUIRE_TOKEN");
        if let Some(t) = token {
            cmd.env("QUIRE_TOKEN", t);
        }
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A refused command may exit before reading its input (a closed pipe); its exit
        // status and stderr are what the test checks.
        match child.stdin.take().unwrap().write_all(stdin) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            r => r.unwrap(),
        }
        child.wait_with_output().unwrap()
    };
    let out = cli(Some(&ingest), &["write", "logs/cli"], b"one\ntwo\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(Some(&reader), &["read", "logs/cli"], b"");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "one\ntwo\n");
    let out = cli(None, &["read", "logs/cli"], b"");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("UNAUTHENTICATED"),
        "{stderr}"
    );
}

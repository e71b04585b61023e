//! Goal: a cluster with TLS on every port and client certificates required everywhere (issue
//! 12: mutual TLS between proxies and bookies, as BookKeeper's TLS client auth) serves its real
//! clients and nobody else. `quire write` and `quire read` with the CA and a client
//! certificate round-trip records through a TLS proxy that writes to TLS bookies; the same
//! commands without TLS, or without a client certificate, fail with one line naming TLS; a
//! ledger client (an admin tool's) with the real certificate makes ledgers on the bookies,
//! while one without a certificate, one with a certificate from another CA and one speaking
//! plain TCP are refused by every bookie. The cluster still serves after every refusal.
//! Method: real ZooKeeper (quire-testkit), three `quire bookie` and one `quire proxy` child
//! processes with the keys of `quire tls-certs` (a CA and one certificate for 127.0.0.1);
//! refusals are handshake failures, answered at once, so no timing is asserted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use quire_ledger::{BookKeeper, ClientConfig, LedgerOptions};
use quire_metadata::MetadataStore;
use quire_testkit::harness::cluster::{run, Cluster};
use quire_tls::ClientTls;

struct Pki {
    ca: String,
    cert: String,
    key: String,
}

fn options() -> LedgerOptions {
    LedgerOptions {
        ensemble_size: 3,
        write_quorum: 3,
        ack_quorum: 2,
        password: b"pw".to_vec(),
        custom: BTreeMap::new(),
    }
}

/// `quire ARGS --proxy ADDR` with `tls` flags, feeding `stdin`.
fn quire(args: &[&str], proxy: &str, tls: &[&str], stdin: Option<&[u8]>) -> std::process::Output {
    let mut all: Vec<&str> = args.to_vec();
    all.extend_from_slice(tls);
    quire_testkit::harness::run_quire(&all, proxy, stdin)
}

fn one_line_error(out: &std::process::Output) -> String {
    assert!(!out.status.success(), "the command should have failed");
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    eprintln!("refused with: {err}");
    err
}

#[test]
fn a_cluster_with_mutual_tls_serves_real_clients_and_refuses_strangers() {
    let cluster = Cluster::start();
    let certs = cluster.dir.path().join("tls");
    let out = run(&[
        "tls-certs".into(),
        "--out".into(),
        certs.display().to_string(),
        "--san".into(),
        "127.0.0.1".into(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pki = Pki {
        ca: certs.join("ca.pem").display().to_string(),
        cert: certs.join("node.pem").display().to_string(),
        key: certs.join("node.key").display().to_string(),
    };
    let server_flags = [
        "--tls-cert-file",
        pki.cert.as_str(),
        "--tls-key-file",
        pki.key.as_str(),
        "--tls-ca-file",
        pki.ca.as_str(),
        "--tls-client-auth",
        "require",
    ];
    let ports: Vec<u16> = (0..3).map(|_| quire_testkit::free_port()).collect();
    let _bookies: Vec<_> = (0..3)
        .map(|i| cluster.start_bookie_with(i, ports[i], &server_flags))
        .collect();
    let mut proxy_flags = server_flags.to_vec();
    proxy_flags.extend_from_slice(&[
        "--bookie-tls-ca-file",
        pki.ca.as_str(),
        "--bookie-tls-cert-file",
        pki.cert.as_str(),
        "--bookie-tls-key-file",
        pki.key.as_str(),
    ]);
    let proxy = cluster.start_proxy_e3(&proxy_flags);

    // The real client: CLI with the CA and the client certificate.
    let client_flags = [
        "--tls-ca-file",
        pki.ca.as_str(),
        "--tls-cert-file",
        pki.cert.as_str(),
        "--tls-key-file",
        pki.key.as_str(),
    ];
    let input: Vec<u8> = (0..200)
        .flat_map(|i| format!("record {i}\n").into_bytes())
        .collect();
    let out = quire(
        &["write", "tls/app"],
        &proxy.addr,
        &client_flags,
        Some(&input),
    );
    assert!(
        out.status.success(),
        "write: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = quire(&["read", "tls/app"], &proxy.addr, &client_flags, None);
    assert!(
        out.status.success(),
        "read: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, input, "read back what was written");

    // Plain TCP to the TLS proxy port.
    let err = one_line_error(&quire(&["read", "tls/app"], &proxy.addr, &[], None));
    assert!(err.contains("requires TLS"), "{err}");
    // TLS without a client certificate.
    let err = one_line_error(&quire(
        &["read", "tls/app"],
        &proxy.addr,
        &["--tls-ca-file", pki.ca.as_str()],
        None,
    ));
    assert!(err.contains("TLS") && err.contains("certificate"), "{err}");

    // `quire bookie info` asks a bookie directly: with the bookie TLS flags it is answered,
    // without them refused.
    let bookie = format!("127.0.0.1:{}", ports[0]);
    let out = run(&[
        "bookie".into(),
        "info".into(),
        bookie.clone(),
        "--bookie-tls-ca-file".into(),
        pki.ca.clone(),
        "--bookie-tls-cert-file".into(),
        pki.cert.clone(),
        "--bookie-tls-key-file".into(),
        pki.key.clone(),
        "--cluster-secret-file".into(),
        cluster.secret_file.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "bookie info: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("writable"));
    let out = run(&["bookie".into(), "info".into(), bookie]);
    one_line_error(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("expects TLS"), "names the cause: {err}");

    // Straight to the bookies, as an admin tool's ledger client.
    let runtime = quire_testkit::harness::cluster::runtime();
    runtime.block_on(async {
        let store: Arc<dyn MetadataStore> = Arc::new(cluster.zk_store().await);
        let client = |tls: Option<ClientTls>| {
            BookKeeper::new(
                store.clone(),
                ClientConfig {
                    request_timeout: Duration::from_secs(30),
                    tls: tls.map(|t| t.client_config().unwrap()),
                    cluster_secret: Some(cluster.secret),
                    ..ClientConfig::default()
                },
            )
        };
        let real = ClientTls {
            ca_file: pki.ca.clone().into(),
            cert_file: Some(pki.cert.clone().into()),
            key_file: Some(pki.key.clone().into()),
        };
        let writer = client(Some(real.clone()))
            .create_ledger(options())
            .await
            .unwrap();
        writer.add(b"admin".to_vec()).await.unwrap();
        writer.close().await.unwrap();

        let stranger_dir = cluster.dir.path().join("stranger");
        std::fs::create_dir_all(&stranger_dir).unwrap();
        let stranger = quire_tls::gen::write_pki(&stranger_dir, &["127.0.0.1".into()]).unwrap();
        let refused = [
            (
                "no client certificate",
                Some(ClientTls {
                    cert_file: None,
                    key_file: None,
                    ..real.clone()
                }),
            ),
            (
                "a certificate from another CA",
                Some(ClientTls {
                    cert_file: Some(stranger.cert_file.clone()),
                    key_file: Some(stranger.key_file.clone()),
                    ..real.clone()
                }),
            ),
            ("plain TCP", None),
        ];
        for (what, tls) in refused {
            match client(tls).create_ledger(options()).await {
                Ok(w) => panic!("{what}: a stranger made ledger {:?} on the bookies", w.id()),
                Err(e) => {
                    eprintln!("{what}: refused: {e}");
                    let e = e.to_string();
                    assert!(e.contains("alert") || e.contains("TLS"), "{what}: {e}");
                }
            }
        }
    });

    // Still serving the real clients.
    let out = quire(&["read", "tls/app"], &proxy.addr, &client_flags, None);
    assert!(
        out.status.success(),
        "read: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, input);
}

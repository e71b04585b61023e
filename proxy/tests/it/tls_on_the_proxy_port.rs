//! Goal: with TLS and required client certificates on the proxy port, a `ProxyClient` with a
//! certificate from the proxy's CA writes and reads, and the others are refused with one line
//! each (`Error::Tls`): no client certificate, a certificate from another CA, a client that
//! does not trust the proxy's CA, a plaintext client; a TLS client is refused by a plaintext
//! proxy the same way. The proxy keeps serving after every refusal.
//! Method: a real cluster (three plain bookies, embedded store) behind a `ProxyServer` with a
//! test CA from rcgen (IP SAN 127.0.0.1). No timing assertions.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use quire_client::{ClientConfig, ProxyClient, ReadPosition};
use quire_ledger::BookKeeper;
use quire_proxy::{Error, ProxyServer, ServerConfig, StreamManager};
use quire_tls::gen::{write_file, write_pki, Ca, PkiFiles};
use quire_tls::{ClientAuth, ClientTls, ServerTls};

async fn proxy_with(
    c: &common::Cluster,
    server: ServerConfig,
) -> (Arc<StreamManager>, ProxyServer) {
    let bk = BookKeeper::new(c.store.clone(), quire_ledger::ClientConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = common::small_config();
    config.owner_address = listener.local_addr().unwrap().to_string();
    let streams = StreamManager::new(c.store.clone(), bk, config);
    let server = ProxyServer::start(listener, streams.clone(), server).unwrap();
    (streams, server)
}

fn client_config(tls: Option<ClientTls>) -> ClientConfig {
    ClientConfig {
        tls: tls.map(|t| t.client_config().unwrap()),
        ..ClientConfig::default()
    }
}

fn mutual(pki: &PkiFiles) -> ClientTls {
    ClientTls {
        ca_file: pki.ca_file.clone(),
        cert_file: Some(pki.cert_file.clone()),
        key_file: Some(pki.key_file.clone()),
    }
}

/// Connects and makes one request: with TLS 1.3 a refused client certificate shows only at the
/// first read after the handshake.
async fn refused(addr: std::net::SocketAddr, config: ClientConfig) -> Error {
    let result = match ProxyClient::connect_with(addr, config).await {
        Ok(client) => client.list_streams().await.map(|_| ()),
        Err(e) => Err(e),
    };
    let e = result.expect_err("a client that should be refused was served");
    eprintln!("refused: {e}");
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_requiring_client_certificates_serves_only_clients_the_ca_signed() {
    let c = common::cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let pki = write_pki(dir.path(), &["127.0.0.1".into()]).unwrap();
    let server_tls = ServerTls {
        cert_file: pki.cert_file.clone(),
        key_file: pki.key_file.clone(),
        ca_file: Some(pki.ca_file.clone()),
        client_auth: ClientAuth::Require,
    };
    let (_streams, server) = proxy_with(
        &c,
        ServerConfig {
            tls: Some(server_tls.server_config().unwrap()),
            ..ServerConfig::default()
        },
    )
    .await;
    let addr = server.local_addr();

    let good = ProxyClient::connect_with(addr, client_config(Some(mutual(&pki))))
        .await
        .unwrap();
    good.create_stream("tls/app").await.unwrap();
    let records = (0..50u64).map(|i| (i, common::payload(i))).collect();
    assert_eq!(
        good.write("tls/app", records, false).await.unwrap().count,
        50
    );

    // No client certificate.
    let anonymous = ClientTls {
        cert_file: None,
        key_file: None,
        ..mutual(&pki)
    };
    let e = refused(addr, client_config(Some(anonymous))).await;
    assert!(matches!(e, Error::Tls { .. }), "{e}");
    assert!(e.to_string().contains("alert"), "{e}");

    // A certificate another CA signed.
    let other = Ca::new("stranger CA").unwrap();
    let (cert, key) = other.issue("stranger", &["127.0.0.1".into()]).unwrap();
    let (cert_file, key_file) = (dir.path().join("s.pem"), dir.path().join("s.key"));
    write_file(&cert_file, &cert, false).unwrap();
    write_file(&key_file, &key, true).unwrap();
    let stranger = ClientTls {
        ca_file: pki.ca_file.clone(),
        cert_file: Some(cert_file),
        key_file: Some(key_file),
    };
    let e = refused(addr, client_config(Some(stranger))).await;
    assert!(matches!(e, Error::Tls { .. }), "{e}");
    assert!(e.to_string().contains("alert"), "{e}");

    // A client that does not trust the proxy's CA.
    let other_ca_file = dir.path().join("other-ca.pem");
    write_file(&other_ca_file, &other.cert_pem(), false).unwrap();
    let distrustful = ClientTls {
        ca_file: other_ca_file,
        ..mutual(&pki)
    };
    let e = refused(addr, client_config(Some(distrustful))).await;
    assert!(matches!(e, Error::Tls { .. }), "{e}");
    assert!(e.to_string().contains("UnknownIssuer"), "{e}");

    // A plaintext client.
    let e = refused(addr, client_config(None)).await;
    assert!(matches!(e, Error::Tls { .. }), "{e}");
    assert!(e.to_string().contains("requires TLS"), "{e}");

    // The real client never noticed: it reads everything back.
    let batch = good
        .read("tls/app", ReadPosition::Head, 100, 1 << 20, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(batch.records.len(), 50);
    for (i, (_, txid, payload)) in batch.records.iter().enumerate() {
        assert_eq!(*txid, i as u64);
        assert_eq!(payload, &common::payload(i as u64));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_is_refused_by_a_plaintext_proxy_with_one_line() {
    let c = common::cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let pki = write_pki(dir.path(), &["127.0.0.1".into()]).unwrap();
    let (_streams, server) = proxy_with(&c, ServerConfig::default()).await;
    let e = refused(server.local_addr(), client_config(Some(mutual(&pki)))).await;
    assert!(matches!(e, Error::Tls { .. }), "{e}");
    assert!(e.to_string().contains("plaintext"), "{e}");
    // Still serving plain clients.
    let plain = ProxyClient::connect(server.local_addr()).await.unwrap();
    plain.create_stream("plain/app").await.unwrap();
}

//! Goal: with TLS and required client auth on the bookie port (BookKeeper's
//! `tlsClientAuthentication`), a ledger client with a certificate from the bookies' CA writes
//! and reads, and every other client is refused with a one-line reason: one without a client
//! certificate, one whose certificate another CA signed, one that speaks plain TCP; and a TLS
//! client is refused by a plaintext bookie. The bookie keeps serving the good client after
//! each refusal (nothing panicked).
//! Method: three real bookies with a test CA from rcgen (IP SAN 127.0.0.1); each client makes
//! a ledger (E=3, Qw=3, Qa=2). No timing assertions: refusals are handshake failures, answered
//! at once; the request timeout is long.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quire_ledger::{BookKeeper, ClientConfig, LedgerOptions};
use quire_metadata::{EmbeddedStore, MetadataStore};
use quire_testkit::bookies::{small_bookie_config, start_registered_bookie};
use quire_tls::gen::{write_file, write_pki, Ca};
use quire_tls::{ClientAuth, ClientTls, ServerTls};

fn options() -> LedgerOptions {
    LedgerOptions {
        ensemble_size: 3,
        write_quorum: 3,
        ack_quorum: 2,
        password: b"pw".to_vec(),
        custom: BTreeMap::new(),
    }
}

fn client(store: &Arc<dyn MetadataStore>, tls: Option<ClientTls>) -> BookKeeper {
    let config = ClientConfig {
        request_timeout: Duration::from_secs(30),
        tls: tls.map(|t| t.client_config().expect("client TLS config")),
        ..ClientConfig::default()
    };
    BookKeeper::new(store.clone(), config)
}

/// The reason of a refused ledger creation (the client tries every bookie, then gives up).
async fn refused(bk: &BookKeeper) -> String {
    let started = std::time::Instant::now();
    match bk.create_ledger(options()).await {
        Ok(w) => panic!(
            "ledger {:?} created by a client that should be refused",
            w.id()
        ),
        Err(e) => {
            // For the test log: what a user would see, and how long it took.
            eprintln!("refused after {:?}: {e}", started.elapsed());
            e.to_string()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookies_requiring_client_certificates_serve_only_clients_the_ca_signed() {
    let dir = tempfile::Builder::new()
        .prefix("quire-tls-bookies-")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let pki = write_pki(dir.path(), &["127.0.0.1".into()]).unwrap();
    let store = EmbeddedStore::open(&dir.path().join("meta")).unwrap();
    let mut bookies = Vec::new();
    for i in 0..3 {
        let mut config = small_bookie_config(dir.path(), i, SocketAddr::from(([127, 0, 0, 1], 0)));
        config.tls = Some(ServerTls {
            cert_file: pki.cert_file.clone(),
            key_file: pki.key_file.clone(),
            ca_file: Some(pki.ca_file.clone()),
            client_auth: ClientAuth::Require,
        });
        bookies.push(start_registered_bookie(config, &store).await);
    }
    let store: Arc<dyn MetadataStore> = Arc::new(store);

    // The real client: trusts the CA, presents a certificate it signed.
    let good = client(
        &store,
        Some(ClientTls {
            ca_file: pki.ca_file.clone(),
            cert_file: Some(pki.cert_file.clone()),
            key_file: Some(pki.key_file.clone()),
        }),
    );
    let writer = good.create_ledger(options()).await.unwrap();
    for i in 0..20u32 {
        writer.add(format!("entry {i}").into_bytes()).await.unwrap();
    }

    // No client certificate: the bookies end the handshake.
    let anonymous = client(
        &store,
        Some(ClientTls {
            ca_file: pki.ca_file.clone(),
            cert_file: None,
            key_file: None,
        }),
    );
    let reason = refused(&anonymous).await;
    assert!(reason.contains("alert"), "{reason}");

    // A certificate from another CA (a stranger's), trusting the real CA for the server.
    let other_ca = Ca::new("stranger CA").unwrap();
    let (cert, key) = other_ca.issue("stranger", &["127.0.0.1".into()]).unwrap();
    let stranger_cert = dir.path().join("stranger.pem");
    let stranger_key = dir.path().join("stranger.key");
    write_file(&stranger_cert, &cert, false).unwrap();
    write_file(&stranger_key, &key, true).unwrap();
    let stranger = client(
        &store,
        Some(ClientTls {
            ca_file: pki.ca_file.clone(),
            cert_file: Some(stranger_cert),
            key_file: Some(stranger_key),
        }),
    );
    let reason = refused(&stranger).await;
    assert!(reason.contains("alert"), "{reason}");

    // A client that trusts another CA refuses the bookies' certificate itself.
    let other_ca_file = dir.path().join("other-ca.pem");
    write_file(&other_ca_file, &other_ca.cert_pem(), false).unwrap();
    let distrustful = client(
        &store,
        Some(ClientTls {
            ca_file: other_ca_file,
            cert_file: None,
            key_file: None,
        }),
    );
    let reason = refused(&distrustful).await;
    assert!(reason.contains("TLS handshake"), "{reason}");

    // Plain TCP to a TLS port: the client says the bookie speaks TLS.
    let plain = client(&store, None);
    let reason = refused(&plain).await;
    assert!(reason.contains("answered with TLS"), "{reason}");

    // The real client was never disturbed: it goes on and reads everything back.
    for i in 20..30u32 {
        writer.add(format!("entry {i}").into_bytes()).await.unwrap();
    }
    writer.close().await.unwrap();
    let reader = good.open_ledger(writer.id()).await.unwrap();
    for i in 0..30u32 {
        let data = reader
            .read(quire_wire::EntryId(u64::from(i)))
            .await
            .unwrap();
        assert_eq!(data, format!("entry {i}").into_bytes());
    }
    shutdown(bookies).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_is_refused_by_a_plaintext_bookie_with_a_clear_reason() {
    let dir = tempfile::Builder::new()
        .prefix("quire-tls-plain-")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let pki = write_pki(dir.path(), &["127.0.0.1".into()]).unwrap();
    let store = EmbeddedStore::open(&dir.path().join("meta")).unwrap();
    let mut bookies = Vec::new();
    for i in 0..3 {
        let config = small_bookie_config(dir.path(), i, SocketAddr::from(([127, 0, 0, 1], 0)));
        bookies.push(start_registered_bookie(config, &store).await);
    }
    let store: Arc<dyn MetadataStore> = Arc::new(store);
    let tls = client(
        &store,
        Some(ClientTls {
            ca_file: pki.ca_file.clone(),
            cert_file: Some(pki.cert_file.clone()),
            key_file: Some(pki.key_file.clone()),
        }),
    );
    let reason = refused(&tls).await;
    assert!(
        reason.contains("TLS handshake") && reason.contains("plaintext"),
        "{reason}"
    );
    // The bookies still serve plain clients.
    let plain = client(&store, None);
    let writer = plain.create_ledger(options()).await.unwrap();
    writer.add(b"after".to_vec()).await.unwrap();
    writer.close().await.unwrap();
    shutdown(bookies).await;
}

async fn shutdown(bookies: Vec<quire_bookie::Bookie>) {
    for b in bookies {
        tokio::task::spawn_blocking(move || b.shutdown().unwrap())
            .await
            .unwrap();
    }
}

//! Shared helpers for the proxy integration tests: three real bookies (one shard each) on
//! 127.0.0.1 with their directories under /tmp, the embedded metadata store, a stream manager
//! with small segments, and a proxy server on a free port.
#![allow(dead_code)]

use std::sync::Arc;

use quire_bookie::Bookie;
use quire_ledger::BookKeeper;
use quire_metadata::{EmbeddedStore, MetadataStore};
use quire_proxy::{ProxyServer, ServerConfig, StreamConfig, StreamManager};

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub bookies: Vec<Bookie>,
    pub store: Arc<dyn MetadataStore>,
}

pub mod revocable;

/// Three bookies registered in a fresh embedded store.
pub async fn cluster() -> Cluster {
    let dir = tempfile::Builder::new()
        .prefix("quire-proxy-test-")
        .tempdir_in("/tmp")
        .unwrap();
    let store = EmbeddedStore::open(&dir.path().join("meta")).unwrap();
    cluster_with(dir, Arc::new(store)).await
}

/// Three bookies registered in a fresh embedded store wrapped so that leases can be revoked.
pub async fn cluster_revocable() -> (Cluster, Arc<revocable::Revocable>) {
    let dir = tempfile::Builder::new()
        .prefix("quire-proxy-test-")
        .tempdir_in("/tmp")
        .unwrap();
    let store = revocable::Revocable::new(EmbeddedStore::open(&dir.path().join("meta")).unwrap());
    (cluster_with(dir, store.clone()).await, store)
}

/// Three bookies (directories under `dir`) registered in `store`.
pub async fn cluster_with(dir: tempfile::TempDir, store: Arc<dyn MetadataStore>) -> Cluster {
    let bookies = quire_testkit::bookies::start_registered_bookies(dir.path(), 3, &*store).await;
    Cluster {
        dir,
        bookies,
        store,
    }
}

/// Small segments (64 KiB) and entries (8 KiB), so a few hundred KiB span several segments.
pub fn small_config() -> StreamConfig {
    StreamConfig {
        segment_size_bytes_max: 64 * 1024,
        entry_size_bytes_target: 8 * 1024,
        ..StreamConfig::default()
    }
}

pub struct Proxy {
    pub streams: Arc<StreamManager>,
    pub server: ProxyServer,
}

/// A stream manager over the cluster and a proxy server in front of it; the manager's owner
/// identity is the server's address.
pub async fn proxy(c: &Cluster, config: StreamConfig) -> Proxy {
    proxy_on(c.store.clone(), config).await
}

/// As [`proxy`], over any metadata store (the bookies must be registered in it).
pub async fn proxy_on(store: Arc<dyn MetadataStore>, mut config: StreamConfig) -> Proxy {
    let bk = BookKeeper::new(store.clone(), quire_ledger::ClientConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    config.owner_address = listener.local_addr().unwrap().to_string();
    let streams = StreamManager::new(store, bk, config);
    let server = ProxyServer::start(listener, streams.clone(), ServerConfig::default()).unwrap();
    Proxy { streams, server }
}

/// Deterministic payload of record `i`: 50 to 549 bytes derived from `i`.
pub fn payload(i: u64) -> Vec<u8> {
    let len = 50 + (i * 7919 % 500) as usize;
    (0..len).map(|k| (i as usize * 31 + k) as u8).collect()
}

/// Waits (bounded, 10 s) until nobody owns `stream`, e.g. after a dropped proxy's stream task
/// gave its lease up.
pub async fn wait_unowned(store: &Arc<dyn MetadataStore>, stream: &str) {
    for _ in 0..1000 {
        if store.stream_owner(stream).await.unwrap().is_none() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("stream {stream} still owned after 10 s");
}

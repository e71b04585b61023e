//! Shared helpers for the proxy integration tests: three real bookies (one shard each) on
//! 127.0.0.1 with their directories under /tmp, the embedded metadata store, a stream manager
//! with small segments, and a proxy server on a free port.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use quire_bookie::Bookie;
use quire_ledger::BookKeeper;
use quire_metadata::{EmbeddedStore, MetadataStore};
use quire_proxy::{ProxyServer, ServerConfig, StreamConfig, StreamManager};

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub bookies: Vec<Bookie>,
    pub store: Arc<dyn MetadataStore>,
}

pub mod raw;
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
    // These tests have a stream owned by the first proxy asked (redirects, take-overs, leases
    // between two proxies), so balanced ownership, on by default, is off here; it is tested
    // with real processes in tools/tests/it/cluster_balanced_ownership.rs.
    config.balance_moves_per_sec = 0;
    let streams = StreamManager::new(store, bk, config);
    let server = ProxyServer::start(listener, streams.clone(), ServerConfig::default()).unwrap();
    Proxy { streams, server }
}

/// Deterministic payload of record `i`: 50 to 549 bytes derived from `i`.
pub fn payload(i: u64) -> Vec<u8> {
    let len = 50 + (i * 7919 % 500) as usize;
    (0..len).map(|k| (i as usize * 31 + k) as u8).collect()
}

/// Every record of `stream` from its head, `(dlsn, txid, payload)`, in pages of 500.
pub async fn read_all(
    client: &quire_client::ProxyClient,
    stream: &str,
) -> Vec<(quire_client::Dlsn, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pos = quire_client::ReadPosition::Head;
    loop {
        let b = client
            .read(stream, pos, 500, 1 << 20, Duration::ZERO)
            .await
            .unwrap();
        if b.records.is_empty() {
            return out;
        }
        out.extend(b.records);
        pos = b.next;
    }
}

/// Records `first_txid .. first_txid + n`, each with txid `t` and payload [`payload`]`(t)`.
pub fn batch(first_txid: u64, n: u64) -> Vec<(u64, Vec<u8>)> {
    (first_txid..first_txid + n)
        .map(|t| (t, payload(t)))
        .collect()
}

/// Checks that `got` (as [`read_all`] returns it) holds exactly the acknowledged `expected`
/// `(txid, payload)` records, in order, at strictly increasing DLSNs.
pub fn assert_reads_back(got: &[(quire_client::Dlsn, u64, Vec<u8>)], expected: &[(u64, Vec<u8>)]) {
    let data: Vec<(u64, Vec<u8>)> = got.iter().map(|(_, t, d)| (*t, d.clone())).collect();
    assert_eq!(data.len(), expected.len(), "record count");
    assert!(
        data == expected,
        "records differ from the acknowledged ones"
    );
    assert!(
        got.windows(2).all(|w| w[0].0 < w[1].0),
        "DLSNs strictly increase"
    );
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

/// Three bookies like [`cluster`]'s, with garbage collection every second (a major compaction
/// due at each run), 64 KiB entry logs and 200 ms checkpoints, their questions answered from
/// the store (only a definite "no such ledger" counts as deleted, as in `quire`'s answerer).
/// Why these sizes: only whole entry logs other than the one being appended to are deleted or
/// compacted, and deleted ledgers' entries share logs with kept ones, so a bookie's disk use
/// goes down only once its logs roll and get compacted.
pub async fn cluster_with_gc() -> Cluster {
    let dir = tempfile::Builder::new()
        .prefix("quire-proxy-test-")
        .tempdir_in("/tmp")
        .unwrap();
    let store: Arc<dyn MetadataStore> =
        Arc::new(EmbeddedStore::open(&dir.path().join("meta")).unwrap());
    let (gc, queries) = quire_bookie::deleted_ledgers_channel();
    let answer_store = store.clone();
    tokio::spawn(async move {
        while let Some(q) = queries.next().await {
            let mut deleted = Vec::new();
            for &id in &q.candidates {
                match answer_store.read_ledger(quire_wire::LedgerId(id)).await {
                    Ok(_) => {}
                    Err(quire_metadata::Error::NotFound { .. }) => deleted.push(id),
                    Err(_) => {
                        deleted.clear();
                        break;
                    }
                }
            }
            q.answer(deleted);
        }
    });
    let mut bookies = Vec::new();
    for i in 0..3 {
        let mut config = quire_testkit::bookies::small_bookie_config(
            dir.path(),
            i,
            std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        );
        config.gc_interval = Duration::from_secs(1);
        config.gc_deleted_ledgers = Some(gc.clone());
        config.engine.major_compaction_interval = Duration::from_secs(1);
        config.engine.entry_log_size_bytes_max = 64 * 1024;
        config.engine.checkpoint_interval = Duration::from_millis(200);
        bookies.push(quire_testkit::bookies::start_registered_bookie(config, &*store).await);
    }
    Cluster {
        dir,
        bookies,
        store,
    }
}

/// Each bookie's ledger directory (`bookie{i}/ledgers`, as `quire_testkit::bookies` lays
/// them out).
pub fn ledger_dirs(c: &Cluster) -> Vec<PathBuf> {
    (0..c.bookies.len())
        .map(|i| c.dir.path().join(format!("bookie{i}/ledgers")))
        .collect()
}

/// Every bookie's entry-log bytes once checkpoints (every 200 ms) have moved the written
/// entries into entry logs: the same figures on three readings 500 ms apart
/// (`quire_testkit::reclaim`, off the runtime's workers).
pub async fn settled_entry_log_bytes(c: &Cluster) -> Vec<u64> {
    let dirs = ledger_dirs(c);
    tokio::task::spawn_blocking(move || {
        quire_testkit::reclaim::settled_entry_log_bytes(
            &dirs,
            Duration::from_millis(500),
            3,
            Duration::from_secs(30),
        )
    })
    .await
    .unwrap()
}

/// Waits (up to 30 s) until every bookie's GC has tombstoned `deleted` and its entry-log bytes
/// went below `before`.
pub async fn wait_until_reclaimed(c: &Cluster, before: &[u64], deleted: BTreeSet<u64>) {
    let dirs = ledger_dirs(c);
    let before = before.to_vec();
    tokio::task::spawn_blocking(move || {
        quire_testkit::reclaim::wait_until_reclaimed(
            &dirs,
            &before,
            &deleted,
            Duration::from_secs(30),
        )
    })
    .await
    .unwrap();
}

//! Real bookies for tests (feature `bookies`): one-shard `quire-bookie` servers on 127.0.0.1
//! with O_DIRECT journals and entry logs under a test's temporary directory, registered as
//! writable in a metadata store, as a running bookie registers itself (BookKeeper's
//! `available` bookies).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use quire_bookie::{Bookie, BookieConfig};
use quire_metadata::{BookieId, BookieInfo, MetadataStore};

/// The configuration tests use for bookie `i` under `dir`: journal in `dir/bookie{i}/journal`,
/// entry logs in `dir/bookie{i}/ledgers`, listening on `addr` (`127.0.0.1:0` for a free port),
/// one shard, 1 MiB of DMA memory (the memlock limit here is 8 MiB) and 1 MiB journal files.
/// The same `dir` and `i` give the same directories, so a test can restart a bookie on its data.
/// The disk usage threshold is 100 %: `dir` is on the host's disk, shared with other work that
/// decides its usage (a CI machine was seen at 98 %, above the 0.95 default), so only a really
/// full disk turns these bookies read-only; tests of read-only mode set their own thresholds.
pub fn small_bookie_config(dir: &Path, i: usize, addr: SocketAddr) -> BookieConfig {
    let root = dir.join(format!("bookie{i}"));
    let mut config = BookieConfig::new(addr, root.join("journal"), root.join("ledgers"));
    config.shards = 1;
    config.io_memory_bytes = 1 << 20;
    config.engine.journal_file_size_bytes = 1 << 20;
    config.disk_usage_threshold = 1.0;
    config.disk_usage_lwm_threshold = 0.99;
    config
}

/// Starts a bookie (on tokio's blocking pool: `Bookie::start` waits for its shards) and
/// registers it as a writable bookie in `store` under its listening address.
///
/// # Panics
/// This is a test helper: it panics when the bookie cannot start or register.
pub async fn start_registered_bookie(config: BookieConfig, store: &dyn MetadataStore) -> Bookie {
    let bookie = tokio::task::spawn_blocking(move || Bookie::start(config))
        .await
        .expect("bookie start task")
        .expect("start bookie");
    store
        .register_bookie(BookieInfo {
            id: BookieId(bookie.addr().to_string()),
            rack: None,
            region: None,
            read_only: false,
        })
        .await
        .expect("register bookie");
    bookie
}

/// Starts `n` bookies with [`small_bookie_config`] (`i` in `0..n`, free ports) and registers
/// each in `store`.
///
/// # Panics
/// As [`start_registered_bookie`].
pub async fn start_registered_bookies(
    dir: &Path,
    n: usize,
    store: &dyn MetadataStore,
) -> Vec<Bookie> {
    let mut bookies = Vec::with_capacity(n);
    for i in 0..n {
        let config = small_bookie_config(dir, i, SocketAddr::from(([127, 0, 0, 1], 0)));
        bookies.push(start_registered_bookie(config, store).await);
    }
    bookies
}

/// Keeps `bookie`'s registration in `store` in step with its read-only state, as the bookie
/// process does (BookKeeper moves the registration to `available/readonly`): at every
/// transition it registers again with the current `read_only` flag. The task ends when the
/// bookie's state handle is dropped; abort it to stop earlier.
pub fn follow_read_only(
    bookie: &Bookie,
    store: Arc<dyn MetadataStore>,
) -> tokio::task::JoinHandle<()> {
    let state = bookie.read_only_state();
    let changes = state.subscribe();
    let id = BookieId(bookie.addr().to_string());
    tokio::spawn(async move {
        while changes.recv_async().await.is_ok() {
            while changes.try_recv().is_ok() {}
            let info = BookieInfo {
                id: id.clone(),
                rack: None,
                region: None,
                read_only: state.is_read_only(),
            };
            if let Err(e) = store.register_bookie(info).await {
                eprintln!("bookie {id}: cannot update the registration: {e}");
            }
        }
    })
}

//! A small cluster for the tests: real bookies registered in an embedded store, a ledger
//! client, and ledgers written and closed through it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use quire_autorecovery::AutorecoveryOptions;
use quire_bookie::Bookie;
use quire_ledger::{BookKeeper, ClientConfig, LedgerOptions};
use quire_metadata::{
    BookieId, Cookie, EmbeddedStore, LedgerMetadata, MetadataStore, COOKIE_FORMAT_VERSION,
};
use quire_testkit::bookies::start_registered_bookies;
use quire_wire::{EntryId, LedgerId};

/// Bookies, an embedded store they are registered in, and a ledger client on it.
pub struct Cluster {
    _dir: tempfile::TempDir,
    pub store: Arc<EmbeddedStore>,
    pub bookies: Vec<Option<Bookie>>,
    pub bk: BookKeeper,
}

/// Options for tests: a 300 ms lost-bookie delay, no grace for open ledgers, 50 ms polls, no
/// periodic check unless a test sets one.
pub fn options() -> AutorecoveryOptions {
    AutorecoveryOptions {
        lost_bookie_recovery_delay: Duration::from_millis(300),
        open_ledger_grace: Duration::ZERO,
        poll_interval: Duration::from_millis(50),
        periodic_check_interval: None,
        replication_rate_bytes: None,
        bookie_tls: None,
        cluster_secret: None,
        placement: Default::default(),
    }
}

/// Starts `n` bookies registered in a new embedded store.
pub async fn cluster(n: usize) -> Cluster {
    let dir = tempfile::Builder::new()
        .prefix("quire-autorecovery-")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let store = EmbeddedStore::open(&dir.path().join("meta")).unwrap();
    let bookies = start_registered_bookies(dir.path(), n, &store).await;
    let store = Arc::new(store);
    let metadata: Arc<dyn MetadataStore> = store.clone();
    let bk = BookKeeper::new(metadata, ClientConfig::default());
    Cluster {
        _dir: dir,
        store,
        bookies: bookies.into_iter().map(Some).collect(),
        bk,
    }
}

/// The payload of entry `e` in every test ledger.
pub fn payload(e: u64) -> Vec<u8> {
    format!("entry-{e}-{}", "x".repeat(100)).into_bytes()
}

impl Cluster {
    /// The directory the bookies' files are under.
    pub fn dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    /// Writes `entries` entries to a new E=3, Qw=3, Qa=2 ledger and closes it.
    pub async fn closed_ledger(&self, entries: u64) -> LedgerId {
        let w = self
            .bk
            .create_ledger(LedgerOptions {
                ensemble_size: 3,
                write_quorum: 3,
                ack_quorum: 2,
                password: b"pw".to_vec(),
                custom: BTreeMap::new(),
            })
            .await
            .unwrap();
        let adds: Vec<_> = (0..entries).map(|e| w.add(payload(e))).collect();
        for a in adds {
            a.await.unwrap();
        }
        w.close().await.unwrap();
        w.id()
    }

    pub async fn meta(&self, id: LedgerId) -> LedgerMetadata {
        self.store.read_ledger(id).await.unwrap().value
    }

    /// Stops bookie `id` and removes its registration: a lost bookie.
    pub async fn lose(&mut self, id: &BookieId) {
        let i = self
            .bookies
            .iter()
            .position(|b| b.as_ref().is_some_and(|b| b.addr().to_string() == id.0))
            .unwrap();
        let b = self.bookies[i].take().unwrap();
        tokio::task::spawn_blocking(move || b.shutdown().unwrap())
            .await
            .unwrap();
        self.store.unregister_bookie(id).await.unwrap();
    }

    /// Running bookies outside `ensemble`.
    pub fn spares(&self, ensemble: &[BookieId]) -> Vec<BookieId> {
        self.bookies
            .iter()
            .flatten()
            .map(|b| BookieId(b.addr().to_string()))
            .filter(|a| !ensemble.contains(a))
            .collect()
    }

    /// Reads every entry of `id` back through the client and compares it.
    pub async fn assert_readable(&self, id: LedgerId, entries: u64) {
        let reader = self.bk.open_ledger(id).await.unwrap();
        for e in 0..entries {
            assert_eq!(
                reader.read(EntryId(e)).await.unwrap(),
                payload(e),
                "entry {e}"
            );
        }
    }

    /// Gives `bookie` a cookie, as a bookie's first start does.
    pub async fn write_cookie(&self, bookie: &BookieId) {
        let cookie = Cookie {
            format_version: COOKIE_FORMAT_VERSION,
            bookie: bookie.clone(),
            instance_id: self.store.instance_id().await.unwrap(),
            journal_dir: "/j".into(),
            ledger_dirs: vec!["/l".into()],
        };
        self.store.write_cookie(&cookie, None).await.unwrap();
    }
}

//! Goal: a bookie quarantined after a failed add stops being quarantined as soon as it
//! registers anew (it restarted), so that in a rolling restart the bookie restarted just before
//! can replace the one going down next; and a bookie that is reachable again but whose
//! registration is the old one stays quarantined (the quarantine follows registrations, not
//! connectivity).
//! Method: three real bookie servers (one shard each, O_DIRECT journals) on 127.0.0.1 with the
//! embedded metadata store; a ledger with E = Qw = Qa = 2, so that each failure needs the one
//! bookie outside the ensemble. Bookie X of the ensemble is shut down, an add fails over to the
//! spare Z (X quarantined, for 10 minutes); X restarts on its address; then Y is shut down and
//! one more add needs X as the replacement. With a new registration of X the add succeeds and
//! X is in the ensemble; without one the writer fails for lack of a replacement.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quire_bookie::{Bookie, BookieConfig};
use quire_ledger::{BookKeeper, ClientConfig, Error, LedgerOptions};
use quire_metadata::{BookieId, EmbeddedStore, MetadataStore};
use quire_testkit::bookies::{small_bookie_config, start_registered_bookie};
use quire_wire::EntryId;

struct Cluster {
    _dir: tempfile::TempDir,
    configs: Vec<BookieConfig>,
    bookies: Vec<Option<Bookie>>,
    addrs: Vec<SocketAddr>,
    store: Arc<dyn MetadataStore>,
}

async fn cluster(n: usize) -> Cluster {
    let dir = tempfile::Builder::new()
        .prefix("quire-quarantine-")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let store: Arc<dyn MetadataStore> =
        Arc::new(EmbeddedStore::open(&dir.path().join("meta")).unwrap());
    let (mut configs, mut bookies, mut addrs) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let config = small_bookie_config(dir.path(), i, "127.0.0.1:0".parse().unwrap());
        let bookie = start_registered_bookie(config.clone(), store.as_ref()).await;
        addrs.push(bookie.addr());
        configs.push(config);
        bookies.push(Some(bookie));
    }
    Cluster {
        _dir: dir,
        configs,
        bookies,
        addrs,
        store,
    }
}

impl Cluster {
    fn index_of(&self, id: &BookieId) -> usize {
        self.addrs
            .iter()
            .position(|a| a.to_string() == id.0)
            .expect("a bookie of this cluster")
    }

    fn id(&self, i: usize) -> BookieId {
        BookieId(self.addrs[i].to_string())
    }

    async fn shutdown(&mut self, i: usize) {
        let b = self.bookies[i].take().expect("bookie is running");
        tokio::task::spawn_blocking(move || b.shutdown().unwrap())
            .await
            .unwrap();
    }

    /// Starts bookie `i` again on its address and directories; `register` as a bookie process
    /// does at start (a new registration), or not (its old registration stays in the store).
    async fn restart(&mut self, i: usize, register: bool) {
        let mut config = self.configs[i].clone();
        config.listen = self.addrs[i];
        let bookie = if register {
            start_registered_bookie(config, self.store.as_ref()).await
        } else {
            tokio::task::spawn_blocking(move || Bookie::start(config))
                .await
                .unwrap()
                .unwrap()
        };
        self.bookies[i] = Some(bookie);
    }
}

fn client_config() -> ClientConfig {
    ClientConfig {
        // Failures here are shut-down bookies (connections close at once), never silence.
        request_timeout: Duration::from_secs(60),
        // Far longer than the test: only a new registration can end a quarantine here.
        bookie_quarantine: Duration::from_secs(600),
        ..ClientConfig::default()
    }
}

fn options() -> LedgerOptions {
    LedgerOptions {
        ensemble_size: 2,
        write_quorum: 2,
        ack_quorum: 2,
        password: b"pw".to_vec(),
        custom: BTreeMap::new(),
    }
}

/// Shared first half: returns (writer, X, Y, Z) after X failed an add, was replaced by Z and
/// restarted (registering anew or not), and Y is shut down.
async fn quarantine_then_restart(
    c: &mut Cluster,
    bk: &BookKeeper,
    register_again: bool,
) -> (quire_ledger::LedgerWriter, usize, usize, usize) {
    let writer = bk.create_ledger(options()).await.unwrap();
    let ensemble = writer.ensemble();
    let (x, y) = (c.index_of(&ensemble[0]), c.index_of(&ensemble[1]));
    let z = (0..3).find(|i| *i != x && *i != y).unwrap();
    assert_eq!(writer.add(b"e0".to_vec()).await.unwrap(), EntryId(0));

    c.shutdown(x).await;
    assert_eq!(writer.add(b"e1".to_vec()).await.unwrap(), EntryId(1));
    assert_eq!(writer.ensemble(), vec![c.id(z), c.id(y)], "Z replaced X");
    assert_eq!(writer.ensemble_changes(), 1);

    c.restart(x, register_again).await;
    c.shutdown(y).await;
    (writer, x, y, z)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_bookie_that_registered_anew_replaces_the_next_failed_one() {
    let mut c = cluster(3).await;
    let bk = BookKeeper::new(c.store.clone(), client_config());
    let (writer, x, _y, z) = quarantine_then_restart(&mut c, &bk, true).await;

    // Y is down; X, failed and quarantined a moment ago, has registered anew: it must be taken
    // as Y's replacement at once (without the early end of its quarantine this add fails with
    // "no replacement").
    assert_eq!(writer.add(b"e2".to_vec()).await.unwrap(), EntryId(2));
    assert_eq!(writer.ensemble(), vec![c.id(z), c.id(x)], "X replaced Y");
    assert_eq!(writer.ensemble_changes(), 2);
    let meta = writer.close().await.unwrap();
    assert_eq!(meta.last_entry, Some(2));
    let reader = bk.open_ledger(writer.id()).await.unwrap();
    for (i, want) in [b"e0", b"e1", b"e2"].iter().enumerate() {
        assert_eq!(reader.read(EntryId(i as u64)).await.unwrap(), want.to_vec());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reachable_bookie_under_its_old_registration_stays_quarantined() {
    let mut c = cluster(3).await;
    let bk = BookKeeper::new(c.store.clone(), client_config());
    let (writer, _x, _y, _z) = quarantine_then_restart(&mut c, &bk, false).await;

    // X serves again but its registration is the one it had when it failed: still
    // quarantined, so Y has no replacement and the entry cannot reach Qa = 2.
    match writer.add(b"e2".to_vec()).await {
        Err(Error::WriterFailed { reason, .. }) => {
            assert!(reason.contains("no replacement"), "{reason}")
        }
        other => panic!("expected the writer to fail for lack of a replacement, got {other:?}"),
    }
}

//! Goal: a bookie of a writer's ensemble whose ledger disk fills turns read-only and answers
//! adds `ReadOnly` (BookKeeper `EREADONLY`); the writer treats it as a failed bookie for writes
//! (ensemble change to a writable spare) and keeps writing, every add acknowledged in entry
//! order and none lost; the read-only bookie still serves reads of what it holds; its
//! registration says read-only, so it is not chosen for new ledgers; once space is freed it is
//! writable again, registered as such, and a new ledger that needs it writes to it.
//! Method: four real one-shard bookies on 127.0.0.1 with O_DIRECT journals under /tmp and the
//! embedded metadata store. Bookie 0's ledger directory is a 32 MiB loop-mounted ext4 image
//! (needs root, as engine/tests/it/full_disk.rs); its disk monitor measures every 100 ms. The
//! ledger (E=3, Qw=3, Qa=2) is created while only bookies 0..2 are registered, so bookie 0 is in
//! its ensemble; bookie 3 registers afterwards as the spare. After 100 acknowledged adds the
//! image is filled to 100 % while the writer keeps adding. Registrations follow each bookie's
//! read-only state as the bookie process does (`quire_testkit::bookies::follow_read_only`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use quire_bookie::{Bookie, BookieConfig};
use quire_ledger::{AddFuture, BookKeeper, ClientConfig, LedgerOptions};
use quire_metadata::{BookieId, EmbeddedStore, MetadataStore};
use quire_testkit::bookies::{follow_read_only, small_bookie_config, start_registered_bookie};
use quire_testkit::loop_mount::LoopMount;
use quire_wire::EntryId;

/// A guard against a hang, not a timing check.
const WAIT_MAX: Duration = Duration::from_secs(60);

fn options(e: u8, w: u8, a: u8) -> LedgerOptions {
    LedgerOptions {
        ensemble_size: e,
        write_quorum: w,
        ack_quorum: a,
        password: b"pw".to_vec(),
        custom: Default::default(),
    }
}

fn payload(e: u64) -> Vec<u8> {
    format!("entry {e} ").repeat(40).into_bytes()
}

async fn registered_read_only(store: &dyn MetadataStore, id: &BookieId) -> Option<bool> {
    store
        .list_bookies()
        .await
        .unwrap()
        .into_iter()
        .find(|b| &b.id == id)
        .map(|b| b.read_only)
}

/// Waits until `pred` holds, failing the test after `WAIT_MAX` naming `what`.
async fn wait_until<F: std::future::Future<Output = bool>>(
    what: &str,
    mut pred: impl FnMut() -> F,
) {
    let deadline = Instant::now() + WAIT_MAX;
    while !pred().await {
        assert!(Instant::now() < deadline, "never saw: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_replaces_a_bookie_that_turns_read_only_and_loses_nothing() {
    let dir = tempfile::Builder::new()
        .prefix("quire-readonly-")
        .tempdir_in("/tmp")
        .unwrap();
    // Everything on a disk of its own, so that the host disk's usage (shared, not this test's
    // to control) never turns a bookie read-only; bookie 0's ledgers on a small one inside it.
    let _test_mount = LoopMount::new_at(512 << 20, dir.path());
    let store: Arc<dyn MetadataStore> =
        Arc::new(EmbeddedStore::open(&dir.path().join("meta")).unwrap());
    let configs: Vec<BookieConfig> = (0..4)
        .map(|i| {
            let mut c = small_bookie_config(dir.path(), i, "127.0.0.1:0".parse().unwrap());
            c.disk_check_interval = Duration::from_millis(100);
            // Thresholds: the filled loop disk reaches 100 %, the test's own disk stays far below.
            c.disk_usage_threshold = 0.99;
            c.disk_usage_lwm_threshold = 0.98;
            // Checkpoints often, so that the filled ledger disk is felt by the engine too.
            c.engine.checkpoint_interval = Duration::from_millis(200);
            c
        })
        .collect();
    let mount = LoopMount::new_at(32 << 20, &configs[0].ledger_dir);
    let mut bookies: Vec<Bookie> = Vec::new();
    let mut followers = Vec::new();
    for c in &configs[..3] {
        let b = start_registered_bookie(c.clone(), &*store).await;
        followers.push(follow_read_only(&b, store.clone()));
        bookies.push(b);
    }
    let ids: Vec<BookieId> = bookies
        .iter()
        .map(|b| BookieId(b.addr().to_string()))
        .collect();
    assert!(!bookies[0].is_read_only(), "bookie 0 starts writable");

    let bk = BookKeeper::new(store.clone(), ClientConfig::default());
    let writer = bk.create_ledger(options(3, 3, 2)).await.unwrap();
    assert!(
        writer.ensemble().contains(&ids[0]),
        "bookie 0 in the ensemble"
    );
    let spare = start_registered_bookie(configs[3].clone(), &*store).await;
    let spare_id = BookieId(spare.addr().to_string());
    followers.push(follow_read_only(&spare, store.clone()));
    bookies.push(spare);

    // Pipelined adds, 16 in flight; every future must resolve Ok with its own entry id.
    let mut next = 0u64;
    let mut in_flight: std::collections::VecDeque<(u64, AddFuture)> = Default::default();
    let mut acked = 0u64;
    let add_until =
        |target: u64,
         next: &mut u64,
         in_flight: &mut std::collections::VecDeque<(u64, AddFuture)>| {
            while *next < target && in_flight.len() < 16 {
                in_flight.push_back((*next, writer.add(payload(*next))));
                *next += 1;
            }
        };
    while acked < 100 {
        add_until(100, &mut next, &mut in_flight);
        let (e, f) = in_flight.pop_front().unwrap();
        assert_eq!(f.await.expect("add before the disk filled"), EntryId(e));
        acked += 1;
    }

    // Fill bookie 0's ledger disk while adds keep flowing.
    let filler = mount.path().join("filler");
    let filling = {
        let filler = filler.clone();
        tokio::task::spawn_blocking(move || quire_testkit::loop_mount::fill_file(&filler))
    };
    let deadline = Instant::now() + WAIT_MAX;
    // Keep writing until the writer changed its ensemble and 200 more adds went through.
    let mut target = u64::MAX;
    while acked < target {
        if target == u64::MAX && writer.ensemble_changes() >= 1 {
            target = acked + 200;
        }
        assert!(
            Instant::now() < deadline,
            "no ensemble change after filling bookie 0's disk ({acked} adds acknowledged)"
        );
        add_until(target, &mut next, &mut in_flight);
        let (e, f) = in_flight.pop_front().unwrap();
        assert_eq!(
            f.await
                .unwrap_or_else(|err| panic!("add {e} failed: {err}")),
            EntryId(e)
        );
        acked += 1;
    }
    while let Some((e, f)) = in_flight.pop_front() {
        assert_eq!(f.await.expect("last adds"), EntryId(e));
        acked += 1;
    }
    filling.await.unwrap();
    assert!(
        bookies[0].is_read_only(),
        "bookie 0 is read-only on a full disk"
    );
    let ensemble = writer.ensemble();
    assert!(
        !ensemble.contains(&ids[0]),
        "bookie 0 replaced: {ensemble:?}"
    );
    assert!(
        ensemble.contains(&spare_id),
        "the spare took its place: {ensemble:?}"
    );
    wait_until("bookie 0 registered read-only", || async {
        registered_read_only(&*store, &ids[0]).await == Some(true)
    })
    .await;
    let meta = writer.close().await.unwrap();
    assert_eq!(acked, next);
    assert_eq!(meta.last_entry, Some(acked - 1));
    assert!(
        meta.fragments.len() >= 2,
        "a fragment per ensemble: {:?}",
        meta.fragments
    );

    // Every acknowledged entry reads back; the first fragment's reads may use bookie 0.
    let reader = bk.open_ledger(writer.id()).await.unwrap();
    for e in 0..acked {
        assert_eq!(
            reader.read(EntryId(e)).await.unwrap(),
            payload(e),
            "entry {e}"
        );
    }
    // A new ledger avoids the read-only bookie: with it excluded only three are writable.
    let err = bk.create_ledger(options(4, 3, 2)).await.err();
    assert!(
        matches!(
            err,
            Some(quire_ledger::Error::NotEnoughBookies {
                needed: 4,
                available: 3
            })
        ),
        "{err:?}"
    );

    // Free the space: bookie 0 is writable again, registered so, and takes a new ledger's adds.
    std::fs::remove_file(&filler).unwrap();
    wait_until("bookie 0 writable and registered so", || async {
        !bookies[0].is_read_only() && registered_read_only(&*store, &ids[0]).await == Some(false)
    })
    .await;
    let w2 = bk.create_ledger(options(4, 4, 4)).await.unwrap();
    assert!(w2.ensemble().contains(&ids[0]));
    for e in 0..20u64 {
        assert_eq!(w2.add(payload(e)).await.unwrap(), EntryId(e));
    }
    assert_eq!(w2.ensemble_changes(), 0, "no bookie refused an add");
    w2.close().await.unwrap();

    for f in followers {
        f.abort();
    }
    for b in bookies {
        tokio::task::spawn_blocking(move || b.shutdown())
            .await
            .unwrap()
            .unwrap_or_else(|e| eprintln!("bookie shutdown: {e}"));
    }
    drop(mount);
}

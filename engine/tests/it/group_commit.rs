use std::rc::Rc;

use crate::common::{config, payload, run, tempdir, KEY};
use quire_engine::Engine;

#[test]
fn concurrent_adds_share_journal_syncs() {
    // Goal: adds that arrive together are made durable by fewer fdatasyncs than adds, and all
    // of them are durable. Method: spawn 200 adds as tasks on one executor, await them all,
    // compare `journal_sync_count` with 200, then "crash" (end the executor without close) and
    // read every entry back after reopening.
    let dir = tempdir();
    let cfg = config(dir.path());
    let cfg2 = cfg.clone();
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        let before = e.journal_sync_count();
        let tasks: Vec<_> = (0..200u64)
            .map(|i| {
                let e = Rc::clone(&e);
                glommio::spawn_local(async move {
                    e.add_entry(i % 4, i / 4, KEY, None, payload(i % 4, i / 4, 300), false)
                        .await
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let syncs = e.journal_sync_count() - before;
        assert!(syncs >= 1);
        assert!(syncs < 50, "200 concurrent adds took {syncs} journal syncs");
    });
    run(move || async move {
        let e = Engine::open(cfg2).await.unwrap();
        for i in 0..200u64 {
            assert_eq!(
                e.read_entry(i % 4, Some(i / 4)).await.unwrap(),
                payload(i % 4, i / 4, 300)
            );
        }
        e.close().await.unwrap();
    });
}

#[test]
fn batch_bytes_bound_splits_groups() {
    // Goal: a group never exceeds group_commit_bytes_max (beyond one record), so big concurrent
    // adds take several syncs. Method: 16 concurrent 64 KiB adds with a 128 KiB bound need at
    // least 8 syncs; all read back.
    let dir = tempdir();
    let mut cfg = config(dir.path());
    cfg.group_commit_bytes_max = 128 << 10;
    cfg.journal_file_size_bytes = 4 << 20;
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        let tasks: Vec<_> = (0..16u64)
            .map(|i| {
                let e = Rc::clone(&e);
                glommio::spawn_local(async move {
                    e.add_entry(1, i, KEY, None, payload(1, i, 64 << 10), false)
                        .await
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert!(
            e.journal_sync_count() >= 8,
            "got {}",
            e.journal_sync_count()
        );
        for i in 0..16u64 {
            assert_eq!(
                e.read_entry(1, Some(i)).await.unwrap(),
                payload(1, i, 64 << 10)
            );
        }
        e.close().await.unwrap();
    });
}

use crate::common::{config, journal_files, payload, run, tempdir, KEY};
use quire_engine::Engine;

#[test]
fn crash_without_checkpoint_replays_every_add() {
    // Goal: every acknowledged add survives a crash before any checkpoint. Method: add entries,
    // end the executor without close or checkpoint, reopen and read all back, including the
    // ledger state (LAC and last entry).
    let dir = tempdir();
    let cfg = config(dir.path());
    let cfg2 = cfg.clone();
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        for i in 0..50u64 {
            e.add_entry(5, i, KEY, Some(i), payload(5, i, 1000), false)
                .await
                .unwrap();
        }
        // Dropped here without close: a crash.
    });
    run(move || async move {
        let e = Engine::open(cfg2).await.unwrap();
        for i in 0..50u64 {
            assert_eq!(e.read_entry(5, Some(i)).await.unwrap(), payload(5, i, 1000));
        }
        let s = e.ledger_state(5).unwrap();
        assert_eq!(s.lac, Some(49));
        assert_eq!(s.last_entry, Some(49));
        e.close().await.unwrap();
    });
}

#[test]
fn crash_across_checkpoint_and_journal_roll() {
    // Goal: replay is correct when part of the data is behind the checkpoint mark (entry logs
    // and index) and the rest spans several rolled journal files; journals wholly before the
    // mark are deleted when reuse is off (tests/journal_reuse.rs covers reuse). Method: 1 MiB
    // journals and 16 KiB entries; add 150 entries (several rolls), checkpoint, add 150 more
    // (more rolls), crash, reopen, read all 300; then add more and crash again to check the
    // writer resumes correctly after replay.
    let dir = tempdir();
    let path = dir.path().to_path_buf();
    let mut cfg = config(dir.path());
    cfg.journal_reuse_files = 0;
    let (cfg2, cfg3) = (cfg.clone(), cfg.clone());
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        for i in 0..150u64 {
            e.add_entry(1, i, KEY, i.checked_sub(1), payload(1, i, 16 << 10), false)
                .await
                .unwrap();
        }
        assert!(
            journal_files(&path).len() >= 3,
            "journal should have rolled"
        );
        e.checkpoint().await.unwrap();
        // Only the mark's file remains, plus the next one if its background pre-creation ran.
        assert!(
            journal_files(&path).len() <= 2,
            "journals before the mark are deleted: {:?}",
            journal_files(&path)
        );
        for i in 150..300u64 {
            e.add_entry(1, i, KEY, i.checked_sub(1), payload(1, i, 16 << 10), false)
                .await
                .unwrap();
        }
        assert!(journal_files(&path).len() >= 3);
    });
    run(move || async move {
        let e = Engine::open(cfg2).await.unwrap();
        for i in 0..300u64 {
            assert_eq!(
                e.read_entry(1, Some(i)).await.unwrap(),
                payload(1, i, 16 << 10),
                "entry {i}"
            );
        }
        assert_eq!(e.ledger_state(1).unwrap().lac, Some(298));
        for i in 300..320u64 {
            e.add_entry(1, i, KEY, i.checked_sub(1), payload(1, i, 16 << 10), false)
                .await
                .unwrap();
        }
    });
    run(move || async move {
        let e = Engine::open(cfg3).await.unwrap();
        for i in 0..320u64 {
            assert_eq!(
                e.read_entry(1, Some(i)).await.unwrap(),
                payload(1, i, 16 << 10),
                "entry {i}"
            );
        }
        assert_eq!(
            e.read_entry(1, None).await.unwrap(),
            payload(1, 319, 16 << 10)
        );
        e.close().await.unwrap();
    });
}

#[test]
fn write_cache_bound_triggers_background_checkpoint() {
    // Goal: the write cache is flushed in the background once it exceeds its byte bound, and
    // entries stay readable throughout. Method: a 64 KiB cache bound, 64 adds of 4 KiB; wait a
    // little; the cache is below the bound and every entry reads back (from the entry logs).
    let dir = tempdir();
    let mut cfg = config(dir.path());
    cfg.write_cache_bytes_max = 64 << 10;
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        for i in 0..64u64 {
            e.add_entry(3, i, KEY, None, payload(3, i, 4096), false)
                .await
                .unwrap();
        }
        glommio::timer::sleep(std::time::Duration::from_millis(200)).await;
        assert!(
            e.write_cache_bytes() <= 64 << 10,
            "cache holds {} bytes",
            e.write_cache_bytes()
        );
        for i in 0..64u64 {
            assert_eq!(e.read_entry(3, Some(i)).await.unwrap(), payload(3, i, 4096));
        }
        e.close().await.unwrap();
    });
}

#[test]
fn lost_mark_with_journal_data_refuses_to_open() {
    // Goal: if the checkpoint mark disappears while a journal holds acknowledged data (e.g. the
    // ledger directory was wiped), open refuses with Corrupt instead of starting empty; a
    // crash during the very first open (no mark, no batches) re-initialises cleanly.
    // Method: add one entry, crash, delete checkpoint.qcp, reopen; then a fresh pair of
    // directories where only the journal file exists.
    let dir = tempdir();
    let cfg = config(dir.path());
    let c = cfg.clone();
    run(move || async move {
        let e = Engine::open(c).await.unwrap();
        e.add_entry(1, 0, KEY, None, payload(1, 0, 10), false)
            .await
            .unwrap();
    });
    std::fs::remove_file(dir.path().join("ledgers/checkpoint.qcp")).unwrap();
    run(move || async move {
        match Engine::open(cfg).await {
            Err(quire_engine::Error::Corrupt { reason, .. }) => {
                assert!(reason.contains("mark is missing"), "{reason}")
            }
            Err(other) => panic!("expected Corrupt, got {other}"),
            Ok(_) => panic!("opened without a mark over journal data"),
        }
    });

    let dir = tempdir();
    let cfg = config(dir.path());
    let c = cfg.clone();
    run(move || async move {
        Engine::open(c).await.unwrap();
    });
    std::fs::remove_file(dir.path().join("ledgers/checkpoint.qcp")).unwrap();
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        e.add_entry(1, 0, KEY, None, payload(1, 0, 10), false)
            .await
            .unwrap();
        e.close().await.unwrap();
    });
}

//! Goal: garbage collection and compaction on the real disk (O_DIRECT files through glommio)
//! give space back and keep every live entry. Method: four ledgers written in the same
//! checkpoints into 64 KiB entry logs, three deleted, a forced compaction; the entry-log files
//! in the ledger directory must take under half their bytes, the survivor must read back byte
//! for byte, also after a restart, and the deleted ones must stay deleted.

use std::path::Path;

use crate::common::{add_payload, config, payload, run, tempdir, KEY};
use quire_engine::{Engine, Error};

fn entry_log_bytes(ledger_dir: &Path) -> u64 {
    std::fs::read_dir(ledger_dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".qel"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

#[test]
fn deleting_ledgers_and_compacting_gives_disk_space_back() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let mut cfg = config(&root);
        cfg.entry_log_size_bytes_max = 64 << 10;
        let engine = Engine::open(cfg.clone()).await.unwrap();
        for e in 0..100 {
            for ledger in 1..=4 {
                add_payload(&engine, ledger, e, 1000).await.unwrap();
            }
            if e % 10 == 9 {
                engine.checkpoint().await.unwrap();
            }
        }
        let before = entry_log_bytes(&cfg.ledger_dir);
        let run = engine.collect_garbage(&[1, 2, 3]).await.unwrap();
        assert_eq!(run.ledgers_deleted, 3);
        let compacted = engine.compact_entry_logs(0.8).await.unwrap();
        assert!(compacted.entry_logs_compacted > 0, "{compacted:?}");
        let after = entry_log_bytes(&cfg.ledger_dir);
        assert!(after * 2 < before, "entry logs: {before} -> {after} bytes");
        assert_eq!(engine.gc_stats().entry_log_bytes, after);
        let check = |engine: std::rc::Rc<Engine>| async move {
            for e in 0..100 {
                assert_eq!(
                    engine.read_entry(4, Some(e)).await.unwrap(),
                    payload(4, e, 1000)
                );
            }
            for ledger in 1..=3 {
                assert!(matches!(
                    engine.read_entry(ledger, Some(0)).await,
                    Err(Error::NoSuchLedger { .. })
                ));
                assert!(matches!(
                    engine
                        .add_entry(ledger, 100, KEY, None, vec![1], false)
                        .await,
                    Err(Error::LedgerDeleted { .. })
                ));
            }
            let check = engine.verify_index().await.unwrap();
            assert_eq!(check.locations, 100);
        };
        check(engine.clone()).await;
        engine.close().await.unwrap();
        let engine = Engine::open(cfg).await.unwrap();
        check(engine.clone()).await;
        engine.close().await.unwrap();
    });
}

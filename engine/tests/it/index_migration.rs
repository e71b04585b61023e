//! Opening a ledger directory of format version 1 (one append-only `index.qix` committed by a
//! version 1 checkpoint mark) migrates its index into a version 2 segment file, also when the
//! open crashes at any step of the migration.

use std::path::Path;

use crate::common::{payload, KEY};
use glommio::{LocalExecutorBuilder, Placement};
use quire_engine::format::{
    encode_entry_record, encode_file_header, encode_mark_v1, encode_segment, pad_to_block,
    Location, Mark, StoredLedger, ENTRY_LOG_MAGIC, ENTRY_RECORD_HEADER_BYTES, FILE_HEADER_BYTES,
    INDEX_MAGIC, JOURNAL_MAGIC,
};
use quire_engine::io::{Storage, StorageFile};
use quire_engine::sim_disk::{OpFilter, SimImage, SimStorage};
use quire_engine::{Engine, EngineConfig, Error};

const ENTRIES: u64 = 300;

fn config() -> EngineConfig {
    let mut c = EngineConfig::new("/sim/journal".into(), "/sim/ledgers".into());
    c.journal_file_size_bytes = 64 << 10;
    c.read_ahead_entries = 0;
    c.read_cache_bytes_max = 1;
    c
}

async fn write_file(s: &SimStorage, path: &Path, data: &[u8]) {
    let f = s.open(path, true).await.unwrap();
    f.write_at(0, data).await.unwrap();
    f.fdatasync().await.unwrap();
}

/// A version 1 directory pair as the previous release left it: ledgers 1 and 2 with ENTRIES
/// entries in one entry log, indexed by two `index.qix` segments (the second moves entry 5 of
/// ledger 1 to a second copy, as compaction did, and fences ledger 2), a v1 mark, a journal.
async fn legacy_image() -> SimImage {
    let s = SimStorage::new(1);
    s.prepare_dir(Path::new("/sim/journal")).await.unwrap();
    s.prepare_dir(Path::new("/sim/ledgers")).await.unwrap();
    let mut log = encode_file_header(ENTRY_LOG_MAGIC, 1);
    let mut locations = Vec::new();
    for ledger in [1u64, 2] {
        for entry in 0..ENTRIES {
            let data = payload(ledger, entry, 40 + entry as usize % 50);
            let offset = log.len() as u64;
            encode_entry_record(&mut log, ledger, entry, &data);
            locations.push((
                ledger,
                entry,
                Location {
                    log_id: 1,
                    offset,
                    data_len: data.len() as u32,
                },
            ));
        }
    }
    // A second copy of 1/5, which the second segment points to.
    let moved_data = payload(1, 5, 40 + 5);
    let moved_at = log.len() as u64;
    encode_entry_record(&mut log, 1, 5, &moved_data);
    pad_to_block(&mut log);
    write_file(
        &s,
        Path::new("/sim/ledgers/entrylog-0000000000000001.qel"),
        &log,
    )
    .await;
    let state = |fenced| StoredLedger {
        fenced,
        master_key: Some(KEY),
        fence_keys: Vec::new(),
        lac: Some(ENTRIES - 2),
        last_entry: Some(ENTRIES - 1),
    };
    let mut index = encode_file_header(INDEX_MAGIC, 0);
    index.extend(encode_segment(
        &locations,
        &[(1, state(false)), (2, state(false))],
    ));
    let moved = Location {
        log_id: 1,
        offset: moved_at,
        data_len: moved_data.len() as u32,
    };
    index.extend(encode_segment(&[(1, 5, moved)], &[(2, state(true))]));
    write_file(&s, Path::new("/sim/ledgers/index.qix"), &index).await;
    let mut journal = encode_file_header(JOURNAL_MAGIC, 1);
    journal.resize(4 * FILE_HEADER_BYTES, 0);
    write_file(
        &s,
        Path::new("/sim/journal/journal-0000000000000001.qj"),
        &journal,
    )
    .await;
    let mark = Mark {
        journal_file_id: 1,
        journal_offset: FILE_HEADER_BYTES as u64,
        next_seq: 1,
        legacy_index_bytes: Some(index.len() as u64),
        segments: Vec::new(),
        summaries: Default::default(),
    };
    write_file(
        &s,
        Path::new("/sim/ledgers/checkpoint.qcp"),
        &encode_mark_v1(&mark),
    )
    .await;
    s.sync_dir(Path::new("/sim/ledgers")).await.unwrap();
    s.sync_dir(Path::new("/sim/journal")).await.unwrap();
    let _ = ENTRY_RECORD_HEADER_BYTES;
    s.durable_image()
}

async fn check(engine: &Engine<SimStorage>) -> Result<(), String> {
    for ledger in [1u64, 2] {
        for entry in 0..ENTRIES {
            let got = engine
                .read_entry(ledger, Some(entry))
                .await
                .map_err(|e| format!("{ledger}/{entry}: {e}"))?;
            if got != payload(ledger, entry, 40 + entry as usize % 50) {
                return Err(format!("{ledger}/{entry} reads other bytes"));
            }
        }
        let st = engine.ledger_state(ledger).ok_or("ledger state lost")?;
        if st.last_entry != Some(ENTRIES - 1) || st.lac != Some(ENTRIES - 2) {
            return Err(format!("ledger {ledger} state {st:?}"));
        }
        if st.fenced != (ledger == 2) {
            return Err(format!("ledger {ledger} fenced flag {}", st.fenced));
        }
    }
    engine.verify_index().await.map_err(|e| e.to_string())?;
    Ok(())
}

fn run<Fut: std::future::Future<Output = ()> + 'static>(f: impl FnOnce() -> Fut + Send + 'static) {
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(f)
        .expect("spawn executor")
        .join()
        .expect("executor panicked");
}

#[test]
fn a_version_1_index_is_migrated_at_open() {
    // Goal: every entry and ledger state of a version 1 index is found after the upgrade, the
    // later segment's location wins, and `index.qix` is gone afterwards. Method: hand-built v1
    // directory (see `legacy_image`), open, check, close, reopen, check.
    run(|| async {
        let image = legacy_image().await;
        let storage = SimStorage::from_image(&image, 2);
        let engine = Engine::open_with(config(), storage.clone()).await.unwrap();
        check(&engine).await.unwrap();
        let names = storage.list(Path::new("/sim/ledgers")).await.unwrap();
        assert!(!names.iter().any(|n| n == "index.qix"), "{names:?}");
        assert_eq!(
            names.iter().filter(|n| n.ends_with(".qis")).count(),
            1,
            "{names:?}"
        );
        assert_eq!(engine.index_stats().segment_entries, 2 * ENTRIES);
        engine.close().await.unwrap();
        let storage = SimStorage::from_image(&storage.durable_image(), 3);
        let engine = Engine::open_with(config(), storage).await.unwrap();
        check(&engine).await.unwrap();
    });
}

#[test]
fn a_crash_at_any_step_of_the_migration_loses_nothing() {
    // Goal: the migration is crash safe. Method: count the ledger-directory operations of a
    // migrating open, then for each one crash there (tearing the last unsynced write), reopen
    // on the durable image and check everything is found.
    run(|| async {
        let image = legacy_image().await;
        let counted = std::rc::Rc::new(std::cell::Cell::new(0u64));
        let c2 = counted.clone();
        let storage = SimStorage::from_image(&image, 4);
        let filter: OpFilter = Box::new(move |_, p: &Path| {
            let hit = p.starts_with("/sim/ledgers");
            c2.set(c2.get() + u64::from(hit));
            hit
        });
        storage.crash_at_matching_op(u64::MAX, filter, None);
        let engine = Engine::open_with(config(), storage.clone()).await.unwrap();
        let n = counted.get();
        drop(engine);
        assert!(
            n > 8,
            "the migrating open took only {n} ledger-dir operations"
        );
        for op in 1..=n {
            let storage = SimStorage::from_image(&image, 10 + op);
            let filter: OpFilter = Box::new(|_, p: &Path| p.starts_with("/sim/ledgers"));
            storage.crash_at_matching_op(op, filter, Some(op));
            let r = Engine::open_with(config(), storage.clone()).await;
            let report = storage.crash(Some(op));
            match r {
                Ok(e) => drop(e),
                Err(Error::Io { .. }) => {}
                Err(e) => panic!("crash at op {op}: open failed with {e}"),
            }
            let storage = SimStorage::from_image(&report.image, 100 + op);
            let engine = Engine::open_with(config(), storage)
                .await
                .unwrap_or_else(|e| {
                    panic!("reopen after a crash at op {op} of {n}: {e}\n{report}")
                });
            check(&engine)
                .await
                .unwrap_or_else(|e| panic!("after a crash at op {op} of {n}: {e}\n{report}"));
        }
    });
}

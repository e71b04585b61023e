//! Goal: (1) the next journal file is created in the background before the roll, and rolls
//! through pre-created files neither lose nor reorder entries, before and after a crash;
//! (2) a crash in the middle of a background pre-creation leaves a directory that opens and
//! replays every acknowledged entry, and writing continues across the next roll; (3) a
//! checkpoint under a tight bulk-write rate limit still completes, and the limiter did act.
//! Method: real engines on O_DIRECT files under /tmp; a "crash" is the end of the glommio
//! executor without `close` (every background task is dropped mid-flight); the directory is
//! inspected with std::fs; waits for background work are bounded loops on the file system.

use std::path::Path;
use std::time::Duration;

use crate::common::{config, payload, run, tempdir, KEY};
use quire_engine::Engine;

fn journal_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join("journal"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("journal-"))
        .collect();
    v.sort();
    v
}

/// Waits (bounded) until `name` exists in the journal directory.
async fn wait_for_file(dir: &Path, name: &str) {
    for _ in 0..3000 {
        if journal_names(dir).iter().any(|n| n == name) {
            return;
        }
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "{name} never appeared; journal dir holds {:?}",
        journal_names(dir)
    );
}

#[test]
fn rolls_through_precreated_files_keep_every_entry_in_order() {
    let dir = tempdir();
    let cfg = config(dir.path()); // 1 MiB journal files
    let d = dir.path().to_path_buf();
    let c = cfg.clone();
    run(move || async move {
        let engine = Engine::open(c).await.unwrap();
        // Past half of file 1: file 2 gets created in the background, under its final name.
        for e in 0..30u64 {
            engine
                .add_entry(1, e, KEY, e.checked_sub(1), payload(1, e, 20_000), false)
                .await
                .unwrap();
        }
        wait_for_file(&d, "journal-0000000000000002.qj").await;
        // Many rolls, with adds in flight concurrently across them.
        let mut tasks = Vec::new();
        for e in 30..200u64 {
            let en = engine.clone();
            tasks.push(glommio::spawn_local(async move {
                en.add_entry(1, e, KEY, e.checked_sub(1), payload(1, e, 20_000), false)
                    .await
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(
            journal_names(&d).len() >= 4,
            "expected several rolls: {:?}",
            journal_names(&d)
        );
        for e in 0..200u64 {
            assert_eq!(
                engine.read_entry(1, Some(e)).await.unwrap(),
                payload(1, e, 20_000)
            );
        }
        // Crash: no close, no checkpoint; the next file may be mid-creation.
    });
    run(move || async move {
        let engine = Engine::open(cfg).await.unwrap();
        assert_eq!(engine.ledger_state(1).unwrap().last_entry, Some(199));
        for e in 0..200u64 {
            assert_eq!(
                engine.read_entry(1, Some(e)).await.unwrap(),
                payload(1, e, 20_000),
                "entry {e} after crash"
            );
        }
        engine.close().await.unwrap();
    });
}

#[test]
fn crash_during_precreation_leaves_a_recoverable_directory() {
    let dir = tempdir();
    let mut cfg = config(dir.path());
    cfg.journal_file_size_bytes = 16 << 20;
    // Slow enough that the crash lands while file 2 is being zero-filled.
    cfg.background_write_bytes_per_second = 1 << 20;
    let d = dir.path().to_path_buf();
    let c = cfg.clone();
    run(move || async move {
        let engine = Engine::open(c).await.unwrap();
        for e in 0..70u64 {
            engine
                .add_entry(3, e, KEY, e.checked_sub(1), payload(3, e, 128 << 10), false)
                .await
                .unwrap();
        }
        wait_for_file(&d, "journal-0000000000000002.qj.tmp").await;
        assert!(
            !journal_names(&d)
                .iter()
                .any(|n| n == "journal-0000000000000002.qj"),
            "still being created"
        );
        // Crash now, mid pre-creation.
    });
    assert!(
        journal_names(dir.path())
            .iter()
            .any(|n| n.ends_with(".qj.tmp")),
        "the crash left the temp file"
    );
    cfg.background_write_bytes_per_second = 0;
    let c = cfg.clone();
    run(move || async move {
        let engine = Engine::open(c).await.unwrap();
        for e in 0..70u64 {
            assert_eq!(
                engine.read_entry(3, Some(e)).await.unwrap(),
                payload(3, e, 128 << 10),
                "entry {e}"
            );
        }
        // Write on across the roll into file 2 (and beyond half of it).
        for e in 70..200u64 {
            engine
                .add_entry(3, e, KEY, e.checked_sub(1), payload(3, e, 128 << 10), false)
                .await
                .unwrap();
        }
        engine.close().await.unwrap();
    });
    assert!(
        !journal_names(dir.path())
            .iter()
            .any(|n| n.ends_with(".qj.tmp")),
        "{:?}",
        journal_names(dir.path())
    );
    run(move || async move {
        let engine = Engine::open(cfg).await.unwrap();
        for e in 0..200u64 {
            assert_eq!(
                engine.read_entry(3, Some(e)).await.unwrap(),
                payload(3, e, 128 << 10),
                "entry {e}"
            );
        }
        engine.close().await.unwrap();
    });
}

#[test]
fn rate_limited_checkpoint_completes() {
    let dir = tempdir();
    let mut cfg = config(dir.path());
    cfg.background_write_bytes_per_second = 2 << 20;
    let c = cfg.clone();
    run(move || async move {
        let engine = Engine::open(c).await.unwrap();
        for e in 0..48u64 {
            engine
                .add_entry(9, e, KEY, e.checked_sub(1), payload(9, e, 128 << 10), false)
                .await
                .unwrap();
        }
        engine.checkpoint().await.unwrap();
        assert_eq!(engine.write_cache_bytes(), 0);
        assert!(
            engine.background_write_waits() > 0,
            "6 MiB at 2 MiB/s must have been paced"
        );
        engine.close().await.unwrap();
    });
    cfg.background_write_bytes_per_second = 0;
    run(move || async move {
        let engine = Engine::open(cfg).await.unwrap();
        assert_eq!(
            engine.write_cache_bytes(),
            0,
            "nothing left to replay: the checkpoint covered it"
        );
        for e in 0..48u64 {
            assert_eq!(
                engine.read_entry(9, Some(e)).await.unwrap(),
                payload(9, e, 128 << 10)
            );
        }
        engine.close().await.unwrap();
    });
}

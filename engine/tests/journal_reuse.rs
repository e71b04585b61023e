//! Goal: checkpointed journal files are reused by later rolls (BookKeeper `journalReuseFiles`):
//! the roll renames a kept file instead of pre-writing a new one, at most
//! `journal_reuse_files` checkpointed files stay on disk, and a journal whose files hold an
//! earlier use's batches replays exactly what was acknowledged, after a crash as after a close,
//! also when the last batch was torn. With reuse off, checkpointed files are deleted.
//! Method: real engines on O_DIRECT files under /tmp with 1 MiB journal files and checkpoints
//! by hand; a file's identity is its inode number with its birth time (an inode number alone
//! can be handed to a new file once the old one is deleted); a "crash" is the end of the
//! executor without `close`; a torn tail is made by damaging the last batch with std::fs.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::SystemTime;

use common::{config, journal_files, payload, run, tempdir, KEY};
use quire_engine::{Engine, EngineConfig};

const ENTRY_BYTES: usize = 20_000;

/// A file's identity: inode number and birth time.
type FileId = (u64, SystemTime);

/// The identity of every journal file, by file name.
fn journal_inodes(dir: &Path) -> HashMap<String, FileId> {
    journal_files(dir)
        .into_iter()
        .map(|p| {
            let m = std::fs::metadata(&p).unwrap();
            let born = m
                .created()
                .expect("the test's file system records birth times (statx btime)");
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                (m.ino(), born),
            )
        })
        .collect()
}

/// Adds entries `from..to` of ledger 1 one at a time, checkpointing every `checkpoint_every`
/// adds; returns the inodes of all journal files seen before each checkpoint.
async fn add_range(
    engine: &Engine,
    dir: &Path,
    from: u64,
    to: u64,
    checkpoint_every: u64,
    seen: &mut HashMap<String, FileId>,
) {
    for e in from..to {
        engine
            .add_entry(
                1,
                e,
                KEY,
                e.checked_sub(1),
                payload(1, e, ENTRY_BYTES),
                false,
            )
            .await
            .unwrap();
        if (e + 1) % checkpoint_every == 0 {
            seen.extend(journal_inodes(dir));
            engine.checkpoint().await.unwrap();
        }
    }
    seen.extend(journal_inodes(dir));
}

async fn check_entries(engine: &Engine, to: u64, when: &str) {
    assert_eq!(
        engine.ledger_state(1).unwrap().last_entry,
        Some(to - 1),
        "{when}"
    );
    for e in 0..to {
        assert_eq!(
            engine.read_entry(1, Some(e)).await.unwrap(),
            payload(1, e, ENTRY_BYTES),
            "entry {e} {when}"
        );
    }
}

fn reuse_config(dir: &Path, keep: usize) -> EngineConfig {
    let mut c = config(dir); // 1 MiB journal files, no timed checkpoints
    c.journal_reuse_files = keep;
    c
}

#[test]
fn rolls_reuse_checkpointed_files_and_replay_only_new_batches() {
    let dir = tempdir();
    let cfg = reuse_config(dir.path(), 2);
    let d = dir.path().to_path_buf();
    let c = cfg.clone();
    // 600 adds of ~20 KiB: ~12 MiB of journal, ~12 rolls of 1 MiB files, a checkpoint every
    // 40 adds (~0.8 MiB), so files are retired and reused throughout.
    run(move || async move {
        let engine = Engine::open(c).await.unwrap();
        let mut seen = HashMap::new();
        add_range(&engine, &d, 0, 600, 40, &mut seen).await;
        let names: Vec<_> = journal_inodes(&d).into_keys().collect();
        assert!(
            names.len() <= 2 + 3,
            "at most 2 kept files besides the live ones: {names:?}"
        );
        // Reuse: some file name appeared with an inode an earlier name had.
        let mut by_ino: HashMap<FileId, Vec<&String>> = HashMap::new();
        for (name, ino) in &seen {
            by_ino.entry(*ino).or_default().push(name);
        }
        let reused = by_ino.values().filter(|v| v.len() > 1).count();
        assert!(
            reused >= 3,
            "expected files reused under new ids: {by_ino:?}"
        );
        let ids_seen = seen.len();
        assert!(ids_seen >= 10, "expected about 12 journal ids: {seen:?}");
        // Reused files keep the configured size.
        for p in journal_files(&d) {
            assert_eq!(
                std::fs::metadata(&p).unwrap().len(),
                1 << 20,
                "{}",
                p.display()
            );
        }
        check_entries(&engine, 600, "before the crash").await;
        // Crash: the live files hold earlier batches past the end of the new ones.
    });
    let c = cfg.clone();
    let d = dir.path().to_path_buf();
    run(move || async move {
        let engine = Engine::open(c).await.unwrap();
        check_entries(&engine, 600, "after the crash").await;
        let mut seen = HashMap::new();
        add_range(&engine, &d, 600, 700, 40, &mut seen).await;
        engine.close().await.unwrap();
    });
    run(move || async move {
        let engine = Engine::open(cfg).await.unwrap();
        check_entries(&engine, 700, "after close and reopen").await;
        engine.close().await.unwrap();
    });
}

#[test]
fn torn_last_batch_in_a_reused_file_is_dropped() {
    let dir = tempdir();
    let cfg = reuse_config(dir.path(), 4);
    let d = dir.path().to_path_buf();
    let c = cfg.clone();
    // Enough adds that files are reused many times over, then a crash.
    let seen_out = std::sync::Arc::new(std::sync::Mutex::new(HashMap::new()));
    let seen_in = seen_out.clone();
    run(move || async move {
        let engine = Engine::open(c).await.unwrap();
        let mut seen = HashMap::new();
        add_range(&engine, &d, 0, 400, 30, &mut seen).await;
        *seen_in.lock().unwrap() = seen;
    });
    // Find the journal's last batch: the highest-seq batch header in any file (the last file
    // by name may be a pre-created one holding only an earlier use's batches, and the blocks
    // after the durable end hold older batches too). Damage its entry data: the bytes stay,
    // the CRC fails.
    let mut best: Option<(std::path::PathBuf, u64, u64)> = None;
    for path in journal_files(dir.path()) {
        let img = std::fs::read(&path).unwrap();
        for at in (4096..img.len()).step_by(4096) {
            let h = &img[at..at + 24];
            let len = u32::from_le_bytes(h[4..8].try_into().unwrap());
            let kind = u16::from_le_bytes(h[16..18].try_into().unwrap());
            let seq = u64::from_le_bytes(h[8..16].try_into().unwrap());
            let crc = u32::from_le_bytes(h[0..4].try_into().unwrap());
            if len == 8
                && kind == 1
                && crc == crc32c::crc32c(&img[at + 4..at + 32])
                && best.as_ref().is_none_or(|b| seq > b.2)
            {
                best = Some((path.clone(), at as u64, seq));
            }
        }
    }
    let (last, at, _) = best.expect("a batch header in the journal");
    let name = last.file_name().unwrap().to_string_lossy().into_owned();
    let id = journal_inodes(dir.path())[&name];
    assert!(
        seen_out
            .lock()
            .unwrap()
            .iter()
            .any(|(n, i)| *i == id && *n != name),
        "the journal's last file {name} is not a reused one"
    );
    let img = std::fs::read(&last).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&last).unwrap();
    // The add record after the 32-byte batch header: flip a byte of its entry data.
    f.write_all_at(
        &[0xa5 ^ img[at as usize + 32 + 24 + 48 + 100]],
        at + 32 + 24 + 48 + 100,
    )
    .unwrap();
    drop(f);
    run(move || async move {
        let engine = Engine::open(cfg).await.unwrap();
        // The cut batch held entry 399: it is gone, everything before stays, writing goes on.
        check_entries(&engine, 399, "after the torn batch").await;
        engine
            .add_entry(1, 399, KEY, Some(398), payload(1, 399, ENTRY_BYTES), false)
            .await
            .unwrap();
        check_entries(&engine, 400, "after re-adding").await;
        engine.close().await.unwrap();
    });
}

#[test]
fn without_reuse_checkpointed_files_are_deleted() {
    let dir = tempdir();
    let cfg = reuse_config(dir.path(), 0);
    let d = dir.path().to_path_buf();
    run(move || async move {
        let engine = Engine::open(cfg).await.unwrap();
        let mut seen = HashMap::new();
        add_range(&engine, &d, 0, 300, 300, &mut seen).await;
        let inos: std::collections::HashSet<FileId> = seen.values().copied().collect();
        assert_eq!(inos.len(), seen.len(), "no file reused: {seen:?}");
        // After the checkpoint only the mark's file (and at most a pre-created next) remain.
        let left = journal_files(&d);
        assert!(left.len() <= 2, "{left:?}");
        check_entries(&engine, 300, "").await;
        engine.close().await.unwrap();
    });
}

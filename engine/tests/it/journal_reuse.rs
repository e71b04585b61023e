//! Goal: checkpointed journal files are reused by later rolls (BookKeeper `journalReuseFiles`):
//! the roll renames a kept file instead of pre-writing a new one, at most
//! `journal_reuse_files` checkpointed files stay on disk, and a journal whose files hold an
//! earlier use's batches replays exactly what was acknowledged, after a crash as after a close,
//! also when the last batch was torn. With reuse off, checkpointed files are deleted.
//! Method: real engines on O_DIRECT files under /tmp with 1 MiB journal files and checkpoints
//! by hand; a file's identity is its inode number with its birth time (an inode number alone
//! can be handed to a new file once the old one is deleted); a "crash" is the end of the
//! executor without `close`; a torn tail is made by damaging the last batch with std::fs.

use std::collections::HashMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::SystemTime;

use crate::common::{batch_headers, config, journal_files, payload, run, tempdir, BatchAt, KEY};
use quire_engine::format::{self as f, JournalSalt};
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
    // Find the journal's last batch: the highest-seq batch header of any file's current use
    // (the last file by name may be a pre-created one with no batch yet). Damage its entry
    // data: the bytes stay, the CRC fails.
    let mut best: Option<(std::path::PathBuf, BatchAt)> = None;
    for path in journal_files(dir.path()) {
        let img = std::fs::read(&path).unwrap();
        for b in batch_headers(&img) {
            if best.as_ref().is_none_or(|(_, x)| b.seq > x.seq) {
                best = Some((path.clone(), b));
            }
        }
    }
    let (last, batch) = best.expect("a batch header in the journal");
    let at = batch.offset as u64;
    let data_at = at + batch.header_bytes as u64 + 24 + 48 + 100;
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
    let f = std::fs::OpenOptions::new().write(true).open(&last).unwrap();
    // The write was torn: the sector holding the add's entry data never reached the medium
    // (zeros there, its stamp gone; a flipped byte with every stamp in place would be rot,
    // journal.md §Recovery rule 4, version 3).
    let sector = data_at / 512 * 512;
    f.write_all_at(&[0u8; 512], sector).unwrap();
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

/// The salt in the header of each journal file now on disk, by id (files a roll is renaming
/// at this moment are skipped).
fn journal_salts(dir: &Path) -> Vec<(u64, JournalSalt)> {
    let mut out = Vec::new();
    for p in journal_files(dir) {
        let Ok(img) = std::fs::read(&p) else { continue };
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let id =
            u64::from_str_radix(&name["journal-".len()..name.len() - ".qj".len()], 16).unwrap();
        if let f::JournalHeader::Ok { salt, .. } = f::decode_journal_header(&img) {
            out.push((id, salt));
        }
    }
    out.sort_by_key(|(id, _)| *id);
    out
}

/// Seq of the forged batch headers: above every seq the test's journal reaches.
const FORGED_SEQ: u64 = 1 << 60;

fn forged_header(salt: &JournalSalt) -> Vec<u8> {
    let mut b = Vec::new();
    f::encode_record(
        &mut b,
        FORGED_SEQ,
        &f::Record::BatchHeader {
            record_count: 1,
            batch_bytes: 4096,
        },
        salt,
    );
    b
}

#[test]
fn forged_batch_headers_in_entry_data_do_not_survive_reuse() {
    // Goal: entry data that holds a batch header valid for the journal file it is written to
    // (the strongest client: it knows that file use's salt) cannot make a later open fail once
    // the file is reused: the reuse gives the file a new salt, under which the old bytes are no
    // record (journal.md §Reuse). Without a new salt per use, replay would find the forged
    // header past the new use's last batch with a seq above the expected one and refuse to
    // open with `Corrupt` (rule 4).
    // Method: 1 MiB files, 2 kept for reuse, 8 KiB entries added one per batch, so an entry's
    // data starts 112 logical bytes into its batch (40-byte batch header, 24-byte record
    // header, 48-byte add fields). In a version 3 file a 4 KiB block holds 4032 logical bytes
    // (8 stamped sectors of 504), so the batch's second and third blocks start at its logical
    // bytes 4032 and 8064: entry bytes 3920 and 7952. There, each entry carries a forged batch
    // header (seq 2^60) sealed with the salt of the newest and the second newest journal file
    // before the add (one of them is the file the add goes to). A checkpoint every 30 adds
    // retires files, which later rolls reuse; then a crash and a reopen.
    const LEN: usize = 8192;
    const DATA_AT: usize = f::RECORD_HEADER_BYTES
        + f::BATCH_HEADER_PAYLOAD_BYTES
        + f::RECORD_HEADER_BYTES
        + f::ADD_FIXED_BYTES;
    const BLOCK_LOGICAL: usize = 8 * f::SECTOR_DATA_BYTES;
    const SLOTS: [usize; 2] = [BLOCK_LOGICAL - DATA_AT, 2 * BLOCK_LOGICAL - DATA_AT];
    let dir = tempdir();
    let cfg = reuse_config(dir.path(), 2);
    let d = dir.path().to_path_buf();
    let c = cfg.clone();
    let salts_out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let salts_in = salts_out.clone();
    let entry = |e: u64, salts: &[(u64, JournalSalt)]| {
        let mut data = payload(1, e, LEN);
        for (slot, (_, salt)) in SLOTS.iter().zip(salts.iter().rev()) {
            let h = forged_header(salt);
            data[*slot..*slot + h.len()].copy_from_slice(&h);
        }
        data
    };
    run(move || async move {
        let engine = Engine::open(c).await.unwrap();
        let mut all = Vec::new();
        for e in 0..400u64 {
            let salts = journal_salts(&d);
            all.extend(salts.iter().map(|(_, s)| *s));
            engine
                .add_entry(1, e, KEY, e.checked_sub(1), entry(e, &salts), false)
                .await
                .unwrap();
            if (e + 1) % 30 == 0 {
                engine.checkpoint().await.unwrap();
            }
        }
        *salts_in.lock().unwrap() = all;
        // Crash.
    });
    // Precondition: some file on disk holds, in a block past its current use's last batch, a
    // forged header that was valid under the salt of a use at the time it was written.
    let salts = salts_out.lock().unwrap().clone();
    let mut found = 0;
    for p in journal_files(dir.path()) {
        let img = std::fs::read(&p).unwrap();
        let end = batch_headers(&img)
            .iter()
            .filter(|b| b.seq != FORGED_SEQ)
            .max_by_key(|b| b.seq)
            .map_or(4096, |b| b.offset + f::stamped_len(b.batch_bytes as usize));
        found += (end..img.len())
            .step_by(4096)
            .filter(|&at| {
                salts.iter().any(|s| {
                    matches!(
                        f::decode_record(&img[at..], s),
                        f::RecordDecode::Ok {
                            seq: FORGED_SEQ,
                            ..
                        }
                    )
                })
            })
            .count();
    }
    assert!(
        found > 0,
        "no forged header past the end of a file's batches: the test did not set up what it \
         checks"
    );
    run(move || async move {
        let engine = Engine::open(cfg).await.unwrap();
        for e in 0..400u64 {
            assert_eq!(
                engine.read_entry(1, Some(e)).await.unwrap().len(),
                LEN,
                "entry {e}"
            );
        }
        engine.close().await.unwrap();
    });
}

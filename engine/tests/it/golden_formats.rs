//! Golden fixtures of every on-disk format version the engine reads (issue 25 item 7): ledger
//! directories under `engine/tests/fixtures/`, written once and never regenerated, opened with
//! today's code.
//!
//! - `v1-dir/`: what the first release left: a version 1 journal (no salt, 8-byte batch header
//!   payload) holding adds that no checkpoint covers, one entry log, the append-only
//!   `index.qix` with two segments (the second moves an entry and fences a ledger) and a
//!   version 1 checkpoint mark. Opening it migrates the index into segment files.
//! - `v3-dir/`: a crash image of today's engine (salted version 2 journal with adds after the
//!   last checkpoint, entry log, index segment files, version 3 mark, tombstone file).
//! - `journal-v3-dir/`: the same crash image written by the build that introduced journal
//!   format version 3 (stamped sectors: 504 logical bytes and an 8-byte stamp per sector); the
//!   `v3-dir/` one keeps its version 2 journal.
//! - `mark-v2.bin`: a version 2 checkpoint mark (segment ids without summaries).
//!
//! Each test copies a fixture to a temporary directory, so the fixture itself is never written.
//! `write_missing_fixtures` (ignored) wrote them; it refuses to overwrite a file that exists, so
//! a format change cannot quietly regenerate what older builds left on disk.

use std::path::{Path, PathBuf};

use crate::common::{config, payload, run, tempdir, KEY};
use quire_engine::format::{
    decode_journal_header, decode_mark, encode_entry_record, encode_file_header, encode_mark_v1,
    encode_mark_v2, encode_record, encode_segment, pad_to_block, JournalHeader, JournalSalt,
    Location, Mark, MarkDecode, Record, StoredLedger, ENTRY_LOG_MAGIC, FILE_HEADER_BYTES,
    INDEX_MAGIC, JOURNAL_MAGIC, RECORD_HEADER_BYTES,
};
use quire_engine::{Engine, Error};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Copies the fixture directory `name` (its `journal/` and `ledgers/`) into `to`.
fn copy_fixture_dir(name: &str, to: &Path) {
    for sub in ["journal", "ledgers"] {
        let from = fixtures().join(name).join(sub);
        std::fs::create_dir_all(to.join(sub)).unwrap();
        for e in std::fs::read_dir(&from).unwrap_or_else(|e| panic!("{}: {e}", from.display())) {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(sub).join(e.file_name())).unwrap();
        }
    }
}

// What v1-dir holds.
const V1_ENTRIES: u64 = 20;
/// Entry of ledger 1 that the second `index.qix` segment moved to a second copy.
const V1_MOVED: u64 = 5;
/// Ledger whose adds are only in the version 1 journal.
const V1_JOURNAL_LEDGER: u64 = 3;
const V1_JOURNAL_ENTRIES: u64 = 4;

fn v1_len(entry: u64) -> usize {
    40 + entry as usize % 50
}

#[test]
fn a_version_1_directory_opens_migrates_and_serves_every_entry() {
    let dir = tempdir();
    copy_fixture_dir("v1-dir", dir.path());
    let cfg = config(dir.path());
    let cfg2 = cfg.clone();
    run(move || async move {
        let e = Engine::open(cfg)
            .await
            .expect("open the version 1 directory");
        check_v1(&e).await;
        e.close().await.unwrap();
    });
    // The migrated directory (segment files, a version 3 mark) opens again the same.
    run(move || async move {
        let e = Engine::open(cfg2).await.expect("reopen after migration");
        check_v1(&e).await;
        e.close().await.unwrap();
    });
    let ledgers = dir.path().join("ledgers");
    assert!(
        !ledgers.join("index.qix").exists(),
        "index.qix outlived its migration"
    );
}

async fn check_v1(e: &Engine) {
    for ledger in [1u64, 2] {
        for entry in 0..V1_ENTRIES {
            let got = e.read_entry(ledger, Some(entry)).await.unwrap();
            assert_eq!(
                got,
                payload(ledger, entry, v1_len(entry)),
                "{ledger}/{entry}"
            );
        }
        let s = e.ledger_state(ledger).unwrap();
        assert_eq!(s.last_entry, Some(V1_ENTRIES - 1), "ledger {ledger}");
        assert_eq!(s.lac, Some(V1_ENTRIES - 2), "ledger {ledger}");
        assert_eq!(s.fenced, ledger == 2, "ledger {ledger}");
    }
    for entry in 0..V1_JOURNAL_ENTRIES {
        let got = e.read_entry(V1_JOURNAL_LEDGER, Some(entry)).await.unwrap();
        assert_eq!(
            got,
            payload(V1_JOURNAL_LEDGER, entry, 300),
            "journal entry {entry}"
        );
    }
    let s = e.ledger_state(V1_JOURNAL_LEDGER).unwrap();
    assert_eq!(s.last_entry, Some(V1_JOURNAL_ENTRIES - 1));
    assert_eq!(s.lac, Some(V1_JOURNAL_ENTRIES - 2));
    assert_eq!(e.bound_master_key(V1_JOURNAL_LEDGER), Some(KEY));
    e.verify_index().await.unwrap();
}

// What v3-dir holds (a crash image: no close after the last adds).
/// Ledger in the entry log and an index segment (checkpointed), LAC 8, last entry 9.
const V3_CHECKPOINTED: u64 = 1;
/// Fenced after its 3 entries, before the checkpoint.
const V3_FENCED: u64 = 2;
/// Only in the journal: 5 entries after the checkpoint, LAC 3.
const V3_JOURNAL_ONLY: u64 = 3;
/// Deleted by garbage collection (tombstoned).
const V3_DELETED: u64 = 4;

#[test]
fn a_crash_image_of_this_format_opens_and_serves_every_entry() {
    // Both crash images (journal version 2 in v3-dir, version 3 in journal-v3-dir) hold the
    // same entries and open the same.
    for name in ["v3-dir", "journal-v3-dir"] {
        open_crash_image(name);
    }
}

fn open_crash_image(name: &'static str) {
    let dir = tempdir();
    copy_fixture_dir(name, dir.path());
    let cfg = config(dir.path());
    run(move || async move {
        let e = Engine::open(cfg)
            .await
            .unwrap_or_else(|err| panic!("open the crash image {name}: {err}"));
        for entry in 0..10 {
            let got = e.read_entry(V3_CHECKPOINTED, Some(entry)).await.unwrap();
            assert_eq!(got, payload(V3_CHECKPOINTED, entry, 100), "entry {entry}");
        }
        let s = e.ledger_state(V3_CHECKPOINTED).unwrap();
        assert_eq!((s.lac, s.last_entry, s.fenced), (Some(8), Some(9), false));

        let s = e.ledger_state(V3_FENCED).unwrap();
        assert_eq!((s.lac, s.last_entry, s.fenced), (Some(1), Some(2), true));
        let refused = e
            .add_entry(V3_FENCED, 3, KEY, Some(2), payload(V3_FENCED, 3, 10), false)
            .await;
        assert!(matches!(refused, Err(Error::Fenced { .. })), "{refused:?}");

        for entry in 0..5 {
            let got = e.read_entry(V3_JOURNAL_ONLY, Some(entry)).await.unwrap();
            assert_eq!(got, payload(V3_JOURNAL_ONLY, entry, 2000), "entry {entry}");
        }
        let s = e.ledger_state(V3_JOURNAL_ONLY).unwrap();
        assert_eq!((s.lac, s.last_entry), (Some(3), Some(4)));

        assert!(e.is_deleted(V3_DELETED));
        assert!(e.ledger_state(V3_DELETED).is_none());
        e.verify_index().await.unwrap();
        e.close().await.unwrap();
    });
}

#[test]
fn the_fixture_headers_and_marks_decode_to_their_written_fields() {
    // The byte layouts themselves, field by field, so a decoder change that still opens the
    // directories (for instance by ignoring a field) is seen too.
    let v1_journal =
        std::fs::read(fixtures().join("v1-dir/journal/journal-0000000000000001.qj")).unwrap();
    assert_eq!(
        decode_journal_header(&v1_journal),
        JournalHeader::Ok {
            file_id: 1,
            salt: JournalSalt::V1
        }
    );
    let v1_mark = std::fs::read(fixtures().join("v1-dir/ledgers/checkpoint.qcp")).unwrap();
    let MarkDecode::Ok(m) = decode_mark(&v1_mark) else {
        panic!("v1 mark does not decode")
    };
    assert_eq!(
        (m.journal_file_id, m.journal_offset, m.next_seq),
        (1, FILE_HEADER_BYTES as u64, 1)
    );
    assert!(m.legacy_index_bytes.is_some() && m.segments.is_empty());

    let v2_mark = std::fs::read(fixtures().join("mark-v2.bin")).unwrap();
    let MarkDecode::Ok(m) = decode_mark(&v2_mark) else {
        panic!("v2 mark does not decode")
    };
    assert_eq!(
        (m.journal_file_id, m.journal_offset, m.next_seq),
        (7, 3 * FILE_HEADER_BYTES as u64, 1234)
    );
    assert_eq!(m.segments, vec![2, 5, 9]);
    assert!(m.summaries.is_empty() && m.legacy_index_bytes.is_none());

    let v3_mark = std::fs::read(fixtures().join("v3-dir/ledgers/checkpoint.qcp")).unwrap();
    let MarkDecode::Ok(m) = decode_mark(&v3_mark) else {
        panic!("v3 mark does not decode")
    };
    assert!(!m.segments.is_empty(), "the v3 mark names no index segment");
    for id in &m.segments {
        assert!(m.summaries.contains_key(id), "segment {id} has no summary");
    }
    for (name, version) in [("v3-dir", 2), ("journal-v3-dir", 3)] {
        let journals: Vec<_> = std::fs::read_dir(fixtures().join(name).join("journal"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(!journals.is_empty());
        for p in journals {
            let b = std::fs::read(&p).unwrap();
            match decode_journal_header(&b) {
                JournalHeader::Ok { salt, .. } => {
                    assert!(salt.value().is_some(), "{}", p.display());
                    assert_eq!(salt.version(), version, "{}", p.display());
                }
                other => panic!("{}: {other:?}", p.display()),
            }
        }
    }
}

/// Writes the fixtures that do not exist yet; never overwrites one. Run by hand only:
/// `cargo test --release -p quire-engine --test it golden_formats::write_missing_fixtures
/// -- --ignored`.
#[test]
#[ignore = "writes fixtures; run by hand when a new format version needs its fixture"]
fn write_missing_fixtures() {
    let root = fixtures();
    if !root.join("v1-dir").exists() {
        write_v1_dir(&root.join("v1-dir"));
    }
    if !root.join("v3-dir").exists() {
        write_v3_dir(&root.join("v3-dir"));
    }
    // The same crash image, written since journal format version 3.
    if !root.join("journal-v3-dir").exists() {
        write_v3_dir(&root.join("journal-v3-dir"));
    }
    let mark_v2 = root.join("mark-v2.bin");
    if !mark_v2.exists() {
        let m = Mark {
            journal_file_id: 7,
            journal_offset: 3 * FILE_HEADER_BYTES as u64,
            next_seq: 1234,
            legacy_index_bytes: None,
            segments: vec![2, 5, 9],
            summaries: Default::default(),
        };
        std::fs::write(mark_v2, encode_mark_v2(&m)).unwrap();
    }
}

fn write_v1_dir(dir: &Path) {
    std::fs::create_dir_all(dir.join("journal")).unwrap();
    std::fs::create_dir_all(dir.join("ledgers")).unwrap();
    let mut log = encode_file_header(ENTRY_LOG_MAGIC, 1);
    let mut locations = Vec::new();
    for ledger in [1u64, 2] {
        for entry in 0..V1_ENTRIES {
            let data = payload(ledger, entry, v1_len(entry));
            let offset = log.len() as u64;
            encode_entry_record(&mut log, ledger, entry, &data);
            let data_len = data.len() as u32;
            let location = Location {
                log_id: 1,
                offset,
                data_len,
            };
            locations.push((ledger, entry, location));
        }
    }
    // A second copy of 1/V1_MOVED, which the second segment points to (as compaction did).
    let moved_data = payload(1, V1_MOVED, v1_len(V1_MOVED));
    let moved_at = log.len() as u64;
    encode_entry_record(&mut log, 1, V1_MOVED, &moved_data);
    pad_to_block(&mut log);
    std::fs::write(dir.join("ledgers/entrylog-0000000000000001.qel"), &log).unwrap();

    let state = |fenced| StoredLedger {
        fenced,
        master_key: Some(KEY),
        fence_keys: Vec::new(),
        lac: Some(V1_ENTRIES - 2),
        last_entry: Some(V1_ENTRIES - 1),
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
    index.extend(encode_segment(&[(1, V1_MOVED, moved)], &[(2, state(true))]));
    std::fs::write(dir.join("ledgers/index.qix"), &index).unwrap();

    // A version 1 journal (the shared file header, unsalted records) whose one batch no
    // checkpoint covers: replay must bring ledger 3 back.
    let salt = JournalSalt::V1;
    let mut adds = Vec::new();
    for entry in 0..V1_JOURNAL_ENTRIES {
        let record = Record::Add {
            ledger: V1_JOURNAL_LEDGER,
            entry,
            lac: entry.checked_sub(1),
            recovery: false,
            master_key: KEY,
            data: payload(V1_JOURNAL_LEDGER, entry, 300),
        };
        encode_record(&mut adds, 2 + entry, &record, &salt);
    }
    let mut journal = encode_file_header(JOURNAL_MAGIC, 1);
    let header = Record::BatchHeader {
        record_count: V1_JOURNAL_ENTRIES as u32,
        // The batch's bytes count its header record too.
        batch_bytes: (RECORD_HEADER_BYTES + salt.batch_header_payload_bytes() + adds.len()) as u32,
    };
    encode_record(&mut journal, 1, &header, &salt);
    journal.extend_from_slice(&adds);
    pad_to_block(&mut journal);
    journal.resize(journal.len() + 2 * FILE_HEADER_BYTES, 0);
    std::fs::write(dir.join("journal/journal-0000000000000001.qj"), &journal).unwrap();

    let mark = Mark {
        journal_file_id: 1,
        journal_offset: FILE_HEADER_BYTES as u64,
        next_seq: 1,
        legacy_index_bytes: Some(index.len() as u64),
        segments: Vec::new(),
        summaries: Default::default(),
    };
    std::fs::write(dir.join("ledgers/checkpoint.qcp"), encode_mark_v1(&mark)).unwrap();
}

fn write_v3_dir(dir: &Path) {
    let scratch = tempdir();
    let cfg = config(scratch.path());
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        for entry in 0..10 {
            e.add_entry(
                V3_CHECKPOINTED,
                entry,
                KEY,
                entry.checked_sub(1),
                payload(1, entry, 100),
                false,
            )
            .await
            .unwrap();
        }
        for entry in 0..3 {
            let data = payload(V3_FENCED, entry, 50);
            e.add_entry(V3_FENCED, entry, KEY, entry.checked_sub(1), data, false)
                .await
                .unwrap();
        }
        e.fence(V3_FENCED, KEY).await.unwrap();
        e.add_entry(V3_DELETED, 0, KEY, None, payload(V3_DELETED, 0, 10), false)
            .await
            .unwrap();
        e.checkpoint().await.unwrap();
        e.collect_garbage(&[V3_DELETED]).await.unwrap();
        for entry in 0..5 {
            let data = payload(V3_JOURNAL_ONLY, entry, 2000);
            e.add_entry(
                V3_JOURNAL_ONLY,
                entry,
                KEY,
                entry.checked_sub(1),
                data,
                false,
            )
            .await
            .unwrap();
        }
        // Dropped without close: a crash image.
    });
    for sub in ["journal", "ledgers"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        for e in std::fs::read_dir(scratch.path().join(sub)).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), dir.join(sub).join(e.file_name())).unwrap();
            }
        }
    }
}

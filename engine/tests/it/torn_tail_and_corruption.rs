use std::os::unix::fs::FileExt;

use crate::common::{batch_headers, config, journal_files, payload, run, tempdir, KEY};
use quire_engine::{Engine, Error};

const BLOCK: u64 = 4096;
/// Where the add record of a one-add batch starts inside its block: batch header 24 + 16 bytes.
const ADD_RECORD_IN_BLOCK: u64 = 40;

/// Adds entries 0..n of ledger 1 one at a time (one batch per add, one block each for small
/// entries) and crashes.
fn write_sequential(cfg: quire_engine::EngineConfig, n: u64) {
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        for i in 0..n {
            e.add_entry(1, i, KEY, None, payload(1, i, 200), false)
                .await
                .unwrap();
        }
    });
}

/// Offset one past the last non-zero byte of the file.
fn data_end(path: &std::path::Path) -> u64 {
    use quire_engine::format as f;
    // A version 3 journal stamps every sector (padding too): the end of the last record is the
    // last non-zero logical byte, mapped back to its place on disk.
    let b = std::fs::read(path).unwrap();
    let mut logical = Vec::new();
    f::unstamp_sectors(&b[f::FILE_HEADER_BYTES..], &mut logical);
    logical.iter().rposition(|&x| x != 0).map_or(0, |p| {
        (f::FILE_HEADER_BYTES + f::stamped_offset(p)) as u64 + 1
    })
}

/// Reopens, checks entries 0..kept read back and `kept` is gone, adds more, crashes, and checks
/// once more (the writer resumed cleanly after the dropped tail).
fn check_tail_dropped(cfg: quire_engine::EngineConfig, kept: u64) {
    let cfg2 = cfg.clone();
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        for i in 0..kept {
            assert_eq!(e.read_entry(1, Some(i)).await.unwrap(), payload(1, i, 200));
        }
        assert!(matches!(
            e.read_entry(1, Some(kept)).await,
            Err(Error::NoSuchEntry { .. })
        ));
        assert_eq!(e.ledger_state(1).unwrap().last_entry, Some(kept - 1));
        for i in kept..kept + 5 {
            e.add_entry(1, i, KEY, None, payload(1, i, 200), false)
                .await
                .unwrap();
        }
    });
    run(move || async move {
        let e = Engine::open(cfg2).await.unwrap();
        for i in 0..kept + 5 {
            assert_eq!(
                e.read_entry(1, Some(i)).await.unwrap(),
                payload(1, i, 200),
                "entry {i}"
            );
        }
        e.close().await.unwrap();
    });
}

#[test]
fn journal_cut_inside_last_record_is_a_torn_tail() {
    // Goal: a journal file that ends inside its last record (a write cut short) opens; the last
    // entry is dropped, all earlier ones read back, and new adds continue after them.
    // Method: 10 sequential adds, crash, truncate the journal 50 bytes before the end of the
    // last record's data, reopen.
    let dir = tempdir();
    let cfg = config(dir.path());
    write_sequential(cfg.clone(), 10);
    let files = journal_files(dir.path());
    let last = files.last().unwrap();
    let end = data_end(last);
    std::fs::OpenOptions::new()
        .write(true)
        .open(last)
        .unwrap()
        .set_len(end - 50)
        .unwrap();
    check_tail_dropped(cfg, 9);
}

#[test]
fn garbled_last_record_is_a_torn_tail() {
    // Goal: a last record with bad bytes (failed CRC32C) and nothing durable after it is a torn
    // tail: dropped, earlier entries kept. Method: 10 sequential adds, crash, zero the sector
    // holding the end of the last record (lost in a torn write), reopen.
    let dir = tempdir();
    let cfg = config(dir.path());
    write_sequential(cfg.clone(), 10);
    let last = journal_files(dir.path()).last().unwrap().clone();
    let end = data_end(&last);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(&last)
        .unwrap();
    // A torn write: the sector holding the record's last bytes never reached the medium (its
    // stamp is gone with it; a flipped byte under an intact stamp would be rot, journal.md
    // §Recovery rule 4, version 3).
    let sector = (end - 20) / 512 * 512;
    f.write_all_at(&[0u8; 512], sector).unwrap();
    check_tail_dropped(cfg, 9);
}

#[test]
fn garbled_record_before_durable_batches_is_corruption() {
    // Goal: damage followed by durable data is not a torn tail: open fails with Corrupt, and
    // the message names the journal file and the byte offset of the bad record.
    // Method: 10 sequential adds (batch k is in block k+1), crash, flip a byte in the data of
    // add 3, reopen and inspect the error.
    let dir = tempdir();
    let cfg = config(dir.path());
    write_sequential(cfg.clone(), 10);
    let last = journal_files(dir.path()).last().unwrap().clone();
    let block = BLOCK * (1 + 3);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(&last)
        .unwrap();
    let at = block + ADD_RECORD_IN_BLOCK + 24 + 48 + 20;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0xff], at).unwrap();
    let want_offset = block + ADD_RECORD_IN_BLOCK;
    run(move || async move {
        match Engine::open(cfg).await {
            Err(err @ Error::Corrupt { .. }) => {
                let msg = err.to_string();
                assert!(
                    msg.contains(&last.display().to_string()),
                    "message lacks the path: {msg}"
                );
                assert!(
                    msg.contains(&format!("byte offset {want_offset}")),
                    "message lacks the offset: {msg}"
                );
                let Error::Corrupt {
                    path,
                    file_offset_bytes,
                    ..
                } = err
                else {
                    unreachable!()
                };
                assert_eq!(path, last);
                assert_eq!(file_offset_bytes, want_offset);
            }
            Err(other) => panic!("expected Corrupt, got {other}"),
            Ok(_) => panic!("open succeeded over mid-file corruption"),
        }
    });
}

#[test]
fn garbled_batch_header_before_a_later_journal_file_is_corruption() {
    // Goal: the corruption rule looks across journal files: a bad batch in one file followed by
    // a valid batch in the next file refuses to open. Method: 1 MiB journals, 16 KiB entries
    // until the journal rolls, crash, garble the first batch header of the first file, reopen.
    let dir = tempdir();
    let cfg = config(dir.path());
    let c = cfg.clone();
    run(move || async move {
        let e = Engine::open(c).await.unwrap();
        for i in 0..80u64 {
            e.add_entry(1, i, KEY, None, payload(1, i, 16 << 10), false)
                .await
                .unwrap();
        }
    });
    let files = journal_files(dir.path());
    assert!(files.len() >= 2);
    let first = files[0].clone();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(&first)
        .unwrap();
    f.write_all_at(&[0xee; 4], BLOCK + 8).unwrap();
    run(move || async move {
        match Engine::open(cfg).await {
            Err(err @ Error::Corrupt { .. }) => {
                let msg = err.to_string();
                assert!(msg.contains(&first.display().to_string()), "{msg}");
                assert!(msg.contains("byte offset 4096"), "{msg}");
            }
            Err(other) => panic!("expected Corrupt, got {other}"),
            Ok(_) => panic!("open succeeded over corruption"),
        }
    });
}

/// Offset of the batch header with `record_count` records, searching 4 KiB block starts.
fn find_batch_with(img: &[u8], record_count: u32) -> Option<usize> {
    batch_headers(img)
        .into_iter()
        .find(|b| b.record_count == record_count)
        .map(|b| b.offset)
}

/// Adds entries `0..n` of `ledger` concurrently (one group commit: the test config waits 1 ms
/// for the oldest add), then crashes.
fn add_one_batch(cfg: quire_engine::EngineConfig, ledger: u64, n: u64, len: usize) {
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let e = e.clone();
                glommio::spawn_local(async move {
                    e.add_entry(ledger, i, KEY, None, payload(ledger, i, len), false)
                        .await
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
}

#[test]
fn a_dropped_torn_batch_cannot_complete_a_later_torn_batch() {
    dropped_batch_case(Tear::KeepFirstBlock);
}

#[test]
fn a_torn_batch_that_lost_its_header_cannot_complete_a_later_torn_batch() {
    // The torn write kept its later sectors but lost the first block, header included: at the
    // batch's offset replay finds zeros, a clean-looking end, yet the batch's records follow.
    dropped_batch_case(Tear::LoseFirstBlock);
}

/// Which part of batch B the crash kept.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tear {
    KeepFirstBlock,
    LoseFirstBlock,
}

fn dropped_batch_case(tear: Tear) {
    // Goal: the records of a torn batch that replay dropped never become part of a later batch
    // (journal.md §Recovery rule 4: the file holding the dropped batch is sealed, the next
    // batch goes to a new file). Method: records of 472 bytes (400-byte entries), so that the
    // first record after a 40-byte batch header ends at 512. Batch B (16 adds of ledger 1) is
    // torn after its first 4 KiB (or loses its first 4 KiB and keeps the rest: `tear`); the
    // engine reopens (B dropped) and writes batch B' (5 adds of
    // ledger 2), which must land at the start of the next file, B's file staying byte for byte
    // as it was. Were B' written at B's offset with B's seq (as before sealing, unless B was
    // zeroed, and a crash could cut that zeroing), a tear of B' after 512 bytes would leave B's
    // records 2-5 to complete it (right seqs, valid CRCs, ending at B''s length). B' is then
    // torn after 512 bytes and neither ledger may have an entry.
    const LEN: usize = 400;
    let dir = tempdir();
    let cfg = config(dir.path());
    add_one_batch(cfg.clone(), 1, 16, LEN);
    let files = journal_files(dir.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let path = files[0].clone();
    let img = std::fs::read(&path).unwrap();
    let x = find_batch_with(&img, 16).expect("the 16 adds formed one batch");
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    match tear {
        Tear::KeepFirstBlock => f.write_all_at(&vec![0u8; 2 * BLOCK as usize], x as u64 + BLOCK),
        Tear::LoseFirstBlock => f.write_all_at(&vec![0u8; BLOCK as usize], x as u64),
    }
    .unwrap();
    drop(f);
    let torn = std::fs::read(&path).unwrap();

    add_one_batch(cfg.clone(), 2, 5, LEN);
    assert!(
        std::fs::read(&path).unwrap() == torn,
        "the file holding the dropped batch was written again"
    );
    let files = journal_files(dir.path());
    assert_eq!(files.len(), 2, "{files:?}");
    let next = files[1].clone();
    let img2 = std::fs::read(&next).unwrap();
    let y = find_batch_with(&img2, 5).expect("B' (5 adds) is in the next file");
    assert_eq!(y, BLOCK as usize, "B' starts the next file");
    // Tear B' after 512 bytes.
    let f = std::fs::OpenOptions::new().write(true).open(&next).unwrap();
    f.write_all_at(&vec![0u8; 2 * BLOCK as usize - 512], y as u64 + 512)
        .unwrap();
    drop(f);

    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        for ledger in [1, 2] {
            assert!(
                e.ledger_state(ledger)
                    .is_none_or(|s| s.last_entry.is_none()),
                "ledger {ledger} has entries from a torn batch: {:?}",
                e.ledger_state(ledger).map(|s| s.last_entry)
            );
        }
        e.close().await.unwrap();
    });
}

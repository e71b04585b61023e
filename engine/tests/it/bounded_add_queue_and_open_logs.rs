//! Goal: two engine tables are bounded (issue 12, items 4 and 5):
//! - the journal queue: with `journal_queue_bytes_max` of 256 KiB, 800 adds of 8 KiB issued at
//!   once never have more than 256 KiB + one add queued (they wait for the writer instead) and
//!   all succeed; with no wait allowed, adds that find the queue full are refused
//!   `JournalQueueFull` instead of queued;
//! - open entry-log files: with `entry_log_readers_max` 2, reads across more than a dozen entry logs keep
//!   at most 2 (+ the log being written) open, before and after a restart, and read the right
//!   bytes.
//!
//! Method: a real engine on O_DIRECT files; the queue is sampled by each add's task as it
//! starts, after the adds before it were queued (a count of bytes, not a timing).

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use crate::common::{config, payload, run, tempdir, KEY};
use quire_engine::{Engine, Error};

/// Bytes one journal record of an 8 KiB add takes in the queue, at most (header and fixed
/// fields are far below 1 KiB).
const ADD_RECORD_BYTES_MAX: usize = (8 << 10) + 1024;

#[test]
fn adds_wait_for_room_in_the_journal_queue() {
    let dir = tempdir();
    let mut cfg = config(dir.path());
    cfg.journal_queue_bytes_max = 256 << 10;
    cfg.group_commit_bytes_max = 64 << 10;
    cfg.journal_file_size_bytes = 8 << 20;
    // A bound on the wait, not a timing: every add must get in on a slow disk too.
    cfg.write_cache_wait_max = Duration::from_secs(120);
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        let max_queued = Rc::new(Cell::new(0usize));
        let adds: Vec<_> = (0..800u64)
            .map(|n| {
                let (e, max_queued) = (e.clone(), max_queued.clone());
                glommio::spawn_local(async move {
                    max_queued.set(max_queued.get().max(e.journal_queue_bytes()));
                    e.add_entry(n, 0, KEY, None, payload(n, 0, 8 << 10), false)
                        .await
                })
            })
            .collect();
        for a in adds {
            a.await.unwrap();
        }
        let max_queued = max_queued.get();
        assert!(
            max_queued <= (256 << 10) + ADD_RECORD_BYTES_MAX,
            "{max_queued} bytes were queued for the journal at once"
        );
        assert!(
            max_queued > 64 << 10,
            "the adds never filled the queue ({max_queued} bytes): nothing was tested"
        );
        for n in (0..800u64).step_by(97) {
            assert_eq!(
                e.read_entry(n, Some(0)).await.unwrap(),
                payload(n, 0, 8 << 10)
            );
        }
        e.close().await.unwrap();
    });
}

#[test]
fn a_full_journal_queue_refuses_when_the_wait_is_over() {
    let dir = tempdir();
    let mut cfg = config(dir.path());
    cfg.journal_queue_bytes_max = 64 << 10;
    cfg.group_commit_bytes_max = 64 << 10;
    cfg.journal_file_size_bytes = 8 << 20;
    cfg.write_cache_wait_max = Duration::ZERO;
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        let adds: Vec<_> = (0..400u64)
            .map(|n| {
                let e = e.clone();
                glommio::spawn_local(async move {
                    e.add_entry(n, 0, KEY, None, payload(n, 0, 8 << 10), false)
                        .await
                })
            })
            .collect();
        let (mut stored, mut refused) = (Vec::new(), 0);
        for (n, a) in adds.into_iter().enumerate() {
            match a.await {
                Ok(()) => stored.push(n as u64),
                Err(Error::JournalQueueFull { queued_bytes, .. }) => {
                    assert!(queued_bytes > 64 << 10, "{queued_bytes}");
                    refused += 1;
                }
                Err(other) => panic!("add {n}: {other}"),
            }
        }
        assert!(refused > 0, "no add found the queue full");
        assert!(!stored.is_empty(), "no add got in");
        // A refused add stored nothing; a stored one reads back.
        for n in 0..400u64 {
            match e.read_entry(n, Some(0)).await {
                Ok(data) => {
                    assert!(stored.contains(&n), "refused add {n} was stored");
                    assert_eq!(data, payload(n, 0, 8 << 10));
                }
                Err(Error::NoSuchLedger { .. } | Error::NoSuchEntry { .. }) => {
                    assert!(!stored.contains(&n), "stored add {n} is missing")
                }
                Err(other) => panic!("read {n}: {other}"),
            }
        }
        e.close().await.unwrap();
    });
}

#[test]
fn entry_log_files_open_for_reads_are_bounded() {
    let dir = tempdir();
    let mut cfg = config(dir.path());
    cfg.entry_log_readers_max = 2;
    cfg.entry_log_size_bytes_max = 64 << 10;
    // Reads must reach the entry logs, not a cache.
    cfg.read_cache_bytes_max = 0;
    cfg.read_ahead_entries = 0;
    let cfg2 = cfg.clone();
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        // 12 checkpoints of 3 entries of 20 KiB: about one entry log each.
        for n in 0..36u64 {
            e.add_entry(1, n, KEY, n.checked_sub(1), payload(1, n, 20 << 10), false)
                .await
                .unwrap();
            if n % 3 == 2 {
                e.checkpoint().await.unwrap();
            }
        }
        for round in 0..2 {
            for n in 0..36u64 {
                assert_eq!(
                    e.read_entry(1, Some(n)).await.unwrap(),
                    payload(1, n, 20 << 10),
                    "round {round} entry {n}"
                );
                let open = e.entry_log_files_open();
                assert!(open <= 3, "{open} entry logs open after reading entry {n}");
            }
        }
        e.close().await.unwrap();
    });
    let logs = std::fs::read_dir(dir.path().join("ledgers"))
        .unwrap()
        .filter(|d| {
            d.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("entrylog-")
        })
        .count();
    assert!(logs >= 8, "only {logs} entry logs were written");
    run(move || async move {
        let e = Engine::open(cfg2).await.unwrap();
        let open = e.entry_log_files_open();
        assert!(open <= 2, "{open} entry logs open after a restart");
        for n in (0..36u64).rev() {
            assert_eq!(
                e.read_entry(1, Some(n)).await.unwrap(),
                payload(1, n, 20 << 10)
            );
            let open = e.entry_log_files_open();
            assert!(open <= 2, "{open} entry logs open after reading entry {n}");
        }
        e.close().await.unwrap();
    });
}

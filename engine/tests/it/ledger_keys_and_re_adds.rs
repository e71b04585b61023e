//! Goal: an acknowledged entry cannot be replaced, and a stranger's fence of a ledger id the
//! shard has never seen cannot block the real writer (docs/protocol.md §Add, §Fence).
//! - A re-add of a stored entry with other bytes is `EntryMismatch` wherever the stored copy is
//!   (write cache, entry log after a checkpoint, after a restart), and the stored bytes stay;
//!   the same bytes are accepted (recovery re-adds are idempotent), normal or recovery.
//! - Concurrent adds of one entry with different bytes: only the first is stored.
//! - A new entry (above the ledger's largest) is never looked up in the index.
//! - A fence of an unknown ledger with key S does not bind S: the first add with another key K
//!   is accepted and binds K, after which S is refused (`Unauthorized`); a fence with K before
//!   any add keeps K fenced (BookKeeper's guarantee), also when S fenced first, after a crash
//!   (journal replay) and after a checkpoint and reopen (the index segment's fence-key records).
//!
//! Method: a real engine on O_DIRECT files; crashes by ending the executor.

use std::rc::Rc;

use crate::common::{config, payload, run, tempdir, KEY};
use quire_engine::{Engine, Error};

const STRANGER: [u8; 20] = [0x5a; 20];

fn other_bytes(ledger: u64, entry: u64) -> Vec<u8> {
    let mut v = payload(ledger, entry, 100);
    v[50] ^= 0xff;
    v
}

fn is_mismatch(r: &Result<(), Error>, ledger: u64, entry: u64) -> bool {
    matches!(r, Err(Error::EntryMismatch { ledger: l, entry: e }) if *l == ledger && *e == entry)
}

#[test]
fn re_add_with_other_bytes_is_refused_wherever_the_entry_is() {
    let dir = tempdir();
    let cfg = config(dir.path());
    let cfg2 = cfg.clone();
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        for n in 0..3 {
            e.add_entry(1, n, KEY, n.checked_sub(1), payload(1, n, 100), false)
                .await
                .unwrap();
        }
        // In the write cache.
        for recovery in [false, true] {
            let r = e
                .add_entry(1, 1, KEY, Some(0), other_bytes(1, 1), recovery)
                .await;
            assert!(is_mismatch(&r, 1, 1), "recovery {recovery}: {r:?}");
        }
        e.add_entry(1, 1, KEY, Some(0), payload(1, 1, 100), true)
            .await
            .expect("an identical recovery re-add is accepted");
        e.add_entry(1, 1, KEY, Some(0), payload(1, 1, 100), false)
            .await
            .expect("an identical normal re-add is accepted");
        // In the entry log (the checkpoint emptied the write cache).
        e.checkpoint().await.unwrap();
        let r = e
            .add_entry(1, 2, KEY, Some(1), other_bytes(1, 2), true)
            .await;
        assert!(is_mismatch(&r, 1, 2), "{r:?}");
        e.add_entry(1, 2, KEY, Some(1), payload(1, 2, 100), true)
            .await
            .unwrap();
        // Concurrent adds of one new entry: the first is stored; a copy with the same bytes
        // waits for it and is accepted; one with other bytes waits and is refused.
        let ((a, b), c) = futures_lite::future::zip(
            futures_lite::future::zip(
                e.add_entry(1, 3, KEY, Some(2), payload(1, 3, 100), false),
                e.add_entry(1, 3, KEY, Some(2), payload(1, 3, 100), false),
            ),
            e.add_entry(1, 3, KEY, Some(2), other_bytes(1, 3), false),
        )
        .await;
        a.unwrap();
        b.unwrap();
        assert!(is_mismatch(&c, 1, 3), "{c:?}");
        assert_eq!(e.read_entry(1, Some(3)).await.unwrap(), payload(1, 3, 100));
        // Out of order: entry 6 of ledger 2 first, then two racing adds of entry 5 (below the
        // ledger's largest entry, but stored nowhere) with different bytes: the first is
        // taken, the second finds it in flight, waits for it and is refused.
        e.add_entry(2, 6, KEY, None, payload(2, 6, 100), false)
            .await
            .unwrap();
        let (a, b) = futures_lite::future::zip(
            e.add_entry(2, 5, KEY, None, payload(2, 5, 100), false),
            e.add_entry(2, 5, KEY, None, other_bytes(2, 5), false),
        )
        .await;
        a.unwrap();
        assert!(is_mismatch(&b, 2, 5), "{b:?}");
        assert_eq!(e.read_entry(2, Some(5)).await.unwrap(), payload(2, 5, 100));
        // Crash.
    });
    run(move || async move {
        let e = Engine::open(cfg2).await.unwrap();
        for n in 0..4 {
            let r = e.add_entry(1, n, KEY, None, other_bytes(1, n), true).await;
            assert!(is_mismatch(&r, 1, n), "entry {n}: {r:?}");
            assert_eq!(e.read_entry(1, Some(n)).await.unwrap(), payload(1, n, 100));
        }
        // A stranger's key is refused before any comparison.
        assert!(matches!(
            e.add_entry(1, 0, STRANGER, None, other_bytes(1, 0), true)
                .await,
            Err(Error::Unauthorized { ledger: 1 })
        ));
        e.close().await.unwrap();
    });
}

#[test]
fn new_entries_skip_the_index_and_re_adds_are_compared_with_it() {
    // Goal: the add path's cost for a new entry stays one lookup of the ledger table: no index
    // lookup (which may read a block from disk) for an entry above the ledger's largest, even
    // when the entry's key lies inside an index segment's key range; an older entry, no longer
    // in the write cache, is compared with the copy the index points to. Method: checkpoint
    // ledgers 1 and 2 (so the segment spans (1, 0)..(2, 9)), then count the block-cache
    // lookups of the index while adding entries 10.. of ledger 1.
    let dir = tempdir();
    let cfg = config(dir.path());
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        for l in [1, 2] {
            for n in 0..10 {
                e.add_entry(l, n, KEY, n.checked_sub(1), payload(l, n, 100), false)
                    .await
                    .unwrap();
            }
        }
        e.checkpoint().await.unwrap();
        let lookups = |e: &Engine| {
            let s = e.index_stats();
            s.cache_hits + s.cache_misses
        };
        let before = lookups(&e);
        for n in 10..60 {
            e.add_entry(1, n, KEY, Some(n - 1), payload(1, n, 100), false)
                .await
                .unwrap();
        }
        assert_eq!(lookups(&e), before, "new entries looked at the index");
        let r = e
            .add_entry(1, 5, KEY, Some(4), other_bytes(1, 5), true)
            .await;
        assert!(is_mismatch(&r, 1, 5), "{r:?}");
        assert!(
            lookups(&e) > before,
            "a re-add of a checkpointed entry reads the index"
        );
        e.close().await.unwrap();
    });
}

#[test]
fn a_strangers_fence_of_an_unknown_ledger_does_not_bind_its_key() {
    let dir = tempdir();
    let cfg = config(dir.path());
    let cfg2 = cfg.clone();
    let cfg3 = cfg.clone();
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        // Ledger 1: only the stranger fenced; the real writer's adds go through.
        assert_eq!(e.fence(1, STRANGER).await.unwrap(), None);
        e.add_entry(1, 0, KEY, None, payload(1, 0, 100), false)
            .await
            .expect("the real writer's first add");
        assert!(!e.ledger_state(1).unwrap().fenced);
        assert!(matches!(
            e.fence(1, STRANGER).await,
            Err(Error::Unauthorized { ledger: 1 })
        ));
        // Ledger 2: the stranger and then the real recovery fenced before any add: the old
        // writer (key KEY) stays cut off.
        e.fence(2, STRANGER).await.unwrap();
        e.fence(2, KEY).await.unwrap();
        assert!(matches!(
            e.add_entry(2, 0, KEY, None, payload(2, 0, 100), false)
                .await,
            Err(Error::Fenced { ledger: 2 })
        ));
        // Ledger 3: fenced with the real key only, then a stranger's add binds another key:
        // the real writer's adds are refused (Unauthorized), never acknowledged.
        e.fence(3, KEY).await.unwrap();
        e.add_entry(3, 0, STRANGER, None, payload(3, 0, 100), false)
            .await
            .unwrap();
        assert!(matches!(
            e.add_entry(3, 1, KEY, Some(0), payload(3, 1, 100), false)
                .await,
            Err(Error::Unauthorized { ledger: 3 })
        ));
        // Ledgers 4 and 5: left fenced (by the stranger; by both) for the restart.
        e.fence(4, STRANGER).await.unwrap();
        e.fence(5, STRANGER).await.unwrap();
        e.fence(5, KEY).await.unwrap();
        // More than 16 distinct keys on one unbound ledger are refused.
        for k in 0..16u8 {
            e.fence(6, [k; 20]).await.unwrap();
        }
        assert!(matches!(
            e.fence(6, [16; 20]).await,
            Err(Error::Unauthorized { ledger: 6 })
        ));
        e.fence(6, [3; 20]).await.expect("a recorded key again");
        // Crash: the states come back from the journal.
    });
    let check = |e: Rc<Engine>| async move {
        assert!(matches!(
            e.add_entry(2, 0, KEY, None, payload(2, 0, 100), false)
                .await,
            Err(Error::Fenced { ledger: 2 })
        ));
        assert!(matches!(
            e.add_entry(5, 0, KEY, None, payload(5, 0, 100), false)
                .await,
            Err(Error::Fenced { ledger: 5 })
        ));
        assert!(matches!(
            e.add_entry(3, 1, KEY, Some(0), payload(3, 1, 100), false)
                .await,
            Err(Error::Unauthorized { ledger: 3 })
        ));
        assert!(matches!(
            e.fence(1, STRANGER).await,
            Err(Error::Unauthorized { ledger: 1 })
        ));
        assert!(matches!(
            e.fence(6, [16; 20]).await,
            Err(Error::Unauthorized { ledger: 6 })
        ));
    };
    run(move || async move {
        let e = Engine::open(cfg2).await.unwrap();
        check(e.clone()).await;
        e.add_entry(1, 1, KEY, Some(0), payload(1, 1, 100), false)
            .await
            .unwrap();
        // Into the index, then reopen.
        e.checkpoint().await.unwrap();
        e.close().await.unwrap();
    });
    run(move || async move {
        let e = Engine::open(cfg3).await.unwrap();
        check(e.clone()).await;
        // Ledger 4 (only the stranger fenced) takes the real writer, after the index round
        // trip; ledger 6 still knows its 16 keys.
        e.add_entry(4, 0, KEY, None, payload(4, 0, 100), false)
            .await
            .unwrap();
        e.fence(6, [15; 20]).await.unwrap();
        e.close().await.unwrap();
    });
}

#[test]
fn fence_only_keys_survive_a_restart_through_the_index_segments() {
    // Goal: fences recorded for keys no add bound are kept by the index segments' ledger-state
    // records (flag bit 4, one record per key), not only by the journal: through checkpoints
    // that each write a newer state, a full index merge (which reads and rewrites the states)
    // and a reopen whose replay starts after every fence. Method: fence, checkpoint, fence
    // more, checkpoint, merge, close, reopen; then probe each ledger with adds and fences.
    let dir = tempdir();
    let cfg = config(dir.path());
    let cfg2 = cfg.clone();
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        // Ledger 10: a stranger's fence only. Ledger 11: the real key (a recovery). Ledger 12:
        // 16 keys, 8 per checkpoint, so that the newer segment's state overrides the older.
        e.fence(10, STRANGER).await.unwrap();
        e.fence(11, STRANGER).await.unwrap();
        e.fence(11, KEY).await.unwrap();
        for k in 0..8u8 {
            e.fence(12, [k; 20]).await.unwrap();
        }
        // Something for the segments to locate as well.
        e.add_entry(9, 0, KEY, None, payload(9, 0, 100), false)
            .await
            .unwrap();
        e.checkpoint().await.unwrap();
        for k in 8..16u8 {
            e.fence(12, [k; 20]).await.unwrap();
        }
        e.add_entry(9, 1, KEY, Some(0), payload(9, 1, 100), false)
            .await
            .unwrap();
        e.checkpoint().await.unwrap();
        e.merge_index().await.unwrap();
        e.close().await.unwrap();
    });
    run(move || async move {
        let e = Engine::open(cfg2).await.unwrap();
        assert!(matches!(
            e.add_entry(11, 0, KEY, None, payload(11, 0, 100), false)
                .await,
            Err(Error::Fenced { ledger: 11 })
        ));
        assert!(matches!(
            e.fence(12, [16; 20]).await,
            Err(Error::Unauthorized { ledger: 12 })
        ));
        // A key of the first checkpoint and one of the second are both still recorded.
        e.fence(12, [0; 20]).await.unwrap();
        e.fence(12, [15; 20]).await.unwrap();
        assert!(matches!(
            e.add_entry(12, 0, [15; 20], None, payload(12, 0, 100), false)
                .await,
            Err(Error::Fenced { ledger: 12 })
        ));
        e.add_entry(10, 0, KEY, None, payload(10, 0, 100), false)
            .await
            .expect("the stranger's fence did not bind ledger 10");
        assert!(!e.ledger_state(10).unwrap().fenced);
        assert_eq!(e.read_entry(9, Some(1)).await.unwrap(), payload(9, 1, 100));
        e.close().await.unwrap();
    });
}

/// Overwrites, in every entry log under `ledger_dir`, the stored bytes `entry` with
/// pseudo-random ones (a damaged medium), synced; returns how many copies it found.
fn damage_entry_log_copies(ledger_dir: &std::path::Path, entry: &[u8]) -> usize {
    use std::io::{Seek, SeekFrom, Write};
    let mut found = 0;
    for f in std::fs::read_dir(ledger_dir).unwrap() {
        let path = f.unwrap().path();
        if path.extension().is_none_or(|x| x != "qel") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let Some(at) = bytes.windows(entry.len()).position(|w| w == entry) else {
            continue;
        };
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..entry.len())
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.seek(SeekFrom::Start(at as u64)).unwrap();
        file.write_all(&noise).unwrap();
        file.sync_all().unwrap();
        found += 1;
    }
    found
}

#[test]
fn issue23_recovery_adds_replace_only_unconfirmed_copies_of_a_fenced_ledger_or_damaged_ones() {
    // Goal (issue 23 items 2 and 6, docs/protocol.md §Add "Replacing a stored entry"): a
    // recovery add replaces a readable copy with other bytes only once the ledger is fenced
    // and only above the shard's LAC, never a confirmed entry, never for a normal add; it
    // replaces a copy that cannot be read back (damaged entry-log record) whether fenced or
    // not. The new bytes are read back at once, after a checkpoint, after a clean reopen and
    // after a crash (journal replay).
    // Method: a real engine on O_DIRECT files; entry-log records overwritten in place with
    // the engine closed; a crash by ending the executor.
    let dir = tempdir();
    let cfg = config(dir.path());
    let (cfg2, cfg3) = (cfg.clone(), cfg.clone());
    let ledger_dir = cfg.ledger_dir.clone();
    let other = |n: u8| {
        let mut v = payload(7, 5, 100);
        v[60] ^= n;
        v
    };
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        // Entries 0..=5, each with the LAC before it: the shard's LAC is 4.
        for n in 0..6 {
            e.add_entry(7, n, KEY, n.checked_sub(1), payload(7, n, 100), false)
                .await
                .unwrap();
        }
        for n in 0..4 {
            e.add_entry(8, n, KEY, n.checked_sub(1), payload(8, n, 100), false)
                .await
                .unwrap();
        }
        // Not fenced: no replacement, even above the LAC.
        let r = e.add_entry(7, 5, KEY, Some(4), other(1), true).await;
        assert!(is_mismatch(&r, 7, 5), "{r:?}");
        e.fence(7, KEY).await.unwrap();
        // Fenced, but at or below the LAC: confirmed, never replaced.
        let mut below = payload(7, 4, 100);
        below[60] ^= 1;
        let r = e.add_entry(7, 4, KEY, Some(3), below, true).await;
        assert!(is_mismatch(&r, 7, 4), "{r:?}");
        // A normal add is refused by the fence before any comparison.
        let r = e.add_entry(7, 5, KEY, Some(4), other(1), false).await;
        assert!(matches!(r, Err(Error::Fenced { ledger: 7 })), "{r:?}");
        // Fenced and above the LAC: the copy in the write cache is replaced.
        e.add_entry(7, 5, KEY, Some(4), other(1), true)
            .await
            .expect("replaces an unconfirmed copy in the write cache");
        assert_eq!(e.read_entry(7, Some(5)).await.unwrap(), other(1));
        // The same, with the copy in the entry log.
        e.checkpoint().await.unwrap();
        e.add_entry(7, 5, KEY, Some(4), other(2), true)
            .await
            .expect("replaces an unconfirmed copy in the entry log");
        assert_eq!(e.read_entry(7, Some(5)).await.unwrap(), other(2));
        e.add_entry(7, 5, KEY, Some(4), other(2), true)
            .await
            .expect("an identical re-add");
        e.checkpoint().await.unwrap();
        assert_eq!(e.ledger_state(7).unwrap().lac, Some(4));
        e.close().await.unwrap();
    });
    assert_eq!(damage_entry_log_copies(&ledger_dir, &payload(8, 1, 100)), 1);
    run(move || async move {
        let e = Engine::open(cfg2).await.unwrap();
        assert_eq!(e.read_entry(7, Some(5)).await.unwrap(), other(2));
        let r = e.read_entry(8, Some(1)).await;
        assert!(matches!(r, Err(Error::Corrupt { .. })), "{r:?}");
        // A normal add finds the copy unreadable and stores nothing.
        let r = e
            .add_entry(8, 1, KEY, Some(0), payload(8, 1, 100), false)
            .await;
        assert!(
            matches!(r, Err(Error::Corrupt { .. } | Error::Io { .. })),
            "{r:?}"
        );
        // A recovery add (re-replication's repair) takes the damaged copy's place; the ledger
        // is not fenced.
        e.add_entry(8, 1, KEY, Some(0), payload(8, 1, 100), true)
            .await
            .expect("a recovery add replaces a damaged copy");
        assert_eq!(e.read_entry(8, Some(1)).await.unwrap(), payload(8, 1, 100));
        e.checkpoint().await.unwrap();
        assert_eq!(e.read_entry(8, Some(1)).await.unwrap(), payload(8, 1, 100));
        // One more replacement, left in the journal only: a crash.
        e.add_entry(7, 5, KEY, Some(4), other(3), true)
            .await
            .unwrap();
    });
    run(move || async move {
        let e = Engine::open(cfg3).await.unwrap();
        assert_eq!(e.read_entry(7, Some(5)).await.unwrap(), other(3));
        assert_eq!(e.read_entry(8, Some(1)).await.unwrap(), payload(8, 1, 100));
        for n in [0, 2, 3] {
            assert_eq!(e.read_entry(8, Some(n)).await.unwrap(), payload(8, n, 100));
        }
        e.close().await.unwrap();
    });
}

use crate::common::{config, payload, run, tempdir, KEY};
use quire_engine::{Engine, Error};

#[test]
fn adds_read_back_from_cache_and_entry_logs() {
    // Goal: entries read back byte-identical from the write cache, and after a checkpoint from
    // the entry logs; `None` reads the last entry; misses are NoSuchLedger / NoSuchEntry.
    // Method: add entries to two ledgers, read them, checkpoint (cache empties), read again,
    // then close, reopen and read once more (now only the index and entry logs hold them).
    let dir = tempdir();
    let cfg = config(dir.path());
    let cfg2 = cfg.clone();
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        for entry in 0..20u64 {
            for ledger in [1u64, 2] {
                e.add_entry(
                    ledger,
                    entry,
                    KEY,
                    entry.checked_sub(1),
                    payload(ledger, entry, 100 + entry as usize * 50),
                    false,
                )
                .await
                .unwrap();
            }
        }
        assert!(e.write_cache_bytes() > 0);
        for ledger in [1u64, 2] {
            for entry in 0..20u64 {
                assert_eq!(
                    e.read_entry(ledger, Some(entry)).await.unwrap(),
                    payload(ledger, entry, 100 + entry as usize * 50)
                );
            }
            assert_eq!(
                e.read_entry(ledger, None).await.unwrap(),
                payload(ledger, 19, 100 + 19 * 50)
            );
            let s = e.ledger_state(ledger).unwrap();
            assert_eq!(s.last_entry, Some(19));
            assert_eq!(s.lac, Some(18));
            assert!(!s.fenced);
        }
        e.checkpoint().await.unwrap();
        assert_eq!(e.write_cache_bytes(), 0);
        for entry in 0..20u64 {
            assert_eq!(
                e.read_entry(2, Some(entry)).await.unwrap(),
                payload(2, entry, 100 + entry as usize * 50)
            );
        }
        assert_eq!(
            e.read_entry(1, None).await.unwrap(),
            payload(1, 19, 100 + 19 * 50)
        );
        assert!(matches!(
            e.read_entry(3, Some(0)).await,
            Err(Error::NoSuchLedger { ledger: 3 })
        ));
        assert!(matches!(
            e.read_entry(1, Some(20)).await,
            Err(Error::NoSuchEntry {
                ledger: 1,
                entry: 20
            })
        ));
        assert!(matches!(
            e.read_entry(3, None).await,
            Err(Error::NoSuchLedger { ledger: 3 })
        ));
        assert!(e.ledger_state(3).is_none());
        e.close().await.unwrap();
        assert!(matches!(
            e.add_entry(1, 20, KEY, None, vec![1], false).await,
            Err(Error::Closed)
        ));
        assert!(matches!(e.read_entry(1, Some(0)).await, Err(Error::Closed)));
        assert!(matches!(e.close().await, Err(Error::Closed)));
    });
    run(move || async move {
        let e = Engine::open(cfg2).await.unwrap();
        assert_eq!(
            e.write_cache_bytes(),
            0,
            "a clean close leaves nothing to replay"
        );
        for ledger in [1u64, 2] {
            for entry in 0..20u64 {
                assert_eq!(
                    e.read_entry(ledger, Some(entry)).await.unwrap(),
                    payload(ledger, entry, 100 + entry as usize * 50)
                );
            }
            assert_eq!(e.ledger_state(ledger).unwrap().lac, Some(18));
        }
        e.close().await.unwrap();
    });
}

#[test]
fn too_large_and_empty_ledger() {
    // Goal: oversized adds are refused with TooLarge; a fenced ledger with no entries answers
    // NoSuchEntry for the last entry. Method: direct calls on a fresh engine.
    let dir = tempdir();
    let mut cfg = config(dir.path());
    cfg.entry_size_bytes_max = 1000;
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        assert!(matches!(
            e.add_entry(1, 0, KEY, None, vec![0; 1001], false).await,
            Err(Error::TooLarge {
                size_bytes: 1001,
                max: 1000
            })
        ));
        e.add_entry(1, 0, KEY, None, vec![5; 1000], false)
            .await
            .unwrap();
        assert_eq!(e.fence(9, KEY).await.unwrap(), None);
        assert!(matches!(
            e.read_entry(9, None).await,
            Err(Error::NoSuchEntry {
                ledger: 9,
                entry: u64::MAX
            })
        ));
        e.close().await.unwrap();
    });
}

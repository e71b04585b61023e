//! Goal: while a checkpoint is writing and the live write cache has refilled to its bound, adds
//! wait for the checkpoint instead of growing the cache without limit; an add that waits longer
//! than `write_cache_wait_max` fails with `WriteCacheFull`, loses nothing already acknowledged,
//! and the engine takes adds again once the checkpoint is done.
//! Method: a real engine on O_DIRECT files under /tmp with a 256 KiB write cache and bulk
//! writes paced at 512 KiB/s, so a checkpoint of a full cache takes about half a second. Three
//! writers add 16 KiB entries back to back while background checkpoints run; the live cache size
//! is sampled after every add. Then the same with a 20 ms wait bound, which must fail some add;
//! finally every acknowledged entry is read back after a reopen.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{add_payload, payload, run, slow_checkpoint_config, tempdir};
use quire_engine::{Engine, Error};

const ENTRY_BYTES: usize = 16 << 10;
const CACHE_BYTES: usize = 256 << 10;

#[test]
fn adds_wait_for_write_cache_room_and_give_up_after_the_bound() {
    let dir = tempdir();
    let mut cfg = slow_checkpoint_config(dir.path(), CACHE_BYTES);
    let c = cfg.clone();
    let acked: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let acked_for_check = acked.clone();
    {
        run(move || async move {
            let engine = Rc::new(Engine::open(c).await.unwrap());
            let largest = Rc::new(Cell::new(0usize));
            let mut writers = Vec::new();
            for ledger in 1..=3u64 {
                let (engine, largest, acked) = (engine.clone(), largest.clone(), acked.clone());
                writers.push(glommio::spawn_local(async move {
                    for e in 0..40u64 {
                        add_payload(&engine, ledger, e, ENTRY_BYTES).await.unwrap();
                        acked.lock().unwrap().push((ledger, e));
                        largest.set(largest.get().max(engine.write_cache_bytes()));
                    }
                }));
            }
            for w in writers {
                w.await;
            }
            // 1.9 MiB went through a 256 KiB cache: adds waited, and the live cache never held
            // more than the bound plus the adds admitted together (one per writer).
            assert!(engine.write_cache_waits() > 0, "no add ever waited");
            assert!(
                largest.get() <= CACHE_BYTES + 3 * ENTRY_BYTES,
                "live write cache reached {} bytes",
                largest.get()
            );
            Rc::try_unwrap(engine).ok().unwrap().close().await.unwrap();
        });
    }

    // A 20 ms bound: a writer that finds the cache full behind a ~0.5 s checkpoint gives up.
    cfg.write_cache_wait_max = Duration::from_millis(20);
    let c = cfg.clone();
    let acked2 = acked_for_check.clone();
    run(move || async move {
        let engine = Engine::open(c).await.unwrap();
        let mut refused = None;
        for e in 0..200u64 {
            match add_payload(&engine, 4, e, ENTRY_BYTES).await {
                Ok(()) => acked2.lock().unwrap().push((4, e)),
                Err(err) => {
                    refused = Some((e, err));
                    break;
                }
            }
        }
        let (e, err) = refused.expect("some add must have found the cache full");
        assert!(
            matches!(err, Error::WriteCacheFull { waited_ms } if waited_ms >= 20),
            "unexpected error {err:?}"
        );
        // Once the checkpoint is through, the same add goes in.
        engine.checkpoint().await.unwrap();
        add_payload(&engine, 4, e, ENTRY_BYTES).await.unwrap();
        acked2.lock().unwrap().push((4, e));
        engine.close().await.unwrap();
    });

    cfg.background_write_bytes_per_second = 0;
    let expected: Vec<(u64, u64)> = acked_for_check.lock().unwrap().clone();
    run(move || async move {
        let engine = Engine::open(cfg).await.unwrap();
        for (ledger, e) in expected {
            assert_eq!(
                engine.read_entry(ledger, Some(e)).await.unwrap(),
                payload(ledger, e, ENTRY_BYTES),
                "ledger {ledger} entry {e}"
            );
        }
        engine.close().await.unwrap();
    });
}

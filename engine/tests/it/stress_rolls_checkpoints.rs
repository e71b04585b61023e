//! Goal: under sustained adds faster than the bulk writer's pace, with journal rolls,
//! pre-creations and checkpoints all overlapping, the engine keeps making progress: every add
//! completes (acknowledged, or refused with `WriteCacheFull`) and none waits forever.
//! Method: a real engine on O_DIRECT files; small journal files (so pre-creation and rolls are
//! frequent), a small write cache (so checkpoints run back to back and adds wait for room),
//! eight writers adding 32 KiB entries back to back for a few seconds; a watchdog on a plain
//! thread fails the test when no add completes for 20 s.

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{add_payload, config, run, tempdir};
use quire_engine::{Engine, Error};

#[test]
fn overlapping_rolls_precreations_and_checkpoints_keep_progressing() {
    let dir = tempdir();
    let mut cfg = config(dir.path());
    cfg.journal_file_size_bytes = 4 << 20;
    cfg.write_cache_bytes_max = 2 << 20;
    cfg.group_commit_wait_max = Duration::ZERO;
    cfg.checkpoint_interval = Duration::from_millis(200);
    let done = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (done, finished) = (done.clone(), finished.clone());
        std::thread::spawn(move || {
            let mut last = (0, Instant::now());
            while !finished.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(200));
                let n = done.load(Ordering::SeqCst);
                if n != last.0 {
                    last = (n, Instant::now());
                } else if last.1.elapsed() > Duration::from_secs(20) {
                    eprintln!("no add completed for 20 s after {n} adds: the engine is stuck");
                    std::process::abort();
                }
            }
        })
    };
    let d = done.clone();
    run(move || async move {
        let engine = Rc::new(Engine::open(cfg).await.unwrap());
        let deadline = Instant::now() + Duration::from_secs(8);
        let mut writers = Vec::new();
        for ledger in 1..=8u64 {
            let (engine, d) = (engine.clone(), d.clone());
            writers.push(glommio::spawn_local(async move {
                let mut e = 0u64;
                while Instant::now() < deadline {
                    match add_payload(&engine, ledger, e, 32 << 10).await {
                        Ok(()) => e += 1,
                        Err(Error::WriteCacheFull { .. }) => {}
                        Err(err) => panic!("ledger {ledger} entry {e}: {err}"),
                    }
                    d.fetch_add(1, Ordering::SeqCst);
                }
                e
            }));
        }
        let mut total = 0;
        for w in writers {
            total += w.await;
        }
        eprintln!("{total} entries acknowledged");
        Rc::try_unwrap(engine).ok().unwrap().close().await.unwrap();
    });
    finished.store(true, Ordering::SeqCst);
    watchdog.join().unwrap();
}

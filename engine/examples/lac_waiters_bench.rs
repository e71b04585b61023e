//! Cost of parked long polls (issue 12, item 5: the LAC waiter list was scanned on every poll,
//! quadratic in the number of parked polls). Parks `n` long polls on one ledger through
//! `Engine::wait_for_lac`, then wakes them all with one add, for a small and a 8× larger `n`
//! in the same process, and prints the time per waiter and the ratio large/small of the total
//! park time: about 8 when parking is O(1) per waiter, about 64 when it is O(n). A benchmark,
//! not a test: nothing is asserted.
//!
//! Run: `cargo run --release -p quire-engine --example lac_waiters_bench -- [dir] [small_n]`
//! (dir defaults to /tmp; ext4 or xfs, never tmpfs; small_n defaults to 2000).

// A benchmark's stopwatch is the real clock, whatever clock the code under test reads
// (quire_clock seam, clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use quire_engine::{Engine, EngineConfig};

const KEY: [u8; 20] = [7; 20];

/// Parks `n` long polls on ledger 1 and wakes them; returns (park time, wake time).
async fn round(engine: Rc<Engine>, ledger: u64, n: usize) -> (Duration, Duration) {
    engine
        .add_entry(ledger, 0, KEY, None, vec![1; 64], false)
        .await
        .unwrap();
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let e = engine.clone();
        tasks.push(glommio::spawn_local(async move {
            e.wait_for_lac(ledger, None, Duration::from_secs(600))
                .await
                .map(|u| u.lac)
        }));
    }
    // The LAC is None until an add carries one: every poll parks.
    while engine.lac_waiters(ledger) < n {
        glommio::yield_if_needed().await;
        glommio::executor().yield_task_queue_now().await;
    }
    let parked = start.elapsed();
    let start = Instant::now();
    engine
        .add_entry(ledger, 1, KEY, Some(0), vec![2; 64], false)
        .await
        .unwrap();
    for t in tasks {
        assert_eq!(t.await.unwrap(), Some(0));
    }
    (parked, start.elapsed())
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "/tmp".into()));
    let small: usize = args.next().map_or(2000, |v| v.parse().expect("small_n"));
    let tmp = tempfile::Builder::new()
        .prefix("quire-lac-bench-")
        .tempdir_in(&dir)
        .expect("tempdir");
    let path = tmp.path().to_path_buf();
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(move || async move {
            let mut cfg = EngineConfig::new(path.join("journal"), path.join("ledgers"));
            cfg.journal_file_size_bytes = 1 << 22;
            cfg.group_commit_wait_max = Duration::from_micros(100);
            let engine = Engine::open(cfg).await.unwrap();
            // Warm-up, then small and large alternately, three times each.
            round(engine.clone(), 1, small / 4).await;
            let mut ledger = 2;
            let (mut ts, mut tl) = (Vec::new(), Vec::new());
            for _ in 0..3 {
                ts.push(round(engine.clone(), ledger, small).await);
                tl.push(round(engine.clone(), ledger + 1, small * 8).await);
                ledger += 2;
            }
            let best = |v: &[(Duration, Duration)]| {
                (
                    v.iter().map(|r| r.0).min().unwrap(),
                    v.iter().map(|r| r.1).min().unwrap(),
                )
            };
            let (ps, ws) = best(&ts);
            let (pl, wl) = best(&tl);
            println!(
                "n={small}: park {:?} ({:.0} ns/waiter), wake {:?}",
                ps,
                ps.as_nanos() as f64 / small as f64,
                ws
            );
            println!(
                "n={}: park {:?} ({:.0} ns/waiter), wake {:?}",
                small * 8,
                pl,
                pl.as_nanos() as f64 / (small * 8) as f64,
                wl
            );
            println!(
                "ratio large/small (8x waiters): park {:.1}, wake {:.1} (8 = linear, 64 = quadratic)",
                pl.as_secs_f64() / ps.as_secs_f64(),
                wl.as_secs_f64() / ws.as_secs_f64()
            );
            engine.close().await.unwrap();
        })
        .unwrap()
        .join()
        .unwrap();
}

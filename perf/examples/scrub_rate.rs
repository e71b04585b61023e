//! The scrubber's cost (issue 28 item 5, "How it is checked": its read rate and its effect on
//! tail-write p99, same run, with and without it), on one real engine shard: the io_uring
//! O_DIRECT journal and entry logs of `quire_engine::Engine` in `--dir` (a real disk, not
//! tmpfs), on one glommio executor as a bookie shard runs it (the scrub pass and the adds share
//! the shard's thread and disk, as `bookie/src/scrub.rs` runs `Engine::scrub` there).
//!
//! 1. **Fill**: `--data-mib` MiB of `--entry-bytes` entries over 8 ledgers, checkpointed into
//!    entry logs and the index.
//! 2. **Read rate**: per round, one whole pass at each configured rate (4 MiB/s, the default
//!    `scrub_rate_bytes_per_sec`, and `--scrub-mib` MiB/s): bytes read / the pass's duration,
//!    and that over the configured rate.
//! 3. **Tail writes**: per round, `--secs` s of open-loop adds (`--rate` adds/s of
//!    `--entry-bytes`, each acknowledged after its journal sync; latency from its scheduled
//!    time) without the scrubber (A), with back-to-back passes at the default 4 MiB/s (B), and
//!    at `--scrub-mib` MiB/s (C): A/B/C/A/B/C. p50, p99, p99.9 per window, and the ratios B/A
//!    and C/A of each round's p99.
//!
//! Usage: `cargo run --release -p quire-perf --example scrub_rate -- --dir target/scrub-bench`

// A benchmark's stopwatch is the real clock (quire_clock seam, clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::cell::Cell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use clap::Parser;
use glommio::{LocalExecutorBuilder, Placement};
use hdrhistogram::Histogram;
use quire_engine::{Engine, EngineConfig};

const KEY: [u8; 20] = [7; 20];
const MIB: u64 = 1 << 20;
/// The bookie's default `[scrub] rate_bytes_per_sec`.
const DEFAULT_SCRUB_RATE: u64 = 4 * MIB;

#[derive(Parser, Clone)]
struct Args {
    /// Directory for the shard's journal and ledgers (emptied first; must be a real disk).
    #[arg(long, default_value = "target/scrub-bench")]
    dir: PathBuf,
    /// Data stored before the measurements, MiB.
    #[arg(long, default_value_t = 64)]
    data_mib: u64,
    #[arg(long, default_value_t = 4096)]
    entry_bytes: usize,
    /// The high scrub rate measured, MiB/s (the low one is the default, 4 MiB/s).
    #[arg(long, default_value_t = 64)]
    scrub_mib: u64,
    /// Adds per second in the tail-write windows.
    #[arg(long, default_value_t = 500)]
    rate: u64,
    /// Length of each tail-write window, seconds.
    #[arg(long, default_value_t = 5)]
    secs: u64,
    #[arg(long, default_value_t = 2)]
    rounds: u32,
}

/// An entry's bytes: ledger and entry id first (the entry header the engine checks), then
/// filler.
fn entry_data(ledger: u64, entry: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|i| (i as u64 ^ entry) as u8 | 1).collect();
    v[..8].copy_from_slice(&ledger.to_le_bytes());
    v[8..16].copy_from_slice(&entry.to_le_bytes());
    v
}

fn main() {
    let args = Args::parse();
    assert!(
        args.entry_bytes >= 16,
        "--entry-bytes holds the 16-byte entry header"
    );
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(16 << 20)
        .spawn(move || run(args))
        .expect("spawn the shard's executor")
        .join()
        .expect("shard");
}

async fn run(mut a: Args) {
    // glommio opens directories by path: a relative one fails its directory sync.
    a.dir = std::path::absolute(&a.dir).expect("absolute --dir");
    let _ = std::fs::remove_dir_all(&a.dir);
    let cfg = EngineConfig::new(a.dir.join("journal"), a.dir.join("ledgers"));
    let e = Engine::open(cfg).await.expect("open the engine");
    fill(&e, &a).await;
    println!("filled {} MiB in {} B entries", a.data_mib, a.entry_bytes);
    let mut ratios = Vec::new();
    for round in 0..a.rounds {
        for rate in [DEFAULT_SCRUB_RATE, a.scrub_mib * MIB] {
            let p = e.scrub(rate).await.expect("scrub pass");
            let got = p.bytes_scanned as f64 / p.duration.as_secs_f64();
            println!(
                "round {round} read rate: configured {:.1} MiB/s, achieved {:.2} MiB/s ({:.3} of configured), {} entries, {:.1} MiB in {:.2?}",
                rate as f64 / MIB as f64,
                got / MIB as f64,
                got / rate as f64,
                p.entries_scanned,
                p.bytes_scanned as f64 / MIB as f64,
                p.duration
            );
        }
    }
    let mut ledger = 1000;
    let windows = [
        ("A without", None),
        ("B scrubber at the default rate", Some(DEFAULT_SCRUB_RATE)),
        ("C scrubber at --scrub-mib", Some(a.scrub_mib * MIB)),
    ];
    for round in 0..a.rounds {
        let mut p99 = [0u64; 3];
        for (i, (label, scrub)) in windows.into_iter().enumerate() {
            ledger += 1;
            let h = window(&e, &a, ledger, scrub).await;
            p99[i] = h.value_at_quantile(0.99);
            println!(
                "round {round} tail writes {label}: {} adds, p50 {} us, p99 {} us, p99.9 {} us",
                h.len(),
                h.value_at_quantile(0.5),
                p99[i],
                h.value_at_quantile(0.999)
            );
        }
        let a99 = p99[0].max(1) as f64;
        ratios.push((p99[1] as f64 / a99, p99[2] as f64 / a99));
    }
    let shown: Vec<String> = ratios
        .iter()
        .map(|(b, c)| format!("B/A {b:.2}, C/A {c:.2}"))
        .collect();
    println!("p99 ratios per round: {}", shown.join("; "));
    e.close().await.expect("close");
    let _ = std::fs::remove_dir_all(&a.dir);
}

/// Stores `--data-mib` MiB over 8 ledgers, 64 adds in flight, then a checkpoint.
async fn fill(e: &Rc<Engine>, a: &Args) {
    let total = a.data_mib * MIB / a.entry_bytes as u64;
    let next = Rc::new(Cell::new(0u64));
    let mut workers = Vec::new();
    for _ in 0..64 {
        let (e, next, len) = (e.clone(), next.clone(), a.entry_bytes);
        workers.push(glommio::spawn_local(async move {
            loop {
                let i = next.get();
                if i >= total {
                    return;
                }
                next.set(i + 1);
                let (ledger, entry) = (1 + i % 8, i / 8);
                e.add_entry(
                    ledger,
                    entry,
                    KEY,
                    entry.checked_sub(1),
                    entry_data(ledger, entry, len),
                    false,
                )
                .await
                .expect("fill add");
            }
        }));
    }
    for w in workers {
        w.await;
    }
    e.checkpoint().await.expect("checkpoint");
}

/// `--secs` s of open-loop adds to `ledger` at `--rate` adds/s, with back-to-back scrub passes
/// at `scrub` bytes/s when given; each add's latency from its scheduled start, microseconds.
async fn window(e: &Rc<Engine>, a: &Args, ledger: u64, scrub: Option<u64>) -> Histogram<u64> {
    let stop = Rc::new(Cell::new(false));
    let scrubber = scrub.map(|rate| {
        let (e, stop) = (e.clone(), stop.clone());
        glommio::spawn_local(async move {
            while !stop.get() {
                e.scrub(rate).await.expect("scrub pass");
            }
        })
    });
    let hist = Rc::new(std::cell::RefCell::new(
        Histogram::<u64>::new(3).expect("histogram"),
    ));
    let start = Instant::now();
    let gap = Duration::from_secs_f64(1.0 / a.rate as f64);
    let n = a.rate * a.secs;
    let mut adds = Vec::with_capacity(n as usize);
    for entry in 0..n {
        let due = start + gap * entry as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            glommio::timer::sleep(wait).await;
        }
        let (e, hist, len) = (e.clone(), hist.clone(), a.entry_bytes);
        adds.push(glommio::spawn_local(async move {
            e.add_entry(
                ledger,
                entry,
                KEY,
                entry.checked_sub(1),
                entry_data(ledger, entry, len),
                false,
            )
            .await
            .expect("add");
            let us = due.elapsed().as_micros() as u64;
            hist.borrow_mut().record(us.max(1)).expect("record");
        }));
    }
    for t in adds {
        t.await;
    }
    stop.set(true);
    if let Some(t) = scrubber {
        t.await;
    }
    let h = hist.borrow().clone();
    h
}

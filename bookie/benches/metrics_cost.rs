//! What recording metrics costs on the add path.
//!
//! Two measurements, each metrics-on against metrics-off in the same run:
//! 1. **End to end**: a real one-shard bookie (O_DIRECT journal under `$TMPDIR`, real TCP on
//!    127.0.0.1) takes `ADDS` pipelined adds (64 in flight, 1 KiB entries, 8 ledgers) from
//!    one client thread; rounds alternate off, on, off, on, ... so that both see the same
//!    machine. Reported: median time per add of each mode and the ratio on/off.
//! 2. **Recording alone**: the calls one add makes into its shard's metrics (the request
//!    histogram, the add-bytes counter, the journal-add histogram, and one batch's sync, flush
//!    and queue figures, charged per add as if every batch held one add: the worst case),
//!    timed in a loop.
//!
//! Run: `cargo bench -p quire-bookie --bench metrics_cost` (`QUIRE_BENCH_ROUNDS`, default 20
//! per mode; `QUIRE_BENCH_ADDS`, default 10000 per round).

// A benchmark's stopwatch is the real clock, whatever clock the code under test reads
// (quire_clock seam, clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use quire_bookie::metrics::BookieMetrics;
use quire_bookie::{Bookie, BookieConfig};
use quire_engine::JournalObserver;
use quire_wire::bookie::{decode_response, encode_request, Request, Response};
use quire_wire::entry::{encode_entry, EntryHeader};
use quire_wire::frame::decode_frame;
use quire_wire::{EntryId, LedgerId, MasterKey};

const IN_FLIGHT: usize = 64;
const LEDGERS: u64 = 8;
const ENTRY_PAYLOAD_BYTES: usize = 1024;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One round: a fresh bookie, `adds` pipelined adds; returns the time per add.
fn round(metrics_on: bool, adds: usize) -> Duration {
    let dir = tempfile::Builder::new()
        .prefix("quire-metrics-bench-")
        .tempdir_in(std::env::temp_dir())
        .expect("tempdir");
    let mut config = BookieConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        dir.path().join("journal"),
        dir.path().join("ledgers"),
    );
    config.shards = 1;
    config.engine.journal_file_size_bytes = 64 << 20;
    let metrics = BookieMetrics::new();
    if metrics_on {
        config.metrics = Some(metrics.for_bookie("bench", 1));
    }
    let bookie = Bookie::start(config).expect("bookie starts");
    if metrics_on {
        metrics.add_status("bench", bookie.status());
    }

    let mut stream = TcpStream::connect(bookie.addr()).unwrap();
    stream.set_nodelay(true).unwrap();
    let mut out = Vec::new();
    encode_request(
        &mut out,
        0,
        &Request::Hello {
            version_min: 1,
            version_max: 1,
        },
    );
    stream.write_all(&out).unwrap();
    let mut buf = Vec::new();
    let mut answered = 0usize;
    // The Hello answer.
    read_answers(&mut stream, &mut buf, 1);

    let key = MasterKey([3; 20]);
    let payload = vec![0x5au8; ENTRY_PAYLOAD_BYTES];
    let entries: Vec<Vec<u8>> = (0..adds as u64)
        .map(|i| {
            let ledger = i % LEDGERS;
            let entry = i / LEDGERS;
            encode_entry(
                EntryHeader {
                    ledger: LedgerId(ledger + 1),
                    entry: EntryId(entry),
                    lac: None,
                    length_bytes: (entry + 1) * ENTRY_PAYLOAD_BYTES as u64,
                },
                &payload,
            )
        })
        .collect();
    let started = Instant::now();
    let mut sent = 0usize;
    while answered < adds {
        out.clear();
        while sent < adds && sent - answered < IN_FLIGHT {
            encode_request(
                &mut out,
                sent as u64 + 1,
                &Request::Add {
                    recovery: false,
                    master_key: key,
                    entry: &entries[sent],
                },
            );
            sent += 1;
        }
        if !out.is_empty() {
            stream.write_all(&out).unwrap();
        }
        answered += read_answers(&mut stream, &mut buf, 1);
    }
    let took = started.elapsed();
    drop(stream);
    bookie.shutdown().unwrap();
    took / adds as u32
}

/// Reads until at least `at_least` whole answers arrived; returns how many were decoded.
/// Every answer must be a success.
fn read_answers(stream: &mut TcpStream, buf: &mut Vec<u8>, at_least: usize) -> usize {
    let mut n = 0;
    let mut chunk = vec![0u8; 256 * 1024];
    loop {
        while let Some((frame, used)) = decode_frame(buf, u32::MAX).unwrap() {
            match decode_response(&frame).unwrap() {
                Response::Failed {
                    status, message, ..
                } => {
                    panic!("add failed: {status:?} {message}")
                }
                _ => n += 1,
            }
            buf.drain(..used);
        }
        if n >= at_least {
            return n;
        }
        let got = stream.read(&mut chunk).unwrap();
        assert!(got > 0, "bookie closed the connection");
        buf.extend_from_slice(&chunk[..got]);
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The recording calls one add costs, in nanoseconds per add.
fn recording_alone(iterations: u32) -> f64 {
    let metrics = BookieMetrics::new();
    let shard = metrics.for_bookie("bench", 1);
    let m = shard.shard(0);
    let batch = quire_engine::JournalBatch {
        records: 1,
        bytes: 4096,
        write: Duration::from_micros(20),
        sync: Duration::from_micros(150),
        queued: 3,
    };
    let took = Duration::from_micros(400);
    let started = Instant::now();
    for i in 0..iterations {
        let t = std::hint::black_box(took + Duration::from_nanos(u64::from(i & 1023)));
        m.add_request.observe(true, t);
        m.add_bytes.inc_by(std::hint::black_box(1024));
        m.add_durable(t);
        m.batch_durable(std::hint::black_box(&batch));
    }
    started.elapsed().as_nanos() as f64 / f64::from(iterations)
}

fn main() {
    let rounds = env_usize("QUIRE_BENCH_ROUNDS", 20);
    let adds = env_usize("QUIRE_BENCH_ADDS", 10_000);
    // Warm-up round (page cache, CPU frequency), not counted.
    round(false, adds / 4);
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let mut pair_ratios = Vec::new();
    for r in 0..rounds {
        // Alternate which mode goes first in each pair.
        let order = if r % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for metrics_on in order {
            let per_add = round(metrics_on, adds);
            println!(
                "round {r} metrics {}: {:.2} us/add",
                if metrics_on { "on " } else { "off" },
                per_add.as_secs_f64() * 1e6
            );
            if metrics_on { &mut on } else { &mut off }.push(per_add);
        }
        // The two runs of a pair ran back to back: their ratio sees the least drift.
        pair_ratios.push(on[r].as_secs_f64() / off[r].as_secs_f64());
    }
    pair_ratios.sort_by(|a, b| a.total_cmp(b));
    let (off_m, on_m) = (median(&mut off), median(&mut on));
    println!(
        "end to end: median {:.2} us/add without metrics, {:.2} us/add with; ratio on/off {:.3} ({rounds} rounds each, {adds} adds per round, {IN_FLIGHT} in flight, {ENTRY_PAYLOAD_BYTES} B entries)",
        off_m.as_secs_f64() * 1e6,
        on_m.as_secs_f64() * 1e6,
        on_m.as_secs_f64() / off_m.as_secs_f64()
    );
    println!(
        "paired: median of per-pair ratios on/off {:.3} (quartiles {:.3} .. {:.3})",
        pair_ratios[pair_ratios.len() / 2],
        pair_ratios[pair_ratios.len() / 4],
        pair_ratios[pair_ratios.len() * 3 / 4]
    );
    let mut alone: Vec<f64> = (0..5).map(|_| recording_alone(2_000_000)).collect();
    alone.sort_by(|a, b| a.total_cmp(b));
    println!(
        "recording alone: {:.1} ns per add (median of 5 x 2,000,000; every batch charged to one add), {:.2}% of the median add without metrics",
        alone[2],
        100.0 * alone[2] / (off_m.as_secs_f64() * 1e9)
    );
}

//! CPU cost of journal format version 3's stamped sectors (journal.md §Sectors): building a
//! batch's write buffer as version 2 did (records, zero padding to 4 KiB) versus version 3
//! (records into a scratch buffer, then laid out 504 bytes + an 8-byte stamp per sector), for
//! batches of one 1 KiB add, 64 KiB and 512 KiB of adds. The modes run interleaved, round after
//! round, in one process; the report gives per-mode medians over rounds of the time per batch,
//! bytes written per batch, and version 3's time as a ratio of version 2's. The disk part
//! (one O_DIRECT write + fdatasync per batch) is the same in both but for the extra blocks,
//! which the bytes column shows. A benchmark, not a test: nothing is asserted.
//!
//! Run: `cargo run --release -p quire-engine --example journal_stamp_bench -- [batches] [rounds]`

// A benchmark's stopwatch is the real clock (quire_clock seam, clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;
use std::time::Instant;

use quire_engine::format::{encode_record, pad_to_block, stamp_batch, JournalSalt, Record};

const SALT: u64 = 0x1234_5678_9abc_def0;

/// The records of a batch of `total` bytes of 1 KiB adds.
fn adds(total: usize) -> Vec<Record> {
    (0..total.div_ceil(1024) as u64)
        .map(|entry| Record::Add {
            ledger: 1,
            entry,
            lac: None,
            recovery: false,
            master_key: [7; 20],
            data: vec![entry as u8; 1024],
        })
        .collect()
}

/// Builds the write buffer of one batch; returns its length.
fn build(
    records: &[Record],
    seq: u64,
    stamped: bool,
    logical: &mut Vec<u8>,
    buf: &mut Vec<u8>,
) -> usize {
    let salt = if stamped {
        JournalSalt::stamped(SALT)
    } else {
        JournalSalt::new(SALT)
    };
    let out = if stamped { &mut *logical } else { &mut *buf };
    out.clear();
    encode_record(
        out,
        seq,
        &Record::BatchHeader {
            record_count: records.len() as u32,
            batch_bytes: 0,
        },
        &salt,
    );
    for (i, r) in records.iter().enumerate() {
        encode_record(out, seq + 1 + i as u64, r, &salt);
    }
    if stamped {
        stamp_batch(logical, SALT, seq, buf);
    } else {
        pad_to_block(buf);
    }
    buf.len()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let batches: usize = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(2000);
    let rounds: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(5);
    println!("batches per round {batches}, rounds {rounds}");
    println!("| batch | v2 ns/batch | v3 ns/batch | v3/v2 time | v2 bytes | v3 bytes |");
    println!("|---|---|---|---|---|---|");
    for size in [1 << 10, 64 << 10, 512 << 10] {
        let records = adds(size);
        let (mut logical, mut buf) = (Vec::new(), Vec::new());
        let mut times = [Vec::new(), Vec::new()];
        let mut bytes = [0usize; 2];
        for _ in 0..rounds {
            for (m, stamped) in [false, true].into_iter().enumerate() {
                let started = Instant::now();
                for b in 0..batches {
                    bytes[m] = build(&records, b as u64 * 1000, stamped, &mut logical, &mut buf);
                    black_box(&buf);
                }
                times[m].push(started.elapsed().as_nanos() as f64 / batches as f64);
            }
        }
        let (v2, v3) = (median(&mut times[0]), median(&mut times[1]));
        println!(
            "| {} KiB | {v2:.0} | {v3:.0} | {:.2} | {} | {} |",
            size >> 10,
            v3 / v2,
            bytes[0],
            bytes[1]
        );
    }
}

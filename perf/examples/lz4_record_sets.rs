//! Same-run measurement of LZ4 record-set compression (issue 26 item 5;
//! `quire_client::compression`) on the loghub samples: each sample's lines are packed into
//! record sets of `--entry-bytes` (the proxy's default entry target, 256 KiB), then for each
//! entry the records section is compressed and decompressed. Printed per sample and in total:
//! the ratio (compressed entry bytes / plain entry bytes) and the CPU per record of packing a
//! plain entry, of compressing its records section, and of decompressing it (single thread,
//! best of `--reps` rounds, so the figures are the codec's cost, not scheduling noise).
//! Usage: `cargo run --release -p quire-perf --example lz4_record_sets -- --reps 5`

use std::hint::black_box;
use std::time::Duration;

use clap::Parser;
use quire_client::compression::{compress_records, decompress_records};
use quire_client::record_set::{self, RECORD_SET_HEADER_SIZE_BYTES};

#[derive(Parser)]
struct Args {
    /// Rounds; the best (fastest) of each measure is kept.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Bytes of records per entry (the proxy's `entry_size_bytes_target` default).
    #[arg(long, default_value_t = 256 * 1024)]
    entry_bytes: usize,
}

/// One sample's entries: each a list of (txid, line).
fn entries(lines: &[&[u8]], entry_bytes: usize) -> Vec<Vec<(u64, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut cur: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut size = 0;
    for (i, l) in lines.iter().enumerate() {
        let rec = record_set::encoded_record_size_bytes(l.len());
        if size + rec > entry_bytes && !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
            size = 0;
        }
        cur.push((1_765_000_000_000 + i as u64, l.to_vec()));
        size += rec;
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[derive(Default, Clone, Copy)]
struct Measure {
    records: u64,
    plain_bytes: u64,
    compressed_bytes: u64,
    pack: Duration,
    compress: Duration,
    decompress: Duration,
}

fn best(a: Duration, b: Duration) -> Duration {
    if a.is_zero() {
        b
    } else {
        a.min(b)
    }
}

fn measure(entries: &[Vec<(u64, Vec<u8>)>], reps: usize) -> Measure {
    let mut m = Measure::default();
    for _ in 0..reps {
        let t = quire_clock::now();
        let plain: Vec<Vec<u8>> = entries
            .iter()
            .map(|e| record_set::encode(0, 0, e.iter().map(|(t, p)| (*t, p.as_slice()))))
            .collect();
        m.pack = best(m.pack, quire_clock::elapsed(t));
        let t = quire_clock::now();
        let compressed: Vec<Vec<u8>> = plain
            .iter()
            .map(|p| compress_records(&p[RECORD_SET_HEADER_SIZE_BYTES..]))
            .collect();
        m.compress = best(m.compress, quire_clock::elapsed(t));
        let t = quire_clock::now();
        for (c, p) in compressed.iter().zip(&plain) {
            let back = decompress_records(c, record_set::ENTRY_SIZE_BYTES_MAX).expect("decodes");
            assert_eq!(back.len(), p.len() - RECORD_SET_HEADER_SIZE_BYTES);
            black_box(back);
        }
        m.decompress = best(m.decompress, quire_clock::elapsed(t));
        m.records = entries.iter().map(|e| e.len() as u64).sum();
        m.plain_bytes = plain.iter().map(|p| p.len() as u64).sum();
        // A compressed v3 entry keeps the header and adds the 4-byte uncompressed length
        // (inside `compressed`) and the v3 header's 9 more bytes than v1's 13.
        m.compressed_bytes = compressed
            .iter()
            .map(|c| (RECORD_SET_HEADER_SIZE_BYTES + 9 + c.len()) as u64)
            .sum();
    }
    m
}

fn row(name: &str, m: &Measure) {
    let per = |d: Duration| d.as_nanos() as f64 / m.records as f64;
    println!(
        "{name:<14} {:>7} {:>11} {:>11} {:>7.3} {:>9.1} {:>12.1} {:>14.1}",
        m.records,
        m.plain_bytes,
        m.compressed_bytes,
        m.compressed_bytes as f64 / m.plain_bytes as f64,
        per(m.pack),
        per(m.compress),
        per(m.decompress)
    );
}

fn main() {
    let args = Args::parse();
    println!(
        "{:<14} {:>7} {:>11} {:>11} {:>7} {:>9} {:>12} {:>14}",
        "sample",
        "records",
        "plain B",
        "lz4 B",
        "ratio",
        "pack ns/r",
        "compress ns/r",
        "decompress ns/r"
    );
    let mut total = Measure::default();
    for file in quire_testkit::loghub::files() {
        let bytes = std::fs::read(&file).expect("read sample");
        let lines: Vec<&[u8]> = bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        let m = measure(&entries(&lines, args.entry_bytes), args.reps);
        row(file.file_stem().unwrap().to_str().unwrap(), &m);
        total.records += m.records;
        total.plain_bytes += m.plain_bytes;
        total.compressed_bytes += m.compressed_bytes;
        total.pack += m.pack;
        total.compress += m.compress;
        total.decompress += m.decompress;
    }
    row("all", &total);
}

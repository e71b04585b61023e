//! Same-run measurement behind the design card's rkyv (issue 25 item 8; ARCHITECTURE.md, "The
//! design card's crates"): would an rkyv archive, read in place, make a reader's pass over a
//! ledger entry's records cheaper than the record-set codec (`quire_client::record_set`)?
//!
//! The readers' work per entry (a proxy serving a read, a tailing client) is: check the entry,
//! then visit each record's txid and payload. Both formats are built from the same records; each
//! way visits every record, summing txids and payload lengths and reading each payload's first
//! and last byte, so that no way can skip its work:
//! - `record-set decode`: `record_set::decode` (lengths checked, payloads borrowed, one `Vec` of
//!   references) from the entry bytes as they sit in a receive buffer, at any alignment;
//! - `rkyv access (validated)`: `rkyv::access` (bytecheck validation: what bytes from a socket or
//!   a disk require) on a 16-byte aligned copy of the archive, the copy counted, since an entry
//!   arrives at an arbitrary offset of a receive buffer;
//! - `rkyv access (validated, aligned)`: the same without the copy (a receive path that lands
//!   every entry aligned);
//! - `rkyv access_unchecked`: no validation (safe only for bytes this process wrote itself).
//!
//! Shapes (`--shape`): `1x1024` (one 1 KiB record per entry: a writer at low rate),
//! `64x1024`, `1000x100` (many small records). Sizes of both encodings are printed too.
//! Usage: `cargo run --release -p quire-perf --features rkyv-compare --example rkyv_records -- --reps 5`

use std::hint::black_box;
use std::time::Instant;

use clap::Parser;
use quire_client::record_set;
use rkyv::rancor::Error as RkyvError;
use rkyv::util::AlignedVec;

#[derive(Parser)]
struct Args {
    /// Rounds; each runs every way once per shape, interleaved.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Entries visited per way per round.
    #[arg(long, default_value_t = 20_000)]
    entries: usize,
}

/// One record as the archive holds it.
#[derive(rkyv::Archive, rkyv::Serialize)]
struct Record {
    txid: u64,
    payload: Vec<u8>,
}

/// One entry's records as the archive holds them (the record set's fields).
#[derive(rkyv::Archive, rkyv::Serialize)]
struct Entry {
    segment_record_index: u64,
    records: Vec<Record>,
}

/// What each way computes from an entry: folded so the optimiser keeps every read.
fn fold(acc: u64, txid: u64, payload: &[u8]) -> u64 {
    let ends = u64::from(payload.first().copied().unwrap_or(0))
        + u64::from(payload.last().copied().unwrap_or(0));
    acc.wrapping_add(txid)
        .wrapping_add(payload.len() as u64)
        .wrapping_add(ends)
}

fn visit_record_set(bytes: &[u8]) -> u64 {
    let set = record_set::decode(bytes).expect("a record set");
    set.records
        .iter()
        .fold(set.segment_record_index, |a, r| fold(a, r.txid, r.payload))
}

fn visit_archived(entry: &ArchivedEntry) -> u64 {
    entry
        .records
        .iter()
        .fold(entry.segment_record_index.to_native(), |a, r| {
            fold(a, r.txid.to_native(), r.payload.as_slice())
        })
}

/// The entry bytes of both formats for `count` records of `size` bytes.
fn build(count: usize, size: usize) -> (Vec<u8>, AlignedVec) {
    let records: Vec<(u64, Vec<u8>)> = (0..count)
        .map(|i| (1000 + i as u64, vec![(i % 251) as u8; size]))
        .collect();
    let set = record_set::encode(7, 0, records.iter().map(|(t, p)| (*t, p.as_slice())));
    let entry = Entry {
        segment_record_index: 7,
        records: records
            .into_iter()
            .map(|(txid, payload)| Record { txid, payload })
            .collect(),
    };
    let archive = rkyv::to_bytes::<RkyvError>(&entry).expect("serialize");
    (set, archive)
}

/// Nanoseconds per entry of `visit` over `entries` visits.
fn time(entries: usize, mut visit: impl FnMut() -> u64) -> f64 {
    let start = Instant::now();
    let mut acc = 0u64;
    for _ in 0..entries {
        acc = acc.wrapping_add(visit());
    }
    black_box(acc);
    start.elapsed().as_nanos() as f64 / entries as f64
}

const WAYS: [&str; 4] = [
    "record-set decode",
    "rkyv access (validated)",
    "rkyv access (validated, aligned)",
    "rkyv access_unchecked",
];

/// One round of every way on one shape: ns per entry, in [`WAYS`] order.
fn round(entries: usize, set: &[u8], archive: &AlignedVec) -> [f64; 4] {
    // The entry as it sits in a receive buffer: after a 13-byte frame header, unaligned.
    let mut recv = vec![0u8; 13];
    recv.extend_from_slice(archive);
    let unaligned = &recv[13..];
    let a = time(entries, || visit_record_set(black_box(set)));
    let b = time(entries, || {
        let mut copy = AlignedVec::<16>::with_capacity(unaligned.len());
        copy.extend_from_slice(black_box(unaligned));
        let entry = rkyv::access::<ArchivedEntry, RkyvError>(&copy).expect("valid");
        visit_archived(entry)
    });
    let c = time(entries, || {
        let entry = rkyv::access::<ArchivedEntry, RkyvError>(black_box(archive)).expect("valid");
        visit_archived(entry)
    });
    // SAFETY: `archive` was serialized by this process from an `Entry` just above.
    let d = time(entries, || {
        visit_archived(unsafe { rkyv::access_unchecked::<ArchivedEntry>(black_box(archive)) })
    });
    [a, b, c, d]
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args = Args::parse();
    for (count, size) in [(1usize, 1024usize), (64, 1024), (1000, 100)] {
        let (set, archive) = build(count, size);
        // Both ways must see the same records.
        let entry = rkyv::access::<ArchivedEntry, RkyvError>(&archive).expect("valid");
        assert_eq!(visit_record_set(&set), visit_archived(entry));
        let mut runs: Vec<Vec<f64>> = vec![Vec::new(); WAYS.len()];
        for _ in 0..args.reps {
            for (i, ns) in round(args.entries, &set, &archive).into_iter().enumerate() {
                runs[i].push(ns);
            }
        }
        println!(
            "shape {count}x{size}: record set {} bytes, rkyv archive {} bytes ({:+.1} bytes/record)",
            set.len(),
            archive.len(),
            (archive.len() as f64 - set.len() as f64) / count as f64
        );
        let base = median(&mut runs[0].clone());
        for (way, ns) in WAYS.iter().zip(runs.iter_mut()) {
            let m = median(ns);
            println!(
                "  {way:<34} median {m:>10.1} ns/entry  ({:.2}x record-set decode)",
                m / base
            );
        }
    }
}

//! Goal: no decoder of network or disk bytes panics or disagrees with its encoder on
//! malformed input (issue 12 item 7: the seeded run where libFuzzer cannot run, as in CI).
//! Method: for every target of `quire_fuzz::TARGETS`, its valid seeds and the checked-in
//! libFuzzer corpus (`tools/fuzz/corpus/<target>/`) are decoded as they are, then
//! `QUIRE_FUZZ_ITERATIONS` (default 20,000) mutated inputs per target: bit flips, boundary
//! values written over lengths and counts, truncation, growth, duplicated ranges and splices
//! of two inputs, most of them with their checksums recomputed so the structure behind the
//! CRC32C is reached. Each case has its own seed, derived from `QUIRE_FUZZ_SEED` (default
//! fixed, so CI repeats the same cases); a failing case prints the line that replays it
//! (`QUIRE_FUZZ_CASE=target:seed`) and writes its input to `target/fuzz-failures/`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use quire_fuzz::{Target, TARGETS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ITERATIONS_DEFAULT: u64 = 20_000;
const SEED_DEFAULT: u64 = 0x005e_ed0f_f022;
/// Inputs never grow past this (the formats' interesting parts are in their first blocks).
const INPUT_BYTES_MAX: usize = 64 * 1024;

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

/// The target's seeds and corpus files.
fn bases(t: &Target) -> Vec<Vec<u8>> {
    let mut out = (t.seeds)();
    if let Ok(dir) = std::fs::read_dir(corpus_dir(t.name)) {
        let mut files: Vec<PathBuf> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for f in files {
            out.push(std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display())));
        }
    }
    out
}

const INTERESTING_U32: [u32; 9] = [0, 1, 2, 0x7f, 0x80, 0xffff, 0x1_0000, 0x7fff_ffff, u32::MAX];

/// One mutated input built from `bases` by `rng`.
fn mutate(rng: &mut StdRng, bases: &[Vec<u8>], t: &Target) -> Vec<u8> {
    let mut b = bases[rng.gen_range(0..bases.len())].clone();
    for _ in 0..rng.gen_range(1..=4) {
        let len = b.len();
        match rng.gen_range(0..8) {
            0 if len > 0 => {
                let i = rng.gen_range(0..len);
                b[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.gen_range(0..len);
                b[i] = [0u8, 0xff, 0x7f, 0x80, 1][rng.gen_range(0..5)];
            }
            2 if len >= 4 => {
                // Lengths and counts are little-endian u32 or u64 at small offsets.
                let i = rng.gen_range(0..=len - 4);
                let v = INTERESTING_U32[rng.gen_range(0..INTERESTING_U32.len())];
                let v = if rng.gen_bool(0.3) {
                    v.wrapping_add(rng.gen_range(0..64))
                } else {
                    v
                };
                b[i..i + 4].copy_from_slice(&v.to_le_bytes());
            }
            3 if len > 0 => b.truncate(rng.gen_range(0..len)),
            4 => {
                let n = rng.gen_range(1..=64);
                b.extend((0..n).map(|_| rng.gen::<u8>()));
            }
            5 if len > 1 => {
                let from = rng.gen_range(0..len);
                let to = rng.gen_range(from..=len.min(from + 256));
                let chunk = b[from..to].to_vec();
                let at = rng.gen_range(0..=len);
                b.splice(at..at, chunk);
            }
            6 => {
                let other = &bases[rng.gen_range(0..bases.len())];
                if !other.is_empty() {
                    let cut = rng.gen_range(0..=b.len());
                    let from = rng.gen_range(0..other.len());
                    b.truncate(cut);
                    b.extend_from_slice(&other[from..]);
                }
            }
            _ => {
                let n = rng.gen_range(0..=len.min(512));
                b = (0..n).map(|_| rng.gen::<u8>()).collect();
            }
        }
        b.truncate(INPUT_BYTES_MAX);
    }
    if rng.gen_bool(0.8) {
        (t.reseal)(&mut b);
    }
    b
}

fn case_seed(seed: u64, target_index: usize, iteration: u64) -> u64 {
    // SplitMix64 of the three, so neighbouring cases are unrelated.
    let mut z = seed
        .wrapping_add((target_index as u64) << 48)
        .wrapping_add(iteration.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn run_case(t: &Target, input: &[u8], what: &str) {
    if catch_unwind(AssertUnwindSafe(|| (t.check)(input))).is_err() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-failures");
        let _ = std::fs::create_dir_all(&dir);
        let file = dir.join(format!(
            "{}-{}.bin",
            t.name,
            what.replace([':', ' ', '='], "_")
        ));
        let _ = std::fs::write(&file, input);
        panic!(
            "fuzz target {} failed on {what} ({} bytes, written to {})",
            t.name,
            input.len(),
            file.display()
        );
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    Some(match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).unwrap_or_else(|e| panic!("{name}={v}: {e}")),
        None => v.parse().unwrap_or_else(|e| panic!("{name}={v}: {e}")),
    })
}

#[test]
fn decoders_survive_seeded_mutations() {
    let seed = env_u64("QUIRE_FUZZ_SEED").unwrap_or(SEED_DEFAULT);
    let iterations = env_u64("QUIRE_FUZZ_ITERATIONS").unwrap_or(ITERATIONS_DEFAULT);
    let only: Option<(String, u64)> = std::env::var("QUIRE_FUZZ_CASE").ok().map(|c| {
        let (name, s) = c.split_once(':').expect("QUIRE_FUZZ_CASE=target:seed");
        (name.to_string(), s.parse().expect("case seed is a u64"))
    });
    eprintln!("QUIRE_FUZZ_SEED={seed:#x}, {iterations} cases per target");
    for (ti, t) in TARGETS.iter().enumerate() {
        let bases = bases(t);
        assert!(!bases.is_empty(), "{} has seeds", t.name);
        if let Some((name, case)) = &only {
            if name == t.name {
                let input = mutate(&mut StdRng::seed_from_u64(*case), &bases, t);
                run_case(t, &input, &format!("QUIRE_FUZZ_CASE={name}:{case}"));
            }
            continue;
        }
        for (i, b) in bases.iter().enumerate() {
            run_case(t, b, &format!("base input {i}"));
        }
        for it in 0..iterations {
            let case = case_seed(seed, ti, it);
            let input = mutate(&mut StdRng::seed_from_u64(case), &bases, t);
            run_case(t, &input, &format!("QUIRE_FUZZ_CASE={}:{case}", t.name));
        }
    }
}

#[test]
fn seeds_decode_as_valid() {
    // The seeds must be accepted by their decoders, or the mutations start from nothing.
    use quire_engine::format as f;
    for s in (quire_fuzz::target("journal_record").unwrap().seeds)() {
        let salt = f::JournalSalt::new(quire_fuzz::JOURNAL_SALT);
        assert!(matches!(
            f::decode_record(&s, &salt),
            f::RecordDecode::Ok { .. }
        ));
    }
    for s in (quire_fuzz::target("record_set").unwrap().seeds)() {
        assert!(quire_client::record_set::decode(&s).is_ok());
    }
    for s in (quire_fuzz::target("checkpoint_mark").unwrap().seeds)() {
        assert!(matches!(f::decode_mark(&s), f::MarkDecode::Ok(_)));
    }
    for s in (quire_fuzz::target("tombstone_group").unwrap().seeds)() {
        assert!(matches!(
            f::decode_tombstone_group(&s),
            f::TombstoneDecode::Ok { .. }
        ));
    }
    for s in (quire_fuzz::target("bookie_frame").unwrap().seeds)() {
        let (frame, _) = quire_wire::frame::decode_frame(&s, u32::MAX)
            .unwrap()
            .unwrap();
        let ok = quire_wire::bookie::decode_request(&frame).is_ok()
            || quire_wire::bookie::decode_response(&frame).is_ok();
        assert!(ok, "bookie seed {frame:?}");
    }
    for s in (quire_fuzz::target("index_segment_block").unwrap().seeds)() {
        assert!(f::check_block(&s, f::LOCATIONS_PER_BLOCK.max(f::KEYS_PER_BLOCK)).is_ok());
    }
}

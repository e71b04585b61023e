//! The scrubber (issue 28 item 5) on the simulated disk, over a few seeds: a pass finds every
//! bit planted in a stored entry (and no other entry), names its ledger, entry, log and
//! offset; reads of a damaged entry answer `Corrupt` until a recovery add replaces it, and the
//! next pass counts it repaired; a damaged index segment is found and rebuilt; a paced pass
//! keeps to its rate.
//!
//! `QUIRE_FAULT_SEEDS=N` runs seeds 0..N of each test (default 8); a failure names its seed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::sim_faults::{cfg, each_seed, Acked};
use crate::common::{payload, KEY};
use quire_engine::sim_disk::{SimImage, SimStorage};
use quire_engine::{Engine, Error};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A disk holding `n` entries of ledgers 1 and 2 (sizes drawn from the seed) in entry logs and
/// the index, closed cleanly, and what was acknowledged.
async fn checkpointed(seed: u64, n: u64) -> (SimImage, Acked) {
    let mut rng = StdRng::seed_from_u64(seed);
    let s = SimStorage::new(seed);
    let e = Engine::open_with(cfg(), s.clone()).await.expect("open");
    let mut acked = Acked::new();
    for entry in 0..n {
        for ledger in 1..=2u64 {
            let data = payload(ledger, entry, rng.gen_range(16..3000));
            e.add_entry(
                ledger,
                entry,
                KEY,
                entry.checked_sub(1),
                data.clone(),
                false,
            )
            .await
            .expect("add");
            acked.insert((ledger, entry), data);
        }
    }
    e.checkpoint().await.expect("checkpoint");
    e.close().await.expect("close");
    (s.durable_image(), acked)
}

/// Every (path, offset) of an entry-log record holding `data`, in `image`.
fn record_of(image: &SimImage, data: &[u8]) -> (std::path::PathBuf, u64) {
    let dir = Path::new("/sim/ledgers");
    for name in image.dirs[dir].keys().filter(|n| n.ends_with(".qel")) {
        let path = dir.join(name);
        let file = image.file(&path).expect("log");
        if let Some(at) = file.windows(data.len()).position(|w| w == data) {
            return (path, (at - 24) as u64);
        }
    }
    panic!("entry not in any entry log");
}

/// Reads every acknowledged entry: `Ok(true)` right, `Ok(false)` `Corrupt`, `Err` anything else.
async fn read_answers(
    e: &Engine<SimStorage>,
    acked: &Acked,
) -> Result<BTreeSet<(u64, u64)>, String> {
    let mut corrupt = BTreeSet::new();
    for (&(l, n), want) in acked {
        match e.read_entry(l, Some(n)).await {
            Ok(got) if &got == want => {}
            Ok(_) => return Err(format!("entry {l}/{n}: other bytes served")),
            Err(Error::Corrupt { .. }) => {
                corrupt.insert((l, n));
            }
            Err(err) => return Err(format!("entry {l}/{n}: {err}")),
        }
    }
    Ok(corrupt)
}

#[test]
fn a_scrub_pass_finds_every_planted_flip_and_a_recovery_add_repairs_it() {
    // Goal: every bit planted in a stored entry-log record (payload or header) is found by one
    // pass, with its ledger, entry, log and record offset, and nothing else is; the damaged
    // entries read `Corrupt` (never "no such entry", never other bytes, even when they were in
    // the read cache before the rot, so a repair's read-back sees the damage) until a recovery add
    // replaces them, after which they read right and the next pass counts them repaired.
    // Method: 150 entries on each of two ledgers (several hundred KiB, two entry logs), reopen,
    // read everything (into the read cache),
    // rot 1 to 5 seeded bits in distinct seeded entries, scrub, read, re-add, scrub.
    each_seed("scrub finds flips", |seed| async move {
        let (image, acked) = checkpointed(seed, 150).await;
        let s = SimStorage::from_image(&image, seed);
        let e = Engine::open_with(cfg(), s.clone())
            .await
            .map_err(|e| format!("open: {e}"))?;
        // Every entry in the read cache first: a cached copy must not hide the damage.
        if !read_answers(&e, &acked).await?.is_empty() {
            return Err("corrupt before any rot".into());
        }
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5c2b);
        let keys: Vec<(u64, u64)> = acked.keys().copied().collect();
        let mut planted = BTreeMap::new();
        for _ in 0..rng.gen_range(1..=5) {
            let key = keys[rng.gen_range(0..keys.len())];
            let (path, offset) = record_of(&image, &acked[&key]);
            // Anywhere in the record: CRC, length, ledger, entry or data.
            let within = rng.gen_range(0..24 + acked[&key].len() as u64);
            s.rot(&path, offset + within, rng.gen_range(0..8));
            planted.insert(key, (path, offset));
        }
        let pass = e.scrub(0).await.map_err(|e| format!("scrub: {e}"))?;
        let found: BTreeMap<(u64, u64), (std::path::PathBuf, u64)> = pass
            .damaged
            .iter()
            .map(|d| ((d.ledger, d.entry), (d.path.clone(), d.offset)))
            .collect();
        if found != planted {
            return Err(format!("planted {planted:?}, found {found:?}"));
        }
        if pass.entries_scanned != acked.len() as u64 {
            return Err(format!("{} entries scanned", pass.entries_scanned));
        }
        let corrupt = read_answers(&e, &acked).await?;
        if corrupt != planted.keys().copied().collect() {
            return Err(format!("corrupt reads {corrupt:?}"));
        }
        for key in planted.keys() {
            let data = acked[key].clone();
            e.add_entry(key.0, key.1, KEY, None, data, true)
                .await
                .map_err(|e| format!("recovery add {key:?}: {e}"))?;
        }
        e.checkpoint()
            .await
            .map_err(|e| format!("checkpoint: {e}"))?;
        let again = e.scrub(0).await.map_err(|e| format!("scrub: {e}"))?;
        let stats = e.scrub_stats();
        if !again.damaged.is_empty() || again.repaired != planted.len() as u64 {
            return Err(format!("second pass {again:?}"));
        }
        if stats.damaged_found != planted.len() as u64 || stats.damaged_now != 0 {
            return Err(format!("stats {stats:?}"));
        }
        if !read_answers(&e, &acked).await?.is_empty() {
            return Err("a repaired entry still reads corrupt".into());
        }
        Ok(format!("{} flips found and repaired", planted.len()))
    });
}

#[test]
fn a_scrub_pass_finds_a_rotten_index_block_and_the_rebuild_repairs_it() {
    // Goal: bit rot in an index segment's data block is found by a pass (the index blocks are
    // re-read past the cache), handed to the rebuild from the entry logs, and after it every
    // entry is scanned and reads right. Method: 300 entries per ledger, open, rot a seeded
    // block of the segment, scrub, rebuild, scrub.
    each_seed("scrub index", |seed| async move {
        let (image, acked) = checkpointed(seed, 300).await;
        let dir = Path::new("/sim/ledgers");
        let name = image.dirs[dir]
            .keys()
            .find(|n| n.ends_with(".qis"))
            .ok_or("no index segment")?;
        let path = dir.join(name);
        let blocks = image.file(&path).expect("segment").len() as u64 / 4096;
        let s = SimStorage::from_image(&image, seed);
        // The open reads every index block (it recounts the live bytes): rot after it, so
        // only the pass can find it.
        let e = Engine::open_with(cfg(), s.clone())
            .await
            .map_err(|e| format!("open: {e}"))?;
        let block = 1 + seed % (blocks - 1);
        s.rot(&path, block * 4096 + 8 + seed * 37 % 4000, (seed % 8) as u8);
        let pass = e.scrub(0).await.map_err(|e| format!("scrub: {e}"))?;
        if pass.index_segments_damaged != 1 || e.scrub_stats().index_segments_damaged != 1 {
            return Err(format!("rotten block {block} not found: {pass:?}"));
        }
        let rebuilt = e
            .rebuild_damaged_index()
            .await
            .map_err(|e| format!("rebuild: {e}"))?;
        let after = e.scrub(0).await.map_err(|e| format!("scrub: {e}"))?;
        if after.entries_scanned != acked.len() as u64 || !after.damaged.is_empty() {
            return Err(format!("after the rebuild: {after:?}"));
        }
        if !read_answers(&e, &acked).await?.is_empty() {
            return Err("an entry reads corrupt after the rebuild".into());
        }
        Ok(format!(
            "block {block} of {blocks}: found, {rebuilt} rebuilt"
        ))
    });
}

#[test]
fn a_paced_scrub_pass_keeps_to_its_rate() {
    // Goal: `rate_bytes_per_sec` bounds the pass's read rate (it sleeps between spans).
    // Method: an unpaced pass measures the bytes; a pass paced to twice them per second must
    // take about half a second (it waits after each span for the bytes read so far).
    each_seed("scrub pace", |seed| async move {
        if seed > 0 {
            return Ok("one seed is enough".into());
        }
        let (image, _) = checkpointed(seed, 150).await;
        let s = SimStorage::from_image(&image, seed);
        let e = Engine::open_with(cfg(), s.clone())
            .await
            .map_err(|e| format!("open: {e}"))?;
        let bytes = e.scrub(0).await.map_err(|e| format!("{e}"))?.bytes_scanned;
        let rate = bytes * 2;
        let t = Instant::now();
        let paced = e.scrub(rate).await.map_err(|e| format!("{e}"))?;
        let took = t.elapsed();
        if took < Duration::from_millis(450) || took > Duration::from_secs(5) {
            return Err(format!("{bytes} bytes at {rate}/s took {took:?}"));
        }
        Ok(format!(
            "{} bytes at {rate} B/s in {took:?}",
            paced.bytes_scanned
        ))
    });
}

#[test]
fn a_scrub_pass_in_small_pieces_checks_everything_and_holds_at_most_a_piece() {
    // Goal: a pass's memory is bounded by its piece size, not by the shard's entries, and
    // walking in pieces changes nothing of what a pass finds. Method: 300 entries per ledger
    // (600 locations), rot 1 to 3 seeded entries, then a pass in pieces of 64 locations and a
    // pass in one piece: both check all 600 entries and find the same damage; the pieced pass
    // never held more than 64 locations (counted by the pass) and walked at least 10 pieces.
    each_seed("scrub pieces", |seed| async move {
        const PIECE: usize = 64;
        let (image, acked) = checkpointed(seed, 300).await;
        let s = SimStorage::from_image(&image, seed);
        let e = Engine::open_with(cfg(), s.clone())
            .await
            .map_err(|e| format!("open: {e}"))?;
        let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37);
        let keys: Vec<(u64, u64)> = acked.keys().copied().collect();
        let mut planted = BTreeSet::new();
        for _ in 0..rng.gen_range(1..=3) {
            let key = keys[rng.gen_range(0..keys.len())];
            let (path, offset) = record_of(&image, &acked[&key]);
            s.rot(
                &path,
                offset + 24 + rng.gen_range(0..16),
                rng.gen_range(0..8),
            );
            planted.insert(key);
        }
        let pieced = e
            .scrub_in_pieces(0, PIECE)
            .await
            .map_err(|e| format!("pieced scrub: {e}"))?;
        let whole = e.scrub(0).await.map_err(|e| format!("scrub: {e}"))?;
        let found = |p: &quire_engine::ScrubPass| -> BTreeSet<(u64, u64)> {
            p.damaged.iter().map(|d| (d.ledger, d.entry)).collect()
        };
        let n = acked.len() as u64;
        if pieced.entries_scanned != n || whole.entries_scanned != n {
            return Err(format!(
                "scanned {} in pieces, {} whole, of {n}",
                pieced.entries_scanned, whole.entries_scanned
            ));
        }
        if found(&pieced) != planted || found(&whole) != planted {
            return Err(format!(
                "planted {planted:?}, pieced {pieced:?}, whole {whole:?}"
            ));
        }
        if pieced.locations_held_max > PIECE as u64 || pieced.pieces < n / PIECE as u64 {
            return Err(format!(
                "held {} locations at most in {} pieces",
                pieced.locations_held_max, pieced.pieces
            ));
        }
        if whole.locations_held_max != n {
            return Err(format!("whole pass held {}", whole.locations_held_max));
        }
        Ok(format!(
            "{} pieces, {} held at most, {} bytes pieced vs {} whole",
            pieced.pieces, pieced.locations_held_max, pieced.bytes_scanned, whole.bytes_scanned
        ))
    });
}

#[test]
fn a_paced_scrub_pass_never_reads_more_than_its_rate_allows() {
    // Goal: at a low rate, the bytes a pass reads never exceed rate × the pass's own measured
    // duration + one read (no wall-clock assertion: the pass's figures are compared with each
    // other). Method: an unpaced pass measures the bytes; passes paced to a quarter and to half
    // of them per second (in pieces of 100 locations) keep to the bound and read as much.
    each_seed("scrub pace bound", |seed| async move {
        if seed > 1 {
            return Ok("two seeds are enough".into());
        }
        let (image, _) = checkpointed(seed, 150).await;
        let s = SimStorage::from_image(&image, seed);
        let e = Engine::open_with(cfg(), s.clone())
            .await
            .map_err(|e| format!("open: {e}"))?;
        let bytes = e.scrub(0).await.map_err(|e| format!("{e}"))?.bytes_scanned;
        let mut seen = Vec::new();
        for rate in [bytes * 4, bytes * 2] {
            let p = e
                .scrub_in_pieces(rate, 100)
                .await
                .map_err(|e| format!("{e}"))?;
            let allowed = rate as f64 * p.duration.as_secs_f64() + (1u64 << 20) as f64;
            if p.bytes_scanned as f64 > allowed || p.bytes_scanned < bytes / 2 {
                return Err(format!(
                    "{} bytes at {rate} B/s in {:?} (allowed {allowed:.0})",
                    p.bytes_scanned, p.duration
                ));
            }
            seen.push(format!(
                "{} B at {rate} B/s in {:?}",
                p.bytes_scanned, p.duration
            ));
        }
        Ok(seen.join(", "))
    });
}

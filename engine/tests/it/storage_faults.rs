//! Storage faults on the simulated disk (issue 28 item 3), each alone and combined with a
//! crash, over a few seeds: a flipped bit in data read back, a stored bit rotting, EIO on a read
//! and on a write, an fdatasync that reports success and keeps nothing, a misdirected write, a
//! torn write with a hole in the middle of a page. Each test states the engine's answer: it
//! detects the damage (journal record CRCs, entry-log record CRC32C and identity, index block
//! CRCs), never answers "no such entry" for an entry it acknowledged and never serves other
//! bytes, never panics, and refuses (an error naming corruption or I/O) what it cannot trust.
//! The one answer no disk-local check can give (an fdatasync that lied, then a crash) is pinned
//! as such: the other replicas of the ledger hold the entry (BookKeeper's ack quorum).
//!
//! `QUIRE_FAULT_SEEDS=N` runs seeds 0..N of each test (default 8); a failure names its seed.

use std::path::Path;

use crate::common::sim_faults::{cfg, each_seed, Acked};
use crate::common::{payload, KEY};
use quire_engine::format as f;
use quire_engine::sim_disk::{Fault, PathFilter, SimImage, SimStorage, TEAR_HOLE};
use quire_engine::{Engine, Error};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Files whose name ends with `ext` (`.qj` journal, `.qel` entry log, `.qis` index segment).
fn ext(ext: &'static str) -> PathFilter {
    Box::new(move |p: &Path| p.to_string_lossy().ends_with(ext))
}

async fn open(
    image: &SimImage,
    seed: u64,
) -> Result<(SimStorage, std::rc::Rc<Engine<SimStorage>>), Error> {
    let s = SimStorage::from_image(image, seed);
    let e = Engine::open_with(cfg(), s.clone()).await?;
    Ok((s, e))
}

/// Adds entries `from..to` to ledgers 1 and 2 (sizes drawn from `rng`), one at a time;
/// returns the acknowledged ones and the first error (adds stop there).
async fn add_range(
    engine: &Engine<SimStorage>,
    rng: &mut StdRng,
    range: std::ops::Range<u64>,
    acked: &mut Acked,
) -> Option<Error> {
    for entry in range {
        for ledger in 1..=2u64 {
            let data = payload(ledger, entry, rng.gen_range(16..1500));
            let lac = entry.checked_sub(1);
            match engine
                .add_entry(ledger, entry, KEY, lac, data.clone(), false)
                .await
            {
                Ok(()) => {
                    acked.insert((ledger, entry), data);
                }
                Err(e) => return Some(e),
            }
        }
    }
    None
}

/// How one read of an acknowledged entry was answered.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Right,
    Corrupt,
    Io,
    /// `IndexRebuilding`: a damaged index segment is being rebuilt; not a negative answer.
    Rebuilding,
}

/// Reads every acknowledged entry; an answer other than its bytes, `Corrupt` or `Io` (other
/// bytes, "no such entry", anything else) is an error naming the entry.
async fn read_all(
    engine: &Engine<SimStorage>,
    acked: &Acked,
) -> Result<Vec<((u64, u64), Answer)>, String> {
    let mut out = Vec::new();
    for (&(ledger, entry), want) in acked {
        let a = match engine.read_entry(ledger, Some(entry)).await {
            Ok(got) if &got == want => Answer::Right,
            Ok(got) => {
                return Err(format!(
                    "entry {ledger}/{entry}: {} other bytes served",
                    got.len()
                ))
            }
            Err(Error::Corrupt { .. }) => Answer::Corrupt,
            Err(Error::Io { .. }) => Answer::Io,
            Err(Error::IndexRebuilding { .. }) => Answer::Rebuilding,
            Err(e) => return Err(format!("acknowledged entry {ledger}/{entry}: {e}")),
        };
        out.push(((ledger, entry), a));
    }
    Ok(out)
}

fn count(answers: &[((u64, u64), Answer)], a: Answer) -> usize {
    answers.iter().filter(|x| x.1 == a).count()
}

/// A disk holding `n` entries of ledgers 1 and 2 in entry logs and the index (checkpointed,
/// closed cleanly), and what was acknowledged.
async fn checkpointed(seed: u64, n: u64) -> (SimImage, Acked) {
    let mut rng = StdRng::seed_from_u64(seed);
    let s = SimStorage::new(seed);
    let e = Engine::open_with(cfg(), s.clone()).await.expect("open");
    let mut acked = Acked::new();
    assert!(add_range(&e, &mut rng, 0..n, &mut acked).await.is_none());
    e.checkpoint().await.expect("checkpoint");
    e.close().await.expect("close");
    (s.durable_image(), acked)
}

#[test]
fn a_bit_flipped_in_an_entry_log_read_is_corruption_and_the_next_read_is_right() {
    // Goal: a bit flipped on the way back from the medium (the entry-log read of a cold entry)
    // is caught by the entry record's CRC32C: `Corrupt`, never other bytes or "no such entry";
    // the medium is fine, so reading again returns the entry. Method: 30 entries on each of two
    // ledgers checkpointed to an entry log, reopen (cold caches), flip a bit in the k-th
    // entry-log read (k and the bit drawn from the seed), read everything twice.
    each_seed("read bit flip", |seed| async move {
        let (image, acked) = checkpointed(seed, 30).await;
        // Odd seeds without read-ahead: each read is one entry's record, so the flip is in it.
        let mut c = cfg();
        if seed % 2 == 1 {
            c.read_ahead_entries = 0;
        }
        let s = SimStorage::from_image(&image, seed);
        let e = Engine::open_with(c, s.clone())
            .await
            .map_err(|e| format!("open: {e}"))?;
        s.inject(Fault::ReadBitFlip, 1 + seed / 2 % 4, ext(".qel"));
        let first = read_all(&e, &acked).await?;
        let again = read_all(&e, &acked).await?;
        if count(&again, Answer::Right) != acked.len() || count(&first, Answer::Io) > 0 {
            return Err(format!("second pass {again:?}"));
        }
        if seed % 2 == 1 && count(&first, Answer::Corrupt) != 1 {
            return Err(format!(
                "one flipped entry read, {} corrupt answers",
                count(&first, Answer::Corrupt)
            ));
        }
        Ok(format!(
            "{} corrupt answers, {:?}",
            count(&first, Answer::Corrupt),
            s.fault_log()
        ))
    });
}

/// The offset of `needle` in the file at `path` of `image`.
fn find_in(image: &SimImage, path: &Path, needle: &[u8]) -> Option<usize> {
    image
        .file(path)?
        .windows(needle.len())
        .position(|w| w == needle)
}

/// The entry-log file of `image` (the tests here write one).
fn entry_log_of(image: &SimImage) -> std::path::PathBuf {
    let dir = Path::new("/sim/ledgers");
    let name = image.dirs[dir]
        .keys()
        .find(|n| n.ends_with(".qel"))
        .expect("an entry log");
    dir.join(name)
}

#[test]
fn a_rotten_byte_of_an_entry_is_corruption_on_every_read_and_after_a_restart() {
    // Goal: bit rot inside a stored entry (its entry-log record) makes that entry `Corrupt` on
    // every read, before and after a crash and reopen, never "no such entry" (the bookie then
    // answers with an error and the ledger client reads another replica); the other entries
    // read right. Method: flip one bit of the payload of a seeded entry in the entry log.
    each_seed("bit rot", |seed| async move {
        let (image, acked) = checkpointed(seed, 20).await;
        let (s, e) = open(&image, seed).await.map_err(|e| format!("open: {e}"))?;
        let key = (1 + seed % 2, seed % 20);
        let log = entry_log_of(&image);
        let at = find_in(&image, &log, &acked[&key]).ok_or("entry not in the log")?;
        s.rot(&log, (at + acked[&key].len() / 2) as u64, (seed % 8) as u8);
        for round in 0..2 {
            let e = if round == 0 {
                e.clone()
            } else {
                open(&s.crash(None).image, seed)
                    .await
                    .map_err(|e| format!("reopen: {e}"))?
                    .1
            };
            let answers = read_all(&e, &acked).await?;
            for (k, a) in &answers {
                let want = if *k == key {
                    Answer::Corrupt
                } else {
                    Answer::Right
                };
                if *a != want {
                    return Err(format!(
                        "round {round}: entry {k:?} answered {a:?}, not {want:?}"
                    ));
                }
            }
            if round == 1 {
                break;
            }
        }
        Ok(format!("entry {key:?} corrupt"))
    });
}

#[test]
fn a_rotten_index_block_is_corruption_or_a_rebuild_never_absence() {
    // Goal: bit rot in an index segment's data block (the locations of entries) is caught by
    // the block's CRC32C: the entries it locates read as `Corrupt` or, once the engine rebuilt
    // the segment from the entry logs (index.md "Damaged segments"), right; never "no such
    // entry". Method: 300 entries per ledger (several data blocks), flip a seeded bit in a
    // seeded block of the segment after its header, reopen, read everything, rebuild, read.
    each_seed("index rot", |seed| async move {
        let (image, acked) = checkpointed(seed, 300).await;
        let dir = Path::new("/sim/ledgers");
        let name = image.dirs[dir]
            .keys()
            .find(|n| n.ends_with(".qis"))
            .ok_or("no index segment")?;
        let path = dir.join(name);
        let len = image.file(&path).expect("segment").len() as u64;
        let s = SimStorage::from_image(&image, seed);
        let blocks = len / 4096;
        let block = 1 + seed % (blocks - 1);
        s.rot(&path, block * 4096 + 8 + seed * 37 % 4000, (seed % 8) as u8);
        let e = match Engine::open_with(cfg(), s.clone()).await {
            Ok(e) => e,
            Err(err @ Error::Corrupt { .. }) => return Ok(format!("open refused: {err}")),
            Err(err) => return Err(format!("open: {err}")),
        };
        let answers = read_all(&e, &acked).await?;
        let corrupt = count(&answers, Answer::Corrupt) + count(&answers, Answer::Rebuilding);
        let rebuilt = e
            .rebuild_damaged_index()
            .await
            .map_err(|e| format!("rebuild: {e}"))?;
        let after = read_all(&e, &acked).await?;
        if count(&after, Answer::Right) != acked.len() {
            return Err(format!("after the rebuild: {after:?}"));
        }
        Ok(format!(
            "block {block} of {blocks}: {corrupt} corrupt answers, {rebuilt} rebuilt"
        ))
    });
}

#[test]
fn eio_on_a_read_is_an_io_error_never_absence() {
    // Goal: a read failing with EIO (entry log, index segment, or the journal at open) is an
    // `Io` error naming the file, never "no such entry" or an empty ledger; the medium is fine,
    // so the next read (or open) finds everything. Method: the seed picks the file kind and the
    // k-th read; entries checkpointed, plus later ones only in the journal.
    each_seed("read EIO", |seed| async move {
        let (image, mut acked) = checkpointed(seed, 30).await;
        let mut rng = StdRng::seed_from_u64(seed);
        let (s, e) = open(&image, seed).await.map_err(|e| format!("open: {e}"))?;
        assert!(add_range(&e, &mut rng, 30..40, &mut acked).await.is_none());
        let image = s.crash(None).image;
        let kind = [".qel", ".qis", ".qj"][(seed % 3) as usize];
        let s = SimStorage::from_image(&image, seed);
        s.inject(Fault::ReadEio, 1 + seed / 3 % 3, ext(kind));
        let (first, opened) = match Engine::open_with(cfg(), s.clone()).await {
            Ok(e) => (read_all(&e, &acked).await?, "opened"),
            Err(Error::Io { .. }) => (vec![], "open failed with Io"),
            Err(err) => return Err(format!("open with {kind} EIO: {err}")),
        };
        let (_, e) = open(&image, seed)
            .await
            .map_err(|e| format!("reopen: {e}"))?;
        let after = read_all(&e, &acked).await?;
        if count(&after, Answer::Right) != acked.len() {
            return Err(format!("after: {after:?}"));
        }
        Ok(format!(
            "{kind}: {opened}, {} Io answers, {} corrupt, {:?}",
            count(&first, Answer::Io),
            count(&first, Answer::Corrupt),
            s.fault_log()
        ))
    });
}

/// Whether `e` is the simulated crash (every I/O after it fails so).
fn crashed(e: &Error) -> bool {
    e.to_string().contains("simulated crash")
}

/// Reads every acknowledged entry after a reopen: each must read right; `maybe` (in flight at
/// a fault or crash) may be absent or whole.
async fn all_there(
    engine: &Engine<SimStorage>,
    acked: &Acked,
    maybe: &Acked,
) -> Result<(), String> {
    let answers = read_all(engine, acked).await?;
    if let Some(bad) = answers.iter().find(|a| a.1 != Answer::Right) {
        return Err(format!(
            "acknowledged entry {:?} answered {:?}",
            bad.0, bad.1
        ));
    }
    for (&(l, en), want) in maybe {
        match engine.read_entry(l, Some(en)).await {
            Ok(got) if &got == want => {}
            Err(Error::NoSuchEntry { .. } | Error::NoSuchLedger { .. }) => {}
            other => return Err(format!("in-flight entry {l}/{en}: {other:?}")),
        }
    }
    Ok(())
}

#[test]
fn eio_on_a_write_fails_the_add_or_the_checkpoint_and_loses_nothing_acknowledged() {
    // Goal: a journal write failing with EIO fails the adds of its batch with `Io` (and, as
    // add_entry documents, every later add until the engine is reopened); an entry-log or
    // index write failing with EIO fails the checkpoint with `Io`, reads go on from memory;
    // after a crash and reopen every acknowledged entry reads right. Method: 30 entries
    // checkpointed, then the seed picks the journal (k-th write during 20 more adds) or the
    // entry log / index (k-th write of a checkpoint after 20 more adds).
    each_seed("write EIO", |seed| async move {
        let (image, mut acked) = checkpointed(seed, 30).await;
        let mut rng = StdRng::seed_from_u64(seed);
        let (s, e) = open(&image, seed).await.map_err(|e| format!("open: {e}"))?;
        let kind = [".qj", ".qel", ".qis"][(seed % 3) as usize];
        s.inject(Fault::WriteEio, 1 + seed / 3 % 2, ext(kind));
        let err = add_range(&e, &mut rng, 30..50, &mut acked).await;
        let mut maybe = Acked::new();
        let note = match (kind, err) {
            (".qj", Some(Error::Io { .. })) => {
                let mut rest = Acked::new();
                let later = add_range(&e, &mut rng, 60..61, &mut rest).await;
                if !matches!(later, Some(Error::Io { .. })) {
                    return Err(format!("an add after the failed journal write: {later:?}"));
                }
                "the add failed with Io, later adds too".to_string()
            }
            (".qj", other) => return Err(format!("journal write EIO: add answered {other:?}")),
            (_, None) => match e.checkpoint().await {
                Err(Error::Io { .. }) => {
                    if count(&read_all(&e, &acked).await?, Answer::Right) != acked.len() {
                        return Err("reads after the failed checkpoint".into());
                    }
                    "the checkpoint failed with Io, reads went on".to_string()
                }
                other => return Err(format!("{kind} write EIO: checkpoint answered {other:?}")),
            },
            (_, Some(err)) => return Err(format!("add failed: {err}")),
        };
        // What the failed add was writing may or may not be durable.
        let mut rng2 = StdRng::seed_from_u64(seed);
        let mut all = Acked::new();
        add_range_model(&mut rng2, 30..50, &mut all);
        for (k, v) in all {
            if !acked.contains_key(&k) {
                maybe.insert(k, v);
            }
        }
        if s.fault_log().is_empty() {
            return Err("the fault did not fire".into());
        }
        let (_, e) = open(&s.crash(None).image, seed)
            .await
            .map_err(|e| format!("reopen: {e}"))?;
        all_there(&e, &acked, &maybe).await?;
        Ok(format!("{kind}: {note}; {:?}", s.fault_log()))
    });
}

/// The entries [`add_range`] would add over `range` with `rng` (to know the unacknowledged
/// ones' bytes).
fn add_range_model(rng: &mut StdRng, range: std::ops::Range<u64>, out: &mut Acked) {
    for entry in range {
        for ledger in 1..=2u64 {
            out.insert(
                (ledger, entry),
                payload(ledger, entry, rng.gen_range(16..1500)),
            );
        }
    }
}

#[test]
fn a_lost_journal_sync_then_a_crash_loses_the_entry_and_a_later_sync_covers_it() {
    // Goal: the engine's answer to an fdatasync of the journal that reported success and kept
    // nothing. Followed by an honest fdatasync of the same file before a crash, nothing is
    // lost (fdatasync makes every completed write durable). Followed by a crash at once, the
    // entry the lying sync acknowledged is gone and the engine answers "no such entry": no
    // disk-local check can tell a write that never reached the medium from one never made
    // (BookKeeper's answer is the ledger's other replicas: the entry was acknowledged only
    // once Qa bookies had it). This test pins that answer; every entry synced honestly stays.
    each_seed("lost sync", |seed| async move {
        let mut rng = StdRng::seed_from_u64(seed);
        let s = SimStorage::new(seed);
        let e = Engine::open_with(cfg(), s.clone())
            .await
            .map_err(|e| format!("open: {e}"))?;
        let mut acked = Acked::new();
        assert!(add_range(&e, &mut rng, 0..10, &mut acked).await.is_none());
        s.inject(Fault::LostSync, 1, ext(".qj"));
        let mut lied = Acked::new();
        let data = payload(1, 10, rng.gen_range(16..1500));
        e.add_entry(1, 10, KEY, Some(9), data.clone(), false)
            .await
            .map_err(|e| format!("add: {e}"))?;
        lied.insert((1, 10), data);
        let honest_after = seed % 2 == 0;
        if honest_after {
            let data = payload(2, 10, 100);
            e.add_entry(2, 10, KEY, Some(9), data.clone(), false)
                .await
                .map_err(|e| format!("add: {e}"))?;
            acked.insert((2, 10), data);
            acked.extend(lied.clone());
        }
        let (_, e) = open(&s.crash(None).image, seed)
            .await
            .map_err(|e| format!("reopen: {e}"))?;
        all_there(&e, &acked, &Acked::new()).await?;
        if !honest_after {
            // Entry 10 of ledger 1 was acknowledged on the lying sync (the batch's only add).
            match e.read_entry(1, Some(10)).await {
                Err(Error::NoSuchEntry { .. }) => {}
                other => return Err(format!("the entry of the lost sync: {other:?}")),
            }
        }
        Ok(format!(
            "honest sync after: {honest_after}; {:?}",
            s.fault_log()
        ))
    });
}

#[test]
fn a_lost_entry_log_sync_under_a_checkpoint_is_corruption_after_a_crash_never_absence() {
    // Goal: the checkpoint's fdatasync of the entry log reports success and keeps nothing,
    // the checkpoint goes on (index, mark), and the disk crashes: the entries whose records
    // were lost must read as `Corrupt` (the index points at bytes that are not their record),
    // or the open must refuse, never "no such entry" nor other bytes. Method: 20 entries
    // checkpointed; 20 more, a checkpoint with its k-th entry-log fdatasync lost, a crash.
    each_seed("lost entry-log sync", |seed| async move {
        let (image, mut acked) = checkpointed(seed, 20).await;
        let mut rng = StdRng::seed_from_u64(seed);
        let (s, e) = open(&image, seed).await.map_err(|e| format!("open: {e}"))?;
        assert!(add_range(&e, &mut rng, 20..40, &mut acked).await.is_none());
        s.inject(Fault::LostSync, 1 + seed % 2, ext(".qel"));
        e.checkpoint()
            .await
            .map_err(|e| format!("checkpoint: {e}"))?;
        let fired = s.fault_log();
        let e = match open(&s.crash(None).image, seed).await {
            Ok((_, e)) => e,
            Err(err @ Error::Corrupt { .. }) => {
                return Ok(format!("open refused: {err}; {fired:?}"))
            }
            Err(err) => return Err(format!("reopen: {err}")),
        };
        let answers = read_all(&e, &acked).await?;
        Ok(format!(
            "{} corrupt, {} right; {fired:?}",
            count(&answers, Answer::Corrupt),
            count(&answers, Answer::Right)
        ))
    });
}

#[test]
fn a_misdirected_write_is_caught_by_checks_never_served_nor_absent() {
    // Goal: a write that lands one or two blocks away from its place (reported as a success),
    // in the journal or in the entry log under a checkpoint, is caught: the journal's replay
    // finds a batch where none can be (or a hole before durable batches) and refuses to open
    // with `Corrupt`; entry-log records read where the index expects them fail their CRC or
    // identity check (`Corrupt`). Never other bytes, never "no such entry" for an acknowledged
    // entry. Method: 20 entries checkpointed; the seed picks the file, the k-th write and the
    // shift; 20 more adds and a checkpoint; read everything; crash, reopen, read everything.
    each_seed("misdirected write", |seed| async move {
        let (image, mut acked) = checkpointed(seed, 20).await;
        let mut rng = StdRng::seed_from_u64(seed);
        let (s, e) = open(&image, seed).await.map_err(|e| format!("open: {e}"))?;
        let kind = [".qj", ".qel"][(seed % 2) as usize];
        let blocks = [1, -1, 2, -2][(seed / 2 % 4) as usize];
        // The entry log's first write is its header; its records come after.
        let nth = 1 + seed / 8 % 3 + u64::from(kind == ".qel");
        s.inject(Fault::Misdirect { blocks }, nth, ext(kind));
        if let Some(err) = add_range(&e, &mut rng, 20..40, &mut acked).await {
            return Err(format!("add: {err}"));
        }
        // The journal's batches matter until a checkpoint: crash before one.
        if kind == ".qel" {
            e.checkpoint()
                .await
                .map_err(|e| format!("checkpoint: {e}"))?;
        }
        let live = read_all(&e, &acked).await?;
        let fired = s.fault_log();
        let after = match open(&s.crash(None).image, seed).await {
            Ok((_, e)) => {
                let a = read_all(&e, &acked).await?;
                format!("{} corrupt after reopen", count(&a, Answer::Corrupt))
            }
            Err(err @ Error::Corrupt { .. }) => format!("reopen refused: {err}"),
            Err(err) => return Err(format!("reopen: {err}")),
        };
        Ok(format!(
            "{kind} {blocks:+}: {} corrupt live; {after}; {fired:?}",
            count(&live, Answer::Corrupt)
        ))
    });
}

#[test]
fn a_torn_write_with_a_hole_mid_page_loses_nothing_acknowledged() {
    // Goal: a crash during a write that lets the write's first and last sectors reach the
    // medium and loses sectors in the middle (TEAR_HOLE): the torn journal batch was never
    // acknowledged and is dropped by its CRC (the zeros in the middle fail it), a torn
    // checkpoint write (entry log, index, mark) was never relied on; every acknowledged entry
    // reads right after the reopen, the torn one is absent or whole. Method: 20 entries
    // checkpointed, then adds and a checkpoint with a crash armed on the k-th write to the
    // seed's file kind, torn with a hole.
    each_seed("hole tear", |seed| async move {
        let (image, mut acked) = checkpointed(seed, 20).await;
        let mut rng = StdRng::seed_from_u64(seed);
        let (s, e) = open(&image, seed).await.map_err(|e| format!("open: {e}"))?;
        s.tear_holes(true);
        // The mark is written as checkpoint.qcp.tmp, then renamed.
        let kind = [".qj", ".qel", ".qis", ".qcp.tmp"][(seed % 4) as usize];
        let filter: quire_engine::sim_disk::OpFilter = Box::new(move |k, p: &Path| {
            k == quire_engine::sim_disk::OpKind::Write && p.to_string_lossy().ends_with(kind)
        });
        let tear = TEAR_HOLE | (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 2);
        let nth = if kind == ".qcp.tmp" {
            1
        } else {
            1 + seed / 4 % 2
        };
        s.crash_at_matching_op(nth, filter, Some(tear));
        let err = add_range(&e, &mut rng, 20..40, &mut acked).await;
        if err.is_none() {
            let _ = e.checkpoint().await;
        }
        if let Some(err) = err.filter(|e| !crashed(e)) {
            return Err(format!("add: {err}"));
        }
        let report = s.crash(None);
        let mut maybe = Acked::new();
        let mut all = Acked::new();
        add_range_model(&mut StdRng::seed_from_u64(seed), 20..40, &mut all);
        maybe.extend(all.into_iter().filter(|(k, _)| !acked.contains_key(k)));
        let (_, e) = open(&report.image, seed)
            .await
            .map_err(|e| format!("reopen: {e}\n{report}"))?;
        all_there(&e, &acked, &maybe)
            .await
            .map_err(|e| format!("{e}\n{report}"))?;
        if report.torn.is_none() {
            return Err(format!("the crash did not tear a {kind} write\n{report}"));
        }
        Ok(format!("{kind}: torn {:?}", report.torn))
    });
}

/// Where `data` is in the version 3 journal file `path` of `image`: the on-disk offset of its
/// byte `skip`. Searched in the file's logical bytes (journal.md §Sectors: every 4 KiB block
/// after the header holds 4032 logical bytes, 504 per sector before its stamp), since stamps
/// split an entry's bytes on disk.
fn in_journal_file(image: &SimImage, path: &Path, data: &[u8], skip: usize) -> Option<usize> {
    let file = image.file(path)?;
    let mut logical = Vec::new();
    f::unstamp_sectors(file.get(f::FILE_HEADER_BYTES..)?, &mut logical);
    let at = logical.windows(data.len()).position(|w| w == data)?;
    Some(f::FILE_HEADER_BYTES + f::stamped_offset(at + skip))
}

/// The journal file of `image` holding `data`, and the on-disk offset of its byte `skip`.
fn in_journal(image: &SimImage, data: &[u8], skip: usize) -> Option<(std::path::PathBuf, usize)> {
    let dir = Path::new("/sim/journal");
    image.dirs[dir].keys().find_map(|n| {
        let p = dir.join(n);
        in_journal_file(image, &p, data, skip).map(|at| (p, at))
    })
}

/// A disk whose journal holds 10 entries of ledgers 1 and 2 (each add synced) after a crash,
/// with no checkpoint: every entry is only in the journal. Returns the image, the acknowledged
/// entries and the journal file holding the last one.
async fn journal_only(seed: u64) -> (SimImage, Acked, std::path::PathBuf) {
    let mut rng = StdRng::seed_from_u64(seed);
    let s = SimStorage::new(seed);
    let e = Engine::open_with(cfg(), s.clone()).await.expect("open");
    let mut acked = Acked::new();
    assert!(add_range(&e, &mut rng, 0..10, &mut acked).await.is_none());
    let image = s.crash(None).image;
    let (holder, _) =
        in_journal(&image, &acked[&(2, 9)], 0).expect("the journal file holding the last entry");
    (image, acked, holder)
}

#[test]
fn bit_rot_in_an_earlier_journal_batch_refuses_the_open() {
    // Goal: a bit rotting inside an acknowledged journal record that later durable batches
    // follow is corruption (journal.md §Recovery rule 4): the open fails with `Corrupt` naming
    // the file, rather than replaying up to it and answering "no such entry" for the rest.
    // Method: 10 entries per ledger, each add its own synced batch; flip a bit in the payload of
    // a seeded entry before the last; reopen.
    each_seed("journal rot", |seed| async move {
        let (image, acked, _) = journal_only(seed).await;
        let key = (1 + seed % 2, seed % 9);
        let (journal, at) =
            in_journal(&image, &acked[&key], 7).ok_or("entry not in the journal")?;
        let s = SimStorage::from_image(&image, seed);
        s.rot(&journal, at as u64, (seed % 8) as u8);
        match Engine::open_with(cfg(), s).await {
            Err(err @ Error::Corrupt { .. }) => Ok(format!("entry {key:?}: {err}")),
            Ok(_) => Err(format!("entry {key:?} rotten: the open succeeded")),
            Err(err) => Err(format!("entry {key:?} rotten: {err}")),
        }
    });
}

#[test]
fn bit_rot_in_the_last_journal_batch_is_not_taken_for_a_torn_tail() {
    // Goal: an entry acknowledged after its batch was synced is never answered "no such
    // entry"; bit rot in the last batch reads as `Corrupt` (or refuses the open), as it does in
    // earlier batches, because every sector of that batch carries its stamp (journal.md
    // §Recovery rule 4, version 3). Method: 10 entries per ledger, each add its own synced
    // batch; flip a bit in the payload of the last one (ledger 2, entry 9); reopen and read it.
    each_seed("last batch rot", |seed| async move {
        let (image, acked, journal) = journal_only(seed).await;
        let at = in_journal_file(&image, &journal, &acked[&(2, 9)], 7 + seed as usize)
            .ok_or("entry not in the journal")?;
        let s = SimStorage::from_image(&image, seed);
        s.rot(&journal, at as u64, (seed % 8) as u8);
        let e = match Engine::open_with(cfg(), s).await {
            Err(err @ Error::Corrupt { .. }) => return Ok(format!("open refused: {err}")),
            Err(err) => return Err(format!("open: {err}")),
            Ok(e) => e,
        };
        match e.read_entry(2, Some(9)).await {
            Err(Error::Corrupt { .. }) => Ok("corrupt".into()),
            other => Err(format!(
                "the acknowledged entry 2/9 with a rotten bit reads as {other:?}"
            )),
        }
    });
}

#[test]
fn a_torn_last_journal_write_is_dropped_and_the_open_succeeds() {
    // Goal: the per-sector stamps never take a torn write for rot (journal.md §Recovery rule
    // 4, version 3): a crash that keeps only some sectors of the last journal write (a prefix,
    // a suffix, or both ends around a hole mid-page) leaves a batch whose stamps are not all
    // there, so it is dropped as the one write in flight and the open succeeds, with every
    // acknowledged entry right and the torn one absent or whole. Method: 6 adds of 600..9000
    // bytes (batches of 1..3 blocks, each its own synced batch), then a crash during the next
    // journal write, torn by the seed's mode and sector counts (with 3 seeds per mode).
    each_seed("torn last journal write", |seed| async move {
        let mut rng = StdRng::seed_from_u64(seed);
        let s = SimStorage::new(seed);
        s.tear_holes(true);
        let e = Engine::open_with(cfg(), s.clone())
            .await
            .map_err(|e| format!("open: {e}"))?;
        let mut acked = Acked::new();
        let mut maybe = Acked::new();
        let r = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 2;
        let tear = match seed % 3 {
            0 => r,
            1 => 1 << 63 | r,
            _ => TEAR_HOLE | r,
        };
        for entry in 0..4u64 {
            let data = payload(1, entry, rng.gen_range(600..9000));
            if entry == 3 {
                let filter: quire_engine::sim_disk::OpFilter = Box::new(|k, p: &Path| {
                    k == quire_engine::sim_disk::OpKind::Write
                        && p.to_string_lossy().ends_with(".qj")
                });
                s.crash_at_matching_op(1, filter, Some(tear));
            }
            let lac = entry.checked_sub(1);
            match e.add_entry(1, entry, KEY, lac, data.clone(), false).await {
                Ok(()) => {
                    acked.insert((1, entry), data);
                }
                Err(err) if entry == 3 && crashed(&err) => {
                    maybe.insert((1, entry), data);
                }
                Err(err) => return Err(format!("add 1/{entry}: {err}")),
            }
        }
        let report = s.crash(None);
        if report.torn.is_none() {
            return Err(format!(
                "the crash did not tear the journal write\n{report}"
            ));
        }
        let (_, e) = open(&report.image, seed)
            .await
            .map_err(|e| format!("reopen after a torn write: {e}\n{report}"))?;
        all_there(&e, &acked, &maybe)
            .await
            .map_err(|e| format!("{e}\n{report}"))?;
        Ok(format!("torn {:?}", report.torn))
    });
}

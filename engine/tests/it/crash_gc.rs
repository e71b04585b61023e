//! Seeded crash tests of garbage collection and entry-log compaction on the crash-simulating
//! disk (`quire_engine::sim_disk`).
//!
//! Each seed writes several ledgers into many small entry logs (checkpoints between bursts, so
//! every log holds entries of several ledgers), fences some, then runs a GC that deletes some
//! ledgers (fenced ones among them) and a forced compaction, sometimes with adds and a
//! checkpoint running at the same time. The disk crashes during a seed-chosen operation in the
//! ledger directory of that phase (drawn from 1 to the number of operations a dry run of the
//! same seed took, so every step is hit across seeds: tombstone writes and renames, output-log
//! creation, copies, syncs, the index segment, the mark, the old log's removal, directory syncs),
//! maybe tearing the last unsynced write and keeping some earlier ones. Then it reopens and
//! checks: every acknowledged entry of a live ledger reads back byte for byte; a deleted ledger
//! stays deleted (no state, reads `NoSuchLedger`, adds and fences `LedgerDeleted`, whatever the
//! master key); every index entry points to a good record in an existing entry log
//! (`verify_index`); after a GC on the reopened engine the live bytes are exactly the records of
//! the entries present and no entry log without a live entry is left.
//! Then a clean close, another open, and the same checks.
//!
//! `QUIRE_GC_CRASH_SEEDS=N` runs seeds 0..N (default 300); `QUIRE_GC_CRASH_SEED=S` replays one.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use crate::common::{payload, KEY};
use glommio::{LocalExecutorBuilder, Placement};
use quire_engine::sim_disk::{CrashReport, OpFilter, SimImage, SimStorage};
use quire_engine::{Engine, EngineConfig, Error};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SEEDS_DEFAULT: u64 = 300;
const LEDGERS: u64 = 6;
const RECORD_HEADER_BYTES: u64 = 24;

fn sim_config() -> EngineConfig {
    let mut c = EngineConfig::new("/sim/journal".into(), "/sim/ledgers".into());
    c.journal_file_size_bytes = 256 << 10;
    c.group_commit_wait_max = Duration::ZERO;
    // Checkpoints only by hand: the operation sequence of a seed barely varies between runs.
    c.write_cache_bytes_max = 4 << 20;
    c.checkpoint_interval = Duration::from_secs(3600);
    c.entry_log_size_bytes_max = 16 << 10;
    c.background_write_bytes_per_second = 0;
    c.background_sync_bytes = 8 << 10;
    // Compaction only when asked.
    // Reads go to the entry logs (no read-ahead, no read cache), so that they meet compaction.
    c.read_ahead_entries = 0;
    c.read_cache_bytes_max = 1;
    c.minor_compaction_interval = Duration::ZERO;
    c.major_compaction_interval = Duration::ZERO;
    c
}

/// Whether a ledger is deleted, as far as the test knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deleted {
    No,
    /// The deletion was in flight at a crash.
    Either,
    Yes,
}

#[derive(Debug, Default)]
struct Model {
    /// (ledger, entry) → (bytes, acknowledged or seen after a reopen).
    entries: BTreeMap<(u64, u64), (Vec<u8>, bool)>,
    next_entry: BTreeMap<u64, u64>,
    deleted: BTreeMap<u64, Deleted>,
    fenced: BTreeSet<u64>,
}

type Shared = Rc<RefCell<Model>>;
/// (ledger, entry) and (bytes, acknowledged).
type EntryItem = ((u64, u64), (Vec<u8>, bool));

fn crash_explains(storage: &SimStorage, e: &Error) -> bool {
    matches!(e, Error::Io { .. }) && storage.crash_report().is_some()
}

async fn add(
    engine: &Engine<SimStorage>,
    m: &Shared,
    ledger: u64,
    len: usize,
) -> Result<(), Error> {
    let entry = {
        let mut mm = m.borrow_mut();
        let n = mm.next_entry.entry(ledger).or_default();
        let e = *n;
        *n += 1;
        mm.entries
            .insert((ledger, e), (payload(ledger, e, len), false));
        e
    };
    let r = engine
        .add_entry(
            ledger,
            entry,
            KEY,
            entry.checked_sub(1),
            payload(ledger, entry, len),
            false,
        )
        .await;
    if r.is_ok() {
        m.borrow_mut()
            .entries
            .get_mut(&(ledger, entry))
            .expect("entry")
            .1 = true;
    }
    r
}

/// Phase A, no crash: ledgers written in bursts across many entry logs, some fenced.
async fn fill(engine: &Engine<SimStorage>, m: &Shared, rng: &mut StdRng) -> Result<(), String> {
    // Every ledger gets a state first, so that the deletion probe in `verify` never creates one.
    for ledger in 1..=LEDGERS {
        add(engine, m, ledger, 64)
            .await
            .map_err(|e| format!("fill add to ledger {ledger}: {e}"))?;
    }
    let bursts = rng.gen_range(8..20);
    for _ in 0..bursts {
        for _ in 0..rng.gen_range(2..8) {
            let ledger = rng.gen_range(1..=LEDGERS);
            if m.borrow().fenced.contains(&ledger) {
                continue;
            }
            let len = rng.gen_range(16..3000);
            add(engine, m, ledger, len)
                .await
                .map_err(|e| format!("fill add to ledger {ledger}: {e}"))?;
        }
        engine
            .checkpoint()
            .await
            .map_err(|e| format!("fill checkpoint: {e}"))?;
    }
    for ledger in 1..=LEDGERS {
        if rng.gen_bool(0.3) {
            engine
                .fence(ledger, KEY)
                .await
                .map_err(|e| format!("fence {ledger}: {e}"))?;
            m.borrow_mut().fenced.insert(ledger);
        }
    }
    engine
        .checkpoint()
        .await
        .map_err(|e| format!("fill checkpoint: {e}"))?;
    Ok(())
}

/// Phase B: delete `doomed`, compact, maybe with a concurrent writer and checkpoint. Errors the
/// crash explains are expected; anything else is a failure.
async fn gc_phase(
    engine: Rc<Engine<SimStorage>>,
    storage: &SimStorage,
    m: &Shared,
    doomed: &[u64],
    concurrent: Option<u64>,
    threshold: f64,
) -> Result<(), String> {
    for &l in doomed {
        m.borrow_mut().deleted.insert(l, Deleted::Either);
    }
    let writer = concurrent.map(|ledger| {
        let (engine, m, storage) = (engine.clone(), m.clone(), storage.clone());
        glommio::spawn_local(async move {
            for i in 0..12 {
                match add(&engine, &m, ledger, 100 + i * 211).await {
                    Ok(()) => {}
                    Err(e) if crash_explains(&storage, &e) => return Ok(()),
                    Err(e) => return Err(format!("concurrent add: {e}")),
                }
                if i % 3 == 1 {
                    // A recovery add rewrites an entry with its own bytes (what a recovering
                    // writer does): its new copy moves it out of the log being compacted.
                    let e = (i / 2) as u64;
                    let data = m.borrow().entries.get(&(ledger, e)).map(|d| d.0.clone());
                    if let Some(data) = data {
                        match engine
                            .add_entry(ledger, e, KEY, e.checked_sub(1), data, true)
                            .await
                        {
                            Ok(()) => {}
                            Err(e) if crash_explains(&storage, &e) => return Ok(()),
                            Err(e) => return Err(format!("concurrent recovery add: {e}")),
                        }
                    }
                }
                if i % 4 == 3 {
                    match engine.checkpoint().await {
                        Ok(()) => {}
                        Err(e) if crash_explains(&storage, &e) => return Ok(()),
                        Err(e) => return Err(format!("concurrent checkpoint: {e}")),
                    }
                }
            }
            Ok::<(), String>(())
        })
    });
    // Reads of live ledgers' acknowledged entries go on throughout and must all succeed,
    // also when compaction moves an entry and deletes its log under the read.
    let done = Rc::new(std::cell::Cell::new(false));
    let reader = {
        let (engine, m, storage, done) = (engine.clone(), m.clone(), storage.clone(), done.clone());
        let doomed = doomed.to_vec();
        glommio::spawn_local(async move {
            let keys: Vec<(u64, u64)> = m
                .borrow()
                .entries
                .iter()
                .filter(|((l, _), (_, a))| *a && !doomed.contains(l))
                .map(|(k, _)| *k)
                .collect();
            if keys.is_empty() {
                return Ok(());
            }
            let mut n = 0u64;
            // Bounded, and yielding, so that the GC phase's length stays that of the GC.
            for _ in 0..400 {
                if done.get() {
                    break;
                }
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let (l, e) = keys[(n >> 33) as usize % keys.len()];
                match engine.read_entry(l, Some(e)).await {
                    Ok(got) if m.borrow().entries.get(&(l, e)).is_some_and(|d| d.0 == got) => {}
                    Ok(_) => return Err(format!("live read of {l}/{e} returned other bytes")),
                    Err(err) if crash_explains(&storage, &err) => return Ok(()),
                    Err(err) => return Err(format!("live read of {l}/{e} during GC: {err}")),
                }
                futures_lite::future::yield_now().await;
            }
            Ok::<(), String>(())
        })
    };
    let gc = async {
        // Two deletions when there are two ledgers to delete: the first creates the tombstone
        // file, the second appends to it.
        let (first, second) = doomed.split_at(doomed.len().div_ceil(2));
        for part in [first, second] {
            if part.is_empty() {
                continue;
            }
            match engine.collect_garbage(part).await {
                Ok(run) => {
                    for &l in part {
                        m.borrow_mut().deleted.insert(l, Deleted::Yes);
                    }
                    if run.ledgers_deleted != part.len() as u64 {
                        return Err(format!("GC deleted {} of {part:?}", run.ledgers_deleted));
                    }
                }
                Err(e) if crash_explains(storage, &e) => return Ok(()),
                Err(e) => return Err(format!("collect_garbage: {e}")),
            }
        }
        match engine.compact_entry_logs(threshold).await {
            Ok(_) => Ok(()),
            Err(e) if crash_explains(storage, &e) => Ok(()),
            Err(e) => Err(format!("compact_entry_logs: {e}")),
        }
    };
    let r = gc.await;
    done.set(true);
    if let Some(w) = writer {
        w.await?;
    }
    reader.await?;
    r
}

/// Checks a freshly opened engine against the model, fixing every "either" to what it found.
async fn verify(engine: &Engine<SimStorage>, m: &Shared, when: &str) -> Result<(), String> {
    let fail = |s: String| format!("{when}: {s}");
    let ids: BTreeSet<u64> = engine.ledger_ids().into_iter().collect();
    // Only ledgers the test wrote: the deletion probe below would create an unknown one.
    let ledgers: Vec<u64> = m.borrow().next_entry.keys().copied().collect();
    for ledger in ledgers {
        let state = m
            .borrow()
            .deleted
            .get(&ledger)
            .copied()
            .unwrap_or(Deleted::No);
        let gone = engine.ledger_state(ledger).is_none()
            && matches!(
                engine
                    .add_entry(ledger, 1 << 40, [9; 20], None, vec![1], false)
                    .await,
                Err(Error::LedgerDeleted { .. })
            );
        match (state, gone) {
            (Deleted::Yes, false) => return Err(fail(format!("deleted ledger {ledger} is back"))),
            (Deleted::No, true) => {
                return Err(fail(format!(
                    "ledger {ledger} was deleted but never asked to be"
                )))
            }
            (Deleted::Either, g) => {
                m.borrow_mut()
                    .deleted
                    .insert(ledger, if g { Deleted::Yes } else { Deleted::No });
            }
            _ => {}
        }
        if gone {
            if ids.contains(&ledger) {
                return Err(fail(format!("deleted ledger {ledger} is in ledger_ids")));
            }
            match engine.read_entry(ledger, Some(0)).await {
                Err(Error::NoSuchLedger { .. }) => {}
                other => {
                    return Err(fail(format!(
                        "read of deleted ledger {ledger}: {:?}",
                        other.map(|d| d.len())
                    )))
                }
            }
            match engine.fence(ledger, KEY).await {
                Err(Error::LedgerDeleted { .. }) => {}
                other => return Err(fail(format!("fence of deleted ledger {ledger}: {other:?}"))),
            }
            match engine
                .add_entry(ledger, 0, KEY, None, vec![1, 2, 3], true)
                .await
            {
                Err(Error::LedgerDeleted { .. }) => {}
                other => {
                    return Err(fail(format!(
                        "recovery add to deleted ledger {ledger}: {other:?}"
                    )))
                }
            }
            continue;
        }
        let entries: Vec<EntryItem> = m
            .borrow()
            .entries
            .range((ledger, 0)..=(ledger, u64::MAX))
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        for ((l, e), (data, acked)) in entries {
            match engine.read_entry(l, Some(e)).await {
                Ok(got) if got == data => {
                    m.borrow_mut().entries.get_mut(&(l, e)).expect("entry").1 = true;
                }
                Ok(got) => {
                    return Err(fail(format!(
                        "entry {l}/{e} reads {} bytes, not the {} added",
                        got.len(),
                        data.len()
                    )))
                }
                Err(Error::NoSuchEntry { .. } | Error::NoSuchLedger { .. }) if !acked => {
                    m.borrow_mut().entries.remove(&(l, e));
                }
                Err(err) => return Err(fail(format!("acknowledged entry {l}/{e}: {err}"))),
            }
        }
        let fenced = engine.ledger_state(ledger).is_some_and(|s| s.fenced);
        if m.borrow().fenced.contains(&ledger) && !fenced {
            return Err(fail(format!("fence of ledger {ledger} lost")));
        }
    }
    engine
        .verify_index()
        .await
        .map_err(|e| fail(format!("verify_index: {e}")))?;
    Ok(())
}

/// The bytes the live entries' records take: what the index must count as live once
/// everything is checkpointed.
fn live_record_bytes(m: &Shared) -> u64 {
    let mm = m.borrow();
    mm.entries
        .iter()
        .filter(|((l, _), _)| mm.deleted.get(l).copied().unwrap_or(Deleted::No) == Deleted::No)
        .map(|(_, (d, _))| RECORD_HEADER_BYTES + d.len() as u64)
        .sum()
}

/// A GC on a reopened engine finishes the work: then the live bytes are exact, no log without
/// a live entry remains (that disk use goes down is checked by `gc_reclaims_disk_space`).
async fn finish_and_check(
    engine: &Engine<SimStorage>,
    m: &Shared,
    bytes_before_gc: u64,
    when: &str,
) -> Result<(), String> {
    let fail = |s: String| format!("{when}: {s}");
    engine
        .checkpoint()
        .await
        .map_err(|e| fail(format!("checkpoint: {e}")))?;
    let doomed: Vec<u64> = m
        .borrow()
        .deleted
        .iter()
        .filter(|(_, d)| **d == Deleted::Yes)
        .map(|(l, _)| *l)
        .collect();
    let run = engine
        .collect_garbage(&doomed)
        .await
        .map_err(|e| fail(format!("collect_garbage: {e}")))?;
    if run.ledgers_deleted != 0 {
        return Err(fail(format!(
            "{} deleted ledgers were not tombstoned",
            run.ledgers_deleted
        )));
    }
    engine
        .compact_entry_logs(0.95)
        .await
        .map_err(|e| fail(format!("compact: {e}")))?;
    let s = engine.gc_stats();
    let want = live_record_bytes(m);
    if s.live_bytes != want {
        return Err(fail(format!(
            "index counts {} live bytes, the entries present take {want}",
            s.live_bytes
        )));
    }
    let _ = bytes_before_gc;
    // Compacted at 0.95: every log but the current one and the last compaction output is
    // nearly full of live data; none is without a live entry.
    let again = engine
        .compact_entry_logs(0.0)
        .await
        .map_err(|e| fail(format!("GC: {e}")))?;
    if again.entry_logs_deleted != 0 {
        return Err(fail(format!(
            "{} entry logs without live entries survived a GC",
            again.entry_logs_deleted
        )));
    }
    verify(engine, m, when).await
}

fn crash_point(r: &CrashReport) -> String {
    let Some(op) = &r.during else {
        return "between ops".into();
    };
    let mut words = op.split_whitespace().skip(1);
    let kind = words.next().unwrap_or("?");
    let path = words.next().unwrap_or("");
    let name = path.rsplit('/').next().unwrap_or(path);
    let ext = match name.split_once('.') {
        Some((_, e)) => e,
        None => name,
    };
    format!("{kind} {ext}")
}

/// Runs seed `seed` with the crash at ledger-directory operation `crash_op` of the GC phase
/// (`None`: a dry run that only counts them). Returns the crash point and the count.
async fn run_seed_async(seed: u64, crash_op: Option<u64>) -> Result<(String, u64), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let m: Shared = Rc::new(RefCell::new(Model::default()));
    let storage = SimStorage::new(rng.gen());
    let engine = Engine::open_with(sim_config(), storage.clone())
        .await
        .map_err(|e| format!("open: {e}"))?;
    fill(&engine, &m, &mut rng).await?;
    let bytes_before_gc = engine.gc_stats().entry_log_bytes;
    let mut doomed: Vec<u64> = (1..=LEDGERS).filter(|_| rng.gen_bool(0.4)).collect();
    if doomed.is_empty() {
        doomed.push(rng.gen_range(1..=LEDGERS));
    }
    let live: Vec<u64> = (1..=LEDGERS)
        .filter(|l| !doomed.contains(l) && !m.borrow().fenced.contains(l))
        .collect();
    let concurrent = if rng.gen_bool(0.5) && !live.is_empty() {
        Some(live[rng.gen_range(0..live.len())])
    } else {
        None
    };
    let threshold = [0.5, 0.8, 0.95][rng.gen_range(0..3)];
    let tear = rng.gen_bool(0.5).then(|| rng.gen::<u64>());
    let keep = rng.gen_bool(0.3).then(|| rng.gen::<u64>());
    let ops_before = storage.ops();
    let counted = Rc::new(std::cell::Cell::new(0u64));
    let c2 = counted.clone();
    let filter: OpFilter = Box::new(move |_, p: &Path| {
        let hit = p.starts_with("/sim/ledgers");
        if hit {
            c2.set(c2.get() + 1);
        }
        hit
    });
    // A dry run arms a crash that never comes, only to count the operations.
    storage.crash_at_matching_op(crash_op.unwrap_or(u64::MAX), filter, tear);
    storage.keep_unsynced_writes(keep);
    gc_phase(engine.clone(), &storage, &m, &doomed, concurrent, threshold).await?;
    let n = counted.get();
    let report = storage.crash(tear);
    let _ = engine.close().await;
    let point = if crash_op.is_some() {
        crash_point(&report)
    } else {
        "dry run".into()
    };
    let ctx = format!(
        "seed {seed}, crash at ledger-dir op {crash_op:?} of {n} ({} ops before the GC), \
         doomed {doomed:?}, fenced {:?}, concurrent {concurrent:?}, threshold {threshold}, \
         tear {tear:?}, keep {keep:?}\n{report}",
        ops_before,
        m.borrow().fenced
    );
    let image: SimImage = report.image;

    let storage = SimStorage::from_image(&image, rng.gen());
    let engine = Engine::open_with(sim_config(), storage.clone())
        .await
        .map_err(|e| format!("reopen after the crash: {e}\n{ctx}"))?;
    verify(&engine, &m, "after the crash")
        .await
        .map_err(|e| format!("{e}\n{ctx}"))?;
    finish_and_check(&engine, &m, bytes_before_gc, "GC after the crash")
        .await
        .map_err(|e| format!("{e}\n{ctx}"))?;
    engine
        .close()
        .await
        .map_err(|e| format!("close: {e}\n{ctx}"))?;
    let storage = SimStorage::from_image(&storage.durable_image(), rng.gen());
    let engine = Engine::open_with(sim_config(), storage.clone())
        .await
        .map_err(|e| format!("open after close: {e}\n{ctx}"))?;
    verify(&engine, &m, "after close and open")
        .await
        .map_err(|e| format!("{e}\n{ctx}"))?;
    let _ = engine.close().await;
    Ok((point, n))
}

fn run_seed(seed: u64, crash_op: Option<u64>) -> Result<(String, u64), String> {
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(move || run_seed_async(seed, crash_op))
        .expect("spawn executor")
        .join()
        .unwrap_or_else(|e| Err(format!("the executor panicked: {e:?}")))
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}"))
    })
}

/// The crash op of `seed`: uniform over the ledger-directory operations its dry run counted.
fn crash_op_of(seed: u64) -> Result<u64, String> {
    let (_, n) = run_seed(seed, None)?;
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
    Ok(rng.gen_range(1..=n.max(1)))
}

#[test]
fn gc_and_compaction_lose_nothing_at_any_crash_point() {
    // Goal: GC and compaction are crash safe: whatever operation a crash interrupts, every
    // acknowledged entry of a live ledger survives byte for byte, deleted ledgers stay deleted
    // and refuse writes, no index entry points into a deleted or damaged log, and a later GC
    // reclaims what the crashed one left. Method: see the file doc; each seed's crash point is
    // drawn over the operations its dry run took; the crash points hit are tallied.
    let seeds: Vec<u64> = match env_u64("QUIRE_GC_CRASH_SEED") {
        Some(s) => vec![s],
        None => (0..env_u64("QUIRE_GC_CRASH_SEEDS").unwrap_or(SEEDS_DEFAULT)).collect(),
    };
    let mut points: BTreeMap<String, u64> = BTreeMap::new();
    let mut failed = Vec::new();
    for &seed in &seeds {
        let r = crash_op_of(seed).and_then(|op| run_seed(seed, Some(op)));
        match r {
            Ok((p, _)) => *points.entry(p).or_default() += 1,
            Err(e) => {
                eprintln!(
                    "crash_gc seed {seed} FAILED: {e}\nreplay: QUIRE_GC_CRASH_SEED={seed} cargo test \
                     --release -p quire-engine --test it crash_gc"
                );
                failed.push(seed);
            }
        }
    }
    eprintln!(
        "crash_gc: {} seeds, {} failed; crashes by operation: {points:?}",
        seeds.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "failing seeds: {failed:?}");
}

#[test]
fn every_operation_of_one_gc_run_is_a_safe_crash_point() {
    // Goal: the same contract, crash at each operation in turn, for two seeds. Method: count
    // the GC phase's ledger-directory operations in a dry run, then one run per operation;
    // every kind of step of GC and compaction must have been crashed in.
    let mut points: BTreeMap<String, u64> = BTreeMap::new();
    for seed in [1_000_001u64, 1_000_002] {
        let (_, n) = run_seed(seed, None).unwrap_or_else(|e| panic!("dry run of seed {seed}: {e}"));
        assert!(n > 10, "seed {seed}: the GC phase took only {n} operations");
        for op in 1..=n {
            match run_seed(seed, Some(op)) {
                Ok((p, _)) => *points.entry(p).or_default() += 1,
                Err(e) => panic!("seed {seed}, crash at op {op} of {n}: {e}"),
            }
        }
    }
    eprintln!("crash_gc, every operation: crashes by operation: {points:?}");
    // Tombstone file creation and append, compaction output, copies, index, mark, removal.
    for step in [
        "create qdl.tmp",
        "write qdl.tmp",
        "fdatasync qdl.tmp",
        "rename qdl.tmp",
        "write qdl",
        "fdatasync qdl",
        "create qel",
        "write qel",
        "fdatasync qel",
        "create qis",
        "write qis",
        "fdatasync qis",
        "remove qis",
        "write qcp.tmp",
        "rename qcp.tmp",
        "remove qel",
        "sync_dir ledgers",
    ] {
        assert!(
            points.contains_key(step),
            "no crash during {step:?}: {points:?}"
        );
    }
}

#[test]
fn gc_reclaims_disk_space() {
    // Goal: deleting ledgers and compacting gives disk space back, and the figures say so.
    // Method: four ledgers written in the same checkpoints (each log holds all four), delete
    // three, GC and compact at the major threshold; the entry logs must shrink to under half
    // their size (a quarter is live; log headers and block padding are the rest) and every entry of the survivor must read back.
    let out = LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(|| async {
            let m: Shared = Rc::new(RefCell::new(Model::default()));
            let storage = SimStorage::new(7);
            let engine = Engine::open_with(sim_config(), storage.clone())
                .await
                .unwrap();
            for _ in 0..20 {
                for ledger in 1..=4 {
                    add(&engine, &m, ledger, 1000).await.unwrap();
                }
                engine.checkpoint().await.unwrap();
            }
            let before = engine.gc_stats();
            let run = engine.collect_garbage(&[1, 2, 3]).await.unwrap();
            assert_eq!(run.ledgers_deleted, 3);
            let compacted = engine.compact_entry_logs(0.8).await.unwrap();
            let after = engine.gc_stats();
            assert!(compacted.entry_logs_compacted > 0, "{compacted:?}");
            assert!(
                after.entry_log_bytes * 2 < before.entry_log_bytes,
                "entry logs: {before:?} -> {after:?}"
            );
            assert_eq!(after.live_bytes, 20 * (RECORD_HEADER_BYTES + 1000));
            assert_eq!(after.ledgers_deleted, 3);
            assert_eq!(
                after.bytes_reclaimed_by_deletion + after.bytes_reclaimed_by_compaction,
                run.bytes_reclaimed + compacted.bytes_reclaimed
            );
            for ledger in 1..=3 {
                m.borrow_mut().deleted.insert(ledger, Deleted::Yes);
            }
            verify(&engine, &m, "after GC").await.unwrap();
            engine.close().await.unwrap();
            let storage = SimStorage::from_image(&storage.durable_image(), 8);
            let engine = Engine::open_with(sim_config(), storage).await.unwrap();
            verify(&engine, &m, "after reopen").await.unwrap();
            assert_eq!(engine.gc_stats().live_bytes, after.live_bytes);
        })
        .expect("spawn executor")
        .join();
    out.expect("executor panicked");
}

#[test]
fn scheduled_compaction_follows_minor_and_major_intervals() {
    // Goal: collect_garbage compacts only when an interval has passed: major (0.8) when its
    // interval passed, else minor (0.2), none with both disabled (zero). Method: three engines
    // with different intervals; a run right after open and one after the intervals passed.
    let out = LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(|| async {
            let mut cfg = sim_config();
            let engine = Engine::open_with(cfg.clone(), SimStorage::new(1))
                .await
                .unwrap();
            let run = engine.collect_garbage(&[]).await.unwrap();
            assert_eq!(run.compaction_threshold, None, "both intervals disabled");

            cfg.minor_compaction_interval = Duration::from_millis(30);
            cfg.major_compaction_interval = Duration::from_secs(3600);
            let engine = Engine::open_with(cfg.clone(), SimStorage::new(2))
                .await
                .unwrap();
            let run = engine.collect_garbage(&[]).await.unwrap();
            assert_eq!(run.compaction_threshold, None, "counted from open");
            glommio::timer::sleep(Duration::from_millis(40)).await;
            let run = engine.collect_garbage(&[]).await.unwrap();
            assert_eq!(run.compaction_threshold, Some(0.2));
            let run = engine.collect_garbage(&[]).await.unwrap();
            assert_eq!(
                run.compaction_threshold, None,
                "the minor interval restarted"
            );

            cfg.minor_compaction_interval = Duration::from_millis(30);
            cfg.major_compaction_interval = Duration::from_millis(30);
            let engine = Engine::open_with(cfg, SimStorage::new(3)).await.unwrap();
            glommio::timer::sleep(Duration::from_millis(40)).await;
            let run = engine.collect_garbage(&[]).await.unwrap();
            assert_eq!(run.compaction_threshold, Some(0.8), "major wins");
            let run = engine.collect_garbage(&[]).await.unwrap();
            assert_eq!(
                run.compaction_threshold, None,
                "a major run restarts the minor interval"
            );
            let s = engine.gc_stats();
            assert_eq!(
                (s.major_compactions, s.minor_compactions, s.runs),
                (1, 0, 2)
            );
        })
        .expect("spawn executor")
        .join();
    out.expect("executor panicked");
}

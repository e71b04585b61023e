//! The engine facade: [`Engine`] opens a shard's storage, spawns its two background tasks
//! (journal writer, checkpointer) and delegates each call to the concept that owns the state:
//! `journal` (group commit, files, replay), `write_cache`, `checkpoint`, `entry_log`, `index`,
//! `ledgers`, `read_ahead` and `lac_watch` (the parts of a BookKeeper bookie's
//! `InterleavedLedgerStorage`/`DbLedgerStorage` and `Journal`, one module each).

use std::cell::RefCell;
use std::collections::HashMap;
use std::io as stdio;
use std::rc::Rc;
use std::time::Duration;

use glommio::{Latency, Shares, TaskQueueHandle};

use crate::checkpoint::{Checkpointer, MarkKeeper};
use crate::entry_log::EntryLogs;
use crate::format::{Record, LAC_NONE};
use crate::gc::{Compaction, Gc, GcRun, GcState, IndexCheck};
use crate::index::merge::IndexMerger;
use crate::index::rebuild::IndexRebuilder;
use crate::index::Index;
use crate::io::{DmaStorage, Storage, BLOCK_BYTES};
use crate::journal::files::JournalFiles;
use crate::journal::writer::{DurableBatch, JournalWriter};
use crate::journal::Journal;
use crate::lac_watch::LacWatchers;
use crate::ledgers::{apply_durable, Admission, Ledgers};
use crate::open::{open_state, Opened};
use crate::read_ahead::ReadAhead;
use crate::scrub::{DamagedEntry, ScrubPass, ScrubStats, Scrubber, SCRUB_PIECE_LOCATIONS};
use crate::sync::Closed;
use crate::throttle::Throttle;
use crate::write_cache::WriteCache;
use crate::{
    EngineConfig, Error, GcStats, IndexStats, JournalObserver, LacUpdate, LedgerState, ReadStats,
};

/// glommio shares of the journal writer's task queue (latency-sensitive).
const JOURNAL_QUEUE_SHARES: usize = 1000;
/// Preemption target of the journal writer's task queue.
const JOURNAL_QUEUE_LATENCY: Duration = Duration::from_millis(1);
/// glommio shares of the engine's background queue (checkpoint, journal pre-creation).
const BACKGROUND_QUEUE_SHARES: usize = 50;

/// The facade's handles: the shared pieces it reads and writes on the request path, and the
/// subsystem contexts it delegates to (each of which holds its own handles; see
/// ARCHITECTURE.md, "Engine: who owns what"). Shard-local: `Rc`, never `Send`.
struct Inner<S: Storage> {
    cfg: Rc<EngineConfig>,
    storage: Rc<S>,
    closed: Closed,
    journal: Rc<Journal<S::File>>,
    write_cache: Rc<WriteCache>,
    ledgers: Rc<Ledgers>,
    index: Rc<Index<S::File>>,
    entry_logs: Rc<EntryLogs<S::File>>,
    read_ahead: Rc<ReadAhead>,
    lac_watchers: Rc<LacWatchers>,
    /// Pacing of bulk writes against the journal (checkpoints, journal pre-creation,
    /// compaction); the facade only reads its figures.
    throttle: Rc<Throttle>,
    /// The durable mark, the checkpoint lock and the checkpointer's signals.
    marks: Rc<MarkKeeper>,
    checkpointer: Checkpointer<S>,
    gc: Rc<Gc<S>>,
    merger: Rc<IndexMerger<S>>,
    rebuilder: IndexRebuilder<S>,
    scrubber: Scrubber<S>,
    /// The engine's background task queue (checkpoints, journal pre-creation, GC).
    background_tq: TaskQueueHandle,
    /// Adds admitted after a stored-copy check (possible re-adds) and not yet answered, per
    /// (ledger, entry): how many, and the journal's submitted count once the last was queued.
    /// Bounded by the adds in flight; new entries never enter it.
    re_adds_in_flight: ReAddsInFlight,
}

/// Possible re-adds in flight: per (ledger, entry), how many, and the journal's submitted count
/// once the last of them was queued.
type ReAddsInFlight = RefCell<HashMap<(u64, u64), (u32, u64)>>;

/// What a durable journal batch makes visible, applied by the facade's journal task: the
/// journal's durable end, the ledger table and the write cache (one record at a time, in
/// journal order), a checkpoint request when the write cache is over its bound, the adds'
/// completions, and the LAC watchers of the ledgers touched (BookKeeper acknowledges an add
/// and advances the LAC only once its journal entry is durable).
struct DurableSink<F> {
    journal: Rc<Journal<F>>,
    ledgers: Rc<Ledgers>,
    write_cache: Rc<WriteCache>,
    lac_watchers: Rc<LacWatchers>,
    marks: Rc<MarkKeeper>,
}

impl<F> DurableSink<F> {
    /// Applies `batch`, with no await: a checkpoint snapshots the write cache and reads the
    /// durable end in one synchronous step, and must find them agreeing.
    fn apply(&self, batch: DurableBatch) {
        let mut dones = Vec::with_capacity(batch.records.len());
        let mut touched: Vec<u64> = Vec::new();
        self.journal.set_durable(batch.pos);
        for p in batch.records {
            let ledger = match &p.record {
                Record::Add { ledger, .. } | Record::Fence { ledger, .. } => *ledger,
                Record::BatchHeader { .. } => unreachable!("batch headers are not queued"),
            };
            if touched.last() != Some(&ledger) {
                touched.push(ledger);
            }
            apply_durable(&self.ledgers, &self.write_cache, p.record);
            dones.push(p.done);
        }
        if self.write_cache.over_bound() {
            self.marks.request();
        }
        self.journal.note_finished(dones.len());
        for d in dones {
            d.complete(Ok(()));
        }
        touched.sort_unstable();
        touched.dedup();
        if !self.lac_watchers.is_empty() {
            for ledger in touched {
                self.lac_watchers.wake(ledger);
            }
        }
    }
}

/// The facade's journal task: runs the writer and applies each batch it reports durable, until
/// the engine is closed and the journal queue drained.
async fn journal_task<S: Storage + 'static>(
    mut writer: JournalWriter<S>,
    sink: DurableSink<S::File>,
) {
    while let Some(batch) = writer.next_durable().await {
        sink.apply(batch);
    }
}

/// What [`Engine::add_entry`] found of another copy of the entry it adds.
enum OtherCopy {
    /// None besides what the entry logs held (if they were compared): decide now.
    None,
    /// A copy in the write cache, with the same bytes or not: decide now.
    Cached { same: bool },
    /// A copy may be in flight: wait until the journal finished `finished` records.
    InFlight { finished: u64 },
    /// The index may hold a copy: read and compare it.
    MaybeOnDisk,
}

/// What an add of an entry the shard may already hold found, decided at its admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// No other copy, or one with the same bytes.
    Nothing,
    /// A readable copy with other bytes.
    Other,
    /// A copy that cannot be read back (fails its record check, or an I/O error).
    Damaged,
}

/// Marks one possible re-add in flight in `Inner::re_adds_in_flight` until dropped (answered,
/// failed or cancelled).
struct ReAddInFlight<'a> {
    map: &'a ReAddsInFlight,
    key: (u64, u64),
}

impl<'a> ReAddInFlight<'a> {
    fn new(map: &'a ReAddsInFlight, key: (u64, u64), seq: u64) -> Self {
        let mut m = map.borrow_mut();
        let (count, until) = m.entry(key).or_insert((0, 0));
        *count += 1;
        *until = (*until).max(seq);
        Self { map, key }
    }
}

impl Drop for ReAddInFlight<'_> {
    fn drop(&mut self) {
        let mut m = self.map.borrow_mut();
        if let Some((count, _)) = m.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                m.remove(&self.key);
            }
        }
    }
}

impl<S: Storage> Inner<S> {
    /// `IndexRebuilding` while `ledger`'s state may be in a lost block of a damaged index
    /// segment not yet rebuilt: the ledger table cannot answer for it (not even "no such
    /// ledger"), nor admit an add or fence against a state it does not know.
    fn check_state_known(&self, ledger: u64) -> Result<(), Error> {
        if self.index.state_pending(ledger) {
            return Err(Error::IndexRebuilding {
                ledger: Some(ledger),
            });
        }
        Ok(())
    }
}

/// The storage engine of one bookie shard.
///
/// # Threading
/// Shard-local (`!Send`): create and use it on one glommio executor. [`Engine::open`] creates two
/// glommio task queues on that executor: `quire-journal` (latency matters, high shares) for the
/// journal writer, and `quire-engine-background` (not latency sensitive, low shares) for the
/// checkpointer and the background pre-creation of the next journal file.
pub struct Engine<S: Storage = DmaStorage> {
    inner: Inner<S>,
}

impl Engine<DmaStorage> {
    /// Opens (creating directories and files if missing) the engine on the real disk and replays
    /// the journal from the checkpoint mark.
    ///
    /// # Errors
    /// `Error::Corrupt` naming the file and byte offset if a journal record that is followed by
    /// durable data is damaged, or if a file header or the mark fails its checksum (a damaged
    /// or missing index segment is not an error: it is rebuilt from the entry logs in the
    /// background while the keys and ledgers it covers answer `IndexRebuilding` (also when it is
    /// missing or its header is unreadable: the version 3 checkpoint mark records its ranges and
    /// entry logs; only when a version 2 mark of an older build names it is it rebuilt during
    /// open, from every entry log); the ledgers whose state it held come back fenced, see
    /// `Engine::index_stats` and docs/format/index.md, "Damaged segments");
    /// `Error::UnsupportedFormat` for a file version this build does not read; `Error::Io`.
    /// A torn journal tail (the last, never acknowledged batch) is dropped silently.
    pub async fn open(config: EngineConfig) -> Result<Rc<Engine>, Error> {
        Engine::open_with(config, DmaStorage).await
    }
}

impl<S: Storage + 'static> Engine<S> {
    /// Like [`Engine::open`], on any [`Storage`] (e.g. a crash-simulating test disk).
    pub async fn open_with(config: EngineConfig, storage: S) -> Result<Rc<Engine<S>>, Error> {
        assert!(
            config.journal_file_size_bytes >= 2 * BLOCK_BYTES as u64,
            "journal files hold a header and a batch"
        );
        assert!(config.group_commit_bytes_max > 0);
        assert!(
            config.entry_size_bytes_max < u32::MAX as usize / 2,
            "entry sizes fit the u32 length fields"
        );
        let ex = glommio::executor();
        let journal_tq = ex.create_task_queue(
            Shares::Static(JOURNAL_QUEUE_SHARES),
            Latency::Matters(JOURNAL_QUEUE_LATENCY),
            "quire-journal",
        );
        let background_tq = ex.create_task_queue(
            Shares::Static(BACKGROUND_QUEUE_SHARES),
            Latency::NotImportant,
            "quire-engine-background",
        );
        let cfg = Rc::new(config);
        let storage = Rc::new(storage);
        let opened = open_state(&cfg, &*storage).await?;
        let (inner, writer, sink) = assemble(cfg, storage, opened, background_tq);
        inner.journal.writer_started();
        let spawn_err = |e: glommio::GlommioError<()>| Error::Io {
            op: "spawn engine task",
            path: inner.cfg.journal_dir.clone(),
            file_offset_bytes: 0,
            source: stdio::Error::other(e.to_string()),
        };
        glommio::spawn_local_into(journal_task(writer, sink), journal_tq)
            .map_err(spawn_err)?
            .detach();
        glommio::spawn_local_into(inner.checkpointer.clone().run_loop(), background_tq)
            .map_err(spawn_err)?
            .detach();
        let merger = inner.merger.clone();
        glommio::spawn_local_into(async move { merger.run_loop().await }, background_tq)
            .map_err(spawn_err)?
            .detach();
        if inner.index.rebuild_pending() {
            // The merger rebuilds damaged segments first, in the background.
            inner.index.merge_signal.notify();
        }
        Ok(Rc::new(Engine { inner }))
    }

    /// Stores entry `entry` of `ledger` and resolves once it is durable in the journal.
    /// `data` is stored verbatim; `lac` is the LAC piggybacked on the entry (the ledger's LAC
    /// becomes the max of all stored ones). The first add of a ledger binds its master key (a
    /// fence before it does not, see [`Engine::fence`]).
    ///
    /// An add of an entry this shard already stores or has in flight is compared byte for byte
    /// with that copy (the write cache, or the entry logs through the index): the same bytes
    /// are journaled again (recovery re-adds are idempotent), other bytes are refused, so an
    /// acknowledged entry is never replaced. Only an entry at or below the ledger's largest
    /// admitted entry is looked for; a new entry costs one lookup of the ledger table.
    /// Two exceptions, for recovery adds only (docs/protocol.md §Add, "Replacing a stored
    /// entry"): a copy that cannot be read back (its entry-log record fails its check, or the
    /// read fails with an I/O error) is replaced, since nobody can read it; and a readable copy
    /// with other bytes is replaced when the ledger is fenced for its key and `entry` is above
    /// this shard's LAC of it, so never an entry this shard knows confirmed (ledger recovery
    /// repairing a divergent replica of an unconfirmed entry). The new bytes win from the next
    /// read on, and after a restart (the journal replays in order; the checkpoint points the
    /// index at the newest copy).
    ///
    /// # Durability
    /// Resolves `Ok` only after the journal write and fdatasync covering this add completed.
    /// Concurrent adds share one write and one sync (group commit, BookKeeper journal rules:
    /// `group_commit_wait_max`, `group_commit_bytes_max`).
    /// # Errors
    /// `TooLarge` if `data.len() > entry_size_bytes_max`; `Unauthorized` if the ledger has a
    /// different master key; `Fenced` if the ledger is fenced and `recovery` is false (recovery
    /// adds are allowed on fenced ledgers, as in BookKeeper); `EntryMismatch` if this shard
    /// stores or is storing the entry with other bytes (but for the two recovery-add
    /// exceptions above); `Corrupt` or `Io` for a normal add whose stored copy cannot be read;
    /// `LedgerDeleted`; `WriteCacheFull` if the write
    /// cache stayed full for `write_cache_wait_max` behind a running checkpoint;
    /// `JournalQueueFull` if more than `journal_queue_bytes_max` bytes stayed queued for the
    /// journal that long (adds wait for room before their checks, BookKeeper's bounded journal
    /// queue); `Io` if the journal failed; `Closed` after [`Engine::close`].
    /// # Full disk
    /// When the next journal file cannot be created (e.g. ENOSPC while pre-writing it), the adds
    /// waiting for that roll fail with `Io` naming the file, the operation and the OS error
    /// (kind `StorageFull` for ENOSPC); the journal itself is intact and the next add retries the
    /// roll, so adds work again once space is freed. A failed journal write or fdatasync instead
    /// fails every later add until the engine is reopened (replay recovers every acknowledged
    /// add). Reads are not affected either way.
    /// # Cancellation
    /// Dropping the future does not withdraw the add; it may still become durable.
    pub async fn add_entry(
        &self,
        ledger: u64,
        entry: u64,
        master_key: [u8; 20],
        lac: Option<u64>,
        data: Vec<u8>,
        recovery: bool,
    ) -> Result<(), Error> {
        let inner = &self.inner;
        if inner.closed.get() {
            return Err(Error::Closed);
        }
        if data.len() > inner.cfg.entry_size_bytes_max {
            return Err(Error::TooLarge {
                size_bytes: data.len(),
                max: inner.cfg.entry_size_bytes_max,
            });
        }
        assert!(
            lac != Some(LAC_NONE),
            "LAC u64::MAX is not a valid entry id"
        );
        inner.check_state_known(ledger)?;
        let key = (ledger, entry);
        let re_add_seq = self.admit(key, master_key, recovery, &data).await?;
        // Only a possible re-add is tracked (a new entry's first copy is covered by the
        // ledger's `admitted_seq`): a later re-add of the same entry waits for it.
        let _in_flight =
            re_add_seq.map(|seq| ReAddInFlight::new(&inner.re_adds_in_flight, key, seq));
        let record = Record::Add {
            ledger,
            entry,
            lac,
            recovery,
            master_key,
            data,
        };
        inner.journal.submit(record).await
    }

    /// Admits the add of `data` as entry `key`: waits for room in the write cache and the
    /// journal queue, then checks it against the ledger table and any other copy of the entry
    /// (see [`Engine::add_entry`]) until it is admitted, with no await between the last check
    /// and the return, so the caller queues it before anything else runs. Returns the
    /// journal's submitted count it will have when it is a possible re-add (else `None`).
    async fn admit(
        &self,
        key: (u64, u64),
        master_key: [u8; 20],
        recovery: bool,
        data: &[u8],
    ) -> Result<Option<u64>, Error> {
        let inner = &self.inner;
        let (ledger, entry) = key;
        // Whether the wait for this ledger's adds in flight at the first check is behind us.
        let mut earlier_adds_settled = false;
        let mut compared_on_disk = false;
        // What the comparison with the entry logs found (once `compared_on_disk`).
        let mut on_disk = Found::Nothing;
        loop {
            // Wait for room before the checks: from the fence and stored-copy checks to the
            // submission there is no await, so an add is never acknowledged after a fence of
            // its ledger was answered, and two different copies of one entry are never both
            // admitted.
            inner.write_cache.wait_for_room().await?;
            inner
                .journal
                .wait_for_room(
                    inner.cfg.journal_queue_bytes_max,
                    inner.cfg.write_cache_wait_max,
                )
                .await?;
            if inner.closed.get() {
                // Closed while this add waited: the journal writer may be gone.
                return Err(Error::Closed);
            }
            inner.journal.check_failed()?;
            let seq = inner.journal.submitted() + 1;
            // A new entry (above the ledger's largest admitted one) is admitted here, in one
            // lookup of the ledger table: nothing to compare it with.
            let Admission::MaybeStored { in_flight_until } = inner
                .ledgers
                .admit_add(ledger, entry, master_key, recovery, seq, false)?
            else {
                return Ok(None);
            };
            let other = self.other_copy(
                key,
                data,
                in_flight_until,
                &mut earlier_adds_settled,
                compared_on_disk,
            );
            let found = match other {
                OtherCopy::Cached { same: true } => Found::Nothing,
                OtherCopy::Cached { same: false } => Found::Other,
                OtherCopy::None => on_disk,
                OtherCopy::InFlight { finished } => {
                    inner.journal.wait_finished(finished).await;
                    continue;
                }
                OtherCopy::MaybeOnDisk => {
                    on_disk = self.compare_on_disk(key, data, recovery).await?;
                    compared_on_disk = true;
                    continue;
                }
            };
            // No await since the ledger table was consulted above.
            self.decide(key, found, recovery)?;
            let admitted = inner
                .ledgers
                .admit_add(ledger, entry, master_key, recovery, seq, true)?;
            assert_eq!(
                admitted,
                Admission::Admitted,
                "nothing changed since the check"
            );
            return Ok(Some(seq));
        }
    }

    /// Compares the copy of entry `key` the entry logs may hold with `data`: `Nothing` when
    /// there is none or it has the same bytes; `Other` for other bytes a recovery add may
    /// replace; `Damaged` for an unreadable copy a recovery add may replace.
    ///
    /// # Errors
    /// `EntryMismatch` for other bytes no add may replace; the read's `Corrupt` or `Io` for a
    /// normal add.
    async fn compare_on_disk(
        &self,
        key: (u64, u64),
        data: &[u8],
        recovery: bool,
    ) -> Result<Found, Error> {
        let (ledger, entry) = key;
        match self.read_entry(ledger, Some(entry)).await {
            Ok(stored) if stored != data => {
                if !(recovery && self.inner.ledgers.may_replace(ledger, entry)) {
                    return Err(Error::EntryMismatch { ledger, entry });
                }
                Ok(Found::Other)
            }
            Ok(_) => Ok(Found::Nothing),
            // Not on disk (a gap of this bookie's stripe), or deleted meanwhile.
            Err(Error::NoSuchEntry { .. } | Error::NoSuchLedger { .. }) => Ok(Found::Nothing),
            // A damaged copy: a recovery add (a repair) may take its place.
            Err(e @ (Error::Corrupt { .. } | Error::Io { .. })) if recovery => {
                tracing::warn!(ledger, entry, error = %e, "stored copy unreadable; a recovery add replaces it");
                Ok(Found::Damaged)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether an add of entry `key` that found `found` may go on: no other copy, or a copy a
    /// recovery add may replace (docs/protocol.md §Add, "Replacing a stored entry").
    ///
    /// # Errors
    /// `EntryMismatch` otherwise.
    fn decide(&self, key: (u64, u64), found: Found, recovery: bool) -> Result<(), Error> {
        let (ledger, entry) = key;
        match found {
            Found::Nothing => Ok(()),
            Found::Damaged if recovery => Ok(()),
            Found::Other if recovery && self.inner.ledgers.may_replace(ledger, entry) => {
                tracing::warn!(
                    ledger,
                    entry,
                    "a recovery add replaces an unconfirmed copy with other bytes"
                );
                Ok(())
            }
            Found::Damaged | Found::Other => Err(Error::EntryMismatch { ledger, entry }),
        }
    }

    /// Looks, with no await, for another copy of entry `key` that an add of `data` (at or
    /// below its ledger's largest admitted entry) must agree with: in the write cache (with
    /// the same bytes or not), in flight (the ledger's adds queued before the first look,
    /// among them the entry's first copy, once; then possible re-adds of it), or in the index
    /// unless `compared_on_disk`.
    fn other_copy(
        &self,
        key: (u64, u64),
        data: &[u8],
        in_flight_until: u64,
        earlier_adds_settled: &mut bool,
        compared_on_disk: bool,
    ) -> OtherCopy {
        let inner = &self.inner;
        if let Some(d) = inner.write_cache.get(&key) {
            return OtherCopy::Cached {
                same: d.as_slice() == data,
            };
        }
        // The entry's first copy was admitted as a new entry before the first look (once the
        // entry is at or below the largest admitted one, no add of it is new again), so one
        // wait for the ledger's adds queued by then covers it; later copies are re-adds,
        // tracked per entry.
        if !*earlier_adds_settled {
            *earlier_adds_settled = true;
            if !inner.journal.has_finished(in_flight_until) {
                return OtherCopy::InFlight {
                    finished: in_flight_until,
                };
            }
        }
        if let Some(&(_, until)) = inner.re_adds_in_flight.borrow().get(&key) {
            if !inner.journal.has_finished(until) {
                return OtherCopy::InFlight { finished: until };
            }
        }
        if !compared_on_disk {
            return OtherCopy::MaybeOnDisk;
        }
        OtherCopy::None
    }

    /// Reads entry `entry` of `ledger`, or with `None` the last entry this shard holds for it.
    /// Recent entries come from the write cache with no disk I/O; older ones from the entry logs.
    ///
    /// # Errors
    /// `NoSuchLedger` / `NoSuchEntry` only when the index truly lacks it (never because of an
    /// I/O error); `NoSuchEntry { entry: u64::MAX }` for `None` on a ledger with no entries;
    /// `Corrupt` if the stored record fails its CRC32C; `Io`; `Closed`.
    pub async fn read_entry(&self, ledger: u64, entry: Option<u64>) -> Result<Vec<u8>, Error> {
        let inner = &self.inner;
        if inner.closed.get() {
            return Err(Error::Closed);
        }
        inner.check_state_known(ledger)?;
        let Some(last_entry) = inner.ledgers.last_entry(ledger) else {
            return Err(Error::NoSuchLedger { ledger });
        };
        let entry = match entry {
            Some(e) => e,
            None => last_entry.ok_or(Error::NoSuchEntry {
                ledger,
                entry: u64::MAX,
            })?,
        };
        if let Some(d) = inner.write_cache.get(&(ledger, entry)) {
            inner.read_ahead.count(|s| s.write_cache_hits += 1);
            return Ok(d.as_ref().clone());
        }
        if let Some(d) = inner.read_ahead.cached(&(ledger, entry)) {
            inner.read_ahead.count(|s| s.read_cache_hits += 1);
            return Ok(d.as_ref().clone());
        }
        let lookup = || async {
            let loc = inner
                .index
                .location(ledger, entry)
                .await?
                .ok_or(Error::NoSuchEntry { ledger, entry })?;
            let following = inner
                .index
                .following(ledger, entry, inner.read_ahead.entries_max())
                .await?;
            Ok::<_, Error>((loc, inner.read_ahead.plan(&following, loc)))
        };
        let (loc, plan) = lookup().await?;
        let r = inner
            .read_ahead
            .read(
                &*inner.storage,
                &inner.entry_logs,
                ledger,
                entry,
                loc,
                &plan,
            )
            .await;
        match r {
            // Compaction may have moved the entry and deleted its old log between the lookup
            // and the read: look up again and read the new copy.
            Err(Error::Io { .. })
                if inner.index.location(ledger, entry).await.ok().flatten() != Some(loc) =>
            {
                let (loc, plan) = lookup().await?;
                inner
                    .read_ahead
                    .read(
                        &*inner.storage,
                        &inner.entry_logs,
                        ledger,
                        entry,
                        loc,
                        &plan,
                    )
                    .await
            }
            r => r,
        }
    }

    /// Whether entry `entry` of `ledger` would be answered from memory (write cache or read
    /// cache) right now, with no disk I/O. The bookie uses this to put a read in its tail-read or
    /// its catch-up task queue.
    pub fn is_cached(&self, ledger: u64, entry: Option<u64>) -> bool {
        let inner = &self.inner;
        let entry = match entry {
            Some(e) => e,
            None => match inner.ledgers.last_entry(ledger).flatten() {
                Some(e) => e,
                None => return true,
            },
        };
        inner.write_cache.contains(&(ledger, entry)) || inner.read_ahead.contains(&(ledger, entry))
    }

    /// Long-poll read of the LAC (BookKeeper `READ_ENTRY` with `previousLAC` and a timeout,
    /// bookkeeper.md §1.3): waits until this shard's LAC of `ledger` is past `previous`
    /// (`None` = no LAC yet, so any LAC passes it), the ledger is fenced, or `timeout` elapsed,
    /// whichever comes first; then answers with the LAC and, when it passed `previous`, entry
    /// `previous + 1` (entry 0 for `None`) if this shard holds it.
    ///
    /// The waiter is woken by the engine's journal task when an add or fence of this ledger
    /// becomes durable (a per-ledger watcher; no polling). A ledger this shard has never seen is
    /// waited on like any other (its first add may be on its way), where BookKeeper would answer
    /// `NoSuchLedger`.
    ///
    /// # Errors
    /// `Closed` if the engine is or gets closed while waiting; the piggybacked read's `Io` or
    /// `Corrupt` error. A timeout is not an error: the answer then carries the unchanged LAC.
    /// # Cancellation
    /// Dropping the future unregisters the waiter.
    pub async fn wait_for_lac(
        &self,
        ledger: u64,
        previous: Option<u64>,
        timeout: Duration,
    ) -> Result<LacUpdate, Error> {
        let inner = &self.inner;
        inner.check_state_known(ledger)?;
        let deadline = quire_clock::now() + timeout;
        let (lac, fenced) = inner
            .lac_watchers
            .wait(ledger, previous, deadline, &inner.closed, || {
                inner.ledgers.lac_and_fenced(ledger)
            })
            .await?;
        let mut next_entry = None;
        if lac > previous {
            let next = previous.map_or(0, |p| p + 1);
            match self.read_entry(ledger, Some(next)).await {
                Ok(data) => next_entry = Some((next, data)),
                Err(Error::NoSuchEntry { .. } | Error::NoSuchLedger { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(LacUpdate {
            lac,
            fenced,
            next_entry,
        })
    }

    /// Read-path counters since open (write cache, read cache, entry-log reads, read-ahead).
    pub fn read_stats(&self) -> ReadStats {
        self.inner.read_ahead.stats()
    }

    /// Times a bulk write (checkpoint, journal pre-creation) waited for the rate limit or for a
    /// journal write/sync in flight, since open.
    pub fn background_write_waits(&self) -> u64 {
        self.inner.throttle.waits()
    }

    /// Number of long-poll waiters parked on `ledger` right now (observability and tests).
    pub fn lac_waiters(&self, ledger: u64) -> usize {
        self.inner.lac_watchers.waiters(ledger)
    }

    /// The state of `ledger`, or `None` if this shard never saw an add or fence for it.
    pub fn ledger_state(&self, ledger: u64) -> Option<LedgerState> {
        self.inner.ledgers.state(ledger)
    }

    /// The master key bound to `ledger` by its first add (normal or recovery), or `None` when
    /// no add bound one yet (never seen, only fenced, or deleted). A bookie that admits keys
    /// only for ledgers the metadata store holds checks a request against the metadata exactly
    /// when this is `None`: once a key is bound, the engine itself refuses every other key.
    pub fn bound_master_key(&self, ledger: u64) -> Option<[u8; 20]> {
        self.inner.ledgers.bound_key(ledger)
    }

    /// Whether `ledger` was deleted by garbage collection (its tombstone is durable): its adds
    /// and fences are refused with `LedgerDeleted` whatever their key.
    pub fn is_deleted(&self, ledger: u64) -> bool {
        self.inner.ledgers.is_deleted(ledger)
    }

    /// Fences `ledger` (BookKeeper fencing read): later normal adds with `master_key` get
    /// `Fenced`. Returns the ledger's LAC once the fence record is durable.
    ///
    /// A ledger whose key no add has bound yet (never seen, or only fenced) is fenced for
    /// `master_key` only, and the key is not bound (BookKeeper would create the ledger with
    /// it): the first add binds its own key and finds the ledger fenced if that key was
    /// fenced; otherwise the recorded fences are dropped. So a stranger who fences ledger ids
    /// ahead cannot stop the real writer, while a recovery fence (with the key from the ledger
    /// metadata) still cuts off the old writer (docs/protocol.md §Fence).
    ///
    /// # Durability
    /// The fence record is journaled; resolves only after it is durable. Fences recorded for a
    /// key no add bound survive a restart (journal replay, then the index's ledger states).
    /// # Errors
    /// `Unauthorized` for a key other than the bound one, or, before any add, for a 17th
    /// distinct key; `LedgerDeleted`; `Io`; `Closed`.
    pub async fn fence(&self, ledger: u64, master_key: [u8; 20]) -> Result<Option<u64>, Error> {
        let inner = &self.inner;
        if inner.closed.get() {
            return Err(Error::Closed);
        }
        inner.journal.check_failed()?;
        inner.check_state_known(ledger)?;
        inner.ledgers.fence(ledger, master_key)?;
        inner
            .journal
            .submit(Record::Fence { ledger, master_key })
            .await?;
        Ok(inner.ledgers.lac(ledger))
    }

    /// Runs one checkpoint now: write cache → entry log (synced) → index segment and ledger
    /// states (synced) → checkpoint mark (temp file, fsync, rename, fsync dir) → removes journal
    /// files wholly before the mark.
    ///
    /// # Errors
    /// `Io`; `Closed`. On error nothing is lost: the cache keeps the entries and the mark stays.
    pub async fn checkpoint(&self) -> Result<(), Error> {
        if self.inner.closed.get() {
            return Err(Error::Closed);
        }
        self.inner.checkpointer.checkpoint().await
    }

    /// Waits for queued adds to become durable, runs a final checkpoint and stops the
    /// background tasks. Later calls of any method return `Closed`.
    pub async fn close(&self) -> Result<(), Error> {
        let inner = &self.inner;
        if inner.closed.close() {
            return Err(Error::Closed);
        }
        inner.journal.wake_writer();
        inner.lac_watchers.wake_all();
        inner.journal.stop().await;
        let r = inner.checkpointer.checkpoint().await;
        inner.marks.request();
        inner.index.merge_signal.notify();
        r
    }

    /// Ids of the ledgers this shard holds a state for (sorted): the local ledger set that
    /// garbage collection compares with the metadata store (BookKeeper's
    /// `ScanAndCompareGarbageCollector` snapshots it before reading the metadata).
    pub fn ledger_ids(&self) -> Vec<u64> {
        self.inner.ledgers.ids()
    }

    /// One garbage-collection run on the engine's background task queue (BookKeeper's
    /// `GarbageCollectorThread` pass): tombstones the ledgers of `deleted` (the caller found
    /// them gone from the metadata store; a failed or partial metadata read must never put a
    /// ledger here), deletes entry logs with no live entry left, and runs the minor (below
    /// `minor_compaction_threshold`) or major (below `major_compaction_threshold`) compaction
    /// when its interval has passed since the last one or since open.
    ///
    /// A deleted ledger's adds and fences are refused with `LedgerDeleted` from then on, also
    /// after a restart; reads of it answer `NoSuchLedger`. Compaction copies an entry log's live
    /// entries into a new log, syncs it, commits the new locations (index segment, then the
    /// checkpoint mark) and only then deletes the old log; its reads and writes go through the
    /// bulk throttle (`background_write_bytes_per_second`, and never while a journal write or
    /// sync is in flight).
    ///
    /// # Errors
    /// `Io`; `Corrupt` when a record being copied fails its check (the log is kept);
    /// `Closed` (also when the engine is closed during the run, which then stops before its
    /// next step). On error nothing acknowledged is lost and the next run retries.
    /// # Cancellation
    /// Dropping the future does not stop the run; it goes on in the background queue.
    pub async fn collect_garbage(&self, deleted: &[u64]) -> Result<GcRun, Error> {
        self.gc_task(deleted.to_vec(), Compaction::Scheduled).await
    }

    /// Like [`Engine::collect_garbage`] with no deleted ledgers, compacting now every entry log
    /// whose live fraction is below `threshold` (0.0 to 1.0; BookKeeper's forced GC). Deletes
    /// entry logs with no live entry first.
    pub async fn compact_entry_logs(&self, threshold: f64) -> Result<GcRun, Error> {
        self.gc_task(Vec::new(), Compaction::Threshold(threshold))
            .await
    }

    async fn gc_task(&self, deleted: Vec<u64>, compaction: Compaction) -> Result<GcRun, Error> {
        if self.inner.closed.get() {
            return Err(Error::Closed);
        }
        let gc = self.inner.gc.clone();
        let task = glommio::spawn_local_into(
            async move { gc.run(&deleted, compaction).await },
            self.inner.background_tq,
        )
        .map_err(|e| Error::Io {
            op: "spawn garbage collection",
            path: self.inner.cfg.ledger_dir.clone(),
            file_offset_bytes: 0,
            source: stdio::Error::other(e.to_string()),
        })?;
        // Detached: dropping the caller's future does not cut a run short between two steps
        // that belong together; a close makes the run stop at its next step instead.
        task.detach().await.unwrap_or(Err(Error::Closed))
    }

    /// Figures of the index now: live segments, resident bytes (segment headers and top keys
    /// plus the block cache, bounded by `index_cache_bytes_max` plus a few hundred bytes per
    /// segment), block-cache hits and misses, merges, and the damaged segments rebuilt from the
    /// entry logs since open (at open, or in the background after a read found a bad block).
    pub fn index_stats(&self) -> IndexStats {
        self.inner.index.stats()
    }

    /// The index's location of entry `entry` of `ledger` (no read of the entry): for the index
    /// benchmark. Not a stable interface.
    #[doc(hidden)]
    pub async fn index_lookup(
        &self,
        ledger: u64,
        entry: u64,
    ) -> Result<Option<crate::format::Location>, Error> {
        self.inner.index.location(ledger, entry).await
    }

    /// Merges every live index segment into one (dropping deleted ledgers' locations and
    /// overridden ones, as background merges do for runs of segments), then runs the merges
    /// still due; returns how many ran. For tests and tools (BookKeeper's forced compaction of
    /// the location index).
    ///
    /// # Errors
    /// `Io`, `Corrupt`; `Closed`.
    pub async fn merge_index(&self) -> Result<u64, Error> {
        self.inner.index.full_merge_wanted.set(true);
        let mut n = 0;
        while self.inner.merger.merge_once().await? {
            n += 1;
        }
        Ok(n)
    }

    /// Rebuilds now, in the caller's task, every damaged index segment still waiting for its
    /// background rebuild (found by the open or by a read); returns how many. For tests and
    /// tools: the background merger does the same on its own.
    ///
    /// # Errors
    /// `Io`, `Corrupt` (another segment is damaged too); `Closed`.
    pub async fn rebuild_damaged_index(&self) -> Result<u64, Error> {
        let mut n = 0;
        while self.inner.rebuilder.repair().await? {
            n += 1;
        }
        Ok(n)
    }

    /// Garbage-collection figures since open, with the entry logs' size and live bytes now.
    pub fn gc_stats(&self) -> GcStats {
        self.inner.gc.stats()
    }

    /// Reads back every entry the index points to and checks its record (CRC32C, ledger, entry,
    /// length) and that its entry log exists: a consistency check (BookKeeper's
    /// `localconsistencycheck`). Holds the checkpoint lock while it runs.
    ///
    /// # Errors
    /// `Corrupt` naming the first bad or missing record; `Io`.
    pub async fn verify_index(&self) -> Result<IndexCheck, Error> {
        self.inner.gc.verify_index().await
    }

    /// One scrub pass (BookKeeper's scrubber, docs/format/entry-log.md "Scrubbing"): re-reads
    /// every live index segment past the block cache and every entry-log record the index
    /// points to, at most `rate_bytes_per_sec` of entry logs per second (0: unpaced), checking
    /// CRCs and record identity. Holds no lock; one pass at a time. A damaged entry is logged
    /// (warning naming ledger, entry, log and offset), listed in the answer and in
    /// [`Engine::scrub_damaged`] until a recovery add replaces it; its reads answer `Corrupt`
    /// meanwhile. A damaged index segment is handed to the background rebuild. The index is
    /// walked in pieces of at most [`SCRUB_PIECE_LOCATIONS`] locations (a pass's memory does
    /// not grow with the shard's entries).
    ///
    /// # Errors
    /// `Io` or `Corrupt` of the index lookups; `IndexRebuilding` when more than 16 index
    /// segments are damaged; `Closed`.
    pub async fn scrub(&self, rate_bytes_per_sec: u64) -> Result<ScrubPass, Error> {
        self.inner
            .scrubber
            .pass(rate_bytes_per_sec, SCRUB_PIECE_LOCATIONS)
            .await
    }

    /// [`Engine::scrub`] in pieces of at most `piece_locations` index locations (at least 1):
    /// tests and benchmarks of the bound. Same checks and result.
    pub async fn scrub_in_pieces(
        &self,
        rate_bytes_per_sec: u64,
        piece_locations: usize,
    ) -> Result<ScrubPass, Error> {
        self.inner
            .scrubber
            .pass(rate_bytes_per_sec, piece_locations)
            .await
    }

    /// Scrubber figures since open: passes, entries and bytes scanned, damage found, repaired.
    pub fn scrub_stats(&self) -> ScrubStats {
        self.inner.scrubber.stats()
    }

    /// The damaged entries the last scrub pass found, by (ledger, entry).
    pub fn scrub_damaged(&self) -> Vec<DamagedEntry> {
        self.inner.scrubber.damaged()
    }

    /// Resolves when a background checkpoint failed for lack of space (`Error::is_storage_full`)
    /// since the last call resolved. The bookie's disk monitor uses it to turn the bookie
    /// read-only at once instead of at its next measurement (BookKeeper turns a bookie
    /// read-only on `NoWritableLedgerDirException`). One waiter at a time.
    pub async fn wait_for_storage_full(&self) {
        self.inner.marks.storage_full.wait().await
    }

    /// Number of journal fdatasyncs issued since open (group-commit observability).
    pub fn journal_sync_count(&self) -> u64 {
        self.inner.journal.sync_count()
    }

    /// Adds that had to wait for write-cache room since open (see `write_cache_wait_max`).
    pub fn write_cache_waits(&self) -> u64 {
        self.inner.write_cache.waits()
    }

    /// Bytes of entry data in the live write cache (not counting a snapshot a checkpoint is
    /// writing).
    pub fn write_cache_bytes(&self) -> usize {
        self.inner.write_cache.bytes()
    }

    /// Number of ledgers this shard holds state for (adds or fences seen, not yet deleted).
    pub fn ledger_count(&self) -> usize {
        self.inner.ledgers.len()
    }

    /// Records queued for the journal and not yet written, now.
    pub fn journal_queue_len(&self) -> usize {
        self.inner.journal.queue_len()
    }

    /// Bytes of the records queued for the journal and not yet written, now (an add is admitted
    /// while at most `journal_queue_bytes_max` are queued).
    pub fn journal_queue_bytes(&self) -> usize {
        self.inner.journal.queue_bytes()
    }

    /// Entry-log files open for reads now: at most `entry_log_readers_max`, plus the log
    /// being written.
    pub fn entry_log_files_open(&self) -> usize {
        self.inner.entry_logs.open_readers()
    }

    /// Sets the hook the journal writer reports every durable batch and add to (replacing an
    /// earlier one). Without one, the writer reports nothing.
    pub fn set_journal_observer(&self, observer: Rc<dyn JournalObserver>) {
        self.inner.journal.set_observer(observer);
    }
}

/// Hands what the open loaded to the subsystems that own it, and builds their contexts: the
/// facade's handles, the journal writer and the sink that applies its durable batches.
fn assemble<S: Storage + 'static>(
    cfg: Rc<EngineConfig>,
    storage: Rc<S>,
    opened: Opened<S>,
    background_tq: TaskQueueHandle,
) -> (Inner<S>, JournalWriter<S>, DurableSink<S::File>) {
    let Opened {
        journal_cursor,
        reusable_journals,
        mark,
        write_cache,
        ledgers,
        index,
        entry_logs,
        usage,
        tombstones,
        reserve,
    } = opened;
    let closed = Closed::default();
    let journal = Rc::new(Journal::new(
        cfg.journal_dir.clone(),
        journal_cursor,
        background_tq,
        reusable_journals,
    ));
    let throttle = Rc::new(Throttle::new(
        cfg.background_write_bytes_per_second,
        cfg.background_sync_bytes,
    ));
    let read_ahead = Rc::new(ReadAhead::new(
        cfg.read_cache_bytes_max,
        cfg.read_ahead_entries,
        cfg.read_ahead_bytes_max,
    ));
    let journal_files = JournalFiles::new(
        storage.clone(),
        cfg.clone(),
        journal.clone(),
        throttle.clone(),
        closed.clone(),
    );
    let sh = Shared {
        cfg,
        storage,
        closed,
        journal,
        journal_files,
        throttle,
        write_cache: Rc::new(write_cache),
        ledgers: Rc::new(ledgers),
        index: Rc::new(index),
        entry_logs: Rc::new(entry_logs),
        usage: Rc::new(usage),
        read_ahead,
        lac_watchers: Rc::new(LacWatchers::default()),
        marks: Rc::new(MarkKeeper::new(mark)),
    };
    let checkpointer = sh.checkpointer();
    let rebuilder = sh.rebuilder();
    let merger = Rc::new(sh.merger(rebuilder.clone()));
    let gc = Rc::new(sh.gc(checkpointer.clone(), tombstones, reserve));
    let scrubber = Scrubber::new(
        sh.storage.clone(),
        sh.closed.clone(),
        sh.ledgers.clone(),
        sh.index.clone(),
        sh.entry_logs.clone(),
        sh.read_ahead.clone(),
    );
    let writer = sh.writer();
    let sink = sh.sink();
    let inner = Inner {
        cfg: sh.cfg,
        storage: sh.storage,
        closed: sh.closed,
        journal: sh.journal,
        write_cache: sh.write_cache,
        ledgers: sh.ledgers,
        index: sh.index,
        entry_logs: sh.entry_logs,
        read_ahead: sh.read_ahead,
        lac_watchers: sh.lac_watchers,
        throttle: sh.throttle,
        marks: sh.marks,
        checkpointer,
        gc,
        merger,
        rebuilder,
        scrubber,
        background_tq,
        re_adds_in_flight: RefCell::new(HashMap::new()),
    };
    (inner, writer, sink)
}

/// The shared pieces while the engine is assembled: each subsystem context takes the handles
/// it needs from here (and only those).
struct Shared<S: Storage> {
    cfg: Rc<EngineConfig>,
    storage: Rc<S>,
    closed: Closed,
    journal: Rc<Journal<S::File>>,
    journal_files: JournalFiles<S>,
    throttle: Rc<Throttle>,
    write_cache: Rc<WriteCache>,
    ledgers: Rc<Ledgers>,
    index: Rc<Index<S::File>>,
    entry_logs: Rc<EntryLogs<S::File>>,
    usage: Rc<crate::gc::LogUsage>,
    read_ahead: Rc<ReadAhead>,
    lac_watchers: Rc<LacWatchers>,
    marks: Rc<MarkKeeper>,
}

impl<S: Storage + 'static> Shared<S> {
    /// The checkpointer's context.
    fn checkpointer(&self) -> Checkpointer<S> {
        Checkpointer {
            marks: self.marks.clone(),
            storage: self.storage.clone(),
            cfg: self.cfg.clone(),
            closed: self.closed.clone(),
            journal: self.journal.clone(),
            journal_files: self.journal_files.clone(),
            write_cache: self.write_cache.clone(),
            ledgers: self.ledgers.clone(),
            index: self.index.clone(),
            entry_logs: self.entry_logs.clone(),
            read_ahead: self.read_ahead.clone(),
            usage: self.usage.clone(),
            throttle: self.throttle.clone(),
        }
    }

    /// The index rebuilder's context.
    fn rebuilder(&self) -> IndexRebuilder<S> {
        IndexRebuilder {
            index: self.index.clone(),
            storage: self.storage.clone(),
            cfg: self.cfg.clone(),
            closed: self.closed.clone(),
            marks: self.marks.clone(),
            ledgers: self.ledgers.clone(),
            usage: self.usage.clone(),
        }
    }

    /// The index merger's context (it rebuilds damaged segments with `rebuilder` first).
    fn merger(&self, rebuilder: IndexRebuilder<S>) -> IndexMerger<S> {
        IndexMerger {
            index: self.index.clone(),
            storage: self.storage.clone(),
            cfg: self.cfg.clone(),
            closed: self.closed.clone(),
            marks: self.marks.clone(),
            ledgers: self.ledgers.clone(),
            throttle: self.throttle.clone(),
            rebuilder,
        }
    }

    /// Garbage collection's context, owning the tombstones and the space reserve.
    fn gc(
        &self,
        checkpointer: Checkpointer<S>,
        tombstones: crate::tombstones::Tombstones<S::File>,
        reserve: crate::reserve::Reserve,
    ) -> Gc<S> {
        Gc {
            state: GcState::new(),
            tombstones,
            reserve,
            storage: self.storage.clone(),
            cfg: self.cfg.clone(),
            closed: self.closed.clone(),
            marks: self.marks.clone(),
            checkpointer,
            ledgers: self.ledgers.clone(),
            write_cache: self.write_cache.clone(),
            read_ahead: self.read_ahead.clone(),
            lac_watchers: self.lac_watchers.clone(),
            entry_logs: self.entry_logs.clone(),
            index: self.index.clone(),
            usage: self.usage.clone(),
            throttle: self.throttle.clone(),
        }
    }

    /// The journal writer's context.
    fn writer(&self) -> JournalWriter<S> {
        JournalWriter::new(
            self.journal.clone(),
            self.journal_files.clone(),
            self.throttle.clone(),
            self.closed.clone(),
            self.cfg.clone(),
        )
    }

    /// The sink the facade's journal task applies durable batches with.
    fn sink(&self) -> DurableSink<S::File> {
        DurableSink {
            journal: self.journal.clone(),
            ledgers: self.ledgers.clone(),
            write_cache: self.write_cache.clone(),
            lac_watchers: self.lac_watchers.clone(),
            marks: self.marks.clone(),
        }
    }
}

//! Opening an engine: preparing the two directories, the first journal, index and mark of a
//! fresh directory pair, loading the committed index, discarding what a crash left behind, and
//! replaying the journal from the checkpoint mark (BookKeeper's bookie start-up: ledger storage
//! first, then journal replay from `lastMark`).

use std::collections::HashSet;

use crate::checkpoint::{read_mark, write_mark, MARK_FILE};
use crate::entry_log::EntryLogs;
use crate::files::{corrupt, io_err, journal_name, parse_id};
use crate::format::{Mark, FILE_HEADER_BYTES};
use crate::gc::LogUsage;
use crate::index::legacy::INDEX_FILE;
use crate::index::migrate::migrate;
use crate::index::Index;
use crate::io::{Storage, StorageFile};
use crate::journal::files::{create_journal_file, list_journals};
use crate::journal::replay::{find_later_batch, read_journal, replay};
use crate::journal::replay_crash;
use crate::journal::JournalCursor;
use crate::ledgers::{apply_durable, Ledgers};
use crate::reserve::Reserve;
use crate::tombstones::Tombstones;
use crate::write_cache::WriteCache;
use crate::{EngineConfig, Error};

/// What an open loaded and replayed, for the facade to hand to the subsystems that own it.
pub(crate) struct Opened<S: Storage> {
    /// Where the journal continues (replay's end).
    pub journal_cursor: JournalCursor<S::File>,
    /// Checkpointed journal files kept for reuse, ascending.
    pub reusable_journals: Vec<u64>,
    /// The durable checkpoint mark in force.
    pub mark: Mark,
    pub write_cache: WriteCache,
    pub ledgers: Ledgers,
    pub index: Index<S::File>,
    pub entry_logs: EntryLogs<S::File>,
    pub usage: LogUsage,
    pub tombstones: Tombstones<S::File>,
    pub reserve: Reserve,
}

/// Opens the engine's state on `storage`; background tasks are not started yet.
pub(crate) async fn open_state<S: Storage>(
    cfg: &EngineConfig,
    storage: &S,
) -> Result<Opened<S>, Error> {
    let (ledger_names, mut journal_ids) = prepare_dirs(storage, cfg).await?;
    let mark = load_mark(storage, cfg, &ledger_names, &mut journal_ids).await?;

    // Tombstones first: a deleted ledger's index entries and state never come back, also not
    // through a rebuild of a damaged index segment.
    let (tombstones, deleted) = Tombstones::load(storage, &cfg.ledger_dir, &ledger_names).await?;
    let is_deleted = |l: u64| deleted.contains(&l);

    // The space reserve, taken while there is room (on a full disk it keeps what it holds).
    let reserve = Reserve::new(&cfg.ledger_dir, cfg.space_reserve_bytes);
    reserve.take(storage).await?;

    // Index segments and ledger states; a damaged segment is rebuilt from the entry logs.
    let (index, ledgers, mark) = Index::open(
        storage,
        &cfg.ledger_dir,
        &mark,
        cfg.index_cache_bytes_max,
        &is_deleted,
        cfg.entry_size_bytes_max,
    )
    .await?;
    let ledgers = Ledgers::new(ledgers);
    for &ledger in &deleted {
        ledgers.delete(ledger);
    }
    let usage = count_live_bytes(&index, &ledgers, mark.segments.len()).await?;
    let entry_logs = open_entry_logs(storage, cfg, &ledger_names, &usage).await?;
    let write_cache = WriteCache::new(cfg.write_cache_bytes_max, cfg.write_cache_wait_max);
    let reusable_journals = retire_old_journals(storage, cfg, &mut journal_ids, &mark).await?;
    let crash_after = replay_crash::crash_after(storage, cfg, &journal_ids, &mark).await;
    let mut applied = 0u64;
    let journal_cursor = replay(storage, cfg, &journal_ids, &mark, &mut |record| {
        applied += 1;
        if crash_after == Some(applied) {
            quire_faults::abort_at(replay_crash::POINT);
        }
        apply_durable(&ledgers, &write_cache, record)
    })
    .await?;
    Ok(Opened {
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
    })
}

/// Step 1: creates the two directories if missing; returns the ledger directory's file names
/// and the journal file ids (temp files a crash left are removed).
async fn prepare_dirs<S: Storage>(
    storage: &S,
    cfg: &EngineConfig,
) -> Result<(Vec<String>, Vec<u64>), Error> {
    storage.prepare_dir(&cfg.journal_dir).await.map_err(io_err(
        "prepare journal dir",
        &cfg.journal_dir,
        0,
    ))?;
    storage.prepare_dir(&cfg.ledger_dir).await.map_err(io_err(
        "prepare ledger dir",
        &cfg.ledger_dir,
        0,
    ))?;
    let ledger_names = storage.list(&cfg.ledger_dir).await.map_err(io_err(
        "list ledger dir",
        &cfg.ledger_dir,
        0,
    ))?;
    let journal_ids = list_journals(storage, cfg).await?;
    Ok((ledger_names, journal_ids))
}

/// Step 2: the mark in force; a fresh directory pair gets its first journal, index and mark
/// here, and a version 1 mark's legacy `index.qix` is migrated into a segment file first.
async fn load_mark<S: Storage>(
    storage: &S,
    cfg: &EngineConfig,
    ledger_names: &[String],
    journal_ids: &mut Vec<u64>,
) -> Result<Mark, Error> {
    let mark = if ledger_names.iter().any(|n| n == MARK_FILE) {
        read_mark(storage, &cfg.ledger_dir).await?
    } else {
        start_fresh(storage, cfg, ledger_names, journal_ids).await?
    };
    if mark.legacy_index_bytes.is_some() {
        migrate(storage, &cfg.ledger_dir, &mark).await
    } else {
        Ok(mark)
    }
}

/// Step 3: entry-log metadata, the live bytes per log from the index (one pass over the
/// segments, deleted ledgers left out).
///
/// This pass reads every data block: one that fails its check has its segment rebuilt from
/// the entry logs in the background (same states, locations from the logs), and the pass
/// starts over without it and its key range (at most `segments` times); until the rebuild
/// recounts them, garbage collection waits (these figures lack the damaged segment's keys).
async fn count_live_bytes<F: StorageFile>(
    index: &Index<F>,
    ledgers: &Ledgers,
    segments: usize,
) -> Result<LogUsage, Error> {
    let mut rebuilds_left = segments;
    let (usage, deleted_left) = loop {
        let usage = LogUsage::default();
        let mut deleted_left = false;
        let pass = index
            .for_each_location(|ledger, _, loc| {
                if ledgers.is_deleted(ledger) {
                    deleted_left = true;
                } else {
                    usage.add(ledger, loc)
                }
            })
            .await;
        let err = match pass {
            Ok(()) => break (usage, deleted_left),
            Err(e) => e,
        };
        let damaged = match &err {
            Error::Corrupt { path, .. } if rebuilds_left > 0 => index.live_segment_at(path),
            _ => None,
        };
        let Some(id) = damaged else {
            return Err(err);
        };
        rebuilds_left -= 1;
        index.defer_rebuild(id, err.to_string());
    };
    if deleted_left {
        // A crash (or close) came before the merge that drops them: merge everything soon.
        index.full_merge_wanted.set(true);
        index.merge_signal.notify();
    }
    Ok(usage)
}

/// Step 4: opens the entry logs for reads; the next log gets a new id (never append to an old
/// one: it may hold unindexed bytes past its last sync). An index entry into a log that is not
/// there is corruption (garbage collection deletes a log only once no committed index entry
/// points into it).
async fn open_entry_logs<S: Storage>(
    storage: &S,
    cfg: &EngineConfig,
    ledger_names: &[String],
    usage: &LogUsage,
) -> Result<EntryLogs<S::File>, Error> {
    let ids: Vec<u64> = ledger_names
        .iter()
        .filter_map(|n| parse_id(n, "entrylog-", ".qel"))
        .collect();
    let next_entry_log_id = ids.iter().copied().max().unwrap_or(0) + 1;
    let entry_logs = EntryLogs::new(
        cfg.ledger_dir.clone(),
        next_entry_log_id,
        cfg.entry_log_size_bytes_max,
        cfg.entry_log_readers_max,
    );
    for id in ids {
        let path = entry_logs.path(id);
        let f = storage
            .open(&path, false)
            .await
            .map_err(io_err("open entry log", &path, 0))?;
        let size = f.size().await.map_err(io_err("stat entry log", &path, 0))?;
        entry_logs.register_existing(id, size, f);
    }
    let on_disk: HashSet<u64> = entry_logs.sizes().into_iter().map(|(id, _)| id).collect();
    if let Some(missing) = usage
        .referenced_logs()
        .into_iter()
        .find(|id| !on_disk.contains(id))
    {
        return Err(corrupt(
            &entry_logs.path(missing),
            0,
            "the index points into this entry log, which is missing",
        ));
    }
    Ok(entry_logs)
}

/// Step 5: journal files wholly before the mark are checkpointed: the newest are kept for
/// reuse (returned, ascending), the rest (more than a close or crash left to retire) are
/// removed; `journal_ids` keeps the files to replay, which must start with the mark's.
async fn retire_old_journals<S: Storage>(
    storage: &S,
    cfg: &EngineConfig,
    journal_ids: &mut Vec<u64>,
    mark: &Mark,
) -> Result<Vec<u64>, Error> {
    let retired: Vec<u64> = journal_ids
        .iter()
        .copied()
        .filter(|id| *id < mark.journal_file_id)
        .collect();
    let surplus = retired.len().saturating_sub(cfg.journal_reuse_files);
    for id in &retired[..surplus] {
        let p = cfg.journal_dir.join(journal_name(*id));
        storage
            .remove(&p)
            .await
            .map_err(io_err("remove old journal", &p, 0))?;
    }
    let reusable = retired[surplus..].to_vec();
    journal_ids.retain(|id| *id >= mark.journal_file_id);
    if journal_ids.first() != Some(&mark.journal_file_id) {
        return Err(corrupt(
            &cfg.journal_dir.join(journal_name(mark.journal_file_id)),
            mark.journal_offset,
            "journal file named by the checkpoint mark is missing",
        ));
    }
    Ok(reusable)
}

/// Sets up a directory pair that has no mark: the first journal and the first mark (naming no
/// index segment). No mark means no open ever finished, so no add was ever acknowledged: files left by a
/// crash during the first open are discarded, unless a journal holds a batch (then the mark was
/// lost, e.g. a wiped ledger directory, and guessing would be unsafe: `Corrupt`).
async fn start_fresh<S: Storage>(
    storage: &S,
    cfg: &EngineConfig,
    ledger_names: &[String],
    journal_ids: &mut Vec<u64>,
) -> Result<Mark, Error> {
    let mark_path = cfg.ledger_dir.join(MARK_FILE);
    let index_path = cfg.ledger_dir.join(INDEX_FILE);
    for id in std::mem::take(journal_ids) {
        let p = cfg.journal_dir.join(journal_name(id));
        let j = read_journal(storage, &p, id).await?;
        if let Some((at, _)) = find_later_batch(&j.img, &j.salt, FILE_HEADER_BYTES as u64, 0) {
            return Err(corrupt(
                &mark_path,
                0,
                format!(
                    "checkpoint mark is missing but {} holds a batch at byte offset {at}",
                    p.display()
                ),
            ));
        }
        storage.remove(&p).await.map_err(io_err(
            "remove journal of an unfinished first open",
            &p,
            0,
        ))?;
    }
    if ledger_names.iter().any(|n| n == INDEX_FILE) {
        storage.remove(&index_path).await.map_err(io_err(
            "remove index of an unfinished first open",
            &index_path,
            0,
        ))?;
    }
    let path = cfg.journal_dir.join(journal_name(1));
    drop(create_journal_file(storage, cfg, &path, 1, None).await?);
    journal_ids.push(1);
    storage.sync_dir(&cfg.ledger_dir).await.map_err(io_err(
        "sync ledger dir",
        &cfg.ledger_dir,
        0,
    ))?;
    // No index segment yet; segment files an unfinished first open left are removed when the
    // index opens (the mark names none).
    let m = Mark {
        journal_file_id: 1,
        journal_offset: FILE_HEADER_BYTES as u64,
        next_seq: 1,
        legacy_index_bytes: None,
        segments: Vec::new(),
        summaries: Default::default(),
    };
    write_mark(storage, &cfg.ledger_dir, &m).await?;
    Ok(m)
}

//! Journal files: creation pre-written with zeros (temp name, sync, rename: BookKeeper's journal
//! pre-allocation), reuse of a fully checkpointed file under the next id (BookKeeper's
//! `journalReuseFiles`), the background pre-creation of the next file, listing on open, and
//! retiring files wholly before the checkpoint mark: kept for reuse up to
//! `journal_reuse_files`, removed beyond (BookKeeper's journal garbage collection after a
//! checkpoint).

use std::io as stdio;
use std::path::Path;
use std::rc::Rc;

use super::{Journal, NewJournalFile};
use crate::files::{io_err, journal_name, parse_id};
use crate::format::{encode_journal_header, round_up_block, JournalSalt, FILE_HEADER_BYTES};
use crate::io::{Storage, StorageFile};
use crate::sync::Closed;
use crate::throttle::{bulk_write, Throttle};
use crate::{EngineConfig, Error};

/// Bytes of zeros written per request while pre-writing a journal file.
const ZERO_CHUNK_BYTES: usize = 1 << 20;

/// A fresh random salt for one use of a journal file (docs/format/journal.md §Header).
///
/// # Errors
/// `Io` if the operating system's random source fails (`getrandom(2)`).
fn new_salt(path: &Path) -> Result<u64, Error> {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b).map_err(|e| {
        io_err("journal salt from getrandom", path, 0)(stdio::Error::other(e.to_string()))
    })?;
    Ok(u64::from_le_bytes(b))
}

/// Creates a journal file pre-written with zeros, under a new salt: written as `<name>.tmp`,
/// synced, then renamed, so a crash never leaves a half-written file under a journal name.
pub(crate) async fn create_journal_file<S: Storage>(
    storage: &S,
    cfg: &EngineConfig,
    path: &Path,
    id: u64,
    throttle: Option<&Throttle>,
) -> Result<NewJournalFile<S::File>, Error> {
    let tmp = path.with_extension("qj.tmp");
    match storage.remove(&tmp).await {
        Ok(()) => {}
        Err(e) if e.kind() == stdio::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("remove stale journal temp file", &tmp, 0)(e)),
    }
    let f = storage
        .open(&tmp, true)
        .await
        .map_err(io_err("create journal", &tmp, 0))?;
    let size = round_up_block(cfg.journal_file_size_bytes);
    let salt = new_salt(path)?;
    let filled: Result<(), Error> = async {
        let header = encode_journal_header(id, salt);
        f.write_at(0, &header)
            .await
            .map_err(io_err("journal header write", &tmp, 0))?;
        let zeros = vec![0u8; ZERO_CHUNK_BYTES];
        let mut pos = FILE_HEADER_BYTES as u64;
        while pos < size {
            let n = ((size - pos) as usize).min(ZERO_CHUNK_BYTES);
            bulk_write(&f, pos, &zeros[..n], throttle)
                .await
                .map_err(|(at, e)| io_err("journal pre-write zeros", &tmp, at)(e))?;
            pos += n as u64;
        }
        f.fdatasync()
            .await
            .map_err(io_err("journal fdatasync", &tmp, 0))
    }
    .await;
    // On failure the closure (and with it the file) is dropped before the removal.
    let file = publish(storage, cfg, &tmp, path, filled.map(|()| f)).await?;
    Ok(NewJournalFile {
        file,
        salt: JournalSalt::stamped(salt),
    })
}

/// Gives a prepared temp journal file its name: renames `tmp` to `path` and syncs the journal
/// directory. If `prepared` failed, removes `tmp` instead (a half-written temp file would keep
/// the space it got, typically the last free space of a full disk, which checkpoints then lack)
/// and returns the error.
async fn publish<S: Storage>(
    storage: &S,
    cfg: &EngineConfig,
    tmp: &Path,
    path: &Path,
    prepared: Result<S::File, Error>,
) -> Result<S::File, Error> {
    let f = match prepared {
        Ok(f) => f,
        Err(e) => {
            if let Err(re) = storage.remove(tmp).await {
                tracing::warn!(
                    "removing {} after a failed preparation: {re}",
                    tmp.display()
                );
            }
            return Err(e);
        }
    };
    storage
        .rename(tmp, path)
        .await
        .map_err(io_err("journal rename", path, 0))?;
    storage.sync_dir(&cfg.journal_dir).await.map_err(io_err(
        "sync journal dir",
        &cfg.journal_dir,
        0,
    ))?;
    Ok(f)
}

/// Turns the checkpointed journal file `old_id` into journal file `id`: renamed to
/// `<id>.qj.tmp`, its header rewritten for `id` with a new salt and synced, renamed to its final
/// name, the directory synced. Its old bytes stay: sealed with another salt (or none), they
/// decode as no record of the new use, so replay reads them as the end of the file
/// (docs/format/journal.md §Reuse, §Recovery).
/// A crash at any step leaves either the old name (still a retired file, below the mark, maybe
/// already with the new header, which only a first open without a mark would read) or the temp
/// name (deleted at open), never a final name with a foreign header.
///
/// # Errors
/// `Io` from any step; `NotFound` if `old_id` is gone, `InvalidData` if its size is not the
/// configured journal file size (a file a giant batch grew, or one from another setting); the
/// temp file is then removed.
async fn reuse_journal_file<S: Storage>(
    storage: &S,
    cfg: &EngineConfig,
    old_id: u64,
    path: &Path,
    id: u64,
) -> Result<NewJournalFile<S::File>, Error> {
    let old = cfg.journal_dir.join(journal_name(old_id));
    let tmp = path.with_extension("qj.tmp");
    let salt = new_salt(path)?;
    storage
        .rename(&old, &tmp)
        .await
        .map_err(io_err("rename journal for reuse", &old, 0))?;
    let prepared: Result<S::File, Error> = async {
        let f =
            storage
                .open(&tmp, false)
                .await
                .map_err(io_err("open journal for reuse", &tmp, 0))?;
        let size = f.size().await.map_err(io_err("stat journal", &tmp, 0))?;
        let want = round_up_block(cfg.journal_file_size_bytes);
        if size != want {
            return Err(io_err("reuse journal", &tmp, 0)(stdio::Error::new(
                stdio::ErrorKind::InvalidData,
                format!("file has {size} bytes, journal files have {want}"),
            )));
        }
        f.write_at(0, &encode_journal_header(id, salt))
            .await
            .map_err(io_err("journal header write", &tmp, 0))?;
        f.fdatasync()
            .await
            .map_err(io_err("journal fdatasync", &tmp, 0))?;
        Ok(f)
    }
    .await;
    let file = publish(storage, cfg, &tmp, path, prepared).await?;
    Ok(NewJournalFile {
        file,
        salt: JournalSalt::stamped(salt),
    })
}

/// The running engine's handle on its journal files: rolls (reuse or creation, pre-created in
/// the background) and retirement after a checkpoint. Owns nothing but shared handles; the
/// journal writer and the checkpointer each hold one.
pub(crate) struct JournalFiles<S: Storage> {
    storage: Rc<S>,
    cfg: Rc<EngineConfig>,
    journal: Rc<Journal<S::File>>,
    /// Bulk-write pacing of file creation (pre-writing zeros).
    throttle: Rc<Throttle>,
    closed: Closed,
}

impl<S: Storage> Clone for JournalFiles<S> {
    fn clone(&self) -> Self {
        Self {
            storage: self.storage.clone(),
            cfg: self.cfg.clone(),
            journal: self.journal.clone(),
            throttle: self.throttle.clone(),
            closed: self.closed.clone(),
        }
    }
}

impl<S: Storage + 'static> JournalFiles<S> {
    /// The journal files of `journal` on `storage` (directory and sizes from `cfg`).
    pub fn new(
        storage: Rc<S>,
        cfg: Rc<EngineConfig>,
        journal: Rc<Journal<S::File>>,
        throttle: Rc<Throttle>,
        closed: Closed,
    ) -> Self {
        Self {
            storage,
            cfg,
            journal,
            throttle,
            closed,
        }
    }

    /// Creates journal file `id` for the running engine: a reused checkpointed file when one
    /// is kept, else a new one pre-written with zeros (throttled like every bulk write).
    async fn create_for_roll(&self, id: u64) -> Result<NewJournalFile<S::File>, Error> {
        let path = self.journal.path(id);
        loop {
            // Taken out synchronously: from here on this file is ours alone.
            let Some(old_id) = self.journal.reusable.borrow_mut().pop_front() else {
                break;
            };
            match reuse_journal_file(&*self.storage, &self.cfg, old_id, &path, id).await {
                Ok(f) => {
                    tracing::debug!("journal {id} reuses checkpointed journal {old_id}");
                    return Ok(f);
                }
                Err(e) => tracing::warn!("cannot reuse journal {old_id} as journal {id}: {e}"),
            }
        }
        create_journal_file(&*self.storage, &self.cfg, &path, id, Some(&self.throttle)).await
    }

    /// Starts creating journal file `id` on the background queue unless that is under way.
    pub fn start_precreate(&self, id: u64) {
        let journal = &self.journal;
        if journal
            .precreate
            .borrow()
            .as_ref()
            .is_some_and(|(pid, _)| *pid == id)
            || self.closed.get()
        {
            return;
        }
        let files = self.clone();
        match glommio::spawn_local_into(
            async move { files.create_for_roll(id).await },
            journal.background_tq,
        ) {
            Ok(task) => *journal.precreate.borrow_mut() = Some((id, task)),
            Err(e) => tracing::warn!("cannot start the background creation of journal {id}: {e}"),
        }
    }

    /// The journal file `id` for a roll: the pre-created one when it was started (waiting for
    /// it if it is still being written), else created here.
    pub async fn next_journal_file(&self, id: u64) -> Result<NewJournalFile<S::File>, Error> {
        let pre = self.journal.precreate.borrow_mut().take();
        if let Some((pid, task)) = pre {
            if pid == id {
                match task.await {
                    Ok(f) => return Ok(f),
                    Err(e) => tracing::warn!(
                        "background creation of journal {id} failed, creating it now: {e}"
                    ),
                }
            }
        }
        self.create_for_roll(id).await
    }

    /// Retires the journal files `from..to` (wholly before the new checkpoint mark's file
    /// `to`; `from` is the previous mark's file): they join the files kept for reuse, and the
    /// oldest kept ones beyond `journal_reuse_files` are deleted. Failures are logged, not
    /// returned: the files are only garbage now (a file left behind is deleted at the next
    /// open).
    pub async fn retire(&self, from: u64, to: u64) {
        let surplus: Vec<u64> = {
            let mut kept = self.journal.reusable.borrow_mut();
            kept.extend(from..to);
            let n = kept.len().saturating_sub(self.cfg.journal_reuse_files);
            kept.drain(..n).collect()
        };
        remove_journals(&*self.storage, &self.cfg.journal_dir, &surplus).await;
    }
}

/// The ids of the journal files in `cfg.journal_dir`, ascending; temp files a crash left
/// behind are removed.
pub(crate) async fn list_journals<S: Storage>(
    storage: &S,
    cfg: &EngineConfig,
) -> Result<Vec<u64>, Error> {
    let names = storage.list(&cfg.journal_dir).await.map_err(io_err(
        "list journal dir",
        &cfg.journal_dir,
        0,
    ))?;
    let mut ids = Vec::new();
    for name in names {
        if name.ends_with(".qj.tmp") {
            let p = cfg.journal_dir.join(&name);
            storage
                .remove(&p)
                .await
                .map_err(io_err("remove journal temp file", &p, 0))?;
        } else if let Some(id) = parse_id(&name, "journal-", ".qj") {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Deletes the journal files `ids`, logging failures.
pub(crate) async fn remove_journals<S: Storage>(storage: &S, journal_dir: &Path, ids: &[u64]) {
    for &id in ids {
        let path = journal_dir.join(journal_name(id));
        match storage.remove(&path).await {
            Ok(()) => {}
            Err(e) if e.kind() == stdio::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("removing {} failed: {e}", path.display()),
        }
    }
}

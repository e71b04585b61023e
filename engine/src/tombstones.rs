//! Tombstones: the durable list of ledgers this shard deleted (`deleted-ledgers.qdl`,
//! docs/format/tombstones.md). A deletion is durable once its tombstone group is synced; every
//! open applies the tombstones after loading the index, so a deleted ledger's index entries and
//! state never come back, and its adds and fences are refused for good (BookKeeper's failure
//! mode of a fenced-then-deleted ledger written again, bookkeeper.md §failure modes 14).

use std::cell::RefCell;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::files::{check_header, corrupt, io_err};
use crate::format::{
    decode_tombstone_group, encode_file_header, encode_tombstone_group, TombstoneDecode,
    FILE_HEADER_BYTES, TOMBSTONE_MAGIC,
};
use crate::io::{Storage, StorageFile, BLOCK_BYTES};
use crate::Error;

/// Name of the tombstone file in the ledger directory.
pub(crate) const TOMBSTONE_FILE: &str = "deleted-ledgers.qdl";
const TOMBSTONE_TMP_FILE: &str = "deleted-ledgers.qdl.tmp";

/// The tombstone file: where the next group goes (`None` until the file exists).
pub(crate) struct Tombstones<F> {
    dir: PathBuf,
    /// The file and its end; appends are serialised by the caller (the GC lock).
    file: RefCell<Option<(Rc<F>, u64)>>,
}

impl<F: StorageFile> Tombstones<F> {
    /// Reads the tombstones of `dir`. A torn last group (a deletion that never returned) is
    /// dropped and zeroed; a leftover temp file of an unfinished first deletion is removed.
    ///
    /// # Errors
    /// `Corrupt` for a bad header, or a bad group followed by a valid one; `Io`.
    pub async fn load<S: Storage<File = F>>(
        storage: &S,
        dir: &Path,
        names: &[String],
    ) -> Result<(Self, HashSet<u64>), Error> {
        let path = dir.join(TOMBSTONE_FILE);
        if names.iter().any(|n| n == TOMBSTONE_TMP_FILE) {
            let tmp = dir.join(TOMBSTONE_TMP_FILE);
            storage.remove(&tmp).await.map_err(io_err(
                "remove unfinished tombstone file",
                &tmp,
                0,
            ))?;
        }
        let mut deleted = HashSet::new();
        if !names.iter().any(|n| n == TOMBSTONE_FILE) {
            return Ok((
                Self {
                    dir: dir.to_path_buf(),
                    file: RefCell::new(None),
                },
                deleted,
            ));
        }
        let f = storage
            .open(&path, false)
            .await
            .map_err(io_err("open tombstones", &path, 0))?;
        let size = f
            .size()
            .await
            .map_err(io_err("stat tombstones", &path, 0))?;
        let img = f
            .read_at(0, size as usize)
            .await
            .map_err(io_err("read tombstones", &path, 0))?;
        check_header(&path, TOMBSTONE_MAGIC, &img, 0)?;
        let mut at = FILE_HEADER_BYTES;
        let end = loop {
            if at >= img.len() {
                break at;
            }
            match decode_tombstone_group(&img[at..]) {
                TombstoneDecode::Ok { ids, padded_bytes } => {
                    deleted.extend(ids);
                    at += padded_bytes;
                }
                TombstoneDecode::Zeros => break at,
                TombstoneDecode::Bad(reason) => {
                    // A torn last group was never acknowledged; anything valid after it was.
                    let mut later = at + BLOCK_BYTES;
                    while later < img.len() {
                        if let TombstoneDecode::Ok { .. } = decode_tombstone_group(&img[later..]) {
                            return Err(corrupt(
                                &path,
                                at as u64,
                                format!("{reason}; a valid tombstone group follows at {later}"),
                            ));
                        }
                        later += BLOCK_BYTES;
                    }
                    tracing::warn!(
                        "{}: dropping torn tombstone group at byte offset {at}: {reason}",
                        path.display()
                    );
                    break at;
                }
            }
        };
        let tail_end = img
            .iter()
            .rposition(|&b| b != 0)
            .map_or(0, |p| crate::format::round_up_block(p as u64 + 1) as usize);
        if tail_end > end {
            f.write_at(end as u64, &vec![0u8; tail_end - end])
                .await
                .map_err(io_err("zero torn tombstone group", &path, end as u64))?;
            f.fdatasync()
                .await
                .map_err(io_err("tombstones fdatasync", &path, end as u64))?;
        }
        Ok((
            Self {
                dir: dir.to_path_buf(),
                file: RefCell::new(Some((Rc::new(f), end as u64))),
            },
            deleted,
        ))
    }

    /// Makes tombstones for `ids` durable. The first deletion creates the file whole (header
    /// and group in a temp file, synced, renamed, directory synced); later ones append a group
    /// and sync it.
    pub async fn append<S: Storage<File = F>>(
        &self,
        storage: &S,
        ids: &[u64],
    ) -> Result<(), Error> {
        if ids.is_empty() {
            return Ok(());
        }
        let group = encode_tombstone_group(ids);
        let path = self.dir.join(TOMBSTONE_FILE);
        let current = self.file.borrow().clone();
        match current {
            Some((f, end)) => {
                f.write_at(end, &group)
                    .await
                    .map_err(io_err("tombstones write", &path, end))?;
                f.fdatasync()
                    .await
                    .map_err(io_err("tombstones fdatasync", &path, end))?;
                *self.file.borrow_mut() = Some((f, end + group.len() as u64));
            }
            None => {
                let tmp = self.dir.join(TOMBSTONE_TMP_FILE);
                let f =
                    storage
                        .open(&tmp, true)
                        .await
                        .map_err(io_err("create tombstones", &tmp, 0))?;
                let mut b = encode_file_header(TOMBSTONE_MAGIC, 0);
                b.extend_from_slice(&group);
                f.write_at(0, &b)
                    .await
                    .map_err(io_err("tombstones write", &tmp, 0))?;
                f.fdatasync()
                    .await
                    .map_err(io_err("tombstones fdatasync", &tmp, 0))?;
                storage
                    .rename(&tmp, &path)
                    .await
                    .map_err(io_err("tombstones rename", &path, 0))?;
                storage.sync_dir(&self.dir).await.map_err(io_err(
                    "sync ledger dir",
                    &self.dir,
                    0,
                ))?;
                *self.file.borrow_mut() = Some((Rc::new(f), b.len() as u64));
            }
        }
        Ok(())
    }
}

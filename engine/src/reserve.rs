//! The space reserve (`space-reserve.qrs`, docs/format/tombstones.md, "Space reserve"): a file
//! of zeros written in the ledger directory while there is room, that garbage collection gives
//! back when one of its own writes finds the disk full. The work that frees space (a tombstone
//! group, a checkpoint mark, a compaction's index segment) needs a few blocks of its own before
//! it can delete anything; on a disk that entry logs filled to 100 % those blocks exist only
//! because the reserve kept them (BookKeeper's trap #1316, where a full bookie could not run the
//! GC that would have emptied it; BookKeeper keeps room for index files and replay with
//! `minUsableSizeForIndexFileCreation` and `minUsableSizeForHighPriorityWrites`).
//!
//! The reserve is written with zeros, not fallocated, so its blocks are really allocated and
//! deleting it really frees them. It is taken again after every GC run, as far as there is room
//! (a partial reserve is kept: whatever it holds is given back next time).

use std::cell::Cell;
use std::path::PathBuf;

use crate::files::io_err;
use crate::io::{Storage, StorageFile, BLOCK_BYTES};
use crate::Error;

/// Name of the reserve file in the ledger directory.
pub(crate) const RESERVE_FILE: &str = "space-reserve.qrs";

/// Bytes of zeros written per request while taking the reserve.
const WRITE_BYTES: usize = 256 << 10;

/// The reserve of one ledger directory: how much it holds now.
pub(crate) struct Reserve {
    path: PathBuf,
    /// The size to keep, rounded down to whole blocks; 0 turns the reserve off.
    bytes_max: u64,
    /// Bytes the reserve file holds now (as far as this engine knows).
    held: Cell<u64>,
}

impl Reserve {
    pub fn new(ledger_dir: &std::path::Path, bytes_max: u64) -> Self {
        Self {
            path: ledger_dir.join(RESERVE_FILE),
            bytes_max: bytes_max - bytes_max % BLOCK_BYTES as u64,
            held: Cell::new(0),
        }
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.held.get()
    }

    /// Writes the reserve up to its size with zeros and syncs it, as far as there is room. A full
    /// disk is not an error: what was written is kept and the shortfall logged.
    ///
    /// # Errors
    /// `Io` other than a full disk.
    pub async fn take<S: Storage>(&self, storage: &S) -> Result<(), Error> {
        if self.bytes_max == 0 {
            return Ok(());
        }
        let f = storage.open(&self.path, true).await.map_err(io_err(
            "create space reserve",
            &self.path,
            0,
        ))?;
        let size = f
            .size()
            .await
            .map_err(io_err("stat space reserve", &self.path, 0))?;
        let mut at = size - size % BLOCK_BYTES as u64;
        self.held.set(at);
        if at >= self.bytes_max {
            // Closed now, not in the background: `release` must free the blocks at once.
            f.close().await;
            return Ok(());
        }
        let zeros = vec![0u8; WRITE_BYTES];
        let mut result = Ok(());
        while at < self.bytes_max {
            let n = (self.bytes_max - at).min(WRITE_BYTES as u64) as usize;
            if let Err(e) = f.write_at(at, &zeros[..n]).await {
                result = Err(io_err("space reserve write", &self.path, at)(e));
                break;
            }
            at += n as u64;
        }
        if let Err(e) = f.fdatasync().await {
            result = result.and(Err(io_err("space reserve fdatasync", &self.path, at)(e)));
        }
        let now = f.size().await.unwrap_or(at);
        f.close().await;
        self.held.set(now - now % BLOCK_BYTES as u64);
        match result {
            Err(e) if e.is_storage_full() => {
                tracing::warn!(
                    "{}: disk full, the space reserve holds {} of {} bytes",
                    self.path.display(),
                    self.held.get(),
                    self.bytes_max
                );
                Ok(())
            }
            r => r,
        }
    }

    /// Gives the reserve back to the filesystem (removes the file, syncs the directory).
    /// Returns whether it held anything.
    ///
    /// # Errors
    /// `Io`.
    pub async fn release<S: Storage>(&self, storage: &S) -> Result<bool, Error> {
        let held = self.held.get();
        if held == 0 {
            return Ok(false);
        }
        match storage.remove(&self.path).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove space reserve", &self.path, 0)(e)),
        }
        self.held.set(0);
        let dir = self.path.parent().unwrap_or(std::path::Path::new("."));
        storage
            .sync_dir(dir)
            .await
            .map_err(io_err("sync ledger dir", dir, 0))?;
        tracing::warn!(
            "{}: disk full, gave back the {held}-byte space reserve for garbage collection",
            self.path.display()
        );
        Ok(true)
    }
}

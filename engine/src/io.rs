//! The one narrow seam between the engine and the disk.
//!
//! Every byte the engine reads or writes goes through [`Storage`] and [`StorageFile`]. The real
//! implementation, [`DmaStorage`], uses glommio `DmaFile`s (O_DIRECT, io_uring); the
//! crash-simulating one, `sim_disk::SimStorage` (drops unsynced writes, tears the last one;
//! built only with the test feature `sim-disk`), stands in for it in tests. No other module of this crate touches `std::fs` or glommio
//! files.
//!
//! All writes are 4 KiB aligned in position and length ([`BLOCK_BYTES`]): that is what O_DIRECT
//! needs, and it keeps the unit of torn writes we reason about in the format docs one block.

use std::io;
use std::path::{Path, PathBuf};

use glommio::io::{DmaFile, OpenOptions};

/// The alignment of every write position and length, in bytes.
pub const BLOCK_BYTES: usize = 4096;
const _: () = assert!(BLOCK_BYTES.is_power_of_two());

/// Largest single I/O request issued to glommio, in bytes; bigger reads and writes are split.
/// Bounded so that one request never needs more DMA memory than a test executor owns.
const IO_CHUNK_BYTES_MAX: usize = 256 * 1024;

/// One open file. Shard-local.
// Native `async fn` in a trait: the engine is shard-local and generic over the storage, so the
// missing `Send` bound on the returned futures is intended.
#[allow(async_fn_in_trait)]
pub trait StorageFile {
    /// Reads up to `len` bytes at `pos` (any alignment). Returns fewer bytes only at end of file.
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>>;
    /// Writes `data` at `pos`. `pos` and `data.len()` must be multiples of [`BLOCK_BYTES`].
    /// Not durable until [`StorageFile::fdatasync`] resolves.
    async fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<()>;
    /// Makes every completed write to this file durable (fdatasync(2)).
    async fn fdatasync(&self) -> io::Result<()>;
    /// Writes `data` at `pos` (alignment as [`StorageFile::write_at`]) and returns once it is
    /// durable, with everything written to this file before: the same guarantee as `write_at`
    /// followed by `fdatasync`, which is what this default does. A crash during the call may
    /// leave any prefix of blocks of `data` written, as with that pair.
    async fn write_durable_at(&self, pos: u64, data: &[u8]) -> io::Result<()> {
        self.write_at(pos, data).await?;
        self.fdatasync().await
    }
    /// Current file size in bytes.
    async fn size(&self) -> io::Result<u64>;
    /// Closes the file now. Dropping it closes it too, but later (glommio closes a dropped
    /// file in the background): a removed file's blocks are freed only at its last close, so
    /// whoever removes a file to free space closes it first.
    async fn close(self)
    where
        Self: Sized,
    {
    }
}

/// A directory tree of files. Shard-local.
#[allow(async_fn_in_trait)]
pub trait Storage {
    type File: StorageFile;
    /// Opens `path` for reading and writing; creates it (empty) if `create` and it is missing.
    async fn open(&self, path: &Path, create: bool) -> io::Result<Self::File>;
    /// Names (not paths) of the regular files in `dir`.
    async fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    async fn remove(&self, path: &Path) -> io::Result<()>;
    /// Atomically renames `from` to `to` (rename(2)); durable after [`Storage::sync_dir`].
    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes creations, renames and removals in `dir` durable.
    async fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Creates `dir` and its parents if missing, and readies it for I/O (see [`DmaStorage`]).
    async fn prepare_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The real storage: glommio DMA files (O_DIRECT through io_uring). Must be used from inside a
/// glommio executor. Shard-local.
#[derive(Debug, Default, Clone, Copy)]
pub struct DmaStorage;

/// Name of the small non-empty file [`DmaStorage::prepare_dir`] opens in every directory.
pub const PROBE_FILE_NAME: &str = "io-probe";

impl Storage for DmaStorage {
    type File = DmaStorageFile;

    async fn open(&self, path: &Path, create: bool) -> io::Result<DmaStorageFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .dma_open(path)
            .await?;
        Ok(DmaStorageFile { file })
    }

    async fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for item in std::fs::read_dir(dir)? {
            let item = item?;
            if item.file_type()?.is_file() {
                if let Some(name) = item.file_name().to_str() {
                    names.push(name.to_owned());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    async fn remove(&self, path: &Path) -> io::Result<()> {
        glommio::io::remove(path).await.map_err(Into::into)
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        glommio::io::rename(from, to).await.map_err(Into::into)
    }

    async fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let d = glommio::io::Directory::open(dir).await?;
        d.sync().await?;
        d.close().await?;
        Ok(())
    }

    /// Creates the directory and then opens a small non-empty probe file in it with
    /// `DmaFile::open`. glommio probes io_uring poll support with a read on the first DMA file it
    /// opens on a device; on an empty file that read "succeeds" and the device is wrongly marked
    /// pollable, after which every read fails with EOPNOTSUPP (reference/infra.md §3). A non-empty
    /// probe file makes the probe fail correctly.
    async fn prepare_dir(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let probe: PathBuf = dir.join(PROBE_FILE_NAME);
        let len = std::fs::metadata(&probe).map(|m| m.len()).unwrap_or(0);
        if len < BLOCK_BYTES as u64 {
            std::fs::write(&probe, vec![0x51u8; BLOCK_BYTES])?;
        }
        let f = DmaFile::open(&probe).await?;
        f.close().await?;
        Ok(())
    }
}

/// A glommio `DmaFile` behind [`StorageFile`].
#[derive(Debug)]
pub struct DmaStorageFile {
    file: DmaFile,
}

impl StorageFile for DmaStorageFile {
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let want = (len - out.len()).min(IO_CHUNK_BYTES_MAX);
            let got = self.file.read_at(pos + out.len() as u64, want).await?;
            let n = got.len();
            out.extend_from_slice(&got[..n]);
            if n < want {
                break;
            }
        }
        Ok(out)
    }

    async fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<()> {
        self.write_chunks(pos, data, false).await
    }

    async fn fdatasync(&self) -> io::Result<()> {
        self.file.fdatasync().await.map_err(Into::into)
    }

    /// Each chunk is written with `RWF_DSYNC` (the vendored glommio's `write_at_dsync`): ext4
    /// completes such an O_DIRECT write only after flushing the device's write cache, so a
    /// completed chunk is durable together with every write to the file completed before it,
    /// as after `fdatasync`. It saves the second request and the io-wq worker wake-up that
    /// io_uring spends on every `fdatasync`.
    async fn write_durable_at(&self, pos: u64, data: &[u8]) -> io::Result<()> {
        self.write_chunks(pos, data, true).await
    }

    async fn size(&self) -> io::Result<u64> {
        self.file.file_size().await.map_err(Into::into)
    }

    async fn close(self) {
        if let Err(e) = self.file.close().await {
            tracing::warn!("closing a file: {e}");
        }
    }
}

impl DmaStorageFile {
    /// Writes `data` at `pos` in chunks of at most [`IO_CHUNK_BYTES_MAX`], each with
    /// `RWF_DSYNC` when `dsync`.
    async fn write_chunks(&self, pos: u64, data: &[u8], dsync: bool) -> io::Result<()> {
        assert!(
            pos & (BLOCK_BYTES as u64 - 1) == 0,
            "write position {pos} not block aligned"
        );
        assert!(
            data.len() & (BLOCK_BYTES - 1) == 0,
            "write length {} not block aligned",
            data.len()
        );
        let mut done = 0usize;
        while done < data.len() {
            let n = (data.len() - done).min(IO_CHUNK_BYTES_MAX);
            let mut buf = self.file.alloc_dma_buffer(n);
            buf.as_bytes_mut().copy_from_slice(&data[done..done + n]);
            let at = pos + done as u64;
            let written = if dsync {
                self.file.write_at_dsync(buf, at).await?
            } else {
                self.file.write_at(buf, at).await?
            };
            if written != n {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("short O_DIRECT write: {written} of {n} bytes"),
                ));
            }
            done += n;
        }
        Ok(())
    }
}

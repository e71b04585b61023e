//! The one narrow seam between the engine and the disk.
//!
//! Every byte the engine reads or writes goes through [`Storage`] and [`StorageFile`]. The real
//! implementation, [`DmaStorage`], uses glommio `DmaFile`s (O_DIRECT, io_uring). A crash-simulating
//! disk (drops unsynced writes, tears the last one) can implement the same traits later and stand
//! in for it in tests. No other module of this crate touches `std::fs` or glommio files.
//!
//! All writes are 4 KiB aligned in position and length ([`BLOCK_BYTES`]): that is what O_DIRECT
//! needs, and it keeps the unit of torn writes we reason about in the format docs one block.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::io;
use std::path::{Path, PathBuf};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use glommio::io::{DmaFile, OpenOptions};
use glommio::timer::Timer;

/// The alignment of every write position and length, in bytes.
pub const BLOCK_BYTES: usize = 4096;
const _: () = assert!(BLOCK_BYTES.is_power_of_two());

/// Largest single I/O request issued to glommio, in bytes; bigger reads and writes are split.
/// Bounded so that one request never needs more DMA memory than a test executor owns.
const IO_CHUNK_BYTES_MAX: usize = 256 * 1024;

/// How often a disk I/O still in flight is polled again even though glommio has not woken its
/// task. See [`repolled`].
pub const IO_REPOLL_INTERVAL: Duration = Duration::from_millis(1);

thread_local! {
    static MISSED_IO_WAKEUPS: Cell<u64> = const { Cell::new(0) };
}

/// Disk I/Os on this thread (shard) that had completed without waking their task and were found
/// complete only by the [`IO_REPOLL_INTERVAL`] re-poll. Counted since the thread started.
pub fn missed_io_wakeups() -> u64 {
    MISSED_IO_WAKEUPS.with(Cell::get)
}

/// A waker that notes that it was woken, then wakes the task.
struct NoteWake {
    woken: Arc<AtomicBool>,
    task: Waker,
}

impl Wake for NoteWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Relaxed);
        self.task.wake_by_ref();
    }
}

/// Runs a glommio disk I/O future, polling it again every [`IO_REPOLL_INTERVAL`] while it is
/// pending, and counts the times it was found complete without having woken its task
/// ([`missed_io_wakeups`]).
///
/// Why: with glommio 0.9 on Linux 6.18, a bookie shard under heavy load sometimes slept through
/// the completion of a journal write: the write had finished, but its task was not woken until
/// some unrelated wake-up re-polled it. Journal writes then "took" exactly as long as the next
/// timer of the shard (2.000 s in a diagnostic run whose only other timer was 2 s), and twice the
/// shard never woke again: its adds stopped, the ledger client's requests timed out and the
/// proxy changed ensembles away from it. The re-poll bounds such a miss to one interval; when
/// nothing is missed it costs one timer per I/O still in flight after its first poll.
async fn repolled<F: Future>(io: F) -> F::Output {
    let mut io = pin!(io);
    let woken = Arc::new(AtomicBool::new(false));
    let mut tick: Option<Timer> = None;
    let mut ticked = false;
    poll_fn(|cx: &mut Context<'_>| {
        let woken_by_io = woken.swap(false, Ordering::Relaxed);
        let waker = Waker::from(Arc::new(NoteWake {
            woken: woken.clone(),
            task: cx.waker().clone(),
        }));
        if let Poll::Ready(v) = io.as_mut().poll(&mut Context::from_waker(&waker)) {
            if ticked && !woken_by_io {
                let n = MISSED_IO_WAKEUPS.with(|c| {
                    c.set(c.get() + 1);
                    c.get()
                });
                if n.is_power_of_two() {
                    tracing::warn!(
                        missed = n,
                        "a disk I/O completed without waking its task; found by the re-poll"
                    );
                }
            }
            return Poll::Ready(v);
        }
        let timer = tick.get_or_insert_with(|| Timer::new(IO_REPOLL_INTERVAL));
        if Pin::new(&mut *timer).poll(cx).is_ready() {
            ticked = true;
            *timer = Timer::new(IO_REPOLL_INTERVAL);
            let _ = Pin::new(timer).poll(cx);
        }
        Poll::Pending
    })
    .await
}

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
    /// Current file size in bytes.
    async fn size(&self) -> io::Result<u64>;
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
            let got = repolled(self.file.read_at(pos + out.len() as u64, want)).await?;
            let n = got.len();
            out.extend_from_slice(&got[..n]);
            if n < want {
                break;
            }
        }
        Ok(out)
    }

    async fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<()> {
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
            let written = repolled(self.file.write_at(buf, pos + done as u64)).await?;
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

    async fn fdatasync(&self) -> io::Result<()> {
        repolled(self.file.fdatasync()).await.map_err(Into::into)
    }

    async fn size(&self) -> io::Result<u64> {
        self.file.file_size().await.map_err(Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A future that becomes ready once `at` has passed but never wakes its task: what a disk
    /// I/O whose completion glommio did not deliver looks like to the engine.
    struct SilentUntil {
        at: Instant,
    }

    impl Future for SilentUntil {
        type Output = u32;
        fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<u32> {
            if Instant::now() >= self.at {
                Poll::Ready(7)
            } else {
                Poll::Pending
            }
        }
    }

    #[test]
    fn a_completion_that_wakes_nobody_is_found_by_the_re_poll() {
        // Goal: `repolled` finishes an I/O future that completed without waking its task,
        // within a few re-poll intervals, and counts it; an I/O that wakes its task normally is
        // not counted.
        // Method: a future that turns ready after 20 ms without ever waking (alone it would
        // hang the test), then a glommio timer (which wakes normally) behind `repolled`.
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .io_memory(1 << 20)
            .spawn(|| async {
                let before = missed_io_wakeups();
                let started = Instant::now();
                let v = repolled(SilentUntil {
                    at: started + Duration::from_millis(20),
                })
                .await;
                assert_eq!(v, 7);
                assert!(
                    started.elapsed() < Duration::from_secs(2),
                    "took {:?}",
                    started.elapsed()
                );
                assert_eq!(missed_io_wakeups(), before + 1);

                repolled(Timer::new(Duration::from_millis(20))).await;
                assert_eq!(
                    missed_io_wakeups(),
                    before + 1,
                    "a normal wake-up was counted"
                );
            })
            .expect("spawn executor")
            .join()
            .expect("executor panicked");
    }
}

//! The raw-device baseline: what the disk itself can do, measured in the same run.
//!
//! * **Durable 4 KiB appends**: `O_DIRECT` writes of one aligned 4 KiB block at consecutive
//!   offsets of a pre-written file, each made durable before the next is issued, by default
//!   with `fdatasync` after the write (as the journal does once per group-commit batch), or
//!   with `O_DSYNC` on the file ([`SyncMode`]). One write at a time: this is the disk's latency
//!   for the smallest durable append, the floor under a bookie's add latency.
//! * **Sequential bandwidth**: `O_DIRECT` writes of large aligned blocks (1 MiB by default)
//!   over the same file, with an `fdatasync` every 64 MiB and at the end; bytes divided by the
//!   time including the syncs.
//!
//! The file is pre-written (and synced) before either test, so neither measures block
//! allocation; it is deleted when the [`BaselineFile`] is dropped. Give a directory on the
//! journal device: the sandbox's data directory, or a real bookie's journal filesystem.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::hist::{LatencyHistogram, Summary};

/// Alignment and size of one durable append: 4 KiB.
pub const BLOCK_SIZE_BYTES: usize = 4096;

/// How each durable append is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum SyncMode {
    /// `pwrite` then `fdatasync(2)` (what the journal does per batch).
    Fdatasync,
    /// The file is opened with `O_DSYNC`: each `pwrite` returns once durable.
    Dsync,
}

impl SyncMode {
    /// A short description for reports.
    pub fn describe(self) -> &'static str {
        match self {
            SyncMode::Fdatasync => "O_DIRECT pwrite + fdatasync per 4 KiB append",
            SyncMode::Dsync => "O_DIRECT|O_DSYNC pwrite per 4 KiB append",
        }
    }
}

/// Settings of the baseline.
#[derive(Debug, Clone)]
pub struct BaselineConfig {
    /// Directory for the scratch file (on the journal device).
    pub dir: PathBuf,
    /// Size of the pre-written scratch file, bytes (a multiple of 1 MiB).
    pub file_size_bytes: u64,
    /// Duration of each of the two tests.
    pub test_duration: Duration,
    /// How durable appends are synced.
    pub sync: SyncMode,
    /// Block size of the sequential test, bytes (a multiple of 4 KiB).
    pub seq_block_size_bytes: usize,
}

/// One baseline measurement.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct BaselineResult {
    /// How appends were made durable.
    pub sync_mode: String,
    /// Latency of one durable 4 KiB append.
    pub append: Summary,
    /// Durable appends per second (one at a time).
    pub append_ops_per_s: f64,
    /// Sequential O_DIRECT write bandwidth, bytes per second.
    pub seq_write_bytes_per_s: f64,
    /// Block size of the sequential test, bytes.
    pub seq_block_size_bytes: usize,
    /// Percentile distribution of the append latency `(quantile, ms)`, for plots.
    pub append_distribution: Vec<(f64, f64)>,
}

/// A page-aligned, zero-initialised heap buffer, as O_DIRECT requires.
struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl AlignedBuf {
    fn new(size: usize) -> Self {
        let layout = Layout::from_size_align(size, BLOCK_SIZE_BYTES)
            .expect("size and 4096 alignment are valid");
        assert!(size > 0);
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Self { ptr, layout }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr points to layout.size() initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// The pre-written scratch file, removed on drop.
#[derive(Debug)]
pub struct BaselineFile {
    path: PathBuf,
    size_bytes: u64,
}

impl Drop for BaselineFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl BaselineFile {
    /// Creates `quire-perf-baseline-<pid>.tmp` in `dir` and writes `size_bytes` of data into it,
    /// then syncs it.
    ///
    /// # Errors
    /// If the directory is missing or not writable, or the disk is full.
    pub fn prepare(dir: &Path, size_bytes: u64) -> Result<Self> {
        let mib = 1u64 << 20;
        if size_bytes < mib || !size_bytes.is_multiple_of(mib) {
            bail!(
                "baseline file size must be a positive multiple of 1 MiB, not {size_bytes} bytes"
            );
        }
        let path = dir.join(format!("quire-perf-baseline-{}.tmp", std::process::id()));
        let file = Self { path, size_bytes };
        let mut f = File::create(&file.path)
            .with_context(|| format!("cannot create {}", file.path.display()))?;
        let mut chunk = vec![0u8; mib as usize];
        for (i, b) in chunk.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(131);
        }
        for _ in 0..size_bytes / mib {
            f.write_all(&chunk)
                .with_context(|| format!("cannot pre-write {}", file.path.display()))?;
        }
        f.sync_all()
            .with_context(|| format!("cannot sync {}", file.path.display()))?;
        Ok(file)
    }

    /// Path of the scratch file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open_direct(&self, dsync: bool) -> Result<File> {
        let mut flags = libc::O_DIRECT;
        if dsync {
            flags |= libc::O_DSYNC;
        }
        OpenOptions::new().write(true).custom_flags(flags).open(&self.path).with_context(|| {
            format!("cannot open {} with O_DIRECT (tmpfs and some filesystems refuse it; give a directory on the journal disk)", self.path.display())
        })
    }

    /// Runs both tests: durable 4 KiB appends, then sequential bandwidth.
    ///
    /// # Errors
    /// Any I/O error, with the path.
    pub fn measure(&self, cfg: &BaselineConfig) -> Result<BaselineResult> {
        let (append, ops) = self.durable_appends(cfg.sync, cfg.test_duration)?;
        let bw = self.sequential(cfg.seq_block_size_bytes, cfg.test_duration)?;
        Ok(BaselineResult {
            sync_mode: cfg.sync.describe().to_string(),
            append: append.summary(),
            append_ops_per_s: ops,
            seq_write_bytes_per_s: bw,
            seq_block_size_bytes: cfg.seq_block_size_bytes,
            append_distribution: append.distribution(),
        })
    }

    /// Durable 4 KiB appends for `duration`; returns their latencies and the rate achieved.
    ///
    /// # Errors
    /// Any I/O error, with the path.
    pub fn durable_appends(
        &self,
        sync: SyncMode,
        duration: Duration,
    ) -> Result<(LatencyHistogram, f64)> {
        let f = self.open_direct(sync == SyncMode::Dsync)?;
        let mut buf = AlignedBuf::new(BLOCK_SIZE_BYTES);
        let blocks = self.size_bytes / BLOCK_SIZE_BYTES as u64;
        let mut hist = LatencyHistogram::new();
        let start = quire_clock::now();
        let mut n = 0u64;
        while quire_clock::elapsed(start) < duration {
            buf.as_mut_slice()[..8].copy_from_slice(&n.to_le_bytes());
            let off = (n % blocks) * BLOCK_SIZE_BYTES as u64;
            let t = quire_clock::now();
            f.write_all_at(buf.as_slice(), off)
                .with_context(|| format!("O_DIRECT write to {} at {off}", self.path.display()))?;
            if sync == SyncMode::Fdatasync {
                f.sync_data()
                    .with_context(|| format!("fdatasync {}", self.path.display()))?;
            }
            hist.record(quire_clock::elapsed(t));
            n += 1;
        }
        Ok((hist, n as f64 / quire_clock::elapsed(start).as_secs_f64()))
    }

    /// Sequential O_DIRECT writes of `block` bytes for about `duration`; bytes per second,
    /// syncs included.
    ///
    /// # Errors
    /// Any I/O error, with the path; a block size that is not a multiple of 4 KiB.
    pub fn sequential(&self, block: usize, duration: Duration) -> Result<f64> {
        if block == 0 || !block.is_multiple_of(BLOCK_SIZE_BYTES) || block as u64 > self.size_bytes {
            bail!("sequential block size must be a multiple of 4 KiB no larger than the file, not {block}");
        }
        let f = self.open_direct(false)?;
        let buf = AlignedBuf::new(block);
        let per_file = self.size_bytes / block as u64;
        let sync_every = ((64u64 << 20) / block as u64).max(1);
        let start = quire_clock::now();
        let mut n = 0u64;
        while quire_clock::elapsed(start) < duration {
            let off = (n % per_file) * block as u64;
            f.write_all_at(buf.as_slice(), off)
                .with_context(|| format!("O_DIRECT write to {} at {off}", self.path.display()))?;
            n += 1;
            if n.is_multiple_of(sync_every) {
                f.sync_data()
                    .with_context(|| format!("fdatasync {}", self.path.display()))?;
            }
        }
        f.sync_data()
            .with_context(|| format!("fdatasync {}", self.path.display()))?;
        Ok((n * block as u64) as f64 / quire_clock::elapsed(start).as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the baseline runs on a real O_DIRECT file and reports sane figures. Method: a 4 MiB
    // file in a temp dir on the ext4 disk (not tmpfs), 200 ms per test, both sync modes; every
    // append was recorded, the rate and bandwidth are positive, and the file is gone after drop.
    // No bound on the figures themselves: this is a functional test, not a benchmark.
    #[test]
    fn measures_a_real_file_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let file = BaselineFile::prepare(dir.path(), 4 << 20).unwrap();
        let path = file.path().to_path_buf();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 << 20);
        for sync in [SyncMode::Fdatasync, SyncMode::Dsync] {
            let cfg = BaselineConfig {
                dir: dir.path().to_path_buf(),
                file_size_bytes: 4 << 20,
                test_duration: Duration::from_millis(200),
                sync,
                seq_block_size_bytes: 1 << 20,
            };
            let r = file.measure(&cfg).unwrap();
            assert!(
                r.append.count > 0 && r.append_ops_per_s > 0.0 && r.seq_write_bytes_per_s > 0.0,
                "{r:?}"
            );
            assert!(r.append.p50_ms <= r.append.p99_ms && r.append.p99_ms <= r.append.max_ms);
        }
        assert!(
            file.sequential(1000, Duration::from_millis(1)).is_err(),
            "unaligned block refused"
        );
        drop(file);
        assert!(!path.exists());
        assert!(
            BaselineFile::prepare(dir.path(), 1000).is_err(),
            "size not a MiB multiple refused"
        );
    }
}

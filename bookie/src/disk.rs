//! Read-only mode on disk usage (BookKeeper's `LedgerDirsMonitor`, bookkeeper.md §2.10).
//!
//! A monitor thread measures, with `statvfs(2)`, the usage of every shard's journal and ledger
//! directory every `disk_check_interval`, and at once when a shard reports that a write (an
//! add, a fence, or a background checkpoint) failed with ENOSPC. Usage is `1 − f_bavail / f_blocks`: the fraction of the filesystem this process
//! cannot write to (BookKeeper's `1 − usableSpace / totalSpace`).
//!
//! * **Read-only** as soon as *any* directory reaches `disk_usage_threshold` (BookKeeper
//!   `diskUsageThreshold`, default 0.95, with `readOnlyModeOnAnyDiskFullEnabled`: one full disk
//!   is enough, bookkeeper.md §6 row 10), or a write failed with ENOSPC, or a directory cannot
//!   be measured (its space cannot be vouched for).
//! * **Writable** again only once *every* directory is below `disk_usage_lwm_threshold`
//!   (`diskUsageLwmThreshold`, default 0.90): the gap keeps a bookie near the threshold from
//!   flapping.
//!
//! The state is never persisted (BookKeeper's `persistBookieStatusEnabled` is off by default,
//! and a persisted status is what left bookies stuck read-only, bookkeeper.md §6 row 11): a
//! restarted bookie measures again before it serves.
//!
//! What read-only means is decided by the shards (`shard.rs`): normal adds are answered
//! `ReadOnly`; reads, LAC reads, long polls, fences and recovery adds are served. Background
//! work (checkpoints, and garbage collection) keeps running, so that space can come back.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Default of `BookieConfig::disk_usage_threshold` (BookKeeper `diskUsageThreshold`).
pub const DISK_USAGE_THRESHOLD_DEFAULT: f64 = 0.95;
/// Default of `BookieConfig::disk_usage_lwm_threshold` (BookKeeper `diskUsageLwmThreshold`).
pub const DISK_USAGE_LWM_THRESHOLD_DEFAULT: f64 = 0.90;
/// Default of `BookieConfig::disk_check_interval` (BookKeeper `diskCheckInterval`, 10 000 ms).
pub const DISK_CHECK_INTERVAL_DEFAULT: Duration = Duration::from_secs(10);

/// The measured usage of one directory's filesystem.
#[derive(Debug, Clone, PartialEq)]
pub struct DirUsage {
    /// The directory (a shard's journal or ledger directory).
    pub path: PathBuf,
    /// Fraction of the filesystem's blocks this process cannot write, in `0.0..=1.0`; `None`
    /// when `statvfs` failed (the directory then counts as full).
    pub usage: Option<f64>,
}

/// The read-only state of one bookie, shared by its shards, its monitor thread and whoever
/// holds a handle ([`crate::Bookie::read_only_state`]). Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct ReadOnlyState {
    inner: Arc<Inner>,
}

struct Inner {
    read_only: AtomicBool,
    locked: Mutex<Locked>,
    /// Wakes the monitor thread: a reported ENOSPC, or shutdown.
    wake: Condvar,
}

#[derive(Default)]
struct Locked {
    subscribers: Vec<flume::Sender<bool>>,
    usages: Vec<DirUsage>,
    /// A write failed with ENOSPC since the last measurement.
    storage_full_reported: bool,
    stop: bool,
}

impl std::fmt::Debug for ReadOnlyState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOnlyState")
            .field("read_only", &self.is_read_only())
            .finish()
    }
}

impl ReadOnlyState {
    fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                read_only: AtomicBool::new(false),
                locked: Mutex::new(Locked::default()),
                wake: Condvar::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Locked> {
        // The lock guards plain data that every holder leaves consistent; a panic elsewhere
        // (release builds abort anyway) must not stop the monitor.
        self.inner.locked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the bookie is read-only now: normal adds are refused with `ReadOnly`. Garbage
    /// collection and compaction must keep running while it is (they give space back).
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only.load(Ordering::Acquire)
    }

    /// A channel that receives the new state (`true` = read-only) at every transition from now
    /// on, e.g. to move the bookie's registration between `available` and `readonly`. The
    /// channel is unbounded; a dropped receiver is forgotten at the next transition.
    pub fn subscribe(&self) -> flume::Receiver<bool> {
        let (tx, rx) = flume::unbounded();
        self.lock().subscribers.push(tx);
        rx
    }

    /// The usage of every monitored directory at the last measurement.
    pub fn dir_usages(&self) -> Vec<DirUsage> {
        self.lock().usages.clone()
    }

    /// Reports that a write failed with ENOSPC (or EDQUOT): the bookie turns read-only at once
    /// (BookKeeper: `NoWritableLedgerDirException` → read-only) and the monitor measures now;
    /// it turns writable again only below the low-water mark.
    pub(crate) fn report_storage_full(&self) {
        let mut locked = self.lock();
        locked.storage_full_reported = true;
        self.set(&mut locked, true, "a write failed: no space left on device");
        self.inner.wake.notify_all();
    }

    /// Sets the state; notifies subscribers on a change.
    fn set(&self, locked: &mut Locked, read_only: bool, why: &str) {
        let before = self.inner.read_only.swap(read_only, Ordering::AcqRel);
        if before == read_only {
            return;
        }
        if read_only {
            tracing::warn!(reason = why, usages = ?locked.usages, "bookie is now read-only");
        } else {
            tracing::info!(reason = why, usages = ?locked.usages, "bookie is writable again");
        }
        locked.subscribers.retain(|tx| tx.send(read_only).is_ok());
    }

    /// Measures every directory once and applies the thresholds. An ENOSPC reported while
    /// measuring makes these measurements stale: the state stays read-only and the monitor
    /// measures again at once.
    fn check(&self, dirs: &[PathBuf], threshold: f64, lwm: f64) {
        self.lock().storage_full_reported = false;
        let usages: Vec<DirUsage> = dirs
            .iter()
            .map(|d| DirUsage {
                path: d.clone(),
                usage: match usage_of(d) {
                    Ok(u) => Some(u),
                    Err(e) => {
                        tracing::warn!(dir = %d.display(), error = %e, "cannot measure disk usage; counting the directory as full");
                        None
                    }
                },
            })
            .collect();
        let mut locked = self.lock();
        let measured: Vec<Option<f64>> = usages.iter().map(|u| u.usage).collect();
        locked.usages = usages;
        if locked.storage_full_reported {
            return;
        }
        let now = next_state(self.is_read_only(), &measured, threshold, lwm);
        let why = if now {
            "a directory reached disk_usage_threshold (or could not be measured)"
        } else {
            "every directory is below disk_usage_lwm_threshold"
        };
        self.set(&mut locked, now, why);
    }
}

/// The next read-only state (`true` = read-only) from the current one and each directory's
/// usage (`None`: unmeasurable).
///
/// Read-only when any directory is at or above `threshold` or unmeasurable; writable when
/// every directory is below `lwm`; otherwise unchanged (a bookie made read-only by ENOSPC
/// stays so until every directory is below `lwm`).
pub(crate) fn next_state(
    read_only: bool,
    usages: &[Option<f64>],
    threshold: f64,
    lwm: f64,
) -> bool {
    if usages.iter().any(|u| u.is_none_or(|u| u >= threshold)) {
        return true;
    }
    if usages.iter().all(|u| u.is_some_and(|u| u < lwm)) {
        return false;
    }
    read_only
}

/// `1 − f_bavail / f_blocks` of the filesystem holding `dir`; 0 for a filesystem that reports
/// no blocks at all.
///
/// # Errors
/// The `statvfs(2)` error (e.g. the directory is gone, or the device failed).
pub fn usage_of(dir: &Path) -> std::io::Result<f64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs is plain old data; all zeroes is a valid value to be overwritten.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `s` a valid statvfs the kernel writes into.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let blocks = s.f_blocks as f64;
    if blocks <= 0.0 {
        return Ok(0.0);
    }
    Ok((1.0 - s.f_bavail as f64 / blocks).clamp(0.0, 1.0))
}

/// The running monitor: its thread and the state it maintains.
pub(crate) struct DiskMonitor {
    state: ReadOnlyState,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DiskMonitor {
    /// Measures `dirs` once (so a bookie that starts on a full disk starts read-only), then
    /// starts the monitor thread.
    ///
    /// # Errors
    /// The thread cannot be spawned.
    pub(crate) fn start(
        dirs: Vec<PathBuf>,
        threshold: f64,
        lwm: f64,
        interval: Duration,
    ) -> std::io::Result<DiskMonitor> {
        let state = ReadOnlyState::new();
        state.check(&dirs, threshold, lwm);
        let s = state.clone();
        let thread = std::thread::Builder::new()
            .name("quire-disk-monitor".into())
            .spawn(move || {
                let mut locked = s.lock();
                loop {
                    if locked.stop {
                        return;
                    }
                    if !locked.storage_full_reported {
                        locked = s
                            .inner
                            .wake
                            .wait_timeout(locked, interval)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                        if locked.stop {
                            return;
                        }
                    }
                    drop(locked);
                    s.check(&dirs, threshold, lwm);
                    locked = s.lock();
                }
            })?;
        Ok(DiskMonitor {
            state,
            thread: Some(thread),
        })
    }

    pub(crate) fn state(&self) -> &ReadOnlyState {
        &self.state
    }

    /// Stops and joins the monitor thread.
    pub(crate) fn stop(&mut self) {
        self.state.lock().stop = true;
        self.state.inner.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for DiskMonitor {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_with_hysteresis() {
        // Goal: any directory at the threshold (or unmeasurable) makes the bookie read-only;
        // only every directory below the low-water mark makes it writable; in between the
        // state holds. Method: the decision over a table of cases.
        let (t, l) = (0.95, 0.90);
        for (read_only, usages, want) in [
            (false, vec![Some(0.5), Some(0.94)], false),
            (false, vec![Some(0.5), Some(0.95)], true),
            (false, vec![Some(0.96), Some(0.1)], true),
            (false, vec![None, Some(0.1)], true),
            (true, vec![Some(0.92), Some(0.1)], true),
            (false, vec![Some(0.92), Some(0.1)], false),
            (true, vec![Some(0.89), Some(0.1)], false),
            (true, vec![], false),
        ] {
            assert_eq!(
                next_state(read_only, &usages, t, l),
                want,
                "read_only {read_only} usages {usages:?}"
            );
        }
    }

    #[test]
    fn usage_of_a_real_directory_and_a_missing_one() {
        // Goal: statvfs gives a fraction for a real directory and an error for a missing one
        // (which then counts as full).
        let dir = tempfile::tempdir().unwrap();
        let u = usage_of(dir.path()).unwrap();
        assert!((0.0..=1.0).contains(&u), "{u}");
        assert!(usage_of(&dir.path().join("missing")).is_err());
        let s = ReadOnlyState::new();
        s.check(&[dir.path().join("missing")], 0.95, 0.9);
        assert!(s.is_read_only());
        assert_eq!(s.dir_usages()[0].usage, None);
    }

    #[test]
    fn storage_full_report_and_subscribers() {
        // Goal: ENOSPC turns the state read-only at once and subscribers hear each transition;
        // a later measurement below the low-water mark turns it writable again.
        let dir = tempfile::tempdir().unwrap();
        let s = ReadOnlyState::new();
        let rx = s.subscribe();
        s.report_storage_full();
        assert!(s.is_read_only());
        assert_eq!(rx.try_recv(), Ok(true));
        // Thresholds above any real usage: the next measurement finds room.
        s.check(&[dir.path().to_path_buf()], 1.1, 1.05);
        assert!(!s.is_read_only());
        assert_eq!(rx.try_recv(), Ok(false));
        assert!(rx.try_recv().is_err(), "no transition, no message");
    }
}

//! Durable-append benchmark for the journal's sync path (performance.md, design implication 3):
//! 4 KiB (and 64 KiB) O_DIRECT appends into a pre-zeroed file, each made durable by one of
//!
//! * `uring-write+fdatasync`: glommio DmaFile `write_at`, then glommio `fdatasync` (io_uring);
//!   this is the engine's journal path;
//! * `uring-O_DSYNC`: glommio DmaFile opened with `O_DSYNC`, `write_at` only;
//! * `psync-write+fdatasync`: blocking `pwrite` on an O_DIRECT fd, then `fdatasync(2)`;
//! * `psync-O_DSYNC`: blocking `pwrite` on an O_DIRECT|O_DSYNC fd;
//! * `psync-RWF_DSYNC`: blocking `pwritev2(..., RWF_DSYNC)` on an O_DIRECT fd.
//!
//! Modes run interleaved, round after round, in the same process, so a noisy host affects them
//! alike; the report gives per-mode medians over rounds of p50/p99 and each mode's p50 as a
//! ratio of the engine's current path. This is a benchmark, not a test: nothing is asserted.
//!
//! Run: `cargo run --release -p quire-engine --example journal_sync_bench -- [dir] [appends] [rounds]`
//! (dir defaults to /tmp; it must be ext4 or xfs, never tmpfs).

// A benchmark's stopwatch is the real clock, whatever clock the code under test reads
// (quire_clock seam, clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use glommio::io::DmaFile;
use glommio::{LocalExecutorBuilder, Placement};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    UringFdatasync,
    UringODsync,
    PsyncFdatasync,
    PsyncODsync,
    PsyncRwfDsync,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::UringFdatasync => "uring-write+fdatasync",
            Mode::UringODsync => "uring-O_DSYNC",
            Mode::PsyncFdatasync => "psync-write+fdatasync",
            Mode::PsyncODsync => "psync-O_DSYNC",
            Mode::PsyncRwfDsync => "psync-RWF_DSYNC",
        }
    }
}

const MODES: [Mode; 5] = [
    Mode::UringFdatasync,
    Mode::UringODsync,
    Mode::PsyncFdatasync,
    Mode::PsyncODsync,
    Mode::PsyncRwfDsync,
];

/// Writes `bytes` (a multiple of 1 MiB) of zeros with plain I/O and syncs: the journal's
/// pre-written state.
fn prezero(path: &Path, bytes: u64) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("create bench file");
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..(bytes >> 20) {
        f.write_all(&zeros).expect("pre-write zeros");
    }
    f.sync_all().expect("sync bench file");
}

/// A 4 KiB-aligned heap buffer for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}
impl Aligned {
    fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Self { ptr, layout }
    }
}
impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

fn psync_run(path: &Path, mode: Mode, bs: usize, n: usize) -> Vec<Duration> {
    let mut flags = libc::O_DIRECT;
    if mode == Mode::PsyncODsync {
        flags |= libc::O_DSYNC;
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(flags)
        .open(path)
        .expect("open");
    let fd = f.as_raw_fd();
    let buf = Aligned::new(bs);
    // SAFETY: buf is bs bytes long.
    unsafe { std::ptr::write_bytes(buf.ptr, 0x5a, bs) };
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let off = (4096 + i * bs) as libc::off_t;
        let t = Instant::now();
        let w = match mode {
            Mode::PsyncRwfDsync => {
                let iov = libc::iovec {
                    iov_base: buf.ptr.cast(),
                    iov_len: bs,
                };
                // SAFETY: iov points at bs valid bytes; fd is open.
                unsafe { libc::pwritev2(fd, &iov, 1, off, libc::RWF_DSYNC) }
            }
            // SAFETY: buf holds bs bytes; fd is open.
            _ => unsafe { libc::pwrite(fd, buf.ptr.cast(), bs, off) },
        };
        assert_eq!(
            w,
            bs as isize,
            "short or failed write: {}",
            std::io::Error::last_os_error()
        );
        if mode == Mode::PsyncFdatasync {
            // SAFETY: fd is open.
            assert_eq!(unsafe { libc::fdatasync(fd) }, 0);
        }
        lat.push(t.elapsed());
    }
    lat
}

async fn uring_run(path: PathBuf, mode: Mode, bs: usize, n: usize) -> Vec<Duration> {
    let flags = if mode == Mode::UringODsync {
        libc::O_DSYNC
    } else {
        0
    };
    let f: DmaFile = glommio::io::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(flags)
        .dma_open(&path)
        .await
        .expect("dma open");
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let mut b = f.alloc_dma_buffer(bs);
        b.as_bytes_mut().fill(0x5a);
        let t = Instant::now();
        let w = f.write_at(b, (4096 + i * bs) as u64).await.expect("write");
        assert_eq!(w, bs);
        if mode == Mode::UringFdatasync {
            f.fdatasync().await.expect("fdatasync");
        }
        lat.push(t.elapsed());
    }
    f.close().await.expect("close");
    lat
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(args.get(1).map_or("/tmp", String::as_str));
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let rounds: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(3);
    let path = dir.join(format!("quire-sync-bench-{}.dat", std::process::id()));
    for bs in [4096usize, 65536] {
        let n = if bs == 4096 { n } else { (n / 4).max(100) };
        let file_bytes = ((4096 + n * bs) as u64).div_ceil(1 << 20) << 20;
        let mut p50s: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
        let mut p99s: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
        for _round in 0..rounds {
            for (mi, &mode) in MODES.iter().enumerate() {
                prezero(&path, file_bytes);
                let mut lat = match mode {
                    Mode::UringFdatasync | Mode::UringODsync => {
                        let p = path.clone();
                        LocalExecutorBuilder::new(Placement::Unbound)
                            .io_memory(1 << 20)
                            .spawn(move || uring_run(p, mode, bs, n))
                            .expect("executor")
                            .join()
                            .expect("executor panicked")
                    }
                    _ => psync_run(&path, mode, bs, n),
                };
                lat.sort();
                p50s[mi].push(pct(&lat, 0.50));
                p99s[mi].push(pct(&lat, 0.99));
            }
        }
        let _ = std::fs::remove_file(&path);
        println!(
            "\n{bs}-byte durable appends, {n} per run, {rounds} rounds (median of rounds; µs)"
        );
        println!(
            "{:<24} {:>9} {:>9} {:>14}   raw p50 per round",
            "mode", "p50", "p99", "p50 / uring-fds"
        );
        let base = median(p50s[0].clone());
        for (mi, mode) in MODES.iter().enumerate() {
            let p50 = median(p50s[mi].clone());
            let p99 = median(p99s[mi].clone());
            let raw: Vec<String> = p50s[mi].iter().map(|v| format!("{v:.0}")).collect();
            println!(
                "{:<24} {:>9.0} {:>9.0} {:>14.2}   [{}]",
                mode.name(),
                p50,
                p99,
                p50 / base,
                raw.join(", ")
            );
        }
    }
}

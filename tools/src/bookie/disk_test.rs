//! `quire bookie disk-test --journal-dir D [--ledger-dir L]`: what a bookie's disks can do,
//! measured the way perf/'s raw-device baseline does (perf/src/baseline.rs), so that an
//! operator can tell a slow disk from a slow bookie before deploying:
//! * **durable append latency**: `O_DIRECT|O_DSYNC` `pwrite`s of one aligned 4 KiB block at
//!   consecutive offsets of a pre-written scratch file, one at a time (each returns once the
//!   block is durable, as a journal group commit's write + `fdatasync`), p50 and p99 in µs;
//! * **sequential bandwidth**: `O_DIRECT` 1 MiB writes over the same file with an `fdatasync`
//!   every 64 MiB and at the end, MB/s (10^6 bytes) including the syncs.
//!
//! The scratch file (`quire-disk-test-<pid>.tmp`) is pre-written and synced first, so that
//! neither figure measures block allocation, and deleted at the end. The engine's own I/O path
//! runs on glommio executors inside a bookie; a CLI tool writes with std and aligned buffers.
//!
//! The figures are printed beside the floor perf/ measured on the development VM
//! ([`FLOOR`], /work/shared/reference/performance.md Part B and perf/README.md): a disk well
//! above that floor's latency gives a bookie well above its add latency.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

/// One durable append: 4 KiB, also the O_DIRECT alignment used.
const BLOCK_BYTES: usize = 4096;
/// One sequential write: 1 MiB.
const CHUNK_BYTES: usize = 1 << 20;
/// Bytes between `fdatasync`s in the bandwidth test.
const SYNC_EVERY_BYTES: u64 = 64 << 20;

/// The reference figures perf/ measured on the development VM (2 vCPU, ext4 on one virtio
/// disk): 4 KiB `O_DIRECT|O_DSYNC` appends p50 172 µs, p99 1 300 µs; durable sequential
/// writes of 1 MiB ≈ 1 117 MiB/s (1 171 MB/s).
pub const FLOOR: Floor = Floor {
    append_p50_us: 172,
    append_p99_us: 1300,
    bandwidth_mb_s: 1171,
};

/// Reference figures (see [`FLOOR`]).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Floor {
    pub append_p50_us: u64,
    pub append_p99_us: u64,
    pub bandwidth_mb_s: u64,
}

/// `quire bookie disk-test` options.
#[derive(Args, Debug)]
pub struct DiskTestArgs {
    /// The journal directory (on the journal device): append latency and bandwidth.
    #[arg(long)]
    pub journal_dir: PathBuf,
    /// The ledger directory, if on another device: its bandwidth too.
    #[arg(long)]
    pub ledger_dir: Option<PathBuf>,
    /// Durable 4 KiB appends to time.
    #[arg(long, default_value_t = 2000)]
    pub appends: usize,
    /// Bytes to write sequentially for the bandwidth (a multiple of 1 MiB; also the scratch
    /// file's size).
    #[arg(long, default_value_t = 128 << 20)]
    pub bytes: u64,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// One directory's figures.
#[derive(Debug, serde::Serialize)]
pub struct DiskFigures {
    pub dir: PathBuf,
    pub append_p50_us: Option<u64>,
    pub append_p99_us: Option<u64>,
    pub bandwidth_mb_s: f64,
}

/// A 4 KiB-aligned zeroed buffer for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    layout: Layout,
}

impl Aligned {
    fn new(len: usize) -> Result<Aligned> {
        let layout = Layout::from_size_align(len, BLOCK_BYTES)?;
        // SAFETY: the layout has a non-zero size (callers pass 4 KiB or 1 MiB).
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            bail!("cannot allocate {len} bytes");
        }
        Ok(Aligned { ptr, layout })
    }
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: ptr points to layout.size() initialized (zeroed) bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated by alloc_zeroed with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// The scratch file, deleted on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn open_direct(path: &Path, dsync: bool) -> Result<File> {
    let mut flags = libc::O_DIRECT;
    if dsync {
        flags |= libc::O_DSYNC;
    }
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .custom_flags(flags)
        .open(path)
        .with_context(|| format!("cannot open {} with O_DIRECT", path.display()))
}

/// Writes `bytes` sequentially in 1 MiB O_DIRECT writes, syncing every 64 MiB and at the end;
/// returns MB/s.
fn sequential(file: &File, bytes: u64) -> Result<f64> {
    let mut chunk = Aligned::new(CHUNK_BYTES)?;
    chunk.bytes().fill(0x5a);
    let start = quire_clock::now();
    let mut at = 0;
    while at < bytes {
        file.write_all_at(chunk.bytes(), at)?;
        at += CHUNK_BYTES as u64;
        if at.is_multiple_of(SYNC_EVERY_BYTES) {
            file.sync_data()?;
        }
    }
    file.sync_data()?;
    Ok(bytes as f64 / quire_clock::elapsed(start).as_secs_f64() / 1e6)
}

/// Times `n` durable 4 KiB appends (O_DSYNC); returns the sorted latencies in µs.
fn appends(path: &Path, n: usize, limit: u64) -> Result<Vec<u64>> {
    let file = open_direct(path, true)?;
    let mut block = Aligned::new(BLOCK_BYTES)?;
    block.bytes().fill(0xa5);
    let mut us = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let at = (i * BLOCK_BYTES as u64) % limit;
        let start = quire_clock::now();
        file.write_all_at(block.bytes(), at)?;
        us.push(quire_clock::elapsed(start).as_micros() as u64);
    }
    us.sort_unstable();
    Ok(us)
}

fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    let last = sorted.len().checked_sub(1)?;
    Some(sorted[((last as f64) * q).round() as usize])
}

/// Measures one directory: bandwidth always, append latency when `appends_n > 0`.
fn measure(dir: &Path, bytes: u64, appends_n: usize) -> Result<DiskFigures> {
    let scratch = Scratch(dir.join(format!("quire-disk-test-{}.tmp", std::process::id())));
    let file = open_direct(&scratch.0, false)?;
    // Pre-written, so that the timed writes overwrite allocated blocks (the journal reuses
    // pre-written files too); the first pass is also the bandwidth run.
    sequential(&file, bytes)?;
    let bandwidth_mb_s = sequential(&file, bytes)?;
    drop(file);
    let (p50, p99) = if appends_n > 0 {
        let us = appends(&scratch.0, appends_n, bytes)?;
        (quantile(&us, 0.5), quantile(&us, 0.99))
    } else {
        (None, None)
    };
    Ok(DiskFigures {
        dir: dir.to_path_buf(),
        append_p50_us: p50,
        append_p99_us: p99,
        bandwidth_mb_s,
    })
}

/// Runs `quire bookie disk-test`.
///
/// # Errors
/// A directory that is missing, not writable, or on a filesystem without O_DIRECT (tmpfs).
pub fn run(args: DiskTestArgs) -> Result<()> {
    let mb = 1 << 20;
    if args.bytes < mb || !args.bytes.is_multiple_of(mb) {
        bail!(
            "--bytes {} must be a positive multiple of 1 MiB",
            args.bytes
        );
    }
    let mut results = vec![measure(&args.journal_dir, args.bytes, args.appends)?];
    if let Some(ledger) = &args.ledger_dir {
        results.push(measure(ledger, args.bytes, 0)?);
    }
    if args.json {
        let doc = serde_json::json!({ "results": results, "floor": FLOOR });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let show = |v: Option<u64>| v.map_or("-".into(), |v| v.to_string());
    for (i, r) in results.iter().enumerate() {
        let role = if i == 0 { "journal" } else { "ledger" };
        println!("{role} {}:", r.dir.display());
        if i == 0 {
            println!(
                "  durable 4 KiB append (O_DIRECT|O_DSYNC): p50 {} µs, p99 {} µs   (floor: p50 {} µs, p99 {} µs)",
                show(r.append_p50_us),
                show(r.append_p99_us),
                FLOOR.append_p50_us,
                FLOOR.append_p99_us
            );
        }
        println!(
            "  sequential 1 MiB O_DIRECT writes, fdatasync per 64 MiB: {:.0} MB/s   (floor: {} MB/s)",
            r.bandwidth_mb_s, FLOOR.bandwidth_mb_s
        );
    }
    println!("floor: perf/'s raw-device baseline on the development VM (ext4, one virtio disk)");
    Ok(())
}

//! Same-run measurements behind the design card's crates (issue 25 item 8; ARCHITECTURE.md,
//! "The design card's crates"): would the `io-uring` crate make the journal's durable write
//! cheaper than the carried glommio does, and would `memmap2` make journal replay cheaper than
//! the DMA reads it uses?
//!
//! **Journal writes.** Appends of `--batch-kib` KiB, block aligned, to a preallocated O_DIRECT
//! file, each durable before the next starts (one journal batch at a time, as with one writer and
//! no pipelining), in five ways:
//! - `glommio-dsync`: `DmaFile::write_at_dsync` (what the engine does: one request, RWF_DSYNC);
//! - `glommio-write+fdatasync`: `write_at` then `fdatasync` (two requests; the fdatasync goes to
//!   an io-wq worker);
//! - `uring-fixed-dsync`: a ring of our own, the buffer registered, `WriteFixed` with RWF_DSYNC;
//! - `uring-linked-fsync`: `WriteFixed` linked (IOSQE_IO_LINK) to `Fsync(DATASYNC)`, submitted
//!   together, waiting for both;
//! - `pwritev2-dsync`: a blocking `pwritev2(RWF_DSYNC)` on the calling thread (the floor: no ring).
//!
//! **Journal replay.** A `--replay-mib` MiB file of written blocks read whole and CRC32C'd (the
//! replay's pass over it), the file's page cache dropped before each run
//! (`posix_fadvise(DONTNEED)`):
//! - `dma-read+copy`: glommio `DmaFile::read_at` in 1 MiB chunks copied into one `Vec` (what
//!   `engine::io::DmaStorageFile::read_at` does for replay);
//! - `dma-read+copy, 4 ahead`: the same reads with four in flight;
//! - `mmap`: `memmap2::Mmap` with `MADV_SEQUENTIAL`, read in place (no copy, through the page
//!   cache).
//!
//! The ways run interleaved, `--reps` rounds, and each figure is reported with its ratio to the
//! engine's way in the same run. Usage (on the journal's device; /tmp here):
//! `cargo run --release -p quire-perf --example design_crates -- --dir /var/tmp/q --reps 3`

// A benchmark's stopwatch is the real clock, whatever clock the code under test reads
// (quire_clock seam, clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use glommio::io::DmaFile;
use glommio::{LocalExecutorBuilder, Placement};
use hdrhistogram::Histogram;
use io_uring::{opcode, squeue, types, IoUring};

const BLOCK: usize = 4096;

#[derive(Parser)]
struct Args {
    /// Directory on the device to measure (not tmpfs: O_DIRECT).
    #[arg(long, default_value = "/var/tmp/quire-design-crates")]
    dir: PathBuf,
    /// Bytes of one journal batch, in KiB (a multiple of 4).
    #[arg(long, default_value_t = 16)]
    batch_kib: usize,
    /// Durable writes per way per round.
    #[arg(long, default_value_t = 2000)]
    writes: usize,
    /// Writes of one way before the next way's turn.
    #[arg(long, default_value_t = 50)]
    block: usize,
    /// Size of the replayed journal file, in MiB.
    #[arg(long, default_value_t = 256)]
    replay_mib: usize,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 3)]
    reps: usize,
}

/// A block-aligned heap buffer (O_DIRECT needs aligned memory).
struct Aligned {
    ptr: *mut u8,
    len: usize,
}

impl Aligned {
    fn new(len: usize, fill: u8) -> Self {
        let layout = std::alloc::Layout::from_size_align(len, BLOCK).unwrap();
        // SAFETY: the layout has a non-zero size; the pointer is checked below.
        let ptr = unsafe { std::alloc::alloc(layout) };
        assert!(!ptr.is_null(), "allocation of {len} bytes");
        // SAFETY: `ptr` points to `len` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(ptr, fill, len) };
        Self { ptr, len }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, BLOCK).unwrap();
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

fn open_direct(path: &Path, len: u64) -> std::fs::File {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // SAFETY: plain fallocate(2) on an open descriptor.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) };
    assert_eq!(r, 0, "fallocate: {}", std::io::Error::last_os_error());
    f
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 10_000_000, 3).unwrap()
}

/// Durable writes through the carried glommio, `dsync` or write + fdatasync.
fn glommio_writes(path: PathBuf, batch: usize, writes: usize, dsync: bool) -> Histogram<u64> {
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(8 << 20)
        .spawn(move || async move {
            let f = glommio::io::OpenOptions::new()
                .read(true)
                .write(true)
                .dma_open(&path)
                .await
                .expect("open");
            let mut h = histogram();
            for i in 0..writes {
                let mut buf = f.alloc_dma_buffer(batch);
                buf.as_bytes_mut().fill(0x5a);
                let pos = (i * batch) as u64;
                let t = Instant::now();
                if dsync {
                    f.write_at_dsync(buf, pos).await.expect("write");
                } else {
                    f.write_at(buf, pos).await.expect("write");
                    f.fdatasync().await.expect("fdatasync");
                }
                h.record(t.elapsed().as_micros() as u64).unwrap();
            }
            f.close().await.expect("close");
            h
        })
        .expect("executor")
        .join()
        .expect("executor panicked")
}

/// Durable writes on a ring of our own with one registered buffer: `WriteFixed` with RWF_DSYNC,
/// or `WriteFixed` linked to `Fsync(DATASYNC)`.
fn uring_writes(path: &Path, batch: usize, writes: usize, linked: bool) -> Histogram<u64> {
    let f = open_direct(path, (batch * writes) as u64);
    let fd = types::Fd(f.as_raw_fd());
    let mut ring = IoUring::new(8).expect("io_uring");
    let buf = Aligned::new(batch, 0x5a);
    let iov = libc::iovec {
        iov_base: buf.ptr.cast(),
        iov_len: batch,
    };
    // SAFETY: the buffer outlives the ring's use of it (unregistered when the ring drops, before
    // `buf`, declared earlier, is dropped).
    unsafe { ring.submitter().register_buffers(&[iov]) }.expect("register_buffers");
    let mut h = histogram();
    for i in 0..writes {
        let pos = (i * batch) as u64;
        let write = opcode::WriteFixed::new(fd, buf.ptr, batch as u32, 0).offset(pos);
        let t = Instant::now();
        let want = if linked {
            let w = write.build().flags(squeue::Flags::IO_LINK).user_data(1);
            let s = opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build()
                .user_data(2);
            // SAFETY: the entries point at the registered buffer, alive until completion.
            unsafe { ring.submission().push_multiple(&[w, s]) }.expect("queue");
            2
        } else {
            let w = write.rw_flags(libc::RWF_DSYNC).build().user_data(1);
            // SAFETY: as above.
            unsafe { ring.submission().push(&w) }.expect("queue");
            1
        };
        ring.submit_and_wait(want).expect("submit");
        let mut done = 0;
        while done < want {
            for c in ring.completion() {
                assert!(
                    c.result() >= 0,
                    "io_uring op {}: {}",
                    c.user_data(),
                    c.result()
                );
                done += 1;
            }
            if done < want {
                ring.submit_and_wait(1).expect("wait");
            }
        }
        h.record(t.elapsed().as_micros() as u64).unwrap();
    }
    drop(ring);
    h
}

/// Blocking `pwritev2(RWF_DSYNC)` on this thread.
fn pwritev2_writes(path: &Path, batch: usize, writes: usize) -> Histogram<u64> {
    let f = open_direct(path, (batch * writes) as u64);
    let buf = Aligned::new(batch, 0x5a);
    let iov = libc::iovec {
        iov_base: buf.ptr.cast(),
        iov_len: batch,
    };
    let mut h = histogram();
    for i in 0..writes {
        let t = Instant::now();
        // SAFETY: one iovec over an allocation of `batch` bytes.
        let n = unsafe {
            libc::pwritev2(
                f.as_raw_fd(),
                &iov,
                1,
                (i * batch) as libc::off_t,
                libc::RWF_DSYNC,
            )
        };
        assert_eq!(
            n,
            batch as isize,
            "pwritev2: {}",
            std::io::Error::last_os_error()
        );
        h.record(t.elapsed().as_micros() as u64).unwrap();
    }
    h
}

/// Creates `path` with `len` bytes of written zeros, synced: the journal pre-creates its files
/// this way (engine/src/journal/files.rs), so its batches overwrite allocated, written blocks
/// and a durable write needs no extent conversion.
fn zero_fill(path: &Path, len: usize) {
    let f = open_direct(path, len as u64);
    let zeros = Aligned::new(1 << 20, 0);
    // SAFETY: the aligned buffer holds 1 MiB.
    let bytes = unsafe { std::slice::from_raw_parts(zeros.ptr, zeros.len) };
    let mut at = 0;
    while at < len {
        let n = (len - at).min(bytes.len());
        f.write_all_at(&bytes[..n], at as u64).expect("zero fill");
        at += n;
    }
    f.sync_all().expect("sync");
}

/// Writes the replay file once: `mib` MiB of non-zero blocks.
fn write_replay_file(path: &Path, mib: usize) {
    let f = open_direct(path, (mib << 20) as u64);
    let chunk = Aligned::new(1 << 20, 0xa5);
    // SAFETY: the aligned buffer holds 1 MiB.
    let bytes = unsafe { std::slice::from_raw_parts(chunk.ptr, chunk.len) };
    for i in 0..mib {
        f.write_all_at(bytes, (i << 20) as u64).expect("write");
    }
    f.sync_all().expect("sync");
}

fn drop_cache(path: &Path) {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: plain posix_fadvise(2).
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0);
}

/// Replay's read: whole file through glommio DMA reads of 1 MiB, copied into one Vec, then
/// CRC32C'd. Returns (time, CRC).
fn replay_dma(path: PathBuf) -> (Duration, u32) {
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(8 << 20)
        .spawn(move || async move {
            let t = Instant::now();
            let f = DmaFile::open(&path).await.expect("open");
            let size = f.file_size().await.expect("size") as usize;
            let mut img = Vec::with_capacity(size);
            while img.len() < size {
                let want = (size - img.len()).min(1 << 20);
                let got = f.read_at(img.len() as u64, want).await.expect("read");
                img.extend_from_slice(&got[..]);
            }
            let crc = crc32c::crc32c(&img);
            let took = t.elapsed();
            f.close().await.expect("close");
            (took, crc)
        })
        .expect("executor")
        .join()
        .expect("executor panicked")
}

/// The same DMA reads with `depth` of them in flight (what replay could do without a mapping).
fn replay_dma_ahead(path: PathBuf, depth: usize) -> (Duration, u32) {
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(16 << 20)
        .spawn(move || async move {
            let t = Instant::now();
            let f = std::rc::Rc::new(DmaFile::open(&path).await.expect("open"));
            let size = f.file_size().await.expect("size") as usize;
            let mut img = Vec::with_capacity(size);
            let mut in_flight = std::collections::VecDeque::new();
            let mut next = 0usize;
            while img.len() < size {
                while in_flight.len() < depth && next < size {
                    let (f, at, want) = (f.clone(), next, (size - next).min(1 << 20));
                    in_flight.push_back(glommio::spawn_local(async move {
                        f.read_at(at as u64, want).await.expect("read")
                    }));
                    next += want;
                }
                let got = in_flight.pop_front().expect("a read in flight").await;
                img.extend_from_slice(&got[..]);
            }
            let crc = crc32c::crc32c(&img);
            let took = t.elapsed();
            drop(img);
            std::rc::Rc::try_unwrap(f)
                .unwrap_or_else(|_| panic!("a read still holds the file"))
                .close()
                .await
                .expect("close");
            (took, crc)
        })
        .expect("executor")
        .join()
        .expect("executor panicked")
}

/// Replay's read through a shared mapping read in place.
fn replay_mmap(path: &Path) -> (Duration, u32) {
    let t = Instant::now();
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: nothing writes the file while it is mapped (this process wrote it before).
    let map = unsafe { memmap2::Mmap::map(&f) }.expect("mmap");
    map.advise(memmap2::Advice::Sequential).expect("madvise");
    let crc = crc32c::crc32c(&map);
    (t.elapsed(), crc)
}

fn micros(h: &Histogram<u64>) -> (f64, u64, u64) {
    (
        h.mean(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
    )
}

fn main() {
    let args = Args::parse();
    assert!(
        args.batch_kib * 1024 % BLOCK == 0,
        "--batch-kib must be a multiple of 4"
    );
    std::fs::create_dir_all(&args.dir).unwrap();
    let batch = args.batch_kib * 1024;
    let names = [
        "glommio-dsync",
        "glommio-write+fdatasync",
        "uring-fixed-dsync",
        "uring-linked-fsync",
        "pwritev2-dsync",
    ];
    let mut write_hists: Vec<Histogram<u64>> = names.iter().map(|_| histogram()).collect();
    let replay = args.dir.join("replay.qj");
    write_replay_file(&replay, args.replay_mib);
    let replay_names = ["dma-read+copy", "dma-read+copy, 4 ahead", "mmap"];
    let mut replay_times = [Duration::ZERO; 3];
    // The disk's flush latency here changes over time (phases of about 4 ms and of about
    // 0.1 ms per durable write, whatever the way), so the ways alternate in blocks of
    // `--block` writes, rotating, instead of running their writes back to back.
    let paths: Vec<PathBuf> = (0..names.len())
        .map(|way| args.dir.join(format!("journal-{way}.qj")))
        .collect();
    for p in &paths {
        zero_fill(p, batch * args.block);
    }
    for rep in 0..args.reps {
        for b in 0..args.writes.div_ceil(args.block) {
            for k in 0..names.len() {
                let way = (k + b + rep) % names.len();
                let path = paths[way].clone();
                let h = match way {
                    0 => glommio_writes(path, batch, args.block, true),
                    1 => glommio_writes(path, batch, args.block, false),
                    2 => uring_writes(&path, batch, args.block, false),
                    3 => uring_writes(&path, batch, args.block, true),
                    _ => pwritev2_writes(&path, batch, args.block),
                };
                write_hists[way].add(&h).unwrap();
            }
        }
        for k in 0..replay_names.len() {
            let way = (k + rep) % replay_names.len();
            drop_cache(&replay);
            let (took, crc) = match way {
                0 => replay_dma(replay.clone()),
                1 => replay_dma_ahead(replay.clone(), 4),
                _ => replay_mmap(&replay),
            };
            assert_eq!(crc, crc32c::crc32c(&vec![0xa5u8; args.replay_mib << 20]));
            replay_times[way] += took;
        }
        eprintln!("round {} of {} done", rep + 1, args.reps);
    }
    std::fs::remove_file(&replay).unwrap();
    for p in &paths {
        std::fs::remove_file(p).unwrap();
    }

    println!(
        "durable journal writes of {} KiB, {} per way per round, {} rounds (µs; ratio to glommio-dsync)",
        args.batch_kib, args.writes, args.reps
    );
    println!(
        "{:<26} {:>9} {:>7} {:>7} {:>11} {:>10}",
        "way", "mean", "p50", "p99", "mean ratio", "p99 ratio"
    );
    let (base_mean, _, base_p99) = micros(&write_hists[0]);
    for (name, h) in names.iter().zip(&write_hists) {
        let (mean, p50, p99) = micros(h);
        println!(
            "{name:<26} {mean:>9.1} {p50:>7} {p99:>7} {:>11.2} {:>10.2}",
            mean / base_mean,
            p99 as f64 / base_p99 as f64
        );
    }
    let per_run = |d: Duration| d.as_secs_f64() * 1000.0 / args.reps as f64;
    println!(
        "replay of a {} MiB journal, page cache dropped (ms per run; ratio to dma-read+copy)",
        args.replay_mib
    );
    for (name, took) in replay_names.iter().zip(replay_times) {
        let ratio = took.as_secs_f64() / replay_times[0].as_secs_f64();
        println!("{name:<26} {:>9.1} {ratio:>11.2}", per_run(took));
    }
}

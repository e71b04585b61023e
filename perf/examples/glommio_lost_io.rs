//! A glommio-only reproduction of the bookie shard that waited for good on its journal writes
//! (perf/README.md, "A shard that waited on its journal writes").
//!
//! Each of `--shards` executors mimics one bookie shard:
//! * a latency-sensitive task queue (1000 shares, `Latency::Matters(1 ms)`) runs a journal
//!   writer: it takes queued records, writes them with `write_at` on an O_DIRECT `DmaFile`,
//!   `fdatasync`s, answers the senders, and rolls to a pre-created file when the current one is
//!   full;
//! * a background task queue (50 shares, `Latency::NotImportant`) pre-creates the next journal
//!   (zero writes of 256 KiB and one `fdatasync`) once the current one is half full, and runs a
//!   checkpoint-like loop of bulk 256 KiB writes to an entry log, synced every 4 MiB, with old
//!   files removed through glommio's blocking thread;
//! * a TCP server on 127.0.0.1 (glommio sockets: accept and receive land on the latency ring)
//!   whose connection tasks send each request to a journal writer, a third of them to another
//!   shard's writer over a flume channel, so that the wake-ups cross threads both ways;
//! * a few timers.
//!
//! One more executor runs the TCP clients, and `--burners` threads spin to take the CPU from
//! the shards. A plain monitor thread (nothing on the executors) watches every disk I/O in
//! flight: one pending for more than 1 s is printed (again at 2 s, 4 s, ...) with its shard,
//! task and operation; one pending for `--fail-after-seconds` makes the program print the
//! summary and exit with status 1. Exit status 0: no I/O stayed pending that long in
//! `--seconds`.
//!
//! Run: `cargo run --release -p quire-perf --example glommio_lost_io -- --seconds 60`
//! (`--help` for the options; `TMPDIR` or `--dir` must be on a real file system, not tmpfs).

// A benchmark's stopwatch is the real clock, whatever clock the code under test reads
// (quire_clock seam, clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::io::{DmaFile, OpenOptions};
use glommio::net::{TcpListener, TcpStream};
use glommio::{executor, Latency, LocalExecutorBuilder, Placement, Shares};

const BLOCK: usize = 4096;
const CHUNK: usize = 256 * 1024;
const JOURNAL_FILE_BYTES: u64 = 64 << 20;
const ENTRY_LOG_BYTES: u64 = 128 << 20;
const SYNC_EVERY_BYTES: u64 = 4 << 20;
const REQUEST_BYTES: usize = 16 * 1024;

/// One disk I/O slot per task that does I/O: the monitor thread reads it.
struct OpSlot {
    shard: usize,
    task: &'static str,
    /// Nanoseconds since the program's epoch when the current I/O was issued; 0 when idle.
    started_ns: AtomicU64,
    /// Index into [`OPS`] of the current I/O.
    op: AtomicUsize,
    done: AtomicU64,
}

const OPS: [&str; 3] = ["write_at", "fdatasync", "remove"];

struct Shared {
    epoch: Instant,
    slots: Mutex<Vec<Arc<OpSlot>>>,
    stop: AtomicBool,
    records: AtomicU64,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }
    fn slot(&self, shard: usize, task: &'static str) -> Arc<OpSlot> {
        let s = Arc::new(OpSlot {
            shard,
            task,
            started_ns: AtomicU64::new(0),
            op: AtomicUsize::new(0),
            done: AtomicU64::new(0),
        });
        self.slots.lock().unwrap().push(s.clone());
        s
    }
}

/// Marks `slot` busy with `op` while `f` runs.
async fn tracked<T>(
    shared: &Shared,
    slot: &OpSlot,
    op: usize,
    f: impl std::future::Future<Output = T>,
) -> T {
    slot.op.store(op, Ordering::Relaxed);
    slot.started_ns.store(shared.now_ns(), Ordering::Release);
    let v = f.await;
    slot.started_ns.store(0, Ordering::Release);
    slot.done.fetch_add(1, Ordering::Relaxed);
    v
}

async fn write_all(shared: &Shared, slot: &OpSlot, f: &DmaFile, pos: u64, data: &[u8]) {
    let mut done = 0;
    while done < data.len() {
        let n = (data.len() - done).min(CHUNK);
        let mut buf = f.alloc_dma_buffer(n);
        buf.as_bytes_mut().copy_from_slice(&data[done..done + n]);
        let w = tracked(shared, slot, 0, f.write_at(buf, pos + done as u64))
            .await
            .expect("write_at");
        assert_eq!(w, n, "short write");
        done += n;
    }
}

async fn zero_fill(shared: &Shared, slot: &OpSlot, f: &DmaFile, bytes: u64) {
    let mut pos = 0;
    while pos < bytes {
        let mut buf = f.alloc_dma_buffer(CHUNK);
        buf.as_bytes_mut().fill(0);
        tracked(shared, slot, 0, f.write_at(buf, pos))
            .await
            .expect("zero write");
        pos += CHUNK as u64;
    }
    tracked(shared, slot, 1, f.fdatasync())
        .await
        .expect("fdatasync");
}

async fn open(path: &Path) -> DmaFile {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .dma_open(path)
        .await
        .unwrap_or_else(|e| panic!("open {path:?}: {e}"))
}

/// A record for a journal writer and the channel its answer goes to.
struct Record {
    bytes: usize,
    reply: flume::Sender<()>,
}

/// The journal writer: group commit of whatever is queued, write_at + fdatasync, roll to the
/// pre-created next file at JOURNAL_FILE_BYTES.
async fn journal_writer(
    shared: Arc<Shared>,
    shard: usize,
    dir: PathBuf,
    rx: flume::Receiver<Record>,
    background: glommio::TaskQueueHandle,
) {
    let slot = shared.slot(shard, "journal");
    let pre_slot = shared.slot(shard, "precreate");
    let mut id = 0u64;
    let mut file = open(&dir.join(format!("journal-{id}"))).await;
    let mut pos = 0u64;
    let mut next: Option<glommio::Task<DmaFile>> = None;
    let payload = vec![0x5au8; 2 << 20];
    while let Ok(first) = rx.recv_async().await {
        let mut group = vec![first];
        while let Ok(r) = rx.try_recv() {
            group.push(r);
            if group.len() >= 64 {
                break;
            }
        }
        let bytes: usize = group.iter().map(|r| r.bytes).sum::<usize>() + 64;
        let len = bytes.div_ceil(BLOCK) * BLOCK;
        if pos + len as u64 > JOURNAL_FILE_BYTES {
            let pre = match next.take() {
                Some(t) => t,
                None => start_precreate(&shared, &pre_slot, &dir, id + 1, background),
            };
            let new_file = pre.await;
            let old = std::mem::replace(&mut file, new_file);
            let _ = old.close().await;
            let old_path = dir.join(format!("journal-{id}"));
            tracked(&shared, &slot, 2, glommio::io::remove(&old_path))
                .await
                .expect("remove journal");
            id += 1;
            pos = 0;
        }
        write_all(&shared, &slot, &file, pos, &payload[..len]).await;
        tracked(&shared, &slot, 1, file.fdatasync())
            .await
            .expect("journal fdatasync");
        pos += len as u64;
        shared
            .records
            .fetch_add(group.len() as u64, Ordering::Relaxed);
        for r in group {
            let _ = r.reply.try_send(());
        }
        if next.is_none() && pos >= JOURNAL_FILE_BYTES / 2 {
            next = Some(start_precreate(
                &shared,
                &pre_slot,
                &dir,
                id + 1,
                background,
            ));
        }
    }
}

fn start_precreate(
    shared: &Arc<Shared>,
    slot: &Arc<OpSlot>,
    dir: &Path,
    id: u64,
    background: glommio::TaskQueueHandle,
) -> glommio::Task<DmaFile> {
    let shared = shared.clone();
    let slot = slot.clone();
    let path = dir.join(format!("journal-{id}"));
    glommio::spawn_local_into(
        async move {
            let f = open(&path).await;
            zero_fill(&shared, &slot, &f, JOURNAL_FILE_BYTES).await;
            f
        },
        background,
    )
    .expect("spawn pre-creation")
}

/// Checkpoint-like bulk writes: bursts of 4-24 MiB every 100 ms, synced every 4 MiB, entry logs
/// rotated and the older ones removed.
async fn checkpointer(shared: Arc<Shared>, shard: usize, dir: PathBuf) {
    let slot = shared.slot(shard, "checkpoint");
    let data = vec![0xc3u8; CHUNK];
    let mut id = 0u64;
    let mut file = open(&dir.join(format!("entrylog-{id}"))).await;
    let mut pos = 0u64;
    let mut unsynced = 0u64;
    let mut burst = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        glommio::timer::sleep(Duration::from_millis(100)).await;
        burst = (burst + 1) % 6;
        let burst_bytes = (4 + burst * 4) << 20;
        let mut written = 0;
        while written < burst_bytes {
            write_all(&shared, &slot, &file, pos, &data).await;
            pos += CHUNK as u64;
            written += CHUNK as u64;
            unsynced += CHUNK as u64;
            if unsynced >= SYNC_EVERY_BYTES {
                tracked(&shared, &slot, 1, file.fdatasync())
                    .await
                    .expect("bulk fdatasync");
                unsynced = 0;
            }
            if pos >= ENTRY_LOG_BYTES {
                tracked(&shared, &slot, 1, file.fdatasync())
                    .await
                    .expect("bulk fdatasync");
                let old = std::mem::replace(
                    &mut file,
                    open(&dir.join(format!("entrylog-{}", id + 1))).await,
                );
                let _ = old.close().await;
                tracked(
                    &shared,
                    &slot,
                    2,
                    glommio::io::remove(dir.join(format!("entrylog-{id}"))),
                )
                .await
                .expect("remove entry log");
                id += 1;
                pos = 0;
            }
        }
    }
}

/// One server connection: reads fixed-size requests, sends each to a journal writer (a third
/// to the next shard's, across threads), answers once it is durable.
async fn serve(mut stream: TcpStream, local: flume::Sender<Record>, remote: flume::Sender<Record>) {
    let n = Cell::new(0u64);
    let mut req = vec![0u8; REQUEST_BYTES];
    let inflight: RefCell<VecDeque<flume::Receiver<()>>> = RefCell::new(VecDeque::new());
    loop {
        if stream.read_exact(&mut req).await.is_err() {
            return;
        }
        n.set(n.get() + 1);
        let (reply, reply_rx) = flume::bounded(1);
        let to = if n.get().is_multiple_of(3) {
            &remote
        } else {
            &local
        };
        if to
            .send_async(Record {
                bytes: REQUEST_BYTES,
                reply,
            })
            .await
            .is_err()
        {
            return;
        }
        inflight.borrow_mut().push_back(reply_rx);
        // Answer in order, keeping up to 8 requests of this connection in flight.
        while inflight.borrow().len() >= 8 {
            let rx = inflight.borrow_mut().pop_front().expect("non-empty");
            if rx.recv_async().await.is_err() || stream.write_all(&[1u8; 8]).await.is_err() {
                return;
            }
        }
    }
}

async fn shard_main(
    shared: Arc<Shared>,
    shard: usize,
    dir: PathBuf,
    rx: flume::Receiver<Record>,
    local_tx: flume::Sender<Record>,
    remote_tx: flume::Sender<Record>,
    addr_tx: std::sync::mpsc::Sender<(usize, std::net::SocketAddr)>,
) {
    std::fs::create_dir_all(&dir).expect("shard dir");
    // A non-empty file first, as the engine's prepare_dir does: glommio probes iopoll
    // support on the first DMA file of a device and an empty one gets it wrong.
    let probe = dir.join("io-probe");
    std::fs::write(&probe, vec![0x51u8; BLOCK]).expect("probe file");
    DmaFile::open(&probe)
        .await
        .expect("probe open")
        .close()
        .await
        .expect("probe close");
    let journal_tq = executor().create_task_queue(
        Shares::Static(1000),
        Latency::Matters(Duration::from_millis(1)),
        "journal",
    );
    let background_tq =
        executor().create_task_queue(Shares::Static(50), Latency::NotImportant, "background");
    let net_tq = executor().create_task_queue(
        Shares::Static(1000),
        Latency::Matters(Duration::from_millis(1)),
        "tail-write",
    );
    let writer = glommio::spawn_local_into(
        journal_writer(shared.clone(), shard, dir.clone(), rx, background_tq),
        journal_tq,
    )
    .expect("spawn writer");
    let ckpt = glommio::spawn_local_into(checkpointer(shared.clone(), shard, dir), background_tq)
        .expect("spawn checkpointer");
    // Timers of assorted lengths, as the shard's long polls and timeouts have.
    let timers = glommio::spawn_local(async move {
        let mut i = 0u64;
        loop {
            glommio::timer::sleep(Duration::from_micros(300 + (i % 7) * 700)).await;
            i += 1;
        }
    })
    .detach();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    addr_tx
        .send((shard, listener.local_addr().expect("addr")))
        .expect("addr");
    let accept = glommio::spawn_local_into(
        async move {
            while let Ok(s) = listener.accept().await {
                glommio::spawn_local_into(serve(s, local_tx.clone(), remote_tx.clone()), net_tq)
                    .expect("spawn conn")
                    .detach();
            }
        },
        net_tq,
    )
    .expect("spawn accept")
    .detach();
    while !shared.stop.load(Ordering::Relaxed) {
        glommio::timer::sleep(Duration::from_millis(50)).await;
    }
    drop(timers);
    drop(accept);
    ckpt.await;
    drop(writer);
}

/// TCP clients: `conns` connections per shard, each writing requests as fast as the answers
/// let it.
async fn clients(shared: Arc<Shared>, addrs: Vec<std::net::SocketAddr>, conns: usize) {
    let mut tasks = Vec::new();
    for addr in addrs {
        for _ in 0..conns {
            let shared = shared.clone();
            tasks.push(glommio::spawn_local(async move {
                let mut s = TcpStream::connect(addr).await.expect("connect");
                let req = vec![7u8; REQUEST_BYTES];
                let mut ack = [0u8; 8];
                let mut sent = 0u64;
                let mut acked = 0u64;
                while !shared.stop.load(Ordering::Relaxed) {
                    if s.write_all(&req).await.is_err() {
                        return;
                    }
                    sent += 1;
                    while sent - acked >= 8 {
                        if s.read_exact(&mut ack).await.is_err() {
                            return;
                        }
                        acked += 1;
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await;
    }
}

/// What the kernel holds for this process: every thread's state and kernel stack, the block
/// layer's in-flight counts and each io_uring's fdinfo (SQ/CQ heads and tails, the overflow
/// list, pending polls).
fn dump_kernel_state() {
    let inflight = std::fs::read_dir("/sys/block")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| {
                    let f = e.path().join("inflight");
                    format!(
                        "{}: {}",
                        e.file_name().to_string_lossy(),
                        std::fs::read_to_string(f).unwrap_or_default().trim()
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default();
    eprintln!("block layer in flight (reads writes): {inflight}");
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.filter_map(|e| e.ok()) {
            let p = t.path();
            let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
            let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
            let state = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .next()
                .unwrap_or("?")
                .to_string();
            let stack = std::fs::read_to_string(p.join("stack")).unwrap_or_default();
            let top: Vec<&str> = stack.lines().take(4).collect();
            eprintln!(
                "thread {} {} state {}: {}",
                t.file_name().to_string_lossy(),
                comm.trim(),
                state,
                top.join(" < ")
            );
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        for fd in fds.filter_map(|e| e.ok()) {
            let target = std::fs::read_link(fd.path()).unwrap_or_default();
            if target.to_string_lossy().contains("io_uring") {
                let n = fd.file_name().to_string_lossy().to_string();
                let info =
                    std::fs::read_to_string(format!("/proc/self/fdinfo/{n}")).unwrap_or_default();
                let keep: Vec<&str> = info
                    .lines()
                    .filter(|l| {
                        !l.starts_with("pos:")
                            && !l.starts_with("flags:")
                            && !l.starts_with("mnt_id:")
                            && !l.starts_with("ino:")
                    })
                    .collect();
                eprintln!("io_uring fd {n}: {}", keep.join(" | "));
            }
        }
    }
}

struct Args {
    seconds: u64,
    shards: usize,
    conns: usize,
    burners: usize,
    fail_after: u64,
    dir: PathBuf,
}

fn parse_args() -> Args {
    let mut a = Args {
        seconds: 60,
        shards: 3,
        conns: 4,
        burners: 2,
        fail_after: 5,
        dir: std::env::temp_dir(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--seconds" => a.seconds = v().parse().expect("--seconds"),
            "--shards" => a.shards = v().parse().expect("--shards"),
            "--conns" => a.conns = v().parse().expect("--conns"),
            "--burners" => a.burners = v().parse().expect("--burners"),
            "--fail-after-seconds" => a.fail_after = v().parse().expect("--fail-after-seconds"),
            "--dir" => a.dir = PathBuf::from(v()),
            _ => {
                eprintln!(
                    "usage: glommio_lost_io [--seconds 60] [--shards 3] [--conns 4 per shard] \
                     [--burners 2] [--fail-after-seconds 5] [--dir DIR]"
                );
                std::process::exit(2);
            }
        }
    }
    a
}

fn main() {
    let args = parse_args();
    let root = args
        .dir
        .join(format!("glommio-lost-io-{}", std::process::id()));
    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        slots: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        records: AtomicU64::new(0),
    });
    let chans: Vec<_> = (0..args.shards)
        .map(|_| flume::bounded::<Record>(1024))
        .collect();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let mut handles = Vec::new();
    for shard in 0..args.shards {
        let rx = chans[shard].1.clone();
        let local_tx = chans[shard].0.clone();
        let remote_tx = chans[(shard + 1) % args.shards].0.clone();
        let dir = root.join(format!("shard-{shard}"));
        let shared = shared.clone();
        let addr_tx = addr_tx.clone();
        handles.push(
            LocalExecutorBuilder::new(Placement::Unbound)
                .name(&format!("lost-io-shard-{shard}"))
                .io_memory(2 << 20)
                .spawn(move || shard_main(shared, shard, dir, rx, local_tx, remote_tx, addr_tx))
                .expect("spawn shard"),
        );
    }
    drop(chans);
    let mut addrs: Vec<_> = (0..args.shards)
        .map(|_| addr_rx.recv().expect("addr"))
        .collect();
    addrs.sort();
    let addrs: Vec<_> = addrs.into_iter().map(|(_, a)| a).collect();
    {
        let shared = shared.clone();
        let conns = args.conns;
        handles.push(
            LocalExecutorBuilder::new(Placement::Unbound)
                .name("lost-io-clients")
                .spawn(move || clients(shared, addrs, conns))
                .expect("spawn clients"),
        );
    }
    for _ in 0..args.burners {
        let shared = shared.clone();
        std::thread::spawn(move || {
            // Spin 2 ms, rest 1 ms: contention that comes and goes, as compiles do.
            while !shared.stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(2) {
                    std::hint::spin_loop();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
    }

    let end = Instant::now() + Duration::from_secs(args.seconds);
    let mut warned: Vec<(usize, u64, u64)> = Vec::new();
    let mut failed = false;
    let mut last_report = Instant::now();
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(200));
        let now = shared.now_ns();
        for (i, s) in shared.slots.lock().unwrap().iter().enumerate() {
            let started = s.started_ns.load(Ordering::Acquire);
            if started == 0 {
                continue;
            }
            let pending_ms = (now.saturating_sub(started)) / 1_000_000;
            if pending_ms < 1000 {
                continue;
            }
            let next = warned
                .iter_mut()
                .find(|(j, st, _)| *j == i && *st == started);
            let due = match &next {
                Some((_, _, at)) => pending_ms >= *at,
                None => true,
            };
            if due {
                eprintln!(
                    "PENDING shard {} task {} op {} for {} ms (done before: {})",
                    s.shard,
                    s.task,
                    OPS[s.op.load(Ordering::Relaxed)],
                    pending_ms,
                    s.done.load(Ordering::Relaxed)
                );
                let again = (pending_ms / 1000 + 1).next_power_of_two() * 1000;
                match next {
                    Some(e) => e.2 = again,
                    None => warned.push((i, started, again)),
                }
            }
            if pending_ms >= args.fail_after * 1000 {
                failed = true;
            }
        }
        if failed {
            break;
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            last_report = Instant::now();
            eprintln!(
                "{:>4} s: {} records durable",
                shared.epoch.elapsed().as_secs(),
                shared.records.load(Ordering::Relaxed)
            );
        }
    }
    let records = shared.records.load(Ordering::Relaxed);
    if failed {
        dump_kernel_state();
        eprintln!(
            "FAIL: a disk I/O stayed pending for {} s or more ({records} records durable); \
             data left in {root:?}",
            args.fail_after
        );
        std::process::exit(1);
    }
    shared.stop.store(true, Ordering::Relaxed);
    drop(handles);
    let _ = std::fs::remove_dir_all(&root);
    eprintln!(
        "OK: no disk I/O pending {} s in {} s ({records} records durable)",
        args.fail_after, args.seconds
    );
    std::process::exit(0);
}

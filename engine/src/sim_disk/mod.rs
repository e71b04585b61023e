//! A crash-simulating disk: an in-memory [`Storage`] that knows which of its bytes and directory
//! entries are durable, for crash tests of the engine (engine/tests/it/crash_sim.rs).
//!
//! # Model
//! Every file is an inode with two images: the live one (what reads see: every completed write,
//! as a real disk answers) and the durable one (what survives a crash). A write changes the live
//! image only and is remembered as unsynced; [`StorageFile::fdatasync`] makes all of the file's
//! completed writes (and its size) durable. Each directory likewise has live and durable entries
//! (name -> inode): [`Storage::open`] with `create`, [`Storage::rename`] and [`Storage::remove`]
//! change the live entries only, and [`Storage::sync_dir`] makes the directory's live entries
//! durable. That is all POSIX promises (fsync(2), rename(2)); a real file system often persists
//! more, so an engine that passes here relies on nothing beyond the promise. An open file keeps
//! its inode after a rename or removal, as on POSIX. Directories themselves (made by
//! [`Storage::prepare_dir`]) are durable at once: the engine creates them before it acknowledges
//! anything.
//!
//! # Crash
//! [`SimStorage::crash`] (now) or [`SimStorage::crash_at_op`] (during the n-th counted operation
//! from now: write, fdatasync, rename, remove, sync_dir, or an open that creates a file;
//! [`SimStorage::crash_at_matching_op`] counts only the operations a filter accepts) takes the
//! durable image and, if asked, tears the last unsynced write: a prefix of whole 512-byte sectors
//! of it, or (when bit 63 of the tear value is set) a suffix, is made durable as well (the part
//! a power cut let reach the medium; a device may store a write's sectors in any order);
//! [`SimStorage::keep_unsynced_writes`] also keeps a seeded subset of the earlier unsynced
//! writes (a device may store any completed write before a flush). The crashed operation and
//! every later call on this storage or its files fail with an `io::Error` whose message starts
//! with "simulated crash" (they never hang, so the engine's error paths run and its tasks end).
//! [`SimStorage::crash_report`] returns the image, which [`SimStorage::from_image`] turns into a
//! fresh disk to reopen the engine on.
//!
//! # Storage faults
//! [`SimStorage::inject`] arms a [`Fault`] (a flipped bit in data read back, EIO on a read or a
//! write, an fdatasync that reports success and keeps nothing, a misdirected write) for the
//! n-th matching read, write or fdatasync; [`SimStorage::rot`] flips a stored bit (bit rot, seen
//! by every later read and kept by a crash); a tear value with [`TEAR_HOLE`] set tears the last
//! write in the middle instead of at an end. See `faults`.
//!
//! # Scheduling
//! Operations complete in memory; each first yields to the executor 0 to 2 times (chosen by the
//! seed), so that the engine's concurrent tasks (journal writer, checkpoint, journal
//! pre-creation) interleave as they do on a real disk.
//!
//! # Threading
//! Shard-local (`!Send`): a storage and its files share one `Rc`. A [`SimImage`] is plain data
//! and may move between executors.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::io::{Storage, StorageFile, BLOCK_BYTES};

mod faults;
pub use faults::{Fault, PathFilter};
use faults::{Faults, On, WriteFault};

/// Set in a tear value (with bit 63 clear) on a disk with [`SimStorage::tear_holes`] on, the
/// torn write keeps its first and last sectors and loses a seeded run of sectors between them:
/// a torn write in the middle of a page (a device may store a write's sectors in any order). A
/// write under 3 sectors is dropped whole. Off (the default), the bit is ignored, so the seeds
/// of the crash tests keep their tears.
pub const TEAR_HOLE: u64 = 1 << 62;

/// Size of the unit a torn write keeps or loses, in bytes (a disk sector).
pub const SECTOR_BYTES: usize = 512;
/// How many of the latest counted operations a [`CrashReport`] lists.
const TRACE_OPS_MAX: usize = 32;

/// The durable contents of a crashed disk: directory -> file name -> bytes. Plain data (`Send`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimImage {
    pub dirs: BTreeMap<PathBuf, BTreeMap<String, Vec<u8>>>,
}

impl SimImage {
    /// The bytes of the file at `path`, if the image holds it.
    pub fn file(&self, path: &Path) -> Option<&[u8]> {
        let (dir, name) = split(path).ok()?;
        self.dirs.get(dir)?.get(name).map(Vec::as_slice)
    }
}

/// What a crash kept and where it happened.
#[derive(Debug, Clone)]
pub struct CrashReport {
    /// Number (from 1, since the storage was made) of the counted operation the crash happened
    /// in, or of the last one before an explicit [`SimStorage::crash`].
    pub op_number: u64,
    /// The operation the crash happened in (`None` for an explicit crash between operations).
    pub during: Option<String>,
    /// The torn write, `(path, file offset, length, bytes kept)`, if one was torn.
    pub torn: Option<(PathBuf, u64, usize, usize)>,
    /// Unsynced writes dropped wholly or partly (a torn one counts unless all of it was kept).
    pub unsynced_writes_dropped: usize,
    /// The latest counted operations, oldest first, at most 32.
    pub recent_ops: Vec<String>,
    /// The durable image.
    pub image: SimImage,
}

impl fmt::Display for CrashReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.during {
            Some(op) => writeln!(f, "crash during op #{}: {op}", self.op_number)?,
            None => writeln!(f, "crash after op #{}", self.op_number)?,
        }
        match &self.torn {
            Some((p, pos, len, kept)) => writeln!(
                f,
                "torn write: {} @{pos} +{len}, {kept} bytes kept",
                p.display()
            )?,
            None => writeln!(f, "no torn write")?,
        }
        writeln!(
            f,
            "unsynced writes dropped: {}",
            self.unsynced_writes_dropped
        )?;
        writeln!(f, "recent ops:")?;
        for op in &self.recent_ops {
            writeln!(f, "  {op}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Inode {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Its latest live path (kept after a removal), for traces and crash filters.
    path: PathBuf,
}

#[derive(Debug, Default)]
struct Dir {
    live: BTreeMap<String, usize>,
    durable: BTreeMap<String, usize>,
}

/// A write not yet made durable by an fdatasync of its file.
#[derive(Debug)]
struct UnsyncedWrite {
    inode: usize,
    path: PathBuf,
    pos: u64,
    data: Vec<u8>,
}

/// The kinds of operation a crash can be armed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// An open that creates a missing file.
    Create,
    Write,
    Fdatasync,
    Rename,
    Remove,
    SyncDir,
}

/// Which counted operations count toward an armed crash: `(kind, path)`, the path being the
/// file's (as opened), the renamed file's old one or the synced directory's.
pub type OpFilter = Box<dyn Fn(OpKind, &Path) -> bool>;

struct Armed {
    /// Matching operations still to go; the crash happens in the one that brings this to 0.
    left: u64,
    filter: OpFilter,
    tear: Option<u64>,
}

struct Disk {
    /// Never freed: an unlinked inode may still be open, and tests are small.
    inodes: Vec<Inode>,
    dirs: BTreeMap<PathBuf, Dir>,
    /// Oldest first; the last one is the write a crash may tear.
    unsynced: Vec<UnsyncedWrite>,
    ops: u64,
    armed: Option<Armed>,
    /// Seed of the coins that keep or drop each earlier unsynced write at a crash.
    keep_unsynced: Option<u64>,
    crashed: Option<CrashReport>,
    trace: VecDeque<String>,
    rng: u64,
    faults: Faults,
    /// Whether a tear value with [`TEAR_HOLE`] tears a hole.
    tear_holes: bool,
}

/// splitmix64: small, seedable, good enough to pick yield counts.
fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn crash_error() -> io::Error {
    io::Error::other("simulated crash: the disk is gone")
}

fn split(path: &Path) -> io::Result<(&Path, &str)> {
    let dir = path.parent();
    let name = path.file_name().and_then(|n| n.to_str());
    match (dir, name) {
        (Some(d), Some(n)) => Ok((d, n)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file in a directory", path.display()),
        )),
    }
}

fn not_found(what: &str, path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{what} {} not found", path.display()),
    )
}

impl Disk {
    fn check_up(&self) -> io::Result<()> {
        if self.crashed.is_some() {
            return Err(crash_error());
        }
        Ok(())
    }

    /// Counts one operation; crashes the disk if it is the armed one. `Err` means the operation
    /// must not take effect (a write is recorded as unsynced first so that it can tear); `Ok`
    /// hands the write back.
    fn count(
        &mut self,
        kind: OpKind,
        path: &Path,
        what: String,
        write: Option<UnsyncedWrite>,
    ) -> io::Result<Option<UnsyncedWrite>> {
        self.check_up()?;
        self.ops += 1;
        let line = format!("#{} {what}", self.ops);
        if self.trace.len() == TRACE_OPS_MAX {
            self.trace.pop_front();
        }
        self.trace.push_back(line.clone());
        let fire = match &mut self.armed {
            Some(a) if (a.filter)(kind, path) => {
                a.left -= 1;
                a.left == 0
            }
            _ => false,
        };
        if fire {
            let tear = self.armed.take().and_then(|a| a.tear);
            if let Some(w) = write {
                self.unsynced.push(w);
            }
            self.do_crash(Some(line), tear);
            return Err(crash_error());
        }
        Ok(write)
    }

    fn do_crash(&mut self, during: Option<String>, tear: Option<u64>) {
        assert!(self.crashed.is_none(), "a disk crashes once");
        let (image, torn, dropped) = self.durable_image(tear, self.keep_unsynced);
        self.unsynced.clear();
        self.crashed = Some(CrashReport {
            op_number: self.ops,
            during,
            torn,
            unsynced_writes_dropped: dropped,
            recent_ops: self.trace.iter().cloned().collect(),
            image,
        });
    }

    /// What a crash now would leave: the image, the torn write and the count of dropped writes.
    #[allow(clippy::type_complexity)]
    fn durable_image(
        &self,
        tear: Option<u64>,
        keep_unsynced: Option<u64>,
    ) -> (SimImage, Option<(PathBuf, u64, usize, usize)>, usize) {
        let mut image = SimImage::default();
        let mut reachable: BTreeMap<usize, (PathBuf, String)> = BTreeMap::new();
        for (dpath, d) in &self.dirs {
            let files = image.dirs.entry(dpath.clone()).or_default();
            for (name, &ino) in &d.durable {
                files.insert(name.clone(), self.inodes[ino].durable.clone());
                reachable.insert(ino, (dpath.clone(), name.clone()));
            }
        }
        // Makes bytes `from..to` of write `w` durable.
        let keep_bytes = |image: &mut SimImage, w: &UnsyncedWrite, from: usize, to: usize| {
            if let Some((dpath, name)) = reachable.get(&w.inode) {
                let f = image
                    .dirs
                    .get_mut(dpath)
                    .and_then(|d| d.get_mut(name))
                    .expect("a reachable inode has an image");
                let pos = w.pos as usize;
                if f.len() < pos + to {
                    f.resize(pos + to, 0);
                }
                f[pos + from..pos + to].copy_from_slice(&w.data[from..to]);
            }
        };
        let mut dropped = self.unsynced.len();
        // The earlier unsynced writes, oldest first, each whole or not at all.
        let torn_one = if tear.is_some() { 1 } else { 0 };
        let earlier = self.unsynced.len().saturating_sub(torn_one);
        if let Some(mut coin) = keep_unsynced {
            for w in &self.unsynced[..earlier] {
                if next_random(&mut coin).is_multiple_of(2) {
                    keep_bytes(&mut image, w, 0, w.data.len());
                    dropped -= 1;
                }
            }
        }
        let mut torn = None;
        if let (Some(r), Some(w)) = (tear, self.unsynced.last()) {
            let sectors = w.data.len().div_ceil(SECTOR_BYTES);
            if self.tear_holes && r >> 62 == 1 {
                // A hole: both ends reach the medium, the middle does not.
                let kept = match faults::hole(sectors, r) {
                    Some((a, b)) => {
                        keep_bytes(&mut image, w, 0, a * SECTOR_BYTES);
                        keep_bytes(&mut image, w, b * SECTOR_BYTES, w.data.len());
                        w.data.len() - (b - a) * SECTOR_BYTES
                    }
                    None => 0,
                };
                torn = Some((w.path.clone(), w.pos, w.data.len(), kept));
                return (image, torn, dropped);
            }
            let n = ((r & !(1 << 63)) % (sectors as u64 + 1)) as usize;
            let (from, to) = if r >> 63 == 0 {
                (0, (n * SECTOR_BYTES).min(w.data.len()))
            } else {
                // The last `n` sectors (the write's end may be a short sector).
                ((sectors - n) * SECTOR_BYTES, w.data.len())
            };
            keep_bytes(&mut image, w, from, to);
            if to - from == w.data.len() {
                dropped -= 1;
            }
            torn = Some((w.path.clone(), w.pos, w.data.len(), to - from));
        }
        (image, torn, dropped)
    }

    fn dir(&self, dir: &Path) -> io::Result<&Dir> {
        self.dirs
            .get(dir)
            .ok_or_else(|| not_found("directory", dir))
    }

    fn dir_mut(&mut self, dir: &Path) -> io::Result<&mut Dir> {
        self.dirs
            .get_mut(dir)
            .ok_or_else(|| not_found("directory", dir))
    }

    fn lookup(&self, path: &Path) -> io::Result<usize> {
        let (dir, name) = split(path)?;
        self.dir(dir)?
            .live
            .get(name)
            .copied()
            .ok_or_else(|| not_found("file", path))
    }
}

/// The crash-simulating disk (see the module doc). Cloning gives another handle to the same disk.
/// Shard-local.
#[derive(Clone)]
pub struct SimStorage {
    disk: Rc<RefCell<Disk>>,
}

impl fmt::Debug for SimStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.disk.borrow();
        f.debug_struct("SimStorage")
            .field("ops", &d.ops)
            .field("unsynced_writes", &d.unsynced.len())
            .field("crashed", &d.crashed.is_some())
            .finish()
    }
}

impl SimStorage {
    /// An empty disk. `seed` picks how often each operation yields to the executor.
    pub fn new(seed: u64) -> Self {
        Self::from_image(&SimImage::default(), seed)
    }

    /// A disk holding `image`, all of it durable (what a machine finds after a crash).
    pub fn from_image(image: &SimImage, seed: u64) -> Self {
        let mut disk = Disk {
            inodes: Vec::new(),
            dirs: BTreeMap::new(),
            unsynced: Vec::new(),
            ops: 0,
            armed: None,
            keep_unsynced: None,
            crashed: None,
            trace: VecDeque::new(),
            rng: seed,
            faults: Faults::default(),
            tear_holes: false,
        };
        for (dpath, files) in &image.dirs {
            let mut d = Dir::default();
            for (name, bytes) in files {
                disk.inodes.push(Inode {
                    live: bytes.clone(),
                    durable: bytes.clone(),
                    path: dpath.join(name),
                });
                d.live.insert(name.clone(), disk.inodes.len() - 1);
            }
            d.durable = d.live.clone();
            disk.dirs.insert(dpath.clone(), d);
        }
        Self {
            disk: Rc::new(RefCell::new(disk)),
        }
    }

    /// Arms a crash during the `n`-th counted operation from now (`n >= 1`; counted: write,
    /// fdatasync, rename, remove, sync_dir, an open that creates a file). `tear`: `None` drops
    /// every unsynced write; `Some(r)` keeps the first `r % (s + 1)` whole sectors of the last
    /// unsynced write (of `s` sectors) and drops the rest (the last ones with bit 63 set; a hole
    /// in the middle with [`TEAR_HOLE`] on a disk with [`SimStorage::tear_holes`]). Replaces an
    /// earlier arming.
    pub fn crash_at_op(&self, n: u64, tear: Option<u64>) {
        self.crash_at_matching_op(n, Box::new(|_, _| true), tear);
    }

    /// Like [`SimStorage::crash_at_op`], counting only the operations `filter` accepts (e.g. the
    /// journal's writes and syncs).
    pub fn crash_at_matching_op(&self, n: u64, filter: OpFilter, tear: Option<u64>) {
        assert!(n >= 1, "the crash is armed for a later operation");
        self.disk.borrow_mut().armed = Some(Armed {
            left: n,
            filter,
            tear,
        });
    }

    /// With `Some(seed)`, a later crash also keeps each unsynced write before the last one (or
    /// each one, when the last is not torn) whole or drops it, by a coin drawn from `seed`, as a
    /// device may store any completed write before a flush; `None` (the default) drops them all.
    pub fn keep_unsynced_writes(&self, seed: Option<u64>) {
        self.disk.borrow_mut().keep_unsynced = seed;
    }

    /// Crashes now, between operations (a no-op if the disk already crashed), and returns the
    /// report; `tear` as in [`SimStorage::crash_at_op`].
    pub fn crash(&self, tear: Option<u64>) -> CrashReport {
        let mut d = self.disk.borrow_mut();
        if d.crashed.is_none() {
            d.do_crash(None, tear);
        }
        d.crashed.clone().expect("crashed")
    }

    /// The report of the crash, once the disk crashed.
    pub fn crash_report(&self) -> Option<CrashReport> {
        self.disk.borrow().crashed.clone()
    }

    /// The image a crash now with no torn write would leave, without crashing.
    pub fn durable_image(&self) -> SimImage {
        self.disk.borrow().durable_image(None, None).0
    }

    /// With `true`, a later tear value with [`TEAR_HOLE`] set (and bit 63 clear) tears a hole
    /// in the middle of the write instead of keeping a prefix.
    pub fn tear_holes(&self, on: bool) {
        self.disk.borrow_mut().tear_holes = on;
    }

    /// Arms `fault` for the `nth` (from 1) read, write or fdatasync from now, of the kind the
    /// fault applies to, on a file whose path `filter` accepts; it fires once. Several faults
    /// may be armed at once (an operation fires at most one).
    pub fn inject(&self, fault: Fault, nth: u64, filter: PathFilter) {
        self.disk.borrow_mut().faults.arm(fault, nth, filter);
    }

    /// Flips bit `bit` (0..8) of the byte at `offset` of the file at `path`, in what reads see
    /// and in what a crash keeps (bit rot on the medium).
    ///
    /// # Panics
    /// When the file does not exist or is shorter than `offset + 1` bytes (a test's mistake).
    pub fn rot(&self, path: &Path, offset: u64, bit: u8) {
        let mut d = self.disk.borrow_mut();
        let ino = d.lookup(path).expect("rot: no such file");
        let inode = &mut d.inodes[ino];
        let at = offset as usize;
        inode.live[at] ^= 1 << (bit % 8);
        if at < inode.durable.len() {
            inode.durable[at] ^= 1 << (bit % 8);
        }
        d.faults
            .fired
            .push(format!("rot {} @{offset} bit {bit}", path.display()));
    }

    /// The faults that fired so far, oldest first (`"ReadEio in read /p @0 +4096"`, ...).
    pub fn fault_log(&self) -> Vec<String> {
        self.disk.borrow().faults.fired.clone()
    }

    /// The live size of the file at `path` (what reads see), if it exists.
    pub fn file_len(&self, path: &Path) -> Option<u64> {
        let d = self.disk.borrow();
        let ino = d.lookup(path).ok()?;
        Some(d.inodes[ino].live.len() as u64)
    }

    /// Counted operations since the disk was made.
    pub fn ops(&self) -> u64 {
        self.disk.borrow().ops
    }

    /// Yields to the executor 0 to 2 times, as the seed says.
    async fn pause(&self) {
        let n = next_random(&mut self.disk.borrow_mut().rng) % 3;
        for _ in 0..n {
            futures_lite::future::yield_now().await;
        }
    }
}

impl Storage for SimStorage {
    type File = SimFile;

    async fn open(&self, path: &Path, create: bool) -> io::Result<SimFile> {
        self.pause().await;
        let mut d = self.disk.borrow_mut();
        d.check_up()?;
        let inode = match d.lookup(path) {
            Ok(i) => i,
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                let (dir, name) = split(path)?;
                d.dir(dir)?;
                d.count(
                    OpKind::Create,
                    path,
                    format!("create {}", path.display()),
                    None,
                )?;
                d.inodes.push(Inode {
                    path: path.to_path_buf(),
                    ..Inode::default()
                });
                let i = d.inodes.len() - 1;
                d.dir_mut(dir)?.live.insert(name.to_owned(), i);
                i
            }
            Err(e) => return Err(e),
        };
        Ok(SimFile {
            disk: self.disk.clone(),
            inode,
        })
    }

    async fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.pause().await;
        let d = self.disk.borrow();
        d.check_up()?;
        Ok(d.dir(dir)?.live.keys().cloned().collect())
    }

    async fn remove(&self, path: &Path) -> io::Result<()> {
        self.pause().await;
        let mut d = self.disk.borrow_mut();
        d.check_up()?;
        d.lookup(path)?;
        d.count(
            OpKind::Remove,
            path,
            format!("remove {}", path.display()),
            None,
        )?;
        let (dir, name) = split(path)?;
        d.dir_mut(dir)?.live.remove(name);
        Ok(())
    }

    /// Within one directory only (all the engine does); across directories `Unsupported`.
    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.pause().await;
        let mut d = self.disk.borrow_mut();
        d.check_up()?;
        let (fdir, fname) = split(from)?;
        let (tdir, tname) = split(to)?;
        if fdir != tdir {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the simulated disk renames within one directory only",
            ));
        }
        let i = d.lookup(from)?;
        let what = format!("rename {} -> {tname}", from.display());
        d.count(OpKind::Rename, from, what, None)?;
        let dir = d.dir_mut(fdir)?;
        dir.live.remove(fname);
        dir.live.insert(tname.to_owned(), i);
        d.inodes[i].path = to.to_path_buf();
        Ok(())
    }

    async fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.pause().await;
        let mut d = self.disk.borrow_mut();
        d.check_up()?;
        d.dir(dir)?;
        d.count(
            OpKind::SyncDir,
            dir,
            format!("sync_dir {}", dir.display()),
            None,
        )?;
        let dd = d.dir_mut(dir)?;
        dd.durable = dd.live.clone();
        Ok(())
    }

    async fn prepare_dir(&self, dir: &Path) -> io::Result<()> {
        self.pause().await;
        let mut d = self.disk.borrow_mut();
        d.check_up()?;
        d.dirs.entry(dir.to_path_buf()).or_default();
        Ok(())
    }
}

/// An open file of a [`SimStorage`]. Shard-local.
pub struct SimFile {
    disk: Rc<RefCell<Disk>>,
    inode: usize,
}

impl fmt::Debug for SimFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.disk.borrow();
        f.debug_struct("SimFile")
            .field("path", &d.inodes[self.inode].path)
            .finish()
    }
}

impl SimFile {
    async fn pause(&self) {
        let n = next_random(&mut self.disk.borrow_mut().rng) % 3;
        for _ in 0..n {
            futures_lite::future::yield_now().await;
        }
    }
}

impl StorageFile for SimFile {
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        self.pause().await;
        let mut d = self.disk.borrow_mut();
        d.check_up()?;
        let live = &d.inodes[self.inode].live;
        let start = usize::try_from(pos).unwrap_or(usize::MAX).min(live.len());
        let end = start.saturating_add(len).min(live.len());
        let mut data = live[start..end].to_vec();
        let path = d.inodes[self.inode].path.clone();
        let what = format!("read {} @{pos} +{len}", path.display());
        match d.faults.fire(On::Read, &path, &what) {
            Some(Fault::ReadEio) => return Err(faults::eio()),
            Some(Fault::ReadBitFlip) => {
                let bit = next_random(&mut d.rng);
                if let Some(at) = faults::flip(&mut data, bit) {
                    let line = format!("  flipped a bit of byte {}", pos + at as u64);
                    d.faults.fired.push(line);
                }
            }
            _ => {}
        }
        Ok(data)
    }

    /// Same alignment rule as the real disk; a misaligned write fails with `InvalidInput`.
    async fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<()> {
        self.pause().await;
        if !pos.is_multiple_of(BLOCK_BYTES as u64) || !data.len().is_multiple_of(BLOCK_BYTES) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("write @{pos} +{} not block aligned", data.len()),
            ));
        }
        let mut d = self.disk.borrow_mut();
        d.check_up()?;
        let path = d.inodes[self.inode].path.clone();
        let asked = format!("write {} @{pos} +{}", path.display(), data.len());
        let pos = match faults::write_fault(d.faults.fire(On::Write, &path, &asked), pos) {
            Some(WriteFault::Eio) => return Err(faults::eio()),
            Some(WriteFault::LandAt(at)) => at,
            None => pos,
        };
        let what = format!("write {} @{pos} +{}", path.display(), data.len());
        let w = UnsyncedWrite {
            inode: self.inode,
            path: path.clone(),
            pos,
            data: data.to_vec(),
        };
        let w = d
            .count(OpKind::Write, &path, what, Some(w))?
            .expect("count hands the write back");
        let live = &mut d.inodes[self.inode].live;
        let (start, end) = (pos as usize, pos as usize + data.len());
        if live.len() < end {
            live.resize(end, 0);
        }
        live[start..end].copy_from_slice(data);
        d.unsynced.push(w);
        Ok(())
    }

    async fn fdatasync(&self) -> io::Result<()> {
        self.pause().await;
        let mut d = self.disk.borrow_mut();
        d.check_up()?;
        let path = d.inodes[self.inode].path.clone();
        let what = format!("fdatasync {}", path.display());
        d.count(OpKind::Fdatasync, &path, what.clone(), None)?;
        if d.faults.fire(On::Sync, &path, &what).is_some() {
            // LostSync: success, and the file's writes stay unsynced.
            return Ok(());
        }
        let ino = self.inode;
        d.unsynced.retain(|w| w.inode != ino);
        let inode = &mut d.inodes[ino];
        inode.durable.clone_from(&inode.live);
        Ok(())
    }

    async fn size(&self) -> io::Result<u64> {
        self.pause().await;
        let d = self.disk.borrow();
        d.check_up()?;
        Ok(d.inodes[self.inode].live.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future::block_on;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn only_synced_writes_and_synced_entries_survive_a_crash() {
        // Goal: the durability rules of the module doc, one by one. Method: a file whose data is
        // synced but whose creation is not is lost; after sync_dir it survives with its synced
        // bytes only; a rename not followed by sync_dir is undone; reads before the crash see
        // everything.
        block_on(async {
            let s = SimStorage::new(1);
            s.prepare_dir(&p("/d")).await.unwrap();
            let f = s.open(&p("/d/a"), true).await.unwrap();
            f.write_at(0, &[1u8; 4096]).await.unwrap();
            f.fdatasync().await.unwrap();
            let lost = s.durable_image();
            assert_eq!(lost.file(&p("/d/a")), None, "creation not synced");

            s.sync_dir(&p("/d")).await.unwrap();
            f.write_at(4096, &[2u8; 4096]).await.unwrap();
            assert_eq!(f.read_at(4096, 10).await.unwrap(), vec![2u8; 10]);
            assert_eq!(f.size().await.unwrap(), 8192);
            s.rename(&p("/d/a"), &p("/d/b")).await.unwrap();
            assert_eq!(s.list(&p("/d")).await.unwrap(), vec!["b".to_owned()]);
            let r = s.crash(None);
            assert_eq!(r.image.file(&p("/d/a")), Some(&[1u8; 4096][..]));
            assert_eq!(r.image.file(&p("/d/b")), None);
            assert_eq!(r.unsynced_writes_dropped, 1);
            assert!(f.read_at(0, 1).await.is_err(), "I/O fails after the crash");

            let s2 = SimStorage::from_image(&r.image, 2);
            let g = s2.open(&p("/d/a"), false).await.unwrap();
            assert_eq!(g.read_at(0, 8192).await.unwrap(), vec![1u8; 4096]);
        });
    }

    #[test]
    fn kept_unsynced_writes_are_whole_and_synced_bytes_never_change() {
        // Goal: with keep_unsynced_writes, each earlier unsynced write survives whole or not at
        // all, and synced bytes stay. Method: 16 one-block writes over a synced file of 1s,
        // crash with a torn last write, check every block is all 1s or all its write's byte.
        block_on(async {
            let s = SimStorage::new(4);
            s.prepare_dir(&p("/d")).await.unwrap();
            let f = s.open(&p("/d/a"), true).await.unwrap();
            f.write_at(0, &[1u8; 16 * 4096]).await.unwrap();
            f.fdatasync().await.unwrap();
            s.sync_dir(&p("/d")).await.unwrap();
            for i in 0..16u8 {
                f.write_at(u64::from(i) * 4096, &[i + 2; 4096])
                    .await
                    .unwrap();
            }
            s.keep_unsynced_writes(Some(9));
            let r = s.crash(Some(5));
            let img = r.image.file(&p("/d/a")).unwrap();
            assert_eq!(img.len(), 16 * 4096);
            let mut kept = 0;
            for (i, block) in img.chunks(4096).enumerate().take(15) {
                let b = block[0];
                assert!(b == 1 || b == i as u8 + 2, "block {i} holds {b}");
                assert!(block.iter().all(|&x| x == b), "block {i} is torn");
                kept += usize::from(b != 1);
            }
            assert!(
                kept > 0 && kept < 15,
                "{kept} of 15 kept: the coin is not fair"
            );
            let last = &img[15 * 4096..];
            assert!(last[..5 * SECTOR_BYTES].iter().all(|&x| x == 17));
            assert!(last[5 * SECTOR_BYTES..].iter().all(|&x| x == 1));
            assert_eq!(r.unsynced_writes_dropped, 16 - kept);
        });
    }

    /// Syncs a block of 1s at /d/a, then crashes in the write of a block of 2s over it with
    /// `tear`; returns the crash report.
    fn crash_overwriting_a_synced_block(tear: u64) -> CrashReport {
        block_on(async {
            let s = SimStorage::new(3);
            s.prepare_dir(&p("/d")).await.unwrap();
            let f = s.open(&p("/d/a"), true).await.unwrap();
            f.write_at(0, &[1u8; 4096]).await.unwrap();
            f.fdatasync().await.unwrap();
            s.sync_dir(&p("/d")).await.unwrap();
            assert_eq!(s.ops(), 4);
            s.crash_at_op(1, Some(tear));
            assert!(f.write_at(0, &[2u8; 4096]).await.is_err());
            s.crash_report().expect("crashed")
        })
    }

    #[test]
    fn an_armed_crash_tears_the_write_it_happens_in_at_a_sector_boundary() {
        // Goal: crash_at_op counts operations and tears the last unsynced write to a prefix of
        // whole sectors over the durable bytes. Method: overwrite a synced block of 1s with 2s
        // and crash in that write keeping 3 sectors.
        let r = crash_overwriting_a_synced_block(3);
        assert_eq!(r.op_number, 5);
        let img = r.image.file(&p("/d/a")).unwrap();
        assert!(img[..3 * SECTOR_BYTES].iter().all(|&b| b == 2));
        assert!(img[3 * SECTOR_BYTES..].iter().all(|&b| b == 1));
        assert_eq!(r.torn, Some((p("/d/a"), 0, 4096, 3 * SECTOR_BYTES)));
    }

    #[test]
    fn a_tear_with_bit_63_keeps_the_last_sectors() {
        // Goal: the other half of the tear model: the write's first sectors are lost and its
        // last ones reach the medium (journal.md's media assumptions allow any part).
        let r = crash_overwriting_a_synced_block(3 | 1 << 63);
        let img = r.image.file(&p("/d/a")).unwrap();
        assert!(img[..5 * SECTOR_BYTES].iter().all(|&b| b == 1));
        assert!(img[5 * SECTOR_BYTES..].iter().all(|&b| b == 2));
        assert_eq!(r.torn, Some((p("/d/a"), 0, 4096, 3 * SECTOR_BYTES)));
    }
}

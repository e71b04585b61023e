//! Prometheus metrics of a bookie, and the state `quire bookie info` reports.
//!
//! # Recording
//! Every shard holds its own handles ([`ShardMetrics`]): `prometheus-client` metrics labelled
//! `bookie="ID",shard="i"`, which are `Arc`s over atomics (counters, gauges) or over a lock only that shard
//! and a scrape ever take (histograms). A shard records on its own executor with no
//! cross-core traffic; the HTTP thread that serves `/metrics` reads them.
//!
//! # Names
//! BookKeeper's (reference/bookkeeper.md §4.3, scopes joined with `_`) where one exists:
//! `bookkeeper_server_ADD_ENTRY_REQUEST`, `bookkeeper_server_READ_ENTRY_REQUEST` (label
//! `success`, as BookKeeper's OpStats), `bookie_journal_JOURNAL_SYNC`,
//! `bookie_journal_JOURNAL_ADD_ENTRY`, `bookie_journal_JOURNAL_QUEUE_SIZE`, ... Latencies are
//! histograms in **seconds**. `prometheus-client` writes OpenMetrics text, which appends
//! `_total` to counters (`bookie_journal_JOURNAL_WRITE_BYTES_total`).
//!
//! # Adding a metric
//! * An event on a shard (a count or a latency): one row in the `shard_metrics!` table below
//!   (field, type, name, help), then record it where the event happens through the shard's
//!   [`ShardMetrics`] (`m.my_field.inc()`, `.observe(secs)`).
//! * A value read from shard state (a size, a cumulative count): one row in the `shard_state!`
//!   table (field, type, name, help); then set `status.shards[i].my_field` in the shard's
//!   publisher ([`crate::shard`], `publish_state`).
//! * A value sampled at scrape time from outside the shards (disk): [`StateCollector`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use quire_wire::bookie::{BookieInfo, BookieState, DirInfo, DirKind, ScrubInfo};

/// Upper bounds of the latency histograms' buckets, in seconds: 50 µs to 10 s, about three per
/// decade, so that a p99 of a fast disk (100 µs) and of a stalled one (seconds) both resolve.
pub const LATENCY_BUCKETS_SECONDS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// The labels of every per-shard metric: the bookie (its id, or a name the process gives
/// it; one process may run several, as the sandbox does) and the shard.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabels {
    pub bookie: String,
    pub shard: u16,
}

/// The labels of a request latency: bookie, shard and whether it succeeded (BookKeeper's
/// OpStats register successful and failed events apart).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub bookie: String,
    pub shard: u16,
    pub success: bool,
}

/// A latency histogram split by outcome, for one shard.
#[derive(Clone, Debug)]
pub struct OutcomeHistogram {
    pub ok: Histogram,
    pub failed: Histogram,
}

impl OutcomeHistogram {
    /// Records one request of `took`.
    pub fn observe(&self, success: bool, took: Duration) {
        let h = if success { &self.ok } else { &self.failed };
        h.observe(took.as_secs_f64());
    }
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS_SECONDS)
}

/// How each kind of per-shard metric is made.
trait Make: Sized {
    fn make() -> Self;
}
impl Make for Histogram {
    fn make() -> Self {
        latency_histogram()
    }
}
impl Make for Counter {
    fn make() -> Self {
        Counter::default()
    }
}
impl Make for Gauge {
    fn make() -> Self {
        Gauge::default()
    }
}

/// Declares the event metrics of a shard: the per-shard handles, their families and their
/// registration, from one table. `shard` rows are labelled by shard; `outcome` rows (request
/// latencies) by shard and success.
macro_rules! shard_metrics {
    (
        shard { $( $(#[doc = $doc:literal])* $field:ident: $kind:ident = $name:literal; )* }
        outcome { $( $(#[doc = $odoc:literal])* $ofield:ident = $oname:literal; )* }
    ) => {
        /// One shard's metric handles (cheap clones of the registered metrics).
        #[derive(Clone, Debug)]
        pub struct ShardMetrics {
            $( $(#[doc = $doc])* pub $field: $kind, )*
            $( $(#[doc = $odoc])* pub $ofield: OutcomeHistogram, )*
        }

        #[derive(Debug)]
        struct Families {
            $( $field: Family<ShardLabels, $kind, fn() -> $kind>, )*
            $( $ofield: Family<OutcomeLabels, Histogram, fn() -> Histogram>, )*
        }

        impl Families {
            fn new() -> Self {
                Self {
                    $( $field: Family::new_with_constructor(<$kind as Make>::make as fn() -> $kind), )*
                    $( $ofield: Family::new_with_constructor(latency_histogram as fn() -> Histogram), )*
                }
            }

            fn shard(&self, bookie: &str, shard: u16) -> ShardMetrics {
                // One statement per lookup: a `get_or_create` guard lives to the end of its
                // statement, and a second lookup in the same family would deadlock on it.
                let l = ShardLabels { bookie: bookie.to_string(), shard };
                let ok = OutcomeLabels { bookie: bookie.to_string(), shard, success: true };
                let failed = OutcomeLabels { bookie: bookie.to_string(), shard, success: false };
                $( let $field = self.$field.get_or_create(&l).clone(); )*
                $(
                    let ok_handle = self.$ofield.get_or_create(&ok).clone();
                    let failed_handle = self.$ofield.get_or_create(&failed).clone();
                    let $ofield = OutcomeHistogram { ok: ok_handle, failed: failed_handle };
                )*
                ShardMetrics { $( $field, )* $( $ofield, )* }
            }

            fn register(&self, registry: &mut Registry) {
                // The registry adds the final full stop itself.
                $( registry.register($name, concat!($($doc),*).trim().trim_end_matches('.'), self.$field.clone()); )*
                $( registry.register($oname, concat!($($odoc),*).trim().trim_end_matches('.'), self.$ofield.clone()); )*
            }
        }
    };
}

shard_metrics! {
    shard {
        /// Seconds of each journal fdatasync (one per group-commit batch).
        journal_sync: Histogram = "bookie_journal_JOURNAL_SYNC";
        /// Seconds from an add entering the journal queue to its batch being durable.
        journal_add: Histogram = "bookie_journal_JOURNAL_ADD_ENTRY";
        /// Seconds of each journal batch write (before its fdatasync).
        journal_flush: Histogram = "bookie_journal_JOURNAL_FLUSH_LATENCY";
        /// Records waiting in the journal queue when the last batch became durable.
        journal_queue: Gauge = "bookie_journal_JOURNAL_QUEUE_SIZE";
        /// Bytes written to the journal, padding included.
        journal_write_bytes: Counter = "bookie_journal_JOURNAL_WRITE_BYTES";
        /// Bytes of entries received in successful adds.
        add_bytes: Counter = "bookie_BOOKIE_ADD_ENTRY_BYTES";
        /// Bytes of entries sent in successful reads.
        read_bytes: Counter = "bookie_BOOKIE_READ_ENTRY_BYTES";
        /// Connections refused for want of the cluster secret: a wrong proof, a request before
        /// the handshake, or a Hello without its version.
        auth_failures: Counter = "bookie_AUTH_FAILURES";
    }
    outcome {
        /// Seconds from an add request read off the connection to its response queued for writing.
        add_request = "bookkeeper_server_ADD_ENTRY_REQUEST";
        /// Seconds from a read request read off the connection to its response queued for writing.
        read_request = "bookkeeper_server_READ_ENTRY_REQUEST";
        /// Seconds from a long-poll LAC read (with its piggybacked next entry) read off the
        /// connection to its response queued, the wait included.
        long_poll_request = "bookkeeper_server_READ_ENTRY_LONG_POLL_REQUEST";
    }
}

impl quire_engine::JournalObserver for ShardMetrics {
    fn batch_durable(&self, b: &quire_engine::JournalBatch) {
        self.journal_sync.observe(b.sync.as_secs_f64());
        self.journal_flush.observe(b.write.as_secs_f64());
        self.journal_queue.set(b.queued as i64);
        self.journal_write_bytes.inc_by(b.bytes as u64);
    }

    fn add_durable(&self, waited: Duration) {
        self.journal_add.observe(waited.as_secs_f64());
    }
}

/// Declares the state a shard publishes (relaxed atomics it sets every
/// [`STATE_PUBLISH_INTERVAL`]) and how the collector exposes it.
macro_rules! shard_state {
    ( $( $(#[doc = $doc:literal])* $field:ident: $kind:ident = $name:literal; )* ) => {
        /// What one shard last published about its engine. Written by the shard, read by
        /// scrapes and by `GetBookieInfo`.
        #[derive(Debug, Default)]
        pub struct ShardState {
            $( $(#[doc = $doc])* pub $field: AtomicU64, )*
        }

        impl ShardState {
            fn encode(bookies: &[(String, Arc<BookieStatus>)], encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
                $(
                    let help = concat!($($doc),*).trim();
                    shard_state!(@encode $kind, encoder, $name, help, bookies, $field);
                )*
                Ok(())
            }
        }
    };
    (@encode gauge, $enc:ident, $name:expr, $help:expr, $bookies:ident, $field:ident) => {{
        let mut family = $enc.encode_descriptor($name, $help, None, prometheus_client::metrics::MetricType::Gauge)?;
        for (bookie, status) in $bookies {
            for (i, s) in status.shards.iter().enumerate() {
                let labels = ShardLabels { bookie: bookie.clone(), shard: i as u16 };
                let v = s.$field.load(Ordering::Relaxed) as i64;
                ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
            }
        }
    }};
    (@encode counter, $enc:ident, $name:expr, $help:expr, $bookies:ident, $field:ident) => {{
        let mut family = $enc.encode_descriptor($name, $help, None, prometheus_client::metrics::MetricType::Counter)?;
        for (bookie, status) in $bookies {
            for (i, s) in status.shards.iter().enumerate() {
                let labels = ShardLabels { bookie: bookie.clone(), shard: i as u16 };
                let v = s.$field.load(Ordering::Relaxed);
                ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
            }
        }
    }};
}

shard_state! {
    /// Ledgers the shard holds state for.
    ledgers: gauge = "bookie_ledgers_count";
    /// Bytes of entry data in the write cache (durable in the journal, not yet in an entry log).
    write_cache_bytes: gauge = "bookie_write_cache_size";
    /// Bytes of entry data in the read cache.
    read_cache_bytes: gauge = "bookie_read_cache_size";
    /// Reads answered from the write cache.
    write_cache_hits: counter = "bookie_write_cache_hits";
    /// Reads answered from the read cache.
    read_cache_hits: counter = "bookie_read_cache_hits";
    /// Reads that missed both caches and read an entry log.
    read_cache_misses: counter = "bookie_read_cache_misses";
    /// Garbage-collection runs completed since the bookie started (scheduled or requested).
    gc_runs: counter = "bookie_gc_runs";
    /// Garbage-collection runs that failed (an I/O or corruption error; the next run retries).
    gc_failed_runs: counter = "bookie_gc_failed_runs";
    /// Ledgers deleted (tombstoned) by garbage collection since the bookie started.
    gc_ledgers_deleted: counter = "bookie_DELETED_LEDGER_TOTAL";
    /// Entry logs deleted because no live entry was left in them.
    gc_entry_logs_deleted: counter = "bookie_gc_entry_logs_deleted";
    /// Entry logs deleted after compaction copied their live entries to a new log.
    gc_entry_logs_compacted: counter = "bookie_gc_entry_logs_compacted";
    /// Current entry logs rolled by garbage collection because most of their bytes belonged
    /// to deleted ledgers (the engine's `entry_log_roll_floor_bytes`), so that the next run
    /// can reclaim them.
    gc_entry_logs_rolled: counter = "bookie_gc_entry_logs_rolled";
    /// Live entries copied by compaction.
    gc_entries_relocated: counter = "bookie_gc_entries_relocated";
    /// Bytes of entry logs deleted because no live entry was left in them.
    gc_reclaimed_deletion_bytes: counter = "bookie_RECLAIMED_DELETION_SPACE_BYTES";
    /// Bytes of compacted entry logs deleted, less the bytes their live entries took again.
    gc_reclaimed_compaction_bytes: counter = "bookie_RECLAIMED_COMPACTION_SPACE_BYTES";
    /// Minor compaction passes run.
    gc_minor_compactions: counter = "bookie_MINOR_COMPACTION_TOTAL";
    /// Major compaction passes run.
    gc_major_compactions: counter = "bookie_MAJOR_COMPACTION_TOTAL";
    /// Entry logs on disk.
    entry_logs: gauge = "bookie_ACTIVE_ENTRY_LOG_TOTAL";
    /// Bytes of the entry logs on disk.
    entry_log_bytes: gauge = "bookie_ACTIVE_ENTRY_LOG_SPACE_BYTES";
    /// Bytes of live (not deleted) entries in the entry logs on disk: the rest is what garbage
    /// collection and compaction can reclaim.
    entry_log_live_bytes: gauge = "bookie_entry_log_live_bytes";
    /// Damaged index segments rebuilt from the entry logs (at start or after a read found one).
    index_segments_rebuilt: counter = "bookie_INDEX_REBUILD_SEGMENTS";
    /// Ledgers given a rebuilt state by those rebuilds (fenced when rebuilt at start).
    index_ledgers_rebuilt: counter = "bookie_INDEX_REBUILD_LEDGERS";
    /// Entry locations written by those rebuilds.
    index_entries_rebuilt: counter = "bookie_INDEX_REBUILD_ENTRIES";
    /// Scrub passes completed (re-reads of the index and entry logs, checksums checked).
    scrub_passes: counter = "bookie_scrub_passes";
    /// Entry-log records read and checked by scrub passes.
    scrub_entries_scanned: counter = "bookie_scrub_entries_scanned";
    /// Entry-log bytes read by scrub passes.
    scrub_bytes_scanned: counter = "bookie_scrub_bytes_scanned";
    /// Damaged entries found by scrub passes (each counted once until repaired).
    scrub_damaged_found: counter = "bookie_scrub_damaged_entries_found";
    /// Damaged entries at the end of the last scrub pass, not yet repaired.
    scrub_damaged_now: gauge = "bookie_scrub_damaged_entries";
    /// Damaged entries a later scrub pass found replaced by an intact copy.
    scrub_repaired: counter = "bookie_scrub_repaired_entries";
    /// Damaged index segments found by scrub passes (rebuilt from the entry logs).
    scrub_index_segments_damaged: counter = "bookie_scrub_damaged_index_segments";
    /// End of the last scrub pass, seconds since the Unix epoch (0: none yet).
    scrub_last_pass_end_seconds: gauge = "bookie_scrub_last_pass_end_seconds";
}

/// How often each shard publishes its [`ShardState`].
pub const STATE_PUBLISH_INTERVAL: Duration = Duration::from_millis(500);

/// Bookie state values of [`BookieStatus::state`] (and of the `GetBookieInfo` response).
pub const STATE_WRITABLE: u8 = 0;
/// The bookie refuses adds (`ReadOnly`); reads are served.
pub const STATE_READ_ONLY: u8 = 1;

/// What the bookie knows about itself, shared by its shards and the threads that report it
/// (scrapes, `GetBookieInfo`). Kept whether or not metrics are exported.
#[derive(Debug)]
pub struct BookieStatus {
    /// One entry per shard.
    pub shards: Vec<ShardState>,
    /// Each shard's scrubber figures as `GetBookieInfo` answers them (not metrics: the
    /// `bookie_scrub_*` series are in [`ShardState`]).
    pub(crate) scrub: Vec<std::sync::Mutex<ScrubInfo>>,
    /// The journal root directory.
    pub journal_dir: PathBuf,
    /// The ledger root directory.
    pub ledger_dir: PathBuf,
    /// [`STATE_WRITABLE`] or [`STATE_READ_ONLY`] as set by [`BookieStatus::set_state`].
    state: AtomicU8,
    /// The disk monitor's read-only state, once the bookie attached it: read-only there
    /// overrides `state`.
    read_only: std::sync::OnceLock<crate::disk::ReadOnlyState>,
}

impl BookieStatus {
    pub(crate) fn new(shards: usize, journal_dir: PathBuf, ledger_dir: PathBuf) -> Self {
        Self {
            shards: (0..shards).map(|_| ShardState::default()).collect(),
            scrub: (0..shards).map(|_| Default::default()).collect(),
            journal_dir,
            ledger_dir,
            state: AtomicU8::new(STATE_WRITABLE),
            read_only: std::sync::OnceLock::new(),
        }
    }

    /// Makes [`BookieStatus::state`] follow the disk monitor's read-only mode.
    pub(crate) fn attach_read_only(&self, read_only: crate::disk::ReadOnlyState) {
        let _ = self.read_only.set(read_only);
    }

    /// [`STATE_WRITABLE`] or [`STATE_READ_ONLY`].
    pub fn state(&self) -> u8 {
        if self.read_only.get().is_some_and(|r| r.is_read_only()) {
            return STATE_READ_ONLY;
        }
        self.state.load(Ordering::Relaxed)
    }

    /// Sets the state reported by metrics (`bookie_SERVER_STATUS`) and `GetBookieInfo`.
    pub fn set_state(&self, state: u8) {
        self.state.store(state, Ordering::Relaxed);
    }

    /// The directories reported per directory: (kind, path).
    pub fn dirs(&self) -> [(DirKind, &Path); 2] {
        [
            (DirKind::Journal, self.journal_dir.as_path()),
            (DirKind::Ledger, self.ledger_dir.as_path()),
        ]
    }
}

/// Disk figures of one directory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskUsage {
    /// Size of the file system holding the directory (`statvfs` `f_blocks * f_frsize`).
    pub total_bytes: u64,
    /// Space available to the bookie there (`f_bavail * f_frsize`).
    pub free_bytes: u64,
    /// Space the files under the directory take (allocated blocks, so pre-written journal
    /// files count in full).
    pub used_bytes: u64,
}

/// Measures `dir` now.
///
/// # Errors
/// The `statvfs(2)` or directory walk error.
pub fn disk_usage(dir: &Path) -> std::io::Result<DiskUsage> {
    use std::os::unix::ffi::OsStrExt;
    let mut c = dir.as_os_str().as_bytes().to_vec();
    c.push(0);
    let c = std::ffi::CStr::from_bytes_with_nul(&c)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: statvfs writes into a zeroed plain struct; `c` is a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let frsize = st.f_frsize as u64;
    Ok(DiskUsage {
        total_bytes: st.f_blocks as u64 * frsize,
        free_bytes: st.f_bavail as u64 * frsize,
        used_bytes: allocated_bytes(dir)?,
    })
}

/// Bytes allocated to the files under `dir` (recursively; symlinks not followed).
fn allocated_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let meta = match entry.metadata() {
                Ok(m) => m,
                // Removed between the listing and the stat (a journal file deleted by a
                // checkpoint): it takes no space any more.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.blocks() * 512;
            }
        }
    }
    Ok(total)
}

/// The `dir` label value of a directory kind.
pub fn dir_kind_label(kind: DirKind) -> &'static str {
    match kind {
        DirKind::Journal => "journal",
        DirKind::Ledger => "ledger",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirLabels {
    bookie: String,
    dir: &'static str,
    path: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BookieLabels {
    bookie: String,
}

/// The bookies whose state a [`StateCollector`] exposes: (bookie label, status).
type Statuses = Arc<Mutex<Vec<(String, Arc<BookieStatus>)>>>;

/// Exposes the published [`ShardState`], the bookie state and the disk figures of each
/// directory of every added bookie, computed at scrape time.
#[derive(Debug)]
struct StateCollector {
    statuses: Statuses,
}

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::MetricType;
        let bookies = self
            .statuses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        ShardState::encode(&bookies, &mut encoder)?;
        {
            let mut family = encoder.encode_descriptor(
                "bookie_SERVER_STATUS",
                "1 while the bookie is writable, 0 while it is read-only.",
                None,
                MetricType::Gauge,
            )?;
            for (bookie, status) in &bookies {
                let writable = i64::from(status.state() == STATE_WRITABLE);
                let labels = BookieLabels {
                    bookie: bookie.clone(),
                };
                ConstGauge::new(writable).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut usages: Vec<(DirLabels, DiskUsage)> = Vec::new();
        for (bookie, status) in &bookies {
            for (kind, path) in status.dirs() {
                match disk_usage(path) {
                    Ok(u) => usages.push((
                        DirLabels {
                            bookie: bookie.clone(),
                            dir: dir_kind_label(kind),
                            path: path.display().to_string(),
                        },
                        u,
                    )),
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "cannot measure a bookie directory")
                    }
                }
            }
        }
        type Pick = fn(&DiskUsage) -> u64;
        let figures: [(&str, &str, Pick); 3] = [
            (
                "bookie_dir_total_bytes",
                "Size of the file system holding the directory.",
                |u| u.total_bytes,
            ),
            (
                "bookie_dir_free_bytes",
                "Space available to the bookie on the directory's file system.",
                |u| u.free_bytes,
            ),
            (
                "bookie_dir_used_bytes",
                "Space taken by the bookie's files under the directory.",
                |u| u.used_bytes,
            ),
        ];
        for (name, help, pick) in figures {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (labels, u) in &usages {
                ConstGauge::new(pick(u) as i64).encode(family.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}

/// The metrics of the bookies of one process (one, or the sandbox's several): the per-shard
/// event metrics and the state collector, each metric family registered once and labelled
/// by bookie.
///
/// Use: [`BookieMetrics::new`], [`BookieMetrics::register`] in the registry the HTTP endpoint
/// serves; per bookie, [`BookieMetrics::for_bookie`] into [`crate::BookieConfig::metrics`],
/// then after the start [`BookieMetrics::add_status`] with [`crate::Bookie::status`].
#[derive(Debug)]
pub struct BookieMetrics {
    families: Families,
    statuses: Statuses,
}

/// One bookie's per-shard handles, for [`crate::BookieConfig::metrics`].
#[derive(Debug)]
pub struct BookieShardMetrics {
    shards: Vec<ShardMetrics>,
}

impl BookieShardMetrics {
    /// The handles of shard `index`.
    ///
    /// # Panics
    /// If there is no such shard.
    pub fn shard(&self, index: usize) -> &ShardMetrics {
        &self.shards[index]
    }

    /// Number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }
}

impl BookieMetrics {
    /// Metric families with no bookie yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            families: Families::new(),
            statuses: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// Handles for a bookie of `shards` shards, labelled `bookie` (its id).
    pub fn for_bookie(&self, bookie: &str, shards: usize) -> Arc<BookieShardMetrics> {
        let shards = (0..shards)
            .map(|i| self.families.shard(bookie, i as u16))
            .collect();
        Arc::new(BookieShardMetrics { shards })
    }

    /// Exposes the state of a started bookie (ledgers, caches, state, disk), labelled `bookie`.
    pub fn add_status(&self, bookie: &str, status: Arc<BookieStatus>) {
        self.statuses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((bookie.to_string(), status));
    }

    /// Registers every family and the state collector in `registry` (once per process).
    pub fn register(&self, registry: &mut Registry) {
        self.families.register(registry);
        registry.register_collector(Box::new(StateCollector {
            statuses: self.statuses.clone(),
        }));
    }
}

/// The answer to `GetBookieInfo`: the state, each shard's last published ledger count (at most
/// [`STATE_PUBLISH_INTERVAL`] old), each directory measured now and, when `scrub`, each
/// shard's last published scrubber figures. Runs `statvfs(2)` and
/// walks the two directories on the calling thread, so it blocks: a shard calls it on its
/// executor's blocking-thread pool (`spawn_blocking`), never on its own thread.
///
/// # Errors
/// The first directory that cannot be measured.
pub fn bookie_info(status: &BookieStatus, scrub: bool) -> std::io::Result<BookieInfo> {
    let state = match status.state() {
        STATE_READ_ONLY => BookieState::ReadOnly,
        _ => BookieState::Writable,
    };
    let shard_ledgers = status
        .shards
        .iter()
        .map(|s| s.ledgers.load(Ordering::Relaxed))
        .collect();
    let mut dirs = Vec::with_capacity(2);
    for (kind, path) in status.dirs() {
        let u = disk_usage(path).map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot measure {}: {e}", path.display()))
        })?;
        dirs.push(DirInfo {
            kind,
            path: path.display().to_string(),
            total_bytes: u.total_bytes,
            free_bytes: u.free_bytes,
            used_bytes: u.used_bytes,
        });
    }
    let scrub = scrub.then(|| {
        status
            .scrub
            .iter()
            // A poisoned lock still holds the last figures written.
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .collect()
    });
    Ok(BookieInfo {
        state,
        shard_ledgers,
        dirs,
        scrub,
    })
}

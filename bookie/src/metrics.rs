//! Prometheus metrics of a bookie, and the state `quire bookie info` reports.
//!
//! # Recording
//! Every shard holds its own handles ([`ShardMetrics`]): `prometheus-client` metrics labelled
//! `shard="i"`, which are `Arc`s over atomics (counters, gauges) or over a lock only that shard
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
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use quire_wire::bookie::{BookieInfo, BookieState, DirInfo, DirKind};

/// Upper bounds of the latency histograms' buckets, in seconds: 50 µs to 10 s, about three per
/// decade, so that a p99 of a fast disk (100 µs) and of a stalled one (seconds) both resolve.
pub const LATENCY_BUCKETS_SECONDS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The `shard` label of every per-shard metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabels {
    pub shard: u16,
}

/// The labels of a request latency: shard and whether it succeeded (BookKeeper's OpStats
/// register successful and failed events apart).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
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

            fn shard(&self, shard: u16) -> ShardMetrics {
                // One statement per lookup: a `get_or_create` guard lives to the end of its
                // statement, and a second lookup in the same family would deadlock on it.
                let l = ShardLabels { shard };
                let ok = OutcomeLabels { shard, success: true };
                let failed = OutcomeLabels { shard, success: false };
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
    }
    outcome {
        /// Seconds from an add request read off the connection to its response queued for writing.
        add_request = "bookkeeper_server_ADD_ENTRY_REQUEST";
        /// Seconds from a read request read off the connection to its response queued for writing.
        read_request = "bookkeeper_server_READ_ENTRY_REQUEST";
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
            fn encode(states: &[ShardState], encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
                $(
                    let help = concat!($($doc),*).trim();
                    shard_state!(@encode $kind, encoder, $name, help, states, $field);
                )*
                Ok(())
            }
        }
    };
    (@encode gauge, $enc:ident, $name:expr, $help:expr, $states:ident, $field:ident) => {{
        let mut family = $enc.encode_descriptor($name, $help, None, prometheus_client::metrics::MetricType::Gauge)?;
        for (i, s) in $states.iter().enumerate() {
            let labels = ShardLabels { shard: i as u16 };
            let v = s.$field.load(Ordering::Relaxed) as i64;
            ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
        }
    }};
    (@encode counter, $enc:ident, $name:expr, $help:expr, $states:ident, $field:ident) => {{
        let mut family = $enc.encode_descriptor($name, $help, None, prometheus_client::metrics::MetricType::Counter)?;
        for (i, s) in $states.iter().enumerate() {
            let labels = ShardLabels { shard: i as u16 };
            let v = s.$field.load(Ordering::Relaxed);
            ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
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
    /// The journal root directory.
    pub journal_dir: PathBuf,
    /// The ledger root directory.
    pub ledger_dir: PathBuf,
    /// [`STATE_WRITABLE`] or [`STATE_READ_ONLY`]. Nothing sets read-only yet: the read-only
    /// mode on disk usage sets it through [`BookieStatus::set_state`].
    state: AtomicU8,
}

impl BookieStatus {
    pub(crate) fn new(shards: usize, journal_dir: PathBuf, ledger_dir: PathBuf) -> Self {
        Self {
            shards: (0..shards).map(|_| ShardState::default()).collect(),
            journal_dir,
            ledger_dir,
            state: AtomicU8::new(STATE_WRITABLE),
        }
    }

    /// [`STATE_WRITABLE`] or [`STATE_READ_ONLY`].
    pub fn state(&self) -> u8 {
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
    dir: &'static str,
    path: String,
}

/// Exposes the published [`ShardState`], the bookie state and the disk figures of each
/// directory, computed at scrape time.
#[derive(Debug)]
struct StateCollector {
    status: Arc<BookieStatus>,
}

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::MetricType;
        ShardState::encode(&self.status.shards, &mut encoder)?;
        let writable = i64::from(self.status.state() == STATE_WRITABLE);
        let status = ConstGauge::new(writable);
        status.encode(encoder.encode_descriptor(
            "bookie_SERVER_STATUS",
            "1 while the bookie is writable, 0 while it is read-only.",
            None,
            MetricType::Gauge,
        )?)?;
        let usages: Vec<(DirLabels, DiskUsage)> = self
            .status
            .dirs()
            .iter()
            .filter_map(|(kind, path)| match disk_usage(path) {
                Ok(u) => Some((
                    DirLabels {
                        dir: dir_kind_label(*kind),
                        path: path.display().to_string(),
                    },
                    u,
                )),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot measure a bookie directory");
                    None
                }
            })
            .collect();
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

/// The metrics of one bookie: the per-shard event metrics and the state collector. Create it
/// with [`BookieMetrics::new`], give it to [`crate::BookieConfig::metrics`], and register it
/// in the registry the HTTP endpoint serves with [`BookieMetrics::register`] (before or after
/// the start).
#[derive(Debug)]
pub struct BookieMetrics {
    families: Families,
    shards: Vec<ShardMetrics>,
}

impl BookieMetrics {
    /// Metrics for a bookie of `shards` shards.
    pub fn new(shards: usize) -> Arc<Self> {
        let families = Families::new();
        let shards = (0..shards).map(|i| families.shard(i as u16)).collect();
        Arc::new(Self { families, shards })
    }

    /// The handles of shard `index`.
    ///
    /// # Panics
    /// If the bookie has no such shard.
    pub fn shard(&self, index: usize) -> &ShardMetrics {
        &self.shards[index]
    }

    /// Number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Registers the event metrics, and the state of `status` ([`crate::Bookie::status`]), in
    /// `registry`. Use a sub-registry with a label (e.g. `bookie="ADDR"`) when one process
    /// runs several bookies.
    pub fn register(&self, registry: &mut Registry, status: Arc<BookieStatus>) {
        self.families.register(registry);
        registry.register_collector(Box::new(StateCollector { status }));
    }
}

/// The answer to `GetBookieInfo`: the state, each shard's last published ledger count (at most
/// [`STATE_PUBLISH_INTERVAL`] old) and each directory measured now. Runs `statvfs(2)` and
/// walks the two directories on the calling thread: an admin request, rare and short.
///
/// # Errors
/// The first directory that cannot be measured.
pub fn bookie_info(status: &BookieStatus) -> std::io::Result<BookieInfo> {
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
    Ok(BookieInfo {
        state,
        shard_ledgers,
        dirs,
    })
}

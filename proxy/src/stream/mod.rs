//! The stream layer: streams as sequences of log segments, one ledger each (DistributedLog
//! `BKLogWriteHandler` / `BKAsyncLogWriter` / `BKAsyncLogReader`, reduced).
//!
//! * Every stream this proxy touches gets one **stream task** that owns its writer state: the
//!   open segment's [`LedgerWriter`], the stream metadata and its version, the last txid. Appends
//!   are commands sent to that task through a bounded channel and are applied in the order they
//!   were submitted.
//! * **Appends are pipelined** (DistributedLog's write proxy: many outstanding writes per
//!   stream, acknowledged in order): the task packs an append into entries, sends them
//!   (`LedgerWriter::add` assigns the entry id and sends at call time) and takes the next
//!   append without waiting, as long as fewer than [`StreamConfig::adds_in_flight_max`] entry
//!   adds are outstanding. Acknowledgements arrive in entry order; an append is answered once
//!   the entry holding its last record is acknowledged, and appends are answered strictly in
//!   submission order. Appends that are queued together are **batched**: the task takes them
//!   from the queue while they add up to less than [`StreamConfig::entry_size_bytes_target`]
//!   and packs their records into shared entries; each append still gets its own DLSNs and its
//!   own answer.
//! * Records are packed into record sets ([`crate::record_set`]) of up to
//!   [`StreamConfig::entry_size_bytes_target`] bytes, one per entry. A record's DLSN is
//!   (segment seq no, entry id, slot).
//! * An add that fails (storage error, or a fenced ledger: ownership lost) fails every append
//!   not yet answered that has records in flight, with the same kind of error; nothing after
//!   the failure point is acknowledged (the ledger writer fails every later add too).
//! * A segment rolls once its entries add up to [`StreamConfig::segment_size_bytes_max`]:
//!   the next segment's ledger is created first (DistributedLog's ledger allocator), then
//!   every outstanding add is awaited (appends arriving meanwhile wait in the queue), the ledger
//!   is closed, the segment is marked `Completed` (last entry, last txid, record count, bytes)
//!   by compare-and-set, and the next entry opens a new segment with the next sequence number.
//!   When the new ledger cannot be created (fewer writable bookies than the ensemble needs:
//!   BookKeeper refuses such a ledger too), the roll is deferred and the segment keeps taking
//!   writes, up to [`StreamConfig::segment_roll_overshoot_bytes_max`] and
//!   [`StreamConfig::segment_roll_overshoot_time_max`] past its roll point; the roll is retried
//!   every second and happens as soon as a ledger can be created.
//! * The first time a stream is touched (read or write), or for all streams at once with
//!   [`StreamManager::recover_all`], any `InProgress` segment left by an
//!   earlier owner is recovered: its ledger is fenced and closed (`recover_ledger`), its last
//!   entry is read to learn the last txid and record count, and it is marked `Completed`. New
//!   writes go into a new segment. The same recovery runs before the next append after a
//!   storage error (the failed writer is dropped, DistributedLog's "writer is dead" rule).
//! * **One writer per stream** (DistributedLog's write lock, `lockTimeoutSeconds=0` as in its
//!   proxy): before a stream task is created, i.e. before this proxy recovers the stream's
//!   in-progress segment or writes to it, it takes the stream's lease in the metadata store
//!   under its identity ([`StreamConfig::owner_address`]). If another proxy holds it, the
//!   request fails at once with [`Error::OwnedElsewhere`] naming the owner, which clients
//!   follow as a redirect. Reads are served by any proxy: by the owner from its state, by a
//!   non-owner through its follower of the stream (`follower`); a read of a stream nobody owns
//!   makes this proxy its owner.
//! * Ownership is lost when the lease's `lost` flag rises (session expiry, lease released from
//!   outside), when an add or a close finds the segment's ledger fenced (someone recovered it
//!   under this writer), or when a stream metadata update finds another writer's version. The
//!   writer then drops its ledger writer and cached state without completing the segment
//!   (the next owner recovers it), gives the lease up, fails the current and queued requests
//!   with [`Error::OwnershipLost`] and ends its task. The lease is checked before every append
//!   and every segment start and watched while idle; a loss noticed while idle fails the next
//!   write with `OwnershipLost`. Any later request acquires the stream again (and is redirected
//!   while someone else owns it). As DistributedLog's docs stress, the lease alone is not what
//!   makes this safe: fencing and compare-and-set metadata updates are.
//! * Readers never touch the writer: the stream task publishes the segment list with each
//!   segment's readable end (its last entry once completed, the writer's LAC while in progress)
//!   through a `tokio::sync::watch`, and tail readers sleep on it. Entries just acknowledged are
//!   kept in a bounded cache, so tail reads are served without a bookie round trip.
//!
//! # Threading
//! [`StreamManager`] is shared (`Send + Sync`); use it from any tokio task.
//!
//! # Modules
//! Each concept is a type with its own fields; the `use` graph between the modules has no
//! cycle (the facade here uses them, they use only modules listed before them, and
//! [`StreamConfig`] from here).
//!
//! * Leaves: `clock` (the metadata store's clock, layer metrics), `tail_cache` (the readers'
//!   view of the segments, recently acknowledged entries), `shared` (`StreamShared`, state a
//!   stream task shares with readers and `describe`; error helpers), `command` (the task's
//!   commands), `labels` (ledger labels, orphan deletion), `lookups` (first/last DLSN, record
//!   count, last write time, sealed for `describe`).
//! * `placement`: balanced ownership, a leaf: the proxy registry heartbeat and the view of the
//!   live proxies, a stream's preferred owner by rendezvous hashing (the registry redirects a
//!   stream nobody owns to it).
//! * `position`: read positions other than a DLSN, by binary search over the segments and over
//!   one segment's entries.
//! * `ownership`: [`ownership::Ownership`], the lease a stream task holds (check, release,
//!   give up), and the handle of one acquisition.
//! * `record`: [`record::StreamRecord`], the stream record, its compare-and-set updates and
//!   their publication to readers and `describe`.
//! * `segment`: [`segment::Segments`], the open segment, the spare ledger, a deferred roll and
//!   an unrecovered segment: start, complete and recover log segments.
//! * `lifecycle`: truncation, retention and deletion over a record and its segments.
//! * `writer`: [`writer::Writer`], the stream task: it holds a `StreamRecord`, an `Ownership`
//!   and a `Segments` plus the append pipeline, and runs the commands; `writer::seal` writes the
//!   end-of-stream marker.
//! * `follower`: the streams this proxy reads without owning them, one follower each (the
//!   segment list on a metadata watch, the LAC by long polls, a bounded cache).
//! * `registry`: [`registry::Registry`], the streams this proxy acquired: acquisition (lease,
//!   recovery, task) and sending commands.
//! * `reader` (reads), `sweep` (the lifecycle sweep) and `balance` (the balancer: releases
//!   streams preferred by another live proxy, rate-limited) work through the registry.
//! * This module: the settings and [`StreamManager`], a facade over the registry.

mod balance;
mod clock;
mod command;
mod compress;
mod follower;
mod labels;
mod lifecycle;
mod lookups;
mod ownership;
pub mod placement;
mod position;
pub mod producer;
mod reader;
mod record;
mod registry;
mod segment;
mod shared;
mod subscriptions;
mod sweep;
mod tail_cache;
mod writer;

pub use labels::{LEDGER_LABEL_SEGMENT, LEDGER_LABEL_STREAM};
pub use subscriptions::{advance as subscription_advance, lag as subscription_lag};
pub use sweep::SweepReport;

use std::sync::Arc;
use std::time::Duration;

use quire_ledger::BookKeeper;
use quire_metadata::{validate_stream_name, MetadataStore};
use tokio::sync::oneshot;

use crate::dlsn::{Dlsn, ReadPosition};
use crate::error::{Error, FromMetadata, Result};
use crate::record_set::{
    ENTRY_SIZE_BYTES_MAX, RECORD_SET_HEADER_SIZE_BYTES, RECORD_SIZE_BYTES_MAX,
};
use crate::types::{
    ReadBatch, RetentionChange, RetentionDefaults, StreamInfo, TruncateResult, WriteResult,
};

use command::Command;
use shared::OwnerView;

/// Stream layer settings.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// A segment rolls once its entry payloads reach this many bytes (DistributedLog
    /// `maxLogSegmentBytes`, default 256 MiB).
    pub segment_size_bytes_max: u64,
    /// Records are packed into one entry until it would pass this size; at most
    /// [`ENTRY_SIZE_BYTES_MAX`]. A record larger than the target goes alone into its entry.
    pub entry_size_bytes_target: usize,
    /// Ensemble size E of each segment's ledger (DistributedLog `bkcEnsembleSize`, 3).
    pub ensemble_size: u8,
    /// Write quorum Qw (3).
    pub write_quorum: u8,
    /// Ack quorum Qa (2).
    pub ack_quorum: u8,
    /// Entry adds outstanding per stream (across appends) before the stream task stops taking
    /// appends and waits for the oldest (DistributedLog's outstanding-writes bound).
    pub adds_in_flight_max: usize,
    /// Bytes of recently acknowledged entries kept per stream for tail reads.
    pub tail_cache_bytes_max: usize,
    /// When the stream has had nothing in flight for this long after its last acknowledgement,
    /// and the last entry holding records is not yet covered by a LAC carried to the bookies
    /// (the LAC travels on the next entry), the writer sends a control entry carrying it
    /// (DistributedLog's control record), so that a reader that cannot ask this writer (another
    /// proxy after this one died, reading without recovery) reads up to the last acknowledged
    /// record. Default 200 ms; `None`: never (such a reader may then stop one entry short).
    pub lac_advance_delay: Option<Duration>,
    /// Appends queued per stream before submitters wait.
    pub append_queue_max: usize,
    /// This proxy's identity as a stream owner: the address (`host:port`) clients can reach it
    /// at, recorded in each stream lease it takes and handed to clients in redirects
    /// (DistributedLog's lock client id is the proxy's socket address). Empty (the default):
    /// a unique placeholder `unadvertised-<pid>-<n>` is used, fine for a single proxy but
    /// useless to a redirected client.
    pub owner_address: String,
    /// This proxy's region and rack labels (`region`, `rack` in its config file), written in
    /// its proxy registry record ([`quire_metadata::ProxyInfo`]) and shown by `quire proxy
    /// list`. `None`: BookKeeper's `default-region` and `/default-rack`.
    pub owner_labels: (Option<String>, Option<String>),
    /// A segment that holds at least one record rolls once it has been open this long
    /// (DistributedLog `logSegmentRollingIntervalMinutes`, default 2 h), beside the size rule.
    /// Measured on the monotonic clock from the segment's start, so wall-clock jumps neither
    /// hold a roll back nor make every record roll. `None`: size rolling only.
    pub segment_roll_interval: Option<Duration>,
    /// Cluster default of time-based retention: completed segments whose completion is older
    /// than this are deleted, oldest first (DistributedLog `retentionPeriodHours`, there 72 h
    /// by default). `None` (the default here): kept forever. Streams override it
    /// ([`quire_metadata::RetentionOverride`]).
    pub retention_time: Option<Duration>,
    /// Cluster default of size-based retention: while a stream's segments hold more payload
    /// bytes than this, its oldest completed segment is deleted. `None`: no limit.
    pub retention_size_bytes: Option<u64>,
    /// How far past [`StreamConfig::segment_size_bytes_max`] a segment may grow while its roll
    /// is deferred because no new segment can be started (fewer writable bookies than the
    /// ensemble size). Past it, writes are refused with `STORAGE_ERROR` (nothing written;
    /// retry) until a roll succeeds. Default 256 MiB (one more default segment).
    pub segment_roll_overshoot_bytes_max: u64,
    /// How long past its roll point (size reached, or [`StreamConfig::segment_roll_interval`]
    /// elapsed) a segment may keep taking writes while its roll is deferred; then writes are
    /// refused as for the byte bound. Default 1 h.
    pub segment_roll_overshoot_time_max: Duration,
    /// How often each stream task checks the time roll and retention (default 1 s).
    pub lifecycle_check_interval: Duration,
    /// How often the proxy sweeps every stream in the metadata store
    /// ([`StreamManager::sweep`]: retention and segment completion on streams nobody owns,
    /// orphan ledger metadata). Default 300 s; `None`: no periodic sweep (the owner's
    /// per-stream checks still run). The sweep task starts with the manager when it is made
    /// inside a tokio runtime.
    pub lifecycle_sweep_interval: Option<Duration>,
    /// The txid guard, Quire's own (DistributedLog has none): a record whose txid is more than
    /// this above the txid before it (the stream's last txid, acknowledged or in flight, for a
    /// write's first record; the previous record's for the others) is refused with
    /// [`Error::TxidTooFarAhead`] (`TXID_TOO_FAR_AHEAD`, 540) and nothing of its write is
    /// written. A stream's first record (no last txid yet) may have any txid below `u64::MAX`.
    /// Without it, one record with a txid near 2^64 makes every later normal write to its
    /// stream `TXID_OUT_OF_ORDER` for good, since txids never decrease. A jump of exactly this
    /// much passes. Default [`TXID_JUMP_MAX_DEFAULT`] (2^40); `None`: no guard (only the order
    /// rule).
    pub txid_jump_max: Option<u64>,
    /// How the streams this proxy owns store their entries (`compress.rs`): `Lz4` stores
    /// every entry's records section LZ4-compressed (record set v3 flag bit0, DistributedLog's
    /// `CompressionCodec` LZ4), `None` (the default) only the entries holding a record of a
    /// write that asked for it (write flag `0x04`). Readers see the same records either way;
    /// segment sizes and size retention count the stored (compressed) bytes.
    pub compression: quire_client::compression::Compression,
    /// Most subscriptions a stream may have (`[streams] subscriptions_per_stream_max`): a
    /// commit that would create one more fails with `TooManySubscriptions` (each lives in the
    /// metadata store, a znode, and every list and lag computation walks them all).
    /// DistributedLog sets no bound on `SubscriptionsStore`.
    pub subscriptions_per_stream_max: usize,
    /// Bytes of recent entries a follower keeps: the cache
    /// of one stream this proxy reads without owning it (`follower.rs`), shared by all of this
    /// proxy's readers of the stream. Default 8 MiB, as the owner's tail cache.
    pub follower_cache_bytes_max: usize,
    /// A follower that served no read for this long stops (its long poll and cache go away;
    /// the next read starts a new one). Default 60 s.
    pub follower_idle_timeout: Duration,
    /// Serve reads of streams another proxy owns here, through a follower (`[streams]
    /// follower_reads`). On by default (issue 29: readers spread over all proxies). A follower
    /// shows an entry only once the bookies know it is below the LAC, so the last entry of a
    /// burst reaches its readers up to [`StreamConfig::lac_advance_delay`] after the owner's;
    /// a read with no wait that finds nothing new there is redirected to the owner, so reading
    /// a stream back right after writing it is not cut short. Off, every read of a stream
    /// another proxy owns is redirected to the owner (`OwnedElsewhere`).
    pub follower_reads: bool,
    /// Most streams this proxy owns at once (`[streams] owned_streams_max`; DistributedLog's
    /// `maxAcquiredPartitionsPerProxy`): a request that would acquire one more fails with
    /// `TooManyStreams` and nothing is done; streams owned already are served as before.
    /// `None` (the default, as DistributedLog's -1): no limit, since a proxy alone in its
    /// cluster must serve every stream; set it from the measured memory per owned stream
    /// (perf/README.md, "Many streams").
    pub owned_streams_max: Option<usize>,
    /// Balanced ownership (`[streams] balance_moves_per_sec`, `placement.rs`): the most
    /// streams per second this proxy releases to their preferred owner (rendezvous hashing
    /// over the live proxies of the proxy registry); default
    /// [`BALANCE_MOVES_PER_SEC_DEFAULT`]. 0 turns balancing off: a stream goes to the first
    /// proxy asked and stays there. Needs [`StreamConfig::owner_address`].
    pub balance_moves_per_sec: u32,
    /// Load-aware placement (`[streams] balance_load_threshold_percent`, `placement.rs`):
    /// with balancing on, a proxy whose write load (records/s or bytes/s) is above this
    /// percentage of the live proxies' mean halves its capacity weight in the weighted
    /// rendezvous placement (at most every 5 s, down to 1/16), so a share of its streams
    /// moves through the balancer; below 100/T % of the mean it raises it again. 0: off
    /// (placement by hash alone), the default: with it on, streams move off a proxy whose
    /// streams are busier than the others' even when the hash spreads them evenly, which tests
    /// and operators expecting placement by hash alone must allow for; 150 is the value the
    /// integration test uses (DistributedLog's balancer moves streams off proxies loaded above
    /// the mean as well, by stream count).
    pub balance_load_threshold_percent: u32,
    /// The ledger client's speculative read timeout, at first and at least
    /// (`[streams] speculative_read_timeout_ms`; `quire_ledger::ClientConfig::
    /// speculative_read_timeout`, BookKeeper `speculativeReadTimeout`); zero turns speculative
    /// reads off. Applied by the process that builds the ledger client (`quire proxy`).
    pub speculative_read_timeout: Duration,
    /// The most the speculative read timeout adapts or backs off to (`[streams]
    /// max_speculative_read_timeout_ms`; BookKeeper `maxSpeculativeReadTimeout`).
    pub max_speculative_read_timeout: Duration,
}

/// Default of [`StreamConfig::balance_moves_per_sec`]: 100 moves per second. A move costs
/// about a dozen ZooKeeper operations (the old owner completes the segment and releases the
/// lease, the new one takes the lease, reads the record and opens a segment) and a ledger
/// close and create on the bookies, so 100/s keeps a proxy's balancing to about a thousand
/// ZooKeeper operations a second, while a proxy joining three that own 10,000 streams is
/// handed its 2,500 in under 10 s (each of the three moves its share at this rate).
pub const BALANCE_MOVES_PER_SEC_DEFAULT: u32 = 100;

/// Default of [`StreamConfig::txid_jump_max`]: 2^40 = 1,099,511,627,776. As a time gap
/// between consecutive txids that is 35 years of millisecond txids (`quire write` uses
/// wall-clock milliseconds), 12.7 days of microsecond ones, but only 18 minutes of nanosecond
/// ones (such applications need a larger value or no guard); and it is far below the ~2^64 a
/// stray or negative-turned-unsigned txid lands at.
pub const TXID_JUMP_MAX_DEFAULT: u64 = 1 << 40;

impl Default for StreamConfig {
    fn default() -> Self {
        Self {
            segment_size_bytes_max: 256 * 1024 * 1024,
            entry_size_bytes_target: 256 * 1024,
            ensemble_size: 3,
            write_quorum: 3,
            ack_quorum: 2,
            adds_in_flight_max: 64,
            tail_cache_bytes_max: 8 * 1024 * 1024,
            lac_advance_delay: Some(Duration::from_millis(200)),
            append_queue_max: 64,
            owner_address: String::new(),
            owner_labels: (None, None),
            segment_roll_interval: Some(Duration::from_secs(2 * 3600)),
            retention_time: None,
            retention_size_bytes: None,
            segment_roll_overshoot_bytes_max: 256 * 1024 * 1024,
            segment_roll_overshoot_time_max: Duration::from_secs(3600),
            lifecycle_check_interval: Duration::from_secs(1),
            lifecycle_sweep_interval: Some(Duration::from_secs(300)),
            txid_jump_max: Some(TXID_JUMP_MAX_DEFAULT),
            subscriptions_per_stream_max: 1_000,
            owned_streams_max: None,
            balance_moves_per_sec: BALANCE_MOVES_PER_SEC_DEFAULT,
            balance_load_threshold_percent: 0,
            compression: quire_client::compression::Compression::None,
            follower_cache_bytes_max: 8 * 1024 * 1024,
            follower_idle_timeout: Duration::from_secs(60),
            follower_reads: true,
            speculative_read_timeout: quire_ledger::ClientConfig::default()
                .speculative_read_timeout,
            max_speculative_read_timeout: quire_ledger::ClientConfig::default()
                .max_speculative_read_timeout,
        }
    }
}

/// One owned stream's size, from [`StreamManager::owned_stream_sizes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedStreamSize {
    /// The stream's name.
    pub name: String,
    /// Its log segments (completed and in progress).
    pub segments: usize,
    /// Bytes of its segments: completed segments' lengths plus the acknowledged bytes of the
    /// one being written (what size retention compares with its limit).
    pub retained_bytes: u64,
}

/// The streams this proxy owns.
///
/// # Threading
/// Shared (`Send + Sync`).
pub struct StreamManager {
    /// The acquired streams and what acquiring one needs; shared with the sweep loop.
    registry: Arc<registry::Registry>,
}

impl std::fmt::Debug for StreamManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamManager")
            .field("identity", &self.registry.identity)
            .field("config", &self.registry.config)
            .finish()
    }
}

impl StreamManager {
    /// Makes a manager over a metadata store and a ledger client. Nothing is read until a
    /// stream is first used. Its owner identity is `config.owner_address` (see there).
    ///
    /// # Panics
    /// If the config breaks E >= Qw >= Qa >= 1 or the entry target is outside
    /// `[RECORD_SET_HEADER_SIZE_BYTES + 12, ENTRY_SIZE_BYTES_MAX]`.
    pub fn new(
        metadata: Arc<dyn MetadataStore>,
        bookkeeper: BookKeeper,
        config: StreamConfig,
    ) -> Arc<Self> {
        assert!(config.ensemble_size >= config.write_quorum, "E >= Qw");
        assert!(config.write_quorum >= config.ack_quorum, "Qw >= Qa");
        assert!(config.ack_quorum >= 1, "Qa >= 1");
        assert!(
            config.entry_size_bytes_target <= ENTRY_SIZE_BYTES_MAX,
            "entry target above the entry limit"
        );
        assert!(
            config.entry_size_bytes_target > RECORD_SET_HEADER_SIZE_BYTES,
            "entry target too small"
        );
        assert!(config.adds_in_flight_max >= 1 && config.append_queue_max >= 1);
        let sweep_interval = config.lifecycle_sweep_interval;
        let registry = Arc::new(registry::Registry::new(metadata, bookkeeper, config));
        if let (Some(interval), Some(rt)) = (sweep_interval, &registry.runtime) {
            drop(rt.spawn(sweep::sweep_loop(Arc::downgrade(&registry), interval)));
        }
        if let Some(rt) = &registry.runtime {
            balance::start(&registry, rt);
        }
        Arc::new(Self { registry })
    }

    /// The settings in force.
    pub fn config(&self) -> &StreamConfig {
        &self.registry.config
    }

    /// The identity this manager takes stream leases under (its advertised address).
    pub fn identity(&self) -> &str {
        &self.registry.identity
    }

    /// Streams this manager holds now: acquired (lease taken, task started) and not lost.
    /// For metrics (`quire_proxy_streams_owned`).
    pub fn owned_stream_count(&self) -> usize {
        self.registry.owned_count()
    }

    /// Stream acquisitions under way now: a request found the stream unowned here and its
    /// lease, recovery and task start have not ended (`quire_proxy_acquisitions_under_way`).
    pub fn acquisitions_under_way(&self) -> i64 {
        self.registry
            .layer
            .acquiring
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stream acquisitions completed since start (`quire_proxy_acquisitions`).
    pub fn acquisitions(&self) -> u64 {
        self.registry
            .layer
            .acquired
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Acquisitions refused with `TooManyStreams` since start (`owned_streams_max`; for
    /// `quire_proxy_streams_refused`).
    pub fn too_many_streams_refusals(&self) -> u64 {
        self.registry
            .too_many_refusals
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Segments and retained bytes of every stream this manager owns now, sorted by name (for
    /// `quire_proxy_stream_segments` and `quire_proxy_stream_retained_bytes`). Retained bytes
    /// are what size retention compares with its limit (`lifecycle::retention_prefix`): the
    /// completed segments' lengths in the owner's stream record plus the acknowledged bytes
    /// of the segment being written.
    pub fn owned_stream_sizes(&self) -> Vec<OwnedStreamSize> {
        let mut rows: Vec<OwnedStreamSize> = self
            .registry
            .owned_all()
            .iter()
            .map(|h| {
                let segments = h.tail.borrow().segments.len();
                let view = h.shared.view.lock().expect("view lock");
                let completed: u64 = view.meta.as_ref().map_or(0, |m| {
                    m.value
                        .segments
                        .iter()
                        .filter(|s| s.state == quire_metadata::SegmentState::Completed)
                        .map(|s| s.length_bytes)
                        .sum()
                });
                let open = view.live.map_or(0, |l| l.3);
                OwnedStreamSize {
                    name: h.name.clone(),
                    segments,
                    retained_bytes: completed.saturating_add(open),
                }
            })
            .collect();
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        rows
    }

    /// The stream layer's metrics for a Prometheus registry, read at scrape time:
    /// `quire_proxy_metadata_clock_skew_seconds` (gauge: this proxy's wall clock minus the
    /// metadata store's, measured at each stream record update), `quire_proxy_segment_roll_deferred_total`
    /// (counter: segment rolls deferred because no new segment could be started) and
    /// `quire_proxy_segments_past_roll_point` (gauge: streams writing past their roll point now).
    pub fn metrics_collector(&self) -> Box<dyn prometheus_client::collector::Collector> {
        Box::new(clock::LayerMetrics(self.registry.layer.clone()))
    }

    /// This proxy's wall clock minus the metadata store's, in milliseconds, as last measured
    /// (at a stream record update); `None` before the first.
    pub fn metadata_clock_skew_ms(&self) -> Option<i64> {
        self.registry.layer.clock.skew_ms()
    }

    /// Creates an empty stream.
    ///
    /// # Errors
    /// `InvalidStreamName`, `StreamExists`, `Metadata`, `ShuttingDown`.
    pub async fn create_stream(&self, name: &str) -> Result<()> {
        self.registry.create_stream(name).await
    }

    /// Names of every stream, sorted.
    ///
    /// # Errors
    /// `Metadata`.
    pub async fn list_streams(&self) -> Result<Vec<String>> {
        self.registry.list_streams().await
    }

    /// Appends `records` (`(txid, payload)`) to `name` and returns once all are durable on the
    /// ack quorum. Appends to one stream are applied in submission order.
    ///
    /// # Errors
    /// Checked before anything is written: `RecordTooLarge` (a payload above
    /// [`RECORD_SIZE_BYTES_MAX`]), `TxidOutOfOrder` (a txid below the previous one or below the
    /// stream's last txid), `TxidTooFarAhead` (a txid more than [`StreamConfig::txid_jump_max`]
    /// above the previous record's or the stream's last txid: the txid guard), `BadRequest`
    /// (no records), `NoSuchStream` (unless
    /// `create_if_missing`), `InvalidStreamName`, `OwnedElsewhere` (another proxy owns the
    /// stream; redirect), `OwnershipLost` (this proxy lost the stream since its last request;
    /// the next request acquires it again). During the write: `Storage`, `Metadata` or
    /// `OwnershipLost`; then records not acknowledged may or may not be in the log after
    /// recovery.
    pub async fn append(
        &self,
        name: &str,
        records: Vec<(u64, Vec<u8>)>,
        create_if_missing: bool,
    ) -> Result<WriteResult> {
        let rx = self
            .submit_append(name, None, records, (create_if_missing, false))
            .await?;
        rx.await.map_err(|_| Error::ShuttingDown)?
    }

    /// Opens a producer session for exactly-once writes to `name`: a random id, never 0. Any
    /// proxy answers (nothing is stored: the session lives in the entries its writes add, and
    /// the stream's owner keeps its dedup state, `producer.rs`); the stream need not exist
    /// yet (a session write may create it).
    ///
    /// # Errors
    /// `InvalidStreamName`.
    pub fn open_producer_session(&self, name: &str) -> Result<u64> {
        validate_stream_name(name)
            .map_err(|e| Error::from_metadata(name, "open producer session", e))?;
        Ok(producer::new_session_id())
    }

    /// As [`StreamManager::append`], for a write of a producer session numbered by `producer`
    /// (exactly-once appends, `producer.rs`): records of the session this stream already holds
    /// are not written again; a write applied in full is answered with its original DLSNs.
    ///
    /// # Errors
    /// As `append`, and `ProducerSequenceGap` (the write does not follow the session's last
    /// applied sequence), `ProducerSessionExpired` (the owner cannot tell whether it was
    /// applied: an unknown session not starting at 0, or sequences older than the window);
    /// nothing is written for either.
    pub async fn append_in_session(
        &self,
        name: &str,
        producer: crate::protocol::ProducerSeq,
        records: Vec<(u64, Vec<u8>)>,
        create_if_missing: bool,
    ) -> Result<WriteResult> {
        let rx = self
            .submit_append(name, Some(producer), records, (create_if_missing, false))
            .await?;
        rx.await.map_err(|_| Error::ShuttingDown)?
    }

    /// Whether this proxy owns `name` now: its acquisition has ended, its task runs and the
    /// lease is not known lost, so that [`StreamManager::submit_append`] would queue the
    /// append without acquiring the stream (no metadata read, lease or recovery). Reads the
    /// registry under its lock, without awaiting; the answer may be stale by the time it is
    /// used (a loss noticed after it makes the submit acquire the stream again).
    pub fn is_owned_here(&self, name: &str) -> bool {
        self.registry.is_owned(name)
    }

    /// Queues an append and returns the receiver of its result. Appends submitted one after
    /// another (each awaited up to here) are applied in that order.
    pub(crate) async fn submit_append(
        &self,
        name: &str,
        producer: Option<crate::protocol::ProducerSeq>,
        records: Vec<(u64, Vec<u8>)>,
        (create_if_missing, compress): (bool, bool),
    ) -> Result<oneshot::Receiver<Result<WriteResult>>> {
        if records.is_empty() {
            return Err(Error::BadRequest {
                reason: "a write needs at least one record".into(),
            });
        }
        if let Some((i, (_, p))) = records
            .iter()
            .enumerate()
            .find(|(_, (_, p))| p.len() > RECORD_SIZE_BYTES_MAX)
        {
            return Err(Error::RecordTooLarge {
                record_index: i,
                size_bytes: p.len(),
                max_bytes: RECORD_SIZE_BYTES_MAX,
            });
        }
        // The txid rules between the request's own records need no stream state: checked here,
        // a refused write does not create its stream even with `create_if_missing`. The stream
        // task checks them again together with the stream's last txid.
        writer::check_txids(&records, None, self.registry.config.txid_jump_max)?;
        let counts = (
            records.len() as u64,
            records.iter().map(|(_, p)| p.len() as u64).sum::<u64>(),
        );
        let (reply, rx) = oneshot::channel();
        let handle = self
            .registry
            .send_to_stream(
                name,
                create_if_missing,
                true,
                Command::Append {
                    records,
                    producer,
                    reply,
                    compress,
                },
            )
            .await?;
        // Handed to a stream this proxy owns: its load (`placement.rs`).
        self.registry.layer.count_written(counts.0, counts.1);
        (handle.shared.written.lock().expect("written lock")).add(counts.0, counts.1);
        Ok(rx)
    }

    /// Reads up to `max_records` records (and about `max_bytes` payload bytes, but at least one
    /// record when one is readable) from `from`, across segment boundaries; in the segment being
    /// written only entries up to the writer's LAC are visible. When nothing is readable at
    /// `from`, waits up to `wait` for a write to make something readable (see `reader.rs`).
    ///
    /// # Errors
    /// `NoSuchStream`, `InvalidStreamName`, `BadRequest` (`max_records` = 0), `Storage`,
    /// `Metadata`, `Truncated`. `OwnedElsewhere` only when [`StreamConfig::follower_reads`]
    /// is off and another proxy owns the stream, or when it is on and a read without a wait
    /// finds nothing past its position on this proxy's follower (the owner says where the
    /// stream ends; `reader.rs`).
    pub async fn read(
        &self,
        name: &str,
        from: ReadPosition,
        max_records: u32,
        max_bytes: u32,
        wait: Duration,
    ) -> Result<ReadBatch> {
        reader::read(&self.registry, name, from, max_records, max_bytes, wait).await
    }

    /// Whether a read of `name` from `from` would fetch its first entry from the bookies (a
    /// catch-up read) rather than take it from the tail cache or wait at the tail. `false` when
    /// the stream is not acquired by this proxy, or its acquisition is over (the read itself then
    /// acquires it or answers with a redirect). The server runs catch-up reads on its
    /// lower-priority read runtime.
    pub fn is_catch_up_read(&self, name: &str, from: ReadPosition) -> bool {
        reader::is_catch_up_read(&self.registry, name, from)
    }

    /// One lifecycle sweep over every stream in the metadata store (see `sweep.rs`): retention
    /// and time rolls on streams this proxy owns or that nobody owns, and deletion of orphan
    /// ledger metadata (ledgers labelled with a stream whose record does not list them, or
    /// with a stream that no longer exists). Runs by itself every
    /// [`StreamConfig::lifecycle_sweep_interval`]; callable at any time.
    ///
    /// # Errors
    /// `Metadata` when the streams or ledgers cannot be listed; `ShuttingDown`. A failure on
    /// one stream is logged and the sweep goes on with the next.
    pub async fn sweep(&self) -> Result<SweepReport> {
        sweep::sweep(&self.registry).await
    }

    /// The stream's record, owner and this proxy's retention defaults. Any proxy answers
    /// (from the metadata store); when this proxy owns the stream, the record is the owner's
    /// (the newer of it and the store's), whose segment being written shows its acknowledged
    /// entries, records and bytes so far, also in the middle of a roll, and `max_txid` is the owner's
    /// last txid (acknowledged or in flight, the one the txid guard compares with). From a
    /// proxy that does not own the stream, `max_txid` is the stored one: the last txid of the
    /// segments completed so far, which lags while another proxy has a segment open.
    ///
    /// # Errors
    /// `NoSuchStream`, `InvalidStreamName`, `Metadata`.
    pub async fn describe(&self, name: &str) -> Result<StreamInfo> {
        validate_stream_name(name).map_err(|e| Error::from_metadata(name, "describe stream", e))?;
        let stored = self
            .registry
            .metadata
            .read_stream(name)
            .await
            .map_err(|e| Error::from_metadata(name, "read stream", e))?;
        let mut meta = stored.value.clone();
        let owner = self
            .registry
            .metadata
            .stream_owner(name)
            .await
            .map_err(|e| Error::from_metadata(name, "read stream owner", e))?;
        if let Some(h) = self.registry.owned(name) {
            // The owner's last txid is ahead of the stored one while a segment is open.
            let last_txid = *h.shared.last_txid.lock().expect("last txid lock");
            // The record read above may predate a roll the owner made since (the segment it
            // shows in progress is completed, and the progress counted now is the next
            // segment's): take the owner's record and progress, which change together.
            let (owned, live, live_last) = {
                let view = h.shared.view.lock().expect("view lock");
                (view.meta.clone(), view.live, view.live_last_record)
            };
            if let Some(owned) = owned.filter(|o| o.version >= stored.version) {
                meta = owned.value.clone();
            }
            meta.max_txid = meta.max_txid.max(last_txid);
            OwnerView::describe(&mut meta, live, live_last);
        }
        Ok(StreamInfo {
            lookups: lookups::lookups(&meta),
            metadata: meta,
            owner,
            defaults: self.retention_defaults(),
        })
    }

    /// This proxy's cluster-wide retention defaults.
    pub fn retention_defaults(&self) -> RetentionDefaults {
        RetentionDefaults {
            time_secs: self.registry.config.retention_time.map(|d| d.as_secs()),
            size_bytes: self.registry.config.retention_size_bytes,
        }
    }

    /// Truncates the stream before `before` (DistributedLog `truncate(DLSN)`): at once every
    /// record before it is unreadable (a read from an earlier DLSN gets `Truncated`, a read
    /// from the head starts at the point), and whole segments whose records all lie before it
    /// are deleted, ledger metadata included (oldest first; never the segment being written).
    /// The point never moves backwards: a `before` at or below the point in force changes
    /// nothing and returns that point. Done by the stream's owner only.
    ///
    /// # Errors
    /// `BadRequest` when `before` is beyond the end of the stream (past the entry after the
    /// last acknowledged one) or the stream holds no record; `NoSuchStream`,
    /// `InvalidStreamName`, `OwnedElsewhere` (redirect), `OwnershipLost` (another proxy took
    /// the stream: nothing was changed or deleted), `Metadata`.
    pub async fn truncate(&self, name: &str, before: Dlsn) -> Result<TruncateResult> {
        self.registry
            .owner_command(name, |reply| Command::Truncate { before, reply })
            .await
    }

    /// Deletes the stream (DistributedLog `delete`): its record goes first (by compare-and-set;
    /// from then on the name is free and can be created again), then every segment's ledger
    /// metadata; the lease is given up. Writes queued behind the delete fail with
    /// `NoSuchStream`; writes acknowledged before it went with the stream. Returns how many
    /// segments were deleted. Done by the stream's owner only.
    ///
    /// # Errors
    /// `NoSuchStream`, `InvalidStreamName`, `OwnedElsewhere` (redirect), `OwnershipLost`
    /// (nothing deleted), `Metadata`.
    pub async fn delete_stream(&self, name: &str) -> Result<u32> {
        let r = self
            .registry
            .owner_command(name, |reply| Command::Delete { reply })
            .await;
        if r.is_ok() {
            // Forget the ended acquisition so the name can be used again at once.
            self.registry.forget_deleted(name);
        }
        r
    }

    /// Seals the stream (DistributedLog `markEndOfStream`): appends taken before it finish,
    /// then the end-of-stream marker is written after the last record (into the open segment,
    /// or a new one), the segment is completed and the record marked `sealed`. Later writes
    /// fail with `EndOfStream`, also under another owner after a restart; reads that reach the
    /// marker answer with `end_of_stream`. Truncation, retention and deletion go on as before.
    /// Returns the DLSN of the stream's last record (`None`: no record). Sealing a sealed
    /// stream changes nothing. Done by the stream's owner only.
    ///
    /// # Errors
    /// `NoSuchStream`, `InvalidStreamName`, `OwnedElsewhere` (redirect), `OwnershipLost`,
    /// `Storage`, `Metadata` (the stream may or may not be sealed; retry).
    pub async fn seal_stream(&self, name: &str) -> Result<Option<Dlsn>> {
        self.registry
            .owner_command(name, |reply| Command::Seal { reply })
            .await
    }

    /// Changes the stream's retention overrides (each [`RetentionChange::Keep`], `Set` or
    /// back to the cluster `Default`) and returns the overrides in force. Done by the owner,
    /// which applies them at its next check (within [`StreamConfig::lifecycle_check_interval`]).
    ///
    /// # Errors
    /// `BadRequest` for a value of 0 or above the maximum
    /// ([`crate::types::check_retention_time_secs`], [`crate::types::check_retention_size_bytes`]);
    /// `NoSuchStream`, `OwnedElsewhere`, `OwnershipLost`, `Metadata`.
    pub async fn set_retention(
        &self,
        name: &str,
        time_secs: RetentionChange,
        size_bytes: RetentionChange,
        keep_for_subscriptions: Option<bool>,
    ) -> Result<quire_metadata::RetentionOverride> {
        if let RetentionChange::Set(v) = time_secs {
            crate::types::check_retention_time_secs(v)
                .map_err(|reason| Error::BadRequest { reason })?;
        }
        if let RetentionChange::Set(v) = size_bytes {
            crate::types::check_retention_size_bytes(v)
                .map_err(|reason| Error::BadRequest { reason })?;
        }
        self.registry
            .owner_command(name, |reply| Command::SetRetention {
                time_secs,
                size_bytes,
                keep_for_subscriptions,
                reply,
            })
            .await
    }

    /// Sets the stream's own compression (`SET_COMPRESSION`; `None`: back to
    /// [`StreamConfig::compression`]) and returns the setting in force. Done by the owner,
    /// which applies it from its next entry on (entries already written stay as stored;
    /// readers decompress whatever they find, `compress.rs`).
    ///
    /// # Errors
    /// `NoSuchStream`, `OwnedElsewhere`, `OwnershipLost`, `Metadata`.
    pub async fn set_compression(
        &self,
        name: &str,
        compression: Option<quire_metadata::StreamCompression>,
    ) -> Result<Option<quire_metadata::StreamCompression>> {
        self.registry
            .owner_command(name, |reply| Command::SetCompression { compression, reply })
            .await
    }

    /// The stream record's own write limits ([`quire_metadata::StreamMetadata::limits`]) when
    /// this proxy owns `name` and the record sets them; `None` otherwise (the server then
    /// applies `[limits] stream_*`). Read from the owner's view of the record, no I/O.
    pub fn owned_stream_limits(&self, name: &str) -> Option<quire_metadata::RateLimits> {
        let h = self.registry.owned(name)?;
        let view = h.shared.view.lock().expect("view lock");
        view.meta.as_ref().and_then(|m| m.value.limits)
    }

    /// Sets the stream's own write limits (`SET_LIMITS`; `None`: back to the owning proxy's
    /// `[limits] stream_*` defaults) and returns the limits in force in the record. Done by
    /// the owner, which enforces them from its next write on.
    ///
    /// # Errors
    /// `NoSuchStream`, `OwnedElsewhere`, `OwnershipLost`, `Metadata`.
    pub async fn set_limits(
        &self,
        name: &str,
        limits: Option<quire_metadata::RateLimits>,
    ) -> Result<Option<quire_metadata::RateLimits>> {
        self.registry
            .owner_command(name, |reply| Command::SetLimits { limits, reply })
            .await
    }

    /// Sets the stream's own placement (`SET_PLACEMENT`, issue 30 item 2; `None`: back to
    /// the proxy's `[ledger]` placement and quorum) and returns the placement in force in the
    /// record. Done by the owner, which places every new segment's ledger by it from the next
    /// segment on (the open segment, and a spare ledger made before, keep theirs) and records
    /// it in that ledger's metadata, where ensemble changes, recovery and re-replication read
    /// it.
    ///
    /// # Errors
    /// `BadRequest` for a placement that breaks its rules
    /// ([`quire_metadata::StreamPlacement::validate`]); `NoSuchStream`, `OwnedElsewhere`,
    /// `OwnershipLost`, `Metadata`.
    pub async fn set_placement(
        &self,
        name: &str,
        placement: Option<quire_metadata::StreamPlacement>,
    ) -> Result<Option<quire_metadata::StreamPlacement>> {
        if let Some(p) = &placement {
            p.validate().map_err(|e| Error::BadRequest {
                reason: format!("stream {name:?}: {e}"),
            })?;
        }
        self.registry
            .owner_command(name, |reply| Command::SetPlacement { placement, reply })
            .await
    }

    /// Acquires every stream in the metadata store that no other proxy owns now, recovering
    /// any segment a previous owner left in progress, instead of at each stream's first use.
    /// Returns how many streams were acquired (streams owned elsewhere are skipped, and so are
    /// the ones past `owned_streams_max`).
    ///
    /// # Errors
    /// The first stream that fails to recover (`Storage`, `Metadata`); the ones before it stay
    /// acquired.
    pub async fn recover_all(&self) -> Result<usize> {
        let names = self.list_streams().await?;
        let mut acquired = 0;
        for name in &names {
            match self.registry.stream(name, false, false).await {
                Ok(_) => acquired += 1,
                Err(
                    Error::OwnedElsewhere { .. }
                    | Error::NoSuchStream { .. }
                    | Error::TooManyStreams { .. }
                    | Error::RegionUnavailable { .. },
                ) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(acquired)
    }

    /// A drain's first step (`ProxyServer::drain` calls it before it stops accepting): with
    /// balancing on and another live proxy, leaves the proxy registry, keeps serving for about
    /// one registry tick and a half while the others drop this proxy from their views, then
    /// hands every owned stream to its preferred owner among them, 64 at a time, as the
    /// balancer moves streams (segment completed, lease released, writers redirected).
    /// Returns the streams handed over; 0 (only the registry left) otherwise. What is still
    /// owned afterwards is closed by [`StreamManager::shutdown`].
    pub async fn hand_over(&self) -> usize {
        balance::hand_over(&self.registry).await
    }

    /// Completes the open segment of every stream (close the ledger, mark it `Completed`),
    /// gives every stream lease up and refuses new requests with `ShuttingDown`. Streams not
    /// closed cleanly are recovered by the next owner anyway; this only saves it the fencing.
    ///
    /// # Errors
    /// The first `Storage` or `Metadata` error met; the other streams are still closed.
    pub async fn shutdown(&self) -> Result<()> {
        // Leave the proxy registry first, so that the others stop redirecting here.
        let reg = &self.registry;
        reg.placement.stop(&*reg.metadata).await;
        let cells = self.registry.begin_shutdown();
        let mut first_err = None;
        for cell in cells {
            let Some(handle) = cell.get() else { continue };
            let (reply, rx) = oneshot::channel();
            if handle.commands.send(Command::Close { reply }).await.is_ok() {
                if let Ok(Err(e)) = rx.await {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

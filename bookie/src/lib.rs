//! The Quire bookie server: one glommio executor per shard, each owning one storage engine,
//! all serving the bookie wire protocol (`docs/protocol.md`) on one TCP port.
//!
//! * **Ledger → shard.** A ledger belongs to exactly one shard, chosen by [`shard_of`]: a
//!   fixed 64-bit mix of the ledger id (the SplitMix64 finalizer) modulo the shard count. The
//!   shard count is recorded in the journal and ledger directories at first start; a later
//!   start with another count is refused, because it would move ledgers away from their data.
//! * **Connections.** Every shard binds its own listener on the same address with
//!   `SO_REUSEPORT` (glommio's `TcpListener::bind` sets it), so the kernel spreads
//!   connections over the shards. A request whose ledger lives on another shard is forwarded
//!   over a bounded flume channel to the owner, which answers on a capacity-1 channel: at most
//!   one cross-core hop each way.
//! * **Pipelining.** Each request runs in its own task; responses are matched by request id
//!   and may complete out of order. Responses are batched per connection into one write.
//! * **Read-only mode.** A monitor thread measures the usage of every shard's directories
//!   ([`disk`], BookKeeper's `LedgerDirsMonitor`); past `disk_usage_threshold` the bookie is
//!   read-only (normal adds answered `ReadOnly`, everything else served) until every directory
//!   is below `disk_usage_lwm_threshold`. [`Bookie::read_only_state`] reports and announces it.
//!
//! # Threading
//! [`Bookie`] is a handle owned by the starting thread; shards run on their own threads
//! (each glommio executor is two threads: the executor and its blocking pool).

mod conn;
pub mod disk;
mod faults;
mod gc;
mod host;
mod keys;
pub mod metrics;
mod ops;
mod scrub;
mod settings;
mod shard;

use std::fs;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use glommio::{LocalExecutorBuilder, Placement};
use tracing::Instrument;

use crate::shard::{Control, Event, ShardArgs, FORWARD_QUEUE_MAX};

pub use crate::conn::IN_FLIGHT_REQUESTS_PER_CONNECTION_MAX;
pub use crate::disk::{DirUsage, ReadOnlyState};
pub use crate::gc::{
    deleted_ledgers_channel, DeletedLedgers, DeletedLedgersQueries, DeletedLedgersQuery,
    GC_ANSWER_WAIT_MAX, GC_INTERVAL_DEFAULT,
};
pub use crate::host::ShardHost;
pub use crate::keys::{
    ledger_keys_channel, LedgerKeyAnswer, LedgerKeyQueries, LedgerKeyQuery, LedgerKeys,
    KEY_ANSWER_WAIT_MAX,
};
pub use crate::scrub::{
    damaged_ledgers_channel, DamagedLedgerReports, DamagedLedgers, ScrubConfig,
    SCRUB_INTERVAL_DEFAULT, SCRUB_RATE_BYTES_PER_SEC_DEFAULT,
};
pub use crate::settings::{check_cpu_set, BookieSettings, SHARDS_DEFAULT};

/// Default glommio `io_memory` per executor: 2 MiB, small enough for an 8 MiB memlock limit.
pub const IO_MEMORY_BYTES_DEFAULT: usize = 2 * 1024 * 1024;
/// Smallest accepted `frame_size_bytes_max`: a frame header plus a master key and an entry
/// header must fit.
pub const FRAME_SIZE_BYTES_MIN: u32 = 1024;
/// Largest shard count: the handshake carries it as a u16.
pub const SHARDS_MAX: usize = u16::MAX as usize;
/// Name of the file, in both the journal and the ledger directory, that records the shard count.
pub const SHARD_COUNT_FILE: &str = "quire-bookie-shards";

/// The largest entry an add frame of `frame_size_bytes_max` can carry: the frame length
/// counts 12 header bytes after the length field, then the 20-byte master key.
pub fn entry_size_bytes_max_for(frame_size_bytes_max: u32) -> usize {
    (frame_size_bytes_max as usize).saturating_sub(
        quire_wire::frame::FRAME_LEN_MIN as usize + quire_wire::MASTER_KEY_SIZE_BYTES,
    )
}

/// Maps a ledger to the shard that owns it.
///
/// The ledger id goes through the SplitMix64 finalizer (shifts 30/27/31, multipliers
/// `0xbf58476d1ce4e5b9` and `0x94d049bb133111eb`), and the result is taken modulo `shards`.
/// The mapping is part of the on-disk contract: it must never change for a given shard count.
///
/// # Panics
/// If `shards` is 0.
pub fn shard_of(ledger: u64, shards: usize) -> usize {
    assert!(shards >= 1, "a bookie has at least one shard");
    let mut z = ledger;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z % shards as u64) as usize
}

/// Everything [`Bookie::start`] needs.
#[derive(Debug, Clone)]
pub struct BookieConfig {
    /// Address every shard listens on; port 0 picks a free port (see [`Bookie::addr`]).
    pub listen: SocketAddr,
    /// Root of the journals: shard `i` uses `journal_dir/shard-{i}`.
    pub journal_dir: PathBuf,
    /// Root of the entry logs and indexes: shard `i` uses `ledger_dir/shard-{i}`.
    pub ledger_dir: PathBuf,
    /// Number of shards (executor threads, engines). Default: the number of CPUs.
    pub shards: usize,
    /// Largest frame accepted or sent, in bytes after the length field. Default 5 MiB.
    pub frame_size_bytes_max: u32,
    /// glommio `io_memory` per executor, in bytes. Default 2 MiB.
    pub io_memory_bytes: usize,
    /// CPUs to pin the shards to: shard `i` runs on CPU `cpu_set[i % cpu_set.len()]` (glommio
    /// `Placement::Fixed`; its blocking-pool thread too). Empty (the default): unpinned, the
    /// kernel places every shard. DESIGN.md's shard-per-core model wants one shard per pinned
    /// core; on a small host that shares its cores with the proxy, unpinned measured better
    /// (perf/README.md, "CPU per record"). A CPU that does not exist fails the start with
    /// `Runtime`.
    pub cpu_set: Vec<usize>,
    /// Usage (fraction of a filesystem's blocks, `0.0 < t <= 1.0`) at which a journal or ledger
    /// directory counts as full and the bookie turns read-only (BookKeeper
    /// `diskUsageThreshold`, any one directory being enough as with
    /// `readOnlyModeOnAnyDiskFullEnabled`). Default 0.95.
    pub disk_usage_threshold: f64,
    /// Usage below which every directory must be for a read-only bookie to take adds again
    /// (BookKeeper `diskUsageLwmThreshold`; `0.0 < lwm <= disk_usage_threshold`). Default 0.90.
    pub disk_usage_lwm_threshold: f64,
    /// Time between two measurements of the directories' usage (BookKeeper
    /// `diskCheckInterval`); a write failing with ENOSPC triggers one at once. Default 10 s.
    pub disk_check_interval: std::time::Duration,
    /// Engine settings for every shard; its directories are replaced per shard.
    pub engine: quire_engine::EngineConfig,
    /// Time between garbage-collection runs on each shard (BookKeeper `gcWaitTime`, default
    /// 600 s); zero disables garbage collection.
    pub gc_interval: std::time::Duration,
    /// Where shards ask which of their ledgers are deleted in the metadata store (see
    /// [`deleted_ledgers_channel`]). `None`: no ledger is ever deleted, while entry logs
    /// without live entries are still removed and compaction still runs.
    pub gc_deleted_ledgers: Option<DeletedLedgers>,
    /// The scrubber of every shard: on, daily, 4 MiB/s per shard by default ([`ScrubConfig`]).
    pub scrub: ScrubConfig,
    /// Where shards ask the metadata store whether a ledger exists and with which master key
    /// (see [`ledger_keys_channel`]), before an add or fence of a ledger on which no key is
    /// bound yet: a key binds only for a ledger the store holds with that key, so no ledger id
    /// can be squatted or filled by someone without its key (docs/protocol.md §Add, "When a
    /// key binds"). `None` (the default, for tests of the bookie alone): the first add binds
    /// any key, BookKeeper's rule. `quire bookie` and the sandbox always set it.
    pub ledger_keys: Option<LedgerKeys>,
    /// Where the shards record their metrics ([`metrics::BookieMetrics::for_bookie`], made
    /// for `shards` shards); `None` (the default): nothing is recorded.
    pub metrics: Option<Arc<metrics::BookieShardMetrics>>,
    /// Executors shared with other bookies of this process ([`ShardHost`]); `None` (the
    /// default): each shard gets an executor thread of its own, placed by `cpu_set`.
    pub host: Option<ShardHost>,
    /// A connection that has not completed its handshake (`Hello`) this long after it was
    /// accepted is closed (a partial header cannot hold a connection open). Default 10 s.
    pub handshake_timeout: std::time::Duration,
    /// A handshaken connection with no request in flight and nothing received for this long is
    /// closed; clients reconnect on their next request. Default 15 min.
    pub idle_timeout: std::time::Duration,
    /// Open client connections per bookie; each shard takes its share
    /// (`ceil(connections_max / shards)`, the kernel spreads accepts over the shards), and a
    /// connection over it is closed at once. Default 4096.
    pub connections_max: usize,
    /// Open client connections per client IP address (Kafka's `max.connections.per.ip`); each
    /// shard takes its share (`ceil(connections_per_ip_max / shards)`) and a connection over
    /// it is closed at once, so that one address holding connections cannot take every slot
    /// of `connections_max` from the proxies on other addresses. Default 1024.
    pub connections_per_ip_max: usize,
    /// Bytes of partial request frames larger than 64 KiB the bookie buffers at once (Kafka's
    /// `queued.max.request.bytes` memory pool); each shard takes its share
    /// (`ceil(request_pool_bytes / shards)`, at least one maximal frame). A connection
    /// reserves a large frame's size from its shard's share before reading the body and is
    /// not read while the share cannot give it. Default 256 MiB.
    pub request_pool_bytes: usize,
    /// A frame must arrive whole within this of its first bytes (time spent waiting for the
    /// pool excluded), or its connection is closed: a client trickling a frame cannot hold pool
    /// bytes. Default 60 s.
    pub frame_timeout: std::time::Duration,
    /// TLS on the bookie port (BookKeeper's `tlsProvider`, `tlsCertificatePath`, `tlsKeyStore`,
    /// `tlsTrustStore`, `tlsClientAuthentication`): with it every connection starts with a TLS
    /// handshake, bounded by `handshake_timeout`, and with client auth required a peer without
    /// a certificate signed by `ca_file` is closed before it is read. `None` (the default):
    /// plain TCP.
    pub tls: Option<quire_tls::ServerTls>,
    /// The secret every process of the cluster holds (`docs/protocol.md` §2, the role of
    /// BookKeeper's SASL/digest bookie authentication). With it the bookie speaks only
    /// protocol version 2: a connection must prove the secret (`Auth`, HMAC-SHA256 over both
    /// sides' nonces) within `handshake_timeout`, and any other request before that is refused
    /// with `Unauthorized` and closed before it touches any state. `None` (the default, for
    /// tests of this crate): version 1, no authentication. `quire bookie` always sets one.
    pub cluster_secret: Option<quire_wire::auth::ClusterSecret>,
}

/// Default of [`BookieConfig::handshake_timeout`].
pub const HANDSHAKE_TIMEOUT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(10);
/// Default of [`BookieConfig::idle_timeout`].
pub const IDLE_TIMEOUT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(15 * 60);
/// Default of [`BookieConfig::connections_max`].
pub const CONNECTIONS_MAX_DEFAULT: usize = 4096;
/// Default of [`BookieConfig::connections_per_ip_max`].
pub const CONNECTIONS_PER_IP_MAX_DEFAULT: usize = 1024;
/// Default of [`BookieConfig::request_pool_bytes`]: 256 MiB.
pub const REQUEST_POOL_BYTES_DEFAULT: usize = 256 * 1024 * 1024;
/// Default of [`BookieConfig::frame_timeout`].
pub const FRAME_TIMEOUT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(60);

impl BookieConfig {
    /// A configuration with defaults for everything but the address and directories.
    pub fn new(listen: SocketAddr, journal_dir: PathBuf, ledger_dir: PathBuf) -> Self {
        let shards = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut engine = quire_engine::EngineConfig::new(journal_dir.clone(), ledger_dir.clone());
        let frame_size_bytes_max = quire_wire::frame::FRAME_SIZE_BYTES_MAX_DEFAULT;
        // An add frame carries the frame header and the master key around the entry, so the
        // largest entry is what is left of the largest frame.
        engine.entry_size_bytes_max = engine
            .entry_size_bytes_max
            .min(entry_size_bytes_max_for(frame_size_bytes_max));
        Self {
            listen,
            journal_dir,
            ledger_dir,
            shards,
            frame_size_bytes_max,
            io_memory_bytes: IO_MEMORY_BYTES_DEFAULT,
            cpu_set: Vec::new(),
            disk_usage_threshold: disk::DISK_USAGE_THRESHOLD_DEFAULT,
            disk_usage_lwm_threshold: disk::DISK_USAGE_LWM_THRESHOLD_DEFAULT,
            disk_check_interval: disk::DISK_CHECK_INTERVAL_DEFAULT,
            engine,
            gc_interval: GC_INTERVAL_DEFAULT,
            gc_deleted_ledgers: None,
            scrub: ScrubConfig::default(),
            ledger_keys: None,
            metrics: None,
            host: None,
            handshake_timeout: HANDSHAKE_TIMEOUT_DEFAULT,
            idle_timeout: IDLE_TIMEOUT_DEFAULT,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            connections_per_ip_max: CONNECTIONS_PER_IP_MAX_DEFAULT,
            request_pool_bytes: REQUEST_POOL_BYTES_DEFAULT,
            frame_timeout: FRAME_TIMEOUT_DEFAULT,
            tls: None,
            cluster_secret: None,
        }
    }

    /// The journal directory of shard `index`.
    pub fn shard_journal_dir(&self, index: usize) -> PathBuf {
        self.journal_dir.join(format!("shard-{index}"))
    }

    /// The ledger directory of shard `index`.
    pub fn shard_ledger_dir(&self, index: usize) -> PathBuf {
        self.ledger_dir.join(format!("shard-{index}"))
    }
}

/// Everything that can stop a bookie from starting or shutting down cleanly.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A shard's engine failed to open (e.g. journal corruption) or to close.
    #[error("shard {shard}: {source}")]
    Engine {
        shard: usize,
        #[source]
        source: quire_engine::Error,
    },
    /// A file-system operation of the bookie itself failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A shard could not listen on the configured address.
    #[error("shard {shard}: cannot listen on {addr}: {source}")]
    Bind {
        shard: usize,
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    /// The configuration is invalid or does not match the directories.
    #[error("bad configuration: {0}")]
    Config(String),
    /// The TLS files could not be read or do not go together.
    #[error("bookie TLS: {0}")]
    Tls(#[from] quire_tls::Error),
    /// A shard thread could not start, or exited without reporting.
    #[error("shard {shard}: executor: {message}")]
    Runtime { shard: usize, message: String },
}

struct ShardHandle {
    control: flume::Sender<Control>,
    events: flume::Receiver<Event>,
    thread: Option<glommio::ExecutorJoinHandle<()>>,
}

/// A running bookie. Dropping it shuts it down like [`Bookie::shutdown`], ignoring errors.
pub struct Bookie {
    addr: SocketAddr,
    shards: Vec<ShardHandle>,
    /// Stopped after the shards (its state handle may outlive it).
    monitor: disk::DiskMonitor,
    status: Arc<metrics::BookieStatus>,
    /// The shared executors the shards run on, if any: held until the shards have closed,
    /// so that the last bookie to drop it joins the host's threads.
    _host: Option<ShardHost>,
}

impl std::fmt::Debug for Bookie {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bookie")
            .field("addr", &self.addr)
            .field("shards", &self.shards.len())
            .finish()
    }
}

impl Bookie {
    /// Starts one glommio executor thread per shard, opens (replays) each shard's engine,
    /// binds every shard to the same address, and returns once every shard is serving.
    ///
    /// # Errors
    /// `Config` for invalid settings or a shard count that differs from the one recorded in
    /// the directories; `Io` if those records cannot be read or written; `Engine` naming the
    /// first shard whose engine fails to open (for example journal corruption, with file and
    /// offset); `Bind` if the address is taken; `Runtime` if an executor cannot start. On
    /// error every shard already started is closed and joined.
    pub fn start(config: BookieConfig) -> Result<Bookie, Error> {
        validate(&config)?;
        let shard_count = config.shards;
        // Read once, before anything starts, so that bad TLS files fail the start.
        let tls = match &config.tls {
            Some(files) => Some(futures_rustls::TlsAcceptor::from(files.server_config()?)),
            None => None,
        };
        check_shard_count(&config.journal_dir, shard_count)?;
        check_shard_count(&config.ledger_dir, shard_count)?;
        let status = Arc::new(metrics::BookieStatus::new(
            shard_count,
            config.journal_dir.clone(),
            config.ledger_dir.clone(),
        ));
        let monitor = start_disk_monitor(&config)?;
        let read_only = monitor.state().clone();
        status.attach_read_only(read_only.clone());
        let mut bookie = Bookie {
            addr: config.listen,
            shards: Vec::with_capacity(shard_count),
            monitor,
            status: status.clone(),
            _host: config.host.clone(),
        };
        let shared = ShardShared {
            tls,
            read_only,
            status,
        };
        let started = bookie
            .spawn_shards(&config, &shared)
            .and_then(|()| bookie.wait_opened())
            .and_then(|()| bookie.bind_all(config.listen));
        if let Err(err) = started {
            bookie.abort();
            return Err(err);
        }
        tracing::info!(
            addr = %bookie.addr,
            shards = shard_count,
            read_only = bookie.is_read_only(),
            "bookie serving"
        );
        Ok(bookie)
    }

    /// Starts one executor thread per shard (each opens its engine at once); the shards can
    /// forward requests to each other over bounded queues.
    ///
    /// # Errors
    /// `Runtime` naming the first shard whose executor cannot start (the caller aborts the
    /// shards already started).
    fn spawn_shards(&mut self, config: &BookieConfig, shared: &ShardShared) -> Result<(), Error> {
        let shard_count = config.shards;
        let mut forward_txs = Vec::with_capacity(shard_count);
        let mut forward_rxs = Vec::with_capacity(shard_count);
        for _ in 0..shard_count {
            let (tx, rx) = flume::bounded(FORWARD_QUEUE_MAX);
            forward_txs.push(tx);
            forward_rxs.push(rx);
        }
        for (index, forward_rx) in forward_rxs.into_iter().enumerate() {
            let (control_tx, control_rx) = flume::bounded(4);
            let (events_tx, events_rx) = flume::bounded(8);
            let args = shard_args(
                config,
                shared,
                index,
                ShardChannels {
                    control: control_rx,
                    events: events_tx,
                    forward_rx,
                    peers: forward_txs.clone(),
                },
            );
            let thread = spawn_shard(config, index, args).map_err(|message| Error::Runtime {
                shard: index,
                message,
            })?;
            self.shards.push(ShardHandle {
                control: control_tx,
                events: events_rx,
                thread,
            });
        }
        Ok(())
    }

    /// Waits until every shard's engine has opened: every engine replays in parallel, and
    /// nothing is bound before all of them have.
    ///
    /// # Errors
    /// `Engine` for the first shard whose engine failed to open; `Runtime` if a shard
    /// reported something else or exited.
    fn wait_opened(&self) -> Result<(), Error> {
        let mut first_error = None;
        for (index, s) in self.shards.iter().enumerate() {
            match s.events.recv() {
                Ok(Event::Opened) => {}
                Ok(Event::OpenFailed(source)) => {
                    first_error.get_or_insert(Error::Engine {
                        shard: index,
                        source,
                    });
                }
                other => {
                    first_error.get_or_insert(unexpected(index, "Opened", other));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Binds every shard to `listen`. Shard 0 binds first so that port 0 resolves to one port
    /// that the others share; `self.addr` becomes the bound address.
    ///
    /// # Errors
    /// `Bind` if the address is taken; `Runtime` if a shard does not answer.
    fn bind_all(&mut self, listen: SocketAddr) -> Result<(), Error> {
        let mut addr = listen;
        for index in 0..self.shards.len() {
            let a = self.bind_shard(index, addr)?;
            if index == 0 {
                addr = a;
            }
        }
        self.addr = addr;
        Ok(())
    }

    /// The address the bookie listens on (with the real port when started with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether the bookie is read-only now (a journal or ledger directory reached
    /// `disk_usage_threshold` and not every one is below `disk_usage_lwm_threshold` yet).
    pub fn is_read_only(&self) -> bool {
        self.monitor.state().is_read_only()
    }

    /// A handle on the read-only state: the current state, each directory's measured usage,
    /// and a subscription to transitions (to move the registration between BookKeeper's
    /// `available` and `available/readonly`). Usable from any thread, after shutdown too.
    pub fn read_only_state(&self) -> ReadOnlyState {
        self.monitor.state().clone()
    }

    /// What the shards publish about themselves (ledger counts, cache sizes) and the bookie's
    /// state: what `GetBookieInfo` answers and metrics expose. Expose it with
    /// [`metrics::BookieMetrics::add_status`].
    pub fn status(&self) -> Arc<metrics::BookieStatus> {
        self.status.clone()
    }

    /// Clean stop: every shard stops accepting connections and reading requests, every
    /// request already read is answered (including requests forwarded between shards), then
    /// every engine is closed (final checkpoint) and every thread joined.
    ///
    /// # Errors
    /// The first `Engine` error from closing an engine, or `Runtime` if a shard thread died.
    pub fn shutdown(mut self) -> Result<(), Error> {
        self.stop_all()
    }

    fn bind_shard(&self, index: usize, addr: SocketAddr) -> Result<SocketAddr, Error> {
        let s = &self.shards[index];
        if s.control.send(Control::Bind(addr)).is_err() {
            return Err(Error::Runtime {
                shard: index,
                message: "exited before bind".into(),
            });
        }
        match s.events.recv() {
            Ok(Event::Bound(a)) => Ok(a),
            Ok(Event::BindFailed(source)) => Err(Error::Bind {
                shard: index,
                addr,
                source,
            }),
            other => Err(unexpected(index, "Bound", other)),
        }
    }

    /// Closes and joins every shard after a failed start.
    fn abort(&mut self) {
        for s in &self.shards {
            let _ = s.control.send(Control::Close);
        }
        for (index, s) in self.shards.iter_mut().enumerate() {
            if let Some(thread) = s.thread.take() {
                if let Err(e) = thread.join() {
                    tracing::error!(shard = index, error = %e, "shard thread failed");
                }
            }
        }
        self.shards.clear();
    }

    fn stop_all(&mut self) -> Result<(), Error> {
        let mut first_error = None;
        // Phase 1: all shards stop reading and drain. Only when every shard has drained can
        // no forwarded request arrive anywhere, so engines close in phase 2.
        for s in &self.shards {
            let _ = s.control.send(Control::Stop);
        }
        for (index, s) in self.shards.iter().enumerate() {
            match s.events.recv() {
                Ok(Event::Drained) => {}
                other => {
                    first_error.get_or_insert(unexpected(index, "Drained", other));
                }
            }
        }
        for s in &self.shards {
            let _ = s.control.send(Control::Close);
        }
        for (index, s) in self.shards.iter().enumerate() {
            match s.events.recv() {
                Ok(Event::Closed(Ok(()))) => {}
                Ok(Event::Closed(Err(source))) => {
                    first_error.get_or_insert(Error::Engine {
                        shard: index,
                        source,
                    });
                }
                other => {
                    first_error.get_or_insert(unexpected(index, "Closed", other));
                }
            }
        }
        for (index, s) in self.shards.iter_mut().enumerate() {
            if let Some(thread) = s.thread.take() {
                if let Err(e) = thread.join() {
                    first_error.get_or_insert(Error::Runtime {
                        shard: index,
                        message: e.to_string(),
                    });
                }
            }
        }
        self.shards.clear();
        self.monitor.stop();
        match first_error {
            Some(e) => Err(e),
            None => {
                tracing::info!(addr = %self.addr, "bookie stopped");
                Ok(())
            }
        }
    }
}

impl Drop for Bookie {
    fn drop(&mut self) {
        if !self.shards.is_empty() {
            if let Err(e) = self.stop_all() {
                tracing::error!(error = %e, "bookie shutdown on drop failed");
            }
        }
    }
}

/// What every shard gets a handle of: the TLS acceptor, the read-only state of the disk
/// monitor and the bookie's status for `GetBookieInfo` and metrics.
struct ShardShared {
    tls: Option<futures_rustls::TlsAcceptor>,
    read_only: disk::ReadOnlyState,
    status: Arc<metrics::BookieStatus>,
}

/// A shard's channels: control and events with the starting thread, forwarding with the
/// other shards.
struct ShardChannels {
    control: flume::Receiver<Control>,
    events: flume::Sender<Event>,
    forward_rx: flume::Receiver<shard::Forwarded>,
    peers: Vec<flume::Sender<shard::Forwarded>>,
}

/// Creates every shard's journal and ledger directory (so that a bookie that starts on a full
/// disk is read-only before it serves anything) and starts the disk monitor over them.
///
/// # Errors
/// `Io` if a directory cannot be created; `Runtime` if the monitor thread cannot start.
fn start_disk_monitor(config: &BookieConfig) -> Result<disk::DiskMonitor, Error> {
    let mut monitored = Vec::with_capacity(2 * config.shards);
    for index in 0..config.shards {
        for dir in [
            config.shard_journal_dir(index),
            config.shard_ledger_dir(index),
        ] {
            fs::create_dir_all(&dir).map_err(|source| Error::Io {
                op: "create directory",
                path: dir.clone(),
                source,
            })?;
            monitored.push(dir);
        }
    }
    disk::DiskMonitor::start(
        monitored,
        config.disk_usage_threshold,
        config.disk_usage_lwm_threshold,
        config.disk_check_interval,
    )
    .map_err(|e| Error::Runtime {
        shard: 0,
        message: format!("cannot start the disk monitor thread: {e}"),
    })
}

/// The arguments of shard `index`: its engine directories, its share of the connection and
/// request-pool limits (the bookie-wide ones divided by the shard count, rounded up), and
/// the handles every shard gets.
fn shard_args(
    config: &BookieConfig,
    shared: &ShardShared,
    index: usize,
    channels: ShardChannels,
) -> ShardArgs {
    let shard_count = config.shards;
    let mut engine = config.engine.clone();
    engine.journal_dir = config.shard_journal_dir(index);
    engine.ledger_dir = config.shard_ledger_dir(index);
    ShardArgs {
        index,
        shard_count,
        frame_size_bytes_max: config.frame_size_bytes_max,
        engine,
        control: channels.control,
        events: channels.events,
        forward_rx: channels.forward_rx,
        peers: channels.peers,
        gc_interval: config.gc_interval,
        gc_deleted_ledgers: config.gc_deleted_ledgers.clone(),
        scrub: config.scrub.clone(),
        ledger_keys: config.ledger_keys.clone(),
        read_only: shared.read_only.clone(),
        metrics: config.metrics.as_ref().map(|m| m.shard(index).clone()),
        status: shared.status.clone(),
        tls: shared.tls.clone(),
        limits: shard::ConnectionLimits {
            handshake_timeout: config.handshake_timeout,
            idle_timeout: config.idle_timeout,
            connections_max: config.connections_max.div_ceil(shard_count).max(1),
            connections_per_ip_max: config.connections_per_ip_max.div_ceil(shard_count).max(1),
            frame_timeout: config.frame_timeout,
            request_pool_bytes: config
                .request_pool_bytes
                .div_ceil(shard_count)
                .max(config.frame_size_bytes_max as usize + 4),
            cluster_secret: config.cluster_secret,
        },
    }
}

/// Starts shard `index`'s executor: on the host's threads when one is configured, else on a
/// thread of its own, unbound unless `cpu_set` asks (on a 2-core machine pinning shards next
/// to the proxy and the test harness hurts more than it helps, reference/infra.md §2).
/// Returns the thread's join handle (`None` on a host).
///
/// # Errors
/// Why the executor could not start.
fn spawn_shard(
    config: &BookieConfig,
    index: usize,
    args: ShardArgs,
) -> Result<Option<glommio::ExecutorJoinHandle<()>>, String> {
    match &config.host {
        Some(host) => host
            .place(Box::new(move || {
                Box::pin(shard::shard_main(args).instrument(tracing::info_span!("shard", index)))
            }))
            .map(|()| None),
        None => {
            let placement = match config.cpu_set.as_slice() {
                [] => Placement::Unbound,
                cpus => Placement::Fixed(cpus[index % cpus.len()]),
            };
            LocalExecutorBuilder::new(placement)
                .name(&format!("quire-shard-{index}"))
                .io_memory(config.io_memory_bytes)
                .spawn(move || {
                    shard::shard_main(args).instrument(tracing::info_span!("shard", index))
                })
                .map(Some)
                .map_err(|e| e.to_string())
        }
    }
}

fn unexpected(shard: usize, wanted: &str, got: Result<Event, flume::RecvError>) -> Error {
    let message = match got {
        Ok(event) => format!("expected {wanted}, got {event:?}"),
        Err(_) => format!("exited while the bookie waited for {wanted}"),
    };
    Error::Runtime { shard, message }
}

fn validate(config: &BookieConfig) -> Result<(), Error> {
    if config.shards == 0 || config.shards > SHARDS_MAX {
        return Err(Error::Config(format!(
            "shards is {}, must be in 1..={SHARDS_MAX}",
            config.shards
        )));
    }
    if let Some(m) = &config.metrics {
        if m.shard_count() != config.shards {
            return Err(Error::Config(format!(
                "metrics were made for {} shards but the bookie has {}",
                m.shard_count(),
                config.shards
            )));
        }
    }
    if config.frame_size_bytes_max < FRAME_SIZE_BYTES_MIN {
        return Err(Error::Config(format!(
            "frame_size_bytes_max is {}, must be at least {FRAME_SIZE_BYTES_MIN}",
            config.frame_size_bytes_max
        )));
    }
    if config.io_memory_bytes < 64 * 1024 {
        return Err(Error::Config(format!(
            "io_memory_bytes is {}, glommio needs at least 65536",
            config.io_memory_bytes
        )));
    }
    let (t, lwm) = (config.disk_usage_threshold, config.disk_usage_lwm_threshold);
    if !(t > 0.0 && t <= 1.0) {
        return Err(Error::Config(format!(
            "disk_usage_threshold is {t}, must be in (0, 1]"
        )));
    }
    if !(lwm > 0.0 && lwm <= t) {
        return Err(Error::Config(format!(
            "disk_usage_lwm_threshold is {lwm}, must be in (0, disk_usage_threshold = {t}]"
        )));
    }
    if config.disk_check_interval.is_zero() {
        return Err(Error::Config("disk_check_interval must be positive".into()));
    }
    if config.engine.entry_size_bytes_max > entry_size_bytes_max_for(config.frame_size_bytes_max) {
        tracing::warn!(
            entry_size_bytes_max = config.engine.entry_size_bytes_max,
            frame_size_bytes_max = config.frame_size_bytes_max,
            "the largest entry does not fit in the largest frame; big adds will be refused as TooLarge frames"
        );
    }
    Ok(())
}

/// Records `shards` in `dir` on first start; refuses a different count later.
///
/// The file holds one line, `shards=N`. It is written before any shard directory is used, and
/// synced, so a crash cannot leave shard data without a record of the count.
fn check_shard_count(dir: &Path, shards: usize) -> Result<(), Error> {
    fs::create_dir_all(dir).map_err(|source| Error::Io {
        op: "create directory",
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(SHARD_COUNT_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => {
            let recorded = text
                .trim()
                .strip_prefix("shards=")
                .and_then(|n| n.parse::<usize>().ok())
                .ok_or_else(|| {
                    Error::Config(format!(
                        "{} is malformed: {:?}",
                        path.display(),
                        text.trim()
                    ))
                })?;
            if recorded != shards {
                return Err(Error::Config(format!(
                    "{} records {recorded} shards but the bookie was started with {shards}; ledgers map to \
                     shards by hash(ledger) mod shards, so changing the count would orphan existing ledgers. \
                     Start with shards={recorded}.",
                    path.display()
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let tmp = dir.join(format!("{SHARD_COUNT_FILE}.tmp"));
            let write = || -> io::Result<()> {
                let mut f = fs::File::create(&tmp)?;
                io::Write::write_all(&mut f, format!("shards={shards}\n").as_bytes())?;
                f.sync_all()?;
                fs::rename(&tmp, &path)?;
                fs::File::open(dir)?.sync_all()
            };
            write().map_err(|source| Error::Io {
                op: "write shard count",
                path: path.clone(),
                source,
            })
        }
        Err(source) => Err(Error::Io {
            op: "read shard count",
            path,
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_hash_is_stable_and_spreads() {
        // Goal: the ledger→shard mapping is fixed (it is an on-disk contract) and spreads
        // consecutive ledger ids over the shards. Method: pin a few values, count a range.
        assert_eq!(shard_of(0, 1), 0);
        let pinned: Vec<usize> = (0..8).map(|l| shard_of(l, 4)).collect();
        assert_eq!(pinned, PINNED_4);
        let mut counts = [0usize; 4];
        for l in 0..4000 {
            counts[shard_of(l, 4)] += 1;
        }
        for c in counts {
            assert!((800..1200).contains(&c), "uneven spread {counts:?}");
        }
    }

    const PINNED_4: [usize; 8] = [0, 1, 2, 0, 0, 0, 0, 0];
}

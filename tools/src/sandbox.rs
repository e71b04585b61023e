//! `quire sandbox`: the embedded metadata store, N bookies and a proxy in one process.
//!
//! Layout of the data directory:
//! ```text
//! DIR/LOCK                     flock(2)ed while a sandbox runs on DIR
//! DIR/sandbox.json             bookie addresses chosen at first start, reused on restart
//! DIR/metadata/metadata.json   the embedded metadata store
//! DIR/bookie-{i}/journal/      bookie i's journal directory (one subdirectory per shard)
//! DIR/bookie-{i}/ledgers/      bookie i's entry logs and index
//! ```
//! Bookie addresses are part of every ledger's metadata (the ensemble), so a restarted sandbox
//! must bring its bookies back at the same addresses: they are chosen once (free ports on
//! 127.0.0.1) and recorded in `sandbox.json`.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use quire_bookie::{Bookie, BookieConfig, DeletedLedgers, DeletedLedgersQueries, ShardHost};
use quire_metadata::{BookieId, BookieInfo, EmbeddedStore, MetadataStore};

/// `quire sandbox` options.
#[derive(Args, Debug)]
pub struct SandboxArgs {
    /// Directory holding all of the sandbox's data; created if missing.
    #[arg(long, default_value = "quire-sandbox")]
    data_dir: PathBuf,
    /// Address the proxy listens on (port 0 picks a free one; the address is printed).
    #[arg(long, default_value = crate::PROXY_ADDR_DEFAULT)]
    listen: SocketAddr,
    /// Number of bookies (only read at first start).
    #[arg(long, default_value_t = 3)]
    bookies: usize,
    /// Shards (glommio executors) per bookie.
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// Ensemble size E of new segments' ledgers.
    #[arg(long, default_value_t = 3)]
    ensemble_size: u8,
    /// Write quorum Qw.
    #[arg(long, default_value_t = 3)]
    write_quorum: u8,
    /// Ack quorum Qa.
    #[arg(long, default_value_t = 2)]
    ack_quorum: u8,
    /// Segments roll once they hold this many bytes (DistributedLog default: 256 MiB).
    #[arg(long, default_value_t = 256 * 1024 * 1024)]
    segment_size_bytes: u64,
    /// Records are packed into entries of up to this many bytes.
    #[arg(long, default_value_t = 256 * 1024)]
    entry_size_bytes: usize,
    /// A segment holding at least one record also rolls once it is this many seconds old
    /// (DistributedLog default: 2 h); 0 turns time rolling off.
    #[arg(long, default_value_t = 7200)]
    segment_roll_secs: u64,
    /// Default retention time of every stream: completed segments older than this many
    /// seconds are deleted, oldest first (streams override it with `quire stream retention`).
    /// Unset: kept forever.
    #[arg(long, value_parser = parse_retention_time_secs)]
    retention_time_secs: Option<u64>,
    /// Default retention size of every stream: its oldest completed segments are deleted while
    /// it holds more than this many bytes. Unset: no limit.
    #[arg(long, value_parser = parse_retention_size_bytes)]
    retention_size_bytes: Option<u64>,
    /// Seconds between the proxy's lifecycle sweeps over every stream: retention and the
    /// completion of abandoned segments on streams no request touched, and deletion of orphan
    /// ledger metadata left by a crash mid-deletion (default 300; 0 disables).
    #[arg(long, default_value_t = 300)]
    lifecycle_sweep_secs: u64,
    /// The txid guard (Quire's own, against a poisoned stream): a record whose txid is more
    /// than this above the txid before it (its stream's last txid, or the previous record of
    /// the same write) is refused with `TXID_TOO_FAR_AHEAD`; a stream's first record may have
    /// any txid. 0 turns the guard off.
    #[arg(long, default_value_t = quire_proxy::TXID_JUMP_MAX_DEFAULT)]
    txid_jump_max: u64,
    /// Size of each pre-written journal file, in bytes.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    journal_file_size_bytes: u64,
    /// Checkpointed journal files each shard keeps for reuse by later rolls (the bookie setting
    /// `journal_reuse_files`; 0 pre-writes every new journal file with zeros).
    #[arg(long, default_value_t = 4)]
    journal_reuse_files: usize,
    /// CPUs to pin the bookies' shards to, e.g. `0,1`: the shards of all bookies, numbered
    /// bookie by bookie, take the listed CPUs in turn (shard g on the (g mod n)-th). Default:
    /// unpinned, which measured better on a 2-core host (perf/README.md, "CPU per record").
    #[arg(long, value_delimiter = ',')]
    cpu_set: Option<Vec<usize>>,
    /// glommio executor threads shared by the shards of every bookie (a bookie `ShardHost`:
    /// one wake-up serves the replicas that arrive together, and the bookies get a share of
    /// the cores instead of one thread per shard); 0 gives each shard a thread of its own, as a
    /// `quire bookie` process does. Pinned by `--cpu-set` when given. Default: half the CPUs,
    /// at least 1, leaving the rest to the proxy (measured in perf/README.md, "Shards of
    /// several bookies on shared executors").
    #[arg(long)]
    shard_executors: Option<usize>,
    /// Journal batches are written and then fdatasync'ed (two requests) instead of written
    /// with RWF_DSYNC (one request; the default).
    #[arg(long)]
    journal_separate_fdatasync: bool,
    /// Worker threads of the proxy's tokio runtime (the catch-up read runtime is apart).
    #[arg(long, default_value_t = 2)]
    proxy_threads: usize,
    /// Seconds between garbage-collection runs on each bookie shard (BookKeeper `gcWaitTime`;
    /// 0 disables).
    #[arg(long, default_value_t = 600)]
    gc_interval_secs: u64,
    /// Usage of a bookie directory's filesystem (fraction in (0, 1]) at which that bookie
    /// turns read-only (BookKeeper `diskUsageThreshold`; default 0.95).
    #[arg(long)]
    disk_usage_threshold: Option<f64>,
    /// Usage every directory of a read-only bookie must be below for it to take adds again
    /// (BookKeeper `diskUsageLwmThreshold`; default 0.90).
    #[arg(long)]
    disk_usage_lwm_threshold: Option<f64>,
    /// Time between two disk usage measurements, in milliseconds (default 10000).
    #[arg(long)]
    disk_check_interval_ms: Option<u64>,
    /// TLS with required client certificates on every bookie port and on the proxy port
    /// (off by default). The first start makes a CA and one certificate for 127.0.0.1,
    /// localhost and the listen address in `DATA_DIR/tls` (`ca.pem`, `node.pem`, `node.key`,
    /// as `quire tls-certs`); clients pass them as `--tls-ca-file`, `--tls-cert-file` and
    /// `--tls-key-file`.
    #[arg(long)]
    tls: bool,
    /// Address of the HTTP endpoint serving `GET /metrics` (every bookie's metrics labelled
    /// `bookie="bookie-N"`, and the proxy's) and `GET /healthz`; off unless set. Port 0 picks
    /// a free port (printed).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Minor compaction threshold: entry logs whose live fraction is below it are rewritten
    /// (BookKeeper `minorCompactionThreshold`; 0 to 1, below the major one; default 0.2).
    #[arg(long)]
    minor_compaction_threshold: Option<f64>,
    /// Seconds between minor compactions (BookKeeper `minorCompactionInterval`; default 3600,
    /// 0 disables).
    #[arg(long)]
    minor_compaction_interval_secs: Option<u64>,
    /// Major compaction threshold (BookKeeper `majorCompactionThreshold`; default 0.8).
    #[arg(long)]
    major_compaction_threshold: Option<f64>,
    /// Seconds between major compactions (BookKeeper `majorCompactionInterval`; default
    /// 86400, 0 disables).
    #[arg(long)]
    major_compaction_interval_secs: Option<u64>,
    /// An entry log rolls to a new file beyond this many bytes (BookKeeper `logSizeLimit`;
    /// default 1 GiB). Only whole non-current logs are deleted or compacted.
    #[arg(long)]
    entry_log_size_bytes: Option<u64>,
    /// Milliseconds between the bookies' checkpoints (write cache to entry logs; BookKeeper
    /// `flushInterval`; default 10000).
    #[arg(long)]
    checkpoint_interval_ms: Option<u64>,
    /// Bound of each bookie shard's index block cache, in bytes (BookKeeper
    /// `dbStorage_rocksDB_blockCacheSize`; default 16 MiB, at least 65536).
    #[arg(long)]
    index_cache_bytes_max: Option<u64>,
    /// Bytes of zeros each bookie shard keeps in its ledger directory and gives back when
    /// garbage collection finds the disk full (default 4 MiB; 0 turns it off).
    #[arg(long)]
    space_reserve_bytes: Option<u64>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SandboxFile {
    bookies: Vec<SocketAddr>,
}

/// Takes an exclusive flock on `DIR/LOCK` for the life of the process, so that two sandboxes
/// never share a data directory.
fn lock_data_dir(dir: &Path) -> Result<std::fs::File> {
    let path = dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: flock on a file descriptor we own; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        bail!("another sandbox is running on {}", dir.display());
    }
    Ok(file)
}

/// The engine keys given as flags over the engine's defaults ([`quire_engine::EngineSettings`]),
/// checked.
fn engine_settings(args: &SandboxArgs) -> Result<quire_engine::EngineSettings> {
    let d = quire_engine::EngineSettings::default();
    let s = quire_engine::EngineSettings {
        entry_log_size_bytes: args.entry_log_size_bytes.unwrap_or(d.entry_log_size_bytes),
        checkpoint_interval_ms: args
            .checkpoint_interval_ms
            .unwrap_or(d.checkpoint_interval_ms),
        index_cache_bytes_max: args
            .index_cache_bytes_max
            .unwrap_or(d.index_cache_bytes_max),
        space_reserve_bytes: args.space_reserve_bytes.unwrap_or(d.space_reserve_bytes),
        ..d
    };
    s.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(s)
}

/// The compaction flags over the engine's defaults, checked.
fn compaction_settings(args: &SandboxArgs) -> Result<quire_engine::CompactionSettings> {
    let d = quire_engine::CompactionSettings::default();
    let s = quire_engine::CompactionSettings {
        minor_threshold: args.minor_compaction_threshold.unwrap_or(d.minor_threshold),
        minor_interval_secs: args
            .minor_compaction_interval_secs
            .unwrap_or(d.minor_interval_secs),
        major_threshold: args.major_compaction_threshold.unwrap_or(d.major_threshold),
        major_interval_secs: args
            .major_compaction_interval_secs
            .unwrap_or(d.major_interval_secs),
    };
    s.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(s)
}

/// The read-only mode flags over the bookie's defaults, checked: (threshold, low-water mark,
/// interval).
fn disk_usage(args: &SandboxArgs) -> Result<(f64, f64, Duration)> {
    let d = quire_bookie::BookieSettings::default();
    let s = quire_bookie::BookieSettings {
        disk_usage_threshold: args.disk_usage_threshold.unwrap_or(d.disk_usage_threshold),
        disk_usage_lwm_threshold: args.disk_usage_lwm_threshold,
        disk_check_interval_ms: args
            .disk_check_interval_ms
            .unwrap_or(d.disk_check_interval_ms),
        ..d
    };
    s.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let interval = Duration::from_millis(s.disk_check_interval_ms);
    Ok((s.disk_usage_threshold, s.disk_usage_lwm(), interval))
}

/// The configuration of bookie `index` (1-based). With `cpu_set`, its shard `i` is global
/// shard `(index - 1) * shards + i`, so that one-shard bookies spread over the listed CPUs
/// instead of all taking the first.
fn bookie_config(
    args: &SandboxArgs,
    cpu_set: &[usize],
    disk: (f64, f64, Duration),
    index: usize,
    listen: SocketAddr,
    gc: &MetadataChannels,
) -> Result<BookieConfig> {
    let root = args.data_dir.join(format!("bookie-{index}"));
    let mut config = BookieConfig::new(listen, root.join("journal"), root.join("ledgers"));
    config.shards = args.shards;
    if !cpu_set.is_empty() {
        let first = (index - 1) * args.shards;
        config.cpu_set = (first..first + args.shards)
            .map(|g| cpu_set[g % cpu_set.len()])
            .collect();
    }
    config.io_memory_bytes = 1 << 20;
    config.engine.journal_file_size_bytes = args.journal_file_size_bytes;
    config.engine.journal_reuse_files = args.journal_reuse_files;
    config.engine.journal_dsync_writes = !args.journal_separate_fdatasync;
    config.gc_interval = Duration::from_secs(args.gc_interval_secs);
    config.gc_deleted_ledgers = Some(gc.deleted.clone());
    // A key binds only for a ledger the metadata store holds with that key (issue 24).
    config.ledger_keys = Some(gc.keys.clone());
    (
        config.disk_usage_threshold,
        config.disk_usage_lwm_threshold,
        config.disk_check_interval,
    ) = disk;
    engine_settings(args)?.apply(&mut config.engine);
    compaction_settings(args)?.apply(&mut config.engine);
    if args.tls {
        let pki = sandbox_pki(args)?;
        config.tls = Some(quire_tls::ServerTls {
            cert_file: pki.cert_file,
            key_file: pki.key_file,
            ca_file: Some(pki.ca_file),
            client_auth: quire_tls::ClientAuth::Require,
        });
    }
    config.cluster_secret = Some(sandbox_cluster_secret(args)?);
    Ok(config)
}

/// Where the sandbox keeps its cluster secret: `DATA_DIR/secrets/cluster-secret`.
pub fn sandbox_cluster_secret_file(data_dir: &Path) -> PathBuf {
    data_dir.join("secrets").join("cluster-secret")
}

/// The sandbox's cluster secret, made (0600, in a 0700 directory) at the first start: its
/// bookies admit only connections that prove it, so a stranger on a bookie port can neither
/// add, read nor fence (issue 24).
fn sandbox_cluster_secret(args: &SandboxArgs) -> Result<quire_wire::auth::ClusterSecret> {
    let path = sandbox_cluster_secret_file(&args.data_dir);
    Ok(crate::secret_file::create_cluster_secret(&path, "the sandbox's cluster secret")?.0)
}

/// The sandbox's TLS files in `DATA_DIR/tls`, made at the first start with `--tls`.
fn sandbox_pki(args: &SandboxArgs) -> Result<quire_tls::gen::PkiFiles> {
    let dir = args.data_dir.join("tls");
    let files = quire_tls::gen::PkiFiles {
        ca_file: dir.join("ca.pem"),
        cert_file: dir.join("node.pem"),
        key_file: dir.join("node.key"),
    };
    if files.ca_file.exists() && files.cert_file.exists() && files.key_file.exists() {
        return Ok(files);
    }
    // The key is private: the directory is the owner's only (the key is written 0600 in it).
    crate::secret_file::create_private_dir(&dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let mut sans = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    let ip = args.listen.ip();
    if !ip.is_unspecified() && !ip.is_loopback() {
        sans.push(ip.to_string());
    }
    Ok(quire_tls::gen::write_pki(&dir, &sans)?)
}

/// The bookies' channels to the metadata side (answered in [`serve`]).
struct MetadataChannels {
    /// Garbage collection: which ledgers are deleted.
    deleted: DeletedLedgers,
    /// Key binding: does a ledger exist, with which master key.
    keys: quire_bookie::LedgerKeys,
}

/// Starts the bookies, at their recorded addresses if this directory was used before, each
/// recording into `metrics` (labelled `bookie="bookie-{i}"`, its directory's name: the
/// address of a first start is only known once it is bound) when given.
fn start_bookies(
    args: &SandboxArgs,
    gc: &MetadataChannels,
    metrics: Option<&quire_bookie::metrics::BookieMetrics>,
) -> Result<Vec<Bookie>> {
    let record = args.data_dir.join("sandbox.json");
    let known: Option<SandboxFile> = match std::fs::read(&record) {
        Ok(bytes) => Some(
            serde_json::from_slice(&bytes)
                .with_context(|| format!("{} is corrupt", record.display()))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", record.display())),
    };
    let addrs: Vec<SocketAddr> = match &known {
        Some(k) => k.bookies.clone(),
        None => vec!["127.0.0.1:0".parse().expect("literal address"); args.bookies],
    };
    if addrs.is_empty() {
        bail!(
            "{} lists no bookies; a sandbox needs at least one",
            record.display()
        );
    }
    if known.is_some() {
        // Every recorded bookie must still have its directories: a missing one means the data
        // directory was changed by hand, and starting would serve an incomplete cluster.
        for i in 1..=addrs.len() {
            let dir = args.data_dir.join(format!("bookie-{i}"));
            if !dir.is_dir() {
                bail!(
                    "{} lists {} bookies but {} is missing; refusing to start",
                    record.display(),
                    addrs.len(),
                    dir.display()
                );
            }
        }
    }
    let cpu_set = match &args.cpu_set {
        Some(cpus) => {
            quire_bookie::check_cpu_set(cpus).map_err(|e| anyhow::anyhow!("{e}"))?;
            cpus.clone()
        }
        None => Vec::new(),
    };
    let disk = disk_usage(args)?;
    let executors = args.shard_executors.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
    });
    let host = match executors {
        0 => None,
        n => {
            let shards_per_executor = (addrs.len() * args.shards).div_ceil(n);
            let io_memory = shards_per_executor.max(1) << 20;
            Some(ShardHost::start(n, &cpu_set, io_memory).map_err(anyhow::Error::msg)?)
        }
    };
    let mut bookies = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let mut config = bookie_config(args, &cpu_set, disk, i + 1, *addr, gc)?;
        config.host = host.clone();
        let label = format!("bookie-{}", i + 1);
        if let Some(m) = metrics {
            config.metrics = Some(m.for_bookie(&label, config.shards));
        }
        let bookie = Bookie::start(config)
            .with_context(|| format!("bookie {} at {addr} did not start", i + 1))?;
        if let Some(m) = metrics {
            m.add_status(&label, bookie.status());
        }
        bookies.push(bookie);
    }
    if known.is_none() {
        let file = SandboxFile {
            bookies: bookies.iter().map(Bookie::addr).collect(),
        };
        let tmp = record.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&file)?)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &record)?;
        std::fs::File::open(&args.data_dir)?.sync_all()?;
    }
    Ok(bookies)
}

/// Refuses data directories whose parts disagree, before anything is started.
///
/// Bookies keep entries under ledger ids that only the metadata store hands out, so bookie data
/// without its metadata (a deleted `metadata.json`) must never be served: a fresh store would
/// hand the same ledger ids out again and recovery would adopt the old entries. Likewise,
/// metadata without `sandbox.json` has lost the bookie addresses its ledgers name.
fn check_data_dir(args: &SandboxArgs, store: &EmbeddedStore) -> Result<()> {
    let record = args.data_dir.join("sandbox.json");
    let metadata = args
        .data_dir
        .join("metadata")
        .join(quire_metadata::EMBEDDED_FILE_NAME);
    if record.exists() && !metadata.exists() {
        bail!(
            "{} is missing although {} exists: the sandbox's metadata was lost; refusing to start, \
             because its bookies' entries would be taken for new ledgers",
            metadata.display(),
            record.display()
        );
    }
    if !record.exists() && store.ledger_count() > 0 {
        bail!(
            "{} is missing although the metadata names {} ledgers: the bookie addresses are lost; \
             refusing to start",
            record.display(),
            store.ledger_count()
        );
    }
    Ok(())
}

/// Runs the sandbox until SIGINT or SIGTERM.
pub fn run(args: SandboxArgs) -> Result<()> {
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create {}", args.data_dir.display()))?;
    let _lock = lock_data_dir(&args.data_dir)?;
    let store = EmbeddedStore::open(&args.data_dir.join("metadata")).context("metadata store")?;
    check_data_dir(&args, &store)?;
    if args.proxy_threads == 0 {
        bail!("invalid setting --proxy-threads 0: the proxy needs at least one thread");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.proxy_threads)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let read_runtime = crate::proxy_cmd::catch_up_read_runtime()?;
    // Makes the metadata file exist before sandbox.json is first written (see check_data_dir).
    runtime
        .block_on(store.instance_id())
        .context("metadata store")?;
    // The bookies' garbage collection asks the metadata store which ledgers are deleted.
    let (deleted, gc_queries) = quire_bookie::deleted_ledgers_channel();
    // And, before a key binds, whether the ledger exists with that key.
    let (keys, key_queries) = quire_bookie::ledger_keys_channel();
    let gc = MetadataChannels { deleted, keys };
    // Up before the bookies, so that /healthz says 503 until everything serves.
    let exposition = crate::metrics_http::Exposition::default();
    if let Some(listen) = args.metrics_listen {
        let addr = crate::metrics_http::start(listen, exposition.clone())?;
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "quire sandbox: metrics on http://{addr}/metrics")?;
        out.flush()?;
    }
    let bookie_metrics = args.metrics_listen.map(|_| {
        let m = quire_bookie::metrics::BookieMetrics::new();
        exposition.register(|r| m.register(r));
        m
    });
    let bookies = start_bookies(&args, &gc, bookie_metrics.as_deref())?;
    drop(gc);
    let served = runtime.block_on(serve(
        &args,
        store,
        &bookies,
        read_runtime.handle(),
        (gc_queries, key_queries),
        &exposition,
    ));
    runtime.shutdown_timeout(Duration::from_secs(5));
    read_runtime.shutdown_timeout(Duration::from_secs(5));
    let mut stop_error = None;
    for bookie in bookies {
        if let Err(e) = bookie.shutdown() {
            stop_error.get_or_insert(e);
        }
    }
    served?;
    if let Some(e) = stop_error {
        return Err(e).context("bookie shutdown");
    }
    Ok(())
}

/// Keeps a bookie's registration's `read_only` flag equal to the bookie's state (the embedded
/// store's counterpart of moving a ZooKeeper registration between `available/` and
/// `readonly/`), so that new ledgers and ensemble changes avoid a bookie whose disk is full.
/// Runs until the bookie's state handle is gone or the task is aborted.
async fn follow_read_only(
    store: Arc<dyn MetadataStore>,
    mut info: BookieInfo,
    state: quire_bookie::ReadOnlyState,
    changes: flume::Receiver<bool>,
) {
    while changes.recv_async().await.is_ok() {
        while changes.try_recv().is_ok() {}
        info.read_only = state.is_read_only();
        // The embedded store does not fail a registration today; say so if it ever does.
        match store.register_bookie(info.clone()).await {
            Ok(()) => eprintln!(
                "quire sandbox: bookie {} is {}",
                info.id,
                if info.read_only {
                    "read-only (disk usage)"
                } else {
                    "writable again"
                }
            ),
            Err(e) => {
                tracing::warn!(bookie = %info.id, error = %e, "cannot update the registration")
            }
        }
    }
}

async fn serve(
    args: &SandboxArgs,
    store: EmbeddedStore,
    bookies: &[Bookie],
    read_runtime: &tokio::runtime::Handle,
    (gc_queries, key_queries): (DeletedLedgersQueries, quire_bookie::LedgerKeyQueries),
    exposition: &crate::metrics_http::Exposition,
) -> Result<()> {
    let store: Arc<dyn MetadataStore> = Arc::new(store);
    let keys_store = store.clone();
    tokio::spawn(crate::gc::answer_ledger_keys(
        key_queries,
        store.clone(),
        Box::new(move || {
            let s = keys_store.clone();
            Box::pin(async move { Ok(s) })
        }),
    ));
    let gc_store = store.clone();
    tokio::spawn(crate::gc::answer_deleted_ledgers(
        gc_queries,
        store.clone(),
        Box::new(move || {
            // The embedded store has no session to lose: the same one again.
            let s = gc_store.clone();
            Box::pin(async move { Ok(s) })
        }),
    ));
    let mut followers = Vec::new();
    for b in bookies {
        let state = b.read_only_state();
        // Subscribed before the first registration, so that no transition is missed.
        let changes = state.subscribe();
        let info = BookieInfo {
            id: BookieId(b.addr().to_string()),
            rack: None,
            read_only: state.is_read_only(),
        };
        store.register_bookie(info.clone()).await?;
        followers.push(tokio::spawn(follow_read_only(
            store.clone(),
            info,
            state,
            changes,
        )));
    }
    // With --tls the proxy presents the sandbox certificate to the bookies (mutual TLS).
    let pki = if args.tls {
        Some(sandbox_pki(args)?)
    } else {
        None
    };
    let bookie_tls = match &pki {
        Some(p) => Some(
            quire_tls::ClientTls {
                ca_file: p.ca_file.clone(),
                cert_file: Some(p.cert_file.clone()),
                key_file: Some(p.key_file.clone()),
            }
            .client_config()?,
        ),
        None => None,
    };
    let proxy_tls = match &pki {
        Some(p) => Some(
            quire_tls::ServerTls {
                cert_file: p.cert_file.clone(),
                key_file: p.key_file.clone(),
                ca_file: Some(p.ca_file.clone()),
                client_auth: quire_tls::ClientAuth::Require,
            }
            .server_config()?,
        ),
        None => None,
    };
    let bk = quire_ledger::BookKeeper::with_read_runtime(
        store.clone(),
        quire_ledger::ClientConfig {
            tls: bookie_tls,
            cluster_secret: Some(sandbox_cluster_secret(args)?),
            ..quire_ledger::ClientConfig::default()
        },
        read_runtime.clone(),
    );
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let config = quire_proxy::StreamConfig {
        owner_address: addr.to_string(),
        ensemble_size: args.ensemble_size,
        write_quorum: args.write_quorum,
        ack_quorum: args.ack_quorum,
        segment_size_bytes_max: args.segment_size_bytes,
        entry_size_bytes_target: args.entry_size_bytes,
        segment_roll_interval: (args.segment_roll_secs > 0)
            .then(|| Duration::from_secs(args.segment_roll_secs)),
        retention_time: args.retention_time_secs.map(Duration::from_secs),
        retention_size_bytes: args.retention_size_bytes,
        lifecycle_sweep_interval: (args.lifecycle_sweep_secs > 0)
            .then(|| Duration::from_secs(args.lifecycle_sweep_secs)),
        txid_jump_max: (args.txid_jump_max > 0).then_some(args.txid_jump_max),
        ..quire_proxy::StreamConfig::default()
    };
    let streams = quire_proxy::StreamManager::new(store, bk, config);
    // Recover segments a crash left in progress before taking traffic, so that problems
    // surface at start rather than at a first write.
    // Recover each stream's in-progress segment now; one stream that cannot be recovered is
    // reported and stays unavailable, but does not keep the others from being served.
    for name in streams.list_streams().await.context("listing streams")? {
        if let Err(e) = streams
            .read(
                &name,
                quire_client::ReadPosition::Head,
                1,
                1,
                Duration::ZERO,
            )
            .await
        {
            eprintln!("quire sandbox: stream {name:?} is unavailable: {e}");
        }
    }
    let metrics = args.metrics_listen.map(|_| {
        let m = quire_proxy::ProxyMetrics::new();
        exposition.register(|r| m.register(r, streams.clone()));
        m
    });
    let server = quire_proxy::ProxyServer::start(
        listener,
        streams.clone(),
        quire_proxy::ServerConfig {
            catch_up_read_runtime: Some(read_runtime.clone()),
            metrics,
            tls: proxy_tls,
            ..quire_proxy::ServerConfig::default()
        },
    )
    .context("proxy server")?;
    // Before the address line: whoever read it sees /healthz answer 200.
    exposition.set_serving(true);
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let bookie_list: Vec<String> = bookies.iter().map(|b| b.addr().to_string()).collect();
        writeln!(
            out,
            "quire sandbox: bookies {} (E={} Qw={} Qa={})",
            bookie_list.join(" "),
            args.ensemble_size,
            args.write_quorum,
            args.ack_quorum
        )?;
        writeln!(
            out,
            "quire sandbox: bookies admit only holders of the cluster secret in {} (--cluster-secret-file)",
            sandbox_cluster_secret_file(&args.data_dir).display()
        )?;
        if let Some(p) = &pki {
            writeln!(
                out,
                "quire sandbox: TLS on, client certificates required: --tls-ca-file {} --tls-cert-file {} --tls-key-file {}",
                p.ca_file.display(),
                p.cert_file.display(),
                p.key_file.display()
            )?;
        }
        writeln!(out, "quire sandbox: proxy listening on {addr}")?;
        out.flush()?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT")?,
        _ = term.recv() => {},
    }
    exposition.set_serving(false);
    eprintln!("quire sandbox: stopping");
    for f in followers {
        f.abort();
    }
    server.shutdown();
    streams
        .shutdown()
        .await
        .context("completing open segments")?;
    Ok(())
}

/// Parses and checks a retention time in seconds (`--retention-time-secs`).
pub fn parse_retention_time_secs(v: &str) -> std::result::Result<u64, String> {
    let n: u64 = v
        .parse()
        .map_err(|_| format!("{v:?} is not a whole number"))?;
    quire_client::check_retention_time_secs(n)
}

/// Parses and checks a retention size in bytes (`--retention-size-bytes`).
pub fn parse_retention_size_bytes(v: &str) -> std::result::Result<u64, String> {
    let n: u64 = v
        .parse()
        .map_err(|_| format!("{v:?} is not a whole number"))?;
    quire_client::check_retention_size_bytes(n)
}

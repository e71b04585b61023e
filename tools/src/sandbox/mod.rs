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
//!
//! [`bookies`] starts the bookies from the flags; [`serve`] answers their metadata questions,
//! keeps their registrations, and serves the proxy until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use quire_metadata::{EmbeddedStore, MetadataStore};

mod bookies;
mod serve;

use bookies::{start_bookies, MetadataChannels};

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
    let read_runtime = crate::proxy::catch_up_read_runtime()?;
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
    let served = runtime.block_on(serve::serve(
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

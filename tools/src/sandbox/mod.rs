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

/// The sandbox's flags that set a crate's key, by table (as in [`crate::config`]): `--help`
/// shows their defaults from the crates' settings types ([`Defaults`]), the one place each is
/// written, and an unset flag takes that default.
pub const KEYS: &[crate::config::Table] = &[
    (
        "streams",
        "ensemble_size write_quorum ack_quorum segment_size_bytes entry_size_bytes \
        segment_roll_secs retention_time_secs retention_size_bytes lifecycle_sweep_secs \
        txid_jump_max",
    ),
    (
        "engine",
        "journal_file_size_bytes journal_reuse_files entry_log_size_bytes \
        entry_log_roll_floor_bytes checkpoint_interval_ms index_cache_bytes_max \
        space_reserve_bytes",
    ),
    (
        "compaction",
        "minor_compaction_threshold=minor_threshold \
        minor_compaction_interval_secs=minor_interval_secs \
        major_compaction_threshold=major_threshold \
        major_compaction_interval_secs=major_interval_secs",
    ),
    (
        "bookie",
        "gc_interval_secs disk_usage_threshold disk_usage_lwm_threshold disk_check_interval_ms",
    ),
];

/// The sandbox's entry-log size (64 MiB, where a bookie's default is BookKeeper's 1 GiB): a
/// sandbox holds little data, and the smaller the logs the sooner the space of a deleted
/// stream's entries in logs other than the current one comes back.
pub const SANDBOX_ENTRY_LOG_SIZE_BYTES: u64 = 64 << 20;

/// The crates' defaults of the tables in [`KEYS`], but for [`SANDBOX_ENTRY_LOG_SIZE_BYTES`].
#[derive(Debug, serde::Serialize)]
pub struct Defaults {
    streams: quire_proxy::StreamSettings,
    engine: quire_engine::EngineSettings,
    compaction: quire_engine::CompactionSettings,
    bookie: quire_bookie::BookieSettings,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            streams: Default::default(),
            engine: quire_engine::EngineSettings {
                entry_log_size_bytes: SANDBOX_ENTRY_LOG_SIZE_BYTES,
                ..Default::default()
            },
            compaction: Default::default(),
            bookie: Default::default(),
        }
    }
}

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
    #[arg(long)]
    ensemble_size: Option<u8>,
    /// Write quorum Qw.
    #[arg(long)]
    write_quorum: Option<u8>,
    /// Ack quorum Qa; E >= Qw >= Qa >= 1.
    #[arg(long)]
    ack_quorum: Option<u8>,
    /// Segments roll once they hold this many bytes (as DistributedLog's by default).
    #[arg(long)]
    segment_size_bytes: Option<u64>,
    /// Records are packed into entries of up to this many bytes.
    #[arg(long)]
    entry_size_bytes: Option<usize>,
    /// A segment holding at least one record also rolls once it is this many seconds old
    /// (as DistributedLog's by default); 0 turns time rolling off.
    #[arg(long)]
    segment_roll_secs: Option<u64>,
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
    /// ledger metadata left by a crash mid-deletion (0 disables).
    #[arg(long)]
    lifecycle_sweep_secs: Option<u64>,
    /// The txid guard (Quire's own, against a poisoned stream): a record whose txid is more
    /// than this above the txid before it (its stream's last txid, or the previous record of
    /// the same write) is refused with `TXID_TOO_FAR_AHEAD`; a stream's first record may have
    /// any txid. 0 turns the guard off.
    #[arg(long)]
    txid_jump_max: Option<u64>,
    /// Size of each pre-written journal file, in bytes.
    #[arg(long)]
    journal_file_size_bytes: Option<u64>,
    /// Checkpointed journal files each shard keeps for reuse by later rolls (the bookie setting
    /// `journal_reuse_files`; 0 pre-writes every new journal file with zeros).
    #[arg(long)]
    journal_reuse_files: Option<usize>,
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
    #[arg(long)]
    gc_interval_secs: Option<u64>,
    /// Usage of a bookie directory's filesystem (fraction in (0, 1]) at which that bookie
    /// turns read-only (BookKeeper `diskUsageThreshold`).
    #[arg(long)]
    disk_usage_threshold: Option<f64>,
    /// Usage every directory of a read-only bookie must be below for it to take adds again
    /// (BookKeeper `diskUsageLwmThreshold`; unset: 0.90, or disk_usage_threshold if lower).
    #[arg(long)]
    disk_usage_lwm_threshold: Option<f64>,
    /// Time between two disk usage measurements, in milliseconds (BookKeeper
    /// `diskCheckInterval`).
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
    /// (BookKeeper `minorCompactionThreshold`; 0 to 1, below the major one).
    #[arg(long)]
    minor_compaction_threshold: Option<f64>,
    /// Seconds between minor compactions (BookKeeper `minorCompactionInterval`; 0 disables).
    #[arg(long)]
    minor_compaction_interval_secs: Option<u64>,
    /// Major compaction threshold (BookKeeper `majorCompactionThreshold`).
    #[arg(long)]
    major_compaction_threshold: Option<f64>,
    /// Seconds between major compactions (BookKeeper `majorCompactionInterval`; 0 disables).
    #[arg(long)]
    major_compaction_interval_secs: Option<u64>,
    /// An entry log rolls to a new file beyond this many bytes (BookKeeper `logSizeLimit`;
    /// smaller than a bookie's).
    #[arg(long)]
    entry_log_size_bytes: Option<u64>,
    /// Garbage collection rolls the entry log being appended to once it holds this many bytes
    /// and less than half of them are live, and reclaims it in the same run (0: never).
    #[arg(long)]
    entry_log_roll_floor_bytes: Option<u64>,
    /// Milliseconds between the bookies' checkpoints (write cache to entry logs; BookKeeper
    /// `flushInterval`).
    #[arg(long)]
    checkpoint_interval_ms: Option<u64>,
    /// Bound of each bookie shard's index block cache, in bytes (BookKeeper
    /// `dbStorage_rocksDB_blockCacheSize`; at least 65536).
    #[arg(long)]
    index_cache_bytes_max: Option<u64>,
    /// Bytes of zeros each bookie shard keeps in its ledger directory and gives back when
    /// garbage collection finds the disk full (0 turns it off).
    #[arg(long)]
    space_reserve_bytes: Option<u64>,
}

/// Takes an exclusive flock on `DIR/LOCK` for the life of the process, so that two sandboxes
/// never share a data directory (and `quire cluster region --data-dir` never writes the
/// embedded store under a running sandbox).
pub(crate) fn lock_data_dir(dir: &Path) -> Result<std::fs::File> {
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
    let streams = serve::stream_settings(&args)?;
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
        &streams,
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

#[cfg(test)]
mod tests {
    //! Goal: the sandbox's flags reach its bookies and proxy through the crates' settings
    //! types, checked, with the crates' defaults when unset. Method: parse flags, build the
    //! configurations the sandbox would start with (no process).

    use std::time::Duration;

    use clap::{Args, FromArgMatches};

    use super::bookies::{bookie_config, disk_usage, MetadataChannels};
    use super::serve::stream_settings;
    use super::SandboxArgs;

    fn parse(dir: &std::path::Path, flags: &[&str]) -> SandboxArgs {
        let command = SandboxArgs::augment_args(clap::Command::new("sandbox"));
        let mut argv = vec!["sandbox", "--data-dir", dir.to_str().unwrap()];
        argv.extend(flags);
        SandboxArgs::from_arg_matches(&command.try_get_matches_from(argv).unwrap()).unwrap()
    }

    fn config_of(args: &SandboxArgs) -> quire_bookie::BookieConfig {
        let (deleted, _) = quire_bookie::deleted_ledgers_channel();
        let (keys, _) = quire_bookie::ledger_keys_channel();
        let channels = MetadataChannels { deleted, keys };
        let disk = disk_usage(args).unwrap();
        let listen = "127.0.0.1:1".parse().unwrap();
        bookie_config(args, &[], disk, 1, listen, &channels).unwrap()
    }

    #[test]
    fn journal_and_gc_flags_reach_every_bookie() {
        // --journal-file-size-bytes and --journal-reuse-files were set, then overwritten with
        // the engine's defaults by the engine settings applied after them.
        let dir = tempfile::tempdir().unwrap();
        let args = parse(
            dir.path(),
            &[
                "--journal-file-size-bytes",
                "1048576",
                "--journal-reuse-files",
                "0",
                "--gc-interval-secs",
                "7",
                "--checkpoint-interval-ms",
                "250",
            ],
        );
        let c = config_of(&args);
        assert_eq!(c.engine.journal_file_size_bytes, 1 << 20);
        assert_eq!(c.engine.journal_reuse_files, 0);
        assert_eq!(c.gc_interval, Duration::from_secs(7));
        assert_eq!(c.engine.checkpoint_interval, Duration::from_millis(250));

        let c = config_of(&parse(dir.path(), &[]));
        let d =
            quire_bookie::BookieConfig::new(c.listen, c.journal_dir.clone(), c.ledger_dir.clone());
        assert_eq!(
            c.engine.journal_file_size_bytes,
            d.engine.journal_file_size_bytes
        );
        assert_eq!(c.engine.journal_reuse_files, d.engine.journal_reuse_files);
        assert_eq!(c.gc_interval, d.gc_interval);
    }

    #[test]
    fn stream_flags_are_checked_as_the_streams_table() {
        // A quorum breaking E >= Qw >= Qa >= 1 was a panic in StreamManager::new once the
        // bookies ran; it is one line naming the key, before anything starts.
        let dir = tempfile::tempdir().unwrap();
        let args = parse(dir.path(), &["--ensemble-size", "2", "--write-quorum", "3"]);
        let e = stream_settings(&args).unwrap_err().to_string();
        assert!(e.starts_with("invalid setting ensemble_size = 2"), "{e}");
        let args = parse(dir.path(), &["--entry-size-bytes", "0"]);
        let e = stream_settings(&args).unwrap_err().to_string();
        assert!(e.contains("entry_size_bytes"), "{e}");

        let s = stream_settings(&parse(dir.path(), &["--ack-quorum", "1"])).unwrap();
        let d = quire_proxy::StreamSettings::default();
        assert_eq!(s.ack_quorum, 1);
        assert_eq!(
            (s.ensemble_size, s.write_quorum),
            (d.ensemble_size, d.write_quorum)
        );
        assert_eq!(s.segment_size_bytes, d.segment_size_bytes);
    }
}

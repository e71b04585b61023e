//! The sandbox's bookies: their configuration from the sandbox's flags (through the crates'
//! settings types, so that each flag is checked as the same key of a bookie's file is), their
//! cluster secret and TLS files, and their start at the addresses `sandbox.json` records.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use quire_bookie::{Bookie, BookieConfig, DeletedLedgers, ShardHost};

use super::SandboxArgs;

#[derive(serde::Serialize, serde::Deserialize)]
struct SandboxFile {
    bookies: Vec<SocketAddr>,
}

/// The engine keys given as flags over the engine's defaults ([`quire_engine::EngineSettings`]),
/// checked.
fn engine_settings(args: &SandboxArgs) -> Result<quire_engine::EngineSettings> {
    let d = super::Defaults::default().engine;
    let s = quire_engine::EngineSettings {
        journal_file_size_bytes: args
            .journal_file_size_bytes
            .unwrap_or(d.journal_file_size_bytes),
        journal_reuse_files: args.journal_reuse_files.unwrap_or(d.journal_reuse_files),
        entry_log_size_bytes: args.entry_log_size_bytes.unwrap_or(d.entry_log_size_bytes),
        entry_log_roll_floor_bytes: args
            .entry_log_roll_floor_bytes
            .unwrap_or(d.entry_log_roll_floor_bytes),
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

/// The read-only mode and garbage-collection flags over the bookie's defaults, checked:
/// (threshold, low-water mark, interval, GC interval).
pub(super) fn disk_usage(args: &SandboxArgs) -> Result<(f64, f64, Duration, Duration)> {
    let d = quire_bookie::BookieSettings::default();
    let s = quire_bookie::BookieSettings {
        disk_usage_threshold: args.disk_usage_threshold.unwrap_or(d.disk_usage_threshold),
        disk_usage_lwm_threshold: args.disk_usage_lwm_threshold,
        disk_check_interval_ms: args
            .disk_check_interval_ms
            .unwrap_or(d.disk_check_interval_ms),
        gc_interval_secs: args.gc_interval_secs.unwrap_or(d.gc_interval_secs),
        ..d
    };
    s.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let interval = Duration::from_millis(s.disk_check_interval_ms);
    let gc = Duration::from_secs(s.gc_interval_secs);
    Ok((s.disk_usage_threshold, s.disk_usage_lwm(), interval, gc))
}

/// The configuration of bookie `index` (1-based). With `cpu_set`, its shard `i` is global
/// shard `(index - 1) * shards + i`, so that one-shard bookies spread over the listed CPUs
/// instead of all taking the first.
pub(super) fn bookie_config(
    args: &SandboxArgs,
    cpu_set: &[usize],
    disk: (f64, f64, Duration, Duration),
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
    config.engine.journal_dsync_writes = !args.journal_separate_fdatasync;
    config.gc_deleted_ledgers = Some(gc.deleted.clone());
    // A key binds only for a ledger the metadata store holds with that key (issue 24).
    config.ledger_keys = Some(gc.keys.clone());
    (
        config.disk_usage_threshold,
        config.disk_usage_lwm_threshold,
        config.disk_check_interval,
        config.gc_interval,
    ) = disk;
    // The journal file size and reuse flags too (they were set before this and overwritten
    // by it with the defaults, so that both flags were ignored).
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
pub(super) fn sandbox_cluster_secret(
    args: &SandboxArgs,
) -> Result<quire_wire::auth::ClusterSecret> {
    let path = sandbox_cluster_secret_file(&args.data_dir);
    Ok(crate::secret_file::create_cluster_secret(&path, "the sandbox's cluster secret")?.0)
}

/// The sandbox's TLS files in `DATA_DIR/tls`, made at the first start with `--tls`.
pub(super) fn sandbox_pki(args: &SandboxArgs) -> Result<quire_tls::gen::PkiFiles> {
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

/// The bookies' channels to the metadata side (answered in [`super::serve`]).
pub(super) struct MetadataChannels {
    /// Garbage collection: which ledgers are deleted.
    pub(super) deleted: DeletedLedgers,
    /// Key binding: does a ledger exist, with which master key.
    pub(super) keys: quire_bookie::LedgerKeys,
}

/// Starts the bookies, at their recorded addresses if this directory was used before, each
/// recording into `metrics` (labelled `bookie="bookie-{i}"`, its directory's name: the
/// address of a first start is only known once it is bound) when given.
pub(super) fn start_bookies(
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

//! Configuration of the `quire bookie` and `quire proxy` processes and the metadata address of
//! the admin commands.
//!
//! A process reads an optional TOML file (`--config FILE`) and then lets every command-line flag
//! override the field of the same name (`journal_dir` ↔ `--journal-dir`). Each settings struct
//! is at once the serde form of the file (unknown keys are refused, so a typo is an error, not a
//! silently ignored setting) and the clap form of the flags; [`BookieSettings::resolve`] and
//! [`ProxySettings::resolve`] merge the two, apply defaults and check values, and every problem
//! is one line naming the setting.
//!
//! Example files: `tools/examples/bookie.toml`, `tools/examples/proxy.toml`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use quire_metadata::{MetadataStore, ZkDigest, ZkStore};
use serde::Deserialize;

/// ZooKeeper session timeout used when none is configured, in milliseconds (BookKeeper's
/// `zkTimeout` default).
pub const ZK_SESSION_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// ZooKeeper root path used when none is configured.
pub const ZK_ROOT_DEFAULT: &str = "/quire";

/// Where the metadata store lives: a ZooKeeper connect string and the root path of Quire's
/// znodes under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataAddress {
    /// ZooKeeper connect string, `host:port[,host:port...]`.
    pub zookeeper: String,
    /// Absolute path under which every Quire znode lives, e.g. `/quire`.
    pub zk_root: String,
    /// ZooKeeper session timeout: after this long without the server hearing from the
    /// process, its ephemeral nodes (bookie registration, stream leases) are deleted.
    pub session_timeout: Duration,
    /// The digest identity of the session, read from `zk_auth_file`; with one, every znode the
    /// process creates is readable and writable by that identity only.
    pub digest: Option<ZkDigest>,
}

impl MetadataAddress {
    fn resolve(
        zookeeper: Option<String>,
        zk_root: Option<String>,
        session_timeout_ms: Option<u64>,
        zk_auth_file: Option<PathBuf>,
    ) -> Result<Self> {
        let zookeeper = zookeeper
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| missing("zookeeper", "--zookeeper"))?;
        for host in zookeeper.split(',') {
            let ok = host
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok {
                bail!(
                    "invalid setting zookeeper = {zookeeper:?}: expected host:port[,host:port...]"
                );
            }
        }
        let zk_root = zk_root.unwrap_or_else(|| ZK_ROOT_DEFAULT.to_string());
        if !zk_root.starts_with('/')
            || (zk_root.len() > 1 && zk_root.ends_with('/'))
            || zk_root.contains("//")
        {
            bail!("invalid setting zk_root = {zk_root:?}: expected an absolute ZooKeeper path like /quire");
        }
        let ms = session_timeout_ms.unwrap_or(ZK_SESSION_TIMEOUT_MS_DEFAULT);
        if !(1_000..=600_000).contains(&ms) {
            bail!("invalid setting zk_session_timeout_ms = {ms}: expected 1000 to 600000");
        }
        let digest = match zk_auth_file {
            None => None,
            Some(path) => {
                crate::secret_file::warn_if_exposed(&path, "zk_auth_file");
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read zk_auth_file {}", path.display()))?;
                let digest = ZkDigest::parse(&text)
                    .map_err(|e| anyhow!("invalid zk_auth_file {}: {e}", path.display()))?;
                Some(digest)
            }
        };
        Ok(Self {
            zookeeper,
            zk_root,
            session_timeout: Duration::from_millis(ms),
            digest,
        })
    }

    /// Connects to the ZooKeeper metadata store (the layout under `zk_root` is created on
    /// first use).
    ///
    /// # Errors
    /// The store's error when ZooKeeper cannot be reached within about the session timeout,
    /// or its layout under the root is unreadable or of another version.
    pub async fn connect_zk(&self) -> Result<Arc<ZkStore>> {
        let store = ZkStore::connect_with_auth(
            &self.zookeeper,
            &self.zk_root,
            self.session_timeout,
            self.digest.as_ref(),
        )
        .await
        .with_context(|| {
            format!(
                "cannot connect to ZooKeeper at {} (root {})",
                self.zookeeper, self.zk_root
            )
        })?;
        Ok(Arc::new(store))
    }

    /// Like [`MetadataAddress::connect_zk`], as the metadata interface.
    ///
    /// # Errors
    /// As [`MetadataAddress::connect_zk`].
    pub async fn connect(&self) -> Result<Arc<dyn MetadataStore>> {
        Ok(self.connect_zk().await?)
    }
}

fn missing(key: &str, flag: &str) -> anyhow::Error {
    anyhow!("missing setting {key}: set it in the config file or with {flag}")
}

/// Reads and parses a TOML config file into `T`.
///
/// # Errors
/// One line: the file cannot be read, or `FILE line N: message` for a syntax error, a wrong
/// type or an unknown key.
pub fn read_toml<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        let message = e.message().replace('\n', " ");
        match line {
            Some(line) => anyhow!(
                "config file {} line {line}: {}",
                path.display(),
                message.trim()
            ),
            None => anyhow!("config file {}: {}", path.display(), message.trim()),
        }
    })
}

/// The admin commands' metadata address: `--zookeeper` / `QUIRE_ZOOKEEPER`, `--zk-root` /
/// `QUIRE_ZK_ROOT`.
#[derive(Args, Debug, Clone)]
pub struct MetadataArgs {
    /// ZooKeeper connect string (host:port[,host:port...]).
    #[arg(long, env = "QUIRE_ZOOKEEPER", global = true)]
    pub zookeeper: Option<String>,
    /// Root path of Quire's znodes.
    #[arg(long, env = "QUIRE_ZK_ROOT", global = true)]
    pub zk_root: Option<String>,
    /// ZooKeeper session timeout, in milliseconds.
    #[arg(long, global = true)]
    pub zk_session_timeout_ms: Option<u64>,
    /// File holding the ZooKeeper digest identity `user:password` of a cluster whose znodes
    /// carry ACLs.
    #[arg(long, env = "QUIRE_ZK_AUTH_FILE", global = true)]
    pub zk_auth_file: Option<PathBuf>,
}

impl MetadataArgs {
    /// The address, checked.
    ///
    /// # Errors
    /// One line when the connect string is missing or malformed.
    pub fn resolve(&self) -> Result<MetadataAddress> {
        MetadataAddress::resolve(
            self.zookeeper.clone(),
            self.zk_root.clone(),
            self.zk_session_timeout_ms,
            self.zk_auth_file.clone(),
        )
    }
}

/// `quire bookie` settings: the config file's keys, each overridable by the flag of the same
/// name.
#[derive(Args, Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BookieSettings {
    /// ZooKeeper connect string (host:port[,host:port...]).
    #[arg(long)]
    pub zookeeper: Option<String>,
    /// Root path of Quire's znodes (default /quire).
    #[arg(long)]
    pub zk_root: Option<String>,
    /// ZooKeeper session timeout in milliseconds (default 10000).
    #[arg(long)]
    pub zk_session_timeout_ms: Option<u64>,
    /// File holding the ZooKeeper digest identity `user:password`: the session authenticates
    /// with it and every znode it creates gets the ACL of that identity only (default: none,
    /// znodes open to anyone).
    #[arg(long)]
    pub zk_auth_file: Option<PathBuf>,
    /// Journal directory (one subdirectory per shard).
    #[arg(long)]
    pub journal_dir: Option<PathBuf>,
    /// Ledger directory: entry logs and index (one subdirectory per shard).
    #[arg(long)]
    pub ledger_dir: Option<PathBuf>,
    /// Address to listen on, with a fixed port.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Address clients use to reach this bookie, and its bookie id (default: the listen
    /// address, which must then not be a wildcard).
    #[arg(long)]
    pub advertised: Option<String>,
    /// Rack label recorded in the bookie registry.
    #[arg(long)]
    pub rack: Option<String>,
    /// Shards (glommio executors, one engine each; default 1).
    #[arg(long)]
    pub shards: Option<usize>,
    /// glommio io_memory per shard, in bytes (default 2 MiB).
    #[arg(long)]
    pub io_memory_bytes: Option<usize>,
    /// CPUs to pin the shards to, e.g. `0,1` (key: `cpu_set = [0, 1]`): shard i runs on the
    /// (i mod n)-th listed CPU. Default: unpinned.
    #[arg(long, value_delimiter = ',')]
    pub cpu_set: Option<Vec<usize>>,
    /// Size of each pre-written journal file, in bytes (default 64 MiB).
    #[arg(long)]
    pub journal_file_size_bytes: Option<u64>,
    /// Checkpointed journal files kept per shard for reuse by later rolls instead of
    /// pre-writing new files with zeros (BookKeeper `journalReuseFiles`; default 4, 0 turns
    /// reuse off; the engine's `EngineConfig::journal_reuse_files`).
    #[arg(long)]
    pub journal_reuse_files: Option<usize>,
    /// Longest wait of the oldest queued add before its journal group is written, in
    /// microseconds (BookKeeper `journalMaxGroupWaitMSec`; default 2000).
    #[arg(long)]
    pub group_commit_wait_us: Option<u64>,
    /// Seconds between garbage-collection runs on each shard: deleted ledgers dropped, entry
    /// logs without live entries deleted, scheduled compaction (BookKeeper `gcWaitTime`;
    /// default 600, 0 disables).
    #[arg(long)]
    pub gc_interval_secs: Option<u64>,
    /// Usage of a journal or ledger directory's filesystem (fraction of its blocks, in (0, 1])
    /// at which the bookie turns read-only (BookKeeper `diskUsageThreshold`; default 0.95).
    #[arg(long)]
    pub disk_usage_threshold: Option<f64>,
    /// Usage every directory must be below for a read-only bookie to take adds again
    /// (BookKeeper `diskUsageLwmThreshold`; default 0.90, at most disk_usage_threshold).
    #[arg(long)]
    pub disk_usage_lwm_threshold: Option<f64>,
    /// Time between two disk usage measurements, in milliseconds (BookKeeper
    /// `diskCheckInterval`; default 10000). A write failing with ENOSPC measures at once.
    #[arg(long)]
    pub disk_check_interval_ms: Option<u64>,
    /// Address of the HTTP endpoint serving `GET /metrics` (Prometheus) and `GET /healthz`;
    /// off unless set.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Minor compaction rewrites entry logs whose live bytes are below this fraction of their
    /// size (BookKeeper `minorCompactionThreshold`; 0 to 1, below the major one; default 0.2).
    #[arg(long)]
    pub minor_compaction_threshold: Option<f64>,
    /// Seconds between minor compactions, run by the GC loop once due (BookKeeper
    /// `minorCompactionInterval`; default 3600, 0 disables).
    #[arg(long)]
    pub minor_compaction_interval_secs: Option<u64>,
    /// Major compaction rewrites entry logs whose live fraction is below this (BookKeeper
    /// `majorCompactionThreshold`; 0 to 1, above the minor one; default 0.8).
    #[arg(long)]
    pub major_compaction_threshold: Option<f64>,
    /// Seconds between major compactions (BookKeeper `majorCompactionInterval`; default 86400,
    /// 0 disables).
    #[arg(long)]
    pub major_compaction_interval_secs: Option<u64>,
    /// An entry log rolls to a new file beyond this many bytes (BookKeeper `logSizeLimit`;
    /// default 1 GiB, at least 16384). Only whole non-current logs are deleted or compacted.
    #[arg(long)]
    pub entry_log_size_bytes: Option<u64>,
    /// Milliseconds between checkpoints, which move written entries from the write cache into
    /// entry logs and the index (BookKeeper `flushInterval`; default 10000, 10 to 3600000).
    #[arg(long)]
    pub checkpoint_interval_ms: Option<u64>,
    /// Bound of each shard's index block cache, in bytes: the only part of the entry index
    /// that grows with use (BookKeeper `dbStorage_rocksDB_blockCacheSize`; default 16 MiB, at
    /// least 65536).
    #[arg(long)]
    pub index_cache_bytes_max: Option<u64>,
    /// Bytes of zeros each shard keeps in its ledger directory (`space-reserve.qrs`) and gives
    /// back when garbage collection finds the disk full, so that a full disk never blocks the
    /// work that frees it (default 4194304; 0 turns it off; rounded down to 4 KiB).
    #[arg(long)]
    pub space_reserve_bytes: Option<u64>,
    /// Bytes of adds (records) queued for each shard's journal writer beyond which an add waits
    /// for the writer, up to 4 s, then is refused with `TooManyRequests` (status 106): adds
    /// arriving faster than the journal disk writes them cannot grow the queue without bound
    /// (BookKeeper `journalQueueSize`; default 64 MiB, at least 65536).
    #[arg(long)]
    pub journal_queue_bytes_max: Option<u64>,
    /// Entry-log files each shard keeps open for reads besides the one being written; past it
    /// the least recently used is closed and reopened on its next read (BookKeeper
    /// `openFileLimit`; default 256, at least 1).
    #[arg(long)]
    pub entry_log_readers_max: Option<usize>,
    /// Run an autorecovery daemon (auditor candidate and replication worker) inside this
    /// bookie (BookKeeper `autoRecoveryDaemonEnabled`; default true).
    #[arg(long)]
    pub autorecovery_enabled: Option<bool>,
    /// Seconds a bookie's registration must have been gone before its ledgers are marked
    /// under-replicated (BookKeeper `lostBookieRecoveryDelay`; default 60).
    #[arg(long)]
    pub lost_bookie_recovery_delay_secs: Option<u64>,
    /// Milliseconds the last fragment of a ledger that is not closed is left to its writer
    /// before autorecovery recovers the ledger (BookKeeper
    /// `openLedgerRereplicationGracePeriod`; default 30000).
    #[arg(long)]
    pub open_ledger_rereplication_grace_period_ms: Option<u64>,
    /// Milliseconds between the auditor's registry polls and an idle replication worker's
    /// looks for under-replicated ledgers (default 1000).
    #[arg(long)]
    pub autorecovery_poll_interval_ms: Option<u64>,
    /// Seconds between the auditor's walks over every ledger (BookKeeper
    /// `auditorPeriodicCheckInterval`; default 86400, 0 disables).
    #[arg(long)]
    pub auditor_periodic_check_interval_secs: Option<u64>,
    /// Bytes per second the replication worker writes to target bookies at most (BookKeeper
    /// `replicationRateByBytes`; default 0: unlimited).
    #[arg(long)]
    pub replication_rate_bytes: Option<u64>,
    /// A client connection that has not completed its handshake this many milliseconds after
    /// it was accepted is closed (default 10000, 100 to 600000).
    #[arg(long)]
    pub handshake_timeout_ms: Option<u64>,
    /// A handshaken client connection with nothing in flight and nothing received for this
    /// many seconds is closed (default 900, 1 to 86400).
    #[arg(long)]
    pub idle_timeout_secs: Option<u64>,
    /// Open client connections per bookie; more are closed at once (default 4096, at least 1;
    /// each shard takes its share).
    #[arg(long)]
    pub connections_max: Option<usize>,
    /// Open client connections per client IP address (Kafka's `max.connections.per.ip`); more
    /// from that address are closed at once (default 1024, at least 1; each shard takes its
    /// share).
    #[arg(long)]
    pub connections_per_ip_max: Option<usize>,
    /// Bytes of request frames above 64 KiB buffered at once (Kafka's
    /// `queued.max.request.bytes`); a connection waits, unread, for its frame's share (default
    /// 268435456 = 256 MiB; each shard takes its share, at least one 5 MiB frame).
    #[arg(long)]
    pub request_pool_bytes: Option<usize>,
    /// A frame must arrive whole within this many milliseconds of its first bytes, or its
    /// connection is closed (default 60000, 100 to 3600000).
    #[arg(long)]
    pub frame_timeout_ms: Option<u64>,
    /// PEM certificate chain of this server; with `tls_key_file` it turns TLS on for its
    /// port (BookKeeper `tlsCertificatePath`). Default: plain TCP.
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file` (BookKeeper `tlsKeyStore`).
    #[arg(long)]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA certificates trusted for peers' certificates: clients' when
    /// `tls_client_auth = "require"`, and bookies' for this bookie's autorecovery (BookKeeper `tlsTrustStore`).
    #[arg(long)]
    pub tls_ca_file: Option<PathBuf>,
    /// `none` (default) or `require`: whether clients must present a certificate signed by
    /// `tls_ca_file` (mutual TLS; BookKeeper `tlsClientAuthentication`).
    #[arg(long)]
    pub tls_client_auth: Option<String>,
    /// File holding the cluster secret (64 hexadecimal digits; `quire sandbox` makes one,
    /// Ansible distributes one): every connection to a bookie proves it (protocol version 2,
    /// docs/protocol.md §2; the role of BookKeeper's SASL/digest authentication). Required.
    #[arg(long)]
    pub cluster_secret_file: Option<PathBuf>,
}

/// Smallest accepted `journal_queue_bytes_max` (64 KiB): the queue admits an add while it holds
/// at most this many bytes, so a smaller bound only turns group commit into one add per write.
pub const JOURNAL_QUEUE_BYTES_MIN: u64 = 64 * 1024;

/// Smallest accepted `index_cache_bytes_max`: sixteen 4 KiB index blocks.
pub const INDEX_CACHE_BYTES_MIN: u64 = 64 * 1024;

/// Smallest accepted `entry_log_size_bytes`: the 4 KiB header and three 4 KiB blocks, since
/// every checkpoint starts at a fresh 4 KiB boundary (docs/format/entry-log.md).
pub const ENTRY_LOG_SIZE_BYTES_MIN: u64 = 16 * 1024;

/// Compaction and entry-log settings shared by `quire bookie` and `quire sandbox`, as given
/// (`None`: the engine default).
#[derive(Debug, Default, Clone, Copy)]
pub struct CompactionSettings {
    /// `minor_compaction_threshold`, a fraction.
    pub minor_threshold: Option<f64>,
    /// `minor_compaction_interval_secs`.
    pub minor_interval_secs: Option<u64>,
    /// `major_compaction_threshold`, a fraction.
    pub major_threshold: Option<f64>,
    /// `major_compaction_interval_secs`.
    pub major_interval_secs: Option<u64>,
    /// `entry_log_size_bytes`.
    pub entry_log_size_bytes: Option<u64>,
    /// `checkpoint_interval_ms`.
    pub checkpoint_interval_ms: Option<u64>,
    /// `index_cache_bytes_max`.
    pub index_cache_bytes_max: Option<u64>,
    /// `space_reserve_bytes`.
    pub space_reserve_bytes: Option<u64>,
}

impl CompactionSettings {
    /// Checks the values and writes them into `engine`.
    ///
    /// # Errors
    /// One line naming the setting: a threshold outside [0, 1] or not a number, a minor
    /// threshold not below the major one (BookKeeper's rule), an entry-log size below
    /// [`ENTRY_LOG_SIZE_BYTES_MIN`], a checkpoint interval outside 10 ms to 1 h, an index cache
    /// below [`INDEX_CACHE_BYTES_MIN`].
    pub fn apply(&self, engine: &mut quire_engine::EngineConfig) -> Result<()> {
        for (key, v) in [
            ("minor_compaction_threshold", self.minor_threshold),
            ("major_compaction_threshold", self.major_threshold),
        ] {
            if let Some(v) = v {
                if !(0.0..=1.0).contains(&v) {
                    bail!("invalid setting {key} = {v}: expected a fraction from 0 to 1");
                }
            }
        }
        let minor = self
            .minor_threshold
            .unwrap_or(engine.minor_compaction_threshold);
        let major = self
            .major_threshold
            .unwrap_or(engine.major_compaction_threshold);
        if minor >= major {
            bail!("invalid settings minor_compaction_threshold = {minor}, major_compaction_threshold = {major}: the minor threshold must be below the major one");
        }
        engine.minor_compaction_threshold = minor;
        engine.major_compaction_threshold = major;
        if let Some(s) = self.minor_interval_secs {
            engine.minor_compaction_interval = Duration::from_secs(s);
        }
        if let Some(s) = self.major_interval_secs {
            engine.major_compaction_interval = Duration::from_secs(s);
        }
        if let Some(b) = self.entry_log_size_bytes {
            if b < ENTRY_LOG_SIZE_BYTES_MIN {
                bail!("invalid setting entry_log_size_bytes = {b}: expected at least {ENTRY_LOG_SIZE_BYTES_MIN}");
            }
            engine.entry_log_size_bytes_max = b;
        }
        if let Some(ms) = self.checkpoint_interval_ms {
            if !(10..=3_600_000).contains(&ms) {
                bail!("invalid setting checkpoint_interval_ms = {ms}: expected 10 to 3600000");
            }
            engine.checkpoint_interval = Duration::from_millis(ms);
        }
        if let Some(b) = self.index_cache_bytes_max {
            if b < INDEX_CACHE_BYTES_MIN {
                bail!("invalid setting index_cache_bytes_max = {b}: expected at least {INDEX_CACHE_BYTES_MIN}");
            }
            engine.index_cache_bytes_max = usize::try_from(b).unwrap_or(usize::MAX);
        }
        if let Some(b) = self.space_reserve_bytes {
            engine.space_reserve_bytes = b;
        }
        Ok(())
    }
}

/// The CPUs this process may run on (its `sched_getaffinity(2)` mask), or `None` if the mask
/// cannot be read.
fn allowed_cpus() -> Option<Vec<usize>> {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes at most size_of::<cpu_set_t>() bytes into `set`.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return None;
    }
    let cpus = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE, the size of `set`.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect();
    Some(cpus)
}

/// Checks a `cpu_set` setting: non-empty, no CPU twice, every CPU one this process may run on
/// (so that a typo fails at start naming the setting, not as a shard that cannot start).
pub fn check_cpu_set(cpus: Vec<usize>) -> Result<Vec<usize>> {
    if cpus.is_empty() {
        bail!(
            "invalid setting cpu_set = []: list at least one CPU, or leave it out to run unpinned"
        );
    }
    let allowed = allowed_cpus();
    for (i, c) in cpus.iter().enumerate() {
        if cpus[..i].contains(c) {
            bail!("invalid setting cpu_set = {cpus:?}: CPU {c} is listed twice");
        }
        if let Some(allowed) = &allowed {
            if !allowed.contains(c) {
                bail!("invalid setting cpu_set = {cpus:?}: CPU {c} is not available to this process (available: {allowed:?})");
            }
        }
    }
    Ok(cpus)
}

/// Checks the read-only mode settings (`disk_usage_threshold`, `disk_usage_lwm_threshold`,
/// `disk_check_interval_ms`), filling in BookKeeper's defaults (0.95, 0.90, 10 s); returns
/// (threshold, low-water mark, interval).
///
/// # Errors
/// One line naming the setting: a threshold outside (0, 1], a low-water mark above the
/// threshold or not positive, or an interval of 0.
pub fn check_disk_usage(
    threshold: Option<f64>,
    lwm: Option<f64>,
    interval_ms: Option<u64>,
) -> Result<(f64, f64, Duration)> {
    use quire_bookie::disk::{
        DISK_CHECK_INTERVAL_DEFAULT, DISK_USAGE_LWM_THRESHOLD_DEFAULT, DISK_USAGE_THRESHOLD_DEFAULT,
    };
    let t = threshold.unwrap_or(DISK_USAGE_THRESHOLD_DEFAULT);
    if !(t > 0.0 && t <= 1.0) {
        bail!(
            "invalid setting disk_usage_threshold = {t}: expected a fraction in (0, 1], e.g. 0.95"
        );
    }
    // A lower threshold without a low-water mark keeps BookKeeper's 5-point gap when it can.
    let l = lwm.unwrap_or_else(|| DISK_USAGE_LWM_THRESHOLD_DEFAULT.min(t));
    if !(l > 0.0 && l <= t) {
        bail!("invalid setting disk_usage_lwm_threshold = {l}: expected a fraction in (0, disk_usage_threshold = {t}]");
    }
    let interval = match interval_ms {
        None => DISK_CHECK_INTERVAL_DEFAULT,
        Some(0) => bail!("invalid setting disk_check_interval_ms = 0: expected at least 1"),
        Some(ms) => Duration::from_millis(ms),
    };
    Ok((t, l, interval))
}

/// A checked bookie configuration.
#[derive(Debug, Clone)]
pub struct BookieOptions {
    /// Where the metadata store is.
    pub metadata: MetadataAddress,
    /// The bookie id, `host:port` clients connect to.
    pub advertised: String,
    /// Rack label for the registry.
    pub rack: Option<String>,
    /// Where `/metrics` and `/healthz` are served, if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// The bookie server's configuration.
    pub bookie: quire_bookie::BookieConfig,
    /// The autorecovery daemon to run inside the bookie (`None`: disabled).
    pub autorecovery: Option<crate::autorecovery::AutorecoveryOptions>,
}

/// Overrides every `None` of `flags` by the file's value.
macro_rules! merge {
    ($flags:expr, $file:expr, $($field:ident),+) => {{
        let (flags, file) = ($flags, $file);
        Self { $($field: flags.$field.or(file.$field)),+ }
    }};
}

fn check_listen_and_advertised(listen: SocketAddr, advertised: Option<String>) -> Result<String> {
    if listen.port() == 0 {
        bail!("invalid setting listen = {listen}: the port must be fixed (it is part of the id other processes know this process by)");
    }
    let advertised = match advertised {
        Some(a) => a,
        None if listen.ip().is_unspecified() => {
            bail!("missing setting advertised: listen = {listen} is a wildcard address, so set the address others reach this process at with advertised = \"host:port\" or --advertised")
        }
        None => listen.to_string(),
    };
    let ok = advertised
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
    if !ok {
        bail!("invalid setting advertised = {advertised:?}: expected host:port");
    }
    Ok(advertised)
}

impl BookieSettings {
    /// Flag values win over the file's.
    pub fn merged(self, file: BookieSettings) -> Self {
        merge!(
            self,
            file,
            zookeeper,
            zk_root,
            zk_session_timeout_ms,
            zk_auth_file,
            journal_dir,
            ledger_dir,
            listen,
            advertised,
            rack,
            shards,
            io_memory_bytes,
            cpu_set,
            journal_file_size_bytes,
            journal_reuse_files,
            group_commit_wait_us,
            gc_interval_secs,
            disk_usage_threshold,
            disk_usage_lwm_threshold,
            disk_check_interval_ms,
            metrics_listen,
            minor_compaction_threshold,
            minor_compaction_interval_secs,
            major_compaction_threshold,
            major_compaction_interval_secs,
            entry_log_size_bytes,
            checkpoint_interval_ms,
            index_cache_bytes_max,
            space_reserve_bytes,
            journal_queue_bytes_max,
            entry_log_readers_max,
            autorecovery_enabled,
            lost_bookie_recovery_delay_secs,
            open_ledger_rereplication_grace_period_ms,
            autorecovery_poll_interval_ms,
            auditor_periodic_check_interval_secs,
            replication_rate_bytes,
            handshake_timeout_ms,
            idle_timeout_secs,
            connections_max,
            connections_per_ip_max,
            request_pool_bytes,
            frame_timeout_ms,
            tls_cert_file,
            tls_key_file,
            tls_ca_file,
            tls_client_auth,
            cluster_secret_file
        )
    }

    /// Applies defaults and checks every value.
    ///
    /// # Errors
    /// One line naming the first missing or invalid setting.
    pub fn resolve(self) -> Result<BookieOptions> {
        let metadata = MetadataAddress::resolve(
            self.zookeeper,
            self.zk_root,
            self.zk_session_timeout_ms,
            self.zk_auth_file,
        )?;
        let journal_dir = self
            .journal_dir
            .ok_or_else(|| missing("journal_dir", "--journal-dir"))?;
        let ledger_dir = self
            .ledger_dir
            .ok_or_else(|| missing("ledger_dir", "--ledger-dir"))?;
        let journal_dir = std::path::absolute(&journal_dir)
            .with_context(|| format!("invalid setting journal_dir = {}", journal_dir.display()))?;
        let ledger_dir = std::path::absolute(&ledger_dir)
            .with_context(|| format!("invalid setting ledger_dir = {}", ledger_dir.display()))?;
        if journal_dir == ledger_dir {
            bail!(
                "invalid settings: journal_dir and ledger_dir are both {}; they must differ",
                journal_dir.display()
            );
        }
        let listen = self.listen.ok_or_else(|| missing("listen", "--listen"))?;
        let advertised = check_listen_and_advertised(listen, self.advertised)?;
        let mut bookie = quire_bookie::BookieConfig::new(listen, journal_dir, ledger_dir);
        bookie.shards = self.shards.unwrap_or(1);
        if bookie.shards == 0 || bookie.shards > 64 {
            bail!(
                "invalid setting shards = {}: expected 1 to 64",
                bookie.shards
            );
        }
        if let Some(b) = self.io_memory_bytes {
            if b < 64 * 1024 {
                bail!("invalid setting io_memory_bytes = {b}: expected at least 65536");
            }
            bookie.io_memory_bytes = b;
        }
        if let Some(cpus) = self.cpu_set {
            bookie.cpu_set = check_cpu_set(cpus)?;
        }
        if let Some(b) = self.journal_file_size_bytes {
            if b < 8 * 1024 {
                bail!("invalid setting journal_file_size_bytes = {b}: expected at least 8192");
            }
            bookie.engine.journal_file_size_bytes = b;
        }
        if let Some(n) = self.journal_reuse_files {
            bookie.engine.journal_reuse_files = n;
        }
        if let Some(us) = self.group_commit_wait_us {
            if us > 1_000_000 {
                bail!("invalid setting group_commit_wait_us = {us}: expected at most 1000000");
            }
            bookie.engine.group_commit_wait_max = Duration::from_micros(us);
        }
        if let Some(secs) = self.gc_interval_secs {
            bookie.gc_interval = Duration::from_secs(secs);
        }
        if let Some(ms) = self.handshake_timeout_ms {
            if !(100..=600_000).contains(&ms) {
                bail!("invalid setting handshake_timeout_ms = {ms}: expected 100 to 600000");
            }
            bookie.handshake_timeout = Duration::from_millis(ms);
        }
        if let Some(secs) = self.idle_timeout_secs {
            if !(1..=86_400).contains(&secs) {
                bail!("invalid setting idle_timeout_secs = {secs}: expected 1 to 86400");
            }
            bookie.idle_timeout = Duration::from_secs(secs);
        }
        if let Some(n) = self.connections_max {
            if n == 0 {
                bail!("invalid setting connections_max = 0: expected at least 1");
            }
            bookie.connections_max = n;
        }
        if let Some(n) = self.connections_per_ip_max {
            if n == 0 {
                bail!("invalid setting connections_per_ip_max = 0: expected at least 1");
            }
            bookie.connections_per_ip_max = n;
        }
        if let Some(n) = self.request_pool_bytes {
            let frame = bookie.frame_size_bytes_max as usize;
            if n < frame {
                bail!("invalid setting request_pool_bytes = {n}: expected at least the frame limit, {frame}");
            }
            bookie.request_pool_bytes = n;
        }
        if let Some(ms) = self.frame_timeout_ms {
            if !(100..=3_600_000).contains(&ms) {
                bail!("invalid setting frame_timeout_ms = {ms}: expected 100 to 3600000");
            }
            bookie.frame_timeout = Duration::from_millis(ms);
        }
        if let Some(b) = self.journal_queue_bytes_max {
            if b < JOURNAL_QUEUE_BYTES_MIN {
                bail!("invalid setting journal_queue_bytes_max = {b}: expected at least {JOURNAL_QUEUE_BYTES_MIN}");
            }
            bookie.engine.journal_queue_bytes_max = usize::try_from(b).unwrap_or(usize::MAX);
        }
        if let Some(n) = self.entry_log_readers_max {
            if n == 0 {
                bail!("invalid setting entry_log_readers_max = 0: expected at least 1");
            }
            bookie.engine.entry_log_readers_max = n;
        }
        // Every real bookie admits only its cluster's processes (issue 24): no secret, no start.
        let secret_file = self
            .cluster_secret_file
            .ok_or_else(|| missing("cluster_secret_file", "--cluster-secret-file"))?;
        let secret = crate::secret_file::read_cluster_secret(&secret_file, "cluster_secret_file")?;
        bookie.cluster_secret = Some(secret);
        bookie.tls = crate::tls::server_tls(
            self.tls_cert_file,
            self.tls_key_file,
            self.tls_ca_file,
            self.tls_client_auth.as_deref(),
        )?;
        let disk = check_disk_usage(
            self.disk_usage_threshold,
            self.disk_usage_lwm_threshold,
            self.disk_check_interval_ms,
        )?;
        (
            bookie.disk_usage_threshold,
            bookie.disk_usage_lwm_threshold,
            bookie.disk_check_interval,
        ) = disk;
        CompactionSettings {
            minor_threshold: self.minor_compaction_threshold,
            minor_interval_secs: self.minor_compaction_interval_secs,
            major_threshold: self.major_compaction_threshold,
            major_interval_secs: self.major_compaction_interval_secs,
            entry_log_size_bytes: self.entry_log_size_bytes,
            checkpoint_interval_ms: self.checkpoint_interval_ms,
            index_cache_bytes_max: self.index_cache_bytes_max,
            space_reserve_bytes: self.space_reserve_bytes,
        }
        .apply(&mut bookie.engine)?;
        let mut autorecovery = crate::autorecovery::AutorecoveryOptions::resolve(
            self.lost_bookie_recovery_delay_secs,
            self.open_ledger_rereplication_grace_period_ms,
            self.autorecovery_poll_interval_ms,
            self.auditor_periodic_check_interval_secs,
            self.replication_rate_bytes,
        )?;
        autorecovery.cluster_secret = Some(secret);
        let autorecovery_enabled = self.autorecovery_enabled.unwrap_or(true);
        if let Some(tls) = &bookie.tls {
            // The bookie's own autorecovery talks to the other (TLS) bookies as a client: it
            // trusts tls_ca_file and presents the bookie's certificate (BookKeeper's bookie
            // uses its keystore for both sides too).
            if autorecovery_enabled {
                let Some(ca_file) = tls.ca_file.clone() else {
                    bail!("missing setting tls_ca_file: TLS is on and this bookie's autorecovery connects to the other bookies, so it needs the CA that signs their certificates (or set autorecovery_enabled = false)");
                };
                let client = quire_tls::ClientTls {
                    ca_file,
                    cert_file: Some(tls.cert_file.clone()),
                    key_file: Some(tls.key_file.clone()),
                };
                autorecovery.bookie_tls = Some(client.client_config()?);
            }
        }
        Ok(BookieOptions {
            metadata,
            advertised,
            rack: self.rack,
            metrics_listen: self.metrics_listen,
            bookie,
            autorecovery: autorecovery_enabled.then_some(autorecovery),
        })
    }
}

/// `quire proxy` settings: the config file's keys, each overridable by the flag of the same
/// name.
#[derive(Args, Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxySettings {
    /// ZooKeeper connect string (host:port[,host:port...]).
    #[arg(long)]
    pub zookeeper: Option<String>,
    /// Root path of Quire's znodes (default /quire).
    #[arg(long)]
    pub zk_root: Option<String>,
    /// ZooKeeper session timeout in milliseconds (default 10000).
    #[arg(long)]
    pub zk_session_timeout_ms: Option<u64>,
    /// File holding the ZooKeeper digest identity `user:password`: the session authenticates
    /// with it and every znode it creates gets the ACL of that identity only (default: none,
    /// znodes open to anyone).
    #[arg(long)]
    pub zk_auth_file: Option<PathBuf>,
    /// Address to listen on, with a fixed port.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Address clients use to reach this proxy, its identity as a stream owner (default: the
    /// listen address, which must then not be a wildcard).
    #[arg(long)]
    pub advertised: Option<String>,
    /// Ensemble size E of new segments' ledgers (default 3).
    #[arg(long)]
    pub ensemble_size: Option<u8>,
    /// Write quorum Qw (default 3).
    #[arg(long)]
    pub write_quorum: Option<u8>,
    /// Ack quorum Qa (default 2).
    #[arg(long)]
    pub ack_quorum: Option<u8>,
    /// A segment rolls once it holds this many bytes (default 256 MiB).
    #[arg(long)]
    pub segment_size_bytes: Option<u64>,
    /// Records are packed into entries of up to this many bytes (default 256 KiB).
    #[arg(long)]
    pub entry_size_bytes: Option<usize>,
    /// A segment holding at least one record also rolls once it is this many seconds old
    /// (default 7200, DistributedLog's 2 h); 0 turns time rolling off.
    #[arg(long)]
    pub segment_roll_secs: Option<u64>,
    /// When a segment cannot roll because no new segment can be started (fewer writable
    /// bookies than the ensemble size), it keeps taking writes up to this many bytes past
    /// `segment_size_bytes`; beyond, writes are refused (`STORAGE_ERROR`, nothing written)
    /// until a roll succeeds (default 268435456 = 256 MiB).
    #[arg(long)]
    pub segment_roll_overshoot_bytes: Option<u64>,
    /// The same bound in time: seconds past the roll point (size reached, or
    /// `segment_roll_secs` elapsed) a segment may keep taking writes while its roll is
    /// deferred (default 3600).
    #[arg(long)]
    pub segment_roll_overshoot_secs: Option<u64>,
    /// Default retention time of every stream, in seconds (1 to 100 years); unset: kept
    /// forever. Streams override it (`quire stream retention`).
    #[arg(long)]
    pub retention_time_secs: Option<u64>,
    /// Default retention size of every stream, in bytes (1 to 2^60); unset: no limit.
    #[arg(long)]
    pub retention_size_bytes: Option<u64>,
    /// Seconds between lifecycle sweeps over every stream in the metadata store: retention
    /// and the completion of abandoned segments on streams nobody owns (acquired for the
    /// sweep and given back), and deletion of orphan ledger metadata (default 300; 0
    /// disables; at most 86400).
    #[arg(long)]
    pub lifecycle_sweep_secs: Option<u64>,
    /// The txid guard (Quire's own, against a poisoned stream): a record whose txid is more
    /// than this above the txid before it (its stream's last txid, or the previous record of
    /// the same write) is refused with `TXID_TOO_FAR_AHEAD` and nothing of its write is
    /// written; a stream's first record may have any txid. Default 2^40 = 1099511627776; 0
    /// turns the guard off.
    #[arg(long)]
    pub txid_jump_max: Option<u64>,
    /// Longest SIGTERM drain, in milliseconds (default 30000): finishing the writes in flight,
    /// completing open segments and releasing stream leases. When it runs out the proxy
    /// closes every connection and exits with an error status.
    #[arg(long)]
    pub drain_timeout_ms: Option<u64>,
    /// Address of the HTTP endpoint serving `GET /metrics` (Prometheus) and `GET /healthz`;
    /// off unless set.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Token file (`quire token new` makes its entries): clients must then present one of its
    /// tokens and get only its rights; off unless set.
    #[arg(long)]
    pub auth_tokens_file: Option<PathBuf>,
    /// PEM certificate chain of this proxy; with `tls_key_file` it turns TLS on for the proxy
    /// port (BookKeeper `tlsCertificatePath`). Default: plain TCP.
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file` (BookKeeper `tlsKeyStore`).
    #[arg(long)]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA certificates trusted for clients' certificates when `tls_client_auth =
    /// "require"` (BookKeeper `tlsTrustStore`).
    #[arg(long)]
    pub tls_ca_file: Option<PathBuf>,
    /// `none` (default) or `require`: whether clients must present a certificate signed by
    /// `tls_ca_file` (BookKeeper `tlsClientAuthentication`).
    #[arg(long)]
    pub tls_client_auth: Option<String>,
    /// PEM CA certificate that signs the bookies' certificates; turns TLS to bookies on.
    #[arg(long)]
    pub bookie_tls_ca_file: Option<PathBuf>,
    /// PEM client certificate presented to bookies that require one (mutual TLS).
    #[arg(long)]
    pub bookie_tls_cert_file: Option<PathBuf>,
    /// PEM key of `bookie_tls_cert_file`.
    #[arg(long)]
    pub bookie_tls_key_file: Option<PathBuf>,
    /// Process-wide pool of bytes for request frames above 64 KiB (Kafka's
    /// `queued.max.request.bytes`): a connection reserves a large frame's size before reading
    /// its body and waits, unread, while the pool is empty (default 268435456 = 256 MiB; at
    /// least the 5 MiB frame limit).
    #[arg(long)]
    pub request_pool_bytes: Option<usize>,
    /// A frame must arrive whole within this many milliseconds of its first bytes, or its
    /// connection is closed (default 60000).
    #[arg(long)]
    pub frame_timeout_ms: Option<u64>,
    /// Most bytes of read answers one connection may have being built or queued; beyond it the
    /// connection takes no new request until the client reads its answers (default 16777216 =
    /// 16 MiB; at least the 5 MiB frame limit).
    #[arg(long)]
    pub connection_response_bytes_max: Option<usize>,
    /// Process-wide bound on read answers queued and not yet written to their sockets; while
    /// it is reached no connection starts a read (default 268435456 = 256 MiB).
    #[arg(long)]
    pub response_bytes_max: Option<usize>,
    /// A connection whose answers cannot be written for this many milliseconds (its client
    /// does not read them) is closed (default 60000).
    #[arg(long)]
    pub send_timeout_ms: Option<u64>,
    /// While requests wait for `response_bytes_max`, a connection holding some of it whose
    /// answers make no headway for this many milliseconds is closed (default 1000).
    #[arg(long)]
    pub pressure_send_timeout_ms: Option<u64>,
    /// Open connections from one client IP address; more are closed at once (default 1024).
    #[arg(long)]
    pub connections_per_ip_max: Option<usize>,
    /// Connections in their handshake at once; beyond it the one longest in its handshake is
    /// closed (default 1024).
    #[arg(long)]
    pub handshakes_max: Option<usize>,
    /// File holding the cluster secret (64 hexadecimal digits; `quire sandbox` makes one,
    /// Ansible distributes one): every connection to a bookie proves it (protocol version 2,
    /// docs/protocol.md §2; the role of BookKeeper's SASL/digest authentication). Required.
    #[arg(long)]
    pub cluster_secret_file: Option<PathBuf>,
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

/// A checked proxy configuration.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// Where the metadata store is.
    pub metadata: MetadataAddress,
    /// Listen address.
    pub listen: SocketAddr,
    /// The proxy's identity as a stream owner and the address other proxies redirect to.
    pub advertised: String,
    /// Stream layer settings.
    pub streams: quire_proxy::StreamConfig,
    /// Longest SIGTERM drain (see `quire proxy`).
    pub drain_timeout: Duration,
    /// Where `/metrics` and `/healthz` are served, if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// The tokens clients must present, if any.
    pub auth: Option<Arc<quire_proxy::auth::Authorizer>>,
    /// TLS on the proxy port (`None`: plain TCP).
    pub tls: Option<quire_tls::ServerTls>,
    /// TLS to bookies (`None`: plain TCP).
    pub bookie_tls: Option<quire_tls::ClientTls>,
    /// The cluster secret proved to every bookie.
    pub cluster_secret: quire_wire::auth::ClusterSecret,
    /// The proxy port's bounds (`request_pool_bytes`, `frame_timeout`,
    /// `connection_response_bytes_max`, `response_bytes_max`, `send_timeout`,
    /// `pressure_send_timeout`, `connections_per_ip_max`, `handshakes_max`); its other fields
    /// are the defaults.
    pub server: quire_proxy::ServerConfig,
}

/// SIGTERM drain limit of `quire proxy` when none is configured, in milliseconds.
pub const DRAIN_TIMEOUT_MS_DEFAULT: u64 = 30_000;

impl ProxySettings {
    /// Flag values win over the file's.
    pub fn merged(self, file: ProxySettings) -> Self {
        merge!(
            self,
            file,
            zookeeper,
            zk_root,
            zk_session_timeout_ms,
            zk_auth_file,
            listen,
            advertised,
            ensemble_size,
            write_quorum,
            ack_quorum,
            segment_size_bytes,
            entry_size_bytes,
            segment_roll_secs,
            segment_roll_overshoot_bytes,
            segment_roll_overshoot_secs,
            retention_time_secs,
            retention_size_bytes,
            lifecycle_sweep_secs,
            txid_jump_max,
            drain_timeout_ms,
            metrics_listen,
            auth_tokens_file,
            tls_cert_file,
            tls_key_file,
            tls_ca_file,
            tls_client_auth,
            bookie_tls_ca_file,
            bookie_tls_cert_file,
            bookie_tls_key_file,
            request_pool_bytes,
            frame_timeout_ms,
            connection_response_bytes_max,
            response_bytes_max,
            send_timeout_ms,
            pressure_send_timeout_ms,
            connections_per_ip_max,
            handshakes_max,
            cluster_secret_file
        )
    }

    /// The proxy port's memory bounds, checked.
    fn server_limits(&self) -> Result<quire_proxy::ServerConfig> {
        let mut server = quire_proxy::ServerConfig::default();
        let frame = server.frame_size_bytes_max as usize;
        if let Some(n) = self.request_pool_bytes {
            if n < frame {
                bail!("invalid setting request_pool_bytes = {n}: expected at least the frame limit, {frame}");
            }
            server.request_pool_bytes = n;
        }
        if let Some(n) = self.connection_response_bytes_max {
            if n < frame {
                bail!("invalid setting connection_response_bytes_max = {n}: expected at least the frame limit, {frame}");
            }
            server.connection_response_bytes_max = n;
        }
        if let Some(n) = self.response_bytes_max {
            if n < frame {
                bail!("invalid setting response_bytes_max = {n}: expected at least the frame limit, {frame}");
            }
            server.response_bytes_max = n;
        }
        if let Some(ms) = self.frame_timeout_ms {
            if !(100..=3_600_000).contains(&ms) {
                bail!("invalid setting frame_timeout_ms = {ms}: expected 100 to 3600000");
            }
            server.frame_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = self.send_timeout_ms {
            if !(100..=3_600_000).contains(&ms) {
                bail!("invalid setting send_timeout_ms = {ms}: expected 100 to 3600000");
            }
            server.send_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = self.pressure_send_timeout_ms {
            if !(100..=3_600_000).contains(&ms) {
                bail!("invalid setting pressure_send_timeout_ms = {ms}: expected 100 to 3600000");
            }
            server.pressure_send_timeout = Duration::from_millis(ms);
        }
        if let Some(n) = self.connections_per_ip_max {
            if n == 0 {
                bail!("invalid setting connections_per_ip_max = 0: expected at least 1");
            }
            server.connections_per_ip_max = n;
        }
        if let Some(n) = self.handshakes_max {
            if n == 0 {
                bail!("invalid setting handshakes_max = 0: expected at least 1");
            }
            server.handshakes_max = n;
        }
        Ok(server)
    }

    /// Applies defaults and checks every value.
    ///
    /// # Errors
    /// One line naming the first missing or invalid setting.
    pub fn resolve(self) -> Result<ProxyOptions> {
        let server = self.server_limits()?;
        let metadata = MetadataAddress::resolve(
            self.zookeeper,
            self.zk_root,
            self.zk_session_timeout_ms,
            self.zk_auth_file,
        )?;
        let listen = self.listen.ok_or_else(|| missing("listen", "--listen"))?;
        let advertised = check_listen_and_advertised(listen, self.advertised)?;
        // Bookies admit only their cluster's processes: without the secret every add fails.
        let secret_file = self
            .cluster_secret_file
            .clone()
            .ok_or_else(|| missing("cluster_secret_file", "--cluster-secret-file"))?;
        let cluster_secret =
            crate::secret_file::read_cluster_secret(&secret_file, "cluster_secret_file")?;
        let mut streams = quire_proxy::StreamConfig::default();
        streams.ensemble_size = self.ensemble_size.unwrap_or(streams.ensemble_size);
        streams.write_quorum = self.write_quorum.unwrap_or(streams.write_quorum);
        streams.ack_quorum = self.ack_quorum.unwrap_or(streams.ack_quorum);
        let (e, w, a) = (
            streams.ensemble_size,
            streams.write_quorum,
            streams.ack_quorum,
        );
        if !(e >= w && w >= a && a >= 1) {
            bail!("invalid settings ensemble_size = {e}, write_quorum = {w}, ack_quorum = {a}: need E >= Qw >= Qa >= 1");
        }
        if let Some(b) = self.segment_size_bytes {
            if b == 0 {
                bail!("invalid setting segment_size_bytes = 0: expected at least 1");
            }
            streams.segment_size_bytes_max = b;
        }
        if let Some(b) = self.entry_size_bytes {
            if b == 0 || b > quire_client::ENTRY_SIZE_BYTES_MAX {
                bail!(
                    "invalid setting entry_size_bytes = {b}: expected 1 to {}",
                    quire_client::ENTRY_SIZE_BYTES_MAX
                );
            }
            streams.entry_size_bytes_target = b;
        }
        if let Some(secs) = self.segment_roll_secs {
            streams.segment_roll_interval = (secs > 0).then(|| Duration::from_secs(secs));
        }
        if let Some(b) = self.segment_roll_overshoot_bytes {
            streams.segment_roll_overshoot_bytes_max = b;
        }
        if let Some(secs) = self.segment_roll_overshoot_secs {
            streams.segment_roll_overshoot_time_max = Duration::from_secs(secs);
        }
        if let Some(v) = self.retention_time_secs {
            let v = quire_client::check_retention_time_secs(v)
                .map_err(|e| anyhow!("invalid setting retention_time_secs = {v}: {e}"))?;
            streams.retention_time = Some(Duration::from_secs(v));
        }
        if let Some(v) = self.retention_size_bytes {
            let v = quire_client::check_retention_size_bytes(v)
                .map_err(|e| anyhow!("invalid setting retention_size_bytes = {v}: {e}"))?;
            streams.retention_size_bytes = Some(v);
        }
        if let Some(secs) = self.lifecycle_sweep_secs {
            if secs > 86_400 {
                bail!("invalid setting lifecycle_sweep_secs = {secs}: expected 0 (off) to 86400");
            }
            streams.lifecycle_sweep_interval = (secs > 0).then(|| Duration::from_secs(secs));
        }
        if let Some(v) = self.txid_jump_max {
            streams.txid_jump_max = (v > 0).then_some(v);
        }
        let drain_ms = self.drain_timeout_ms.unwrap_or(DRAIN_TIMEOUT_MS_DEFAULT);
        if !(100..=3_600_000).contains(&drain_ms) {
            bail!("invalid setting drain_timeout_ms = {drain_ms}: expected 100 to 3600000");
        }
        Ok(ProxyOptions {
            server,
            metadata,
            listen,
            advertised,
            streams,
            drain_timeout: Duration::from_millis(drain_ms),
            metrics_listen: self.metrics_listen,
            auth: self
                .auth_tokens_file
                .as_deref()
                .map(crate::token::load_authorizer)
                .transpose()?
                .map(Arc::new),
            tls: crate::tls::server_tls(
                self.tls_cert_file,
                self.tls_key_file,
                self.tls_ca_file,
                self.tls_client_auth.as_deref(),
            )?,
            bookie_tls: crate::tls::client_tls(
                "bookie_",
                self.bookie_tls_ca_file,
                self.bookie_tls_cert_file,
                self.bookie_tls_key_file,
            )?,
            cluster_secret,
        })
    }
}

/// Reads `--config FILE` if given and lets the flags override it.
///
/// # Errors
/// One line for an unreadable or invalid file.
pub fn load<T: for<'de> Deserialize<'de> + Default>(config: Option<&Path>) -> Result<T> {
    match config {
        Some(path) => read_toml(path),
        None => Ok(T::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cluster secret file for the tests' settings (every bookie and proxy needs one).
    fn test_secret_file() -> PathBuf {
        static FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
        FILE.get_or_init(|| {
            let path = std::env::temp_dir()
                .join(format!("quire-config-test-{}", std::process::id()))
                .join("cluster-secret");
            let secret = quire_wire::auth::ClusterSecret::generate().unwrap();
            crate::secret_file::write_private(&path, secret.to_hex().as_bytes(), true).unwrap();
            path
        })
        .clone()
    }

    /// Flags with only `cluster_secret_file` set.
    fn bookie_flags() -> BookieSettings {
        BookieSettings {
            cluster_secret_file: Some(test_secret_file()),
            ..Default::default()
        }
    }

    /// Flags with only `cluster_secret_file` set.
    fn proxy_flags() -> ProxySettings {
        ProxySettings {
            cluster_secret_file: Some(test_secret_file()),
            ..Default::default()
        }
    }

    #[test]
    fn bookie_and_proxy_refuse_to_start_without_a_cluster_secret() {
        // Goal: every real bookie and proxy admits only its cluster (issue 24): without
        // `cluster_secret_file` neither starts, and the error names the setting.
        let base = "zookeeper = \"h:1\"\njournal_dir = \"/j\"\nledger_dir = \"/l\"\nlisten = \"127.0.0.1:1\"\n";
        let file: BookieSettings = toml::from_str(base).unwrap();
        let e = BookieSettings::default()
            .merged(file)
            .resolve()
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("missing setting cluster_secret_file"),
            "{e}"
        );
        let file: ProxySettings =
            toml::from_str("zookeeper = \"h:1\"\nlisten = \"127.0.0.1:1\"\n").unwrap();
        let e = ProxySettings::default().merged(file).resolve().unwrap_err();
        assert!(
            e.to_string()
                .contains("missing setting cluster_secret_file"),
            "{e}"
        );
        let o = bookie_from(base).unwrap();
        assert!(o.bookie.cluster_secret.is_some());
        assert!(o.autorecovery.unwrap().cluster_secret.is_some());
    }

    fn bookie_from(text: &str) -> Result<BookieOptions> {
        let file: BookieSettings = toml::from_str(text).map_err(|e| anyhow!("{}", e.message()))?;
        bookie_flags().merged(file).resolve()
    }

    #[test]
    fn bookie_file_and_flag_override() {
        // Goal: file values are read, flags win, defaults fill the rest.
        let text = r#"
            zookeeper = "127.0.0.1:2181"
            journal_dir = "/data/j"
            ledger_dir = "/data/l"
            listen = "127.0.0.1:3181"
            shards = 2
            group_commit_wait_us = 500
            gc_interval_secs = 30
            metrics_listen = "127.0.0.1:9181"
        "#;
        let file: BookieSettings = toml::from_str(text).unwrap();
        let flags = BookieSettings {
            shards: Some(3),
            rack: Some("r1".into()),
            ..bookie_flags()
        };
        let o = flags.merged(file).resolve().unwrap();
        assert_eq!(o.bookie.shards, 3);
        assert_eq!(o.rack.as_deref(), Some("r1"));
        assert_eq!(o.advertised, "127.0.0.1:3181");
        assert_eq!(o.metadata.zk_root, "/quire");
        assert_eq!(o.metrics_listen, Some("127.0.0.1:9181".parse().unwrap()));
        assert_eq!(
            o.bookie.engine.group_commit_wait_max,
            Duration::from_micros(500)
        );
        assert_eq!(o.bookie.gc_interval, Duration::from_secs(30));
        let o = bookie_from("zookeeper = \"h:1\"\njournal_dir = \"/j\"\nledger_dir = \"/l\"\nlisten = \"127.0.0.1:1\"\n").unwrap();
        assert_eq!(o.bookie.gc_interval, quire_bookie::GC_INTERVAL_DEFAULT);
    }

    #[test]
    fn bookie_engine_bounds_are_read_and_checked() {
        // Goal: `journal_queue_bytes_max` and `entry_log_readers_max` reach the engine
        // configuration, default to the engine's defaults, and a too small value is one line
        // naming the setting.
        let base = "zookeeper = \"h:1\"\njournal_dir = \"/j\"\nledger_dir = \"/l\"\nlisten = \"127.0.0.1:1\"\n";
        let o = bookie_from(&format!(
            "{base}journal_queue_bytes_max = 1048576\nentry_log_readers_max = 8"
        ))
        .unwrap();
        assert_eq!(o.bookie.engine.journal_queue_bytes_max, 1 << 20);
        assert_eq!(o.bookie.engine.entry_log_readers_max, 8);
        let d = bookie_from(base).unwrap().bookie.engine;
        assert_eq!(d.journal_queue_bytes_max, 64 << 20);
        assert_eq!(d.entry_log_readers_max, 256);
        for (bad, want) in [
            (
                "journal_queue_bytes_max = 4096",
                "invalid setting journal_queue_bytes_max = 4096",
            ),
            (
                "entry_log_readers_max = 0",
                "invalid setting entry_log_readers_max = 0",
            ),
        ] {
            let e = bookie_from(&format!("{base}{bad}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want) && e.lines().count() == 1, "{bad}: {e}");
        }
    }

    #[test]
    fn bookie_compaction_settings_are_read_and_checked() {
        // Goal: the compaction, entry-log and checkpoint keys reach the engine configuration;
        // thresholds outside [0, 1], minor >= major and too small sizes are one line by name.
        let base = "zookeeper = \"h:1\"\njournal_dir = \"/j\"\nledger_dir = \"/l\"\nlisten = \"127.0.0.1:1\"\n";
        let o = bookie_from(&format!(
            "{base}minor_compaction_threshold = 0.1\nminor_compaction_interval_secs = 5\n\
             major_compaction_threshold = 0.5\nmajor_compaction_interval_secs = 0\n\
             entry_log_size_bytes = 131072\ncheckpoint_interval_ms = 250\n\
             index_cache_bytes_max = 1048576"
        ))
        .unwrap();
        let e = &o.bookie.engine;
        assert_eq!(e.minor_compaction_threshold, 0.1);
        assert_eq!(e.minor_compaction_interval, Duration::from_secs(5));
        assert_eq!(e.major_compaction_threshold, 0.5);
        assert_eq!(e.major_compaction_interval, Duration::ZERO);
        assert_eq!(e.entry_log_size_bytes_max, 131072);
        assert_eq!(e.checkpoint_interval, Duration::from_millis(250));
        assert_eq!(e.index_cache_bytes_max, 1 << 20);
        let d = bookie_from(base).unwrap().bookie.engine;
        assert_eq!(d.index_cache_bytes_max, 16 << 20);
        assert_eq!(
            (d.minor_compaction_threshold, d.major_compaction_threshold),
            (0.2, 0.8)
        );
        for (bad, want) in [
            (
                "minor_compaction_threshold = -0.1",
                "invalid setting minor_compaction_threshold",
            ),
            (
                "major_compaction_threshold = 1.5",
                "invalid setting major_compaction_threshold",
            ),
            (
                "minor_compaction_threshold = 0.9",
                "must be below the major one",
            ),
            (
                "major_compaction_threshold = 0.1",
                "must be below the major one",
            ),
            (
                "entry_log_size_bytes = 4096",
                "invalid setting entry_log_size_bytes",
            ),
            (
                "checkpoint_interval_ms = 0",
                "invalid setting checkpoint_interval_ms",
            ),
            (
                "index_cache_bytes_max = 4096",
                "invalid setting index_cache_bytes_max",
            ),
        ] {
            let e = bookie_from(&format!("{base}{bad}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want) && e.lines().count() == 1, "{bad}: {e}");
        }
    }

    #[test]
    fn bookie_cpu_set_is_read_and_checked() {
        // Goal: `cpu_set` reaches the bookie's configuration; an empty list, a repeated CPU
        // and a CPU this process cannot run on are refused by name. Method: CPU 0 is in the
        // affinity mask of the test process and CPU 1023 is not, on the machines that run the
        // tests (neither restricts the mask nor has 1,024 CPUs).
        let base = "zookeeper = \"h:1\"\njournal_dir = \"/j\"\nledger_dir = \"/l\"\nlisten = \"127.0.0.1:1\"\n";
        let o = bookie_from(&format!("{base}cpu_set = [0]")).unwrap();
        assert_eq!(o.bookie.cpu_set, vec![0]);
        let o = bookie_from(base).unwrap();
        assert!(o.bookie.cpu_set.is_empty(), "unpinned by default");
        for (set, want) in [
            ("[]", "list at least one CPU"),
            ("[0, 0]", "CPU 0 is listed twice"),
            ("[1023]", "CPU 1023 is not available"),
        ] {
            let e = bookie_from(&format!("{base}cpu_set = {set}"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("invalid setting cpu_set") && e.contains(want),
                "{set}: {e}"
            );
        }
    }

    #[test]
    fn bookie_errors_name_the_setting() {
        // Goal: each missing or invalid setting is reported by name.
        let base = "zookeeper = \"h:1\"\njournal_dir = \"/j\"\nledger_dir = \"/l\"\n";
        let e = bookie_from(base).unwrap_err().to_string();
        assert!(e.contains("missing setting listen"), "{e}");
        let e = bookie_from(&format!("{base}listen = \"0.0.0.0:3181\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing setting advertised"), "{e}");
        let e = bookie_from(&format!("{base}listen = \"127.0.0.1:0\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("the port must be fixed"), "{e}");
        let e = bookie_from("journal_dir = \"/j\"").unwrap_err().to_string();
        assert!(e.contains("missing setting zookeeper"), "{e}");
        let e = bookie_from("zookeeper = \"nohost\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid setting zookeeper"), "{e}");
        let e = bookie_from("journal = \"/j\"").unwrap_err().to_string();
        assert!(e.contains("unknown field `journal`"), "{e}");
        let e = bookie_from(&format!("{base}listen = \"127.0.0.1:1\"\nshards = 0"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid setting shards = 0"), "{e}");
    }

    #[test]
    fn tls_settings_are_read_and_checked() {
        // Goal: TLS is off by default; the TLS keys reach the bookie's configuration and its
        // autorecovery's client; incomplete TLS settings are refused by name.
        let dir = tempfile::tempdir().unwrap();
        let pki = quire_tls::gen::write_pki(dir.path(), &["127.0.0.1".into()]).unwrap();
        let base = "zookeeper = \"h:1\"\njournal_dir = \"/j\"\nledger_dir = \"/l\"\nlisten = \"127.0.0.1:3181\"\n";
        let o = bookie_from(base).unwrap();
        assert!(o.bookie.tls.is_none(), "plain TCP by default");
        let (cert, key, ca) = (
            pki.cert_file.display(),
            pki.key_file.display(),
            pki.ca_file.display(),
        );
        let full = format!(
            "{base}tls_cert_file = \"{cert}\"\ntls_key_file = \"{key}\"\ntls_ca_file = \"{ca}\"\ntls_client_auth = \"require\"\n"
        );
        let o = bookie_from(&full).unwrap();
        let tls = o.bookie.tls.expect("TLS on");
        assert_eq!(tls.client_auth, quire_tls::ClientAuth::Require);
        assert!(o.autorecovery.expect("on").bookie_tls.is_some());
        for (text, want) in [
            (
                format!("{base}tls_cert_file = \"{cert}\"\n"),
                "missing setting tls_key_file",
            ),
            (
                format!("{base}tls_client_auth = \"require\"\n"),
                "TLS is off",
            ),
            (full.replace("require", "sometimes"), "tls_client_auth"),
            (
                format!("{base}tls_cert_file = \"{cert}\"\ntls_key_file = \"{key}\"\n"),
                "missing setting tls_ca_file",
            ),
            (
                full.replace(&ca.to_string(), "/nonexistent/ca.pem"),
                "/nonexistent/ca.pem",
            ),
        ] {
            let e = format!("{:#}", bookie_from(&text).unwrap_err());
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn bookie_disk_usage_settings_are_read_and_checked() {
        // Goal: the read-only mode keys reach the bookie's configuration with BookKeeper's
        // defaults, and bad values are refused by name.
        let base = "zookeeper = \"h:1\"\njournal_dir = \"/j\"\nledger_dir = \"/l\"\nlisten = \"127.0.0.1:1\"\n";
        let o = bookie_from(base).unwrap();
        assert_eq!(
            (
                o.bookie.disk_usage_threshold,
                o.bookie.disk_usage_lwm_threshold,
                o.bookie.disk_check_interval
            ),
            (0.95, 0.90, Duration::from_secs(10))
        );
        let o = bookie_from(&format!(
            "{base}disk_usage_threshold = 0.8\ndisk_usage_lwm_threshold = 0.7\ndisk_check_interval_ms = 250"
        ))
        .unwrap();
        assert_eq!(o.bookie.disk_usage_threshold, 0.8);
        assert_eq!(o.bookie.disk_usage_lwm_threshold, 0.7);
        assert_eq!(o.bookie.disk_check_interval, Duration::from_millis(250));
        let o = bookie_from(&format!("{base}disk_usage_threshold = 0.5")).unwrap();
        assert_eq!(o.bookie.disk_usage_lwm_threshold, 0.5);
        for (text, want) in [
            (
                "disk_usage_threshold = 1.5",
                "invalid setting disk_usage_threshold = 1.5",
            ),
            (
                "disk_usage_threshold = 0.0",
                "invalid setting disk_usage_threshold = 0",
            ),
            (
                "disk_usage_lwm_threshold = 0.99",
                "invalid setting disk_usage_lwm_threshold = 0.99",
            ),
            (
                "disk_check_interval_ms = 0",
                "invalid setting disk_check_interval_ms = 0",
            ),
        ] {
            let e = bookie_from(&format!("{base}{text}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn proxy_quorum_is_checked() {
        // Goal: the proxy refuses a quorum shape that breaks E >= Qw >= Qa >= 1.
        let file: ProxySettings =
            toml::from_str("zookeeper = \"h:1\"\nlisten = \"127.0.0.1:4181\"\nensemble_size = 2")
                .unwrap();
        let e = proxy_flags()
            .merged(file.clone())
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.contains("need E >= Qw >= Qa >= 1"), "{e}");
        let flags = ProxySettings {
            write_quorum: Some(2),
            ..proxy_flags()
        };
        let o = flags.merged(file).resolve().unwrap();
        assert_eq!(
            (
                o.streams.ensemble_size,
                o.streams.write_quorum,
                o.streams.ack_quorum
            ),
            (2, 2, 2)
        );
    }

    #[test]
    fn proxy_lifecycle_settings_are_read_and_checked() {
        // Goal: segment_roll_secs (0 = off), retention_time_secs and retention_size_bytes reach
        // the stream config; 0 and absurd retention values are one clear line.
        let base = "zookeeper = \"h:1\"\nlisten = \"127.0.0.1:4181\"\n";
        let parse = |extra: &str| {
            let file: ProxySettings = toml::from_str(&format!("{base}{extra}")).unwrap();
            proxy_flags().merged(file).resolve()
        };
        let o = parse(
            "segment_roll_secs = 60\nretention_time_secs = 3600\nretention_size_bytes = 1000",
        )
        .unwrap();
        assert_eq!(
            o.streams.segment_roll_interval,
            Some(Duration::from_secs(60))
        );
        assert_eq!(o.streams.retention_time, Some(Duration::from_secs(3600)));
        assert_eq!(o.streams.retention_size_bytes, Some(1000));
        let o = parse("segment_roll_secs = 0").unwrap();
        assert_eq!(o.streams.segment_roll_interval, None);
        let o =
            parse("segment_roll_overshoot_bytes = 4096\nsegment_roll_overshoot_secs = 5").unwrap();
        assert_eq!(o.streams.segment_roll_overshoot_bytes_max, 4096);
        assert_eq!(
            o.streams.segment_roll_overshoot_time_max,
            Duration::from_secs(5)
        );
        let o = parse("lifecycle_sweep_secs = 30").unwrap();
        assert_eq!(
            o.streams.lifecycle_sweep_interval,
            Some(Duration::from_secs(30))
        );
        let o = parse("lifecycle_sweep_secs = 0").unwrap();
        assert_eq!(o.streams.lifecycle_sweep_interval, None);
        let e = parse("lifecycle_sweep_secs = 86401")
            .unwrap_err()
            .to_string();
        assert!(e.contains("lifecycle_sweep_secs = 86401"), "{e}");
        let o = parse("").unwrap();
        assert_eq!(
            o.streams.segment_roll_interval,
            Some(Duration::from_secs(7200))
        );
        assert_eq!(
            o.streams.lifecycle_sweep_interval,
            Some(Duration::from_secs(300))
        );
        assert_eq!(
            (o.streams.retention_time, o.streams.retention_size_bytes),
            (None, None)
        );
        for (bad, key) in [
            ("retention_time_secs = 0", "retention_time_secs = 0"),
            ("retention_time_secs = 99999999999", "100 years"),
            ("retention_size_bytes = 0", "retention_size_bytes = 0"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(key) && e.lines().count() == 1, "{e}");
        }
    }

    #[test]
    fn proxy_txid_guard_setting_is_read() {
        // Goal: the txid guard is on at 2^40 unless configured; txid_jump_max sets it, 0 turns
        // it off, and the flag wins over the file. Method: parse small files, merge a flag.
        let base = "zookeeper = \"h:1\"\nlisten = \"127.0.0.1:4181\"\n";
        let file =
            |extra: &str| -> ProxySettings { toml::from_str(&format!("{base}{extra}")).unwrap() };
        let resolve = |f: ProxySettings| proxy_flags().merged(f).resolve().unwrap();
        assert_eq!(
            resolve(file("")).streams.txid_jump_max,
            Some(1 << 40),
            "on by default"
        );
        assert_eq!(
            resolve(file("txid_jump_max = 1000")).streams.txid_jump_max,
            Some(1000)
        );
        assert_eq!(
            resolve(file("txid_jump_max = 0")).streams.txid_jump_max,
            None
        );
        let flags = ProxySettings {
            txid_jump_max: Some(5),
            ..proxy_flags()
        };
        let o = flags.merged(file("txid_jump_max = 0")).resolve().unwrap();
        assert_eq!(o.streams.txid_jump_max, Some(5));
        assert!(toml::from_str::<ProxySettings>("txid_jump_max = -1").is_err());
    }

    #[test]
    fn proxy_memory_bounds_are_read_and_checked() {
        // Goal: the proxy port's memory bounds have their defaults unless configured, are read
        // from the file, and values below the frame limit or out of range are refused.
        let base = "zookeeper = \"h:1\"\nlisten = \"127.0.0.1:4181\"\n";
        let resolve = |extra: &str| {
            let f: ProxySettings = toml::from_str(&format!("{base}{extra}")).unwrap();
            proxy_flags().merged(f).resolve()
        };
        let d = resolve("").unwrap().server;
        assert_eq!(d.request_pool_bytes, 256 << 20);
        assert_eq!(d.connection_response_bytes_max, 16 << 20);
        assert_eq!(d.response_bytes_max, 256 << 20);
        assert_eq!(d.frame_timeout, Duration::from_secs(60));
        assert_eq!(d.send_timeout, Duration::from_secs(60));
        let o = resolve(
            "request_pool_bytes = 67108864\nframe_timeout_ms = 2000\n\
             connection_response_bytes_max = 8388608\nresponse_bytes_max = 33554432\n\
             send_timeout_ms = 5000\n",
        )
        .unwrap()
        .server;
        assert_eq!(o.request_pool_bytes, 64 << 20);
        assert_eq!(o.frame_timeout, Duration::from_secs(2));
        assert_eq!(o.connection_response_bytes_max, 8 << 20);
        assert_eq!(o.response_bytes_max, 32 << 20);
        assert_eq!(o.send_timeout, Duration::from_secs(5));
        for bad in [
            "request_pool_bytes = 1024",
            "connection_response_bytes_max = 1024",
            "response_bytes_max = 1024",
            "frame_timeout_ms = 10",
            "send_timeout_ms = 0",
        ] {
            let e = resolve(bad).unwrap_err().to_string();
            let key = bad.split(' ').next().unwrap();
            assert!(e.contains(key), "{bad}: {e}");
        }
    }

    #[test]
    fn example_files_parse() {
        // Goal: the shipped example files are valid.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let b: BookieSettings = read_toml(&dir.join("bookie.toml")).unwrap();
        // Each names the cluster secret file; the test's own stands in for it (flags win).
        assert!(b.cluster_secret_file.is_some());
        bookie_flags().merged(b).resolve().unwrap();
        let p: ProxySettings = read_toml(&dir.join("proxy.toml")).unwrap();
        assert!(p.cluster_secret_file.is_some());
        proxy_flags().merged(p).resolve().unwrap();
    }
}

//! The command-line flags of `quire bookie`, `quire proxy` and `quire autorecovery`: each
//! overrides one config-file key, named by [`crate::config`]'s key lists (`--zk-root` →
//! `[zookeeper] root`, `--group-commit-wait-us` → `[engine] group_commit_wait_us`). The keys'
//! meanings, ranges and BookKeeper names are documented on the crates' settings types
//! (`quire_bookie::BookieSettings`, `quire_engine::EngineSettings`, ...); `--help` shows each
//! default, read from those types' `Default`. The ZooKeeper flags are one set,
//! [`ZooKeeperFlags`], which the admin commands that read the metadata store flatten too.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Command};
use serde::Serialize;

use crate::config::{Key, MetadataAddress};

/// Adds `[default: VALUE]` to the help of each flag of `keys` whose key has a default in
/// `defaults` (the process's file type's `Default`, which reads the crates' defaults), so that
/// `--help` shows the defaults the process uses without the flags themselves having one (a
/// flag given overrides the file; a flag not given leaves the file's value).
pub fn with_defaults(mut command: Command, keys: &[Key], defaults: &impl Serialize) -> Command {
    let Ok(defaults) = toml::Value::try_from(defaults) else {
        return command;
    };
    for Key { flag, path, .. } in keys {
        let Some(value) = path.split('.').try_fold(&defaults, |v, k| v.get(k)) else {
            continue;
        };
        let shown = match value {
            toml::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        command = command.mut_arg(*flag, |arg| {
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            let long = arg.get_long_help().map(ToString::to_string);
            let arg = arg.help(format!("{help} [default: {shown}]"));
            match long {
                Some(long) => arg.long_help(format!("{long} [default: {shown}]")),
                None => arg,
            }
        });
    }
    command
}

/// The `[ledger]` placement flags, the same for the three daemons that place ledgers' bookies
/// (`quire bookie`'s embedded autorecovery, `quire proxy`, `quire autorecovery`): flattened
/// into each, where each overrides its key of the file's `[ledger]` table.
///
/// `None`: not given, the file's value or the default stands.
#[derive(Args, Debug, Default, Clone, Serialize)]
pub struct LedgerPlacementFlags {
    /// Placement of ledgers' bookies: `default` (random), `rack-aware` or `region-aware`
    /// ([ledger] placement).
    #[arg(long)]
    pub placement: Option<quire_ledger::placement::Policy>,
    /// Racks each write set spans at least under rack-aware placement (BookKeeper
    /// `minNumRacksPerWriteQuorum`; [ledger] min_racks_per_write_quorum).
    #[arg(long)]
    pub min_racks_per_write_quorum: Option<u8>,
    /// Fail a rack-aware placement that cannot keep min_racks_per_write_quorum (BookKeeper
    /// `enforceMinNumRacksPerWriteQuorum`; [ledger] enforce_min_racks).
    #[arg(long)]
    pub enforce_min_racks: Option<bool>,
    /// Regions every ack quorum spans at least under region-aware placement (DistributedLog
    /// `minRegionsForDurability`; [ledger] min_regions_for_durability).
    #[arg(long)]
    pub min_regions_for_durability: Option<u8>,
    /// Fail a region-aware placement that cannot keep min_regions_for_durability
    /// (BookKeeper `enforceDurability`; [ledger] enforce_durability).
    #[arg(long)]
    pub enforce_durability: Option<bool>,
    /// Reads ask a write set's replicas closest first, recently failed ones last; false: in
    /// write-set order (BookKeeper `reorderReadSequenceEnabled`; [ledger]
    /// reorder_read_sequence).
    #[arg(long)]
    pub reorder_read_sequence: Option<bool>,
}

/// The ZooKeeper flags, the same for every command that talks to ZooKeeper: flattened into the
/// flags of `quire bookie`, `quire proxy` and `quire autorecovery` (where each overrides its
/// key of the file's `[zookeeper]` table, `quire_metadata::ZooKeeperConfig`) and into every
/// admin command that reads the metadata store (`quire ledger ...`, `quire bookie list`, ...;
/// there with their environment variables, [`ZooKeeperFlags::resolve`]). Each flag is mapped
/// to its key once, by [`crate::config::ZOOKEEPER`]; [`crate::config::load`] overlays them.
///
/// `None`: not given, the file's value or the default stands.
#[derive(Args, Debug, Default, Clone, Serialize)]
pub struct ZooKeeperFlags {
    /// ZooKeeper connect string, host:port[,host:port...] ([zookeeper] servers).
    #[arg(long, env = "QUIRE_ZOOKEEPER", global = true)]
    pub zookeeper: Option<String>,
    /// Root path of Quire's znodes ([zookeeper] root).
    #[arg(long, env = "QUIRE_ZK_ROOT", global = true)]
    pub zk_root: Option<String>,
    /// ZooKeeper session timeout in milliseconds ([zookeeper] session_timeout_ms).
    #[arg(long, global = true)]
    pub zk_session_timeout_ms: Option<u64>,
    /// File holding the ZooKeeper digest identity `user:password`; every znode created gets
    /// its ACL ([zookeeper] auth_file; unset: znodes open to anyone).
    #[arg(long, env = "QUIRE_ZK_AUTH_FILE", global = true)]
    pub zk_auth_file: Option<PathBuf>,
}

impl ZooKeeperFlags {
    /// The metadata address these flags (and their environment variables) name, over the
    /// `[zookeeper]` table's defaults: what an admin command connects to.
    ///
    /// # Errors
    /// One line naming the key when the connect string is missing or a value is malformed,
    /// or when the auth file cannot be read.
    pub fn resolve(&self) -> Result<MetadataAddress> {
        let keys = crate::config::keys_of(&[crate::config::ZOOKEEPER]);
        let file: crate::config::AutorecoveryFile = crate::config::load(None, &keys, self)?;
        MetadataAddress::from_config(&file.zookeeper, &keys)
    }
}

/// `command` (`quire bookie`, `quire proxy` or `quire autorecovery`) with its
/// [`ZooKeeperFlags`] not global, so that its admin subcommands have the flags of their own.
/// They keep their environment variables: flag over variable over the file's `[zookeeper]`
/// table over the default, as for every other command; [`env_overrides`] names what a
/// variable replaced, which the process logs as a warning when it also read a file.
pub fn process_zookeeper_flags(mut command: Command) -> Command {
    let flags = ZooKeeperFlags::augment_args(Command::new("zookeeper"));
    for arg in flags.get_arguments() {
        command = command.mut_arg(arg.get_id(), |a| a.global(false));
    }
    command
}

/// For a process command's matches: each ZooKeeper flag whose value came from its environment
/// variable, as `(variable, value)`.
pub fn env_overrides(matches: &clap::ArgMatches) -> Vec<(String, String)> {
    let flags = ZooKeeperFlags::augment_args(Command::new("zookeeper"));
    flags
        .get_arguments()
        .filter(|a| {
            matches.value_source(a.get_id().as_str())
                == Some(clap::parser::ValueSource::EnvVariable)
        })
        .filter_map(|a| {
            let var = a.get_env()?.to_string_lossy().into_owned();
            let value = matches.get_raw(a.get_id().as_str())?.next()?;
            Some((var, value.to_string_lossy().into_owned()))
        })
        .collect()
}

/// `quire bookie` flags (None: not given, the file's value or the default stands).
#[derive(Args, Debug, Default, Clone, Serialize)]
pub struct BookieFlags {
    #[command(flatten)]
    #[serde(flatten)]
    pub zk: ZooKeeperFlags,
    /// Journal directory, one subdirectory per shard ([bookie] journal_dir).
    #[arg(long)]
    pub journal_dir: Option<PathBuf>,
    /// Ledger directory: entry logs and index ([bookie] ledger_dir).
    #[arg(long)]
    pub ledger_dir: Option<PathBuf>,
    /// Address to listen on, with a fixed port.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Address clients use to reach this bookie, and its bookie id (unset: the listen
    /// address, which must then not be a wildcard).
    #[arg(long)]
    pub advertised: Option<String>,
    /// Rack label recorded in the bookie registry.
    #[arg(long)]
    pub rack: Option<String>,
    /// Region label recorded in the bookie registry (unset: default-region).
    #[arg(long)]
    pub region: Option<String>,
    /// Shards: glommio executors, one engine each ([bookie] shards).
    #[arg(long)]
    pub shards: Option<usize>,
    /// glommio io_memory per shard, in bytes ([bookie] io_memory_bytes).
    #[arg(long)]
    pub io_memory_bytes: Option<usize>,
    /// CPUs to pin the shards to, e.g. `0,1`: shard i runs on the (i mod n)-th ([bookie]
    /// cpu_set; unset: unpinned).
    #[arg(long, value_delimiter = ',')]
    pub cpu_set: Option<Vec<usize>>,
    /// Size of each pre-written journal file, in bytes ([engine] journal_file_size_bytes).
    #[arg(long)]
    pub journal_file_size_bytes: Option<u64>,
    /// Checkpointed journal files kept per shard for reuse (BookKeeper `journalReuseFiles`; 0
    /// turns reuse off; [engine] journal_reuse_files).
    #[arg(long)]
    pub journal_reuse_files: Option<usize>,
    /// Longest wait of the oldest queued add before its journal group is written, in
    /// microseconds (BookKeeper `journalMaxGroupWaitMSec`; [engine] group_commit_wait_us).
    #[arg(long)]
    pub group_commit_wait_us: Option<u64>,
    /// Seconds between garbage-collection runs on each shard (BookKeeper `gcWaitTime`; 0
    /// disables; [bookie] gc_interval_secs).
    #[arg(long)]
    pub gc_interval_secs: Option<u64>,
    /// Usage fraction of a journal or ledger filesystem at which the bookie turns read-only
    /// (BookKeeper `diskUsageThreshold`; [bookie] disk_usage_threshold).
    #[arg(long)]
    pub disk_usage_threshold: Option<f64>,
    /// Usage every directory must be below for a read-only bookie to take adds again
    /// (BookKeeper `diskUsageLwmThreshold`; [bookie] disk_usage_lwm_threshold; unset: 0.90,
    /// or disk_usage_threshold if lower).
    #[arg(long)]
    pub disk_usage_lwm_threshold: Option<f64>,
    /// Milliseconds between disk usage measurements (BookKeeper `diskCheckInterval`;
    /// [bookie] disk_check_interval_ms).
    #[arg(long)]
    pub disk_check_interval_ms: Option<u64>,
    /// Address of the HTTP endpoint serving `GET /metrics` and `GET /healthz`; off unless set.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Minor compaction threshold, a fraction (BookKeeper `minorCompactionThreshold`;
    /// [compaction] minor_threshold).
    #[arg(long)]
    pub minor_compaction_threshold: Option<f64>,
    /// Seconds between minor compactions, 0 disables ([compaction] minor_interval_secs).
    #[arg(long)]
    pub minor_compaction_interval_secs: Option<u64>,
    /// Major compaction threshold, a fraction above the minor one (BookKeeper
    /// `majorCompactionThreshold`; [compaction] major_threshold).
    #[arg(long)]
    pub major_compaction_threshold: Option<f64>,
    /// Seconds between major compactions, 0 disables ([compaction] major_interval_secs).
    #[arg(long)]
    pub major_compaction_interval_secs: Option<u64>,
    /// An entry log rolls beyond this many bytes (BookKeeper `logSizeLimit`; [engine]
    /// entry_log_size_bytes).
    #[arg(long)]
    pub entry_log_size_bytes: Option<u64>,
    /// Garbage collection rolls the entry log being appended to once it holds this many bytes
    /// and less than half of them are live, and reclaims it in the same run ([engine]
    /// entry_log_roll_floor_bytes; 0: never).
    #[arg(long)]
    pub entry_log_roll_floor_bytes: Option<u64>,
    /// Milliseconds between checkpoints (BookKeeper `flushInterval`; [engine]
    /// checkpoint_interval_ms).
    #[arg(long)]
    pub checkpoint_interval_ms: Option<u64>,
    /// Bound of each shard's index block cache, in bytes ([engine] index_cache_bytes_max).
    #[arg(long)]
    pub index_cache_bytes_max: Option<u64>,
    /// Bytes of zeros each shard keeps in reserve for a full disk ([engine]
    /// space_reserve_bytes; 0 turns it off).
    #[arg(long)]
    pub space_reserve_bytes: Option<u64>,
    /// Bytes of adds queued per shard for the journal writer beyond which adds wait, then are
    /// refused (BookKeeper `journalQueueSize`; [engine] journal_queue_bytes_max).
    #[arg(long)]
    pub journal_queue_bytes_max: Option<u64>,
    /// Entry-log files each shard keeps open for reads (BookKeeper `openFileLimit`; [engine]
    /// entry_log_readers_max).
    #[arg(long)]
    pub entry_log_readers_max: Option<usize>,
    /// Run an autorecovery daemon inside this bookie (BookKeeper
    /// `autoRecoveryDaemonEnabled`; [autorecovery] enabled).
    #[arg(long)]
    pub autorecovery_enabled: Option<bool>,
    /// Seconds a bookie's registration must have been gone before its ledgers are marked
    /// under-replicated (BookKeeper `lostBookieRecoveryDelay`).
    #[arg(long)]
    pub lost_bookie_recovery_delay_secs: Option<u64>,
    /// Milliseconds the last fragment of an open ledger is left to its writer (BookKeeper
    /// `openLedgerRereplicationGracePeriod`).
    #[arg(long)]
    pub open_ledger_rereplication_grace_period_ms: Option<u64>,
    /// Milliseconds between the auditor's registry polls ([autorecovery] poll_interval_ms).
    #[arg(long)]
    pub autorecovery_poll_interval_ms: Option<u64>,
    /// Seconds between the auditor's walks over every ledger (BookKeeper
    /// `auditorPeriodicCheckInterval`; 0 disables).
    #[arg(long)]
    pub auditor_periodic_check_interval_secs: Option<u64>,
    /// Bytes per second a replication worker writes at most (BookKeeper
    /// `replicationRateByBytes`; 0: unlimited).
    #[arg(long)]
    pub replication_rate_bytes: Option<u64>,
    /// Milliseconds a connection may take to complete its handshake ([bookie]
    /// handshake_timeout_ms).
    #[arg(long)]
    pub handshake_timeout_ms: Option<u64>,
    /// Seconds a handshaken connection may stay idle ([bookie] idle_timeout_secs).
    #[arg(long)]
    pub idle_timeout_secs: Option<u64>,
    /// Open client connections per bookie ([bookie] connections_max).
    #[arg(long)]
    pub connections_max: Option<usize>,
    /// Open client connections per client IP address (Kafka `max.connections.per.ip`;
    /// [bookie] connections_per_ip_max).
    #[arg(long)]
    pub connections_per_ip_max: Option<usize>,
    /// Bytes of request frames above 64 KiB buffered at once (Kafka
    /// `queued.max.request.bytes`; [bookie] request_pool_bytes).
    #[arg(long)]
    pub request_pool_bytes: Option<usize>,
    /// Milliseconds a frame may take to arrive whole ([bookie] frame_timeout_ms).
    #[arg(long)]
    pub frame_timeout_ms: Option<u64>,
    /// Whether every shard scrubs its index and entry logs (checksums re-read, damage
    /// reported and marked for repair; [bookie] scrub_enabled).
    #[arg(long)]
    pub scrub_enabled: Option<bool>,
    /// Seconds between the end of a scrub pass and the start of the next (BookKeeper
    /// `localScrubPeriod`; [bookie] scrub_interval_secs).
    #[arg(long)]
    pub scrub_interval_secs: Option<u64>,
    /// Entry-log bytes a scrub pass reads per second on each shard, 0 unpaced ([bookie]
    /// scrub_rate_bytes_per_sec).
    #[arg(long)]
    pub scrub_rate_bytes_per_sec: Option<u64>,
    /// PEM certificate chain of this bookie; with the key it turns TLS on ([tls] cert_file).
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of the certificate ([tls] key_file).
    #[arg(long)]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA certificates trusted for clients' and other bookies' certificates ([tls]
    /// ca_file).
    #[arg(long)]
    pub tls_ca_file: Option<PathBuf>,
    /// `none` or `require`: whether clients must present a certificate ([tls] client_auth).
    #[arg(long)]
    pub tls_client_auth: Option<String>,
    /// File holding the cluster secret (64 hexadecimal digits) every connection to a bookie
    /// proves (docs/protocol.md §2). Required.
    #[arg(long)]
    pub cluster_secret_file: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub ledger: LedgerPlacementFlags,
}

/// `quire proxy` flags (None: not given, the file's value or the default stands).
#[derive(Args, Debug, Default, Clone, Serialize)]
pub struct ProxyFlags {
    #[command(flatten)]
    #[serde(flatten)]
    pub zk: ZooKeeperFlags,
    /// Address to listen on, with a fixed port.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Address clients use to reach this proxy, its identity as a stream owner (unset: the
    /// listen address, which must then not be a wildcard).
    #[arg(long)]
    pub advertised: Option<String>,
    /// Region label of this proxy, in its proxy registry record (unset: default-region).
    #[arg(long)]
    pub region: Option<String>,
    /// Rack label of this proxy, in its proxy registry record (unset: /default-rack).
    #[arg(long)]
    pub rack: Option<String>,
    /// Ensemble size E of new segments' ledgers ([streams] ensemble_size).
    #[arg(long)]
    pub ensemble_size: Option<u8>,
    /// Write quorum Qw ([streams] write_quorum).
    #[arg(long)]
    pub write_quorum: Option<u8>,
    /// Ack quorum Qa ([streams] ack_quorum).
    #[arg(long)]
    pub ack_quorum: Option<u8>,
    /// A segment rolls once it holds this many bytes ([streams] segment_size_bytes).
    #[arg(long)]
    pub segment_size_bytes: Option<u64>,
    /// Records are packed into entries of up to this many bytes ([streams]
    /// entry_size_bytes).
    #[arg(long)]
    pub entry_size_bytes: Option<usize>,
    /// A segment holding a record also rolls once this many seconds old; 0 turns time
    /// rolling off ([streams] segment_roll_secs).
    #[arg(long)]
    pub segment_roll_secs: Option<u64>,
    /// Bytes past its roll point a segment that cannot roll keeps taking writes ([streams]
    /// segment_roll_overshoot_bytes).
    #[arg(long)]
    pub segment_roll_overshoot_bytes: Option<u64>,
    /// Seconds past its roll point a segment that cannot roll keeps taking writes ([streams]
    /// segment_roll_overshoot_secs).
    #[arg(long)]
    pub segment_roll_overshoot_secs: Option<u64>,
    /// Default retention time of every stream, in seconds (unset: kept forever).
    #[arg(long)]
    pub retention_time_secs: Option<u64>,
    /// Default retention size of every stream, in bytes (unset: no limit).
    #[arg(long)]
    pub retention_size_bytes: Option<u64>,
    /// Seconds between lifecycle sweeps over every stream; 0 disables ([streams]
    /// lifecycle_sweep_secs).
    #[arg(long)]
    pub lifecycle_sweep_secs: Option<u64>,
    /// The txid guard: a record whose txid is more than this above the one before it is
    /// refused with `TXID_TOO_FAR_AHEAD`; 0 turns it off ([streams] txid_jump_max).
    #[arg(long)]
    pub txid_jump_max: Option<u64>,
    /// Record-set compression of every entry this proxy writes, `none` or `lz4`; a write may
    /// still ask for LZ4 itself (WRITE flag 0x04) ([streams] compression).
    #[arg(long)]
    pub compression: Option<quire_client::compression::Compression>,
    /// Most subscriptions a stream may have; a commit creating one more fails with
    /// TOO_MANY_SUBSCRIPTIONS ([streams] subscriptions_per_stream_max).
    #[arg(long)]
    pub subscriptions_per_stream_max: Option<usize>,
    /// Most streams this proxy owns at once; a request acquiring one more fails with
    /// TOO_MANY_STREAMS and the client tries another proxy; 0 is no limit ([streams]
    /// owned_streams_max).
    #[arg(long)]
    pub owned_streams_max: Option<usize>,
    /// Serve reads of streams another proxy owns from the bookies here (a follower per
    /// stream) instead of redirecting them to the owner ([streams] follower_reads).
    #[arg(long)]
    pub follower_reads: Option<bool>,
    /// Bytes of entries each follower keeps for its readers, 65536 to 1073741824 ([streams]
    /// follower_cache_bytes_max).
    #[arg(long)]
    pub follower_cache_bytes_max: Option<usize>,
    /// Seconds without a read after which a follower stops, 1 to 86400 ([streams]
    /// follower_idle_timeout_secs).
    #[arg(long)]
    pub follower_idle_timeout_secs: Option<u64>,
    /// Balanced ownership: the most streams per second this proxy hands to their preferred
    /// owner (rendezvous hashing over the live proxies); 0 turns balancing off, and a stream
    /// stays with the first proxy asked ([streams] balance_moves_per_sec).
    #[arg(long)]
    pub balance_moves_per_sec: Option<u32>,
    /// With balancing on, a proxy whose write load (records/s or bytes/s) is above this
    /// percentage of the live proxies' mean halves its placement weight so that a share of its
    /// streams moves; 0 (the default) turns it off, else 110 to 1000 ([streams]
    /// balance_load_threshold_percent).
    #[arg(long)]
    pub balance_load_threshold_percent: Option<u32>,
    /// Milliseconds a read waits for one replica before it asks the next one as well, at first
    /// and at least (adapting to the p99 of recent reads, backing off x2 while it does not
    /// help); 0 turns speculative reads off ([streams] speculative_read_timeout_ms).
    #[arg(long)]
    pub speculative_read_timeout_ms: Option<u64>,
    /// The most the speculative read timeout adapts or backs off to, in milliseconds
    /// ([streams] max_speculative_read_timeout_ms).
    #[arg(long)]
    pub max_speculative_read_timeout_ms: Option<u64>,
    /// Longest SIGTERM drain, in milliseconds, 100 to 3600000.
    #[arg(long)]
    pub drain_timeout_ms: Option<u64>,
    /// Address of the HTTP endpoint serving `GET /metrics` and `GET /healthz`; off unless set.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Token file: clients must present one of its tokens; off unless set.
    #[arg(long)]
    pub auth_tokens_file: Option<PathBuf>,
    /// PEM certificate chain of this proxy; with the key it turns TLS on ([tls] cert_file).
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of the certificate ([tls] key_file).
    #[arg(long)]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA certificates trusted for clients' certificates ([tls] ca_file).
    #[arg(long)]
    pub tls_ca_file: Option<PathBuf>,
    /// `none` or `require`: whether clients must present a certificate ([tls] client_auth).
    #[arg(long)]
    pub tls_client_auth: Option<String>,
    /// PEM CA certificate that signs the bookies' certificates; turns TLS to bookies on
    /// ([bookie_tls] ca_file).
    #[arg(long)]
    pub bookie_tls_ca_file: Option<PathBuf>,
    /// PEM client certificate presented to bookies ([bookie_tls] cert_file).
    #[arg(long)]
    pub bookie_tls_cert_file: Option<PathBuf>,
    /// PEM key of the client certificate ([bookie_tls] key_file).
    #[arg(long)]
    pub bookie_tls_key_file: Option<PathBuf>,
    /// Process-wide pool of bytes for request frames above 64 KiB ([server]
    /// request_pool_bytes).
    #[arg(long)]
    pub request_pool_bytes: Option<usize>,
    /// Milliseconds a frame may take to arrive whole ([server] frame_timeout_ms).
    #[arg(long)]
    pub frame_timeout_ms: Option<u64>,
    /// Bytes of read answers one connection may have built or queued ([server]
    /// connection_response_bytes_max).
    #[arg(long)]
    pub connection_response_bytes_max: Option<usize>,
    /// Process-wide bound on read answers queued ([server] response_bytes_max).
    #[arg(long)]
    pub response_bytes_max: Option<usize>,
    /// Milliseconds a connection's answers may stay unwritten ([server] send_timeout_ms).
    #[arg(long)]
    pub send_timeout_ms: Option<u64>,
    /// The same while requests wait for response_bytes_max ([server]
    /// pressure_send_timeout_ms).
    #[arg(long)]
    pub pressure_send_timeout_ms: Option<u64>,
    /// Open connections from one client IP address ([server] connections_per_ip_max).
    #[arg(long)]
    pub connections_per_ip_max: Option<usize>,
    /// Connections in their handshake at once ([server] handshakes_max).
    #[arg(long)]
    pub handshakes_max: Option<usize>,
    /// Hard limit on records/s of everything this proxy writes; over it OVER_CAPACITY, 0 = none ([limits] proxy_records_per_sec).
    #[arg(long)]
    pub proxy_records_per_sec: Option<u64>,
    /// Hard limit on record payload bytes/s of everything this proxy writes; 0 = none ([limits] proxy_bytes_per_sec).
    #[arg(long)]
    pub proxy_bytes_per_sec: Option<u64>,
    /// Soft limit on records/s of everything this proxy writes (logged and counted); 0 = none ([limits] proxy_soft_records_per_sec).
    #[arg(long)]
    pub proxy_soft_records_per_sec: Option<u64>,
    /// Soft limit on payload bytes/s of everything this proxy writes; 0 = none ([limits] proxy_soft_bytes_per_sec).
    #[arg(long)]
    pub proxy_soft_bytes_per_sec: Option<u64>,
    /// Most unanswered writes of everything this proxy writes; 0 = none ([limits] proxy_outstanding_writes_max).
    #[arg(long)]
    pub proxy_outstanding_writes_max: Option<u64>,
    /// Hard limit on records/s of each owned stream without limits of its own; over it OVER_CAPACITY, 0 = none ([limits] stream_records_per_sec).
    #[arg(long)]
    pub stream_records_per_sec: Option<u64>,
    /// Hard limit on record payload bytes/s of each owned stream without limits of its own; 0 = none ([limits] stream_bytes_per_sec).
    #[arg(long)]
    pub stream_bytes_per_sec: Option<u64>,
    /// Soft limit on records/s of each owned stream without limits of its own (logged and counted); 0 = none ([limits] stream_soft_records_per_sec).
    #[arg(long)]
    pub stream_soft_records_per_sec: Option<u64>,
    /// Soft limit on payload bytes/s of each owned stream without limits of its own; 0 = none ([limits] stream_soft_bytes_per_sec).
    #[arg(long)]
    pub stream_soft_bytes_per_sec: Option<u64>,
    /// Most unanswered writes of each owned stream without limits of its own; 0 = none ([limits] stream_outstanding_writes_max).
    #[arg(long)]
    pub stream_outstanding_writes_max: Option<u64>,
    /// File holding the cluster secret proved to every bookie. Required.
    #[arg(long)]
    pub cluster_secret_file: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub ledger: LedgerPlacementFlags,
}

/// `quire autorecovery` flags (None: not given, the file's value or the default stands).
#[derive(Args, Debug, Default, Clone, Serialize)]
pub struct AutorecoveryFlags {
    #[command(flatten)]
    #[serde(flatten)]
    pub zk: ZooKeeperFlags,
    /// This daemon's identity in the auditor election and on worker locks (unset:
    /// `autorecovery-<pid>@<hostname>`).
    #[arg(long)]
    pub name: Option<String>,
    /// Seconds a bookie's registration must have been gone before its ledgers are marked
    /// under-replicated (BookKeeper `lostBookieRecoveryDelay`).
    #[arg(long)]
    pub lost_bookie_recovery_delay_secs: Option<u64>,
    /// Milliseconds the last fragment of an open ledger is left to its writer (BookKeeper
    /// `openLedgerRereplicationGracePeriod`).
    #[arg(long)]
    pub open_ledger_rereplication_grace_period_ms: Option<u64>,
    /// Milliseconds between the auditor's registry polls ([autorecovery] poll_interval_ms).
    #[arg(long)]
    pub autorecovery_poll_interval_ms: Option<u64>,
    /// Seconds between the auditor's walks over every ledger; 0 disables.
    #[arg(long)]
    pub auditor_periodic_check_interval_secs: Option<u64>,
    /// Bytes per second the replication worker writes at most; 0: unlimited.
    #[arg(long)]
    pub replication_rate_bytes: Option<u64>,
    /// Address of the HTTP endpoint serving `GET /metrics` and `GET /healthz`; off unless set.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// PEM CA certificate that signs the bookies' certificates; turns TLS to bookies on.
    #[arg(long)]
    pub bookie_tls_ca_file: Option<PathBuf>,
    /// PEM client certificate, for bookies that require one.
    #[arg(long)]
    pub bookie_tls_cert_file: Option<PathBuf>,
    /// PEM key of the client certificate.
    #[arg(long)]
    pub bookie_tls_key_file: Option<PathBuf>,
    /// File holding the cluster secret (see `quire bookie`). Required.
    #[arg(long)]
    pub cluster_secret_file: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub ledger: LedgerPlacementFlags,
}

#[cfg(test)]
mod tests {
    //! Goal: one ZooKeeper flag set, accepted exactly as before the flags were one struct.
    //! Method: walk the built command line (no environment is read or set).

    /// A flag's long name and its environment variable.
    type Flag = (String, Option<String>);

    /// Every command (space-separated path) with the ZooKeeper flags, and the environment
    /// variable of each flag there.
    fn zookeeper_commands() -> Vec<(String, Vec<Flag>)> {
        fn walk(path: &str, c: &clap::Command, out: &mut Vec<(String, Vec<Flag>)>) {
            let flags: Vec<_> = c
                .get_arguments()
                .filter(|a| a.get_id() == "zookeeper" || a.get_id().as_str().starts_with("zk_"))
                .map(|a| {
                    let env = a.get_env().map(|e| e.to_string_lossy().into_owned());
                    (a.get_long().unwrap_or_default().to_string(), env)
                })
                .collect();
            if !flags.is_empty() {
                out.push((path.trim().to_string(), flags));
            }
            for sub in c.get_subcommands() {
                walk(&format!("{path} {}", sub.get_name()), sub, out);
            }
        }
        let mut out = Vec::new();
        walk("", &crate::command(), &mut out);
        out
    }

    #[test]
    fn every_zookeeper_command_takes_the_same_flags_and_admin_commands_their_variables() {
        let commands = zookeeper_commands();
        let mut names: Vec<&str> = commands.iter().map(|(c, _)| c.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "autorecovery",
                "autorecovery status",
                "bookie",
                "bookie decommission",
                "bookie delete-cookie",
                "bookie info",
                "bookie list",
                "cluster region",
                "cluster status",
                "debug bundle",
                "ledger list",
                "ledger recover",
                "ledger show",
                "proxy",
                "proxy list",
            ]
        );
        for (command, flags) in &commands {
            let env = |v: &str| Some(v.to_string());
            let mut want = vec![
                ("zookeeper".to_string(), env("QUIRE_ZOOKEEPER")),
                ("zk-root".to_string(), env("QUIRE_ZK_ROOT")),
                ("zk-session-timeout-ms".to_string(), None),
                ("zk-auth-file".to_string(), env("QUIRE_ZK_AUTH_FILE")),
            ];
            want.sort();
            let mut flags = flags.clone();
            flags.sort();
            assert_eq!(flags, want, "quire {command}");
        }
    }

    #[test]
    fn flags_before_a_subcommand_stay_the_process_commands() {
        // `quire bookie --zookeeper H list` was refused (the flags run a bookie; `list` has
        // its own), and `quire bookie list --zookeeper H` accepted.
        let parse = |args: &[&str]| crate::command().try_get_matches_from(args);
        let e = parse(&["quire", "bookie", "--zookeeper", "h:1", "list"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{e}");
        let m = parse(&["quire", "bookie", "list", "--zookeeper", "h:1"]).unwrap();
        let (_, bookie) = m.subcommand().unwrap();
        let (_, list) = bookie.subcommand().unwrap();
        assert_eq!(
            list.get_one::<String>("zookeeper").map(String::as_str),
            Some("h:1")
        );
        let m = parse(&["quire", "proxy", "--zk-root", "/q", "--zookeeper", "h:1"]).unwrap();
        let (_, proxy) = m.subcommand().unwrap();
        assert_eq!(
            proxy.get_one::<String>("zk_root").map(String::as_str),
            Some("/q")
        );
    }
}

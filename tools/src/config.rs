//! Loading the config files of `quire bookie`, `quire proxy` and `quire autorecovery`.
//!
//! Each crate owns its keys: a settings type that derives `Deserialize` with
//! `serde(default, deny_unknown_fields)`, whose `Default` is the crate's and whose `validate()`
//! names the key ([`ZooKeeperConfig`] for `[zookeeper]`, `quire_bookie::BookieSettings` for
//! `[bookie]`, `quire_engine::EngineSettings` and `CompactionSettings` for `[engine]` and
//! `[compaction]`, `quire_proxy::StreamSettings` and `ServerSettings` for `[streams]` and
//! `[server]`, [`crate::tls`] for `[tls]` and `[bookie_tls]`,
//! [`crate::autorecovery::AutorecoveryConfig`] for `[autorecovery]`). This module only reads
//! the file into the process's file type, which nests those tables, overlays the flags
//! ([`crate::flags`]) named in the process's key list, and calls the validations.
//!
//! Files from before the tables (every key at the top level, named like its flag): a key the
//! previous release's Ansible templates wrote still loads, with a warning naming its new place
//! ([`Old::Alias`]), so that a deployed file keeps working until it is templated again; any
//! other moved key fails with one line naming its new table and key ([`Old::Refuse`]).
//!
//! Example files: `tools/examples/bookie.toml`, `tools/examples/proxy.toml`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use quire_metadata::{ConfigError, MetadataStore, ZkDigest, ZkStore, ZooKeeperConfig};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::autorecovery::{AutorecoveryConfig, AutorecoveryOptions};
use crate::tls::{ClientTlsSettings, ServerTlsSettings};

/// How a key spelled as before the tables (at the top level, under its flag's name) is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Old {
    /// The key did not move.
    Same,
    /// It loads as its new key, with a warning.
    Alias,
    /// It fails, naming its new key.
    Refuse,
}
use Old::{Alias, Refuse, Same};

/// A flag (and pre-table key) name, the key's dotted path in the file, and how the old
/// spelling is read.
pub type Key = (&'static str, &'static str, Old);

const ZK_KEYS: [Key; 4] = [
    ("zookeeper", "zookeeper.servers", Alias),
    ("zk_root", "zookeeper.root", Alias),
    (
        "zk_session_timeout_ms",
        "zookeeper.session_timeout_ms",
        Alias,
    ),
    ("zk_auth_file", "zookeeper.auth_file", Alias),
];
const AUTORECOVERY_TABLE_KEYS: [Key; 5] = [
    (
        "lost_bookie_recovery_delay_secs",
        "autorecovery.lost_bookie_recovery_delay_secs",
        Refuse,
    ),
    (
        "open_ledger_rereplication_grace_period_ms",
        "autorecovery.open_ledger_rereplication_grace_period_ms",
        Refuse,
    ),
    (
        "autorecovery_poll_interval_ms",
        "autorecovery.poll_interval_ms",
        Refuse,
    ),
    (
        "auditor_periodic_check_interval_secs",
        "autorecovery.auditor_periodic_check_interval_secs",
        Refuse,
    ),
    (
        "replication_rate_bytes",
        "autorecovery.replication_rate_bytes",
        Refuse,
    ),
];
const COMMON_KEYS: [Key; 3] = [
    ("listen", "listen", Same),
    ("metrics_listen", "metrics_listen", Same),
    ("cluster_secret_file", "cluster_secret_file", Same),
];

/// The keys of `quire bookie` (see [`Key`]).
pub const BOOKIE_KEYS: &[Key] = &[
    ("advertised", "advertised", Same),
    ("rack", "rack", Same),
    ("journal_dir", "bookie.journal_dir", Alias),
    ("ledger_dir", "bookie.ledger_dir", Alias),
    ("shards", "bookie.shards", Alias),
    ("io_memory_bytes", "bookie.io_memory_bytes", Alias),
    ("cpu_set", "bookie.cpu_set", Alias),
    ("gc_interval_secs", "bookie.gc_interval_secs", Refuse),
    ("disk_usage_threshold", "bookie.disk_usage_threshold", Alias),
    (
        "disk_usage_lwm_threshold",
        "bookie.disk_usage_lwm_threshold",
        Alias,
    ),
    (
        "disk_check_interval_ms",
        "bookie.disk_check_interval_ms",
        Refuse,
    ),
    (
        "handshake_timeout_ms",
        "bookie.handshake_timeout_ms",
        Refuse,
    ),
    ("idle_timeout_secs", "bookie.idle_timeout_secs", Refuse),
    ("connections_max", "bookie.connections_max", Refuse),
    (
        "connections_per_ip_max",
        "bookie.connections_per_ip_max",
        Refuse,
    ),
    ("request_pool_bytes", "bookie.request_pool_bytes", Refuse),
    ("frame_timeout_ms", "bookie.frame_timeout_ms", Refuse),
    (
        "journal_file_size_bytes",
        "engine.journal_file_size_bytes",
        Alias,
    ),
    ("journal_reuse_files", "engine.journal_reuse_files", Alias),
    ("group_commit_wait_us", "engine.group_commit_wait_us", Alias),
    (
        "journal_queue_bytes_max",
        "engine.journal_queue_bytes_max",
        Refuse,
    ),
    (
        "entry_log_readers_max",
        "engine.entry_log_readers_max",
        Refuse,
    ),
    (
        "entry_log_size_bytes",
        "engine.entry_log_size_bytes",
        Refuse,
    ),
    (
        "checkpoint_interval_ms",
        "engine.checkpoint_interval_ms",
        Refuse,
    ),
    (
        "index_cache_bytes_max",
        "engine.index_cache_bytes_max",
        Refuse,
    ),
    ("space_reserve_bytes", "engine.space_reserve_bytes", Refuse),
    (
        "minor_compaction_threshold",
        "compaction.minor_threshold",
        Refuse,
    ),
    (
        "minor_compaction_interval_secs",
        "compaction.minor_interval_secs",
        Refuse,
    ),
    (
        "major_compaction_threshold",
        "compaction.major_threshold",
        Refuse,
    ),
    (
        "major_compaction_interval_secs",
        "compaction.major_interval_secs",
        Refuse,
    ),
    ("tls_cert_file", "tls.cert_file", Alias),
    ("tls_key_file", "tls.key_file", Alias),
    ("tls_ca_file", "tls.ca_file", Alias),
    ("tls_client_auth", "tls.client_auth", Alias),
    ("autorecovery_enabled", "autorecovery.enabled", Refuse),
];

/// The keys of `quire proxy` (see [`Key`]).
pub const PROXY_KEYS: &[Key] = &[
    ("advertised", "advertised", Same),
    ("drain_timeout_ms", "drain_timeout_ms", Same),
    ("auth_tokens_file", "auth_tokens_file", Same),
    ("ensemble_size", "streams.ensemble_size", Alias),
    ("write_quorum", "streams.write_quorum", Alias),
    ("ack_quorum", "streams.ack_quorum", Alias),
    ("segment_size_bytes", "streams.segment_size_bytes", Alias),
    ("entry_size_bytes", "streams.entry_size_bytes", Alias),
    ("segment_roll_secs", "streams.segment_roll_secs", Refuse),
    (
        "segment_roll_overshoot_bytes",
        "streams.segment_roll_overshoot_bytes",
        Refuse,
    ),
    (
        "segment_roll_overshoot_secs",
        "streams.segment_roll_overshoot_secs",
        Refuse,
    ),
    ("retention_time_secs", "streams.retention_time_secs", Refuse),
    (
        "retention_size_bytes",
        "streams.retention_size_bytes",
        Refuse,
    ),
    (
        "lifecycle_sweep_secs",
        "streams.lifecycle_sweep_secs",
        Refuse,
    ),
    ("txid_jump_max", "streams.txid_jump_max", Refuse),
    ("request_pool_bytes", "server.request_pool_bytes", Refuse),
    ("frame_timeout_ms", "server.frame_timeout_ms", Refuse),
    (
        "connection_response_bytes_max",
        "server.connection_response_bytes_max",
        Refuse,
    ),
    ("response_bytes_max", "server.response_bytes_max", Refuse),
    ("send_timeout_ms", "server.send_timeout_ms", Refuse),
    (
        "pressure_send_timeout_ms",
        "server.pressure_send_timeout_ms",
        Refuse,
    ),
    (
        "connections_per_ip_max",
        "server.connections_per_ip_max",
        Refuse,
    ),
    ("handshakes_max", "server.handshakes_max", Refuse),
    ("tls_cert_file", "tls.cert_file", Alias),
    ("tls_key_file", "tls.key_file", Alias),
    ("tls_ca_file", "tls.ca_file", Alias),
    ("tls_client_auth", "tls.client_auth", Alias),
    ("bookie_tls_ca_file", "bookie_tls.ca_file", Alias),
    ("bookie_tls_cert_file", "bookie_tls.cert_file", Alias),
    ("bookie_tls_key_file", "bookie_tls.key_file", Alias),
];

/// The keys of `quire autorecovery` (see [`Key`]).
pub const AUTORECOVERY_KEYS: &[Key] = &[
    ("name", "autorecovery.name", Refuse),
    ("bookie_tls_ca_file", "bookie_tls.ca_file", Refuse),
    ("bookie_tls_cert_file", "bookie_tls.cert_file", Refuse),
    ("bookie_tls_key_file", "bookie_tls.key_file", Refuse),
];

/// Every key of a process: the shared ones and its own.
pub fn keys_of(own: &'static [Key]) -> Vec<Key> {
    let autorecovery = own != PROXY_KEYS;
    let shared = ZK_KEYS.iter().chain(&COMMON_KEYS);
    let shared = shared.chain(AUTORECOVERY_TABLE_KEYS.iter().filter(|_| autorecovery));
    shared
        .chain(own)
        .filter(|k| k.0 != "listen" || own != AUTORECOVERY_KEYS)
        .copied()
        .collect()
}

/// The file of `quire bookie`: the process's own keys and the crates' tables.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BookieFile {
    pub listen: Option<SocketAddr>,
    pub advertised: Option<String>,
    pub rack: Option<String>,
    pub metrics_listen: Option<SocketAddr>,
    pub cluster_secret_file: Option<PathBuf>,
    pub zookeeper: ZooKeeperConfig,
    pub bookie: quire_bookie::BookieSettings,
    pub engine: quire_engine::EngineSettings,
    pub compaction: quire_engine::CompactionSettings,
    pub tls: ServerTlsSettings,
    pub autorecovery: AutorecoveryConfig,
}

/// The file of `quire proxy`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyFile {
    pub listen: Option<SocketAddr>,
    pub advertised: Option<String>,
    pub metrics_listen: Option<SocketAddr>,
    pub cluster_secret_file: Option<PathBuf>,
    pub auth_tokens_file: Option<PathBuf>,
    /// Longest SIGTERM drain, in milliseconds, 100 to 3600000.
    pub drain_timeout_ms: u64,
    pub zookeeper: ZooKeeperConfig,
    pub streams: quire_proxy::StreamSettings,
    pub server: quire_proxy::ServerSettings,
    pub tls: ServerTlsSettings,
    pub bookie_tls: ClientTlsSettings,
}

impl Default for ProxyFile {
    fn default() -> Self {
        Self {
            listen: None,
            advertised: None,
            metrics_listen: None,
            cluster_secret_file: None,
            auth_tokens_file: None,
            drain_timeout_ms: 30_000,
            zookeeper: ZooKeeperConfig::default(),
            streams: Default::default(),
            server: Default::default(),
            tls: Default::default(),
            bookie_tls: Default::default(),
        }
    }
}

/// The file of `quire autorecovery`.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutorecoveryFile {
    pub metrics_listen: Option<SocketAddr>,
    pub cluster_secret_file: Option<PathBuf>,
    pub zookeeper: ZooKeeperConfig,
    pub autorecovery: AutorecoveryConfig,
    pub bookie_tls: ClientTlsSettings,
}

/// Reads `config` (if any) into `T`, reading old spellings as `keys` say, then overlays the
/// given `flags` (named like `keys`).
///
/// # Errors
/// One line: an unreadable file, `FILE line N: message` for a syntax error, a wrong type or
/// an unknown key, or a refused old key naming its new place.
pub fn load<T>(config: Option<&Path>, keys: &[Key], flags: &impl Serialize) -> Result<T>
where
    T: Serialize + DeserializeOwned + Default,
{
    let text = match config {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config file {}", path.display()))?,
        ),
        None => None,
    };
    let path = config.unwrap_or(Path::new("-"));
    from_text(text.as_deref(), path, keys, flags)
}

/// [`load`] of a file's text (`None`: no file), `path` naming it in errors.
///
/// # Errors
/// As [`load`].
pub fn from_text<T>(
    text: Option<&str>,
    path: &Path,
    keys: &[Key],
    flags: &impl Serialize,
) -> Result<T>
where
    T: Serialize + DeserializeOwned + Default,
{
    let file: T = match text {
        Some(text) => parse_toml(&upgrade(text, keys, path)?, path)?,
        None => T::default(),
    };
    let mut value = toml::Value::try_from(&file)?;
    let toml::Value::Table(given) = toml::Value::try_from(flags)? else {
        bail!("flags are not a table");
    };
    for (flag, v) in given {
        let path = keys
            .iter()
            .find(|k| k.0 == flag)
            .map_or(flag.as_str(), |k| k.1);
        let (table, key) = path
            .split_once('.')
            .map_or((None, path), |(t, k)| (Some(t), k));
        let mut at = value.as_table_mut().context("file is not a table")?;
        if let Some(t) = table {
            let entry = at.entry(t).or_insert_with(|| toml::Table::new().into());
            at = entry.as_table_mut().context("not a table")?;
        }
        at.insert(key.to_string(), v);
    }
    T::deserialize(value).map_err(|e| anyhow!("invalid flag: {}", e.message().trim()))
}

/// Rewrites the old top-level spelling of moved keys as dotted keys (`shards = 2` →
/// `bookie.shards = 2` on the same line, so that later errors keep their line numbers).
fn upgrade(text: &str, keys: &[Key], path: &Path) -> Result<String> {
    let table: toml::Table = parse_toml(text, path)?;
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let header = lines
        .iter()
        .position(|l| l.trim_start().starts_with('['))
        .unwrap_or(lines.len());
    for (name, value) in &table {
        let Some(&(_, new, old)) = keys.iter().find(|k| k.0 == name && k.1 != k.0) else {
            continue;
        };
        if name == "zookeeper" && value.is_table() {
            continue;
        }
        let (t, key) = new.split_once('.').context("moved key without a table")?;
        let file = path.display();
        if old == Refuse || table.get(t).is_some_and(toml::Value::is_table) {
            bail!("config file {file}: key {name} has moved: write it as {key} in the [{t}] table");
        }
        let at = lines[..header].iter().position(|l| {
            let l = l.trim_start();
            l.strip_prefix(name.as_str())
                .is_some_and(|r| r.trim_start().starts_with('='))
        });
        let Some(at) = at else {
            bail!("config file {file}: key {name} has moved: write it as {key} in the [{t}] table");
        };
        lines[at] = lines[at].replacen(name.as_str(), new, 1);
        tracing::warn!(
            "config file {file}: key {name} is read as {key} in the [{t}] table; write it there"
        );
    }
    Ok(lines.join("\n"))
}

fn parse_toml<T: DeserializeOwned>(text: &str, path: &Path) -> Result<T> {
    toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        let message = e.message().replace('\n', " ");
        let (file, message) = (path.display(), message.trim());
        match line {
            Some(line) => anyhow!("config file {file} line {line}: {message}"),
            None => anyhow!("config file {file}: {message}"),
        }
    })
}

/// Reads and parses a TOML file into `T` (one line on error, as [`load`]).
///
/// # Errors
/// An unreadable file, or `FILE line N: message`.
pub fn read_toml<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    parse_toml(&text, path)
}

/// A crate's [`ConfigError`] in table `table`, with the flag that sets the key when a missing
/// key has one.
fn named(e: impl Into<ConfigError>, table: &str, keys: &[Key]) -> anyhow::Error {
    let e = e.into();
    let e = if table.is_empty() {
        e
    } else {
        e.in_table(table)
    };
    match keys.iter().find(|k| k.1 == e.key) {
        Some(k) if e.missing => anyhow!(
            "{e} (in the config file, or with --{})",
            k.0.replace('_', "-")
        ),
        _ => anyhow!("{e}"),
    }
}

fn engine_error(e: quire_engine::ConfigError) -> ConfigError {
    let quire_engine::ConfigError {
        key,
        value,
        expected,
        missing,
    } = e;
    ConfigError {
        key,
        value,
        expected,
        missing,
    }
}

fn missing(key: &str) -> anyhow::Error {
    let flag = key.replace('_', "-");
    anyhow!("missing setting {key}: set it in the config file or with --{flag}")
}

/// Where the metadata store lives, checked, with the digest identity read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataAddress {
    /// ZooKeeper connect string, `host:port[,host:port...]`.
    pub zookeeper: String,
    /// Absolute path under which every Quire znode lives, e.g. `/quire`.
    pub zk_root: String,
    /// ZooKeeper session timeout.
    pub session_timeout: Duration,
    /// The digest identity of the session, read from `[zookeeper] auth_file`.
    pub digest: Option<ZkDigest>,
}

impl MetadataAddress {
    /// Checks the `[zookeeper]` table and reads its auth file.
    ///
    /// # Errors
    /// One line naming the key.
    pub fn from_config(zk: &ZooKeeperConfig, keys: &[Key]) -> Result<Self> {
        zk.validate().map_err(|e| named(e, "zookeeper", keys))?;
        let digest = match &zk.auth_file {
            None => None,
            Some(path) => {
                crate::secret_file::warn_if_exposed(path, "zookeeper.auth_file");
                let text = std::fs::read_to_string(path).with_context(|| {
                    format!("cannot read zookeeper.auth_file {}", path.display())
                })?;
                let digest = ZkDigest::parse(&text)
                    .map_err(|e| anyhow!("invalid zookeeper.auth_file {}: {e}", path.display()))?;
                Some(digest)
            }
        };
        let (zookeeper, zk_root) = (zk.servers.clone(), zk.root.clone());
        Ok(Self {
            zookeeper,
            zk_root,
            session_timeout: zk.session_timeout(),
            digest,
        })
    }

    /// Connects to the ZooKeeper metadata store (its layout under the root is created on
    /// first use).
    ///
    /// # Errors
    /// ZooKeeper unreachable within about the session timeout, or a layout of another version.
    pub async fn connect_zk(&self) -> Result<Arc<ZkStore>> {
        let (zk, root) = (&self.zookeeper, &self.zk_root);
        let store =
            ZkStore::connect_with_auth(zk, root, self.session_timeout, self.digest.as_ref())
                .await
                .with_context(|| format!("cannot connect to ZooKeeper at {zk} (root {root})"))?;
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

/// The admin commands' metadata address flags.
#[derive(Args, Debug, Clone, Serialize)]
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
    /// File holding the ZooKeeper digest identity `user:password`.
    #[arg(long, env = "QUIRE_ZK_AUTH_FILE", global = true)]
    pub zk_auth_file: Option<PathBuf>,
}

impl MetadataArgs {
    /// The address, checked.
    ///
    /// # Errors
    /// One line when the connect string is missing or malformed.
    pub fn resolve(&self) -> Result<MetadataAddress> {
        let file: AutorecoveryFile = load(None, &ZK_KEYS, self)?;
        MetadataAddress::from_config(&file.zookeeper, &ZK_KEYS)
    }
}

/// A checked bookie configuration.
#[derive(Debug, Clone)]
pub struct BookieOptions {
    pub metadata: MetadataAddress,
    /// The bookie id, `host:port` clients connect to.
    pub advertised: String,
    pub rack: Option<String>,
    pub metrics_listen: Option<SocketAddr>,
    pub bookie: quire_bookie::BookieConfig,
    /// The autorecovery daemon to run inside the bookie (`None`: disabled).
    pub autorecovery: Option<AutorecoveryOptions>,
}

/// A checked proxy configuration.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    pub metadata: MetadataAddress,
    pub listen: SocketAddr,
    /// The proxy's identity as a stream owner and the address other proxies redirect to.
    pub advertised: String,
    pub streams: quire_proxy::StreamConfig,
    pub drain_timeout: Duration,
    pub metrics_listen: Option<SocketAddr>,
    pub auth: Option<Arc<quire_proxy::auth::Authorizer>>,
    pub tls: Option<quire_tls::ServerTls>,
    pub bookie_tls: Option<quire_tls::ClientTls>,
    pub cluster_secret: quire_wire::auth::ClusterSecret,
    /// The proxy port's bounds (`[server]`); its other fields are the defaults.
    pub server: quire_proxy::ServerConfig,
}

fn check_listen_and_advertised(
    listen: Option<SocketAddr>,
    advertised: Option<String>,
) -> Result<(SocketAddr, String)> {
    let listen = listen.ok_or_else(|| missing("listen"))?;
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
    if advertised.contains(',') || !quire_metadata::is_host_port_list(&advertised) {
        bail!("invalid setting advertised = {advertised:?}: expected host:port");
    }
    Ok((listen, advertised))
}

fn cluster_secret(file: Option<&Path>) -> Result<quire_wire::auth::ClusterSecret> {
    // Bookies admit only their cluster's processes (issue 24): no secret, no start.
    let path = file.ok_or_else(|| missing("cluster_secret_file"))?;
    crate::secret_file::read_cluster_secret(path, "cluster_secret_file")
}

impl BookieFile {
    /// Checks every table and builds the bookie's configuration.
    ///
    /// # Errors
    /// One line naming the first missing or invalid key.
    pub fn resolve(self) -> Result<BookieOptions> {
        let keys = keys_of(BOOKIE_KEYS);
        let metadata = MetadataAddress::from_config(&self.zookeeper, &keys)?;
        let (listen, advertised) = check_listen_and_advertised(self.listen, self.advertised)?;
        let mut bookie = self
            .bookie
            .to_config(listen)
            .map_err(|e| named(engine_error(e), "bookie", &keys))?;
        self.engine
            .validate()
            .map_err(|e| named(engine_error(e), "engine", &keys))?;
        self.compaction
            .validate()
            .map_err(|e| named(engine_error(e), "compaction", &keys))?;
        self.engine.apply(&mut bookie.engine);
        self.compaction.apply(&mut bookie.engine);
        let secret = cluster_secret(self.cluster_secret_file.as_deref())?;
        bookie.cluster_secret = Some(secret);
        bookie.tls = self.tls.resolve()?;
        self.autorecovery
            .validate()
            .map_err(|e| named(e, "autorecovery", &keys))?;
        let mut autorecovery = self.autorecovery.options();
        autorecovery.cluster_secret = Some(secret);
        if let (Some(tls), true) = (&bookie.tls, self.autorecovery.enabled) {
            // The bookie's own autorecovery talks to the other (TLS) bookies as a client: it
            // trusts tls.ca_file and presents the bookie's certificate (BookKeeper's bookie
            // uses its keystore for both sides too).
            let Some(ca_file) = tls.ca_file.clone() else {
                bail!("missing setting tls.ca_file: TLS is on and this bookie's autorecovery connects to the other bookies, so it needs the CA that signs their certificates (or set [autorecovery] enabled = false)");
            };
            let (cert_file, key_file) = (Some(tls.cert_file.clone()), Some(tls.key_file.clone()));
            let client = quire_tls::ClientTls {
                ca_file,
                cert_file,
                key_file,
            };
            autorecovery.bookie_tls = Some(client.client_config()?);
        }
        Ok(BookieOptions {
            metadata,
            advertised,
            rack: self.rack,
            metrics_listen: self.metrics_listen,
            bookie,
            autorecovery: self.autorecovery.enabled.then_some(autorecovery),
        })
    }
}

impl ProxyFile {
    /// Checks every table and builds the proxy's configuration.
    ///
    /// # Errors
    /// One line naming the first missing or invalid key.
    pub fn resolve(self) -> Result<ProxyOptions> {
        let keys = keys_of(PROXY_KEYS);
        self.server
            .validate()
            .map_err(|e| named(e, "server", &keys))?;
        let mut server = quire_proxy::ServerConfig::default();
        self.server.apply(&mut server);
        let metadata = MetadataAddress::from_config(&self.zookeeper, &keys)?;
        let (listen, advertised) = check_listen_and_advertised(self.listen, self.advertised)?;
        let cluster_secret = cluster_secret(self.cluster_secret_file.as_deref())?;
        self.streams
            .validate()
            .map_err(|e| named(e, "streams", &keys))?;
        let mut streams = quire_proxy::StreamConfig::default();
        self.streams.apply(&mut streams);
        let drain_ms = self.drain_timeout_ms;
        if !(100..=3_600_000).contains(&drain_ms) {
            bail!("invalid setting drain_timeout_ms = {drain_ms}: expected 100 to 3600000");
        }
        let auth = self
            .auth_tokens_file
            .as_deref()
            .map(crate::token::load_authorizer);
        Ok(ProxyOptions {
            server,
            metadata,
            listen,
            advertised,
            streams,
            drain_timeout: Duration::from_millis(drain_ms),
            metrics_listen: self.metrics_listen,
            auth: auth.transpose()?.map(Arc::new),
            tls: self.tls.resolve()?,
            bookie_tls: self.bookie_tls.resolve()?,
            cluster_secret,
        })
    }
}

/// Parses and checks a retention time in seconds (`--retention-time-secs`).
pub fn parse_retention_time_secs(v: &str) -> std::result::Result<u64, String> {
    let n: u64 = v
        .parse()
        .map_err(|_| format!("{v:?} is not a whole number"))?;
    quire_proxy::check_retention_time_secs(n)
}

/// Parses and checks a retention size in bytes (`--retention-size-bytes`).
pub fn parse_retention_size_bytes(v: &str) -> std::result::Result<u64, String> {
    let n: u64 = v
        .parse()
        .map_err(|_| format!("{v:?} is not a whole number"))?;
    quire_proxy::check_retention_size_bytes(n)
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

//! Loading the config files of `quire bookie`, `quire proxy` and `quire autorecovery`.
//!
//! Each crate owns its keys: a settings type that derives `Deserialize` with
//! `serde(default, deny_unknown_fields)`, whose `Default` is the crate's and whose `validate()`
//! names the key ([`ZooKeeperConfig`] for `[zookeeper]`, `quire_bookie::BookieSettings` for
//! `[bookie]`, `quire_engine::EngineSettings` and `CompactionSettings` for `[engine]` and
//! `[compaction]`, `quire_proxy::StreamSettings` and `ServerSettings` for `[streams]` and
//! `[server]`, [`crate::tls`] for `[tls]` and `[bookie_tls]`,
//! [`crate::autorecovery::AutorecoveryConfig`] for `[autorecovery]`). This module only reads
//! the file into the process's file type, which nests those tables, and overlays the flags
//! ([`crate::flags`]) named in the process's key list; [`crate::options`] calls the
//! validations, [`crate::metadata`] connects to the `[zookeeper]` table's store.
//!
//! Files from before the tables (every key at the top level, named like its flag): a key the
//! previous release's Ansible templates wrote still loads, with a warning naming its new place
//! ([`Old::Alias`]), so that a deployed file keeps working until it is templated again; any
//! other moved key fails with one line naming its new table and key ([`Old::Refuse`]).
//!
//! Example files: `tools/examples/bookie.toml`, `tools/examples/proxy.toml`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use quire_metadata::{ConfigError, ZooKeeperConfig};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::autorecovery::AutorecoveryConfig;
/// The admin commands' ZooKeeper flags under their former name, which
/// `crate::autorecovery`'s commands still use.
pub use crate::flags::ZooKeeperFlags as MetadataArgs;
pub use crate::metadata::MetadataAddress;
pub use crate::options::{BookieOptions, ProxyOptions};
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

/// One key of a process: its flag's (and old top-level) name, its dotted path in the file, and
/// how the old spelling is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub flag: &'static str,
    pub path: String,
    pub old: Old,
}

/// A table and its keys, separated by white space, each `flag` or `flag=key` when its name in
/// the table differs (the top level is the table "").
pub type Table = (&'static str, &'static str);

/// The keys the previous release's Ansible templates wrote: at the top level of an old file
/// they still load, so that a deployed file works until it is templated again.
const ALIASED: &str = "zookeeper zk_root zk_session_timeout_ms zk_auth_file journal_dir \
    ledger_dir shards io_memory_bytes cpu_set journal_file_size_bytes journal_reuse_files \
    group_commit_wait_us disk_usage_threshold disk_usage_lwm_threshold tls_cert_file \
    tls_key_file tls_ca_file tls_client_auth ensemble_size write_quorum ack_quorum \
    segment_size_bytes entry_size_bytes bookie_tls_ca_file bookie_tls_cert_file \
    bookie_tls_key_file";

/// The `[zookeeper]` table, the same in every process.
pub const ZOOKEEPER: Table = (
    "zookeeper",
    "zookeeper=servers zk_root=root \
    zk_session_timeout_ms=session_timeout_ms zk_auth_file=auth_file",
);
const AUTORECOVERY: Table = (
    "autorecovery",
    "lost_bookie_recovery_delay_secs \
    open_ledger_rereplication_grace_period_ms autorecovery_poll_interval_ms=poll_interval_ms \
    auditor_periodic_check_interval_secs replication_rate_bytes",
);
/// The `[ledger]` table (`quire_ledger::placement::PlacementSettings`): placement of new
/// ensembles (the proxy) and of replacements (the proxy, autorecovery, decommission).
const LEDGER: Table = (
    "ledger",
    "placement min_racks_per_write_quorum enforce_min_racks min_regions_for_durability \
    enforce_durability reorder_read_sequence",
);
const TLS: Table = (
    "tls",
    "tls_cert_file=cert_file tls_key_file=key_file \
    tls_ca_file=ca_file tls_client_auth=client_auth",
);
const BOOKIE_TLS: Table = (
    "bookie_tls",
    "bookie_tls_ca_file=ca_file \
    bookie_tls_cert_file=cert_file bookie_tls_key_file=key_file",
);

/// The tables of `quire bookie`.
pub const BOOKIE_KEYS: &[Table] = &[
    (
        "",
        "listen advertised rack region metrics_listen cluster_secret_file",
    ),
    ZOOKEEPER,
    (
        "bookie",
        "journal_dir ledger_dir shards io_memory_bytes cpu_set gc_interval_secs \
        disk_usage_threshold disk_usage_lwm_threshold disk_check_interval_ms \
        handshake_timeout_ms idle_timeout_secs connections_max connections_per_ip_max \
        request_pool_bytes frame_timeout_ms scrub_enabled scrub_interval_secs \
        scrub_rate_bytes_per_sec",
    ),
    (
        "engine",
        "journal_file_size_bytes journal_reuse_files group_commit_wait_us \
        journal_queue_bytes_max entry_log_readers_max entry_log_size_bytes \
        entry_log_roll_floor_bytes checkpoint_interval_ms index_cache_bytes_max space_reserve_bytes",
    ),
    (
        "compaction",
        "minor_compaction_threshold=minor_threshold \
        minor_compaction_interval_secs=minor_interval_secs \
        major_compaction_threshold=major_threshold \
        major_compaction_interval_secs=major_interval_secs",
    ),
    TLS,
    ("autorecovery", "autorecovery_enabled=enabled"),
    AUTORECOVERY,
    LEDGER,
];

/// The tables of `quire proxy`.
pub const PROXY_KEYS: &[Table] = &[
    (
        "",
        "listen advertised region rack metrics_listen cluster_secret_file auth_tokens_file \
        drain_timeout_ms",
    ),
    ZOOKEEPER,
    (
        "streams",
        "ensemble_size write_quorum ack_quorum segment_size_bytes entry_size_bytes \
        segment_roll_secs segment_roll_overshoot_bytes segment_roll_overshoot_secs \
        retention_time_secs retention_size_bytes lifecycle_sweep_secs txid_jump_max compression \
        subscriptions_per_stream_max owned_streams_max balance_moves_per_sec \
        balance_load_threshold_percent follower_reads follower_cache_bytes_max \
        follower_idle_timeout_secs \
        speculative_read_timeout_ms max_speculative_read_timeout_ms",
    ),
    (
        "server",
        "request_pool_bytes frame_timeout_ms connection_response_bytes_max \
        response_bytes_max send_timeout_ms pressure_send_timeout_ms connections_per_ip_max \
        handshakes_max",
    ),
    (
        "limits",
        "proxy_records_per_sec proxy_bytes_per_sec proxy_soft_records_per_sec \
        proxy_soft_bytes_per_sec proxy_outstanding_writes_max stream_records_per_sec \
        stream_bytes_per_sec stream_soft_records_per_sec stream_soft_bytes_per_sec \
        stream_outstanding_writes_max",
    ),
    TLS,
    BOOKIE_TLS,
    LEDGER,
];

/// The tables of `quire autorecovery`.
pub const AUTORECOVERY_KEYS: &[Table] = &[
    ("", "metrics_listen cluster_secret_file"),
    ZOOKEEPER,
    AUTORECOVERY,
    ("autorecovery", "name"),
    BOOKIE_TLS,
    LEDGER,
];

/// Every key of a process's tables.
pub fn keys_of(tables: &[Table]) -> Vec<Key> {
    let mut keys = Vec::new();
    for &(table, names) in tables {
        for name in names.split_whitespace() {
            let (flag, key) = name.split_once('=').unwrap_or((name, name));
            let (path, old) = match table {
                "" => (key.to_string(), Old::Same),
                t if ALIASED.split_whitespace().any(|a| a == flag) => {
                    (format!("{t}.{key}"), Old::Alias)
                }
                t => (format!("{t}.{key}"), Old::Refuse),
            };
            keys.push(Key { flag, path, old });
        }
    }
    keys
}

/// The file of `quire bookie`: the process's own keys and the crates' tables.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BookieFile {
    pub listen: Option<SocketAddr>,
    pub advertised: Option<String>,
    pub rack: Option<String>,
    /// Region label recorded in the bookie registry (none: `default-region`).
    pub region: Option<String>,
    pub metrics_listen: Option<SocketAddr>,
    pub cluster_secret_file: Option<PathBuf>,
    pub zookeeper: ZooKeeperConfig,
    pub bookie: quire_bookie::BookieSettings,
    pub engine: quire_engine::EngineSettings,
    pub compaction: quire_engine::CompactionSettings,
    pub tls: ServerTlsSettings,
    pub autorecovery: AutorecoveryConfig,
    /// Placement of the replacements this bookie's autorecovery chooses.
    pub ledger: quire_ledger::placement::PlacementSettings,
}

/// The file of `quire proxy`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyFile {
    pub listen: Option<SocketAddr>,
    pub advertised: Option<String>,
    /// Region and rack labels of this proxy, in its proxy registry record (none:
    /// `default-region`, `/default-rack`).
    pub region: Option<String>,
    pub rack: Option<String>,
    pub metrics_listen: Option<SocketAddr>,
    pub cluster_secret_file: Option<PathBuf>,
    pub auth_tokens_file: Option<PathBuf>,
    /// Longest SIGTERM drain, in milliseconds, 100 to 3600000.
    pub drain_timeout_ms: u64,
    pub zookeeper: ZooKeeperConfig,
    pub streams: quire_proxy::StreamSettings,
    pub server: quire_proxy::ServerSettings,
    pub limits: quire_proxy::LimitSettings,
    pub tls: ServerTlsSettings,
    pub bookie_tls: ClientTlsSettings,
    /// Placement of new ensembles and replacements.
    pub ledger: quire_ledger::placement::PlacementSettings,
}

impl Default for ProxyFile {
    fn default() -> Self {
        Self {
            listen: None,
            advertised: None,
            region: None,
            rack: None,
            metrics_listen: None,
            cluster_secret_file: None,
            auth_tokens_file: None,
            drain_timeout_ms: 30_000,
            zookeeper: ZooKeeperConfig::default(),
            streams: Default::default(),
            server: Default::default(),
            limits: Default::default(),
            tls: Default::default(),
            bookie_tls: Default::default(),
            ledger: Default::default(),
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
    /// Placement of the replacements re-replication and decommission choose.
    pub ledger: quire_ledger::placement::PlacementSettings,
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
        Some(text) => {
            let (text, moved) = upgrade(text, keys, path)?;
            let file = parse_toml(&text, path)?;
            // Only once the file is good, so that an error stays one line.
            for line in moved {
                tracing::warn!("{line}");
            }
            file
        }
        None => T::default(),
    };
    let mut value = toml::Value::try_from(&file)?;
    let toml::Value::Table(given) = toml::Value::try_from(flags)? else {
        bail!("flags are not a table");
    };
    for (flag, v) in given {
        let path = keys
            .iter()
            .find(|k| k.flag == flag)
            .map_or(flag.as_str(), |k| k.path.as_str());
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
fn upgrade(text: &str, keys: &[Key], path: &Path) -> Result<(String, Vec<String>)> {
    let table: toml::Table = parse_toml(text, path)?;
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let mut moved = Vec::new();
    let header = lines
        .iter()
        .position(|l| l.trim_start().starts_with('['))
        .unwrap_or(lines.len());
    for (name, value) in &table {
        let Some(Key { path: new, old, .. }) = keys.iter().find(|k| k.flag == name) else {
            continue;
        };
        if *old == Old::Same || (name == "zookeeper" && value.is_table()) {
            continue;
        }
        let (t, key) = new.split_once('.').context("moved key without a table")?;
        let file = path.display();
        if *old == Old::Refuse || table.get(t).is_some_and(toml::Value::is_table) {
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
        moved.push(format!(
            "config file {file}: key {name} is read as {key} in the [{t}] table; write it there"
        ));
    }
    Ok((lines.join("\n"), moved))
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
pub fn named(e: impl Into<ConfigError>, table: &str, keys: &[Key]) -> anyhow::Error {
    let e = e.into();
    let e = if table.is_empty() {
        e
    } else {
        e.in_table(table)
    };
    match keys.iter().find(|k| k.path == e.key) {
        Some(k) if e.missing => anyhow!(
            "{e} (in the config file, or with --{})",
            k.flag.replace('_', "-")
        ),
        _ => anyhow!("{e}"),
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

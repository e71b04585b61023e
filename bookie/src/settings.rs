//! The bookie's keys in its config file, the `[bookie]` table ([`BookieSettings`]), in file
//! units. Defaults come from [`BookieConfig::new`] and the `*_DEFAULT` constants it uses, the
//! one place each is written; the engine's own keys are the `[engine]` and `[compaction]`
//! tables of quire-engine ([`quire_engine::EngineSettings`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use quire_engine::ConfigError;
use serde::{Deserialize, Serialize};

use crate::{disk, BookieConfig, SHARDS_MAX};

/// Shards of a bookie started from a config file when `shards` is not given. (The programmatic
/// [`BookieConfig::new`] takes one per CPU; a configured bookie asks for more explicitly, since
/// each shard pre-writes its own journal files.)
pub const SHARDS_DEFAULT: usize = 1;

/// The `[bookie]` table: each key sets the [`BookieConfig`] field named in its doc.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BookieSettings {
    /// [`BookieConfig::journal_dir`] (one subdirectory per shard). Required.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal_dir: Option<PathBuf>,
    /// [`BookieConfig::ledger_dir`]: entry logs and index (one subdirectory per shard).
    /// Required, and not the journal directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger_dir: Option<PathBuf>,
    /// [`BookieConfig::shards`], 1 to 65535 (glommio executors, one engine each).
    pub shards: usize,
    /// [`BookieConfig::io_memory_bytes`], glommio io_memory per shard, at least 65536.
    pub io_memory_bytes: usize,
    /// [`BookieConfig::cpu_set`]: CPUs to pin the shards to (shard i on the (i mod n)-th); no
    /// CPU twice, each one this process may run on. Unset: unpinned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_set: Option<Vec<usize>>,
    /// [`BookieConfig::gc_interval`] in seconds (BookKeeper `gcWaitTime`; 0 disables).
    pub gc_interval_secs: u64,
    /// [`BookieConfig::disk_usage_threshold`], a fraction in (0, 1] (BookKeeper
    /// `diskUsageThreshold`).
    pub disk_usage_threshold: f64,
    /// [`BookieConfig::disk_usage_lwm_threshold`], a fraction in (0, disk_usage_threshold]
    /// (BookKeeper `diskUsageLwmThreshold`). Unset: the default low-water mark, or
    /// `disk_usage_threshold` when that is lower.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_usage_lwm_threshold: Option<f64>,
    /// [`BookieConfig::disk_check_interval`] in milliseconds, at least 1 (BookKeeper
    /// `diskCheckInterval`).
    pub disk_check_interval_ms: u64,
    /// [`BookieConfig::handshake_timeout`] in milliseconds, 100 to 600000.
    pub handshake_timeout_ms: u64,
    /// [`BookieConfig::idle_timeout`] in seconds, 1 to 86400.
    pub idle_timeout_secs: u64,
    /// [`BookieConfig::connections_max`], at least 1.
    pub connections_max: usize,
    /// [`BookieConfig::connections_per_ip_max`], at least 1 (Kafka
    /// `max.connections.per.ip`).
    pub connections_per_ip_max: usize,
    /// [`BookieConfig::request_pool_bytes`], at least the frame limit (Kafka
    /// `queued.max.request.bytes`).
    pub request_pool_bytes: usize,
    /// [`BookieConfig::frame_timeout`] in milliseconds, 100 to 3600000.
    pub frame_timeout_ms: u64,
    /// [`crate::ScrubConfig::enabled`]: whether every shard scrubs its index and entry logs.
    pub scrub_enabled: bool,
    /// [`crate::ScrubConfig::interval`] in seconds, at least 1 (BookKeeper
    /// `localScrubPeriod`).
    pub scrub_interval_secs: u64,
    /// [`crate::ScrubConfig::rate_bytes_per_sec`]: entry-log bytes a scrub pass reads per
    /// second on each shard; 0 is unpaced (BookKeeper `localScrubRateLimit`, in entries).
    pub scrub_rate_bytes_per_sec: u64,
}

impl Default for BookieSettings {
    fn default() -> Self {
        let c = BookieConfig::new(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            PathBuf::new(),
            PathBuf::new(),
        );
        Self {
            journal_dir: None,
            ledger_dir: None,
            shards: SHARDS_DEFAULT,
            io_memory_bytes: c.io_memory_bytes,
            cpu_set: None,
            gc_interval_secs: c.gc_interval.as_secs(),
            disk_usage_threshold: c.disk_usage_threshold,
            disk_usage_lwm_threshold: None,
            disk_check_interval_ms: ms(c.disk_check_interval),
            handshake_timeout_ms: ms(c.handshake_timeout),
            idle_timeout_secs: c.idle_timeout.as_secs(),
            connections_max: c.connections_max,
            connections_per_ip_max: c.connections_per_ip_max,
            request_pool_bytes: c.request_pool_bytes,
            frame_timeout_ms: ms(c.frame_timeout),
            scrub_enabled: c.scrub.enabled,
            scrub_interval_secs: c.scrub.interval.as_secs(),
            scrub_rate_bytes_per_sec: c.scrub.rate_bytes_per_sec,
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn in_range(key: &str, v: u64, range: std::ops::RangeInclusive<u64>) -> Result<(), ConfigError> {
    if !range.contains(&v) {
        let expected = match *range.end() {
            u64::MAX => format!("expected at least {}", range.start()),
            end => format!("expected {} to {end}", range.start()),
        };
        return Err(ConfigError::invalid(key, v, expected));
    }
    Ok(())
}

impl BookieSettings {
    /// The low-water mark in effect: the key, or the default one capped at
    /// `disk_usage_threshold` (a lower threshold keeps BookKeeper's gap when it can).
    pub fn disk_usage_lwm(&self) -> f64 {
        self.disk_usage_lwm_threshold.unwrap_or_else(|| {
            disk::DISK_USAGE_LWM_THRESHOLD_DEFAULT.min(self.disk_usage_threshold)
        })
    }

    /// Checks every key except the two required directories (see
    /// [`BookieSettings::to_config`]); errors name the key within the table.
    ///
    /// # Errors
    /// A value outside its range (see each key).
    pub fn validate(&self) -> Result<(), ConfigError> {
        in_range("shards", self.shards as u64, 1..=SHARDS_MAX as u64)?;
        if self.io_memory_bytes < 64 * 1024 {
            return Err(ConfigError::invalid(
                "io_memory_bytes",
                self.io_memory_bytes,
                "expected at least 65536",
            ));
        }
        if let Some(cpus) = &self.cpu_set {
            check_cpu_set(cpus)?;
        }
        let t = self.disk_usage_threshold;
        if !(t > 0.0 && t <= 1.0) {
            return Err(ConfigError::invalid(
                "disk_usage_threshold",
                t,
                "expected a fraction in (0, 1], e.g. 0.95",
            ));
        }
        let l = self.disk_usage_lwm();
        if !(l > 0.0 && l <= t) {
            return Err(ConfigError::invalid(
                "disk_usage_lwm_threshold",
                l,
                format!("expected a fraction in (0, disk_usage_threshold = {t}]"),
            ));
        }
        in_range(
            "disk_check_interval_ms",
            self.disk_check_interval_ms,
            1..=u64::MAX,
        )?;
        in_range(
            "handshake_timeout_ms",
            self.handshake_timeout_ms,
            100..=600_000,
        )?;
        in_range("idle_timeout_secs", self.idle_timeout_secs, 1..=86_400)?;
        in_range("connections_max", self.connections_max as u64, 1..=u64::MAX)?;
        in_range(
            "connections_per_ip_max",
            self.connections_per_ip_max as u64,
            1..=u64::MAX,
        )?;
        let frame = quire_wire::frame::FRAME_SIZE_BYTES_MAX_DEFAULT as usize;
        if self.request_pool_bytes < frame {
            return Err(ConfigError::invalid(
                "request_pool_bytes",
                self.request_pool_bytes,
                format!("expected at least the frame limit, {frame}"),
            ));
        }
        in_range("frame_timeout_ms", self.frame_timeout_ms, 100..=3_600_000)?;
        in_range(
            "scrub_interval_secs",
            self.scrub_interval_secs,
            1..=u64::MAX,
        )?;
        Ok(())
    }

    /// Checks every key and builds the configuration of a bookie listening on `listen`; the
    /// engine keeps [`quire_engine::EngineConfig::new`]'s values until the `[engine]` and
    /// `[compaction]` tables are applied to `config.engine`.
    ///
    /// # Errors
    /// As [`BookieSettings::validate`], and a missing `journal_dir` or `ledger_dir`, one that
    /// cannot be made absolute, or both the same directory.
    pub fn to_config(&self, listen: SocketAddr) -> Result<BookieConfig, ConfigError> {
        self.validate()?;
        let dir = |key: &str, d: &Option<PathBuf>| {
            let d = d
                .as_ref()
                .ok_or_else(|| ConfigError::missing(key, "the directory is required"))?;
            std::path::absolute(d)
                .map_err(|e| ConfigError::invalid(key, d.display(), e.to_string()))
        };
        let journal_dir = dir("journal_dir", &self.journal_dir)?;
        let ledger_dir = dir("ledger_dir", &self.ledger_dir)?;
        if journal_dir == ledger_dir {
            return Err(ConfigError::invalid(
                "ledger_dir",
                ledger_dir.display(),
                "journal_dir is the same directory; they must differ",
            ));
        }
        let mut c = BookieConfig::new(listen, journal_dir, ledger_dir);
        c.shards = self.shards;
        c.io_memory_bytes = self.io_memory_bytes;
        c.cpu_set = self.cpu_set.clone().unwrap_or_default();
        c.gc_interval = Duration::from_secs(self.gc_interval_secs);
        c.disk_usage_threshold = self.disk_usage_threshold;
        c.disk_usage_lwm_threshold = self.disk_usage_lwm();
        c.disk_check_interval = Duration::from_millis(self.disk_check_interval_ms);
        c.handshake_timeout = Duration::from_millis(self.handshake_timeout_ms);
        c.idle_timeout = Duration::from_secs(self.idle_timeout_secs);
        c.connections_max = self.connections_max;
        c.connections_per_ip_max = self.connections_per_ip_max;
        c.request_pool_bytes = self.request_pool_bytes;
        c.frame_timeout = Duration::from_millis(self.frame_timeout_ms);
        c.scrub.enabled = self.scrub_enabled;
        c.scrub.interval = Duration::from_secs(self.scrub_interval_secs);
        c.scrub.rate_bytes_per_sec = self.scrub_rate_bytes_per_sec;
        Ok(c)
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

/// Checks a `cpu_set` key: non-empty, no CPU twice, every CPU one this process may run on (so
/// that a typo fails at start naming the key, not as a shard that cannot start).
///
/// # Errors
/// An empty list, a repeated CPU, a CPU outside this process's affinity mask.
pub fn check_cpu_set(cpus: &[usize]) -> Result<(), ConfigError> {
    let shown = format!("{cpus:?}");
    if cpus.is_empty() {
        return Err(ConfigError::invalid(
            "cpu_set",
            shown,
            "list at least one CPU, or leave it out to run unpinned",
        ));
    }
    let allowed = allowed_cpus();
    for (i, c) in cpus.iter().enumerate() {
        if cpus[..i].contains(c) {
            return Err(ConfigError::invalid(
                "cpu_set",
                shown,
                format!("CPU {c} is listed twice"),
            ));
        }
        if let Some(allowed) = &allowed {
            if !allowed.contains(c) {
                return Err(ConfigError::invalid(
                    "cpu_set",
                    shown,
                    format!("CPU {c} is not available to this process (available: {allowed:?})"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_default_to_the_bookie_config() {
        // Goal: the file defaults are BookieConfig::new's (shards aside), written once there.
        let listen = SocketAddr::from(([127, 0, 0, 1], 1));
        let s = BookieSettings {
            journal_dir: Some("/j".into()),
            ledger_dir: Some("/l".into()),
            ..Default::default()
        };
        let mut want = BookieConfig::new(listen, "/j".into(), "/l".into());
        want.shards = SHARDS_DEFAULT;
        assert_eq!(
            format!("{:?}", s.to_config(listen).unwrap()),
            format!("{want:?}")
        );
    }

    #[test]
    fn bad_values_name_the_key() {
        let s = BookieSettings {
            shards: SHARDS_MAX + 1,
            ..Default::default()
        };
        assert_eq!(
            s.validate().unwrap_err().in_table("bookie").to_string(),
            "invalid setting bookie.shards = 65536: expected 1 to 65535"
        );
        let e = BookieSettings::default()
            .to_config(SocketAddr::from(([127, 0, 0, 1], 1)))
            .unwrap_err();
        assert!(e.missing && e.key == "journal_dir", "{e}");
    }
}

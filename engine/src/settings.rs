//! The engine's keys in a bookie's config file: the `[engine]` table ([`EngineSettings`]) and
//! the `[compaction]` table ([`CompactionSettings`]), in file units (bytes, whole
//! milliseconds, microseconds or seconds). Their defaults are read from
//! [`EngineConfig::new`], the one place each engine default is written.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::EngineConfig;

pub use quire_config::ConfigError;

/// Smallest accepted `journal_file_size_bytes`: a header block and one record block.
pub const JOURNAL_FILE_SIZE_BYTES_MIN: u64 = 8 * 1024;
/// Smallest accepted `journal_queue_bytes_max` (64 KiB): the queue admits an add while it holds
/// at most this many bytes, so a smaller bound only turns group commit into one add per write.
pub const JOURNAL_QUEUE_BYTES_MIN: u64 = 64 * 1024;
/// Smallest accepted `index_cache_bytes_max`: sixteen 4 KiB index blocks.
pub const INDEX_CACHE_BYTES_MIN: u64 = 64 * 1024;
/// Smallest accepted `entry_log_size_bytes`: the 4 KiB header and three 4 KiB blocks, since
/// every checkpoint starts at a fresh 4 KiB boundary (docs/format/entry-log.md).
pub const ENTRY_LOG_SIZE_BYTES_MIN: u64 = 16 * 1024;

/// The `[engine]` table: each key sets the [`EngineConfig`] field named in its doc.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineSettings {
    /// [`EngineConfig::journal_file_size_bytes`], at least 8192.
    pub journal_file_size_bytes: u64,
    /// [`EngineConfig::journal_reuse_files`] (BookKeeper `journalReuseFiles`; 0 turns reuse
    /// off).
    pub journal_reuse_files: usize,
    /// [`EngineConfig::group_commit_wait_max`] in microseconds, at most 1000000 (BookKeeper
    /// `journalMaxGroupWaitMSec`).
    pub group_commit_wait_us: u64,
    /// [`EngineConfig::journal_queue_bytes_max`], at least 65536 (BookKeeper
    /// `journalQueueSize`).
    pub journal_queue_bytes_max: u64,
    /// [`EngineConfig::entry_log_readers_max`], at least 1 (BookKeeper `openFileLimit`).
    pub entry_log_readers_max: usize,
    /// [`EngineConfig::entry_log_size_bytes_max`], at least 16384 (BookKeeper
    /// `logSizeLimit`).
    pub entry_log_size_bytes: u64,
    /// [`EngineConfig::entry_log_roll_floor_bytes`] (0 turns the roll off).
    pub entry_log_roll_floor_bytes: u64,
    /// [`EngineConfig::checkpoint_interval`] in milliseconds, 10 to 3600000 (BookKeeper
    /// `flushInterval`).
    pub checkpoint_interval_ms: u64,
    /// [`EngineConfig::index_cache_bytes_max`], at least 65536 (BookKeeper
    /// `dbStorage_rocksDB_blockCacheSize`).
    pub index_cache_bytes_max: u64,
    /// [`EngineConfig::space_reserve_bytes`] (0 turns the reserve off).
    pub space_reserve_bytes: u64,
}

impl Default for EngineSettings {
    fn default() -> Self {
        let c = EngineConfig::new(PathBuf::new(), PathBuf::new());
        Self {
            journal_file_size_bytes: c.journal_file_size_bytes,
            journal_reuse_files: c.journal_reuse_files,
            group_commit_wait_us: u64::try_from(c.group_commit_wait_max.as_micros())
                .unwrap_or(u64::MAX),
            journal_queue_bytes_max: c.journal_queue_bytes_max as u64,
            entry_log_readers_max: c.entry_log_readers_max,
            entry_log_size_bytes: c.entry_log_size_bytes_max,
            entry_log_roll_floor_bytes: c.entry_log_roll_floor_bytes,
            checkpoint_interval_ms: u64::try_from(c.checkpoint_interval.as_millis())
                .unwrap_or(u64::MAX),
            index_cache_bytes_max: c.index_cache_bytes_max as u64,
            space_reserve_bytes: c.space_reserve_bytes,
        }
    }
}

fn at_least(key: &str, v: u64, min: u64) -> Result<(), ConfigError> {
    if v < min {
        return Err(ConfigError::invalid(
            key,
            v,
            format!("expected at least {min}"),
        ));
    }
    Ok(())
}

impl EngineSettings {
    /// Checks every key; errors name the key within the table.
    ///
    /// # Errors
    /// A value below its minimum or outside its range (see each key).
    pub fn validate(&self) -> Result<(), ConfigError> {
        at_least(
            "journal_file_size_bytes",
            self.journal_file_size_bytes,
            JOURNAL_FILE_SIZE_BYTES_MIN,
        )?;
        if self.group_commit_wait_us > 1_000_000 {
            return Err(ConfigError::invalid(
                "group_commit_wait_us",
                self.group_commit_wait_us,
                "expected at most 1000000",
            ));
        }
        at_least(
            "journal_queue_bytes_max",
            self.journal_queue_bytes_max,
            JOURNAL_QUEUE_BYTES_MIN,
        )?;
        at_least(
            "entry_log_readers_max",
            self.entry_log_readers_max as u64,
            1,
        )?;
        at_least(
            "entry_log_size_bytes",
            self.entry_log_size_bytes,
            ENTRY_LOG_SIZE_BYTES_MIN,
        )?;
        if !(10..=3_600_000).contains(&self.checkpoint_interval_ms) {
            return Err(ConfigError::invalid(
                "checkpoint_interval_ms",
                self.checkpoint_interval_ms,
                "expected 10 to 3600000",
            ));
        }
        at_least(
            "index_cache_bytes_max",
            self.index_cache_bytes_max,
            INDEX_CACHE_BYTES_MIN,
        )?;
        Ok(())
    }

    /// Writes the keys into `engine` (call [`EngineSettings::validate`] first).
    pub fn apply(&self, engine: &mut EngineConfig) {
        engine.journal_file_size_bytes = self.journal_file_size_bytes;
        engine.journal_reuse_files = self.journal_reuse_files;
        engine.group_commit_wait_max = Duration::from_micros(self.group_commit_wait_us);
        engine.journal_queue_bytes_max =
            usize::try_from(self.journal_queue_bytes_max).unwrap_or(usize::MAX);
        engine.entry_log_readers_max = self.entry_log_readers_max;
        engine.entry_log_size_bytes_max = self.entry_log_size_bytes;
        engine.entry_log_roll_floor_bytes = self.entry_log_roll_floor_bytes;
        engine.checkpoint_interval = Duration::from_millis(self.checkpoint_interval_ms);
        engine.index_cache_bytes_max =
            usize::try_from(self.index_cache_bytes_max).unwrap_or(usize::MAX);
        engine.space_reserve_bytes = self.space_reserve_bytes;
    }
}

/// The `[compaction]` table (BookKeeper `minorCompactionThreshold`, `minorCompactionInterval`,
/// `majorCompactionThreshold`, `majorCompactionInterval`): entry logs whose live fraction is
/// below a threshold are rewritten by the GC loop once that compaction is due.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompactionSettings {
    /// [`EngineConfig::minor_compaction_threshold`], a fraction from 0 to 1, below the major
    /// one.
    pub minor_threshold: f64,
    /// [`EngineConfig::minor_compaction_interval`] in seconds; 0 disables.
    pub minor_interval_secs: u64,
    /// [`EngineConfig::major_compaction_threshold`], a fraction from 0 to 1.
    pub major_threshold: f64,
    /// [`EngineConfig::major_compaction_interval`] in seconds; 0 disables.
    pub major_interval_secs: u64,
}

impl Default for CompactionSettings {
    fn default() -> Self {
        let c = EngineConfig::new(PathBuf::new(), PathBuf::new());
        Self {
            minor_threshold: c.minor_compaction_threshold,
            minor_interval_secs: c.minor_compaction_interval.as_secs(),
            major_threshold: c.major_compaction_threshold,
            major_interval_secs: c.major_compaction_interval.as_secs(),
        }
    }
}

impl CompactionSettings {
    /// Checks every key; errors name the key within the table.
    ///
    /// # Errors
    /// A threshold outside [0, 1] or not a number, a minor threshold not below the major one
    /// (BookKeeper's rule).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, v) in [
            ("minor_threshold", self.minor_threshold),
            ("major_threshold", self.major_threshold),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(ConfigError::invalid(
                    key,
                    v,
                    "expected a fraction from 0 to 1",
                ));
            }
        }
        if self.minor_threshold >= self.major_threshold {
            return Err(ConfigError::invalid(
                "minor_threshold",
                self.minor_threshold,
                format!(
                    "the minor threshold must be below the major one (major_threshold = {})",
                    self.major_threshold
                ),
            ));
        }
        Ok(())
    }

    /// Writes the keys into `engine` (call [`CompactionSettings::validate`] first).
    pub fn apply(&self, engine: &mut EngineConfig) {
        engine.minor_compaction_threshold = self.minor_threshold;
        engine.minor_compaction_interval = Duration::from_secs(self.minor_interval_secs);
        engine.major_compaction_threshold = self.major_threshold;
        engine.major_compaction_interval = Duration::from_secs(self.major_interval_secs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_default_to_the_engine_config_and_apply_back() {
        // Goal: the file defaults are EngineConfig::new's, written once there; applying the
        // defaults changes nothing.
        let base = EngineConfig::new(PathBuf::new(), PathBuf::new());
        let mut c = base.clone();
        EngineSettings::default().apply(&mut c);
        CompactionSettings::default().apply(&mut c);
        assert_eq!(format!("{c:?}"), format!("{base:?}"));
        EngineSettings::default().validate().unwrap();
        CompactionSettings::default().validate().unwrap();
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = EngineSettings {
            checkpoint_interval_ms: 0,
            ..Default::default()
        };
        let e = e.validate().unwrap_err().in_table("engine");
        assert_eq!(
            e.to_string(),
            "invalid setting engine.checkpoint_interval_ms = 0: expected 10 to 3600000"
        );
        let c = CompactionSettings {
            minor_threshold: 0.9,
            ..Default::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("must be below the major one"));
    }
}

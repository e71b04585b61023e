//! The proxy's keys in its config file, in file units: the `[streams]` table
//! ([`StreamSettings`], the stream layer) and the `[server]` table ([`ServerSettings`], the
//! proxy port's bounds). Defaults come from [`StreamConfig::default`] and
//! [`ServerConfig::default`], the one place each is written.

use std::time::Duration;

use quire_metadata::ConfigError;
use serde::{Deserialize, Serialize};

use crate::{ServerConfig, StreamConfig};
use quire_client::record_set::RECORD_SET_HEADER_SIZE_BYTES;
use quire_client::ENTRY_SIZE_BYTES_MAX;

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The `[streams]` table: each key sets the [`StreamConfig`] field named in its doc.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StreamSettings {
    /// [`StreamConfig::ensemble_size`] E of new segments' ledgers.
    pub ensemble_size: u8,
    /// [`StreamConfig::write_quorum`] Qw.
    pub write_quorum: u8,
    /// [`StreamConfig::ack_quorum`] Qa; E >= Qw >= Qa >= 1 (BookKeeper's rule).
    pub ack_quorum: u8,
    /// [`StreamConfig::segment_size_bytes_max`], at least 1.
    pub segment_size_bytes: u64,
    /// [`StreamConfig::entry_size_bytes_target`], more than the record-set header
    /// ([`RECORD_SET_HEADER_SIZE_BYTES`]) and at most [`ENTRY_SIZE_BYTES_MAX`].
    pub entry_size_bytes: usize,
    /// [`StreamConfig::segment_roll_interval`] in seconds (DistributedLog's
    /// `logSegmentRollingIntervalMinutes`); 0 turns time rolling off.
    pub segment_roll_secs: u64,
    /// [`StreamConfig::segment_roll_overshoot_bytes_max`].
    pub segment_roll_overshoot_bytes: u64,
    /// [`StreamConfig::segment_roll_overshoot_time_max`] in seconds.
    pub segment_roll_overshoot_secs: u64,
    /// [`StreamConfig::retention_time`] in seconds, 1 to 100 years (DistributedLog
    /// `retentionPeriodHours`). Unset: kept forever.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_time_secs: Option<u64>,
    /// [`StreamConfig::retention_size_bytes`], 1 to 2^60. Unset: no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_size_bytes: Option<u64>,
    /// [`StreamConfig::lifecycle_sweep_interval`] in seconds, at most 86400; 0 turns it off.
    pub lifecycle_sweep_secs: u64,
    /// [`StreamConfig::txid_jump_max`], the txid guard; 0 turns it off.
    pub txid_jump_max: u64,
    /// [`StreamConfig::compression`]: `"none"` (the default) or `"lz4"`.
    pub compression: quire_client::compression::Compression,
    /// [`StreamConfig::subscriptions_per_stream_max`], at least 1.
    pub subscriptions_per_stream_max: usize,
    /// [`StreamConfig::owned_streams_max`]; 0 (the default) is no limit.
    pub owned_streams_max: usize,
    /// [`StreamConfig::follower_reads`] (default on).
    pub follower_reads: bool,
    /// [`StreamConfig::follower_cache_bytes_max`], 64 KiB to 1 GiB.
    pub follower_cache_bytes_max: usize,
    /// [`StreamConfig::follower_idle_timeout`] in seconds, 1 to 86400.
    pub follower_idle_timeout_secs: u64,
    /// [`StreamConfig::balance_moves_per_sec`], 0 (off) to 10000.
    pub balance_moves_per_sec: u32,
    /// [`StreamConfig::balance_load_threshold_percent`], 0 (off) or 110 to 1000.
    pub balance_load_threshold_percent: u32,
    /// [`StreamConfig::speculative_read_timeout`] in milliseconds, 0 (off) to 60000.
    pub speculative_read_timeout_ms: u64,
    /// [`StreamConfig::max_speculative_read_timeout`] in milliseconds, from
    /// `speculative_read_timeout_ms` (at least 1) to 60000.
    pub max_speculative_read_timeout_ms: u64,
}

impl Default for StreamSettings {
    fn default() -> Self {
        let c = StreamConfig::default();
        Self {
            ensemble_size: c.ensemble_size,
            write_quorum: c.write_quorum,
            ack_quorum: c.ack_quorum,
            segment_size_bytes: c.segment_size_bytes_max,
            entry_size_bytes: c.entry_size_bytes_target,
            segment_roll_secs: c.segment_roll_interval.map_or(0, |d| d.as_secs()),
            segment_roll_overshoot_bytes: c.segment_roll_overshoot_bytes_max,
            segment_roll_overshoot_secs: c.segment_roll_overshoot_time_max.as_secs(),
            retention_time_secs: c.retention_time.map(|d| d.as_secs()),
            retention_size_bytes: c.retention_size_bytes,
            lifecycle_sweep_secs: c.lifecycle_sweep_interval.map_or(0, |d| d.as_secs()),
            txid_jump_max: c.txid_jump_max.unwrap_or(0),
            compression: c.compression,
            subscriptions_per_stream_max: c.subscriptions_per_stream_max,
            owned_streams_max: c.owned_streams_max.unwrap_or(0),
            follower_reads: c.follower_reads,
            follower_cache_bytes_max: c.follower_cache_bytes_max,
            follower_idle_timeout_secs: c.follower_idle_timeout.as_secs(),
            balance_moves_per_sec: c.balance_moves_per_sec,
            balance_load_threshold_percent: c.balance_load_threshold_percent,
            speculative_read_timeout_ms: ms(c.speculative_read_timeout),
            max_speculative_read_timeout_ms: ms(c.max_speculative_read_timeout),
        }
    }
}

impl StreamSettings {
    /// Checks every key; errors name the key within the table.
    ///
    /// # Errors
    /// A quorum breaking E >= Qw >= Qa >= 1, a segment or entry size out of range, a
    /// retention of 0 or above its maximum, a sweep interval above a day, a follower cache or
    /// idle timeout out of range, a balance rate above 10000, a load threshold other than 0
    /// or 110 to 1000.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let (e, w, a) = (self.ensemble_size, self.write_quorum, self.ack_quorum);
        if !(e >= w && w >= a && a >= 1) {
            return Err(ConfigError::invalid(
                "ensemble_size",
                format!("{e}, write_quorum = {w}, ack_quorum = {a}"),
                "need E >= Qw >= Qa >= 1",
            ));
        }
        if self.segment_size_bytes == 0 {
            return Err(ConfigError::invalid(
                "segment_size_bytes",
                0,
                "expected at least 1",
            ));
        }
        // An entry must hold its record-set header and some record bytes: the stream manager
        // refuses a smaller target (an assertion), so it is checked here, where it is one line.
        if self.entry_size_bytes <= RECORD_SET_HEADER_SIZE_BYTES
            || self.entry_size_bytes > ENTRY_SIZE_BYTES_MAX
        {
            return Err(ConfigError::invalid(
                "entry_size_bytes",
                self.entry_size_bytes,
                format!(
                    "expected {} to {ENTRY_SIZE_BYTES_MAX}",
                    RECORD_SET_HEADER_SIZE_BYTES + 1
                ),
            ));
        }
        if let Some(v) = self.retention_time_secs {
            quire_client::check_retention_time_secs(v)
                .map_err(|e| ConfigError::invalid("retention_time_secs", v, e))?;
        }
        if let Some(v) = self.retention_size_bytes {
            quire_client::check_retention_size_bytes(v)
                .map_err(|e| ConfigError::invalid("retention_size_bytes", v, e))?;
        }
        if self.lifecycle_sweep_secs > 86_400 {
            return Err(ConfigError::invalid(
                "lifecycle_sweep_secs",
                self.lifecycle_sweep_secs,
                "expected 0 (off) to 86400",
            ));
        }
        if self.subscriptions_per_stream_max == 0 {
            return Err(ConfigError::invalid(
                "subscriptions_per_stream_max",
                0,
                "expected at least 1",
            ));
        }
        if !(64 * 1024..=1 << 30).contains(&self.follower_cache_bytes_max) {
            return Err(ConfigError::invalid(
                "follower_cache_bytes_max",
                self.follower_cache_bytes_max,
                "expected 65536 to 1073741824",
            ));
        }
        if !(1..=86_400).contains(&self.follower_idle_timeout_secs) {
            return Err(ConfigError::invalid(
                "follower_idle_timeout_secs",
                self.follower_idle_timeout_secs,
                "expected 1 to 86400",
            ));
        }
        if self.balance_moves_per_sec > 10_000 {
            return Err(ConfigError::invalid(
                "balance_moves_per_sec",
                self.balance_moves_per_sec,
                "expected 0 (off) to 10000",
            ));
        }
        // At or below 100 % the dead band between T and 100/T is empty: weights would swing.
        let t = self.balance_load_threshold_percent;
        if t != 0 && !(110..=1000).contains(&t) {
            return Err(ConfigError::invalid(
                "balance_load_threshold_percent",
                t,
                "expected 0 (off) or 110 to 1000",
            ));
        }
        self.validate_speculative_reads()
    }

    /// The speculative read keys: the floor 0 (off) to 60000 ms, the maximum from the floor
    /// (at least 1) to 60000 ms.
    fn validate_speculative_reads(&self) -> Result<(), ConfigError> {
        let (floor, max) = (
            self.speculative_read_timeout_ms,
            self.max_speculative_read_timeout_ms,
        );
        if floor > 60_000 {
            return Err(ConfigError::invalid(
                "speculative_read_timeout_ms",
                floor,
                "expected 0 (off) to 60000",
            ));
        }
        if max < floor.max(1) || max > 60_000 {
            return Err(ConfigError::invalid(
                "max_speculative_read_timeout_ms",
                max,
                format!("expected speculative_read_timeout_ms ({floor}) to 60000, and at least 1"),
            ));
        }
        Ok(())
    }

    /// Writes the keys into `c` (call [`StreamSettings::validate`] first).
    pub fn apply(&self, c: &mut StreamConfig) {
        let secs = |s: u64| (s > 0).then(|| Duration::from_secs(s));
        c.ensemble_size = self.ensemble_size;
        c.write_quorum = self.write_quorum;
        c.ack_quorum = self.ack_quorum;
        c.segment_size_bytes_max = self.segment_size_bytes;
        c.entry_size_bytes_target = self.entry_size_bytes;
        c.segment_roll_interval = secs(self.segment_roll_secs);
        c.segment_roll_overshoot_bytes_max = self.segment_roll_overshoot_bytes;
        c.segment_roll_overshoot_time_max = Duration::from_secs(self.segment_roll_overshoot_secs);
        c.retention_time = self.retention_time_secs.map(Duration::from_secs);
        c.retention_size_bytes = self.retention_size_bytes;
        c.lifecycle_sweep_interval = secs(self.lifecycle_sweep_secs);
        c.txid_jump_max = (self.txid_jump_max > 0).then_some(self.txid_jump_max);
        c.compression = self.compression;
        c.subscriptions_per_stream_max = self.subscriptions_per_stream_max;
        c.owned_streams_max = (self.owned_streams_max > 0).then_some(self.owned_streams_max);
        c.follower_reads = self.follower_reads;
        c.follower_cache_bytes_max = self.follower_cache_bytes_max;
        c.follower_idle_timeout = Duration::from_secs(self.follower_idle_timeout_secs);
        c.balance_moves_per_sec = self.balance_moves_per_sec;
        c.balance_load_threshold_percent = self.balance_load_threshold_percent;
        c.speculative_read_timeout = Duration::from_millis(self.speculative_read_timeout_ms);
        c.max_speculative_read_timeout =
            Duration::from_millis(self.max_speculative_read_timeout_ms);
    }
}

/// The `[server]` table: the proxy port's bounds (docs/proxy-protocol.md, "Memory bounds",
/// "Connection limits and timeouts"); each key sets the [`ServerConfig`] field named in its
/// doc.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// [`ServerConfig::request_pool_bytes`], at least the frame limit (Kafka
    /// `queued.max.request.bytes`).
    pub request_pool_bytes: usize,
    /// [`ServerConfig::frame_timeout`] in milliseconds, 100 to 3600000.
    pub frame_timeout_ms: u64,
    /// [`ServerConfig::connection_response_bytes_max`], at least the frame limit.
    pub connection_response_bytes_max: usize,
    /// [`ServerConfig::response_bytes_max`], at least the frame limit.
    pub response_bytes_max: usize,
    /// [`ServerConfig::send_timeout`] in milliseconds, 100 to 3600000.
    pub send_timeout_ms: u64,
    /// [`ServerConfig::pressure_send_timeout`] in milliseconds, 100 to 3600000.
    pub pressure_send_timeout_ms: u64,
    /// [`ServerConfig::connections_per_ip_max`], at least 1 (Kafka `max.connections.per.ip`).
    pub connections_per_ip_max: usize,
    /// [`ServerConfig::handshakes_max`], at least 1.
    pub handshakes_max: usize,
}

impl Default for ServerSettings {
    fn default() -> Self {
        let c = ServerConfig::default();
        Self {
            request_pool_bytes: c.request_pool_bytes,
            frame_timeout_ms: ms(c.frame_timeout),
            connection_response_bytes_max: c.connection_response_bytes_max,
            response_bytes_max: c.response_bytes_max,
            send_timeout_ms: ms(c.send_timeout),
            pressure_send_timeout_ms: ms(c.pressure_send_timeout),
            connections_per_ip_max: c.connections_per_ip_max,
            handshakes_max: c.handshakes_max,
        }
    }
}

impl ServerSettings {
    /// Checks every key; errors name the key within the table.
    ///
    /// # Errors
    /// A byte bound below the frame limit, a time outside 100 ms to 1 h, a count of 0.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let frame = ServerConfig::default().frame_size_bytes_max as usize;
        for (key, n) in [
            ("request_pool_bytes", self.request_pool_bytes),
            (
                "connection_response_bytes_max",
                self.connection_response_bytes_max,
            ),
            ("response_bytes_max", self.response_bytes_max),
        ] {
            if n < frame {
                return Err(ConfigError::invalid(
                    key,
                    n,
                    format!("expected at least the frame limit, {frame}"),
                ));
            }
        }
        for (key, v) in [
            ("frame_timeout_ms", self.frame_timeout_ms),
            ("send_timeout_ms", self.send_timeout_ms),
            ("pressure_send_timeout_ms", self.pressure_send_timeout_ms),
        ] {
            if !(100..=3_600_000).contains(&v) {
                return Err(ConfigError::invalid(key, v, "expected 100 to 3600000"));
            }
        }
        for (key, n) in [
            ("connections_per_ip_max", self.connections_per_ip_max),
            ("handshakes_max", self.handshakes_max),
        ] {
            if n == 0 {
                return Err(ConfigError::invalid(key, 0, "expected at least 1"));
            }
        }
        Ok(())
    }

    /// Writes the keys into `c` (call [`ServerSettings::validate`] first).
    pub fn apply(&self, c: &mut ServerConfig) {
        c.request_pool_bytes = self.request_pool_bytes;
        c.frame_timeout = Duration::from_millis(self.frame_timeout_ms);
        c.connection_response_bytes_max = self.connection_response_bytes_max;
        c.response_bytes_max = self.response_bytes_max;
        c.send_timeout = Duration::from_millis(self.send_timeout_ms);
        c.pressure_send_timeout = Duration::from_millis(self.pressure_send_timeout_ms);
        c.connections_per_ip_max = self.connections_per_ip_max;
        c.handshakes_max = self.handshakes_max;
    }
}

/// The `[limits]` table: write rate limits and quotas ([`crate::quota`],
/// docs/proxy-protocol.md "Limits"). `proxy_*` keys limit everything this proxy writes
/// (DistributedLog's `rpsHardServiceLimit`, `bpsHardServiceLimit`, and their soft forms);
/// `stream_*` keys are the limits of each stream this proxy owns whose record sets none
/// (`quire stream limits`; DL's per-stream `rpsHardWriteLimit`, `bpsHardWriteLimit`,
/// `perWriterOutstandingWriteLimit`). Rates per second (records, record payload bytes);
/// every key 0 (the default): no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitSettings {
    /// The proxy's hard records/s.
    pub proxy_records_per_sec: u64,
    /// The proxy's hard bytes/s.
    pub proxy_bytes_per_sec: u64,
    /// The proxy's soft records/s (logged and counted only).
    pub proxy_soft_records_per_sec: u64,
    /// The proxy's soft bytes/s.
    pub proxy_soft_bytes_per_sec: u64,
    /// Most writes the proxy has accepted and not answered.
    pub proxy_outstanding_writes_max: u64,
    /// Each stream's hard records/s.
    pub stream_records_per_sec: u64,
    /// Each stream's hard bytes/s.
    pub stream_bytes_per_sec: u64,
    /// Each stream's soft records/s.
    pub stream_soft_records_per_sec: u64,
    /// Each stream's soft bytes/s.
    pub stream_soft_bytes_per_sec: u64,
    /// Most writes to one stream accepted and not answered.
    pub stream_outstanding_writes_max: u64,
}

impl LimitSettings {
    /// Checks every key: any value is valid (0 turns a limit off), but a soft rate above its
    /// hard rate would never be reached, so it is refused.
    ///
    /// # Errors
    /// A soft rate above the hard rate of the same scope and kind.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, soft, hard) in [
            (
                "proxy_soft_records_per_sec",
                self.proxy_soft_records_per_sec,
                self.proxy_records_per_sec,
            ),
            (
                "proxy_soft_bytes_per_sec",
                self.proxy_soft_bytes_per_sec,
                self.proxy_bytes_per_sec,
            ),
            (
                "stream_soft_records_per_sec",
                self.stream_soft_records_per_sec,
                self.stream_records_per_sec,
            ),
            (
                "stream_soft_bytes_per_sec",
                self.stream_soft_bytes_per_sec,
                self.stream_bytes_per_sec,
            ),
        ] {
            if hard > 0 && soft > hard {
                return Err(ConfigError::invalid(
                    key,
                    soft,
                    format!("expected at most the hard limit, {hard}"),
                ));
            }
        }
        Ok(())
    }

    /// Writes the keys into `c.limits` (call [`LimitSettings::validate`] first).
    pub fn apply(&self, c: &mut ServerConfig) {
        c.limits.proxy = crate::quota::RateLimits {
            records_per_sec: self.proxy_records_per_sec,
            bytes_per_sec: self.proxy_bytes_per_sec,
            soft_records_per_sec: self.proxy_soft_records_per_sec,
            soft_bytes_per_sec: self.proxy_soft_bytes_per_sec,
            outstanding_writes_max: self.proxy_outstanding_writes_max,
        };
        c.limits.stream = crate::quota::RateLimits {
            records_per_sec: self.stream_records_per_sec,
            bytes_per_sec: self.stream_bytes_per_sec,
            soft_records_per_sec: self.stream_soft_records_per_sec,
            soft_bytes_per_sec: self.stream_soft_bytes_per_sec,
            outstanding_writes_max: self.stream_outstanding_writes_max,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_default_to_the_configs_and_apply_back() {
        // Goal: applying the file defaults changes nothing (the defaults are written once, in
        // StreamConfig::default and ServerConfig::default).
        let mut s = StreamConfig::default();
        StreamSettings::default().apply(&mut s);
        assert_eq!(format!("{s:?}"), format!("{:?}", StreamConfig::default()));
        let mut c = ServerConfig::default();
        ServerSettings::default().apply(&mut c);
        assert_eq!(format!("{c:?}"), format!("{:?}", ServerConfig::default()));
        StreamSettings::default().validate().unwrap();
        ServerSettings::default().validate().unwrap();
        LimitSettings::default().validate().unwrap();
        let mut c = ServerConfig::default();
        LimitSettings::default().apply(&mut c);
        assert_eq!(c.limits, crate::quota::LimitConfig::default());
        let soft_above_hard = LimitSettings {
            stream_records_per_sec: 10,
            stream_soft_records_per_sec: 20,
            ..Default::default()
        };
        assert!(soft_above_hard
            .validate()
            .unwrap_err()
            .to_string()
            .contains("stream_soft_records_per_sec"));
        let e = StreamSettings {
            ensemble_size: 2,
            ..Default::default()
        };
        assert!(e
            .validate()
            .unwrap_err()
            .to_string()
            .contains("need E >= Qw >= Qa >= 1"));
    }

    #[test]
    fn balance_load_threshold_is_off_or_110_to_1000() {
        // Goal: 0 (off) and 110 to 1000 pass and reach the StreamConfig; 1 to 109 (an empty
        // dead band) and above 1000 are refused, naming the key.
        let with = |t| StreamSettings {
            balance_load_threshold_percent: t,
            ..Default::default()
        };
        for ok in [0, 110, 150, 1000] {
            with(ok).validate().unwrap();
            let mut c = StreamConfig::default();
            with(ok).apply(&mut c);
            assert_eq!(c.balance_load_threshold_percent, ok);
        }
        for bad in [1, 100, 109, 1001] {
            let e = with(bad).validate().unwrap_err().to_string();
            assert!(e.contains("balance_load_threshold_percent"), "{bad}: {e}");
        }
    }

    #[test]
    fn speculative_read_keys_are_bounded() {
        // Goal: 0 turns speculation off and is valid; a floor above 60 s, a maximum below the
        // floor (or 0) or above 60 s is refused, naming the key.
        let with = |floor, max| StreamSettings {
            speculative_read_timeout_ms: floor,
            max_speculative_read_timeout_ms: max,
            ..Default::default()
        };
        let table: [(u64, u64, Option<&str>); 7] = [
            (50, 2000, None),
            (0, 2000, None),
            (100, 100, None),
            (60_001, 60_001, Some("speculative_read_timeout_ms")),
            (100, 99, Some("max_speculative_read_timeout_ms")),
            (0, 0, Some("max_speculative_read_timeout_ms")),
            (50, 60_001, Some("max_speculative_read_timeout_ms")),
        ];
        for (floor, max, err) in table {
            let got = with(floor, max).validate();
            match err {
                None => got.unwrap(),
                Some(key) => assert!(
                    got.as_ref().unwrap_err().to_string().contains(key),
                    "{floor} {max}: {got:?}"
                ),
            }
        }
        let mut c = StreamConfig::default();
        with(0, 10).apply(&mut c);
        assert_eq!(c.speculative_read_timeout, Duration::ZERO);
        assert_eq!(c.max_speculative_read_timeout, Duration::from_millis(10));
    }
}

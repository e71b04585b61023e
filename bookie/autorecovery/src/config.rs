//! The `[autorecovery]` table ([`AutorecoveryConfig`], deserialized by the `quire` CLI from
//! `quire bookie`'s and `quire autorecovery`'s files) and the checked options the daemon runs
//! with ([`AutorecoveryOptions`]). Every default is written once, in the constants here.

use std::time::Duration;

use serde::Deserialize;

/// Default `lost_bookie_recovery_delay_secs`. BookKeeper's is 0; a minute here, so that a
/// restarted bookie (a rolling restart) is back before anything is copied.
pub const LOST_BOOKIE_RECOVERY_DELAY_SECS_DEFAULT: u64 = 60;
/// Default `open_ledger_rereplication_grace_period_ms` (BookKeeper's, 30 s).
pub const OPEN_LEDGER_GRACE_MS_DEFAULT: u64 = 30_000;
/// Default `autorecovery_poll_interval_ms`.
pub const POLL_INTERVAL_MS_DEFAULT: u64 = 1_000;
/// Default `auditor_periodic_check_interval_secs` (BookKeeper `auditorPeriodicCheckInterval`
/// is a week; a day here).
pub const PERIODIC_CHECK_INTERVAL_SECS_DEFAULT: u64 = 86_400;
/// How long a worker leaves a ledger alone after failing it (BookKeeper
/// `rwRereplicateBackoffMs`).
pub const REREPLICATE_BACKOFF: Duration = Duration::from_secs(5);

/// Checked autorecovery settings.
#[derive(Debug, Clone)]
pub struct AutorecoveryOptions {
    /// How long a bookie's registration must have been gone before its ledgers are marked.
    pub lost_bookie_recovery_delay: Duration,
    /// How long the last fragment of a ledger that is not closed is left to its writer.
    pub open_ledger_grace: Duration,
    /// How often the auditor reads the registry and an idle worker looks for marks.
    pub poll_interval: Duration,
    /// How often the auditor walks every ledger regardless (`None`: only when a bookie is lost).
    pub periodic_check_interval: Option<Duration>,
    /// Bytes per second the worker writes to target bookies at most (`None`: unlimited).
    pub replication_rate_bytes: Option<u64>,
    /// TLS to bookies (`None`: plain TCP).
    pub bookie_tls: Option<std::sync::Arc<quire_tls::rustls::ClientConfig>>,
    /// The cluster secret proved to every bookie (`None` only in tests of bookies without
    /// one; `quire autorecovery` and `quire bookie` always set it).
    pub cluster_secret: Option<quire_wire::auth::ClusterSecret>,
    /// Placement of the replacement bookies re-replication and decommission choose (the
    /// `[ledger]` table; the same policy as the proxies').
    pub placement: quire_ledger::placement::PlacementSettings,
}

/// The `[autorecovery]` table of `quire bookie` and `quire autorecovery`. Its defaults are
/// the `*_DEFAULT` constants above, written once there.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutorecoveryConfig {
    /// Run an autorecovery daemon inside the bookie (BookKeeper `autoRecoveryDaemonEnabled`);
    /// read by `quire bookie` only.
    pub enabled: bool,
    /// The daemon's identity in the auditor election and on worker locks; read by
    /// `quire autorecovery` only (unset: `autorecovery-<pid>@<hostname>`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Seconds a bookie's registration must have been gone before its ledgers are marked
    /// under-replicated (BookKeeper `lostBookieRecoveryDelay`).
    pub lost_bookie_recovery_delay_secs: u64,
    /// Milliseconds the last fragment of a ledger that is not closed is left to its writer
    /// (BookKeeper `openLedgerRereplicationGracePeriod`).
    pub open_ledger_rereplication_grace_period_ms: u64,
    /// Milliseconds between the auditor's registry polls and an idle worker's looks for
    /// marks, 1 to 60000.
    pub poll_interval_ms: u64,
    /// Seconds between the auditor's walks over every ledger (BookKeeper
    /// `auditorPeriodicCheckInterval`); 0 disables.
    pub auditor_periodic_check_interval_secs: u64,
    /// Bytes per second a replication worker writes to target bookies at most (BookKeeper
    /// `replicationRateByBytes`); 0: unlimited.
    pub replication_rate_bytes: u64,
}

impl Default for AutorecoveryConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            name: None,
            lost_bookie_recovery_delay_secs: LOST_BOOKIE_RECOVERY_DELAY_SECS_DEFAULT,
            open_ledger_rereplication_grace_period_ms: OPEN_LEDGER_GRACE_MS_DEFAULT,
            poll_interval_ms: POLL_INTERVAL_MS_DEFAULT,
            auditor_periodic_check_interval_secs: PERIODIC_CHECK_INTERVAL_SECS_DEFAULT,
            replication_rate_bytes: 0,
        }
    }
}

impl AutorecoveryConfig {
    /// Checks every key; errors name the key within the table.
    ///
    /// # Errors
    /// A poll interval of 0 or above a minute.
    pub fn validate(&self) -> Result<(), quire_metadata::ConfigError> {
        if !(1..=60_000).contains(&self.poll_interval_ms) {
            return Err(quire_metadata::ConfigError::invalid(
                "poll_interval_ms",
                self.poll_interval_ms,
                "expected 1 to 60000",
            ));
        }
        Ok(())
    }

    /// The daemon's options (call [`AutorecoveryConfig::validate`] first); no TLS and no
    /// cluster secret yet.
    pub fn options(&self) -> AutorecoveryOptions {
        let periodic = self.auditor_periodic_check_interval_secs;
        AutorecoveryOptions {
            lost_bookie_recovery_delay: Duration::from_secs(self.lost_bookie_recovery_delay_secs),
            open_ledger_grace: Duration::from_millis(
                self.open_ledger_rereplication_grace_period_ms,
            ),
            poll_interval: Duration::from_millis(self.poll_interval_ms),
            periodic_check_interval: (periodic > 0).then(|| Duration::from_secs(periodic)),
            replication_rate_bytes: Some(self.replication_rate_bytes).filter(|&r| r > 0),
            bookie_tls: None,
            cluster_secret: None,
            placement: quire_ledger::placement::PlacementSettings::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_poll_interval_is_bounded_and_the_error_names_the_key() {
        assert!(AutorecoveryConfig::default().validate().is_ok());
        for bad in [0, 60_001] {
            let c = AutorecoveryConfig {
                poll_interval_ms: bad,
                ..AutorecoveryConfig::default()
            };
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("poll_interval_ms"), "{e}");
        }
    }

    #[test]
    fn zero_turns_the_periodic_check_and_the_rate_limit_off() {
        let c = AutorecoveryConfig {
            auditor_periodic_check_interval_secs: 0,
            replication_rate_bytes: 0,
            ..AutorecoveryConfig::default()
        };
        let o = c.options();
        assert_eq!(o.periodic_check_interval, None);
        assert_eq!(o.replication_rate_bytes, None);
        let o = AutorecoveryConfig::default().options();
        assert_eq!(o.lost_bookie_recovery_delay, Duration::from_secs(60));
        assert_eq!(o.periodic_check_interval, Some(Duration::from_secs(86_400)));
    }
}

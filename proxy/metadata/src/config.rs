//! The `[zookeeper]` table: one ZooKeeper settings type for every process (bookie, proxy,
//! autorecovery daemon, admin commands); its `validate()` returns quire-config's
//! [`ConfigError`], re-exported here.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use quire_config::ConfigError;

/// Checks a `host:port[,host:port...]` list (a ZooKeeper connect string or an address).
pub fn is_host_port_list(s: &str) -> bool {
    !s.trim().is_empty()
        && s.split(',').all(|host| {
            host.rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0))
        })
}

/// ZooKeeper settings, the `[zookeeper]` table of every process's config file.
///
/// The defaults are those of [`Default`]: root `/quire`, session timeout 10 000 ms
/// (BookKeeper's `zkTimeout`), no digest identity; `servers` has none and is required.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ZooKeeperConfig {
    /// Connect string, `host:port[,host:port...]` (BookKeeper `zkServers`). Required.
    pub servers: String,
    /// Absolute path under which every Quire znode lives (BookKeeper `zkLedgersRootPath`).
    pub root: String,
    /// Session timeout in milliseconds, 1000 to 600000: after this long without hearing from
    /// the process, ZooKeeper deletes its ephemeral nodes (bookie registration, stream
    /// leases).
    pub session_timeout_ms: u64,
    /// File holding the digest identity `user:password` (mode 0600): the session authenticates
    /// with it and every znode it creates gets the ACL of that identity only (BookKeeper
    /// `zkEnableSecurity`). Unset: znodes open to anyone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_file: Option<PathBuf>,
}

impl Default for ZooKeeperConfig {
    fn default() -> Self {
        Self {
            servers: String::new(),
            root: "/quire".to_string(),
            session_timeout_ms: 10_000,
            auth_file: None,
        }
    }
}

impl ZooKeeperConfig {
    /// The session timeout as a duration.
    pub fn session_timeout(&self) -> Duration {
        Duration::from_millis(self.session_timeout_ms)
    }

    /// Checks every key; errors name the key within the table (`servers`, `root`,
    /// `session_timeout_ms`); prefix the table with [`ConfigError::in_table`].
    ///
    /// # Errors
    /// A missing or malformed connect string, a root that is not an absolute ZooKeeper path,
    /// a session timeout outside 1000 to 600000 ms.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.servers.trim().is_empty() {
            return Err(ConfigError::missing(
                "servers",
                "set the ZooKeeper connect string host:port[,host:port...]",
            ));
        }
        if !is_host_port_list(&self.servers) {
            return Err(ConfigError::invalid(
                "servers",
                format!("{:?}", self.servers),
                "expected host:port[,host:port...]",
            ));
        }
        let root = &self.root;
        if !root.starts_with('/') || (root.len() > 1 && root.ends_with('/')) || root.contains("//")
        {
            return Err(ConfigError::invalid(
                "root",
                format!("{root:?}"),
                "expected an absolute ZooKeeper path like /quire",
            ));
        }
        if !(1_000..=600_000).contains(&self.session_timeout_ms) {
            return Err(ConfigError::invalid(
                "session_timeout_ms",
                self.session_timeout_ms,
                "expected 1000 to 600000",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zookeeper_config_checks_name_the_key() {
        // Goal: the defaults are BookKeeper's and each bad key is named.
        let mut c = ZooKeeperConfig::default();
        assert_eq!(c.validate().unwrap_err().key, "servers");
        c.servers = "h:1,g:2".into();
        c.validate().unwrap();
        for (f, key) in [
            (
                (|c: &mut ZooKeeperConfig| c.servers = "nohost".into()) as fn(&mut _),
                "servers",
            ),
            (|c| c.root = "quire".into(), "root"),
            (|c| c.root = "/a//b".into(), "root"),
            (|c| c.session_timeout_ms = 10, "session_timeout_ms"),
        ] {
            let mut bad = c.clone();
            f(&mut bad);
            let e = bad.validate().unwrap_err().in_table("zookeeper");
            assert_eq!(e.key, format!("zookeeper.{key}"));
            assert!(
                e.to_string().starts_with("invalid setting zookeeper."),
                "{e}"
            );
        }
    }
}

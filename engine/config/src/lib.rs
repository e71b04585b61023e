//! [`ConfigError`], the one error type of every Quire crate's settings `validate()` (the
//! engine's `[engine]` and `[compaction]` tables, the bookie's `[bookie]`, the metadata store's
//! `[zookeeper]`, the proxy's `[streams]` and `[server]`, autorecovery's `[autorecovery]`).
//!
//! It sits in a crate of its own, below every other, because the crates that validate settings
//! do not depend on one another (quire-engine on no workspace crate, quire-metadata only on
//! quire-wire), and one type lets the `quire` command name any crate's key the same way
//! (`tools/src/config.rs`, `named`) without converting between copies.

/// A missing or invalid configuration key. `key` is the key as written in the file, with its
/// table (`zookeeper.servers`, `engine.group_commit_wait_us`); the message reads
/// `invalid setting KEY = VALUE: EXPECTED` or `missing setting KEY: HINT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} setting {key}{value}: {expected}", if self.missing { "missing" } else { "invalid" })]
pub struct ConfigError {
    /// The key, dotted with its table when it has one.
    pub key: String,
    /// ` = VALUE` as written, or empty for a missing key.
    pub value: String,
    /// What was expected instead.
    pub expected: String,
    /// The key is required and was not given.
    pub missing: bool,
}

impl ConfigError {
    /// `key` holds `value`, which is not what `expected` says.
    pub fn invalid(key: &str, value: impl std::fmt::Display, expected: impl Into<String>) -> Self {
        Self {
            key: key.to_string(),
            value: format!(" = {value}"),
            expected: expected.into(),
            missing: false,
        }
    }

    /// `key` is required.
    pub fn missing(key: &str, hint: impl Into<String>) -> Self {
        Self {
            key: key.to_string(),
            value: String::new(),
            expected: hint.into(),
            missing: true,
        }
    }

    /// The same error with the key prefixed by its table (`shards` → `bookie.shards`).
    #[must_use]
    pub fn in_table(mut self, table: &str) -> Self {
        self.key = format!("{table}.{}", self.key);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::ConfigError;

    #[test]
    fn messages_name_the_key_with_its_table() {
        // Goal: the one-line messages every process prints for a bad or missing key.
        let e = ConfigError::invalid("shards", 0, "expected 1 to 65535").in_table("bookie");
        assert_eq!(
            e.to_string(),
            "invalid setting bookie.shards = 0: expected 1 to 65535"
        );
        let e = ConfigError::missing("servers", "set the connect string").in_table("zookeeper");
        assert!(e.missing);
        assert_eq!(
            e.to_string(),
            "missing setting zookeeper.servers: set the connect string"
        );
    }
}

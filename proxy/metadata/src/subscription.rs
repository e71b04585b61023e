//! Subscriptions: named reader positions kept per stream (DistributedLog's
//! `SubscriptionsStore`: `advanceCommitPosition`, `getLastCommitPosition`,
//! `deleteSubscriber`). The record is stored under the stream (`docs/format/metadata.md`,
//! `docs/format/zookeeper-layout.md`); the forward-only commit rule is the proxy's, applied by
//! compare-and-set on the record's version.

use serde::{Deserialize, Serialize};

use crate::{Error, TruncationPoint};

/// Longest subscription name, in bytes.
pub const SUBSCRIPTION_NAME_SIZE_BYTES_MAX: usize = 255;

/// One subscriber's committed position in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscription {
    /// Where the subscriber resumes: the DLSN of the first record it has not processed yet
    /// (just after the last one it committed). Only moves forward.
    pub committed: TruncationPoint,
    /// When the position was last moved, ms since the Unix epoch (the committing proxy's
    /// clock).
    pub commit_time_ms: u64,
}

/// Checks a subscription name: 1 to 255 bytes of ASCII letters, digits, `-`, `_` and `.`, not
/// starting with `.` (one znode name, as a bookie id).
///
/// # Errors
/// `Invalid` saying which rule the name breaks.
pub fn validate_subscription_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= SUBSCRIPTION_NAME_SIZE_BYTES_MAX
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid {
            what: "subscription name",
            reason: format!(
                "{name:?}: must be 1 to 255 bytes of ASCII letters, digits, '-', '_' and '.', not starting with '.'"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscription_names() {
        for ok in ["a", "billing-v2", "A.b_c-1"] {
            assert!(validate_subscription_name(ok).is_ok(), "{ok}");
        }
        let long = "x".repeat(256);
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "sp ace",
            "ü",
            long.as_str(),
        ] {
            assert!(validate_subscription_name(bad).is_err(), "{bad}");
        }
    }
}

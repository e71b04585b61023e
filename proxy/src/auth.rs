//! Client authentication and authorisation on the proxy port: bearer tokens with read, write
//! and admin rights by stream-name prefix.
//!
//! A client sends its token in the handshake (`HELLO`, docs/proxy-protocol.md). A proxy given an
//! [`Authorizer`] refuses a handshake without a token, or with one it does not know, with
//! `UNAUTHENTICATED` (401) and closes the connection; afterwards each request needs a right on
//! its stream, else it gets `REQUEST_DENIED` (403, DistributedLog's code for a denied request)
//! and the connection stays open:
//!
//! | right | requests |
//! |---|---|
//! | read | read, describe stream; list streams shows the streams the token can read |
//! | write | write (also when it creates the stream), create stream |
//! | admin | truncate, delete, set retention |
//!
//! A right covers the streams whose names start with one of its prefixes (`""`: every
//! stream). The proxy keeps only SHA-256 digests of the tokens, so a copy of its token file does
//! not let anyone in; tokens are compared by digest.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use quire_client::protocol::Request;
/// Longest token a handshake may carry, in bytes (the codec refuses longer ones).
pub use quire_client::protocol::TOKEN_BYTES_MAX;

/// The rights one token grants: stream-name prefixes per right.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// The token's name, for logs and error messages (never the token itself).
    pub name: String,
    /// Prefixes of the streams the token may read.
    pub read: Vec<String>,
    /// Prefixes of the streams the token may write and create.
    pub write: Vec<String>,
    /// Prefixes of the streams the token may truncate, delete and set retention on.
    pub admin: Vec<String>,
    /// The tenant's write limits on each proxy (`[[token]]` keys `records_per_sec`,
    /// `bytes_per_sec`, `soft_records_per_sec`, `soft_bytes_per_sec`,
    /// `outstanding_writes_max`; all 0: none). See `crate::quota`.
    pub limits: crate::quota::RateLimits,
}

/// The right a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Right {
    /// Reading records or a stream's description.
    Read,
    /// Appending records or creating a stream.
    Write,
    /// Truncating, deleting, changing retention.
    Admin,
}

impl Right {
    fn name(self) -> &'static str {
        match self {
            Right::Read => "read",
            Right::Write => "write",
            Right::Admin => "admin",
        }
    }
}

/// The SHA-256 digest of a token, as lowercase hex: what a token file holds.
pub fn token_digest_hex(token: &[u8]) -> String {
    Sha256::digest(token)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Known tokens (by digest) and their grants.
#[derive(Debug, Clone, Default)]
pub struct Authorizer {
    grants: HashMap<[u8; 32], Grant>,
}

/// Why an [`Authorizer`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    /// A digest is not 64 hex digits.
    #[error("token {name:?}: sha256 must be 64 hex digits")]
    BadDigest { name: String },
    /// Two grants have the same digest.
    #[error("tokens {first:?} and {second:?} have the same sha256")]
    DuplicateToken { first: String, second: String },
}

impl Authorizer {
    /// Builds the table from `(sha256 hex digest, grant)` pairs.
    ///
    /// # Errors
    /// [`AuthConfigError`] for a malformed or repeated digest.
    pub fn new(
        grants: impl IntoIterator<Item = (String, Grant)>,
    ) -> Result<Authorizer, AuthConfigError> {
        let mut table = HashMap::new();
        for (hex, grant) in grants {
            let digest = parse_digest(&hex).ok_or_else(|| AuthConfigError::BadDigest {
                name: grant.name.clone(),
            })?;
            if let Some(first) = table.get(&digest).map(|g: &Grant| g.name.clone()) {
                return Err(AuthConfigError::DuplicateToken {
                    first,
                    second: grant.name,
                });
            }
            table.insert(digest, grant);
        }
        Ok(Authorizer { grants: table })
    }

    /// The grant of `token`, `None` for an unknown token.
    pub fn authenticate(&self, token: &[u8]) -> Option<&Grant> {
        let digest: [u8; 32] = Sha256::digest(token).into();
        self.grants.get(&digest)
    }

    /// How many tokens are known.
    pub fn len(&self) -> usize {
        self.grants.len()
    }

    /// Whether no token is known (then every handshake is refused).
    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl Grant {
    /// Whether this grant has `right` on `stream`.
    pub fn allows(&self, right: Right, stream: &str) -> bool {
        let prefixes = match right {
            Right::Read => &self.read,
            Right::Write => &self.write,
            Right::Admin => &self.admin,
        };
        prefixes.iter().any(|p| stream.starts_with(p.as_str()))
    }

    /// Checks `req` against this grant: `Ok` when allowed (list streams always is; its answer
    /// is filtered with [`Grant::allows`]), else the one-line reason.
    pub fn check(&self, req: &Request) -> Result<(), String> {
        let (right, stream) = match req {
            Request::Hello { .. } | Request::ListStreams | Request::ListStreamsPage { .. } => {
                return Ok(())
            }
            // A subscription is a reader's own position: reading the stream is the right to
            // keep one (DistributedLog's reader commits it); deleting one is admin.
            Request::Read { stream, .. }
            | Request::DescribeStream { stream, .. }
            | Request::CommitSubscription { stream, .. }
            | Request::GetSubscription { stream, .. }
            | Request::ListSubscriptions { stream } => (Right::Read, stream),
            Request::Write { stream, .. }
            | Request::ProducerWrite { stream, .. }
            | Request::OpenProducerSession { stream }
            | Request::CreateStream { stream } => (Right::Write, stream),
            Request::TruncateStream { stream, .. }
            | Request::DeleteStream { stream }
            | Request::SetRetention { stream, .. }
            | Request::SetCompression { stream, .. }
            | Request::SetLimits { stream, .. }
            | Request::SetPlacement { stream, .. }
            | Request::SealStream { stream }
            | Request::DeleteSubscription { stream, .. } => (Right::Admin, stream),
        };
        if self.allows(right, stream) {
            Ok(())
        } else {
            Err(format!(
                "token {:?} has no {} right on stream {stream:?}",
                self.name,
                right.name()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant {
        Grant {
            name: "ingest".into(),
            read: vec!["logs/".into(), "metrics/".into()],
            write: vec!["logs/".into()],
            admin: vec![],
            limits: Default::default(),
        }
    }

    #[test]
    fn tokens_are_known_by_digest_only() {
        let a = Authorizer::new([(token_digest_hex(b"t0ken"), grant())]).unwrap();
        assert_eq!(
            a.authenticate(b"t0ken").map(|g| g.name.as_str()),
            Some("ingest")
        );
        assert!(a.authenticate(b"t0ken ").is_none());
        assert!(a.authenticate(b"").is_none());
        assert!(matches!(
            Authorizer::new([("abc".to_string(), grant())]),
            Err(AuthConfigError::BadDigest { .. })
        ));
        let twice = [
            (token_digest_hex(b"x"), grant()),
            (token_digest_hex(b"x"), grant()),
        ];
        assert!(matches!(
            Authorizer::new(twice),
            Err(AuthConfigError::DuplicateToken { .. })
        ));
    }

    #[test]
    fn each_request_needs_its_right_on_its_stream() {
        let g = grant();
        let write = |s: &str| Request::Write {
            stream: s.into(),
            create_if_missing: true,
            compress: false,
            records: vec![],
        };
        assert!(g.check(&write("logs/a")).is_ok());
        assert!(g.check(&write("metrics/a")).is_err());
        assert!(g
            .check(&Request::DescribeStream {
                stream: "metrics/a".into(),
                home_region: true,
                placement: true,
            })
            .is_ok());
        assert!(g
            .check(&Request::DescribeStream {
                stream: "other".into(),
                home_region: true,
                placement: true,
            })
            .is_err());
        let e = g
            .check(&Request::DeleteStream {
                stream: "logs/a".into(),
            })
            .unwrap_err();
        assert!(e.contains("admin") && e.contains("ingest"), "{e}");
        assert!(g.check(&Request::ListStreams).is_ok());
        let all = Grant {
            admin: vec![String::new()],
            ..grant()
        };
        assert!(all
            .check(&Request::DeleteStream {
                stream: "any/thing".into()
            })
            .is_ok());
    }
}

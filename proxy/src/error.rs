//! The stream layer's and the server's errors: the proxy protocol's error type
//! ([`quire_client::Error`], one variant per failure the protocol can report, with its stable
//! [`ErrorCode`]) and how metadata store failures map onto it.

pub use quire_client::error::{BoxError, Error, ErrorCode, Result};

/// Maps a metadata store error onto the protocol's errors, turning the ones with a protocol
/// meaning into their own variants (DistributedLog's `LogNotFoundException`,
/// `LogExistsException`, `InvalidStreamNameException`; the rest is a `METADATA_EXCEPTION`).
/// A trait because the error type lives in quire-client, which knows no metadata store.
pub(crate) trait FromMetadata {
    /// `NotFound` of a stream: `NoSuchStream`; `AlreadyExists` of a stream: `StreamExists`;
    /// an invalid stream name: `InvalidStreamName`; anything else: `Metadata` with `op`.
    fn from_metadata(stream: &str, op: &'static str, e: quire_metadata::Error) -> Self;
}

impl FromMetadata for Error {
    fn from_metadata(stream: &str, op: &'static str, e: quire_metadata::Error) -> Self {
        match e {
            quire_metadata::Error::NotFound { kind: "stream", .. } => Error::NoSuchStream {
                stream: stream.to_string(),
            },
            quire_metadata::Error::AlreadyExists { kind: "stream", .. } => Error::StreamExists {
                stream: stream.to_string(),
            },
            quire_metadata::Error::Invalid {
                what: "stream name",
                reason,
            } => Error::InvalidStreamName { reason },
            other => Error::Metadata {
                stream: stream.to_string(),
                op,
                source: Box::new(other),
            },
        }
    }
}

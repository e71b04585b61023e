//! The error type of the proxy protocol and its stable status codes.
//!
//! One vocabulary for both ends, as DistributedLog's protocol module holds its exception
//! hierarchy and `StatusCode` for the service and its client: the stream layer and the server
//! in quire-proxy fail with these variants and answer with their [`ErrorCode`]; the client
//! gets a proxy's answer back as [`Error::Remote`] and fails with its own (client side)
//! variants for what happens on its side of the connection.

use quire_wire::WireError;

/// Status codes of the proxy protocol, carried in the frame header's `status` field.
/// Numbered after DistributedLog's `StatusCode` where one exists. Stable numbers: add new ones,
/// never renumber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// Success (only in the frame header, never inside an [`Error`]).
    Ok = 0,
    /// Another proxy owns the stream; the error message is the owner's address
    /// (`host:port`), where the client should send the request instead (DL `FOUND`).
    StreamOwnedElsewhere = 302,
    /// Malformed, unexpected or out-of-range request.
    BadRequest = 400,
    /// A record is larger than [`crate::RECORD_SIZE_BYTES_MAX`] (DL `TOO_LARGE_RECORD`).
    RecordTooLarge = 413,
    /// The handshake carried no token, or one the proxy does not know, and the proxy requires
    /// one; the connection is closed. Quire's own code (DistributedLog has none for this).
    Unauthenticated = 401,
    /// The token has no right for this request on this stream (DL `REQUEST_DENIED`); nothing
    /// was done and the connection stays open.
    RequestDenied = 403,
    /// No protocol version in common with the peer.
    UnsupportedVersion = 426,
    /// An unexpected failure inside the proxy (DL `INTERNAL_SERVER_ERROR`).
    Internal = 500,
    /// The proxy is shutting down, or refused a new connection because it already has its
    /// maximum number of open connections (DL `SERVICE_UNAVAILABLE`: the client should try
    /// another proxy).
    ServiceUnavailable = 503,
    /// This proxy owned the stream and lost it (its lease expired or was taken, or another
    /// writer fenced the segment's ledger); the request failed. The next request to this proxy
    /// tries to acquire the stream again (DL `LOCKING_EXCEPTION`).
    OwnershipLost = 504,
    /// The metadata store failed or holds an unexpected state (DL `METADATA_EXCEPTION`).
    Metadata = 506,
    /// Bookies / the ledger layer failed; the write may or may not have been stored
    /// (DL `BK_TRANSMIT_ERROR`).
    Storage = 507,
    /// The stream does not exist (DL `LOG_NOT_FOUND`).
    NoSuchStream = 510,
    /// A read asked for a position before the stream's truncation point: those records were
    /// truncated and are gone (DL `TRUNCATED_TRANSACTION`). The message names the point.
    Truncated = 511,
    /// The stream is sealed (`SEAL_STREAM`): a write after the end-of-stream marker, or a read
    /// at it (DL `END_OF_STREAM`, `EndOfStreamException`). Nothing was written.
    EndOfStream = 512,
    /// A txid is smaller than one already written to the stream (DL `TRANSACTION_OUT_OF_ORDER`).
    TxidOutOfOrder = 514,
    /// A write would take its stream, its token (tenant) or the answering proxy over a hard
    /// rate limit (records/s, bytes/s) or outstanding-write limit (DL `OVER_CAPACITY`, its
    /// `bpsHardServiceLimit`/`rpsHardServiceLimit`); nothing was written. The message names the
    /// scope and the limit. A client backs off and retries later.
    OverCapacity = 517,
    /// The answering proxy's region is marked unavailable by an operator (`quire cluster
    /// region unavailable`) and the request would acquire a stream this proxy does not own
    /// (creating it or its first write here); nothing was done. Streams the proxy owns already
    /// are served as before. The client tries the proxies of its next region
    /// (DistributedLog's `REGION_UNAVAILABLE`).
    RegionUnavailable = 519,
    /// Acquiring the stream would make this proxy own more streams than its
    /// `[streams] owned_streams_max` (DL `TOO_MANY_STREAMS`, from `maxAcquiredPartitionsPerProxy`);
    /// nothing was done. Redirectable: the client tries the other proxies it knows, and fails
    /// with this code when every one refuses. Streams the proxy owns already are not affected.
    TooManyStreams = 524,
    /// The stream already exists (DL `LOG_EXISTS`).
    StreamExists = 525,
    /// A txid is more than the proxy's `txid_jump_max` (default 2^40) above the txid before it
    /// (the stream's last txid, or the previous record of the same write); nothing was
    /// written. Quire's own guard against a poisoned stream, with no DistributedLog
    /// equivalent: one stray txid near 2^64 would otherwise make every later normal write to
    /// the stream `TXID_OUT_OF_ORDER` for good. Numbered outside DistributedLog's 500–527 so
    /// that it never stands for one of DL's codes.
    TxidTooFarAhead = 540,
    /// A write in a producer session does not follow the session's last applied sequence
    /// number at the stream's owner: a gap (a write of the session before it never reached the
    /// stream), or sequences that only partly line up with what was applied. Nothing was
    /// written; the message gives the sequence the owner expects next. Quire's own code
    /// (Kafka's `OUT_OF_ORDER_SEQUENCE_NUMBER`; DistributedLog has no producer sessions).
    ProducerSequenceGap = 541,
    /// The stream's owner keeps no state for this producer session at this sequence: the
    /// session is unknown to it (never seen, or its last write left the dedup window) or the
    /// sequences are older than the window it keeps. It cannot tell whether the write was
    /// applied, so it writes nothing: never twice. A producer opens a new session for new
    /// writes; a retried write's outcome stays unknown. Quire's own code (Kafka's
    /// `UNKNOWN_PRODUCER_ID`).
    ProducerSessionExpired = 542,
    /// A commit would create a subscription on a stream that has the proxy's
    /// `subscriptions_per_stream_max` (default 1,000) already; nothing was stored. Delete
    /// unused subscriptions or commit under an existing name. Quire's own code (DistributedLog
    /// sets no bound).
    TooManySubscriptions = 543,
    /// The stream name breaks the naming rules (DL `INVALID_STREAM_NAME`).
    InvalidStreamName = 602,
}

impl ErrorCode {
    /// Every code, for tests and documentation.
    pub const ALL: [ErrorCode; 25] = [
        Self::Ok,
        Self::StreamOwnedElsewhere,
        Self::BadRequest,
        Self::Unauthenticated,
        Self::RequestDenied,
        Self::RecordTooLarge,
        Self::UnsupportedVersion,
        Self::Internal,
        Self::ServiceUnavailable,
        Self::OwnershipLost,
        Self::Metadata,
        Self::Storage,
        Self::NoSuchStream,
        Self::Truncated,
        Self::EndOfStream,
        Self::TxidOutOfOrder,
        Self::OverCapacity,
        Self::RegionUnavailable,
        Self::TooManyStreams,
        Self::StreamExists,
        Self::TxidTooFarAhead,
        Self::ProducerSequenceGap,
        Self::ProducerSessionExpired,
        Self::TooManySubscriptions,
        Self::InvalidStreamName,
    ];

    /// Maps a wire value back to a code; `None` for a number this version does not know.
    pub fn from_u16(v: u16) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| *c as u16 == v)
    }

    /// A short upper-case name, as printed by tools.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ok => "OK",
            Self::StreamOwnedElsewhere => "STREAM_OWNED_ELSEWHERE",
            Self::BadRequest => "BAD_REQUEST",
            Self::Unauthenticated => "UNAUTHENTICATED",
            Self::RequestDenied => "REQUEST_DENIED",
            Self::RecordTooLarge => "RECORD_TOO_LARGE",
            Self::UnsupportedVersion => "UNSUPPORTED_VERSION",
            Self::Internal => "INTERNAL",
            Self::ServiceUnavailable => "SERVICE_UNAVAILABLE",
            Self::OwnershipLost => "OWNERSHIP_LOST",
            Self::Metadata => "METADATA_ERROR",
            Self::Storage => "STORAGE_ERROR",
            Self::NoSuchStream => "NO_SUCH_STREAM",
            Self::Truncated => "TRUNCATED",
            Self::EndOfStream => "END_OF_STREAM",
            Self::TxidOutOfOrder => "TXID_OUT_OF_ORDER",
            Self::OverCapacity => "OVER_CAPACITY",
            Self::RegionUnavailable => "REGION_UNAVAILABLE",
            Self::TooManyStreams => "TOO_MANY_STREAMS",
            Self::StreamExists => "STREAM_EXISTS",
            Self::TxidTooFarAhead => "TXID_TOO_FAR_AHEAD",
            Self::ProducerSequenceGap => "PRODUCER_SEQUENCE_GAP",
            Self::ProducerSessionExpired => "PRODUCER_SESSION_EXPIRED",
            Self::TooManySubscriptions => "TOO_MANY_SUBSCRIPTIONS",
            Self::InvalidStreamName => "INVALID_STREAM_NAME",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), *self as u16)
    }
}

/// Boxed source error of a lower layer.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything the stream layer, the proxy server and the proxy client can fail with.
/// `Display` is one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stream does not exist.
    #[error("stream {stream:?} does not exist")]
    NoSuchStream { stream: String },
    /// A read from a position before the stream's truncation point (DistributedLog
    /// `AlreadyTruncatedTransactionException`); read from `truncated_before` or the head.
    #[error("stream {stream:?} is truncated before {truncated_before}: records before it are gone, {requested} cannot be read (read from {truncated_before} or from the head)")]
    Truncated {
        stream: String,
        requested: crate::dlsn::Dlsn,
        truncated_before: crate::dlsn::Dlsn,
    },
    /// The stream is sealed: it ends with the end-of-stream marker and takes no more writes
    /// (DistributedLog `EndOfStreamException`). Nothing of the request was written.
    #[error("stream {stream:?} is sealed (end of stream): it takes no more writes")]
    EndOfStream { stream: String },
    /// The stream already exists.
    #[error("stream {stream:?} already exists")]
    StreamExists { stream: String },
    /// The stream name breaks the naming rules.
    #[error("invalid stream name: {reason}")]
    InvalidStreamName { reason: String },
    /// A record is over the size limit; nothing of the request was written.
    #[error("record {record_index} of the request is {size_bytes} bytes, above the limit of {max_bytes} bytes; nothing was written")]
    RecordTooLarge {
        record_index: usize,
        size_bytes: usize,
        max_bytes: usize,
    },
    /// A txid is the reserved end-of-stream value [`crate::protocol::TXID_RESERVED`]
    /// (`u64::MAX`, DistributedLog's `Long.MAX_VALUE`); nothing of the request was written.
    #[error("txid {txid} of record {record_index} is reserved for end-of-stream (the largest usable txid is {}); nothing was written", u64::MAX - 1)]
    ReservedTxid { record_index: usize, txid: u64 },
    /// A txid is smaller than the previous one; nothing of the request was written.
    #[error("txid {txid} of record {record_index} is below the stream's last txid {last_txid}; nothing was written")]
    TxidOutOfOrder {
        record_index: usize,
        txid: u64,
        last_txid: u64,
    },
    /// A txid is more than `txid_jump_max` above the txid before it: the stream's last txid
    /// (acknowledged or in flight) for a write's first record, the previous record's for the
    /// others (the txid guard, `quire_proxy::StreamConfig::txid_jump_max`; Quire's own, not
    /// DistributedLog's). Nothing of the request was written and the stream's last txid is
    /// unchanged.
    #[error("txid {txid} of record {record_index} is more than {txid_jump_max} above the txid before it ({last_txid}): refused by the proxy's txid guard (txid_jump_max) so that one stray txid cannot make the stream unwritable; nothing was written")]
    TxidTooFarAhead {
        record_index: usize,
        txid: u64,
        last_txid: u64,
        txid_jump_max: u64,
    },
    /// A producer session's write does not follow the session's last applied sequence
    /// (`PRODUCER_SEQUENCE_GAP`, see `quire_proxy`'s producer sessions); nothing was written.
    #[error("producer session {session_id:#x} on stream {stream:?}: write of sequences {first_seq}..={last_seq} does not follow the applied ones (next expected {expected}); nothing was written")]
    ProducerSequenceGap {
        stream: String,
        session_id: u64,
        first_seq: u64,
        last_seq: u64,
        expected: u64,
    },
    /// The owner keeps no dedup state for this session at these sequences
    /// (`PRODUCER_SESSION_EXPIRED`); nothing was written.
    #[error("producer session {session_id:#x} on stream {stream:?}: sequence {first_seq} {reason}; nothing was written (open a new session)")]
    ProducerSessionExpired {
        stream: String,
        session_id: u64,
        first_seq: u64,
        reason: String,
    },
    /// A first commit of subscription `name` would exceed the stream's bound on subscriptions
    /// (`TOO_MANY_SUBSCRIPTIONS`); nothing was stored.
    #[error("stream {stream:?} has {max} subscriptions, its proxy's subscriptions_per_stream_max: subscription {name:?} was not created (delete unused ones with `quire stream subs STREAM --delete NAME`)")]
    TooManySubscriptions {
        stream: String,
        name: String,
        max: usize,
    },
    /// A write would exceed a hard limit of `scope` (`proxy`, `stream` or `token`):
    /// `OVER_CAPACITY`, nothing was written (DistributedLog `OverCapacityException`).
    #[error("over capacity: {scope} limit {limit} exceeded ({detail}); nothing was written, retry later")]
    OverCapacity {
        scope: &'static str,
        limit: &'static str,
        detail: String,
    },
    /// Acquiring `stream` would make the proxy own more than its `[streams] owned_streams_max`
    /// streams (`TOO_MANY_STREAMS`, DistributedLog `maxAcquiredPartitionsPerProxy`); nothing
    /// was done.
    /// `stream` would be acquired by a proxy of `region`, which an operator marked as not
    /// accepting new streams (`REGION_UNAVAILABLE`, DistributedLog's `RegionUnavailableException`);
    /// nothing was done.
    #[error("region {region} is marked unavailable: proxy {proxy} does not take stream {stream:?} (try another region)")]
    RegionUnavailable {
        stream: String,
        proxy: String,
        region: String,
    },
    #[error("proxy {proxy} owns {max} streams, its owned_streams_max: it does not take stream {stream:?} (try another proxy)")]
    TooManyStreams {
        stream: String,
        proxy: String,
        max: usize,
    },
    /// (client side) A write's outcome is unknown: the connection was lost after it was sent,
    /// or the owner answered `OWNERSHIP_LOST` or `STORAGE_ERROR` during it. Its records may or
    /// may not be in the stream. Writes outside a producer session are never retried by the
    /// client (a retry could write them twice); inside one the `Producer` retries them with the
    /// same sequences and the owner drops what it already applied (Kafka's idempotent
    /// producer). `code` is the cause's code (`INTERNAL` for a lost connection).
    #[error("outcome of the write to stream {stream:?} is unknown (its records may or may not be in the stream): {reason}")]
    WriteOutcomeUnknown {
        stream: String,
        code: ErrorCode,
        reason: String,
    },
    /// The handshake's token is missing or unknown to a proxy that requires one
    /// (the proxy's authorizer, `quire_proxy::auth`).
    #[error("not authenticated: {reason}")]
    Unauthenticated { reason: String },
    /// The token lacks the right this request needs on its stream (the proxy's authorizer,
    /// `quire_proxy::auth`).
    #[error("request denied: {reason}")]
    RequestDenied { reason: String },
    /// The request is malformed or out of range.
    #[error("bad request: {reason}")]
    BadRequest { reason: String },
    /// The ledger layer or the bookies failed. For a write, records not acknowledged may or may
    /// not have been stored (they may appear after recovery).
    #[error("storage error on stream {stream:?} during {op}: {source}")]
    Storage {
        stream: String,
        op: &'static str,
        #[source]
        source: BoxError,
    },
    /// The metadata store failed, or holds a state the stream layer did not expect.
    #[error("metadata error on stream {stream:?} during {op}: {source}")]
    Metadata {
        stream: String,
        op: &'static str,
        #[source]
        source: BoxError,
    },
    /// The proxy is shutting down.
    #[error("the proxy is shutting down")]
    ShuttingDown,
    /// Another proxy owns the stream (DistributedLog's write lock is held elsewhere); send the
    /// request to `owner`. Nothing of the request was done.
    #[error("stream {stream:?} is owned by proxy {owner}")]
    OwnedElsewhere { stream: String, owner: String },
    /// This proxy lost ownership of the stream: its lease was lost, or another writer fenced the
    /// ledger of the segment being written or changed the stream's metadata. For a write, records
    /// not acknowledged may or may not be in the log (after the new owner's recovery); the next
    /// request tries to acquire the stream again.
    #[error("ownership of stream {stream:?} lost: {reason}")]
    OwnershipLost { stream: String, reason: String },
    /// (client side) The stream's owner could not be reached through redirects.
    #[error("stream {stream:?} is owned by proxy {owner}, but the redirect failed: {reason}")]
    RedirectFailed {
        stream: String,
        owner: String,
        reason: String,
    },
    /// A proxy answered a request with an error (client side).
    #[error("proxy error {code}: {message}")]
    Remote { code: ErrorCode, message: String },
    /// The peer broke the protocol (client or server side).
    #[error("protocol error: {0}")]
    Protocol(#[from] WireError),
    /// The handshake found no common protocol version.
    #[error("no common proxy protocol version: peer speaks {peer_min}..={peer_max}, we speak {ours_min}..={ours_max}")]
    UnsupportedVersion {
        peer_min: u16,
        peer_max: u16,
        ours_min: u16,
        ours_max: u16,
    },
    /// (client side) The address answered the handshake with something that is not a proxy
    /// handshake answer (another protocol, such as a bookie or an HTTP server). `answer`
    /// describes the bytes received.
    #[error("{addr} is not a Quire proxy (it answered with {answer})")]
    NotAProxy { addr: String, answer: String },
    /// (client side) TLS to the proxy failed: the handshake (an unknown CA, a refused or
    /// missing client certificate, a plaintext port), or the proxy answered a plaintext client
    /// with TLS. `reason` is one line.
    #[error("TLS with {addr}: {reason}")]
    Tls { addr: String, reason: String },
    /// (client side) The TCP connection was accepted but no handshake answer arrived in time
    /// (`ClientConfig::connect_timeout`).
    #[error("{addr} accepted the connection but did not answer the handshake within {} s", fmt_secs(*waited))]
    HandshakeTimeout {
        addr: String,
        waited: std::time::Duration,
    },
    /// A socket operation failed or the connection closed.
    #[error("connection error during {op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// An unexpected internal failure.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// The protocol status code that reports this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::NoSuchStream { .. } => ErrorCode::NoSuchStream,
            Error::StreamExists { .. } => ErrorCode::StreamExists,
            Error::Truncated { .. } => ErrorCode::Truncated,
            Error::EndOfStream { .. } => ErrorCode::EndOfStream,
            Error::InvalidStreamName { .. } => ErrorCode::InvalidStreamName,
            Error::RecordTooLarge { .. } => ErrorCode::RecordTooLarge,
            Error::TxidOutOfOrder { .. } => ErrorCode::TxidOutOfOrder,
            Error::TxidTooFarAhead { .. } => ErrorCode::TxidTooFarAhead,
            Error::ProducerSequenceGap { .. } => ErrorCode::ProducerSequenceGap,
            Error::ProducerSessionExpired { .. } => ErrorCode::ProducerSessionExpired,
            Error::TooManySubscriptions { .. } => ErrorCode::TooManySubscriptions,
            Error::OverCapacity { .. } => ErrorCode::OverCapacity,
            Error::TooManyStreams { .. } => ErrorCode::TooManyStreams,
            Error::RegionUnavailable { .. } => ErrorCode::RegionUnavailable,
            Error::WriteOutcomeUnknown { code, .. } => *code,
            Error::Unauthenticated { .. } => ErrorCode::Unauthenticated,
            Error::RequestDenied { .. } => ErrorCode::RequestDenied,
            Error::BadRequest { .. }
            | Error::Protocol(_)
            | Error::ReservedTxid { .. }
            | Error::NotAProxy { .. }
            | Error::Tls { .. } => ErrorCode::BadRequest,
            Error::Storage { .. } => ErrorCode::Storage,
            Error::Metadata { .. } => ErrorCode::Metadata,
            Error::ShuttingDown => ErrorCode::ServiceUnavailable,
            Error::OwnedElsewhere { .. } | Error::RedirectFailed { .. } => {
                ErrorCode::StreamOwnedElsewhere
            }
            Error::OwnershipLost { .. } => ErrorCode::OwnershipLost,
            Error::Remote { code, .. } => *code,
            Error::UnsupportedVersion { .. } => ErrorCode::UnsupportedVersion,
            Error::Io { .. } | Error::HandshakeTimeout { .. } | Error::Internal(_) => {
                ErrorCode::Internal
            }
        }
    }
}

/// A duration in seconds for messages: `5`, `0.3`.
fn fmt_secs(d: std::time::Duration) -> String {
    if d.subsec_millis() == 0 {
        d.as_secs().to_string()
    } else {
        format!("{}", d.as_millis() as f64 / 1000.0)
    }
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable_and_round_trip() {
        // Goal: freeze the numbers on the wire; method: list them and map each back.
        let numbers: Vec<u16> = ErrorCode::ALL.iter().map(|c| *c as u16).collect();
        assert_eq!(
            numbers,
            [
                0, 302, 400, 401, 403, 413, 426, 500, 503, 504, 506, 507, 510, 511, 512, 514, 517,
                519, 524, 525, 540, 541, 542, 543, 602
            ]
        );
        for c in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_u16(c as u16), Some(c));
        }
        assert_eq!(ErrorCode::from_u16(1), None);
    }
}

//! The ledger client's error type: one variant per way a BookKeeper client operation fails
//! (metadata, bookie status, unreachable or slow bookie, fencing, closed ledger, missing or
//! corrupt entry, dead writer, failed recovery), following BookKeeper's client exceptions.

use std::sync::Arc;

use quire_wire::bookie::Status;
use quire_wire::WireError;

/// Ledger client failures. Display is one line.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The metadata store failed or refused (shared, so that the error stays `Clone` for every
    /// pending add it fails).
    #[error("metadata: {0}")]
    Metadata(#[source] Arc<quire_metadata::Error>),
    /// A bookie answered with an error status.
    #[error("bookie {bookie} answered {status:?}: {message}")]
    Bookie {
        bookie: String,
        status: Status,
        message: String,
    },
    /// A bookie could not be reached or dropped the connection.
    #[error("bookie {bookie} unreachable: {reason}")]
    BookieUnreachable { bookie: String, reason: String },
    /// A bookie did not answer in time.
    #[error("bookie {bookie} did not answer within {after_ms} ms")]
    Timeout { bookie: String, after_ms: u64 },
    /// Fewer writable bookies are registered than the ensemble needs.
    #[error("not enough bookies: ensemble needs {needed}, {available} writable registered")]
    NotEnoughBookies { needed: usize, available: usize },
    /// The ledger was fenced by a recoverer; this writer can add nothing more (BookKeeper
    /// `LedgerFencedException`). An add that failed this way has an unknown outcome.
    #[error("ledger {ledger} is fenced: another writer recovered it")]
    Fenced { ledger: u64 },
    /// The ledger is closed.
    #[error("ledger {ledger} is closed")]
    Closed { ledger: u64 },
    /// Every replica of the entry's write set said it does not exist.
    #[error("ledger {ledger} has no entry {entry}")]
    NoSuchEntry { ledger: u64, entry: u64 },
    /// An entry failed its digest or names the wrong position.
    #[error("ledger {ledger} entry {entry} from bookie {bookie} is corrupt: {reason}")]
    Corrupt {
        ledger: u64,
        entry: u64,
        bookie: String,
        reason: String,
    },
    /// Re-replication found the entry already on the replacement bookie with other bytes than
    /// its source replica; nothing was overwritten (an operator must look at both).
    #[error("ledger {ledger} entry {entry}: bookie {bookie} holds a divergent replica (differs from its source); not overwritten")]
    DivergentReplica {
        ledger: u64,
        entry: u64,
        bookie: String,
    },
    /// Bytes from a bookie did not decode.
    #[error("protocol error: {0}")]
    Protocol(#[source] WireError),
    /// An add could not reach its ack quorum and no replacement bookie could be found (or the
    /// ensemble change itself failed); the writer is dead. Entries after its LAC have an unknown
    /// outcome until the ledger is closed or recovered.
    #[error("ledger {ledger} writer failed at entry {entry}: {reason}")]
    WriterFailed {
        ledger: u64,
        entry: u64,
        reason: String,
    },
    /// Recovery could not establish the ledger's end.
    #[error("recovery of ledger {ledger} failed: {reason}")]
    Recovery { ledger: u64, reason: String },
    /// The placement policy cannot keep its rule with the bookies registered (a
    /// `region-aware` ensemble whose ack quorums would lie in too few regions, a `rack-aware`
    /// one with too few racks, when enforced; see [`crate::placement`]). The message names
    /// the rule and the writable bookies per region.
    #[error("placement: {0}")]
    Placement(String),
    /// Bad arguments (quorum shape, sizes).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl From<quire_metadata::Error> for Error {
    fn from(e: quire_metadata::Error) -> Self {
        Error::Metadata(Arc::new(e))
    }
}

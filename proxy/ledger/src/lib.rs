//! The ledger client: BookKeeper's client semantics over the Quire bookie protocol.
//!
//! * [`BookKeeper::create_ledger`] picks an ensemble of E bookies from the registry and stores
//!   the ledger metadata; [`LedgerWriter::add`] sends entry e to the write set
//!   `(e + i) mod E, i < Qw` and confirms it once Qa of them hold it durably, strictly in entry
//!   order ([`quorum::AckTracker`]); every entry carries the writer's LAC (piggybacked LAC).
//! * [`LedgerWriter::close`] seals the ledger by compare-and-set at its LAC.
//! * [`BookKeeper::open_ledger`] reads entries from any replica of their write set, closest
//!   first ([`locality`]), asking the next one as well after an adaptive speculative timeout.
//! * [`BookKeeper::recover_ledger`] is BookKeeper's open-with-recovery: mark IN_RECOVERY, fence
//!   the last ensemble until the answers cover it, read forward from the LAC with fencing reads
//!   of every replica, re-add each recovered entry to its whole write set (repairing replicas
//!   that hold other bytes, or failing rather than close over one), stop at the first entry
//!   proven missing, and close. Only the last fragment's ensemble is fenced; reads and re-adds go to each
//!   entry's own fragment ([`quire_metadata::LedgerMetadata::fragment_for`]).
//! * Ensemble change (BookKeeper `LedgerHandle.ensembleChangeLoop`, changing immediately as
//!   BookKeeper does without `delayEnsembleChange`): when a bookie of the current ensemble fails
//!   an add (connection error, timeout, any error status but Fenced/Unauthorized, e.g.
//!   ReadOnly), the writer picks a replacement ([`placement`]) among the registered writable
//!   bookies outside the ensemble and not failed recently, appends a fragment starting at
//!   LAC + 1 by compare-and-set (or rewrites the last fragment if it starts there) while the
//!   ledger is OPEN and the failed bookie still in it, and re-sends every pending add to the
//!   replacement, dropping the replaced bookie's acks. Success is held back while the change
//!   runs, so no entry is confirmed on a write set the metadata does not name. With no
//!   replacement the writer goes on while every entry can still reach Qa, and fails past that.
//!   A bookie that misses entries confirmed without it (no replacement, or its add failed after
//!   the entry reached Qa) is reported once per writer to the metadata store
//!   (`MetadataStore::report_under_replicated`) for autorecovery to copy them back.
//!
//! # Threading
//! Everything is `Send + Sync` and runs on tokio.

//!
//! # Modules
//! * `client`: the [`BookKeeper`] handle, its settings, bookie quarantine and connection pool use.
//! * `writer`: ledger creation and the [`LedgerWriter`] add pipeline, confirmation and close.
//! * `ensemble_change`: replacing failed bookies of a writer's ensemble.
//! * `recovery`: fencing, reading forward and closing a ledger whose writer is gone.
//! * `reader`: [`LedgerReader`], reads from a write set and LAC reads.
//! * `rereplicate`: copying a lost bookie's entries of one fragment to a replacement
//!   ([`BookKeeper::replicate_fragment`], autorecovery's replication step).
//! * `long_poll`: long-poll LAC reads with the next entry piggybacked.
//! * [`locality`]: the read order of a write set's replicas (closest first, failed last), pure,
//!   and the cache of the registry's labels.
//! * `speculative`: the adaptive speculative read timeout.
//! * `conn`: pipelined bookie connections, one per lane.
//! * [`placement`], [`quorum`]: replacement choice and ack-quorum bookkeeping, pure.
//! * `error`: [`Error`].

mod client;
mod conn;
mod ensemble_change;
mod error;
pub mod locality;
mod long_poll;
pub mod metrics;
pub mod placement;
pub mod quorum;
mod reader;
mod recovery;
mod rereplicate;
mod speculative;
mod writer;

pub use client::{BookKeeper, ClientConfig, SpeculativeReads};
pub use error::Error;
pub use reader::LedgerReader;
pub use rereplicate::{fragment_range, FragmentReplicated};
pub use writer::{
    ledger_master_key, master_key, new_ledger_secret, AddFuture, LedgerOptions, LedgerWriter,
    LEDGER_SECRET_BYTES,
};

//! Autorecovery (BookKeeper's `replication` package, ../shared/reference/bookkeeper.md §4.1):
//! an auditor that marks the ledgers of lost bookies under-replicated, and replication workers
//! that copy those ledgers' lost replicas back.
//!
//! Every autorecovery daemon (one inside each `quire bookie` by default, BookKeeper's
//! `autoRecoveryDaemonEnabled`, or a `quire autorecovery` process) runs both parts:
//!
//! * **Auditor** (BookKeeper `AuditorElector` + `Auditor`): the daemons elect one auditor
//!   through ZooKeeper (ephemeral-sequential nodes, the lowest wins; when its session ends the
//!   next takes over, within a session timeout). It polls the bookie registry every
//!   `autorecovery_poll_interval_ms`; a bookie it knows (registered earlier, or named in some
//!   ledger's metadata) whose registration has been gone for `lost_bookie_recovery_delay_secs`
//!   is lost: it walks every ledger's metadata and marks each ledger with a fragment on a lost
//!   bookie under-replicated (`UnderReplicationStore::mark_under_replicated`). A new auditor starts the delay
//!   of bookies already gone when it takes over. Every `auditor_periodic_check_interval_secs`
//!   it walks the ledgers again, marking what a lost bookie still holds and, reading the first
//!   and last entry each registered bookie should hold in each fragment with a known end
//!   (BookKeeper's `LedgerChecker`), the ledgers a bookie lacks entries of (one wiped and
//!   registered again with a new cookie).
//! * **Replication worker** (BookKeeper `ReplicationWorker`): claims one marked ledger at a
//!   time with an ephemeral lock (`UnderReplicationStore::try_lock_under_replicated`), and for every fragment
//!   naming a listed bookie that is still unregistered, copies the fragment's entries to a
//!   replacement ([`quire_ledger::BookKeeper::replicate_fragment`]: verified, recovery adds,
//!   then the ensemble by compare-and-set); a listed bookie that is registered and, checked
//!   again, lacks entries gets them copied back in place
//!   ([`quire_ledger::BookKeeper::repair_fragment_in_place`]); then it removes the mark by
//!   compare-and-set (a mark the auditor extended meanwhile stays for another pass). The last
//!   fragment of a ledger that is not closed has no end yet: the ledger is left to its writer
//!   for `open_ledger_rereplication_grace_period_ms` after it was marked, then recovered
//!   (fenced and closed) first, as BookKeeper does. A deleted ledger's mark is simply removed. A failed
//!   ledger is retried after [`REREPLICATE_BACKOFF`] (BookKeeper `rwRereplicateBackoffMs`).

//!
//! The daemon runs on any [`UnderReplicationStore`]: ZooKeeper in a cluster (the bookie's and
//! `quire autorecovery`'s), the embedded store in tests. The `quire` CLI (tools/) only loads
//! the `[autorecovery]` table, overlays flags and prints.
//!
//! Modules: [`config`] (the table and its checked options), [`metrics`], [`auditor`],
//! [`worker`] (the replication worker), [`decommission`], and [`run_daemon`] tying the auditor
//! and the worker to one metadata session.

pub mod auditor;
pub mod config;
mod daemon;
pub mod decommission;
pub mod metrics;
pub mod worker;

pub use auditor::Auditor;
pub use config::{
    AutorecoveryConfig, AutorecoveryOptions, LOST_BOOKIE_RECOVERY_DELAY_SECS_DEFAULT,
    OPEN_LEDGER_GRACE_MS_DEFAULT, PERIODIC_CHECK_INTERVAL_SECS_DEFAULT, POLL_INTERVAL_MS_DEFAULT,
    REREPLICATE_BACKOFF,
};
pub use daemon::run_daemon;
pub use metrics::AutorecoveryMetrics;
pub use quire_metadata::UnderReplicationStore;
pub use worker::{Outcome, Worker};

/// Whether a ledger-client error says the ledger's metadata is gone (the ledger was deleted).
pub(crate) fn is_not_found(e: &quire_ledger::Error) -> bool {
    matches!(e, quire_ledger::Error::Metadata(m) if matches!(**m, quire_metadata::Error::NotFound { .. }))
}

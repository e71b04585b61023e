//! The ledger client's Prometheus metrics (BookKeeper client's `BookKeeperClientStats`:
//! `ADD_ENTRY` latency per bookie, `ADD_ENTRY_TIMEOUT`, `ENSEMBLE_CHANGES`, `LEDGER_RECOVER`,
//! `PENDING_ADDS`), process-wide: every [`crate::BookKeeper`] of the process records into
//! the one set [`metrics`] returns, and a process exposes it with
//! [`LedgerClientMetrics::register`] (the proxy does; docs/metrics.md).
//!
//! Names (OpenMetrics; counters get `_total`):
//! * `quire_ledger_add_latency{bookie}`: histogram, seconds from an add request sent to one
//!   bookie to its reply (successful or not; not timed out). Cardinality: the bookies this
//!   process has connected to (a bookie's three series start at zero on its first
//!   connection, which looks up their handles once for every add on it).
//! * `quire_ledger_add_timeouts{bookie}`: adds to a bookie that got no reply within the
//!   request timeout.
//! * `quire_ledger_add_failures{bookie}`: adds a bookie answered with an error or whose
//!   connection failed (timeouts apart).
//! * `quire_ledger_ensemble_changes`: ensemble changes completed by this process's writers
//!   (a failed bookie replaced in a ledger's ensemble).
//! * `quire_ledger_recoveries{outcome}`: ledger recoveries (fence, read the last entries,
//!   close) run, `ok` or `failed`.
//! * `quire_ledger_pending_adds`: gauge, entries added but not yet acknowledged by an ack
//!   quorum, across this process's writers.
//! * `quire_ledger_speculative_reads`: entry reads sent to one more replica of the write set
//!   because the replicas asked had not answered within the speculative read timeout
//!   (BookKeeper `SPECULATIVE_READ_COUNT`).
//! * `quire_ledger_speculative_read_wins`: reads whose first good answer came from a replica
//!   asked speculatively (the speculation helped).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds of the add latency buckets, in seconds (the bookie's, so panels line up).
const LATENCY_BUCKETS_SECONDS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BookieLabels {
    bookie: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS_SECONDS)
}

/// The ledger client's metrics; see the module documentation.
#[derive(Debug)]
pub struct LedgerClientMetrics {
    add_latency: Family<BookieLabels, Histogram, fn() -> Histogram>,
    add_timeouts: Family<BookieLabels, Counter>,
    add_failures: Family<BookieLabels, Counter>,
    ensemble_changes: Counter,
    recoveries: Family<OutcomeLabels, Counter>,
    pending_adds: Gauge,
    speculative_reads: Counter,
    speculative_read_wins: Counter,
}

/// The process's ledger client metrics.
pub fn metrics() -> &'static LedgerClientMetrics {
    static METRICS: OnceLock<LedgerClientMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let m = LedgerClientMetrics {
            add_latency: Family::new_with_constructor(latency_histogram),
            add_timeouts: Family::default(),
            add_failures: Family::default(),
            ensemble_changes: Counter::default(),
            recoveries: Family::default(),
            pending_adds: Gauge::default(),
            speculative_reads: Counter::default(),
            speculative_read_wins: Counter::default(),
        };
        for outcome in ["ok", "failed"] {
            let _ = m.recoveries.get_or_create(&OutcomeLabels { outcome });
        }
        m
    })
}

/// How an add sent to one bookie ended, for [`BookieAddMetrics::add_done`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddOutcome {
    Replied,
    Failed,
    TimedOut,
}

impl LedgerClientMetrics {
    /// Registers the metrics in `registry` (once per registry).
    pub fn register(&'static self, registry: &mut Registry) {
        registry.register(
            "quire_ledger_add_latency",
            "Seconds from an add sent to a bookie to its reply, by bookie",
            self.add_latency.clone(),
        );
        registry.register(
            "quire_ledger_add_timeouts",
            "Adds to a bookie that got no reply within the request timeout, by bookie",
            self.add_timeouts.clone(),
        );
        registry.register(
            "quire_ledger_add_failures",
            "Adds a bookie answered with an error or whose connection failed, by bookie",
            self.add_failures.clone(),
        );
        registry.register(
            "quire_ledger_ensemble_changes",
            "Ensemble changes completed (a failed bookie replaced in a ledger's ensemble)",
            self.ensemble_changes.clone(),
        );
        registry.register(
            "quire_ledger_recoveries",
            "Ledger recoveries (fence, read the last entries, close) run, by outcome",
            self.recoveries.clone(),
        );
        registry.register(
            "quire_ledger_pending_adds",
            "Entries added and not yet acknowledged by an ack quorum",
            self.pending_adds.clone(),
        );
        registry.register(
            "quire_ledger_speculative_reads",
            "Entry reads sent to one more replica after the speculative read timeout",
            self.speculative_reads.clone(),
        );
        registry.register(
            "quire_ledger_speculative_read_wins",
            "Entry reads whose first good answer came from a replica asked speculatively",
            self.speculative_read_wins.clone(),
        );
    }

    /// The handles of `bookie`'s series, looked up once (one label allocation and one family
    /// lock per series) and kept by each connection to that bookie, so that an add records
    /// without either ([`BookieAddMetrics::add_done`]).
    pub(crate) fn for_bookie(&self, bookie: &str) -> Arc<BookieAddMetrics> {
        let labels = BookieLabels {
            bookie: bookie.to_string(),
        };
        Arc::new(BookieAddMetrics {
            latency: self.add_latency.get_or_create(&labels).clone(),
            timeouts: self.add_timeouts.get_or_create(&labels).clone(),
            failures: self.add_failures.get_or_create(&labels).clone(),
        })
    }

    /// Counts a completed ensemble change.
    pub(crate) fn ensemble_changed(&self) {
        self.ensemble_changes.inc();
    }

    /// Counts a read sent speculatively.
    pub(crate) fn speculative_read_sent(&self) {
        self.speculative_reads.inc();
    }

    /// Counts a read a speculatively asked replica answered first.
    pub(crate) fn speculative_read_won(&self) {
        self.speculative_read_wins.inc();
    }

    /// Counts a recovery run.
    pub(crate) fn recovered(&self, ok: bool) {
        let outcome = if ok { "ok" } else { "failed" };
        self.recoveries
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }
}

/// One bookie's add series (`quire_ledger_add_latency`, `_timeouts`, `_failures` with its
/// `bookie` label): handles into the families, which share their values with them.
#[derive(Debug)]
pub(crate) struct BookieAddMetrics {
    latency: Histogram,
    timeouts: Counter,
    failures: Counter,
}

impl BookieAddMetrics {
    /// Records an add sent to this bookie that ended as `outcome` after `took`: a timeout is
    /// counted only; a failure is counted and timed; a reply is timed.
    pub(crate) fn add_done(&self, took: Duration, outcome: AddOutcome) {
        match outcome {
            AddOutcome::TimedOut => {
                self.timeouts.inc();
                return;
            }
            AddOutcome::Failed => {
                self.failures.inc();
            }
            AddOutcome::Replied => {}
        }
        self.latency.observe(took.as_secs_f64());
    }
}

/// One entry in `quire_ledger_pending_adds` while it lives.
#[derive(Debug)]
pub(crate) struct PendingAdd(());

impl PendingAdd {
    pub(crate) fn new() -> Self {
        metrics().pending_adds.inc();
        Self(())
    }
}

impl Drop for PendingAdd {
    fn drop(&mut self) {
        metrics().pending_adds.dec();
    }
}

//! Autorecovery metrics, registered in the process's Prometheus registry by the CLI.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Autorecovery metrics (named after BookKeeper's `ReplicationStats`).
#[derive(Clone, Debug, Default)]
pub struct AutorecoveryMetrics {
    /// Ledgers marked under-replicated, as this daemon last listed them.
    pub under_replicated_ledgers: Gauge,
    /// Entry bytes written to replacement bookies by this daemon's worker.
    pub bytes_written: Counter,
    /// Entries written to replacement bookies.
    pub entries_written: Counter,
    /// Fragments whose lost bookie this worker replaced.
    pub fragments_replicated: Counter,
    /// Fragments whose registered bookie lacked entries and got them copied back.
    pub fragments_repaired: Counter,
}

impl AutorecoveryMetrics {
    /// Registers the metrics in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "auditor_NUM_UNDER_REPLICATED_LEDGERS",
            "Ledgers marked under-replicated (as this daemon last listed them)",
            self.under_replicated_ledgers.clone(),
        );
        registry.register(
            "replication_worker_NUM_BYTES_WRITTEN",
            "Entry bytes copied to replacement bookies by re-replication",
            self.bytes_written.clone(),
        );
        registry.register(
            "replication_worker_NUM_ENTRIES_WRITTEN",
            "Entries copied to replacement bookies by re-replication",
            self.entries_written.clone(),
        );
        registry.register(
            "replication_worker_NUM_FRAGMENTS_REPLICATED",
            "Ledger fragments whose lost bookie was replaced",
            self.fragments_replicated.clone(),
        );
        registry.register(
            "replication_worker_NUM_FRAGMENTS_REPAIRED_IN_PLACE",
            "Ledger fragments whose registered bookie lacked entries and got them copied back",
            self.fragments_repaired.clone(),
        );
    }
}

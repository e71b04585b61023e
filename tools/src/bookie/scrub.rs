//! The metadata side of a bookie's scrubber (quire_bookie's `scrub` module): each ledger a
//! scrub pass found damaged entries of is marked under-replicated naming this bookie
//! (BookKeeper `markLedgerUnderreplicated`). A replication worker then claims the mark and,
//! the bookie being registered, copies the entries it cannot read back onto it in place
//! (`BookKeeper::repair_fragment_in_place`, ARCHITECTURE.md "Scrubber").

use std::sync::Arc;
use std::time::Duration;

use quire_bookie::DamagedLedgerReports;
use quire_metadata::{BookieId, ZkStore};
use quire_wire::LedgerId;

use crate::config::MetadataAddress;

/// Longest wait for one mark; past it the ledger is marked again after the next pass.
const MARK_TIMEOUT: Duration = Duration::from_secs(30);

/// Marks every reported ledger until the bookie stops. `store` is used until a mark fails; the
/// next report then connects anew (an expired session).
pub async fn mark_damaged_ledgers(
    reports: DamagedLedgerReports,
    store: Arc<ZkStore>,
    address: MetadataAddress,
    bookie: BookieId,
) {
    let mut store = Some(store);
    while let Some(ledger) = reports.next().await {
        if store.is_none() {
            match address.connect_zk().await {
                Ok(s) => store = Some(s),
                Err(e) => {
                    tracing::warn!(ledger, error = %e, "scrub: metadata store unreachable; the damaged ledger is marked after the next pass");
                    continue;
                }
            }
        }
        let s = store.clone().expect("connected above");
        let marked = tokio::time::timeout(
            MARK_TIMEOUT,
            s.mark_under_replicated(LedgerId(ledger), std::slice::from_ref(&bookie)),
        )
        .await;
        match marked {
            Ok(Ok(())) => {
                tracing::warn!(ledger, bookie = %bookie, "scrub: ledger with damaged entries marked under-replicated for repair")
            }
            Ok(Err(e)) => {
                tracing::warn!(ledger, error = %e, "scrub: cannot mark the damaged ledger under-replicated");
                store = None;
            }
            Err(_) => {
                tracing::warn!(ledger, "scrub: marking the damaged ledger timed out");
                store = None;
            }
        }
    }
}

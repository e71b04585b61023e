//! Retiring a bookie (BookKeeper `decommissionbookie`, but with the bookie still up, so that
//! its replicas are also a source) and deleting a wiped bookie's cookie (BookKeeper
//! `cookie_delete`). The replication workers do the copying; this module records the
//! decommission, marks the bookie's ledgers and waits until no ledger's metadata names it.

use std::collections::HashSet;
use std::time::Duration;

use quire_metadata::{BookieId, UnderReplicationStore};

/// Why a decommission or a cookie deletion stopped.
#[derive(Debug, thiserror::Error)]
pub enum DecommissionError {
    /// The bookie has no cookie and no decommission of it was under way.
    #[error("bookie {0} has no cookie: not a bookie of this cluster, or decommissioned already")]
    NoCookie(BookieId),
    /// `delete_cookie` of a bookie that is registered.
    #[error("bookie {0} is registered (it runs): stop it before deleting its cookie")]
    Registered(BookieId),
    /// The timeout passed with ledgers still naming the bookie; a second run resumes.
    #[error("decommission of {bookie} not finished: {naming} ledgers still name it; run the command again to resume")]
    NotFinished {
        /// The bookie being decommissioned.
        bookie: BookieId,
        /// Ledgers whose metadata still names it.
        naming: usize,
    },
    /// A metadata operation failed (`what` says which).
    #[error("{what}: {source}")]
    Metadata {
        /// The step, as a sentence fragment ("cannot read the bookie's cookie").
        what: &'static str,
        /// The store's error.
        source: quire_metadata::Error,
    },
}

fn metadata(what: &'static str) -> impl FnOnce(quire_metadata::Error) -> DecommissionError {
    move |source| DecommissionError::Metadata { what, source }
}

/// What a decommission reports while it runs (the CLI prints these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// The decommission is recorded: `fresh` when it starts, not when it resumes.
    Started {
        /// `false` for a resumed decommission.
        fresh: bool,
    },
    /// No autorecovery daemon is in the election: nothing copies until one runs.
    NoDaemon,
    /// This many ledgers still name the bookie (reported when the count changes).
    Remaining(usize),
    /// A fragment of `ledger` naming the bookie has no replacement: every writable registered
    /// bookie that is not being decommissioned is in its ensemble already, so a worker cannot
    /// copy it until another bookie registers (reported once per ledger).
    NoReplacement {
        /// The ledger.
        ledger: quire_wire::LedgerId,
        /// The fragment's first entry.
        first_entry: u64,
    },
}

/// How a decommission runs.
#[derive(Debug, Clone, Copy)]
pub struct DecommissionOptions {
    /// Give up after this long (a second run resumes); `None`: as long as it takes.
    pub timeout: Option<Duration>,
    /// How often the ledgers are walked again.
    pub poll_interval: Duration,
}

impl Default for DecommissionOptions {
    fn default() -> Self {
        Self {
            timeout: None,
            poll_interval: Duration::from_secs(1),
        }
    }
}

/// Decommissions `bookie`: records the decommission, removes the bookie's registration (no
/// new ledger picks it; it goes on serving the ledgers it is in), then until no ledger's
/// metadata names it marks every ledger that does under-replicated for it (the replication
/// workers treat a decommissioning bookie as lost), reporting [`Progress`]; finally deletes
/// its cookie and ends the decommission, so that it can be stopped and its disks reused. A
/// second call resumes.
///
/// # Errors
/// [`DecommissionError::NoCookie`] for a bookie without a cookie (and no decommission under
/// way), [`DecommissionError::NotFinished`] when the timeout passes, `Metadata` otherwise.
pub async fn decommission(
    store: &dyn UnderReplicationStore,
    bookie: &BookieId,
    options: DecommissionOptions,
    report: &mut (dyn FnMut(Progress) + Send),
) -> Result<(), DecommissionError> {
    begin(store, bookie, report).await?;
    let deadline = options.timeout.map(|t| quire_clock::now() + t);
    let mut last_count = None;
    let mut unplaceable = HashSet::new();
    loop {
        let pass = mark_pass(store, bookie).await?;
        for (ledger, first_entry) in pass.no_replacement {
            if unplaceable.insert(ledger) {
                report(Progress::NoReplacement {
                    ledger,
                    first_entry,
                });
            }
        }
        if pass.naming == 0 {
            break;
        }
        if last_count != Some(pass.naming) {
            report(Progress::Remaining(pass.naming));
            last_count = Some(pass.naming);
        }
        if deadline.is_some_and(|d| quire_clock::now() >= d) {
            return Err(DecommissionError::NotFinished {
                bookie: bookie.clone(),
                naming: pass.naming,
            });
        }
        tokio::time::sleep(options.poll_interval).await;
    }
    finish(store, bookie).await
}

/// Records the decommission and removes the registration.
async fn begin(
    store: &dyn UnderReplicationStore,
    bookie: &BookieId,
    report: &mut (dyn FnMut(Progress) + Send),
) -> Result<(), DecommissionError> {
    let cookie = match store.read_cookie(bookie).await {
        Ok(c) => Some(c),
        Err(quire_metadata::Error::NotFound { .. }) => None,
        Err(e) => return Err(metadata("cannot read the bookie's cookie")(e)),
    };
    let fresh = store
        .start_decommission(bookie)
        .await
        .map_err(metadata("cannot record the decommission"))?;
    if cookie.is_none() && fresh {
        store
            .end_decommission(bookie)
            .await
            .map_err(metadata("cannot end the decommission"))?;
        return Err(DecommissionError::NoCookie(bookie.clone()));
    }
    report(Progress::Started { fresh });
    match store.unregister_bookie(bookie).await {
        Ok(()) | Err(quire_metadata::Error::NotFound { .. }) => {}
        Err(e) => return Err(metadata("cannot remove the bookie's registration")(e)),
    }
    let state = store
        .autorecovery_state()
        .await
        .map_err(metadata("cannot read the autorecovery state"))?;
    if state.candidates.is_empty() {
        report(Progress::NoDaemon);
    }
    Ok(())
}

/// One walk: the ledgers naming the bookie (each marked) and the fragments no bookie can take.
struct Pass {
    naming: usize,
    no_replacement: Vec<(quire_wire::LedgerId, u64)>,
}

async fn mark_pass(
    store: &dyn UnderReplicationStore,
    bookie: &BookieId,
) -> Result<Pass, DecommissionError> {
    let spares = candidates(store).await?;
    let mut pass = Pass {
        naming: 0,
        no_replacement: Vec::new(),
    };
    let ledgers = store
        .list_ledgers()
        .await
        .map_err(metadata("cannot list ledgers"))?;
    for ledger in ledgers {
        let meta = match store.read_ledger(ledger).await {
            Ok(v) => v.value,
            Err(quire_metadata::Error::NotFound { .. }) => continue,
            Err(e) => return Err(metadata("cannot read a ledger")(e)),
        };
        let naming: Vec<_> = meta
            .fragments
            .iter()
            .filter(|f| f.bookies.contains(bookie))
            .collect();
        if naming.is_empty() {
            continue;
        }
        pass.naming += 1;
        // A replacement is a writable registered bookie outside the fragment's ensemble
        // (BookKeeper's placement never puts one bookie twice in an ensemble).
        if let Some(f) = naming
            .iter()
            .find(|f| spares.iter().all(|s| f.bookies.contains(s)))
        {
            pass.no_replacement.push((ledger, f.first_entry));
        }
        store
            .mark_under_replicated(ledger, std::slice::from_ref(bookie))
            .await
            .map_err(metadata("cannot mark a ledger under-replicated"))?;
    }
    Ok(pass)
}

/// Writable registered bookies not being decommissioned: where replicas can go.
async fn candidates(store: &dyn UnderReplicationStore) -> Result<Vec<BookieId>, DecommissionError> {
    let leaving: HashSet<BookieId> = store
        .decommissioning()
        .await
        .map_err(metadata("cannot list decommissions"))?
        .into_iter()
        .collect();
    Ok(store
        .list_bookies()
        .await
        .map_err(metadata("cannot list bookies"))?
        .into_iter()
        .filter(|b| !b.read_only && !leaving.contains(&b.id))
        .map(|b| b.id)
        .collect())
}

/// Deletes the cookie and ends the decommission.
async fn finish(
    store: &dyn UnderReplicationStore,
    bookie: &BookieId,
) -> Result<(), DecommissionError> {
    if let Ok(c) = store.read_cookie(bookie).await {
        match store.delete_cookie(bookie, c.version).await {
            Ok(()) | Err(quire_metadata::Error::NotFound { .. }) => {}
            Err(e) => return Err(metadata("cannot delete the bookie's cookie")(e)),
        }
    }
    store
        .end_decommission(bookie)
        .await
        .map_err(metadata("cannot end the decommission"))
}

/// Deletes the cookie of a bookie that is not registered (BookKeeper's `cookie_delete`), so
/// that a bookie whose disks were wiped or replaced can start on empty directories under the
/// same id and register with a new cookie; the auditor's periodic check then finds the
/// replicas it lacks and the workers copy them back.
///
/// # Errors
/// [`DecommissionError::Registered`] (stop it first), [`DecommissionError::NoCookie`], or
/// `Metadata`.
pub async fn delete_cookie(
    store: &dyn UnderReplicationStore,
    bookie: &BookieId,
) -> Result<(), DecommissionError> {
    let registered = store
        .list_bookies()
        .await
        .map_err(metadata("cannot list bookies"))?;
    if registered.iter().any(|b| b.id == *bookie) {
        return Err(DecommissionError::Registered(bookie.clone()));
    }
    let cookie = match store.read_cookie(bookie).await {
        Ok(c) => c,
        Err(quire_metadata::Error::NotFound { .. }) => {
            return Err(DecommissionError::NoCookie(bookie.clone()))
        }
        Err(e) => return Err(metadata("cannot read the bookie's cookie")(e)),
    };
    store
        .delete_cookie(bookie, cookie.version)
        .await
        .map_err(metadata("cannot delete the bookie's cookie"))
}

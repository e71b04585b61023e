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
    /// Refused up front: the writable bookies left cannot hold an ensemble the decommission
    /// must rewrite (nothing was changed; the bookie stays registered and writable).
    #[error("ledger {ledger}'s ensemble needs {ensemble} bookies; {writable} writable bookies remain besides {bookie}, all in that ensemble already{more}: add a bookie first")]
    NoRoom {
        /// The bookie to decommission.
        bookie: BookieId,
        /// The first ledger with a fragment no bookie can take.
        ledger: quire_wire::LedgerId,
        /// That fragment's ensemble size.
        ensemble: usize,
        /// Writable registered bookies besides `bookie` not being decommissioned.
        writable: usize,
        /// " (and N more ledgers like it)", or empty.
        more: String,
    },
    /// Refused up front: fewer writable bookies would remain than the ensemble the proxies
    /// create ledgers with (the largest ensemble size among open ledgers), so new streams and
    /// segment rolls would fail (nothing was changed).
    #[error("new ledgers need {ensemble} bookies (ledger {ledger} is open with ensemble size {ensemble}); {writable} writable bookies remain besides {bookie}: add a bookie first")]
    TooFewForEnsemble {
        /// The bookie to decommission.
        bookie: BookieId,
        /// An open ledger with the largest ensemble size.
        ledger: quire_wire::LedgerId,
        /// Its ensemble size.
        ensemble: usize,
        /// Writable registered bookies besides `bookie` not being decommissioned.
        writable: usize,
    },
    /// A resumed decommission refused by the same check as a new one (`source`); its record
    /// stays, so the bookie stays out of the registry until it is cancelled or finishes.
    #[error("{source}; the decommission stays under way (bookie unregistered): run again once a bookie is added, or cancel it with --cancel")]
    ResumeRefused {
        /// The refusal ([`DecommissionError::NoRoom`] or
        /// [`DecommissionError::TooFewForEnsemble`]).
        source: Box<DecommissionError>,
    },
    /// `cancel` of a bookie with no decommission under way.
    #[error("no decommission of bookie {0} is under way")]
    NotDecommissioning(BookieId),
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
    /// This many ledgers still name the bookie, and the workers copied this much off it so far
    /// (reported when either changes).
    Remaining {
        /// Ledgers whose metadata still names the bookie.
        ledgers: usize,
        /// Entry bytes copied off the bookie so far (the decommission record's).
        bytes_copied: u64,
        /// Of the ledgers left, the open ones (still written): their last fragment is left to
        /// the writer for the grace period, then the ledger is recovered first.
        open: usize,
    },
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
/// second call resumes. Before it starts or resumes, [`check_room`] refuses one the remaining
/// writable bookies cannot hold. Returns the entry bytes the workers copied off the bookie.
///
/// # Errors
/// [`DecommissionError::NoCookie`] for a bookie without a cookie (and no decommission under
/// way), [`DecommissionError::NoRoom`] or [`DecommissionError::TooFewForEnsemble`] (refused,
/// nothing changed), [`DecommissionError::ResumeRefused`] (a resumed one refused so; its
/// record stays),
/// [`DecommissionError::NotFinished`] when the timeout passes, `Metadata` otherwise.
pub async fn decommission(
    store: &dyn UnderReplicationStore,
    bookie: &BookieId,
    options: DecommissionOptions,
    report: &mut (dyn FnMut(Progress) + Send),
) -> Result<u64, DecommissionError> {
    begin(store, bookie, report).await?;
    let deadline = options.timeout.map(|t| quire_clock::now() + t);
    let mut last = None;
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
        let now = Progress::Remaining {
            ledgers: pass.naming,
            bytes_copied: copied(store, bookie).await?,
            open: pass.open,
        };
        if last.as_ref() != Some(&now) {
            report(now.clone());
            last = Some(now);
        }
        if deadline.is_some_and(|d| quire_clock::now() >= d) {
            return Err(DecommissionError::NotFinished {
                bookie: bookie.clone(),
                naming: pass.naming,
            });
        }
        tokio::time::sleep(options.poll_interval).await;
    }
    let bytes = copied(store, bookie).await?;
    finish(store, bookie).await?;
    Ok(bytes)
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
    let under_way = store
        .decommissioning()
        .await
        .map_err(metadata("cannot list decommissions"))?
        .contains(bookie);
    // Checked before anything changes, so that a refusal leaves the bookie as it was; a
    // resumed one (its record exists) is checked again, since bookies may have gone since.
    if cookie.is_some() {
        check_room(store, bookie).await.map_err(|e| match e {
            e @ DecommissionError::Metadata { .. } => e,
            e if under_way => DecommissionError::ResumeRefused {
                source: Box::new(e),
            },
            e => e,
        })?;
    }
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

/// Bytes copied off `bookie` so far, from its decommission record.
async fn copied(
    store: &dyn UnderReplicationStore,
    bookie: &BookieId,
) -> Result<u64, DecommissionError> {
    Ok(store
        .decommissions()
        .await
        .map_err(metadata("cannot read the decommission record"))?
        .into_iter()
        .find(|(b, _)| b == bookie)
        .map_or(0, |(_, d)| d.bytes_copied))
}

/// One walk: the ledgers naming the bookie (each marked), how many of them are open, and the
/// fragments no bookie can take.
struct Pass {
    naming: usize,
    open: usize,
    no_replacement: Vec<(quire_wire::LedgerId, u64)>,
}

async fn mark_pass(
    store: &dyn UnderReplicationStore,
    bookie: &BookieId,
) -> Result<Pass, DecommissionError> {
    let spares = candidates(store).await?;
    let mut pass = Pass {
        naming: 0,
        open: 0,
        no_replacement: Vec::new(),
    };
    let mut to_mark = Vec::new();
    quire_metadata::walk_ledgers(store, |ledger, meta| {
        let naming: Vec<_> = meta
            .fragments
            .iter()
            .filter(|f| f.bookies.contains(bookie))
            .collect();
        if naming.is_empty() {
            return;
        }
        pass.naming += 1;
        if meta.state != quire_metadata::LedgerState::Closed {
            pass.open += 1;
        }
        // A replacement is a writable registered bookie outside the fragment's ensemble
        // (BookKeeper's placement never puts one bookie twice in an ensemble).
        if let Some(f) = naming
            .iter()
            .find(|f| spares.iter().all(|s| f.bookies.contains(s)))
        {
            pass.no_replacement.push((ledger, f.first_entry));
        }
        to_mark.push(ledger);
    })
    .await
    .map_err(metadata("cannot read the ledgers' metadata"))?;
    for ledger in to_mark {
        store
            .mark_under_replicated(ledger, std::slice::from_ref(bookie))
            .await
            .map_err(metadata("cannot mark a ledger under-replicated"))?;
    }
    Ok(pass)
}

/// Refuses a decommission the cluster has no room for (nothing changed yet):
/// * every fragment naming `bookie` needs a replacement outside its ensemble among the
///   writable registered bookies other than `bookie` not being decommissioned (BookKeeper's
///   placement never puts one bookie twice in an ensemble), or its worker would wait for ever;
/// * those bookies must be at least the ensemble size the proxies create ledgers with, known
///   here as the largest ensemble size among open ledgers (each proxy's current segments),
///   or new ledgers (new streams, segment rolls, ensemble changes) would fail.
///
/// A cluster with no open ledger gives no ensemble size: only the first rule applies.
///
/// # Errors
/// [`DecommissionError::NoRoom`] naming the first stuck ledger, else
/// [`DecommissionError::TooFewForEnsemble`], or `Metadata`.
pub async fn check_room(
    store: &dyn UnderReplicationStore,
    bookie: &BookieId,
) -> Result<(), DecommissionError> {
    let spares: Vec<BookieId> = candidates(store)
        .await?
        .into_iter()
        .filter(|b| b != bookie)
        .collect();
    let mut stuck: Vec<(quire_wire::LedgerId, usize)> = Vec::new();
    let mut widest_open: Option<(quire_wire::LedgerId, usize)> = None;
    quire_metadata::walk_ledgers(store, |ledger, meta| {
        let ensemble = usize::from(meta.ensemble_size);
        if meta.state == quire_metadata::LedgerState::Open
            && widest_open.is_none_or(|(_, e)| ensemble > e)
        {
            widest_open = Some((ledger, ensemble));
        }
        let no_room = meta
            .fragments
            .iter()
            .find(|f| f.bookies.contains(bookie) && spares.iter().all(|s| f.bookies.contains(s)));
        if let Some(f) = no_room {
            stuck.push((ledger, f.bookies.len()));
        }
    })
    .await
    .map_err(metadata("cannot read the ledgers' metadata"))?;
    if let Some(&(ledger, ensemble)) = stuck.first() {
        let more = match stuck.len() - 1 {
            0 => String::new(),
            1 => " (and 1 more ledger like it)".into(),
            n => format!(" (and {n} more ledgers like it)"),
        };
        return Err(DecommissionError::NoRoom {
            bookie: bookie.clone(),
            ledger,
            ensemble,
            writable: spares.len(),
            more,
        });
    }
    match widest_open {
        Some((ledger, ensemble)) if spares.len() < ensemble => {
            Err(DecommissionError::TooFewForEnsemble {
                bookie: bookie.clone(),
                ledger,
                ensemble,
                writable: spares.len(),
            })
        }
        _ => Ok(()),
    }
}

/// Cancels the decommission of `bookie` (puts it back): ends its record, so that the bookie,
/// which watches it, registers again (writable unless its disks are full); and removes the
/// under-replication marks that name only it (their ledgers have nothing else to copy; a
/// worker would only check it in place). What the workers copied already stays where it is:
/// the ledgers it moved simply no longer name the bookie. A decommission whose cookie was
/// deleted (finished) cannot be cancelled.
///
/// # Errors
/// [`DecommissionError::NotDecommissioning`], or `Metadata`.
pub async fn cancel(
    store: &dyn UnderReplicationStore,
    bookie: &BookieId,
) -> Result<(), DecommissionError> {
    let under_way = store
        .decommissioning()
        .await
        .map_err(metadata("cannot list decommissions"))?;
    if !under_way.contains(bookie) {
        return Err(DecommissionError::NotDecommissioning(bookie.clone()));
    }
    store
        .end_decommission(bookie)
        .await
        .map_err(metadata("cannot end the decommission"))?;
    let marks = store
        .list_under_replicated()
        .await
        .map_err(metadata("cannot list under-replicated ledgers"))?;
    for (ledger, mark) in marks {
        let m = &mark.value;
        if m.gaps_on.is_empty() && m.missing_bookies == std::slice::from_ref(bookie) {
            match store.clear_under_replicated(ledger, mark.version).await {
                // Extended meanwhile (another bookie lost): it stays for the workers.
                Ok(()) | Err(quire_metadata::Error::BadVersion { .. }) => {}
                Err(e) => return Err(metadata("cannot clear an under-replication mark")(e)),
            }
        }
    }
    Ok(())
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

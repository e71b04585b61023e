//! The auditor (BookKeeper `AuditorElector` + `Auditor`): elected among the daemons, it polls
//! the bookie registry, marks the ledgers of bookies gone longer than
//! `lost_bookie_recovery_delay`, and now and then walks every ledger checking that each
//! registered bookie holds the entries its fragments give it (BookKeeper's `LedgerChecker`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use quire_ledger::BookKeeper;
use quire_metadata::{BookieId, LedgerMetadata, UnderReplicationStore};
use quire_wire::LedgerId;

use crate::{is_not_found, AutorecoveryMetrics, AutorecoveryOptions};

/// Waits to be elected auditor as `name`, then audits every `poll_interval` until an error it
/// cannot go on from (its election place is gone: the daemon starts over).
///
/// # Errors
/// The election cannot be joined or read, or this candidate is no longer the auditor.
pub async fn run(
    store: &dyn UnderReplicationStore,
    bk: &BookKeeper,
    name: &str,
    options: &AutorecoveryOptions,
    metrics: &AutorecoveryMetrics,
) -> Result<()> {
    let candidate = store
        .join_auditor_election(name)
        .await
        .context("cannot join the auditor election")?;
    candidate.wait_until_elected().await?;
    tracing::info!(%name, "elected auditor");
    eprintln!("quire autorecovery: {name} is the auditor");
    let mut auditor = Auditor::new(options.clone());
    loop {
        if let Err(e) = auditor.audit_once(store, bk).await {
            tracing::warn!(error = %format!("{e:#}"), "audit failed; retrying");
        }
        match store.list_under_replicated().await {
            Ok(marks) => {
                metrics.under_replicated_ledgers.set(marks.len() as i64);
            }
            Err(e) => tracing::debug!(error = %e, "cannot count under-replicated ledgers"),
        }
        tokio::time::sleep(options.poll_interval).await;
        if !candidate.is_elected().await? {
            bail!("no longer the auditor (its election node is gone)");
        }
    }
}

/// What one [`Auditor::audit_once`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AuditPass {
    /// Whether it walked the ledgers (a lost bookie's delay ran out, or the periodic check).
    pub walked: bool,
    /// Whether the walk was the periodic check (replicas of registered bookies read too).
    pub full_check: bool,
    /// Ledgers it marked (or whose marks it extended).
    pub marked: usize,
}

/// The auditor's memory between two polls.
#[derive(Debug)]
pub struct Auditor {
    options: AutorecoveryOptions,
    /// Bookies seen registered, or named in a ledger's metadata.
    known: BTreeSet<BookieId>,
    /// Known bookies not registered now, with when this auditor first saw them gone.
    lost_since: HashMap<BookieId, Instant>,
    /// Lost bookies whose ledgers were marked.
    published: HashSet<BookieId>,
    /// When the next periodic check is due (the first poll makes one).
    next_full_check: Instant,
}

/// One walk's fixed inputs.
struct Walk<'a> {
    registered: &'a HashSet<BookieId>,
    lost: HashSet<BookieId>,
    full_check: bool,
    now: Instant,
}

impl Auditor {
    /// A new auditor: it knows no bookie yet, so the delay of a bookie already gone starts at
    /// its first poll; its first poll is a periodic check.
    pub fn new(options: AutorecoveryOptions) -> Self {
        Self {
            options,
            known: BTreeSet::new(),
            lost_since: HashMap::new(),
            published: HashSet::new(),
            next_full_check: quire_clock::now(),
        }
    }

    /// One poll of the registry; walks the ledgers when a lost bookie's delay ran out or the
    /// periodic check is due. The periodic check also reads, from every registered bookie of
    /// every fragment with a known end, the first and last entry it should hold there
    /// ([`BookKeeper::bookies_missing_entries`]), and marks the ledger for a bookie that
    /// lacks one.
    ///
    /// # Errors
    /// The registry or the ledger list cannot be read, or a mark cannot be written (the next
    /// poll tries again: nothing is counted as published before its marks are written).
    pub async fn audit_once(
        &mut self,
        store: &dyn UnderReplicationStore,
        bk: &BookKeeper,
    ) -> Result<AuditPass> {
        let registered: HashSet<BookieId> = store
            .list_bookies()
            .await
            .context("cannot list bookies")?
            .into_iter()
            .map(|b| b.id)
            .collect();
        let now = quire_clock::now();
        let overdue = self.track_registry(&registered, now);
        let full_check = now >= self.next_full_check;
        if overdue.is_empty() && !full_check {
            return Ok(AuditPass::default());
        }
        let lost = self.published.iter().chain(&overdue).cloned().collect();
        let walk = Walk {
            registered: &registered,
            lost,
            full_check,
            now,
        };
        let marked = self.walk_ledgers(store, bk, &walk).await?;
        self.publish(overdue, marked);
        if full_check {
            let every = self.options.periodic_check_interval;
            self.next_full_check = now + every.unwrap_or(Duration::from_secs(u64::from(u32::MAX)));
        }
        Ok(AuditPass {
            walked: true,
            full_check,
            marked,
        })
    }

    /// Updates what is known from the registry; returns the lost bookies whose delay ran out
    /// and whose ledgers are not marked yet.
    fn track_registry(&mut self, registered: &HashSet<BookieId>, now: Instant) -> Vec<BookieId> {
        self.known.extend(registered.iter().cloned());
        for b in registered {
            if self.lost_since.remove(b).is_some() {
                tracing::info!(bookie = %b, "bookie registered again");
            }
            self.published.remove(b);
        }
        let delay = self.options.lost_bookie_recovery_delay;
        for b in self.known.iter().filter(|b| !registered.contains(*b)) {
            self.lost_since.entry(b.clone()).or_insert_with(|| {
                tracing::info!(bookie = %b, delay_secs = delay.as_secs(), "bookie gone; its ledgers are marked under-replicated once the delay passes");
                now
            });
        }
        self.lost_since
            .iter()
            .filter(|(b, since)| {
                !self.published.contains(*b) && now.duration_since(**since) >= delay
            })
            .map(|(b, _)| b.clone())
            .collect()
    }

    /// Marks every ledger with a fragment on a lost bookie (and, in a periodic check, every
    /// ledger a registered bookie lacks entries of); returns how many.
    async fn walk_ledgers(
        &mut self,
        store: &dyn UnderReplicationStore,
        bk: &BookKeeper,
        walk: &Walk<'_>,
    ) -> Result<usize> {
        let mut marked = 0usize;
        for id in store.list_ledgers().await.context("cannot list ledgers")? {
            let meta = match store.read_ledger(id).await {
                Ok(v) => v.value,
                Err(quire_metadata::Error::NotFound { .. }) => continue,
                Err(e) => return Err(e).with_context(|| format!("cannot read ledger {id}")),
            };
            let Some(missing) = self.missing_of(bk, id, &meta, walk).await else {
                continue;
            };
            if !missing.is_empty() {
                let missing: Vec<BookieId> = missing.into_iter().collect();
                store
                    .mark_under_replicated(id, &missing)
                    .await
                    .with_context(|| format!("cannot mark ledger {id} under-replicated"))?;
                marked += 1;
            }
        }
        Ok(marked)
    }

    /// The bookies `id` misses replicas on: lost ones its fragments name and, in a periodic
    /// check, registered ones lacking entries. `None` when the ledger was deleted meanwhile.
    async fn missing_of(
        &mut self,
        bk: &BookKeeper,
        id: LedgerId,
        meta: &LedgerMetadata,
        walk: &Walk<'_>,
    ) -> Option<BTreeSet<BookieId>> {
        let mut missing = BTreeSet::new();
        for b in meta.fragments.iter().flat_map(|f| f.bookies.iter()) {
            // A bookie first seen in metadata and not registered starts its delay now.
            if self.known.insert(b.clone()) && !walk.registered.contains(b) {
                self.lost_since.entry(b.clone()).or_insert(walk.now);
            }
            if walk.lost.contains(b) {
                missing.insert(b.clone());
            }
        }
        if !walk.full_check {
            return Some(missing);
        }
        let probe: HashSet<BookieId> = meta
            .fragments
            .iter()
            .flat_map(|f| f.bookies.iter())
            .filter(|b| walk.registered.contains(*b) && !walk.lost.contains(*b))
            .cloned()
            .collect();
        match bk.bookies_missing_entries(id, &probe).await {
            Ok(found) => {
                for (first_entry, b) in found {
                    tracing::warn!(ledger = id.0, first_entry, bookie = %b, "registered bookie lacks entries of its fragment");
                    missing.insert(b);
                }
            }
            Err(e) if is_not_found(&e) => return None,
            Err(e) => tracing::warn!(ledger = id.0, error = %e, "replica check failed"),
        }
        Some(missing)
    }

    /// Records that the overdue bookies' ledgers are marked, and says so.
    fn publish(&mut self, overdue: Vec<BookieId>, marked: usize) {
        for b in &overdue {
            tracing::info!(bookie = %b, "bookie lost: its ledgers are marked under-replicated");
            eprintln!(
                "quire autorecovery: bookie {b} lost; its ledgers are marked under-replicated"
            );
        }
        if marked > 0 {
            tracing::info!(
                ledgers = marked,
                "ledgers with fragments on lost bookies marked"
            );
        }
        self.published.extend(overdue);
    }
}

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
//!   bookie under-replicated (`ZkStore::mark_under_replicated`). A new auditor starts the delay
//!   of bookies already gone when it takes over. Every `auditor_periodic_check_interval_secs`
//!   it walks the ledgers again, marking what a lost bookie still holds and, reading the first
//!   and last entry each registered bookie should hold in each fragment with a known end
//!   (BookKeeper's `LedgerChecker`), the ledgers a bookie lacks entries of (one wiped and
//!   registered again with a new cookie).
//! * **Replication worker** (BookKeeper `ReplicationWorker`): claims one marked ledger at a
//!   time with an ephemeral lock (`ZkStore::try_lock_under_replicated`), and for every fragment
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

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use quire_ledger::{BookKeeper, ClientConfig};
use quire_metadata::{BookieId, LedgerState, MetadataStore, UnderReplication, Versioned, ZkStore};
use quire_wire::LedgerId;
use serde::Deserialize;
use tokio::sync::watch;

use crate::config::{MetadataAddress, MetadataArgs};

/// Default `lost_bookie_recovery_delay_secs`. BookKeeper's is 0; a minute here, so that a
/// restarted bookie (a rolling restart) is back before anything is copied.
pub const LOST_BOOKIE_RECOVERY_DELAY_SECS_DEFAULT: u64 = 60;
/// Default `open_ledger_rereplication_grace_period_ms` (BookKeeper's, 30 s).
pub const OPEN_LEDGER_GRACE_MS_DEFAULT: u64 = 30_000;
/// Default `autorecovery_poll_interval_ms`.
pub const POLL_INTERVAL_MS_DEFAULT: u64 = 1_000;
/// Default `auditor_periodic_check_interval_secs` (BookKeeper `auditorPeriodicCheckInterval`
/// is a week; a day here).
pub const PERIODIC_CHECK_INTERVAL_SECS_DEFAULT: u64 = 86_400;
/// How long a worker leaves a ledger alone after failing it (BookKeeper
/// `rwRereplicateBackoffMs`).
pub const REREPLICATE_BACKOFF: Duration = Duration::from_secs(5);

/// Checked autorecovery settings.
#[derive(Debug, Clone)]
pub struct AutorecoveryOptions {
    /// How long a bookie's registration must have been gone before its ledgers are marked.
    pub lost_bookie_recovery_delay: Duration,
    /// How long the last fragment of a ledger that is not closed is left to its writer.
    pub open_ledger_grace: Duration,
    /// How often the auditor reads the registry and an idle worker looks for marks.
    pub poll_interval: Duration,
    /// How often the auditor walks every ledger regardless (`None`: only when a bookie is lost).
    pub periodic_check_interval: Option<Duration>,
    /// Bytes per second the worker writes to target bookies at most (`None`: unlimited).
    pub replication_rate_bytes: Option<u64>,
    /// TLS to bookies (`None`: plain TCP).
    pub bookie_tls: Option<std::sync::Arc<quire_tls::rustls::ClientConfig>>,
    /// The cluster secret proved to every bookie (`None` only in tests of bookies without
    /// one; `quire autorecovery` and `quire bookie` always set it).
    pub cluster_secret: Option<quire_wire::auth::ClusterSecret>,
}

/// The `[autorecovery]` table of `quire bookie` and `quire autorecovery`. Its defaults are
/// the `*_DEFAULT` constants above, written once there.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutorecoveryConfig {
    /// Run an autorecovery daemon inside the bookie (BookKeeper `autoRecoveryDaemonEnabled`);
    /// read by `quire bookie` only.
    pub enabled: bool,
    /// The daemon's identity in the auditor election and on worker locks; read by
    /// `quire autorecovery` only (unset: `autorecovery-<pid>@<hostname>`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Seconds a bookie's registration must have been gone before its ledgers are marked
    /// under-replicated (BookKeeper `lostBookieRecoveryDelay`).
    pub lost_bookie_recovery_delay_secs: u64,
    /// Milliseconds the last fragment of a ledger that is not closed is left to its writer
    /// (BookKeeper `openLedgerRereplicationGracePeriod`).
    pub open_ledger_rereplication_grace_period_ms: u64,
    /// Milliseconds between the auditor's registry polls and an idle worker's looks for
    /// marks, 1 to 60000.
    pub poll_interval_ms: u64,
    /// Seconds between the auditor's walks over every ledger (BookKeeper
    /// `auditorPeriodicCheckInterval`); 0 disables.
    pub auditor_periodic_check_interval_secs: u64,
    /// Bytes per second a replication worker writes to target bookies at most (BookKeeper
    /// `replicationRateByBytes`); 0: unlimited.
    pub replication_rate_bytes: u64,
}

impl Default for AutorecoveryConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            name: None,
            lost_bookie_recovery_delay_secs: LOST_BOOKIE_RECOVERY_DELAY_SECS_DEFAULT,
            open_ledger_rereplication_grace_period_ms: OPEN_LEDGER_GRACE_MS_DEFAULT,
            poll_interval_ms: POLL_INTERVAL_MS_DEFAULT,
            auditor_periodic_check_interval_secs: PERIODIC_CHECK_INTERVAL_SECS_DEFAULT,
            replication_rate_bytes: 0,
        }
    }
}

impl AutorecoveryConfig {
    /// Checks every key; errors name the key within the table.
    ///
    /// # Errors
    /// A poll interval of 0 or above a minute.
    pub fn validate(&self) -> Result<(), quire_metadata::ConfigError> {
        if !(1..=60_000).contains(&self.poll_interval_ms) {
            return Err(quire_metadata::ConfigError::invalid(
                "poll_interval_ms",
                self.poll_interval_ms,
                "expected 1 to 60000",
            ));
        }
        Ok(())
    }

    /// The daemon's options (call [`AutorecoveryConfig::validate`] first); no TLS and no
    /// cluster secret yet.
    pub fn options(&self) -> AutorecoveryOptions {
        let periodic = self.auditor_periodic_check_interval_secs;
        AutorecoveryOptions {
            lost_bookie_recovery_delay: Duration::from_secs(self.lost_bookie_recovery_delay_secs),
            open_ledger_grace: Duration::from_millis(
                self.open_ledger_rereplication_grace_period_ms,
            ),
            poll_interval: Duration::from_millis(self.poll_interval_ms),
            periodic_check_interval: (periodic > 0).then(|| Duration::from_secs(periodic)),
            replication_rate_bytes: Some(self.replication_rate_bytes).filter(|&r| r > 0),
            bookie_tls: None,
            cluster_secret: None,
        }
    }
}

/// Autorecovery metrics (named after BookKeeper's `ReplicationStats`).
#[derive(Clone, Default)]
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

/// Runs an autorecovery daemon (auditor candidate and replication worker) as `name` until
/// `stop` turns true. Connects its own ZooKeeper session and starts over with a new one when
/// the session is lost or a part fails.
pub async fn run_daemon(
    address: MetadataAddress,
    name: String,
    options: AutorecoveryOptions,
    metrics: AutorecoveryMetrics,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        if *stop.borrow() {
            return;
        }
        let store = tokio::select! {
            _ = stop.changed() => return,
            r = address.connect_zk() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "autorecovery cannot connect to ZooKeeper; retrying");
                    tokio::select! {
                        _ = stop.changed() => return,
                        () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            },
        };
        let bk = BookKeeper::new(
            store.clone(),
            ClientConfig {
                replication_rate_bytes_per_sec: options.replication_rate_bytes,
                tls: options.bookie_tls.clone(),
                cluster_secret: options.cluster_secret,
                ..ClientConfig::default()
            },
        );
        let mut lost = store.session_lost();
        let ended = tokio::select! {
            _ = stop.changed() => return,
            _ = lost.wait_for(|l| *l) => "ZooKeeper session lost".to_string(),
            r = auditor(store.clone(), bk.clone(), name.clone(), options.clone(), metrics.clone()) => {
                format!("auditor stopped: {:#}", r.err().unwrap_or_else(|| anyhow::anyhow!("no error")))
            }
            () = worker(store.clone(), bk, name.clone(), options.clone(), metrics.clone()) => {
                "worker stopped".to_string()
            }
        };
        tracing::warn!(%name, "autorecovery starts over with a new session: {ended}");
        drop(store);
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// What the auditor knows between two polls.
#[derive(Default)]
struct AuditState {
    /// Bookies seen registered, or named in a ledger's metadata.
    known: BTreeSet<BookieId>,
    /// Known bookies not registered now, with when this auditor first saw them gone.
    lost_since: HashMap<BookieId, Instant>,
    /// Lost bookies whose ledgers were marked.
    published: HashSet<BookieId>,
}

/// Waits to be elected, then audits until an error it cannot go on from.
async fn auditor(
    store: Arc<ZkStore>,
    bk: BookKeeper,
    name: String,
    options: AutorecoveryOptions,
    metrics: AutorecoveryMetrics,
) -> Result<()> {
    let candidate = store
        .join_auditor_election(&name)
        .await
        .context("cannot join the auditor election")?;
    candidate.wait_until_elected().await?;
    tracing::info!(%name, "elected auditor");
    eprintln!("quire autorecovery: {name} is the auditor");
    let mut state = AuditState::default();
    let mut next_full_check = Instant::now();
    loop {
        if let Err(e) = audit_once(&store, &bk, &options, &mut state, &mut next_full_check).await {
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

/// One poll of the registry; walks the ledgers when a lost bookie's delay ran out or the
/// periodic check is due. The periodic check also reads, from every registered bookie of
/// every fragment with a known end, the first and last entry it should hold there
/// ([`BookKeeper::bookies_missing_entries`]), and marks the ledger for a bookie that lacks one.
async fn audit_once(
    store: &ZkStore,
    bk: &BookKeeper,
    options: &AutorecoveryOptions,
    state: &mut AuditState,
    next_full_check: &mut Instant,
) -> Result<()> {
    let registered: HashSet<BookieId> = store
        .list_bookies()
        .await
        .context("cannot list bookies")?
        .into_iter()
        .map(|b| b.id)
        .collect();
    let now = Instant::now();
    state.known.extend(registered.iter().cloned());
    for b in &registered {
        if state.lost_since.remove(b).is_some() {
            tracing::info!(bookie = %b, "bookie registered again");
        }
        state.published.remove(b);
    }
    for b in state.known.iter().filter(|b| !registered.contains(*b)) {
        state.lost_since.entry(b.clone()).or_insert_with(|| {
            tracing::info!(bookie = %b, delay_secs = options.lost_bookie_recovery_delay.as_secs(), "bookie gone; its ledgers are marked under-replicated once the delay passes");
            now
        });
    }
    let overdue: Vec<BookieId> = state
        .lost_since
        .iter()
        .filter(|(b, since)| {
            !state.published.contains(*b)
                && now.duration_since(**since) >= options.lost_bookie_recovery_delay
        })
        .map(|(b, _)| b.clone())
        .collect();
    let full_check = now >= *next_full_check;
    if overdue.is_empty() && !full_check {
        return Ok(());
    }
    let lost: HashSet<BookieId> = state
        .published
        .iter()
        .chain(overdue.iter())
        .cloned()
        .collect();
    let mut marked = 0usize;
    for id in store.list_ledgers().await.context("cannot list ledgers")? {
        let meta = match store.read_ledger(id).await {
            Ok(v) => v.value,
            Err(quire_metadata::Error::NotFound { .. }) => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot read ledger {id}")),
        };
        let mut missing = BTreeSet::new();
        for b in meta.fragments.iter().flat_map(|f| f.bookies.iter()) {
            if state.known.insert(b.clone()) && !registered.contains(b) {
                state.lost_since.entry(b.clone()).or_insert(now);
            }
            if lost.contains(b) {
                missing.insert(b.clone());
            }
        }
        if full_check {
            let probe: HashSet<BookieId> = meta
                .fragments
                .iter()
                .flat_map(|f| f.bookies.iter())
                .filter(|b| registered.contains(*b) && !lost.contains(*b))
                .cloned()
                .collect();
            match bk.bookies_missing_entries(id, &probe).await {
                Ok(found) => {
                    for (first_entry, b) in found {
                        tracing::warn!(ledger = id.0, first_entry, bookie = %b, "registered bookie lacks entries of its fragment");
                        missing.insert(b);
                    }
                }
                Err(e) if is_not_found(&e) => continue,
                Err(e) => tracing::warn!(ledger = id.0, error = %e, "replica check failed"),
            }
        }
        if !missing.is_empty() {
            let missing: Vec<BookieId> = missing.into_iter().collect();
            store
                .mark_under_replicated(id, &missing)
                .await
                .with_context(|| format!("cannot mark ledger {id} under-replicated"))?;
            marked += 1;
        }
    }
    for b in &overdue {
        tracing::info!(bookie = %b, "bookie lost: its ledgers are marked under-replicated");
        eprintln!("quire autorecovery: bookie {b} lost; its ledgers are marked under-replicated");
    }
    if marked > 0 {
        tracing::info!(
            ledgers = marked,
            "ledgers with fragments on lost bookies marked"
        );
    }
    state.published.extend(overdue);
    if full_check {
        *next_full_check = now
            + options
                .periodic_check_interval
                .unwrap_or(Duration::from_secs(u64::from(u32::MAX)));
    }
    Ok(())
}

/// What one claim of a ledger came to.
#[derive(Debug)]
enum Handled {
    /// Nothing left to copy; the mark is removed (unless the auditor extended it meanwhile).
    Done,
    /// The last fragment of an open ledger is in its grace period until then.
    Deferred(Instant),
}

/// The replication worker: one marked ledger at a time, until the session is lost.
async fn worker(
    store: Arc<ZkStore>,
    bk: BookKeeper,
    name: String,
    options: AutorecoveryOptions,
    metrics: AutorecoveryMetrics,
) {
    // Ledgers this worker leaves alone until the given time (failed, or in a grace period).
    let mut later: HashMap<LedgerId, Instant> = HashMap::new();
    loop {
        let claimed = match claim_one(&store, &name, &mut later, &metrics).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot look for under-replicated ledgers");
                None
            }
        };
        let Some((lock, mark)) = claimed else {
            tokio::time::sleep(options.poll_interval).await;
            continue;
        };
        let id = lock.ledger;
        let outcome = replicate_ledger(&store, &bk, id, &mark, &options, &metrics).await;
        if let Err(e) = store.release_replication_lock(lock).await {
            tracing::warn!(ledger = id.0, error = %e, "cannot release the replication lock; it goes with the session");
        }
        match outcome {
            Ok(Handled::Done) => {
                later.remove(&id);
            }
            Ok(Handled::Deferred(until)) => {
                later.insert(id, until);
            }
            Err(e) => {
                tracing::warn!(ledger = id.0, error = %format!("{e:#}"), "re-replication failed; retrying later");
                later.insert(id, Instant::now() + REREPLICATE_BACKOFF);
            }
        }
    }
}

/// Claims one marked ledger not in `later` (random order, so that workers spread out).
async fn claim_one(
    store: &ZkStore,
    name: &str,
    later: &mut HashMap<LedgerId, Instant>,
    metrics: &AutorecoveryMetrics,
) -> Result<Option<(quire_metadata::ReplicationLock, Versioned<UnderReplication>)>> {
    use rand::seq::SliceRandom;
    let mut marks = store.list_under_replicated().await?;
    metrics.under_replicated_ledgers.set(marks.len() as i64);
    let now = Instant::now();
    later.retain(|id, until| *until > now && marks.iter().any(|(m, _)| m == id));
    marks.retain(|(id, _)| !later.contains_key(id));
    marks.shuffle(&mut rand::thread_rng());
    for (id, _) in marks {
        let Some(lock) = store.try_lock_under_replicated(id, name).await? else {
            continue;
        };
        // Read the mark again under the lock: a worker that held it before may have removed it.
        match store.read_under_replicated(id).await {
            Ok(mark) => return Ok(Some((lock, mark))),
            Err(quire_metadata::Error::NotFound { .. }) => {
                store.release_replication_lock(lock).await?;
            }
            Err(e) => {
                store.release_replication_lock(lock).await?;
                return Err(e.into());
            }
        }
    }
    Ok(None)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn is_not_found(e: &quire_ledger::Error) -> bool {
    matches!(e, quire_ledger::Error::Metadata(m) if matches!(**m, quire_metadata::Error::NotFound { .. }))
}

/// Re-replicates every fragment of `id` that names a bookie of the mark's `missing_bookies`
/// still unregistered (or being decommissioned), and copies back, in place, the entries a
/// registered bookie of the mark lacks (the periodic check's finding or a writer's report),
/// checking every entry of every fragment that names it.
async fn replicate_ledger(
    store: &ZkStore,
    bk: &BookKeeper,
    id: LedgerId,
    mark: &Versioned<UnderReplication>,
    options: &AutorecoveryOptions,
    metrics: &AutorecoveryMetrics,
) -> Result<Handled> {
    let registered: HashSet<BookieId> = store
        .list_bookies()
        .await?
        .into_iter()
        .map(|b| b.id)
        .collect();
    let decommissioning: HashSet<BookieId> = store.decommissioning().await?.into_iter().collect();
    let lost: HashSet<BookieId> = mark
        .value
        .missing_bookies
        .iter()
        .filter(|b| !registered.contains(*b) || decommissioning.contains(*b))
        .cloned()
        .collect();
    let mut meta = match store.read_ledger(id).await {
        Ok(v) => v.value,
        Err(quire_metadata::Error::NotFound { .. }) => {
            tracing::info!(
                ledger = id.0,
                "under-replicated ledger was deleted; mark removed"
            );
            store.clear_under_replicated(id, mark.version).await?;
            return Ok(Handled::Done);
        }
        Err(e) => return Err(e.into()),
    };
    let present: HashSet<BookieId> = mark
        .value
        .missing_bookies
        .iter()
        .chain(&mark.value.gaps_on)
        .filter(|b| !lost.contains(*b) && registered.contains(*b))
        .cloned()
        .collect();
    // A bookie a writer reported that is not registered now (restarting, or stopped): its
    // gaps are copied back when it returns; if it never does, the auditor marks it lost.
    let away: Vec<&BookieId> = mark
        .value
        .missing_bookies
        .iter()
        .chain(&mark.value.gaps_on)
        .filter(|b| !lost.contains(*b) && !registered.contains(*b))
        .collect();
    let names_lost = |f: &quire_metadata::Fragment| f.bookies.iter().any(|b| lost.contains(b));
    let mut deferred = None;
    if meta.state != LedgerState::Closed && meta.fragments.last().is_some_and(names_lost) {
        let grace_end_ms = mark
            .value
            .ctime_ms
            .saturating_add(options.open_ledger_grace.as_millis() as u64);
        let now = now_ms();
        if now < grace_end_ms {
            deferred = Some(Instant::now() + Duration::from_millis(grace_end_ms - now));
        } else {
            tracing::info!(
                ledger = id.0,
                "open ledger past its grace period: recovering it first"
            );
            match bk.recover_ledger(id).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {
                    store.clear_under_replicated(id, mark.version).await?;
                    return Ok(Handled::Done);
                }
                Err(e) => return Err(e).context("recovery before re-replication"),
            }
            meta = store.read_ledger(id).await?.value;
        }
    }
    let last = meta.fragments.len().saturating_sub(1);
    let todo: Vec<(u64, BookieId)> = meta
        .fragments
        .iter()
        .enumerate()
        .filter(|(i, _)| meta.state == LedgerState::Closed || *i < last)
        .flat_map(|(_, f)| {
            f.bookies
                .iter()
                .filter(|b| lost.contains(*b))
                .map(|b| (f.first_entry, b.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    // A registered bookie of the mark (a wiped one the periodic check found, or one a writer
    // reported after adds to it failed) gets every fragment that names it checked entry by
    // entry and its missing entries copied back in place: a writer's gaps can lie anywhere in
    // a fragment, where the periodic check's first/last probe does not look. An open ledger
    // whose last fragment names one is left until its writer closes it (or a recovery does):
    // that fragment's end is not known yet, and the writer is likely alive.
    let names_present =
        |f: &quire_metadata::Fragment| f.bookies.iter().any(|b| present.contains(b));
    let mut in_place = Vec::new();
    if meta.state != LedgerState::Closed && meta.fragments.last().is_some_and(names_present) {
        let retry = Instant::now() + options.open_ledger_grace;
        deferred = Some(deferred.map_or(retry, |d: Instant| d.min(retry)));
    } else {
        for (i, f) in meta.fragments.iter().enumerate() {
            if meta.state != LedgerState::Closed && i == last {
                continue;
            }
            for b in f.bookies.iter().filter(|b| present.contains(*b)) {
                in_place.push((f.first_entry, b.clone()));
            }
        }
    }
    for (first_entry, bookie) in in_place {
        match bk.repair_fragment_in_place(id, first_entry, &bookie).await {
            Ok(done) => {
                metrics.bytes_written.inc_by(done.bytes_copied);
                metrics.entries_written.inc_by(done.entries_copied);
                metrics.fragments_repaired.inc();
            }
            Err(e) if is_not_found(&e) => {
                store.clear_under_replicated(id, mark.version).await?;
                return Ok(Handled::Done);
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "ledger {id}: fragment from entry {first_entry}, copying back to {bookie}"
                    )
                })
            }
        }
    }
    for (first_entry, bookie) in todo {
        match bk.replicate_fragment(id, first_entry, &bookie, &lost).await {
            Ok(done) => {
                metrics.bytes_written.inc_by(done.bytes_copied);
                metrics.entries_written.inc_by(done.entries_copied);
                metrics.fragments_replicated.inc();
            }
            Err(e) if is_not_found(&e) => {
                tracing::info!(
                    ledger = id.0,
                    "under-replicated ledger was deleted; mark removed"
                );
                store.clear_under_replicated(id, mark.version).await?;
                return Ok(Handled::Done);
            }
            Err(e) => {
                // A deleted ledger can fail the copy before its metadata read says so.
                if let Err(quire_metadata::Error::NotFound { .. }) = store.read_ledger(id).await {
                    store.clear_under_replicated(id, mark.version).await?;
                    return Ok(Handled::Done);
                }
                return Err(e).with_context(|| {
                    format!("ledger {id}: fragment from entry {first_entry}, bookie {bookie}")
                });
            }
        }
    }
    if !away.is_empty() {
        tracing::info!(ledger = id.0, bookies = ?away, "reported bookies not registered; their gaps are copied back when they return");
        let retry = Instant::now() + options.open_ledger_grace;
        deferred = Some(deferred.map_or(retry, |d| d.min(retry)));
    }
    if let Some(until) = deferred {
        tracing::info!(
            ledger = id.0,
            "open ledger's last fragment left to its writer, or a reported bookie away; retried later"
        );
        return Ok(Handled::Deferred(until));
    }
    match store.clear_under_replicated(id, mark.version).await {
        Ok(()) => tracing::info!(ledger = id.0, "ledger fully replicated; mark removed"),
        Err(quire_metadata::Error::BadVersion { .. }) => {
            tracing::info!(
                ledger = id.0,
                "mark extended meanwhile; it stays for another pass"
            )
        }
        Err(e) => return Err(e.into()),
    }
    Ok(Handled::Done)
}

/// `quire autorecovery` options: run a standalone daemon, or `status`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AutorecoveryArgs {
    #[command(subcommand)]
    pub command: Option<AutorecoveryCommand>,
    /// TOML configuration file; every flag below overrides the key of the same name.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: crate::flags::AutorecoveryFlags,
}

/// `quire autorecovery` subcommands.
#[derive(Subcommand, Debug)]
pub enum AutorecoveryCommand {
    /// The auditor, the auditor candidates, the ledgers workers hold now, and every
    /// under-replicated ledger with its lost bookies and how long it has waited.
    Status(StatusArgs),
}

/// `quire autorecovery status` options.
#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub metadata: MetadataArgs,
    #[command(flatten)]
    pub output: crate::admin::OutputArgs,
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Runs `quire autorecovery`.
pub fn run(args: AutorecoveryArgs) -> Result<()> {
    if let Some(AutorecoveryCommand::Status(status_args)) = args.command {
        return status(status_args);
    }
    let keys = crate::config::keys_of(crate::config::AUTORECOVERY_KEYS);
    let file: crate::config::AutorecoveryFile =
        crate::config::load(args.config.as_deref(), &keys, &args.settings)?;
    let address = MetadataAddress::from_config(&file.zookeeper, &keys)?;
    file.autorecovery
        .validate()
        .map_err(|e| anyhow::anyhow!("{}", e.in_table("autorecovery")))?;
    let mut options = file.autorecovery.options();
    options.bookie_tls = match file.bookie_tls.resolve()? {
        Some(t) => Some(t.client_config()?),
        None => None,
    };
    let secret_file = file.cluster_secret_file.ok_or_else(|| {
        anyhow::anyhow!("missing setting cluster_secret_file: set it in the config file or with --cluster-secret-file")
    })?;
    options.cluster_secret = Some(crate::secret_file::read_cluster_secret(
        &secret_file,
        "cluster_secret_file",
    )?);
    let name = file
        .autorecovery
        .name
        .unwrap_or_else(|| format!("autorecovery-{}@{}", std::process::id(), hostname()));
    let metrics = AutorecoveryMetrics::default();
    let exposition = crate::metrics_http::Exposition::default();
    if let Some(listen) = file.metrics_listen {
        exposition.register(|r| metrics.register(r));
        let addr = crate::metrics_http::start(listen, exposition.clone())?;
        tracing::info!(%addr, "metrics endpoint listening");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let result = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        // Connect once up front, so that a wrong address fails at start with one line.
        drop(address.connect_zk().await?);
        let (stop_tx, stop_rx) = watch::channel(false);
        let daemon = tokio::spawn(run_daemon(address, name.clone(), options, metrics, stop_rx));
        exposition.set_serving(true);
        println!("quire autorecovery: {name} running");
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        exposition.set_serving(false);
        let _ = stop_tx.send(true);
        let _ = daemon.await;
        Ok::<_, anyhow::Error>(())
    });
    runtime.shutdown_timeout(Duration::from_secs(5));
    result
}

/// `quire autorecovery status`.
fn status(args: StatusArgs) -> Result<()> {
    crate::admin::with_zk_store(&args.metadata, async |store| {
        let state = store
            .autorecovery_state()
            .await
            .context("cannot read the autorecovery state")?;
        let marks = store
            .list_under_replicated()
            .await
            .context("cannot list under-replicated ledgers")?;
        let now = now_ms();
        if args.output.json {
            let ledgers: Vec<serde_json::Value> = marks
                .iter()
                .map(|(id, m)| {
                    serde_json::json!({
                        "ledger": id.0,
                        "missing_bookies": m.value.missing_bookies,
                        "gaps_on": m.value.gaps_on,
                        "marked_at_ms": m.value.ctime_ms,
                        "waiting_ms": now.saturating_sub(m.value.ctime_ms),
                        "worker": state.locks.iter().find(|(l, _)| l == id).map(|(_, w)| w),
                    })
                })
                .collect();
            let workers: Vec<serde_json::Value> = state
                .locks
                .iter()
                .map(|(l, w)| serde_json::json!({ "ledger": l.0, "worker": w }))
                .collect();
            let doc = serde_json::json!({
                "auditor": state.candidates.first(),
                "candidates": state.candidates,
                "workers": workers,
                "under_replicated": ledgers,
            });
            println!("{}", serde_json::to_string_pretty(&doc)?);
            return Ok(());
        }
        use std::fmt::Write as _;
        let mut out = String::new();
        match state.candidates.first() {
            Some(a) => writeln!(out, "auditor: {a}")?,
            None => writeln!(out, "auditor: none (no autorecovery daemon runs)")?,
        }
        writeln!(out, "candidates: {}", state.candidates.join(", "))?;
        if state.locks.is_empty() {
            writeln!(out, "workers: idle")?;
        }
        for (l, w) in &state.locks {
            writeln!(out, "worker {w}: ledger {l}")?;
        }
        writeln!(out, "under-replicated ledgers: {}", marks.len())?;
        for (id, m) in &marks {
            // A writer's reported gaps are shown as "BOOKIE(gaps)".
            let missing: Vec<String> = m
                .value
                .missing_bookies
                .iter()
                .map(|b| b.0.clone())
                .chain(m.value.gaps_on.iter().map(|b| format!("{b}(gaps)")))
                .collect();
            writeln!(
                out,
                "  ledger {id}: missing {} (waiting {} s)",
                missing.join(" "),
                now.saturating_sub(m.value.ctime_ms) / 1000
            )?;
        }
        print!("{out}");
        Ok(())
    })
}

/// `quire bookie decommission` options.
#[derive(Args, Debug)]
pub struct DecommissionArgs {
    /// The bookie to retire (its id, `host:port`).
    pub bookie: String,
    /// Give up (the next run resumes) after this many seconds; default: wait as long as it
    /// takes.
    #[arg(long)]
    pub timeout_secs: Option<u64>,
    #[command(flatten)]
    pub metadata: MetadataArgs,
}

/// `quire bookie decommission BOOKIE` (BookKeeper `decommissionbookie`, but with the bookie
/// still up, so that its replicas are also a source): records the decommission, removes the
/// bookie's registration (no new ledger picks it; it goes on serving the ledgers it is in),
/// then until no ledger's metadata names it, marks every ledger that does under-replicated
/// for it (the replication workers treat a decommissioning bookie as lost) and prints
/// progress; finally deletes its cookie, so that it can be stopped and its disks wiped and
/// reused. A second run resumes. Needs autorecovery daemons running (inside the bookies by
/// default).
pub fn decommission(args: DecommissionArgs) -> Result<()> {
    crate::admin::with_zk_store(&args.metadata, async |store| {
        let id = BookieId(args.bookie.clone());
        let cookie = match store.read_cookie(&id).await {
            Ok(c) => Some(c),
            Err(quire_metadata::Error::NotFound { .. }) => None,
            Err(e) => return Err(e).context("cannot read the bookie's cookie"),
        };
        let fresh = store.start_decommission(&id).await?;
        if cookie.is_none() && fresh {
            store.end_decommission(&id).await?;
            bail!("bookie {id} has no cookie: not a bookie of this cluster, or decommissioned already");
        }
        println!(
            "decommissioning bookie {id} ({})",
            if fresh { "started" } else { "resumed" }
        );
        match store.unregister_bookie(&id).await {
            Ok(()) | Err(quire_metadata::Error::NotFound { .. }) => {}
            Err(e) => return Err(e).context("cannot remove the bookie's registration"),
        }
        if store.autorecovery_state().await?.candidates.is_empty() {
            eprintln!("quire: warning: no autorecovery daemon runs; nothing copies the bookie's replicas until one does");
        }
        let deadline = args
            .timeout_secs
            .map(|s| Instant::now() + Duration::from_secs(s));
        let mut last_report = None;
        loop {
            let mut naming = 0usize;
            for ledger in store.list_ledgers().await? {
                let meta = match store.read_ledger(ledger).await {
                    Ok(v) => v.value,
                    Err(quire_metadata::Error::NotFound { .. }) => continue,
                    Err(e) => return Err(e.into()),
                };
                if meta.fragments.iter().any(|f| f.bookies.contains(&id)) {
                    naming += 1;
                    store
                        .mark_under_replicated(ledger, std::slice::from_ref(&id))
                        .await?;
                }
            }
            if naming == 0 {
                break;
            }
            if last_report != Some(naming) {
                println!("{naming} ledgers still name {id}");
                last_report = Some(naming);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                bail!("decommission of {id} not finished: {naming} ledgers still name it; run the command again to resume");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if let Ok(c) = store.read_cookie(&id).await {
            match store.delete_cookie(&id, c.version).await {
                Ok(()) | Err(quire_metadata::Error::NotFound { .. }) => {}
                Err(e) => return Err(e).context("cannot delete the bookie's cookie"),
            }
        }
        store.end_decommission(&id).await?;
        println!("bookie {id} decommissioned: no ledger names it and its cookie is deleted; stop it, and its disks can be reused");
        Ok(())
    })
}

/// `quire bookie delete-cookie` options.
#[derive(Args, Debug)]
pub struct DeleteCookieArgs {
    /// The bookie whose cookie to delete (its id, `host:port`).
    pub bookie: String,
    #[command(flatten)]
    pub metadata: MetadataArgs,
}

/// `quire bookie delete-cookie BOOKIE` (BookKeeper's `cookie_delete` shell command): deletes the
/// bookie's cookie from ZooKeeper, so that a bookie whose disks were wiped or replaced can
/// start on empty directories under the same id and register with a new cookie; the
/// auditor's periodic check then finds the replicas it lacks and the workers copy them back.
///
/// # Errors
/// The bookie is registered (it runs: stop it first), it has no cookie, or ZooKeeper fails.
pub fn delete_cookie(args: DeleteCookieArgs) -> Result<()> {
    crate::admin::with_zk_store(&args.metadata, async |store| {
        let id = BookieId(args.bookie.clone());
        let registered = store.list_bookies().await.context("cannot list bookies")?;
        if registered.iter().any(|b| b.id == id) {
            bail!("bookie {id} is registered (it runs): stop it before deleting its cookie");
        }
        let cookie = match store.read_cookie(&id).await {
            Ok(c) => c,
            Err(quire_metadata::Error::NotFound { .. }) => {
                bail!("bookie {id} has no cookie: not a bookie of this cluster, or deleted already")
            }
            Err(e) => return Err(e).context("cannot read the bookie's cookie"),
        };
        store
            .delete_cookie(&id, cookie.version)
            .await
            .context("cannot delete the bookie's cookie")?;
        println!("cookie of bookie {id} deleted: it can start on empty directories");
        Ok(())
    })
}

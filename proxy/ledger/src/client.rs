//! The client handle (BookKeeper's `BookKeeper` object): the metadata store, the pool of bookie
//! connections every ledger of the client shares, its settings, and the quarantine of bookies
//! that failed lately (BookKeeper `bookieQuarantineTime`), which ledger creation, ensemble
//! changes and reads consult.
//!
//! A quarantine ends after `bookie_quarantine`, or as soon as a listing of the registry shows
//! the bookie registered anew as writable (a restart: its registration epoch differs from the
//! one seen when it was quarantined). Otherwise a rolling restart finds the bookie restarted
//! just before still quarantined when the next one goes down, and a writer whose ensemble lost
//! the second one has no replacement. The early end is Quire's addition to BookKeeper's
//! time-bound quarantine.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quire_metadata::{BookieId, BookieInfo, MetadataStore};
use quire_wire::frame::FRAME_SIZE_BYTES_MAX_DEFAULT;
use quire_wire::{EntryId, LedgerId};

use crate::conn::{self, Lane, Pool};
use crate::locality::{self, LabelCache, Locality, Replica};
use crate::speculative::SpeculativeTimeout;
use crate::Error;

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Per-request timeout against one bookie (BookKeeper `addEntryTimeoutSec`/`readTimeout`: 5 s).
    pub request_timeout: Duration,
    /// Largest frame accepted from a bookie.
    pub frame_size_bytes_max: u32,
    /// How long a bookie that failed an add (or could not be connected to as a replacement) is
    /// not chosen as a replacement in ensemble changes (BookKeeper `bookieQuarantineTime`;
    /// default 60 s here, BookKeeper's is 30 min), unless it registers anew as writable before.
    pub bookie_quarantine: Duration,
    /// While a failed ensemble position has no replacement, how often a further failure at it
    /// triggers another search (an entry that can no longer reach Qa always triggers one).
    /// Default 1 s.
    pub replacement_retry_interval: Duration,
    /// Bytes per second re-replication writes to target bookies at most, over all copies this
    /// client runs (BookKeeper `replicationRateByBytes`); `None`, the default, is unlimited.
    pub replication_rate_bytes_per_sec: Option<u64>,
    /// TLS to every bookie, from `quire_tls::ClientTls::client_config` (BookKeeper's
    /// `tlsTrustStore` and, for bookies that require client auth, `tlsCertificatePath` /
    /// `tlsKeyStore`); `None`, the default, is plain TCP.
    pub tls: Option<Arc<quire_tls::rustls::ClientConfig>>,
    /// The cluster secret proved to every bookie, and checked in its answer (protocol version
    /// 2, `docs/protocol.md` §2; the role of BookKeeper's `clientAuthProviderFactoryClass`
    /// with digest authentication). `None`, the default, speaks version 1, which a bookie
    /// with a secret refuses.
    pub cluster_secret: Option<quire_wire::auth::ClusterSecret>,
    /// How new ensembles and replacements are placed over regions and racks (`[ledger]`
    /// table; [`crate::placement`]); the default is random (BookKeeper's
    /// `DefaultEnsemblePlacementPolicy`).
    pub placement: crate::placement::PlacementSettings,
    /// This client's region label (the proxy's `[proxy] region`), for reads by distance
    /// (`locality`); `None` with `rack` `None` too: reads ignore distance. Unset while `rack`
    /// is set: `default-region`.
    pub region: Option<String>,
    /// This client's rack label within its region (the proxy's `[proxy] rack`); unset while
    /// `region` is set: `/default-rack` (BookKeeper's default rack).
    pub rack: Option<String>,
    /// How long a plain read waits for a replica before it asks the next one as well, at
    /// first and at least (BookKeeper `speculativeReadTimeout`, whose default is 2 s); zero
    /// turns speculative reads off. The timeout adapts above it to the p99 of recent reads and
    /// backs off ×2 while speculation does not help (`speculative`). Default 50 ms.
    pub speculative_read_timeout: Duration,
    /// The most the speculative read timeout adapts or backs off to (BookKeeper
    /// `maxSpeculativeReadTimeout`). Default 2 s.
    pub max_speculative_read_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(5),
            frame_size_bytes_max: FRAME_SIZE_BYTES_MAX_DEFAULT,
            bookie_quarantine: Duration::from_secs(60),
            replacement_retry_interval: Duration::from_secs(1),
            replication_rate_bytes_per_sec: None,
            tls: None,
            cluster_secret: None,
            placement: crate::placement::PlacementSettings::default(),
            region: None,
            rack: None,
            speculative_read_timeout: Duration::from_millis(50),
            max_speculative_read_timeout: Duration::from_secs(2),
        }
    }
}

/// When a bookie was quarantined, and the epoch of its registration then (see `Inner`).
pub(crate) type Quarantined = (Instant, Option<Option<u64>>);

pub(crate) struct Inner {
    pub(crate) metadata: Arc<dyn MetadataStore>,
    pub(crate) pool: Pool,
    pub(crate) config: ClientConfig,
    /// Bookies that failed recently, with when and the epoch of the registration they had
    /// then (`Some(None)`: not registered, or the store gives no epochs; `None`: the registry
    /// was never listed, so no new registration can be told apart); not chosen as
    /// replacements until `config.bookie_quarantine` has passed or they register anew.
    pub(crate) quarantine: Mutex<HashMap<BookieId, Quarantined>>,
    /// The registration epoch of each bookie at the last listing of the registry; `None`
    /// before the first listing.
    pub(crate) registrations: Mutex<Option<HashMap<BookieId, Option<u64>>>>,
    /// Paces re-replication writes (`config.replication_rate_bytes_per_sec`).
    pub(crate) replication_pace: Option<crate::rereplicate::BytePace>,
    /// When each (ledger, bookie) was last reported for a damaged replica, so that a read
    /// of many damaged entries makes one report per [`DAMAGE_REPORT_INTERVAL`].
    pub(crate) damage_reported: Mutex<HashMap<(LedgerId, BookieId), Instant>>,
    /// This client's locality (`config.region`, `config.rack`); `None` when neither is set.
    pub(crate) local: Option<Locality>,
    /// The registry's labels as last listed (`locality`).
    pub(crate) labels: Mutex<LabelCache>,
    /// The adaptive speculative read timeout (`speculative`).
    pub(crate) speculation: SpeculativeTimeout,
    /// Speculative reads this client sent, and those the speculative replica answered first.
    pub(crate) speculative_sent: AtomicU64,
    pub(crate) speculative_won: AtomicU64,
}

/// A client's speculative reads so far ([`BookKeeper::speculative_reads`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpeculativeReads {
    /// Reads sent to one more replica because the ones asked had not answered within the
    /// speculative timeout.
    pub sent: u64,
    /// Reads whose first good answer came from a replica asked speculatively.
    pub won: u64,
}

/// How often one client reports the same bookie's damaged replicas of one ledger at most.
pub(crate) const DAMAGE_REPORT_INTERVAL: Duration = Duration::from_secs(10);

/// The client: a metadata store handle plus a pool of bookie connections.
///
/// # Threading
/// Shared (`Send + Sync`), cheap to clone.
#[derive(Clone)]
pub struct BookKeeper {
    pub(crate) inner: Arc<Inner>,
}

impl BookKeeper {
    /// Makes a client over `metadata`.
    pub fn new(metadata: Arc<dyn MetadataStore>, config: ClientConfig) -> Self {
        Self::build(metadata, config, None)
    }

    /// Makes a client whose entry-read and long-poll connections (one of each per bookie, apart
    /// from the connection that carries adds, fences and LAC reads) run their socket tasks on
    /// `read_runtime`: a server gives it a runtime of lower priority so that decoding bulk
    /// catch-up reads does not take CPU from tail writes.
    pub fn with_read_runtime(
        metadata: Arc<dyn MetadataStore>,
        config: ClientConfig,
        read_runtime: tokio::runtime::Handle,
    ) -> Self {
        Self::build(metadata, config, Some(read_runtime))
    }

    fn build(
        metadata: Arc<dyn MetadataStore>,
        config: ClientConfig,
        read_runtime: Option<tokio::runtime::Handle>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                metadata,
                pool: Pool::new(read_runtime, config.tls.clone(), config.cluster_secret),
                replication_pace: config
                    .replication_rate_bytes_per_sec
                    .filter(|&r| r > 0)
                    .map(crate::rereplicate::BytePace::new),
                quarantine: Mutex::default(),
                registrations: Mutex::default(),
                damage_reported: Mutex::default(),
                local: (config.region.is_some() || config.rack.is_some())
                    .then(|| Locality::new(config.region.as_deref(), config.rack.as_deref())),
                labels: Mutex::default(),
                speculation: SpeculativeTimeout::new(
                    config.speculative_read_timeout,
                    config.max_speculative_read_timeout,
                ),
                speculative_sent: AtomicU64::new(0),
                speculative_won: AtomicU64::new(0),
                config,
            }),
        }
    }

    /// The metadata store this client uses.
    pub fn metadata(&self) -> &Arc<dyn MetadataStore> {
        &self.inner.metadata
    }

    /// Quarantines `bookie`, remembering the registration epoch the last listing showed for it
    /// (the listing made just before, where ledger creation and ensemble changes call this).
    pub(crate) fn quarantine(&self, bookie: &BookieId) {
        let epoch = self
            .inner
            .registrations
            .lock()
            .ok()
            .and_then(|r| r.as_ref().map(|r| r.get(bookie).copied().flatten()));
        if let Ok(mut q) = self.inner.quarantine.lock() {
            q.insert(bookie.clone(), (quire_clock::now(), epoch));
        }
    }

    /// Lists the registry, and ends the quarantine of every bookie now registered as writable
    /// under an epoch other than the one it had when quarantined (it restarted, or came back
    /// from read-only, since it failed).
    ///
    /// # Errors
    /// `Metadata`.
    pub(crate) async fn registered_bookies(&self) -> Result<Vec<BookieInfo>, Error> {
        let listed = self.inner.metadata.list_bookie_registrations().await?;
        if let Ok(mut r) = self.inner.registrations.lock() {
            *r = Some(
                listed
                    .iter()
                    .map(|b| (b.info.id.clone(), b.epoch))
                    .collect(),
            );
        }
        if let Ok(mut q) = self.inner.quarantine.lock() {
            for b in &listed {
                if b.info.read_only || b.epoch.is_none() {
                    continue;
                }
                if q.get(&b.info.id)
                    .is_some_and(|(_, then)| then.is_some_and(|then| then != b.epoch))
                {
                    tracing::info!(bookie = %b.info.id, "bookie registered anew: quarantine ended");
                    q.remove(&b.info.id);
                }
            }
        }
        let infos: Vec<BookieInfo> = listed.into_iter().map(|b| b.info).collect();
        if let Ok(mut labels) = self.inner.labels.lock() {
            labels.update(&infos);
        }
        Ok(infos)
    }

    /// This client's speculative reads so far (the process-wide counts are the metrics
    /// `quire_ledger_speculative_reads` and `quire_ledger_speculative_read_wins`).
    pub fn speculative_reads(&self) -> SpeculativeReads {
        SpeculativeReads {
            sent: self.inner.speculative_sent.load(Ordering::Relaxed),
            won: self.inner.speculative_won.load(Ordering::Relaxed),
        }
    }

    /// How many registered bookies' labels (rack, region) this client knows from its last
    /// listing of the registry: 0 before the first listing, which a read of a client with its
    /// own labels starts in the background (`locality`). Reads order replicas by distance
    /// only for bookies counted here.
    pub fn known_bookie_labels(&self) -> usize {
        self.inner
            .labels
            .lock()
            .map_or(0, |cache| cache.labels.len())
    }

    /// The order in which to ask `replicas` (a write set's bookies, in write-set order) for an
    /// entry: indices into it, closest first, quarantined last (`locality::read_order`); in
    /// write-set order when `placement.reorder_read_sequence` is off.
    pub(crate) fn read_order(&self, replicas: &[BookieId]) -> Vec<usize> {
        let reorder = self.inner.config.placement.reorder_read_sequence;
        // With the switch off the order is the write set's: no quarantine or label lookups
        // (and no registry listing for labels).
        let (quarantined, labels) = if reorder {
            (self.quarantined(), self.labels_for_read())
        } else {
            Default::default()
        };
        let replicas: Vec<Replica<'_>> = replicas
            .iter()
            .map(|b| Replica {
                locality: labels.get(b),
                failed: quarantined.contains(b),
            })
            .collect();
        locality::read_sequence(reorder, self.inner.local.as_ref(), &replicas)
    }

    /// The cached registry labels; for a client with labels, starts a background listing of
    /// the registry when they are older than `locality::LABELS_REFRESH_INTERVAL`.
    fn labels_for_read(&self) -> Arc<HashMap<BookieId, Locality>> {
        let Ok(mut cache) = self.inner.labels.lock() else {
            return Arc::default();
        };
        if self.inner.local.is_some() && cache.wants_refresh() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                cache.refreshing = true;
                let client = self.clone();
                runtime.spawn(async move {
                    let listed = client.registered_bookies().await;
                    if let Ok(mut cache) = client.inner.labels.lock() {
                        cache.refreshing = false;
                        if let Err(e) = listed {
                            // Keep the labels; try again an interval later, not on every read.
                            tracing::debug!(error = %e, "cannot list the bookie registry for its labels");
                            cache.listed_at = Some(quire_clock::now());
                        }
                    }
                });
            }
        }
        cache.labels.clone()
    }

    /// Reports, in the background, that `bookie` misses or holds damaged copies of entries of
    /// `ledger` (BookKeeper's `markLedgerUnderreplicated`, through
    /// `MetadataStore::report_under_replicated`), so that autorecovery copies them back in
    /// place; `what` says why, for the log.
    pub(crate) fn report_under_replicated(
        &self,
        ledger: LedgerId,
        bookie: BookieId,
        what: &'static str,
    ) {
        let store = self.inner.metadata.clone();
        tokio::spawn(async move {
            match store
                .report_under_replicated(ledger, std::slice::from_ref(&bookie))
                .await
            {
                Ok(true) => {
                    tracing::info!(ledger = ledger.0, %bookie, "ledger marked under-replicated: {what}")
                }
                Ok(false) => {
                    tracing::debug!(ledger = ledger.0, %bookie, "{what}; this metadata store keeps no under-replication marks")
                }
                Err(e) => {
                    tracing::warn!(ledger = ledger.0, %bookie, error = %e, "cannot mark the ledger under-replicated ({what})")
                }
            }
        });
    }

    /// A read found `bookie`'s copy of `entry` damaged (it failed its digest or named another
    /// position, or the bookie answered `IoError`): reports the ledger under-replicated with
    /// the bookie named, at most once per [`DAMAGE_REPORT_INTERVAL`] per (ledger, bookie),
    /// so that autorecovery's in-place repair replaces the copy (issue 23 item 6).
    pub(crate) fn damaged_replica(
        &self,
        ledger: LedgerId,
        entry: EntryId,
        bookie: &BookieId,
        reason: &str,
    ) {
        tracing::warn!(ledger = ledger.0, entry = entry.0, %bookie, "damaged replica: {reason}");
        {
            let Ok(mut reported) = self.inner.damage_reported.lock() else {
                return;
            };
            reported.retain(|_, at| quire_clock::elapsed(*at) < DAMAGE_REPORT_INTERVAL);
            if reported.contains_key(&(ledger, bookie.clone())) {
                return;
            }
            reported.insert((ledger, bookie.clone()), quire_clock::now());
        }
        self.report_under_replicated(ledger, bookie.clone(), "a read found a damaged replica");
    }

    pub(crate) fn quarantined(&self) -> HashSet<BookieId> {
        let keep_for = self.inner.config.bookie_quarantine;
        let Ok(mut q) = self.inner.quarantine.lock() else {
            return HashSet::new();
        };
        q.retain(|_, (since, _)| quire_clock::elapsed(*since) < keep_for);
        q.keys().cloned().collect()
    }

    pub(crate) async fn conn(
        &self,
        bookie: &BookieId,
        lane: Lane,
    ) -> Result<Arc<conn::Conn>, Error> {
        self.inner
            .pool
            .get(
                bookie,
                lane,
                self.inner.config.frame_size_bytes_max,
                self.inner.config.request_timeout,
            )
            .await
    }
}

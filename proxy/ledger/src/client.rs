//! The client handle (BookKeeper's `BookKeeper` object): the metadata store, the pool of bookie
//! connections every ledger of the client shares, its settings, and the quarantine of bookies
//! that failed lately (BookKeeper `bookieQuarantineTime`), which ledger creation, ensemble
//! changes and reads consult.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quire_metadata::{BookieId, MetadataStore};
use quire_wire::frame::FRAME_SIZE_BYTES_MAX_DEFAULT;

use crate::conn::{self, Lane, Pool};
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
    /// default 60 s here, BookKeeper's is 30 min).
    pub bookie_quarantine: Duration,
    /// While a failed ensemble position has no replacement, how often a further failure at it
    /// triggers another search (an entry that can no longer reach Qa always triggers one).
    /// Default 1 s.
    pub replacement_retry_interval: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(5),
            frame_size_bytes_max: FRAME_SIZE_BYTES_MAX_DEFAULT,
            bookie_quarantine: Duration::from_secs(60),
            replacement_retry_interval: Duration::from_secs(1),
        }
    }
}

pub(crate) struct Inner {
    pub(crate) metadata: Arc<dyn MetadataStore>,
    pub(crate) pool: Pool,
    pub(crate) config: ClientConfig,
    /// Bookies that failed recently, with when; not chosen as replacements until
    /// `config.bookie_quarantine` has passed.
    pub(crate) quarantine: Mutex<HashMap<BookieId, Instant>>,
}

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
                pool: Pool::new(read_runtime),
                config,
                quarantine: Mutex::default(),
            }),
        }
    }

    /// The metadata store this client uses.
    pub fn metadata(&self) -> &Arc<dyn MetadataStore> {
        &self.inner.metadata
    }

    pub(crate) fn quarantine(&self, bookie: &BookieId) {
        if let Ok(mut q) = self.inner.quarantine.lock() {
            q.insert(bookie.clone(), Instant::now());
        }
    }

    pub(crate) fn quarantined(&self) -> HashSet<BookieId> {
        let keep_for = self.inner.config.bookie_quarantine;
        let Ok(mut q) = self.inner.quarantine.lock() else {
            return HashSet::new();
        };
        q.retain(|_, since| since.elapsed() < keep_for);
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

//! The metadata store: one interface for everything a Quire cluster keeps outside the bookies,
//! its embedded, on-disk implementation for the single-machine sandbox ([`EmbeddedStore`]), and
//! its ZooKeeper implementation for clusters ([`ZkStore`]).
//!
//! What is stored (the ZooKeeper layout of BookKeeper and DistributedLog, reduced to types):
//! * the bookie registry ([`BookieInfo`]) and the proxy registry ([`ProxyInfo`]),
//! * ledger id generation and ledger metadata ([`LedgerMetadata`]),
//! * stream metadata: the segment list and the highest txid ([`StreamMetadata`]);
//! * subscriptions: named reader positions per stream ([`Subscription`], DistributedLog's
//!   `SubscriptionsStore`), deleted with their stream.
//!
//! Every update is a compare-and-set against the [`Version`] the caller read, as with ZooKeeper's
//! `setData(path, data, version)`; a stale version fails with [`Error::BadVersion`] and changes
//! nothing. [`ZkStore`] maps each record to one znode (`docs/format/zookeeper-layout.md`), so
//! the trait deliberately offers nothing that needs a transaction across records.
//!
//! # Threading
//! Implementations are shared (`Send + Sync`) and used from the tokio metadata plane.

mod autorecovery;
mod config;
mod embedded;
mod placement;
mod subscription;
mod types;
mod zookeeper;

pub use autorecovery::{
    pending_decommissions, walk_ledgers, AuditorElection, PendingDecommission,
    UnderReplicationStore,
};
pub use config::{is_host_port_list, ConfigError, ZooKeeperConfig};
pub use embedded::{EmbeddedStore, EMBEDDED_FILE_NAME};
pub use placement::{
    PlacementPolicy, QuorumShape, StreamPlacement, LEDGER_PLACEMENT_KEY, PLACEMENT_REGIONS_MAX,
};
pub use subscription::{
    validate_subscription_name, Subscription, SUBSCRIPTION_NAME_SIZE_BYTES_MAX,
};
pub use types::*;
pub use zookeeper::{
    decode_stream_name, encode_stream_name, AuditorCandidate, AutorecoveryState, ZkDigest, ZkStore,
    ZK_LAYOUT_VERSION,
};

use async_trait::async_trait;

/// The version of a stored record, bumped by every successful update (ZooKeeper `Stat.version`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Version(pub u64);

/// A record together with the version it was read at.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned<T> {
    /// The record.
    pub value: T,
    /// Pass this back to an update to make it a compare-and-set.
    pub version: Version,
}

/// A successful update together with when the store applied it by the store's own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamped {
    /// The record's new version.
    pub version: Version,
    /// Milliseconds since the Unix epoch at which the store applied the update, by the store's
    /// clock: ZooKeeper's `Stat.mtime` (the leader's wall clock when it processed the write),
    /// the embedded store's process clock. `None` from a store that keeps no time.
    pub store_time_ms: Option<u64>,
}

/// Metadata store failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No record under this key.
    #[error("{kind} {key} does not exist")]
    NotFound { kind: &'static str, key: String },
    /// A create found the record already there.
    #[error("{kind} {key} already exists")]
    AlreadyExists { kind: &'static str, key: String },
    /// A compare-and-set lost: the record changed since it was read.
    #[error("{kind} {key} changed since it was read (expected version {expected}, found {found})")]
    BadVersion {
        kind: &'static str,
        key: String,
        expected: u64,
        found: u64,
    },
    /// A record's name or contents are not acceptable.
    #[error("invalid {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
    /// The store's own storage failed.
    #[error("metadata store I/O error on {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// The store's persisted state could not be parsed.
    #[error("metadata store file {path} is corrupt: {reason}")]
    Corrupt { path: String, reason: String },
    /// A ZooKeeper request failed for a reason other than the ones above: connection loss,
    /// session expiry or close, timeout, authentication. The operation may or may not have
    /// taken effect when the reason is a connection loss (ZooKeeper's rule); read back before
    /// retrying a non-idempotent update.
    #[error("ZooKeeper {op} on {path} failed: {source}")]
    ZooKeeper {
        op: &'static str,
        path: String,
        source: zookeeper_client::Error,
    },
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// The metadata interface shared by the embedded store and ZooKeeper.
///
/// # Errors
/// Every method can fail with `Io` (embedded) or `ZooKeeper` (ZooKeeper); the others are
/// listed per method.
#[async_trait]
pub trait MetadataStore: Send + Sync + 'static {
    /// Adds or replaces a bookie in the registry (BookKeeper `available/<id>`).
    async fn register_bookie(&self, info: BookieInfo) -> Result<()>;
    /// Removes a bookie from the registry; `NotFound` if it is not there.
    async fn unregister_bookie(&self, id: &BookieId) -> Result<()>;
    /// Every registered bookie, sorted by id.
    async fn list_bookies(&self) -> Result<Vec<BookieInfo>>;
    /// Reports that `bookies` miss entries of `ledger` (an add to them failed and was not
    /// re-sent elsewhere), so that autorecovery copies the entries back: BookKeeper's
    /// `markLedgerUnderreplicated`, called here by the writer as well as by the auditor.
    /// Returns `true` when a mark was made or extended, `false` when this store keeps no
    /// under-replication marks (the default: a store with no autorecovery, such as the
    /// sandbox's embedded one, where nothing would ever read them).
    ///
    /// # Errors
    /// The store's errors (`ZooKeeper`, `Corrupt` for an unreadable existing mark).
    async fn report_under_replicated(
        &self,
        ledger: quire_wire::LedgerId,
        bookies: &[BookieId],
    ) -> Result<bool> {
        let _ = (ledger, bookies);
        Ok(false)
    }
    /// Every registered bookie with its registration's epoch ([`BookieRegistration`]), sorted
    /// by id. The default lists [`MetadataStore::list_bookies`] with no epochs (`None`).
    async fn list_bookie_registrations(&self) -> Result<Vec<BookieRegistration>> {
        Ok(self
            .list_bookies()
            .await?
            .into_iter()
            .map(|info| BookieRegistration { info, epoch: None })
            .collect())
    }

    /// Hands out a ledger id never handed out before, even across restarts.
    async fn allocate_ledger_id(&self) -> Result<quire_wire::LedgerId>;
    /// The id [`MetadataStore::allocate_ledger_id`] tries next, without taking it: every id
    /// handed out so far is below it. An id at or above it was never allocated, so a ledger of
    /// that id cannot have been deleted (bookie garbage collection relies on this; ids given
    /// explicitly to `create_ledger` may lie above it).
    async fn next_ledger_id(&self) -> Result<quire_wire::LedgerId>;
    /// Stores new ledger metadata; `AlreadyExists` if the id is taken, `Invalid` if the
    /// quorum shape breaks E >= Qw >= Qa >= 1.
    async fn create_ledger(
        &self,
        id: quire_wire::LedgerId,
        meta: &LedgerMetadata,
    ) -> Result<Version>;
    /// Reads ledger metadata; `NotFound`.
    async fn read_ledger(&self, id: quire_wire::LedgerId) -> Result<Versioned<LedgerMetadata>>;
    /// [`MetadataStore::read_ledger`] that does not answer `NotFound` from a stale replica:
    /// ZooKeeper syncs the session's server with the leader first (`sync`, as BookKeeper's
    /// `ZkLedgerUnderreplicationManager` and readers after another client's write do), so a
    /// ledger created by another session before this call began is seen. The default (a store
    /// with one copy, such as the embedded one) is `read_ledger`. `NotFound`.
    async fn read_ledger_synced(
        &self,
        id: quire_wire::LedgerId,
    ) -> Result<Versioned<LedgerMetadata>> {
        self.read_ledger(id).await
    }
    /// Compare-and-set of ledger metadata; `NotFound`, `BadVersion`.
    async fn update_ledger(
        &self,
        id: quire_wire::LedgerId,
        meta: &LedgerMetadata,
        expected: Version,
    ) -> Result<Version>;
    /// Deletes ledger metadata; `NotFound`, `BadVersion`.
    async fn delete_ledger(&self, id: quire_wire::LedgerId, expected: Version) -> Result<()>;
    /// Ids of every ledger with metadata, ascending (BookKeeper `LedgerManager.getLedgerRanges`,
    /// what its garbage collector and DistributedLog's `audit_ledgers` walk). One listing per
    /// bucket of 10 000 ids in ZooKeeper; meant for periodic sweeps, not request paths.
    async fn list_ledgers(&self) -> Result<Vec<quire_wire::LedgerId>>;

    /// Creates a stream; `AlreadyExists`, `Invalid` for a bad name.
    async fn create_stream(&self, meta: &StreamMetadata) -> Result<Version>;
    /// Reads a stream; `NotFound`.
    async fn read_stream(&self, name: &str) -> Result<Versioned<StreamMetadata>>;
    /// Compare-and-set of stream metadata; `NotFound`, `BadVersion`.
    async fn update_stream(&self, meta: &StreamMetadata, expected: Version) -> Result<Version>;
    /// [`MetadataStore::update_stream`], also returning when the store applied the update by
    /// its own clock ([`Stamped`]), so that a writer can compare its clock with the store's
    /// (the stream layer ages segments by the store's clock). The default keeps no time
    /// (`store_time_ms: None`).
    async fn update_stream_stamped(
        &self,
        meta: &StreamMetadata,
        expected: Version,
    ) -> Result<Stamped> {
        Ok(Stamped {
            version: self.update_stream(meta, expected).await?,
            store_time_ms: None,
        })
    }
    /// Deletes a stream and its subscriptions; `NotFound`, `BadVersion`.
    async fn delete_stream(&self, name: &str, expected: Version) -> Result<()>;
    /// Names of every stream, sorted.
    async fn list_streams(&self) -> Result<Vec<String>>;

    /// Reads subscription `name` of `stream` (DistributedLog `getLastCommitPosition`);
    /// `NotFound` (kind "subscription") when absent, also when the stream does not exist;
    /// `Invalid` for a bad name.
    async fn read_subscription(&self, stream: &str, name: &str) -> Result<Versioned<Subscription>>;
    /// Creates (`expected = None`; `AlreadyExists`) or replaces by compare-and-set
    /// (`BadVersion`) subscription `name` of `stream`; `NotFound` (kind "stream") when the
    /// stream does not exist; `Invalid` for a bad name.
    async fn write_subscription(
        &self,
        stream: &str,
        name: &str,
        sub: &Subscription,
        expected: Option<Version>,
    ) -> Result<Version>;
    /// Every subscription of `stream`, sorted by name; `NotFound` (kind "stream") when the
    /// stream does not exist.
    async fn list_subscriptions(&self, stream: &str) -> Result<Vec<(String, Subscription)>>;
    /// Deletes subscription `name` of `stream` (DistributedLog `deleteSubscriber`); `NotFound`.
    async fn delete_subscription(&self, stream: &str, name: &str) -> Result<()>;

    /// The cluster's instance id, created at random the first time any process asks
    /// (BookKeeper `INSTANCEID`).
    async fn instance_id(&self) -> Result<String>;
    /// Reads a bookie's cookie; `NotFound` if the bookie never registered one.
    async fn read_cookie(&self, bookie: &BookieId) -> Result<Versioned<Cookie>>;
    /// Creates (`expected = None`; `AlreadyExists` if present) or replaces by compare-and-set
    /// (`BadVersion`) a bookie's cookie.
    async fn write_cookie(&self, cookie: &Cookie, expected: Option<Version>) -> Result<Version>;

    /// Tries to become the single owner of a stream (DistributedLog's ephemeral-sequential
    /// write lock, without waiting). `Ok(Ok(lease))` on success; `Ok(Err(owner))` names the
    /// current owner when someone else holds it.
    async fn try_acquire_stream(
        &self,
        stream: &str,
        owner: &str,
    ) -> Result<std::result::Result<StreamLease, String>>;
    /// The current owner of a stream, if any.
    async fn stream_owner(&self, stream: &str) -> Result<Option<String>>;
    /// Gives ownership up; a no-op if it was already lost.
    async fn release_stream(&self, lease: StreamLease) -> Result<()>;

    /// Returns once the stream record's version is no longer `seen` (it was updated or
    /// deleted), or after `timeout`, whichever comes first; the caller reads the record again.
    /// A follower reader learns of rolls, seals and truncations this way (DistributedLog's
    /// readers watch the log segments znode). ZooKeeper sets a data watch on the record; this
    /// default, for stores without watches, just waits up to 100 ms (a poll).
    async fn wait_stream_changed(
        &self,
        name: &str,
        seen: Version,
        timeout: std::time::Duration,
    ) -> Result<()> {
        let _ = (name, seen);
        tokio::time::sleep(timeout.min(std::time::Duration::from_millis(100))).await;
        Ok(())
    }
    /// Adds or rewrites this process's record in the proxy registry ([`ProxyInfo`]; ZooKeeper:
    /// the EPHEMERAL node `proxies/<address>` of this session, gone when the session ends).
    /// `Invalid` for an address that is not one path component. The default keeps no registry.
    async fn register_proxy(&self, info: &ProxyInfo) -> Result<()> {
        let _ = info;
        Ok(())
    }
    /// Removes a proxy's record (a drain, before the streams are given up); a no-op if absent.
    async fn unregister_proxy(&self, address: &str) -> Result<()> {
        let _ = address;
        Ok(())
    }
    /// Every registered proxy, sorted by address (empty from a store that keeps no registry).
    async fn list_proxies(&self) -> Result<Vec<ProxyInfo>> {
        Ok(Vec::new())
    }
    /// Marks `region` as not accepting new streams (`unavailable`), or clears the mark
    /// (ZooKeeper: the persistent node `regions/unavailable/<region>`; the embedded store: the
    /// document's `unavailable_regions`; issue 30 item 4; the proxies of a marked region answer `REGION_UNAVAILABLE` to requests that would acquire a
    /// stream). Idempotent. `Invalid` for a region that is not one path component, and from
    /// a store that keeps no marks (the default; both Quire stores keep them).
    async fn set_region_unavailable(&self, region: &str, unavailable: bool) -> Result<()> {
        let _ = (region, unavailable);
        Err(Error::Invalid {
            what: "region mark",
            reason: "this metadata store keeps no region marks".into(),
        })
    }
    /// The regions marked unavailable, sorted (empty from a store that keeps no marks).
    async fn unavailable_regions(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
    /// Whether `region` is marked unavailable (one read; the default lists every mark).
    async fn region_unavailable(&self, region: &str) -> Result<bool> {
        Ok(self
            .unavailable_regions()
            .await?
            .iter()
            .any(|r| r == region))
    }
}

/// `Invalid` unless `region` can name a region mark: one path component (a ZooKeeper znode
/// name; the embedded store keeps the same rule so that a mark valid in one store is valid in
/// the other).
pub(crate) fn validate_region(region: &str) -> Result<()> {
    if region.is_empty()
        || region == "."
        || region == ".."
        || region.contains('/')
        || region.chars().any(char::is_control)
        || region.len() > 255
    {
        return Err(Error::Invalid {
            what: "region",
            reason: format!("{region:?} is not one path component"),
        });
    }
    Ok(())
}

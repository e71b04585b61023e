//! The ZooKeeper metadata store: every record is one znode under a root path (e.g. `/quire`),
//! following BookKeeper's and DistributedLog's ZooKeeper layouts, reduced to Quire's records.
//! The layout, node types, encodings and the lock recipe are specified in
//! `docs/format/zookeeper-layout.md`.
//!
//! * Versions are znode `Stat.version`s; every update is `setData`/`delete` with the expected
//!   version, so a stale version fails with [`Error::BadVersion`] and changes nothing.
//! * Bookie registrations and stream locks are EPHEMERAL znodes of this store's session: they
//!   vanish when the session closes (the store is dropped) or expires. Watch
//!   [`ZkStore::session_lost`] to learn of it; a bookie or proxy must then stop acting on them.
//! * ZooKeeper failures (connection loss, session expiry, ...) surface as
//!   [`Error::ZooKeeper`]; nothing is retried behind the caller's back except where a retry is
//!   provably harmless: reads of a node that raced with its deletion, a lost CAS on the ledger id
//!   counter, and reads that met a connection loss while the session lives
//!   ([`ZkStore::get_data`], [`ZkStore::list_children`]).
//!
//! # Runtime
//! The `zookeeper-client` crate spawns its session task on the current tokio runtime:
//! [`ZkStore::connect`] must run inside a tokio runtime context, and that runtime must keep
//! running while the store is used. Background watch tasks are spawned there too.
//!
//! # Modules
//! This module owns the session (connect, the session watcher, [`ZkStore::session_lost`]) and
//! maps [`MetadataStore`] onto the others: `layout` (the root's layout version and instance id),
//! `paths` (znode names and paths), `records` (JSON records read, created and compared-and-set
//! by znode version: ledgers, streams, cookies), `registry` (ephemeral bookie registrations),
//! `id_gen` (the ledger id counter), `lock` (stream ownership by ephemeral-sequential lock) and
//! `underreplication` (autorecovery: under-replicated ledger marks, replication locks, the
//! auditor election).

mod id_gen;
mod layout;
mod lock;
mod paths;
mod proxies;
mod records;
mod regions;
mod registry;
mod subscriptions;
mod underreplication;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use quire_wire::LedgerId;
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::{
    BookieId, BookieInfo, BookieRegistration, Cookie, Error, LedgerMetadata, MetadataStore, Result,
    Stamped, StreamLease, StreamMetadata, Subscription, Version, Versioned,
};

pub use layout::ZK_LAYOUT_VERSION;
pub use paths::{decode_stream_name, encode_stream_name};
pub use underreplication::{AuditorCandidate, AutorecoveryState};

use lock::LeaseFlags;
use records::zk_err;

struct Inner {
    client: zk::Client,
    root: String,
    session_lost: watch::Receiver<bool>,
    /// The ACL of every node this store creates: `creator_all` with digest authentication,
    /// `anyone_all` without.
    acls: zk::Acls<'static>,
    /// Lost-flags of the leases this session holds, flipped by the session watcher *before*
    /// `session_lost`, so that anyone who sees the session lost also sees its leases lost.
    leases: LeaseFlags,
    /// Lock nodes of leases this store handed out and still watches (see `lock.rs`: a lock
    /// node of this session not among them is an orphan).
    held: std::sync::Mutex<lock::HeldLocks>,
    /// Concurrent ledger id allocations, served together (`id_gen.rs`).
    id_rounds: id_gen::IdRounds,
}

/// The ZooKeeper-backed [`MetadataStore`]. Cloning shares one ZooKeeper session; the session is
/// closed (and this store's ephemeral nodes deleted) when the last clone is dropped.
///
/// # Threading
/// `Send + Sync`; ZooKeeper orders the requests of one session.
#[derive(Clone)]
pub struct ZkStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ZkStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkStore")
            .field("root", &self.inner.root)
            .field("session", &self.inner.client.session_id())
            .finish()
    }
}

impl ZkStore {
    /// Connects to ZooKeeper (`connect_string` is `host:port[,host:port...]`), opens the layout
    /// under `root` (an absolute path other than `/`, e.g. `/quire`), creating it atomically on
    /// first use, and checks its layout version.
    ///
    /// `session_timeout` is the requested ZooKeeper session timeout; the server clamps it to
    /// [2, 20] × its tickTime. Ephemeral nodes of this store outlive a crash of this process by
    /// about that long (BookKeeper's `zkTimeout`).
    ///
    /// Must be called inside a tokio runtime context (see the module docs).
    ///
    /// # Errors
    /// `Invalid` for a bad root path; `ZooKeeper` when the connection or a request fails (e.g.
    /// no server answers within about the session timeout); `Corrupt` when `<root>/LAYOUT` is
    /// unreadable or holds a layout version other than [`ZK_LAYOUT_VERSION`].
    pub async fn connect(
        connect_string: &str,
        root: &str,
        session_timeout: Duration,
    ) -> Result<ZkStore> {
        Self::connect_with_auth(connect_string, root, session_timeout, None).await
    }

    /// [`ZkStore::connect`], authenticated with `digest` when given (BookKeeper's
    /// `zkEnableSecurity`): the session adds the digest identity, and every node it creates
    /// carries the ACL `auth::cdrwa` (ZooKeeper's CREATOR_ALL_ACL), so that only sessions with
    /// the same identity can read, change or delete it (the ledger secrets of stream records
    /// included). Nodes created before, without an identity, keep `world:anyone:cdrwa`.
    ///
    /// # Errors
    /// As [`ZkStore::connect`]; a session whose identity lacks a right on an existing node fails
    /// that request with `ZooKeeper` (source `NoAuth`), e.g. opening a root created by another
    /// identity.
    pub async fn connect_with_auth(
        connect_string: &str,
        root: &str,
        session_timeout: Duration,
        digest: Option<&ZkDigest>,
    ) -> Result<ZkStore> {
        if !root.starts_with('/') || root.len() < 2 || root.ends_with('/') || root.contains("//") {
            return Err(Error::Invalid {
                what: "ZooKeeper root path",
                reason: format!(
                    "{root:?} must be absolute, not '/', and without a trailing or double '/'"
                ),
            });
        }
        let mut connector = zk::Client::connector().with_session_timeout(session_timeout);
        let mut acls = zk::Acls::anyone_all();
        if let Some(d) = digest {
            connector = connector.with_auth("digest", d.credentials().as_bytes());
            acls = zk::Acls::creator_all();
        }
        let client = connector
            .connect(connect_string)
            .await
            .map_err(|e| zk_err("connect", connect_string, e))?;

        // Session watcher: flips `session_lost` on a terminal state (expired, closed, auth failed).
        let (lost_tx, lost_rx) = watch::channel(false);
        let leases: LeaseFlags = Arc::default();
        let lease_flags = leases.clone();
        let mut states = client.state_watcher();
        tokio::spawn(async move {
            loop {
                match states.changed().await {
                    zk::SessionState::Expired
                    | zk::SessionState::Closed
                    | zk::SessionState::AuthFailed => {
                        tracing::warn!("ZooKeeper session lost");
                        lock::mark_all_lost(&lease_flags);
                        lost_tx.send_replace(true);
                        return;
                    }
                    _ => {}
                }
            }
        });

        let store = ZkStore {
            inner: Arc::new(Inner {
                client,
                root: root.to_string(),
                session_lost: lost_rx,
                acls,
                leases,
                held: Default::default(),
                id_rounds: Default::default(),
            }),
        };
        store.open_layout().await?;
        Ok(store)
    }

    /// `getData` of `path`, sent again after a connection loss while the session lives: the
    /// client reconnects (to another server of the ensemble, or the same one restarted) within
    /// the session timeout, and a read is idempotent, so it is retried as BookKeeper's
    /// `ZooKeeperClient` retries its operations, with a backoff from 50 ms to 1 s, for at most
    /// the negotiated session timeout. Any other error, or a connection loss past that, is
    /// returned as it is.
    pub(super) async fn get_data(
        &self,
        path: &str,
    ) -> std::result::Result<(Vec<u8>, zk::Stat), zk::Error> {
        self.read_retrying(|| self.inner.client.get_data(path))
            .await
    }

    /// `getChildren` of `path`, retried as [`ZkStore::get_data`] is.
    pub(super) async fn list_children(
        &self,
        path: &str,
    ) -> std::result::Result<Vec<String>, zk::Error> {
        self.read_retrying(|| self.inner.client.list_children(path))
            .await
    }

    async fn read_retrying<T, F, Fut>(&self, read: F) -> std::result::Result<T, zk::Error>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, zk::Error>>,
    {
        let deadline = quire_clock::now() + self.inner.client.session_timeout();
        let mut backoff = std::time::Duration::from_millis(50);
        loop {
            match read().await {
                Err(zk::Error::ConnectionLoss)
                    if !*self.inner.session_lost.borrow()
                        && quire_clock::now() + backoff < deadline =>
                {
                    tracing::debug!(
                        backoff_ms = backoff.as_millis() as u64,
                        "ZooKeeper read met a connection loss; reading again"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(std::time::Duration::from_secs(1));
                }
                r => return r,
            }
        }
    }

    /// Becomes `true` once this store's ZooKeeper session is over (expired, closed, or
    /// authentication failed). From then on every call fails with `ZooKeeper`, and every
    /// ephemeral node of the session (bookie registrations, stream locks) is gone or about to
    /// be: a bookie must stop serving writes and re-register with a new store, a proxy must
    /// stop writing the streams it owned (BookKeeper and DistributedLog both treat session
    /// expiry this way). A disconnection alone does not count: the session may resume.
    pub fn session_lost(&self) -> watch::Receiver<bool> {
        self.inner.session_lost.clone()
    }

    /// The underlying ZooKeeper client (for tests and tools, e.g. to read the session id).
    pub fn client(&self) -> &zk::Client {
        &self.inner.client
    }

    /// The root path of the layout.
    pub fn root(&self) -> &str {
        &self.inner.root
    }

    fn persistent(&self) -> zk::CreateOptions<'static> {
        zk::CreateMode::Persistent.with_acls(self.inner.acls)
    }

    fn ephemeral(&self) -> zk::CreateOptions<'static> {
        zk::CreateMode::Ephemeral.with_acls(self.inner.acls)
    }

    fn ephemeral_sequential(&self) -> zk::CreateOptions<'static> {
        zk::CreateMode::EphemeralSequential.with_acls(self.inner.acls)
    }
}

/// A ZooKeeper digest identity, `user:password` (ZooKeeper's `digest` scheme; BookKeeper's
/// `zkEnableSecurity` with a JAAS digest login). The password is never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ZkDigest {
    user: String,
    password: String,
}

impl ZkDigest {
    /// Parses `user:password`: the user ends at the first `:`, the password may hold more
    /// (surrounding whitespace, e.g. a file's final newline, is ignored).
    ///
    /// # Errors
    /// `Invalid` when there is no `:`, or the user or the password is empty.
    pub fn parse(text: &str) -> Result<ZkDigest> {
        let invalid = |reason: &str| Error::Invalid {
            what: "ZooKeeper digest",
            reason: reason.to_string(),
        };
        let (user, password) = text
            .trim()
            .split_once(':')
            .ok_or_else(|| invalid("expected user:password"))?;
        if user.is_empty() || password.is_empty() {
            return Err(invalid(
                "expected a non-empty user and password as user:password",
            ));
        }
        Ok(ZkDigest {
            user: user.to_string(),
            password: password.to_string(),
        })
    }

    /// The user name.
    pub fn user(&self) -> &str {
        &self.user
    }

    fn credentials(&self) -> String {
        format!("{}:{}", self.user, self.password)
    }
}

impl std::fmt::Debug for ZkDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkDigest")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Each method is implemented in the module of its concept.
#[async_trait]
impl MetadataStore for ZkStore {
    async fn report_under_replicated(
        &self,
        ledger: LedgerId,
        bookies: &[BookieId],
    ) -> Result<bool> {
        self.mark_gaps(ledger, bookies).await?;
        Ok(true)
    }
    async fn register_bookie(&self, info: BookieInfo) -> Result<()> {
        registry::register_bookie(self, info).await
    }

    async fn unregister_bookie(&self, id: &BookieId) -> Result<()> {
        registry::unregister_bookie(self, id).await
    }

    async fn list_bookies(&self) -> Result<Vec<BookieInfo>> {
        Ok(registry::list_bookie_registrations(self)
            .await?
            .into_iter()
            .map(|r| r.info)
            .collect())
    }

    async fn list_bookie_registrations(&self) -> Result<Vec<BookieRegistration>> {
        registry::list_bookie_registrations(self).await
    }

    async fn allocate_ledger_id(&self) -> Result<LedgerId> {
        id_gen::allocate_ledger_id(self).await
    }

    async fn next_ledger_id(&self) -> Result<LedgerId> {
        id_gen::next_ledger_id(self).await
    }

    async fn create_ledger(&self, id: LedgerId, meta: &LedgerMetadata) -> Result<Version> {
        records::create_ledger(self, id, meta).await
    }

    async fn read_ledger(&self, id: LedgerId) -> Result<Versioned<LedgerMetadata>> {
        records::read_ledger(self, id).await
    }

    async fn read_ledger_synced(&self, id: LedgerId) -> Result<Versioned<LedgerMetadata>> {
        records::read_ledger_synced(self, id).await
    }

    async fn update_ledger(
        &self,
        id: LedgerId,
        meta: &LedgerMetadata,
        expected: Version,
    ) -> Result<Version> {
        records::update_ledger(self, id, meta, expected).await
    }

    async fn delete_ledger(&self, id: LedgerId, expected: Version) -> Result<()> {
        records::delete_ledger(self, id, expected).await
    }

    async fn list_ledgers(&self) -> Result<Vec<LedgerId>> {
        records::list_ledgers(self).await
    }

    async fn create_stream(&self, meta: &StreamMetadata) -> Result<Version> {
        records::create_stream(self, meta).await
    }

    async fn read_stream(&self, name: &str) -> Result<Versioned<StreamMetadata>> {
        records::read_stream(self, name).await
    }

    async fn wait_stream_changed(
        &self,
        name: &str,
        seen: Version,
        timeout: Duration,
    ) -> Result<()> {
        records::wait_stream_changed(self, name, seen, timeout).await
    }

    async fn update_stream(&self, meta: &StreamMetadata, expected: Version) -> Result<Version> {
        Ok(records::update_stream(self, meta, expected).await?.version)
    }

    async fn update_stream_stamped(
        &self,
        meta: &StreamMetadata,
        expected: Version,
    ) -> Result<Stamped> {
        records::update_stream(self, meta, expected).await
    }

    async fn delete_stream(&self, name: &str, expected: Version) -> Result<()> {
        records::delete_stream(self, name, expected).await
    }

    async fn list_streams(&self) -> Result<Vec<String>> {
        records::list_streams(self).await
    }

    async fn read_subscription(&self, stream: &str, name: &str) -> Result<Versioned<Subscription>> {
        subscriptions::read_subscription(self, stream, name).await
    }

    async fn write_subscription(
        &self,
        stream: &str,
        name: &str,
        sub: &Subscription,
        expected: Option<Version>,
    ) -> Result<Version> {
        subscriptions::write_subscription(self, stream, name, sub, expected).await
    }

    async fn list_subscriptions(&self, stream: &str) -> Result<Vec<(String, Subscription)>> {
        subscriptions::list_subscriptions(self, stream).await
    }

    async fn delete_subscription(&self, stream: &str, name: &str) -> Result<()> {
        subscriptions::delete_subscription(self, stream, name).await
    }

    async fn instance_id(&self) -> Result<String> {
        layout::instance_id(self).await
    }

    async fn read_cookie(&self, bookie: &BookieId) -> Result<Versioned<Cookie>> {
        records::read_cookie(self, bookie).await
    }

    async fn write_cookie(&self, cookie: &Cookie, expected: Option<Version>) -> Result<Version> {
        records::write_cookie(self, cookie, expected).await
    }

    async fn try_acquire_stream(
        &self,
        stream: &str,
        owner: &str,
    ) -> Result<std::result::Result<StreamLease, String>> {
        lock::try_acquire_stream(self, stream, owner).await
    }

    async fn stream_owner(&self, stream: &str) -> Result<Option<String>> {
        lock::stream_owner(self, stream).await
    }

    async fn release_stream(&self, lease: StreamLease) -> Result<()> {
        lock::release_stream(self, lease).await
    }

    async fn register_proxy(&self, info: &crate::ProxyInfo) -> Result<()> {
        proxies::register_proxy(self, info).await
    }

    async fn unregister_proxy(&self, address: &str) -> Result<()> {
        proxies::unregister_proxy(self, address).await
    }

    async fn list_proxies(&self) -> Result<Vec<crate::ProxyInfo>> {
        proxies::list_proxies(self).await
    }

    async fn set_region_unavailable(&self, region: &str, unavailable: bool) -> Result<()> {
        regions::set_region_unavailable(self, region, unavailable).await
    }

    async fn unavailable_regions(&self) -> Result<Vec<String>> {
        regions::unavailable_regions(self).await
    }

    async fn region_unavailable(&self, region: &str) -> Result<bool> {
        regions::region_unavailable(self, region).await
    }
}

#[cfg(test)]
mod tests {
    use super::ZkDigest;

    #[test]
    fn digest_parses_user_and_password_and_never_prints_the_password() {
        let d = ZkDigest::parse("quire:pa:ss\n").unwrap();
        assert_eq!(
            (d.user(), d.credentials().as_str()),
            ("quire", "quire:pa:ss")
        );
        assert!(!format!("{d:?}").contains("pa:ss"));
        for bad in ["", "quire", "quire:", ":secret", "  \n"] {
            assert!(ZkDigest::parse(bad).is_err(), "{bad:?}");
        }
    }
}

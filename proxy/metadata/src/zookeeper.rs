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
//!   provably harmless (reads of a node that raced with its deletion, a lost CAS on the ledger id
//!   counter).
//!
//! # Runtime
//! The `zookeeper-client` crate spawns its session task on the current tokio runtime:
//! [`ZkStore::connect`] must run inside a tokio runtime context, and that runtime must keep
//! running while the store is used. Background watch tasks are spawned there too.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use quire_wire::LedgerId;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::embedded::random_instance_id;
use crate::{
    validate_stream_name, BookieId, BookieInfo, Cookie, Error, LedgerMetadata, MetadataStore,
    Result, StreamLease, StreamMetadata, Version, Versioned,
};

/// Version of the znode layout described in `docs/format/zookeeper-layout.md`, stored in
/// `<root>/LAYOUT`. A store refuses to open a root whose layout version differs.
pub const ZK_LAYOUT_VERSION: u32 = 1;

/// Prefix of the ephemeral-sequential children of a stream's lock node.
const LOCK_CHILD_PREFIX: &str = "lock-";
/// How often `try_acquire_stream` starts over when the holder vanished while it looked.
const LOCK_ATTEMPTS_MAX: usize = 16;

/// Content of `<root>/LAYOUT`.
#[derive(Debug, Serialize, Deserialize)]
struct LayoutRecord {
    layout_version: u32,
}

struct Inner {
    client: zk::Client,
    root: String,
    session_lost: watch::Receiver<bool>,
    /// Lost-flags of the leases this session holds, flipped by the session watcher *before*
    /// `session_lost`, so that anyone who sees the session lost also sees its leases lost.
    leases: LeaseFlags,
}

/// Senders of live leases' `lost` flags.
type LeaseFlags = Arc<std::sync::Mutex<Vec<std::sync::Weak<watch::Sender<bool>>>>>;

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

fn zk_err(op: &'static str, path: &str, source: zk::Error) -> Error {
    Error::ZooKeeper {
        op,
        path: path.to_string(),
        source,
    }
}

fn persistent() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

fn ephemeral() -> zk::CreateOptions<'static> {
    zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all())
}

fn ephemeral_sequential() -> zk::CreateOptions<'static> {
    zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all())
}

fn to_json<T: Serialize>(what: &str, value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| Error::Invalid {
        what: "record",
        reason: format!("cannot encode {what}: {e}"),
    })
}

fn from_json<T: for<'de> Deserialize<'de>>(path: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::Corrupt {
        path: path.to_string(),
        reason: e.to_string(),
    })
}

fn version_of(stat: &zk::Stat) -> Version {
    // Stat.version is a non-negative i32 for every znode this store writes.
    Version(u64::try_from(stat.version).unwrap_or(0))
}

/// Encodes a stream name into one znode name: `%` becomes `%25` and `/` becomes `%2F`; every
/// other allowed character (ASCII letters, digits, `-`, `_`, `.`) stays as it is. Valid names
/// never start with `.`, so the result is never `.` or `..`.
pub fn encode_stream_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

/// Inverse of [`encode_stream_name`].
///
/// # Errors
/// `Invalid` for a `%` not followed by `25` or `2F`.
pub fn decode_stream_name(encoded: &str) -> Result<String> {
    let mut out = String::with_capacity(encoded.len());
    let mut rest = encoded;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let esc = rest.get(i..i + 3);
        match esc {
            Some("%25") => out.push('%'),
            Some("%2F") => out.push('/'),
            _ => {
                return Err(Error::Invalid {
                    what: "encoded stream name",
                    reason: format!("{encoded:?}: '%' must be followed by 25 or 2F"),
                })
            }
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Checks that a bookie id can be one znode name.
fn validate_bookie_id(id: &BookieId) -> Result<()> {
    let s = id.0.as_str();
    if s.is_empty()
        || s == "."
        || s == ".."
        || s.contains('/')
        || s.chars().any(char::is_control)
        || s.len() > 255
    {
        return Err(Error::Invalid {
            what: "bookie id",
            reason: format!("{s:?} must be 1 to 255 bytes without '/' or control characters, and not '.' or '..'"),
        });
    }
    Ok(())
}

/// Ledger ids as 20 decimal digits, split BookKeeper-style so no directory holds more than
/// 10 000 ledgers: `ledgers/<first 16 digits>/L<last 4 digits>`.
fn ledger_bucket_and_leaf(id: LedgerId) -> (String, String) {
    let d = format!("{:020}", id.0);
    (d[..16].to_string(), format!("L{}", &d[16..]))
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
        if !root.starts_with('/') || root.len() < 2 || root.ends_with('/') || root.contains("//") {
            return Err(Error::Invalid {
                what: "ZooKeeper root path",
                reason: format!(
                    "{root:?} must be absolute, not '/', and without a trailing or double '/'"
                ),
            });
        }
        let client = zk::Client::connector()
            .with_session_timeout(session_timeout)
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
                        let flags = lease_flags
                            .lock()
                            .map(|mut v| std::mem::take(&mut *v))
                            .unwrap_or_default();
                        for flag in flags.iter().filter_map(std::sync::Weak::upgrade) {
                            flag.send_replace(true);
                        }
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
                leases,
            }),
        };
        store.open_layout().await?;
        Ok(store)
    }

    /// Creates the layout if `<root>/LAYOUT` is absent (one multi-op, so it is all or nothing),
    /// then checks the layout version.
    async fn open_layout(&self) -> Result<()> {
        let c = &self.inner.client;
        let root = &self.inner.root;
        if let Some(parent) = root.rfind('/').filter(|&i| i > 0).map(|i| &root[..i]) {
            c.mkdir(parent, &persistent())
                .await
                .map_err(|e| zk_err("mkdir", parent, e))?;
        }
        match c.create(root, b"", &persistent()).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(zk_err("create", root, e)),
        }
        let layout_path = self.path("LAYOUT");
        if c.check_stat(&layout_path)
            .await
            .map_err(|e| zk_err("exists", &layout_path, e))?
            .is_none()
        {
            let layout = to_json(
                "layout",
                &LayoutRecord {
                    layout_version: ZK_LAYOUT_VERSION,
                },
            )?;
            let next_id = to_json("ledger id counter", &1u64)?;
            let mut multi = c.new_multi_writer();
            let add = |multi: &mut zk::MultiWriter<'_>, rel: &str, data: &[u8]| {
                let p = self.path(rel);
                multi
                    .add_create(&p, data, &persistent())
                    .map_err(|e| zk_err("create", &p, e))
            };
            add(&mut multi, "LAYOUT", &layout)?;
            for dir in [
                "bookies",
                "bookies/available",
                "bookies/readonly",
                "cookies",
                "idgen",
                "ledgers",
                "streams",
                "locks",
            ] {
                add(&mut multi, dir, b"")?;
            }
            add(&mut multi, "idgen/ledger", &next_id)?;
            match multi.commit().await {
                Ok(_) => {
                    tracing::info!(root = %root, "created ZooKeeper metadata layout version {ZK_LAYOUT_VERSION}")
                }
                // Another process created it first.
                Err(zk::MultiWriteError::OperationFailed {
                    source: zk::Error::NodeExists,
                    ..
                }) => {}
                Err(e) => return Err(zk_err("create layout", root, e.into())),
            }
        }
        let (bytes, _) = c
            .get_data(&layout_path)
            .await
            .map_err(|e| zk_err("get", &layout_path, e))?;
        let layout: LayoutRecord = from_json(&layout_path, &bytes)?;
        if layout.layout_version != ZK_LAYOUT_VERSION {
            return Err(Error::Corrupt {
                path: layout_path,
                reason: format!(
                    "layout version {} is not the supported {ZK_LAYOUT_VERSION}",
                    layout.layout_version
                ),
            });
        }
        Ok(())
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

    fn path(&self, rel: &str) -> String {
        format!("{}/{rel}", self.inner.root)
    }

    fn ledger_path(&self, id: LedgerId) -> String {
        let (bucket, leaf) = ledger_bucket_and_leaf(id);
        self.path(&format!("ledgers/{bucket}/{leaf}"))
    }

    fn stream_path(&self, name: &str) -> String {
        self.path(&format!("streams/{}", encode_stream_name(name)))
    }

    fn lock_dir(&self, name: &str) -> String {
        self.path(&format!("locks/{}", encode_stream_name(name)))
    }

    fn bookie_path(&self, id: &BookieId, read_only: bool) -> String {
        self.path(&format!(
            "bookies/{}/{}",
            if read_only { "readonly" } else { "available" },
            id.0
        ))
    }

    fn my_session(&self) -> i64 {
        self.inner.client.session_id().0
    }

    /// Reads and decodes one record.
    async fn get<T: for<'de> Deserialize<'de>>(
        &self,
        kind: &'static str,
        key: &str,
        path: &str,
    ) -> Result<Versioned<T>> {
        match self.inner.client.get_data(path).await {
            Ok((bytes, stat)) => Ok(Versioned {
                value: from_json(path, &bytes)?,
                version: version_of(&stat),
            }),
            Err(zk::Error::NoNode) => Err(Error::NotFound {
                kind,
                key: key.to_string(),
            }),
            Err(e) => Err(zk_err("get", path, e)),
        }
    }

    /// Creates a persistent record; `AlreadyExists` if present.
    async fn create_record(
        &self,
        kind: &'static str,
        key: &str,
        path: &str,
        data: &[u8],
    ) -> Result<Version> {
        match self.inner.client.create(path, data, &persistent()).await {
            Ok((stat, _)) => Ok(version_of(&stat)),
            Err(zk::Error::NodeExists) => Err(Error::AlreadyExists {
                kind,
                key: key.to_string(),
            }),
            Err(e) => Err(zk_err("create", path, e)),
        }
    }

    /// Turns a failed versioned write into the crate's error, reading the current version for
    /// `BadVersion` (best effort).
    async fn versioned_write_error(
        &self,
        op: &'static str,
        kind: &'static str,
        key: &str,
        path: &str,
        expected: Version,
        e: zk::Error,
    ) -> Error {
        match e {
            zk::Error::NoNode => Error::NotFound {
                kind,
                key: key.to_string(),
            },
            zk::Error::BadVersion => {
                let found = match self.inner.client.check_stat(path).await {
                    Ok(Some(stat)) => version_of(&stat).0,
                    _ => expected.0,
                };
                Error::BadVersion {
                    kind,
                    key: key.to_string(),
                    expected: expected.0,
                    found,
                }
            }
            e => zk_err(op, path, e),
        }
    }

    /// `setData` with the expected version.
    async fn cas(
        &self,
        kind: &'static str,
        key: &str,
        path: &str,
        data: &[u8],
        expected: Version,
    ) -> Result<Version> {
        let Ok(v) = i32::try_from(expected.0) else {
            return Err(Error::BadVersion {
                kind,
                key: key.to_string(),
                expected: expected.0,
                found: 0,
            });
        };
        match self.inner.client.set_data(path, data, Some(v)).await {
            Ok(stat) => Ok(version_of(&stat)),
            Err(e) => Err(self
                .versioned_write_error("set", kind, key, path, expected, e)
                .await),
        }
    }

    /// `delete` with the expected version.
    async fn cas_delete(
        &self,
        kind: &'static str,
        key: &str,
        path: &str,
        expected: Version,
    ) -> Result<()> {
        let Ok(v) = i32::try_from(expected.0) else {
            return Err(Error::BadVersion {
                kind,
                key: key.to_string(),
                expected: expected.0,
                found: 0,
            });
        };
        match self.inner.client.delete(path, Some(v)).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self
                .versioned_write_error("delete", kind, key, path, expected, e)
                .await),
        }
    }

    /// Reads the bookie registrations under `bookies/<sub>`, skipping nodes that vanish while
    /// being read.
    async fn list_bookie_dir(
        &self,
        sub: &str,
        out: &mut BTreeMap<BookieId, BookieInfo>,
    ) -> Result<()> {
        let dir = self.path(&format!("bookies/{sub}"));
        let children = self
            .inner
            .client
            .list_children(&dir)
            .await
            .map_err(|e| zk_err("list", &dir, e))?;
        for child in children {
            let p = format!("{dir}/{child}");
            match self.inner.client.get_data(&p).await {
                Ok((bytes, _)) => {
                    let info: BookieInfo = from_json(&p, &bytes)?;
                    out.insert(info.id.clone(), info);
                }
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(zk_err("get", &p, e)),
            }
        }
        Ok(())
    }

    /// The lock children of a stream, sorted by sequence number (lowest = owner).
    async fn lock_children(&self, dir: &str) -> Result<Vec<String>> {
        let mut children = match self.inner.client.list_children(dir).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(zk_err("list", dir, e)),
        };
        children.retain(|c| c.starts_with(LOCK_CHILD_PREFIX));
        // The sequence suffix is 10 (or, past i32::MAX, 19) digits: compare by number.
        children.sort_by_key(|c| {
            c[LOCK_CHILD_PREFIX.len()..]
                .parse::<u64>()
                .unwrap_or(u64::MAX)
        });
        Ok(children)
    }

    /// The owner recorded in the lowest lock child, if any; `None` also when the children
    /// vanished while being read (the caller retries).
    async fn lowest_owner(&self, dir: &str, children: &[String]) -> Result<Option<String>> {
        let Some(first) = children.first() else {
            return Ok(None);
        };
        let p = format!("{dir}/{first}");
        match self.inner.client.get_data(&p).await {
            Ok((bytes, _)) => Ok(Some(String::from_utf8(bytes).map_err(|_| {
                Error::Corrupt {
                    path: p.clone(),
                    reason: "lock owner is not UTF-8".into(),
                }
            })?)),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(zk_err("get", &p, e)),
        }
    }
}

/// Watches a held lock node; flips `tx` to `true` once the node is deleted, the session is lost,
/// or the store is dropped. Ends early when every lease receiver is gone.
async fn watch_lease(
    store: Weak<Inner>,
    path: String,
    tx: Arc<watch::Sender<bool>>,
    mut session_lost: watch::Receiver<bool>,
) {
    loop {
        let watcher = {
            let Some(inner) = store.upgrade() else { break };
            match inner.client.check_and_watch_stat(&path).await {
                Ok((Some(_), watcher)) => watcher,
                Ok((None, _)) => break,
                Err(e) => {
                    drop(inner);
                    tracing::debug!(path = %path, "cannot watch stream lock: {e}");
                    // Connection trouble: wait for it to resolve either way, then look again.
                    tokio::select! {
                        _ = session_lost.wait_for(|lost| *lost) => break,
                        () = tokio::time::sleep(Duration::from_millis(200)) => continue,
                        () = tx.closed() => return,
                    }
                }
            }
        };
        tokio::select! {
            event = watcher.changed() => match event.event_type {
                zk::EventType::NodeDeleted => break,
                zk::EventType::Session
                    if matches!(
                        event.session_state,
                        zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed
                    ) => break,
                _ => continue,
            },
            _ = session_lost.wait_for(|lost| *lost) => break,
            () = tx.closed() => return,
        }
    }
    tx.send_replace(true);
}

#[async_trait]
impl MetadataStore for ZkStore {
    /// Creates the EPHEMERAL node `bookies/available/<id>` (or `bookies/readonly/<id>`) holding
    /// the [`BookieInfo`] as JSON and removes this session's node from the other directory. If
    /// another session still holds the node (a previous incarnation of the bookie that has not
    /// expired yet), waits up to the session timeout for it to go away, as a BookKeeper bookie
    /// does at start, then fails with `AlreadyExists`.
    async fn register_bookie(&self, info: BookieInfo) -> Result<()> {
        validate_bookie_id(&info.id)?;
        let c = &self.inner.client;
        let mine = self.bookie_path(&info.id, info.read_only);
        let other = self.bookie_path(&info.id, !info.read_only);
        let data = to_json("bookie info", &info)?;
        let deadline = tokio::time::Instant::now() + c.session_timeout() + Duration::from_secs(1);
        loop {
            match c.create(&mine, &data, &ephemeral()).await {
                Ok(_) => break,
                Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(zk_err("create", &mine, e)),
            }
            let (stat, watcher) = c
                .check_and_watch_stat(&mine)
                .await
                .map_err(|e| zk_err("exists", &mine, e))?;
            let Some(stat) = stat else { continue };
            if stat.ephemeral_owner == self.my_session() {
                c.set_data(&mine, &data, None)
                    .await
                    .map_err(|e| zk_err("set", &mine, e))?;
                break;
            }
            if tokio::time::timeout_at(deadline, watcher.changed())
                .await
                .is_err()
            {
                return Err(Error::AlreadyExists {
                    kind: "bookie registration (held by another live ZooKeeper session)",
                    key: info.id.0.clone(),
                });
            }
        }
        match c.check_stat(&other).await {
            Ok(Some(stat)) if stat.ephemeral_owner == self.my_session() => {
                match c.delete(&other, None).await {
                    Ok(()) | Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(zk_err("delete", &other, e)),
                }
            }
            Ok(_) => {}
            Err(e) => return Err(zk_err("exists", &other, e)),
        }
        Ok(())
    }

    /// Deletes the bookie's node from `bookies/available` and `bookies/readonly`, whichever
    /// session created it (an operator's decommission).
    async fn unregister_bookie(&self, id: &BookieId) -> Result<()> {
        validate_bookie_id(id)?;
        let mut found = false;
        for read_only in [false, true] {
            let p = self.bookie_path(id, read_only);
            match self.inner.client.delete(&p, None).await {
                Ok(()) => found = true,
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(zk_err("delete", &p, e)),
            }
        }
        if found {
            Ok(())
        } else {
            Err(Error::NotFound {
                kind: "bookie",
                key: id.0.clone(),
            })
        }
    }

    async fn list_bookies(&self) -> Result<Vec<BookieInfo>> {
        let mut all = BTreeMap::new();
        self.list_bookie_dir("available", &mut all).await?;
        // A bookie caught between the two directories counts as read-only.
        self.list_bookie_dir("readonly", &mut all).await?;
        Ok(all.into_values().collect())
    }

    /// Compare-and-set increment of the counter `idgen/ledger` (the next id to hand out, JSON
    /// number, starting at 1); ids whose ledger node already exists (created with an explicit
    /// id) are skipped. Ids are never handed out twice, even across processes and restarts, as
    /// long as the layout is not deleted; a lost CAS retries, and an id whose allocation reply
    /// was lost to a connection failure is simply never used.
    async fn allocate_ledger_id(&self) -> Result<LedgerId> {
        let c = &self.inner.client;
        let p = self.path("idgen/ledger");
        loop {
            let (bytes, stat) = c.get_data(&p).await.map_err(|e| zk_err("get", &p, e))?;
            let next: u64 = from_json(&p, &bytes)?;
            let bumped = next.checked_add(1).ok_or_else(|| Error::Corrupt {
                path: p.clone(),
                reason: "ledger id counter is exhausted".into(),
            })?;
            match c
                .set_data(
                    &p,
                    &to_json("ledger id counter", &bumped)?,
                    Some(stat.version),
                )
                .await
            {
                Ok(_) => {}
                Err(zk::Error::BadVersion) => continue,
                Err(e) => return Err(zk_err("set", &p, e)),
            }
            let id = LedgerId(next);
            let lp = self.ledger_path(id);
            match c.check_stat(&lp).await {
                Ok(None) => return Ok(id),
                Ok(Some(_)) => continue,
                Err(e) => return Err(zk_err("exists", &lp, e)),
            }
        }
    }

    async fn create_ledger(&self, id: LedgerId, meta: &LedgerMetadata) -> Result<Version> {
        meta.validate()?;
        let data = to_json("ledger metadata", meta)?;
        let p = self.ledger_path(id);
        let key = id.to_string();
        match self.create_record("ledger", &key, &p, &data).await {
            Err(Error::ZooKeeper {
                source: zk::Error::NoNode,
                ..
            }) => {
                // First ledger of its bucket: create the bucket, then retry once.
                let bucket = &p[..p.rfind('/').unwrap_or(p.len())];
                match self.inner.client.create(bucket, b"", &persistent()).await {
                    Ok(_) | Err(zk::Error::NodeExists) => {}
                    Err(e) => return Err(zk_err("create", bucket, e)),
                }
                self.create_record("ledger", &key, &p, &data).await
            }
            other => other,
        }
    }

    async fn read_ledger(&self, id: LedgerId) -> Result<Versioned<LedgerMetadata>> {
        self.get("ledger", &id.to_string(), &self.ledger_path(id))
            .await
    }

    async fn update_ledger(
        &self,
        id: LedgerId,
        meta: &LedgerMetadata,
        expected: Version,
    ) -> Result<Version> {
        meta.validate()?;
        let data = to_json("ledger metadata", meta)?;
        self.cas(
            "ledger",
            &id.to_string(),
            &self.ledger_path(id),
            &data,
            expected,
        )
        .await
    }

    async fn delete_ledger(&self, id: LedgerId, expected: Version) -> Result<()> {
        self.cas_delete("ledger", &id.to_string(), &self.ledger_path(id), expected)
            .await
    }

    async fn create_stream(&self, meta: &StreamMetadata) -> Result<Version> {
        validate_stream_name(&meta.name)?;
        let data = to_json("stream metadata", meta)?;
        self.create_record("stream", &meta.name, &self.stream_path(&meta.name), &data)
            .await
    }

    async fn read_stream(&self, name: &str) -> Result<Versioned<StreamMetadata>> {
        validate_stream_name(name)?;
        self.get("stream", name, &self.stream_path(name)).await
    }

    async fn update_stream(&self, meta: &StreamMetadata, expected: Version) -> Result<Version> {
        validate_stream_name(&meta.name)?;
        let data = to_json("stream metadata", meta)?;
        self.cas(
            "stream",
            &meta.name,
            &self.stream_path(&meta.name),
            &data,
            expected,
        )
        .await
    }

    /// Deletes the stream's node and, if no one holds or contends for its lock, its lock node.
    async fn delete_stream(&self, name: &str, expected: Version) -> Result<()> {
        validate_stream_name(name)?;
        self.cas_delete("stream", name, &self.stream_path(name), expected)
            .await?;
        let dir = self.lock_dir(name);
        match self.inner.client.delete(&dir, None).await {
            Ok(()) | Err(zk::Error::NoNode | zk::Error::NotEmpty) => Ok(()),
            Err(e) => Err(zk_err("delete", &dir, e)),
        }
    }

    async fn list_streams(&self) -> Result<Vec<String>> {
        let dir = self.path("streams");
        let children = self
            .inner
            .client
            .list_children(&dir)
            .await
            .map_err(|e| zk_err("list", &dir, e))?;
        let mut names = children
            .iter()
            .map(|c| {
                decode_stream_name(c).map_err(|e| Error::Corrupt {
                    path: format!("{dir}/{c}"),
                    reason: e.to_string(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        names.sort();
        Ok(names)
    }

    /// `INSTANCEID` holds the id as ASCII; the first process to find it absent creates it, and a
    /// loser of that race reads the winner's.
    async fn instance_id(&self) -> Result<String> {
        let c = &self.inner.client;
        let p = self.path("INSTANCEID");
        loop {
            match c.get_data(&p).await {
                Ok((bytes, _)) => {
                    return String::from_utf8(bytes).map_err(|_| Error::Corrupt {
                        path: p.clone(),
                        reason: "instance id is not UTF-8".into(),
                    })
                }
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(zk_err("get", &p, e)),
            }
            let id = random_instance_id();
            match c.create(&p, id.as_bytes(), &persistent()).await {
                Ok(_) => return Ok(id),
                Err(zk::Error::NodeExists) => continue,
                Err(e) => return Err(zk_err("create", &p, e)),
            }
        }
    }

    async fn read_cookie(&self, bookie: &BookieId) -> Result<Versioned<Cookie>> {
        validate_bookie_id(bookie)?;
        self.get(
            "cookie",
            &bookie.0,
            &self.path(&format!("cookies/{}", bookie.0)),
        )
        .await
    }

    async fn write_cookie(&self, cookie: &Cookie, expected: Option<Version>) -> Result<Version> {
        validate_bookie_id(&cookie.bookie)?;
        let p = self.path(&format!("cookies/{}", cookie.bookie.0));
        let data = to_json("cookie", cookie)?;
        match expected {
            None => {
                self.create_record("cookie", &cookie.bookie.0, &p, &data)
                    .await
            }
            Some(v) => self.cas("cookie", &cookie.bookie.0, &p, &data, v).await,
        }
    }

    /// DistributedLog's lock recipe without waiting: create an EPHEMERAL_SEQUENTIAL child
    /// `locks/<encoded stream>/lock-<seq>` holding `owner`; it holds the lock iff its sequence
    /// number is the lowest. Otherwise the child is deleted again and the lowest child's owner
    /// is returned. The lease's `lost` flips when the child is deleted (by anyone), the session
    /// is lost, or the store is dropped; `token` is the child's path.
    async fn try_acquire_stream(
        &self,
        stream: &str,
        owner: &str,
    ) -> Result<std::result::Result<StreamLease, String>> {
        validate_stream_name(stream)?;
        let c = &self.inner.client;
        let dir = self.lock_dir(stream);
        let prefix = format!("{dir}/{LOCK_CHILD_PREFIX}");
        for _ in 0..LOCK_ATTEMPTS_MAX {
            let seq = match c
                .create(&prefix, owner.as_bytes(), &ephemeral_sequential())
                .await
            {
                Ok((_, seq)) => seq,
                Err(zk::Error::NoNode) => {
                    match c.create(&dir, b"", &persistent()).await {
                        Ok(_) | Err(zk::Error::NodeExists) => {}
                        Err(e) => return Err(zk_err("create", &dir, e)),
                    }
                    continue;
                }
                Err(e) => return Err(zk_err("create", &prefix, e)),
            };
            let mine = format!("{LOCK_CHILD_PREFIX}{seq}");
            let my_path = format!("{dir}/{mine}");
            let children = match self.lock_children(&dir).await {
                Ok(children) => children,
                Err(e) => {
                    let _ = c.delete(&my_path, None).await;
                    return Err(e);
                }
            };
            if children.first() == Some(&mine) {
                let (tx, rx) = watch::channel(false);
                let tx = Arc::new(tx);
                if let Ok(mut flags) = self.inner.leases.lock() {
                    flags.retain(|f| f.strong_count() > 0);
                    flags.push(Arc::downgrade(&tx));
                }
                tokio::spawn(watch_lease(
                    Arc::downgrade(&self.inner),
                    my_path.clone(),
                    tx,
                    self.session_lost(),
                ));
                tracing::debug!(stream, owner, lock = %my_path, "acquired stream lock");
                return Ok(Ok(StreamLease {
                    stream: stream.to_string(),
                    owner: owner.to_string(),
                    lost: rx,
                    token: my_path,
                }));
            }
            match c.delete(&my_path, None).await {
                Ok(()) | Err(zk::Error::NoNode) => {}
                Err(e) => return Err(zk_err("delete", &my_path, e)),
            }
            let others: Vec<String> = children.into_iter().filter(|c| *c != mine).collect();
            if let Some(holder) = self.lowest_owner(&dir, &others).await? {
                return Ok(Err(holder));
            }
            // The holder vanished while we looked: start over.
        }
        Err(Error::ZooKeeper {
            op: "acquire lock",
            path: dir,
            source: zk::Error::UnexpectedError(format!(
                "lock changed hands {LOCK_ATTEMPTS_MAX} times while acquiring"
            )),
        })
    }

    async fn stream_owner(&self, stream: &str) -> Result<Option<String>> {
        validate_stream_name(stream)?;
        let dir = self.lock_dir(stream);
        for _ in 0..LOCK_ATTEMPTS_MAX {
            let children = self.lock_children(&dir).await?;
            if children.is_empty() {
                return Ok(None);
            }
            if let Some(owner) = self.lowest_owner(&dir, &children).await? {
                return Ok(Some(owner));
            }
        }
        Ok(None)
    }

    /// Deletes the lease's lock child; a no-op if it is already gone (lost).
    async fn release_stream(&self, lease: StreamLease) -> Result<()> {
        let lock_prefix = format!("{}/", self.lock_dir(&lease.stream));
        if !lease.token.starts_with(&lock_prefix) {
            return Err(Error::Invalid {
                what: "stream lease",
                reason: format!("{} is not a lock of {}", lease.token, lease.stream),
            });
        }
        match self.inner.client.delete(&lease.token, None).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            // The session is over, so the ephemeral child is gone (or about to be) anyway.
            Err(zk::Error::SessionExpired | zk::Error::ClientClosed) => Ok(()),
            Err(e) => Err(zk_err("delete", &lease.token, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_name_encoding_round_trips_and_is_one_component() {
        for name in ["a", "logs/hdfs-2k", "a/b/c.d_e-f"] {
            let enc = encode_stream_name(name);
            assert!(!enc.contains('/'), "{enc}");
            assert_eq!(decode_stream_name(&enc).unwrap(), name);
        }
        assert_eq!(encode_stream_name("x/y"), "x%2Fy");
        for bad in ["%", "%2", "%41", "a%2f"] {
            assert!(decode_stream_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ledger_paths_split_into_buckets_of_ten_thousand() {
        assert_eq!(
            ledger_bucket_and_leaf(LedgerId(1)),
            ("0000000000000000".into(), "L0001".into())
        );
        assert_eq!(
            ledger_bucket_and_leaf(LedgerId(123_456_789)),
            ("0000000000012345".into(), "L6789".into())
        );
        let (b, l) = ledger_bucket_and_leaf(LedgerId(u64::MAX));
        assert_eq!((b.len(), l.len()), (16, 5));
    }
}

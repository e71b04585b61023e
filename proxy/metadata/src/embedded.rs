//! The embedded metadata store: all records in memory, persisted as one JSON document that is
//! replaced atomically (write to a temporary file, fdatasync, rename, fsync the directory) before
//! any update returns. Meant for the single-machine sandbox, where update rates are low (one
//! update per segment roll, not per entry). Format: `docs/format/metadata.md`.
//!
//! The document holds every stream's ledger secret and every ledger's master key, so it is
//! written mode 0600 in a directory of mode 0700; a store opened on a file or directory that
//! others can read warns and narrows them.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use quire_wire::LedgerId;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

mod underreplication;

use crate::{
    validate_stream_name, BookieId, BookieInfo, BookieRegistration, Cookie, Error, LedgerMetadata,
    MetadataStore, Result, Stamped, StreamLease, StreamMetadata, Subscription, Version, Versioned,
};

/// Layout version of the persisted document. Readers accept exactly this one so far.
pub const EMBEDDED_FORMAT_VERSION: u32 = 1;
/// Name of the document in the store's directory.
pub const EMBEDDED_FILE_NAME: &str = "metadata.json";

#[derive(Debug, Default, Serialize, Deserialize)]
struct Document {
    format_version: u32,
    /// Next ledger id to hand out.
    next_ledger_id: u64,
    bookies: BTreeMap<BookieId, BookieInfo>,
    ledgers: BTreeMap<u64, (LedgerMetadata, Version)>,
    streams: BTreeMap<String, (StreamMetadata, Version)>,
    #[serde(default)]
    instance_id: Option<String>,
    #[serde(default)]
    cookies: BTreeMap<BookieId, (Cookie, Version)>,
    /// Under-replication marks by ledger id (autorecovery; absent in documents written before).
    #[serde(default)]
    under_replicated: BTreeMap<u64, (crate::UnderReplication, Version)>,
    /// Bookies being decommissioned, with their records (older documents hold the start in
    /// milliseconds since the Unix epoch alone, which reads as a record).
    #[serde(default)]
    decommissioning: BTreeMap<BookieId, crate::Decommission>,
    /// Subscriptions by stream, then by name (absent in documents written before).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    subscriptions: BTreeMap<String, BTreeMap<String, (Subscription, Version)>>,
    /// Regions marked unavailable (ZooKeeper's `regions/unavailable/<region>` nodes; absent
    /// in documents written before, and when none is marked).
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    unavailable_regions: std::collections::BTreeSet<String>,
    /// Stream ownership is process-lifetime, like the ZooKeeper lock's ephemeral node.
    #[serde(skip)]
    leases: BTreeMap<String, (String, String, tokio::sync::watch::Sender<bool>)>,
    #[serde(skip)]
    next_lease_token: u64,
    /// The epoch of each bookie's current registration (process-lifetime, as registrations).
    #[serde(skip)]
    registration_epochs: BTreeMap<BookieId, u64>,
    #[serde(skip)]
    next_registration_epoch: u64,
}

/// The embedded, file-backed [`MetadataStore`].
///
/// # Threading
/// Shared (`Send + Sync`); updates are serialised by one async mutex.
#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<Mutex<Document>>,
    path: PathBuf,
    /// Replication locks and auditor candidates (process-lifetime, never persisted).
    ephemeral: Arc<std::sync::Mutex<underreplication::Ephemeral>>,
    /// The "session" of autorecovery's locks: the process, so it never ends (kept so that its
    /// receivers never see a closed channel).
    session: Arc<tokio::sync::watch::Sender<bool>>,
    /// The proxy registry (process-lifetime, never persisted, like ZooKeeper's ephemeral
    /// `proxies/*` nodes), by address.
    proxies: Arc<std::sync::Mutex<std::collections::BTreeMap<String, crate::ProxyInfo>>>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("path", &self.path)
            .finish()
    }
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `dir`, reading `dir/metadata.json` if it exists.
    /// Bookie registrations do not survive a restart: like ZooKeeper's ephemeral nodes, they
    /// belong to the process that made them.
    ///
    /// # Errors
    /// `Io` if the directory or file cannot be read, `Corrupt` if the file does not parse or has
    /// an unknown format version.
    pub fn open(dir: &Path) -> Result<Self> {
        let io = |source| Error::Io {
            path: dir.display().to_string(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(PRIVATE_DIR_MODE)
            .create(dir)
            .map_err(io)?;
        let path = dir.join(EMBEDDED_FILE_NAME);
        make_private(dir, PRIVATE_DIR_MODE).map_err(io)?;
        make_private(&path, PRIVATE_FILE_MODE).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })?;
        let mut doc = match std::fs::read(&path) {
            Ok(bytes) => {
                let doc: Document = serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?;
                if doc.format_version != EMBEDDED_FORMAT_VERSION {
                    return Err(Error::Corrupt {
                        path: path.display().to_string(),
                        reason: format!(
                            "format version {} is not the supported {}",
                            doc.format_version, EMBEDDED_FORMAT_VERSION
                        ),
                    });
                }
                doc
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Document {
                format_version: EMBEDDED_FORMAT_VERSION,
                next_ledger_id: 1,
                ..Default::default()
            },
            Err(e) => {
                return Err(Error::Io {
                    path: path.display().to_string(),
                    source: e,
                })
            }
        };
        doc.bookies.clear();
        Ok(Self {
            inner: Arc::new(Mutex::new(doc)),
            path,
            ephemeral: Arc::default(),
            session: Arc::new(tokio::sync::watch::channel(false).0),
            proxies: Arc::default(),
        })
    }

    /// Number of ledgers the store has metadata for. Meant for start-up checks, before any
    /// update runs: while one holds the lock it answers `usize::MAX`.
    pub fn ledger_count(&self) -> usize {
        self.inner
            .try_lock()
            .map_or(usize::MAX, |doc| doc.ledgers.len())
    }

    /// Writes the document durably. Called with the lock held, so writes never reorder.
    async fn persist(&self, doc: &Document) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(doc).map_err(|e| Error::Corrupt {
            path: self.path.display().to_string(),
            reason: format!("cannot serialise: {e}"),
        })?;
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || write_atomically(&path, &bytes))
            .await
            .map_err(|e| Error::Io {
                path: self.path.display().to_string(),
                source: std::io::Error::other(e),
            })?
    }
}

/// Mode of the metadata document: its owner only (it holds ledger secrets).
const PRIVATE_FILE_MODE: u32 = 0o600;
/// Mode of the store's directory.
const PRIVATE_DIR_MODE: u32 = 0o700;

/// Narrows `path` to `mode` when others have any access to it, with a warning (a store written
/// before modes were set, or a file copied in). A missing file is fine.
fn make_private(path: &Path, mode: u32) -> std::io::Result<()> {
    let found = match std::fs::metadata(path) {
        Ok(m) => m.permissions().mode() & 0o777,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if found & 0o077 != 0 {
        tracing::warn!(
            path = %path.display(),
            "{} was mode {found:o}, readable by other users, and holds ledger secrets: set to {mode:o}",
            path.display()
        );
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |source| Error::Io {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("json.tmp");
    // Created 0600 (truncated if a crash left one): the secrets are never readable by others.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(PRIVATE_FILE_MODE)
        .open(&tmp)
        .map_err(io)?;
    f.set_permissions(std::fs::Permissions::from_mode(PRIVATE_FILE_MODE))
        .map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_data().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)?;
    Ok(())
}

fn check_version(kind: &'static str, key: String, expected: Version, found: Version) -> Result<()> {
    if expected == found {
        Ok(())
    } else {
        Err(Error::BadVersion {
            kind,
            key,
            expected: expected.0,
            found: found.0,
        })
    }
}

#[async_trait]
impl MetadataStore for EmbeddedStore {
    async fn register_bookie(&self, info: BookieInfo) -> Result<()> {
        // Registrations are process-lifetime (ephemeral), so they are not persisted.
        let mut doc = self.inner.lock().await;
        doc.next_registration_epoch += 1;
        let epoch = doc.next_registration_epoch;
        doc.registration_epochs.insert(info.id.clone(), epoch);
        doc.bookies.insert(info.id.clone(), info);
        Ok(())
    }

    async fn unregister_bookie(&self, id: &BookieId) -> Result<()> {
        let mut doc = self.inner.lock().await;
        doc.registration_epochs.remove(id);
        match doc.bookies.remove(id) {
            Some(_) => Ok(()),
            None => Err(Error::NotFound {
                kind: "bookie",
                key: id.0.clone(),
            }),
        }
    }

    async fn list_bookies(&self) -> Result<Vec<BookieInfo>> {
        Ok(self.inner.lock().await.bookies.values().cloned().collect())
    }

    async fn list_bookie_registrations(&self) -> Result<Vec<BookieRegistration>> {
        let doc = self.inner.lock().await;
        Ok(doc
            .bookies
            .values()
            .map(|info| BookieRegistration {
                info: info.clone(),
                epoch: doc.registration_epochs.get(&info.id).copied(),
            })
            .collect())
    }

    async fn allocate_ledger_id(&self) -> Result<LedgerId> {
        let mut doc = self.inner.lock().await;
        let id = doc.next_ledger_id;
        doc.next_ledger_id += 1;
        self.persist(&doc).await?;
        Ok(LedgerId(id))
    }

    async fn next_ledger_id(&self) -> Result<LedgerId> {
        Ok(LedgerId(self.inner.lock().await.next_ledger_id))
    }

    async fn create_ledger(&self, id: LedgerId, meta: &LedgerMetadata) -> Result<Version> {
        meta.validate()?;
        let mut doc = self.inner.lock().await;
        if doc.ledgers.contains_key(&id.0) {
            return Err(Error::AlreadyExists {
                kind: "ledger",
                key: id.to_string(),
            });
        }
        doc.ledgers.insert(id.0, (meta.clone(), Version(0)));
        doc.next_ledger_id = doc.next_ledger_id.max(id.0 + 1);
        self.persist(&doc).await?;
        Ok(Version(0))
    }

    async fn read_ledger(&self, id: LedgerId) -> Result<Versioned<LedgerMetadata>> {
        let doc = self.inner.lock().await;
        let (value, version) = doc.ledgers.get(&id.0).cloned().ok_or(Error::NotFound {
            kind: "ledger",
            key: id.to_string(),
        })?;
        Ok(Versioned { value, version })
    }

    async fn update_ledger(
        &self,
        id: LedgerId,
        meta: &LedgerMetadata,
        expected: Version,
    ) -> Result<Version> {
        meta.validate()?;
        let mut doc = self.inner.lock().await;
        let slot = doc.ledgers.get_mut(&id.0).ok_or(Error::NotFound {
            kind: "ledger",
            key: id.to_string(),
        })?;
        check_version("ledger", id.to_string(), expected, slot.1)?;
        let next = Version(slot.1 .0 + 1);
        *slot = (meta.clone(), next);
        self.persist(&doc).await?;
        Ok(next)
    }

    async fn delete_ledger(&self, id: LedgerId, expected: Version) -> Result<()> {
        let mut doc = self.inner.lock().await;
        let found = doc
            .ledgers
            .get(&id.0)
            .ok_or(Error::NotFound {
                kind: "ledger",
                key: id.to_string(),
            })?
            .1;
        check_version("ledger", id.to_string(), expected, found)?;
        doc.ledgers.remove(&id.0);
        self.persist(&doc).await
    }

    async fn list_ledgers(&self) -> Result<Vec<LedgerId>> {
        let doc = self.inner.lock().await;
        Ok(doc.ledgers.keys().map(|&id| LedgerId(id)).collect())
    }

    async fn create_stream(&self, meta: &StreamMetadata) -> Result<Version> {
        validate_stream_name(&meta.name)?;
        let mut doc = self.inner.lock().await;
        if doc.streams.contains_key(&meta.name) {
            return Err(Error::AlreadyExists {
                kind: "stream",
                key: meta.name.clone(),
            });
        }
        doc.streams
            .insert(meta.name.clone(), (meta.clone(), Version(0)));
        self.persist(&doc).await?;
        Ok(Version(0))
    }

    async fn read_stream(&self, name: &str) -> Result<Versioned<StreamMetadata>> {
        let doc = self.inner.lock().await;
        let (value, version) = doc.streams.get(name).cloned().ok_or(Error::NotFound {
            kind: "stream",
            key: name.to_string(),
        })?;
        Ok(Versioned { value, version })
    }

    async fn update_stream(&self, meta: &StreamMetadata, expected: Version) -> Result<Version> {
        Ok(self.update_stream_stamped(meta, expected).await?.version)
    }

    /// The stamp is this process's wall clock after the update: the embedded store lives in
    /// the process that writes through it (the sandbox), so its clock is the writer's.
    async fn update_stream_stamped(
        &self,
        meta: &StreamMetadata,
        expected: Version,
    ) -> Result<Stamped> {
        let mut doc = self.inner.lock().await;
        let slot = doc.streams.get_mut(&meta.name).ok_or(Error::NotFound {
            kind: "stream",
            key: meta.name.clone(),
        })?;
        check_version("stream", meta.name.clone(), expected, slot.1)?;
        let next = Version(slot.1 .0 + 1);
        *slot = (meta.clone(), next);
        self.persist(&doc).await?;
        let now = quire_clock::unix_ms();
        Ok(Stamped {
            version: next,
            store_time_ms: Some(now),
        })
    }

    async fn delete_stream(&self, name: &str, expected: Version) -> Result<()> {
        let mut doc = self.inner.lock().await;
        let found = doc
            .streams
            .get(name)
            .ok_or(Error::NotFound {
                kind: "stream",
                key: name.to_string(),
            })?
            .1;
        check_version("stream", name.to_string(), expected, found)?;
        doc.streams.remove(name);
        doc.subscriptions.remove(name);
        self.persist(&doc).await
    }

    async fn list_streams(&self) -> Result<Vec<String>> {
        Ok(self.inner.lock().await.streams.keys().cloned().collect())
    }

    async fn read_subscription(&self, stream: &str, name: &str) -> Result<Versioned<Subscription>> {
        crate::validate_subscription_name(name)?;
        let doc = self.inner.lock().await;
        let (value, version) = doc
            .subscriptions
            .get(stream)
            .and_then(|subs| subs.get(name))
            .copied()
            .ok_or_else(|| subscription_not_found(stream, name))?;
        Ok(Versioned { value, version })
    }

    async fn write_subscription(
        &self,
        stream: &str,
        name: &str,
        sub: &Subscription,
        expected: Option<Version>,
    ) -> Result<Version> {
        crate::validate_subscription_name(name)?;
        let mut doc = self.inner.lock().await;
        if !doc.streams.contains_key(stream) {
            return Err(Error::NotFound {
                kind: "stream",
                key: stream.to_string(),
            });
        }
        let key = format!("{stream}/{name}");
        let subs = doc.subscriptions.entry(stream.to_string()).or_default();
        let next = match (subs.get(name), expected) {
            (None, None) => Version(0),
            (Some(_), None) => {
                return Err(Error::AlreadyExists {
                    kind: "subscription",
                    key,
                })
            }
            (None, Some(_)) => return Err(subscription_not_found(stream, name)),
            (Some((_, found)), Some(expected)) => {
                check_version("subscription", key, expected, *found)?;
                Version(found.0 + 1)
            }
        };
        subs.insert(name.to_string(), (*sub, next));
        self.persist(&doc).await?;
        Ok(next)
    }

    async fn list_subscriptions(&self, stream: &str) -> Result<Vec<(String, Subscription)>> {
        let doc = self.inner.lock().await;
        if !doc.streams.contains_key(stream) {
            return Err(Error::NotFound {
                kind: "stream",
                key: stream.to_string(),
            });
        }
        Ok(doc
            .subscriptions
            .get(stream)
            .map(|subs| subs.iter().map(|(n, (s, _))| (n.clone(), *s)).collect())
            .unwrap_or_default())
    }

    async fn delete_subscription(&self, stream: &str, name: &str) -> Result<()> {
        crate::validate_subscription_name(name)?;
        let mut doc = self.inner.lock().await;
        let subs = doc
            .subscriptions
            .get_mut(stream)
            .ok_or_else(|| subscription_not_found(stream, name))?;
        subs.remove(name)
            .ok_or_else(|| subscription_not_found(stream, name))?;
        if subs.is_empty() {
            doc.subscriptions.remove(stream);
        }
        self.persist(&doc).await
    }

    async fn instance_id(&self) -> Result<String> {
        let mut doc = self.inner.lock().await;
        if let Some(id) = &doc.instance_id {
            return Ok(id.clone());
        }
        let id = random_instance_id();
        doc.instance_id = Some(id.clone());
        self.persist(&doc).await?;
        Ok(id)
    }

    async fn read_cookie(&self, bookie: &BookieId) -> Result<Versioned<Cookie>> {
        let doc = self.inner.lock().await;
        let (value, version) = doc.cookies.get(bookie).cloned().ok_or(Error::NotFound {
            kind: "cookie",
            key: bookie.0.clone(),
        })?;
        Ok(Versioned { value, version })
    }

    async fn write_cookie(&self, cookie: &Cookie, expected: Option<Version>) -> Result<Version> {
        let mut doc = self.inner.lock().await;
        let key = cookie.bookie.clone();
        let next = match (doc.cookies.get(&key), expected) {
            (Some(_), None) => {
                return Err(Error::AlreadyExists {
                    kind: "cookie",
                    key: key.0,
                })
            }
            (None, Some(_)) => {
                return Err(Error::NotFound {
                    kind: "cookie",
                    key: key.0,
                })
            }
            (None, None) => Version(0),
            (Some((_, found)), Some(expected)) => {
                check_version("cookie", key.0.clone(), expected, *found)?;
                Version(found.0 + 1)
            }
        };
        doc.cookies.insert(key, (cookie.clone(), next));
        self.persist(&doc).await?;
        Ok(next)
    }

    async fn try_acquire_stream(
        &self,
        stream: &str,
        owner: &str,
    ) -> Result<std::result::Result<StreamLease, String>> {
        let mut doc = self.inner.lock().await;
        if let Some((holder, _, _)) = doc.leases.get(stream) {
            return Ok(Err(holder.clone()));
        }
        doc.next_lease_token += 1;
        let token = doc.next_lease_token.to_string();
        let (tx, rx) = tokio::sync::watch::channel(false);
        doc.leases
            .insert(stream.to_string(), (owner.to_string(), token.clone(), tx));
        Ok(Ok(StreamLease {
            stream: stream.to_string(),
            owner: owner.to_string(),
            lost: rx,
            token,
        }))
    }

    async fn stream_owner(&self, stream: &str) -> Result<Option<String>> {
        Ok(self
            .inner
            .lock()
            .await
            .leases
            .get(stream)
            .map(|(owner, _, _)| owner.clone()))
    }

    async fn register_proxy(&self, info: &crate::ProxyInfo) -> Result<()> {
        self.proxies
            .lock()
            .expect("proxies lock")
            .insert(info.address.clone(), info.clone());
        Ok(())
    }

    async fn unregister_proxy(&self, address: &str) -> Result<()> {
        self.proxies.lock().expect("proxies lock").remove(address);
        Ok(())
    }

    async fn list_proxies(&self) -> Result<Vec<crate::ProxyInfo>> {
        Ok(self
            .proxies
            .lock()
            .expect("proxies lock")
            .values()
            .cloned()
            .collect())
    }

    async fn set_region_unavailable(&self, region: &str, unavailable: bool) -> Result<()> {
        crate::validate_region(region)?;
        let mut doc = self.inner.lock().await;
        let changed = if unavailable {
            doc.unavailable_regions.insert(region.to_string())
        } else {
            doc.unavailable_regions.remove(region)
        };
        // Persistent like the ZooKeeper node: the mark outlives the process until cleared.
        if changed {
            self.persist(&doc).await?;
        }
        Ok(())
    }

    async fn unavailable_regions(&self) -> Result<Vec<String>> {
        let doc = self.inner.lock().await;
        Ok(doc.unavailable_regions.iter().cloned().collect())
    }

    async fn region_unavailable(&self, region: &str) -> Result<bool> {
        crate::validate_region(region)?;
        Ok(self.inner.lock().await.unavailable_regions.contains(region))
    }

    async fn release_stream(&self, lease: StreamLease) -> Result<()> {
        let mut doc = self.inner.lock().await;
        if doc
            .leases
            .get(&lease.stream)
            .is_some_and(|(_, token, _)| *token == lease.token)
        {
            if let Some((_, _, tx)) = doc.leases.remove(&lease.stream) {
                tx.send_replace(true);
            }
        }
        Ok(())
    }
}

fn subscription_not_found(stream: &str, name: &str) -> Error {
    Error::NotFound {
        kind: "subscription",
        key: format!("{stream}/{name}"),
    }
}

/// 128 random bits as 32 hex digits (never time-based: two clusters created at the same
/// moment must still differ).
pub(crate) fn random_instance_id() -> String {
    let bytes: [u8; 16] = quire_clock::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

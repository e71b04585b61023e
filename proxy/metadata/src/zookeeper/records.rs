//! Versioned JSON records, one persistent znode each (ledger metadata, stream metadata, bookie
//! cookies): create, read, and compare-and-set or delete against the znode's `Stat.version`, as
//! BookKeeper's ledger manager and DistributedLog's log metadata store do. Also the ZooKeeper
//! error mapping and JSON encoding that the other modules share.

use quire_wire::LedgerId;
use serde::{Deserialize, Serialize};
use zookeeper_client as zk;

use super::paths::{
    decode_stream_name, ledger_bucket_and_leaf, ledger_id_of, validate_bookie_id,
    LEDGERS_PER_BUCKET,
};
use super::ZkStore;
use crate::{
    validate_stream_name, BookieId, Cookie, Error, LedgerMetadata, Result, Stamped, StreamMetadata,
    Version, Versioned,
};

pub(super) fn zk_err(op: &'static str, path: &str, source: zk::Error) -> Error {
    Error::ZooKeeper {
        op,
        path: path.to_string(),
        source,
    }
}

pub(super) fn to_json<T: Serialize>(what: &str, value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| Error::Invalid {
        what: "record",
        reason: format!("cannot encode {what}: {e}"),
    })
}

pub(super) fn from_json<T: for<'de> Deserialize<'de>>(path: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::Corrupt {
        path: path.to_string(),
        reason: e.to_string(),
    })
}

pub(super) fn version_of(stat: &zk::Stat) -> Version {
    // Stat.version is a non-negative i32 for every znode this store writes.
    Version(u64::try_from(stat.version).unwrap_or(0))
}

impl ZkStore {
    /// Reads and decodes one record.
    pub(super) async fn get<T: for<'de> Deserialize<'de>>(
        &self,
        kind: &'static str,
        key: &str,
        path: &str,
    ) -> Result<Versioned<T>> {
        match self.get_data(path).await {
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
    pub(super) async fn create_record(
        &self,
        kind: &'static str,
        key: &str,
        path: &str,
        data: &[u8],
    ) -> Result<Version> {
        match self
            .inner
            .client
            .create(path, data, &self.persistent())
            .await
        {
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
    pub(super) async fn versioned_write_error(
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

    /// `setData` with the expected version; the node's new `Stat` (its version and `mtime`).
    pub(super) async fn cas(
        &self,
        kind: &'static str,
        key: &str,
        path: &str,
        data: &[u8],
        expected: Version,
    ) -> Result<zk::Stat> {
        let Ok(v) = i32::try_from(expected.0) else {
            return Err(Error::BadVersion {
                kind,
                key: key.to_string(),
                expected: expected.0,
                found: 0,
            });
        };
        match self.inner.client.set_data(path, data, Some(v)).await {
            Ok(stat) => Ok(stat),
            Err(e) => Err(self
                .versioned_write_error("set", kind, key, path, expected, e)
                .await),
        }
    }

    /// `delete` with the expected version.
    pub(super) async fn cas_delete(
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
}

pub(super) async fn create_ledger(
    store: &ZkStore,
    id: LedgerId,
    meta: &LedgerMetadata,
) -> Result<Version> {
    meta.validate()?;
    let data = to_json("ledger metadata", meta)?;
    let p = store.ledger_path(id);
    let key = id.to_string();
    // A bucket is created by its first ledger and may be removed once empty (`delete_ledger`),
    // so the create can find it missing more than once; each round creates it again.
    for _ in 0..8 {
        match store.create_record("ledger", &key, &p, &data).await {
            Err(Error::ZooKeeper {
                source: zk::Error::NoNode,
                ..
            }) => {
                let bucket = &p[..p.rfind('/').unwrap_or(p.len())];
                match store
                    .inner
                    .client
                    .create(bucket, b"", &store.persistent())
                    .await
                {
                    Ok(_) | Err(zk::Error::NodeExists) => {}
                    Err(e) => return Err(zk_err("create", bucket, e)),
                }
            }
            other => return other,
        }
    }
    store.create_record("ledger", &key, &p, &data).await
}

pub(super) async fn read_ledger(
    store: &ZkStore,
    id: LedgerId,
) -> Result<Versioned<LedgerMetadata>> {
    store
        .get("ledger", &id.to_string(), &store.ledger_path(id))
        .await
}

/// Syncs this session's server with the leader, then reads (`sync` is path-agnostic in
/// ZooKeeper; the ledgers root always exists once the layout is open).
pub(super) async fn read_ledger_synced(
    store: &ZkStore,
    id: LedgerId,
) -> Result<Versioned<LedgerMetadata>> {
    let root = store.path("ledgers");
    store
        .inner
        .client
        .sync(&root)
        .await
        .map_err(|e| zk_err("sync", &root, e))?;
    read_ledger(store, id).await
}

pub(super) async fn update_ledger(
    store: &ZkStore,
    id: LedgerId,
    meta: &LedgerMetadata,
    expected: Version,
) -> Result<Version> {
    meta.validate()?;
    let data = to_json("ledger metadata", meta)?;
    store
        .cas(
            "ledger",
            &id.to_string(),
            &store.ledger_path(id),
            &data,
            expected,
        )
        .await
        .map(|stat| version_of(&stat))
}

/// Deletes a ledger's node, then its bucket when that is empty and wholly below the id
/// counter (no id of it will be handed out again, so only a ledger created with an explicit
/// id could still go there, and `create_ledger` recreates a missing bucket). The bucket delete
/// is unversioned: ZooKeeper refuses to delete a node with children, so a ledger created in it
/// meanwhile keeps it; any failure there is ignored (an empty bucket costs one znode).
pub(super) async fn delete_ledger(store: &ZkStore, id: LedgerId, expected: Version) -> Result<()> {
    store
        .cas_delete("ledger", &id.to_string(), &store.ledger_path(id), expected)
        .await?;
    let (bucket, _) = ledger_bucket_and_leaf(id);
    let bucket_end = (id.0 / LEDGERS_PER_BUCKET + 1).saturating_mul(LEDGERS_PER_BUCKET);
    let counter = store.path("idgen/ledger");
    let next: Option<u64> = match store.get_data(&counter).await {
        Ok((bytes, _)) => from_json(&counter, &bytes).ok(),
        Err(_) => None,
    };
    if next.is_some_and(|n| n >= bucket_end) {
        let bucket_path = store.path(&format!("ledgers/{bucket}"));
        match store.inner.client.delete(&bucket_path, None).await {
            Ok(()) | Err(zk::Error::NotEmpty) | Err(zk::Error::NoNode) => {}
            Err(e) => {
                tracing::debug!(path = %bucket_path, error = %e, "empty ledger bucket not removed")
            }
        }
    }
    Ok(())
}

/// Every ledger id under `ledgers/`, ascending: the buckets, then each bucket's `L<4 digits>`
/// children. A bucket removed between the two listings is skipped; a child name that is not a
/// ledger leaf is `Corrupt`.
pub(super) async fn list_ledgers(store: &ZkStore) -> Result<Vec<LedgerId>> {
    let dir = store.path("ledgers");
    let buckets = store
        .list_children(&dir)
        .await
        .map_err(|e| zk_err("list", &dir, e))?;
    let mut ids = Vec::new();
    for b in &buckets {
        let bp = format!("{dir}/{b}");
        let children = match store.list_children(&bp).await {
            Ok(ch) => ch,
            Err(zk::Error::NoNode) => continue,
            Err(e) => return Err(zk_err("list", &bp, e)),
        };
        for leaf in &children {
            let id = ledger_id_of(b, leaf).ok_or_else(|| Error::Corrupt {
                path: format!("{bp}/{leaf}"),
                reason: "not a ledger node (expected a 16-digit bucket and L + 4 digits)".into(),
            })?;
            ids.push(id);
        }
    }
    ids.sort();
    Ok(ids)
}

pub(super) async fn create_stream(store: &ZkStore, meta: &StreamMetadata) -> Result<Version> {
    validate_stream_name(&meta.name)?;
    let data = to_json("stream metadata", meta)?;
    store
        .create_record("stream", &meta.name, &store.stream_path(&meta.name), &data)
        .await
}

pub(super) async fn read_stream(store: &ZkStore, name: &str) -> Result<Versioned<StreamMetadata>> {
    validate_stream_name(name)?;
    store.get("stream", name, &store.stream_path(name)).await
}

/// Waits for the stream record to leave version `seen` (a data watch on its znode), or for
/// `timeout`; returns at once when it already did or is gone.
pub(super) async fn wait_stream_changed(
    store: &ZkStore,
    name: &str,
    seen: Version,
    timeout: std::time::Duration,
) -> Result<()> {
    validate_stream_name(name)?;
    let path = store.stream_path(name);
    let (stat, watcher) = store
        .inner
        .client
        .check_and_watch_stat(&path)
        .await
        .map_err(|e| zk_err("watch", &path, e))?;
    match stat {
        Some(stat) if version_of(&stat) == seen => {
            // Any event (data changed, deleted, session trouble) is a reason to read again.
            let _ = tokio::time::timeout(timeout, watcher.changed()).await;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The stream record's compare-and-set; the stamp is the znode's new `mtime`, the ZooKeeper
/// leader's clock when it applied the write.
pub(super) async fn update_stream(
    store: &ZkStore,
    meta: &StreamMetadata,
    expected: Version,
) -> Result<Stamped> {
    validate_stream_name(&meta.name)?;
    let data = to_json("stream metadata", meta)?;
    let stat = store
        .cas(
            "stream",
            &meta.name,
            &store.stream_path(&meta.name),
            &data,
            expected,
        )
        .await?;
    Ok(Stamped {
        version: version_of(&stat),
        store_time_ms: u64::try_from(stat.mtime).ok(),
    })
}

/// Deletes the stream's node with its subscriptions and, if no one holds or contends for its
/// lock, its lock node.
pub(super) async fn delete_stream(store: &ZkStore, name: &str, expected: Version) -> Result<()> {
    validate_stream_name(name)?;
    super::subscriptions::delete_stream_node(store, name, expected).await?;
    let dir = store.lock_dir(name);
    match store.inner.client.delete(&dir, None).await {
        Ok(()) | Err(zk::Error::NoNode | zk::Error::NotEmpty) => Ok(()),
        Err(e) => Err(zk_err("delete", &dir, e)),
    }
}

pub(super) async fn list_streams(store: &ZkStore) -> Result<Vec<String>> {
    let dir = store.path("streams");
    let children = store
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

pub(super) async fn read_cookie(store: &ZkStore, bookie: &BookieId) -> Result<Versioned<Cookie>> {
    validate_bookie_id(bookie)?;
    store
        .get(
            "cookie",
            &bookie.0,
            &store.path(&format!("cookies/{}", bookie.0)),
        )
        .await
}

pub(super) async fn write_cookie(
    store: &ZkStore,
    cookie: &Cookie,
    expected: Option<Version>,
) -> Result<Version> {
    validate_bookie_id(&cookie.bookie)?;
    let p = store.path(&format!("cookies/{}", cookie.bookie.0));
    let data = to_json("cookie", cookie)?;
    match expected {
        None => {
            store
                .create_record("cookie", &cookie.bookie.0, &p, &data)
                .await
        }
        Some(v) => store
            .cas("cookie", &cookie.bookie.0, &p, &data, v)
            .await
            .map(|stat| version_of(&stat)),
    }
}

//! Subscriptions in ZooKeeper: one persistent znode per subscriber under its stream's node,
//! `streams/<encoded stream>/subscribers/<name>`, holding the `Subscription` JSON (DistributedLog
//! keeps its `SubscriptionsStore` under the log's znode the same way). The `subscribers`
//! directory is made on the first commit; a stream is deleted together with it in one multi.

use zookeeper_client as zk;

use super::records::{from_json, to_json, version_of, zk_err};
use super::ZkStore;
use crate::{
    validate_stream_name, validate_subscription_name, Error, Result, Subscription, Version,
    Versioned,
};

/// Attempts at deleting a stream whose subscriptions change meanwhile.
const DELETE_ATTEMPTS_MAX: usize = 8;

impl ZkStore {
    fn subscribers_dir(&self, stream: &str) -> String {
        format!("{}/subscribers", self.stream_path(stream))
    }

    fn subscription_path(&self, stream: &str, name: &str) -> String {
        format!("{}/{name}", self.subscribers_dir(stream))
    }
}

fn key(stream: &str, name: &str) -> String {
    format!("{stream}/{name}")
}

fn stream_not_found(stream: &str) -> Error {
    Error::NotFound {
        kind: "stream",
        key: stream.to_string(),
    }
}

pub(super) async fn read_subscription(
    store: &ZkStore,
    stream: &str,
    name: &str,
) -> Result<Versioned<Subscription>> {
    validate_stream_name(stream)?;
    validate_subscription_name(name)?;
    let path = store.subscription_path(stream, name);
    store.get("subscription", &key(stream, name), &path).await
}

pub(super) async fn write_subscription(
    store: &ZkStore,
    stream: &str,
    name: &str,
    sub: &Subscription,
    expected: Option<Version>,
) -> Result<Version> {
    validate_stream_name(stream)?;
    validate_subscription_name(name)?;
    let data = to_json("subscription", sub)?;
    let path = store.subscription_path(stream, name);
    if let Some(v) = expected {
        let stat = store
            .cas("subscription", &key(stream, name), &path, &data, v)
            .await?;
        return Ok(version_of(&stat));
    }
    let c = &store.inner.client;
    for _ in 0..2 {
        match c.create(&path, &data, &store.persistent()).await {
            Ok((stat, _)) => return Ok(version_of(&stat)),
            Err(zk::Error::NodeExists) => {
                return Err(Error::AlreadyExists {
                    kind: "subscription",
                    key: key(stream, name),
                })
            }
            // The stream's first subscription: make its directory (not the stream: a missing
            // stream node fails this create with NoNode).
            Err(zk::Error::NoNode) => {
                let dir = store.subscribers_dir(stream);
                match c.create(&dir, b"", &store.persistent()).await {
                    Ok(_) | Err(zk::Error::NodeExists) => {}
                    Err(zk::Error::NoNode) => return Err(stream_not_found(stream)),
                    Err(e) => return Err(zk_err("create", &dir, e)),
                }
            }
            Err(e) => return Err(zk_err("create", &path, e)),
        }
    }
    // The directory vanished again between the two creates: the stream was deleted.
    Err(stream_not_found(stream))
}

/// Names under the stream's `subscribers` directory; empty when it does not exist yet.
async fn subscriber_names(store: &ZkStore, stream: &str) -> Result<Vec<String>> {
    let dir = store.subscribers_dir(stream);
    match store.inner.client.list_children(&dir).await {
        Ok(mut names) => {
            names.sort();
            Ok(names)
        }
        Err(zk::Error::NoNode) => Ok(Vec::new()),
        Err(e) => Err(zk_err("list", &dir, e)),
    }
}

pub(super) async fn list_subscriptions(
    store: &ZkStore,
    stream: &str,
) -> Result<Vec<(String, Subscription)>> {
    validate_stream_name(stream)?;
    let c = &store.inner.client;
    let stream_path = store.stream_path(stream);
    match c.check_stat(&stream_path).await {
        Ok(Some(_)) => {}
        Ok(None) => return Err(stream_not_found(stream)),
        Err(e) => return Err(zk_err("stat", &stream_path, e)),
    }
    let mut subs = Vec::new();
    for name in subscriber_names(store, stream).await? {
        let path = store.subscription_path(stream, &name);
        match c.get_data(&path).await {
            Ok((bytes, _)) => subs.push((name, from_json(&path, &bytes)?)),
            // Deleted since the listing.
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(zk_err("get", &path, e)),
        }
    }
    Ok(subs)
}

pub(super) async fn delete_subscription(store: &ZkStore, stream: &str, name: &str) -> Result<()> {
    validate_stream_name(stream)?;
    validate_subscription_name(name)?;
    let path = store.subscription_path(stream, name);
    match store.inner.client.delete(&path, None).await {
        Ok(()) => Ok(()),
        Err(zk::Error::NoNode) => Err(Error::NotFound {
            kind: "subscription",
            key: key(stream, name),
        }),
        Err(e) => Err(zk_err("delete", &path, e)),
    }
}

/// Deletes the stream's node at `expected` together with its subscriptions, in one multi so
/// that a failed compare-and-set deletes nothing. A subscription committed meanwhile makes the
/// multi fail (`NotEmpty`); the listing is then taken again.
pub(super) async fn delete_stream_node(
    store: &ZkStore,
    stream: &str,
    expected: Version,
) -> Result<()> {
    let Ok(v) = i32::try_from(expected.0) else {
        return Err(Error::BadVersion {
            kind: "stream",
            key: stream.to_string(),
            expected: expected.0,
            found: 0,
        });
    };
    let stream_path = store.stream_path(stream);
    let dir = store.subscribers_dir(stream);
    for _ in 0..DELETE_ATTEMPTS_MAX {
        let names = subscriber_names(store, stream).await?;
        let dir_exists =
            !names.is_empty() || matches!(store.inner.client.check_stat(&dir).await, Ok(Some(_)));
        let mut multi = store.inner.client.new_multi_writer();
        let add = |multi: &mut zk::MultiWriter<'_>, path: &str, version: Option<i32>| {
            multi
                .add_delete(path, version)
                .map_err(|e| zk_err("delete", path, e))
        };
        for name in &names {
            add(&mut multi, &store.subscription_path(stream, name), None)?;
        }
        if dir_exists {
            add(&mut multi, &dir, None)?;
        }
        let stream_index = names.len() + usize::from(dir_exists);
        add(&mut multi, &stream_path, Some(v))?;
        match multi.commit().await {
            Ok(_) => return Ok(()),
            Err(zk::MultiWriteError::OperationFailed { index, source })
                if index == stream_index && source != zk::Error::NotEmpty =>
            {
                return Err(store
                    .versioned_write_error(
                        "delete",
                        "stream",
                        stream,
                        &stream_path,
                        expected,
                        source,
                    )
                    .await)
            }
            // The subscriptions changed since the listing (one added, or one deleted).
            Err(zk::MultiWriteError::OperationFailed {
                source: zk::Error::NotEmpty | zk::Error::NoNode,
                ..
            }) => continue,
            Err(e) => return Err(zk_err("delete", &stream_path, e.into())),
        }
    }
    Err(zk_err("delete", &stream_path, zk::Error::NotEmpty))
}

//! Stream ownership: DistributedLog's write lock recipe (an EPHEMERAL_SEQUENTIAL child per
//! contender, the lowest holds the lock), taken without waiting, and the watch that flips a
//! lease's `lost` flag when its lock node or the session goes away.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;
use zookeeper_client as zk;

use super::records::zk_err;
use super::{Inner, ZkStore};
use crate::{validate_stream_name, Error, Result, StreamLease};

/// Prefix of the ephemeral-sequential children of a stream's lock node.
const LOCK_CHILD_PREFIX: &str = "lock-";
/// How often `try_acquire_stream` starts over when the holder vanished while it looked.
const LOCK_ATTEMPTS_MAX: usize = 16;

/// Senders of live leases' `lost` flags.
pub(super) type LeaseFlags = Arc<std::sync::Mutex<Vec<std::sync::Weak<watch::Sender<bool>>>>>;

/// Flips the `lost` flag of every live lease of the session (the session watcher calls this
/// before it flips `session_lost`).
pub(super) fn mark_all_lost(flags: &LeaseFlags) {
    let flags = flags
        .lock()
        .map(|mut v| std::mem::take(&mut *v))
        .unwrap_or_default();
    for flag in flags.iter().filter_map(Weak::upgrade) {
        flag.send_replace(true);
    }
}

impl ZkStore {
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

/// DistributedLog's lock recipe without waiting: create an EPHEMERAL_SEQUENTIAL child
/// `locks/<encoded stream>/lock-<seq>` holding `owner`; it holds the lock iff its sequence
/// number is the lowest. Otherwise the child is deleted again and the lowest child's owner
/// is returned. The lease's `lost` flips when the child is deleted (by anyone), the session
/// is lost, or the store is dropped; `token` is the child's path.
pub(super) async fn try_acquire_stream(
    store: &ZkStore,
    stream: &str,
    owner: &str,
) -> Result<std::result::Result<StreamLease, String>> {
    validate_stream_name(stream)?;
    let c = &store.inner.client;
    let dir = store.lock_dir(stream);
    let prefix = format!("{dir}/{LOCK_CHILD_PREFIX}");
    for _ in 0..LOCK_ATTEMPTS_MAX {
        let seq = match c
            .create(&prefix, owner.as_bytes(), &store.ephemeral_sequential())
            .await
        {
            Ok((_, seq)) => seq,
            Err(zk::Error::NoNode) => {
                match c.create(&dir, b"", &store.persistent()).await {
                    Ok(_) | Err(zk::Error::NodeExists) => {}
                    Err(e) => return Err(zk_err("create", &dir, e)),
                }
                continue;
            }
            Err(e) => return Err(zk_err("create", &prefix, e)),
        };
        let mine = format!("{LOCK_CHILD_PREFIX}{seq}");
        let my_path = format!("{dir}/{mine}");
        let children = match store.lock_children(&dir).await {
            Ok(children) => children,
            Err(e) => {
                let _ = c.delete(&my_path, None).await;
                return Err(e);
            }
        };
        if children.first() == Some(&mine) {
            let (tx, rx) = watch::channel(false);
            let tx = Arc::new(tx);
            if let Ok(mut flags) = store.inner.leases.lock() {
                flags.retain(|f| f.strong_count() > 0);
                flags.push(Arc::downgrade(&tx));
            }
            tokio::spawn(watch_lease(
                Arc::downgrade(&store.inner),
                my_path.clone(),
                tx,
                store.session_lost(),
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
        if let Some(holder) = store.lowest_owner(&dir, &others).await? {
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

pub(super) async fn stream_owner(store: &ZkStore, stream: &str) -> Result<Option<String>> {
    validate_stream_name(stream)?;
    let dir = store.lock_dir(stream);
    for _ in 0..LOCK_ATTEMPTS_MAX {
        let children = store.lock_children(&dir).await?;
        if children.is_empty() {
            return Ok(None);
        }
        if let Some(owner) = store.lowest_owner(&dir, &children).await? {
            return Ok(Some(owner));
        }
    }
    Ok(None)
}

/// Deletes the lease's lock child; a no-op if it is already gone (lost).
pub(super) async fn release_stream(store: &ZkStore, lease: StreamLease) -> Result<()> {
    let lock_prefix = format!("{}/", store.lock_dir(&lease.stream));
    if !lease.token.starts_with(&lock_prefix) {
        return Err(Error::Invalid {
            what: "stream lease",
            reason: format!("{} is not a lock of {}", lease.token, lease.stream),
        });
    }
    match store.inner.client.delete(&lease.token, None).await {
        Ok(()) | Err(zk::Error::NoNode) => Ok(()),
        // The session is over, so the ephemeral child is gone (or about to be) anyway.
        Err(zk::Error::SessionExpired | zk::Error::ClientClosed) => Ok(()),
        Err(e) => Err(zk_err("delete", &lease.token, e)),
    }
}

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

/// What `reap_own_orphan` must not take for an orphan: the lock nodes whose leases this store
/// handed out and still watches, and per lock directory the acquisitions in flight (a node of
/// another acquisition of this store between its create and its check is no orphan).
#[derive(Debug, Default)]
pub(super) struct HeldLocks {
    held: std::collections::HashSet<String>,
    acquiring: std::collections::HashMap<String, usize>,
}

/// One acquisition in flight in a lock directory, counted until dropped (also when the
/// acquiring future is dropped half-way).
struct Acquiring<'a> {
    store: &'a ZkStore,
    dir: String,
}

impl<'a> Acquiring<'a> {
    fn new(store: &'a ZkStore, dir: &str) -> Self {
        *store.locks().acquiring.entry(dir.to_string()).or_insert(0) += 1;
        Acquiring {
            store,
            dir: dir.to_string(),
        }
    }
}

impl Drop for Acquiring<'_> {
    fn drop(&mut self) {
        let mut locks = self.store.locks();
        if let Some(n) = locks.acquiring.get_mut(&self.dir) {
            *n -= 1;
            if *n == 0 {
                locks.acquiring.remove(&self.dir);
            }
        }
    }
}

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
        let mut children = match self.list_children(dir).await {
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
        match self.get_data(&p).await {
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

impl ZkStore {
    /// Deletes lock child `first` of `dir` when it is an orphan of this very session: it holds
    /// `owner`, its ephemeral owner is this session, and no lease of this store holds it (its
    /// lease was dropped or given up while a delete failed on a lost connection, or its create
    /// succeeded on the server while the reply was lost). Such a node outlives nothing but the
    /// session, which a live proxy keeps: without this, the proxy answered "owned by
    /// 127.0.0.1:P" to its own requests for the stream until it restarted (chaos seed
    /// 250541322692507). ZooKeeper's lock recipe has the same hazard; Curator guards its
    /// creates with a session-unique name for it. Returns whether it deleted the node.
    async fn reap_own_orphan(&self, dir: &str, first: &str, owner: &str) -> Result<bool> {
        let p = format!("{dir}/{first}");
        {
            let locks = self.locks();
            if locks.held.contains(&p) || locks.acquiring.get(dir).is_some_and(|n| *n > 1) {
                return Ok(false);
            }
        }
        let c = &self.inner.client;
        let stat = match c.get_data(&p).await {
            Ok((bytes, stat)) if bytes == owner.as_bytes() => stat,
            Ok(_) | Err(zk::Error::NoNode) => return Ok(false),
            Err(e) => return Err(zk_err("get", &p, e)),
        };
        if stat.ephemeral_owner != c.session_id().0 {
            return Ok(false);
        }
        tracing::warn!(lock = %p, owner, "deleting an orphaned lock node of this session");
        match c.delete(&p, Some(stat.version)).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(true),
            Err(e) => Err(zk_err("delete", &p, e)),
        }
    }

    fn locks(&self) -> std::sync::MutexGuard<'_, HeldLocks> {
        self.inner.held.lock().unwrap_or_else(|p| p.into_inner())
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
                        () = tx.closed() => break,
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
            () = tx.closed() => break,
        }
    }
    // No lease holds the node any more (lost, or every receiver of its flag dropped).
    if let Some(inner) = store.upgrade() {
        let mut locks = inner.held.lock().unwrap_or_else(|p| p.into_inner());
        locks.held.remove(&path);
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
    let _acquiring = Acquiring::new(store, &dir);
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
            store.locks().held.insert(my_path.clone());
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
        if let Some(first) = others.first() {
            if store.reap_own_orphan(&dir, first, owner).await? {
                continue;
            }
        }
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
    store.locks().held.remove(&lease.token);
    match store.inner.client.delete(&lease.token, None).await {
        Ok(()) | Err(zk::Error::NoNode) => Ok(()),
        // The session is over, so the ephemeral child is gone (or about to be) anyway.
        Err(zk::Error::SessionExpired | zk::Error::ClientClosed) => Ok(()),
        Err(e) => Err(zk_err("delete", &lease.token, e)),
    }
}

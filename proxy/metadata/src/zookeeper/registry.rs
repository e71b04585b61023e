//! The bookie registry (BookKeeper's `available` and `available/readonly` znodes): each bookie
//! registers an EPHEMERAL node of its session holding its [`BookieInfo`], so a crashed bookie
//! leaves the registry when its session expires.

use std::collections::BTreeMap;
use std::time::Duration;

use zookeeper_client as zk;

use super::paths::validate_bookie_id;
use super::records::{from_json, to_json, zk_err};
use super::ZkStore;
use crate::{BookieId, BookieInfo, BookieRegistration, Error, Result};

impl ZkStore {
    fn my_session(&self) -> i64 {
        self.inner.client.session_id().0
    }

    /// Reads the bookie registrations under `bookies/<sub>`, skipping nodes that vanish while
    /// being read.
    async fn list_bookie_dir(
        &self,
        sub: &str,
        out: &mut BTreeMap<BookieId, BookieRegistration>,
    ) -> Result<()> {
        let dir = self.path(&format!("bookies/{sub}"));
        let children = self
            .list_children(&dir)
            .await
            .map_err(|e| zk_err("list", &dir, e))?;
        for child in children {
            let p = format!("{dir}/{child}");
            match self.get_data(&p).await {
                Ok((bytes, stat)) => {
                    let info: BookieInfo = from_json(&p, &bytes)?;
                    // The creation zxid names this registration: a new session, or a move
                    // between the two directories, creates a new node.
                    let epoch = u64::try_from(stat.czxid).ok();
                    out.insert(info.id.clone(), BookieRegistration { info, epoch });
                }
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(zk_err("get", &p, e)),
            }
        }
        Ok(())
    }
}

/// Creates the EPHEMERAL node `bookies/available/<id>` (or `bookies/readonly/<id>`) holding
/// the [`BookieInfo`] as JSON and removes this session's node from the other directory. If
/// another session still holds the node (a previous incarnation of the bookie that has not
/// expired yet), waits for it to go away, as a BookKeeper bookie does at start
/// (`checkRegNodeAndWaitExpired`), then fails with `AlreadyExists`. The wait is twice the
/// session timeout plus a second: ZooKeeper expires a silent session only at the next tick
/// after its timeout (sessions expire in `tickTime` buckets, and `tickTime` can be up to half
/// the timeout), so a SIGKILLed bookie's node can outlive its timeout by up to half of it; a
/// bookie restarted at once used to give up after one timeout and exit (found by the chaos
/// runner).
pub(super) async fn register_bookie(store: &ZkStore, info: BookieInfo) -> Result<()> {
    validate_bookie_id(&info.id)?;
    let c = &store.inner.client;
    let mine = store.bookie_path(&info.id, info.read_only);
    let other = store.bookie_path(&info.id, !info.read_only);
    let data = to_json("bookie info", &info)?;
    let deadline = tokio::time::Instant::now() + c.session_timeout() * 2 + Duration::from_secs(1);
    loop {
        match c.create(&mine, &data, &store.ephemeral()).await {
            Ok(_) => break,
            Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(zk_err("create", &mine, e)),
        }
        let (stat, watcher) = c
            .check_and_watch_stat(&mine)
            .await
            .map_err(|e| zk_err("exists", &mine, e))?;
        let Some(stat) = stat else { continue };
        if stat.ephemeral_owner == store.my_session() {
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
        Ok(Some(stat)) if stat.ephemeral_owner == store.my_session() => {
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
pub(super) async fn unregister_bookie(store: &ZkStore, id: &BookieId) -> Result<()> {
    validate_bookie_id(id)?;
    let mut found = false;
    for read_only in [false, true] {
        let p = store.bookie_path(id, read_only);
        match store.inner.client.delete(&p, None).await {
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

pub(super) async fn list_bookie_registrations(store: &ZkStore) -> Result<Vec<BookieRegistration>> {
    let mut all = BTreeMap::new();
    store.list_bookie_dir("available", &mut all).await?;
    // A bookie caught between the two directories counts as read-only.
    store.list_bookie_dir("readonly", &mut all).await?;
    Ok(all.into_values().collect())
}

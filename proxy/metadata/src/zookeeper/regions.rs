//! Region marks (issue 30 item 4): an operator marks a region as not accepting new streams
//! with the persistent node `regions/unavailable/<region>` (empty), and clears the mark by
//! deleting it. Persistent, not ephemeral: the mark outlives the operator's session and is
//! the cluster's state until cleared. The directories are created on first use (layouts made
//! before marks existed have none).

use zookeeper_client as zk;

use super::records::zk_err;
use super::ZkStore;
use crate::{validate_region, Result};

impl ZkStore {
    fn unavailable_dir(&self) -> String {
        self.path("regions/unavailable")
    }

    /// Creates `regions` and `regions/unavailable` if missing.
    async fn ensure_region_dirs(&self) -> Result<()> {
        for dir in [self.path("regions"), self.unavailable_dir()] {
            match self
                .inner
                .client
                .create(&dir, b"", &self.persistent())
                .await
            {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(zk_err("create", &dir, e)),
            }
        }
        Ok(())
    }
}

/// Creates (`unavailable`) or deletes `regions/unavailable/<region>`; a no-op when it already
/// is as asked.
pub(super) async fn set_region_unavailable(
    store: &ZkStore,
    region: &str,
    unavailable: bool,
) -> Result<()> {
    validate_region(region)?;
    let c = &store.inner.client;
    let p = format!("{}/{region}", store.unavailable_dir());
    if unavailable {
        store.ensure_region_dirs().await?;
        match c.create(&p, b"", &store.persistent()).await {
            Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
            Err(e) => Err(zk_err("create", &p, e)),
        }
    } else {
        match c.delete(&p, None).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(zk_err("delete", &p, e)),
        }
    }
}

/// The regions marked unavailable, sorted.
pub(super) async fn unavailable_regions(store: &ZkStore) -> Result<Vec<String>> {
    let dir = store.unavailable_dir();
    let mut out = match store.inner.client.list_children(&dir).await {
        Ok(ch) => ch,
        Err(zk::Error::NoNode) => return Ok(Vec::new()),
        Err(e) => return Err(zk_err("list", &dir, e)),
    };
    out.sort();
    Ok(out)
}

/// Whether `regions/unavailable/<region>` exists (one `exists` call).
pub(super) async fn region_unavailable(store: &ZkStore, region: &str) -> Result<bool> {
    validate_region(region)?;
    let p = format!("{}/{region}", store.unavailable_dir());
    let stat = store
        .inner
        .client
        .check_stat(&p)
        .await
        .map_err(|e| zk_err("exists", &p, e))?;
    Ok(stat.is_some())
}

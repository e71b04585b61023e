//! The layout under the root (BookKeeper's `LAYOUT` and `INSTANCEID` znodes): creating it
//! atomically on first use, refusing a root of another layout version, and the cluster's
//! instance id.

use serde::{Deserialize, Serialize};
use zookeeper_client as zk;

use super::records::{from_json, to_json, zk_err};
use super::ZkStore;
use crate::embedded::random_instance_id;
use crate::{Error, Result};

/// Version of the znode layout described in `docs/format/zookeeper-layout.md`, stored in
/// `<root>/LAYOUT`. A store refuses to open a root whose layout version differs.
pub const ZK_LAYOUT_VERSION: u32 = 1;

/// Content of `<root>/LAYOUT`.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct LayoutRecord {
    layout_version: u32,
}

impl ZkStore {
    /// Creates the layout if `<root>/LAYOUT` is absent (one multi-op, so it is all or nothing),
    /// then checks the layout version.
    pub(super) async fn open_layout(&self) -> Result<()> {
        let c = &self.inner.client;
        let root = &self.inner.root;
        if let Some(parent) = root.rfind('/').filter(|&i| i > 0).map(|i| &root[..i]) {
            c.mkdir(parent, &self.persistent())
                .await
                .map_err(|e| zk_err("mkdir", parent, e))?;
        }
        match c.create(root, b"", &self.persistent()).await {
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
                    .add_create(&p, data, &self.persistent())
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
}

/// `INSTANCEID` holds the id as ASCII; the first process to find it absent creates it, and a
/// loser of that race reads the winner's.
pub(super) async fn instance_id(store: &ZkStore) -> Result<String> {
    let c = &store.inner.client;
    let p = store.path("INSTANCEID");
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
        match c.create(&p, id.as_bytes(), &store.persistent()).await {
            Ok(_) => return Ok(id),
            Err(zk::Error::NodeExists) => continue,
            Err(e) => return Err(zk_err("create", &p, e)),
        }
    }
}

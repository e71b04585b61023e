//! Where the metadata store is: the checked `[zookeeper]` table of a process or an admin
//! command ([`MetadataAddress`]; the flags for it are [`crate::flags::ZooKeeperFlags`]).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use quire_metadata::{MetadataStore, ZkDigest, ZkStore, ZooKeeperConfig};

use crate::config::{named, Key};

/// Where the metadata store lives, checked, with the digest identity read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataAddress {
    /// ZooKeeper connect string, `host:port[,host:port...]`.
    pub zookeeper: String,
    /// Absolute path under which every Quire znode lives, e.g. `/quire`.
    pub zk_root: String,
    /// ZooKeeper session timeout.
    pub session_timeout: Duration,
    /// The digest identity of the session, read from `[zookeeper] auth_file`.
    pub digest: Option<ZkDigest>,
}

impl MetadataAddress {
    /// Checks the `[zookeeper]` table and reads its auth file.
    ///
    /// # Errors
    /// One line naming the key.
    pub fn from_config(zk: &ZooKeeperConfig, keys: &[Key]) -> Result<Self> {
        zk.validate().map_err(|e| named(e, "zookeeper", keys))?;
        let digest = match &zk.auth_file {
            None => None,
            Some(path) => {
                crate::secret_file::warn_if_exposed(path, "zookeeper.auth_file");
                let text = std::fs::read_to_string(path).with_context(|| {
                    format!("cannot read zookeeper.auth_file {}", path.display())
                })?;
                let digest = ZkDigest::parse(&text)
                    .map_err(|e| anyhow!("invalid zookeeper.auth_file {}: {e}", path.display()))?;
                Some(digest)
            }
        };
        let (zookeeper, zk_root) = (zk.servers.clone(), zk.root.clone());
        Ok(Self {
            zookeeper,
            zk_root,
            session_timeout: zk.session_timeout(),
            digest,
        })
    }

    /// Connects to the ZooKeeper metadata store (its layout under the root is created on
    /// first use).
    ///
    /// # Errors
    /// ZooKeeper unreachable within about the session timeout, or a layout of another version.
    pub async fn connect_zk(&self) -> Result<Arc<ZkStore>> {
        let (zk, root) = (&self.zookeeper, &self.zk_root);
        let store =
            ZkStore::connect_with_auth(zk, root, self.session_timeout, self.digest.as_ref()).await;
        match store {
            Ok(store) => {
                let store = Arc::new(store);
                crate::zk_metrics::track(&store);
                Ok(store)
            }
            // ZooKeeper answered and refused the identity: not a connection problem.
            Err(e) if is_auth_refusal(&e) => {
                let with = match &self.digest {
                    Some(d) => format!("identity {:?}", d.user()),
                    None => "no identity".to_string(),
                };
                Err(anyhow!(e).context(format!(
                    "ZooKeeper at {zk} refused this session ({with}) under root {root}: its znodes \
                     belong to another digest identity; give the cluster's zookeeper.auth_file \
                     (--zk-auth-file or QUIRE_ZK_AUTH_FILE)"
                )))
            }
            Err(e) => {
                Err(anyhow!(e)
                    .context(format!("cannot connect to ZooKeeper at {zk} (root {root})")))
            }
        }
    }

    /// Like [`MetadataAddress::connect_zk`], as the metadata interface.
    ///
    /// # Errors
    /// As [`MetadataAddress::connect_zk`].
    pub async fn connect(&self) -> Result<Arc<dyn MetadataStore>> {
        Ok(self.connect_zk().await?)
    }
}

/// Whether a store error is ZooKeeper refusing the session's identity (`NoAuth` on a node of
/// another identity, or `AuthFailed`) rather than a failure to reach it.
fn is_auth_refusal(e: &quire_metadata::Error) -> bool {
    use zookeeper_client::Error as Zk;
    matches!(
        e,
        quire_metadata::Error::ZooKeeper {
            source: Zk::NoAuth | Zk::AuthFailed,
            ..
        }
    )
}

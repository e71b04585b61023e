//! The proxy registry: each proxy keeps an EPHEMERAL node `proxies/<address>` of its session
//! holding its [`ProxyInfo`] as JSON (as bookies do under `bookies/available`), so a crashed
//! proxy leaves the registry when its session expires. The `proxies` directory is created on
//! first use: layouts made before it existed have none, and it holds nothing durable.

use zookeeper_client as zk;

use super::records::{from_json, to_json, zk_err};
use super::ZkStore;
use crate::{Error, ProxyInfo, Result};

/// `Invalid` unless `address` can name one znode.
fn validate_proxy_address(address: &str) -> Result<()> {
    if address.is_empty() || address == "." || address == ".." || address.contains('/') {
        return Err(Error::Invalid {
            what: "proxy address",
            reason: format!("{address:?} is not one path component"),
        });
    }
    Ok(())
}

impl ZkStore {
    fn proxy_dir(&self) -> String {
        self.path("proxies")
    }

    /// Creates the `proxies` directory if it is missing.
    async fn ensure_proxy_dir(&self) -> Result<()> {
        let dir = self.proxy_dir();
        match self
            .inner
            .client
            .create(&dir, b"", &self.persistent())
            .await
        {
            Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
            Err(e) => Err(zk_err("create", &dir, e)),
        }
    }
}

/// Writes this session's `proxies/<address>` node: `set_data` when this session holds it,
/// otherwise creates it, first deleting a node a previous incarnation of the same address left
/// behind (its session has not expired yet, but that process is gone: its address is ours).
pub(super) async fn register_proxy(store: &ZkStore, info: &ProxyInfo) -> Result<()> {
    validate_proxy_address(&info.address)?;
    let c = &store.inner.client;
    let p = format!("{}/{}", store.proxy_dir(), info.address);
    let data = to_json("proxy info", info)?;
    for _ in 0..3 {
        match c
            .check_stat(&p)
            .await
            .map_err(|e| zk_err("exists", &p, e))?
        {
            Some(stat) if stat.ephemeral_owner == c.session_id().0 => {
                return match c.set_data(&p, &data, None).await {
                    Ok(_) => Ok(()),
                    Err(zk::Error::NoNode) => continue,
                    Err(e) => Err(zk_err("set", &p, e)),
                };
            }
            Some(stat) => match c.delete(&p, Some(stat.version)).await {
                Ok(()) | Err(zk::Error::NoNode | zk::Error::BadVersion) => continue,
                Err(e) => return Err(zk_err("delete", &p, e)),
            },
            None => {}
        }
        store.ensure_proxy_dir().await?;
        match c.create(&p, &data, &store.ephemeral()).await {
            Ok(_) => return Ok(()),
            Err(zk::Error::NodeExists) => continue,
            Err(e) => return Err(zk_err("create", &p, e)),
        }
    }
    Err(Error::Invalid {
        what: "proxy registration",
        reason: format!("{p} kept changing under this proxy"),
    })
}

/// Deletes `proxies/<address>`; a no-op when it is absent.
pub(super) async fn unregister_proxy(store: &ZkStore, address: &str) -> Result<()> {
    validate_proxy_address(address)?;
    let p = format!("{}/{address}", store.proxy_dir());
    match store.inner.client.delete(&p, None).await {
        Ok(()) | Err(zk::Error::NoNode) => Ok(()),
        Err(e) => Err(zk_err("delete", &p, e)),
    }
}

/// Every `proxies/*` record, sorted by address, skipping nodes that vanish while being read.
pub(super) async fn list_proxies(store: &ZkStore) -> Result<Vec<ProxyInfo>> {
    let dir = store.proxy_dir();
    let children = match store.list_children(&dir).await {
        Ok(ch) => ch,
        Err(zk::Error::NoNode) => return Ok(Vec::new()),
        Err(e) => return Err(zk_err("list", &dir, e)),
    };
    let mut out = Vec::with_capacity(children.len());
    for child in children {
        let p = format!("{dir}/{child}");
        match store.get_data(&p).await {
            Ok((bytes, _)) => out.push(from_json::<ProxyInfo>(&p, &bytes)?),
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(zk_err("get", &p, e)),
        }
    }
    out.sort_by(|a, b| a.address.cmp(&b.address));
    Ok(out)
}

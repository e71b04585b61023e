//! What the admin commands share: `--json` ([`OutputArgs`]) and running a command against the
//! metadata store its ZooKeeper flags name ([`with_store`], [`with_zk_store`]) on a
//! current-thread runtime. The commands are `quire ledger` ([`crate::ledger`]), `quire bookie
//! list` ([`crate::bookie::list`]), `quire autorecovery status`, `quire bookie decommission`
//! and `delete-cookie` ([`crate::autorecovery`]); `quire stream` ([`crate::stream`]) goes
//! through a proxy instead.

use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use quire_metadata::MetadataStore;

use crate::flags::ZooKeeperFlags;

/// Output options shared by the admin commands.
#[derive(Args, Debug, Clone)]
pub struct OutputArgs {
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `f` on a current-thread runtime with the address `metadata` names, then shuts the
/// runtime down (waiting at most 2 s for its tasks).
fn with_address<T>(
    metadata: &ZooKeeperFlags,
    f: impl AsyncFnOnce(crate::config::MetadataAddress) -> Result<T>,
) -> Result<T> {
    let address = metadata.resolve()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let result = runtime.block_on(f(address));
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}

/// Runs `f` with a ZooKeeper store connected from `metadata` (for the admin commands that need
/// ZooKeeper-only records: autorecovery, cookies).
pub(crate) fn with_zk_store<T>(
    metadata: &ZooKeeperFlags,
    f: impl AsyncFnOnce(std::sync::Arc<quire_metadata::ZkStore>) -> Result<T>,
) -> Result<T> {
    with_address(metadata, async |address| {
        f(address.connect_zk().await?).await
    })
}

pub(crate) fn with_store<T>(
    metadata: &ZooKeeperFlags,
    f: impl AsyncFnOnce(&dyn MetadataStore) -> Result<T>,
) -> Result<T> {
    with_address(metadata, async |address| {
        let store = address.connect().await?;
        f(store.as_ref()).await
    })
}

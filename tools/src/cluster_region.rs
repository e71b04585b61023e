//! `quire cluster region`: the operator's region marks (issue 30 item 4). `unavailable REGION`
//! marks a region as taking no new streams (the persistent ZooKeeper node
//! `regions/unavailable/REGION` under the cluster root): its proxies answer
//! `REGION_UNAVAILABLE` (519) to requests that would create or acquire a stream they do not
//! own, so clients given proxies per region fail over to their next region, while the streams
//! they own keep being served. `available REGION` clears the mark; `list` prints the marked
//! regions, one a line. Each is idempotent.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use quire_metadata::MetadataStore;

use crate::flags::ZooKeeperFlags;

/// `quire cluster region` subcommands.
#[derive(Args, Debug)]
pub struct RegionArgs {
    #[command(subcommand)]
    pub command: RegionCommand,
    #[command(flatten)]
    pub metadata: ZooKeeperFlags,
}

/// `quire cluster region` subcommands.
#[derive(Subcommand, Debug)]
pub enum RegionCommand {
    /// Mark REGION as taking no new streams: its proxies answer REGION_UNAVAILABLE (519) to
    /// requests that would create or acquire a stream they do not own.
    Unavailable { region: String },
    /// Clear REGION's mark: its proxies take new streams again.
    Available { region: String },
    /// The regions marked unavailable, one a line.
    List,
}

/// Runs `quire cluster region`.
pub fn run(args: RegionArgs) -> Result<()> {
    let lines = crate::admin::with_zk_store(&args.metadata, async |store| match &args.command {
        RegionCommand::Unavailable { region } => {
            store
                .set_region_unavailable(region, true)
                .await
                .with_context(|| format!("cannot mark region {region} unavailable"))?;
            Ok(vec![format!(
                "region {region} marked unavailable: its proxies take no new streams"
            )])
        }
        RegionCommand::Available { region } => {
            store
                .set_region_unavailable(region, false)
                .await
                .with_context(|| format!("cannot clear the mark of region {region}"))?;
            Ok(vec![format!("region {region} takes new streams")])
        }
        RegionCommand::List => store
            .unavailable_regions()
            .await
            .context("cannot list the region marks"),
    })?;
    for l in lines {
        println!("{l}");
    }
    Ok(())
}

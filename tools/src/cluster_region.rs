//! `quire cluster region`: the operator's region marks (issue 30 item 4). `unavailable REGION`
//! marks a region as taking no new streams (the persistent ZooKeeper node
//! `regions/unavailable/REGION` under the cluster root): its proxies answer
//! `REGION_UNAVAILABLE` (519) to requests that would create or acquire a stream they do not
//! own, so clients given proxies per region fail over to their next region, while the streams
//! they own keep being served. `available REGION` clears the mark; `list` prints the marked
//! regions, one a line. Each is idempotent.
//!
//! With `--data-dir DIR` the marks go to a stopped sandbox's embedded store (`DIR/metadata`,
//! its document's `unavailable_regions`) instead of ZooKeeper: the sandbox's proxy honours
//! them from its next start. Refused while a sandbox runs on DIR (it holds the whole document
//! in memory and would write over the mark).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use quire_metadata::MetadataStore;

use crate::flags::ZooKeeperFlags;

/// `quire cluster region` subcommands.
#[derive(Args, Debug)]
pub struct RegionArgs {
    #[command(subcommand)]
    pub command: RegionCommand,
    /// A stopped sandbox's data directory: mark its embedded store instead of ZooKeeper.
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
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
    let lines = match &args.data_dir {
        Some(dir) => in_sandbox(dir, &args.command)?,
        None => crate::admin::with_zk_store(&args.metadata, async |store| {
            apply(store.as_ref(), &args.command).await
        })?,
    };
    for l in lines {
        println!("{l}");
    }
    Ok(())
}

/// The command against a stopped sandbox's embedded store (`DIR/metadata`), holding the
/// sandbox's lock meanwhile.
///
/// # Errors
/// No sandbox metadata in `dir`; a sandbox running on it; the store's open and write errors.
fn in_sandbox(dir: &std::path::Path, command: &RegionCommand) -> Result<Vec<String>> {
    // Never make a store where no sandbox ran: the sandbox refuses metadata without its
    // bookies' record (`sandbox.json`).
    let doc = dir
        .join("metadata")
        .join(quire_metadata::EMBEDDED_FILE_NAME);
    if !doc.exists() {
        anyhow::bail!("no sandbox metadata at {}", doc.display());
    }
    let _lock = crate::sandbox::lock_data_dir(dir)
        .context("stop the sandbox first: its marks apply when it starts again")?;
    let store = quire_metadata::EmbeddedStore::open(&dir.join("metadata"))
        .with_context(|| format!("cannot open the sandbox's metadata in {}", dir.display()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(apply(&store, command))
}

/// Sets, clears or lists the marks in `store`; the lines to print.
async fn apply(store: &dyn MetadataStore, command: &RegionCommand) -> Result<Vec<String>> {
    match command {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_go_to_a_stopped_sandboxs_store_and_not_under_a_running_one() {
        // Goal (issue 30 item 2): `--data-dir` marks the sandbox's embedded store, kept in
        // its document across opens; refused while the sandbox's lock is held.
        let dir = tempfile::tempdir().unwrap();
        let err = in_sandbox(dir.path(), &RegionCommand::List).unwrap_err();
        assert!(err.to_string().contains("no sandbox metadata"), "{err:#}");
        // What a sandbox leaves: a written document.
        let store = quire_metadata::EmbeddedStore::open(&dir.path().join("metadata")).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(store.allocate_ledger_id()).unwrap();
        drop(store);
        let mark = RegionCommand::Unavailable { region: "b".into() };
        assert!(in_sandbox(dir.path(), &mark).unwrap()[0].contains("marked unavailable"));
        assert_eq!(in_sandbox(dir.path(), &RegionCommand::List).unwrap(), ["b"]);
        let running = crate::sandbox::lock_data_dir(dir.path()).unwrap();
        let err = in_sandbox(dir.path(), &RegionCommand::List).unwrap_err();
        assert!(
            format!("{err:#}").contains("stop the sandbox first"),
            "{err:#}"
        );
        drop(running);
        let clear = RegionCommand::Available { region: "b".into() };
        in_sandbox(dir.path(), &clear).unwrap();
        assert!(in_sandbox(dir.path(), &RegionCommand::List)
            .unwrap()
            .is_empty());
    }
}

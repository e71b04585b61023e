//! `quire bookie list`: the registered bookies, read-only ones marked (BookKeeper shell's
//! `listbookies`), through the metadata store.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use clap::Args;

use crate::admin::{with_store, OutputArgs};
use crate::flags::ZooKeeperFlags;

/// `quire bookie list` options.
#[derive(Args, Debug)]
pub struct BookieListArgs {
    #[command(flatten)]
    pub metadata: ZooKeeperFlags,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Runs `quire bookie list`.
pub fn run(args: BookieListArgs) -> Result<()> {
    with_store(&args.metadata, async |store| {
        let bookies = store.list_bookies().await.context("cannot list bookies")?;
        if args.output.json {
            println!("{}", serde_json::to_string_pretty(&bookies)?);
            return Ok(());
        }
        let mut out = String::new();
        for b in &bookies {
            let rack = crate::cluster::labels(b.region.as_deref(), b.rack.as_deref());
            let mode = if b.read_only { " (read-only)" } else { "" };
            writeln!(out, "{}{rack}{mode}", b.id)?;
        }
        writeln!(
            out,
            "{} bookies registered, {} read-only",
            bookies.len(),
            bookies.iter().filter(|b| b.read_only).count()
        )?;
        print!("{out}");
        Ok(())
    })
}

//! `quire bookie`: run one bookie process of a multi-process cluster ([`mod@run`]), or one of
//! its admin subcommands: `list` ([`list`]), `info ADDR` ([`info`]), `decommission`
//! ([`decommission`]) and `delete-cookie` ([`cookie`], which also holds the cookie rules a
//! starting bookie checks).

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};

pub mod cookie;
pub mod decommission;
pub mod disk_test;
pub mod info;
pub mod list;
pub mod run;
pub mod scrub;

/// `quire bookie` options: run a bookie, or an admin subcommand.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BookieArgs {
    #[command(subcommand)]
    pub command: Option<BookieCommand>,
    /// TOML configuration file; every flag below overrides the key of the same name.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: crate::flags::BookieFlags,
}

/// `quire bookie` admin subcommands.
#[derive(Subcommand, Debug)]
pub enum BookieCommand {
    /// List registered bookies (read-only ones marked).
    List(list::BookieListArgs),
    /// Ask one bookie, over the bookie protocol, for its state, shards, ledgers and disk use.
    Info(info::InfoArgs),
    /// Retire a bookie that is still up: its replicas are copied to other bookies by
    /// autorecovery, then its cookie is deleted. Shows progress; a second run resumes.
    Decommission(decommission::DecommissionArgs),
    /// Delete a stopped bookie's cookie from ZooKeeper, so that it can start again on wiped
    /// or new disks; autorecovery then copies its replicas back to it.
    DeleteCookie(cookie::DeleteCookieArgs),
    /// Measure the journal device's durable 4 KiB append latency (p50/p99 µs) and the
    /// sequential bandwidth (MB/s) of the journal and ledger directories, beside perf/'s floor.
    DiskTest(disk_test::DiskTestArgs),
}

/// Runs `quire bookie`.
pub fn run(args: BookieArgs) -> Result<()> {
    match args.command {
        Some(BookieCommand::List(a)) => list::run(a),
        Some(BookieCommand::Info(a)) => info::run(a),
        Some(BookieCommand::Decommission(a)) => decommission::run(a),
        Some(BookieCommand::DeleteCookie(a)) => cookie::delete(a),
        Some(BookieCommand::DiskTest(a)) => disk_test::run(a),
        None => run::run(args.config.as_deref(), &args.settings),
    }
}

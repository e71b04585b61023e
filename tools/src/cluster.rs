//! `quire cluster status`: one look at a ZooKeeper cluster from its metadata store, as rpk's
//! `cluster health` (and BookKeeper shell's `listbookies` + `listunderreplicated` +
//! `whoisauditor` together):
//! * bookies and their state: `writable` (`bookies/available`), `read-only`
//!   (`bookies/readonly`), `down` (it has a cookie, so it registered before, but holds no
//!   registration now), `decommissioning` (`underreplication/decommission/<id>` exists);
//! * proxies with the streams they own (the owners of the streams' write locks: a proxy that
//!   owns nothing does not show here; `quire proxy list` reads the proxy registry);
//! * autorecovery: the auditor (first election candidate), the candidates, the count of
//!   under-replicated ledgers;
//! * pending decommissions with their start time;
//! * the regions an operator marked as taking no new streams (`quire cluster region
//!   unavailable`, issue 30): a maintenance state, not a problem.
//!
//! **Unhealthy** (exit status 1, each reason on stderr and in the JSON's `problems`):
//! * a bookie that registered before (it has a cookie) is not registered now and is not being
//!   decommissioned;
//! * a bookie is read-only (a full disk: it takes no new ledgers);
//! * no bookie is writable;
//! * a ledger is under-replicated;
//! * no auditor is elected while autorecovery is expected (the default: every bookie runs it
//!   unless `[autorecovery] enabled = false`; `--no-autorecovery` says the cluster runs none).
//!
//! An unreachable ZooKeeper is an error (exit status 1, one line), not a status.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use quire_metadata::{AutorecoveryState, MetadataStore, UnderReplication, Versioned, ZkStore};
use quire_wire::LedgerId;
use serde::Serialize;

use crate::admin::OutputArgs;
use crate::flags::ZooKeeperFlags;
use crate::stream::format_time_ms;

/// `quire cluster` subcommands.
#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub command: ClusterCommand,
}

/// `quire cluster` subcommands.
#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Bookies with their state, proxies with their streams, autorecovery, under-replicated
    /// ledgers and pending decommissions; exit status 1 when unhealthy (a bookie that
    /// registered before is missing, a bookie is read-only, ledgers are under-replicated, no
    /// auditor while autorecovery is expected).
    Status(StatusArgs),
    /// Region marks: `unavailable REGION` (its proxies take no new streams, answering
    /// REGION_UNAVAILABLE so writers fail over to their next region), `available REGION`,
    /// `list`.
    Region(crate::cluster_region::RegionArgs),
}

/// `quire cluster status` options.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The cluster runs no autorecovery (every bookie has `[autorecovery] enabled = false` and
    /// no standalone daemon runs): a missing auditor is then not a problem.
    #[arg(long)]
    pub no_autorecovery: bool,
    #[command(flatten)]
    pub metadata: ZooKeeperFlags,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// One bookie as the metadata store knows it.
#[derive(Debug, Clone, Serialize)]
pub struct BookieStatus {
    pub id: String,
    pub rack: Option<String>,
    /// Region label (`None`: unlabelled, default-region).
    pub region: Option<String>,
    /// `writable`, `read-only` or `down`.
    pub state: &'static str,
    /// Whether a decommission of it is pending.
    pub decommissioning: bool,
}

/// A pending decommission (`quire_metadata::Decommission`, the record autorecovery's workers
/// add their copies to).
#[derive(Debug, Clone, Serialize)]
pub struct Decommission {
    pub bookie: String,
    /// RFC 3339.
    pub started_at: String,
    /// Entry bytes and entries the workers copied off the bookie so far.
    pub bytes_copied: u64,
    pub entries_copied: u64,
}

/// Everything `quire cluster status` shows.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub healthy: bool,
    pub problems: Vec<String>,
    pub checked_at: String,
    pub bookies: Vec<BookieStatus>,
    /// Proxy identity → the streams it owns.
    pub proxies: BTreeMap<String, Vec<String>>,
    pub streams: usize,
    pub unowned_streams: usize,
    pub auditor: Option<String>,
    pub auditor_candidates: Vec<String>,
    pub autorecovery_expected: bool,
    pub under_replicated_ledgers: usize,
    pub decommissions: Vec<Decommission>,
    /// Regions marked as taking no new streams (`regions/unavailable/<region>`), sorted.
    pub unavailable_regions: Vec<String>,
}

/// Runs `quire cluster`.
pub fn run(args: ClusterArgs) -> Result<()> {
    let args = match args.command {
        ClusterCommand::Status(args) => args,
        ClusterCommand::Region(args) => return crate::cluster_region::run(args),
    };
    let status = crate::admin::with_zk_store(&args.metadata, async |store| {
        read_status(&store, !args.no_autorecovery).await
    })?;
    if args.output.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", format_status(&status)?);
    }
    if !status.healthy {
        bail!("cluster unhealthy: {}", status.problems.join("; "));
    }
    Ok(())
}

/// Children of `rel` under the store's root, sorted (none when the directory is absent).
async fn children(store: &ZkStore, rel: &str) -> Result<Vec<String>> {
    let path = format!("{}/{rel}", store.root());
    match store.client().list_children(&path).await {
        Ok(mut c) => {
            c.sort();
            Ok(c)
        }
        Err(zookeeper_client::Error::NoNode) => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("cannot list {path}")),
    }
}

/// The pending decommissions, from the metadata store's records.
pub async fn read_decommissions(store: &ZkStore) -> Result<Vec<Decommission>> {
    let records = store
        .decommissions()
        .await
        .context("cannot read the decommission records")?;
    Ok(records
        .into_iter()
        .map(|(bookie, d)| Decommission {
            bookie: bookie.0,
            started_at: format_time_ms(d.start_ms),
            bytes_copied: d.bytes_copied,
            entries_copied: d.entries_copied,
        })
        .collect())
}

/// What `cluster status` and `autorecovery status` both show of autorecovery.
pub(crate) struct Recovery {
    /// The auditor election's candidates (the first is the auditor) and the replication locks.
    pub(crate) state: AutorecoveryState,
    /// The under-replication marks, by ledger.
    pub(crate) marks: Vec<(LedgerId, Versioned<UnderReplication>)>,
}

/// Reads the autorecovery state and the under-replication marks, for both status commands.
///
/// # Errors
/// A ZooKeeper request failed (the message says which read).
pub(crate) async fn read_recovery(store: &ZkStore) -> Result<Recovery> {
    let state = store
        .autorecovery_state()
        .await
        .context("cannot read the autorecovery state")?;
    let marks = store
        .list_under_replicated()
        .await
        .context("cannot list under-replicated ledgers")?;
    Ok(Recovery { state, marks })
}

/// Reads the cluster's status from its metadata store.
///
/// # Errors
/// A ZooKeeper request failed.
pub async fn read_status(store: &ZkStore, autorecovery_expected: bool) -> Result<Status> {
    let registered = store.list_bookies().await.context("cannot list bookies")?;
    let cookies = children(store, "cookies").await?;
    let decommissions = read_decommissions(store).await?;
    let leaving = |id: &str| decommissions.iter().any(|d| d.bookie == id);
    let mut bookies: Vec<BookieStatus> = registered
        .iter()
        .map(|b| BookieStatus {
            id: b.id.0.clone(),
            rack: b.rack.clone(),
            region: b.region.clone(),
            state: if b.read_only { "read-only" } else { "writable" },
            decommissioning: leaving(&b.id.0),
        })
        .collect();
    for id in cookies
        .iter()
        .filter(|c| !registered.iter().any(|b| &b.id.0 == *c))
    {
        // The labels live only in the registration, which a down bookie no longer has.
        bookies.push(BookieStatus {
            id: id.clone(),
            rack: None,
            region: None,
            state: "down",
            decommissioning: leaving(id),
        });
    }
    bookies.sort_by(|a, b| a.id.cmp(&b.id));
    let Recovery { state, marks } = read_recovery(store).await?;
    let (proxies, streams, unowned) = stream_owners(store).await?;
    let unavailable_regions = store
        .unavailable_regions()
        .await
        .context("cannot list the region marks")?;
    let mut status = Status {
        healthy: true,
        problems: Vec::new(),
        checked_at: format_time_ms(quire_clock::unix_ms()),
        bookies,
        proxies,
        streams,
        unowned_streams: unowned,
        auditor: state.candidates.first().cloned(),
        auditor_candidates: state.candidates,
        autorecovery_expected,
        under_replicated_ledgers: marks.len(),
        decommissions,
        unavailable_regions,
    };
    status.problems = problems(&status);
    status.healthy = status.problems.is_empty();
    Ok(status)
}

/// Streams grouped by owner, the stream count and how many have no owner.
async fn stream_owners(store: &ZkStore) -> Result<(BTreeMap<String, Vec<String>>, usize, usize)> {
    let names = store.list_streams().await.context("cannot list streams")?;
    let mut proxies: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut unowned = 0;
    for name in &names {
        match store.stream_owner(name).await {
            Ok(Some(owner)) => proxies.entry(owner).or_default().push(name.clone()),
            Ok(None) => unowned += 1,
            Err(e) => return Err(e).with_context(|| format!("cannot read the owner of {name}")),
        }
    }
    Ok((proxies, names.len(), unowned))
}

/// What makes the cluster unhealthy (the module's list), one line each.
fn problems(s: &Status) -> Vec<String> {
    let mut out = Vec::new();
    for b in &s.bookies {
        match b.state {
            "down" if !b.decommissioning => out.push(format!(
                "bookie {} is down (it registered before and is not registered now)",
                b.id
            )),
            "read-only" => out.push(format!(
                "bookie {} is read-only (a disk is over its usage threshold)",
                b.id
            )),
            _ => {}
        }
    }
    if !s.bookies.iter().any(|b| b.state == "writable") {
        out.push("no bookie is writable".into());
    }
    if s.under_replicated_ledgers > 0 {
        out.push(format!(
            "{} ledgers are under-replicated",
            s.under_replicated_ledgers
        ));
    }
    if s.autorecovery_expected && s.auditor.is_none() {
        out.push("no autorecovery auditor is elected (no autorecovery daemon runs; pass --no-autorecovery if the cluster runs none)".into());
    }
    out
}

/// The human form of a status.
fn format_status(s: &Status) -> Result<String> {
    let mut out = String::new();
    let health = if s.healthy { "healthy" } else { "UNHEALTHY" };
    writeln!(out, "cluster: {health} (checked at {})", s.checked_at)?;
    for p in &s.problems {
        writeln!(out, "  problem: {p}")?;
    }
    writeln!(out, "bookies: {}", s.bookies.len())?;
    for b in &s.bookies {
        let rack = labels(b.region.as_deref(), b.rack.as_deref());
        let leaving = if b.decommissioning {
            ", decommissioning"
        } else {
            ""
        };
        writeln!(out, "  {} {}{leaving}{rack}", b.id, b.state)?;
    }
    writeln!(
        out,
        "proxies: {} owning streams ({} streams, {} without an owner)",
        s.proxies.len(),
        s.streams,
        s.unowned_streams
    )?;
    for (proxy, streams) in &s.proxies {
        writeln!(
            out,
            "  {proxy}: {} streams: {}",
            streams.len(),
            streams.join(" ")
        )?;
    }
    let marked = if s.unavailable_regions.is_empty() {
        "none".to_string()
    } else {
        s.unavailable_regions.join(" ")
    };
    writeln!(out, "regions marked unavailable: {marked}")?;
    let auditor = match (&s.auditor, s.autorecovery_expected) {
        (Some(a), _) => a.clone(),
        (None, true) => "none".into(),
        (None, false) => "none (not expected)".into(),
    };
    writeln!(
        out,
        "autorecovery: auditor {auditor}, {} candidates, {} under-replicated ledgers",
        s.auditor_candidates.len(),
        s.under_replicated_ledgers
    )?;
    writeln!(out, "decommissions: {}", s.decommissions.len())?;
    for d in &s.decommissions {
        writeln!(
            out,
            "  {} started at {}, {} bytes ({} entries) copied off it so far",
            d.bookie, d.started_at, d.bytes_copied, d.entries_copied
        )?;
    }
    Ok(out)
}

/// ` region=R rack=K` for the labels a registration carries (each left out when unset), as
/// `quire bookie list`, `quire proxy list` and `quire cluster status` print them.
pub fn labels(region: Option<&str>, rack: Option<&str>) -> String {
    let mut out = String::new();
    if let Some(r) = region {
        out.push_str(&format!(" region={r}"));
    }
    if let Some(r) = rack {
        out.push_str(&format!(" rack={r}"));
    }
    out
}

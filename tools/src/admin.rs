//! Admin commands over the metadata store (BookKeeper shell's `ledgermetadata`,
//! `recover`/`ledger`, `listbookies`; DistributedLog's `show`):
//!
//! * `quire ledger show LEDGER`: the ledger's metadata;
//! * `quire ledger recover LEDGER`: fences and closes the ledger (the ledger client's
//!   `recover_ledger`), printing where it ends;
//! * `quire bookie list`: registered bookies, read-only ones marked;
//! * `quire stream show STREAM`: segments, max txid and current owner.
//!
//! They find the metadata store from `--zookeeper` / `QUIRE_ZOOKEEPER` and `--zk-root` /
//! `QUIRE_ZK_ROOT`. Output is text for people, or one JSON document with `--json`.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use quire_metadata::{LedgerMetadata, MetadataStore, SegmentState, StreamMetadata, Version};
use quire_wire::LedgerId;

use crate::config::MetadataArgs;

/// Output options shared by the admin commands.
#[derive(Args, Debug, Clone)]
pub struct OutputArgs {
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `quire ledger` subcommands.
#[derive(Args, Debug)]
pub struct LedgerArgs {
    #[command(subcommand)]
    pub command: LedgerCommand,
}

/// `quire ledger` subcommands.
#[derive(Subcommand, Debug)]
pub enum LedgerCommand {
    /// Print a ledger's metadata: state, quorum, ensembles by fragment, last entry, length.
    Show(LedgerIdArgs),
    /// Recover a ledger: fence its last ensemble, find its end, close it (BookKeeper's
    /// open-with-recovery); print where it ends. A closed ledger is left as it is.
    Recover(LedgerIdArgs),
}

/// A ledger id and where the metadata is.
#[derive(Args, Debug)]
pub struct LedgerIdArgs {
    /// Ledger id.
    pub ledger: u64,
    #[command(flatten)]
    pub metadata: MetadataArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `quire bookie list` options.
#[derive(Args, Debug)]
pub struct BookieListArgs {
    #[command(flatten)]
    pub metadata: MetadataArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `quire stream` subcommands.
#[derive(Args, Debug)]
pub struct StreamArgs {
    #[command(subcommand)]
    pub command: StreamCommand,
}

/// `quire stream` subcommands.
#[derive(Subcommand, Debug)]
pub enum StreamCommand {
    /// Print a stream's segments (seq no, ledger, state, DLSN range, records), max txid and
    /// current owner.
    Show(StreamShowArgs),
}

/// `quire stream show` options.
#[derive(Args, Debug)]
pub struct StreamShowArgs {
    /// Stream name.
    pub stream: String,
    #[command(flatten)]
    pub metadata: MetadataArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

fn with_store<T>(
    metadata: &MetadataArgs,
    f: impl AsyncFnOnce(&dyn MetadataStore) -> Result<T>,
) -> Result<T> {
    let address = metadata.resolve()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let result = runtime.block_on(async {
        let store = address.connect().await?;
        f(store.as_ref()).await
    });
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}

/// Runs `quire ledger ...`.
pub fn ledger(args: LedgerArgs) -> Result<()> {
    match args.command {
        LedgerCommand::Show(a) => with_store(&a.metadata, async |store| {
            let v = store
                .read_ledger(LedgerId(a.ledger))
                .await
                .with_context(|| format!("ledger {}", a.ledger))?;
            print_ledger(a.ledger, &v.value, Some(v.version), a.output.json)
        }),
        LedgerCommand::Recover(a) => {
            let address = a.metadata.resolve()?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("cannot start the tokio runtime")?;
            let result = runtime.block_on(async {
                let store = address.connect().await?;
                let bk =
                    quire_ledger::BookKeeper::new(store, quire_ledger::ClientConfig::default());
                let meta = bk
                    .recover_ledger(LedgerId(a.ledger))
                    .await
                    .with_context(|| format!("recovery of ledger {} failed", a.ledger))?;
                if a.output.json {
                    print_ledger(a.ledger, &meta, None, true)
                } else {
                    let last = meta
                        .last_entry
                        .map_or("none (empty)".to_string(), |e| e.to_string());
                    println!(
                        "ledger {} recovered: state {:?}, last entry {last}, length {} bytes",
                        a.ledger, meta.state, meta.length_bytes
                    );
                    Ok(())
                }
            });
            runtime.shutdown_timeout(Duration::from_secs(2));
            result
        }
    }
}

fn print_ledger(
    id: u64,
    meta: &LedgerMetadata,
    version: Option<Version>,
    json: bool,
) -> Result<()> {
    if json {
        let doc =
            serde_json::json!({ "ledger": id, "version": version.map(|v| v.0), "metadata": meta });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let mut out = String::new();
    writeln!(out, "ledger {id}")?;
    writeln!(out, "  state:       {:?}", meta.state)?;
    writeln!(
        out,
        "  quorum:      E={} Qw={} Qa={}",
        meta.ensemble_size, meta.write_quorum, meta.ack_quorum
    )?;
    let last = meta
        .last_entry
        .map_or("none".to_string(), |e| e.to_string());
    writeln!(out, "  last entry:  {last}")?;
    writeln!(out, "  length:      {} bytes", meta.length_bytes)?;
    writeln!(out, "  digest:      {:?}", meta.digest_type)?;
    writeln!(
        out,
        "  created:     {} ms since the epoch",
        meta.creation_time_ms
    )?;
    if let Some(v) = version {
        writeln!(out, "  version:     {}", v.0)?;
    }
    writeln!(out, "  ensembles:")?;
    for f in &meta.fragments {
        let bookies: Vec<&str> = f.bookies.iter().map(|b| b.0.as_str()).collect();
        writeln!(
            out,
            "    from entry {:<8} {}",
            f.first_entry,
            bookies.join(" ")
        )?;
    }
    for (k, v) in &meta.custom {
        writeln!(out, "  custom:      {k} = {v}")?;
    }
    print!("{out}");
    Ok(())
}

/// Runs `quire bookie list`.
pub fn bookie_list(args: BookieListArgs) -> Result<()> {
    with_store(&args.metadata, async |store| {
        let bookies = store.list_bookies().await.context("cannot list bookies")?;
        if args.output.json {
            println!("{}", serde_json::to_string_pretty(&bookies)?);
            return Ok(());
        }
        let mut out = String::new();
        for b in &bookies {
            let rack = b
                .rack
                .as_deref()
                .map(|r| format!(" rack={r}"))
                .unwrap_or_default();
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

/// Runs `quire stream ...`.
pub fn stream(args: StreamArgs) -> Result<()> {
    let StreamCommand::Show(a) = args.command;
    with_store(&a.metadata, async |store| {
        let v = store
            .read_stream(&a.stream)
            .await
            .with_context(|| format!("stream {:?}", a.stream))?;
        let owner = store
            .stream_owner(&a.stream)
            .await
            .context("cannot read the stream's owner")?;
        if a.output.json {
            let doc =
                serde_json::json!({ "version": v.version.0, "owner": owner, "metadata": v.value });
            println!("{}", serde_json::to_string_pretty(&doc)?);
            return Ok(());
        }
        print!("{}", format_stream(&v.value, owner.as_deref())?);
        Ok(())
    })
}

fn format_stream(meta: &StreamMetadata, owner: Option<&str>) -> Result<String> {
    let mut out = String::new();
    writeln!(out, "stream {}", meta.name)?;
    writeln!(out, "  owner:    {}", owner.unwrap_or("none"))?;
    writeln!(
        out,
        "  max txid: {}",
        meta.max_txid.map_or("none".to_string(), |t| t.to_string())
    )?;
    writeln!(out, "  segments: {}", meta.segments.len())?;
    if !meta.segments.is_empty() {
        writeln!(
            out,
            "  {:>6} {:>8} {:<11} {:<27} {:>9} {:>12}",
            "seq", "ledger", "state", "DLSN range", "records", "bytes"
        )?;
    }
    for s in &meta.segments {
        // A segment's DLSNs run from SEQ:0:0 up to (not including) SEQ:(last entry + 1):0.
        let (state, range, records, bytes) = match s.state {
            SegmentState::Completed => (
                "completed",
                match s.last_entry {
                    Some(last) => format!("{}:0:0 .. <{}:{}:0", s.seq_no, s.seq_no, last + 1),
                    None => "empty".to_string(),
                },
                s.record_count.to_string(),
                s.length_bytes.to_string(),
            ),
            SegmentState::InProgress => (
                "in progress",
                format!("{}:0:0 ..", s.seq_no),
                "-".into(),
                "-".into(),
            ),
        };
        writeln!(
            out,
            "  {:>6} {:>8} {:<11} {:<27} {:>9} {:>12}",
            s.seq_no, s.ledger_id, state, range, records, bytes
        )?;
    }
    Ok(out)
}

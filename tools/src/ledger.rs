//! `quire ledger`: ledger admin over the metadata store (BookKeeper shell's
//! `ledgermetadata`, `recover`/`ledger`, `listunderreplicated`):
//!
//! * `quire ledger list [--under-replicated]`: ledger ids, or the ledgers autorecovery marked
//!   under-replicated (BookKeeper `listunderreplicated`);
//! * `quire ledger show LEDGER`: the ledger's metadata;
//! * `quire ledger recover LEDGER`: fences and closes the ledger (the ledger client's
//!   `recover_ledger`), printing where it ends.
//!
//! They find the metadata store from `--zookeeper` / `QUIRE_ZOOKEEPER` and `--zk-root` /
//! `QUIRE_ZK_ROOT` ([`crate::flags::ZooKeeperFlags`]). Output is text for people, or one JSON
//! document with `--json`.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use quire_metadata::{LedgerMetadata, MetadataStore, Version};
use quire_wire::LedgerId;

use crate::admin::OutputArgs;
use crate::flags::ZooKeeperFlags;

/// `quire ledger` subcommands.
#[derive(Args, Debug)]
pub struct LedgerArgs {
    #[command(subcommand)]
    pub command: LedgerCommand,
}

/// `quire ledger` subcommands.
#[derive(Subcommand, Debug)]
pub enum LedgerCommand {
    /// List ledger ids; with `--under-replicated`, only the ledgers autorecovery marked, with
    /// their lost bookies and how long they have waited (BookKeeper `listunderreplicated`).
    List(LedgerListArgs),
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
    pub metadata: ZooKeeperFlags,
    #[command(flatten)]
    pub output: OutputArgs,
    /// TLS to bookies (`recover`).
    #[command(flatten)]
    pub bookie_tls: crate::tls::BookieTlsArgs,
}

/// `quire ledger list` options.
#[derive(Args, Debug)]
pub struct LedgerListArgs {
    /// Only ledgers marked under-replicated.
    #[arg(long)]
    pub under_replicated: bool,
    #[command(flatten)]
    pub metadata: ZooKeeperFlags,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Runs `quire ledger ...`.
pub fn run(args: LedgerArgs) -> Result<()> {
    match args.command {
        LedgerCommand::List(a) => ledger_list(a),
        LedgerCommand::Show(a) => ledger_show(a),
        LedgerCommand::Recover(a) => {
            let address = a.metadata.resolve()?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("cannot start the tokio runtime")?;
            let result = runtime.block_on(async {
                let store = address.connect().await?;
                let config = quire_ledger::ClientConfig {
                    tls: a.bookie_tls.client_config()?,
                    cluster_secret: a.bookie_tls.cluster_secret()?,
                    ..quire_ledger::ClientConfig::default()
                };
                let bk = quire_ledger::BookKeeper::new(store, config);
                let meta = bk
                    .recover_ledger(LedgerId(a.ledger))
                    .await
                    .with_context(|| format!("recovery of ledger {} failed", a.ledger))?;
                if a.output.json {
                    print_ledger(a.ledger, &meta, None, true, None)
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

/// `quire ledger show LEDGER`: the metadata, and for a ledger not closed yet the LAC its last
/// ensemble reports (BookKeeper's `readLastConfirmed` on a handle opened without recovery:
/// nothing is fenced), since the metadata's last entry and length are only set at close.
fn ledger_show(a: LedgerIdArgs) -> Result<()> {
    let address = a.metadata.resolve()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let result = runtime.block_on(async {
        let store = address.connect().await?;
        let v = store
            .read_ledger(LedgerId(a.ledger))
            .await
            .with_context(|| format!("ledger {}", a.ledger))?;
        let lac = if v.value.state == quire_metadata::LedgerState::Closed {
            None
        } else {
            Some(read_lac(store, &a).await)
        };
        print_ledger(a.ledger, &v.value, Some(v.version), a.output.json, lac)
    });
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}

/// The LAC of an open ledger from its bookies: `Ok(None)` when no entry is confirmed yet,
/// `Err(reason)` when no bookie answered.
async fn read_lac(
    store: std::sync::Arc<dyn MetadataStore>,
    a: &LedgerIdArgs,
) -> std::result::Result<Option<u64>, String> {
    let config = quire_ledger::ClientConfig {
        tls: a.bookie_tls.client_config().map_err(|e| format!("{e:#}"))?,
        cluster_secret: a
            .bookie_tls
            .cluster_secret()
            .map_err(|e| format!("{e:#}"))?,
        request_timeout: Duration::from_secs(5),
        ..quire_ledger::ClientConfig::default()
    };
    let bk = quire_ledger::BookKeeper::new(store, config);
    let reader = bk
        .open_ledger(LedgerId(a.ledger))
        .await
        .map_err(|e| e.to_string())?;
    let lac = reader.read_lac().await.map_err(|e| e.to_string())?;
    Ok(lac.map(|e| e.0))
}

/// `quire ledger list [--under-replicated]`.
fn ledger_list(args: LedgerListArgs) -> Result<()> {
    let address = args.metadata.resolve()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let result = runtime.block_on(async {
        let store = address.connect_zk().await?;
        if !args.under_replicated {
            let ids = store.list_ledgers().await.context("cannot list ledgers")?;
            if args.output.json {
                let ids: Vec<u64> = ids.iter().map(|l| l.0).collect();
                println!("{}", serde_json::to_string_pretty(&ids)?);
            } else {
                let mut out = String::new();
                for id in &ids {
                    writeln!(out, "{id}")?;
                }
                writeln!(out, "{} ledgers", ids.len())?;
                print!("{out}");
            }
            return Ok(());
        }
        let marks = store
            .list_under_replicated()
            .await
            .context("cannot list under-replicated ledgers")?;
        let now = quire_clock::unix_ms();
        if args.output.json {
            let doc: Vec<serde_json::Value> = marks
                .iter()
                .map(|(id, m)| {
                    serde_json::json!({
                        "ledger": id.0,
                        "missing_bookies": m.value.missing_bookies,
                        "gaps_on": m.value.gaps_on,
                        "marked_at_ms": m.value.ctime_ms,
                        "waiting_ms": now.saturating_sub(m.value.ctime_ms),
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&doc)?);
            return Ok(());
        }
        let mut out = String::new();
        for (id, m) in &marks {
            // A writer's reported gaps are shown as "BOOKIE(gaps)".
            let missing: Vec<String> = m
                .value
                .missing_bookies
                .iter()
                .map(|b| b.0.clone())
                .chain(m.value.gaps_on.iter().map(|b| format!("{b}(gaps)")))
                .collect();
            writeln!(
                out,
                "{id} missing {} waiting {} s",
                missing.join(" "),
                now.saturating_sub(m.value.ctime_ms) / 1000
            )?;
        }
        writeln!(out, "{} under-replicated ledgers", marks.len())?;
        print!("{out}");
        Ok(())
    });
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}

/// Prints a ledger; `lac` is the LAC read from the bookies of a ledger not closed (`None`
/// for a closed one, whose metadata holds its end).
fn print_ledger(
    id: u64,
    meta: &LedgerMetadata,
    version: Option<Version>,
    json: bool,
    lac: Option<std::result::Result<Option<u64>, String>>,
) -> Result<()> {
    if json {
        let mut doc =
            serde_json::json!({ "ledger": id, "version": version.map(|v| v.0), "metadata": meta });
        match &lac {
            Some(Ok(l)) => doc["last_add_confirmed"] = serde_json::json!(l),
            Some(Err(e)) => doc["last_add_confirmed_error"] = serde_json::json!(e),
            None => {}
        }
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
    match &lac {
        None => {
            let last = meta
                .last_entry
                .map_or("none".to_string(), |e| e.to_string());
            writeln!(out, "  last entry:  {last}")?;
            writeln!(out, "  length:      {} bytes", meta.length_bytes)?;
        }
        // Open: the metadata's end is not set until close; the bookies know the LAC.
        Some(Ok(l)) => {
            // BookKeeper's LAC reaches the bookies with the writer's next add, so it lags the
            // writer's by one entry while the ledger is written.
            let l = l.map_or("none yet".into(), |e| e.to_string());
            writeln!(out, "  last add confirmed: {l} (open: read from the bookies, which learn it with the next add; the last entry and length are set at close)")?;
        }
        Some(Err(e)) => writeln!(
            out,
            "  last add confirmed: unknown (no bookie answered: {e})"
        )?,
    }
    writeln!(out, "  digest:      {:?}", meta.digest_type)?;
    let created = crate::stream::format_time_ms(meta.creation_time_ms);
    writeln!(out, "  created:     {created}")?;
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

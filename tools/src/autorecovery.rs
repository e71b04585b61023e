//! `quire autorecovery` (a standalone autorecovery daemon, and `status`) and the autorecovery
//! subcommands of `quire bookie` (`decommission`, `delete-cookie`): the command line, the
//! config-file overlay and the printing. The auditor, the replication worker and decommission
//! itself are the `quire-autorecovery` crate (bookie/autorecovery), which `quire bookie` also
//! runs inside every bookie.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use quire_autorecovery::decommission::{DecommissionError, DecommissionOptions, Progress};
use quire_metadata::{BookieId, ZkStore};
use tokio::sync::watch;

use crate::config::{MetadataAddress, MetadataArgs};

pub use quire_autorecovery::{AutorecoveryConfig, AutorecoveryMetrics, AutorecoveryOptions};

/// Runs an autorecovery daemon ([`quire_autorecovery::run_daemon`]) as `name` on ZooKeeper
/// sessions of its own at `address` until `stop` turns true.
pub async fn run_daemon(
    address: MetadataAddress,
    name: String,
    options: AutorecoveryOptions,
    metrics: AutorecoveryMetrics,
    stop: watch::Receiver<bool>,
) {
    let connect = move || {
        let address = address.clone();
        async move {
            let store: Arc<ZkStore> = address.connect_zk().await?;
            Ok(store)
        }
    };
    quire_autorecovery::run_daemon(connect, name, options, metrics, stop).await;
}

/// `quire autorecovery` options: run a standalone daemon, or `status`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AutorecoveryArgs {
    #[command(subcommand)]
    pub command: Option<AutorecoveryCommand>,
    /// TOML configuration file; every flag below overrides the key of the same name.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: crate::flags::AutorecoveryFlags,
}

/// `quire autorecovery` subcommands.
#[derive(Subcommand, Debug)]
pub enum AutorecoveryCommand {
    /// The auditor, the auditor candidates, the ledgers workers hold now, and every
    /// under-replicated ledger with its lost bookies and how long it has waited.
    Status(StatusArgs),
}

/// `quire autorecovery status` options.
#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub metadata: MetadataArgs,
    #[command(flatten)]
    pub output: crate::admin::OutputArgs,
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Runs `quire autorecovery`.
pub fn run(args: AutorecoveryArgs) -> Result<()> {
    if let Some(AutorecoveryCommand::Status(status_args)) = args.command {
        return status(status_args);
    }
    let keys = crate::config::keys_of(crate::config::AUTORECOVERY_KEYS);
    let file: crate::config::AutorecoveryFile =
        crate::config::load(args.config.as_deref(), &keys, &args.settings)?;
    let address = MetadataAddress::from_config(&file.zookeeper, &keys)?;
    file.autorecovery
        .validate()
        .map_err(|e| anyhow::anyhow!("{}", e.in_table("autorecovery")))?;
    let mut options = file.autorecovery.options();
    options.bookie_tls = match file.bookie_tls.resolve()? {
        Some(t) => Some(t.client_config()?),
        None => None,
    };
    let secret_file = file.cluster_secret_file.ok_or_else(|| {
        anyhow::anyhow!("missing setting cluster_secret_file: set it in the config file or with --cluster-secret-file")
    })?;
    options.cluster_secret = Some(crate::secret_file::read_cluster_secret(
        &secret_file,
        "cluster_secret_file",
    )?);
    let name = file
        .autorecovery
        .name
        .unwrap_or_else(|| format!("autorecovery-{}@{}", std::process::id(), hostname()));
    let metrics = AutorecoveryMetrics::default();
    let exposition = crate::metrics_http::Exposition::default();
    if let Some(listen) = file.metrics_listen {
        exposition.register(|r| metrics.register(r));
        exposition.register(crate::zk_metrics::register);
        let addr = crate::metrics_http::start(listen, exposition.clone())?;
        tracing::info!(%addr, "metrics endpoint listening");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let result = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        // Connect once up front, so that a wrong address fails at start with one line.
        drop(address.connect_zk().await?);
        let (stop_tx, stop_rx) = watch::channel(false);
        let daemon = tokio::spawn(run_daemon(address, name.clone(), options, metrics, stop_rx));
        exposition.set_serving(true);
        println!("quire autorecovery: {name} running");
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        exposition.set_serving(false);
        let _ = stop_tx.send(true);
        let _ = daemon.await;
        Ok::<_, anyhow::Error>(())
    });
    runtime.shutdown_timeout(Duration::from_secs(5));
    result
}

/// `quire autorecovery status`.
fn status(args: StatusArgs) -> Result<()> {
    crate::admin::with_zk_store(&args.metadata, async |store| {
        let state = store
            .autorecovery_state()
            .await
            .context("cannot read the autorecovery state")?;
        let marks = store
            .list_under_replicated()
            .await
            .context("cannot list under-replicated ledgers")?;
        let now = quire_clock::unix_ms();
        if args.output.json {
            let ledgers: Vec<serde_json::Value> = marks
                .iter()
                .map(|(id, m)| {
                    serde_json::json!({
                        "ledger": id.0,
                        "missing_bookies": m.value.missing_bookies,
                        "gaps_on": m.value.gaps_on,
                        "marked_at_ms": m.value.ctime_ms,
                        "waiting_ms": now.saturating_sub(m.value.ctime_ms),
                        "worker": state.locks.iter().find(|(l, _)| l == id).map(|(_, w)| w),
                    })
                })
                .collect();
            let workers: Vec<serde_json::Value> = state
                .locks
                .iter()
                .map(|(l, w)| serde_json::json!({ "ledger": l.0, "worker": w }))
                .collect();
            let doc = serde_json::json!({
                "auditor": state.candidates.first(),
                "candidates": state.candidates,
                "workers": workers,
                "under_replicated": ledgers,
            });
            println!("{}", serde_json::to_string_pretty(&doc)?);
            return Ok(());
        }
        use std::fmt::Write as _;
        let mut out = String::new();
        match state.candidates.first() {
            Some(a) => writeln!(out, "auditor: {a}")?,
            None => writeln!(out, "auditor: none (no autorecovery daemon runs)")?,
        }
        writeln!(out, "candidates: {}", state.candidates.join(", "))?;
        if state.locks.is_empty() {
            writeln!(out, "workers: idle")?;
        }
        for (l, w) in &state.locks {
            writeln!(out, "worker {w}: ledger {l}")?;
        }
        writeln!(out, "under-replicated ledgers: {}", marks.len())?;
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
                "  ledger {id}: missing {} (waiting {} s)",
                missing.join(" "),
                now.saturating_sub(m.value.ctime_ms) / 1000
            )?;
        }
        print!("{out}");
        Ok(())
    })
}

/// `quire bookie decommission` options.
#[derive(Args, Debug)]
pub struct DecommissionArgs {
    /// The bookie to retire (its id, `host:port`).
    pub bookie: String,
    /// Give up (the next run resumes) after this many seconds; default: wait as long as it
    /// takes.
    #[arg(long)]
    pub timeout_secs: Option<u64>,
    #[command(flatten)]
    pub metadata: MetadataArgs,
}

/// `quire bookie decommission BOOKIE` ([`quire_autorecovery::decommission::decommission`]):
/// prints its progress. Needs autorecovery daemons running (inside the bookies by default).
pub fn decommission(args: DecommissionArgs) -> Result<()> {
    crate::admin::with_zk_store(&args.metadata, async |store| {
        let id = BookieId(args.bookie.clone());
        let options = DecommissionOptions {
            timeout: args.timeout_secs.map(Duration::from_secs),
            ..DecommissionOptions::default()
        };
        let mut report = |p: Progress| {
            match p {
            Progress::Started { fresh } => println!(
                "decommissioning bookie {id} ({})",
                if fresh { "started" } else { "resumed" }
            ),
            Progress::NoDaemon => eprintln!("quire: warning: no autorecovery daemon runs; nothing copies the bookie's replicas until one does"),
            Progress::Remaining(naming) => println!("{naming} ledgers still name {id}"),
            Progress::NoReplacement { ledger, first_entry } => eprintln!("quire: warning: ledger {ledger}: no bookie can take the fragment from entry {first_entry} (every writable bookie is in its ensemble); it waits until another bookie registers"),
        }
        };
        quire_autorecovery::decommission::decommission(&*store, &id, options, &mut report)
            .await
            .map_err(cli_error)?;
        println!("bookie {id} decommissioned: no ledger names it and its cookie is deleted; stop it, and its disks can be reused");
        Ok(())
    })
}

/// A decommission error as one line (its metadata cause included).
fn cli_error(e: DecommissionError) -> anyhow::Error {
    match e {
        DecommissionError::Metadata { what, source } => anyhow::Error::new(source).context(what),
        other => anyhow::anyhow!("{other}"),
    }
}

/// `quire bookie delete-cookie` options.
#[derive(Args, Debug)]
pub struct DeleteCookieArgs {
    /// The bookie whose cookie to delete (its id, `host:port`).
    pub bookie: String,
    #[command(flatten)]
    pub metadata: MetadataArgs,
}

/// `quire bookie delete-cookie BOOKIE` ([`quire_autorecovery::decommission::delete_cookie`]).
///
/// # Errors
/// The bookie is registered (it runs: stop it first), it has no cookie, or ZooKeeper fails.
pub fn delete_cookie(args: DeleteCookieArgs) -> Result<()> {
    crate::admin::with_zk_store(&args.metadata, async |store| {
        let id = BookieId(args.bookie.clone());
        quire_autorecovery::decommission::delete_cookie(&*store, &id)
            .await
            .map_err(cli_error)?;
        println!("cookie of bookie {id} deleted: it can start on empty directories");
        Ok(())
    })
}

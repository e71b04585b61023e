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
    file.ledger
        .validate()
        .map_err(|e| anyhow::anyhow!("{}", e.in_table("ledger")))?;
    let mut options = file.autorecovery.options();
    options.placement = file.ledger.clone();
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
        let crate::cluster::Recovery { state, marks } =
            crate::cluster::read_recovery(&store).await?;
        let pending = quire_metadata::pending_decommissions(&*store)
            .await
            .context("cannot read the decommissions under way")?;
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
                "decommissions": pending,
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
        write_decommissions(&mut out, &pending, now)?;
        print!("{out}");
        Ok(())
    })
}

/// The decommissions under way, for `autorecovery status`'s text output.
fn write_decommissions(
    out: &mut String,
    pending: &[quire_metadata::PendingDecommission],
    now_ms: u64,
) -> std::fmt::Result {
    use std::fmt::Write as _;
    writeln!(out, "decommissions under way: {}", pending.len())?;
    for d in pending {
        writeln!(
            out,
            "  bookie {}: {} ledgers still name it, {} bytes copied off it, started {} s ago{}",
            d.bookie,
            d.ledgers_left,
            d.record.bytes_copied,
            now_ms.saturating_sub(d.record.start_ms) / 1000,
            if d.registered {
                " (still registered)"
            } else {
                ""
            }
        )?;
    }
    Ok(())
}

/// `quire bookie decommission` options.
#[derive(Args, Debug)]
pub struct DecommissionArgs {
    /// The bookie to retire (its id, `host:port`).
    pub bookie: String,
    /// Give up (the next run resumes) after this many seconds; default: wait as long as it
    /// takes.
    #[arg(long, conflicts_with = "cancel")]
    pub timeout_secs: Option<u64>,
    /// Cancel a decommission under way instead (one interrupted, or given up): the bookie
    /// registers again and takes new ledgers; replicas copied already stay where they went.
    #[arg(long)]
    pub cancel: bool,
    #[command(flatten)]
    pub metadata: MetadataArgs,
}

/// `quire bookie decommission BOOKIE` ([`quire_autorecovery::decommission::decommission`]):
/// refused up front (exit status 1, the reason in one line) when the remaining writable bookies
/// cannot hold an ensemble it must rewrite; otherwise prints its progress (ledgers left, bytes
/// copied, what it waits on). Needs autorecovery daemons running (inside the bookies by
/// default). Interrupted, it stays under way: a second run resumes, `--cancel` puts the bookie
/// back ([`quire_autorecovery::decommission::cancel`]).
pub fn decommission(args: DecommissionArgs) -> Result<()> {
    crate::admin::with_zk_store(&args.metadata, async |store| {
        let id = BookieId(args.bookie.clone());
        if args.cancel {
            quire_autorecovery::decommission::cancel(&*store, &id)
                .await
                .map_err(cli_error)?;
            println!("decommission of bookie {id} cancelled: it registers again within seconds and takes new ledgers");
            return Ok(());
        }
        let options = DecommissionOptions {
            timeout: args.timeout_secs.map(Duration::from_secs),
            ..DecommissionOptions::default()
        };
        let mut report = |p: Progress| print_progress(&id, p);
        let run =
            quire_autorecovery::decommission::decommission(&*store, &id, options, &mut report);
        let bytes = tokio::select! {
            r = run => r.map_err(cli_error)?,
            _ = tokio::signal::ctrl_c() => anyhow::bail!(
                "interrupted: the decommission of {id} stays under way (the bookie stays unregistered); run the command again to resume, or `quire bookie decommission --cancel {id}` to put it back"
            ),
        };
        println!("bookie {id} decommissioned: no ledger names it ({bytes} bytes copied off it) and its cookie is deleted; stop it, and its disks can be reused");
        Ok(())
    })
}

/// Prints one progress report of a decommission of `id`.
fn print_progress(id: &BookieId, p: Progress) {
    match p {
        Progress::Started { fresh } => println!(
            "decommissioning bookie {id} ({})",
            if fresh { "started" } else { "resumed" }
        ),
        Progress::NoDaemon => eprintln!("quire: warning: no autorecovery daemon runs; nothing copies the bookie's replicas until one does"),
        Progress::Remaining { ledgers, bytes_copied, open } => {
            let wait = if open > 0 {
                format!("; {open} of them open: left to their writers for open_ledger_rereplication_grace_period_ms, then recovered and copied")
            } else {
                String::new()
            };
            println!("{ledgers} ledgers still name {id}; {bytes_copied} bytes copied off it so far{wait}")
        }
        Progress::NoReplacement { ledger, first_entry } => eprintln!("quire: warning: ledger {ledger}: no bookie can take the fragment from entry {first_entry} (every writable bookie is in its ensemble); it waits until another bookie registers"),
    }
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

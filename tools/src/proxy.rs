//! `quire proxy`: one proxy process of a multi-process cluster.
//!
//! It connects to the metadata store (ZooKeeper), builds the ledger client and the
//! [`quire_proxy::StreamManager`], and serves the proxy protocol on its listen address until
//! SIGINT or SIGTERM. Its identity as a stream owner is its advertised address, which other
//! proxies name when they redirect a client.
//!
//! # SIGTERM drain
//! On SIGTERM or SIGINT it drains ([`quire_proxy::ProxyServer::drain`]): it stops accepting,
//! finishes and answers every write already handed to a stream, completes the open segment of
//! every stream it writes (so the next owner need not fence them), releases every stream lease
//! (so another proxy takes the streams at its next request, without waiting for the ZooKeeper
//! session to expire), refuses writes arriving meanwhile with `SERVICE_UNAVAILABLE` (not
//! written; safe to resend elsewhere), sends the last answers and exits 0. The drain is bounded
//! by `drain_timeout_ms` (`--drain-timeout-ms`, default 30000): past it, or at a second signal,
//! every connection is closed at once and the process exits with status 1. Nothing
//! acknowledged is lost either way: a segment left in progress is recovered (fenced) by the
//! next owner.
//!
//! If its ZooKeeper session expires, every stream lease it held is gone and another proxy may
//! already own those streams: it stops serving and exits with an error (a supervisor restarts
//! it with a new session). Writes it accepted but had not acknowledged fail; nothing it
//! acknowledged is lost, since the next owner recovers (fences) the segment it was writing.
//!
//! Streams are not recovered eagerly at start (unlike the sandbox): with several proxies, a
//! stream belongs to whichever proxy first takes a write for it, and that proxy recovers a
//! segment left in progress before its first write.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::config::{ProxyFile, ProxyOptions};

/// `quire proxy` options.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ProxyArgs {
    #[command(subcommand)]
    pub command: Option<ProxyCommand>,
    /// TOML configuration file; every flag below overrides the key of the same name.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: crate::flags::ProxyFlags,
}

/// `quire proxy` admin subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum ProxyCommand {
    /// List the proxies of the proxy registry: streams owned, write load and placement weight
    /// of each (every proxy with an advertised address registers; balancing, by hash and by
    /// load, is automatic with `[streams] balance_moves_per_sec` above 0).
    List(ProxyListArgs),
}

/// `quire proxy list` options.
#[derive(Args, Debug)]
pub struct ProxyListArgs {
    #[command(flatten)]
    pub metadata: crate::flags::ZooKeeperFlags,
    #[command(flatten)]
    pub output: crate::admin::OutputArgs,
}

/// Runs `quire proxy list`: one line per registered proxy (address, owned streams, write load
/// in bytes/s and records/s over its last ticks, capacity weight in load-aware placement, age
/// of its last heartbeat by this machine's clock), then the totals; `--json` prints the
/// records.
fn list(args: ProxyListArgs) -> Result<()> {
    use std::fmt::Write as _;
    crate::admin::with_store(&args.metadata, async |store| {
        let proxies = store.list_proxies().await.context("cannot list proxies")?;
        if args.output.json {
            println!("{}", serde_json::to_string_pretty(&proxies)?);
            return Ok(());
        }
        let now_ms = quire_clock::unix_ms();
        let mut out = String::new();
        for p in &proxies {
            let age = now_ms.saturating_sub(p.updated_ms);
            writeln!(
                out,
                "{} owned_streams={} write_bytes_per_sec={} write_records_per_sec={} \
                 weight={}.{:03} heartbeat={} updated={}.{:03}s ago{}",
                p.address,
                p.owned_streams,
                p.write_bytes_per_sec,
                p.write_records_per_sec,
                p.weight_milli / 1000,
                p.weight_milli % 1000,
                p.heartbeat,
                age / 1000,
                age % 1000,
                crate::cluster::labels(p.region.as_deref(), p.rack.as_deref())
            )?;
        }
        let owned: u64 = proxies.iter().map(|p| p.owned_streams).sum();
        let bytes: u64 = proxies.iter().map(|p| p.write_bytes_per_sec).sum();
        writeln!(
            out,
            "{} proxies registered, {owned} streams owned, {bytes} write bytes/s",
            proxies.len()
        )?;
        print!("{out}");
        Ok(())
    })
}

/// Runs `quire proxy`.
pub fn run(args: ProxyArgs) -> Result<()> {
    if let Some(ProxyCommand::List(a)) = args.command {
        return list(a);
    }
    let keys = crate::config::keys_of(crate::config::PROXY_KEYS);
    let file: ProxyFile = crate::config::load(args.config.as_deref(), &keys, &args.settings)?;
    let options = file.resolve()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let read_runtime = catch_up_read_runtime()?;
    let result = runtime.block_on(serve(options, read_runtime.handle()));
    runtime.shutdown_timeout(Duration::from_secs(5));
    read_runtime.shutdown_timeout(Duration::from_secs(5));
    result
}

/// The signals a proxy stops at.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Waits for SIGTERM or SIGINT.
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {},
            _ = self.int.recv() => {},
        }
    }
}

/// Serves until a signal (then drains) or the end of the ZooKeeper session (then exits with an
/// error).
async fn serve(options: ProxyOptions, read_runtime: &tokio::runtime::Handle) -> Result<()> {
    let mut signals = Signals::new()?;
    let zk = options.metadata.connect_zk().await?;
    let mut session_lost = zk.session_lost();
    let streams = stream_manager(&options, zk, read_runtime)?;
    let exposition = crate::metrics_http::Exposition::default();
    let metrics = start_metrics(&options, &streams, &exposition)?;
    let server = start_server(&options, &streams, read_runtime, metrics).await?;
    exposition.set_serving(true);
    print_listening(&options, server.local_addr())?;
    let lost = tokio::select! {
        _ = signals.recv() => false,
        r = session_lost.wait_for(|lost| *lost) => r.is_ok(),
    };
    exposition.set_serving(false);
    if lost {
        // Every lease of this session is gone and another proxy may own the streams now; the
        // stream tasks already refuse writes (ownership lost, or fenced at the bookies). Stop
        // serving and exit so that a supervisor restarts the proxy with a new session.
        server.shutdown();
        bail!(
            "ZooKeeper session expired: the stream ownerships of {} are lost; exiting",
            options.advertised
        );
    }
    drain(&options, &server, &streams, &mut signals).await
}

/// The ledger client (to the bookies, with TLS and the cluster secret) and the stream manager
/// on `zk`, owning streams as the advertised address.
fn stream_manager(
    options: &ProxyOptions,
    zk: std::sync::Arc<quire_metadata::ZkStore>,
    read_runtime: &tokio::runtime::Handle,
) -> Result<std::sync::Arc<quire_proxy::StreamManager>> {
    let store: std::sync::Arc<dyn quire_metadata::MetadataStore> = zk;
    let bookie_tls = match &options.bookie_tls {
        Some(t) => Some(t.client_config()?),
        None => None,
    };
    let bk = quire_ledger::BookKeeper::with_read_runtime(
        store.clone(),
        quire_ledger::ClientConfig {
            tls: bookie_tls,
            cluster_secret: Some(options.cluster_secret),
            placement: options.placement.clone(),
            region: options.labels.0.clone(),
            rack: options.labels.1.clone(),
            speculative_read_timeout: options.streams.speculative_read_timeout,
            max_speculative_read_timeout: options.streams.max_speculative_read_timeout,
            ..quire_ledger::ClientConfig::default()
        },
        read_runtime.clone(),
    );
    let mut config = options.streams.clone();
    config.owner_address = options.advertised.clone();
    config.owner_labels = options.labels.clone();
    Ok(quire_proxy::StreamManager::new(store, bk, config))
}

/// The `--metrics-listen` endpoint, when set, and the proxy's metrics it serves.
fn start_metrics(
    options: &ProxyOptions,
    streams: &std::sync::Arc<quire_proxy::StreamManager>,
    exposition: &crate::metrics_http::Exposition,
) -> Result<Option<std::sync::Arc<quire_proxy::ProxyMetrics>>> {
    let Some(listen) = options.metrics_listen else {
        return Ok(None);
    };
    let m = quire_proxy::ProxyMetrics::new();
    exposition.register(|r| m.register(r, streams.clone()));
    exposition.register(crate::zk_metrics::register);
    let addr = crate::metrics_http::start(listen, exposition.clone())?;
    tracing::info!(%addr, "metrics endpoint listening");
    Ok(Some(m))
}

/// Binds the listen address and starts the proxy server on it.
async fn start_server(
    options: &ProxyOptions,
    streams: &std::sync::Arc<quire_proxy::StreamManager>,
    read_runtime: &tokio::runtime::Handle,
    metrics: Option<std::sync::Arc<quire_proxy::ProxyMetrics>>,
) -> Result<quire_proxy::ProxyServer> {
    let server_tls = match &options.tls {
        Some(t) => Some(t.server_config()?),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("cannot listen on {}", options.listen))?;
    quire_proxy::ProxyServer::start(
        listener,
        streams.clone(),
        quire_proxy::ServerConfig {
            catch_up_read_runtime: Some(read_runtime.clone()),
            metrics,
            auth: options.auth.clone(),
            tls: server_tls,
            ..options.server.clone()
        },
    )
    .context("proxy server")
}

/// The line that says the proxy serves (tests and scripts wait for it).
fn print_listening(options: &ProxyOptions, addr: std::net::SocketAddr) -> Result<()> {
    use std::io::Write;
    let s = &options.streams;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "quire proxy: {} listening on {addr}{} (E={} Qw={} Qa={})",
        options.advertised,
        if options.tls.is_some() {
            " with TLS"
        } else {
            ""
        },
        s.ensemble_size,
        s.write_quorum,
        s.ack_quorum
    )?;
    out.flush()?;
    Ok(())
}

/// The SIGTERM drain, bounded by `drain_timeout_ms` and cut short by a second signal.
async fn drain(
    options: &ProxyOptions,
    server: &quire_proxy::ProxyServer,
    streams: &quire_proxy::StreamManager,
    signals: &mut Signals,
) -> Result<()> {
    eprintln!(
        "quire proxy: {} draining (at most {} ms)",
        options.advertised,
        options.drain_timeout.as_millis()
    );
    let started = quire_clock::now();
    let drained = tokio::select! {
        r = tokio::time::timeout(options.drain_timeout, server.drain(streams)) => r.ok(),
        _ = signals.recv() => None,
    };
    match drained {
        Some(r) => {
            r.context("draining: completing open segments")?;
            eprintln!(
                "quire proxy: {} drained in {} ms",
                options.advertised,
                quire_clock::elapsed(started).as_millis()
            );
            Ok(())
        }
        None => {
            server.shutdown();
            bail!(
                "drain of {} not finished after {} ms (timeout {} ms, or a second signal); closed every connection",
                options.advertised,
                quire_clock::elapsed(started).as_millis(),
                options.drain_timeout.as_millis()
            )
        }
    }
}

/// The proxy's catch-up read runtime: half the cores (at least one thread) at
/// [`quire_proxy::CATCH_UP_READ_NICE`], so that a scan of a backlog runs on what tail writes
/// leave over.
pub(crate) fn catch_up_read_runtime() -> Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    quire_proxy::catch_up_read_runtime((cores / 2).max(1), quire_proxy::CATCH_UP_READ_NICE)
        .context("cannot start the catch-up read runtime")
}

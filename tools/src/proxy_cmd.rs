//! `quire proxy`: one proxy process of a multi-process cluster.
//!
//! It connects to the metadata store (ZooKeeper), builds the ledger client and the
//! [`quire_proxy::StreamManager`], and serves the proxy protocol on its listen address until
//! SIGINT or SIGTERM; then it stops accepting, completes the open segment of every stream it
//! writes (so the next owner need not fence them) and exits. Its identity as a stream owner is
//! its advertised address, which other proxies name when they redirect a client.
//!
//! Streams are not recovered eagerly at start (unlike the sandbox): with several proxies, a
//! stream belongs to whichever proxy first takes a write for it, and that proxy recovers a
//! segment left in progress before its first write.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use crate::config::{ProxyOptions, ProxySettings};

/// `quire proxy` options.
#[derive(Args, Debug)]
pub struct ProxyArgs {
    /// TOML configuration file; every flag below overrides the key of the same name.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: ProxySettings,
}

/// Runs `quire proxy`.
pub fn run(args: ProxyArgs) -> Result<()> {
    let file: ProxySettings = crate::config::load(args.config.as_deref())?;
    let options = args.settings.merged(file).resolve()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let result = runtime.block_on(serve(options));
    runtime.shutdown_timeout(Duration::from_secs(5));
    result
}

async fn serve(options: ProxyOptions) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let store = options.metadata.connect().await?;
    let bk = quire_ledger::BookKeeper::new(store.clone(), quire_ledger::ClientConfig::default());
    let streams = quire_proxy::StreamManager::new(store, bk, options.streams.clone());
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("cannot listen on {}", options.listen))?;
    let server = quire_proxy::ProxyServer::start(listener, streams.clone(), quire_proxy::ServerConfig::default())
        .context("proxy server")?;
    {
        use std::io::Write;
        let s = &options.streams;
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "quire proxy: {} listening on {} (E={} Qw={} Qa={})",
            options.advertised,
            server.local_addr(),
            s.ensemble_size,
            s.write_quorum,
            s.ack_quorum
        )?;
        out.flush()?;
    }
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    eprintln!("quire proxy: {} stopping", options.advertised);
    server.shutdown();
    streams.shutdown().await.context("completing open segments")?;
    Ok(())
}

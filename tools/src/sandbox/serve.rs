//! The sandbox at work: the bookies' metadata questions answered from the embedded store,
//! their registrations kept in step with their read-only state, and the proxy served until
//! SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use quire_bookie::{Bookie, DeletedLedgersQueries};
use quire_metadata::{BookieId, BookieInfo, EmbeddedStore, MetadataStore};
use quire_proxy::StreamSettings;

use super::bookies::{sandbox_cluster_secret, sandbox_cluster_secret_file, sandbox_pki};
use super::SandboxArgs;

/// Keeps a bookie's registration's `read_only` flag equal to the bookie's state (the embedded
/// store's counterpart of moving a ZooKeeper registration between `available/` and
/// `readonly/`), so that new ledgers and ensemble changes avoid a bookie whose disk is full.
/// Runs until the bookie's state handle is gone or the task is aborted.
async fn follow_read_only(
    store: Arc<dyn MetadataStore>,
    mut info: BookieInfo,
    state: quire_bookie::ReadOnlyState,
    changes: flume::Receiver<bool>,
) {
    while changes.recv_async().await.is_ok() {
        while changes.try_recv().is_ok() {}
        info.read_only = state.is_read_only();
        // The embedded store does not fail a registration today; say so if it ever does.
        match store.register_bookie(info.clone()).await {
            Ok(()) => eprintln!(
                "quire sandbox: bookie {} is {}",
                info.id,
                if info.read_only {
                    "read-only (disk usage)"
                } else {
                    "writable again"
                }
            ),
            Err(e) => {
                tracing::warn!(bookie = %info.id, error = %e, "cannot update the registration")
            }
        }
    }
}

/// Serves until SIGINT or SIGTERM: answers the bookies' metadata questions, registers them,
/// starts the proxy on `args.listen` after recovering every stream's open segment, prints
/// where everything is, then stops the proxy and completes the open segments.
pub(super) async fn serve(
    args: &SandboxArgs,
    store: EmbeddedStore,
    bookies: &[Bookie],
    read_runtime: &tokio::runtime::Handle,
    queries: (DeletedLedgersQueries, quire_bookie::LedgerKeyQueries),
    exposition: &crate::metrics_http::Exposition,
    settings: &StreamSettings,
) -> Result<()> {
    let store: Arc<dyn MetadataStore> = Arc::new(store);
    spawn_metadata_answers(&store, queries);
    let followers = register_bookies(&store, bookies).await?;
    let tls = SandboxTls::new(args)?;
    let bk = quire_ledger::BookKeeper::with_read_runtime(
        store.clone(),
        quire_ledger::ClientConfig {
            tls: tls.bookie.clone(),
            cluster_secret: Some(sandbox_cluster_secret(args)?),
            ..quire_ledger::ClientConfig::default()
        },
        read_runtime.clone(),
    );
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let streams = quire_proxy::StreamManager::new(store, bk, stream_config(settings, addr));
    recover_streams(&streams).await?;
    let metrics = args.metrics_listen.map(|_| {
        let m = quire_proxy::ProxyMetrics::new();
        exposition.register(|r| m.register(r, streams.clone()));
        m
    });
    let server = quire_proxy::ProxyServer::start(
        listener,
        streams.clone(),
        quire_proxy::ServerConfig {
            catch_up_read_runtime: Some(read_runtime.clone()),
            metrics,
            tls: tls.proxy.clone(),
            ..quire_proxy::ServerConfig::default()
        },
    )
    .context("proxy server")?;
    // Before the address line: whoever read it sees /healthz answer 200.
    exposition.set_serving(true);
    print_serving(args, settings, bookies, tls.pki.as_ref(), addr)?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT")?,
        _ = term.recv() => {},
    }
    exposition.set_serving(false);
    eprintln!("quire sandbox: stopping");
    for f in followers {
        f.abort();
    }
    server.shutdown();
    streams
        .shutdown()
        .await
        .context("completing open segments")?;
    Ok(())
}

/// Answers the bookies' key and garbage-collection questions from the embedded store.
fn spawn_metadata_answers(
    store: &Arc<dyn MetadataStore>,
    (gc_queries, key_queries): (DeletedLedgersQueries, quire_bookie::LedgerKeyQueries),
) {
    // The embedded store has no session to lose: a "reconnection" is the same one again.
    let same = || -> crate::gc::Connect {
        let store = store.clone();
        Box::new(move || {
            let s = store.clone();
            Box::pin(async move { Ok(s) })
        })
    };
    tokio::spawn(crate::gc::answer_ledger_keys(
        key_queries,
        store.clone(),
        same(),
    ));
    tokio::spawn(crate::gc::answer_deleted_ledgers(
        gc_queries,
        store.clone(),
        same(),
    ));
}

/// Registers every bookie and keeps each registration's `read_only` flag in step
/// ([`follow_read_only`], the tasks returned).
async fn register_bookies(
    store: &Arc<dyn MetadataStore>,
    bookies: &[Bookie],
) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut followers = Vec::new();
    for b in bookies {
        let state = b.read_only_state();
        // Subscribed before the first registration, so that no transition is missed.
        let changes = state.subscribe();
        let info = BookieInfo {
            id: BookieId(b.addr().to_string()),
            rack: None,
            region: None,
            read_only: state.is_read_only(),
        };
        store.register_bookie(info.clone()).await?;
        followers.push(tokio::spawn(follow_read_only(
            store.clone(),
            info,
            state,
            changes,
        )));
    }
    Ok(followers)
}

/// With `--tls`, the sandbox's files and what the proxy presents: to the bookies (mutual TLS,
/// the sandbox certificate) and to its clients (client certificates required).
struct SandboxTls {
    pki: Option<quire_tls::gen::PkiFiles>,
    bookie: Option<Arc<quire_tls::rustls::ClientConfig>>,
    proxy: Option<Arc<quire_tls::rustls::ServerConfig>>,
}

impl SandboxTls {
    fn new(args: &SandboxArgs) -> Result<Self> {
        if !args.tls {
            return Ok(Self {
                pki: None,
                bookie: None,
                proxy: None,
            });
        }
        let p = sandbox_pki(args)?;
        let bookie = quire_tls::ClientTls {
            ca_file: p.ca_file.clone(),
            cert_file: Some(p.cert_file.clone()),
            key_file: Some(p.key_file.clone()),
        }
        .client_config()?;
        let proxy = quire_tls::ServerTls {
            cert_file: p.cert_file.clone(),
            key_file: p.key_file.clone(),
            ca_file: Some(p.ca_file.clone()),
            client_auth: quire_tls::ClientAuth::Require,
        }
        .server_config()?;
        Ok(Self {
            pki: Some(p),
            bookie: Some(bookie),
            proxy: Some(proxy),
        })
    }
}

/// The stream keys given as flags over the proxy's defaults ([`StreamSettings`], the `[streams]`
/// table of `quire proxy`), checked: a quorum breaking E >= Qw >= Qa >= 1 or a size out of range
/// is one line naming the key, before anything starts (it was a panic once the bookies ran).
pub(super) fn stream_settings(args: &SandboxArgs) -> Result<StreamSettings> {
    let d = StreamSettings::default();
    let s = StreamSettings {
        ensemble_size: args.ensemble_size.unwrap_or(d.ensemble_size),
        write_quorum: args.write_quorum.unwrap_or(d.write_quorum),
        ack_quorum: args.ack_quorum.unwrap_or(d.ack_quorum),
        segment_size_bytes: args.segment_size_bytes.unwrap_or(d.segment_size_bytes),
        entry_size_bytes: args.entry_size_bytes.unwrap_or(d.entry_size_bytes),
        segment_roll_secs: args.segment_roll_secs.unwrap_or(d.segment_roll_secs),
        retention_time_secs: args.retention_time_secs.or(d.retention_time_secs),
        retention_size_bytes: args.retention_size_bytes.or(d.retention_size_bytes),
        lifecycle_sweep_secs: args.lifecycle_sweep_secs.unwrap_or(d.lifecycle_sweep_secs),
        txid_jump_max: args.txid_jump_max.unwrap_or(d.txid_jump_max),
        ..d
    };
    s.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(s)
}

/// The stream configuration of `settings`, owner `addr`.
fn stream_config(settings: &StreamSettings, addr: SocketAddr) -> quire_proxy::StreamConfig {
    let mut config = quire_proxy::StreamConfig {
        owner_address: addr.to_string(),
        ..quire_proxy::StreamConfig::default()
    };
    settings.apply(&mut config);
    config
}

/// Recovers the segments a crash left in progress before taking traffic, so that problems
/// surface at start rather than at a first write. One stream that cannot be recovered is
/// reported and stays unavailable, but does not keep the others from being served.
async fn recover_streams(streams: &quire_proxy::StreamManager) -> Result<()> {
    for name in streams.list_streams().await.context("listing streams")? {
        if let Err(e) = streams
            .read(
                &name,
                quire_client::ReadPosition::Head,
                1,
                1,
                Duration::ZERO,
            )
            .await
        {
            eprintln!("quire sandbox: stream {name:?} is unavailable: {e}");
        }
    }
    Ok(())
}

/// The lines that say where the bookies, the secret, the TLS files and the proxy are (the
/// last one, with the proxy's address, is what tests and scripts wait for).
fn print_serving(
    args: &SandboxArgs,
    settings: &StreamSettings,
    bookies: &[Bookie],
    pki: Option<&quire_tls::gen::PkiFiles>,
    addr: SocketAddr,
) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let bookie_list: Vec<String> = bookies.iter().map(|b| b.addr().to_string()).collect();
    writeln!(
        out,
        "quire sandbox: bookies {} (E={} Qw={} Qa={})",
        bookie_list.join(" "),
        settings.ensemble_size,
        settings.write_quorum,
        settings.ack_quorum
    )?;
    writeln!(
        out,
        "quire sandbox: bookies admit only holders of the cluster secret in {} (--cluster-secret-file)",
        sandbox_cluster_secret_file(&args.data_dir).display()
    )?;
    if let Some(p) = pki {
        writeln!(
            out,
            "quire sandbox: TLS on, client certificates required: --tls-ca-file {} --tls-cert-file {} --tls-key-file {}",
            p.ca_file.display(),
            p.cert_file.display(),
            p.key_file.display()
        )?;
    }
    writeln!(out, "quire sandbox: proxy listening on {addr}")?;
    out.flush()?;
    Ok(())
}

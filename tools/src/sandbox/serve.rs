//! The sandbox at work: the bookies' metadata questions answered from the embedded store,
//! their registrations kept in step with their read-only state, and the proxy served until
//! SIGINT or SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use quire_bookie::{Bookie, DeletedLedgersQueries};
use quire_metadata::{BookieId, BookieInfo, EmbeddedStore, MetadataStore};

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

pub(super) async fn serve(
    args: &SandboxArgs,
    store: EmbeddedStore,
    bookies: &[Bookie],
    read_runtime: &tokio::runtime::Handle,
    (gc_queries, key_queries): (DeletedLedgersQueries, quire_bookie::LedgerKeyQueries),
    exposition: &crate::metrics_http::Exposition,
) -> Result<()> {
    let store: Arc<dyn MetadataStore> = Arc::new(store);
    let keys_store = store.clone();
    tokio::spawn(crate::gc::answer_ledger_keys(
        key_queries,
        store.clone(),
        Box::new(move || {
            let s = keys_store.clone();
            Box::pin(async move { Ok(s) })
        }),
    ));
    let gc_store = store.clone();
    tokio::spawn(crate::gc::answer_deleted_ledgers(
        gc_queries,
        store.clone(),
        Box::new(move || {
            // The embedded store has no session to lose: the same one again.
            let s = gc_store.clone();
            Box::pin(async move { Ok(s) })
        }),
    ));
    let mut followers = Vec::new();
    for b in bookies {
        let state = b.read_only_state();
        // Subscribed before the first registration, so that no transition is missed.
        let changes = state.subscribe();
        let info = BookieInfo {
            id: BookieId(b.addr().to_string()),
            rack: None,
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
    // With --tls the proxy presents the sandbox certificate to the bookies (mutual TLS).
    let pki = if args.tls {
        Some(sandbox_pki(args)?)
    } else {
        None
    };
    let bookie_tls = match &pki {
        Some(p) => Some(
            quire_tls::ClientTls {
                ca_file: p.ca_file.clone(),
                cert_file: Some(p.cert_file.clone()),
                key_file: Some(p.key_file.clone()),
            }
            .client_config()?,
        ),
        None => None,
    };
    let proxy_tls = match &pki {
        Some(p) => Some(
            quire_tls::ServerTls {
                cert_file: p.cert_file.clone(),
                key_file: p.key_file.clone(),
                ca_file: Some(p.ca_file.clone()),
                client_auth: quire_tls::ClientAuth::Require,
            }
            .server_config()?,
        ),
        None => None,
    };
    let bk = quire_ledger::BookKeeper::with_read_runtime(
        store.clone(),
        quire_ledger::ClientConfig {
            tls: bookie_tls,
            cluster_secret: Some(sandbox_cluster_secret(args)?),
            ..quire_ledger::ClientConfig::default()
        },
        read_runtime.clone(),
    );
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let config = quire_proxy::StreamConfig {
        owner_address: addr.to_string(),
        ensemble_size: args.ensemble_size,
        write_quorum: args.write_quorum,
        ack_quorum: args.ack_quorum,
        segment_size_bytes_max: args.segment_size_bytes,
        entry_size_bytes_target: args.entry_size_bytes,
        segment_roll_interval: (args.segment_roll_secs > 0)
            .then(|| Duration::from_secs(args.segment_roll_secs)),
        retention_time: args.retention_time_secs.map(Duration::from_secs),
        retention_size_bytes: args.retention_size_bytes,
        lifecycle_sweep_interval: (args.lifecycle_sweep_secs > 0)
            .then(|| Duration::from_secs(args.lifecycle_sweep_secs)),
        txid_jump_max: (args.txid_jump_max > 0).then_some(args.txid_jump_max),
        ..quire_proxy::StreamConfig::default()
    };
    let streams = quire_proxy::StreamManager::new(store, bk, config);
    // Recover segments a crash left in progress before taking traffic, so that problems
    // surface at start rather than at a first write.
    // Recover each stream's in-progress segment now; one stream that cannot be recovered is
    // reported and stays unavailable, but does not keep the others from being served.
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
            tls: proxy_tls,
            ..quire_proxy::ServerConfig::default()
        },
    )
    .context("proxy server")?;
    // Before the address line: whoever read it sees /healthz answer 200.
    exposition.set_serving(true);
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let bookie_list: Vec<String> = bookies.iter().map(|b| b.addr().to_string()).collect();
        writeln!(
            out,
            "quire sandbox: bookies {} (E={} Qw={} Qa={})",
            bookie_list.join(" "),
            args.ensemble_size,
            args.write_quorum,
            args.ack_quorum
        )?;
        writeln!(
            out,
            "quire sandbox: bookies admit only holders of the cluster secret in {} (--cluster-secret-file)",
            sandbox_cluster_secret_file(&args.data_dir).display()
        )?;
        if let Some(p) = &pki {
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
    }
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

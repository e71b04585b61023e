//! `quire bookie` (no subcommand): one bookie process of a multi-process cluster.
//!
//! Lifecycle:
//! 1. read the configuration ([`crate::config::BookieFile`]);
//! 2. connect to the metadata store (ZooKeeper);
//! 3. check the bookie's cookie ([`super::cookie::check_cookie`], BookKeeper's `Cookie` rules)
//!    and write it on first start;
//! 4. start the bookie server ([`quire_bookie::Bookie::start`]);
//! 5. register in the bookie registry (an ephemeral znode: it disappears with the session),
//!    under `available/` or, when its disks are full, `readonly/` (BookKeeper's
//!    `available/readonly`);
//! 6. unless `autorecovery_enabled = false`, run an autorecovery daemon (auditor candidate and
//!    replication worker, [`crate::autorecovery`]) on a ZooKeeper session of its own;
//! 7. serve until SIGINT or SIGTERM, moving the registration whenever the bookie turns
//!    read-only or writable again ([`quire_bookie::ReadOnlyState`]) and re-registering if the
//!    registration disappears (ZooKeeper session expiry), staying out of the registry while a
//!    decommission of it is under way and coming back when it is cancelled, then unregister
//!    and shut the server down cleanly.
//!
//! On session loss the bookie keeps serving and registers again with a new session, as
//! BookKeeper's bookie does (its registration manager re-registers on `SessionExpired`): the
//! registration only steers the placement of new ledgers, while the correctness of writes to
//! existing ledgers rests on fencing, which the bookie enforces from its own durable state,
//! never from ZooKeeper. Stopping writes instead would turn a ZooKeeper hiccup into a lost
//! replica for every ledger whose ensemble holds this bookie, forcing ensemble changes.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use quire_metadata::{BookieId, BookieInfo, MetadataStore, ZkStore};

use crate::config::{BookieFile, BookieOptions, MetadataAddress};

/// Runs one bookie from `config` (if any) with `flags` over it, until SIGINT or SIGTERM.
pub fn run(config: Option<&Path>, flags: &crate::flags::BookieFlags) -> Result<()> {
    let keys = crate::config::keys_of(crate::config::BOOKIE_KEYS);
    let file: BookieFile = crate::config::load(config, &keys, flags)?;
    let options = file.resolve()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let result = serve(&runtime, options);
    runtime.shutdown_timeout(Duration::from_secs(5));
    result
}

/// Steps 2 to 7 of the lifecycle (module doc) on `runtime`.
fn serve(runtime: &tokio::runtime::Runtime, options: BookieOptions) -> Result<()> {
    let id = BookieId(options.advertised.clone());
    // Signal handlers first, so that a SIGTERM during start is seen rather than fatal.
    let signals = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        Ok::<_, std::io::Error>((
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        ))
    })?;
    let store = runtime.block_on(options.metadata.connect_zk())?;
    let journal_dir = options.bookie.journal_dir.clone();
    let ledger_dir = options.bookie.ledger_dir.clone();
    let outcome = runtime.block_on(super::cookie::check_cookie(
        &*store,
        &id,
        &journal_dir,
        &ledger_dir,
    ))?;
    tracing::info!(bookie = %id, ?outcome, "cookie checked");
    let mut bookie_config = options.bookie.clone();
    spawn_metadata_answers(runtime, &options.metadata, &store, &mut bookie_config);
    let (damaged, reports) = quire_bookie::damaged_ledgers_channel();
    bookie_config.scrub.damaged_ledgers = Some(damaged);
    runtime.spawn(super::scrub::mark_damaged_ledgers(
        reports,
        store.clone(),
        options.metadata.clone(),
        id.clone(),
    ));
    // The endpoint comes up before the bookie so that /healthz says 503 during replay.
    let exposition = crate::metrics_http::Exposition::default();
    let autorecovery_metrics = crate::autorecovery::AutorecoveryMetrics::default();
    let metrics = match options.metrics_listen {
        Some(listen) => {
            let m = quire_bookie::metrics::BookieMetrics::new();
            exposition.register(|r| m.register(r));
            exposition.register(crate::zk_metrics::register);
            if options.autorecovery.is_some() {
                exposition.register(|r| autorecovery_metrics.register(r));
            }
            bookie_config.metrics = Some(m.for_bookie(&id.0, bookie_config.shards));
            let addr = crate::metrics_http::start(listen, exposition.clone())?;
            tracing::info!(%addr, "metrics endpoint listening");
            Some(m)
        }
        None => None,
    };
    let bookie = quire_bookie::Bookie::start(bookie_config)
        .with_context(|| format!("bookie {id} did not start"))?;
    if let Some(m) = &metrics {
        m.add_status(&id.0, bookie.status());
    }
    let running = Running {
        options: &options,
        id: &id,
        store,
        bookie: &bookie,
        exposition: &exposition,
        autorecovery_metrics,
    };
    let served = runtime.block_on(running.serve(signals));
    let stopped = bookie.shutdown().context("bookie shutdown");
    served?;
    stopped
}

/// Starts answering the shards' metadata questions (`config`'s channels) on `runtime`:
/// garbage collection's "which ledgers are deleted" and, before a key binds, "does the ledger
/// exist with that key" (issue 24). Both use `store`'s session (ZooKeeper pipelines its
/// requests, so GC's sweep does not hold up a first add) and a new one after a failed read
/// (e.g. an expired session).
fn spawn_metadata_answers(
    runtime: &tokio::runtime::Runtime,
    address: &MetadataAddress,
    store: &Arc<ZkStore>,
    config: &mut quire_bookie::BookieConfig,
) {
    let reconnect = || -> crate::gc::Connect {
        let address = address.clone();
        Box::new(move || {
            let address = address.clone();
            Box::pin(async move {
                let s: Arc<dyn MetadataStore> = address.connect_zk().await?;
                Ok(s)
            })
        })
    };
    let (gc, gc_queries) = quire_bookie::deleted_ledgers_channel();
    config.gc_deleted_ledgers = Some(gc);
    let gc_store: Arc<dyn MetadataStore> = store.clone();
    runtime.spawn(crate::gc::answer_deleted_ledgers(
        gc_queries,
        gc_store,
        reconnect(),
    ));
    let (keys, key_queries) = quire_bookie::ledger_keys_channel();
    config.ledger_keys = Some(keys);
    let keys_store: Arc<dyn MetadataStore> = store.clone();
    runtime.spawn(crate::gc::answer_ledger_keys(
        key_queries,
        keys_store,
        reconnect(),
    ));
}

/// A started bookie, from its registration to its unregistration.
struct Running<'a> {
    options: &'a BookieOptions,
    id: &'a BookieId,
    store: Arc<ZkStore>,
    bookie: &'a quire_bookie::Bookie,
    exposition: &'a crate::metrics_http::Exposition,
    autorecovery_metrics: crate::autorecovery::AutorecoveryMetrics,
}

impl Running<'_> {
    /// Registers the bookie, says it serves, keeps the registration ([`keep_registered`]) and
    /// runs autorecovery until SIGTERM or SIGINT (`signals`), then stops both and unregisters.
    async fn serve(
        self,
        (mut term, mut int): (tokio::signal::unix::Signal, tokio::signal::unix::Signal),
    ) -> Result<()> {
        let (id, store) = (self.id, &self.store);
        // Subscribed before the state is read, so that no transition falls between the two.
        let read_only = self.bookie.read_only_state();
        let changes = read_only.subscribe();
        let info = BookieInfo {
            id: id.clone(),
            rack: self.options.rack.clone(),
            region: self.options.region.clone(),
            read_only: read_only.is_read_only(),
        };
        store
            .register_bookie(info.clone())
            .await
            .with_context(|| format!("cannot register bookie {id}"))?;
        // Before the "serving" line: whoever read it sees /healthz answer 200.
        self.exposition.set_serving(true);
        self.print_serving(info.read_only)?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let keeper = tokio::spawn(keep_registered(
            store.clone(),
            self.options.metadata.clone(),
            info,
            (read_only, changes),
            stop_rx.clone(),
        ));
        let autorecovery = self.spawn_autorecovery(stop_rx);
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        self.exposition.set_serving(false);
        eprintln!("quire bookie: {id} stopping");
        let _ = stop_tx.send(true);
        if let Some(task) = autorecovery {
            // Its session closes as it ends, handing the auditor role over at once.
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        let store = keeper.await.unwrap_or_else(|_| store.clone());
        // Unregister first, so that no new ledger picks a bookie that is going away.
        match store.unregister_bookie(id).await {
            Ok(()) | Err(quire_metadata::Error::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(bookie = %id, error = %e, "unregister failed; the session's end removes it")
            }
        }
        Ok(())
    }

    /// The line that says the bookie serves (tests and scripts wait for it).
    fn print_serving(&self, read_only: bool) -> Result<()> {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let mode = if read_only {
            " (read-only: disk usage)"
        } else {
            ""
        };
        let (id, addr) = (self.id, self.bookie.addr());
        writeln!(out, "quire bookie: {id} serving on {addr}{mode}")?;
        out.flush()?;
        Ok(())
    }

    /// The autorecovery daemon, unless disabled. It runs on a ZooKeeper session of its own, so
    /// that its election node and locks live and die independently of the registration's
    /// session.
    fn spawn_autorecovery(
        &self,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let options = self.options.autorecovery.clone()?;
        Some(tokio::spawn(crate::autorecovery::run_daemon(
            self.options.metadata.clone(),
            self.id.0.clone(),
            options,
            self.autorecovery_metrics.clone(),
            stop,
        )))
    }
}

/// Registers the bookie again under `available` or `readonly` as `info.read_only` says;
/// whether that worked (else the caller retries in a second).
async fn move_registration(store: &ZkStore, info: &BookieInfo) -> bool {
    let dir = if info.read_only {
        "readonly"
    } else {
        "available"
    };
    match store.register_bookie(info.clone()).await {
        Ok(()) => {
            eprintln!("quire bookie: {} registered under {dir}", info.id);
            true
        }
        Err(e) => {
            tracing::warn!(bookie = %info.id, error = %e, "cannot move the registration to {dir}; retrying");
            false
        }
    }
}

/// Keeps the registration alive and in the right directory until told to stop; returns the
/// store in use then.
///
/// When the bookie turns read-only or writable again, it registers again with the new
/// `read_only` flag, which moves the ephemeral node between `available/` and `readonly/`
/// (BookKeeper's `RegistrationManager.registerBookie(id, readOnly)`); a failed move is retried
/// every second. When the ZooKeeper session expires, the ephemeral registration is gone: it
/// connects a new store (a new session), retrying every second, and registers again with the
/// current state. It also follows its decommission record ([`super::decommission::follow`]:
/// out while one is under way, back once it is cancelled) when a ZooKeeper watch on the
/// records fires, and once at start and after each new session.
/// The bookie serves throughout.
async fn keep_registered(
    mut store: Arc<ZkStore>,
    address: MetadataAddress,
    mut info: BookieInfo,
    (state, changes): (quire_bookie::ReadOnlyState, flume::Receiver<bool>),
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Arc<ZkStore> {
    let mut retry_move = false;
    // The ZooKeeper watch on the decommission records; `None`: to be armed (and the record
    // followed) before waiting.
    let mut records: Option<super::decommission::RecordWatch> = None;
    loop {
        if records.is_none() {
            info.read_only = state.is_read_only();
            records = Some(super::decommission::arm_and_follow(&store, &info).await);
        }
        let mut lost = store.session_lost();
        let record_changed = records.as_mut().expect("armed above");
        // `None`: a decommission record was created or deleted (followed outside the select,
        // whose output holds a non-Send watch guard).
        let wake = tokio::select! {
            _ = stop.changed() => return store,
            r = lost.wait_for(|lost| *lost) => {
                if r.is_err() {
                    return store;
                }
                Some(false)
            }
            r = changes.recv_async() => {
                if r.is_err() {
                    // The bookie is gone; nothing will change any more.
                    return store;
                }
                Some(true)
            }
            _ = tokio::time::sleep(Duration::from_secs(1)), if retry_move => Some(true),
            _ = record_changed => None,
        };
        let Some(moved) = wake else {
            records = None;
            continue;
        };
        if moved {
            // Several transitions may be queued; the current state is what counts.
            while changes.try_recv().is_ok() {}
            info.read_only = state.is_read_only();
            retry_move = !move_registration(&store, &info).await;
            // A decommissioned bookie registered again by the move goes out again.
            records = None;
            continue;
        }
        eprintln!(
            "quire bookie: {}: ZooKeeper session expired; registering again with a new session",
            info.id
        );
        loop {
            info.read_only = state.is_read_only();
            let attempt = async {
                let fresh = address.connect_zk().await?;
                fresh
                    .register_bookie(info.clone())
                    .await
                    .context("register")?;
                Ok::<_, anyhow::Error>(fresh)
            };
            tokio::select! {
                _ = stop.changed() => return store,
                r = attempt => match r {
                    Ok(fresh) => {
                        store = fresh;
                        retry_move = false;
                        // The old session's watch is gone: armed again on the new one.
                        records = None;
                        eprintln!("quire bookie: {} registered again", info.id);
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(bookie = %info.id, error = %format!("{e:#}"), "re-registration failed; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                },
            }
        }
    }
}

//! `quire bookie`: one bookie process of a multi-process cluster.
//!
//! Lifecycle:
//! 1. read the configuration ([`crate::config::BookieFile`]);
//! 2. connect to the metadata store (ZooKeeper);
//! 3. check the bookie's cookie ([`check_cookie`], BookKeeper's `Cookie` rules) and write it on
//!    first start;
//! 4. start the bookie server ([`quire_bookie::Bookie::start`]);
//! 5. register in the bookie registry (an ephemeral znode: it disappears with the session),
//!    under `available/` or, when its disks are full, `readonly/` (BookKeeper's
//!    `available/readonly`);
//! 6. unless `autorecovery_enabled = false`, run an autorecovery daemon (auditor candidate and
//!    replication worker, [`crate::autorecovery`]) on a ZooKeeper session of its own;
//! 7. serve until SIGINT or SIGTERM, moving the registration whenever the bookie turns
//!    read-only or writable again ([`quire_bookie::ReadOnlyState`]) and re-registering if the
//!    registration disappears (ZooKeeper session expiry), then unregister and shut the server
//!    down cleanly.
//!
//! On session loss the bookie keeps serving and registers again with a new session, as
//! BookKeeper's bookie does (its registration manager re-registers on `SessionExpired`): the
//! registration only steers the placement of new ledgers, while the correctness of writes to
//! existing ledgers rests on fencing, which the bookie enforces from its own durable state,
//! never from ZooKeeper. Stopping writes instead would turn a ZooKeeper hiccup into a lost
//! replica for every ledger whose ensemble holds this bookie, forcing ensemble changes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use quire_metadata::{BookieId, BookieInfo, Cookie, MetadataStore, ZkStore, COOKIE_FORMAT_VERSION};

use crate::config::{BookieFile, BookieOptions, MetadataAddress};

/// Name of the cookie file kept in the journal directory and in the ledger directory.
pub const COOKIE_FILE: &str = "COOKIE";

/// `quire bookie` options: run a bookie, or an admin subcommand.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BookieArgs {
    #[command(subcommand)]
    pub command: Option<BookieCommand>,
    /// TOML configuration file; every flag below overrides the key of the same name.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: crate::flags::BookieFlags,
}

/// `quire bookie` admin subcommands.
#[derive(Subcommand, Debug)]
pub enum BookieCommand {
    /// List registered bookies (read-only ones marked).
    List(crate::admin::BookieListArgs),
    /// Ask one bookie, over the bookie protocol, for its state, shards, ledgers and disk use.
    Info(InfoArgs),
    /// Retire a bookie that is still up: its replicas are copied to other bookies by
    /// autorecovery, then its cookie is deleted. Shows progress; a second run resumes.
    Decommission(crate::autorecovery::DecommissionArgs),
    /// Delete a stopped bookie's cookie from ZooKeeper, so that it can start again on wiped
    /// or new disks; autorecovery then copies its replicas back to it.
    DeleteCookie(crate::autorecovery::DeleteCookieArgs),
}

/// `quire bookie info` options.
#[derive(Args, Debug)]
pub struct InfoArgs {
    /// The bookie's address (host:port, its bookie id).
    pub addr: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// TLS to the bookie.
    #[command(flatten)]
    pub bookie_tls: crate::tls::BookieTlsArgs,
}

/// Runs `quire bookie`.
pub fn run(args: BookieArgs) -> Result<()> {
    match args.command {
        Some(BookieCommand::List(list)) => return crate::admin::bookie_list(list),
        Some(BookieCommand::Info(info)) => return bookie_info(info),
        Some(BookieCommand::Decommission(d)) => return crate::autorecovery::decommission(d),
        Some(BookieCommand::DeleteCookie(d)) => return crate::autorecovery::delete_cookie(d),
        None => {}
    }
    let keys = crate::config::keys_of(crate::config::BOOKIE_KEYS);
    let file: BookieFile = crate::config::load(args.config.as_deref(), &keys, &args.settings)?;
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

fn serve(runtime: &tokio::runtime::Runtime, options: BookieOptions) -> Result<()> {
    let id = BookieId(options.advertised.clone());
    // Signal handlers first, so that a SIGTERM during start is seen rather than fatal.
    let (mut term, mut int) = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        Ok::<_, std::io::Error>((
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        ))
    })?;
    let store = runtime.block_on(options.metadata.connect_zk())?;
    let journal_dir = options.bookie.journal_dir.clone();
    let ledger_dir = options.bookie.ledger_dir.clone();
    let outcome = runtime.block_on(check_cookie(&*store, &id, &journal_dir, &ledger_dir))?;
    tracing::info!(bookie = %id, ?outcome, "cookie checked");

    // Garbage collection asks the metadata store which ledgers are deleted, on a connection
    // of its own (a new one after a failed read, e.g. an expired session).
    let (gc, gc_queries) = quire_bookie::deleted_ledgers_channel();
    let mut bookie_config = options.bookie.clone();
    bookie_config.gc_deleted_ledgers = Some(gc);
    let gc_address = options.metadata.clone();
    let gc_store: Arc<dyn MetadataStore> = store.clone();
    runtime.spawn(crate::gc::answer_deleted_ledgers(
        gc_queries,
        gc_store,
        Box::new(move || {
            let address = gc_address.clone();
            Box::pin(async move {
                let s: Arc<dyn MetadataStore> = address.connect_zk().await?;
                Ok(s)
            })
        }),
    ));
    // Before a key binds, shards ask whether the ledger exists with that key (issue 24), on
    // the same session (ZooKeeper pipelines its requests, so GC's sweep does not hold up a
    // first add) and on a new one after a failed read.
    let (keys, key_queries) = quire_bookie::ledger_keys_channel();
    bookie_config.ledger_keys = Some(keys);
    let keys_address = options.metadata.clone();
    let keys_store: Arc<dyn MetadataStore> = store.clone();
    runtime.spawn(crate::gc::answer_ledger_keys(
        key_queries,
        keys_store,
        Box::new(move || {
            let address = keys_address.clone();
            Box::pin(async move {
                let s: Arc<dyn MetadataStore> = address.connect_zk().await?;
                Ok(s)
            })
        }),
    ));
    // The endpoint comes up before the bookie so that /healthz says 503 during replay.
    let exposition = crate::metrics_http::Exposition::default();
    let autorecovery_metrics = crate::autorecovery::AutorecoveryMetrics::default();
    let metrics = match options.metrics_listen {
        Some(listen) => {
            let m = quire_bookie::metrics::BookieMetrics::new();
            exposition.register(|r| m.register(r));
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
    // Subscribed before the state is read, so that no transition falls between the two.
    let read_only = bookie.read_only_state();
    let changes = read_only.subscribe();
    let info = BookieInfo {
        id: id.clone(),
        rack: options.rack.clone(),
        read_only: read_only.is_read_only(),
    };
    let served = runtime.block_on(async {
        store.register_bookie(info.clone()).await.with_context(|| format!("cannot register bookie {id}"))?;
        // Before the "serving" line: whoever read it sees /healthz answer 200.
        exposition.set_serving(true);
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let mode = if info.read_only { " (read-only: disk usage)" } else { "" };
            writeln!(out, "quire bookie: {id} serving on {}{mode}", bookie.addr())?;
            out.flush()?;
        }
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stop_rx_autorecovery = stop_rx.clone();
        let keeper = tokio::spawn(keep_registered(
            store.clone(),
            options.metadata.clone(),
            info.clone(),
            (read_only, changes),
            stop_rx,
        ));
        // Autorecovery runs on a ZooKeeper session of its own, so that its election node and
        // locks live and die independently of the registration's session.
        let autorecovery = options.autorecovery.clone().map(|o| {
            tokio::spawn(crate::autorecovery::run_daemon(
                options.metadata.clone(),
                id.0.clone(),
                o,
                autorecovery_metrics.clone(),
                stop_rx_autorecovery,
            ))
        });
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        exposition.set_serving(false);
        eprintln!("quire bookie: {id} stopping");
        let _ = stop_tx.send(true);
        if let Some(task) = autorecovery {
            // Its session closes as it ends, handing the auditor role over at once.
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        let store = keeper.await.unwrap_or_else(|_| store.clone());
        // Unregister first, so that no new ledger picks a bookie that is going away.
        match store.unregister_bookie(&id).await {
            Ok(()) | Err(quire_metadata::Error::NotFound { .. }) => {}
            Err(e) => tracing::warn!(bookie = %id, error = %e, "unregister failed; the session's end removes it"),
        }
        Ok::<_, anyhow::Error>(())
    });
    let stopped = bookie.shutdown().context("bookie shutdown");
    served?;
    stopped
}

/// How long `quire bookie info` waits to connect, and then for each answer.
const INFO_TIMEOUT: Duration = Duration::from_secs(10);

/// `quire bookie info ADDR`: a handshake and one `GetBookieInfo` request
/// (docs/protocol.md), printed as text or JSON.
fn bookie_info(args: InfoArgs) -> Result<()> {
    use quire_wire::bookie::{BookieState, DirKind};
    let info = fetch_bookie_info(
        &args.addr,
        args.bookie_tls.client_config()?,
        args.bookie_tls.cluster_secret()?,
    )?;
    let addr = &args.addr;
    let state = match info.state {
        BookieState::Writable => "writable",
        BookieState::ReadOnly => "read-only",
    };
    let kind = |k: DirKind| match k {
        DirKind::Journal => "journal",
        DirKind::Ledger => "ledger",
    };
    let ledgers: u64 = info.shard_ledgers.iter().sum();
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if args.json {
        let dirs: Vec<serde_json::Value> = info
            .dirs
            .iter()
            .map(|d| {
                serde_json::json!({
                    "kind": kind(d.kind),
                    "path": d.path,
                    "total_bytes": d.total_bytes,
                    "free_bytes": d.free_bytes,
                    "used_bytes": d.used_bytes,
                })
            })
            .collect();
        let v = serde_json::json!({
            "bookie": addr,
            "state": state,
            "shards": info.shard_ledgers.len(),
            "ledgers": ledgers,
            "shard_ledgers": info.shard_ledgers,
            "dirs": dirs,
        });
        writeln!(out, "{v}")?;
    } else {
        writeln!(out, "bookie {addr}")?;
        writeln!(out, "state: {state}")?;
        let per_shard: Vec<String> = info.shard_ledgers.iter().map(u64::to_string).collect();
        writeln!(
            out,
            "shards: {} (ledgers per shard: {})",
            info.shard_ledgers.len(),
            per_shard.join(", ")
        )?;
        writeln!(out, "ledgers: {ledgers}")?;
        for d in &info.dirs {
            let fs_used = d.total_bytes.saturating_sub(d.free_bytes);
            let pct = if d.total_bytes == 0 {
                0.0
            } else {
                100.0 * fs_used as f64 / d.total_bytes as f64
            };
            writeln!(
                out,
                "{} {}: bookie files {}, file system {} free of {} ({pct:.1}% used)",
                kind(d.kind),
                d.path,
                human_bytes(d.used_bytes),
                human_bytes(d.free_bytes),
                human_bytes(d.total_bytes)
            )?;
        }
    }
    out.flush()?;
    Ok(())
}

/// `n` bytes with a binary unit, e.g. `64.0 MiB`.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Connects to `addr`, shakes hands (version 2 with the cluster secret, checking the
/// bookie's proof; version 1 without) and asks for the bookie info.
fn fetch_bookie_info(
    addr: &str,
    tls: Option<std::sync::Arc<quire_tls::rustls::ClientConfig>>,
    secret: Option<quire_wire::auth::ClusterSecret>,
) -> Result<quire_wire::bookie::BookieInfo> {
    use quire_wire::blocking::{BookieConnection, ConnectionError};
    use quire_wire::bookie::{decode_bookie_info_response, BookieInfoReply, Request};
    use std::net::ToSocketAddrs;
    let sock = addr
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve bookie address {addr}"))?
        .next()
        .with_context(|| format!("bookie address {addr} resolves to nothing"))?;
    let tcp = std::net::TcpStream::connect_timeout(&sock, INFO_TIMEOUT)
        .with_context(|| format!("cannot connect to bookie {addr}"))?;
    tcp.set_read_timeout(Some(INFO_TIMEOUT))?;
    tcp.set_write_timeout(Some(INFO_TIMEOUT))?;
    let stream: Box<dyn ReadWrite> = match tls {
        None => Box::new(tcp),
        Some(config) => {
            let name = quire_tls::server_name(addr)?;
            let session = quire_tls::rustls::ClientConnection::new(config, name)
                .with_context(|| format!("TLS to bookie {addr}"))?;
            Box::new(quire_tls::rustls::StreamOwned::new(session, tcp))
        }
    };
    let mut conn = match BookieConnection::connect(stream, secret.as_ref()) {
        Ok(c) => c,
        Err(ConnectionError::BadProof) => bail!(
            "bookie {addr}: its proof of the cluster secret does not match ours: it is not a \
             bookie of this cluster"
        ),
        Err(e) => return Err(e).with_context(|| format!("handshake with bookie {addr}")),
    };
    let answer = conn
        .call(&Request::GetBookieInfo)
        .with_context(|| format!("bookie info from bookie {addr}"))?;
    let reply = decode_bookie_info_response(&answer.frame())
        .with_context(|| format!("bad bookie info answer from bookie {addr}"))?;
    match reply {
        BookieInfoReply::Ok(info) => Ok(info),
        BookieInfoReply::Failed { status, message } => {
            bail!("bookie {addr} answered {status:?}: {message}")
        }
    }
}

/// A plain or TLS connection for `quire bookie info`.
trait ReadWrite: std::io::Read + std::io::Write {}
impl<T: std::io::Read + std::io::Write> ReadWrite for T {}

/// Keeps the registration alive and in the right directory until told to stop; returns the
/// store in use then.
///
/// When the bookie turns read-only or writable again, it registers again with the new
/// `read_only` flag, which moves the ephemeral node between `available/` and `readonly/`
/// (BookKeeper's `RegistrationManager.registerBookie(id, readOnly)`); a failed move is retried
/// every second. When the ZooKeeper session expires, the ephemeral registration is gone: it
/// connects a new store (a new session), retrying every second, and registers again with the
/// current state. The bookie serves throughout.
async fn keep_registered(
    mut store: Arc<ZkStore>,
    address: MetadataAddress,
    mut info: BookieInfo,
    (state, changes): (quire_bookie::ReadOnlyState, flume::Receiver<bool>),
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Arc<ZkStore> {
    let mut retry_move = false;
    loop {
        let mut lost = store.session_lost();
        let moved = tokio::select! {
            _ = stop.changed() => return store,
            r = lost.wait_for(|lost| *lost) => {
                if r.is_err() {
                    return store;
                }
                false
            }
            r = changes.recv_async() => {
                if r.is_err() {
                    // The bookie is gone; nothing will change any more.
                    return store;
                }
                true
            }
            _ = tokio::time::sleep(Duration::from_secs(1)), if retry_move => true,
        };
        if moved {
            // Several transitions may be queued; the current state is what counts.
            while changes.try_recv().is_ok() {}
            info.read_only = state.is_read_only();
            let dir = if info.read_only {
                "readonly"
            } else {
                "available"
            };
            match store.register_bookie(info.clone()).await {
                Ok(()) => {
                    retry_move = false;
                    eprintln!("quire bookie: {} registered under {dir}", info.id);
                }
                Err(e) => {
                    retry_move = true;
                    tracing::warn!(bookie = %info.id, error = %e, "cannot move the registration to {dir}; retrying");
                }
            }
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

/// What [`check_cookie`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CookieOutcome {
    /// First start: the cookie was written to both directories and the metadata store.
    Created,
    /// Both directories and the store hold the same cookie.
    Matched,
}

/// What a directory holds.
#[derive(Debug)]
enum DirState {
    /// Missing or empty (a `lost+found` is ignored).
    Empty,
    /// Has a cookie; `only_cookie` if nothing else is there.
    Cookie { cookie: Cookie, only_cookie: bool },
    /// Holds files but no cookie.
    DataWithoutCookie,
}

fn dir_state(dir: &Path) -> Result<DirState> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DirState::Empty),
        Err(e) => {
            return Err(e).with_context(|| format!("cannot list directory {}", dir.display()))
        }
    };
    let mut others = 0usize;
    let mut has_cookie = false;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list directory {}", dir.display()))?;
        let name = entry.file_name();
        if name == COOKIE_FILE {
            has_cookie = true;
        } else if name != "lost+found" && name != "COOKIE.tmp" {
            others += 1;
        }
    }
    if !has_cookie {
        return Ok(if others == 0 {
            DirState::Empty
        } else {
            DirState::DataWithoutCookie
        });
    }
    let path = dir.join(COOKIE_FILE);
    let bytes = std::fs::read(&path)
        .with_context(|| format!("cannot read cookie file {}", path.display()))?;
    let cookie: Cookie = serde_json::from_slice(&bytes).map_err(|e| {
        anyhow::anyhow!(
            "cookie file {} is corrupt: {e}; refusing to start",
            path.display()
        )
    })?;
    Ok(DirState::Cookie {
        cookie,
        only_cookie: others == 0,
    })
}

/// Writes `DIR/COOKIE` atomically: a temporary file, synced, renamed over, directory synced.
fn write_cookie_file(dir: &Path, cookie: &Cookie) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create directory {}", dir.display()))?;
    let tmp = dir.join("COOKIE.tmp");
    let path = dir.join(COOKIE_FILE);
    let bytes = serde_json::to_vec_pretty(cookie)?;
    let write = || -> std::io::Result<()> {
        std::fs::write(&tmp, &bytes)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().with_context(|| format!("cannot write cookie file {}", path.display()))
}

fn path_string(dir: &Path) -> Result<String> {
    dir.to_str()
        .map(str::to_string)
        .with_context(|| format!("directory {} is not valid UTF-8", dir.display()))
}

/// Why `found` (a directory's cookie) is not `expected`, in words.
fn mismatch(found: &Cookie, expected: &Cookie) -> String {
    if found.instance_id != expected.instance_id {
        format!(
            "it holds the cookie of cluster {} (bookie {}), but this cluster's instance id is {}",
            found.instance_id, found.bookie, expected.instance_id
        )
    } else if found.bookie != expected.bookie {
        format!(
            "it holds the cookie of bookie {}, not of {}",
            found.bookie, expected.bookie
        )
    } else if found.journal_dir != expected.journal_dir {
        format!(
            "its cookie names journal directory {}, but {} is configured",
            found.journal_dir, expected.journal_dir
        )
    } else if found.ledger_dirs != expected.ledger_dirs {
        format!(
            "its cookie names ledger directories {:?}, but {:?} are configured",
            found.ledger_dirs, expected.ledger_dirs
        )
    } else {
        format!(
            "its cookie (format {}) differs from the metadata store's",
            found.format_version
        )
    }
}

/// Checks (and on first start writes) the bookie's cookie, following BookKeeper's `Cookie`
/// rules: the cookie (instance id, bookie id, journal directory, ledger directories) is kept in
/// the metadata store and as `COOKIE` in the journal directory and in the ledger directory.
///
/// * First start (no cookie anywhere, both directories empty): the cookie is written to both
///   directories, then created in the store. A start interrupted between the two (both
///   directories hold only this very cookie) completes the same way.
/// * Later starts: the store's cookie and both directories' cookies must exist and be equal to
///   the cookie of this configuration.
///
/// # Errors
/// One line naming the directory and the reason, when: a directory was emptied (wiped) or
/// replaced while the store has a cookie; a directory holds another bookie's or another
/// cluster's cookie; the configured directories differ from the ones the cookie names; a
/// directory holds data but no cookie; a cookie file is corrupt; or the store fails.
pub async fn check_cookie(
    store: &dyn MetadataStore,
    bookie: &BookieId,
    journal_dir: &Path,
    ledger_dir: &Path,
) -> Result<CookieOutcome> {
    let instance_id = store
        .instance_id()
        .await
        .context("cannot read the cluster's instance id")?;
    let expected = Cookie {
        format_version: COOKIE_FORMAT_VERSION,
        bookie: bookie.clone(),
        instance_id,
        journal_dir: path_string(journal_dir)?,
        ledger_dirs: vec![path_string(ledger_dir)?],
    };
    let stored = match store.read_cookie(bookie).await {
        Ok(v) => Some(v.value),
        Err(quire_metadata::Error::NotFound { .. }) => None,
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read the cookie of bookie {bookie}"))
        }
    };
    let dirs = [
        ("journal", journal_dir, dir_state(journal_dir)?),
        ("ledger", ledger_dir, dir_state(ledger_dir)?),
    ];
    match stored {
        Some(stored) => {
            // A directory holding someone else's cookie is named first: it is the likelier
            // mistake (a swapped directory) and the more useful message.
            for (kind, dir, state) in &dirs {
                if let DirState::Cookie { cookie, .. } = state {
                    if *cookie != expected {
                        bail!("{kind} directory {} does not belong to bookie {bookie}: {}; refusing to start", dir.display(), mismatch(cookie, &expected));
                    }
                }
            }
            if stored != expected {
                bail!(
                    "bookie {bookie} cannot start with this configuration: {}; refusing to start",
                    mismatch(&stored, &expected)
                );
            }
            for (kind, dir, state) in &dirs {
                match state {
                    DirState::Empty => bail!(
                        "{kind} directory {} has no cookie, but the metadata store has one for bookie {bookie}: the directory was emptied or replaced since the bookie last ran; refusing to start",
                        dir.display()
                    ),
                    DirState::DataWithoutCookie => bail!(
                        "{kind} directory {} holds data but no cookie, while the metadata store has one for bookie {bookie}: the directory was replaced; refusing to start",
                        dir.display()
                    ),
                    DirState::Cookie { cookie, .. } if *cookie != expected => {
                        bail!("{kind} directory {} does not belong to bookie {bookie}: {}; refusing to start", dir.display(), mismatch(cookie, &expected))
                    }
                    DirState::Cookie { .. } => {}
                }
            }
            Ok(CookieOutcome::Matched)
        }
        None => {
            let fresh = dirs.iter().all(|(_, _, state)| match state {
                DirState::Empty => true,
                DirState::Cookie {
                    cookie,
                    only_cookie,
                } => *only_cookie && *cookie == expected,
                DirState::DataWithoutCookie => false,
            });
            if !fresh {
                for (kind, dir, state) in &dirs {
                    match state {
                        DirState::Empty => {}
                        DirState::DataWithoutCookie => bail!(
                            "{kind} directory {} is not empty and has no cookie, and the metadata store has no cookie for bookie {bookie}: use empty directories for a new bookie; refusing to start",
                            dir.display()
                        ),
                        DirState::Cookie { cookie, .. } => bail!(
                            "{kind} directory {} holds a cookie (bookie {}, cluster {}), but the metadata store has no cookie for bookie {bookie}: the directory belongs to another bookie or cluster; refusing to start",
                            dir.display(),
                            cookie.bookie,
                            cookie.instance_id
                        ),
                    }
                }
            }
            for (_, dir, _) in &dirs {
                write_cookie_file(dir, &expected)?;
            }
            store
                .write_cookie(&expected, None)
                .await
                .with_context(|| format!("cannot store the cookie of bookie {bookie}"))?;
            Ok(CookieOutcome::Created)
        }
    }
}

#[cfg(test)]
mod tests {
    //! Goal: every cookie rule, decided in-process against the embedded store and real
    //! directories. Method: run `check_cookie` over prepared directory states.

    use super::*;
    use quire_metadata::EmbeddedStore;

    struct Fixture {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        store: EmbeddedStore,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let store = EmbeddedStore::open(&root.join("meta")).unwrap();
        Fixture {
            _tmp: tmp,
            root,
            store,
        }
    }

    fn id(s: &str) -> BookieId {
        BookieId(s.to_string())
    }

    #[tokio::test]
    async fn first_start_writes_then_later_starts_match() {
        let f = fixture();
        let (j, l) = (f.root.join("j"), f.root.join("l"));
        assert_eq!(
            check_cookie(&f.store, &id("b:1"), &j, &l).await.unwrap(),
            CookieOutcome::Created
        );
        assert!(j.join(COOKIE_FILE).is_file() && l.join(COOKIE_FILE).is_file());
        std::fs::create_dir_all(j.join("shard-0")).unwrap();
        assert_eq!(
            check_cookie(&f.store, &id("b:1"), &j, &l).await.unwrap(),
            CookieOutcome::Matched
        );
        let stored = f.store.read_cookie(&id("b:1")).await.unwrap().value;
        assert_eq!(stored.journal_dir, j.to_str().unwrap());
        assert_eq!(stored.instance_id, f.store.instance_id().await.unwrap());
    }

    #[tokio::test]
    async fn wiped_journal_or_ledger_dir_is_refused() {
        let f = fixture();
        let (j, l) = (f.root.join("j"), f.root.join("l"));
        check_cookie(&f.store, &id("b:1"), &j, &l).await.unwrap();
        std::fs::remove_dir_all(&j).unwrap();
        let e = check_cookie(&f.store, &id("b:1"), &j, &l)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("journal directory {} has no cookie", j.display())),
            "{e}"
        );
        assert!(e.contains("emptied or replaced"), "{e}");

        let f = fixture();
        let (j, l) = (f.root.join("j"), f.root.join("l"));
        check_cookie(&f.store, &id("b:1"), &j, &l).await.unwrap();
        std::fs::remove_file(l.join(COOKIE_FILE)).unwrap();
        std::fs::write(l.join("data"), b"x").unwrap();
        let e = check_cookie(&f.store, &id("b:1"), &j, &l)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "ledger directory {} holds data but no cookie",
                l.display()
            )),
            "{e}"
        );
    }

    #[tokio::test]
    async fn swapped_dirs_and_other_clusters_are_refused() {
        let f = fixture();
        let (j1, l1, j2, l2) = (
            f.root.join("j1"),
            f.root.join("l1"),
            f.root.join("j2"),
            f.root.join("l2"),
        );
        check_cookie(&f.store, &id("b:1"), &j1, &l1).await.unwrap();
        check_cookie(&f.store, &id("b:2"), &j2, &l2).await.unwrap();
        // Bookie 1's journal cookie replaced by bookie 2's (a swapped disk).
        std::fs::copy(j2.join(COOKIE_FILE), j1.join(COOKIE_FILE)).unwrap();
        let e = check_cookie(&f.store, &id("b:1"), &j1, &l1)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "journal directory {} does not belong to bookie b:1",
                j1.display()
            )),
            "{e}"
        );
        assert!(e.contains("cookie of bookie b:2"), "{e}");

        // Configured with another bookie's directory: the store's cookie names another path.
        let e = check_cookie(&f.store, &id("b:2"), &j2, &l1)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("ledger directories"), "{e}");

        // A directory from another cluster, offered to a new bookie.
        let other = fixture();
        let (j3, l3) = (f.root.join("j3"), f.root.join("l3"));
        check_cookie(&other.store, &id("b:3"), &j3, &l3)
            .await
            .unwrap();
        let e = check_cookie(&f.store, &id("b:3"), &j3, &l3)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "journal directory {} holds a cookie",
                j3.display()
            )),
            "{e}"
        );
        assert!(e.contains("no cookie for bookie b:3"), "{e}");
    }

    #[tokio::test]
    async fn new_bookie_needs_empty_dirs_and_an_interrupted_first_start_completes() {
        let f = fixture();
        let (j, l) = (f.root.join("j"), f.root.join("l"));
        std::fs::create_dir_all(&j).unwrap();
        std::fs::write(j.join("journal-0000000000000001.qj"), b"old").unwrap();
        let e = check_cookie(&f.store, &id("b:1"), &j, &l)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not empty and has no cookie"), "{e}");

        // Files written, store not yet: the next start completes the first start.
        let f = fixture();
        let (j, l) = (f.root.join("j"), f.root.join("l"));
        let instance_id = f.store.instance_id().await.unwrap();
        let cookie = Cookie {
            format_version: COOKIE_FORMAT_VERSION,
            bookie: id("b:1"),
            instance_id,
            journal_dir: j.to_str().unwrap().into(),
            ledger_dirs: vec![l.to_str().unwrap().into()],
        };
        write_cookie_file(&j, &cookie).unwrap();
        write_cookie_file(&l, &cookie).unwrap();
        assert_eq!(
            check_cookie(&f.store, &id("b:1"), &j, &l).await.unwrap(),
            CookieOutcome::Created
        );
        assert_eq!(f.store.read_cookie(&id("b:1")).await.unwrap().value, cookie);
    }

    #[tokio::test]
    async fn corrupt_cookie_file_is_refused() {
        let f = fixture();
        let (j, l) = (f.root.join("j"), f.root.join("l"));
        check_cookie(&f.store, &id("b:1"), &j, &l).await.unwrap();
        std::fs::write(l.join(COOKIE_FILE), b"{not json").unwrap();
        let e = check_cookie(&f.store, &id("b:1"), &j, &l)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "cookie file {} is corrupt",
                l.join(COOKIE_FILE).display()
            )),
            "{e}"
        );
    }
}

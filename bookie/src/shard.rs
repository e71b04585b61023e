//! One shard: a glommio executor thread that owns one engine, accepts connections on the
//! shared port, and serves requests for the ledgers it owns and forwards the others.
//!
//! The controlling thread ([`crate::Bookie`]) drives each shard through a small life cycle
//! over channels: open the engine → bind → serve → stop (stop accepting and reading, answer
//! what is in flight) → close (close the engine). See `ShardMain` below for the order.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::net::TcpListener;
use glommio::sync::{Gate, Semaphore};
use glommio::{Latency, Shares, TaskQueueHandle};
use quire_engine::{Engine, EngineConfig};
use quire_wire::bookie::Status;

use crate::disk::ReadOnlyState;
use crate::metrics::{BookieStatus, ShardMetrics, STATE_PUBLISH_INTERVAL};
use crate::ops::{execute, Class, Failure, Op, Outcome};
use crate::shard_of;

/// Requests queued from other shards to one shard at most; senders wait when it is full.
pub(crate) const FORWARD_QUEUE_MAX: usize = 4096;

/// glommio shares and preemption targets of a shard's request task queues. Tail writes get
/// the most, catch-up reads the least and no latency class, so a bulk catch-up reader yields
/// to tail traffic (performance.md, "Design implications").
const TAIL_WRITE_SHARES: usize = 1000;
const TAIL_READ_SHARES: usize = 500;
const CATCH_UP_READ_SHARES: usize = 100;
const TAIL_LATENCY: Duration = Duration::from_millis(1);

/// A request forwarded from the shard that read it to the shard that owns its ledger.
pub(crate) struct Forwarded {
    pub(crate) op: Op,
    /// Capacity-1 channel used as a oneshot: the owner sends exactly one outcome.
    pub(crate) reply: flume::Sender<Outcome>,
}

/// Commands from the controlling thread to a shard.
#[derive(Debug)]
pub(crate) enum Control {
    /// Bind the listener to this address and start serving.
    Bind(SocketAddr),
    /// Stop accepting and reading, answer every request in flight, then report `Drained`.
    Stop,
    /// Close the engine and exit. Also used to abort a failed start.
    Close,
}

/// Reports from a shard to the controlling thread.
#[derive(Debug)]
pub(crate) enum Event {
    Opened,
    OpenFailed(quire_engine::Error),
    Bound(SocketAddr),
    BindFailed(std::io::Error),
    Drained,
    Closed(Result<(), quire_engine::Error>),
}

/// Everything a shard's executor is started with. `Send`: it crosses to the new thread.
pub(crate) struct ShardArgs {
    pub(crate) index: usize,
    pub(crate) shard_count: usize,
    pub(crate) frame_size_bytes_max: u32,
    pub(crate) engine: EngineConfig,
    pub(crate) control: flume::Receiver<Control>,
    pub(crate) events: flume::Sender<Event>,
    pub(crate) forward_rx: flume::Receiver<Forwarded>,
    /// One sender per shard, indexed by shard (this shard's own entry is unused).
    pub(crate) peers: Vec<flume::Sender<Forwarded>>,
    pub(crate) gc_interval: Duration,
    pub(crate) gc_deleted_ledgers: Option<crate::gc::DeletedLedgers>,
    pub(crate) scrub: crate::scrub::ScrubConfig,
    pub(crate) ledger_keys: Option<crate::keys::LedgerKeys>,
    /// The bookie's read-only state (shared by every shard and the disk monitor).
    pub(crate) read_only: ReadOnlyState,
    /// This shard's metric handles, when the bookie records metrics.
    pub(crate) metrics: Option<ShardMetrics>,
    /// Shared with every shard and the controller; this shard publishes its entry.
    pub(crate) status: Arc<BookieStatus>,
    pub(crate) limits: ConnectionLimits,
    /// The TLS acceptor when the bookie port speaks TLS.
    pub(crate) tls: Option<futures_rustls::TlsAcceptor>,
}

/// Limits on one shard's client connections (`BookieConfig`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    pub(crate) handshake_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    /// This shard's share of `BookieConfig::connections_max`.
    pub(crate) connections_max: usize,
    /// This shard's share of `BookieConfig::connections_per_ip_max`.
    pub(crate) connections_per_ip_max: usize,
    pub(crate) frame_timeout: Duration,
    /// This shard's share of `BookieConfig::request_pool_bytes`.
    pub(crate) request_pool_bytes: usize,
    /// `BookieConfig::cluster_secret`: with it, connections must pass the version-2 handshake.
    pub(crate) cluster_secret: Option<quire_wire::auth::ClusterSecret>,
}

/// One open connection's count in [`Shard::connections_per_ip`], given back when dropped.
struct IpSlot {
    shard: Rc<Shard>,
    ip: std::net::IpAddr,
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut map = self.shard.connections_per_ip.borrow_mut();
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// The serving state of one shard. Shard-local (`!Send`): lives on its executor thread.
pub(crate) struct Shard {
    pub(crate) index: usize,
    pub(crate) shard_count: usize,
    pub(crate) frame_size_bytes_max: u32,
    engine: Rc<Engine>,
    /// Asks the metadata store before a key binds (`BookieConfig::ledger_keys`).
    key_check: Option<crate::keys::KeyCheck>,
    peers: Vec<flume::Sender<Forwarded>>,
    read_only: ReadOnlyState,
    /// Every request read on this shard's connections holds a pass until it is answered,
    /// including requests forwarded to other shards. Shutdown closes it and waits.
    pub(crate) in_flight: Gate,
    /// Never has permits; closing it tells every connection reader to stop.
    pub(crate) stop: Semaphore,
    tail_write_tq: TaskQueueHandle,
    tail_read_tq: TaskQueueHandle,
    catch_up_read_tq: TaskQueueHandle,
    /// This shard's metric handles, when the bookie records metrics.
    pub(crate) metrics: Option<ShardMetrics>,
    /// The bookie's shared status (what `GetBookieInfo` answers).
    pub(crate) status: Arc<BookieStatus>,
    pub(crate) limits: ConnectionLimits,
    /// The TLS acceptor when the bookie port speaks TLS.
    pub(crate) tls: Option<futures_rustls::TlsAcceptor>,
    /// Client connections open on this shard now.
    pub(crate) connections: std::cell::Cell<usize>,
    /// Client connections open on this shard now, per client address.
    pub(crate) connections_per_ip:
        std::cell::RefCell<std::collections::HashMap<std::net::IpAddr, usize>>,
    /// This shard's share of `BookieConfig::request_pool_bytes`, one permit a byte.
    pub(crate) request_pool: Rc<Semaphore>,
}

impl Shard {
    /// The shard count as sent in the handshake (validated to fit at start).
    pub(crate) fn shard_count_wire(&self) -> u16 {
        u16::try_from(self.shard_count).expect("shard count validated at start")
    }

    /// The task queue that should run a task serving `op` on this shard.
    pub(crate) fn queue_for(&self, op: &Op) -> TaskQueueHandle {
        let owned = shard_of(op.ledger(), self.shard_count) == self.index;
        match op.class(owned.then_some(self.engine.as_ref())) {
            Class::TailWrite => self.tail_write_tq,
            Class::TailRead => self.tail_read_tq,
            Class::CatchUpRead => self.catch_up_read_tq,
        }
    }

    /// Runs `op` on this shard's engine (which must own its ledger). A parked long-poll is
    /// answered at once, with the LAC as it stands, when the shard starts stopping, so that
    /// shutdown never waits for long-poll timeouts.
    async fn execute_owned(&self, op: Op) -> Outcome {
        let outcome = self.execute_owned_inner(op).await;
        if let Err(f) = &outcome {
            if f.storage_full {
                self.read_only.report_storage_full();
            }
        }
        outcome
    }

    async fn execute_owned_inner(&self, op: Op) -> Outcome {
        if let Some(check) = &self.key_check {
            self.check_ledger_key(check, &op).await?;
        }
        if let Op::LongPoll {
            ledger, previous, ..
        } = op
        {
            return futures_lite::future::or(execute(&self.engine, op), async move {
                let _ = self.stop.acquire(1).await;
                execute(
                    &self.engine,
                    Op::LongPoll {
                        ledger,
                        previous,
                        timeout: Duration::ZERO,
                    },
                )
                .await
            })
            .await;
        }
        execute(&self.engine, op).await
    }

    /// Admits an add or fence of a ledger on which the engine has no bound key only if the
    /// metadata store holds the ledger with the request's key (crate::keys, docs/protocol.md
    /// §Add "When a key binds"). Other operations, ledgers with a bound key (the engine checks
    /// the key itself) and deleted ledgers (the engine refuses them) pass unasked.
    async fn check_ledger_key(
        &self,
        check: &crate::keys::KeyCheck,
        op: &Op,
    ) -> Result<(), Failure> {
        use crate::keys::LedgerKeyAnswer;
        let (ledger, key, fence) = match *op {
            Op::Add {
                ledger, master_key, ..
            } => (ledger, master_key, false),
            Op::Fence { ledger, master_key }
            | Op::Read {
                ledger,
                fence: Some(master_key),
                ..
            } => (ledger, master_key, true),
            _ => return Ok(()),
        };
        if self.engine.bound_master_key(ledger).is_some() || self.engine.is_deleted(ledger) {
            return Ok(());
        }
        let what = if fence { "fence" } else { "add" };
        match check.ledger_key(ledger).await {
            LedgerKeyAnswer::Exists { master_key } if master_key == key => Ok(()),
            LedgerKeyAnswer::Exists { .. } => Err(Failure::new(
                Status::Unauthorized,
                format!("{what} of ledger {ledger}: the master key is not the one in the ledger's metadata"),
            )),
            LedgerKeyAnswer::NoSuchLedger if fence => Err(Failure::new(
                Status::NoSuchLedger,
                format!("fence of ledger {ledger}: the metadata store has no such ledger"),
            )),
            LedgerKeyAnswer::NoSuchLedger => Err(Failure::new(
                Status::Unauthorized,
                format!("add to ledger {ledger}: the metadata store has no such ledger, so no key binds"),
            )),
            LedgerKeyAnswer::Unavailable(reason) => {
                tracing::warn!(ledger, %reason, "no answer about a ledger's key: {what} answered TooManyRequests");
                Err(Failure::new(
                    Status::TooManyRequests,
                    format!("{what} of ledger {ledger}: its metadata cannot be read now ({reason}); retry"),
                ))
            }
        }
    }

    /// Runs `op` here if this shard owns its ledger, else on the owning shard: at most one
    /// cross-core hop.
    ///
    /// A read-only bookie answers a normal add `ReadOnly` here, before any hop (BookKeeper's
    /// `EREADONLY`): the writer replaces this bookie by an ensemble change. Recovery adds pass
    /// (BookKeeper sends them as high-priority writes, which a read-only bookie takes), as do
    /// fences (recovery must be able to seal a ledger on every bookie), reads and LAC reads.
    pub(crate) async fn dispatch(&self, op: Op) -> Outcome {
        if let Op::Add {
            ledger,
            entry,
            recovery: false,
            ..
        } = op
        {
            if self.read_only.is_read_only() {
                return Err(Failure::new(
                    Status::ReadOnly,
                    format!("bookie is read-only (disk usage): add {ledger}/{entry} refused"),
                ));
            }
        }
        let owner = shard_of(op.ledger(), self.shard_count);
        assert!(owner < self.shard_count, "shard_of out of range");
        if owner == self.index {
            return self.execute_owned(op).await;
        }
        let (reply, reply_rx) = flume::bounded(1);
        if self.peers[owner]
            .send_async(Forwarded { op, reply })
            .await
            .is_err()
        {
            return Err(Failure::new(
                Status::IoError,
                format!("shard {owner} is not running"),
            ));
        }
        match reply_rx.recv_async().await {
            Ok(outcome) => outcome,
            Err(_) => Err(Failure::new(
                Status::IoError,
                format!("shard {owner} dropped the request"),
            )),
        }
    }
}

/// Serves requests forwarded by other shards: one task per request, in the task queue of its
/// class, so a slow add or a parked long-poll does not hold up a read behind it.
async fn forward_loop(shard: Rc<Shard>, forward_rx: flume::Receiver<Forwarded>) {
    while let Ok(Forwarded { op, reply }) = forward_rx.recv_async().await {
        let queue = shard.queue_for(&op);
        let s = shard.clone();
        let task = async move {
            let outcome = s.execute_owned(op).await;
            // The requester may have gone (its connection died); nothing to do then.
            let _ = reply.send(outcome);
        };
        match glommio::spawn_local_into(task, queue) {
            Ok(t) => drop(t.detach()),
            Err(e) => tracing::error!(error = %e, "cannot spawn a forwarded request"),
        }
    }
}

/// Waits until the controller sends `Close` or goes away.
async fn wait_for_close(control: &flume::Receiver<Control>) {
    while let Ok(msg) = control.recv_async().await {
        if matches!(msg, Control::Close) {
            return;
        }
    }
}

/// First pause after a failed accept; doubled per consecutive failure up to
/// [`ACCEPT_BACKOFF_MAX`].
const ACCEPT_BACKOFF_START: Duration = Duration::from_millis(10);
/// Longest pause between accepts after failures.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// At most one warning about failed accepts, and one about refused connections, per this
/// interval and shard; the others are counted into the next warning.
const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// A warning at most once per [`ACCEPT_LOG_INTERVAL`], counting the ones held back.
#[derive(Default)]
struct LogLimit {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimit {
    /// `Some(suppressed since the last warning)` when a warning may be logged now.
    fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < ACCEPT_LOG_INTERVAL => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// Accepts connections; one over this shard's share of `connections_max` is closed at once,
/// and failed accepts (EMFILE and friends, which last until connections close) back off
/// exponentially. Both are logged at most once per [`ACCEPT_LOG_INTERVAL`] (like the proxy).
async fn accept_loop(shard: Rc<Shard>, listener: TcpListener) {
    let mut pause = ACCEPT_BACKOFF_START;
    let mut failed_log = LogLimit::default();
    let mut refused_log = LogLimit::default();
    let mut refused_ip_log = LogLimit::default();
    loop {
        match listener.accept().await {
            Ok(stream) => {
                pause = ACCEPT_BACKOFF_START;
                if shard.connections.get() >= shard.limits.connections_max {
                    if let Some(suppressed) = refused_log.allow(quire_clock::now()) {
                        tracing::warn!(
                            shard = shard.index,
                            limit = shard.limits.connections_max,
                            suppressed,
                            "refusing a connection over the shard's connection limit"
                        );
                    }
                    drop(stream);
                    continue;
                }
                let slot = match stream.peer_addr() {
                    Ok(peer) => {
                        let ip = peer.ip();
                        let open = shard.connections_per_ip.borrow().get(&ip).copied();
                        if open.unwrap_or(0) >= shard.limits.connections_per_ip_max {
                            if let Some(suppressed) = refused_ip_log.allow(quire_clock::now()) {
                                tracing::warn!(
                                    shard = shard.index,
                                    %ip,
                                    limit = shard.limits.connections_per_ip_max,
                                    suppressed,
                                    "refusing a connection over the shard's per-address connection limit"
                                );
                            }
                            drop(stream);
                            continue;
                        }
                        *shard.connections_per_ip.borrow_mut().entry(ip).or_insert(0) += 1;
                        Some(IpSlot {
                            shard: shard.clone(),
                            ip,
                        })
                    }
                    Err(_) => None,
                };
                match &shard.tls {
                    None => {
                        let serve = crate::conn::serve(shard.clone(), stream);
                        glommio::spawn_local(async move {
                            serve.await;
                            drop(slot);
                        })
                        .detach();
                    }
                    Some(acceptor) => {
                        let serve = crate::conn::serve_tls(shard.clone(), acceptor.clone(), stream);
                        glommio::spawn_local(async move {
                            serve.await;
                            drop(slot);
                        })
                        .detach();
                    }
                }
            }
            Err(e) => {
                if let Some(suppressed) = failed_log.allow(quire_clock::now()) {
                    tracing::warn!(shard = shard.index, error = %e, suppressed, pause_ms = pause.as_millis() as u64, "accept failed; pausing before accepting again");
                }
                glommio::timer::sleep(pause).await;
                pause = (pause * 2).min(ACCEPT_BACKOFF_MAX);
            }
        }
    }
}

/// The body of a shard's executor thread.
pub(crate) async fn shard_main(args: ShardArgs) {
    let ShardArgs {
        index,
        shard_count,
        frame_size_bytes_max,
        engine,
        control,
        events,
        forward_rx,
        peers,
        gc_interval,
        gc_deleted_ledgers,
        scrub,
        ledger_keys,
        read_only,
        metrics,
        status,
        limits,
        tls,
    } = args;
    let Some(engine) = open_engine(engine, &events, metrics.as_ref(), &status, index).await else {
        return;
    };
    let Some((addr, listener)) = await_bind(&control, &events).await else {
        let result = engine.close().await;
        let _ = events.send(Event::Closed(result));
        return;
    };
    tracing::info!(%addr, "listening");
    let _ = events.send(Event::Bound(addr));

    let ex = glommio::executor();
    let shard = Rc::new(Shard {
        index,
        shard_count,
        frame_size_bytes_max,
        engine: engine.clone(),
        key_check: ledger_keys.map(crate::keys::KeyCheck::new),
        peers,
        read_only,
        in_flight: Gate::new(),
        stop: Semaphore::new(0),
        tail_write_tq: ex.create_task_queue(
            Shares::Static(TAIL_WRITE_SHARES),
            Latency::Matters(TAIL_LATENCY),
            "tail-write",
        ),
        tail_read_tq: ex.create_task_queue(
            Shares::Static(TAIL_READ_SHARES),
            Latency::Matters(TAIL_LATENCY),
            "tail-read",
        ),
        catch_up_read_tq: ex.create_task_queue(
            Shares::Static(CATCH_UP_READ_SHARES),
            Latency::NotImportant,
            "catch-up-read",
        ),
        metrics,
        status: status.clone(),
        limits,
        tls,
        connections: std::cell::Cell::new(0),
        connections_per_ip: Default::default(),
        request_pool: Rc::new(Semaphore::new(limits.request_pool_bytes as u64)),
    });
    let tasks = Background::spawn(
        &shard,
        listener,
        forward_rx,
        gc_interval,
        gc_deleted_ledgers,
        scrub,
    );
    let close_now = serve_until_stop(&control).await;
    stop_and_close(&shard, tasks, &control, &events, close_now).await;
}

/// Opens the shard's engine (replaying its journal) and reports the outcome to the starting
/// thread; `None` when it failed (reported as `OpenFailed`).
async fn open_engine(
    config: EngineConfig,
    events: &flume::Sender<Event>,
    metrics: Option<&ShardMetrics>,
    status: &BookieStatus,
    index: usize,
) -> Option<Rc<Engine>> {
    let engine = match Engine::open(config).await {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "engine failed to open");
            let _ = events.send(Event::OpenFailed(e));
            return None;
        }
    };
    tracing::info!("engine open");
    if let Some(m) = metrics {
        engine.set_journal_observer(Rc::new(m.clone()));
    }
    publish_state(&engine, status, index);
    let _ = events.send(Event::Opened);
    Some(engine)
}

/// Waits for the starting thread's `Bind` and binds; `None` when the start was aborted
/// (`Close`, the controller vanished) or the bind failed (reported as `BindFailed`, then the
/// controller's `Close` is awaited).
async fn await_bind(
    control: &flume::Receiver<Control>,
    events: &flume::Sender<Event>,
) -> Option<(SocketAddr, TcpListener)> {
    match control.recv_async().await {
        Ok(Control::Bind(addr)) => {
            match TcpListener::bind(addr).and_then(|l| Ok((l.local_addr()?, l))) {
                Ok(pair) => Some(pair),
                Err(e) => {
                    let _ = events.send(Event::BindFailed(e.into()));
                    // The controller answers a failed bind with Close.
                    wait_for_close(control).await;
                    None
                }
            }
        }
        // Close (start failed on another shard), or the controller vanished.
        Ok(other) => {
            tracing::debug!(?other, "start aborted before bind");
            None
        }
        Err(_) => None,
    }
}

/// The tasks a serving shard runs besides its connections.
struct Background {
    /// Requests other shards forward to this one.
    forward: glommio::Task<()>,
    /// A background checkpoint that found no space turns the bookie read-only at once.
    storage_full: glommio::Task<()>,
    accept: glommio::Task<()>,
    gc: Option<glommio::Task<()>>,
    scrub: Option<glommio::Task<()>>,
    /// Copies the engine's figures into the shared status.
    publish: glommio::Task<()>,
}

impl Background {
    /// Spawns the forward, storage-full, accept, GC (unless `gc_interval` is zero) and
    /// status-publishing loops of `shard`.
    fn spawn(
        shard: &Rc<Shard>,
        listener: TcpListener,
        forward_rx: flume::Receiver<Forwarded>,
        gc_interval: Duration,
        gc_deleted_ledgers: Option<crate::gc::DeletedLedgers>,
        scrub: crate::scrub::ScrubConfig,
    ) -> Self {
        let (engine, index) = (shard.engine.clone(), shard.index);
        let forward = glommio::spawn_local(forward_loop(shard.clone(), forward_rx));
        let storage_full = glommio::spawn_local({
            let (engine, read_only) = (engine.clone(), shard.read_only.clone());
            async move {
                loop {
                    engine.wait_for_storage_full().await;
                    read_only.report_storage_full();
                }
            }
        });
        let accept = glommio::spawn_local(accept_loop(shard.clone(), listener));
        let gc = (!gc_interval.is_zero()).then(|| {
            glommio::spawn_local(crate::gc::gc_loop(
                engine.clone(),
                index,
                gc_interval,
                gc_deleted_ledgers,
            ))
        });
        let scrub = (scrub.enabled && !scrub.interval.is_zero()).then(|| {
            glommio::spawn_local(crate::scrub::scrub_loop(
                engine.clone(),
                index,
                scrub,
                shard.status.clone(),
            ))
        });
        let publish = glommio::spawn_local({
            let status = shard.status.clone();
            async move {
                loop {
                    glommio::timer::sleep(STATE_PUBLISH_INTERVAL).await;
                    publish_state(&engine, &status, index);
                }
            }
        });
        Self {
            forward,
            storage_full,
            accept,
            gc,
            scrub,
            publish,
        }
    }
}

/// Serves until told to stop; returns true when told to close at once (`Close`, or the
/// controller vanished) rather than to stop and drain first.
async fn serve_until_stop(control: &flume::Receiver<Control>) -> bool {
    loop {
        match control.recv_async().await {
            Ok(Control::Stop) => return false,
            Ok(Control::Close) | Err(_) => return true,
            Ok(Control::Bind(_)) => tracing::error!("Bind received while serving; ignored"),
        }
    }
}

/// Stops the shard: no new connections or requests, waits for the requests in flight
/// (reported as `Drained`), keeps serving forwarded requests until the controller says
/// close (other shards may still forward requests read before they stopped), then stops the
/// background loops and closes the engine (reported as `Closed`).
async fn stop_and_close(
    shard: &Rc<Shard>,
    tasks: Background,
    control: &flume::Receiver<Control>,
    events: &flume::Sender<Event>,
    mut close_now: bool,
) {
    tracing::info!("stopping: no new connections or requests");
    tasks.accept.cancel().await;
    shard.stop.close();
    if shard.in_flight.close().await.is_err() {
        tracing::error!("in-flight gate was already closed");
    }
    let _ = events.send(Event::Drained);
    while !close_now {
        match control.recv_async().await {
            Ok(Control::Close) | Err(_) => close_now = true,
            Ok(other) => tracing::debug!(?other, "ignored while draining"),
        }
    }
    tasks.forward.cancel().await;
    // Only the loop stops here: a run it started goes on detached and stops at its next step
    // once the engine is closed.
    if let Some(t) = tasks.gc {
        t.cancel().await;
    }
    if let Some(t) = tasks.scrub {
        t.cancel().await;
    }
    tasks.storage_full.cancel().await;
    tasks.publish.cancel().await;
    let result = shard.engine.close().await;
    match &result {
        Ok(()) => tracing::info!("engine closed"),
        Err(e) => tracing::error!(error = %e, "engine close failed"),
    }
    let _ = events.send(Event::Closed(result));
}

/// Copies the engine's figures into this shard's entry of the shared status (relaxed stores:
/// each value stands alone, readers need no order between them).
fn publish_state(engine: &Engine, status: &BookieStatus, index: usize) {
    let Some(s) = status.shards.get(index) else {
        return;
    };
    let reads = engine.read_stats();
    s.ledgers
        .store(engine.ledger_count() as u64, Ordering::Relaxed);
    s.write_cache_bytes
        .store(engine.write_cache_bytes() as u64, Ordering::Relaxed);
    s.read_cache_bytes
        .store(reads.read_cache_bytes, Ordering::Relaxed);
    s.write_cache_hits
        .store(reads.write_cache_hits, Ordering::Relaxed);
    s.read_cache_hits
        .store(reads.read_cache_hits, Ordering::Relaxed);
    s.read_cache_misses
        .store(reads.entry_log_reads, Ordering::Relaxed);
    let gc = engine.gc_stats();
    let rebuilt = engine.index_stats();
    let scrub = engine.scrub_stats();
    for (field, v) in [
        (&s.gc_runs, gc.runs),
        (&s.gc_failed_runs, gc.failed_runs),
        (&s.gc_ledgers_deleted, gc.ledgers_deleted),
        (&s.gc_entry_logs_deleted, gc.entry_logs_deleted),
        (&s.gc_entry_logs_compacted, gc.entry_logs_compacted),
        (&s.gc_entry_logs_rolled, gc.entry_logs_rolled),
        (&s.gc_entries_relocated, gc.entries_relocated),
        (
            &s.gc_reclaimed_deletion_bytes,
            gc.bytes_reclaimed_by_deletion,
        ),
        (
            &s.gc_reclaimed_compaction_bytes,
            gc.bytes_reclaimed_by_compaction,
        ),
        (&s.gc_minor_compactions, gc.minor_compactions),
        (&s.gc_major_compactions, gc.major_compactions),
        (&s.entry_logs, gc.entry_logs),
        (&s.entry_log_bytes, gc.entry_log_bytes),
        (&s.entry_log_live_bytes, gc.live_bytes),
        (&s.index_segments_rebuilt, rebuilt.segments_rebuilt),
        (&s.index_ledgers_rebuilt, rebuilt.ledgers_rebuilt),
        (&s.index_entries_rebuilt, rebuilt.entries_rebuilt),
        (&s.scrub_passes, scrub.passes),
        (&s.scrub_entries_scanned, scrub.entries_scanned),
        (&s.scrub_bytes_scanned, scrub.bytes_scanned),
        (&s.scrub_damaged_found, scrub.damaged_found),
        (&s.scrub_damaged_now, scrub.damaged_now),
        (&s.scrub_repaired, scrub.repaired),
        (
            &s.scrub_index_segments_damaged,
            scrub.index_segments_damaged,
        ),
        (
            &s.scrub_last_pass_end_seconds,
            scrub
                .last_pass_end
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs()),
        ),
    ] {
        field.store(v, Ordering::Relaxed);
    }
    if let Some(m) = status.scrub.get(index) {
        let ms = |t: Option<std::time::SystemTime>| {
            t.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as u64)
        };
        let mut i = m.lock().unwrap_or_else(|p| p.into_inner());
        i.flags = (i.flags & quire_wire::bookie::SCRUB_ENABLED)
            | if scrub.pass_started.is_some() {
                quire_wire::bookie::SCRUB_IN_PROGRESS
            } else {
                0
            };
        i.pass_started_ms = ms(scrub.pass_started);
        i.last_pass_start_ms = ms(scrub.last_pass_start);
        i.last_pass_end_ms = ms(scrub.last_pass_end);
        i.last_pass_entries = scrub.last_pass_entries;
        i.last_pass_bytes = scrub.last_pass_bytes;
        i.passes = scrub.passes;
        i.entries_scanned = scrub.entries_scanned;
        i.bytes_scanned = scrub.bytes_scanned;
        i.damaged_found = scrub.damaged_found;
        i.damaged_now = scrub.damaged_now;
        i.repaired = scrub.repaired;
    }
}

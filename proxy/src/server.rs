//! The proxy server: the proxy protocol over TCP, on tokio.
//!
//! One task per connection reads frames; each request runs in its own task and its response
//! goes through a per-connection channel to a writer task, so requests are pipelined and
//! answered as they finish (matched by request id). A write to a stream this proxy owns is
//! submitted to it before the next frame is read; a write that must first acquire its stream
//! (hundreds of ms to seconds) is submitted by its own task, so the connection goes on reading,
//! and later writes to that stream on the connection are submitted after it
//! (`PendingSubmissions`). So pipelined writes to one stream keep their order, and their answers
//! leave in that order too (`WriteTurns`).
//!
//! Connections are bounded (see [`ServerConfig`]): a handshake timeout, an idle timeout for
//! connections with nothing in flight, a maximum of open connections per client address, a
//! maximum of connections in their handshake (the oldest is closed to make room), and a
//! maximum number of open connections beyond which new ones are answered
//! `SERVICE_UNAVAILABLE` and closed. Failed accepts (`EMFILE`) back off. Memory is bounded
//! too: frames above [`FRAME_ALLOWANCE_BYTES`] are reserved from a process-wide pool before
//! their body is read and must arrive within a frame timeout, and requests with large answers
//! reserve them from per-connection and process-wide response budgets until the answer is
//! written; while requests wait for the process-wide budget, connections that do not read
//! their answers are closed (docs/proxy-protocol.md, "Memory bounds"). Failed token checks
//! are counted, logged per address at a bounded rate, answered later and later, and an
//! address that keeps failing is refused for a while ([`crate::limits`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quire_wire::frame::{RecvBuffer, FRAME_SIZE_BYTES_MAX_DEFAULT};
use quire_wire::WireError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::auth::{Authorizer, Grant, Right};
use crate::error::{Error, ErrorCode, Result};
use crate::limits::{
    Admission, AuthFailures, Handshake, IpSlot, LogThrottle, PoolGrant, ResponsePool,
};
use crate::metrics::ProxyMetrics;
use crate::protocol::{
    reserved_txid_index, Opcode, ProducerSeq, Request, Response, PROXY_PROTOCOL_VERSION_MAX,
    PROXY_PROTOCOL_VERSION_MIN, READ_RECORD_OVERHEAD_BYTES,
};
use crate::record_set::RECORD_SIZE_BYTES_MAX;
use crate::stream::StreamManager;

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest frame accepted or sent; at least 2 MiB so one maximal record fits (default
    /// 5 MiB, BookKeeper's `nettyMaxFrameSizeBytes`).
    pub frame_size_bytes_max: u32,
    /// Requests of one connection being processed at once before the server stops reading it.
    pub requests_in_flight_max: usize,
    /// Longest tail wait a read may ask for.
    pub read_wait_max: Duration,
    /// A connection that has not completed its handshake (the TLS handshake if any, then a
    /// whole `HELLO` frame) this long after it was accepted gets `BAD_REQUEST` (request id 0)
    /// and is closed, which frees its slot (default 5 s).
    pub handshake_timeout: Duration,
    /// A handshaken connection with no request in flight (a waiting tail read counts as in
    /// flight) and no complete request frame received for this long is closed, without an
    /// answer (default 10 min). Clients reconnect on their next request.
    pub idle_timeout: Duration,
    /// Most connections open at once (default 4096). When a connection arrives beyond it, the
    /// connection longest in its handshake, if any, is closed to make room; otherwise the new
    /// one gets `SERVICE_UNAVAILABLE` (request id 0) at once and is closed, as
    /// DistributedLog's proxy answers when it cannot serve, so that clients try another proxy.
    pub connections_max: usize,
    /// Most connections open at once from one client IP address (Kafka's
    /// `max.connections.per.ip`, the bookie's `connections_per_ip_max`; default 1024). A
    /// connection beyond it is closed at once, unanswered, so that one address cannot take
    /// every slot of `connections_max` from the others.
    pub connections_per_ip_max: usize,
    /// Most connections in their handshake at once (accepted, handshake not yet answered;
    /// default 1024). A connection arriving beyond it closes the one longest in its handshake:
    /// strangers who never finish a handshake cannot keep others out, since a real client's
    /// handshake takes milliseconds.
    pub handshakes_max: usize,
    /// Where catch-up reads (reads whose first entry is not in the tail cache, see
    /// [`StreamManager::is_catch_up_read`]) run, decoding included; `None` (the default): on the
    /// server's own runtime. Give it a runtime of lower OS priority ([`crate::catch_up_read_runtime`])
    /// so that a reader scanning a backlog takes only CPU that tail writes leave (the role of
    /// Redpanda's fetch scheduling group, or BookKeeper's separate read thread pool).
    pub catch_up_read_runtime: Option<tokio::runtime::Handle>,
    /// Where requests are counted and timed ([`ProxyMetrics`]); `None` (the default): nothing
    /// is recorded.
    pub metrics: Option<Arc<ProxyMetrics>>,
    /// The tokens clients must present in their handshake, with their rights
    /// ([`crate::auth`]); `None` (the default): no authentication, every client may do
    /// everything.
    pub auth: Option<Arc<Authorizer>>,
    /// TLS on the proxy port, from `quire_tls::ServerTls::server_config` (BookKeeper's
    /// `tlsCertificatePath`, `tlsKeyStore`, `tlsTrustStore`, `tlsClientAuthentication`); the
    /// TLS handshake counts against `handshake_timeout`. `None` (the default): plain TCP.
    pub tls: Option<Arc<quire_tls::rustls::ServerConfig>>,
    /// Process-wide pool of bytes for request frames larger than [`FRAME_ALLOWANCE_BYTES`]
    /// (Kafka's `queued.max.request.bytes` memory pool; default 256 MiB, raised to the frame
    /// limit if below it). When a frame header announces such a frame, the connection takes
    /// its size from the pool before it buffers the body, and gives it back when the request
    /// has been answered; while the pool cannot give it, the connection is not read (TCP
    /// back-pressure on the client).
    pub request_pool_bytes: usize,
    /// A frame must arrive whole within this of its first bytes (time spent waiting for the
    /// pool excluded), or the connection gets `BAD_REQUEST` (request id 0) and is closed: a
    /// client trickling a frame (slowloris) cannot hold pool bytes. Default 60 s.
    pub frame_timeout: Duration,
    /// Most response bytes one connection may have being built or queued for its socket
    /// (default 16 MiB, raised to the frame limit if below it). A read counts for the largest
    /// answer it may get (its `max_bytes`, capped, plus one maximal record) from when it is
    /// taken until its answer is written to the socket; when a new request would go over,
    /// the connection takes no further request until the client has read its answers.
    pub connection_response_bytes_max: usize,
    /// Process-wide bound on the bytes of read, describe and list answers being built or
    /// queued for their sockets, counted like `connection_response_bytes_max` (default 256
    /// MiB). A request that would go over waits; bytes that come free go to the waiting
    /// request whose client address holds the fewest, so one address cannot keep the others
    /// waiting. This bounds the proxy's memory for answers whatever the number of connections.
    pub response_bytes_max: usize,
    /// A connection whose answers cannot be written for this long (the client does not read
    /// them) is closed, which frees its share of the response bounds. Default 60 s.
    pub send_timeout: Duration,
    /// While a request waits for the process-wide response budget, a connection that holds
    /// some of it and whose socket has taken none of its answer bytes for this long is
    /// closed (default 1 s): a client that does not read cannot stall the others' reads.
    pub pressure_send_timeout: Duration,
    /// Write rate limits and quotas of the proxy scope and the default per-stream ones
    /// (`[limits]`, [`crate::quota`]); the default: none.
    pub limits: crate::quota::LimitConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            frame_size_bytes_max: FRAME_SIZE_BYTES_MAX_DEFAULT,
            requests_in_flight_max: 1024,
            read_wait_max: Duration::from_secs(60),
            handshake_timeout: HANDSHAKE_TIMEOUT_DEFAULT,
            idle_timeout: Duration::from_secs(600),
            connections_max: 4096,
            connections_per_ip_max: CONNECTIONS_PER_IP_MAX_DEFAULT,
            handshakes_max: HANDSHAKES_MAX_DEFAULT,
            catch_up_read_runtime: None,
            metrics: None,
            auth: None,
            tls: None,
            request_pool_bytes: REQUEST_POOL_BYTES_DEFAULT,
            frame_timeout: Duration::from_secs(60),
            connection_response_bytes_max: CONNECTION_RESPONSE_BYTES_MAX_DEFAULT,
            response_bytes_max: RESPONSE_BYTES_MAX_DEFAULT,
            send_timeout: Duration::from_secs(60),
            pressure_send_timeout: PRESSURE_SEND_TIMEOUT_DEFAULT,
            limits: Default::default(),
        }
    }
}

/// Frames up to this size (header included) are buffered without a reservation from
/// [`ServerConfig::request_pool_bytes`]; bigger ones are reserved in full first. It is also
/// the largest frame taken before the handshake.
pub const FRAME_ALLOWANCE_BYTES: usize = 64 * 1024;
/// Default [`ServerConfig::request_pool_bytes`]: 256 MiB.
pub const REQUEST_POOL_BYTES_DEFAULT: usize = 256 * 1024 * 1024;
/// Default [`ServerConfig::connection_response_bytes_max`]: 16 MiB.
pub const CONNECTION_RESPONSE_BYTES_MAX_DEFAULT: usize = 16 * 1024 * 1024;
/// Default [`ServerConfig::response_bytes_max`]: 256 MiB.
pub const RESPONSE_BYTES_MAX_DEFAULT: usize = 256 * 1024 * 1024;
/// Default [`ServerConfig::handshake_timeout`]: 5 s.
pub const HANDSHAKE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Default [`ServerConfig::connections_per_ip_max`] (the bookie's).
pub const CONNECTIONS_PER_IP_MAX_DEFAULT: usize = 1024;
/// Default [`ServerConfig::handshakes_max`].
pub const HANDSHAKES_MAX_DEFAULT: usize = 1024;
/// Default [`ServerConfig::pressure_send_timeout`]: 1 s.
pub const PRESSURE_SEND_TIMEOUT_DEFAULT: Duration = Duration::from_secs(1);

/// The bounds shared by every connection of one server.
#[derive(Debug)]
struct Shared {
    /// [`ServerConfig::request_pool_bytes`], one permit per byte.
    request_pool: Arc<Semaphore>,
    /// [`ServerConfig::response_bytes_max`].
    responses: Arc<ResponsePool>,
    /// [`ServerConfig::connections_per_ip_max`] and [`ServerConfig::handshakes_max`].
    admission: Arc<Admission>,
    /// Failed token checks per client address.
    auth_failures: AuthFailures,
    /// [`ServerConfig::limits`] and the tokens' limits.
    limiter: Arc<crate::quota::Limiter>,
}

impl Shared {
    fn new(config: &ServerConfig) -> Self {
        let frame_total = config.frame_size_bytes_max as usize + 4;
        Self {
            request_pool: Arc::new(Semaphore::new(config.request_pool_bytes.max(frame_total))),
            responses: ResponsePool::new(config.response_bytes_max.max(frame_total)),
            admission: Admission::new(config.connections_per_ip_max, config.handshakes_max),
            auth_failures: AuthFailures::default(),
            limiter: crate::quota::Limiter::new(config.limits),
        }
    }
}

/// A bounded answer's share of its connection's and the process's response budgets, taken
/// before the request runs and held until its answer has been written.
struct ResponseHold {
    _conn: OwnedSemaphorePermit,
    _process: PoolGrant,
}

/// One encoded answer on its way to the socket.
struct Out {
    bytes: Vec<u8>,
    hold: Option<ResponseHold>,
}

impl Out {
    /// This answer holds `r` until written.
    fn holding(mut self, r: Option<ResponseHold>) -> Self {
        self.hold = r;
        self
    }
}

/// The largest payload byte budget a read may use: room for one maximal record past it and for
/// the headers within one frame.
fn read_bytes_cap(config: &ServerConfig) -> usize {
    config.frame_size_bytes_max as usize - RECORD_SIZE_BYTES_MAX - READ_RECORD_OVERHEAD_BYTES - 4096
}

/// One page of `LIST_STREAMS` (flag `0x01`): the metadata store lists every name (ZooKeeper's
/// `getChildren` has no paging), and `quire_client::list_page::select` picks the page from the
/// sorted names, so a page costs one listing of the namespace and the page's names go out.
///
/// # Errors
/// `BadRequest` for a token no proxy wrote or one of another prefix; `Metadata`.
async fn list_page(
    streams: &StreamManager,
    prefix: &str,
    page_token: &str,
    page_size: u32,
) -> Result<Response> {
    // Checked before the listing: a bad token costs no metadata request.
    quire_client::list_page::name_before(page_token)
        .map_err(|reason| Error::BadRequest { reason })?;
    let names = streams.list_streams().await?;
    let (page, next) = quire_client::list_page::select(&names, prefix, page_token, page_size)
        .map_err(|reason| Error::BadRequest { reason })?;
    Ok(Response::ListStreamsPage {
        streams: page,
        next_page_token: next,
    })
}

/// An upper bound of the answer to `req` for the response budget, or `None` for requests whose
/// answers are small (writes, admin requests), which `requests_in_flight_max` bounds.
fn response_bytes_bound(req: &Request, config: &ServerConfig) -> Option<usize> {
    match req {
        Request::Read { max_bytes, .. } => Some(
            (*max_bytes as usize).min(read_bytes_cap(config))
                + RECORD_SIZE_BYTES_MAX
                + READ_RECORD_OVERHEAD_BYTES
                + 4096,
        ),
        Request::ListStreams
        | Request::ListStreamsPage { .. }
        | Request::DescribeStream { .. }
        | Request::ListSubscriptions { .. } => Some(config.frame_size_bytes_max as usize + 4),
        _ => None,
    }
}

/// The whole size (length field included) of the frame at the front of `pending`, once its
/// length field has arrived.
fn pending_frame_bytes(pending: &[u8]) -> Option<usize> {
    let len: [u8; 4] = pending.get(..4)?.try_into().ok()?;
    Some(4 + u32::from_le_bytes(len) as usize)
}

/// Counts a connection closed by a bound, if there are metrics.
fn refused(metrics: &Option<Arc<ProxyMetrics>>, reason: &'static str) {
    if let Some(m) = metrics {
        m.refused(reason);
    }
}

/// Records `resp` in `metrics` if there are metrics (a read answered here did not wait).
fn record(metrics: &Option<Arc<ProxyMetrics>>, opcode: u8, received: Instant, resp: &Response) {
    if let Some(m) = metrics {
        m.record(opcode, received, resp, false);
    }
}

/// How the server is told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Serving.
    Running,
    /// [`ProxyServer::drain`]: connections stop reading, wait for their writes in flight to be
    /// answered, send every queued answer and close.
    Drain,
    /// [`ProxyServer::shutdown`]: connections close at once; queued answers are dropped.
    Now,
}

/// A running proxy server. Dropping it (or [`ProxyServer::shutdown`]) stops accepting and
/// closes every connection; the [`StreamManager`] is left as it is. [`ProxyServer::drain`]
/// stops it cleanly instead.
pub struct ProxyServer {
    local_addr: SocketAddr,
    stop: watch::Sender<Stop>,
    accept_task: tokio::task::JoinHandle<()>,
    /// One permit per connection slot; a connection task holds one until it has ended.
    connections: Arc<Semaphore>,
    connections_max: usize,
}

impl std::fmt::Debug for ProxyServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyServer")
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl ProxyServer {
    /// Binds `addr` and starts serving `streams`.
    ///
    /// # Errors
    /// `Io` if the address cannot be bound.
    pub async fn bind(
        addr: SocketAddr,
        streams: Arc<StreamManager>,
        config: ServerConfig,
    ) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Io { op: "bind", source })?;
        Self::start(listener, streams, config)
    }

    /// Starts serving `streams` on an already bound listener (in a spawned task).
    ///
    /// # Errors
    /// `Io` if the listener has no local address.
    ///
    /// # Panics
    /// If `config.frame_size_bytes_max` is below 2 MiB or `config.connections_max` is 0.
    pub fn start(
        listener: TcpListener,
        streams: Arc<StreamManager>,
        config: ServerConfig,
    ) -> Result<Self> {
        assert!(
            config.frame_size_bytes_max >= 2 * 1024 * 1024,
            "the frame limit must hold one maximal record"
        );
        assert!(
            config.connections_max > 0,
            "the server must accept at least one connection"
        );
        let local_addr = listener.local_addr().map_err(|source| Error::Io {
            op: "local_addr",
            source,
        })?;
        let (stop, stop_rx) = watch::channel(Stop::Running);
        let connections_max = config.connections_max;
        let connections = Arc::new(Semaphore::new(connections_max));
        let accept_task = tokio::spawn(serve_until(
            listener,
            streams,
            config,
            stop_rx,
            connections.clone(),
        ));
        Ok(Self {
            local_addr,
            stop,
            accept_task,
            connections,
            connections_max,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting and closes every connection. Requests already handed to a stream finish
    /// in the background; their answers are dropped.
    pub fn shutdown(&self) {
        let _ = self.stop.send(Stop::Now);
        self.accept_task.abort();
    }

    /// Stops the proxy cleanly (the SIGTERM path of `quire proxy`), in this order:
    ///
    /// 0. With balanced ownership and another live proxy, [`StreamManager::hand_over`]: it
    ///    leaves the proxy registry, waits until the others have read the registry since,
    ///    and, still serving, hands every owned stream to its next preferred owner (writers
    ///    are redirected; nothing is refused); then it goes on redirecting for
    ///    [`HAND_OVER_GRACE`], so requests already on their way get a redirect too.
    /// 1. Stops accepting: the listening socket is closed, so new connections are refused and
    ///    clients go to another proxy.
    /// 2. [`StreamManager::shutdown`]: every write already submitted to a stream is completed
    ///    and answered, each open segment is completed (its ledger closed, so the next owner
    ///    need not fence it) and every stream lease is released, so another proxy can take
    ///    the streams at once. Writes that arrive meanwhile are refused with
    ///    `SERVICE_UNAVAILABLE` without being written: DistributedLog's proxy answers so when it
    ///    cannot serve, and a client may resend such a write to another proxy without risking a
    ///    duplicate.
    /// 3. Each connection stops reading, waits until its requests in flight other than reads
    ///    are answered, sends every queued answer and a last connection-level
    ///    `SERVICE_UNAVAILABLE` (request id 0: what the client sent and got no answer for was
    ///    not read, so it resends it elsewhere rather than report an unknown outcome), shuts
    ///    its write side and reads and drops what comes until the client closes, at most
    ///    [`DRAIN_LINGER_MAX`] (so the close does not reset the connection before the client
    ///    has read that answer). Reads in flight (such as a tail read waiting for new records)
    ///    are not waited for; a reader resumes from its position on another proxy.
    ///
    /// Returns when every connection has closed. It does not time out by itself: wrap it in
    /// `tokio::time::timeout` and call [`ProxyServer::shutdown`] when that runs out (nothing
    /// acknowledged is lost then either; the next owner recovers the segments).
    ///
    /// # Errors
    /// The first `Storage` or `Metadata` error of completing a segment (the stream's lease is
    /// still released; the next owner recovers the segment). The connections are drained
    /// anyway.
    pub async fn drain(&self, streams: &StreamManager) -> Result<()> {
        // Balanced ownership: hand the streams to the other proxies while still serving.
        if streams.hand_over().await > 0 {
            // Requests already on their way for the streams handed over get a redirect to
            // the new owner rather than SERVICE_UNAVAILABLE and a detour through the client's
            // home proxy.
            tokio::time::sleep(HAND_OVER_GRACE).await;
        }
        self.accept_task.abort();
        let closed = streams.shutdown().await;
        let _ = self.stop.send(Stop::Drain);
        // Every connection task holds one permit until it has ended.
        let _all = self
            .connections
            .acquire_many(self.connections_max as u32)
            .await;
        closed
    }
}

impl Drop for ProxyServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Serves `streams` on `listener` until the task is dropped; one task per connection.
///
/// # Errors
/// Returns only if accepting fails for good (`Io`).
pub async fn serve(
    listener: TcpListener,
    streams: Arc<StreamManager>,
    config: ServerConfig,
) -> Result<()> {
    let (_stop, stop_rx) = watch::channel(Stop::Running);
    let connections = Arc::new(Semaphore::new(config.connections_max));
    serve_until(listener, streams, config, stop_rx, connections).await;
    Ok(())
}

/// How long a drain keeps serving (redirecting) after its hand-over, before it stops
/// accepting and refuses what is left with `SERVICE_UNAVAILABLE`.
const HAND_OVER_GRACE: Duration = Duration::from_millis(500);
/// Longest time a drained connection's last answer (the connection-level
/// `SERVICE_UNAVAILABLE`) waits for the client to close, reading and dropping what it sent.
const DRAIN_LINGER_MAX: Duration = Duration::from_secs(1);

/// First pause after a failed accept; doubled per consecutive failure up to
/// [`ACCEPT_BACKOFF_MAX`].
const ACCEPT_BACKOFF_START: Duration = Duration::from_millis(10);
/// Longest pause between accepts after failures.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// At most one warning about failed accepts per this interval; the others are counted.
const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Connections over the limit being answered at once; further ones are closed without answer.
const REJECTIONS_IN_FLIGHT_MAX: usize = 64;
/// Longest time spent answering a connection over the limit.
const REJECTION_TIME_MAX: Duration = Duration::from_secs(1);

/// Pacing of the accept loop after failures such as `EMFILE` (too many open files), which
/// persist until connections close: accepting again at once would spin and flood the log.
#[derive(Debug)]
struct AcceptBackoff {
    pause: Duration,
    last_log: Option<Instant>,
    suppressed: u64,
}

impl AcceptBackoff {
    fn new() -> Self {
        Self {
            pause: ACCEPT_BACKOFF_START,
            last_log: None,
            suppressed: 0,
        }
    }

    /// A failed accept at `now`: how long to pause, and whether to log (with the number of
    /// failures not logged since the last warning).
    fn on_error(&mut self, now: Instant) -> (Duration, Option<u64>) {
        let pause = self.pause;
        self.pause = (self.pause * 2).min(ACCEPT_BACKOFF_MAX);
        let log = match self.last_log {
            Some(t) if now.saturating_duration_since(t) < ACCEPT_ERROR_LOG_INTERVAL => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last_log = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        };
        (pause, log)
    }

    /// A successful accept: the next failure pauses briefly again (the log stays throttled).
    fn on_success(&mut self) {
        self.pause = ACCEPT_BACKOFF_START;
    }
}

/// Answers a connection over the limit with an error (after the TLS handshake on a TLS
/// port) and closes it; `permit` bounds how many such answers are in flight.
async fn reject_over_limit(
    socket: TcpStream,
    peer: SocketAddr,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    config: Arc<ServerConfig>,
    permit: OwnedSemaphorePermit,
) {
    match acceptor {
        None => reject(socket, config.connections_max, permit).await,
        Some(acceptor) => {
            let mut handshake = None;
            if let Some(tls) = tls_handshake(&acceptor, socket, peer, &config, &mut handshake).await
            {
                reject(tls, config.connections_max, permit).await;
            }
        }
    }
}

/// The task of an admitted connection: takes its connection slot (waiting up to
/// `REJECTION_TIME_MAX` for the one an evicted handshake frees, when `slot` is `None`), does
/// the TLS handshake on a TLS port, and serves it.
async fn serve_accepted(
    socket: TcpStream,
    mut conn: Conn,
    slot: Option<OwnedSemaphorePermit>,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    stop: watch::Receiver<Stop>,
    connections: Arc<Semaphore>,
) {
    let slot = match slot {
        Some(slot) => slot,
        None => {
            let wait = connections.acquire_owned();
            match tokio::time::timeout(REJECTION_TIME_MAX, wait).await {
                Ok(Ok(slot)) => slot,
                _ => {
                    refused(&conn.config.metrics, "connection_limit");
                    return;
                }
            }
        }
    };
    let _open = conn.config.metrics.as_ref().map(|m| m.connection_opened());
    match acceptor {
        None => {
            let (rd, wr) = socket.into_split();
            connection(rd, wr, conn, stop).await;
        }
        Some(acceptor) => {
            let peer = conn.peer;
            let tls =
                tls_handshake(&acceptor, socket, peer, &conn.config, &mut conn.handshake).await;
            if let Some(tls) = tls {
                let (rd, wr) = tokio::io::split(tls);
                connection(rd, wr, conn, stop).await;
            }
        }
    }
    drop(slot);
}

async fn serve_until(
    listener: TcpListener,
    streams: Arc<StreamManager>,
    config: ServerConfig,
    stop: watch::Receiver<Stop>,
    connections: Arc<Semaphore>,
) {
    let acceptor = config.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    let shared = Arc::new(Shared::new(&config));
    let config = Arc::new(config);
    let rejections = Arc::new(Semaphore::new(REJECTIONS_IN_FLIGHT_MAX));
    let mut backoff = AcceptBackoff::new();
    let mut per_ip_log = LogThrottle::default();
    let mut refused_log = LogThrottle::default();
    loop {
        match listener.accept().await {
            Ok((socket, peer)) => {
                backoff.on_success();
                let now = Instant::now();
                if let Some(until) = shared.auth_failures.refused_until(peer.ip(), now) {
                    refused(&config.metrics, "auth_failures");
                    if let Some(suppressed) = refused_log.allow(now) {
                        tracing::warn!(ip = %peer.ip(), suppressed, refused_for_ms = until.saturating_duration_since(now).as_millis() as u64, "refusing connections from an address after repeated failed handshakes (bad tokens)");
                    }
                    continue;
                }
                let Some(ip_slot) = shared.admission.admit(peer.ip()) else {
                    refused(&config.metrics, "per_address_limit");
                    if let Some(suppressed) = per_ip_log.allow(now) {
                        tracing::warn!(ip = %peer.ip(), limit = config.connections_per_ip_max, suppressed, "refusing a connection over the per-address connection limit");
                    }
                    continue;
                };
                let _ = socket.set_nodelay(true);
                let slot = match connections.clone().try_acquire_owned() {
                    Ok(slot) => Some(slot),
                    // Full: the connection longest in its handshake makes room, if there is
                    // one; its slot comes free as soon as its task ends.
                    Err(_) if shared.admission.evict_oldest_handshake() => None,
                    Err(_) => {
                        refused(&config.metrics, "connection_limit");
                        tracing::debug!(%peer, limit = config.connections_max, "refusing a connection over the limit");
                        if let Ok(permit) = rejections.clone().try_acquire_owned() {
                            let (acceptor, config) = (acceptor.clone(), config.clone());
                            tokio::spawn(reject_over_limit(socket, peer, acceptor, config, permit));
                        }
                        continue;
                    }
                };
                let handshake = shared.admission.start_handshake();
                let (streams, config, stop, shared, connections) = (
                    streams.clone(),
                    config.clone(),
                    stop.clone(),
                    shared.clone(),
                    connections.clone(),
                );
                let conn = Conn {
                    peer,
                    accepted: Instant::now(),
                    streams,
                    config,
                    shared,
                    handshake: Some(handshake),
                    _ip_slot: ip_slot,
                };
                tokio::spawn(serve_accepted(
                    socket,
                    conn,
                    slot,
                    acceptor.clone(),
                    stop,
                    connections,
                ));
            }
            Err(e) => {
                let (pause, log) = backoff.on_error(Instant::now());
                if let Some(suppressed) = log {
                    tracing::warn!(error = %e, suppressed, pause_ms = pause.as_millis() as u64, "accept failed; pausing before accepting again");
                }
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// Fires when the connection in `handshake` is to close to make room for others
/// ([`ServerConfig::handshakes_max`]); never without one.
async fn evicted(handshake: &mut Option<Handshake>) {
    match handshake {
        Some(h) => {
            if (&mut h.evicted).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// The TLS handshake of an accepted connection, within `config.handshake_timeout`. A failure
/// (a plaintext client, a client without a certificate the CA signed when one is required) is
/// logged in one line and the connection closed; so is a connection told to make room for
/// others while in its handshake (`handshake`).
async fn tls_handshake(
    acceptor: &tokio_rustls::TlsAcceptor,
    socket: TcpStream,
    peer: SocketAddr,
    config: &ServerConfig,
    handshake: &mut Option<Handshake>,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let accept = tokio::time::timeout(config.handshake_timeout, acceptor.accept(socket));
    let done = tokio::select! {
        done = accept => done,
        _ = evicted(handshake) => {
            refused(&config.metrics, "handshake_evicted");
            tracing::debug!(%peer, "closing a connection in its TLS handshake to make room for new ones");
            return None;
        }
    };
    match done {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(e)) => {
            tracing::info!(%peer, error = %quire_tls::describe_handshake_error(&e), "TLS handshake failed; connection closed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "closing a connection that did not complete its TLS handshake in time");
            None
        }
    }
}

/// Answers a connection over the limit with `SERVICE_UNAVAILABLE` (request id 0) and closes it.
/// The write side is shut first and what the client sent is read and dropped, so the close
/// does not reset the connection and discard the answer before the client reads it.
async fn reject<S>(socket: S, limit: usize, _permit: OwnedSemaphorePermit)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let message = format!(
        "the proxy already has its maximum of {limit} open connections; try later or another proxy"
    );
    let answer = encode(
        &Response::Error {
            code: ErrorCode::ServiceUnavailable,
            message,
        },
        0,
        0,
    );
    let (mut rd, mut wr) = tokio::io::split(socket);
    let _ = tokio::time::timeout(REJECTION_TIME_MAX, async move {
        if wr.write_all(&answer.bytes).await.is_ok() && wr.shutdown().await.is_ok() {
            let mut sink = [0u8; 1024];
            while let Ok(1..) = rd.read(&mut sink).await {}
        }
    })
    .await;
}

/// The error answer to a request. A redirect (`STREAM_OWNED_ELSEWHERE`) carries the owner's
/// address alone as its message, for the client to connect to.
fn error_response(e: &Error) -> Response {
    match e {
        Error::OwnedElsewhere { owner, .. } => Response::Error {
            code: ErrorCode::StreamOwnedElsewhere,
            message: owner.clone(),
        },
        other => Response::Error {
            code: other.code(),
            message: other.to_string(),
        },
    }
}

/// Sends the answers queued on `rx` until every sender is gone, or until `flush` fires: then
/// it sends what is queued at that moment and closes (a draining connection's last answers).
/// An answer is dropped, with the response budget it holds, once written. A write that makes
/// no headway for `send_timeout` (the client does not read) ends the connection, and so does
/// one that makes none for `pressure_send_timeout` while the connection holds process-wide
/// response budget that other requests wait for.
async fn writer_loop<W: tokio::io::AsyncWrite + Unpin>(
    mut socket: W,
    mut rx: mpsc::Receiver<Out>,
    mut flush: oneshot::Receiver<()>,
    peer: SocketAddr,
    send_timeout: SendLimits,
) {
    // A flush sender dropped without firing means no drain: serve until the senders are gone.
    let mut flush_armed = true;
    loop {
        let mut held = Vec::new();
        let mut buf = tokio::select! {
            next = rx.recv() => match next {
                Some(out) => {
                    held.push(out.hold);
                    out.bytes
                }
                None => break,
            },
            fired = &mut flush, if flush_armed => {
                if fired.is_err() {
                    flush_armed = false;
                    continue;
                }
                let mut rest = Vec::new();
                while let Ok(more) = rx.try_recv() {
                    rest.extend_from_slice(&more.bytes);
                    held.push(more.hold);
                }
                if !rest.is_empty() && !send(&mut socket, &rest, peer, &send_timeout).await {
                    return;
                }
                break;
            }
        };
        // Coalesce whatever else is ready into one write.
        while buf.len() < 256 * 1024 {
            match rx.try_recv() {
                Ok(more) => {
                    buf.extend_from_slice(&more.bytes);
                    held.push(more.hold);
                }
                Err(_) => break,
            }
        }
        if !send(&mut socket, &buf, peer, &send_timeout).await {
            return;
        }
        drop(held);
    }
    let _ = socket.shutdown().await;
}

/// How long a connection's writer waits for its socket to take bytes.
struct SendLimits {
    /// [`ServerConfig::send_timeout`].
    timeout: Duration,
    /// [`ServerConfig::pressure_send_timeout`].
    pressure_timeout: Duration,
    /// The process-wide response budget, to know when others wait for it.
    pool: Arc<ResponsePool>,
    /// Bytes of it this connection holds.
    held: Arc<AtomicUsize>,
    metrics: Option<Arc<ProxyMetrics>>,
}

/// Writes and flushes `buf` (the flush is a no-op on plain TCP; TLS may hold encrypted records
/// until it); false if the socket failed or took no byte for `limits.timeout`, or for
/// `limits.pressure_timeout` while this connection holds response budget others wait for.
async fn send<W: tokio::io::AsyncWrite + Unpin>(
    socket: &mut W,
    buf: &[u8],
    peer: SocketAddr,
    limits: &SendLimits,
) -> bool {
    let mut written = 0;
    let mut flushed = false;
    let mut progress = Instant::now();
    while !flushed {
        // Registered before the check, so that pressure arriving in between is not missed.
        let pressure = limits.pool.pressure.notified();
        tokio::pin!(pressure);
        pressure.as_mut().enable();
        let pressed = limits.pool.under_pressure() && limits.held.load(Ordering::Acquire) > 0;
        let patience = if pressed {
            limits.pressure_timeout
        } else {
            limits.timeout
        };
        let step = async {
            if written < buf.len() {
                socket.write(&buf[written..]).await.map(Some)
            } else {
                socket.flush().await.map(|()| None)
            }
        };
        tokio::select! {
            r = step => match r {
                Ok(Some(0)) | Err(_) => return false,
                Ok(Some(n)) => {
                    written += n;
                    progress = Instant::now();
                }
                Ok(None) => flushed = true,
            },
            _ = tokio::time::sleep_until(progress + patience) => {
                if pressed {
                    refused(&limits.metrics, "not_reading");
                    tracing::info!(%peer, unwritten_bytes = buf.len() - written, held_bytes = limits.held.load(Ordering::Acquire), timeout_ms = patience.as_millis() as u64, "closing a connection that does not read its answers while other requests wait for the response budget");
                } else {
                    tracing::info!(%peer, bytes = buf.len(), timeout_ms = patience.as_millis() as u64, "closing a connection that did not read its answers within the send timeout");
                }
                return false;
            }
            // Others started waiting: look again with the shorter patience.
            _ = pressure, if !pressed => {}
        }
    }
    true
}

fn encode(resp: &Response, opcode: u8, request_id: u64) -> Out {
    let mut bytes = Vec::new();
    resp.encode(opcode, request_id, &mut bytes);
    Out { bytes, hold: None }
}

/// When a connection last showed activity: a complete frame received or an answer queued.
/// Milliseconds since the connection was accepted, shared with the request tasks.
struct Activity {
    accepted: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        self.last_ms.store(
            self.accepted.elapsed().as_millis() as u64,
            Ordering::Relaxed,
        );
    }

    fn last(&self) -> Instant {
        self.accepted + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// The order of write answers on one connection: per stream, each write's answer is queued for
/// the socket only after the previous write to that stream on this connection had its answer
/// queued, whatever the answer (a success, an error from the stream task, or an error found
/// before the write reached the stream, such as `BAD_REQUEST` for a reserved txid or
/// `RECORD_TOO_LARGE`). Each write is answered by its own task, and tasks woken in order by the
/// stream task (which completes appends strictly in order) may still run in any order on a
/// multi-threaded runtime; the turn is what makes the promise of `docs/proxy-protocol.md`
/// ("writes to a stream are acknowledged in the order the proxy received them") hold on the
/// wire. Writes to different streams do not wait for each other.
#[derive(Default)]
struct WriteTurns {
    /// Per stream: fires when the last write submitted so far has had its answer queued.
    last: HashMap<String, oneshot::Receiver<()>>,
}

impl WriteTurns {
    /// Above this many streams, entries whose write was answered are dropped, so the map holds
    /// at most the streams with a write in flight (bounded by `requests_in_flight_max`) plus
    /// this many.
    const STREAMS_KEPT_MAX: usize = 64;

    /// The turn of the next write to `stream`: the signal to wait for (none for the first write
    /// to it, or when the previous one is long answered) and the sender that passes the turn on.
    fn next(&mut self, stream: &str) -> (Option<oneshot::Receiver<()>>, oneshot::Sender<()>) {
        if self.last.len() >= Self::STREAMS_KEPT_MAX {
            self.last
                .retain(|_, rx| matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Empty)));
        }
        let (done, turn) = oneshot::channel();
        (self.last.insert(stream.to_string(), turn), done)
    }
}

/// Writes of one connection being submitted off its frame loop: a write whose stream is not
/// owned here (or that comes behind such a write to the same stream) is submitted by its own
/// task, because the submit includes the stream's acquisition (metadata read, lease, recovery
/// of the last segment) and every later frame of the connection would wait behind it. Per
/// stream, the map holds the signal of the last such write; the next write to that stream
/// waits for it before it is submitted, so writes to one stream reach it in frame order (the
/// order `docs/proxy-protocol.md` promises, DistributedLog's per-stream write order). Writes to
/// other streams do not wait.
///
/// A signal is a `watch` channel on which nothing is sent: its sender is dropped once the
/// write was handed to the stream (or refused, or its task ended), which every waiter and
/// [`PendingSubmissions::pending`] see as closed.
///
/// Bounded: an entry still pending belongs to a write that holds one of the connection's
/// `requests_in_flight_max` in-flight permits until it is answered (after its submission), and
/// entries whose submission is done are dropped (on the next frame for that stream, on each
/// read of the socket, and before an insert would reach the bound), so the map never holds more
/// than `requests_in_flight_max` streams.
struct PendingSubmissions {
    last: HashMap<String, watch::Receiver<()>>,
    /// `requests_in_flight_max`.
    streams_max: usize,
}

impl PendingSubmissions {
    fn new(streams_max: usize) -> Self {
        Self {
            last: HashMap::new(),
            streams_max: streams_max.max(1),
        }
    }

    /// Whether a write's submission behind `signal` has not yet ended.
    fn is_pending(signal: &watch::Receiver<()>) -> bool {
        !signal.is_closed()
    }

    /// The signal of the last write to `stream` taken off the frame loop, if its submission
    /// has not yet ended; an ended one's entry is dropped.
    fn pending(&mut self, stream: &str) -> Option<watch::Receiver<()>> {
        let signal = self.last.get(stream)?;
        if Self::is_pending(signal) {
            return Some(signal.clone());
        }
        self.last.remove(stream);
        None
    }

    /// Records a write to `stream` about to be submitted off the frame loop; returns the sender
    /// its task drops once the write is submitted.
    fn start(&mut self, stream: &str) -> watch::Sender<()> {
        if self.last.len() >= self.streams_max && !self.last.contains_key(stream) {
            self.prune();
        }
        let (signal, rx) = watch::channel(());
        self.last.insert(stream.to_string(), rx);
        assert!(
            self.last.len() <= self.streams_max,
            "a pending submission holds an in-flight permit"
        );
        signal
    }

    /// Drops the entries whose submission has ended.
    fn prune(&mut self) {
        if !self.last.is_empty() {
            self.last.retain(|_, signal| Self::is_pending(signal));
        }
    }
}

/// Waits until the submission behind `signal` has ended (at once for `None`).
async fn submitted(signal: Option<watch::Receiver<()>>) {
    if let Some(mut signal) = signal {
        // Nothing is ever sent: `changed` fails once the sender is dropped.
        while signal.changed().await.is_ok() {}
    }
}

/// Bytes kept free in the read buffer before each read. Small, so that many idle connections
/// cost little memory; a large frame grows the buffer as it arrives.
const READ_RESERVE_BYTES: usize = 16 * 1024;
/// A read buffer above this capacity is shrunk once it is empty again.
const READ_BUFFER_KEEP_BYTES: usize = 256 * 1024;

/// What a connection task is given besides its socket.
struct Conn {
    peer: SocketAddr,
    /// Starts the handshake deadline.
    accepted: Instant,
    streams: Arc<StreamManager>,
    config: Arc<ServerConfig>,
    shared: Arc<Shared>,
    /// Its place among the connections in their handshake, until the handshake is answered.
    handshake: Option<Handshake>,
    /// Its count in its address's connections, for as long as it is open.
    _ip_slot: IpSlot,
}

/// The connection is to be closed (what `break 'conn` was in one long loop).
struct Close;

/// One connection's state while its frames are read and its requests handled: what it was
/// given ([`Conn`]), its answer queue, its budgets and the receive buffer.
struct ConnState {
    peer: SocketAddr,
    streams: Arc<StreamManager>,
    config: Arc<ServerConfig>,
    shared: Arc<Shared>,
    /// Its place among the connections in their handshake, until the handshake is answered.
    handshake: Option<Handshake>,
    stop: watch::Receiver<Stop>,
    activity: Arc<Activity>,
    /// Encoded answers for the writer task.
    out_tx: mpsc::Sender<Out>,
    /// Bytes of the process-wide response budget this connection holds.
    held: Arc<AtomicUsize>,
    /// This connection's response budget (`connection_response_bytes_max`), one permit a byte.
    responses: Arc<Semaphore>,
    frame_total_max: usize,
    /// The pool bytes reserved for the frame at the front of the buffer, if it is large.
    frame_permit: Option<OwnedSemaphorePermit>,
    /// When the incomplete frame at the front of the buffer started to arrive (or the pool
    /// gave its bytes): the frame timeout counts from it.
    partial_since: Option<Instant>,
    /// The answer tasks of writes in flight (and of writes being submitted off the frame
    /// loop), which a drain waits for.
    writes: tokio::task::JoinSet<()>,
    permits: Arc<Semaphore>,
    turns: WriteTurns,
    submissions: PendingSubmissions,
    /// Frames are taken from its front; the bytes handed out are dropped once per read.
    buf: RecvBuffer,
    greeted: bool,
    /// The handshake's token's rights, when the proxy requires tokens.
    grant: Option<Grant>,
    /// Its count in its address's connections, for as long as it is open.
    _ip_slot: IpSlot,
}

/// What a request task holds until its answer is queued: the frame's request-pool bytes, its
/// in-flight permit, and what it needs to answer.
struct Answer {
    tx: mpsc::Sender<Out>,
    activity: Arc<Activity>,
    opcode: u8,
    request_id: u64,
    received: Instant,
    frame_hold: Option<OwnedSemaphorePermit>,
    permit: OwnedSemaphorePermit,
}

/// What a write's task needs to answer it, in its stream's turn on the connection.
struct WriteReply {
    answer: Answer,
    /// Records in the write.
    count: usize,
    /// The write's charge to the rate limits, outstanding until it is answered.
    admitted: Option<crate::quota::Admitted>,
    /// Fires when the previous write to the stream on this connection had its answer queued.
    previous: Option<oneshot::Receiver<()>>,
    /// Passes the turn on once this answer is queued.
    done: oneshot::Sender<()>,
    metrics: Option<Arc<ProxyMetrics>>,
}

impl WriteReply {
    /// Waits for the outcome of the write `submitted` to its stream and queues its answer in
    /// its turn; then the write's frame bytes and in-flight permit are given back.
    async fn send(self, submitted: Result<oneshot::Receiver<Result<crate::types::WriteResult>>>) {
        let Self {
            answer,
            count,
            admitted,
            previous,
            done,
            metrics,
        } = self;
        // Outstanding until answered (the limits' outstanding-write counts).
        let _admitted = admitted;
        let result = match submitted {
            Ok(rx) => rx.await.unwrap_or(Err(Error::ShuttingDown)),
            Err(e) => Err(e),
        };
        let resp = match result {
            Ok(w) => {
                assert_eq!(w.count as usize, count);
                Response::Write {
                    count: count as u32,
                    first_dlsn: w.first_dlsn,
                    last_dlsn: w.last_dlsn,
                }
            }
            Err(e) => error_response(&e),
        };
        // A predecessor whose task ended without queuing its answer (the connection is
        // closing) no longer holds the turn.
        if let Some(previous) = previous {
            let _ = previous.await;
        }
        record(&metrics, answer.opcode, answer.received, &resp);
        let _ = answer
            .tx
            .send(encode(&resp, answer.opcode, answer.request_id))
            .await;
        let _ = done.send(());
        answer.activity.touch();
        drop(answer.frame_hold);
        drop(answer.permit);
    }
}

/// Serves one connection's two halves, plain TCP or TLS (generic, so that plain TCP has no
/// indirection): frames are read and their requests handled until the client leaves, a
/// protocol error, a timeout or a stop; then the answers still due go out as the stop mode
/// allows.
async fn connection<R, W>(mut rd: R, wr: W, conn: Conn, stop: watch::Receiver<Stop>)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut st, out_rx) = ConnState::new(conn, stop);
    let (flush_tx, flush_rx) = oneshot::channel();
    let limits = SendLimits {
        timeout: st.config.send_timeout,
        pressure_timeout: st.config.pressure_send_timeout,
        pool: st.shared.responses.clone(),
        held: st.held.clone(),
        metrics: st.config.metrics.clone(),
    };
    let writer = tokio::spawn(writer_loop(wr, out_rx, flush_rx, st.peer, limits));
    loop {
        let step = async {
            let consumed = st.handle_frames().await?;
            while st.writes.try_join_next().is_some() {}
            st.submissions.prune();
            let frame_bytes = st.prepare_read(consumed).await?;
            st.read_more(&mut rd, frame_bytes).await
        };
        if step.await.is_err() {
            break;
        }
    }
    let stop = st.stop.clone();
    st.finish(writer, flush_tx).await;
    if *stop.borrow() == Stop::Drain {
        // The writer has sent the last answer and shut the write side: read and drop what
        // the client still sends until it closes, so that closing does not reset the
        // connection and discard that answer before the client reads it.
        let _ = tokio::time::timeout(DRAIN_LINGER_MAX, async {
            let mut sink = [0u8; 4096];
            while let Ok(1..) = rd.read(&mut sink).await {}
        })
        .await;
    }
}

impl ConnState {
    /// The state of a connection just accepted, and the receiving end of its answer queue.
    fn new(conn: Conn, stop: watch::Receiver<Stop>) -> (Self, mpsc::Receiver<Out>) {
        let Conn {
            peer,
            accepted,
            streams,
            config,
            shared,
            handshake,
            _ip_slot,
        } = conn;
        let (out_tx, out_rx) = mpsc::channel::<Out>(config.requests_in_flight_max);
        let frame_total_max = config.frame_size_bytes_max as usize + 4;
        let st = Self {
            peer,
            activity: Arc::new(Activity {
                accepted,
                last_ms: AtomicU64::new(0),
            }),
            out_tx,
            held: Arc::new(AtomicUsize::new(0)),
            responses: Arc::new(Semaphore::new(
                config.connection_response_bytes_max.max(frame_total_max),
            )),
            frame_total_max,
            frame_permit: None,
            partial_since: None,
            writes: tokio::task::JoinSet::new(),
            permits: Arc::new(Semaphore::new(config.requests_in_flight_max)),
            turns: WriteTurns::default(),
            submissions: PendingSubmissions::new(config.requests_in_flight_max),
            buf: RecvBuffer::new(),
            greeted: false,
            grant: None,
            streams,
            config,
            shared,
            handshake,
            stop,
            _ip_slot,
        };
        (st, out_rx)
    }

    /// Queues an error answer (best effort: the connection may be closing).
    async fn send_error(&self, e: &Error, opcode: u8, request_id: u64) {
        let _ = self
            .out_tx
            .send(encode(&error_response(e), opcode, request_id))
            .await;
    }

    /// Handles every whole frame in the buffer; returns whether there was any.
    async fn handle_frames(&mut self) -> Result<bool, Close> {
        let mut consumed = false;
        loop {
            let (opcode, request_id, decoded) = match self
                .buf
                .next_frame(self.config.frame_size_bytes_max)
            {
                Ok(None) => return Ok(consumed),
                Ok(Some(frame)) => (
                    frame.header.opcode,
                    frame.header.request_id,
                    Request::decode(&frame),
                ),
                Err(e) => {
                    // Oversized or undersized length: the stream cannot be resynchronised.
                    tracing::debug!(peer = %self.peer, error = %e, "closing connection after a bad frame");
                    self.send_error(&Error::Protocol(e), 0, 0).await;
                    return Err(Close);
                }
            };
            self.activity.touch();
            consumed = true;
            // Held until the request has been answered (Kafka's memory pool frees a request's
            // bytes once it is handled); a frame that does not decode gives them back at once.
            let frame_hold = self.frame_permit.take();
            let req = match decoded {
                Ok(r) => r,
                Err(e) => {
                    self.send_error(&Error::Protocol(e.clone()), opcode, request_id)
                        .await;
                    if !self.greeted || matches!(e, WireError::BadMagic { .. }) {
                        return Err(Close);
                    }
                    continue;
                }
            };
            self.handle_request(opcode, request_id, req, frame_hold)
                .await?;
        }
    }

    /// Handles one decoded request: the handshake first, then the token's rights, the
    /// response budget and an in-flight permit, then the request itself.
    async fn handle_request(
        &mut self,
        opcode: u8,
        request_id: u64,
        req: Request,
        frame_hold: Option<OwnedSemaphorePermit>,
    ) -> Result<(), Close> {
        let received = Instant::now();
        if !self.greeted {
            return self.hello(opcode, request_id, req).await;
        }
        if let Some(reason) = self.grant.as_ref().and_then(|g| g.check(&req).err()) {
            let resp = error_response(&Error::RequestDenied { reason });
            record(&self.config.metrics, opcode, received, &resp);
            return match self.out_tx.send(encode(&resp, opcode, request_id)).await {
                Ok(()) => Ok(()),
                Err(_) => Err(Close),
            };
        }
        let reservation = self.reserve_response(&req).await?;
        let Ok(permit) = self.permits.clone().acquire_owned().await else {
            return Err(Close);
        };
        let answer = Answer {
            tx: self.out_tx.clone(),
            activity: self.activity.clone(),
            opcode,
            request_id,
            received,
            frame_hold,
            permit,
        };
        match req {
            Request::Hello { .. } => {
                let e = Error::BadRequest {
                    reason: "handshake already done".into(),
                };
                let resp = error_response(&e);
                record(&self.config.metrics, opcode, received, &resp);
                let _ = answer.tx.send(encode(&resp, opcode, request_id)).await;
                Ok(())
            }
            Request::Write {
                stream,
                create_if_missing,
                compress,
                records,
            } => {
                self.write(stream, (create_if_missing, compress), None, records, answer)
                    .await;
                Ok(())
            }
            Request::ProducerWrite {
                stream,
                create_if_missing,
                compress,
                producer,
                records,
            } => {
                let flags = (create_if_missing, compress);
                self.write(stream, flags, Some(producer), records, answer)
                    .await;
                Ok(())
            }
            other => self.spawn_request(other, answer, reservation).await,
        }
    }

    /// The handshake: the first request must be `Hello` with a protocol version this proxy
    /// speaks and, when the proxy requires tokens, a token it knows.
    async fn hello(&mut self, opcode: u8, request_id: u64, req: Request) -> Result<(), Close> {
        let Request::Hello {
            version_min,
            version_max,
            token,
        } = req
        else {
            let e = Error::BadRequest {
                reason: "the first request must be a handshake".into(),
            };
            self.send_error(&e, opcode, request_id).await;
            return Err(Close);
        };
        let version = version_max.min(PROXY_PROTOCOL_VERSION_MAX);
        if version < version_min.max(PROXY_PROTOCOL_VERSION_MIN) {
            let e = Error::UnsupportedVersion {
                peer_min: version_min,
                peer_max: version_max,
                ours_min: PROXY_PROTOCOL_VERSION_MIN,
                ours_max: PROXY_PROTOCOL_VERSION_MAX,
            };
            self.send_error(&e, opcode, request_id).await;
            return Err(Close);
        }
        let config = self.config.clone();
        if let Some(auth) = &config.auth {
            let known = token.as_ref().and_then(|t| auth.authenticate(&t.0));
            let Some(g) = known else {
                return self.refuse_token(token.is_some(), opcode, request_id).await;
            };
            self.grant = Some(g.clone());
            self.shared.auth_failures.succeeded(self.peer.ip());
        }
        let resp = Response::Hello {
            version,
            frame_size_bytes_max: self.config.frame_size_bytes_max,
            record_size_bytes_max: RECORD_SIZE_BYTES_MAX as u32,
        };
        if self
            .out_tx
            .send(encode(&resp, opcode, request_id))
            .await
            .is_err()
        {
            return Err(Close);
        }
        self.greeted = true;
        if let Some(h) = self.handshake.take() {
            h.done();
        }
        Ok(())
    }

    /// Refuses a handshake with a missing or unknown token (`UNAUTHENTICATED`), counted and
    /// logged. Repeated failures from one address are answered later and later (a guesser's
    /// rate falls), holding the connection meanwhile: its address's connection limit bounds
    /// how many it can have waiting. Always closes the connection.
    async fn refuse_token(
        &mut self,
        had_token: bool,
        opcode: u8,
        request_id: u64,
    ) -> Result<(), Close> {
        let peer = self.peer;
        let (reason, label) = if had_token {
            ("the proxy does not know this token", "unknown_token")
        } else {
            (
                "the proxy requires a token (ProxyClient token, quire --token or QUIRE_TOKEN)",
                "missing_token",
            )
        };
        if let Some(m) = &self.config.metrics {
            m.auth_failed(label);
        }
        let verdict = self.shared.auth_failures.failed(peer.ip(), Instant::now());
        match verdict.warn {
            Some(not_warned) => {
                tracing::warn!(%peer, reason, failures = verdict.count, not_warned, delay_ms = verdict.delay.as_millis() as u64, "refused a handshake: bad token")
            }
            None => {
                tracing::debug!(%peer, reason, failures = verdict.count, "refused a handshake: bad token")
            }
        }
        if !verdict.delay.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(verdict.delay) => {}
                _ = self.stop.changed() => return Err(Close),
            }
        }
        let e = Error::Unauthenticated {
            reason: reason.into(),
        };
        self.send_error(&e, opcode, request_id).await;
        Err(Close)
    }

    /// A request with a large answer first takes its share of the response budgets (this
    /// connection's, then the process's): a client that does not read its answers stops
    /// being served here. `None` for requests with small answers.
    async fn reserve_response(&mut self, req: &Request) -> Result<Option<ResponseHold>, Close> {
        let Some(n) = response_bytes_bound(req, &self.config) else {
            return Ok(None);
        };
        let n = n.min(self.frame_total_max);
        let reserve = async {
            let conn = self
                .responses
                .clone()
                .acquire_many_owned(n as u32)
                .await
                .expect("the response budget is never closed");
            let process = self
                .shared
                .responses
                .acquire(self.peer.ip(), n, &self.held)
                .await;
            ResponseHold {
                _conn: conn,
                _process: process,
            }
        };
        tokio::select! {
            r = reserve => Ok(Some(r)),
            _ = self.stop.changed() => Err(Close),
            _ = self.out_tx.closed() => Err(Close),
        }
    }
    /// Charges a write to the rate limits and quotas of its proxy, stream and token
    /// ([`crate::quota`]); `OVER_CAPACITY` if any hard limit would be exceeded (nothing is
    /// written then). Per-stream limits apply where the stream is owned: the stream record's
    /// own limits if this proxy owns it and they are set, else `[limits] stream_*`.
    fn admit_write(
        &self,
        stream: &str,
        records: &[(u64, Vec<u8>)],
    ) -> Result<crate::quota::Admitted> {
        let charge = crate::quota::Charge {
            stream,
            stream_limits: self.streams.owned_stream_limits(stream),
            token: self.grant.as_ref().map(|g| (g.name.as_str(), g.limits)),
            records: records.len() as u64,
            bytes: records.iter().map(|r| r.1.len() as u64).sum(),
        };
        let metrics = self.config.metrics.as_ref();
        match self.shared.limiter.admit(charge) {
            Ok(a) => {
                if let Some(m) = metrics {
                    for (scope, kind) in &a.soft {
                        m.limit_soft_exceeded(scope, kind);
                    }
                }
                Ok(a)
            }
            Err(r) => {
                if let Some(m) = metrics {
                    m.limit_refused(r.scope, r.kind);
                }
                Err(Error::OverCapacity {
                    scope: r.scope,
                    limit: r.kind,
                    detail: r.detail,
                })
            }
        }
    }

    /// A write: submitted to its stream in frame order, and answered by its own task once the
    /// stream task acknowledged it and the previous write to the same stream on this connection
    /// had its answer queued (see `WriteTurns`). A write to a stream owned here is submitted
    /// before the next frame is read; one whose stream must first be acquired, or that comes
    /// behind such a write to the same stream, is submitted by its task, after the write before
    /// it (see `PendingSubmissions`).
    async fn write(
        &mut self,
        stream: String,
        flags: (bool, bool),
        producer: Option<ProducerSeq>,
        records: Vec<(u64, Vec<u8>)>,
        answer: Answer,
    ) {
        let (previous, done) = self.turns.next(&stream);
        let mut reply = WriteReply {
            answer,
            count: records.len(),
            admitted: None,
            previous,
            done,
            metrics: self.config.metrics.clone(),
        };
        let checked = if let Some(record_index) = reserved_txid_index(&records) {
            // Checked here rather than in the stream layer so that no stream is
            // created or acquired for a request that cannot be written.
            Err(Error::ReservedTxid {
                record_index,
                txid: records[record_index].0,
            })
        } else {
            self.admit_write(&stream, &records)
        };
        let submitted = match checked {
            Err(e) => Err(e),
            Ok(a) => {
                reply.admitted = Some(a);
                if let Some(m) = &self.config.metrics {
                    m.write_submitted(&stream, &records);
                }
                let behind = self.submissions.pending(&stream);
                if behind.is_some() || !self.streams.is_owned_here(&stream) {
                    self.submit_apart(stream, behind, producer, records, flags, reply);
                    return;
                }
                self.streams
                    .submit_append(&stream, producer, records, flags)
                    .await
            }
        };
        self.writes.spawn(reply.send(submitted));
    }

    /// Submits a write off the frame loop: its task waits for the submission of the previous
    /// write to the same stream taken off the loop (`behind`), submits it (acquiring the stream
    /// if need be), lets the next one go, and answers it. The submission runs in a task of its
    /// own that the connection's `JoinSet` only waits for, so that a connection closing does
    /// not cancel an acquisition half-way (a write read from the connection is submitted, as
    /// on the inline path); a drain waits for it like for any write in flight.
    fn submit_apart(
        &mut self,
        stream: String,
        behind: Option<watch::Receiver<()>>,
        producer: Option<ProducerSeq>,
        records: Vec<(u64, Vec<u8>)>,
        flags: (bool, bool),
        reply: WriteReply,
    ) {
        let signal = self.submissions.start(&stream);
        let streams = self.streams.clone();
        let task = tokio::spawn(async move {
            submitted(behind).await;
            let result = streams
                .submit_append(&stream, producer, records, flags)
                .await;
            // Handed to the stream (or refused): the next write to it may go.
            drop(signal);
            reply.send(result).await;
        });
        self.writes.spawn(async move {
            let _ = task.await;
        });
    }

    /// Any other request runs as its own task: a catch-up read on the lower-priority read
    /// runtime when there is one, the rest here. After a delete the next frame is taken once
    /// the delete is done and answered (docs/proxy-protocol.md, "Delete stream"), so writes
    /// pipelined behind it find the stream gone rather than being acknowledged and then
    /// deleted with it. Deletes are rare; only this connection waits. A request other than a
    /// read that acts on a stream with a write still being submitted off the frame loop runs
    /// after that submission, as it would have found the write already queued at its stream
    /// had the stream been owned here (a delete, a seal, a truncation behind a write). Reads
    /// do not wait: a read was never ordered after a write still in flight.
    async fn spawn_request(
        &mut self,
        req: Request,
        answer: Answer,
        reservation: Option<ResponseHold>,
    ) -> Result<(), Close> {
        let runtime = match (&req, &self.config.catch_up_read_runtime) {
            (Request::Read { stream, from, .. }, Some(rt))
                if self.streams.is_catch_up_read(stream, *from) =>
            {
                rt.clone()
            }
            _ => tokio::runtime::Handle::current(),
        };
        let streams = self.streams.clone();
        let config = self.config.clone();
        let grant = self.grant.clone();
        let is_delete = matches!(req, Request::DeleteStream { .. });
        let is_read = matches!(req, Request::Read { .. });
        // Writes never come here; reads are not ordered after writes (see above).
        let behind = (!is_read)
            .then(|| req.stream())
            .flatten()
            .and_then(|s| self.submissions.pending(s));
        let task = runtime.spawn(crate::metrics::with_read_flag(async move {
            submitted(behind).await;
            let resp = match handle(req, &streams, &config).await {
                Ok(Response::ListStreams { streams }) if grant.is_some() => {
                    // Only the streams the token may read.
                    let g = grant.as_ref().expect("checked");
                    Response::ListStreams {
                        streams: streams
                            .into_iter()
                            .filter(|s| g.allows(Right::Read, s))
                            .collect(),
                    }
                }
                Ok(Response::ListStreamsPage {
                    streams,
                    next_page_token,
                }) if grant.is_some() => {
                    // Only the streams the token may read; the page may come out shorter.
                    let g = grant.as_ref().expect("checked");
                    Response::ListStreamsPage {
                        streams: streams
                            .into_iter()
                            .filter(|s| g.allows(Right::Read, s))
                            .collect(),
                        next_page_token,
                    }
                }
                Ok(r) => r,
                Err(e) => error_response(&e),
            };
            crate::metrics::record_answer(&config.metrics, answer.opcode, answer.received, &resp);
            let out = encode(&resp, answer.opcode, answer.request_id).holding(reservation);
            let _ = answer.tx.send(out).await;
            answer.activity.touch();
            drop(answer.frame_hold);
            drop(answer.permit);
        }));
        if is_delete {
            tokio::select! {
                _ = task => {}
                _ = self.stop.changed() => return Err(Close),
            }
        } else if !is_read {
            // A drain answers it before its last, connection-level answer (`finish`).
            self.writes.spawn(async move {
                let _ = task.await;
            });
        }
        Ok(())
    }

    /// Before reading: notes when an incomplete frame started to arrive, reserves a large
    /// frame's bytes in the request pool (until the pool can give them this connection is not
    /// read; before the handshake such a frame closes it), and makes room in the buffer.
    /// Returns the length of the frame at the front of the buffer, when known.
    async fn prepare_read(&mut self, consumed: bool) -> Result<Option<usize>, Close> {
        if self.buf.pending().is_empty() {
            self.partial_since = None;
        } else if consumed || self.partial_since.is_none() {
            self.partial_since = Some(Instant::now());
        }
        let frame_bytes = pending_frame_bytes(self.buf.pending());
        if let Some(total) = frame_bytes.filter(|&t| t > FRAME_ALLOWANCE_BYTES) {
            if !self.greeted {
                tracing::info!(peer = %self.peer, frame_bytes = total, "closing a connection whose first frame is too large for a handshake");
                let e = Error::BadRequest {
                    reason: format!("a frame of {total} bytes before the handshake (at most {FRAME_ALLOWANCE_BYTES})"),
                };
                self.send_error(&e, 0, 0).await;
                return Err(Close);
            }
            if self.frame_permit.is_none() {
                self.frame_permit = Some(self.reserve_frame(total).await?);
                self.partial_since = Some(Instant::now());
            }
        }
        let read_into = self.buf.for_read(READ_BUFFER_KEEP_BYTES);
        match frame_bytes {
            // A reserved frame: room for the rest of it at once, no doubling beyond it.
            Some(total) if self.frame_permit.is_some() => read_into.reserve_exact(
                total
                    .saturating_sub(read_into.len())
                    .max(READ_RESERVE_BYTES),
            ),
            _ => read_into.reserve(READ_RESERVE_BYTES),
        }
        Ok(frame_bytes)
    }

    /// Takes a large frame's `total` bytes from the process-wide request pool, waiting (not
    /// reading this connection) while the pool has no room.
    async fn reserve_frame(&mut self, total: usize) -> Result<OwnedSemaphorePermit, Close> {
        let pool = self.shared.request_pool.clone();
        if let Ok(p) = pool.clone().try_acquire_many_owned(total as u32) {
            return Ok(p);
        }
        tracing::debug!(peer = %self.peer, frame_bytes = total, "request pool exhausted; not reading the connection until it has room");
        tokio::select! {
            p = pool.acquire_many_owned(total as u32) => Ok(p.expect("the request pool is never closed")),
            _ = self.stop.changed() => Err(Close),
            _ = self.out_tx.closed() => Err(Close),
        }
    }

    /// Reads more bytes, until the handshake deadline before the handshake, else the idle
    /// deadline (checked again when it passes: requests may have been in flight meanwhile),
    /// and the frame deadline while a frame is incomplete.
    async fn read_more<R>(&mut self, rd: &mut R, frame_bytes: Option<usize>) -> Result<(), Close>
    where
        R: tokio::io::AsyncRead + Unpin,
    {
        let config = &self.config;
        let in_flight = config.requests_in_flight_max - self.permits.available_permits();
        let deadline = if !self.greeted {
            self.activity.accepted + config.handshake_timeout
        } else if in_flight > 0 {
            Instant::now() + config.idle_timeout
        } else {
            self.activity.last() + config.idle_timeout
        };
        let deadline = self
            .partial_since
            .map_or(deadline, |t| deadline.min(t + config.frame_timeout));
        let read_into = self.buf.for_read(READ_BUFFER_KEEP_BYTES);
        tokio::select! {
            n = rd.read_buf(read_into) => match n {
                Ok(0) | Err(_) => Err(Close),
                Ok(_) => {
                    if !self.greeted && quire_tls::looks_like_tls_record(self.buf.pending()) {
                        // A ClientHello reads as a 66 KB frame header: close now rather than
                        // wait for it until the handshake timeout.
                        tracing::info!(peer = %self.peer, "closing a connection that sent a TLS record: a TLS client on this plaintext port");
                        return Err(Close);
                    }
                    Ok(())
                }
            },
            _ = self.stop.changed() => Err(Close),
            _ = self.out_tx.closed() => Err(Close),
            _ = evicted(&mut self.handshake) => {
                refused(&self.config.metrics, "handshake_evicted");
                tracing::debug!(peer = %self.peer, "closing a connection in its handshake to make room for new ones");
                Err(Close)
            }
            _ = tokio::time::sleep_until(deadline) => self.check_deadlines(frame_bytes).await,
        }
    }

    /// After a read wait timed out: closes the connection whose frame, handshake or idle
    /// deadline has passed (with an error answer for the first two); otherwise reading goes
    /// on.
    async fn check_deadlines(&mut self, frame_bytes: Option<usize>) -> Result<(), Close> {
        let (peer, config) = (self.peer, self.config.clone());
        if let Some(since) = self
            .partial_since
            .filter(|t| Instant::now() >= *t + config.frame_timeout)
        {
            tracing::info!(%peer, frame_bytes = frame_bytes.unwrap_or(0), received_bytes = self.buf.pending().len(), waited_ms = since.elapsed().as_millis() as u64, "closing a connection whose frame did not arrive whole within the frame timeout");
            let e = Error::BadRequest {
                reason: format!(
                    "no whole frame within {} ms of its first bytes",
                    config.frame_timeout.as_millis()
                ),
            };
            self.send_error(&e, 0, 0).await;
            return Err(Close);
        }
        if !self.greeted && Instant::now() >= self.activity.accepted + config.handshake_timeout {
            tracing::debug!(%peer, "closing a connection that did not complete its handshake in time");
            let e = Error::BadRequest {
                reason: format!(
                    "no complete handshake within {} ms of connecting",
                    config.handshake_timeout.as_millis()
                ),
            };
            self.send_error(&e, 0, 0).await;
            return Err(Close);
        }
        let idle = config.requests_in_flight_max == self.permits.available_permits();
        if idle && Instant::now() >= self.activity.last() + config.idle_timeout {
            tracing::debug!(%peer, "closing an idle connection");
            return Err(Close);
        }
        Ok(())
    }

    /// After the connection's reading ended: let queued answers (such as the error that
    /// closes the connection) go out, but never wait on requests still running once the
    /// server stops. On a drain, every write read from this connection has been handed to
    /// its stream: their answers are awaited (the stream manager has completed or refused
    /// them all, or will shortly), then what is queued is sent. Tail reads are not waited
    /// for.
    async fn finish(mut self, writer: tokio::task::JoinHandle<()>, flush_tx: oneshot::Sender<()>) {
        let mode = *self.stop.borrow();
        // A drain sends one more answer (below) once the request tasks are done.
        let out_tx = (mode == Stop::Drain).then_some(self.out_tx);
        match mode {
            Stop::Now => writer.abort(),
            Stop::Drain => {
                tokio::select! {
                    _ = async { while self.writes.join_next().await.is_some() {} } => {}
                    _ = self.stop.wait_for(|s| *s == Stop::Now) => {
                        writer.abort();
                        return;
                    }
                }
                // Every request read from this connection but reads is answered: tell the
                // client that whatever it sent and got no answer for was not read, so it can
                // resend it elsewhere (a write too: nothing of it was done).
                let bye = Response::Error {
                    code: ErrorCode::ServiceUnavailable,
                    message: "the proxy is draining and closes this connection; requests not answered before this were not read: send them to another proxy".into(),
                };
                if let Some(tx) = out_tx {
                    let _ = tx.send(encode(&bye, 0, 0)).await;
                }
                let _ = flush_tx.send(());
                tokio::select! {
                    _ = writer => {}
                    _ = self.stop.wait_for(|s| *s == Stop::Now) => {}
                }
            }
            Stop::Running => {
                let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
            }
        }
    }
}

async fn handle(req: Request, streams: &StreamManager, config: &ServerConfig) -> Result<Response> {
    match req {
        Request::CreateStream { stream } => streams
            .create_stream(&stream)
            .await
            .map(|()| Response::CreateStream),
        Request::ListStreams => {
            let names = streams.list_streams().await?;
            let size: usize = names.iter().map(|n| n.len() + 4).sum();
            if size + 64 > config.frame_size_bytes_max as usize {
                return Err(Error::Internal(format!(
                    "{} stream names do not fit one frame",
                    names.len()
                )));
            }
            Ok(Response::ListStreams { streams: names })
        }
        Request::ListStreamsPage {
            prefix,
            page_token,
            page_size,
        } => list_page(streams, &prefix, &page_token, page_size).await,
        Request::Read { .. } => read(req, streams, config).await,
        Request::DescribeStream {
            stream,
            home_region,
            placement,
        } => describe(&stream, (home_region, placement), streams, config).await,
        Request::TruncateStream { stream, before } => streams
            .truncate(&stream, before)
            .await
            .map(|result| Response::TruncateStream { result }),
        Request::DeleteStream { stream } => streams
            .delete_stream(&stream)
            .await
            .map(|segments_deleted| Response::DeleteStream { segments_deleted }),
        Request::SetRetention {
            stream,
            time_secs,
            size_bytes,
            keep_for_subscriptions,
        } => streams
            .set_retention(&stream, time_secs, size_bytes, keep_for_subscriptions)
            .await
            .map(|retention| Response::SetRetention {
                retention: crate::types::wire_retention(retention),
            }),
        Request::SetCompression {
            stream,
            compression,
        } => streams
            .set_compression(&stream, crate::types::stored_compression(compression))
            .await
            .map(|c| Response::SetCompression {
                compression: crate::types::wire_compression(c),
            }),
        Request::SetLimits { stream, limits } => streams
            .set_limits(&stream, limits.map(crate::types::stored_limits))
            .await
            .map(|l| Response::SetLimits {
                limits: l.map(crate::types::wire_limits),
            }),
        Request::SetPlacement { stream, placement } => {
            set_placement(&stream, placement, streams).await
        }
        Request::CommitSubscription {
            stream,
            name,
            position,
        } => streams
            .commit_subscription(&stream, &name, position)
            .await
            .map(|info| Response::Subscription { info }),
        Request::GetSubscription { stream, name } => streams
            .subscription(&stream, &name)
            .await
            .map(|info| Response::Subscription { info }),
        Request::ListSubscriptions { stream } => list_subscriptions(&stream, streams, config).await,
        Request::DeleteSubscription { stream, name } => streams
            .delete_subscription(&stream, &name)
            .await
            .map(|existed| Response::DeleteSubscription { existed }),
        Request::SealStream { stream } => streams
            .seal_stream(&stream)
            .await
            .map(|last_dlsn| Response::SealStream { last_dlsn }),
        Request::OpenProducerSession { stream } => {
            let session_id = streams.open_producer_session(&stream)?;
            Ok(Response::OpenProducerSession { session_id })
        }
        Request::Hello { .. } | Request::Write { .. } | Request::ProducerWrite { .. } => {
            Err(Error::Internal(format!(
                "{:?} is handled by the connection loop",
                Opcode::from_u8(req.opcode() as u8)
            )))
        }
    }
}

/// `READ`, its wait capped by `read_wait_max` and its byte budget by the frame.
async fn read(req: Request, streams: &StreamManager, config: &ServerConfig) -> Result<Response> {
    let Request::Read {
        stream,
        from,
        max_records,
        max_bytes,
        wait_ms,
        with_write_times,
    } = req
    else {
        return Err(Error::Internal(format!("{req:?} is not a read")));
    };
    let wait = Duration::from_millis(u64::from(wait_ms)).min(config.read_wait_max);
    // Leave room for one maximal record past the byte budget and for the headers.
    let max_bytes = (max_bytes as usize).min(read_bytes_cap(config)) as u32;
    let batch = streams
        .read(&stream, from, max_records, max_bytes, wait)
        .await?;
    Ok(Response::Read {
        next: batch.next,
        records: batch.records,
        write_times_ms: with_write_times.then_some(batch.write_times_ms),
        end_of_stream: batch.end_of_stream,
    })
}

/// `DESCRIBE_STREAM`: refused with `Internal` when the answer would not fit one frame.
/// `DESCRIBE_STREAM`; the home region and the placement only to a client that asked for
/// them (request flags `0x01`, `0x02`: an older client cannot decode them).
async fn describe(
    stream: &str,
    (home_region, placement): (bool, bool),
    streams: &StreamManager,
    config: &ServerConfig,
) -> Result<Response> {
    let mut info = streams.describe(stream).await?;
    if !home_region {
        info.metadata.home_region = None;
    }
    if !placement {
        info.metadata.placement = None;
    }
    // A stream with very many segments could outgrow a frame: say so rather than send a frame
    // the client refuses.
    let size = 256 + info.metadata.segments.len() * 80;
    if size > config.frame_size_bytes_max as usize {
        return Err(Error::Internal(format!(
            "stream {stream:?} has {} segments, too many to describe in one frame",
            info.metadata.segments.len()
        )));
    }
    Ok(Response::DescribeStream { info: info.into() })
}

/// `SET_PLACEMENT`: the stream's own placement, set by its owner (`StreamManager::set_placement`).
async fn set_placement(
    stream: &str,
    placement: Option<quire_client::placement::StreamPlacement>,
    streams: &StreamManager,
) -> Result<Response> {
    let stored = placement.map(crate::types::stored_placement);
    let now = streams.set_placement(stream, stored).await?;
    Ok(Response::SetPlacement {
        placement: now.map(crate::types::wire_placement),
    })
}

/// `LIST_SUBSCRIPTIONS`: refused with `Internal` when the answer would not fit one frame.
async fn list_subscriptions(
    stream: &str,
    streams: &StreamManager,
    config: &ServerConfig,
) -> Result<Response> {
    let subscriptions = streams.list_subscriptions(stream).await?;
    let size: usize = subscriptions.iter().map(|s| s.name.len() + 64).sum();
    if size + 64 > config.frame_size_bytes_max as usize {
        return Err(Error::Internal(format!(
            "{} subscriptions of stream {stream:?} do not fit one frame",
            subscriptions.len()
        )));
    }
    Ok(Response::ListSubscriptions { subscriptions })
}

// The wire status of every error must be a known code.
const _: () = assert!(ErrorCode::Ok as u16 == 0);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_failures_back_off_and_are_logged_rarely() {
        // Goal: a persistent accept failure (EMFILE) neither spins nor floods the log.
        // Method: feed 1,000 consecutive failures on a simulated clock that advances by each
        // pause; check the pauses grow to the cap, the warnings are at most one per interval
        // and carry the count of the ones left out, and a success resets the pause only.
        let start = Instant::now();
        let mut now = start;
        let mut b = AcceptBackoff::new();
        let mut pauses = Vec::new();
        let mut logged = Vec::new();
        for _ in 0..1000 {
            let (pause, log) = b.on_error(now);
            if let Some(suppressed) = log {
                logged.push((now, suppressed));
            }
            pauses.push(pause);
            now += pause;
        }
        assert_eq!(pauses[0], ACCEPT_BACKOFF_START);
        assert!(pauses.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*pauses.last().unwrap(), ACCEPT_BACKOFF_MAX);
        let elapsed = now - start;
        let intervals =
            (elapsed.as_secs_f64() / ACCEPT_ERROR_LOG_INTERVAL.as_secs_f64()).ceil() as usize;
        assert!(
            logged.len() <= intervals + 1,
            "{} warnings in {elapsed:?}",
            logged.len()
        );
        assert!(logged.len() >= 2);
        assert_eq!(logged[0].1, 0);
        // Every failure is either warned about or counted (in a later warning or still pending).
        let counted: u64 = logged.iter().map(|(_, s)| *s).sum();
        assert_eq!(logged.len() as u64 + counted + b.suppressed, 1000);
        for w in logged.windows(2) {
            assert!(w[1].0 - w[0].0 >= ACCEPT_ERROR_LOG_INTERVAL);
        }
        b.on_success();
        let (pause, log) = b.on_error(now);
        assert_eq!(pause, ACCEPT_BACKOFF_START);
        assert!(log.is_none(), "the log stays throttled across a success");
    }
}

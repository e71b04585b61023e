//! The proxy client: pipelined connections to proxies, usable from any tokio runtime.
//!
//! A [`ProxyClient`] talks to the proxy it was connected to (its *home* proxy). A request for a
//! stream that another proxy owns is answered with a redirect (`STREAM_OWNED_ELSEWHERE`, the
//! owner's address as message); the client then connects to the owner (connections are kept,
//! one per proxy), remembers the owner of the stream and resends, up to
//! [`ClientConfig::redirects_max`] times, as DistributedLog's client does with `FOUND` and its
//! ownership cache. Later requests for that stream go straight to the cached owner.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quire_wire::frame::{
    decode_frame, RecvBuffer, FRAME_HEADER_SIZE_BYTES, FRAME_SIZE_BYTES_MAX_DEFAULT, RESPONSE_BIT,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio::sync::oneshot;

type TlsStream = tokio_rustls::client::TlsStream<TcpStream>;

/// The read half of a connection, plain or TLS: an enum rather than a box, so the plain path
/// costs one branch.
enum ReadSide {
    Plain(OwnedReadHalf),
    Tls(tokio::io::ReadHalf<TlsStream>),
}

/// The write half of a connection, plain or TLS.
enum WriteSide {
    Plain(OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<TlsStream>),
}

impl AsyncRead for ReadSide {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(r) => std::pin::Pin::new(r).poll_read(cx, buf),
            Self::Tls(r) => std::pin::Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WriteSide {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(w) => std::pin::Pin::new(w).poll_write(cx, buf),
            Self::Tls(w) => std::pin::Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(w) => std::pin::Pin::new(w).poll_flush(cx),
            Self::Tls(w) => std::pin::Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(w) => std::pin::Pin::new(w).poll_shutdown(cx),
            Self::Tls(w) => std::pin::Pin::new(w).poll_shutdown(cx),
        }
    }
}

use crate::dlsn::Dlsn;
use crate::dlsn::ReadPosition;
use crate::error::{Error, ErrorCode, Result};
use crate::protocol::{
    Opcode, Request, Response, Token, PROXY_PROTOCOL_VERSION_MAX, PROXY_PROTOCOL_VERSION_MIN,
    TXID_RESERVED, WRITE_RECORD_OVERHEAD_BYTES,
};
use crate::types::{ReadBatch, RetentionChange, StreamInfo, TruncateResult, WriteResult};
use quire_metadata::RetentionOverride;

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Longest wait for the TCP connection, and then again for the proxy's answer to the
    /// handshake (`HandshakeTimeout` when it does not come).
    pub connect_timeout: Duration,
    /// Longest wait for a response, on top of a read's own `wait`.
    pub request_timeout: Duration,
    /// Redirects followed for one request before giving up with `RedirectFailed`
    /// (DistributedLog's `maxRedirects`, there unbounded by default).
    pub redirects_max: u32,
    /// The token sent in every handshake (this client's connections to its home proxy and to
    /// the proxies it is redirected to), for proxies that require one ([`crate::auth`]);
    /// `None` (the default): none is sent. A proxy that requires a token refuses the
    /// connection with `UNAUTHENTICATED` (401) when it is missing or unknown.
    pub token: Option<Token>,
    /// TLS to every proxy, from `quire_tls::ClientTls::client_config` (the CA that signs the
    /// proxies' certificates and, where they require one, this client's certificate); `None`,
    /// the default, is plain TCP.
    pub tls: Option<Arc<quire_tls::rustls::ClientConfig>>,
    /// The name the home proxy's certificate must carry; `None`: the IP address connected to.
    /// Proxies reached by a redirect are checked against the host of the address they
    /// advertise.
    pub tls_server_name: Option<String>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            redirects_max: 4,
            token: None,
            tls: None,
            tls_server_name: None,
        }
    }
}

/// Pause before following a redirect again within one request (DistributedLog
/// `redirectBackoffStartMs`); doubled per hop up to [`REDIRECT_BACKOFF_MAX`].
const REDIRECT_BACKOFF_START: Duration = Duration::from_millis(25);
/// Longest pause between redirects (DistributedLog `redirectBackoffMaxMs`).
const REDIRECT_BACKOFF_MAX: Duration = Duration::from_millis(100);

type Pending = HashMap<u64, oneshot::Sender<Result<Response>>>;

struct Shared {
    pending: Mutex<Option<Pending>>,
}

impl Shared {
    fn fail_all(&self, make: impl Fn() -> Error) {
        let taken = self.pending.lock().expect("pending lock").take();
        for (_, tx) in taken.into_iter().flatten() {
            let _ = tx.send(Err(make()));
        }
    }
}

/// A connection to one proxy. Requests are pipelined: any number of calls may be in flight at
/// once, each matched to its response by request id.
struct Connection {
    /// The address as the client knows it (what it connected to).
    addr: String,
    /// The name the proxy's certificate was checked against (TLS only).
    tls_name: Option<quire_tls::rustls::pki_types::ServerName<'static>>,
    writer: tokio::sync::Mutex<WriteSide>,
    shared: Arc<Shared>,
    next_request_id: AtomicU64,
    frame_size_bytes_max: u32,
    record_size_bytes_max: u32,
    config: ClientConfig,
    reader_task: tokio::task::JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader_task.abort();
    }
}

/// Capacity a response buffer keeps once it is empty again (one large answer must not pin its
/// memory for the life of the connection).
const READ_BUFFER_KEEP_BYTES: usize = 256 * 1024;

/// The next response and its request id, reading more from `rd` as needed. Frames are taken
/// from the front of `buf`; the bytes handed out are dropped once per read, not once per frame.
async fn read_one_frame(
    rd: &mut ReadSide,
    buf: &mut RecvBuffer,
    max: u32,
) -> Result<(Response, u64)> {
    loop {
        if let Some(frame) = buf.next_frame(max)? {
            let resp = Response::decode(&frame)?;
            return Ok((resp, frame.header.request_id));
        }
        let mut chunk = [0u8; 64 * 1024];
        let n = rd.read(&mut chunk).await.map_err(|source| Error::Io {
            op: "read response",
            source,
        })?;
        if n == 0 {
            return Err(Error::Io {
                op: "read response",
                source: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "proxy closed the connection",
                ),
            });
        }
        buf.for_read(READ_BUFFER_KEEP_BYTES)
            .extend_from_slice(&chunk[..n]);
    }
}

/// Bytes of a foreign answer shown in a `NotAProxy` error.
const ANSWER_PREVIEW_BYTES: usize = 48;

/// Describes bytes that are not a proxy's answer, for `NotAProxy`: the first line when they
/// are text (an HTTP status line, a banner), else their first bytes in hex.
fn describe_answer(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(ANSWER_PREVIEW_BYTES)];
    let line_end = head
        .iter()
        .position(|b| *b == b'\r' || *b == b'\n')
        .unwrap_or(head.len());
    let line = &head[..line_end];
    if !line.is_empty() && line.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        let more = if line_end < bytes.len() { " ..." } else { "" };
        return format!("the text {:?}{more}", String::from_utf8_lossy(line));
    }
    let hex: Vec<String> = head.iter().map(|b| format!("{b:02x}")).collect();
    let more = if head.len() < bytes.len() { " ..." } else { "" };
    format!("{} bytes: {}{more}", bytes.len(), hex.join(" "))
}

/// What arrived in answer to the handshake.
enum HandshakeAnswer {
    /// A proxy's `HELLO` answer.
    Hello {
        version: u16,
        frame_size_bytes_max: u32,
        record_size_bytes_max: u32,
    },
    /// A proxy's error answer (to the handshake, or connection-level with request id 0).
    Refused { code: ErrorCode, message: String },
}

/// Reads the answer to the handshake and tells a proxy's answer from anything else: only a
/// frame with opcode `HELLO | 0x80` (or a connection-level error: opcode `0x80`, request id 0)
/// that decodes as a proxy response is one.
async fn read_handshake_answer(
    rd: &mut ReadSide,
    buf: &mut Vec<u8>,
    addr: &str,
) -> Result<HandshakeAnswer> {
    let not_a_proxy = |answer: String| Error::NotAProxy {
        addr: addr.to_string(),
        answer,
    };
    loop {
        if matches!(rd, ReadSide::Plain(_)) && quire_tls::looks_like_tls_record(buf) {
            return Err(Error::Tls {
                addr: addr.to_string(),
                reason: "the proxy answered with TLS: its port requires TLS, give this client the TLS CA file".into(),
            });
        }
        match decode_frame(buf, FRAME_SIZE_BYTES_MAX_DEFAULT) {
            Err(_) => return Err(not_a_proxy(describe_answer(buf))),
            Ok(Some((frame, used))) => {
                let h = frame.header;
                let hello_answer = h.opcode == Opcode::Hello as u8 | RESPONSE_BIT;
                let connection_error =
                    h.opcode == RESPONSE_BIT && h.request_id == 0 && h.status != 0;
                let describe_frame = || {
                    format!("a frame with opcode {:#04x}, status {} and a {}-byte body, which no proxy sends", h.opcode, h.status, frame.body.len())
                };
                if !hello_answer && !connection_error {
                    return Err(not_a_proxy(describe_frame()));
                }
                let answer = match Response::decode(&frame) {
                    Ok(Response::Hello {
                        version,
                        frame_size_bytes_max,
                        record_size_bytes_max,
                    }) => HandshakeAnswer::Hello {
                        version,
                        frame_size_bytes_max,
                        record_size_bytes_max,
                    },
                    Ok(Response::Error { code, message }) => {
                        HandshakeAnswer::Refused { code, message }
                    }
                    Ok(_) | Err(_) => return Err(not_a_proxy(describe_frame())),
                };
                buf.drain(..used);
                return Ok(answer);
            }
            Ok(None) => {}
        }
        let mut chunk = [0u8; 4096];
        let n = rd.read(&mut chunk).await.map_err(|source| Error::Io {
            op: "read handshake answer",
            source,
        })?;
        if n == 0 {
            if buf.is_empty() {
                return Err(Error::Io {
                    op: "read handshake answer",
                    source: std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("{addr} closed the connection without answering the handshake"),
                    ),
                });
            }
            return Err(not_a_proxy(format!(
                "{}, then closed the connection",
                describe_answer(buf)
            )));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

impl Connection {
    /// Connects to `addr` (bounded by `connect_timeout`) and performs the handshake (bounded
    /// by `connect_timeout` again).
    ///
    /// With `config.tls`, the TLS handshake comes first (bounded by `connect_timeout` too) and
    /// the proxy's certificate must carry `name` (`None`: `config.tls_server_name`, else the
    /// IP address connected to).
    async fn connect(
        addr: impl ToSocketAddrs,
        config: ClientConfig,
        name: Option<quire_tls::rustls::pki_types::ServerName<'static>>,
    ) -> Result<Self> {
        let timeout = config.connect_timeout;
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| Error::Io {
                op: "connect",
                source: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("TCP connect did not complete within {timeout:?}"),
                ),
            })?
            .map_err(|source| Error::Io {
                op: "connect",
                source,
            })?;
        let peer = stream.peer_addr().map_err(|source| Error::Io {
            op: "peer_addr",
            source,
        })?;
        stream.set_nodelay(true).map_err(|source| Error::Io {
            op: "set_nodelay",
            source,
        })?;
        let addr = peer.to_string();
        let mut tls_name = None;
        let (mut rd, mut wr) = match &config.tls {
            None => {
                let (rd, wr) = stream.into_split();
                (ReadSide::Plain(rd), WriteSide::Plain(wr))
            }
            Some(tls) => {
                let tls_error = |reason: String| Error::Tls {
                    addr: addr.clone(),
                    reason,
                };
                let name = match (name, &config.tls_server_name) {
                    (Some(name), _) => name,
                    (None, Some(host)) => {
                        quire_tls::server_name(host).map_err(|e| tls_error(e.to_string()))?
                    }
                    (None, None) => {
                        quire_tls::rustls::pki_types::ServerName::IpAddress(peer.ip().into())
                    }
                };
                tls_name = Some(name.clone());
                let connector = tokio_rustls::TlsConnector::from(tls.clone());
                let stream = tokio::time::timeout(timeout, connector.connect(name, stream))
                    .await
                    .map_err(|_| tls_error(format!("no TLS handshake within {timeout:?}")))?
                    .map_err(|e| {
                        tls_error(format!(
                            "handshake: {}",
                            quire_tls::describe_handshake_error(&e)
                        ))
                    })?;
                let (rd, wr) = tokio::io::split(stream);
                (ReadSide::Tls(rd), WriteSide::Tls(wr))
            }
        };
        let mut out = Vec::new();
        Request::Hello {
            version_min: PROXY_PROTOCOL_VERSION_MIN,
            version_max: PROXY_PROTOCOL_VERSION_MAX,
            token: config.token.clone(),
        }
        .encode(0, &mut out);
        // The flush is a no-op on plain TCP; TLS may hold encrypted records until it.
        let sent = match wr.write_all(&out).await {
            Ok(()) => wr.flush().await,
            Err(e) => Err(e),
        };
        sent.map_err(|source| Error::Io {
            op: "send handshake",
            source,
        })?;
        let mut buf = Vec::new();
        let answer =
            match tokio::time::timeout(timeout, read_handshake_answer(&mut rd, &mut buf, &addr))
                .await
            {
                // With TLS 1.3 a server refuses a client certificate after the client's side of
                // the handshake is done, so the refusal (an alert) arrives here.
                Ok(Err(Error::Io { op, source }))
                    if config.tls.is_some() && source.to_string().contains("alert") =>
                {
                    return Err(Error::Tls {
                        addr,
                        reason: format!("the proxy ended the connection during {op}: {source} (it requires a client certificate its CA signed)"),
                    })
                }
                Ok(answer) => answer?,
                Err(_) if buf.is_empty() => {
                    return Err(Error::HandshakeTimeout {
                        addr,
                        waited: timeout,
                    })
                }
                Err(_) => {
                    let answer = format!(
                        "{}, then nothing more for {timeout:?}",
                        describe_answer(&buf)
                    );
                    return Err(Error::NotAProxy { addr, answer });
                }
            };
        let (frame_size_bytes_max, record_size_bytes_max) = match answer {
            HandshakeAnswer::Hello {
                version,
                frame_size_bytes_max,
                record_size_bytes_max,
            } => {
                if !(PROXY_PROTOCOL_VERSION_MIN..=PROXY_PROTOCOL_VERSION_MAX).contains(&version) {
                    return Err(Error::UnsupportedVersion {
                        peer_min: version,
                        peer_max: version,
                        ours_min: PROXY_PROTOCOL_VERSION_MIN,
                        ours_max: PROXY_PROTOCOL_VERSION_MAX,
                    });
                }
                (frame_size_bytes_max, record_size_bytes_max)
            }
            HandshakeAnswer::Refused { code, message } => {
                return Err(Error::Remote { code, message })
            }
        };
        // The frame limit must leave room for one maximal record in a request.
        if (frame_size_bytes_max as usize) < record_size_bytes_max as usize + 64 * 1024 {
            return Err(Error::Internal(format!(
                "proxy frame limit {frame_size_bytes_max} is too small for its record limit {record_size_bytes_max}"
            )));
        }
        let shared = Arc::new(Shared {
            pending: Mutex::new(Some(HashMap::new())),
        });
        let reader_task = tokio::spawn(Self::reader_loop(
            rd,
            buf,
            frame_size_bytes_max,
            shared.clone(),
        ));
        Ok(Self {
            addr,
            tls_name,
            writer: tokio::sync::Mutex::new(wr),
            shared,
            next_request_id: AtomicU64::new(1),
            frame_size_bytes_max,
            record_size_bytes_max,
            config,
            reader_task,
        })
    }

    async fn reader_loop(mut rd: ReadSide, buf: Vec<u8>, max: u32, shared: Arc<Shared>) {
        let mut buf = RecvBuffer::from(buf);
        loop {
            match read_one_frame(&mut rd, &mut buf, max).await {
                Ok((resp, 0)) => {
                    // Request id 0 answers no request of ours: the proxy refused the connection.
                    let (code, message) = match resp {
                        Response::Error { code, message } => (code, message),
                        other => (
                            crate::ErrorCode::Internal,
                            format!("unsolicited response {other:?}"),
                        ),
                    };
                    shared.fail_all(|| Error::Remote {
                        code,
                        message: message.clone(),
                    });
                    return;
                }
                Ok((resp, id)) => {
                    let tx = shared
                        .pending
                        .lock()
                        .expect("pending lock")
                        .as_mut()
                        .and_then(|p| p.remove(&id));
                    if let Some(tx) = tx {
                        let _ = tx.send(Ok(resp));
                    }
                }
                Err(e) => {
                    let text = e.to_string();
                    shared.fail_all(|| Error::Io {
                        op: "receive",
                        source: std::io::Error::new(
                            std::io::ErrorKind::ConnectionAborted,
                            text.clone(),
                        ),
                    });
                    return;
                }
            }
        }
    }

    async fn call(&self, req: &Request, extra_wait: Duration) -> Result<Response> {
        let id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.shared.pending.lock().expect("pending lock");
            let Some(p) = p.as_mut() else {
                return Err(Error::Io {
                    op: "send request",
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotConnected,
                        "connection to the proxy is closed",
                    ),
                });
            };
            p.insert(id, tx);
        }
        let mut out = Vec::new();
        req.encode(id, &mut out);
        {
            let mut w = self.writer.lock().await;
            let sent = match w.write_all(&out).await {
                Ok(()) => w.flush().await,
                Err(e) => Err(e),
            };
            if let Err(source) = sent {
                self.forget(id);
                return Err(Error::Io {
                    op: "send request",
                    source,
                });
            }
        }
        let deadline = self.config.request_timeout + extra_wait;
        match tokio::time::timeout(deadline, rx).await {
            Ok(Ok(Ok(Response::Error { code, message }))) => Err(Error::Remote { code, message }),
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(Error::Io {
                op: "receive",
                source: std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "connection to the proxy closed",
                ),
            }),
            Err(_) => {
                self.forget(id);
                Err(Error::Io {
                    op: "receive",
                    source: std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no response within {deadline:?}"),
                    ),
                })
            }
        }
    }

    fn forget(&self, id: u64) {
        if let Some(p) = self.shared.pending.lock().expect("pending lock").as_mut() {
            p.remove(&id);
        }
    }

    fn is_closed(&self) -> bool {
        self.shared.pending.lock().expect("pending lock").is_none()
    }
}

/// A client of the proxy tier: a connection to its home proxy, plus connections to the owners
/// of streams it was redirected to. Requests are pipelined: any number of calls may be in
/// flight from a shared `&ProxyClient` at once.
///
/// # Threading
/// Shared (`Send + Sync`); call from any tokio task.
pub struct ProxyClient {
    /// The home proxy's address (as connected to first).
    home_addr: String,
    /// The name the home proxy's certificate carries (TLS only), checked again on reconnects.
    home_name: Option<quire_tls::rustls::pki_types::ServerName<'static>>,
    /// The connection to the home proxy; replaced when the proxy closed it (idle timeout,
    /// restart).
    home: Mutex<Arc<Connection>>,
    config: ClientConfig,
    /// Connections to other proxies, by the address their redirects named.
    others: tokio::sync::Mutex<HashMap<String, Arc<Connection>>>,
    /// Ownership cache: stream -> owner address (DistributedLog `OwnershipCache`).
    owners: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for ProxyClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyClient")
            .field("home", &self.home_addr)
            .field("frame_size_bytes_max", &self.frame_size_bytes_max())
            .finish()
    }
}

impl ProxyClient {
    /// Connects to a home proxy and performs the handshake, with default settings.
    ///
    /// # Errors
    /// `Io` if the address cannot be reached (or closes the connection without answering);
    /// `HandshakeTimeout` if it accepts the connection but does not answer the handshake within
    /// `ClientConfig::connect_timeout`; `NotAProxy` if it answers with something that is not a
    /// proxy's handshake answer (a bookie, an HTTP server); `Remote` if the proxy refuses the
    /// connection (`SERVICE_UNAVAILABLE` at its connection limit); `UnsupportedVersion`.
    pub async fn connect(addr: impl ToSocketAddrs) -> Result<Self> {
        Self::connect_with(addr, ClientConfig::default()).await
    }

    /// Connects with explicit settings.
    ///
    /// # Errors
    /// As [`ProxyClient::connect`].
    pub async fn connect_with(addr: impl ToSocketAddrs, config: ClientConfig) -> Result<Self> {
        let home = Connection::connect(addr, config.clone(), None).await?;
        Ok(Self {
            home_addr: home.addr.clone(),
            home_name: home.tls_name.clone(),
            home: Mutex::new(Arc::new(home)),
            config,
            others: tokio::sync::Mutex::new(HashMap::new()),
            owners: Mutex::new(HashMap::new()),
        })
    }

    /// The frame limit the home proxy announced. Writes are split to fit it.
    pub fn frame_size_bytes_max(&self) -> u32 {
        self.home.lock().expect("home lock").frame_size_bytes_max
    }

    /// The record limit the home proxy announced.
    pub fn record_size_bytes_max(&self) -> u32 {
        self.home.lock().expect("home lock").record_size_bytes_max
    }

    /// The owner this client last learned for `stream` from a redirect, if any.
    pub fn cached_owner(&self, stream: &str) -> Option<String> {
        self.owners
            .lock()
            .expect("owners lock")
            .get(stream)
            .cloned()
    }

    fn forget_owner(&self, stream: &str) {
        self.owners.lock().expect("owners lock").remove(stream);
    }

    /// The connection to the home proxy, connecting again (with a new handshake) if the proxy
    /// closed the previous one, for example after its idle timeout. Safe: nothing of the
    /// request about to be sent went over the closed connection.
    async fn home(&self) -> Result<Arc<Connection>> {
        let current = self.home.lock().expect("home lock").clone();
        if !current.is_closed() {
            return Ok(current);
        }
        tracing::debug!(proxy = %self.home_addr, "the home proxy closed the connection; connecting again");
        let fresh = Arc::new(
            Connection::connect(
                self.home_addr.as_str(),
                self.config.clone(),
                self.home_name.clone(),
            )
            .await?,
        );
        *self.home.lock().expect("home lock") = fresh.clone();
        Ok(fresh)
    }

    /// The connection to `addr`: the home one, a kept one, or a new one.
    async fn connection_to(&self, addr: &str) -> Result<Arc<Connection>> {
        if addr == self.home_addr {
            return self.home().await;
        }
        let mut others = self.others.lock().await;
        if let Some(c) = others.get(addr) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let name = match &self.config.tls {
            Some(_) => Some(quire_tls::server_name(addr).map_err(|e| Error::Tls {
                addr: addr.to_string(),
                reason: e.to_string(),
            })?),
            None => None,
        };
        let c = Arc::new(Connection::connect(addr, self.config.clone(), name).await?);
        others.insert(addr.to_string(), c.clone());
        Ok(c)
    }

    async fn drop_connection(&self, addr: &str) {
        self.others.lock().await.remove(addr);
    }

    /// Sends a request about `stream` to its owner as far as known (the cached owner, else the
    /// home proxy) and follows redirects.
    async fn call_stream(
        &self,
        stream: &str,
        req: &Request,
        extra_wait: Duration,
    ) -> Result<Response> {
        let mut target = self.cached_owner(stream);
        let mut from_cache = target.is_some();
        let mut hops = 0u32;
        let mut backoff = REDIRECT_BACKOFF_START;
        loop {
            let conn = match &target {
                None => self.home().await?,
                Some(addr) => match self.connection_to(addr).await {
                    Ok(c) => c,
                    Err(e) if from_cache => {
                        // A stale cache entry: nothing was sent, ask the home proxy instead.
                        tracing::debug!(stream, owner = %addr, error = %e, "cached owner unreachable");
                        self.forget_owner(stream);
                        target = None;
                        from_cache = false;
                        continue;
                    }
                    Err(e) => {
                        self.forget_owner(stream);
                        return Err(Error::RedirectFailed {
                            stream: stream.to_string(),
                            owner: addr.clone(),
                            reason: format!("cannot connect: {e}"),
                        });
                    }
                },
            };
            match conn.call(req, extra_wait).await {
                Err(Error::Remote {
                    code: ErrorCode::StreamOwnedElsewhere,
                    message: owner,
                }) => {
                    hops += 1;
                    if owner == conn.addr {
                        self.forget_owner(stream);
                        return Err(Error::RedirectFailed {
                            stream: stream.to_string(),
                            owner,
                            reason: "the owner is an earlier session of this same proxy (it restarted); \
                                     the stream frees up once that ZooKeeper session expires, retry after the session timeout"
                                .into(),
                        });
                    }
                    if hops > self.config.redirects_max {
                        self.forget_owner(stream);
                        return Err(Error::RedirectFailed {
                            stream: stream.to_string(),
                            owner,
                            reason: format!(
                                "gave up after {} redirects",
                                self.config.redirects_max
                            ),
                        });
                    }
                    if hops > 1 {
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(REDIRECT_BACKOFF_MAX);
                    }
                    tracing::debug!(stream, %owner, hops, "following redirect");
                    self.owners
                        .lock()
                        .expect("owners lock")
                        .insert(stream.to_string(), owner.clone());
                    target = Some(owner);
                    from_cache = false;
                }
                Err(Error::Remote {
                    code: ErrorCode::ServiceUnavailable,
                    ..
                }) if target.is_some() => {
                    // The owner we were sent to is shutting down and did nothing with the
                    // request (DistributedLog: SERVICE_UNAVAILABLE marks the host down and the
                    // request goes elsewhere): ask the home proxy who owns the stream now.
                    hops += 1;
                    if hops > self.config.redirects_max {
                        self.forget_owner(stream);
                        return Err(Error::RedirectFailed {
                            stream: stream.to_string(),
                            owner: conn.addr.clone(),
                            reason: format!(
                                "gave up after {} redirects",
                                self.config.redirects_max
                            ),
                        });
                    }
                    self.forget_owner(stream);
                    self.drop_connection(&conn.addr).await;
                    target = None;
                    from_cache = false;
                }
                Err(
                    e @ Error::Remote {
                        code: ErrorCode::OwnershipLost,
                        ..
                    },
                ) => {
                    self.forget_owner(stream);
                    return Err(e);
                }
                Err(e @ Error::Io { .. }) => {
                    // The request may or may not have been processed: never resend it, but route
                    // the next request afresh.
                    if let Some(addr) = &target {
                        self.drop_connection(addr).await;
                        self.forget_owner(stream);
                    }
                    return Err(e);
                }
                other => return other,
            }
        }
    }

    /// Creates an empty stream.
    ///
    /// # Errors
    /// `Remote` with `StreamExists`, `InvalidStreamName` or `Metadata`; `Io` on connection loss.
    pub async fn create_stream(&self, stream: &str) -> Result<()> {
        match self
            .home()
            .await?
            .call(
                &Request::CreateStream {
                    stream: stream.to_string(),
                },
                Duration::ZERO,
            )
            .await?
        {
            Response::CreateStream => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Names of every stream, sorted.
    ///
    /// # Errors
    /// `Remote` with `Metadata`; `Io` on connection loss.
    pub async fn list_streams(&self) -> Result<Vec<String>> {
        match self
            .home()
            .await?
            .call(&Request::ListStreams, Duration::ZERO)
            .await?
        {
            Response::ListStreams { streams } => Ok(streams),
            other => Err(unexpected(&other)),
        }
    }

    /// Appends `records` (`(txid, payload)`, txids non-decreasing) to `stream` and returns once
    /// every record is durable on the bookies' ack quorum.
    ///
    /// A write whose request would exceed the proxy's frame limit is split into several
    /// requests sent one after another; they land in order. Record sizes and the txid order
    /// inside `records` are checked before anything is sent.
    ///
    /// # Errors
    /// `RecordTooLarge`, `ReservedTxid` (a txid is `u64::MAX`, reserved for end-of-stream as in
    /// DistributedLog) or `TxidOutOfOrder` (nothing sent); `Remote` with the proxy's code
    /// (`NoSuchStream`, `TxidOutOfOrder`, `Storage`, `OwnershipLost` (outcome unknown, not
    /// retried), ...); `RedirectFailed` when the stream's owner cannot be reached through
    /// redirects. If a later part of a split write fails, the earlier parts stay written; the
    /// error message says how many records were acknowledged.
    ///
    /// Each part goes to the stream's owner: the cached one, else the home proxy, following
    /// `STREAM_OWNED_ELSEWHERE` redirects.
    pub async fn write(
        &self,
        stream: &str,
        records: Vec<(u64, Vec<u8>)>,
        create_if_missing: bool,
    ) -> Result<WriteResult> {
        if records.is_empty() {
            return Err(Error::BadRequest {
                reason: "a write needs at least one record".into(),
            });
        }
        for (i, (txid, p)) in records.iter().enumerate() {
            if p.len() > self.record_size_bytes_max() as usize {
                return Err(Error::RecordTooLarge {
                    record_index: i,
                    size_bytes: p.len(),
                    max_bytes: self.record_size_bytes_max() as usize,
                });
            }
            if *txid == TXID_RESERVED {
                return Err(Error::ReservedTxid {
                    record_index: i,
                    txid: *txid,
                });
            }
            if i > 0 && *txid < records[i - 1].0 {
                return Err(Error::TxidOutOfOrder {
                    record_index: i,
                    txid: *txid,
                    last_txid: records[i - 1].0,
                });
            }
        }
        // Room for the records in one frame: the limit minus the header, name and count, with
        // some slack.
        let budget =
            self.frame_size_bytes_max() as usize - FRAME_HEADER_SIZE_BYTES - stream.len() - 64;
        let mut result: Option<WriteResult> = None;
        let mut rest = records;
        while !rest.is_empty() {
            let mut used = 0usize;
            let mut n = 0usize;
            for (_, p) in &rest {
                let size = p.len() + WRITE_RECORD_OVERHEAD_BYTES;
                if n > 0 && used + size > budget {
                    break;
                }
                used += size;
                n += 1;
            }
            let tail = rest.split_off(n);
            let chunk = std::mem::replace(&mut rest, tail);
            let written = result.map_or(0, |r| r.count);
            let req = Request::Write {
                stream: stream.to_string(),
                create_if_missing,
                records: chunk,
            };
            let resp = self.call_stream(stream, &req, Duration::ZERO).await;
            let resp = match resp {
                Err(Error::Remote { code, message }) if written > 0 => {
                    return Err(Error::Remote {
                        code,
                        message: format!(
                            "{message} (after {written} records of this write were acknowledged)"
                        ),
                    })
                }
                other => other?,
            };
            match resp {
                Response::Write {
                    count,
                    first_dlsn,
                    last_dlsn,
                } => {
                    result = Some(match result {
                        None => WriteResult {
                            first_dlsn,
                            last_dlsn,
                            count: u64::from(count),
                        },
                        Some(r) => WriteResult {
                            first_dlsn: r.first_dlsn,
                            last_dlsn,
                            count: r.count + u64::from(count),
                        },
                    });
                }
                other => return Err(unexpected(&other)),
            }
        }
        Ok(result.expect("at least one chunk was written"))
    }

    /// Reads up to `max_records` records and about `max_bytes` payload bytes from `from`
    /// (at least one record when one is available). When nothing is available yet, waits up to
    /// `wait` for new records (tailing); an empty batch means none arrived in time.
    ///
    /// # Errors
    /// `Remote` with `NoSuchStream`, `BadRequest` or `Storage`; `RedirectFailed` when the
    /// stream's owner (who serves its reads) cannot be reached; `Io` on connection loss.
    pub async fn read(
        &self,
        stream: &str,
        from: ReadPosition,
        max_records: u32,
        max_bytes: u32,
        wait: Duration,
    ) -> Result<ReadBatch> {
        let wait_ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
        let req = Request::Read {
            stream: stream.to_string(),
            from,
            max_records,
            max_bytes,
            wait_ms,
        };
        match self.call_stream(stream, &req, wait).await? {
            Response::Read { next, records } => Ok(ReadBatch { records, next }),
            other => Err(unexpected(&other)),
        }
    }
}

impl ProxyClient {
    /// A stream's segments (state, ledger, DLSN range through the last entry, record and byte
    /// counts, completion times), truncation point, retention overrides and the proxy's
    /// defaults, and its owner. Answered by the home proxy from the metadata store (not
    /// redirected); the segment being written shows its progress only when the home proxy owns
    /// the stream.
    ///
    /// # Errors
    /// `Remote` with `NoSuchStream`, `InvalidStreamName` or `Metadata`; `Io`.
    pub async fn describe_stream(&self, stream: &str) -> Result<StreamInfo> {
        let req = Request::DescribeStream {
            stream: stream.to_string(),
        };
        match self.home().await?.call(&req, Duration::ZERO).await? {
            Response::DescribeStream { info } => Ok(info),
            other => Err(unexpected(&other)),
        }
    }

    /// Truncates `stream` before `before`: every record before it becomes unreadable at once
    /// and whole segments before it are deleted; the point never moves backwards (see
    /// `StreamManager::truncate`). Sent to the stream's owner, following redirects.
    ///
    /// # Errors
    /// `Remote` with `BadRequest` (beyond the end, or no record), `NoSuchStream`,
    /// `OwnershipLost` (nothing changed; retry), `Metadata`; `RedirectFailed`; `Io`.
    pub async fn truncate(&self, stream: &str, before: Dlsn) -> Result<TruncateResult> {
        let req = Request::TruncateStream {
            stream: stream.to_string(),
            before,
        };
        match self.call_stream(stream, &req, Duration::ZERO).await? {
            Response::TruncateStream { result } => Ok(result),
            other => Err(unexpected(&other)),
        }
    }

    /// Deletes `stream` and all its segments; returns how many segments went. The name can be
    /// used again at once. Sent to the stream's owner, following redirects.
    ///
    /// # Errors
    /// `Remote` with `NoSuchStream`, `OwnershipLost` (nothing deleted; retry), `Metadata`;
    /// `RedirectFailed`; `Io`.
    pub async fn delete_stream(&self, stream: &str) -> Result<u32> {
        let req = Request::DeleteStream {
            stream: stream.to_string(),
        };
        let r = self.call_stream(stream, &req, Duration::ZERO).await;
        self.forget_owner(stream);
        match r? {
            Response::DeleteStream { segments_deleted } => Ok(segments_deleted),
            other => Err(unexpected(&other)),
        }
    }

    /// Changes `stream`'s retention overrides and returns those in force. Sent to the stream's
    /// owner, following redirects.
    ///
    /// # Errors
    /// `Remote` with `BadRequest` (0 or above the maximum), `NoSuchStream`, `OwnershipLost`,
    /// `Metadata`; `RedirectFailed`; `Io`.
    pub async fn set_retention(
        &self,
        stream: &str,
        time_secs: RetentionChange,
        size_bytes: RetentionChange,
    ) -> Result<RetentionOverride> {
        let req = Request::SetRetention {
            stream: stream.to_string(),
            time_secs,
            size_bytes,
        };
        match self.call_stream(stream, &req, Duration::ZERO).await? {
            Response::SetRetention { retention } => Ok(retention),
            other => Err(unexpected(&other)),
        }
    }
}

fn unexpected(r: &Response) -> Error {
    Error::Internal(format!("unexpected response {r:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_answers_are_described_readably() {
        // Goal: a NotAProxy message shows text answers as their first line and binary ones as
        // hex, cut to a preview. Method: describe an HTTP answer, a short and a long binary one.
        assert_eq!(
            describe_answer(b"HTTP/1.1 400 Bad Request\r\n\r\n"),
            "the text \"HTTP/1.1 400 Bad Request\" ..."
        );
        assert_eq!(
            describe_answer(b"SSH-2.0-OpenSSH_9.6"),
            "the text \"SSH-2.0-OpenSSH_9.6\""
        );
        assert_eq!(
            describe_answer(&[0x14, 0, 0, 0, 0x81]),
            "5 bytes: 14 00 00 00 81"
        );
        let long = vec![0xabu8; 100];
        let d = describe_answer(&long);
        assert!(
            d.starts_with("100 bytes: ab ab") && d.ends_with(" ..."),
            "{d}"
        );
        assert_eq!(d.matches("ab").count(), ANSWER_PREVIEW_BYTES);
    }
}

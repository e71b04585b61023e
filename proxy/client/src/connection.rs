//! One connection to one proxy: TCP (and TLS), the handshake, framing, and pipelined
//! requests matched to their answers by request id.
//!
//! A [`Connection`] sends the `HELLO` handshake first (docs/proxy-protocol.md), learns the
//! proxy's frame and record limits, then carries any number of requests at once: each gets the
//! next request id, and a reader task hands every answer to the caller waiting for that id.
//! Which proxy to ask is the `routing` module's business, not this module's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quire_tls::rustls::pki_types::ServerName;
use quire_wire::frame::{decode_frame, RecvBuffer, FRAME_SIZE_BYTES_MAX_DEFAULT, RESPONSE_BIT};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio::sync::oneshot;

use crate::config::ClientConfig;
use crate::error::{Error, ErrorCode, Result};
use crate::protocol::{
    Opcode, Request, Response, PROXY_PROTOCOL_VERSION_MAX, PROXY_PROTOCOL_VERSION_MIN,
};

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
pub(crate) struct Connection {
    /// The address as the client knows it (what it connected to).
    pub(crate) addr: String,
    /// The name the proxy's certificate was checked against (TLS only).
    pub(crate) tls_name: Option<ServerName<'static>>,
    writer: tokio::sync::Mutex<WriteSide>,
    shared: Arc<Shared>,
    next_request_id: AtomicU64,
    /// The frame limit the proxy announced in its handshake answer.
    pub(crate) frame_size_bytes_max: u32,
    /// The record limit the proxy announced in its handshake answer.
    pub(crate) record_size_bytes_max: u32,
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
    ///
    /// # Errors
    /// `Io`, `Tls`, `HandshakeTimeout`, `NotAProxy`, `Remote` (the proxy refused the
    /// connection), `UnsupportedVersion`, `Internal` (limits that cannot work).
    pub(crate) async fn connect(
        addr: impl ToSocketAddrs,
        config: ClientConfig,
        name: Option<ServerName<'static>>,
    ) -> Result<Self> {
        let timeout = config.connect_timeout;
        let (stream, peer) = open_tcp(addr, timeout).await?;
        let addr = peer.to_string();
        let (mut rd, mut wr, tls_name) = match &config.tls {
            None => {
                let (rd, wr) = stream.into_split();
                (ReadSide::Plain(rd), WriteSide::Plain(wr), None)
            }
            Some(tls) => {
                let name = match (name, &config.tls_server_name) {
                    (Some(name), _) => name,
                    (None, Some(host)) => quire_tls::server_name(host).map_err(|e| Error::Tls {
                        addr: addr.clone(),
                        reason: e.to_string(),
                    })?,
                    (None, None) => ServerName::IpAddress(peer.ip().into()),
                };
                let (rd, wr) = start_tls(stream, &addr, tls.clone(), name.clone(), timeout).await?;
                (rd, wr, Some(name))
            }
        };
        send_hello(&mut wr, config.token.clone()).await?;
        let mut buf = Vec::new();
        let (frame_size_bytes_max, record_size_bytes_max) =
            await_hello(&mut rd, &mut buf, &addr, &config).await?;
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
                            ErrorCode::Internal,
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

    /// Sends `req` and waits for its answer, up to `request_timeout` plus `extra_wait` (a
    /// read's own wait). A proxy's error answer comes back as `Error::Remote`.
    ///
    /// # Errors
    /// `Remote`; `Io` when the connection is closed or fails, or no answer came in time (the
    /// request may or may not have been carried out).
    pub(crate) async fn call(&self, req: &Request, extra_wait: Duration) -> Result<Response> {
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

    /// Whether the reader task has stopped (the proxy closed the connection or broke the
    /// protocol): no request can be sent on it any more.
    pub(crate) fn is_closed(&self) -> bool {
        self.shared.pending.lock().expect("pending lock").is_none()
    }
}

/// Opens the TCP connection (bounded by `timeout`), without Nagle's delay: requests are
/// written whole and pipelined.
async fn open_tcp(
    addr: impl ToSocketAddrs,
    timeout: Duration,
) -> Result<(TcpStream, std::net::SocketAddr)> {
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
    Ok((stream, peer))
}

/// The TLS handshake over `stream` (bounded by `timeout`); the proxy's certificate must carry
/// `name`.
async fn start_tls(
    stream: TcpStream,
    addr: &str,
    tls: Arc<quire_tls::rustls::ClientConfig>,
    name: ServerName<'static>,
    timeout: Duration,
) -> Result<(ReadSide, WriteSide)> {
    let tls_error = |reason: String| Error::Tls {
        addr: addr.to_string(),
        reason,
    };
    let connector = tokio_rustls::TlsConnector::from(tls);
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
    Ok((ReadSide::Tls(rd), WriteSide::Tls(wr)))
}

/// Sends the `HELLO` request (request id 0) with every version this build speaks.
async fn send_hello(wr: &mut WriteSide, token: Option<crate::protocol::Token>) -> Result<()> {
    let mut out = Vec::new();
    Request::Hello {
        version_min: PROXY_PROTOCOL_VERSION_MIN,
        version_max: PROXY_PROTOCOL_VERSION_MAX,
        token,
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
    })
}

/// Waits (up to `connect_timeout`) for the answer to the handshake and checks it; returns the
/// proxy's frame and record limits. Bytes read past the answer stay in `buf`.
async fn await_hello(
    rd: &mut ReadSide,
    buf: &mut Vec<u8>,
    addr: &str,
    config: &ClientConfig,
) -> Result<(u32, u32)> {
    let timeout = config.connect_timeout;
    let answer = match tokio::time::timeout(timeout, read_handshake_answer(rd, buf, addr)).await {
        // With TLS 1.3 a server refuses a client certificate after the client's side of
        // the handshake is done, so the refusal (an alert) arrives here.
        Ok(Err(Error::Io { op, source }))
            if config.tls.is_some() && source.to_string().contains("alert") =>
        {
            return Err(Error::Tls {
                addr: addr.to_string(),
                reason: format!("the proxy ended the connection during {op}: {source} (it requires a client certificate its CA signed)"),
            })
        }
        Ok(answer) => answer?,
        Err(_) if buf.is_empty() => {
            return Err(Error::HandshakeTimeout {
                addr: addr.to_string(),
                waited: timeout,
            })
        }
        Err(_) => {
            let answer = format!(
                "{}, then nothing more for {timeout:?}",
                describe_answer(buf)
            );
            return Err(Error::NotAProxy {
                addr: addr.to_string(),
                answer,
            });
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
        HandshakeAnswer::Refused { code, message } => return Err(Error::Remote { code, message }),
    };
    // The frame limit must leave room for one maximal record in a request.
    if (frame_size_bytes_max as usize) < record_size_bytes_max as usize + 64 * 1024 {
        return Err(Error::Internal(format!(
            "proxy frame limit {frame_size_bytes_max} is too small for its record limit {record_size_bytes_max}"
        )));
    }
    Ok((frame_size_bytes_max, record_size_bytes_max))
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

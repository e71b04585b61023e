//! The proxy client: a pipelined connection to one proxy, usable from any tokio runtime.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quire_wire::frame::{decode_frame, FRAME_SIZE_BYTES_MAX_DEFAULT, FRAME_HEADER_SIZE_BYTES};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio::sync::oneshot;

use crate::dlsn::ReadPosition;
use crate::error::{Error, Result};
use crate::protocol::{
    Request, Response, PROXY_PROTOCOL_VERSION_MAX, PROXY_PROTOCOL_VERSION_MIN, WRITE_RECORD_OVERHEAD_BYTES,
};
use crate::types::{ReadBatch, WriteResult};

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Longest wait for the TCP connection and the handshake.
    pub connect_timeout: Duration,
    /// Longest wait for a response, on top of a read's own `wait`.
    pub request_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self { connect_timeout: Duration::from_secs(5), request_timeout: Duration::from_secs(30) }
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

/// A connection to one proxy. Requests are pipelined: any number of calls may be in flight from
/// clones of a `&ProxyClient` at once, each matched to its response by request id.
///
/// # Threading
/// Shared (`Send + Sync`); call from any tokio task.
pub struct ProxyClient {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    shared: Arc<Shared>,
    next_request_id: AtomicU64,
    frame_size_bytes_max: u32,
    record_size_bytes_max: u32,
    config: ClientConfig,
    reader_task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for ProxyClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyClient").field("frame_size_bytes_max", &self.frame_size_bytes_max).finish()
    }
}

impl Drop for ProxyClient {
    fn drop(&mut self) {
        self.reader_task.abort();
    }
}

async fn read_one_frame(rd: &mut OwnedReadHalf, buf: &mut Vec<u8>, max: u32) -> Result<(Response, u64)> {
    loop {
        if let Some((frame, used)) = decode_frame(buf, max)? {
            let resp = Response::decode(&frame)?;
            let id = frame.header.request_id;
            buf.drain(..used);
            return Ok((resp, id));
        }
        let mut chunk = [0u8; 64 * 1024];
        let n = rd.read(&mut chunk).await.map_err(|source| Error::Io { op: "read response", source })?;
        if n == 0 {
            return Err(Error::Io {
                op: "read response",
                source: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "proxy closed the connection"),
            });
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

impl ProxyClient {
    /// Connects and performs the handshake with default settings.
    ///
    /// # Errors
    /// `Io` if the proxy cannot be reached, `UnsupportedVersion` or `Protocol` if the handshake
    /// fails.
    pub async fn connect(addr: impl ToSocketAddrs) -> Result<Self> {
        Self::connect_with(addr, ClientConfig::default()).await
    }

    /// Connects with explicit settings.
    ///
    /// # Errors
    /// As [`ProxyClient::connect`].
    pub async fn connect_with(addr: impl ToSocketAddrs, config: ClientConfig) -> Result<Self> {
        let timeout = config.connect_timeout;
        let timed_out = || Error::Io { op: "connect", source: std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out") };
        tokio::time::timeout(timeout, Self::connect_inner(addr, config)).await.map_err(|_| timed_out())?
    }

    async fn connect_inner(addr: impl ToSocketAddrs, config: ClientConfig) -> Result<Self> {
        let stream = TcpStream::connect(addr).await.map_err(|source| Error::Io { op: "connect", source })?;
        stream.set_nodelay(true).map_err(|source| Error::Io { op: "set_nodelay", source })?;
        let (mut rd, mut wr) = stream.into_split();
        let mut out = Vec::new();
        Request::Hello { version_min: PROXY_PROTOCOL_VERSION_MIN, version_max: PROXY_PROTOCOL_VERSION_MAX }.encode(0, &mut out);
        wr.write_all(&out).await.map_err(|source| Error::Io { op: "send handshake", source })?;
        let mut buf = Vec::new();
        let (resp, _) = read_one_frame(&mut rd, &mut buf, FRAME_SIZE_BYTES_MAX_DEFAULT).await?;
        let (frame_size_bytes_max, record_size_bytes_max) = match resp {
            Response::Hello { version, frame_size_bytes_max, record_size_bytes_max } => {
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
            Response::Error { code, message } => return Err(Error::Remote { code, message }),
            other => return Err(Error::Internal(format!("unexpected handshake answer {other:?}"))),
        };
        // The frame limit must leave room for one maximal record in a request.
        if (frame_size_bytes_max as usize) < record_size_bytes_max as usize + 64 * 1024 {
            return Err(Error::Internal(format!(
                "proxy frame limit {frame_size_bytes_max} is too small for its record limit {record_size_bytes_max}"
            )));
        }
        let shared = Arc::new(Shared { pending: Mutex::new(Some(HashMap::new())) });
        let reader_task = tokio::spawn(Self::reader_loop(rd, buf, frame_size_bytes_max, shared.clone()));
        Ok(Self {
            writer: tokio::sync::Mutex::new(wr),
            shared,
            next_request_id: AtomicU64::new(1),
            frame_size_bytes_max,
            record_size_bytes_max,
            config,
            reader_task,
        })
    }

    async fn reader_loop(mut rd: OwnedReadHalf, mut buf: Vec<u8>, max: u32, shared: Arc<Shared>) {
        loop {
            match read_one_frame(&mut rd, &mut buf, max).await {
                Ok((resp, 0)) => {
                    // Request id 0 answers no request of ours: the proxy refused the connection.
                    let (code, message) = match resp {
                        Response::Error { code, message } => (code, message),
                        other => (crate::ErrorCode::Internal, format!("unsolicited response {other:?}")),
                    };
                    shared.fail_all(|| Error::Remote { code, message: message.clone() });
                    return;
                }
                Ok((resp, id)) => {
                    let tx = shared.pending.lock().expect("pending lock").as_mut().and_then(|p| p.remove(&id));
                    if let Some(tx) = tx {
                        let _ = tx.send(Ok(resp));
                    }
                }
                Err(e) => {
                    let text = e.to_string();
                    shared.fail_all(|| Error::Io {
                        op: "receive",
                        source: std::io::Error::new(std::io::ErrorKind::ConnectionAborted, text.clone()),
                    });
                    return;
                }
            }
        }
    }

    /// The frame limit the proxy announced.
    pub fn frame_size_bytes_max(&self) -> u32 {
        self.frame_size_bytes_max
    }

    /// The record limit the proxy announced.
    pub fn record_size_bytes_max(&self) -> u32 {
        self.record_size_bytes_max
    }

    async fn call(&self, req: Request, extra_wait: Duration) -> Result<Response> {
        let id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.shared.pending.lock().expect("pending lock");
            let Some(p) = p.as_mut() else {
                return Err(Error::Io {
                    op: "send request",
                    source: std::io::Error::new(std::io::ErrorKind::NotConnected, "connection to the proxy is closed"),
                });
            };
            p.insert(id, tx);
        }
        let mut out = Vec::new();
        req.encode(id, &mut out);
        {
            let mut w = self.writer.lock().await;
            if let Err(source) = w.write_all(&out).await {
                self.forget(id);
                return Err(Error::Io { op: "send request", source });
            }
        }
        let deadline = self.config.request_timeout + extra_wait;
        match tokio::time::timeout(deadline, rx).await {
            Ok(Ok(Ok(Response::Error { code, message }))) => Err(Error::Remote { code, message }),
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(Error::Io {
                op: "receive",
                source: std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "connection to the proxy closed"),
            }),
            Err(_) => {
                self.forget(id);
                Err(Error::Io {
                    op: "receive",
                    source: std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no response within {deadline:?}")),
                })
            }
        }
    }

    fn forget(&self, id: u64) {
        if let Some(p) = self.shared.pending.lock().expect("pending lock").as_mut() {
            p.remove(&id);
        }
    }

    /// Creates an empty stream.
    ///
    /// # Errors
    /// `Remote` with `StreamExists`, `InvalidStreamName` or `Metadata`; `Io` on connection loss.
    pub async fn create_stream(&self, stream: &str) -> Result<()> {
        match self.call(Request::CreateStream { stream: stream.to_string() }, Duration::ZERO).await? {
            Response::CreateStream => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Names of every stream, sorted.
    ///
    /// # Errors
    /// `Remote` with `Metadata`; `Io` on connection loss.
    pub async fn list_streams(&self) -> Result<Vec<String>> {
        match self.call(Request::ListStreams, Duration::ZERO).await? {
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
    /// `RecordTooLarge` or `TxidOutOfOrder` (nothing sent); `Remote` with the proxy's code
    /// (`NoSuchStream`, `TxidOutOfOrder`, `Storage`, ...). If a later part of a split write
    /// fails, the earlier parts stay written; the error message says how many records were
    /// acknowledged.
    pub async fn write(&self, stream: &str, records: Vec<(u64, Vec<u8>)>, create_if_missing: bool) -> Result<WriteResult> {
        if records.is_empty() {
            return Err(Error::BadRequest { reason: "a write needs at least one record".into() });
        }
        for (i, (txid, p)) in records.iter().enumerate() {
            if p.len() > self.record_size_bytes_max as usize {
                return Err(Error::RecordTooLarge { record_index: i, size_bytes: p.len(), max_bytes: self.record_size_bytes_max as usize });
            }
            if i > 0 && *txid < records[i - 1].0 {
                return Err(Error::TxidOutOfOrder { record_index: i, txid: *txid, last_txid: records[i - 1].0 });
            }
        }
        // Room for the records in one frame: the limit minus the header, name and count, with
        // some slack.
        let budget = self.frame_size_bytes_max as usize - FRAME_HEADER_SIZE_BYTES - stream.len() - 64;
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
            let resp = self.call(Request::Write { stream: stream.to_string(), create_if_missing, records: chunk }, Duration::ZERO).await;
            let resp = match resp {
                Err(Error::Remote { code, message }) if written > 0 => {
                    return Err(Error::Remote { code, message: format!("{message} (after {written} records of this write were acknowledged)") })
                }
                other => other?,
            };
            match resp {
                Response::Write { count, first_dlsn, last_dlsn } => {
                    result = Some(match result {
                        None => WriteResult { first_dlsn, last_dlsn, count: u64::from(count) },
                        Some(r) => WriteResult { first_dlsn: r.first_dlsn, last_dlsn, count: r.count + u64::from(count) },
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
    /// `Remote` with `NoSuchStream`, `BadRequest` or `Storage`; `Io` on connection loss.
    pub async fn read(&self, stream: &str, from: ReadPosition, max_records: u32, max_bytes: u32, wait: Duration) -> Result<ReadBatch> {
        let wait_ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
        let req = Request::Read { stream: stream.to_string(), from, max_records, max_bytes, wait_ms };
        match self.call(req, wait).await? {
            Response::Read { next, records } => Ok(ReadBatch { records, next }),
            other => Err(unexpected(&other)),
        }
    }
}

fn unexpected(r: &Response) -> Error {
    Error::Internal(format!("unexpected response {r:?}"))
}

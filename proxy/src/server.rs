//! The proxy server: the proxy protocol over TCP, on tokio.
//!
//! One task per connection reads frames; each request runs in its own task and its response
//! goes through a per-connection channel to a writer task, so requests are pipelined and
//! answered as they finish (matched by request id). Writes are submitted to their stream in the
//! order they arrive on the connection before the next frame is read, so pipelined writes to one
//! stream keep their order.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quire_wire::frame::{decode_frame, FRAME_SIZE_BYTES_MAX_DEFAULT};
use quire_wire::WireError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};

use crate::error::{Error, ErrorCode, Result};
use crate::protocol::{Opcode, Request, Response, PROXY_PROTOCOL_VERSION_MAX, PROXY_PROTOCOL_VERSION_MIN, READ_RECORD_OVERHEAD_BYTES};
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
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            frame_size_bytes_max: FRAME_SIZE_BYTES_MAX_DEFAULT,
            requests_in_flight_max: 1024,
            read_wait_max: Duration::from_secs(60),
        }
    }
}

/// A running proxy server. Dropping it (or [`ProxyServer::shutdown`]) stops accepting and
/// closes every connection; the [`StreamManager`] is left as it is.
pub struct ProxyServer {
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for ProxyServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyServer").field("local_addr", &self.local_addr).finish()
    }
}

impl ProxyServer {
    /// Binds `addr` and starts serving `streams`.
    ///
    /// # Errors
    /// `Io` if the address cannot be bound.
    pub async fn bind(addr: SocketAddr, streams: Arc<StreamManager>, config: ServerConfig) -> Result<Self> {
        let listener = TcpListener::bind(addr).await.map_err(|source| Error::Io { op: "bind", source })?;
        Self::start(listener, streams, config)
    }

    /// Starts serving `streams` on an already bound listener (in a spawned task).
    ///
    /// # Errors
    /// `Io` if the listener has no local address.
    ///
    /// # Panics
    /// If `config.frame_size_bytes_max` is below 2 MiB.
    pub fn start(listener: TcpListener, streams: Arc<StreamManager>, config: ServerConfig) -> Result<Self> {
        assert!(config.frame_size_bytes_max >= 2 * 1024 * 1024, "the frame limit must hold one maximal record");
        let local_addr = listener.local_addr().map_err(|source| Error::Io { op: "local_addr", source })?;
        let (stop, stop_rx) = watch::channel(false);
        let accept_task = tokio::spawn(serve_until(listener, streams, config, stop_rx));
        Ok(Self { local_addr, stop, accept_task })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting and closes every connection. Requests already handed to a stream finish
    /// in the background; their answers are dropped.
    pub fn shutdown(&self) {
        let _ = self.stop.send(true);
        self.accept_task.abort();
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
pub async fn serve(listener: TcpListener, streams: Arc<StreamManager>, config: ServerConfig) -> Result<()> {
    let (_stop, stop_rx) = watch::channel(false);
    serve_until(listener, streams, config, stop_rx).await;
    Ok(())
}

async fn serve_until(listener: TcpListener, streams: Arc<StreamManager>, config: ServerConfig, stop: watch::Receiver<bool>) {
    let config = Arc::new(config);
    loop {
        match listener.accept().await {
            Ok((socket, peer)) => {
                let _ = socket.set_nodelay(true);
                tokio::spawn(connection(socket, peer, streams.clone(), config.clone(), stop.clone()));
            }
            Err(e) => {
                // Usually a transient resource shortage (EMFILE): back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The error answer to a request. A redirect (`STREAM_OWNED_ELSEWHERE`) carries the owner's
/// address alone as its message, for the client to connect to.
fn error_response(e: &Error) -> Response {
    match e {
        Error::OwnedElsewhere { owner, .. } => Response::Error { code: ErrorCode::StreamOwnedElsewhere, message: owner.clone() },
        other => Response::Error { code: other.code(), message: other.to_string() },
    }
}

async fn writer_loop(mut socket: OwnedWriteHalf, mut rx: mpsc::Receiver<Vec<u8>>) {
    while let Some(mut buf) = rx.recv().await {
        // Coalesce whatever else is ready into one write.
        while buf.len() < 256 * 1024 {
            match rx.try_recv() {
                Ok(more) => buf.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        if socket.write_all(&buf).await.is_err() {
            return;
        }
    }
    let _ = socket.shutdown().await;
}

fn encode(resp: &Response, opcode: u8, request_id: u64) -> Vec<u8> {
    let mut out = Vec::new();
    resp.encode(opcode, request_id, &mut out);
    out
}

async fn connection(socket: TcpStream, peer: SocketAddr, streams: Arc<StreamManager>, config: Arc<ServerConfig>, mut stop: watch::Receiver<bool>) {
    let (mut rd, wr) = socket.into_split();
    let (out_tx, out_rx) = mpsc::channel::<Vec<u8>>(config.requests_in_flight_max);
    let writer = tokio::spawn(writer_loop(wr, out_rx));
    let permits = Arc::new(Semaphore::new(config.requests_in_flight_max));
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut greeted = false;
    'conn: loop {
        // Handle every whole frame in the buffer.
        loop {
            let (opcode, request_id, decoded, used) = match decode_frame(&buf, config.frame_size_bytes_max) {
                Ok(None) => break,
                Ok(Some((frame, used))) => (frame.header.opcode, frame.header.request_id, Request::decode(&frame), used),
                Err(e) => {
                    // Oversized or undersized length: the stream cannot be resynchronised.
                    tracing::debug!(%peer, error = %e, "closing connection after a bad frame");
                    let _ = out_tx.send(encode(&error_response(&Error::Protocol(e)), 0, 0)).await;
                    break 'conn;
                }
            };
            buf.drain(..used);
            let req = match decoded {
                Ok(r) => r,
                Err(e) => {
                    let resp = error_response(&Error::Protocol(e.clone()));
                    let _ = out_tx.send(encode(&resp, opcode, request_id)).await;
                    if !greeted || matches!(e, WireError::BadMagic { .. }) {
                        break 'conn;
                    }
                    continue;
                }
            };
            if !greeted {
                let Request::Hello { version_min, version_max } = req else {
                    let e = Error::BadRequest { reason: "the first request must be a handshake".into() };
                    let _ = out_tx.send(encode(&error_response(&e), opcode, request_id)).await;
                    break 'conn;
                };
                let version = version_max.min(PROXY_PROTOCOL_VERSION_MAX);
                if version < version_min.max(PROXY_PROTOCOL_VERSION_MIN) {
                    let e = Error::UnsupportedVersion {
                        peer_min: version_min,
                        peer_max: version_max,
                        ours_min: PROXY_PROTOCOL_VERSION_MIN,
                        ours_max: PROXY_PROTOCOL_VERSION_MAX,
                    };
                    let _ = out_tx.send(encode(&error_response(&e), opcode, request_id)).await;
                    break 'conn;
                }
                let resp = Response::Hello {
                    version,
                    frame_size_bytes_max: config.frame_size_bytes_max,
                    record_size_bytes_max: RECORD_SIZE_BYTES_MAX as u32,
                };
                if out_tx.send(encode(&resp, opcode, request_id)).await.is_err() {
                    break 'conn;
                }
                greeted = true;
                continue;
            }
            let Ok(permit) = permits.clone().acquire_owned().await else { break 'conn };
            let tx = out_tx.clone();
            match req {
                Request::Hello { .. } => {
                    let e = Error::BadRequest { reason: "handshake already done".into() };
                    let _ = tx.send(encode(&error_response(&e), opcode, request_id)).await;
                }
                Request::Write { stream, create_if_missing, records } => {
                    // Submitted here, in frame order; awaited in its own task.
                    let count = records.len();
                    let submitted = streams.submit_append(&stream, records, create_if_missing).await;
                    tokio::spawn(async move {
                        let result = match submitted {
                            Ok(rx) => rx.await.unwrap_or(Err(Error::ShuttingDown)),
                            Err(e) => Err(e),
                        };
                        let resp = match result {
                            Ok(w) => {
                                assert_eq!(w.count as usize, count);
                                Response::Write { count: count as u32, first_dlsn: w.first_dlsn, last_dlsn: w.last_dlsn }
                            }
                            Err(e) => error_response(&e),
                        };
                        let _ = tx.send(encode(&resp, opcode, request_id)).await;
                        drop(permit);
                    });
                }
                other => {
                    let streams = streams.clone();
                    let config = config.clone();
                    tokio::spawn(async move {
                        let resp = match handle(other, &streams, &config).await {
                            Ok(r) => r,
                            Err(e) => error_response(&e),
                        };
                        let _ = tx.send(encode(&resp, opcode, request_id)).await;
                        drop(permit);
                    });
                }
            }
        }
        tokio::select! {
            n = rd.read(&mut chunk) => match n {
                Ok(0) | Err(_) => break 'conn,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            },
            _ = stop.changed() => break 'conn,
        }
    }
    drop(out_tx);
    // Let queued answers (such as the error that closes the connection) go out, but never wait
    // on requests still running once the server stops.
    if *stop.borrow() {
        writer.abort();
    } else {
        let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    }
}

async fn handle(req: Request, streams: &StreamManager, config: &ServerConfig) -> Result<Response> {
    match req {
        Request::CreateStream { stream } => streams.create_stream(&stream).await.map(|()| Response::CreateStream),
        Request::ListStreams => {
            let names = streams.list_streams().await?;
            let size: usize = names.iter().map(|n| n.len() + 4).sum();
            if size + 64 > config.frame_size_bytes_max as usize {
                return Err(Error::Internal(format!("{} stream names do not fit one frame", names.len())));
            }
            Ok(Response::ListStreams { streams: names })
        }
        Request::Read { stream, from, max_records, max_bytes, wait_ms } => {
            let wait = Duration::from_millis(u64::from(wait_ms)).min(config.read_wait_max);
            // Leave room for one maximal record past the byte budget and for the headers.
            let bytes_cap = config.frame_size_bytes_max as usize - RECORD_SIZE_BYTES_MAX - READ_RECORD_OVERHEAD_BYTES - 4096;
            let max_bytes = (max_bytes as usize).min(bytes_cap) as u32;
            let batch = streams.read(&stream, from, max_records, max_bytes, wait).await?;
            Ok(Response::Read { next: batch.next, records: batch.records })
        }
        Request::Hello { .. } | Request::Write { .. } => {
            Err(Error::Internal(format!("{:?} is handled by the connection loop", Opcode::from_u8(req.opcode() as u8))))
        }
    }
}

// The wire status of every error must be a known code.
const _: () = assert!(ErrorCode::Ok as u16 == 0);

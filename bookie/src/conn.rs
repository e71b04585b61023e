//! One client connection: frame decoding, the handshake, request dispatch and batched
//! response writes.
//!
//! A connection is served by two tasks on the shard that accepted it. The reader decodes
//! frames and spawns one task per request (so requests are answered out of order, matched by
//! request id); each request task appends its encoded response to the connection's
//! [`Outbox`]. The writer takes everything queued in one swap and writes it with one
//! `write_all`, so responses that complete while a write is in flight share the next one.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use futures_lite::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use glommio::net::TcpStream;
use glommio::sync::Semaphore;
use quire_wire::auth::AuthNonce;
use quire_wire::bookie::{
    decode_request, encode_response, negotiate_version_in, Opcode, Request, Response, Status,
    LONG_POLL_TIMEOUT_MS_MAX, PROTOCOL_VERSION_AUTH,
};
use quire_wire::frame::{decode_frame, FRAME_HEADER_SIZE_BYTES};
use quire_wire::WireError;

use crate::ops::{encode_outcome, Done, Failure, Op, Outcome};
use crate::shard::Shard;

/// Requests one connection may have in flight; the reader stops reading at this bound, so a
/// client that pipelines without limit is slowed down instead of growing the bookie's memory.
pub const IN_FLIGHT_REQUESTS_PER_CONNECTION_MAX: u64 = 1024;
/// Queued response bytes above which the bookie stops reading a connection until the client
/// reads its responses. With the in-flight bound this caps a connection's response memory at
/// about this plus `IN_FLIGHT_REQUESTS_PER_CONNECTION_MAX` responses.
const OUTBOX_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Largest piece of queued responses written to a socket in one call.
const WRITE_SLICE_BYTES_MAX: usize = 256 * 1024;
/// Size of a connection's receive buffer when no frame larger than it is pending.
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// After a fatal protocol error, how long the bookie keeps reading (and discarding) before
/// it closes, so that the error response is not destroyed by a TCP reset.
const LINGER_AFTER_ERROR: Duration = Duration::from_millis(200);
/// Bytes discarded at most while lingering after a fatal protocol error.
const LINGER_BYTES_MAX: usize = 1024 * 1024;
/// Shortest time between two warnings about refused authentications on one shard; the
/// refusals in between are counted in the next warning (and always in the metric).
const AUTH_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// Where a connection is in its handshake.
#[derive(Debug, Clone, Copy)]
enum Handshake {
    /// Nothing but `Hello` is accepted.
    AwaitHello,
    /// Version 2: `Hello` answered with `server_nonce`; nothing but `Auth` is accepted.
    AwaitAuth { server_nonce: AuthNonce },
    /// Requests are served.
    Done,
}

impl Handshake {
    fn done(&self) -> bool {
        matches!(self, Self::Done)
    }
}

thread_local! {
    /// Per shard (one thread each): when the last authentication warning was logged, and the
    /// refusals since.
    static AUTH_WARNINGS: Cell<(Option<Instant>, u64)> = const { Cell::new((None, 0)) };
}

/// Counts a refused authentication (wrong proof, or a request before `Auth`) and logs it,
/// at most once per [`AUTH_WARNING_INTERVAL`] per shard.
fn auth_refused(shard: &Shard, peer: Option<std::net::SocketAddr>, why: &str) {
    if let Some(m) = &shard.metrics {
        m.auth_failures.inc();
    }
    AUTH_WARNINGS.with(|w| {
        let (last, suppressed) = w.get();
        let now = quire_clock::now();
        if last.is_some_and(|t| now.duration_since(t) < AUTH_WARNING_INTERVAL) {
            w.set((last, suppressed + 1));
            return;
        }
        w.set((Some(now), 0));
        tracing::warn!(
            shard = shard.index,
            ?peer,
            refused_since_last_warning = suppressed,
            "refused a connection without the cluster secret: {why}; connection closed"
        );
    });
}

/// Encoded responses waiting to be written to one connection. Shard-local.
#[derive(Default)]
struct Outbox {
    buf: RefCell<Vec<u8>>,
    /// Set once no more responses will be pushed; the writer then drains and stops.
    finished: Cell<bool>,
    /// Set when a write failed: later responses are dropped.
    broken: Cell<bool>,
    waker: RefCell<Option<Waker>>,
    /// The reader, parked while too many response bytes are queued.
    reader_waker: RefCell<Option<Waker>>,
}

impl Outbox {
    fn push(&self, encode: impl FnOnce(&mut Vec<u8>)) {
        if self.broken.get() {
            return;
        }
        encode(&mut self.buf.borrow_mut());
        self.wake();
    }

    fn finish(&self) {
        self.finished.set(true);
        self.wake();
    }

    fn wake(&self) {
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Whether fewer than `OUTBOX_BYTES_MAX` bytes are queued (or writing failed).
    fn has_room(&self) -> bool {
        self.broken.get() || self.buf.borrow().len() < OUTBOX_BYTES_MAX
    }

    /// Waits until fewer than `OUTBOX_BYTES_MAX` bytes are queued (or writing failed).
    async fn wait_for_room(&self) {
        poll_fn(|cx| {
            if self.broken.get() || self.buf.borrow().len() < OUTBOX_BYTES_MAX {
                return Poll::Ready(());
            }
            *self.reader_waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    fn wake_reader(&self) {
        if let Some(w) = self.reader_waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Waits for queued bytes and swaps them out for `spare` (an empty buffer, reused so that
    /// a steady stream of responses allocates nothing). `None` once finished and drained.
    async fn next_batch(&self, spare: &mut Vec<u8>) -> Option<Vec<u8>> {
        debug_assert!(spare.is_empty());
        poll_fn(|cx| {
            let mut buf = self.buf.borrow_mut();
            if !buf.is_empty() {
                let batch = std::mem::replace(&mut *buf, std::mem::take(spare));
                drop(buf);
                self.wake_reader();
                return Poll::Ready(Some(batch));
            }
            if self.finished.get() {
                return Poll::Ready(None);
            }
            *self.waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}

/// How the read side of a connection ended.
enum ReadEnd {
    /// The client closed its side, or reading failed.
    Closed,
    /// The bookie is shutting down.
    Stopped,
    /// A protocol error; an error response is queued and the connection must close.
    Fatal,
}

/// Serves one accepted connection until the client leaves, a protocol error, or shutdown.
///
/// # Cancellation
/// Not cancelled by the shard; it ends by itself once the shard's stop signal fires and its
/// in-flight requests are answered.
pub(crate) async fn serve(shard: Rc<Shard>, stream: TcpStream) {
    let accepted = quire_clock::now();
    let peer = prepare(&shard, &stream);
    shard.connections.set(shard.connections.get() + 1);
    serve_stream(&shard, stream, peer, accepted).await;
    shard.connections.set(shard.connections.get() - 1);
}

/// [`serve`] on a TLS port: the TLS handshake first, then the bookie protocol inside it.
///
/// The TLS handshake and the `Hello` together must finish within the handshake timeout
/// (`BookieConfig::handshake_timeout`), so a peer that stalls mid-handshake holds nothing for
/// long. A failed handshake (a plaintext client, a client without a certificate the bookie's
/// CA signed when client auth is required) closes the connection with one log line.
pub(crate) async fn serve_tls(
    shard: Rc<Shard>,
    acceptor: futures_rustls::TlsAcceptor,
    stream: TcpStream,
) {
    let accepted = quire_clock::now();
    let peer = prepare(&shard, &stream);
    // Counted while handshaking, so that handshakes too stay within the connection limit.
    shard.connections.set(shard.connections.get() + 1);
    let handshake = futures_lite::future::or(
        async { Some(acceptor.accept(stream).await) },
        futures_lite::future::or(
            async {
                glommio::timer::sleep(shard.limits.handshake_timeout).await;
                None
            },
            async {
                // The stop semaphore never has permits; closing it wakes every connection.
                let _ = shard.stop.acquire(1).await;
                None
            },
        ),
    )
    .await;
    match handshake {
        Some(Ok(tls)) => serve_stream(&shard, tls, peer, accepted).await,
        Some(Err(e)) => tracing::info!(
            shard = shard.index,
            ?peer,
            error = %quire_tls::describe_handshake_error(&e),
            "TLS handshake failed; connection closed"
        ),
        None => tracing::debug!(
            shard = shard.index,
            ?peer,
            "closing a connection that did not complete its TLS handshake in time"
        ),
    }
    shard.connections.set(shard.connections.get() - 1);
}

fn prepare(shard: &Shard, stream: &TcpStream) -> Option<std::net::SocketAddr> {
    let peer = stream.peer_addr().ok();
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(?peer, error = %e, "set_nodelay failed");
    }
    tracing::debug!(shard = shard.index, ?peer, "connection accepted");
    peer
}

/// The bookie protocol on one connection, plain TCP or TLS (generic, so the plain path has no
/// indirection).
async fn serve_stream<S>(
    shard: &Rc<Shard>,
    stream: S,
    peer: Option<std::net::SocketAddr>,
    accepted: Instant,
) where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let (mut reader, writer) = futures_lite::io::split(stream);
    let outbox = Rc::new(Outbox::default());
    let write_task = glommio::spawn_local(write_loop(writer, outbox.clone()));
    let in_flight = Rc::new(Semaphore::new(IN_FLIGHT_REQUESTS_PER_CONNECTION_MAX));

    let end = read_loop(shard, &mut reader, &outbox, &in_flight, accepted, peer).await;

    // Every request already read gets its answer before the connection closes.
    if in_flight
        .acquire(IN_FLIGHT_REQUESTS_PER_CONNECTION_MAX)
        .await
        .is_err()
    {
        tracing::error!("connection in-flight semaphore closed unexpectedly");
    }
    outbox.finish();
    let writer = write_task.await;
    if let (ReadEnd::Fatal, Some(mut writer)) = (end, writer) {
        // Send FIN after the error response, then read until the client closes (bounded),
        // so the kernel does not answer unread input with a reset that drops our response.
        let _ = writer.close().await;
        let mut scratch = [0u8; 4096];
        let mut discarded = 0usize;
        let deadline = glommio::timer::sleep(LINGER_AFTER_ERROR);
        futures_lite::pin!(deadline);
        while discarded < LINGER_BYTES_MAX {
            let read =
                futures_lite::future::or(async { Some(reader.read(&mut scratch).await) }, async {
                    (&mut deadline).await;
                    None
                })
                .await;
            match read {
                Some(Ok(n)) if n > 0 => discarded += n,
                _ => break,
            }
        }
    }
    tracing::debug!(shard = shard.index, ?peer, "connection closed");
}

/// Writes batches from `outbox` until it is finished; returns the write half if it is still
/// healthy.
async fn write_loop<S: AsyncWrite + Unpin>(
    mut writer: WriteHalf<S>,
    outbox: Rc<Outbox>,
) -> Option<WriteHalf<S>> {
    let mut spare = Vec::new();
    while let Some(mut batch) = outbox.next_batch(&mut spare).await {
        let result = async {
            // In slices, yielding between them when a latency-sensitive queue (tail writes)
            // is waiting: one megabytes-long write of catch-up read responses would otherwise
            // hold the shard for its whole copy through the kernel.
            for slice in batch.chunks(WRITE_SLICE_BYTES_MAX) {
                writer.write_all(slice).await?;
                glommio::yield_if_needed().await;
            }
            writer.flush().await
        }
        .await;
        if let Err(e) = result {
            tracing::debug!(error = %e, "connection write failed; dropping later responses");
            outbox.broken.set(true);
            outbox.buf.borrow_mut().clear();
            outbox.wake_reader();
            return None;
        }
        batch.clear();
        if batch.capacity() > READ_BUFFER_BYTES * 16 {
            // One huge read response should not pin its buffer for the connection's life.
            batch = Vec::new();
        }
        spare = batch;
    }
    Some(writer)
}

/// The read side's state: the receive buffer and where the connection stands.
struct ReadState {
    buf: Vec<u8>,
    /// Bytes `buf[start..filled]` are received and not yet decoded.
    start: usize,
    filled: usize,
    handshake: Handshake,
    accepted: Instant,
    last_received: Instant,
    /// The shard's request pool bytes reserved for the large frame at the front of `buf`.
    frame_permit: Option<glommio::sync::StaticPermit>,
    /// When the incomplete frame at the front of `buf` started to arrive (or the pool gave
    /// its bytes): `frame_timeout` counts from it.
    partial_since: Option<Instant>,
}

/// Everything a connection's reader hands to the requests it reads.
struct ConnCtx<'a> {
    shard: &'a Rc<Shard>,
    outbox: &'a Rc<Outbox>,
    in_flight: &'a Rc<Semaphore>,
    peer: Option<std::net::SocketAddr>,
}

/// Reads and handles frames until the connection ends: handle every whole frame received,
/// make room for the next one, then read more (within the handshake, idle and frame
/// timeouts).
async fn read_loop<S: AsyncRead + Unpin>(
    shard: &Rc<Shard>,
    reader: &mut ReadHalf<S>,
    outbox: &Rc<Outbox>,
    in_flight: &Rc<Semaphore>,
    accepted: Instant,
    peer: Option<std::net::SocketAddr>,
) -> ReadEnd {
    let ctx = ConnCtx {
        shard,
        outbox,
        in_flight,
        peer,
    };
    let mut st = ReadState {
        buf: vec![0u8; READ_BUFFER_BYTES],
        start: 0,
        filled: 0,
        handshake: Handshake::AwaitHello,
        accepted,
        last_received: accepted,
        frame_permit: None,
        partial_since: None,
    };
    loop {
        let step = async {
            let consumed = handle_frames(&ctx, &mut st).await?;
            make_room(&ctx, &mut st, consumed).await?;
            // Back-pressure: a client that does not read its responses is not read either.
            match wait_for_room_or_stop(shard, outbox).await {
                Room::Ready => {}
                Room::Broken => return Err(ReadEnd::Closed),
                Room::Stopped => return Err(ReadEnd::Stopped),
            }
            read_more(&ctx, &mut st, reader).await
        };
        if let Err(end) = step.await {
            return end;
        }
    }
}

/// Handles every whole frame already received; returns whether any was.
async fn handle_frames(ctx: &ConnCtx<'_>, st: &mut ReadState) -> Result<bool, ReadEnd> {
    let frame_max = ctx.shard.frame_size_bytes_max;
    let mut consumed = false;
    loop {
        // A client that does not read its responses is not served more requests.
        if st.filled > st.start && !ctx.outbox.has_room() {
            match wait_for_room_or_stop(ctx.shard, ctx.outbox).await {
                Room::Stopped => return Err(ReadEnd::Stopped),
                Room::Broken => return Err(ReadEnd::Closed),
                Room::Ready => {}
            }
        }
        match decode_frame(&st.buf[st.start..st.filled], frame_max) {
            Ok(None) => return Ok(consumed),
            Ok(Some((frame, used))) => {
                st.start += used;
                consumed = true;
                assert!(
                    st.start <= st.filled,
                    "decoder consumed more than was received"
                );
                let header = frame.header;
                let request = match decode_request(&frame) {
                    Ok(r) => r,
                    Err(e) => {
                        reject_frame(
                            ctx.outbox,
                            header.opcode,
                            header.request_id,
                            Status::BadRequest,
                            &e,
                        );
                        return Err(ReadEnd::Fatal);
                    }
                };
                match handle_request(ctx, header.request_id, request, &mut st.handshake).await {
                    Flow::Continue => {}
                    Flow::Fatal => return Err(ReadEnd::Fatal),
                    Flow::Stopped => return Err(ReadEnd::Stopped),
                }
                // The request holds its own copy of what it needs.
                st.frame_permit = None;
            }
            Err(e) => {
                let pending = &st.buf[st.start..st.filled];
                let opcode = pending.get(4).copied().unwrap_or(Opcode::Hello as u8);
                let request_id = request_id_of(pending);
                let status = match e {
                    WireError::FrameTooLarge { .. } => Status::TooLarge,
                    _ => Status::BadRequest,
                };
                reject_frame(ctx.outbox, opcode, request_id, status, &e);
                return Err(ReadEnd::Fatal);
            }
        }
    }
}

/// Makes room for the next frame: moves the undecoded tail to the front, then grows the
/// buffer to fit a large frame whose length is known (`decode_frame` already checked it
/// against the limit), reserving its bytes in the shard's request pool first.
async fn make_room(ctx: &ConnCtx<'_>, st: &mut ReadState, consumed: bool) -> Result<(), ReadEnd> {
    if st.start > 0 {
        st.buf.copy_within(st.start..st.filled, 0);
        st.filled -= st.start;
        st.start = 0;
    }
    if st.filled == 0 {
        st.partial_since = None;
    } else if consumed || st.partial_since.is_none() {
        st.partial_since = Some(quire_clock::now());
    }
    if st.filled >= 4 {
        let b = &st.buf;
        let frame_len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let need = 4 + frame_len;
        if need > READ_BUFFER_BYTES && st.frame_permit.is_none() {
            reserve_large_frame(ctx.shard, st, need).await?;
        }
        if need > st.buf.len() {
            st.buf.resize(need, 0);
        } else if need <= READ_BUFFER_BYTES && st.buf.len() > READ_BUFFER_BYTES {
            // A small frame behind a large one: give the large buffer back, which no
            // reservation covers any more (`filled < need`, the frame is not whole).
            st.buf.truncate(READ_BUFFER_BYTES);
            st.buf.shrink_to(READ_BUFFER_BYTES);
        }
    } else if st.buf.len() > READ_BUFFER_BYTES {
        st.buf.truncate(READ_BUFFER_BYTES);
        st.buf.shrink_to(READ_BUFFER_BYTES);
    }
    assert!(
        st.filled < st.buf.len(),
        "receive buffer full without a whole frame"
    );
    Ok(())
}

/// Reserves a large frame's `need` bytes in the shard's request pool before its body is
/// buffered; until the pool can give them, this connection is not read (TCP back-pressure).
/// A connection whose first frame is that large is closed (no handshake is that long).
async fn reserve_large_frame(
    shard: &Shard,
    st: &mut ReadState,
    need: usize,
) -> Result<(), ReadEnd> {
    if !st.handshake.done() {
        tracing::info!(
            shard = shard.index,
            frame_bytes = need,
            "closing a connection whose first frame is too large for a handshake"
        );
        return Err(ReadEnd::Closed);
    }
    let permit = futures_lite::future::or(
        async {
            shard
                .request_pool
                .acquire_static_permit(need as u64)
                .await
                .ok()
        },
        async {
            let _ = shard.stop.acquire(1).await;
            None
        },
    )
    .await;
    let Some(permit) = permit else {
        return Err(ReadEnd::Stopped);
    };
    st.frame_permit = Some(permit);
    st.partial_since = Some(quire_clock::now());
    Ok(())
}

/// Reads more bytes, waiting at most until the handshake, idle or frame deadline
/// (`BookieConfig::handshake_timeout`, `idle_timeout`, `frame_timeout`): a connection that
/// never completes its handshake, sits idle with nothing in flight, or sends a frame too
/// slowly is closed. While requests are in flight the idle check is only postponed.
async fn read_more<S: AsyncRead + Unpin>(
    ctx: &ConnCtx<'_>,
    st: &mut ReadState,
    reader: &mut ReadHalf<S>,
) -> Result<(), ReadEnd> {
    let shard = ctx.shard;
    let limits = shard.limits;
    let idle = ctx.in_flight.available() == IN_FLIGHT_REQUESTS_PER_CONNECTION_MAX;
    // The handshake timeout covers Hello and, in version 2, Auth.
    let deadline = if !st.handshake.done() {
        st.accepted + limits.handshake_timeout
    } else if idle {
        st.last_received + limits.idle_timeout
    } else {
        quire_clock::now() + limits.idle_timeout
    };
    let deadline = st
        .partial_since
        .map_or(deadline, |t| deadline.min(t + limits.frame_timeout));
    let filled = st.filled;
    let read = futures_lite::future::or(
        async { Some(Some(reader.read(&mut st.buf[filled..]).await)) },
        futures_lite::future::or(
            async {
                // The stop semaphore never has permits; closing it wakes every connection.
                let _ = shard.stop.acquire(1).await;
                None
            },
            async {
                glommio::timer::sleep(deadline.saturating_duration_since(quire_clock::now())).await;
                Some(None)
            },
        ),
    )
    .await;
    match read {
        None => Err(ReadEnd::Stopped),
        Some(None) => check_deadlines(shard, st, idle),
        Some(Some(Ok(0))) => {
            if st.filled > 0 {
                tracing::debug!(bytes = st.filled, "client closed mid-frame");
            }
            Err(ReadEnd::Closed)
        }
        Some(Some(Ok(n))) => {
            st.filled += n;
            st.last_received = quire_clock::now();
            if !st.handshake.done() && quire_tls::looks_like_tls_record(&st.buf[..st.filled]) {
                // Would otherwise wait for a "frame" of 66 KB until the handshake timeout.
                tracing::info!(
                    shard = shard.index,
                    "closing a connection that sent a TLS record: a TLS client on this plaintext port"
                );
                return Err(ReadEnd::Closed);
            }
            Ok(())
        }
        Some(Some(Err(e))) => {
            tracing::debug!(error = %e, "connection read failed");
            Err(ReadEnd::Closed)
        }
    }
}

/// After a read wait timed out: closes the connection whose frame, handshake or idle
/// deadline has passed; otherwise (requests in flight postponed it) reading goes on.
fn check_deadlines(shard: &Shard, st: &ReadState, idle: bool) -> Result<(), ReadEnd> {
    let limits = shard.limits;
    if let Some(since) = st
        .partial_since
        .filter(|t| quire_clock::now() >= *t + limits.frame_timeout)
    {
        tracing::info!(
            shard = shard.index,
            received_bytes = st.filled,
            waited_ms = quire_clock::elapsed(since).as_millis() as u64,
            "closing a connection whose frame did not arrive whole within the frame timeout"
        );
        return Err(ReadEnd::Closed);
    }
    if !st.handshake.done() && quire_clock::now() >= st.accepted + limits.handshake_timeout {
        tracing::debug!(
            shard = shard.index,
            bytes = st.filled,
            "closing a connection that did not complete its handshake in time"
        );
        return Err(ReadEnd::Closed);
    }
    if idle && quire_clock::now() >= st.last_received + limits.idle_timeout {
        tracing::debug!(shard = shard.index, "closing an idle connection");
        return Err(ReadEnd::Closed);
    }
    Ok(())
}

/// What [`wait_for_room_or_stop`] saw.
enum Room {
    Ready,
    Broken,
    Stopped,
}

/// Waits until the outbox has room (or writing failed), or the shard stops.
async fn wait_for_room_or_stop(shard: &Shard, outbox: &Outbox) -> Room {
    let room = futures_lite::future::or(
        async {
            outbox.wait_for_room().await;
            true
        },
        async {
            let _ = shard.stop.acquire(1).await;
            false
        },
    )
    .await;
    match (room, outbox.broken.get()) {
        (false, _) => Room::Stopped,
        (true, true) => Room::Broken,
        (true, false) => Room::Ready,
    }
}

/// The request id of a partially received frame, or 0 when its header is not all there.
fn request_id_of(pending: &[u8]) -> u64 {
    match pending.get(8..FRAME_HEADER_SIZE_BYTES) {
        Some(b) => {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        }
        None => 0,
    }
}

/// Queues the error response for a frame the bookie cannot accept. The opcode is echoed when
/// it is a known one, else the response says `Hello` (the only opcode every peer knows).
fn reject_frame(outbox: &Outbox, opcode: u8, request_id: u64, status: Status, err: &WireError) {
    tracing::info!(%err, request_id, "rejecting frame and closing the connection");
    let opcode = Opcode::from_u8(opcode).unwrap_or(Opcode::Hello);
    let message = err.to_string();
    outbox.push(|out| {
        encode_response(
            out,
            request_id,
            &Response::Failed {
                opcode,
                status,
                message: &message,
            },
        )
    });
}

/// What the reader does after a request.
enum Flow {
    Continue,
    Fatal,
    Stopped,
}

/// Queues a failure response to request `request_id`.
fn fail(outbox: &Outbox, request_id: u64, opcode: Opcode, status: Status, message: String) {
    outbox.push(|out| {
        encode_response(
            out,
            request_id,
            &Response::Failed {
                opcode,
                status,
                message: &message,
            },
        )
    });
}

/// Handles one decoded request: the handshake (`Hello`, `Auth`) here, anything before it is
/// refused, `GetBookieInfo` is answered here, and every other request becomes an [`Op`] run
/// as its own task in its class's queue.
async fn handle_request(
    ctx: &ConnCtx<'_>,
    request_id: u64,
    request: Request<'_>,
    handshake: &mut Handshake,
) -> Flow {
    // BookKeeper's request latencies run from the request read to the response written out;
    // here to the response queued for the connection's writer.
    let received = quire_clock::now();
    let (shard, outbox) = (ctx.shard, ctx.outbox);
    match request {
        Request::Hello {
            version_min,
            version_max,
        } => return handle_hello(ctx, request_id, version_min, version_max, handshake),
        Request::Auth {
            client_nonce,
            proof,
        } => return handle_auth(ctx, request_id, &client_nonce, &proof, handshake),
        _ if !handshake.done() => return refuse_before_handshake(ctx, request_id, &request),
        Request::GetBookieInfo { scrub } => {
            return answer_bookie_info(shard, outbox, request_id, scrub).await
        }
        _ => {}
    }
    match op_of(request) {
        Ok(op) => spawn_op(ctx, request_id, op, received).await,
        Err((status, message, flow)) => {
            fail(outbox, request_id, Opcode::Add, status, message);
            flow
        }
    }
}

/// `Hello`: negotiates the protocol version (only the authenticated one with a cluster
/// secret, only version 1 without) and, with a secret, sends the nonce `Auth` must prove.
fn handle_hello(
    ctx: &ConnCtx<'_>,
    request_id: u64,
    version_min: u16,
    version_max: u16,
    handshake: &mut Handshake,
) -> Flow {
    let (shard, outbox) = (ctx.shard, ctx.outbox);
    if !matches!(*handshake, Handshake::AwaitHello) {
        fail(
            outbox,
            request_id,
            Opcode::Hello,
            Status::BadRequest,
            "handshake already done on this connection".into(),
        );
        return Flow::Continue;
    }
    let secret = shard.limits.cluster_secret;
    // A bookie with a cluster secret speaks only the authenticated version, one
    // without only version 1 (it could not prove anything in version 2).
    let ours = if secret.is_some() {
        (PROTOCOL_VERSION_AUTH, PROTOCOL_VERSION_AUTH)
    } else {
        (1, 1)
    };
    match negotiate_version_in(version_min, version_max, ours.0, ours.1) {
        Ok(version) => {
            let auth_nonce = match secret.map(|_| quire_wire::auth::new_nonce()) {
                None => None,
                Some(Ok(n)) => Some(n),
                Some(Err(e)) => {
                    fail(
                        outbox,
                        request_id,
                        Opcode::Hello,
                        Status::IoError,
                        e.to_string(),
                    );
                    return Flow::Fatal;
                }
            };
            *handshake = match auth_nonce {
                Some(server_nonce) => Handshake::AwaitAuth { server_nonce },
                None => Handshake::Done,
            };
            let response = Response::Hello {
                version,
                shard_count: shard.shard_count_wire(),
                frame_size_bytes_max: shard.frame_size_bytes_max,
                auth_nonce,
            };
            outbox.push(|out| encode_response(out, request_id, &response));
            Flow::Continue
        }
        Err(e) => {
            let message = if secret.is_some() {
                format!("{e}: this bookie admits only its cluster's processes, which need the cluster secret (setting cluster_secret_file) and protocol version {PROTOCOL_VERSION_AUTH}")
            } else {
                format!("{e}: this bookie has no cluster secret, so it speaks only version 1")
            };
            if secret.is_some() {
                auth_refused(
                    shard,
                    ctx.peer,
                    "a Hello without the version of the cluster-secret handshake",
                );
            }
            fail(
                outbox,
                request_id,
                Opcode::Hello,
                Status::BadVersion,
                message,
            );
            Flow::Fatal
        }
    }
}

/// `Auth` (version 2): checks the client's proof of the cluster secret against the nonce
/// `Hello` sent and answers with the bookie's own proof; anything else closes the connection.
fn handle_auth(
    ctx: &ConnCtx<'_>,
    request_id: u64,
    client_nonce: &AuthNonce,
    proof: &quire_wire::auth::AuthProof,
    handshake: &mut Handshake,
) -> Flow {
    let (shard, outbox) = (ctx.shard, ctx.outbox);
    match (*handshake, shard.limits.cluster_secret) {
        (Handshake::AwaitAuth { server_nonce }, Some(secret)) => {
            if secret.verify_client_proof(&server_nonce, client_nonce, proof) {
                *handshake = Handshake::Done;
                let response = Response::Auth {
                    proof: secret.bookie_proof(&server_nonce, client_nonce),
                };
                outbox.push(|out| encode_response(out, request_id, &response));
                Flow::Continue
            } else {
                auth_refused(shard, ctx.peer, "a wrong proof of the cluster secret");
                fail(
                    outbox,
                    request_id,
                    Opcode::Auth,
                    Status::Unauthorized,
                    "the proof of the cluster secret does not match: this bookie belongs to another cluster, or the secret file differs".into(),
                );
                Flow::Fatal
            }
        }
        (Handshake::Done, Some(_)) => {
            fail(
                outbox,
                request_id,
                Opcode::Auth,
                Status::BadRequest,
                "already authenticated on this connection".into(),
            );
            Flow::Continue
        }
        (Handshake::AwaitHello, Some(_)) => {
            auth_refused(shard, ctx.peer, "an Auth before Hello");
            fail(
                outbox,
                request_id,
                Opcode::Auth,
                Status::Unauthorized,
                "the first request on a connection must be Hello".into(),
            );
            Flow::Fatal
        }
        (_, None) => {
            fail(
                outbox,
                request_id,
                Opcode::Auth,
                Status::BadRequest,
                "this bookie has no cluster secret: Auth belongs to protocol version 2".into(),
            );
            Flow::Fatal
        }
    }
}

/// Any request but `Hello` or `Auth` before the handshake is done: refused before it touches
/// any state (a stranger on the bookie port can neither add, read nor fence), and the
/// connection closes.
fn refuse_before_handshake(ctx: &ConnCtx<'_>, request_id: u64, request: &Request<'_>) -> Flow {
    let opcode = opcode_of(request);
    if ctx.shard.limits.cluster_secret.is_some() {
        auth_refused(
            ctx.shard,
            ctx.peer,
            "a request before the cluster-secret handshake",
        );
        fail(
            ctx.outbox,
            request_id,
            opcode,
            Status::Unauthorized,
            "this bookie admits only its cluster's processes: complete Hello and Auth with the cluster secret first".into(),
        );
    } else {
        fail(
            ctx.outbox,
            request_id,
            opcode,
            Status::BadRequest,
            "the first request on a connection must be Hello".into(),
        );
    }
    Flow::Fatal
}

/// `GetBookieInfo`: statvfs(2) and the walk of the journal and ledger directories block, so
/// they run on the executor's blocking-thread pool, never on the shard's thread. Shutdown
/// waits for the answer like any request in flight.
async fn answer_bookie_info(
    shard: &Rc<Shard>,
    outbox: &Rc<Outbox>,
    request_id: u64,
    scrub: bool,
) -> Flow {
    let opcode = Opcode::GetBookieInfo;
    let Ok(pass) = shard.in_flight.enter() else {
        fail(
            outbox,
            request_id,
            opcode,
            Status::IoError,
            "bookie is shutting down".into(),
        );
        return Flow::Stopped;
    };
    let status = shard.status.clone();
    let measured = glommio::executor()
        .spawn_blocking(move || crate::metrics::bookie_info(&status, scrub))
        .await;
    match measured {
        Ok(info) => outbox
            .push(|out| quire_wire::bookie::encode_bookie_info_response(out, request_id, &info)),
        Err(e) => fail(outbox, request_id, opcode, Status::IoError, e.to_string()),
    }
    drop(pass);
    Flow::Continue
}

/// The shard operation of a data request (after the handshake). An `Add` whose entry id is
/// reserved (`u64::MAX`, which cannot travel as a LAC or last entry) is refused, and the
/// connection goes on; an unreadable entry header (already checked by `decode_request`)
/// closes it.
///
/// # Errors
/// The `Add` failure's status, message and what the reader does next.
fn op_of(request: Request<'_>) -> Result<Op, (Status, String, Flow)> {
    Ok(match request {
        Request::Add {
            recovery,
            master_key,
            entry,
        } => match quire_wire::entry::peek_header(entry) {
            Ok(h) if h.entry.0 == u64::MAX => {
                return Err((
                    Status::BadRequest,
                    format!("entry id {} is reserved", u64::MAX),
                    Flow::Continue,
                ))
            }
            Ok(h) => Op::Add {
                ledger: h.ledger.0,
                entry: h.entry.0,
                master_key: master_key.0,
                lac: h.lac.map(|e| e.0),
                data: entry.to_vec(),
                recovery,
            },
            Err(e) => return Err((Status::BadRequest, e.to_string(), Flow::Fatal)),
        },
        Request::Read {
            ledger,
            entry,
            fence,
        } => Op::Read {
            ledger: ledger.0,
            entry: entry.map(|e| e.0),
            fence: fence.map(|k| k.0),
        },
        Request::ReadLac { ledger } => Op::ReadLac { ledger: ledger.0 },
        Request::Fence { ledger, master_key } => Op::Fence {
            ledger: ledger.0,
            master_key: master_key.0,
        },
        Request::ReadLacLongPoll {
            ledger,
            previous_lac,
            timeout_ms,
        } => Op::LongPoll {
            ledger: ledger.0,
            previous: previous_lac.map(|e| e.0),
            timeout: Duration::from_millis(u64::from(timeout_ms.min(LONG_POLL_TIMEOUT_MS_MAX))),
        },
        Request::Hello { .. } | Request::Auth { .. } | Request::GetBookieInfo { .. } => {
            unreachable!("answered by handle_request")
        }
    })
}

/// Runs `op` as its own task in the queue of its class (tail write, tail read, catch-up
/// read), so that a parked long-poll or a disk read never holds up the requests behind it.
/// The requests in flight are bounded on the connection, then on the shard (the gate is what
/// shutdown waits on); either failing means the bookie is stopping.
async fn spawn_op(ctx: &ConnCtx<'_>, request_id: u64, op: Op, received: Instant) -> Flow {
    let permit = match ctx.in_flight.acquire_static_permit(1).await {
        Ok(p) => p,
        Err(_) => return Flow::Stopped,
    };
    let pass = match ctx.shard.in_flight.enter() {
        Ok(p) => p,
        Err(_) => {
            drop(permit);
            let failure = Failure::new(Status::IoError, "bookie is shutting down".into());
            let opcode = op.opcode();
            ctx.outbox
                .push(|out| encode_outcome(out, request_id, opcode, &Err(failure)));
            return Flow::Stopped;
        }
    };
    let queue = ctx.shard.queue_for(&op);
    let shard = ctx.shard.clone();
    let outbox = ctx.outbox.clone();
    let task = async move {
        let opcode = op.opcode();
        let add_bytes = match &op {
            Op::Add { data, .. } => data.len(),
            _ => 0,
        };
        let outcome = match crate::faults::before(&op).await {
            crate::faults::Injected::Run => shard.dispatch(op).await,
            crate::faults::Injected::Answer(o) => o,
            // A dropped request: no answer; the permits go as for an answered one.
            crate::faults::Injected::Drop => return drop((permit, pass)),
        };
        outbox.push(|out| encode_outcome(out, request_id, opcode, &outcome));
        if let Some(m) = &shard.metrics {
            record(
                m,
                opcode,
                &outcome,
                quire_clock::elapsed(received),
                add_bytes,
            );
        }
        // Release only after the response is queued: the connection closes once it holds
        // every permit, and shutdown proceeds once every pass is dropped.
        drop(permit);
        drop(pass);
    };
    match glommio::spawn_local_into(task, queue) {
        Ok(t) => drop(t.detach()),
        Err(e) => {
            // Only if the queue vanished, which never happens while the shard runs; the
            // dropped task released its permit and pass, and the client gets no answer for
            // this request, so close the connection rather than leave it hanging.
            tracing::error!(error = %e, "cannot spawn a request task");
            return Flow::Fatal;
        }
    }
    Flow::Continue
}

/// Records one answered request in its shard's metrics.
fn record(
    m: &crate::metrics::ShardMetrics,
    opcode: Opcode,
    outcome: &Outcome,
    took: Duration,
    add_bytes: usize,
) {
    match (opcode, outcome) {
        (Opcode::Add, Ok(_)) => {
            m.add_request.observe(true, took);
            m.add_bytes.inc_by(add_bytes as u64);
        }
        (Opcode::Add, Err(_)) => m.add_request.observe(false, took),
        (Opcode::Read, Ok(Done::Read { data, .. })) => {
            m.read_request.observe(true, took);
            m.read_bytes.inc_by(data.len() as u64);
        }
        (Opcode::Read, _) => m.read_request.observe(false, took),
        (Opcode::ReadLacLongPoll, Ok(Done::LongPoll { next_entry, .. })) => {
            m.long_poll_request.observe(true, took);
            if let Some((_, data)) = next_entry {
                m.read_bytes.inc_by(data.len() as u64);
            }
        }
        (Opcode::ReadLacLongPoll, _) => m.long_poll_request.observe(false, took),
        _ => {}
    }
}

fn opcode_of(request: &Request<'_>) -> Opcode {
    match request {
        Request::Hello { .. } => Opcode::Hello,
        Request::Add { .. } => Opcode::Add,
        Request::Read { .. } => Opcode::Read,
        Request::ReadLac { .. } => Opcode::ReadLac,
        Request::Fence { .. } => Opcode::Fence,
        Request::ReadLacLongPoll { .. } => Opcode::ReadLacLongPoll,
        Request::GetBookieInfo { .. } => Opcode::GetBookieInfo,
        Request::Auth { .. } => Opcode::Auth,
    }
}

//! Pipelined connections to bookies: up to three TCP connections per bookie (one per [`Lane`]),
//! shared by every ledger of this client. A writer task gathers queued frames into one
//! vectored write (an add's entry payload is shared by the bookies of its write set, not
//! copied into each bookie's frame); a reader task matches responses to requests by request
//! id.

use std::collections::HashMap;
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use quire_metadata::BookieId;
use quire_wire::auth::ClusterSecret;
use quire_wire::bookie::{self, Request, Response, Status, PROTOCOL_VERSION_AUTH};
use quire_wire::frame::decode_frame;
use quire_wire::{EntryId, LedgerId};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::Error;

/// A bookie's answer, owned.
#[derive(Debug, Clone)]
pub(crate) enum Reply {
    /// The handshake's answer; the bookie's nonce in version 2.
    Hello {
        auth_nonce: Option<quire_wire::auth::AuthNonce>,
    },
    /// The bookie's proof of the cluster secret.
    Auth {
        proof: quire_wire::auth::AuthProof,
    },
    Add,
    Read {
        data: Vec<u8>,
    },
    ReadLac {
        lac: Option<EntryId>,
    },
    Fence {
        lac: Option<EntryId>,
    },
    /// A long-poll LAC read's answer: the bookie's LAC and, when it held it, the next entry
    /// (id and stored bytes).
    LongPoll {
        ledger: LedgerId,
        lac: Option<EntryId>,
        next_entry: Option<(EntryId, Vec<u8>)>,
    },
    Failed {
        status: Status,
        message: String,
    },
}

type Waiter = oneshot::Sender<Result<Reply, Error>>;

/// Bound on the bytes of frames queued for one connection and not yet handed to its socket
/// (64 MiB): the only bound of a connection's send queue. A bookie that reads more slowly than
/// adds arrive (throttled, stalled, SIGSTOPped) would otherwise make the client hold every frame
/// it cannot take; past the bound a request is refused at once as `BookieUnreachable` ("falls
/// behind"), which the writer treats as a failed add: an ensemble change replaces the bookie,
/// or, with no replacement, the entry counts on the rest of its write set (BookKeeper bounds
/// the same with Netty's channel write-buffer watermarks, and `addEntryQuorumTimeout`).
/// The queue has no bound on its number of frames: a burst of many small requests to a
/// healthy bookie (more than 8,192 adds sent at once) is not a bookie that falls behind, and
/// must not cost an ensemble change.
pub(crate) const OUTGOING_QUEUE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Bytes gathered into one socket write.
const WRITE_BATCH_SIZE_BYTES_MAX: usize = 256 * 1024;
/// Frames gathered into one socket write: at most two slices each, within Linux's `IOV_MAX`
/// (1,024) slices per `writev`.
const WRITE_BATCH_FRAMES_MAX: usize = 512;

/// One request frame queued for a connection's writer task: `head` (the whole frame for most
/// requests; an add's frame header, master key and entry header) then `body` (an add's entry
/// payload, shared with the frames of the other bookies of its write set; empty otherwise).
struct Outgoing {
    id: u64,
    head: Vec<u8>,
    body: Bytes,
}

impl Outgoing {
    fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }
}

/// An add request (`recovery`: BookKeeper's recovery add, accepted by a fenced or read-only
/// bookie) whose entry is `entry_head` followed by `payload`. On the wire it is byte for byte
/// `bookie::encode_request(Request::Add)` of the whole entry (`encode_add_request_head`);
/// only the small head is written per bookie, the payload is shared.
pub(crate) struct AddRequest {
    master_key: quire_wire::MasterKey,
    recovery: bool,
    entry_head: Vec<u8>,
    payload: Bytes,
}

impl AddRequest {
    /// Appends the frame's head for request id `id` to `out` and returns the payload that
    /// follows it on the wire.
    fn encode(self, out: &mut Vec<u8>, id: u64) -> Bytes {
        let entry_len = self.entry_head.len() + self.payload.len();
        bookie::encode_add_request_head(out, id, self.recovery, self.master_key, entry_len);
        out.extend_from_slice(&self.entry_head);
        self.payload
    }
}

/// Which of a bookie's two connections a request travels on.
///
/// A bookie answers each connection's requests in one byte stream, so an add acknowledgement
/// queued behind megabytes of catch-up read responses waits for them to drain: the entry reads
/// of a scanning reader get their own connection and the tail traffic never queues behind them
/// (BookKeeper's client can likewise open several channels per bookie, `numChannelsPerBookie`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Lane {
    /// Adds, fences, recovery (fencing) reads, LAC reads.
    Tail,
    /// Entry reads without fencing: catch-up and tailing readers.
    Read,
    /// Long-poll LAC reads, which park on the bookie for up to their timeout. They get a
    /// connection of their own because a bookie stops reading a connection with
    /// `IN_FLIGHT_REQUESTS_PER_CONNECTION_MAX` (1024) requests in flight: parked polls must not
    /// hold plain reads back. Polls beyond that many per bookie wait for a slot.
    LongPoll,
}

/// One live connection to one bookie.
pub(crate) struct Conn {
    bookie: BookieId,
    /// Frames for the writer task, with their request ids.
    outgoing: mpsc::UnboundedSender<Outgoing>,
    waiters: Arc<Mutex<HashMap<u64, Waiter>>>,
    next_request_id: AtomicU64,
    dead: Arc<AtomicBool>,
    /// Why the connection died, once it has (a TLS alert, a reset), for the errors of calls
    /// made after that.
    closed_reason: Arc<Mutex<Option<String>>>,
    /// Bytes queued for the writer task and not yet written to the socket.
    queued_bytes: Arc<AtomicUsize>,
    /// The bookie's add series, looked up once per connection rather than per add.
    add_metrics: Arc<crate::metrics::BookieAddMetrics>,
}

impl Conn {
    /// Connects (over TLS when `tls` is set: the bookie's certificate must name the host of
    /// its id, an IP address or DNS name) and shakes hands; the connection's reader and writer
    /// tasks run on `runtime`. With `secret`, the handshake is version 2: the client proves
    /// the cluster secret and checks the bookie's proof (`docs/protocol.md` §2), so a bookie
    /// of another cluster, or a process posing as a bookie, is an error naming it.
    async fn connect(
        bookie: &BookieId,
        frame_size_bytes_max: u32,
        timeout: Duration,
        tls: Option<&Arc<quire_tls::rustls::ClientConfig>>,
        secret: Option<&ClusterSecret>,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Arc<Self>, Error> {
        let unreachable = |reason: String| Error::BookieUnreachable {
            bookie: bookie.0.clone(),
            reason,
        };
        let stream = tokio::time::timeout(timeout, TcpStream::connect(&bookie.0))
            .await
            .map_err(|_| unreachable("connect timed out".into()))?
            .map_err(|e| unreachable(e.to_string()))?;
        stream
            .set_nodelay(true)
            .map_err(|e| unreachable(e.to_string()))?;
        let conn = match tls {
            None => {
                let (rd, wr) = stream.into_split();
                Self::start(bookie, rd, wr, frame_size_bytes_max, false, runtime)
            }
            Some(config) => {
                let name =
                    quire_tls::server_name(&bookie.0).map_err(|e| unreachable(e.to_string()))?;
                let connector = tokio_rustls::TlsConnector::from(config.clone());
                let tls = tokio::time::timeout(timeout, connector.connect(name, stream))
                    .await
                    .map_err(|_| unreachable("TLS handshake timed out".into()))?
                    .map_err(|e| {
                        unreachable(format!(
                            "TLS handshake: {}",
                            quire_tls::describe_handshake_error(&e)
                        ))
                    })?;
                let (rd, wr) = tokio::io::split(tls);
                Self::start(bookie, rd, wr, frame_size_bytes_max, true, runtime)
            }
        };

        conn.handshake(bookie, timeout, secret).await?;
        Ok(conn)
    }

    /// The handshake, before anything else: version 1 without a secret, version 2 (`Hello`,
    /// then `Auth` proving the cluster secret and checking the bookie's proof) with one
    /// (`docs/protocol.md` §2).
    ///
    /// # Errors
    /// `Bookie` when the bookie refuses; `BookieUnreachable` for an unexpected answer, a
    /// missing nonce or a bookie proof that does not match.
    async fn handshake(
        self: &Arc<Self>,
        bookie: &BookieId,
        timeout: Duration,
        secret: Option<&ClusterSecret>,
    ) -> Result<(), Error> {
        let unreachable = |reason: String| Error::BookieUnreachable {
            bookie: bookie.0.clone(),
            reason,
        };
        let version = if secret.is_some() {
            PROTOCOL_VERSION_AUTH
        } else {
            1
        };
        let reply = self.call(timeout, |out, id| {
            bookie::encode_request(
                out,
                id,
                &Request::Hello {
                    version_min: version,
                    version_max: version,
                },
            )
        });
        let refused = |status, message| Error::Bookie {
            bookie: bookie.0.clone(),
            status,
            message,
        };
        let server_nonce = match reply.await? {
            Reply::Failed { status, message } => return Err(refused(status, message)),
            Reply::Hello { auth_nonce } => auth_nonce,
            other => {
                return Err(unreachable(format!(
                    "unexpected answer to Hello: {other:?}"
                )))
            }
        };
        let Some(secret) = secret else {
            return Ok(());
        };
        let Some(server_nonce) = server_nonce else {
            return Err(unreachable(
                "the bookie answered Hello without a nonce for the cluster-secret handshake".into(),
            ));
        };
        let client_nonce = quire_wire::auth::new_nonce().map_err(|e| unreachable(e.to_string()))?;
        let proof = secret.client_proof(&server_nonce, &client_nonce);
        let reply = self.call(timeout, |out, id| {
            bookie::encode_request(
                out,
                id,
                &Request::Auth {
                    client_nonce,
                    proof,
                },
            )
        });
        match reply.await? {
            Reply::Failed { status, message } => Err(refused(status, message)),
            Reply::Auth { proof } => {
                if secret.verify_bookie_proof(&server_nonce, &client_nonce, &proof) {
                    Ok(())
                } else {
                    Err(unreachable(
                        "its proof of the cluster secret does not match ours: it is not a bookie of this cluster (another cluster_secret_file)".into(),
                    ))
                }
            }
            other => Err(unreachable(format!("unexpected answer to Auth: {other:?}"))),
        }
    }

    /// Spawns the writer and reader tasks over the two halves of a connected stream (generic,
    /// so that plain TCP has no indirection).
    fn start<R, W>(
        bookie: &BookieId,
        mut rd: R,
        wr: W,
        frame_size_bytes_max: u32,
        tls: bool,
        runtime: &tokio::runtime::Handle,
    ) -> Arc<Self>
    where
        R: tokio::io::AsyncRead + Unpin + Send + 'static,
        W: tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        // Unbounded in frames; `queued_bytes` bounds it (`OUTGOING_QUEUE_BYTES_MAX`).
        let (tx, rx) = mpsc::unbounded_channel::<Outgoing>();
        let waiters: Arc<Mutex<HashMap<u64, Waiter>>> = Arc::default();
        let dead = Arc::new(AtomicBool::new(false));
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let closed_reason: Arc<Mutex<Option<String>>> = Arc::default();

        let conn = Arc::new(Self {
            bookie: bookie.clone(),
            outgoing: tx,
            waiters: waiters.clone(),
            next_request_id: AtomicU64::new(1),
            dead: dead.clone(),
            closed_reason: closed_reason.clone(),
            queued_bytes: queued_bytes.clone(),
            add_metrics: crate::metrics::metrics().for_bookie(&bookie.0),
        });

        runtime.spawn(write_loop(
            rx,
            wr,
            waiters.clone(),
            queued_bytes,
            dead.clone(),
            closed_reason.clone(),
        ));

        let name = bookie.0.clone();
        runtime.spawn(async move {
            let reason = read_loop(&mut rd, &waiters, frame_size_bytes_max, tls).await;
            set_reason(&closed_reason, reason.clone());
            dead.store(true, Ordering::SeqCst);
            let drained: Vec<Waiter> = waiters
                .lock()
                .map(|mut w| w.drain().map(|(_, v)| v).collect())
                .unwrap_or_default();
            for w in drained {
                let _ = w.send(Err(Error::BookieUnreachable {
                    bookie: name.clone(),
                    reason: reason.clone(),
                }));
            }
        });
        conn
    }

    /// Sends one request at once and returns a future for its reply. Sending happens before
    /// this returns, so calls made in order reach the bookie in order. A request still queued
    /// for the socket when its `timeout` passes is never sent (the bookie stalled; see the
    /// writer task in `start`).
    pub(crate) fn call(
        self: &Arc<Self>,
        timeout: Duration,
        encode: impl FnOnce(&mut Vec<u8>, u64),
    ) -> impl std::future::Future<Output = Result<Reply, Error>> + Send + 'static {
        self.send_frame(timeout, |out, id| {
            encode(out, id);
            Bytes::new()
        })
    }

    /// [`Conn::call`] for an add: the frame's head is built here, its payload is shared.
    pub(crate) fn call_add(
        self: &Arc<Self>,
        timeout: Duration,
        add: AddRequest,
    ) -> impl std::future::Future<Output = Result<Reply, Error>> + Send + 'static {
        self.send_frame(timeout, |out, id| add.encode(out, id))
    }

    /// Queues the frame `encode` builds (its head in the buffer given, the returned bytes
    /// behind it) and returns a future for its reply (see [`Conn::call`]).
    fn send_frame(
        self: &Arc<Self>,
        timeout: Duration,
        encode: impl FnOnce(&mut Vec<u8>, u64) -> Bytes,
    ) -> impl std::future::Future<Output = Result<Reply, Error>> + Send + 'static {
        let id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut head = Vec::new();
        let body = encode(&mut head, id);
        let frame = Outgoing { id, head, body };
        let bookie = self.bookie.0.clone();
        let sent = if self.dead.load(Ordering::SeqCst) {
            Err(self.closed_reason())
        } else {
            if let Ok(mut w) = self.waiters.lock() {
                w.insert(id, tx);
            }
            // The reader task marks the connection dead before it fails the waiters it finds; a
            // waiter inserted after that sweep would wait for the timeout, so look again.
            let len = frame.len();
            if self.dead.load(Ordering::SeqCst) {
                Err(self.closed_reason())
            } else {
                // One frame always fits an empty queue, however large.
                let queued = self.queued_bytes.fetch_add(len, Ordering::SeqCst);
                if queued > 0 && queued + len > OUTGOING_QUEUE_BYTES_MAX {
                    self.queued_bytes.fetch_sub(len, Ordering::SeqCst);
                    Err(format!(
                        "the bookie falls behind: {queued} bytes of requests wait for its socket (bound {OUTGOING_QUEUE_BYTES_MAX})"
                    ))
                } else {
                    // Fails only once the writer task ended (a failed socket write).
                    self.outgoing.send(frame).map_err(|_| {
                        self.queued_bytes.fetch_sub(len, Ordering::SeqCst);
                        "connection closed".to_string()
                    })
                }
            }
        };
        let waiters = self.waiters.clone();
        async move {
            if let Err(reason) = sent {
                if let Ok(mut w) = waiters.lock() {
                    w.remove(&id);
                }
                return Err(Error::BookieUnreachable { bookie, reason });
            }
            match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(r)) => r,
                Ok(Err(_)) => Err(Error::BookieUnreachable {
                    bookie,
                    reason: "connection closed".into(),
                }),
                Err(_) => {
                    if let Ok(mut w) = waiters.lock() {
                        w.remove(&id);
                    }
                    Err(Error::Timeout {
                        bookie,
                        after_ms: timeout.as_millis() as u64,
                    })
                }
            }
        }
    }

    fn closed_reason(&self) -> String {
        self.closed_reason
            .lock()
            .ok()
            .and_then(|r| r.clone())
            .map_or_else(
                || "connection closed".into(),
                |r| format!("connection closed: {r}"),
            )
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    /// The add series of this connection's bookie (`metrics::BookieAddMetrics`).
    pub(crate) fn add_metrics(&self) -> &Arc<crate::metrics::BookieAddMetrics> {
        &self.add_metrics
    }
}

/// Keeps the first reason a connection died for.
fn set_reason(slot: &Mutex<Option<String>>, reason: String) {
    if let Ok(mut r) = slot.lock() {
        r.get_or_insert(reason);
    }
}

/// A connection's writer task: takes the queued frames (up to `WRITE_BATCH_SIZE_BYTES_MAX`
/// bytes or `WRITE_BATCH_FRAMES_MAX` frames) and writes them in one vectored write, each add's
/// shared payload straight from its buffer (over TLS, rustls encrypts from the slices; a
/// writer without vectored writes gets the frames gathered into one buffer instead).
/// A frame whose caller gave up (timed out) is dropped unsent: behind a bookie that stalled
/// (SIGSTOP, a long pause) the queue fills with requests nobody awaits any more, and sending
/// them when it resumes would make it journal megabytes of adds already counted as failed
/// (and reported for repair) before it sees the requests of the ledgers placed on it since,
/// which it would deny as NoSuchLedger meanwhile. A failed write marks the connection dead.
async fn write_loop<W: AsyncWrite + Unpin>(
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    mut wr: W,
    waiters: Arc<Mutex<HashMap<u64, Waiter>>>,
    queued_bytes: Arc<AtomicUsize>,
    dead: Arc<AtomicBool>,
    closed_reason: Arc<Mutex<Option<String>>>,
) {
    let vectored = wr.is_write_vectored();
    let mut frames: Vec<Outgoing> = Vec::new();
    let mut gathered: Vec<u8> = Vec::new();
    while let Some(first) = rx.recv().await {
        let (mut size, mut stale) = (0usize, 0usize);
        let mut next = Some(first);
        while let Some(f) = next.take() {
            if waiters.lock().map_or(true, |w| w.contains_key(&f.id)) {
                size += f.len();
                frames.push(f);
            } else {
                stale += f.len();
            }
            if size < WRITE_BATCH_SIZE_BYTES_MAX && frames.len() < WRITE_BATCH_FRAMES_MAX {
                next = rx.try_recv().ok();
            }
        }
        queued_bytes.fetch_sub(stale, Ordering::SeqCst);
        if frames.is_empty() {
            continue;
        }
        let written = if vectored {
            write_all_vectored(&mut wr, &frames).await
        } else {
            for f in &frames {
                gathered.extend_from_slice(&f.head);
                gathered.extend_from_slice(&f.body);
            }
            wr.write_all(&gathered).await
        };
        // The flush is a no-op on plain TCP; TLS may hold encrypted records until it.
        let written = match written {
            Ok(()) => wr.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            set_reason(&closed_reason, format!("write: {e}"));
            dead.store(true, Ordering::SeqCst);
            break;
        }
        queued_bytes.fetch_sub(size, Ordering::SeqCst);
        frames.clear();
        gathered.clear();
    }
}

/// Writes every frame's head and body with `writev`, resuming after short writes.
async fn write_all_vectored<W: AsyncWrite + Unpin>(
    wr: &mut W,
    frames: &[Outgoing],
) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(frames.len() * 2);
    for f in frames {
        slices.push(IoSlice::new(&f.head));
        if !f.body.is_empty() {
            slices.push(IoSlice::new(&f.body));
        }
    }
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let n = wr.write_vectored(rest).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

async fn read_loop<R: tokio::io::AsyncRead + Unpin>(
    rd: &mut R,
    waiters: &Mutex<HashMap<u64, Waiter>>,
    frame_size_bytes_max: u32,
    tls: bool,
) -> String {
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut first = true;
    loop {
        let n = match rd.read(&mut chunk).await {
            Ok(0) => return "bookie closed the connection".into(),
            Ok(n) => n,
            Err(e) => return e.to_string(),
        };
        if std::mem::take(&mut first) && !tls && quire_tls::looks_like_tls_record(&chunk[..n]) {
            return "the bookie answered with TLS: its port requires TLS, configure this client's TLS CA file".into();
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut used_total = 0;
        loop {
            let (frame, used) = match decode_frame(&buf[used_total..], frame_size_bytes_max) {
                Ok(Some(x)) => x,
                Ok(None) => break,
                Err(e) => return format!("bad frame from bookie: {e}"),
            };
            let id = frame.header.request_id;
            let reply = if frame.header.opcode
                == bookie::Opcode::ReadLacLongPoll as u8 | quire_wire::frame::RESPONSE_BIT
            {
                match bookie::decode_long_poll_response(&frame) {
                    Ok(r) => Ok(owned_long_poll(r)),
                    Err(e) => Err(Error::Protocol(e)),
                }
            } else {
                match bookie::decode_response(&frame) {
                    Ok(r) => Ok(owned(r)),
                    Err(e) => Err(Error::Protocol(e)),
                }
            };
            used_total += used;
            let waiter = waiters.lock().ok().and_then(|mut w| w.remove(&id));
            if let Some(w) = waiter {
                let _ = w.send(reply);
            }
        }
        buf.drain(..used_total);
    }
}

fn owned(r: Response<'_>) -> Reply {
    match r {
        Response::Hello { auth_nonce, .. } => Reply::Hello { auth_nonce },
        Response::Auth { proof } => Reply::Auth { proof },
        Response::Add { .. } => Reply::Add,
        Response::Read { data, .. } => Reply::Read {
            data: data.to_vec(),
        },
        Response::ReadLac { lac, .. } => Reply::ReadLac { lac },
        Response::Fence { lac, .. } => Reply::Fence { lac },
        Response::Failed {
            status, message, ..
        } => Reply::Failed {
            status,
            message: message.to_string(),
        },
    }
}

fn owned_long_poll(r: bookie::LongPollReply<'_>) -> Reply {
    match r {
        bookie::LongPollReply::Ok(r) => Reply::LongPoll {
            ledger: r.ledger,
            lac: r.lac,
            next_entry: r.next_entry.map(|(e, data)| (e, data.to_vec())),
        },
        bookie::LongPollReply::Failed { status, message } => Reply::Failed {
            status,
            message: message.to_string(),
        },
    }
}

/// One pool entry: the connection of one (bookie, lane), made by the first caller that needs it
/// while later callers for the same key wait for that attempt.
type Slot = Arc<SlotState>;

#[derive(Default)]
struct SlotState {
    /// Connects that failed so far, with the last one's reason under `conn`'s lock: a caller
    /// that waited while a connect failed gets that failure instead of connecting again, so
    /// that callers queued behind a bookie that accepts TCP but never answers (its handshake
    /// times out) cost one connect and one timeout, not one each (a read's speculative and
    /// abandoned requests queue that way; issue 30 item 3).
    failures: AtomicU64,
    conn: tokio::sync::Mutex<(Option<Arc<Conn>>, String)>,
}

/// Connections by bookie and lane, made on first use and replaced when they die.
///
/// Connecting (TCP connect and handshake, up to the request timeout each) holds only the
/// entry of that bookie and lane, never the whole pool: a bookie that accepts connections but
/// does not answer (SIGSTOPped, its kernel still completing TCP handshakes) delays only the
/// requests for it, not adds, fences or ensemble changes on the other bookies.
pub(crate) struct Pool {
    conns: Mutex<HashMap<(BookieId, Lane), Slot>>,
    /// Where the read and long-poll lanes' connection tasks run (`None`: the runtime of the
    /// caller that makes the connection).
    read_runtime: Option<tokio::runtime::Handle>,
    /// Where the tail lane's connection tasks run: the runtime the client was made on, so that
    /// a connection first needed inside a catch-up read does not inherit its low priority.
    tail_runtime: Option<tokio::runtime::Handle>,
    /// TLS for every connection (`ClientConfig::tls`).
    tls: Option<Arc<quire_tls::rustls::ClientConfig>>,
    /// The cluster secret every connection proves (`ClientConfig::cluster_secret`).
    secret: Option<ClusterSecret>,
}

impl Pool {
    pub(crate) fn new(
        read_runtime: Option<tokio::runtime::Handle>,
        tls: Option<Arc<quire_tls::rustls::ClientConfig>>,
        secret: Option<ClusterSecret>,
    ) -> Self {
        Self {
            conns: Default::default(),
            read_runtime,
            tls,
            secret,
            tail_runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }

    /// The lane of every pooled connection (for tests of connection reuse).
    #[cfg(test)]
    pub(crate) async fn lanes(&self) -> Vec<Lane> {
        let slots: Vec<((BookieId, Lane), Slot)> = self
            .conns
            .lock()
            .map(|c| c.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let mut lanes = Vec::new();
        for ((_, lane), slot) in slots {
            if slot.conn.lock().await.0.is_some() {
                lanes.push(lane);
            }
        }
        lanes
    }

    pub(crate) async fn get(
        &self,
        bookie: &BookieId,
        lane: Lane,
        frame_size_bytes_max: u32,
        timeout: Duration,
    ) -> Result<Arc<Conn>, Error> {
        let key = (bookie.clone(), lane);
        let slot: Slot = {
            let mut conns = self.conns.lock().map_err(|_| Error::BookieUnreachable {
                bookie: bookie.0.clone(),
                reason: "connection pool poisoned".into(),
            })?;
            conns.entry(key).or_default().clone()
        };
        let failures = slot.failures.load(Ordering::SeqCst);
        let mut entry = slot.conn.lock().await;
        if let Some(c) = entry.0.as_ref() {
            if !c.is_dead() {
                return Ok(c.clone());
            }
        }
        if slot.failures.load(Ordering::SeqCst) != failures {
            return Err(Error::BookieUnreachable {
                bookie: bookie.0.clone(),
                reason: format!("a connect made meanwhile failed: {}", entry.1),
            });
        }
        let preferred = match lane {
            Lane::Read | Lane::LongPoll => &self.read_runtime,
            Lane::Tail => &self.tail_runtime,
        };
        let runtime = preferred
            .clone()
            .unwrap_or_else(tokio::runtime::Handle::current);
        let c = Conn::connect(
            bookie,
            frame_size_bytes_max,
            timeout,
            self.tls.as_ref(),
            self.secret.as_ref(),
            &runtime,
        )
        .await
        .inspect_err(|e| {
            entry.1 = e.to_string();
            slot.failures.fetch_add(1, Ordering::SeqCst);
        })?;
        entry.0 = Some(c.clone());
        Ok(c)
    }
}

/// An add request of a whole entry held in one slice (a recovery or re-replication add of an
/// entry read back): the entry is copied once, into the buffer the frame shares.
pub(crate) fn add_request(
    master_key: quire_wire::MasterKey,
    entry: &[u8],
    recovery: bool,
) -> AddRequest {
    AddRequest {
        master_key,
        recovery,
        entry_head: Vec::new(),
        payload: Bytes::copy_from_slice(entry),
    }
}

/// An add request of an entry whose header (`entry::encode_entry_header`) the writer built
/// and whose payload it shares with the other bookies of the write set: no copy of the
/// payload until the socket write.
pub(crate) fn add_request_shared(
    master_key: quire_wire::MasterKey,
    entry_head: &[u8],
    payload: &Bytes,
    recovery: bool,
) -> AddRequest {
    AddRequest {
        master_key,
        recovery,
        entry_head: entry_head.to_vec(),
        payload: payload.clone(),
    }
}

/// Helper for building read requests.
pub(crate) fn read_request(
    ledger: LedgerId,
    entry: Option<EntryId>,
    fence: Option<quire_wire::MasterKey>,
) -> impl FnOnce(&mut Vec<u8>, u64) {
    move |out, id| {
        bookie::encode_request(
            out,
            id,
            &Request::Read {
                ledger,
                entry,
                fence,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_testkit::TcpRelay;
    use quire_wire::entry::{encode_entry, EntryHeader};

    /// Goal: requests that timed out while queued behind a stalled bookie are dropped, not sent
    /// when it resumes, so a request made after the stall reaches it behind at most what the
    /// socket buffers already held (issue 13 item 1: a bookie that re-registered after a
    /// SIGSTOP denied new ledgers as NoSuchLedger while it journalled the old backlog first).
    /// Method: a real bookie (one shard, O_DIRECT journal) behind a testkit relay; once
    /// connected, the relay is throttled to 20 bytes/s (the bookie stalls for this client) and
    /// 3,000 adds of 16 KiB (47 MiB) to ledger 1 are sent with a 300 ms timeout; once they all
    /// failed, the throttle is lifted and one more add is sent and must succeed. Then every
    /// stalled add is read back from the bookie: fewer than half of them may be there (only
    /// what the socket buffers held; without the drop, all of them are).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn adds_that_timed_out_in_the_queue_are_not_sent() {
        let dir = tempfile::Builder::new()
            .prefix("quire-conn-")
            .tempdir_in(std::env::temp_dir())
            .unwrap();
        let config = quire_testkit::bookies::small_bookie_config(
            dir.path(),
            0,
            "127.0.0.1:0".parse().unwrap(),
        );
        let server = tokio::task::spawn_blocking(move || quire_bookie::Bookie::start(config))
            .await
            .unwrap()
            .unwrap();
        let relay = TcpRelay::start(server.addr());
        let bookie = BookieId(relay.connect_string());
        let conn = Conn::connect(
            &bookie,
            quire_wire::frame::FRAME_SIZE_BYTES_MAX_DEFAULT,
            Duration::from_secs(10),
            None,
            None,
            &tokio::runtime::Handle::current(),
        )
        .await
        .unwrap();
        let ledger = LedgerId(1);
        let entry = |e: u64| {
            encode_entry(
                EntryHeader {
                    ledger,
                    entry: EntryId(e),
                    lac: None,
                    length_bytes: 16 * 1024 * (e + 1),
                },
                &[b'x'; 16 * 1024],
            )
        };
        let key = quire_wire::MasterKey([7; 20]);
        const STALLED: u64 = 3000;

        relay.throttle(Some(20));
        let mut stalled = Vec::new();
        for e in 0..STALLED {
            let bytes = entry(e);
            // Spawned, so that every timeout runs from now (a call's future starts its clock
            // when first polled).
            stalled.push(tokio::spawn(conn.call_add(
                Duration::from_millis(300),
                add_request(key, &bytes, false),
            )));
        }
        // The first few may pass before the relay applies the throttle.
        let mut failed = 0;
        for r in stalled {
            match r.await.unwrap() {
                Ok(_) => {}
                Err(Error::Timeout { .. } | Error::BookieUnreachable { .. }) => failed += 1,
                Err(e) => panic!("unexpected error {e}"),
            }
        }
        assert!(failed > STALLED * 9 / 10, "only {failed} adds failed");
        relay.throttle(None);
        let last = entry(STALLED);
        let reply = conn
            .call_add(Duration::from_secs(60), add_request(key, &last, false))
            .await;
        assert!(matches!(reply, Ok(Reply::Add)), "{reply:?}");

        let mut held = 0;
        for e in 0..STALLED {
            match conn
                .call(
                    Duration::from_secs(60),
                    read_request(ledger, Some(EntryId(e)), None),
                )
                .await
                .unwrap()
            {
                Reply::Read { .. } => held += 1,
                Reply::Failed {
                    status: Status::NoSuchEntry,
                    ..
                } => {}
                other => panic!("unexpected answer {other:?}"),
            }
        }
        eprintln!(
            "the bookie holds {held} of {STALLED} adds sent while it stalled ({failed} failed)"
        );
        assert!(
            held < STALLED / 2,
            "the bookie holds {held} of {STALLED} adds sent while it stalled, {failed} of which timed out before they were sent"
        );
        drop(conn);
        drop(relay);
        tokio::task::spawn_blocking(move || server.shutdown().unwrap())
            .await
            .unwrap();
    }
}

#[cfg(test)]
mod shared_payload_tests {
    use super::*;
    use quire_wire::entry::{encode_entry, encode_entry_header, EntryHeader};
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A socket stand-in: keeps every byte written and, for each slice it was handed, the
    /// address of its first byte taken and how many bytes it took; accepts at most `chunk`
    /// bytes per call, so writes come back short.
    struct Recorder {
        out: Vec<u8>,
        taken: Vec<(usize, usize)>,
        chunk: usize,
        vectored: bool,
    }

    impl Recorder {
        fn take(&mut self, bufs: &[IoSlice<'_>]) -> usize {
            let mut left = self.chunk;
            for b in bufs {
                let n = b.len().min(left);
                if n == 0 {
                    continue;
                }
                self.taken.push((b.as_ptr() as usize, n));
                self.out.extend_from_slice(&b[..n]);
                left -= n;
            }
            self.chunk - left
        }
    }

    /// The writer task's end of a [`Recorder`].
    struct Socket(Arc<Mutex<Recorder>>);

    impl AsyncWrite for Socket {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            Poll::Ready(Ok(self.0.lock().unwrap().take(&[IoSlice::new(buf)])))
        }
        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            Poll::Ready(Ok(self.0.lock().unwrap().take(bufs)))
        }
        fn is_write_vectored(&self) -> bool {
            self.0.lock().unwrap().vectored
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Goal: an add's payload reaches each bookie connection's socket write straight from the
    /// buffer the writer was given, shared by the three frames of its write set and never
    /// copied into a frame or a batch buffer (issue 25 item 6), while each connection still
    /// sends byte for byte the frame `encode_request` builds from the whole entry.
    /// Method: one 10,000-byte payload in a `Bytes`; three connection writer tasks (one per
    /// bookie of Qw = 3), each over a recording socket that takes at most 4,096 bytes per
    /// call, get the add (request ids 1, 2, 3) behind a small read request. Each socket's bytes
    /// must equal the read frame followed by the whole-entry add frame, and the slices the
    /// socket was handed must include exactly the payload's 10,000 bytes at the payload's own
    /// addresses. The old writer task copied each frame into one batch buffer (what a
    /// non-vectored socket still gets): its slices lie elsewhere and the check fails.
    #[tokio::test(flavor = "current_thread")]
    async fn add_payload_is_written_from_the_shared_buffer() {
        let payload = Bytes::from((0..10_000u32).map(|i| (i % 253) as u8).collect::<Vec<_>>());
        let key = quire_wire::MasterKey([3u8; 20]);
        let header = EntryHeader {
            ledger: LedgerId(5),
            entry: EntryId(8),
            lac: Some(EntryId(7)),
            length_bytes: 80_000,
        };
        let head = encode_entry_header(header, &payload);
        let range = payload.as_ptr() as usize..payload.as_ptr() as usize + payload.len();
        for id in 1..=3u64 {
            let socket = Arc::new(Mutex::new(Recorder {
                out: Vec::new(),
                taken: Vec::new(),
                chunk: 4096,
                vectored: true,
            }));
            let (tx, rx) = mpsc::unbounded_channel();
            let waiters: Arc<Mutex<HashMap<u64, Waiter>>> = Arc::default();
            let mut expected = Vec::new();
            let read = read_request(LedgerId(5), Some(EntryId(1)), None);
            let mut read_head = Vec::new();
            read(&mut read_head, 100 + id);
            expected.extend_from_slice(&read_head);
            let add = add_request_shared(key, &head, &payload, false);
            let mut add_head = Vec::new();
            let body = add.encode(&mut add_head, id);
            bookie::encode_request(
                &mut expected,
                id,
                &Request::Add {
                    recovery: false,
                    master_key: key,
                    entry: &encode_entry(header, &payload),
                },
            );
            let queued = Arc::new(AtomicUsize::new(0));
            for (rid, frame_head, frame_body) in
                [(100 + id, read_head, Bytes::new()), (id, add_head, body)]
            {
                waiters.lock().unwrap().insert(rid, oneshot::channel().0);
                queued.fetch_add(frame_head.len() + frame_body.len(), Ordering::SeqCst);
                tx.send(Outgoing {
                    id: rid,
                    head: frame_head,
                    body: frame_body,
                })
                .unwrap();
            }
            drop(tx);
            let dead = Arc::new(AtomicBool::new(false));
            let wr = Socket(socket.clone());
            write_loop(
                rx,
                wr,
                waiters,
                queued.clone(),
                dead.clone(),
                Arc::default(),
            )
            .await;
            assert!(!dead.load(Ordering::SeqCst));
            assert_eq!(queued.load(Ordering::SeqCst), 0);
            let rec = socket.lock().unwrap();
            assert_eq!(rec.out, expected, "bookie {id}: the frames on the wire");
            let from_payload: usize = rec
                .taken
                .iter()
                .filter(|(at, n)| range.contains(at) && range.contains(&(at + n - 1)))
                .map(|(_, n)| n)
                .sum();
            assert_eq!(
                from_payload,
                payload.len(),
                "bookie {id}: the payload is written from its own buffer, not a copy"
            );
        }
    }
}

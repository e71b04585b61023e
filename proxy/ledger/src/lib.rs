//! The ledger client: BookKeeper's client semantics over the Quire bookie protocol.
//!
//! * [`BookKeeper::create_ledger`] picks an ensemble of E bookies from the registry and stores
//!   the ledger metadata; [`LedgerWriter::add`] sends entry e to the write set
//!   `(e + i) mod E, i < Qw` and confirms it once Qa of them hold it durably, strictly in entry
//!   order ([`quorum::AckTracker`]); every entry carries the writer's LAC (piggybacked LAC).
//! * [`LedgerWriter::close`] seals the ledger by compare-and-set at its LAC.
//! * [`BookKeeper::open_ledger`] reads entries from any replica of their write set.
//! * [`BookKeeper::recover_ledger`] is BookKeeper's open-with-recovery: mark IN_RECOVERY, fence
//!   the last ensemble until the answers cover it, read forward from the LAC with fencing reads,
//!   re-add each recovered entry to its whole write set, stop at the first entry proven missing,
//!   and close.
//!
//! Not yet here (a later issue): ensemble changes. A bookie failure is tolerated while every
//! entry can still reach Qa; past that the writer fails and says so.
//!
//! # Threading
//! Everything is `Send + Sync` and runs on tokio.

mod conn;
mod long_poll;
pub mod quorum;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quire_metadata::{
    master_key_hex, BookieId, DigestType, Fragment, LedgerMetadata, LedgerState, MetadataStore, Version,
    LEDGER_METADATA_FORMAT_VERSION,
};
use quire_wire::bookie::{self, Request, Status};
use quire_wire::entry::{encode_entry, verify_expected, EntryHeader};
use quire_wire::frame::FRAME_SIZE_BYTES_MAX_DEFAULT;
use quire_wire::{EntryId, LedgerId, MasterKey, WireError};
use sha1::{Digest, Sha1};
use tokio::sync::{oneshot, watch};

use conn::{Pool, Reply};
use quorum::{AckTracker, Progress};

/// Ledger client failures. Display is one line.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The metadata store failed or refused.
    #[error("metadata: {0}")]
    Metadata(String),
    /// A bookie answered with an error status.
    #[error("bookie {bookie} answered {status:?}: {message}")]
    Bookie { bookie: String, status: Status, message: String },
    /// A bookie could not be reached or dropped the connection.
    #[error("bookie {bookie} unreachable: {reason}")]
    BookieUnreachable { bookie: String, reason: String },
    /// A bookie did not answer in time.
    #[error("bookie {bookie} did not answer within {after_ms} ms")]
    Timeout { bookie: String, after_ms: u64 },
    /// Fewer writable bookies are registered than the ensemble needs.
    #[error("not enough bookies: ensemble needs {needed}, {available} writable registered")]
    NotEnoughBookies { needed: usize, available: usize },
    /// The ledger was fenced by a recoverer; this writer can add nothing more (BookKeeper
    /// `LedgerFencedException`). An add that failed this way has an unknown outcome.
    #[error("ledger {ledger} is fenced: another writer recovered it")]
    Fenced { ledger: u64 },
    /// The ledger is closed.
    #[error("ledger {ledger} is closed")]
    Closed { ledger: u64 },
    /// Every replica of the entry's write set said it does not exist.
    #[error("ledger {ledger} has no entry {entry}")]
    NoSuchEntry { ledger: u64, entry: u64 },
    /// An entry failed its digest or names the wrong position.
    #[error("ledger {ledger} entry {entry} from bookie {bookie} is corrupt: {reason}")]
    Corrupt { ledger: u64, entry: u64, bookie: String, reason: String },
    /// Bytes from a bookie did not decode.
    #[error("protocol error: {0}")]
    Protocol(WireError),
    /// An add could not reach its ack quorum; the writer is dead (no ensemble change yet).
    #[error("ledger {ledger} writer failed at entry {entry}: {reason}")]
    WriterFailed { ledger: u64, entry: u64, reason: String },
    /// Recovery could not establish the ledger's end.
    #[error("recovery of ledger {ledger} failed: {reason}")]
    Recovery { ledger: u64, reason: String },
    /// Bad arguments (quorum shape, sizes).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl From<quire_metadata::Error> for Error {
    fn from(e: quire_metadata::Error) -> Self {
        Error::Metadata(e.to_string())
    }
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Per-request timeout against one bookie (BookKeeper `addEntryTimeoutSec`/`readTimeout`: 5 s).
    pub request_timeout: Duration,
    /// Largest frame accepted from a bookie.
    pub frame_size_bytes_max: u32,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self { request_timeout: Duration::from_secs(5), frame_size_bytes_max: FRAME_SIZE_BYTES_MAX_DEFAULT }
    }
}

/// How to create a ledger.
#[derive(Debug, Clone)]
pub struct LedgerOptions {
    /// Ensemble size E.
    pub ensemble_size: u8,
    /// Write quorum Qw.
    pub write_quorum: u8,
    /// Ack quorum Qa.
    pub ack_quorum: u8,
    /// Password; the master key is SHA-1("ledger" ‖ password) as in BookKeeper.
    pub password: Vec<u8>,
    /// Custom metadata stored with the ledger.
    pub custom: BTreeMap<String, String>,
}

/// Derives the master key from a password (BookKeeper `MacDigestManager.genDigest("ledger", pw)`).
pub fn master_key(password: &[u8]) -> MasterKey {
    let mut h = Sha1::new();
    h.update(b"ledger");
    h.update(password);
    MasterKey(h.finalize().into())
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

struct Inner {
    metadata: Arc<dyn MetadataStore>,
    pool: Pool,
    config: ClientConfig,
}

/// The client: a metadata store handle plus a pool of bookie connections.
///
/// # Threading
/// Shared (`Send + Sync`), cheap to clone.
#[derive(Clone)]
pub struct BookKeeper {
    inner: Arc<Inner>,
}

impl BookKeeper {
    /// Makes a client over `metadata`.
    pub fn new(metadata: Arc<dyn MetadataStore>, config: ClientConfig) -> Self {
        Self { inner: Arc::new(Inner { metadata, pool: Pool::default(), config }) }
    }

    /// The metadata store this client uses.
    pub fn metadata(&self) -> &Arc<dyn MetadataStore> {
        &self.inner.metadata
    }

    /// Creates a ledger on E randomly chosen writable bookies and connects to them.
    ///
    /// # Errors
    /// `Invalid` unless E >= Qw >= Qa >= 1; `NotEnoughBookies`; `BookieUnreachable`; `Metadata`.
    pub async fn create_ledger(&self, opts: LedgerOptions) -> Result<LedgerWriter, Error> {
        let (e, w, a) = (opts.ensemble_size, opts.write_quorum, opts.ack_quorum);
        if !(e >= w && w >= a && a >= 1) {
            return Err(Error::Invalid(format!("need E >= Qw >= Qa >= 1, got E={e} Qw={w} Qa={a}")));
        }
        let mut candidates: Vec<BookieId> = self
            .inner
            .metadata
            .list_bookies()
            .await?
            .into_iter()
            .filter(|b| !b.read_only)
            .map(|b| b.id)
            .collect();
        if candidates.len() < usize::from(e) {
            return Err(Error::NotEnoughBookies { needed: usize::from(e), available: candidates.len() });
        }
        {
            use rand::seq::SliceRandom;
            candidates.shuffle(&mut rand::thread_rng());
        }
        candidates.truncate(usize::from(e));
        let key = master_key(&opts.password);
        let id = self.inner.metadata.allocate_ledger_id().await?;
        let meta = LedgerMetadata {
            format_version: LEDGER_METADATA_FORMAT_VERSION,
            ensemble_size: e,
            write_quorum: w,
            ack_quorum: a,
            state: LedgerState::Open,
            fragments: vec![Fragment { first_entry: 0, bookies: candidates.clone() }],
            last_entry: None,
            length_bytes: 0,
            digest_type: DigestType::Crc32c,
            master_key_hex: master_key_hex(&key),
            creation_time_ms: now_ms(),
            custom: opts.custom,
        };
        let version = self.inner.metadata.create_ledger(id, &meta).await?;
        let mut conns = Vec::with_capacity(candidates.len());
        for b in &candidates {
            conns.push(self.conn(b).await?);
        }
        Ok(LedgerWriter {
            shared: Arc::new(WriterShared {
                client: self.clone(),
                id,
                key,
                conns,
                quorum: (e, w, a),
                state: Mutex::new(WriterState {
                    tracker: AckTracker::new(w, a, 0),
                    waiters: std::collections::VecDeque::new(),
                    lac: None,
                    pushed_length_bytes: 0,
                    confirmed_length_bytes: 0,
                    failed: None,
                    meta: (meta, version),
                }),
                lac_tx: watch::channel(None).0,
            }),
        })
    }

    async fn conn(&self, bookie: &BookieId) -> Result<Arc<conn::Conn>, Error> {
        self.inner.pool.get(bookie, self.inner.config.frame_size_bytes_max, self.inner.config.request_timeout).await
    }

    /// Opens a ledger for reading without fencing (BookKeeper `openLedgerNoRecovery`).
    ///
    /// # Errors
    /// `Metadata` (e.g. no such ledger).
    pub async fn open_ledger(&self, id: LedgerId) -> Result<LedgerReader, Error> {
        let meta = self.inner.metadata.read_ledger(id).await?.value;
        Ok(LedgerReader { client: self.clone(), id, meta })
    }

    /// Recovers and closes a ledger (BookKeeper open-with-recovery, `LedgerRecoveryOp`).
    ///
    /// Marks it IN_RECOVERY, fences the last ensemble (waiting until the answers cover every
    /// write set, i.e. Qw − Qa + 1 per write set), reads forward from the highest LAC with
    /// fencing reads, re-adds each recovered entry to its full write set as a recovery add,
    /// stops at the first entry that Qw − Qa + 1 bookies of its write set deny, and closes the
    /// ledger by compare-and-set. Concurrent recoverers converge: they find the same end, and
    /// whoever loses the final compare-and-set adopts the winner's identical result.
    ///
    /// # Errors
    /// `Recovery` if too few bookies answer to decide; `Metadata`; or the close found a
    /// different end written by someone else.
    pub async fn recover_ledger(&self, id: LedgerId) -> Result<LedgerMetadata, Error> {
        loop {
            let current = self.inner.metadata.read_ledger(id).await?;
            let (mut meta, mut version) = (current.value, current.version);
            if meta.state == LedgerState::Closed {
                return Ok(meta);
            }
            if meta.state == LedgerState::Open {
                meta.state = LedgerState::InRecovery;
                match self.inner.metadata.update_ledger(id, &meta, version).await {
                    Ok(v) => version = v,
                    Err(quire_metadata::Error::BadVersion { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            let (last_entry, length_bytes) = self.recover_end(id, &meta).await?;
            meta.state = LedgerState::Closed;
            meta.last_entry = last_entry.map(|e| e.0);
            meta.length_bytes = length_bytes;
            match self.inner.metadata.update_ledger(id, &meta, version).await {
                Ok(_) => return Ok(meta),
                Err(quire_metadata::Error::BadVersion { .. }) => {
                    let now = self.inner.metadata.read_ledger(id).await?.value;
                    if now.state == LedgerState::Closed {
                        if now.last_entry == meta.last_entry {
                            return Ok(now);
                        }
                        return Err(Error::Recovery {
                            ledger: id.0,
                            reason: format!(
                                "closed concurrently at last entry {:?}, this recovery found {:?}",
                                now.last_entry, meta.last_entry
                            ),
                        });
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    async fn recover_end(&self, id: LedgerId, meta: &LedgerMetadata) -> Result<(Option<EntryId>, u64), Error> {
        let key = meta.master_key()?;
        let (e, w, a) = (meta.ensemble_size, meta.write_quorum, meta.ack_quorum);
        let timeout = self.inner.config.request_timeout;
        let fragment = meta.fragments.last().ok_or_else(|| Error::Invalid("ledger without fragments".into()))?;
        // 1. Fence every bookie of the last ensemble.
        let mut calls = Vec::new();
        for b in &fragment.bookies {
            let client = self.clone();
            let b = b.clone();
            calls.push(tokio::spawn(async move {
                let c = client.conn(&b).await?;
                c.call(timeout, move |out, rid| {
                    bookie::encode_request(out, rid, &Request::Fence { ledger: id, master_key: key })
                })
                .await
            }));
        }
        let mut answered = vec![false; usize::from(e)];
        let mut lac: Option<EntryId> = fragment.first_entry.checked_sub(1).map(EntryId);
        let mut reasons = Vec::new();
        for (i, call) in calls.into_iter().enumerate() {
            match call.await.map_err(|j| Error::Invalid(j.to_string())).and_then(|r| r) {
                Ok(Reply::Fence { lac: l }) => {
                    answered[i] = true;
                    lac = lac.max(l);
                }
                Ok(Reply::Failed { status: Status::NoSuchLedger, .. }) => answered[i] = true,
                Ok(Reply::Failed { status, message }) => reasons.push(format!("{}: {status:?} {message}", fragment.bookies[i])),
                Ok(other) => reasons.push(format!("{}: unexpected {other:?}", fragment.bookies[i])),
                Err(err) => reasons.push(err.to_string()),
            }
        }
        if !quorum::covers(&answered, e, w, a) {
            return Err(Error::Recovery { ledger: id.0, reason: format!("fencing did not cover the ensemble: {}", reasons.join("; ")) });
        }
        // 2. Length so far: the header of the LAC entry (if any) carries the cumulative length.
        let reader = LedgerReader { client: self.clone(), id, meta: meta.clone() };
        let mut length_bytes = 0;
        let mut last = lac;
        if let Some(l) = lac {
            match reader.read_raw(l, Some(key)).await? {
                ReadOutcome::Found(bytes) => {
                    length_bytes = header_of(&bytes, id, l)?.length_bytes;
                }
                ReadOutcome::Missing => {
                    return Err(Error::Recovery { ledger: id.0, reason: format!("LAC entry {l} is missing on every replica") });
                }
            }
        }
        // 3. Read forward with fencing reads, re-adding what is found, until proven missing.
        let mut next = lac.map_or(fragment.first_entry, |l| l.0 + 1);
        loop {
            match reader.read_raw(EntryId(next), Some(key)).await? {
                ReadOutcome::Missing => break,
                ReadOutcome::Found(bytes) => {
                    length_bytes = header_of(&bytes, id, EntryId(next))?.length_bytes;
                    self.recovery_add(meta, id, key, EntryId(next), bytes).await?;
                    last = Some(EntryId(next));
                    next += 1;
                }
            }
        }
        Ok((last, length_bytes))
    }

    async fn recovery_add(&self, meta: &LedgerMetadata, id: LedgerId, key: MasterKey, entry: EntryId, bytes: Vec<u8>) -> Result<(), Error> {
        let fragment = meta.fragment_for(entry);
        let timeout = self.inner.config.request_timeout;
        let bytes = Arc::new(bytes);
        let mut calls = Vec::new();
        for pos in quorum::write_set(entry.0, meta.ensemble_size, meta.write_quorum) {
            let client = self.clone();
            let b = fragment.bookies[pos].clone();
            let bytes = bytes.clone();
            calls.push(tokio::spawn(async move {
                let c = client.conn(&b).await?;
                c.call(timeout, move |out, rid| {
                    bookie::encode_request(out, rid, &Request::Add { recovery: true, master_key: key, entry: &bytes })
                })
                .await
            }));
        }
        let mut acks = 0;
        let mut reasons = Vec::new();
        for call in calls {
            match call.await.map_err(|j| Error::Invalid(j.to_string())).and_then(|r| r) {
                Ok(Reply::Add) => acks += 1,
                Ok(other) => reasons.push(format!("{other:?}")),
                Err(e) => reasons.push(e.to_string()),
            }
        }
        if acks < usize::from(meta.ack_quorum) {
            return Err(Error::Recovery {
                ledger: id.0,
                reason: format!("re-adding entry {entry} reached {acks} of {} acks: {}", meta.ack_quorum, reasons.join("; ")),
            });
        }
        Ok(())
    }
}

fn header_of(bytes: &[u8], ledger: LedgerId, entry: EntryId) -> Result<EntryHeader, Error> {
    verify_expected(bytes, ledger, entry).map(|(h, _)| h).map_err(|e| Error::Corrupt {
        ledger: ledger.0,
        entry: entry.0,
        bookie: "(verified after read)".into(),
        reason: e.to_string(),
    })
}

enum ReadOutcome {
    Found(Vec<u8>),
    Missing,
}

/// Future of one add; resolves in entry order.
pub type AddFuture = Pin<Box<dyn Future<Output = Result<EntryId, Error>> + Send + 'static>>;

/// A pending add's waiter: entry id, cumulative ledger length through it, and the sender that
/// resolves its [`AddFuture`].
type AddWaiter = (u64, u64, oneshot::Sender<Result<EntryId, Error>>);

struct WriterState {
    tracker: AckTracker,
    /// Waiters of pending adds, in entry order.
    waiters: std::collections::VecDeque<AddWaiter>,
    lac: Option<EntryId>,
    pushed_length_bytes: u64,
    confirmed_length_bytes: u64,
    failed: Option<Error>,
    meta: (LedgerMetadata, Version),
}

struct WriterShared {
    client: BookKeeper,
    id: LedgerId,
    key: MasterKey,
    conns: Vec<Arc<conn::Conn>>,
    quorum: (u8, u8, u8),
    state: Mutex<WriterState>,
    lac_tx: watch::Sender<Option<EntryId>>,
}

/// The single writer of a ledger (BookKeeper `LedgerHandle`).
///
/// # Threading
/// Shared (`Send + Sync`); `add` may be called from any task.
pub struct LedgerWriter {
    shared: Arc<WriterShared>,
}

impl LedgerWriter {
    /// The ledger id.
    pub fn id(&self) -> LedgerId {
        self.shared.id
    }

    /// Assigns the next entry id, builds the entry (with the current LAC piggybacked) and sends
    /// it to its write set before returning. The returned futures resolve in entry order, each
    /// once Qa bookies of its write set have it durable (BookKeeper `PendingAddOp`).
    ///
    /// # Errors
    /// (through the future) `Fenced` if a recoverer fenced the ledger; `WriterFailed` if an
    /// entry cannot reach Qa; once failed, every later add fails the same way.
    pub fn add(&self, payload: Vec<u8>) -> AddFuture {
        let s = &self.shared;
        let (e, w, _) = s.quorum;
        let (tx, rx) = oneshot::channel();
        let (entry, bytes) = {
            let Ok(mut st) = s.state.lock() else {
                return Box::pin(async { Err(Error::Invalid("writer state poisoned".into())) });
            };
            if let Some(err) = &st.failed {
                let err = err.clone();
                return Box::pin(async move { Err(err) });
            }
            let entry = st.tracker.push();
            st.pushed_length_bytes += payload.len() as u64;
            let header = EntryHeader { ledger: s.id, entry: EntryId(entry), lac: st.lac, length_bytes: st.pushed_length_bytes };
            let length = st.pushed_length_bytes;
            st.waiters.push_back((entry, length, tx));
            (entry, encode_entry(header, &payload))
        };
        let timeout = s.client.inner.config.request_timeout;
        for pos in quorum::write_set(entry, e, w) {
            let conn = s.conns[pos].clone();
            let key = s.key;
            let reply = conn.call(timeout, |out, rid| {
                bookie::encode_request(out, rid, &Request::Add { recovery: false, master_key: key, entry: &bytes })
            });
            let shared = s.clone();
            tokio::spawn(async move {
                let outcome = reply.await;
                shared.on_reply(entry, pos, outcome);
            });
        }
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| Err(Error::Invalid("writer dropped before the add completed".into())))
        })
    }

    /// The last add confirmed: every entry up to it has Qa durable copies.
    pub fn lac(&self) -> Option<EntryId> {
        *self.shared.lac_tx.borrow()
    }

    /// A watch that changes whenever the LAC advances (for tailing readers).
    pub fn lac_watch(&self) -> watch::Receiver<Option<EntryId>> {
        self.shared.lac_tx.subscribe()
    }

    /// Payload bytes of every add issued so far.
    pub fn length_bytes(&self) -> u64 {
        self.shared.state.lock().map_or(0, |s| s.pushed_length_bytes)
    }

    /// Waits for pending adds to finish, then closes the ledger at its LAC by compare-and-set
    /// (BookKeeper `LedgerHandle.asyncClose`).
    ///
    /// # Errors
    /// `Metadata`; `Fenced` if a recoverer changed the metadata meanwhile and ended the ledger
    /// somewhere else.
    pub async fn close(&self) -> Result<LedgerMetadata, Error> {
        let mut watch = self.lac_watch();
        loop {
            let pending = self.shared.state.lock().map_or(0, |s| if s.failed.is_some() { 0 } else { s.tracker.pending_count() });
            if pending == 0 {
                break;
            }
            if watch.changed().await.is_err() {
                break;
            }
        }
        let (mut meta, version, lac, length) = {
            let st = self.shared.state.lock().map_err(|_| Error::Invalid("writer state poisoned".into()))?;
            (st.meta.0.clone(), st.meta.1, st.lac, st.confirmed_length_bytes)
        };
        meta.state = LedgerState::Closed;
        meta.last_entry = lac.map(|e| e.0);
        meta.length_bytes = length;
        let store = &self.shared.client.inner.metadata;
        match store.update_ledger(self.shared.id, &meta, version).await {
            Ok(v) => {
                if let Ok(mut st) = self.shared.state.lock() {
                    st.meta = (meta.clone(), v);
                    st.failed.get_or_insert(Error::Closed { ledger: self.shared.id.0 });
                }
                Ok(meta)
            }
            Err(quire_metadata::Error::BadVersion { .. }) => {
                let now = store.read_ledger(self.shared.id).await?.value;
                if now.state == LedgerState::Closed && now.last_entry == meta.last_entry {
                    Ok(now)
                } else {
                    Err(Error::Fenced { ledger: self.shared.id.0 })
                }
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl WriterShared {
    fn on_reply(&self, entry: u64, pos: usize, outcome: Result<Reply, Error>) {
        let Ok(mut st) = self.state.lock() else { return };
        if st.failed.is_some() {
            return;
        }
        let progress = match outcome {
            Ok(Reply::Add) => st.tracker.ack(entry, pos),
            Ok(Reply::Failed { status: Status::Fenced, .. }) => {
                self.fail(&mut st, Error::Fenced { ledger: self.id.0 });
                return;
            }
            Ok(Reply::Failed { status: Status::Unauthorized, message }) => {
                let bookie = self.conns[pos].bookie().0.clone();
                self.fail(&mut st, Error::Bookie { bookie, status: Status::Unauthorized, message });
                return;
            }
            Ok(other) => {
                tracing::warn!(ledger = self.id.0, entry, bookie = %self.conns[pos].bookie(), "add failed: {other:?}");
                st.tracker.fail(entry, pos)
            }
            Err(e) => {
                tracing::warn!(ledger = self.id.0, entry, bookie = %self.conns[pos].bookie(), "add failed: {e}");
                st.tracker.fail(entry, pos)
            }
        };
        match progress {
            Progress::Confirmed(entries) => {
                let Some(&last) = entries.last() else { return };
                for e in entries {
                    let (we, length, tx) = st.waiters.pop_front().expect("a waiter per pending entry");
                    assert_eq!(we, e, "waiters and tracker agree on order");
                    st.confirmed_length_bytes = length;
                    let _ = tx.send(Ok(EntryId(e)));
                }
                assert!(st.lac.is_none_or(|l| l.0 < last), "LAC only moves forward");
                st.lac = Some(EntryId(last));
                self.lac_tx.send_replace(st.lac);
            }
            Progress::QuorumLost(e) => {
                let err = Error::WriterFailed {
                    ledger: self.id.0,
                    entry: e,
                    reason: "more than Qw - Qa bookies of its write set failed (no ensemble change yet)".into(),
                };
                self.fail(&mut st, err);
            }
        }
    }

    fn fail(&self, st: &mut WriterState, err: Error) {
        st.failed = Some(err.clone());
        for (_, _, tx) in st.waiters.drain(..) {
            let _ = tx.send(Err(err.clone()));
        }
        // Wake close() waiters.
        self.lac_tx.send_modify(|_| {});
    }
}

/// A read handle on a ledger (BookKeeper `ReadOnlyLedgerHandle`).
#[derive(Clone)]
pub struct LedgerReader {
    client: BookKeeper,
    id: LedgerId,
    meta: LedgerMetadata,
}

impl LedgerReader {
    /// The ledger id.
    pub fn id(&self) -> LedgerId {
        self.id
    }

    /// The metadata as read at open.
    pub fn metadata(&self) -> &LedgerMetadata {
        &self.meta
    }

    /// Reads one entry's payload, digest verified, trying each replica of its write set in
    /// turn (BookKeeper reads from the write set, any replica suffices).
    ///
    /// # Errors
    /// `NoSuchEntry` when enough replicas deny it that it cannot have been acknowledged;
    /// otherwise the last replica's error.
    pub async fn read(&self, entry: EntryId) -> Result<Vec<u8>, Error> {
        match self.read_raw(entry, None).await? {
            ReadOutcome::Found(mut bytes) => {
                bytes.drain(..quire_wire::entry::ENTRY_HEADER_SIZE_BYTES);
                Ok(bytes)
            }
            ReadOutcome::Missing => Err(Error::NoSuchEntry { ledger: self.id.0, entry: entry.0 }),
        }
    }

    /// Reads the verified entry bytes. `Missing` needs Qw − Qa + 1 denials from the write set.
    async fn read_raw(&self, entry: EntryId, fence: Option<MasterKey>) -> Result<ReadOutcome, Error> {
        let meta = &self.meta;
        let fragment = meta.fragment_for(entry);
        let timeout = self.client.inner.config.request_timeout;
        let mut denials = 0;
        let mut last_err = None;
        for pos in quorum::write_set(entry.0, meta.ensemble_size, meta.write_quorum) {
            let b = &fragment.bookies[pos];
            let reply = match self.client.conn(b).await {
                Ok(c) => c.call(timeout, conn::read_request(self.id, Some(entry), fence)).await,
                Err(e) => Err(e),
            };
            match reply {
                Ok(Reply::Read { data }) => match verify_expected(&data, self.id, entry) {
                    Ok(_) => return Ok(ReadOutcome::Found(data)),
                    Err(e) => {
                        last_err = Some(Error::Corrupt { ledger: self.id.0, entry: entry.0, bookie: b.0.clone(), reason: e.to_string() })
                    }
                },
                Ok(Reply::Failed { status: Status::NoSuchEntry | Status::NoSuchLedger, .. }) => denials += 1,
                Ok(Reply::Failed { status, message }) => last_err = Some(Error::Bookie { bookie: b.0.clone(), status, message }),
                Ok(other) => last_err = Some(Error::Invalid(format!("unexpected reply {other:?}"))),
                Err(e) => last_err = Some(e),
            }
        }
        if denials >= usize::from(meta.write_quorum - meta.ack_quorum + 1) {
            return Ok(ReadOutcome::Missing);
        }
        Err(last_err.unwrap_or(Error::NoSuchEntry { ledger: self.id.0, entry: entry.0 }))
    }

    /// The highest LAC any bookie of the last ensemble reports (BookKeeper `readLastConfirmed`).
    ///
    /// # Errors
    /// The last error, if no bookie answered.
    pub async fn read_lac(&self) -> Result<Option<EntryId>, Error> {
        let fragment = self.meta.fragments.last().ok_or_else(|| Error::Invalid("ledger without fragments".into()))?;
        let timeout = self.client.inner.config.request_timeout;
        let mut best = None;
        let mut any = false;
        let mut last_err = None;
        for b in &fragment.bookies {
            let id = self.id;
            let reply = match self.client.conn(b).await {
                Ok(c) => c.call(timeout, move |out, rid| bookie::encode_request(out, rid, &Request::ReadLac { ledger: id })).await,
                Err(e) => Err(e),
            };
            match reply {
                Ok(Reply::ReadLac { lac, .. }) => {
                    any = true;
                    best = best.max(lac);
                }
                Ok(Reply::Failed { status: Status::NoSuchLedger, .. }) => any = true,
                Ok(other) => last_err = Some(Error::Invalid(format!("unexpected reply {other:?}"))),
                Err(e) => last_err = Some(e),
            }
        }
        if any {
            Ok(best)
        } else {
            Err(last_err.unwrap_or(Error::Invalid("empty ensemble".into())))
        }
    }
}

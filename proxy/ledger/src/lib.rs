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
//!   and close. Only the last fragment's ensemble is fenced; reads and re-adds go to each
//!   entry's own fragment ([`LedgerMetadata::fragment_for`]).
//! * Ensemble change (BookKeeper `LedgerHandle.ensembleChangeLoop`, changing immediately as
//!   BookKeeper does without `delayEnsembleChange`): when a bookie of the current ensemble fails
//!   an add (connection error, timeout, any error status but Fenced/Unauthorized, e.g.
//!   ReadOnly), the writer picks a replacement ([`placement`]) among the registered writable
//!   bookies outside the ensemble and not failed recently, appends a fragment starting at
//!   LAC + 1 by compare-and-set (or rewrites the last fragment if it starts there) while the
//!   ledger is OPEN and the failed bookie still in it, and re-sends every pending add to the
//!   replacement, dropping the replaced bookie's acks. Success is held back while the change
//!   runs, so no entry is confirmed on a write set the metadata does not name. With no
//!   replacement the writer goes on while every entry can still reach Qa, and fails past that.
//!
//! # Threading
//! Everything is `Send + Sync` and runs on tokio.

mod conn;
mod long_poll;
pub mod placement;
pub mod quorum;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use quire_metadata::{
    master_key_hex, BookieId, DigestType, Fragment, LedgerMetadata, LedgerState, MetadataStore,
    Version, LEDGER_METADATA_FORMAT_VERSION,
};
use quire_wire::bookie::{self, Request, Status};
use quire_wire::entry::{encode_entry, verify_expected, EntryHeader};
use quire_wire::frame::FRAME_SIZE_BYTES_MAX_DEFAULT;
use quire_wire::{EntryId, LedgerId, MasterKey, WireError};
use sha1::{Digest, Sha1};
use tokio::sync::{oneshot, watch};

use conn::{Lane, Pool, Reply};
use quorum::{AckTracker, Progress};

/// Ledger client failures. Display is one line.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The metadata store failed or refused.
    #[error("metadata: {0}")]
    Metadata(String),
    /// A bookie answered with an error status.
    #[error("bookie {bookie} answered {status:?}: {message}")]
    Bookie {
        bookie: String,
        status: Status,
        message: String,
    },
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
    Corrupt {
        ledger: u64,
        entry: u64,
        bookie: String,
        reason: String,
    },
    /// Bytes from a bookie did not decode.
    #[error("protocol error: {0}")]
    Protocol(WireError),
    /// An add could not reach its ack quorum and no replacement bookie could be found (or the
    /// ensemble change itself failed); the writer is dead. Entries after its LAC have an unknown
    /// outcome until the ledger is closed or recovered.
    #[error("ledger {ledger} writer failed at entry {entry}: {reason}")]
    WriterFailed {
        ledger: u64,
        entry: u64,
        reason: String,
    },
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
    /// How long a bookie that failed an add (or could not be connected to as a replacement) is
    /// not chosen as a replacement in ensemble changes (BookKeeper `bookieQuarantineTime`;
    /// default 60 s here, BookKeeper's is 30 min).
    pub bookie_quarantine: Duration,
    /// While a failed ensemble position has no replacement, how often a further failure at it
    /// triggers another search (an entry that can no longer reach Qa always triggers one).
    /// Default 1 s.
    pub replacement_retry_interval: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(5),
            frame_size_bytes_max: FRAME_SIZE_BYTES_MAX_DEFAULT,
            bookie_quarantine: Duration::from_secs(60),
            replacement_retry_interval: Duration::from_secs(1),
        }
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
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

struct Inner {
    metadata: Arc<dyn MetadataStore>,
    pool: Pool,
    config: ClientConfig,
    /// Bookies that failed recently, with when; not chosen as replacements until
    /// `config.bookie_quarantine` has passed.
    quarantine: Mutex<HashMap<BookieId, Instant>>,
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
        Self::build(metadata, config, None)
    }

    /// Makes a client whose entry-read and long-poll connections (one of each per bookie, apart
    /// from the connection that carries adds, fences and LAC reads) run their socket tasks on
    /// `read_runtime`: a server gives it a runtime of lower priority so that decoding bulk
    /// catch-up reads does not take CPU from tail writes.
    pub fn with_read_runtime(
        metadata: Arc<dyn MetadataStore>,
        config: ClientConfig,
        read_runtime: tokio::runtime::Handle,
    ) -> Self {
        Self::build(metadata, config, Some(read_runtime))
    }

    fn build(
        metadata: Arc<dyn MetadataStore>,
        config: ClientConfig,
        read_runtime: Option<tokio::runtime::Handle>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                metadata,
                pool: Pool::new(read_runtime),
                config,
                quarantine: Mutex::default(),
            }),
        }
    }

    /// The metadata store this client uses.
    pub fn metadata(&self) -> &Arc<dyn MetadataStore> {
        &self.inner.metadata
    }

    /// Creates a ledger on E randomly chosen writable bookies it can connect to (bookies that
    /// failed lately are tried last; one that cannot be reached is quarantined and skipped).
    ///
    /// # Errors
    /// `Invalid` unless E >= Qw >= Qa >= 1; `NotEnoughBookies` (fewer than E registered);
    /// `BookieUnreachable` (fewer than E reachable: the last connect error); `Metadata`.
    pub async fn create_ledger(&self, opts: LedgerOptions) -> Result<LedgerWriter, Error> {
        let (e, w, a) = (opts.ensemble_size, opts.write_quorum, opts.ack_quorum);
        if !(e >= w && w >= a && a >= 1) {
            return Err(Error::Invalid(format!(
                "need E >= Qw >= Qa >= 1, got E={e} Qw={w} Qa={a}"
            )));
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
            return Err(Error::NotEnoughBookies {
                needed: usize::from(e),
                available: candidates.len(),
            });
        }
        {
            use rand::seq::SliceRandom;
            candidates.shuffle(&mut rand::thread_rng());
        }
        // Bookies that failed lately go last; a registered bookie that cannot be connected to
        // (dead, its registration not yet expired) is quarantined and the next one is tried, so
        // a new ledger does not wait for the registry to notice a crash.
        let quarantined = self.quarantined();
        candidates.sort_by_key(|b| quarantined.contains(b));
        let mut ensemble = Vec::with_capacity(usize::from(e));
        let mut last_err = None;
        for b in &candidates {
            if ensemble.len() == usize::from(e) {
                break;
            }
            match self.conn(b, Lane::Tail).await {
                Ok(conn) => ensemble.push(Slot {
                    bookie: b.clone(),
                    conn,
                    generation: 0,
                }),
                Err(err) => {
                    tracing::warn!(bookie = %b.0, error = %err, "skipping an unreachable bookie for a new ledger");
                    self.quarantine(b);
                    last_err = Some(err);
                }
            }
        }
        if ensemble.len() < usize::from(e) {
            return Err(last_err.unwrap_or(Error::NotEnoughBookies {
                needed: usize::from(e),
                available: ensemble.len(),
            }));
        }
        let candidates: Vec<BookieId> = ensemble.iter().map(|s| s.bookie.clone()).collect();
        let key = master_key(&opts.password);
        let id = self.inner.metadata.allocate_ledger_id().await?;
        let meta = LedgerMetadata {
            format_version: LEDGER_METADATA_FORMAT_VERSION,
            ensemble_size: e,
            write_quorum: w,
            ack_quorum: a,
            state: LedgerState::Open,
            fragments: vec![Fragment {
                first_entry: 0,
                bookies: candidates.clone(),
            }],
            last_entry: None,
            length_bytes: 0,
            digest_type: DigestType::Crc32c,
            master_key_hex: master_key_hex(&key),
            creation_time_ms: now_ms(),
            custom: opts.custom,
        };
        let version = self.inner.metadata.create_ledger(id, &meta).await?;
        Ok(LedgerWriter {
            shared: Arc::new(WriterShared {
                client: self.clone(),
                id,
                key,
                quorum: (e, w, a),
                state: Mutex::new(WriterState {
                    tracker: AckTracker::new(w, a, 0),
                    pending: VecDeque::new(),
                    lac: None,
                    pushed_length_bytes: 0,
                    confirmed_length_bytes: 0,
                    failed: None,
                    meta: (meta, version),
                    ensemble,
                    failing: BTreeSet::new(),
                    unreplaceable: HashMap::new(),
                    changing: false,
                    ensemble_changes: 0,
                }),
                lac_tx: watch::channel(None).0,
            }),
        })
    }

    fn quarantine(&self, bookie: &BookieId) {
        if let Ok(mut q) = self.inner.quarantine.lock() {
            q.insert(bookie.clone(), Instant::now());
        }
    }

    fn quarantined(&self) -> HashSet<BookieId> {
        let keep_for = self.inner.config.bookie_quarantine;
        let Ok(mut q) = self.inner.quarantine.lock() else {
            return HashSet::new();
        };
        q.retain(|_, since| since.elapsed() < keep_for);
        q.keys().cloned().collect()
    }

    async fn conn(&self, bookie: &BookieId, lane: Lane) -> Result<Arc<conn::Conn>, Error> {
        self.inner
            .pool
            .get(
                bookie,
                lane,
                self.inner.config.frame_size_bytes_max,
                self.inner.config.request_timeout,
            )
            .await
    }

    /// Opens a ledger for reading without fencing (BookKeeper `openLedgerNoRecovery`).
    ///
    /// # Errors
    /// `Metadata` (e.g. no such ledger).
    pub async fn open_ledger(&self, id: LedgerId) -> Result<LedgerReader, Error> {
        let meta = self.inner.metadata.read_ledger(id).await?.value;
        Ok(LedgerReader {
            client: self.clone(),
            id,
            meta,
        })
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

    async fn recover_end(
        &self,
        id: LedgerId,
        meta: &LedgerMetadata,
    ) -> Result<(Option<EntryId>, u64), Error> {
        let key = meta.master_key()?;
        let (e, w, a) = (meta.ensemble_size, meta.write_quorum, meta.ack_quorum);
        let timeout = self.inner.config.request_timeout;
        let fragment = meta
            .fragments
            .last()
            .ok_or_else(|| Error::Invalid("ledger without fragments".into()))?;
        // 1. Fence every bookie of the last ensemble.
        let mut calls = Vec::new();
        for b in &fragment.bookies {
            let client = self.clone();
            let b = b.clone();
            calls.push(tokio::spawn(async move {
                let c = client.conn(&b, Lane::Tail).await?;
                c.call(timeout, move |out, rid| {
                    bookie::encode_request(
                        out,
                        rid,
                        &Request::Fence {
                            ledger: id,
                            master_key: key,
                        },
                    )
                })
                .await
            }));
        }
        let mut answered = vec![false; usize::from(e)];
        let mut lac: Option<EntryId> = fragment.first_entry.checked_sub(1).map(EntryId);
        let mut reasons = Vec::new();
        for (i, call) in calls.into_iter().enumerate() {
            match call
                .await
                .map_err(|j| Error::Invalid(j.to_string()))
                .and_then(|r| r)
            {
                Ok(Reply::Fence { lac: l }) => {
                    answered[i] = true;
                    lac = lac.max(l);
                }
                Ok(Reply::Failed {
                    status: Status::NoSuchLedger,
                    ..
                }) => answered[i] = true,
                Ok(Reply::Failed { status, message }) => {
                    reasons.push(format!("{}: {status:?} {message}", fragment.bookies[i]))
                }
                Ok(other) => reasons.push(format!("{}: unexpected {other:?}", fragment.bookies[i])),
                Err(err) => reasons.push(err.to_string()),
            }
        }
        if !quorum::covers(&answered, e, w, a) {
            return Err(Error::Recovery {
                ledger: id.0,
                reason: format!("fencing did not cover the ensemble: {}", reasons.join("; ")),
            });
        }
        // 2. Length so far: the header of the LAC entry (if any) carries the cumulative length.
        let reader = LedgerReader {
            client: self.clone(),
            id,
            meta: meta.clone(),
        };
        let mut length_bytes = 0;
        let mut last = lac;
        if let Some(l) = lac {
            match reader.read_raw(l, Some(key)).await? {
                ReadOutcome::Found(bytes) => {
                    length_bytes = header_of(&bytes, id, l)?.length_bytes;
                }
                ReadOutcome::Missing => {
                    return Err(Error::Recovery {
                        ledger: id.0,
                        reason: format!("LAC entry {l} is missing on every replica"),
                    });
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
                    self.recovery_add(meta, id, key, EntryId(next), bytes)
                        .await?;
                    last = Some(EntryId(next));
                    next += 1;
                }
            }
        }
        Ok((last, length_bytes))
    }

    async fn recovery_add(
        &self,
        meta: &LedgerMetadata,
        id: LedgerId,
        key: MasterKey,
        entry: EntryId,
        bytes: Vec<u8>,
    ) -> Result<(), Error> {
        let fragment = meta.fragment_for(entry);
        let timeout = self.inner.config.request_timeout;
        let bytes = Arc::new(bytes);
        let mut calls = Vec::new();
        for pos in quorum::write_set(entry.0, meta.ensemble_size, meta.write_quorum) {
            let client = self.clone();
            let b = fragment.bookies[pos].clone();
            let bytes = bytes.clone();
            calls.push(tokio::spawn(async move {
                let c = client.conn(&b, Lane::Tail).await?;
                c.call(timeout, move |out, rid| {
                    bookie::encode_request(
                        out,
                        rid,
                        &Request::Add {
                            recovery: true,
                            master_key: key,
                            entry: &bytes,
                        },
                    )
                })
                .await
            }));
        }
        let mut acks = 0;
        let mut reasons = Vec::new();
        for call in calls {
            match call
                .await
                .map_err(|j| Error::Invalid(j.to_string()))
                .and_then(|r| r)
            {
                Ok(Reply::Add) => acks += 1,
                Ok(other) => reasons.push(format!("{other:?}")),
                Err(e) => reasons.push(e.to_string()),
            }
        }
        if acks < usize::from(meta.ack_quorum) {
            return Err(Error::Recovery {
                ledger: id.0,
                reason: format!(
                    "re-adding entry {entry} reached {acks} of {} acks: {}",
                    meta.ack_quorum,
                    reasons.join("; ")
                ),
            });
        }
        Ok(())
    }
}

fn header_of(bytes: &[u8], ledger: LedgerId, entry: EntryId) -> Result<EntryHeader, Error> {
    verify_expected(bytes, ledger, entry)
        .map(|(h, _)| h)
        .map_err(|e| Error::Corrupt {
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

/// An add not yet confirmed: its bytes are kept so an ensemble change can re-send them.
struct PendingAdd {
    entry: u64,
    /// Cumulative ledger length through this entry, in bytes.
    length_bytes: u64,
    bytes: Arc<Vec<u8>>,
    tx: oneshot::Sender<Result<EntryId, Error>>,
}

/// One position of the writer's current ensemble. `generation` grows with every replacement,
/// so replies from a bookie that no longer holds the position are recognised and dropped.
struct Slot {
    bookie: BookieId,
    conn: Arc<conn::Conn>,
    generation: u64,
}

struct WriterState {
    tracker: AckTracker,
    /// Pending adds, in entry order (the same entries as `tracker`).
    pending: VecDeque<PendingAdd>,
    lac: Option<EntryId>,
    pushed_length_bytes: u64,
    confirmed_length_bytes: u64,
    failed: Option<Error>,
    /// The writer's copy of the ledger metadata and its version.
    meta: (LedgerMetadata, Version),
    /// The current ensemble (the last fragment), by position.
    ensemble: Vec<Slot>,
    /// Positions whose bookie failed an add and that await a replacement.
    failing: BTreeSet<usize>,
    /// Failed positions for which no replacement was found, with the time of the last search.
    unreplaceable: HashMap<usize, Instant>,
    /// An ensemble change is running; success is held back meanwhile.
    changing: bool,
    ensemble_changes: u64,
}

struct WriterShared {
    client: BookKeeper,
    id: LedgerId,
    key: MasterKey,
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
    /// it to its write set in the current ensemble before returning. The returned futures
    /// resolve in entry order, each once Qa bookies of its write set have it durable (BookKeeper
    /// `PendingAddOp`). A bookie failing the add triggers an ensemble change (see the crate
    /// docs); the add then completes on the replacement.
    ///
    /// # Errors
    /// (through the future) `Fenced` if a recoverer fenced the ledger (or moved it to
    /// IN_RECOVERY during an ensemble change); `Closed` if it was closed; `WriterFailed` if an
    /// entry cannot reach Qa and no replacement bookie exists; a bookie's `Unauthorized`
    /// answer. Once failed, every later add fails the same way.
    pub fn add(&self, payload: Vec<u8>) -> AddFuture {
        let s = &self.shared;
        let (e, w, _) = s.quorum;
        let (tx, rx) = oneshot::channel();
        {
            let Ok(mut st) = s.state.lock() else {
                return Box::pin(async { Err(Error::Invalid("writer state poisoned".into())) });
            };
            if let Some(err) = &st.failed {
                let err = err.clone();
                return Box::pin(async move { Err(err) });
            }
            let entry = st.tracker.push();
            st.pushed_length_bytes += payload.len() as u64;
            let header = EntryHeader {
                ledger: s.id,
                entry: EntryId(entry),
                lac: st.lac,
                length_bytes: st.pushed_length_bytes,
            };
            let bytes = Arc::new(encode_entry(header, &payload));
            let length_bytes = st.pushed_length_bytes;
            for pos in quorum::write_set(entry, e, w) {
                s.send(&st, entry, &bytes, pos);
            }
            st.pending.push_back(PendingAdd {
                entry,
                length_bytes,
                bytes,
                tx,
            });
        }
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| {
                Err(Error::Invalid(
                    "writer dropped before the add completed".into(),
                ))
            })
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
        self.shared
            .state
            .lock()
            .map_or(0, |s| s.pushed_length_bytes)
    }

    /// The writer's current ensemble (its last fragment), by position.
    pub fn ensemble(&self) -> Vec<BookieId> {
        self.shared.state.lock().map_or_else(
            |_| Vec::new(),
            |s| s.ensemble.iter().map(|slot| slot.bookie.clone()).collect(),
        )
    }

    /// The writer's copy of the ledger metadata (updated by its ensemble changes and close).
    pub fn metadata(&self) -> Option<LedgerMetadata> {
        self.shared.state.lock().ok().map(|s| s.meta.0.clone())
    }

    /// Ensemble changes this writer has completed.
    pub fn ensemble_changes(&self) -> u64 {
        self.shared.state.lock().map_or(0, |s| s.ensemble_changes)
    }

    /// Waits for pending adds (and a running ensemble change) to finish, then closes the ledger
    /// at its LAC by compare-and-set (BookKeeper `LedgerHandle.asyncClose`). A failed writer
    /// closes at its LAC at once.
    ///
    /// # Errors
    /// `Metadata`; `Fenced` if a recoverer changed the metadata meanwhile and ended the ledger
    /// somewhere else.
    pub async fn close(&self) -> Result<LedgerMetadata, Error> {
        let mut watch = self.lac_watch();
        loop {
            let busy =
                self.shared.state.lock().is_ok_and(|s| {
                    s.changing || (s.failed.is_none() && s.tracker.pending_count() > 0)
                });
            if !busy {
                break;
            }
            if watch.changed().await.is_err() {
                break;
            }
        }
        let (mut meta, mut version, lac, length) = {
            let st = self
                .shared
                .state
                .lock()
                .map_err(|_| Error::Invalid("writer state poisoned".into()))?;
            (
                st.meta.0.clone(),
                st.meta.1,
                st.lac,
                st.confirmed_length_bytes,
            )
        };
        let store = &self.shared.client.inner.metadata;
        loop {
            meta.state = LedgerState::Closed;
            meta.last_entry = lac.map(|e| e.0);
            meta.length_bytes = length;
            match store.update_ledger(self.shared.id, &meta, version).await {
                Ok(v) => {
                    if let Ok(mut st) = self.shared.state.lock() {
                        st.meta = (meta.clone(), v);
                        st.failed.get_or_insert(Error::Closed {
                            ledger: self.shared.id.0,
                        });
                    }
                    return Ok(meta);
                }
                Err(quire_metadata::Error::BadVersion { .. }) => {
                    let now = store.read_ledger(self.shared.id).await?;
                    match now.value.state {
                        // Only this writer changes an open ledger; a stale copy (an ensemble
                        // change that failed the writer after its update) is retried.
                        LedgerState::Open => (meta, version) = (now.value, now.version),
                        LedgerState::Closed if now.value.last_entry == meta.last_entry => {
                            return Ok(now.value)
                        }
                        _ => {
                            return Err(Error::Fenced {
                                ledger: self.shared.id.0,
                            })
                        }
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl WriterShared {
    /// Sends `entry` to the bookie at ensemble position `pos`; the reply comes back to
    /// `on_reply` tagged with the position's generation. Called with the state locked, so sends
    /// and ensemble swaps are ordered.
    fn send(self: &Arc<Self>, st: &WriterState, entry: u64, bytes: &Arc<Vec<u8>>, pos: usize) {
        let slot = &st.ensemble[pos];
        let key = self.key;
        let reply = slot
            .conn
            .call(self.client.inner.config.request_timeout, |out, rid| {
                bookie::encode_request(
                    out,
                    rid,
                    &Request::Add {
                        recovery: false,
                        master_key: key,
                        entry: bytes,
                    },
                )
            });
        let shared = self.clone();
        let generation = slot.generation;
        tokio::spawn(async move {
            let outcome = reply.await;
            shared.on_reply(entry, pos, generation, outcome);
        });
    }

    fn on_reply(
        self: &Arc<Self>,
        entry: u64,
        pos: usize,
        generation: u64,
        outcome: Result<Reply, Error>,
    ) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        if st.failed.is_some() || st.ensemble[pos].generation != generation {
            // Dead writer, or a reply from a bookie that was replaced at this position: its
            // acks do not count for the new fragment (BookKeeper drops them too).
            return;
        }
        match outcome {
            Ok(Reply::Add) => st.tracker.record_ack(entry, pos),
            Ok(Reply::Failed {
                status: Status::Fenced,
                ..
            }) => {
                self.fail(&mut st, Error::Fenced { ledger: self.id.0 });
                return;
            }
            Ok(Reply::Failed {
                status: Status::Unauthorized,
                message,
            }) => {
                let bookie = st.ensemble[pos].bookie.0.clone();
                self.fail(
                    &mut st,
                    Error::Bookie {
                        bookie,
                        status: Status::Unauthorized,
                        message,
                    },
                );
                return;
            }
            other => {
                let reason = match other {
                    Ok(r) => format!("{r:?}"),
                    Err(e) => e.to_string(),
                };
                tracing::warn!(ledger = self.id.0, entry, bookie = %st.ensemble[pos].bookie, "add failed: {reason}");
                let lost = matches!(st.tracker.fail(entry, pos), Progress::QuorumLost(_));
                self.on_bookie_failure(&mut st, pos, lost);
            }
        }
        self.release(&mut st);
    }

    /// Notes that the bookie at `pos` failed and starts an ensemble change unless one runs
    /// (a running change takes the position in its next pass). A position without replacement
    /// is searched again only after `replacement_retry_interval`, or at once when an entry can
    /// no longer reach Qa (`lost`).
    fn on_bookie_failure(self: &Arc<Self>, st: &mut WriterState, pos: usize, lost: bool) {
        if let Some(searched) = st.unreplaceable.get(&pos) {
            if !lost && searched.elapsed() < self.client.inner.config.replacement_retry_interval {
                return;
            }
        }
        st.failing.insert(pos);
        if !st.changing {
            st.changing = true;
            let shared = self.clone();
            tokio::spawn(async move { shared.change_ensemble().await });
        }
    }

    /// Releases confirmed adds in entry order and advances the LAC, unless an ensemble change
    /// holds success back.
    fn release(&self, st: &mut WriterState) {
        if st.changing || st.failed.is_some() {
            return;
        }
        let confirmed = st.tracker.take_confirmed();
        let Some(&last) = confirmed.last() else {
            return;
        };
        // The LAC moves first, so whoever sees an add complete also sees a LAC covering it
        // (BookKeeper sets `lastAddConfirmed` before the callbacks).
        assert!(st.lac.is_none_or(|l| l.0 < last), "LAC only moves forward");
        st.lac = Some(EntryId(last));
        self.lac_tx.send_replace(st.lac);
        for e in confirmed {
            let p = st
                .pending
                .pop_front()
                .expect("a pending add per tracked entry");
            assert_eq!(p.entry, e, "pending adds and tracker agree on order");
            st.confirmed_length_bytes = p.length_bytes;
            let _ = p.tx.send(Ok(EntryId(e)));
        }
    }

    fn fail(&self, st: &mut WriterState, err: Error) {
        st.failed = Some(err.clone());
        for p in st.pending.drain(..) {
            let _ = p.tx.send(Err(err.clone()));
        }
        // Wake close() waiters.
        self.lac_tx.send_modify(|_| {});
    }

    /// The ensemble change loop (BookKeeper `ensembleChangeLoop`): one pass per batch of failed
    /// positions, until none is left; failures arriving during a pass are taken by the next.
    async fn change_ensemble(self: Arc<Self>) {
        loop {
            let failing: Vec<(usize, BookieId)> = {
                let Ok(mut st) = self.state.lock() else {
                    return;
                };
                if st.failed.is_some() || st.failing.is_empty() {
                    st.changing = false;
                    self.release(&mut st);
                    self.lac_tx.send_modify(|_| {});
                    return;
                }
                st.failing
                    .iter()
                    .map(|&p| (p, st.ensemble[p].bookie.clone()))
                    .collect()
            };
            if let Err(err) = self.change_pass(&failing).await {
                tracing::warn!(ledger = self.id.0, "ensemble change failed: {err}");
                if let Ok(mut st) = self.state.lock() {
                    if st.failed.is_none() {
                        self.fail(&mut st, err);
                    }
                    st.changing = false;
                    self.lac_tx.send_modify(|_| {});
                }
                return;
            }
        }
    }

    /// One pass: choose replacements for `failing` (position, bookie), connect to them, update
    /// the metadata by compare-and-set, then swap them in and re-send the pending adds.
    async fn change_pass(self: &Arc<Self>, failing: &[(usize, BookieId)]) -> Result<(), Error> {
        let client = &self.client;
        let (e, w, _) = self.quorum;
        let (ensemble, lac, mut meta, mut version) = {
            let st = self
                .state
                .lock()
                .map_err(|_| Error::Invalid("writer state poisoned".into()))?;
            (
                st.ensemble
                    .iter()
                    .map(|s| s.bookie.clone())
                    .collect::<Vec<_>>(),
                st.lac,
                st.meta.0.clone(),
                st.meta.1,
            )
        };
        // 1. Placement.
        let registered = client.inner.metadata.list_bookies().await?;
        let mut exclude: HashSet<BookieId> = ensemble.iter().cloned().collect();
        exclude.extend(client.quarantined());
        let mut keep: Vec<BookieId> = ensemble
            .iter()
            .enumerate()
            .filter(|(p, _)| !failing.iter().any(|(f, _)| f == p))
            .map(|(_, b)| b.clone())
            .collect();
        let mut chosen: Vec<(usize, BookieId, Arc<conn::Conn>)> = Vec::new();
        for (pos, _) in failing {
            loop {
                let pick = placement::choose_replacement(
                    &registered,
                    &keep,
                    &exclude,
                    &mut rand::thread_rng(),
                );
                let Some(b) = pick else { break };
                exclude.insert(b.clone());
                match client.conn(&b, Lane::Tail).await {
                    Ok(c) => {
                        keep.push(b.clone());
                        chosen.push((*pos, b, c));
                        break;
                    }
                    Err(err) => {
                        tracing::warn!(ledger = self.id.0, bookie = %b, "replacement unreachable: {err}");
                        client.quarantine(&b);
                    }
                }
            }
        }
        for (_, b) in failing {
            client.quarantine(b);
        }
        // 2. Metadata: a fragment from LAC + 1 (success is held back, so the LAC cannot move
        //    during the pass), only while the ledger is OPEN and the failed bookies are still in
        //    the last fragment.
        if !chosen.is_empty() {
            let first = lac.map_or(0, |l| l.0 + 1);
            loop {
                match meta.state {
                    LedgerState::Open => {}
                    LedgerState::InRecovery => return Err(Error::Fenced { ledger: self.id.0 }),
                    LedgerState::Closed => return Err(Error::Closed { ledger: self.id.0 }),
                }
                let last = meta
                    .fragments
                    .last()
                    .ok_or_else(|| Error::Invalid("ledger without fragments".into()))?;
                if last.first_entry > first {
                    return Err(Error::WriterFailed {
                        ledger: self.id.0,
                        entry: first,
                        reason: format!(
                            "last fragment starts at {} beyond LAC + 1 = {first}",
                            last.first_entry
                        ),
                    });
                }
                for (pos, old) in failing {
                    if last.bookies.get(*pos) != Some(old) {
                        return Err(Error::WriterFailed {
                            ledger: self.id.0,
                            entry: first,
                            reason: format!("ensemble changed under the writer: position {pos} no longer holds {old}"),
                        });
                    }
                }
                let mut bookies = last.bookies.clone();
                for (pos, b, _) in &chosen {
                    bookies[*pos] = b.clone();
                }
                let mut next = meta.clone();
                if last.first_entry == first {
                    next.fragments.last_mut().expect("checked above").bookies = bookies;
                } else {
                    next.fragments.push(Fragment {
                        first_entry: first,
                        bookies,
                    });
                }
                match client
                    .inner
                    .metadata
                    .update_ledger(self.id, &next, version)
                    .await
                {
                    Ok(v) => {
                        (meta, version) = (next, v);
                        break;
                    }
                    Err(quire_metadata::Error::BadVersion { .. }) => {
                        let now = client.inner.metadata.read_ledger(self.id).await?;
                        (meta, version) = (now.value, now.version);
                    }
                    Err(err) => return Err(err.into()),
                }
            }
        }
        // 3. Swap in the replacements and re-send every pending add they now hold.
        let mut st = self
            .state
            .lock()
            .map_err(|_| Error::Invalid("writer state poisoned".into()))?;
        if !chosen.is_empty() {
            st.meta = (meta, version);
        }
        if st.failed.is_some() {
            return Ok(());
        }
        debug_assert_eq!(
            st.lac, lac,
            "success is held back during an ensemble change"
        );
        let now = Instant::now();
        for (pos, _) in failing {
            st.failing.remove(pos);
            st.unreplaceable.insert(*pos, now);
        }
        for (pos, bookie, conn) in chosen {
            tracing::info!(ledger = self.id.0, position = pos, from = %st.ensemble[pos].bookie, to = %bookie, first_entry = lac.map_or(0, |l| l.0 + 1), "ensemble change");
            st.unreplaceable.remove(&pos);
            let slot = &mut st.ensemble[pos];
            slot.bookie = bookie;
            slot.conn = conn;
            slot.generation += 1;
            st.tracker.forget_position(pos);
            let resend: Vec<(u64, Arc<Vec<u8>>)> = st
                .pending
                .iter()
                .filter(|p| quorum::write_set(p.entry, e, w).contains(&pos))
                .map(|p| (p.entry, p.bytes.clone()))
                .collect();
            for (entry, bytes) in resend {
                self.send(&st, entry, &bytes, pos);
            }
            st.ensemble_changes += 1;
        }
        if let Some(entry) = st.tracker.first_quorum_lost() {
            let stuck: Vec<String> = st
                .unreplaceable
                .keys()
                .map(|p| st.ensemble[*p].bookie.0.clone())
                .collect();
            let writable = registered.iter().filter(|b| !b.read_only).count();
            return Err(Error::WriterFailed {
                ledger: self.id.0,
                entry,
                reason: format!(
                    "entry cannot reach Qa: no replacement for failed bookie(s) {} ({writable} writable registered, all in the ensemble or failed recently)",
                    stuck.join(", ")
                ),
            });
        }
        Ok(())
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
            ReadOutcome::Missing => Err(Error::NoSuchEntry {
                ledger: self.id.0,
                entry: entry.0,
            }),
        }
    }

    /// Reads the verified entry bytes. `Missing` needs Qw − Qa + 1 denials from the write set.
    async fn read_raw(
        &self,
        entry: EntryId,
        fence: Option<MasterKey>,
    ) -> Result<ReadOutcome, Error> {
        let meta = &self.meta;
        let fragment = meta.fragment_for(entry);
        let timeout = self.client.inner.config.request_timeout;
        let mut denials = 0;
        let mut last_err = None;
        // Replicas that timed out or were unreachable lately go last, so a stalled bookie costs
        // one request timeout per quarantine period instead of one per entry (BookKeeper reads
        // around slow bookies the same way, with its speculative reads).
        let quarantined = self.client.quarantined();
        let mut order = quorum::write_set(entry.0, meta.ensemble_size, meta.write_quorum);
        order.sort_by_key(|&pos| quarantined.contains(&fragment.bookies[pos]));
        // Fencing reads belong to recovery, a tail operation; plain reads take the read lane.
        let lane = if fence.is_some() {
            Lane::Tail
        } else {
            Lane::Read
        };
        for pos in order {
            let b = &fragment.bookies[pos];
            let reply = match self.client.conn(b, lane).await {
                Ok(c) => {
                    c.call(timeout, conn::read_request(self.id, Some(entry), fence))
                        .await
                }
                Err(e) => Err(e),
            };
            match reply {
                Ok(Reply::Read { data }) => match verify_expected(&data, self.id, entry) {
                    Ok(_) => return Ok(ReadOutcome::Found(data)),
                    Err(e) => {
                        last_err = Some(Error::Corrupt {
                            ledger: self.id.0,
                            entry: entry.0,
                            bookie: b.0.clone(),
                            reason: e.to_string(),
                        })
                    }
                },
                Ok(Reply::Failed {
                    status: Status::NoSuchEntry | Status::NoSuchLedger,
                    ..
                }) => denials += 1,
                Ok(Reply::Failed { status, message }) => {
                    last_err = Some(Error::Bookie {
                        bookie: b.0.clone(),
                        status,
                        message,
                    })
                }
                Ok(other) => last_err = Some(Error::Invalid(format!("unexpected reply {other:?}"))),
                Err(e) => {
                    if matches!(e, Error::Timeout { .. } | Error::BookieUnreachable { .. }) {
                        self.client.quarantine(b);
                    }
                    last_err = Some(e);
                }
            }
        }
        if denials >= usize::from(meta.write_quorum - meta.ack_quorum + 1) {
            return Ok(ReadOutcome::Missing);
        }
        Err(last_err.unwrap_or(Error::NoSuchEntry {
            ledger: self.id.0,
            entry: entry.0,
        }))
    }

    /// The highest LAC any bookie of the last ensemble reports (BookKeeper `readLastConfirmed`).
    ///
    /// # Errors
    /// The last error, if no bookie answered.
    pub async fn read_lac(&self) -> Result<Option<EntryId>, Error> {
        let fragment = self
            .meta
            .fragments
            .last()
            .ok_or_else(|| Error::Invalid("ledger without fragments".into()))?;
        let timeout = self.client.inner.config.request_timeout;
        let mut best = None;
        let mut any = false;
        let mut last_err = None;
        for b in &fragment.bookies {
            let id = self.id;
            let reply = match self.client.conn(b, Lane::Tail).await {
                Ok(c) => {
                    c.call(timeout, move |out, rid| {
                        bookie::encode_request(out, rid, &Request::ReadLac { ledger: id })
                    })
                    .await
                }
                Err(e) => Err(e),
            };
            match reply {
                Ok(Reply::ReadLac { lac, .. }) => {
                    any = true;
                    best = best.max(lac);
                }
                Ok(Reply::Failed {
                    status: Status::NoSuchLedger,
                    ..
                }) => any = true,
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

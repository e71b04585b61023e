//! The single writer of a ledger (BookKeeper `LedgerHandle`): ledger creation on a random
//! ensemble, the add pipeline (entry e sent eagerly to its write set `(e + i) mod E`, confirmed
//! strictly in entry order once Qa bookies hold it, with the LAC piggybacked on every entry),
//! the LAC watch, and close by compare-and-set. A failed add hands the position to
//! `ensemble_change`, which shares the writer's state defined here.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use quire_metadata::{
    master_key_hex, BookieId, DigestType, Fragment, LedgerMetadata, LedgerState, Version,
    LEDGER_METADATA_FORMAT_VERSION,
};
use quire_wire::bookie::Status;
use quire_wire::entry::{encode_entry_header, EntryHeader, ENTRY_HEADER_SIZE_BYTES};
use quire_wire::{EntryId, LedgerId, MasterKey};
use sha1::{Digest, Sha1};
use tokio::sync::{oneshot, watch};

use crate::conn::{self, Lane, Reply};
use crate::quorum::{self, AckTracker, Progress};
use crate::{placement, BookKeeper, Error};

/// How to create a ledger.
#[derive(Debug, Clone)]
pub struct LedgerOptions {
    /// Ensemble size E.
    pub ensemble_size: u8,
    /// Write quorum Qw.
    pub write_quorum: u8,
    /// Ack quorum Qa.
    pub ack_quorum: u8,
    /// Secret of the ledger's writer, not empty (a stream's ledger secret, see
    /// [`new_ledger_secret`]). The ledger's master key is [`ledger_master_key`] of it and the
    /// ledger id, kept in the ledger metadata (`master_key_hex`), where recovery and
    /// re-replication take it from.
    pub password: Vec<u8>,
    /// Custom metadata stored with the ledger. A stream's own placement recorded in it
    /// ([`quire_metadata::StreamPlacement::record`], key `quire.placement`) is the placement
    /// the ledger is created and later replaced by ([`placement::LedgerPlacement`]); without
    /// it, the client's `[ledger]` settings.
    pub custom: BTreeMap<String, String>,
}

/// Derives a master key from a password: SHA-1("ledger" ‖ password) (BookKeeper
/// `MacDigestManager.genDigest("ledger", password)`). Ledgers Quire wrote before per-stream
/// secrets have `master_key(b"quire")`, kept in their metadata, with which they are still read
/// and recovered.
pub fn master_key(password: &[u8]) -> MasterKey {
    let mut h = Sha1::new();
    h.update(b"ledger");
    h.update(password);
    MasterKey(h.finalize().into())
}

/// The master key of ledger `id` written with `secret`: [`master_key`] of `secret` followed by
/// the id as u64 big-endian (20 bytes). Every ledger gets its own key, and no key can be
/// derived without the writer's secret (docs/format/metadata.md, `ledger_secret_hex`).
pub fn ledger_master_key(secret: &[u8], id: LedgerId) -> MasterKey {
    let mut password = Vec::with_capacity(secret.len() + 8);
    password.extend_from_slice(secret);
    // Big-endian, as the key's definition says (docs/format/metadata.md).
    password.extend_from_slice(&id.0.to_be_bytes());
    master_key(&password)
}

/// Bytes of a ledger secret made by [`new_ledger_secret`].
pub const LEDGER_SECRET_BYTES: usize = 32;

/// A fresh ledger secret: [`LEDGER_SECRET_BYTES`] random bytes from the thread's CSPRNG
/// (`rand::thread_rng`, ChaCha seeded from the OS).
// A secret: never from the seedable quire_clock seam (ARCHITECTURE.md, clock and randomness).
#[allow(clippy::disallowed_methods)]
pub fn new_ledger_secret() -> Vec<u8> {
    use rand::RngCore;
    let mut secret = vec![0u8; LEDGER_SECRET_BYTES];
    rand::thread_rng().fill_bytes(&mut secret);
    secret
}

fn now_ms() -> u64 {
    quire_clock::unix_ms()
}

impl BookKeeper {
    /// Creates a ledger on E writable bookies it can connect to, placed by the placement
    /// recorded in `opts.custom`, else the client's (`ClientConfig::placement`; bookies that failed lately are placed only
    /// when needed; one that cannot be reached is quarantined and skipped).
    ///
    /// # Errors
    /// `Invalid` unless E >= Qw >= Qa >= 1, or for an empty password; `Metadata` (`Invalid`)
    /// for a recorded placement that does not parse; `NotEnoughBookies` (fewer than E
    /// registered, in the placement's regions);
    /// `Placement` (the policy's enforced rule cannot be kept with the registered bookies);
    /// `BookieUnreachable` (fewer than E reachable: the last connect error); `Metadata`.
    pub async fn create_ledger(&self, opts: LedgerOptions) -> Result<LedgerWriter, Error> {
        let (e, w, a) = (opts.ensemble_size, opts.write_quorum, opts.ack_quorum);
        if !(e >= w && w >= a && a >= 1) {
            return Err(Error::Invalid(format!(
                "need E >= Qw >= Qa >= 1, got E={e} Qw={w} Qa={a}"
            )));
        }
        if opts.password.is_empty() {
            return Err(Error::Invalid(
                "a ledger needs its writer's secret (LedgerOptions::password is empty)".into(),
            ));
        }
        let rule =
            placement::LedgerPlacement::of_ledger(&self.inner.config.placement, &opts.custom)?;
        let ensemble = self.connect_ensemble((e, w, a), &rule).await?;
        let candidates: Vec<BookieId> = ensemble.iter().map(|s| s.bookie.clone()).collect();
        let id = self.inner.metadata.allocate_ledger_id().await?;
        let key = ledger_master_key(&opts.password, id);
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
                placement: rule,
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
                    reported_missing: HashSet::new(),
                    changing: false,
                    ensemble_changes: 0,
                }),
                lac_tx: watch::channel(None).0,
            }),
        })
    }

    /// Connects to an ensemble of `e` writable registered bookies placed by `rule`
    /// ([`crate::placement::choose_ensemble`]; BookKeeper `newEnsemble`), in its regions. Bookies that
    /// failed lately are placed only when no placement exists without them; a registered
    /// bookie that cannot be connected to (dead, its registration not yet expired) is
    /// quarantined and the placement made again without it, so a new ledger does not wait for
    /// the registry to notice a crash.
    ///
    /// # Errors
    /// `NotEnoughBookies` (fewer than `e` eligible); `Placement` (the enforced rule of the
    /// policy cannot be kept); the last connect error when fewer than `e` are reachable;
    /// `Metadata`.
    async fn connect_ensemble(
        &self,
        (e, w, a): placement::Shape,
        rule: &placement::LedgerPlacement,
    ) -> Result<Vec<Slot>, Error> {
        let registered = self.registered_bookies().await?;
        let settings = &rule.settings;
        // Bookies outside the placement's regions are never placed: unreachable from the start.
        let mut unreachable: HashSet<BookieId> = rule.outside(&registered);
        let mut last_err = None;
        loop {
            let mut avoid: HashSet<BookieId> = unreachable.clone();
            avoid.extend(self.quarantined());
            let placed = placement::choose_ensemble(
                settings,
                (e, w, a),
                &registered,
                &avoid,
                &mut quire_clock::rng(),
            )
            .or_else(|_| {
                placement::choose_ensemble(
                    settings,
                    (e, w, a),
                    &registered,
                    &unreachable,
                    &mut quire_clock::rng(),
                )
            });
            let chosen = match placed {
                Ok(chosen) => chosen,
                Err(err) => return Err(last_err.unwrap_or(err)),
            };
            let mut ensemble = Vec::with_capacity(usize::from(e));
            for b in &chosen {
                match self.conn(b, Lane::Tail).await {
                    Ok(conn) => ensemble.push(Slot {
                        bookie: b.clone(),
                        conn,
                        generation: 0,
                    }),
                    Err(err) => {
                        tracing::warn!(bookie = %b.0, error = %err, "skipping an unreachable bookie for a new ledger");
                        self.quarantine(b);
                        unreachable.insert(b.clone());
                        last_err = Some(err);
                    }
                }
            }
            if ensemble.len() == usize::from(e) {
                return Ok(ensemble);
            }
        }
    }
}

/// Future of one add; resolves in entry order.
pub type AddFuture = Pin<Box<dyn Future<Output = Result<EntryId, Error>> + Send + 'static>>;

/// An entry as it is sent: its header (fields and CRC32C digest, `entry::encode_entry_header`)
/// and its payload, the caller's buffer, shared by the frames to every bookie of the write set
/// and kept for re-sends (cloning shares, never copies). On the wire the two are one entry.
#[derive(Clone)]
pub(crate) struct EntryBytes {
    pub(crate) head: [u8; ENTRY_HEADER_SIZE_BYTES],
    pub(crate) payload: Bytes,
}

/// An add not yet confirmed: its bytes are kept so an ensemble change can re-send them.
pub(crate) struct PendingAdd {
    pub(crate) entry: u64,
    /// Cumulative ledger length through this entry, in bytes.
    pub(crate) length_bytes: u64,
    pub(crate) bytes: EntryBytes,
    pub(crate) tx: oneshot::Sender<Result<EntryId, Error>>,
    /// Counts it in `quire_ledger_pending_adds` while it lives (confirmed, failed or dropped
    /// with its writer, it is no longer pending).
    pub(crate) _pending: crate::metrics::PendingAdd,
}

/// One position of the writer's current ensemble. `generation` grows with every replacement,
/// so replies from a bookie that no longer holds the position are recognised and dropped.
pub(crate) struct Slot {
    pub(crate) bookie: BookieId,
    pub(crate) conn: Arc<conn::Conn>,
    pub(crate) generation: u64,
}

pub(crate) struct WriterState {
    pub(crate) tracker: AckTracker,
    /// Pending adds, in entry order (the same entries as `tracker`).
    pub(crate) pending: VecDeque<PendingAdd>,
    pub(crate) lac: Option<EntryId>,
    pub(crate) pushed_length_bytes: u64,
    pub(crate) confirmed_length_bytes: u64,
    pub(crate) failed: Option<Error>,
    /// The writer's copy of the ledger metadata and its version.
    pub(crate) meta: (LedgerMetadata, Version),
    /// The current ensemble (the last fragment), by position.
    pub(crate) ensemble: Vec<Slot>,
    /// Positions whose bookie failed an add and that await a replacement.
    pub(crate) failing: BTreeSet<usize>,
    /// Failed positions for which no replacement was found, with the time of the last search.
    pub(crate) unreplaceable: HashMap<usize, Instant>,
    /// Bookies this writer reported as missing entries of the ledger (once each).
    pub(crate) reported_missing: HashSet<BookieId>,
    /// An ensemble change is running; success is held back meanwhile.
    pub(crate) changing: bool,
    pub(crate) ensemble_changes: u64,
}

pub(crate) struct WriterShared {
    pub(crate) client: BookKeeper,
    pub(crate) id: LedgerId,
    pub(crate) key: MasterKey,
    pub(crate) quorum: (u8, u8, u8),
    /// What the ledger was placed by; its ensemble changes keep it.
    pub(crate) placement: placement::LedgerPlacement,
    pub(crate) state: Mutex<WriterState>,
    pub(crate) lac_tx: watch::Sender<Option<EntryId>>,
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
    ///
    /// # Copies
    /// `payload` (a `Vec<u8>` or a `bytes::Bytes`, taken without copying) is not copied: the
    /// frames to the bookies of the write set share it and the connections write it with
    /// vectored writes behind a small header of their own (perf/README.md, "Copies on the
    /// write path").
    pub fn add(&self, payload: impl Into<Bytes>) -> AddFuture {
        let payload: Bytes = payload.into();
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
            let bytes = EntryBytes {
                head: encode_entry_header(header, &payload),
                payload,
            };
            let length_bytes = st.pushed_length_bytes;
            for pos in quorum::write_set(entry, e, w) {
                s.send(&st, entry, &bytes, pos);
            }
            st.pending.push_back(PendingAdd {
                entry,
                length_bytes,
                bytes,
                tx,
                _pending: crate::metrics::PendingAdd::new(),
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

/// Records an add sent at `sent` in its bookie's series of the ledger client's metrics.
fn record_add(
    bookie: &crate::metrics::BookieAddMetrics,
    sent: Instant,
    outcome: &Result<Reply, Error>,
) {
    use crate::metrics::AddOutcome;
    let outcome = match outcome {
        Ok(Reply::Add) => AddOutcome::Replied,
        Err(Error::Timeout { .. }) => AddOutcome::TimedOut,
        _ => AddOutcome::Failed,
    };
    bookie.add_done(quire_clock::elapsed(sent), outcome);
}

impl WriterShared {
    /// Sends `entry` to the bookie at ensemble position `pos`; the reply comes back to
    /// `on_reply` tagged with the position's generation. Called with the state locked, so sends
    /// and ensemble swaps are ordered.
    pub(crate) fn send(
        self: &Arc<Self>,
        st: &WriterState,
        entry: u64,
        bytes: &EntryBytes,
        pos: usize,
    ) {
        let slot = &st.ensemble[pos];
        let key = self.key;
        let timeout = self.client.inner.config.request_timeout;
        let (shared, generation) = (self.clone(), slot.generation);
        if slot.conn.is_dead() {
            // The bookie closed this connection (its idle timeout, or a restart): the add goes
            // on a new connection from the pool, and fails at this bookie only if none can be
            // made. The new connection then takes the slot's place, so that later adds go out
            // in order on it again; adds sent before that may reach the bookie out of order,
            // which it allows.
            let (bookie, bytes) = (slot.bookie.clone(), bytes.clone());
            // The dead connection's handles: the same bookie's series.
            let series = slot.conn.add_metrics().clone();
            let sent = quire_clock::now();
            tokio::spawn(async move {
                let outcome = match shared.client.conn(&bookie, Lane::Tail).await {
                    Ok(c) => {
                        let add = conn::add_request_shared(key, &bytes.head, &bytes.payload, false);
                        let reply = c.call_add(timeout, add);
                        shared.replace_dead_conn(pos, generation, c);
                        reply.await
                    }
                    Err(e) => Err(e),
                };
                record_add(&series, sent, &outcome);
                shared.on_reply(entry, pos, generation, outcome);
            });
            return;
        }
        let reply = slot.conn.call_add(
            timeout,
            conn::add_request_shared(key, &bytes.head, &bytes.payload, false),
        );
        let (series, sent) = (slot.conn.add_metrics().clone(), quire_clock::now());
        tokio::spawn(async move {
            let outcome = reply.await;
            record_add(&series, sent, &outcome);
            shared.on_reply(entry, pos, generation, outcome);
        });
    }

    /// Puts `conn` in ensemble position `pos` if that position still holds the same bookie
    /// (`generation`) and its connection is still the dead one.
    fn replace_dead_conn(&self, pos: usize, generation: u64, conn: Arc<conn::Conn>) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        let slot = &mut st.ensemble[pos];
        if slot.generation == generation && slot.conn.is_dead() && !conn.is_dead() {
            slot.conn = conn;
        }
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
            Ok(Reply::Failed {
                status: Status::EntryMismatch,
                message,
            }) => {
                // The bookie holds this entry with other bytes (someone else added it with this
                // ledger's key) and refused ours. Its copy must not count: the bookie is
                // replaced like a failed one (ensemble change), so the new fragment, which
                // starts at or below this entry, reads the entry from the replacement.
                tracing::warn!(ledger = self.id.0, entry, bookie = %st.ensemble[pos].bookie, "bookie holds this entry with other bytes ({message}); replacing it");
                let lost = matches!(st.tracker.fail(entry, pos), Progress::QuorumLost(_));
                self.on_bookie_failure(&mut st, pos, lost);
            }
            Ok(Reply::Failed {
                status: Status::ReadOnly,
                ..
            }) => {
                // BookKeeper EREADONLY: the bookie's disks are full. It keeps serving reads of
                // what it holds, but this ledger's writes must go elsewhere: it is replaced like
                // a failed bookie (ensemble change) and quarantined for new placements.
                tracing::info!(ledger = self.id.0, entry, bookie = %st.ensemble[pos].bookie, "bookie is read-only; replacing it for writes");
                if st.lac.is_some_and(|l| entry <= l.0) {
                    // Confirmed without this bookie: no ensemble change re-sends it.
                    self.report_missing(&mut st, pos);
                }
                let lost = matches!(st.tracker.fail(entry, pos), Progress::QuorumLost(_));
                self.on_bookie_failure(&mut st, pos, lost);
            }
            other => {
                let reason = match other {
                    Ok(r) => format!("{r:?}"),
                    Err(e) => e.to_string(),
                };
                tracing::warn!(ledger = self.id.0, entry, bookie = %st.ensemble[pos].bookie, "add failed: {reason}");
                if st.lac.is_some_and(|l| entry <= l.0) {
                    // Confirmed without this bookie: no ensemble change re-sends it.
                    self.report_missing(&mut st, pos);
                }
                let lost = matches!(st.tracker.fail(entry, pos), Progress::QuorumLost(_));
                self.on_bookie_failure(&mut st, pos, lost);
            }
        }
        self.release(&mut st);
    }

    /// Reports (once per bookie) that the bookie at `pos` misses entries of this ledger that
    /// were confirmed without it and will not be re-sent, so that autorecovery copies them
    /// back (issue 13: "entries a bookie missed are re-sent or reported for repair"; BookKeeper
    /// leaves such gaps to the auditor's ledger checker instead).
    pub(crate) fn report_missing(self: &Arc<Self>, st: &mut WriterState, pos: usize) {
        let bookie = st.ensemble[pos].bookie.clone();
        if !st.reported_missing.insert(bookie.clone()) {
            return;
        }
        self.client
            .report_under_replicated(self.id, bookie, "the bookie misses confirmed entries");
    }

    /// Notes that the bookie at `pos` failed and starts an ensemble change unless one runs
    /// (a running change takes the position in its next pass). A position without replacement
    /// is searched again only after `replacement_retry_interval`, or at once when an entry can
    /// no longer reach Qa (`lost`).
    fn on_bookie_failure(self: &Arc<Self>, st: &mut WriterState, pos: usize, lost: bool) {
        if let Some(searched) = st.unreplaceable.get(&pos) {
            if !lost
                && quire_clock::elapsed(*searched)
                    < self.client.inner.config.replacement_retry_interval
            {
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
    pub(crate) fn release(&self, st: &mut WriterState) {
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

    pub(crate) fn fail(&self, st: &mut WriterState, err: Error) {
        st.failed = Some(err.clone());
        for p in st.pending.drain(..) {
            let _ = p.tx.send(Err(err.clone()));
        }
        // Wake close() waiters.
        self.lac_tx.send_modify(|_| {});
    }
}

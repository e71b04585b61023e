//! Key binding only for ledgers the metadata store holds (issue 24 item 2).
//!
//! The engine binds a ledger's master key with the ledger's first add (docs/protocol.md §Add).
//! Left alone, anyone admitted to the bookie port could add one entry with a key of its own to
//! each upcoming ledger id (ids are handed out in order), so that the real writer of that id is
//! refused with `Unauthorized`, or fill the disk under ids nobody will ever allocate, which
//! garbage collection must keep (an id at or above the id counter may still be allocated).
//! BookKeeper itself lets the first add create the ledger; Quire closes the gap as the
//! metadata store already knows every ledger's key (`LedgerMetadata::master_key_hex`, created
//! before the writer's first add):
//!
//! * an add (normal or recovery) or a fence (`Fence`, or `Read` with FENCE) of a ledger on
//!   which the owning shard's engine has no bound key yet first asks the metadata side "does
//!   ledger L exist, and with which master key?" ([`LedgerKeyQuery`]);
//! * only an existing ledger whose key equals the request's reaches the engine; an add for a
//!   ledger the store does not have, or with another key, is `Unauthorized`, a fence of a
//!   ledger the store does not have is `NoSuchLedger` (with another key `Unauthorized`), and
//!   nothing is stored;
//! * a metadata side that cannot answer (unreachable store, timeout) gives `TooManyRequests`
//!   (retryable) and never binds.
//!
//! The bookie does not depend on the metadata store (its shards are glommio executors, the
//! ZooKeeper client runs on tokio): like garbage collection's [`crate::DeletedLedgers`], the
//! question goes over a channel, answered by whoever starts the bookie (`tools/src/gc.rs`).
//!
//! Each shard caches positive answers (a ledger's key never changes) and shares one question
//! among the requests for the same ledger that arrive while it is in flight; those requests go
//! on in the order they asked (pipelined adds 0, 1, 2 of a new ledger reach the engine in
//! entry order, as without the check).

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

use quire_wire::MASTER_KEY_SIZE_BYTES;

/// Longest wait of a shard for the metadata side's answer; past it the request is answered
/// `TooManyRequests` (the metadata side's own reads time out sooner).
pub const KEY_ANSWER_WAIT_MAX: Duration = Duration::from_secs(10);
/// Positive answers a shard keeps (a few hundred KiB); when full it forgets them all, which
/// costs one more metadata read for ledgers without a bound key (fences of ledgers this shard
/// holds no entry of, mostly).
const KNOWN_KEYS_MAX: usize = 16 * 1024;
/// Questions queued for the metadata side at most; a shard waits for room beyond it.
const QUERY_QUEUE_MAX: usize = 1024;

/// The metadata side's answer about one ledger.
#[derive(Clone, PartialEq, Eq)]
pub enum LedgerKeyAnswer {
    /// The ledger's metadata exists and holds this master key.
    Exists {
        master_key: [u8; MASTER_KEY_SIZE_BYTES],
    },
    /// The store has no metadata for the ledger, after making sure it is not reading a stale
    /// replica (ZooKeeper `sync`, then read again).
    NoSuchLedger,
    /// No definite answer (store unreachable, read timed out, unreadable key); with the
    /// reason, for the log. The request is answered retryable and nothing binds.
    Unavailable(String),
}

impl std::fmt::Debug for LedgerKeyAnswer {
    // Never print a master key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LedgerKeyAnswer::Exists { .. } => f.write_str("Exists { master_key: <redacted> }"),
            LedgerKeyAnswer::NoSuchLedger => f.write_str("NoSuchLedger"),
            LedgerKeyAnswer::Unavailable(r) => f.debug_tuple("Unavailable").field(r).finish(),
        }
    }
}

/// One question of a shard: the metadata of `ledger`.
#[derive(Debug)]
pub struct LedgerKeyQuery {
    /// The ledger id asked about.
    pub ledger: u64,
    reply: flume::Sender<LedgerKeyAnswer>,
}

impl LedgerKeyQuery {
    /// Answers the question. Say `NoSuchLedger` only for a definite "no such ledger" read
    /// from an up-to-date replica; anything uncertain is `Unavailable`. Dropping the query
    /// without answering counts as `Unavailable`.
    pub fn answer(self, answer: LedgerKeyAnswer) {
        // The shard may have stopped waiting; nothing to do then.
        let _ = self.reply.send(answer);
    }
}

/// The sending end, given to the bookie in [`crate::BookieConfig::ledger_keys`].
#[derive(Debug, Clone)]
pub struct LedgerKeys(flume::Sender<LedgerKeyQuery>);

/// The receiving end, kept by whoever can read the metadata store.
#[derive(Debug)]
pub struct LedgerKeyQueries(flume::Receiver<LedgerKeyQuery>);

impl LedgerKeyQueries {
    /// The next question; `None` once every bookie holding the sending end has stopped.
    pub async fn next(&self) -> Option<LedgerKeyQuery> {
        self.0.recv_async().await.ok()
    }
}

/// A channel for key questions: the sender goes into the bookie configuration, the receiver
/// to the metadata side. Any runtime may receive (flume).
pub fn ledger_keys_channel() -> (LedgerKeys, LedgerKeyQueries) {
    let (tx, rx) = flume::bounded(QUERY_QUEUE_MAX);
    (LedgerKeys(tx), LedgerKeyQueries(rx))
}

impl LedgerKeys {
    /// Asks about `ledger` and waits for the answer, on any runtime, without a time limit;
    /// `None` if the receiving end is gone or dropped the question.
    pub async fn query(&self, ledger: u64) -> Option<LedgerKeyAnswer> {
        let (reply, answer) = flume::bounded(1);
        self.0
            .send_async(LedgerKeyQuery { ledger, reply })
            .await
            .ok()?;
        answer.recv_async().await.ok()
    }
}

/// One question in flight on a shard, shared by every request for its ledger.
#[derive(Default)]
struct InFlight {
    answer: RefCell<Option<LedgerKeyAnswer>>,
    /// Requests waiting for the answer, in the order they asked; woken in that order.
    waiters: RefCell<Vec<Waker>>,
}

impl InFlight {
    fn settle(&self, answer: LedgerKeyAnswer) {
        if self.answer.borrow().is_some() {
            return;
        }
        *self.answer.borrow_mut() = Some(answer);
        for w in self.waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }
}

/// Settles a question as `Unavailable` if its asker goes away without an answer (the task was
/// dropped), so that the requests waiting on it are answered too.
struct SettleOnDrop<'a> {
    check: &'a KeyCheck,
    ledger: u64,
    in_flight: Rc<InFlight>,
}

impl Drop for SettleOnDrop<'_> {
    fn drop(&mut self) {
        self.in_flight
            .settle(LedgerKeyAnswer::Unavailable("question abandoned".into()));
        self.check.in_flight.borrow_mut().remove(&self.ledger);
    }
}

/// A shard's view of the metadata side's answers. Shard-local.
pub(crate) struct KeyCheck {
    keys: LedgerKeys,
    known: RefCell<HashMap<u64, [u8; MASTER_KEY_SIZE_BYTES]>>,
    in_flight: RefCell<HashMap<u64, Rc<InFlight>>>,
    wait_max: Duration,
}

impl KeyCheck {
    pub(crate) fn new(keys: LedgerKeys) -> Self {
        Self {
            keys,
            known: RefCell::new(HashMap::new()),
            in_flight: RefCell::new(HashMap::new()),
            wait_max: KEY_ANSWER_WAIT_MAX,
        }
    }

    /// What the metadata store says about `ledger`: a cached positive answer, the answer of the
    /// question already in flight for it, or a new question (at most [`KEY_ANSWER_WAIT_MAX`]).
    pub(crate) async fn ledger_key(&self, ledger: u64) -> LedgerKeyAnswer {
        if let Some(k) = self.known.borrow().get(&ledger) {
            return LedgerKeyAnswer::Exists { master_key: *k };
        }
        let existing = self.in_flight.borrow().get(&ledger).cloned();
        if let Some(shared) = existing {
            let mut registered = false;
            return poll_fn(|cx| {
                if let Some(a) = shared.answer.borrow().as_ref() {
                    return Poll::Ready(a.clone());
                }
                if !registered {
                    shared.waiters.borrow_mut().push(cx.waker().clone());
                    registered = true;
                }
                Poll::Pending
            })
            .await;
        }
        let shared = Rc::new(InFlight::default());
        self.in_flight.borrow_mut().insert(ledger, shared.clone());
        let guard = SettleOnDrop {
            check: self,
            ledger,
            in_flight: shared.clone(),
        };
        let asked = async { self.keys.query(ledger).await };
        let timed_out = async {
            glommio::timer::sleep(self.wait_max).await;
            Some(LedgerKeyAnswer::Unavailable(format!(
                "no answer from the metadata side within {:?}",
                self.wait_max
            )))
        };
        let answer = futures_lite::future::or(asked, timed_out)
            .await
            .unwrap_or_else(|| {
                LedgerKeyAnswer::Unavailable("the metadata side dropped the question".into())
            });
        if let LedgerKeyAnswer::Exists { master_key } = &answer {
            let mut known = self.known.borrow_mut();
            if known.len() >= KNOWN_KEYS_MAX {
                known.clear();
            }
            known.insert(ledger, *master_key);
        }
        shared.settle(answer.clone());
        drop(guard);
        answer
    }
}

//! A history checker for logs: tests record, from the client side, what they asked a stream to
//! do and what they were told (every write's invocation and outcome, every read's position and
//! the records it returned, truncations, seals, deletions); [`History::check`] then compares
//! that history with the whole stream read back at the end (the *final log*) and reports every
//! violation of the log's promises (DESIGN.md §9; DistributedLog's: every acknowledged record
//! readable exactly once at the DLSN it was acknowledged with, DLSNs and txids never
//! decreasing, readers see a contiguous prefix-closed view of one log). The kinds of finding
//! are [`Kind`]'s; Jepsen's queue and Kafka analyses (lost, duplicate, aborted read,
//! inconsistent offsets, contiguity) are the model.
//!
//! # What the checker assumes
//! - **Payload identity.** Each record a test writes is identified by its payload bytes, or by
//!   the part [`History::with_record_id`]'s function extracts from it: two writes of one id are
//!   *the same record written twice* (a retry), never two records. Tests give every record a
//!   unique payload (e.g. `"{writer}-{i:08}"`); a retry re-sends the same payload.
//! - **Outcomes.** [`Outcome::Failed`] means the proxy refused the write before anything was
//!   stored (a definite failure: its records must never be read); [`Outcome::Unknown`] means the
//!   writer cannot tell (a timeout, a lost connection, `OwnershipLost`): its records may or may
//!   not be in the log, and may appear twice when retried blindly (without a producer session).
//! - **One write's records are consecutive**: the records of an acknowledged write sit at
//!   `first..=last` DLSN in the order given (DistributedLog packs one write into one entry's
//!   consecutive slots, or into consecutive entries when it is split).
//! - **Order of operations.** Every call of the recording API takes the next tick of one logical
//!   clock, so "a read invoked after a truncation returned" is decided by the order in which the
//!   test's tasks called the API (call `*_invoked` just before sending and the outcome call
//!   just after the answer arrived).
//! - **Readers.** Reads recorded under one reader name form one view: the first read's position
//!   is the view's start and each further read continues where the previous one ended (a tailing
//!   or catch-up reader). A reader that repositions is recorded under a new name.
//! - **The final log** is the whole stream read from its head after every operation ended; its
//!   first record is the first one at or after the latest truncation point.
//!
//! The pure part (this module, `checks`, `report`) depends on no runtime; with the `harness`
//! feature, [`Dlsn`] converts from and to `quire_client::Dlsn`.

mod checks;
mod report;
#[cfg(test)]
mod tests;

pub use report::{Finding, Kind, Report};

use std::fmt;
use std::sync::Mutex;

/// A DistributedLog sequence number: segment sequence number (from 1), entry id in the
/// segment's ledger (from 0), slot in the entry's record set (from 0); ordered in that order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dlsn {
    pub segment: u64,
    pub entry: u64,
    pub slot: u32,
}

impl Dlsn {
    /// The DLSN `segment:entry:slot`.
    pub const fn new(segment: u64, entry: u64, slot: u32) -> Self {
        Self {
            segment,
            entry,
            slot,
        }
    }

    /// The first position of every stream (DistributedLog's `InitialDLSN`, 1:0:0).
    pub const INITIAL: Dlsn = Dlsn::new(1, 0, 0);
}

impl fmt::Display for Dlsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.segment, self.entry, self.slot)
    }
}

#[cfg(feature = "harness")]
impl From<quire_client::Dlsn> for Dlsn {
    fn from(d: quire_client::Dlsn) -> Self {
        Dlsn::new(d.segment_seq_no, d.entry_id, d.slot_index)
    }
}

#[cfg(feature = "harness")]
impl From<Dlsn> for quire_client::Dlsn {
    fn from(d: Dlsn) -> Self {
        quire_client::Dlsn {
            segment_seq_no: d.segment,
            entry_id: d.entry,
            slot_index: d.slot,
        }
    }
}

/// A record as a reader sees it: DLSN, txid, payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub dlsn: Dlsn,
    pub txid: u64,
    pub payload: Vec<u8>,
}

impl Record {
    /// A record at `dlsn` with `txid` and `payload`.
    pub fn new(dlsn: Dlsn, txid: u64, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            dlsn,
            txid,
            payload: payload.into(),
        }
    }
}

/// How a write ended, as its writer saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged: its records are at `first..=last`.
    Ok { first: Dlsn, last: Dlsn },
    /// Refused before anything was stored (its records must never appear).
    Failed(String),
    /// The writer cannot tell whether it was stored (timeout, lost connection, lost ownership).
    Unknown(String),
}

/// A producer session (exactly-once writes): its id and the sequence number of the write's
/// first record. Retries with one session and sequence must not duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    pub id: u64,
    pub seq: u64,
}

/// Where a reader's first read started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// The stream's head (its first record not truncated).
    Head,
    /// The first record at or after this DLSN.
    Dlsn(Dlsn),
    /// The position is not one the checker can resolve (tail, txid, time, last N): the view's
    /// first record is taken as its start, only contiguity after it is checked.
    Other,
}

/// An operation of a history; `id` is its index in [`History::ops`].
#[derive(Debug, Clone)]
pub struct Op {
    pub id: usize,
    /// The writer's or reader's name ("" for stream operations).
    pub process: String,
    /// Logical time of the invocation and of the outcome (`None`: never completed).
    pub invoked: u64,
    pub completed: Option<u64>,
    pub kind: OpKind,
}

/// What an operation did.
#[derive(Debug, Clone)]
pub enum OpKind {
    /// A write of `(txid, payload)` records; `outcome` is `None` until it completes.
    Write {
        records: Vec<(u64, Vec<u8>)>,
        session: Option<Session>,
        outcome: Option<Outcome>,
    },
    /// A read from `from` (for the reader's first read) and what it returned (`None` while in
    /// flight or when it failed).
    Read {
        from: ReadFrom,
        records: Option<Vec<Record>>,
    },
    /// A truncation of everything before `point`; it is in force once completed.
    Truncate { point: Dlsn },
    /// The stream was sealed (end of stream): no write invoked after it may be acknowledged.
    Seal,
    /// The stream was deleted: acknowledged writes that completed before it are gone legitimately.
    Delete,
}

/// Extracts a record's identity from its payload (see the module doc).
pub type RecordId = Box<dyn Fn(&[u8]) -> Vec<u8> + Send + Sync>;

/// The client-side history of one stream. The recording methods take `&self` (a mutex inside),
/// so concurrent writer and reader tasks share one `Arc<History>`.
#[derive(Default)]
pub struct History {
    ops: Mutex<Vec<Op>>,
    clock: Mutex<u64>,
    record_id: Option<RecordId>,
}

impl fmt::Debug for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("History")
            .field("ops", &self.ops().len())
            .finish()
    }
}

impl History {
    /// An empty history; records are identified by their whole payload.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty history whose records are identified by `id(payload)` (e.g. a unique prefix of
    /// a padded payload).
    pub fn with_record_id(id: impl Fn(&[u8]) -> Vec<u8> + Send + Sync + 'static) -> Self {
        Self {
            record_id: Some(Box::new(id)),
            ..Self::default()
        }
    }

    /// The operations so far, in invocation order.
    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().expect("history lock").clone()
    }

    fn tick(&self) -> u64 {
        let mut c = self.clock.lock().expect("history clock");
        *c += 1;
        *c
    }

    fn invoke(&self, process: &str, kind: OpKind) -> usize {
        let mut ops = self.ops.lock().expect("history lock");
        let id = ops.len();
        let invoked = self.tick();
        ops.push(Op {
            id,
            process: process.to_string(),
            invoked,
            completed: None,
            kind,
        });
        id
    }

    fn complete(&self, id: usize, f: impl FnOnce(&mut OpKind)) {
        let mut ops = self.ops.lock().expect("history lock");
        let op = &mut ops[id];
        assert!(op.completed.is_none(), "operation {id} completed twice");
        op.completed = Some(self.tick());
        f(&mut op.kind);
    }

    /// Records that `writer` sent a write of `records` (`(txid, payload)`); returns its id.
    pub fn write_invoked(
        &self,
        writer: &str,
        records: Vec<(u64, Vec<u8>)>,
        session: Option<Session>,
    ) -> usize {
        let kind = OpKind::Write {
            records,
            session,
            outcome: None,
        };
        self.invoke(writer, kind)
    }

    /// Records the outcome of write `id`.
    pub fn write_done(&self, id: usize, outcome: Outcome) {
        self.complete(id, |k| {
            if let OpKind::Write { outcome: o, .. } = k {
                *o = Some(outcome);
            }
        });
    }

    /// Records an acknowledged write of `records` at `first..=last` in one step (invoked and
    /// completed now); returns its id.
    pub fn write_ok(
        &self,
        writer: &str,
        records: Vec<(u64, Vec<u8>)>,
        first: Dlsn,
        last: Dlsn,
    ) -> usize {
        let id = self.write_invoked(writer, records, None);
        self.write_done(id, Outcome::Ok { first, last });
        id
    }

    /// Records that `reader` sent a read from `from` (only the reader's first read's position
    /// counts); returns its id.
    pub fn read_invoked(&self, reader: &str, from: ReadFrom) -> usize {
        self.invoke(
            reader,
            OpKind::Read {
                from,
                records: None,
            },
        )
    }

    /// Records what read `id` returned.
    pub fn read_done(&self, id: usize, records: Vec<Record>) {
        self.complete(id, |k| {
            if let OpKind::Read { records: r, .. } = k {
                *r = Some(records);
            }
        });
    }

    /// Records `reader`'s completed reads have returned so far (what a test waits on before a
    /// step that needs the reader to be past a point, instead of a fixed pause).
    pub fn records_read(&self, reader: &str) -> usize {
        self.ops
            .lock()
            .expect("history lock")
            .iter()
            .filter(|op| op.process == reader)
            .map(|op| match &op.kind {
                OpKind::Read {
                    records: Some(r), ..
                } => r.len(),
                _ => 0,
            })
            .sum()
    }

    /// Records that read `id` failed: it returned nothing, and the reader's view goes on with
    /// its next read.
    pub fn read_failed(&self, id: usize) {
        self.complete(id, |_| {});
    }

    /// Records a truncation to `point` sent; returns its id.
    pub fn truncate_invoked(&self, point: Dlsn) -> usize {
        self.invoke("", OpKind::Truncate { point })
    }

    /// Records a seal (end of stream) sent; returns its id.
    pub fn seal_invoked(&self) -> usize {
        self.invoke("", OpKind::Seal)
    }

    /// Records a deletion sent; returns its id.
    pub fn delete_invoked(&self) -> usize {
        self.invoke("", OpKind::Delete)
    }

    /// Records that truncation, seal or deletion `id` succeeded (a failed one is left
    /// uncompleted: it may or may not have happened, and is not in force for the checks).
    pub fn done(&self, id: usize) {
        self.complete(id, |_| {});
    }

    /// The identity of a record with `payload`.
    fn id_of(&self, payload: &[u8]) -> Vec<u8> {
        match &self.record_id {
            Some(f) => f(payload),
            None => payload.to_vec(),
        }
    }

    /// Checks the history against `final_log` (the whole stream read from its head at the end,
    /// in the order read) and returns every finding (see [`Kind`]).
    pub fn check(&self, final_log: &[Record]) -> Report {
        let ops = self.ops();
        checks::run(&ops, final_log, &|p| self.id_of(p))
    }
}

//! Producer sessions: the owner's exactly-once dedup state for one stream (Kafka's idempotent
//! producer: producer id and per-batch sequence numbers, the broker keeps the last sequence
//! and the offsets of recent batches per producer; DistributedLog has no equivalent).
//!
//! A write in a session carries `(session_id, first_seq)`; its records take consecutive
//! sequence numbers. The table keeps, per session, the next sequence it expects and the runs
//! (`quire_client::record_set::ProducerRun`, one entry's slots of one write) of its recent
//! writes, which give the DLSN of every sequence still in the window. A write is then:
//!
//! - **new** when it starts at the expected sequence (or at 0 for a session the table does not
//!   know): written;
//! - **a duplicate** when all its sequences are below the expected one and still in the
//!   window: nothing written, answered with the original DLSNs at its turn;
//! - **an overlap** when it starts below the expected sequence and ends at or above it (a
//!   write retried after only its first entries reached the log): its applied prefix is
//!   dropped, the rest written, and the answer's first DLSN is the original one of its first
//!   record;
//! - refused with `PRODUCER_SEQUENCE_GAP` when it starts above the expected sequence (a write
//!   of the session never reached the stream), and with `PRODUCER_SESSION_EXPIRED` when the
//!   table cannot tell: the session is unknown and the write does not start at 0, or its first
//!   sequence is older than the window. Nothing written: never twice.
//!
//! The window, per stream: at most [`SESSIONS_MAX`] sessions (the least recently used
//! dropped first), at most [`RUNS_PER_SESSION_MAX`] runs per session, so the table stays under
//! about 256 KiB. The runs are written in the entries themselves (record set v3, flag bit 2),
//! so a new owner (after the old one was killed) or a writer recovering after a storage error
//! rebuilds the table from the last [`REBUILD_ENTRIES_MAX`] entries of the stream's completed
//! segments before it takes its first session write: what it finds there is exactly what the
//! log holds after ledger recovery, in flight or not.

use std::collections::{HashMap, VecDeque};

use quire_ledger::BookKeeper;
use quire_metadata::{SegmentState, StreamMetadata};
use quire_wire::{EntryId, LedgerId};

use super::compress;
use super::shared::storage;
use crate::dlsn::Dlsn;
use crate::error::{Error, Result};
use crate::protocol::ProducerSeq;
use crate::record_set::{self, ProducerRun};

/// Sessions kept per stream; the least recently used is dropped beyond it.
pub const SESSIONS_MAX: usize = 256;
/// Runs kept per session (a write packed into one entry is one run).
pub const RUNS_PER_SESSION_MAX: usize = 32;
/// Entries (newest first, across completed segments) read back to rebuild the table.
pub const REBUILD_ENTRIES_MAX: usize = 256;

/// A new producer session id: random (the process's random source, `quire_clock::random`,
/// seeded per thread in simulations), never 0. 64 random bits make two sessions of one stream
/// sharing an id unlikely enough (about 2^-44 among a million sessions).
pub(super) fn new_session_id() -> u64 {
    loop {
        let id: u64 = quire_clock::random();
        if id != 0 {
            return id;
        }
    }
}

/// One run with where its entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    first_seq: u64,
    count: u32,
    seq_no: u64,
    entry: u64,
    first_slot: u32,
}

impl Run {
    fn dlsn_of(&self, seq: u64) -> Option<Dlsn> {
        let k = seq.checked_sub(self.first_seq)?;
        (k < u64::from(self.count)).then(|| {
            Dlsn::new(
                self.seq_no,
                self.entry,
                self.first_slot + u32::try_from(k).expect("k < count"),
            )
        })
    }
}

#[derive(Debug, Default)]
struct Session {
    /// The sequence the next new write must start at.
    next_seq: u64,
    runs: VecDeque<Run>,
    /// The table's use counter when last used (least recently used is dropped first).
    used: u64,
}

/// What to do with one session write (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    New,
    Duplicate,
    /// The first `applied` records are in the log; `first` is the DLSN of the write's first.
    Overlap {
        applied: usize,
        first: Dlsn,
    },
}

/// The dedup table of one stream, owned by its stream task.
#[derive(Debug, Default)]
pub(super) struct ProducerTable {
    sessions: HashMap<u64, Session>,
    uses: u64,
    /// False until rebuilt from the log since the last recovery.
    pub(super) built: bool,
}

impl ProducerTable {
    /// Forgets everything: the log is the truth again (after a recovery).
    pub(super) fn reset(&mut self) {
        self.sessions.clear();
        self.built = false;
    }

    /// Classifies a write of `count` records numbered by `p`.
    ///
    /// # Errors
    /// `ProducerSequenceGap`, `ProducerSessionExpired`.
    pub(super) fn classify(&self, stream: &str, p: ProducerSeq, count: usize) -> Result<Verdict> {
        let last_seq = p.first_seq + count as u64 - 1;
        let expired = |reason: String| Error::ProducerSessionExpired {
            stream: stream.to_string(),
            session_id: p.session_id,
            first_seq: p.first_seq,
            reason,
        };
        let Some(s) = self.sessions.get(&p.session_id) else {
            return if p.first_seq == 0 {
                Ok(Verdict::New)
            } else {
                Err(expired(format!(
                    "belongs to a session the stream's owner does not know (a session starts at 0; \
                     the owner keeps the sessions seen in the last {REBUILD_ENTRIES_MAX} entries, \
                     at most {SESSIONS_MAX})"
                )))
            };
        };
        if p.first_seq == s.next_seq {
            return Ok(Verdict::New);
        }
        if p.first_seq > s.next_seq {
            return Err(Error::ProducerSequenceGap {
                stream: stream.to_string(),
                session_id: p.session_id,
                first_seq: p.first_seq,
                last_seq,
                expected: s.next_seq,
            });
        }
        // Below the expected sequence: applied, at least in part.
        let oldest = s.runs.front().map_or(s.next_seq, |r| r.first_seq);
        if p.first_seq < oldest {
            return Err(expired(format!(
                "is older than the dedup window (the owner keeps sequences from {oldest}: the \
                 last {RUNS_PER_SESSION_MAX} writes of a session)"
            )));
        }
        if last_seq < s.next_seq {
            return Ok(Verdict::Duplicate);
        }
        let first = self.dlsn_of(p.session_id, p.first_seq).ok_or_else(|| {
            expired("is applied but its position is not known yet (retry)".into())
        })?;
        Ok(Verdict::Overlap {
            applied: (s.next_seq - p.first_seq) as usize,
            first,
        })
    }

    /// Takes a new write of `count` records from `first_seq`: the session now expects
    /// `first_seq + count`. A new session beyond [`SESSIONS_MAX`] drops the least recently used.
    pub(super) fn accept(&mut self, session_id: u64, first_seq: u64, count: usize) {
        self.uses += 1;
        if !self.sessions.contains_key(&session_id) && self.sessions.len() >= SESSIONS_MAX {
            let oldest = self
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.used)
                .map(|(id, _)| *id);
            if let Some(id) = oldest {
                self.sessions.remove(&id);
            }
        }
        let s = self.sessions.entry(session_id).or_default();
        s.next_seq = first_seq + count as u64;
        s.used = self.uses;
    }

    /// Notes where a run of a session's records went (entry `entry` of segment `seq_no`).
    pub(super) fn record_run(&mut self, run: &ProducerRun, seq_no: u64, entry: u64) {
        let Some(s) = self.sessions.get_mut(&run.session_id) else {
            return;
        };
        s.runs.push_back(Run {
            first_seq: run.first_seq,
            count: run.count,
            seq_no,
            entry,
            first_slot: run.first_slot,
        });
        while s.runs.len() > RUNS_PER_SESSION_MAX {
            s.runs.pop_front();
        }
    }

    /// The DLSN of one sequence of a session, if it is in the window and was packed.
    pub(super) fn dlsn_of(&self, session_id: u64, seq: u64) -> Option<Dlsn> {
        let s = self.sessions.get(&session_id)?;
        s.runs.iter().rev().find_map(|r| r.dlsn_of(seq))
    }

    /// The answer to a duplicate write: DLSNs of its first and last sequences.
    ///
    /// # Errors
    /// `ProducerSessionExpired` when they left the window meanwhile.
    pub(super) fn duplicate_answer(
        &self,
        stream: &str,
        p: ProducerSeq,
        count: u64,
    ) -> Result<(Dlsn, Dlsn)> {
        let last = p.first_seq + count - 1;
        match (
            self.dlsn_of(p.session_id, p.first_seq),
            self.dlsn_of(p.session_id, last),
        ) {
            (Some(f), Some(l)) => Ok((f, l)),
            _ => Err(Error::ProducerSessionExpired {
                stream: stream.to_string(),
                session_id: p.session_id,
                first_seq: p.first_seq,
                reason: "left the dedup window before the duplicate was answered".into(),
            }),
        }
    }

    /// Rebuilds the table from entries' runs, oldest entry first: `(seq_no, entry, runs)`.
    pub(super) fn rebuild(&mut self, entries: &[(u64, u64, Vec<ProducerRun>)]) {
        self.sessions.clear();
        for (seq_no, entry, runs) in entries {
            for run in runs {
                self.uses += 1;
                let s = self.sessions.entry(run.session_id).or_default();
                s.next_seq = s.next_seq.max(run.last_seq() + 1);
                s.used = self.uses;
            }
            for run in runs {
                self.record_run(run, *seq_no, *entry);
            }
        }
        while self.sessions.len() > SESSIONS_MAX {
            let oldest = self
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.used)
                .map(|(id, _)| *id)
                .expect("not empty");
            self.sessions.remove(&oldest);
        }
        self.built = true;
    }
}

/// Reads the producer runs of the last [`REBUILD_ENTRIES_MAX`] entries of the stream's
/// completed segments, oldest first, for [`ProducerTable::rebuild`].
///
/// # Errors
/// `Storage` when a ledger cannot be opened or an entry read or decoded.
pub(super) async fn read_tail_runs(
    bookkeeper: &BookKeeper,
    stream: &str,
    meta: &StreamMetadata,
) -> Result<Vec<(u64, u64, Vec<ProducerRun>)>> {
    let mut out = Vec::new();
    let mut budget = REBUILD_ENTRIES_MAX as u64;
    let completed = meta
        .segments
        .iter()
        .rev()
        .filter(|s| s.state == SegmentState::Completed);
    for seg in completed {
        let Some(last) = seg.last_entry else {
            continue; // an empty segment (a writer that crashed before its first entry)
        };
        if budget == 0 {
            break;
        }
        let first = (last + 1).saturating_sub(budget);
        budget -= last + 1 - first;
        let reader = bookkeeper
            .open_ledger(LedgerId(seg.ledger_id))
            .await
            .map_err(|e| storage(stream, "open ledger (producer sessions)", e))?;
        for entry in (first..=last).rev() {
            let payload = reader
                .read(EntryId(entry))
                .await
                .map_err(|e| storage(stream, "read entry (producer sessions)", e))?;
            let payload = compress::plain_entry(stream, seg.ledger_id, entry, &payload)?;
            let set = record_set::decode(&payload).map_err(|e| Error::Storage {
                stream: stream.to_string(),
                op: "decode entry (producer sessions)",
                source: format!("ledger {} entry {entry}: {e}", seg.ledger_id).into(),
            })?;
            if !set.producer_runs.is_empty() {
                out.push((seg.seq_no, entry, set.producer_runs));
            }
        }
    }
    out.reverse();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(session_id: u64, first_seq: u64) -> ProducerSeq {
        ProducerSeq {
            session_id,
            first_seq,
        }
    }

    fn run(session_id: u64, first_seq: u64, first_slot: u32, count: u32) -> ProducerRun {
        ProducerRun {
            session_id,
            first_seq,
            first_slot,
            count,
        }
    }

    /// A table that took writes of `sizes` records for session 7, one entry each in segment 1.
    fn table_with(sizes: &[u32]) -> ProducerTable {
        let mut t = ProducerTable::default();
        let mut next = 0;
        for (e, n) in sizes.iter().enumerate() {
            assert_eq!(
                t.classify("s", seq(7, next), *n as usize).unwrap(),
                Verdict::New
            );
            t.accept(7, next, *n as usize);
            t.record_run(&run(7, next, 0, *n), 1, e as u64);
            next += u64::from(*n);
        }
        t
    }

    #[test]
    fn new_duplicate_overlap_and_gap() {
        // Goal: the four verdicts of the module docs. Method: writes 0..3 and 3..5 applied,
        // then a retry of each, a write straddling the expected sequence, one past it, and a
        // first write of an unknown session at 0 and at 5.
        let t = table_with(&[3, 2]);
        assert_eq!(t.classify("s", seq(7, 5), 1).unwrap(), Verdict::New);
        assert_eq!(t.classify("s", seq(7, 0), 3).unwrap(), Verdict::Duplicate);
        assert_eq!(t.classify("s", seq(7, 3), 2).unwrap(), Verdict::Duplicate);
        assert_eq!(
            t.duplicate_answer("s", seq(7, 3), 2).unwrap(),
            (Dlsn::new(1, 1, 0), Dlsn::new(1, 1, 1))
        );
        // A retry that only partly lines up with the applied writes is still answered.
        assert_eq!(
            t.duplicate_answer("s", seq(7, 1), 3).unwrap(),
            (Dlsn::new(1, 0, 1), Dlsn::new(1, 1, 0))
        );
        assert_eq!(
            t.classify("s", seq(7, 4), 3).unwrap(),
            Verdict::Overlap {
                applied: 1,
                first: Dlsn::new(1, 1, 1)
            }
        );
        let gap = t.classify("s", seq(7, 6), 1).unwrap_err();
        assert!(
            matches!(gap, Error::ProducerSequenceGap { expected: 5, .. }),
            "{gap}"
        );
        assert_eq!(gap.code(), crate::ErrorCode::ProducerSequenceGap);
        assert_eq!(t.classify("s", seq(8, 0), 4).unwrap(), Verdict::New);
        let unknown = t.classify("s", seq(8, 5), 1).unwrap_err();
        assert_eq!(unknown.code(), crate::ErrorCode::ProducerSessionExpired);
    }

    #[test]
    fn window_bounds_runs_and_sessions() {
        // Goal: memory stays bounded and what fell out of the window is refused, never
        // written again. Method: RUNS_PER_SESSION_MAX + 5 one-record writes, then a retry of
        // the first (out of the window) and of the last kept; then SESSIONS_MAX + 1 sessions.
        let sizes = vec![1u32; RUNS_PER_SESSION_MAX + 5];
        let mut t = table_with(&sizes);
        let e = t.classify("s", seq(7, 0), 1).unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::ProducerSessionExpired);
        assert!(e.to_string().contains("window"), "{e}");
        assert_eq!(t.classify("s", seq(7, 5), 1).unwrap(), Verdict::Duplicate);
        assert_eq!(t.sessions[&7].runs.len(), RUNS_PER_SESSION_MAX);
        for id in 100..100 + SESSIONS_MAX as u64 {
            t.accept(id, 0, 1);
        }
        assert_eq!(t.sessions.len(), SESSIONS_MAX);
        assert!(!t.sessions.contains_key(&7), "the least recently used went");
        let e = t
            .classify("s", seq(7, RUNS_PER_SESSION_MAX as u64 + 5), 1)
            .unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::ProducerSessionExpired);
    }

    #[test]
    fn rebuild_from_entries_gives_the_same_answers() {
        // Goal: a new owner's table, rebuilt from the runs in the entries, classifies retries
        // as the old owner's did. Method: session 7's write 0..4 spans entries 3 (slots 2, 3)
        // and 4 (slots 0, 1), session 9 has one record in entry 4; rebuild from them (and
        // from a tail where only entry 3 made it: the retry is then an overlap).
        let entries = vec![
            (2, 3, vec![run(7, 0, 2, 2)]),
            (2, 4, vec![run(7, 2, 0, 2), run(9, 0, 2, 1)]),
        ];
        let mut t = ProducerTable::default();
        t.rebuild(&entries);
        assert!(t.built);
        assert_eq!(t.classify("s", seq(7, 0), 4).unwrap(), Verdict::Duplicate);
        assert_eq!(
            t.duplicate_answer("s", seq(7, 0), 4).unwrap(),
            (Dlsn::new(2, 3, 2), Dlsn::new(2, 4, 1))
        );
        assert_eq!(t.classify("s", seq(7, 4), 1).unwrap(), Verdict::New);
        assert_eq!(t.classify("s", seq(9, 1), 1).unwrap(), Verdict::New);
        t.rebuild(&entries[..1]);
        assert_eq!(
            t.classify("s", seq(7, 0), 4).unwrap(),
            Verdict::Overlap {
                applied: 2,
                first: Dlsn::new(2, 3, 2)
            }
        );
        assert!(
            t.classify("s", seq(9, 1), 1).is_err(),
            "9 is not in that tail"
        );
        t.reset();
        assert!(!t.built && t.sessions.is_empty());
    }
}

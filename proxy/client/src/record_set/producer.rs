//! The producer runs of a record set (version 3, flag bit 2; `docs/format/record-set.md`):
//! which records of the entry belong to which write of which producer session, so that a new
//! owner of the stream rebuilds the exactly-once dedup state from the log tail (as Kafka
//! rebuilds its producer state from the batch headers of the log's last segments).
//!
//! ```text
//! run_count u16 (>= 1), then per run 24 bytes:
//!   session_id u64 (!= 0) | first_seq u64 | first_slot u32 | count u32 (>= 1)
//! ```
//!
//! A run is consecutive slots of the entry holding consecutive sequence numbers of one session
//! (`first_seq` in slot `first_slot`, `first_seq + 1` in the next, ...). Runs are in slot order
//! and do not overlap; slots outside every run hold records written without a session.

use quire_wire::{Reader, WireError};

/// Bytes of one run.
pub const PRODUCER_RUN_SIZE_BYTES: usize = 24;
/// Bytes of the run count.
pub const PRODUCER_RUN_COUNT_SIZE_BYTES: usize = 2;
/// Most runs one entry carries (the run count is a u16).
pub const PRODUCER_RUNS_MAX: usize = u16::MAX as usize;

/// Consecutive records of one entry from one write of one producer session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerRun {
    /// The session (never 0).
    pub session_id: u64,
    /// Sequence number of the record in `first_slot`.
    pub first_seq: u64,
    /// Slot of the run's first record in the entry.
    pub first_slot: u32,
    /// Records in the run (at least 1).
    pub count: u32,
}

impl ProducerRun {
    /// Sequence number of the run's last record.
    pub fn last_seq(&self) -> u64 {
        self.first_seq + u64::from(self.count) - 1
    }
}

/// Appends the run count and the runs.
///
/// # Panics
/// If `runs` is empty or holds more than [`PRODUCER_RUNS_MAX`]: the writer builds them.
pub(super) fn put_runs(out: &mut Vec<u8>, runs: &[ProducerRun]) {
    assert!(!runs.is_empty() && runs.len() <= PRODUCER_RUNS_MAX);
    out.extend_from_slice(&(runs.len() as u16).to_le_bytes());
    for run in runs {
        out.extend_from_slice(&run.session_id.to_le_bytes());
        out.extend_from_slice(&run.first_seq.to_le_bytes());
        out.extend_from_slice(&run.first_slot.to_le_bytes());
        out.extend_from_slice(&run.count.to_le_bytes());
    }
}

/// Reads the run count and the runs of an entry of `record_count` records.
///
/// # Errors
/// `InvalidField` for no run, session id 0, an empty run, a run past the last slot or
/// overlapping the one before it, a last sequence past `u64::MAX`; `Truncated`.
pub(super) fn get_runs(
    r: &mut Reader<'_>,
    record_count: usize,
) -> Result<Vec<ProducerRun>, WireError> {
    let bad = |what| Err(WireError::InvalidField { what });
    let n = r.u16()? as usize;
    if n == 0 || n > record_count {
        return bad("producer run count");
    }
    let mut runs = Vec::with_capacity(n);
    let mut next_free = 0u64;
    for _ in 0..n {
        let run = ProducerRun {
            session_id: r.u64()?,
            first_seq: r.u64()?,
            first_slot: r.u32()?,
            count: r.u32()?,
        };
        if run.session_id == 0 {
            return bad("producer run session id");
        }
        let end = u64::from(run.first_slot) + u64::from(run.count);
        if run.count == 0 || u64::from(run.first_slot) < next_free || end > record_count as u64 {
            return bad("producer run slots");
        }
        if run
            .first_seq
            .checked_add(u64::from(run.count) - 1)
            .is_none()
        {
            return bad("producer run sequence");
        }
        next_free = end;
        runs.push(run);
    }
    Ok(runs)
}

//! Bookie operations as owned values, their execution against a shard's engine, and their
//! encoding as wire responses.
//!
//! An [`Op`] owns its bytes so that it can cross to another shard over a channel; an
//! [`Outcome`] is what comes back. Engine errors become wire statuses here and nowhere else.

use std::time::Duration;

use quire_engine::{Engine, Error as EngineError};
use quire_wire::bookie::{
    encode_long_poll_response, encode_response, LongPollResponse, Opcode, Response, Status,
};
use quire_wire::{EntryId, LedgerId, MASTER_KEY_SIZE_BYTES};

/// One request for the engine that owns `ledger`, detached from the receive buffer.
#[derive(Debug)]
pub(crate) enum Op {
    /// Store `data` (a whole entry, header included) durably.
    Add {
        ledger: u64,
        entry: u64,
        master_key: [u8; MASTER_KEY_SIZE_BYTES],
        lac: Option<u64>,
        data: Vec<u8>,
        recovery: bool,
    },
    /// Read `entry`, or the last entry when `None`; fence first when `fence` holds a key.
    Read {
        ledger: u64,
        entry: Option<u64>,
        fence: Option<[u8; MASTER_KEY_SIZE_BYTES]>,
    },
    /// Report the LAC and last entry the bookie knows for `ledger`.
    ReadLac { ledger: u64 },
    /// Fence `ledger` and report its LAC.
    Fence {
        ledger: u64,
        master_key: [u8; MASTER_KEY_SIZE_BYTES],
    },
    /// Wait until the LAC of `ledger` passes `previous` (or fenced, or `timeout`), then report
    /// it with entry `previous + 1` piggybacked.
    LongPoll {
        ledger: u64,
        previous: Option<u64>,
        timeout: Duration,
    },
}

/// Which of a shard's task queues runs an operation (performance.md: tail writes, tail reads
/// and catch-up reads are scheduled apart so that none waits behind the other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// Adds, fences and fencing reads.
    TailWrite,
    /// Reads answered from memory, LAC reads and long-polls.
    TailRead,
    /// Reads that go to the entry logs.
    CatchUpRead,
}

impl Op {
    /// The ledger this operation touches; it decides the owning shard.
    pub(crate) fn ledger(&self) -> u64 {
        match *self {
            Op::Add { ledger, .. }
            | Op::Read { ledger, .. }
            | Op::ReadLac { ledger }
            | Op::Fence { ledger, .. }
            | Op::LongPoll { ledger, .. } => ledger,
        }
    }

    /// The wire opcode the response carries.
    pub(crate) fn opcode(&self) -> Opcode {
        match self {
            Op::Add { .. } => Opcode::Add,
            Op::Read { .. } => Opcode::Read,
            Op::ReadLac { .. } => Opcode::ReadLac,
            Op::Fence { .. } => Opcode::Fence,
            Op::LongPoll { .. } => Opcode::ReadLacLongPoll,
        }
    }

    /// The task queue class of this operation; `engine` is the owner's engine when this shard
    /// owns the ledger (then a read is classified by whether it would touch the disk), else
    /// `None` (then the task only forwards, which is cheap: a tail read).
    pub(crate) fn class(&self, engine: Option<&Engine>) -> Class {
        match *self {
            Op::Add { .. } | Op::Fence { .. } | Op::Read { fence: Some(_), .. } => Class::TailWrite,
            Op::ReadLac { .. } | Op::LongPoll { .. } => Class::TailRead,
            Op::Read {
                ledger,
                entry,
                fence: None,
            } => match engine {
                Some(e) if !e.is_cached(ledger, entry) => Class::CatchUpRead,
                _ => Class::TailRead,
            },
        }
    }
}

/// The successful result of an [`Op`].
#[derive(Debug)]
pub(crate) enum Done {
    Add {
        ledger: u64,
        entry: u64,
    },
    Read {
        ledger: u64,
        entry: u64,
        data: Vec<u8>,
    },
    ReadLac {
        ledger: u64,
        lac: Option<u64>,
        last_entry: Option<u64>,
    },
    Fence {
        ledger: u64,
        lac: Option<u64>,
    },
    LongPoll {
        ledger: u64,
        lac: Option<u64>,
        fenced: bool,
        next_entry: Option<(u64, Vec<u8>)>,
    },
}

/// A failed [`Op`]: the wire status and a one-line message for humans.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) status: Status,
    pub(crate) message: String,
    /// The engine failed for lack of space (ENOSPC, EDQUOT): the owning shard reports it to
    /// the disk monitor, which turns the bookie read-only at once.
    pub(crate) storage_full: bool,
}

impl Failure {
    pub(crate) fn new(status: Status, message: String) -> Self {
        assert!(status != Status::Ok, "a failure cannot carry status Ok");
        Self {
            status,
            message,
            storage_full: false,
        }
    }
}

/// What a shard sends back for one [`Op`].
pub(crate) type Outcome = Result<Done, Failure>;

/// Maps an engine error to its wire status (`docs/protocol.md`, "Status codes").
///
/// Negative answers (`NoSuchLedger`, `NoSuchEntry`) pass through only when the engine gave
/// them; every storage failure becomes `IoError`, never a negative answer.
pub(crate) fn status_of(err: &EngineError) -> Status {
    match err {
        EngineError::Fenced { .. } => Status::Fenced,
        // Only adds and fences meet a deleted ledger (its reads answer NoSuchLedger): like a
        // fenced one it refuses writes for good, and a writer told `Fenced` stops writing.
        EngineError::LedgerDeleted { .. } => Status::Fenced,
        EngineError::Unauthorized { .. } => Status::Unauthorized,
        EngineError::EntryMismatch { .. } => Status::EntryMismatch,
        EngineError::NoSuchLedger { .. } => Status::NoSuchLedger,
        EngineError::NoSuchEntry { .. } => Status::NoSuchEntry,
        EngineError::TooLarge { .. } => Status::TooLarge,
        // Back-pressure: the add stored nothing and may be retried later. A ledger whose
        // damaged index segment is still being rebuilt is answered so too: never a negative
        // answer, and the client retries or reads another replica.
        EngineError::WriteCacheFull { .. }
        | EngineError::JournalQueueFull { .. }
        | EngineError::IndexRebuilding { .. } => Status::TooManyRequests,
        _ => Status::IoError,
    }
}

fn fail(err: EngineError) -> Failure {
    let status = status_of(&err);
    if status == Status::IoError {
        tracing::warn!(error = %err, "engine failure answered as IoError");
    }
    let storage_full = err.is_storage_full();
    Failure {
        storage_full,
        ..Failure::new(status, err.to_string())
    }
}

/// Runs `op` on the engine of the shard that owns its ledger.
///
/// # Durability
/// `Add` and `Fence` (and a fencing `Read`) resolve only after the engine made them durable.
/// # Threading
/// Shard-local: `engine` must be the engine of the shard that owns `op.ledger()`.
pub(crate) async fn execute(engine: &Engine, op: Op) -> Outcome {
    match op {
        Op::Add {
            ledger,
            entry,
            master_key,
            lac,
            data,
            recovery,
        } => {
            engine
                .add_entry(ledger, entry, master_key, lac, data, recovery)
                .await
                .map_err(fail)?;
            Ok(Done::Add { ledger, entry })
        }
        Op::Read {
            ledger,
            entry,
            fence,
        } => {
            if let Some(master_key) = fence {
                engine.fence(ledger, master_key).await.map_err(fail)?;
            }
            let data = engine.read_entry(ledger, entry).await.map_err(fail)?;
            let entry = match entry {
                Some(e) => e,
                // "Last entry": the stored bytes are the client's entry verbatim, so its
                // header names the entry id. A header too short to read is a storage fault.
                None => match quire_wire::entry::peek_header(&data) {
                    Ok(h) if h.ledger.0 == ledger => h.entry.0,
                    Ok(h) => {
                        return Err(Failure::new(
                            Status::IoError,
                            format!(
                                "stored last entry of ledger {ledger} names ledger {}",
                                h.ledger
                            ),
                        ))
                    }
                    Err(e) => {
                        return Err(Failure::new(
                            Status::IoError,
                            format!("stored last entry of ledger {ledger} is unreadable: {e}"),
                        ))
                    }
                },
            };
            Ok(Done::Read {
                ledger,
                entry,
                data,
            })
        }
        Op::ReadLac { ledger } => match engine.ledger_state(ledger) {
            Some(state) => Ok(Done::ReadLac {
                ledger,
                lac: state.lac,
                last_entry: state.last_entry,
            }),
            None => Err(Failure::new(
                Status::NoSuchLedger,
                format!("no such ledger {ledger}"),
            )),
        },
        Op::Fence { ledger, master_key } => {
            let lac = engine.fence(ledger, master_key).await.map_err(fail)?;
            Ok(Done::Fence { ledger, lac })
        }
        Op::LongPoll {
            ledger,
            previous,
            timeout,
        } => {
            let u = engine
                .wait_for_lac(ledger, previous, timeout)
                .await
                .map_err(fail)?;
            Ok(Done::LongPoll {
                ledger,
                lac: u.lac,
                fenced: u.fenced,
                next_entry: u.next_entry,
            })
        }
    }
}

/// Appends the response frame for `outcome` to `out`.
pub(crate) fn encode_outcome(
    out: &mut Vec<u8>,
    request_id: u64,
    opcode: Opcode,
    outcome: &Outcome,
) {
    if let Ok(Done::LongPoll {
        ledger,
        lac,
        fenced,
        next_entry,
    }) = outcome
    {
        let response = LongPollResponse {
            ledger: LedgerId(*ledger),
            lac: lac.map(EntryId),
            fenced: *fenced,
            next_entry: next_entry
                .as_ref()
                .map(|(e, d)| (EntryId(*e), d.as_slice())),
        };
        encode_long_poll_response(out, request_id, &response);
        return;
    }
    let response = match outcome {
        Ok(Done::Add { ledger, entry }) => Response::Add {
            ledger: LedgerId(*ledger),
            entry: EntryId(*entry),
        },
        Ok(Done::Read {
            ledger,
            entry,
            data,
        }) => Response::Read {
            ledger: LedgerId(*ledger),
            entry: EntryId(*entry),
            data,
        },
        Ok(Done::ReadLac {
            ledger,
            lac,
            last_entry,
        }) => Response::ReadLac {
            ledger: LedgerId(*ledger),
            lac: lac.map(EntryId),
            last_entry: last_entry.map(EntryId),
        },
        Ok(Done::Fence { ledger, lac }) => Response::Fence {
            ledger: LedgerId(*ledger),
            lac: lac.map(EntryId),
        },
        Ok(Done::LongPoll { .. }) => unreachable!("long-poll answers are encoded above"),
        Err(f) => Response::Failed {
            opcode,
            status: f.status,
            message: &f.message,
        },
    };
    encode_response(out, request_id, &response);
}

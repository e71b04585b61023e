//! Per-message fault points on the bookie's request dispatch (docs/fault-points.md): a
//! request that an armed `QUIRE_FAULT_POINTS` message fault selects is failed with a chosen
//! status, answered late, or never answered. Nothing is checked beyond one `OnceLock` load
//! when the variable is unset.

use quire_faults::{Action, Op as FaultOp};
use quire_wire::bookie::Status;

use crate::ops::{Failure, Op, Outcome};

/// What the dispatch does with one request.
pub(crate) enum Injected {
    /// Run it as usual.
    Run,
    /// Answer this instead of running it.
    Answer(Outcome),
    /// Never answer it.
    Drop,
}

/// The request type, ledger and entry a message fault selects by.
fn selector(op: &Op) -> (FaultOp, u64, Option<u64>) {
    match op {
        Op::Add { ledger, entry, .. } => (FaultOp::Add, *ledger, Some(*entry)),
        Op::Read {
            ledger,
            entry,
            fence,
        } => {
            let kind = if fence.is_some() {
                FaultOp::Fence
            } else {
                FaultOp::Read
            };
            (kind, *ledger, *entry)
        }
        Op::Fence { ledger, .. } => (FaultOp::Fence, *ledger, None),
        Op::ReadLac { ledger } | Op::LongPoll { ledger, .. } => (FaultOp::Lac, *ledger, None),
    }
}

/// Applies the armed message fault for `op`, if any: a delay is slept here.
pub(crate) async fn before(op: &Op) -> Injected {
    let (kind, ledger, entry) = selector(op);
    let Some(action) = quire_faults::message(kind, ledger, entry) else {
        return Injected::Run;
    };
    // Tests check this line to know their fault was hit (docs/fault-points.md).
    tracing::warn!(op = ?kind, ledger, entry = ?entry, action = ?action, "fault point: request fault injected");
    match action {
        Action::Delay(ms) => {
            glommio::timer::sleep(std::time::Duration::from_millis(ms)).await;
            Injected::Run
        }
        Action::Drop => Injected::Drop,
        Action::Fail(code) => {
            // Status 0 (Ok) or a number the protocol does not define is answered as EIO.
            let status = Status::from_u16(code)
                .ok()
                .filter(|s| *s != Status::Ok)
                .unwrap_or(Status::IoError);
            let message = format!("fault point: {kind:?} of ledger {ledger} entry {entry:?} fails");
            Injected::Answer(Err(Failure::new(status, message)))
        }
    }
}

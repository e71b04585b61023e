//! Fault points for tests against real processes (docs/fault-points.md; issue 28 item 4).
//!
//! A process arms them only from the `QUIRE_FAULT_POINTS` environment variable, read once
//! (a `OnceLock`): when it is unset every check is one load of an initialised `OnceLock` and a
//! `None` test, so the paths that call them cost nothing measurable. A release deployment
//! refuses to start a process whose environment sets it (the Ansible units), and a process
//! that has it armed says so loudly on stderr and in `quire_fault_points_active`.
//!
//! Two kinds, separated by `;` in the variable:
//! - **crash points**: `crash=<point>[@<fraction>][#<nth>]` aborts the process
//!   (`std::process::abort`, no cleanup, like a SIGKILL) the `nth` time (default 1) the code
//!   passes `<point>`; `@<fraction>` is for points reached with a progress (the journal replay:
//!   abort once that fraction of its records is applied);
//! - **message faults** on a bookie: `<op>=<action>[,ledger=<id>][,entry=<e>|,entries=<a>-<b>]
//!   [,count=<n>]` with `<op>` one of `add`, `read`, `fence` (a fencing read or a fence
//!   request: recovery's reads), `lac` (a LAC read or a LAC long poll) and `<action>` one of
//!   `fail:<status>` (answer with that wire status, docs/protocol.md), `delay:<ms>` (answer
//!   that much later) or `drop` (never answer). Only the first `count` matching requests are
//!   hit when `count` is given.

mod spec;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

pub use spec::{parse, Action, CrashPoint, Fault, MessageFault, Op, Spec};

/// The environment variable that arms fault points.
pub const ENV: &str = "QUIRE_FAULT_POINTS";

/// The armed faults with their hit counters, or `None` when the variable is unset.
struct Armed {
    spec: Spec,
    /// Per fault (same order as `spec.faults`): how many times it matched.
    hits: Vec<AtomicU64>,
}

static ARMED: OnceLock<Option<Armed>> = OnceLock::new();

fn load() -> Option<Armed> {
    let text = std::env::var(ENV).ok()?;
    match parse(&text) {
        Ok(spec) => {
            eprintln!(
                "WARNING: {ENV} is set: fault points are ARMED in this process ({text}). \
                 They fail, delay or drop requests and abort the process on purpose: for tests \
                 only, never in a deployment."
            );
            let hits = spec.faults.iter().map(|_| AtomicU64::new(0)).collect();
            Some(Armed { spec, hits })
        }
        Err(e) => {
            // A test that misspells a fault must not run without it and pass by accident.
            eprintln!("{ENV}: {e}");
            std::process::exit(2);
        }
    }
}

fn armed() -> Option<&'static Armed> {
    ARMED.get_or_init(load).as_ref()
}

/// Reads `QUIRE_FAULT_POINTS` now (a process calls it at start so that a bad spec stops it
/// at once and the warning comes first); returns whether fault points are armed. A spec that
/// does not parse exits the process with status 2 and the reason on stderr.
pub fn init() -> bool {
    armed().is_some()
}

/// Whether fault points are armed (for the `quire_fault_points_active` gauge).
pub fn active() -> bool {
    armed().is_some()
}

/// Counts a hit of fault `i`; whether it fires (within its `count` or `nth`).
fn hit(a: &Armed, i: usize, fires: impl Fn(u64) -> bool) -> bool {
    let n = a.hits[i].fetch_add(1, Ordering::Relaxed) + 1;
    fires(n)
}

/// Aborts the process here when crash point `point` is armed and this is its `nth` pass.
pub fn crash(point: &str) {
    let Some(a) = armed() else { return };
    for (i, f) in a.spec.faults.iter().enumerate() {
        if let Fault::Crash(c) = f {
            if c.point == point && c.fraction.is_none() && hit(a, i, |n| n == c.nth) {
                abort_at(point);
            }
        }
    }
}

/// The fraction armed for progress point `point` (e.g. `engine.replay@0.1`), if any.
pub fn crash_fraction(point: &str) -> Option<f64> {
    armed()?.spec.faults.iter().find_map(|f| match f {
        Fault::Crash(c) if c.point == point => c.fraction,
        _ => None,
    })
}

/// Aborts the process: a crash point fired.
pub fn abort_at(point: &str) -> ! {
    eprintln!("{ENV}: crash point {point} reached: aborting");
    std::process::abort()
}

/// The fault for one bookie request (`op` on `ledger`, `entry` when it names one), if an
/// armed message fault matches it and its count is not used up.
pub fn message(op: Op, ledger: u64, entry: Option<u64>) -> Option<Action> {
    let a = armed()?;
    a.spec.faults.iter().enumerate().find_map(|(i, f)| match f {
        Fault::Message(m) if m.matches(op, ledger, entry) => {
            hit(a, i, |n| m.count.is_none_or(|c| n <= c)).then_some(m.action)
        }
        _ => None,
    })
}

/// A delay action's length.
pub fn delay_of(action: Action) -> Option<Duration> {
    match action {
        Action::Delay(ms) => Some(Duration::from_millis(ms)),
        _ => None,
    }
}

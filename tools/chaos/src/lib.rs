//! The chaos runner (issue 28 item 2): seeded fault schedules over a real multi-process Quire
//! cluster, each checked with the history checker ([`quire_testkit::history`]).
//!
//! A run starts one cluster ([`cluster::ChaosCluster`]: a real ZooKeeper, four bookies, two
//! proxies, an autorecovery daemon, relays on the links a partition cuts) and plays schedules
//! on it, one after another ([`run::Runner`]). Each schedule is a pure function of its seed
//! ([`schedule::Schedule::draw`]): one to four faults (SIGKILL and restart, SIGSTOP and SIGCONT
//! shorter or longer than the ZooKeeper session, partitions through relays (whole, pairwise
//! proxy–bookie and bookie–bookie, one-way), delay and loss on a bookie's links, a throttled
//! bookie, a ZooKeeper crash and restart, a bookie's ledger disk filled and freed, a proxy
//! drained and started again, an extra proxy joining and drained; the proxies balance stream
//! ownership at their default rate), never more than one bookie of four and one proxy of two
//! at once (a joiner aside), nothing else while ZooKeeper is down. Against fresh streams it runs a plain writer, a
//! producer-session writer, tailing and catch-up readers and a truncation
//! ([`workload::Workload`]), recording every operation; then it heals everything, waits until
//! writes succeed again and the cluster is whole ([`cluster::ChaosCluster::wait_healthy`]),
//! reads every stream back and runs the checker. A violation prints the
//! seed, the schedule, the checker's slices of history and the last lines of every process's
//! log; `quire-chaos run --seed S --schedules 1` replays the schedule.
//!
//! The `quire` binary the processes run is the harness's ([`quire_testkit::harness::quire_bin`]:
//! `QUIRE_TEST_BIN`, else the one beside the running executable's `deps/`).

// The runner waits on real child processes and sockets: real-clock deadlines.
#![allow(clippy::disallowed_methods)]

pub mod cluster;
pub mod pinned;
pub mod run;
pub mod schedule;
pub mod workload;

pub use run::{Runner, Summary, Verdict};
pub use schedule::{Fault, Schedule, Shape};

/// The cluster every run uses: four bookies (E=3: one can fail), two proxies, faults starting
/// within `window`; small loop-mounted disks for the bookies (and full-disk faults) when `disks`.
pub fn shape(window: std::time::Duration, disks: bool) -> Shape {
    Shape {
        bookies: 4,
        proxies: 2,
        window,
        disks,
    }
}

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM end a run after its current schedule (the cluster's processes are
/// then stopped by pid and its loop disks unmounted, and the summary is printed) instead of
/// killing the runner and orphaning them. A second signal is handled the same way.
pub fn stop_on_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe {
            libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t);
        }
    }
}

/// Whether SIGINT or SIGTERM arrived since [`stop_on_signals`].
pub fn stop_requested() -> bool {
    STOP.load(std::sync::atomic::Ordering::SeqCst)
}

/// Whether this process runs as root (loop mounts, hence disk faults, need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A seed from the clock (nanoseconds since the epoch, mixed), for fresh runs.
pub fn clock_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    schedule::Rng::new(nanos ^ u64::from(std::process::id())).next_u64() >> 16
}

/// Parses a budget: a number of seconds with an optional unit `s`, `m` or `h` (`90`, `90s`,
/// `5m`, `2h`).
///
/// # Errors
/// A message naming the text when it is not such a number.
pub fn parse_budget(text: &str) -> Result<std::time::Duration, String> {
    let (num, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("budget {text:?}: expected e.g. 90s, 5m, 2h"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("budget {text:?}: unit must be s, m or h")),
    };
    Ok(std::time::Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn budgets_parse_with_units() {
        assert_eq!(parse_budget("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_budget("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_budget("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_budget("2h").unwrap(), Duration::from_secs(7200));
        assert!(parse_budget("5d").is_err());
        assert!(parse_budget("m").is_err());
    }
}

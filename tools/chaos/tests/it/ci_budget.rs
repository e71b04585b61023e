//! CI's chaos run (issue 28): one cluster, two pinned seeds and fresh seeds from the clock,
//! at least 20 schedules within a fixed budget; every schedule's history must check clean.
//! The seeds are printed (run with `--nocapture` to see them; a failure prints them anyway),
//! and a failing one replays with `quire-chaos run --seed S --schedules 1`.
//!
//! Needs the `quire` binary beside the test (`cargo build --release -p quire`; the workspace
//! build of scripts/test makes it).

use std::time::Duration;

/// Seeds every CI run plays: 7 and 1,000,003 draw several faults at once; 51 SIGKILLs a bookie
/// and restarts it within half a second, before ZooKeeper has expired its old session (the
/// chaos runner's first finding: the restarted bookie gave up waiting for its old registration
/// and exited; see quire-metadata's `a_restarted_bookie_waits_out_its_old_registration`).
/// Pinned for the drawing code of this commit and a root run (the disk faults change what a
/// seed draws).
const PINNED: [u64; 3] = [7, 1_000_003, 51];
/// Schedules per CI run, pinned ones included.
const SCHEDULES: u64 = 20;

#[test]
fn chaos_schedules_within_the_ci_budget_check_clean() {
    let fresh = quire_chaos::clock_seed();
    println!("chaos CI: pinned seeds {PINNED:?}, fresh seeds from {fresh}");
    let seeds = PINNED
        .into_iter()
        .chain((0..SCHEDULES - PINNED.len() as u64).map(|k| fresh.wrapping_add(k)));
    let mut runner = quire_chaos::Runner::start(quire_chaos::shape(
        Duration::from_millis(2000),
        quire_chaos::is_root(),
    ));
    // A cap, not the plan: 20 schedules take about 2-2.5 minutes on two shared cores.
    let summary = runner.run(seeds, Duration::from_secs(300));
    assert!(
        summary.failed().is_empty(),
        "violations found:\n{}",
        summary.render()
    );
    assert!(
        summary.verdicts.len() as u64 >= SCHEDULES,
        "only {} schedules within the budget:\n{}",
        summary.verdicts.len(),
        summary.render()
    );
}

//! The regression schedules: each finding of the chaos runner, as the whole schedule its seed
//! drew when it was found (adding fault kinds changes what a seed draws, and a regression must
//! keep replaying its finding). CI plays them first (tools/chaos/tests/it/ci_budget.rs);
//! `quire-chaos run --pinned` plays them alone.

use std::time::Duration;

use crate::schedule::{Direction, Fault, Planned, Schedule};

fn planned(at_ms: u64, lasts_ms: u64, fault: Fault) -> Planned {
    Planned {
        at: Duration::from_millis(at_ms),
        lasts: Duration::from_millis(lasts_ms),
        fault,
    }
}

/// The regressions every CI run plays, as whole schedules (what their seeds drew when they
/// were found: adding fault kinds changed what a seed draws, and a pinned seed must keep
/// replaying its finding).
///
/// All were found with each stream owned by the first proxy asked; since session
/// 26 the runner's proxies balance ownership (their default), so these schedules now play with
/// streams on their preferred owners and moving back after a restart. The faults are the same;
/// each finding's cause also has a regression test of its own (named below) that does not
/// depend on which proxy owns what.
///
/// - 7 and 1,000,003 (window 2 s): several faults at once; one proxy killed.
/// - 51 (window 2 s): SIGKILLs a bookie and restarts it within half a second, before ZooKeeper
///   has expired its old session (the chaos runner's first finding: the restarted bookie gave
///   up waiting for its old registration and exited; see quire-metadata's
///   `a_restarted_bookie_waits_out_its_old_registration`).
/// - 234,236,409,463,439 (window 3 s): two ZooKeeper crashes back to back; on a loaded machine
///   their real downtime outlasts the session, both proxies exit on their expired sessions a
///   second after the heal, and the runner read back from no proxy ("connection refused"),
///   reported as a violation. The runner now waits for the cluster to be whole before the
///   read-back (`ChaosCluster::wait_healthy`). It failed again in CI (stop 38, under the load of
///   the other tests and the deployment test beside it), its finding not kept by the log: the
///   proxies can exit after the heal before any write got through, and the runner waited for
///   writes to resume without restarting them. The wait now restarts exited processes
///   (`Runner::wait_resumed`), and the closing summary carries each finding's first lines.
/// - 250,541,322,692,507 (window 3 s, found by the session-21 soak): proxy 0 killed, then proxy 1
///   paused past the session; proxy 1 lived on and answered "owned by 127.0.0.1:<itself>" for
///   the plain stream for over a minute (writes never resumed): a lock node of its own live
///   session was left behind with no lease holding it. quire-metadata now deletes such an
///   orphan when it acquires (`an_orphaned_lock_node_of_the_same_session_is_reaped`).
/// - 115,053,996,291,042 (window 3 s, same soak, with the new fault kinds): one-way partition to
///   bookie 1, proxy 0 killed and then cut from ZooKeeper for 1.9 s, loss on bookie 2's links;
///   the same stuck stream, this time with its cause in the proxy's error: acquiring the lease
///   failed with "ZooKeeper delete on .../lock-0000000004 failed: connection to server has
///   lost", leaving that child behind in the live session.
/// - 110,774,121,609,494 (window 3 s, found by the session-24 soak): both proxies killed while
///   the workload truncated the plain stream behind its readers; the owner applied the
///   truncation and died before it answered, and the checker, which held a truncation without
///   an answer as not applied, reported every record before the point lost (a false finding,
///   2 of 3 replays). The checker now takes such a truncation as applied unless the final log
///   still holds a record before its point
///   (`a_truncation_without_an_answer_may_have_been_applied`).
pub fn pinned() -> Vec<Schedule> {
    let s = |seed, faults| Schedule { seed, faults };
    vec![
        s(
            7,
            vec![
                planned(557, 991, Fault::KillBookie(0)),
                planned(893, 4615, Fault::PauseProxy(0)),
                planned(1643, 2055, Fault::PauseBookie(0)),
            ],
        ),
        s(1_000_003, vec![planned(937, 1001, Fault::KillProxy(0))]),
        s(51, vec![planned(309, 476, Fault::KillBookie(1))]),
        s(
            234_236_409_463_439,
            vec![
                planned(693, 1131, Fault::RestartZooKeeper),
                planned(2920, 821, Fault::RestartZooKeeper),
            ],
        ),
        s(
            250_541_322_692_507,
            vec![
                planned(145, 1588, Fault::KillProxy(0)),
                planned(1592, 1458, Fault::PartitionBookieZk(3)),
                planned(1957, 4858, Fault::PauseProxy(1)),
            ],
        ),
        s(
            115_053_996_291_042,
            vec![
                planned(333, 1848, Fault::OneWayBookie(1, Direction::ToServer)),
                planned(1708, 384, Fault::KillProxy(0)),
                planned(2486, 1868, Fault::PartitionProxyZk(0)),
                planned(2785, 1991, Fault::LossyBookie(2, 20)),
            ],
        ),
        s(
            110_774_121_609_494,
            vec![
                planned(800, 380, Fault::KillProxy(1)),
                planned(1480, 5420, Fault::CutProxyBookie(1, 0)),
                planned(2100, 350, Fault::KillProxy(0)),
            ],
        ),
    ]
}

//! One schedule, and a run of many on one cluster: draw the schedule from its seed, start the
//! workload on fresh streams, inject and heal each fault at its planned time, heal everything,
//! wait until writes succeed again, read every stream back, check each stream's history, and
//! check the cluster healthy (every bookie registered) before the next schedule.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use quire_testkit::history::History;
use tokio::runtime::Runtime;

use crate::cluster::ChaosCluster;
use crate::schedule::{Schedule, Shape};
use crate::workload::{self, Workload};

/// How long writes may take to resume after every fault is healed before the schedule counts
/// as a violation of "writes resume after a fault heals" (DESIGN.md §9).
pub const RECOVERY_LIMIT: Duration = Duration::from_secs(60);

/// How long the first read-back of a stream retries before the runner checks the cluster
/// whole again (a proxy may exit after the heal, when its ZooKeeper session turns out to have
/// expired) and reads it back once more, for [`READ_BACK_FOR`].
const FIRST_READ_BACK_FOR: Duration = Duration::from_secs(20);

/// How long the read-back of a stream retries on a cluster found whole.
const READ_BACK_FOR: Duration = Duration::from_secs(60);

/// What one schedule found.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub schedule: Schedule,
    /// Each violation, written up: the checker's findings with their slices of history, or a
    /// liveness failure (writes never resumed, a stream could not be read back from a whole
    /// cluster, a process did not start again).
    pub violations: Vec<String>,
    /// Set when the cluster was not whole again within [`RECOVERY_LIMIT`] after the heal
    /// ([`ChaosCluster::wait_healthy`]: "cluster did not recover within …"): then the streams
    /// could not be read back and the history was not judged. Its own outcome, apart from the
    /// violations: nothing says the log broke a promise, only that the run could not look.
    pub unrecovered: Option<String>,
}

impl Verdict {
    /// Whether the schedule found nothing: no violation, and the cluster recovered.
    pub fn clean(&self) -> bool {
        self.violations.is_empty() && self.unrecovered.is_none()
    }
}

/// What a run of many schedules found.
#[derive(Debug, Default)]
pub struct Summary {
    pub verdicts: Vec<Verdict>,
}

impl Summary {
    /// How often each kind of fault was drawn.
    pub fn fault_kinds(&self) -> BTreeMap<&'static str, usize> {
        let mut kinds = BTreeMap::new();
        for v in &self.verdicts {
            for p in &v.schedule.faults {
                *kinds.entry(p.fault.kind()).or_insert(0) += 1;
            }
        }
        kinds
    }

    /// The schedules with a violation.
    pub fn failed(&self) -> Vec<&Verdict> {
        self.verdicts
            .iter()
            .filter(|v| !v.violations.is_empty())
            .collect()
    }

    /// The schedules after which the cluster did not recover (and had no violation found).
    pub fn unrecovered(&self) -> Vec<&Verdict> {
        self.verdicts
            .iter()
            .filter(|v| v.violations.is_empty() && v.unrecovered.is_some())
            .collect()
    }

    /// The closing lines: schedules run, faults drawn by kind, each failing seed.
    pub fn render(&self) -> String {
        let faults: usize = self.fault_kinds().values().sum();
        let mut out = format!(
            "chaos: {} schedules, {faults} faults, {} with violations, {} where the cluster did \
             not recover\n",
            self.verdicts.len(),
            self.failed().len(),
            self.unrecovered().len()
        );
        for (kind, n) in self.fault_kinds() {
            out.push_str(&format!("  {n:>5}  {kind}\n"));
        }
        for (k, v) in self.verdicts.iter().enumerate() {
            if let (true, Some(why)) = (v.violations.is_empty(), &v.unrecovered) {
                out.push_str(&format!(
                    "  NOT RECOVERED seed {}, schedule {} of the run: {why}\n",
                    v.schedule.seed,
                    k + 1
                ));
            }
            if v.violations.is_empty() {
                continue;
            }
            out.push_str(&format!(
                "  VIOLATION seed {} ({} findings), schedule {} of the run: replay it with \
                 `quire-chaos run --seed {} --schedules 1` (this run's cluster had played {k} \
                 schedules before it)\n",
                v.schedule.seed,
                v.violations.len(),
                k + 1,
                v.schedule.seed,
            ));
            // The findings themselves, shortened: a CI log may keep only this summary.
            for finding in &v.violations {
                out.push_str(&format!("    - {}\n", shorten(finding, 12)));
            }
        }
        out
    }

    /// The failing schedules only, each finding cut to its first `lines` lines: the text a test
    /// panics with, so the last lines of a CI log (which keeps the end of a failing test's
    /// output) say what was found. [`Summary::render`], printed before it, has the rest.
    pub fn brief(&self, lines: usize) -> String {
        let mut out = String::new();
        for v in self.verdicts.iter().filter(|v| !v.clean()) {
            let seed = v.schedule.seed;
            if let (true, Some(why)) = (v.violations.is_empty(), &v.unrecovered) {
                out.push_str(&format!(
                    "seed {seed} NOT RECOVERED: {}\n",
                    shorten(why, lines)
                ));
            }
            for finding in &v.violations {
                out.push_str(&format!(
                    "seed {seed} VIOLATION: {}\n",
                    shorten(finding, lines)
                ));
            }
        }
        out
    }
}

/// A chaos cluster and the runtime its clients run on.
pub struct Runner {
    pub cluster: ChaosCluster,
    rt: Runtime,
}

impl Runner {
    /// Starts the cluster for `shape`.
    pub fn start(shape: Shape) -> Runner {
        let cluster = ChaosCluster::start(shape);
        Runner {
            cluster,
            rt: quire_testkit::harness::cluster::runtime(),
        }
    }

    /// Runs schedules of seeds `seeds` in order until they run out or `budget` has passed
    /// (a schedule started in time runs to its end); prints each schedule, its events and its
    /// verdict, and the summary.
    pub fn run(&mut self, seeds: impl IntoIterator<Item = u64>, budget: Duration) -> Summary {
        let shape = self.cluster.shape;
        let schedules = seeds.into_iter().map(|s| Schedule::draw(s, shape));
        self.run_schedules(schedules, budget)
    }

    /// [`Runner::run`] of given schedules: pinned regressions keep their faults whatever the
    /// drawing code of the day draws for their seed.
    pub fn run_schedules(
        &mut self,
        schedules: impl IntoIterator<Item = Schedule>,
        budget: Duration,
    ) -> Summary {
        let start = Instant::now();
        let mut summary = Summary::default();
        for (k, schedule) in schedules.into_iter().enumerate() {
            if start.elapsed() >= budget {
                println!("chaos: budget of {budget:?} spent after {k} schedules");
                break;
            }
            if crate::stop_requested() {
                println!("chaos: stopped by a signal after {k} schedules");
                break;
            }
            println!(
                "=== schedule {} at {:.0}s",
                k + 1,
                start.elapsed().as_secs_f64()
            );
            summary.verdicts.push(self.play_schedule(schedule));
        }
        print!("{}", summary.render());
        summary
    }

    /// Runs the schedule of `seed` (see the module docs) and returns its verdict.
    pub fn run_schedule(&mut self, seed: u64) -> Verdict {
        self.play_schedule(Schedule::draw(seed, self.cluster.shape))
    }

    /// Runs `schedule` (its seed names the streams and seeds the workload) and returns its
    /// verdict.
    pub fn play_schedule(&mut self, schedule: Schedule) -> Verdict {
        let seed = schedule.seed;
        print!("{schedule}");
        let mut violations = Vec::new();
        let proxies = self.cluster.proxy_addrs();
        let window = self.cluster.shape.window;
        let w = match Workload::start(&self.rt, proxies, seed, window) {
            Ok(w) => w,
            Err(e) => {
                violations.push(format!("no proxy answered at the schedule's start: {e}"));
                return self.verdict(schedule, violations, None);
            }
        };
        self.play(&schedule);
        for line in self.cluster.heal_all() {
            println!("  heal: {line}");
        }
        let since = w.acks();
        let healed = Instant::now();
        if self.wait_resumed(&w, since) {
            println!(
                "  writes resumed {:.2}s after the heal",
                healed.elapsed().as_secs_f64()
            );
        } else {
            violations.push(format!(
                "writes did not resume within {RECOVERY_LIMIT:?} after every fault was healed \
                 (acknowledged plain/session before: {since:?}, after: {:?}; the writers' last \
                 errors follow the verdict)\n{}",
                w.acks(),
                self.describe_streams(&w)
            ));
        }
        // The read-back needs every proxy up and every bookie registered: a proxy that exits
        // after the heal (its session expired) is started again here, before the check.
        let unrecovered = match self.cluster.wait_healthy(RECOVERY_LIMIT) {
            Ok(lines) => {
                for line in lines {
                    println!("  before the check: {line}");
                }
                self.check(w, &mut violations)
            }
            Err(e) => {
                let _ = w.stop(&self.rt);
                Some(e)
            }
        };
        self.delete_streams(seed);
        // A process may exit after the heal (a proxy that wakes from SIGSTOP past its session
        // finds it expired and exits): restart it, so the next schedule starts whole.
        for line in self.cluster.heal_all() {
            println!("  after the check: {line}");
        }
        violations.extend(self.cluster.take_failures());
        if let Err(e) = self.cluster.wait_registered() {
            violations.push(e);
        }
        self.verdict(schedule, violations, unrecovered)
    }

    /// Waits up to [`RECOVERY_LIMIT`] for both writers to have an acknowledgement after `since`,
    /// restarting any process that exits meanwhile, as a deployment's supervisor does (systemd's
    /// `Restart=` in ansible/): a proxy whose ZooKeeper session turns out to have expired exits
    /// a while after ZooKeeper is back, sometimes before any write got through, and writes
    /// cannot resume until it runs again (CI's run of pinned seed 234,236,409,463,439 under
    /// load).
    fn wait_resumed(&mut self, w: &Workload, since: (u64, u64)) -> bool {
        let deadline = Instant::now() + RECOVERY_LIMIT;
        loop {
            for line in self.cluster.revive() {
                println!("  while waiting for writes: {line}");
            }
            let slice =
                Duration::from_millis(500).min(deadline.saturating_duration_since(Instant::now()));
            if w.wait_resumed(since, slice) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
        }
    }

    /// Deletes the schedule's streams, so that a long run does not fill the bookies' disks
    /// (their garbage collection reclaims the ledgers); errors are printed, not violations.
    fn delete_streams(&self, seed: u64) {
        let proxies = self.cluster.proxy_addrs();
        self.rt.block_on(async {
            let Ok(c) = workload::client(&proxies).await else {
                return;
            };
            for kind in ["plain", "session"] {
                let stream = format!("chaos/{seed}/{kind}");
                if let Err(e) = c.delete_stream(&stream).await {
                    println!("  could not delete {stream}: {e}");
                }
            }
        });
    }

    /// `quire stream show` of the workload's streams through every proxy, for a write-up.
    fn describe_streams(&self, w: &Workload) -> String {
        let mut out = String::new();
        for stream in [&w.plain_stream, &w.session_stream] {
            for proxy in w.proxies() {
                let o = quire_testkit::harness::run_quire(&["stream", "show", stream], proxy, None);
                out.push_str(&format!(
                    "quire stream show {stream} --proxy {proxy}: {}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                ));
            }
        }
        out
    }

    fn verdict(
        &self,
        schedule: Schedule,
        violations: Vec<String>,
        unrecovered: Option<String>,
    ) -> Verdict {
        if let Some(why) = &unrecovered {
            println!("  verdict: NOT RECOVERED (seed {}): {why}", schedule.seed);
        }
        if violations.is_empty() && unrecovered.is_none() {
            println!("  verdict: ok (seed {})", schedule.seed);
        } else if violations.is_empty() {
            println!("  last lines of each process's log:");
            print!("{}", self.cluster.log_tails(20));
        } else {
            println!(
                "  verdict: VIOLATION (seed {}, {} findings)",
                schedule.seed,
                violations.len()
            );
            for v in &violations {
                println!("  {}", v.replace('\n', "\n  "));
            }
            println!("  last lines of each process's log:");
            print!("{}", self.cluster.log_tails(20));
        }
        Verdict {
            schedule,
            violations,
            unrecovered,
        }
    }

    /// Injects each fault at its planned time and heals it when it has lasted its planned
    /// duration from the moment its injection took effect (filling a disk or restarting a
    /// process takes a while, which delays the events after it: the printed times are the real
    /// ones), then waits out the window.
    fn play(&mut self, schedule: &Schedule) {
        let t0 = Instant::now();
        let mut events: Vec<(Duration, bool, usize)> = Vec::new();
        for (i, p) in schedule.faults.iter().enumerate() {
            events.push((p.at, true, i));
            events.push((p.end(), false, i));
        }
        // At one instant, heal before injecting.
        events.sort_by_key(|&(t, start, i)| (t, start, i));
        let mut in_force = vec![Duration::ZERO; schedule.faults.len()];
        for (t, start, i) in events {
            let planned = schedule.faults[i];
            let due = if start {
                t
            } else {
                t.max(in_force[i] + planned.lasts)
            };
            if let Some(wait) = due.checked_sub(t0.elapsed()) {
                std::thread::sleep(wait);
            }
            let (verb, did) = if start {
                let did = self.cluster.inject(planned.fault);
                in_force[i] = t0.elapsed();
                ("inject", did)
            } else {
                ("heal", self.cluster.heal(planned.fault))
            };
            let at = t0.elapsed().as_secs_f64();
            println!("  +{at:>6.2}s {verb} {}: {did}", planned.fault);
        }
        if let Some(wait) = self.cluster.shape.window.checked_sub(t0.elapsed()) {
            std::thread::sleep(wait);
        }
    }

    /// Stops the workload, reads both streams back and runs the history checker on each. A
    /// read-back that fails is tried again once the cluster is whole again; when it does not
    /// become whole, returns that outcome ("cluster did not recover within …").
    fn check(&mut self, w: Workload, violations: &mut Vec<String>) -> Option<String> {
        let proxies = w.proxies().to_vec();
        let streams: [(String, std::sync::Arc<History>); 2] = [
            (w.plain_stream.clone(), w.plain.clone()),
            (w.session_stream.clone(), w.session.clone()),
        ];
        let ((plain, session), reads) = w.stop(&self.rt);
        for (name, t) in [("plain", plain), ("session", session)] {
            println!(
                "  {name} writes: {} ok, {} failed, {} unknown, longest pause between acks \
                 {:.2}s; last error: {}",
                t.ok,
                t.failed,
                t.unknown,
                t.longest_pause.as_secs_f64(),
                t.last_error.as_deref().unwrap_or("none")
            );
        }
        println!("  records read by the plain tail, session tail, catch-up: {reads:?}");
        for (stream, history) in streams {
            let first = workload::final_log(&proxies, &stream, FIRST_READ_BACK_FOR);
            let log = match self.rt.block_on(first) {
                Ok(log) => log,
                Err(e) => {
                    println!("  read back of {stream} failed ({e}); waiting for the cluster");
                    match self.cluster.wait_healthy(RECOVERY_LIMIT) {
                        Ok(lines) => lines
                            .iter()
                            .for_each(|l| println!("  before reading again: {l}")),
                        Err(e) => return Some(e),
                    }
                    let again = workload::final_log(&proxies, &stream, READ_BACK_FOR);
                    match self.rt.block_on(again) {
                        Ok(log) => log,
                        Err(e) => {
                            violations.push(format!(
                                "{stream} could not be read back from a whole cluster: {e}"
                            ));
                            continue;
                        }
                    }
                }
            };
            let report = history.check(&log);
            println!(
                "  {stream}: {} records, {} operations, {} findings, {} allowed duplicates",
                report.final_records,
                report.ops,
                report.findings.len(),
                report.allowed_duplicates.len()
            );
            for f in &report.findings {
                violations.push(format!("{stream}: {f}"));
            }
            if !report.findings.is_empty() {
                print!("{}", self.stream_state(&proxies, &stream));
            }
        }
        None
    }

    /// What the cluster holds of `stream` now, for a finding's write-up: `quire stream show`
    /// through the first proxy that answers, then `quire ledger show` of each segment's ledger.
    fn stream_state(&self, proxies: &[String], stream: &str) -> String {
        let mut out = format!("  state of {stream} after the read back:\n");
        let shown = proxies.iter().find_map(|p| {
            let o = quire_testkit::harness::run_quire(&["stream", "show", stream], p, None);
            o.status
                .success()
                .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
        });
        let Some(shown) = shown else {
            out.push_str("    (no proxy answered `stream show`)\n");
            return out;
        };
        let mut ledgers = Vec::new();
        for line in shown.lines() {
            out.push_str(&format!("    {line}\n"));
            ledgers.extend(ledger_of_segment_line(line));
        }
        for id in ledgers {
            let o = self
                .cluster
                .cluster
                .admin(&["ledger", "show", &id.to_string()]);
            for line in String::from_utf8_lossy(&o.stdout).lines() {
                out.push_str(&format!("    ledger {id}: {line}\n"));
            }
        }
        out
    }
}

/// The ledger id of a segment line of `quire stream show` (`SEQ LEDGER STATE ...`), if it is
/// one.
fn ledger_of_segment_line(line: &str) -> Option<u64> {
    let mut words = line.split_whitespace();
    words.next()?.parse::<u64>().ok()?;
    words.next()?.parse().ok()
}

/// The first `lines` lines of `text`, with a count of those left out.
fn shorten(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    let mut out = all
        .iter()
        .take(lines)
        .copied()
        .collect::<Vec<_>>()
        .join("\n      ");
    if all.len() > lines {
        out.push_str(&format!(
            "\n      ({} more lines in the schedule's verdict above)",
            all.len() - lines
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_carries_each_finding_shortened() {
        // Goal: a CI log that keeps only the closing summary still says what was found.
        // Method: one verdict with a 20-line finding; the summary names the seed and holds the
        // finding's first lines and a count of the rest, not all 20.
        let finding: Vec<String> = (1..=20).map(|i| format!("line {i}")).collect();
        let summary = Summary {
            verdicts: vec![Verdict {
                schedule: Schedule {
                    seed: 42,
                    faults: Vec::new(),
                },
                violations: vec![format!("writes did not resume\n{}", finding.join("\n"))],
                unrecovered: None,
            }],
        };
        let text = summary.render();
        assert!(text.contains("VIOLATION seed 42"), "{text}");
        assert!(text.contains("- writes did not resume"), "{text}");
        assert!(text.contains("line 11"), "{text}");
        assert!(!text.contains("line 12\n"), "{text}");
        assert!(text.contains("(9 more lines"), "{text}");
        let brief = summary.brief(3);
        assert!(
            brief.starts_with("seed 42 VIOLATION: writes did not resume"),
            "{brief}"
        );
        assert!(
            brief.contains("line 2") && !brief.contains("line 3"),
            "{brief}"
        );
    }
}

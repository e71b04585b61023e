//! The chaos cluster: one real ZooKeeper, bookies, proxies and an autorecovery daemon as child
//! processes on 127.0.0.1 (quire-testkit's harness), with a cuttable, throttlable TCP relay
//! ([`quire_testkit::TcpRelay`]) on every link a partition can cut:
//!
//! - in front of each bookie: the bookie advertises the relay's address (`--advertised`), so
//!   every proxy and the autorecovery daemon reach it through the relay (cut: the bookie is
//!   partitioned from all of them; throttled: a slow bookie);
//! - between each bookie and ZooKeeper, and between each proxy and ZooKeeper (`--zookeeper`
//!   is the relay's address).
//!
//! With `Shape::disks` (root only) each bookie's ledger and journal directories are small
//! loop-mounted ext4 disks, so that a full-disk fault fills one bookie's disk and nothing else.
//!
//! The relay in front of a bookie also plays the finer faults: it cuts one chosen process only
//! (a proxy, or a peer bookie whose autorecovery reads replicas from it: the relay tells the
//! connecting process by its socket's inode), holds one direction (a one-way partition), delays
//! every chunk, or loses chunks (late after a retransmission timeout, or a reset: a TCP relay
//! cannot drop bytes without breaking the stream's framing). See [`quire_testkit::TcpRelay`].
//!
//! Limits: clients reach the proxies directly; the autorecovery daemon and the admin commands
//! reach ZooKeeper directly; one-way, delay and loss act on every peer of a bookie at once.

use std::net::SocketAddr;

use quire_testkit::harness::cluster::{Cluster, Proc};
use quire_testkit::loop_mount::{fill_file, LoopMount};
use quire_testkit::TcpRelay;

use crate::schedule::{Fault, Shape};

/// Write quorum flags of every proxy: E=3 Qw=3 Qa=2 (four bookies: one can fail and the
/// ensemble changes to the fourth).
const QUORUM: &[&str] = &[
    "--ensemble-size",
    "3",
    "--write-quorum",
    "3",
    "--ack-quorum",
    "2",
];

/// Short autorecovery delays, so that a lost bookie is acted on within a schedule.
const AUTORECOVERY_FLAGS: &[&str] = &[
    "--lost-bookie-recovery-delay-secs",
    "2",
    "--open-ledger-rereplication-grace-period-ms",
    "3000",
    "--autorecovery-poll-interval-ms",
    "250",
];

/// Full-disk flags for bookies on their own small disks: read-only past 99 %, writable again
/// below 98 %, checked every 200 ms; garbage collection every 10 s, so that the ledgers of the
/// streams each schedule deletes give their space back during a long run.
const DISK_FLAGS: &[&str] = &[
    "--gc-interval-secs",
    "10",
    "--disk-check-interval-ms",
    "200",
    "--disk-usage-threshold",
    "0.99",
    "--disk-usage-lwm-threshold",
    "0.98",
];

/// Size of each bookie's loop-mounted ledger disk and of its journal disk. The journal disk
/// must hold the journal files not yet reclaimed plus the next one being pre-allocated (4 MiB
/// each): at 32 MiB one reached 97.7 % and the next file's pre-allocation failed with ENOSPC
/// below the 99 % read-only threshold.
const DISK_BYTES: u64 = 64 << 20;

/// Longest wait for a proxy to exit after SIGTERM: its drain is bounded by the proxy's
/// `drain_timeout_ms` (30 s by default, `tools/src/proxy.rs`), plus a margin for a loaded
/// machine. Past it the proxy is killed and the schedule fails ("a drain ends").
const DRAIN_EXIT_MAX: std::time::Duration = std::time::Duration::from_secs(40);

/// How many times a stopped ZooKeeper is started before the run gives up (each try waits up to
/// 60 s for it to serve).
const ZK_RESTART_TRIES: usize = 3;

/// A running chaos cluster (see the module docs). Every process is stopped by pid on drop
/// (fields drop in order: processes, then disks, relays, ZooKeeper and the directory).
pub struct ChaosCluster {
    bookies: Vec<Option<Proc>>,
    /// `shape.proxies` proxies, then the slot of the extra proxy a [`Fault::JoinProxy`] starts
    /// (the clients do not list it; `revive` does not restart it).
    proxies: Vec<Option<Proc>>,
    /// Proxies sent SIGTERM (draining) and not yet seen to exit: slot, when.
    draining: Vec<(usize, std::time::Instant)>,
    autorecovery: Option<Proc>,
    /// Per bookie, its ledger and journal disks (when `shape.disks`).
    disks: Vec<(LoopMount, LoopMount)>,
    bookie_ports: Vec<u16>,
    bookie_front: Vec<TcpRelay>,
    bookie_zk: Vec<TcpRelay>,
    proxy_ports: Vec<u16>,
    proxy_zk: Vec<TcpRelay>,
    paused: Vec<String>,
    /// Pairwise cuts in force: (bookie whose relay cuts, the process it cuts). Applied again
    /// whenever a process restarts (a new pid).
    peer_cuts: Vec<(usize, Peer)>,
    /// Processes that failed to start again (each a violation of "writes resume after a fault
    /// heals" for the schedule; [`ChaosCluster::take_failures`] hands them over).
    failures: Vec<String>,
    pub shape: Shape,
    pub cluster: Cluster,
}

/// A process cut from a bookie by a pairwise partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    Proxy(usize),
    Bookie(usize),
}

fn relay_to(port: u16) -> TcpRelay {
    TcpRelay::start(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// Replaces the value after `flag` in `args`.
fn set_flag(args: &mut [String], flag: &str, value: String) {
    let i = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} in {args:?}"));
    args[i + 1] = value;
}

impl ChaosCluster {
    /// Starts ZooKeeper, `shape.bookies` bookies, `shape.proxies` proxies and an autorecovery
    /// daemon, with their relays, and waits until every bookie is registered.
    pub fn start(shape: Shape) -> ChaosCluster {
        let cluster = Cluster::start();
        let zk_port = cluster.zk.port();
        let bookie_ports: Vec<u16> = (0..shape.bookies)
            .map(|_| quire_testkit::free_port())
            .collect();
        let mut cc = ChaosCluster {
            bookie_front: bookie_ports.iter().map(|&p| relay_to(p)).collect(),
            bookie_zk: (0..shape.bookies).map(|_| relay_to(zk_port)).collect(),
            bookies: (0..shape.bookies).map(|_| None).collect(),
            bookie_ports,
            proxy_ports: (0..=shape.proxies)
                .map(|_| quire_testkit::free_port())
                .collect(),
            proxy_zk: (0..=shape.proxies).map(|_| relay_to(zk_port)).collect(),
            proxies: (0..=shape.proxies).map(|_| None).collect(),
            draining: Vec::new(),
            autorecovery: None,
            disks: Vec::new(),
            paused: Vec::new(),
            peer_cuts: Vec::new(),
            failures: Vec::new(),
            cluster,
            shape,
        };
        if shape.disks {
            cc.disks = (0..shape.bookies)
                .map(|i| {
                    let ledger = LoopMount::new_at(DISK_BYTES, &cc.cluster.ledger_dir(i));
                    let journal = LoopMount::new_at(DISK_BYTES, &cc.cluster.journal_dir(i));
                    (ledger, journal)
                })
                .collect();
        }
        for i in 0..shape.bookies {
            cc.bookies[i] = Some(cc.start_bookie(i));
        }
        for j in 0..shape.proxies {
            cc.proxies[j] = Some(cc.start_proxy(j));
        }
        cc.autorecovery = Some(cc.cluster.start_autorecovery(AUTORECOVERY_FLAGS));
        cc
    }

    fn start_bookie(&self, i: usize) -> Proc {
        let mut args = self.cluster.bookie_args(i, self.bookie_ports[i]);
        set_flag(&mut args, "--zookeeper", self.bookie_zk[i].connect_string());
        args.extend(["--advertised".into(), self.bookie_front[i].connect_string()]);
        let disk_flags = if self.shape.disks {
            DISK_FLAGS
        } else {
            quire_testkit::harness::HOST_DISK_FLAGS
        };
        args.extend(disk_flags.iter().map(|s| s.to_string()));
        Proc::start_env(&args, "quire bookie: ", &format!("bookie {i}"), None, &[])
    }

    fn start_proxy(&self, j: usize) -> Proc {
        let mut args: Vec<String> = vec![
            "proxy".into(),
            "--zookeeper".into(),
            self.proxy_zk[j].connect_string(),
            "--zk-root".into(),
            self.cluster.zk_root.clone(),
            "--zk-session-timeout-ms".into(),
            crate::schedule::SESSION_MS.to_string(),
            "--listen".into(),
            self.proxy_addr(j),
        ];
        args.extend(self.cluster.secret_flags());
        args.extend(QUORUM.iter().map(|s| s.to_string()));
        // Balanced ownership stays at its default (`[streams] balance_moves_per_sec` = 100):
        // a restarted or joining proxy takes its streams back while the other faults go on.
        let mut p = Proc::start_env(&args, "quire proxy: ", &format!("proxy {j}"), None, &[]);
        p.addr = self.proxy_addr(j);
        p
    }

    /// SIGKILL bookie `i`, empty its directories (mount points and `lost+found` stay), and
    /// delete its cookie once its registration has expired (up to 20 s).
    fn wipe(&mut self, i: usize) -> String {
        kill(&mut self.bookies[i]);
        for dir in [self.cluster.journal_dir(i), self.cluster.ledger_dir(i)] {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if entry.file_name() == "lost+found" {
                    continue;
                }
                let _ = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
            }
        }
        let id = self.bookie_front[i].connect_string();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let out = self.cluster.admin(&["bookie", "delete-cookie", &id]);
            if out.status.success() {
                return "SIGKILL sent, data wiped, cookie deleted".into();
            }
            if std::time::Instant::now() > deadline {
                return format!(
                    "SIGKILL sent, data wiped, cookie NOT deleted: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    }

    /// Starts bookie `i` again; a start that fails (the harness panics when the process is not
    /// ready within 60 s) is recorded as a failure, and the bookie left down for the next heal.
    fn restart_bookie(&mut self, i: usize) -> String {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.start_bookie(i))) {
            Ok(p) => {
                self.bookies[i] = Some(p);
                self.apply_peer_cuts();
                "restarted".into()
            }
            Err(e) => self.start_failed(&format!("bookie {i}"), &e),
        }
    }

    fn restart_proxy(&mut self, j: usize) -> String {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.start_proxy(j))) {
            Ok(p) => {
                self.proxies[j] = Some(p);
                self.apply_peer_cuts();
                "restarted".into()
            }
            Err(e) => self.start_failed(&format!("proxy {j}"), &e),
        }
    }

    /// Takes the failures recorded since the last call.
    pub fn take_failures(&mut self) -> Vec<String> {
        std::mem::take(&mut self.failures)
    }

    fn start_failed(&mut self, name: &str, panic: &Box<dyn std::any::Any + Send>) -> String {
        let why = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        self.failures
            .push(format!("{name} did not start again: {why}"));
        "did NOT start again (see the verdict)".into()
    }

    /// The filler file of bookie `i`'s ledger disk.
    fn filler(&self, i: usize) -> std::path::PathBuf {
        self.cluster.ledger_dir(i).join("chaos-filler")
    }

    /// Proxy `j`'s address (`127.0.0.1:port`), the same across its restarts.
    pub fn proxy_addr(&self, j: usize) -> String {
        format!("127.0.0.1:{}", self.proxy_ports[j])
    }

    /// Every proxy's address.
    pub fn proxy_addrs(&self) -> Vec<String> {
        (0..self.shape.proxies)
            .map(|j| self.proxy_addr(j))
            .collect()
    }

    /// The slot of the extra proxy a [`Fault::JoinProxy`] starts.
    fn joiner(&self) -> usize {
        self.shape.proxies
    }

    /// SIGTERM to proxy `j`: it drains (hands its streams over, finishes its writes, exits).
    fn terminate(&mut self, j: usize) -> String {
        let Some(p) = &self.proxies[j] else {
            return "not running; nothing to drain".into();
        };
        // SAFETY: kill(2) on our own child, not yet reaped (`await_exit` reaps it).
        unsafe {
            libc::kill(p.pid(), libc::SIGTERM);
        }
        self.draining.push((j, std::time::Instant::now()));
        "SIGTERM sent (draining)".into()
    }

    /// Proxy `j`'s line of `quire proxy list` cut to its owned streams (`owned_streams=N`):
    /// whether a joiner took a share, for the run's log.
    fn registry_share(&self, j: usize) -> String {
        let out = self.cluster.admin(&["proxy", "list"]);
        let text = String::from_utf8_lossy(&out.stdout);
        let me = format!("{} ", self.proxy_addr(j));
        text.lines()
            .find(|l| l.starts_with(&me))
            .and_then(|l| {
                l.split_whitespace()
                    .find(|w| w.starts_with("owned_streams="))
            })
            .map_or_else(
                || "not in the proxy registry".into(),
                |w| format!("registry: {w}"),
            )
    }

    /// Waits for draining proxy `j` to exit, at most [`DRAIN_EXIT_MAX`] from its SIGTERM, and
    /// empties its slot; a proxy still running then is killed and recorded as a failure (its
    /// drain is bounded by its own timeout). A proxy that was not draining: nothing to do.
    fn await_exit(&mut self, j: usize) -> String {
        let Some(k) = self.draining.iter().position(|(s, _)| *s == j) else {
            return "was not draining".into();
        };
        let (_, since) = self.draining.remove(k);
        let Some(mut p) = self.proxies[j].take() else {
            return "gone".into();
        };
        loop {
            if let Ok(Some(status)) = p.child.try_wait() {
                let secs = since.elapsed().as_secs_f64();
                return format!("drained: exited with {status} {secs:.2}s after SIGTERM");
            }
            if since.elapsed() > DRAIN_EXIT_MAX {
                let name = p.name.clone();
                p.kill();
                self.failures.push(format!(
                    "{name} did not exit within {DRAIN_EXIT_MAX:?} of SIGTERM (its drain is \
                     bounded by 30 s)"
                ));
                return "did NOT exit after SIGTERM; killed (see the verdict)".into();
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Starts `fault`; returns what was done, for the run's log.
    pub fn inject(&mut self, fault: Fault) -> String {
        match fault {
            Fault::DrainProxy(j) => self.terminate(j),
            Fault::JoinProxy => {
                let n = self.joiner();
                // The previous joiner's drain may still run past its planned end.
                let before = self.await_exit(n);
                let did = match self.restart_proxy(n) {
                    ok if ok == "restarted" => format!("started at {}", self.proxy_addr(n)),
                    failed => failed,
                };
                if before == "was not draining" {
                    did
                } else {
                    format!("{did} (the previous joiner {before})")
                }
            }
            Fault::KillBookie(i) => kill(&mut self.bookies[i]),
            Fault::KillProxy(j) => kill(&mut self.proxies[j]),
            Fault::PauseBookie(i) => pause(&self.bookies[i], &mut self.paused),
            Fault::PauseProxy(j) => pause(&self.proxies[j], &mut self.paused),
            Fault::IsolateBookie(i) => cut(&self.bookie_front[i]),
            Fault::PartitionBookieZk(i) => cut(&self.bookie_zk[i]),
            Fault::PartitionProxyZk(j) => cut(&self.proxy_zk[j]),
            Fault::SlowBookie(i, rate) => {
                self.bookie_front[i].throttle(Some(rate));
                "throttled".into()
            }
            Fault::RestartZooKeeper => {
                self.cluster.zk.crash();
                "SIGKILL sent".into()
            }
            Fault::FillDisk(i) => {
                fill_file(&self.filler(i));
                "filled".into()
            }
            Fault::WipeBookie(i) => self.wipe(i),
            Fault::CutProxyBookie(j, i) => self.cut_pair(i, Peer::Proxy(j)),
            Fault::CutBookieBookie(k, i) => self.cut_pair(i, Peer::Bookie(k)),
            Fault::OneWayBookie(i, dir) => {
                self.bookie_front[i].stall(dir, true);
                "held".into()
            }
            Fault::DelayBookie(i, ms) => {
                self.bookie_front[i].delay(Some(std::time::Duration::from_millis(ms)));
                "delaying".into()
            }
            Fault::LossyBookie(i, permille) => {
                self.bookie_front[i].lossy(Some(permille));
                "losing".into()
            }
        }
    }

    fn cut_pair(&mut self, bookie: usize, peer: Peer) -> String {
        self.peer_cuts.push((bookie, peer));
        self.apply_peer_cuts();
        match self.peer_pid(peer) {
            Some(pid) => format!("cut (pid {pid})"),
            None => "cut (the process is down now; cut when it is back)".into(),
        }
    }

    fn heal_pair(&mut self, bookie: usize, peer: Peer) -> String {
        self.peer_cuts.retain(|c| *c != (bookie, peer));
        self.apply_peer_cuts();
        "healed".into()
    }

    fn peer_pid(&self, peer: Peer) -> Option<u32> {
        let p = match peer {
            Peer::Proxy(j) => &self.proxies[j],
            Peer::Bookie(k) => &self.bookies[k],
        };
        p.as_ref().map(|p| p.pid() as u32)
    }

    /// Sets every bookie relay's cut processes from [`ChaosCluster::peer_cuts`] and the
    /// current pids.
    fn apply_peer_cuts(&self) {
        for (i, relay) in self.bookie_front.iter().enumerate() {
            let pids: Vec<u32> = self
                .peer_cuts
                .iter()
                .filter(|(b, _)| *b == i)
                .filter_map(|(_, peer)| self.peer_pid(*peer))
                .collect();
            relay.cut_from(&pids);
        }
    }

    /// Ends `fault`; returns what was done.
    pub fn heal(&mut self, fault: Fault) -> String {
        match fault {
            Fault::DrainProxy(j) => {
                let exit = self.await_exit(j);
                format!("{exit}; {}", self.restart_proxy(j))
            }
            Fault::JoinProxy => {
                let share = self.registry_share(self.joiner());
                format!("{share}; {}", self.terminate(self.joiner()))
            }
            Fault::KillBookie(i) | Fault::WipeBookie(i) => self.restart_bookie(i),
            Fault::KillProxy(j) => self.restart_proxy(j),
            Fault::PauseBookie(i) => resume(&self.bookies[i], &mut self.paused),
            Fault::PauseProxy(j) => resume(&self.proxies[j], &mut self.paused),
            Fault::IsolateBookie(i) | Fault::SlowBookie(i, _) => {
                self.bookie_front[i].throttle(None);
                self.bookie_front[i].heal();
                "healed".into()
            }
            Fault::PartitionBookieZk(i) => heal_relay(&self.bookie_zk[i]),
            Fault::PartitionProxyZk(j) => heal_relay(&self.proxy_zk[j]),
            Fault::RestartZooKeeper => self.restart_zookeeper(),
            Fault::FillDisk(i) => match std::fs::remove_file(self.filler(i)) {
                Ok(()) => "freed".into(),
                Err(e) => format!("no filler to remove: {e}"),
            },
            Fault::CutProxyBookie(j, i) => self.heal_pair(i, Peer::Proxy(j)),
            Fault::CutBookieBookie(k, i) => self.heal_pair(i, Peer::Bookie(k)),
            Fault::OneWayBookie(i, dir) => {
                self.bookie_front[i].stall(dir, false);
                "released".into()
            }
            Fault::DelayBookie(i, _) => {
                self.bookie_front[i].delay(None);
                "healed".into()
            }
            Fault::LossyBookie(i, _) => {
                self.bookie_front[i].lossy(None);
                "healed".into()
            }
        }
    }

    /// Heals everything still faulted (SIGCONT to paused processes, every relay healed and
    /// unthrottled, ZooKeeper started if down), then restarts every process that is not
    /// running: killed, or exited on its own (a proxy whose ZooKeeper session expired exits).
    /// Returns one line per process restarted, with the last lines it printed.
    pub fn heal_all(&mut self) -> Vec<String> {
        self.peer_cuts.clear();
        for r in self
            .bookie_front
            .iter()
            .chain(&self.bookie_zk)
            .chain(&self.proxy_zk)
        {
            r.heal_all();
        }
        for p in self.bookies.iter().chain(&self.proxies).flatten() {
            if self.paused.contains(&p.name) {
                p.resume();
            }
        }
        self.paused.clear();
        for i in 0..self.disks.len() {
            let _ = std::fs::remove_file(self.filler(i));
        }
        if self.cluster.zk.pid().is_none() {
            self.restart_zookeeper();
        }
        let mut lines = Vec::new();
        while let Some(&(j, _)) = self.draining.first() {
            lines.push(format!("proxy {j} {}", self.await_exit(j)));
        }
        lines.extend(self.revive());
        lines
    }

    /// Starts ZooKeeper again, up to [`ZK_RESTART_TRIES`] times: a JVM on a loaded machine can
    /// take longer than one 60 s start window, and a soak should not end on that.
    ///
    /// # Panics
    /// When no try serves: the cluster cannot go on without its metadata store.
    fn restart_zookeeper(&mut self) -> String {
        let mut failures = Vec::new();
        for _ in 0..ZK_RESTART_TRIES {
            match self.cluster.zk.try_restart() {
                Ok(()) if failures.is_empty() => return "restarted".into(),
                Ok(()) => return format!("restarted after {} failed tries", failures.len()),
                Err(e) => {
                    eprintln!("chaos: {e}");
                    failures.push(e);
                }
            }
        }
        panic!(
            "ZooKeeper did not restart in {ZK_RESTART_TRIES} tries; the last: {}",
            failures.last().map_or("", String::as_str)
        );
    }

    /// Restarts every bookie and proxy that is not running (killed, or exited on its own), one
    /// line each for what was found and done; empty when all run.
    pub fn revive(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        for i in 0..self.bookies.len() {
            if let Some(why) = exited(&mut self.bookies[i]) {
                let did = self.restart_bookie(i);
                lines.push(format!("bookie {i} was not running ({why}); {did}"));
            }
        }
        // Not the joiner: it comes and goes with its fault.
        for j in 0..self.shape.proxies {
            if let Some(why) = exited(&mut self.proxies[j]) {
                let did = self.restart_proxy(j);
                lines.push(format!("proxy {j} was not running ({why}); {did}"));
            }
        }
        if let Some(why) = exited(&mut self.autorecovery) {
            lines.push(format!("autorecovery was not running ({why}); restarted"));
            self.autorecovery = Some(self.cluster.start_autorecovery(AUTORECOVERY_FLAGS));
        }
        lines
    }

    /// Waits, up to `limit`, until the cluster is whole again: every process that exited
    /// (or was killed) since the heal is started again, every proxy accepts a TCP connection
    /// on its address, and `quire bookie list` shows every bookie registered. A proxy whose
    /// ZooKeeper session expired exits (DistributedLog's rule: an owner that lost its session
    /// must not keep serving its streams), and it may do so a few seconds *after* the heal,
    /// when its client gives up reconnecting (1.4 × the session timeout): so the wait restarts
    /// processes on every round, not once. Returns the lines of what was restarted.
    ///
    /// # Errors
    /// `cluster did not recover within {limit}` with what was still missing: a distinct outcome
    /// of a schedule (the read-back and the checker cannot judge a history without a cluster),
    /// not a history violation.
    pub fn wait_healthy(&mut self, limit: std::time::Duration) -> Result<Vec<String>, String> {
        let deadline = std::time::Instant::now() + limit;
        let mut lines = Vec::new();
        loop {
            lines.extend(self.revive());
            let missing = self.missing();
            if missing.is_empty() {
                return Ok(lines);
            }
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "cluster did not recover within {limit:?}: {}",
                    missing.join("; ")
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    }

    /// What keeps the cluster from being whole: proxies that refuse connections, bookies not
    /// registered (empty when it is whole).
    fn missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        for j in 0..self.shape.proxies {
            let addr: SocketAddr = match self.proxy_addr(j).parse() {
                Ok(a) => a,
                Err(e) => {
                    missing.push(format!("proxy {j}: bad address: {e}"));
                    continue;
                }
            };
            let timeout = std::time::Duration::from_secs(1);
            if let Err(e) = std::net::TcpStream::connect_timeout(&addr, timeout) {
                missing.push(format!("proxy {j} at {addr} refuses connections: {e}"));
            }
        }
        let want = format!("{} bookies registered", self.shape.bookies);
        let out = self.cluster.admin(&["bookie", "list"]);
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !text.contains(&want) {
            missing.push(format!(
                "not every bookie registered: {}{}",
                text.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        missing
    }

    /// Waits (up to 60 s) until `quire bookie list` shows every bookie registered.
    ///
    /// # Errors
    /// The last listing when they never were.
    pub fn wait_registered(&self) -> Result<(), String> {
        let want = format!("{} bookies registered", self.shape.bookies);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let out = self.cluster.admin(&["bookie", "list"]);
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            if out.status.success() && text.contains(&want) {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(format!("bookies not all registered after 60 s: {text}"));
            }
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    }

    /// The last `n` lines each process printed on stderr (its warnings and errors), for a
    /// violation's write-up.
    pub fn log_tails(&self, n: usize) -> String {
        let mut out = String::new();
        let procs = self.bookies.iter().chain(&self.proxies);
        for p in procs.chain(std::iter::once(&self.autorecovery)).flatten() {
            let text = p.stderr.lock().map(|s| s.clone()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            for l in &lines[lines.len().saturating_sub(n)..] {
                out.push_str(&format!("[{}] {l}\n", p.name));
            }
        }
        out
    }
}

fn kill(p: &mut Option<Proc>) -> String {
    match p.take() {
        Some(p) => {
            p.kill();
            "SIGKILL sent".into()
        }
        None => "not running; nothing to kill".into(),
    }
}

// An exited process is a zombie until `exited` reaps it, so its pid is still ours to signal.
fn pause(p: &Option<Proc>, paused: &mut Vec<String>) -> String {
    match p {
        Some(p) => {
            p.pause();
            paused.push(p.name.clone());
            "SIGSTOP sent".into()
        }
        _ => "not running; nothing to pause".into(),
    }
}

fn resume(p: &Option<Proc>, paused: &mut Vec<String>) -> String {
    match p {
        Some(p) if paused.contains(&p.name) => {
            paused.retain(|n| n != &p.name);
            p.resume();
            "SIGCONT sent".into()
        }
        _ => "was not paused".into(),
    }
}

fn cut(r: &TcpRelay) -> String {
    r.cut();
    "cut".into()
}

fn heal_relay(r: &TcpRelay) -> String {
    r.heal();
    "healed".into()
}

/// Whether the process is gone (never started, killed, or exited): why, else `None`.
fn exited(p: &mut Option<Proc>) -> Option<String> {
    match p {
        None => Some("killed".into()),
        Some(proc) => match proc.child.try_wait() {
            Ok(Some(status)) => {
                let text = proc.stderr.lock().map(|s| s.clone()).unwrap_or_default();
                let last = text.lines().last().unwrap_or("").to_string();
                Some(format!("exited with {status}; last line: {last}"))
            }
            _ => None,
        },
    }
}

//! Test-only helpers shared by Quire's crates: a real, standalone ZooKeeper server, and a
//! loopback TCP relay a test can cut ([`TcpRelay`]) to make a ZooKeeper session expire, a small
//! loop-mounted ext4 filesystem for full-disk tests ([`loop_mount::LoopMount`], needs root), the
//! disk-use checks of data-lifecycle tests ([`reclaim`]: entry-log bytes, GC tombstones, the
//! wait until bookies reclaimed deleted ledgers), the Loghub samples of real system logs
//! ([`loghub`]), the history checker for logs ([`history`]: lost, duplicated and phantom records,
//! gaps and inversions in readers' views), with the `bookies` feature real one-shard bookies registered in a metadata
//! store, and with the `harness` feature the process harness of the `quire` binary
//! (`harness`: a cluster of child processes or a sandbox, the CLI, the post-run checker).
//!
//! Use it as a dev-dependency (`quire-testkit.workspace = true` under `[dev-dependencies]`):
//!
//! ```no_run
//! let zk = quire_testkit::ZooKeeperServer::start();
//! let connect = zk.connect_string(); // "127.0.0.1:<port>"
//! // ... run the test against `connect` ...
//! zk.stop(); // or just drop it
//! ```
//!
//! The server is the Debian package's `org.apache.zookeeper.server.quorum.QuorumPeerMain`
//! (`/usr/share/java/zookeeper.jar`; `.ci/run` installs the `zookeeper` package), started with
//! plain `java` (never `zkServer.sh`, which always logs to `/var/log/zookeeper`) on a free
//! 127.0.0.1 port with its data and logs in a fresh temporary directory, and stopped by its pid.
//! Each start costs roughly 1–2 s, so share one server between the steps of a test where the
//! steps do not interfere (use distinct root paths).

#[cfg(feature = "bookies")]
pub mod bookies;
pub mod cluster_secret;
#[cfg(feature = "harness")]
pub mod harness;
pub mod history;
pub mod loghub;
pub mod loop_mount;
pub mod reclaim;
pub mod relay;

pub use relay::TcpRelay;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The class path of the Debian `zookeeper` package's server.
pub const ZOOKEEPER_CLASSPATH: &str =
    "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar";
/// The package's example log4j configuration (logs go to `zookeeper.log.dir`).
const LOG4J_CONFIG: &str = "/etc/zookeeper/conf_example/log4j.properties";
/// How long `start` waits for the server to become ready.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `stop` waits after SIGTERM before it sends SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A standalone ZooKeeper server process, killed (SIGTERM, then SIGKILL after 10 s) and reaped
/// when stopped or dropped. Its temporary directory is removed afterwards.
#[derive(Debug)]
pub struct ZooKeeperServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl ZooKeeperServer {
    /// Starts a server on a free port of 127.0.0.1 with `tickTime=2000` (so negotiated session
    /// timeouts range from 4 s to 40 s) and waits until it answers `ruok` with `imok` and `srvr`
    /// reports its mode (it is serving requests).
    ///
    /// # Panics
    /// This is a test helper: it panics with a clear message when the package is not installed,
    /// java cannot be started, or the server does not become ready within 60 s (the panic
    /// includes the tail of the server's log).
    pub fn start() -> ZooKeeperServer {
        assert!(
            Path::new("/usr/share/java/zookeeper.jar").exists(),
            "ZooKeeper is not installed: run `apt-get install -y --no-install-recommends zookeeper` (see .ci/run)"
        );
        let dir = tempfile::Builder::new()
            .prefix("quire-zk-")
            .tempdir()
            .expect("create ZooKeeper temp dir");
        let data = dir.path().join("data");
        let log = dir.path().join("log");
        std::fs::create_dir_all(&data).expect("create ZooKeeper data dir");
        std::fs::create_dir_all(&log).expect("create ZooKeeper log dir");
        // Bind-then-release can race with another process taking the port; retry a few times.
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = free_port();
            let mut child = spawn_zookeeper(dir.path(), port);
            match wait_ready(&mut child, port) {
                Ok(()) => {
                    return ZooKeeperServer {
                        child: Some(child),
                        port,
                        dir,
                    }
                }
                Err(e) => {
                    last_error = format!("{e}\n--- server log tail ---\n{}", log_tail(dir.path()));
                    kill_and_wait(child);
                }
            }
        }
        panic!("ZooKeeper did not start: {last_error}");
    }

    /// The client connect string, `127.0.0.1:<port>`.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The client port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server's temporary directory (`zoo.cfg`, `data/`, `log/`).
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// Sends a four-letter-word command (`ruok`, `srvr`, `mntr`, `stat`) and returns the reply.
    ///
    /// # Errors
    /// The I/O error of the connection.
    pub fn four_letter_word(&self, cmd: &str) -> std::io::Result<String> {
        four_letter_word(self.port, cmd)
    }

    /// Stops the server: SIGTERM to its pid, wait for it to exit, SIGKILL after 10 s.
    pub fn stop(mut self) {
        self.kill_and_wait();
    }

    /// SIGKILL to the server and reap it (a crash: no shutdown path runs); its data directory
    /// and port are kept for [`ZooKeeperServer::restart`]. Nothing when it is not running.
    pub fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port with the same data directory (its sessions and
    /// znodes come back from its snapshot and transaction log, as after a restart of a real
    /// ensemble member) and waits until it serves; crashes it first if it runs.
    ///
    /// # Panics
    /// When it does not become ready within 60 s (the port was taken meanwhile, java failed).
    pub fn restart(&mut self) {
        if let Err(e) = self.try_restart() {
            panic!("{e}");
        }
    }

    /// [`ZooKeeperServer::restart`] that returns its failure instead of panicking, for callers
    /// that can try again (a soak on a loaded machine, where a JVM can take over a minute).
    ///
    /// # Errors
    /// Why the server did not become ready within 60 s, with the tail of its logs; it is then
    /// stopped, and a later call starts it afresh.
    pub fn try_restart(&mut self) -> Result<(), String> {
        self.crash();
        let mut child = spawn_zookeeper(self.dir.path(), self.port);
        if let Err(e) = wait_ready(&mut child, self.port) {
            kill_and_wait(child);
            return Err(format!(
                "ZooKeeper did not restart: {e}\n--- server log tail ---\n{}",
                log_tail(self.dir.path())
            ));
        }
        self.child = Some(child);
        Ok(())
    }

    fn kill_and_wait(&mut self) {
        if let Some(child) = self.child.take() {
            kill_and_wait(child);
        }
    }
}

/// Writes `zoo.cfg` for 127.0.0.1:`port` in `dir` (data in `dir/data`, logs in `dir/log`) and
/// starts the server on it.
fn spawn_zookeeper(dir: &Path, port: u16) -> Child {
    let data = dir.join("data");
    let log = dir.join("log");
    let cfg = dir.join("zoo.cfg");
    std::fs::write(
        &cfg,
        format!(
            "tickTime=2000\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
             admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,mntr,stat\nmaxClientCnxns=0\n",
            data.display()
        ),
    )
    .expect("write zoo.cfg");
    let stdout = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log.join("stdout"))
        .expect("open ZooKeeper stdout file");
    let stderr = stdout.try_clone().expect("clone ZooKeeper stdout file");
    Command::new("java")
        .arg("-Xms64m")
        .arg("-Xmx256m")
        .arg("-XX:+UseSerialGC")
        .arg(format!("-Dzookeeper.log.dir={}", log.display()))
        .arg("-Dzookeeper.root.logger=INFO,ROLLINGFILE")
        .arg(format!("-Dlog4j.configuration=file:{LOG4J_CONFIG}"))
        .arg("-cp")
        .arg(ZOOKEEPER_CLASSPATH)
        .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
        .arg(&cfg)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .expect("start java (is a JRE installed?)")
}

/// Polls until `ruok` answers `imok` and `srvr` reports a mode, the child exits, or 60 s pass.
fn wait_ready(child: &mut Child, port: u16) -> Result<(), String> {
    let deadline = quire_clock::now() + START_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("java exited early with {status}"));
        }
        // `ruok` answers `imok` as soon as the port is open; `srvr` reports a mode only once the
        // server is serving requests.
        if matches!(four_letter_word(port, "ruok").as_deref(), Ok("imok"))
            && four_letter_word(port, "srvr").is_ok_and(|s| s.contains("Mode: "))
        {
            return Ok(());
        }
        if quire_clock::now() > deadline {
            return Err(format!(
                "no `imok` from port {port} within {START_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last 20 lines of the server's stdout and log file, for failure messages.
fn log_tail(dir: &Path) -> String {
    let mut out = String::new();
    for name in ["stdout", "zookeeper.log"] {
        if let Ok(text) = std::fs::read_to_string(dir.join("log").join(name)) {
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&lines[lines.len().saturating_sub(20)..].join("\n"));
            out.push('\n');
        }
    }
    out
}

/// SIGTERM to the child's pid, wait for it to exit, SIGKILL after 10 s; always reaps it.
fn kill_and_wait(mut child: Child) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) on the pid of our own child, which is not reaped yet (so the pid is ours).
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let deadline = quire_clock::now() + STOP_GRACE;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return,
            Ok(None) if quire_clock::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
        }
    }
}

impl Drop for ZooKeeperServer {
    fn drop(&mut self) {
        self.kill_and_wait();
    }
}

/// Sends a four-letter-word command to a ZooKeeper server on 127.0.0.1:`port`.
///
/// # Errors
/// The I/O error of the connection (e.g. refused while the server starts).
pub fn four_letter_word(port: u16, cmd: &str) -> std::io::Result<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(cmd.as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// A port on 127.0.0.1 that is free now and that this process has not handed out before.
///
/// Ports come from below the kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`,
/// 32768–60999 by default), never from port 0: a port the kernel picked for a listener is one it
/// may give, after the listener closes, to any outgoing connection (a ZooKeeper client, a bookie
/// connecting to another) before the process meant to listen on it starts, and that process then
/// fails with `EADDRINUSE`. Below the range only explicit binds take ports. A process-wide counter,
/// started at an offset derived from the pid, keeps tests of one binary (and, mostly, of
/// concurrent binaries) apart; each candidate is checked by binding it.
///
/// # Panics
/// When no port of the window can be bound.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let (lo, hi) = explicit_port_window();
    let len = u32::from(hi - lo);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % len,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..len {
        let i = NEXT.fetch_add(1, Ordering::Relaxed) % len;
        let port = lo + u16::try_from(i).expect("window below 65536");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 127.0.0.1:{lo}..{hi}");
}

/// The ports [`free_port`] hands out: 10000 up to the start of the ephemeral range, or from its
/// end up to 65535 when the range starts too low to leave room below it.
fn explicit_port_window() -> (u16, u16) {
    let range =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut it = range
        .split_whitespace()
        .filter_map(|s| s.parse::<u16>().ok());
    let (first, last) = (it.next().unwrap_or(32768), it.next().unwrap_or(60999));
    if first >= 12_000 {
        (10_000, first)
    } else {
        (last.saturating_add(1).max(1025), 65_535)
    }
}

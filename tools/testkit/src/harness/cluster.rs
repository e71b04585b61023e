//! A multi-process cluster for tests: a real ZooKeeper (quire-testkit), `quire bookie` and
//! `quire proxy` child processes on 127.0.0.1 with free ports, real O_DIRECT directories in a
//! temporary directory, and real signals (SIGKILL, SIGSTOP, SIGCONT, SIGTERM).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{quire_bin, temp_dir};

/// ZooKeeper session timeout used by cluster tests, in milliseconds: the shortest the test
/// server allows (2 × tickTime), so that session expiry scenarios stay short.
pub const SESSION_TIMEOUT_MS: u64 = 4000;

/// The tokio runtime the cluster tests' clients run on (two workers).
#[allow(dead_code)] // not every test binary that includes this module uses it
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A ZooKeeper server plus a data directory and a root path for one cluster.
pub struct Cluster {
    pub zk: crate::ZooKeeperServer,
    pub zk_root: String,
    pub dir: tempfile::TempDir,
    /// The cluster secret file every bookie, proxy, autorecovery daemon and admin command of
    /// this cluster is given (`--cluster-secret-file`).
    pub secret_file: PathBuf,
    /// Its value, for ledger clients made in the test.
    pub secret: crate::cluster_secret::ClusterSecret,
}

impl Cluster {
    /// A metadata-store session on this cluster's ZooKeeper and root (call inside a runtime).
    #[allow(dead_code)] // not every test binary that includes this module uses it
    pub async fn zk_store(&self) -> quire_metadata::ZkStore {
        quire_metadata::ZkStore::connect(
            &self.zookeeper(),
            &self.zk_root,
            Duration::from_millis(SESSION_TIMEOUT_MS),
        )
        .await
        .unwrap()
    }

    /// Starts ZooKeeper; no bookie or proxy yet.
    pub fn start() -> Cluster {
        let dir = temp_dir();
        let secret = *super::test_cluster_secret();
        let secret_file = crate::cluster_secret::write_cluster_secret(dir.path(), &secret);
        Cluster {
            zk: crate::ZooKeeperServer::start(),
            zk_root: "/quire-test".into(),
            dir,
            secret_file,
            secret,
        }
    }

    /// `--cluster-secret-file` and this cluster's secret file.
    pub fn secret_flags(&self) -> Vec<String> {
        crate::cluster_secret::cluster_secret_flags(&self.secret_file).to_vec()
    }

    /// The ZooKeeper connect string.
    pub fn zookeeper(&self) -> String {
        self.zk.connect_string()
    }

    /// Bookie `i`'s journal directory.
    pub fn journal_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("bookie-{i}/journal"))
    }

    /// Bookie `i`'s ledger directory.
    pub fn ledger_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("bookie-{i}/ledgers"))
    }

    /// The flags of bookie `i` listening on `port`.
    pub fn bookie_args(&self, i: usize, port: u16) -> Vec<String> {
        vec![
            "bookie".into(),
            "--zookeeper".into(),
            self.zookeeper(),
            "--zk-root".into(),
            self.zk_root.clone(),
            "--zk-session-timeout-ms".into(),
            SESSION_TIMEOUT_MS.to_string(),
            "--journal-dir".into(),
            self.journal_dir(i).display().to_string(),
            "--ledger-dir".into(),
            self.ledger_dir(i).display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--shards".into(),
            "1".into(),
            "--io-memory-bytes".into(),
            "1048576".into(),
            "--journal-file-size-bytes".into(),
            "4194304".into(),
            "--cluster-secret-file".into(),
            self.secret_file.display().to_string(),
        ]
    }

    /// Starts bookie `i` on `port` (use [`crate::free_port`] for a new one) and waits
    /// until it serves and is registered.
    pub fn start_bookie(&self, i: usize, port: u16) -> Proc {
        self.start_bookie_with(i, port, &[])
    }

    /// Like [`Cluster::start_bookie`], with `extra` flags after the usual ones (and after
    /// [`super::HOST_DISK_FLAGS`] unless `extra` sets a disk usage threshold).
    pub fn start_bookie_with(&self, i: usize, port: u16, extra: &[&str]) -> Proc {
        self.start_bookie_logging(i, port, extra, None)
    }

    /// Like [`Cluster::start_bookie_with`], with `log` as the bookie's `QUIRE_LOG` filter
    /// (`None`: the test's own `QUIRE_LOG`, else `warn`).
    pub fn start_bookie_logging(
        &self,
        i: usize,
        port: u16,
        extra: &[&str],
        log: Option<&str>,
    ) -> Proc {
        self.start_bookie_full(i, port, extra, log, &[])
    }

    /// [`Cluster::start_bookie_with`] with `env` added to the process's environment (e.g.
    /// `QUIRE_FAULT_POINTS`, docs/fault-points.md).
    #[allow(dead_code)] // not every test binary that includes this module uses it
    pub fn start_bookie_env(
        &self,
        i: usize,
        port: u16,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Proc {
        self.start_bookie_full(i, port, extra, None, env)
    }

    fn start_bookie_full(
        &self,
        i: usize,
        port: u16,
        extra: &[&str],
        log: Option<&str>,
        env: &[(&str, &str)],
    ) -> Proc {
        let mut args = self.bookie_args(i, port);
        args.extend(
            super::with_host_disk_flags(extra)
                .iter()
                .map(|s| s.to_string()),
        );
        Proc::start_env(&args, "quire bookie: ", &format!("bookie {i}"), log, env)
    }

    /// Runs bookie `i` expecting it to refuse to start; returns its output.
    pub fn bookie_refuses(&self, i: usize, port: u16) -> Output {
        let out = run(&self.bookie_args(i, port));
        assert!(
            !out.status.success(),
            "bookie {i} should have refused to start"
        );
        out
    }

    /// Starts a proxy on `port` with `extra` flags and waits for its listening line.
    pub fn start_proxy(&self, port: u16, extra: &[&str]) -> Proc {
        self.start_proxy_env(port, extra, &[])
    }

    /// [`Cluster::start_proxy`] with `env` added to the process's environment (for example
    /// libfaketime's `LD_PRELOAD` and `FAKETIME`).
    pub fn start_proxy_env(&self, port: u16, extra: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut args: Vec<String> = vec![
            "proxy".into(),
            "--zookeeper".into(),
            self.zookeeper(),
            "--zk-root".into(),
            self.zk_root.clone(),
            "--zk-session-timeout-ms".into(),
            SESSION_TIMEOUT_MS.to_string(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--cluster-secret-file".into(),
            self.secret_file.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut p = Proc::start_env(&args, "quire proxy: ", &format!("proxy :{port}"), None, env);
        p.addr = format!("127.0.0.1:{port}");
        p
    }

    /// [`Cluster::start_proxy`] on a free port writing E=3 Qw=3 Qa=2 ledgers (the quorum most
    /// cluster tests use), with `extra` flags after.
    #[allow(dead_code)] // not every test binary that includes this module uses it
    pub fn start_proxy_e3(&self, extra: &[&str]) -> Proc {
        let mut flags = vec![
            "--ensemble-size",
            "3",
            "--write-quorum",
            "3",
            "--ack-quorum",
            "2",
        ];
        flags.extend_from_slice(extra);
        self.start_proxy(crate::free_port(), &flags)
    }

    /// Starts a standalone autorecovery daemon (`quire autorecovery`) with `extra` flags and
    /// waits for its running line.
    #[allow(dead_code)] // not every test binary that includes this module uses it
    pub fn start_autorecovery(&self, extra: &[&str]) -> Proc {
        let mut args: Vec<String> = vec![
            "autorecovery".into(),
            "--zookeeper".into(),
            self.zookeeper(),
            "--zk-root".into(),
            self.zk_root.clone(),
            "--zk-session-timeout-ms".into(),
            SESSION_TIMEOUT_MS.to_string(),
            "--cluster-secret-file".into(),
            self.secret_file.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        Proc::start(&args, "quire autorecovery: ", "autorecovery")
    }

    /// Runs an admin command (`quire ARGS --zookeeper .. --zk-root ..`).
    pub fn admin(&self, args: &[&str]) -> Output {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend([
            "--zookeeper".into(),
            self.zookeeper(),
            "--zk-root".into(),
            self.zk_root.clone(),
        ]);
        // Admin commands that talk to bookies (`ledger recover`) read the secret from here.
        run_env(
            &all,
            &[(
                "QUIRE_CLUSTER_SECRET_FILE",
                &self.secret_file.display().to_string(),
            )],
        )
    }

    /// Like [`Cluster::admin`], asserting success and returning stdout as text.
    pub fn admin_ok(&self, args: &[&str]) -> String {
        let out = self.admin(args);
        assert!(
            out.status.success(),
            "quire {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf8 output")
    }

    /// Runs a stream admin command (`quire ARGS --proxy PROXY`; stream admin goes through a
    /// proxy), asserting success and returning stdout as text.
    pub fn stream_admin_ok(&self, proxy: &str, args: &[&str]) -> String {
        let out = super::run_quire(args, proxy, None);
        assert!(
            out.status.success(),
            "quire {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf8 output")
    }

    /// Waits (up to 60 s) until `quire bookie list` satisfies `pred`; returns the listing.
    pub fn wait_bookies(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let list = self.admin_ok(&["bookie", "list"]);
            if pred(&list) {
                return list;
            }
            assert!(
                Instant::now() < deadline,
                "bookie list never showed {what}: {list}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A bound for [`wait_proxy_views`] (each of its two waits): 30 balancer ticks of 1 s, room
/// for a loaded machine.
pub const PROXY_VIEWS_MAX: Duration = Duration::from_secs(30);

/// Waits until `store`'s proxy registry lists exactly `addrs` (in any order), then until each
/// of them has read the registry after that listing. The proof is the heartbeat counter: a
/// proxy's balancer tick writes its record (heartbeat `n`) and then reads the registry into
/// its view, so with `h` the heartbeat first read here after the listing, the tick that
/// wrote `h + 1` read the registry after the listing, and a heartbeat of `h + 2` means that
/// view was applied (the same rule as the drain's `await_views` in
/// proxy/src/stream/balance.rs). Polls every 100 ms.
///
/// # Panics
/// When the registry does not list exactly `addrs` within `max`, or a proxy's heartbeat has
/// not moved two past its first reading within `max` after that (a proxy whose balancer
/// stalled, or that left the registry meanwhile); the message names the proxies and their
/// heartbeats.
pub async fn wait_proxy_views(
    store: &dyn quire_metadata::MetadataStore,
    addrs: &[&str],
    max: Duration,
) {
    let mut want: Vec<&str> = addrs.to_vec();
    want.sort_unstable();
    let deadline = Instant::now() + max;
    let mut first = loop {
        let list = store.list_proxies().await.expect("read the proxy registry");
        let mut listed: Vec<&str> = list.iter().map(|p| p.address.as_str()).collect();
        listed.sort_unstable();
        if listed == want {
            break list
                .iter()
                .map(|p| (p.address.clone(), p.heartbeat))
                .collect::<Vec<_>>();
        }
        assert!(
            Instant::now() < deadline,
            "the proxy registry never listed exactly {want:?} within {max:?}; last: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    first.sort_unstable();
    let deadline = Instant::now() + max;
    loop {
        let list = store.list_proxies().await.expect("read the proxy registry");
        let behind: Vec<(String, u64, Option<u64>)> = first
            .iter()
            .filter_map(|(addr, h)| {
                let now = list
                    .iter()
                    .find(|p| &p.address == addr)
                    .map(|p| p.heartbeat);
                (now.unwrap_or(0) < h + 2).then(|| (addr.clone(), *h, now))
            })
            .collect();
        if behind.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "proxies did not read the registry within {max:?} after it listed {want:?}: \
             (address, first heartbeat, heartbeat now or none if gone) {behind:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the `quire` binary to completion.
pub fn run(args: &[String]) -> Output {
    run_env(args, &[])
}

/// [`run`] with `env` added to the process's environment.
pub fn run_env(args: &[String], env: &[(&str, &str)]) -> Output {
    Command::new(quire_bin())
        .args(args)
        .env_remove("QUIRE_ZOOKEEPER")
        .env_remove("QUIRE_ZK_ROOT")
        .env_remove("QUIRE_CLUSTER_SECRET_FILE")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run quire")
}

/// A `quire bookie` or `quire proxy` child process. Killed and reaped on drop.
pub struct Proc {
    pub child: Child,
    pub name: String,
    /// The proxy's address (empty for bookies).
    pub addr: String,
    /// Everything it printed on stderr so far.
    pub stderr: Arc<Mutex<String>>,
    /// The thread copying stderr into `stderr`; it ends at the pipe's EOF, after the exit.
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

impl Proc {
    /// Whether `needle` appears in what the process printed on stderr within `timeout`: the
    /// reader thread copies lines a moment after the process wrote them, so a test that has
    /// seen an effect (a registration in ZooKeeper) waits for the line that goes with it.
    pub fn stderr_shows(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.stderr.lock().unwrap().contains(needle) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn start(args: &[String], ready_prefix: &str, name: &str) -> Proc {
        Self::start_logging(args, ready_prefix, name, None)
    }

    fn start_logging(args: &[String], ready_prefix: &str, name: &str, log: Option<&str>) -> Proc {
        Self::start_env(args, ready_prefix, name, log, &[])
    }

    /// Starts `quire ARGS` with `env` added (and `QUIRE_LOG` = `log`, else the caller's
    /// `QUIRE_LOG`, else `warn`), copies its stderr into [`Proc::stderr`] (each line also
    /// echoed with `[name]` in front), and waits (up to 60 s) for a stdout line starting with
    /// `ready_prefix` (`"quire bookie: "`, `"quire proxy: "`, `"quire autorecovery: "`).
    /// For processes whose flags the `Cluster` methods do not build (e.g. a bookie that reaches
    /// ZooKeeper through a relay).
    ///
    /// # Panics
    /// When the binary cannot be spawned or the process is not ready within 60 s.
    pub fn start_env(
        args: &[String],
        ready_prefix: &str,
        name: &str,
        log: Option<&str>,
        env: &[(&str, &str)],
    ) -> Proc {
        let log = log.map_or_else(
            || std::env::var("QUIRE_LOG").unwrap_or_else(|_| "warn".into()),
            str::to_string,
        );
        let mut child = Command::new(quire_bin())
            .args(args)
            .env("QUIRE_LOG", log)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn quire");
        let stdout = child.stdout.take().expect("stdout");
        let stderr_pipe = child.stderr.take().expect("stderr");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let tag = name.to_string();
        let stderr_reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr_pipe).lines() {
                let Ok(line) = line else { break };
                eprintln!("[{tag}] {line}");
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let prefix = ready_prefix.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.starts_with(&prefix) {
                    let _ = tx.send(line);
                }
            }
        });
        let mut p = Proc {
            child,
            name: name.to_string(),
            addr: String::new(),
            stderr,
            stderr_reader: Some(stderr_reader),
        };
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(_) => p,
            Err(_) => {
                let status = p.child.try_wait().ok().flatten();
                let _ = p.child.kill();
                panic!(
                    "{name} did not become ready within 60 s (exit {status:?}): {}",
                    p.stderr.lock().unwrap()
                );
            }
        }
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own, not yet reaped child.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(rc, 0, "kill({}, {sig})", self.name);
    }

    /// Waits for the process to exit, then for its stderr reader to reach EOF, so that
    /// `stderr` holds every line the process printed (`child.wait()` alone can return while
    /// the reader thread still has the last lines to copy).
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let status = self.child.wait().expect("wait");
        if let Some(reader) = self.stderr_reader.take() {
            let _ = reader.join();
        }
        status
    }

    /// SIGKILL and reap: no shutdown path runs.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// SIGSTOP: the process freezes (its ZooKeeper session goes unheard).
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// SIGTERM, then wait (up to 30 s) for a successful exit.
    pub fn stop(mut self) {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                assert!(
                    status.success(),
                    "{} exited with {status}: {}",
                    self.name,
                    self.stderr.lock().unwrap()
                );
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not stop within 30 s of SIGTERM",
                self.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // Already exited (and now reaped): its pid may be reused, so send nothing.
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // SIGCONT first, in case a test left it stopped.
        // SAFETY: kill(2) on our own child, reaped only below.
        unsafe {
            libc::kill(self.pid(), libc::SIGCONT);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `path` exists and holds nothing.
pub fn is_empty_dir(path: &Path) -> bool {
    std::fs::read_dir(path)
        .map(|mut d| d.next().is_none())
        .unwrap_or(false)
}

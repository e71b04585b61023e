//! A `quire sandbox` child process: the embedded metadata store, bookies and a proxy in one
//! process, on a free loopback port.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{quire_bin, run_quire, with_host_disk_flags};

/// A running `quire sandbox` child.
pub struct Sandbox {
    pub child: Child,
    pub addr: String,
    pub data_dir: PathBuf,
    /// `host:port` of the metrics endpoint, when started with `--metrics-listen`.
    pub metrics_addr: Option<String>,
}

/// Sandbox flags used by tests: small segments so that streams span several of them, small
/// journal files so that they roll.
pub const SMALL_SEGMENTS: &[&str] = &[
    "--segment-size-bytes",
    "65536",
    "--entry-size-bytes",
    "16384",
    "--journal-file-size-bytes",
    "4194304",
];

impl Sandbox {
    /// Starts a sandbox on `data_dir` with a free proxy port and waits for its address line.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Sandbox {
        Self::start_env(data_dir, extra, &[])
    }

    /// [`Sandbox::start`] with `env` added to the process's environment (e.g.
    /// `QUIRE_FAULT_POINTS`, docs/fault-points.md).
    pub fn start_env(data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Sandbox {
        let mut child = Self::command(data_dir, extra, env)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn quire sandbox");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        let (metrics_tx, metrics_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.strip_prefix("quire sandbox: proxy listening on ") {
                    let _ = tx.send(addr.trim().to_string());
                }
                if let Some(url) = line.strip_prefix("quire sandbox: metrics on http://") {
                    let _ = metrics_tx.send(url.trim().trim_end_matches("/metrics").to_string());
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(a) => break a,
                Err(_) => {
                    if let Some(status) = child.try_wait().expect("try_wait") {
                        panic!(
                            "sandbox on {} exited with {status} before printing its address",
                            data_dir.display()
                        );
                    }
                    if Instant::now() > deadline {
                        let _ = child.kill();
                        panic!(
                            "sandbox on {} did not print its address within 60 s",
                            data_dir.display()
                        );
                    }
                }
            }
        };
        // Printed before the proxy's line, so it is there by now if it is printed at all.
        let metrics_addr = metrics_rx.try_recv().ok();
        Sandbox {
            child,
            addr,
            data_dir: data_dir.to_path_buf(),
            metrics_addr,
        }
    }

    /// The `quire sandbox` command on `data_dir` (a free proxy port) with `extra` flags and
    /// `env` added.
    pub fn command(data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Command {
        let mut c = Command::new(quire_bin());
        c.arg("sandbox")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0"])
            .args(with_host_disk_flags(extra))
            .envs(env.iter().copied());
        c
    }

    /// Waits (up to `max`) for the sandbox to exit by itself, e.g. at an armed crash point;
    /// its exit status, or `None` (then it is SIGKILLed and reaped) when it still runs.
    pub fn wait_exit(mut self, max: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + max;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() > deadline {
                self.child.kill().expect("SIGKILL sandbox");
                self.child.wait().expect("reap sandbox");
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `quire ARGS --proxy ADDR` and returns its output.
    pub fn quire(&self, args: &[&str]) -> Output {
        run_quire(args, &self.addr, None)
    }

    /// Runs `quire ARGS --proxy ADDR` with `stdin` fed in.
    pub fn quire_stdin(&self, args: &[&str], stdin: &[u8]) -> Output {
        run_quire(args, &self.addr, Some(stdin))
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL sandbox");
        self.child.wait().expect("reap sandbox");
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn stop(mut self) {
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        assert_eq!(rc, 0, "SIGTERM");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                assert!(status.success(), "sandbox exited with {status}");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sandbox did not stop within 30 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

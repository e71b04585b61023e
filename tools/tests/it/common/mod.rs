//! Shared helpers for tests that drive the real `quire` binary: a sandbox child process on
//! loopback with real O_DIRECT files in a temporary directory.

#![allow(dead_code)]

pub mod checker;
pub mod cluster;
pub mod wire;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The cluster secret of every test cluster of this test process ([`cluster::Cluster::start`]
/// writes it to the cluster's directory), which the raw wire clients ([`wire::Wire`],
/// [`checker::read_entry`]) prove to bookies: the one in `QUIRE_CLUSTER_SECRET_FILE` when set
/// (a deployed cluster's, as ansible/ci/deploy-test.sh sets it), else a random one.
pub fn test_cluster_secret() -> &'static quire_wire::auth::ClusterSecret {
    static SECRET: std::sync::OnceLock<quire_wire::auth::ClusterSecret> =
        std::sync::OnceLock::new();
    SECRET.get_or_init(|| match std::env::var_os("QUIRE_CLUSTER_SECRET_FILE") {
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("read QUIRE_CLUSTER_SECRET_FILE {path:?}: {e}"));
            quire_wire::auth::ClusterSecret::from_hex(&text).expect("a cluster secret")
        }
        None => quire_wire::auth::ClusterSecret::generate().expect("random secret"),
    })
}

/// The cluster secret a sandbox made in `data_dir` (`DATA_DIR/secrets/cluster-secret`).
pub fn sandbox_cluster_secret(data_dir: &Path) -> quire_wire::auth::ClusterSecret {
    let path = data_dir.join("secrets").join("cluster-secret");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    quire_wire::auth::ClusterSecret::from_hex(&text).expect("a cluster secret")
}

/// The `quire` binary built for this test run.
pub fn quire_bin() -> &'static str {
    env!("CARGO_BIN_EXE_quire")
}

/// The loghub sample directory: `QUIRE_LOGHUB_DIR`, else `../shared/data/loghub` beside the
/// repository (where every checkout and CI run has it).
pub fn loghub_dir() -> PathBuf {
    if let Ok(d) = std::env::var("QUIRE_LOGHUB_DIR") {
        return PathBuf::from(d);
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/loghub");
    assert!(
        dir.is_dir(),
        "loghub samples not found at {}; set QUIRE_LOGHUB_DIR",
        dir.display()
    );
    dir
}

/// Every `*.log` file of the loghub samples, sorted.
pub fn loghub_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(loghub_dir())
        .expect("read loghub dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 8, "expected the eight loghub samples");
    files
}

/// What `quire read` must print for a file written with `quire write`: the file, with a final
/// LF added when its last line has none (every record is printed followed by LF).
pub fn expected_read_back(file: &[u8]) -> Vec<u8> {
    let mut out = file.to_vec();
    if !out.is_empty() && out.last() != Some(&b'\n') {
        out.push(b'\n');
    }
    out
}

/// A temporary directory on the ext4 disk (O_DIRECT does not work on tmpfs).
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("quire-test-")
        .tempdir_in(std::env::temp_dir())
        .expect("tempdir")
}

/// Read-only-mode flags for bookies whose directories sit on the host's disk: a usage threshold
/// of 100 %, so that only a really full disk (ENOSPC) turns them read-only. The host disk is
/// shared with other work and its usage is not the test's to control (a CI machine was seen at
/// 98 % used, above the 0.95 default, which made every bookie read-only); tests of read-only
/// mode loop-mount their own small disks and pass their own thresholds instead.
pub const HOST_DISK_FLAGS: &[&str] = &["--disk-usage-threshold", "1.0"];

/// `extra` preceded by [`HOST_DISK_FLAGS`], unless `extra` sets a threshold itself.
pub fn with_host_disk_flags<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let own = extra.iter().any(|f| f.starts_with("--disk-usage"));
    let mut flags: Vec<&'a str> = if own {
        Vec::new()
    } else {
        HOST_DISK_FLAGS.to_vec()
    };
    flags.extend_from_slice(extra);
    flags
}

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
        let mut child = Command::new(quire_bin())
            .arg("sandbox")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0"])
            .args(with_host_disk_flags(extra))
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

/// `GET path` over HTTP/1.1 from `addr` (`host:port`): the status code and the body.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read the answer");
    let (head, body) = out.split_once("\r\n\r\n").expect("a whole HTTP answer");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    (status, body.to_string())
}

/// Sum of the samples of `name` whose labels contain every `key="value"` of `labels`
/// (OpenMetrics text as `/metrics` serves it).
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut total = 0.0;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (label_text, value) = if let Some(r) = rest.strip_prefix('{') {
            match r.split_once("} ") {
                Some((l, v)) => (l, v),
                None => continue,
            }
        } else if let Some(v) = rest.strip_prefix(' ') {
            ("", v)
        } else {
            continue;
        };
        if labels
            .iter()
            .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")))
        {
            total += value.trim().parse::<f64>().expect("numeric sample");
        }
    }
    total
}

/// Runs the `quire` binary with `--proxy addr` appended.
pub fn run_quire(args: &[&str], addr: &str, stdin: Option<&[u8]>) -> Output {
    use std::io::Write;
    let mut cmd = Command::new(quire_bin());
    cmd.args(args)
        .args(["--proxy", addr])
        .env_remove("QUIRE_PROXY");
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn quire");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(input).expect("feed stdin");
    }
    child.wait_with_output().expect("quire output")
}

/// Parses `quire write`'s output line `SEG:ENTRY:SLOT COUNT`.
pub fn parse_write_output(out: &Output) -> ((u64, u64, u64), u64) {
    assert!(
        out.status.success(),
        "quire write failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout.clone()).expect("utf8");
    let mut parts = text.split_whitespace();
    let dlsn = parts.next().expect("dlsn");
    let count: u64 = parts.next().expect("count").parse().expect("count number");
    let nums: Vec<u64> = dlsn
        .split(':')
        .map(|n| n.parse().expect("dlsn part"))
        .collect();
    assert_eq!(nums.len(), 3, "DLSN {dlsn}");
    ((nums[0], nums[1], nums[2]), count)
}

/// Number of records `quire write` makes of `bytes`: lines split at LF, a last line without
/// LF counts too.
pub fn record_count(bytes: &[u8]) -> u64 {
    let lf = bytes.iter().filter(|&&b| b == b'\n').count() as u64;
    lf + u64::from(!bytes.is_empty() && bytes.last() != Some(&b'\n'))
}

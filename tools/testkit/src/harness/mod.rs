//! The process harness (feature `harness`): tests that drive the real `quire` binary start a
//! ZooKeeper, bookies, proxies and autorecovery daemons as child processes ([`cluster`]) or a
//! whole `quire sandbox` ([`Sandbox`]), on loopback, with real O_DIRECT files in temporary
//! directories, and stop them by pid. [`checker`] verifies what a run left behind (every
//! acknowledged record readable once, in order; replicas present), [`wire`] speaks the bookie
//! protocol directly, and the functions here run the CLI and read its answers and metrics.
//!
//! The binary is [`quire_bin`]: `QUIRE_TEST_BIN` when set, else the `quire` that Cargo built beside
//! the running test (the `quire` package's own integration tests always have it).

// The harness waits on real child processes and sockets: its deadlines are the real clock's,
// never a manual clock a test installed on its thread (quire_clock).
#![allow(clippy::disallowed_methods)]

pub mod checker;
pub mod cluster;
pub mod recorded;
mod sandbox;
pub mod wire;

pub use sandbox::{Sandbox, SMALL_SEGMENTS};

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

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

/// The `quire` binary the harness runs: `QUIRE_TEST_BIN`, else `quire` in the Cargo target
/// directory that holds the running test executable (`target/<profile>/deps/it-…` →
/// `target/<profile>/quire`).
///
/// # Panics
/// When neither exists: build it first (`cargo build --release -p quire`).
pub fn quire_bin() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("QUIRE_TEST_BIN") {
            return PathBuf::from(bin);
        }
        let exe = std::env::current_exe().expect("the test executable's path");
        let profile_dir = exe
            .parent()
            .filter(|d| d.ends_with("deps"))
            .and_then(Path::parent)
            .expect("a test executable under target/<profile>/deps");
        let bin = profile_dir.join("quire");
        assert!(
            bin.is_file(),
            "no quire binary at {}: build it (cargo build --release -p quire) or set QUIRE_TEST_BIN",
            bin.display()
        );
        bin
    })
}

/// The loghub samples the harness writes ([`crate::loghub::files`]).
pub fn loghub_files() -> Vec<PathBuf> {
    crate::loghub::files()
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
        // A command that refuses its arguments exits without reading its input: the pipe is
        // closed under the write, and its exit status and stderr say what happened.
        match pipe.write_all(input) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            r => r.expect("feed stdin"),
        }
    }
    child.wait_with_output().expect("quire output")
}

/// Parses `quire write`'s output line `wrote N records to STREAM: first DLSN, last DLSN`:
/// the last DLSN and the count.
pub fn parse_write_output(out: &Output) -> ((u64, u64, u64), u64) {
    assert!(
        out.status.success(),
        "quire write failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `wrote N records to STREAM: first DLSN, last DLSN`
    let text = String::from_utf8(out.stdout.clone()).expect("utf8");
    let words: Vec<&str> = text.split_whitespace().collect();
    assert!(
        words.len() == 9 && words[0] == "wrote" && words[7] == "last",
        "quire write output {text:?}"
    );
    let count: u64 = words[1].parse().expect("count number");
    let dlsn = words[8];
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

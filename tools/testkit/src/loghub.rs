//! The Loghub samples shipped with the test kit (`tools/testkit/data/loghub`): eight 2,000-line
//! real system logs that tests, the README's quick start and the Ansible deployment test write
//! through a cluster and read back byte for byte.
//!
//! [`dir`] is `QUIRE_LOGHUB_DIR` when set, else the copy in this repository, so the tests do not
//! depend on where the repository was cloned. [`files`] checks every sample against
//! `SHA256SUMS` first: a checkout that rewrote line ends (git's `core.autocrlf`) would otherwise
//! make every round-trip comparison fail far from its cause.

use std::path::{Path, PathBuf};

/// How many samples the set holds.
pub const SAMPLES: usize = 8;

/// The sample directory: `QUIRE_LOGHUB_DIR`, else `tools/testkit/data/loghub` of this checkout.
pub fn dir() -> PathBuf {
    match std::env::var_os("QUIRE_LOGHUB_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("data/loghub"),
    }
}

/// Every `*.log` sample of [`dir`], sorted by name, each checked against the directory's
/// `SHA256SUMS`.
///
/// # Panics
/// When the directory is missing, does not hold [`SAMPLES`] samples, lacks `SHA256SUMS`, or a
/// sample's digest differs (the message names the file): test setup errors.
pub fn files() -> Vec<PathBuf> {
    let dir = dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("loghub samples at {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    files.sort();
    assert_eq!(
        files.len(),
        SAMPLES,
        "expected {SAMPLES} loghub samples in {}",
        dir.display()
    );
    let sums = std::fs::read_to_string(dir.join("SHA256SUMS"))
        .unwrap_or_else(|e| panic!("{}/SHA256SUMS: {e}", dir.display()));
    for file in &files {
        check_digest(file, &sums);
    }
    files
}

/// Panics unless `file`'s SHA-256 is the one `sums` (`sha256sum` output) lists for its name.
fn check_digest(file: &Path, sums: &str) {
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a UTF-8 file name");
    let want = sums
        .lines()
        .filter_map(|l| l.split_once("  "))
        .find(|(_, n)| *n == name)
        .map(|(digest, _)| digest)
        .unwrap_or_else(|| panic!("SHA256SUMS lists no {name}"));
    let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    let got: String = ring::digest::digest(&ring::digest::SHA256, &bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        got,
        want,
        "{} differs from the published sample (line ends rewritten by git's core.autocrlf?)",
        file.display()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_samples_match_their_digests() {
        let files = files();
        assert!(files.iter().any(|f| f.ends_with("HDFS_2k.log")));
    }

    #[test]
    fn a_changed_byte_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("HDFS_2k.log");
        std::fs::copy(super::dir().join("HDFS_2k.log"), &file).unwrap();
        let sums = std::fs::read_to_string(super::dir().join("SHA256SUMS")).unwrap();
        check_digest(&file, &sums);
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[0] ^= 1;
        std::fs::write(&file, bytes).unwrap();
        let err = std::panic::catch_unwind(|| check_digest(&file, &sums)).unwrap_err();
        let msg = err.downcast_ref::<String>().unwrap();
        assert!(msg.contains("HDFS_2k.log differs"), "{msg}");
    }
}

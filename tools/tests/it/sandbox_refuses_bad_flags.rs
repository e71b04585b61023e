//! Goal: a sandbox given flags that break a stream rule (E >= Qw >= Qa >= 1, an entry size in
//! range) exits at once with one line naming the key, as `quire proxy` does for the same keys
//! of its `[streams]` table, instead of starting its bookies and then aborting on a panic in
//! the stream manager (exit status 134, a backtrace).
//! Method: real `quire sandbox` processes on a fresh data directory; exit status and stderr.

use quire_testkit::harness::*;
use std::process::Command;

fn sandbox(dir: &std::path::Path, flags: &[&str]) -> std::process::Output {
    Command::new(quire_bin())
        .args(["sandbox", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .args(flags)
        .output()
        .expect("run sandbox")
}

#[test]
fn quorum_and_entry_size_flags_are_checked_before_anything_starts() {
    let dir = temp_dir();
    for (flags, key) in [
        (
            &["--ensemble-size", "2", "--write-quorum", "3"][..],
            "ensemble_size",
        ),
        (&["--ack-quorum", "0"][..], "ensemble_size"),
        (&["--entry-size-bytes", "0"][..], "entry_size_bytes"),
        // At most the record-set header: refused by the stream manager's assertion before.
        (&["--entry-size-bytes", "5"][..], "entry_size_bytes"),
    ] {
        let out = sandbox(dir.path(), flags);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {err}");
        assert!(
            err.starts_with("quire: error: invalid setting") && err.contains(key),
            "{flags:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{flags:?}: {err}");
        assert!(err.lines().count() == 1, "{flags:?}: {err}");
    }
    // Nothing was started on the directory: no bookie directories, no record.
    assert!(!dir.path().join("bookie-1").exists());
    assert!(!dir.path().join("sandbox.json").exists());
}

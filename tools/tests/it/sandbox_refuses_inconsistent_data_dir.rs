//! Goal: a sandbox whose data directory lost part of itself refuses to start, saying why,
//! instead of serving bookie data under fresh metadata (which would hand old ledger ids out
//! again and adopt their entries), and starts again once the part is back.
//! Method: real `quire sandbox` child; write, stop cleanly, move metadata.json or sandbox.json
//! aside, start (must fail with the reason), move it back, start and read.

use quire_testkit::harness::*;
use std::process::Command;

fn start_fails(dir: &std::path::Path) -> String {
    let out = Command::new(quire_bin())
        .args(["sandbox", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .output()
        .expect("run sandbox");
    assert!(
        !out.status.success(),
        "the sandbox started on an inconsistent directory"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn missing_metadata_or_bookie_record_is_refused() {
    let dir = temp_dir();
    let sandbox = Sandbox::start(dir.path(), &[]);
    let (_, count) = parse_write_output(&sandbox.quire_stdin(&["write", "kept"], b"one\ntwo\n"));
    assert_eq!(count, 2);
    sandbox.stop();

    let meta = dir.path().join("metadata/metadata.json");
    let aside = dir.path().join("metadata.json.aside");
    std::fs::rename(&meta, &aside).unwrap();
    let err = start_fails(dir.path());
    assert!(err.contains("metadata was lost"), "{err}");
    std::fs::rename(&aside, &meta).unwrap();

    let record = dir.path().join("sandbox.json");
    let aside = dir.path().join("sandbox.json.aside");
    std::fs::rename(&record, &aside).unwrap();
    let err = start_fails(dir.path());
    assert!(err.contains("bookie addresses are lost"), "{err}");
    std::fs::rename(&aside, &record).unwrap();

    let original = std::fs::read(&record).unwrap();
    std::fs::write(&record, br#"{"bookies": []}"#).unwrap();
    let err = start_fails(dir.path());
    assert!(err.contains("lists no bookies"), "{err}");
    std::fs::write(&record, original).unwrap();

    let sandbox = Sandbox::start(dir.path(), &[]);
    assert_eq!(sandbox.quire(&["read", "kept"]).stdout, b"one\ntwo\n");
    sandbox.stop();
}

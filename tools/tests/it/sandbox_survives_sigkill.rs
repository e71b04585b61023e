//! Goal: a sandbox killed with SIGKILL right after writes were acknowledged, then restarted on
//! the same directory, serves every acknowledged record exactly once and in order, and keeps
//! accepting writes.
//! Method: real `quire sandbox` child; `quire write` returns only after every record is
//! acknowledged; SIGKILL at once; restart; `quire read` and compare. Three rounds on one
//! stream, so segments left in progress by each kill are recovered and closed in turn.

use quire_testkit::harness::*;

#[test]
fn acknowledged_records_survive_sigkill_and_restart() {
    let dir = temp_dir();
    let files = loghub_files();
    let mut expected = Vec::new();
    let mut last_dlsn = (0, 0, 0);
    for (round, file) in files.iter().take(3).enumerate() {
        let sandbox = Sandbox::start(dir.path(), SMALL_SEGMENTS);
        // What earlier rounds acknowledged is all there, once, in order.
        let out = sandbox.quire(&["read", "crash-stream"]);
        if round == 0 {
            assert!(!out.status.success(), "the stream does not exist yet");
        } else {
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                out.stdout == expected,
                "round {round}: read-back differs after SIGKILL"
            );
        }
        let bytes = std::fs::read(file).unwrap();
        let (dlsn, count) =
            parse_write_output(&sandbox.quire(&["write", "crash-stream", file.to_str().unwrap()]));
        assert_eq!(count, record_count(&bytes));
        assert!(
            dlsn > last_dlsn,
            "DLSNs only grow: {dlsn:?} after {last_dlsn:?}"
        );
        last_dlsn = dlsn;
        expected.extend_from_slice(&expected_read_back(&bytes));
        sandbox.kill();
    }
    let sandbox = Sandbox::start(dir.path(), SMALL_SEGMENTS);
    let out = sandbox.quire(&["read", "crash-stream"]);
    assert!(out.status.success());
    assert!(out.stdout == expected, "final read-back differs");
    sandbox.stop();
}

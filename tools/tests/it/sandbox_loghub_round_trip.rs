//! Goal: every loghub sample written through a running sandbox (3 bookies, E=3, Qw=3, Qa=2)
//! reads back byte-identical, and a stream spans several log segments.
//! Method: start the real `quire sandbox` binary with 64 KiB segments, `quire write` each file
//! into its own stream, `quire read` it back and compare bytes; the last DLSN's segment number
//! shows how many segments the stream spans. A clean SIGTERM stop ends the test.

use quire_testkit::harness::*;

#[test]
fn every_loghub_file_round_trips_through_the_sandbox() {
    let dir = temp_dir();
    let sandbox = Sandbox::start(dir.path(), SMALL_SEGMENTS);
    let mut most_segments = 0;
    for file in loghub_files() {
        let name = file.file_stem().unwrap().to_str().unwrap().to_string();
        let stream = format!("loghub/{name}");
        let bytes = std::fs::read(&file).unwrap();
        let (dlsn, count) =
            parse_write_output(&sandbox.quire(&["write", &stream, file.to_str().unwrap()]));
        assert_eq!(count, record_count(&bytes), "{name}: records acknowledged");
        most_segments = most_segments.max(dlsn.0);

        let out = sandbox.quire(&["read", &stream]);
        assert!(
            out.status.success(),
            "read {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let expected = expected_read_back(&bytes);
        assert_eq!(
            out.stdout.len(),
            expected.len(),
            "{name}: length of what was read back"
        );
        assert!(out.stdout == expected, "{name}: bytes differ");
    }
    assert!(
        most_segments >= 3,
        "some stream should span several segments, the most was {most_segments}"
    );

    // Reading from a DLSN in the middle gives a suffix of the stream.
    let out = sandbox.quire(&["read", "loghub/HDFS_2k", "--from", "2:0:0"]);
    assert!(out.status.success());
    let all = sandbox.quire(&["read", "loghub/HDFS_2k"]).stdout;
    assert!(!out.stdout.is_empty() && out.stdout.len() < all.len());
    assert!(
        all.ends_with(&out.stdout),
        "a read from 2:0:0 is a suffix of the whole stream"
    );
    sandbox.stop();
}

#[test]
fn stdin_input_and_clear_errors() {
    // Goal: stdin works as input; CR bytes and empty lines survive; a missing stream, a record
    // too large and an unreachable proxy are one clear line on stderr and a non-zero exit.
    let dir = temp_dir();
    let sandbox = Sandbox::start(dir.path(), &[]);
    let input = b"first\r\n\nthird has a lone \r inside\n";
    let (_, count) = parse_write_output(&sandbox.quire_stdin(&["write", "stdin-stream"], input));
    assert_eq!(count, 3);
    assert_eq!(sandbox.quire(&["read", "stdin-stream"]).stdout, input);

    let missing = sandbox.quire(&["read", "no-such-stream"]);
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("no-such-stream"), "{err}");

    let big = vec![b'x'; 2 * 1024 * 1024];
    let too_large = sandbox.quire_stdin(&["write", "big-stream"], &big);
    assert!(!too_large.status.success());
    let err = String::from_utf8_lossy(&too_large.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(
            "line 1 is 2097152 bytes, above the record limit of 1040384 bytes; nothing was written"
        ),
        "{err}"
    );
    // An oversized line after many small ones: the message counts lines of the input, and
    // says exactly what was written.
    let mut mixed = Vec::new();
    for i in 0..5000 {
        mixed.extend_from_slice(format!("small {i}\n").as_bytes());
    }
    mixed.extend_from_slice(&big);
    let out = sandbox.quire_stdin(&["write", "mixed-stream"], &mixed);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 5001 is 2097152 bytes"), "{err}");
    assert!(
        err.contains("lines 1 to 4096 were written, nothing after them"),
        "{err}"
    );
    let back = sandbox.quire(&["read", "mixed-stream"]).stdout;
    assert_eq!(
        back,
        mixed[..mixed.len() - big.len()]
            .split(|&b| b == b'\n')
            .take(4096)
            .flat_map(|l| [l, b"\n"].concat())
            .collect::<Vec<u8>>()
    );

    // Empty input still creates the stream.
    let (_, count) = {
        let out = sandbox.quire_stdin(&["write", "empty-stream"], b"");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            (0, 0, 0),
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<u64>()
                .unwrap(),
        )
    };
    assert_eq!(count, 0);
    let out = sandbox.quire(&["read", "empty-stream"]);
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let bad_name = sandbox.quire_stdin(&["write", "../escape"], b"x\n");
    assert!(!bad_name.status.success());
    sandbox.stop();

    let nobody = run_quire(&["read", "s"], "127.0.0.1:1", None);
    assert!(!nobody.status.success());
    let err = String::from_utf8_lossy(&nobody.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("127.0.0.1:1"), "{err}");
}

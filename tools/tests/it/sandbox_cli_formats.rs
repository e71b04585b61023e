//! Goal: the CLI's record formats and read controls (issue 26 item 7) against a real sandbox:
//! `--format binary` carries every byte value both ways, byte for byte; `--format json` output
//! parses as JSON (dlsn, txid, payload) and writes back; `--txid-from` and JSON txids are kept;
//! `-c N` stops after N records; `-e` ends a tail at the end the stream had; a read past the end
//! says so on stderr; write prints labelled and JSON results; completions are generated;
//! subscriptions (`--sub`, `quire stream subs`) commit forward only, survive a restart and
//! resume where committed, and go with their stream; `quire write --compression lz4` stores
//! LZ4-compressed entries (smaller segments) that read back byte for byte, with positions by
//! txid, time and last N and `stream show`'s counts as for plain ones; `quire stream compression
//! STREAM lz4` makes the owner compress every entry of the stream (writes without a flag store
//! smaller segments, read back byte for byte), shown by `stream show`, kept across a restart
//! (a new owner) and undone by `default`.
//! Method: one `quire sandbox` process (restarted once on the same data directory); every
//! check runs the real `quire` binary against it.

use quire_testkit::harness::*;

fn ok(out: std::process::Output) -> Vec<u8> {
    assert!(
        out.status.success(),
        "quire failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn json_lines(bytes: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is a JSON object"))
        .collect()
}

/// Binary frames: 4-byte little-endian length, then the payload.
fn frames(payloads: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in payloads {
        out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

#[test]
fn record_formats_and_read_controls() {
    let dir = temp_dir();
    let sandbox = Sandbox::start(dir.path(), &[]);
    binary_round_trip(&sandbox);
    json_output_and_txids(&sandbox);
    count_exit_and_past_end(&sandbox);
    compressed_round_trip(&sandbox);
    stream_compression_set(&sandbox);
    let out = ok(std::process::Command::new(quire_bin())
        .args(["completions", "bash"])
        .output()
        .unwrap());
    assert!(
        String::from_utf8_lossy(&out).contains("quire"),
        "bash completions"
    );
    let sandbox = subscriptions_resume_after_restart(sandbox, dir.path());
    stream_compression_after_restart(&sandbox);
    sandbox.stop();
}

fn lines_of(from: usize, to: usize) -> Vec<u8> {
    (from..to)
        .flat_map(|i| format!("s{i}\n").into_bytes())
        .collect()
}

fn subscriptions_resume_after_restart(sandbox: Sandbox, data_dir: &std::path::Path) -> Sandbox {
    ok(sandbox.quire_stdin(&["write", "subs"], &lines_of(0, 100)));
    assert_eq!(
        ok(sandbox.quire(&["read", "subs", "--sub", "app", "-c", "30"])),
        lines_of(0, 30)
    );
    // Commit is forward only: a read from the head under the same name commits an earlier
    // position, which changes nothing.
    assert_eq!(
        ok(sandbox.quire(&["read", "subs", "--sub", "app", "-o", "head", "-c", "5"])),
        lines_of(0, 5)
    );
    assert_eq!(
        ok(sandbox.quire(&["read", "subs", "--sub", "app", "-c", "10"])),
        lines_of(30, 40)
    );
    let list: serde_json::Value =
        serde_json::from_slice(&ok(sandbox.quire(&["stream", "subs", "subs", "--json"]))).unwrap();
    assert_eq!(list[0]["name"], "app", "{list}");
    let lag = list[0]["lag_records"].as_u64().unwrap();
    // Estimated from the segment metadata: at most the 100 records written.
    assert!(lag <= 100, "{list}");
    // The subscription survives a restart of the proxy (here the whole sandbox, whose
    // embedded store is the metadata store) and resumes where it was committed.
    sandbox.stop();
    let sandbox = Sandbox::start(data_dir, &[]);
    assert_eq!(
        ok(sandbox.quire(&["read", "subs", "--sub", "app", "-c", "10"])),
        lines_of(40, 50)
    );
    // A tail under the subscription that exits at the end reads the rest, and a second one
    // finds nothing left.
    assert_eq!(
        ok(sandbox.quire(&["tail", "subs", "--sub", "app", "-e"])),
        lines_of(50, 100)
    );
    assert_eq!(
        ok(sandbox.quire(&["tail", "subs", "--sub", "app", "-e"])),
        b""
    );
    let text = String::from_utf8(ok(sandbox.quire(&["stream", "subs", "subs"]))).unwrap();
    assert!(text.lines().any(|l| l.starts_with("app ")), "{text}");
    let out = String::from_utf8(ok(
        sandbox.quire(&["stream", "subs", "subs", "--delete", "app"])
    ))
    .unwrap();
    assert!(
        out.contains("subscription app of stream subs deleted"),
        "{out}"
    );
    let text = String::from_utf8(ok(sandbox.quire(&["stream", "subs", "subs"]))).unwrap();
    assert!(text.contains("has no subscriptions"), "{text}");
    // Deleting a stream deletes its subscriptions: a stream made again under the name has none.
    ok(sandbox.quire(&["read", "subs", "--sub", "gone", "-c", "1"]));
    ok(sandbox.quire(&["stream", "delete", "subs"]));
    ok(sandbox.quire_stdin(&["write", "subs"], b"again\n"));
    let text = String::from_utf8(ok(sandbox.quire(&["stream", "subs", "subs"]))).unwrap();
    assert!(text.contains("has no subscriptions"), "{text}");
    sandbox
}

fn binary_round_trip(sandbox: &Sandbox) {
    // A file holding every byte value in one record, one record per byte value, an empty
    // record and LF/CR-laden ones, through --format binary both ways.
    let mut payloads: Vec<Vec<u8>> = vec![(0..=255u8).collect()];
    payloads.extend((0..=255u8).map(|b| vec![b]));
    payloads.push(vec![]);
    payloads.push(b"a\nb\r\n\0c".to_vec());
    let input = frames(&payloads);
    let files = temp_dir();
    let file = files.path().join("every-byte.bin");
    std::fs::write(&file, &input).unwrap();
    let out = sandbox.quire(&["write", "bin", file.to_str().unwrap(), "--format", "binary"]);
    let (_, count) = parse_write_output(&out);
    assert_eq!(count, payloads.len() as u64);
    let back = ok(sandbox.quire(&["read", "bin", "--format", "binary"]));
    assert!(back == input, "binary read back differs from the file");
    // A frame cut short is one line of error naming the frame, and nothing of it is written.
    let out = sandbox.quire_stdin(
        &["write", "bin-bad", "--format", "binary"],
        &[9, 0, 0, 0, 1],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("frame 1") && err.contains("nothing was written"),
        "{err}"
    );
}

fn json_output_and_txids(sandbox: &Sandbox) {
    let out = ok(sandbox.quire_stdin(
        &["write", "j", "--txid-from", "1000", "--json"],
        b"one\ntwo\nthree\n",
    ));
    let result: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(result["records"], 3);
    assert_eq!(result["first_txid"], 1000);
    assert_eq!(result["last_txid"], 1002);
    assert_eq!(result["first_dlsn"], "1:0:0");
    // JSON input: an explicit txid is kept, a record without one takes --txid-from's next
    // value (never below the previous txid), a binary payload travels as base64.
    let input = b"{\"payload\":\"four\",\"txid\":5000}\n{\"payload\":\"/wA=\",\"payload_encoding\":\"base64\"}\n";
    let human = String::from_utf8(ok(sandbox.quire_stdin(
        &["write", "j", "--format", "json", "--txid-from", "6000"],
        input,
    )))
    .unwrap();
    assert!(human.starts_with("wrote 2 records to j: first "), "{human}");
    let records = json_lines(&ok(sandbox.quire(&["read", "j", "--format", "json"])));
    let txids: Vec<u64> = records
        .iter()
        .map(|r| r["txid"].as_u64().unwrap())
        .collect();
    assert_eq!(txids, [1000, 1001, 1002, 5000, 6000]);
    assert_eq!(records[0]["payload"], "one");
    assert_eq!(records[0]["payload_encoding"], "utf8");
    assert_eq!(records[4]["payload"], "/wA=");
    assert_eq!(records[4]["payload_encoding"], "base64");
    assert_eq!(records[0]["dlsn"], result["first_dlsn"]);
    let dlsns: Vec<&str> = records
        .iter()
        .map(|r| r["dlsn"].as_str().unwrap())
        .collect();
    assert!(dlsns.iter().all(|d| d.split(':').count() == 3), "{dlsns:?}");
    // JSON output writes back as JSON input, txids and payloads kept.
    let all = ok(sandbox.quire(&["read", "j", "--format", "json"]));
    ok(sandbox.quire_stdin(&["write", "j2", "--format", "json"], &all));
    let copy = json_lines(&ok(sandbox.quire(&["read", "j2", "--format", "json"])));
    let strip = |v: &[serde_json::Value]| -> Vec<(serde_json::Value, serde_json::Value)> {
        v.iter()
            .map(|r| (r["txid"].clone(), r["payload"].clone()))
            .collect()
    };
    assert_eq!(strip(&copy), strip(&records));
    // A custom delimiter both ways.
    ok(sandbox.quire_stdin(&["write", "d", "--delimiter", "\\0"], b"a\nb\0c\0"));
    let back = ok(sandbox.quire(&["read", "d", "--delimiter", "|"]));
    assert_eq!(back, b"a\nb|c|");
}

fn count_exit_and_past_end(sandbox: &Sandbox) {
    let lines: Vec<u8> = (0..100)
        .flat_map(|i| format!("r{i}\n").into_bytes())
        .collect();
    ok(sandbox.quire_stdin(&["write", "c", "--txid-from", "1"], &lines));
    assert_eq!(
        ok(sandbox.quire(&["read", "c", "-c", "3"])),
        b"r0\nr1\nr2\n"
    );
    // -e: a tail from the 51st record exits at the end the stream had, with exit status 0.
    let records = json_lines(&ok(sandbox.quire(&["read", "c", "--format", "json"])));
    let from = records[50]["dlsn"].as_str().unwrap().to_string();
    let started = std::time::Instant::now();
    let out = ok(sandbox.quire(&["tail", "c", "-e", "-o", &from]));
    let expected: Vec<u8> = (50..100)
        .flat_map(|i| format!("r{i}\n").into_bytes())
        .collect();
    assert_eq!(out, expected);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // A read from past the end prints nothing, exits 0, and says so on stderr.
    let out = sandbox.quire(&["read", "c", "--from", "9:0:0"]);
    assert!(out.status.success() && out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("past the end of stream c"), "{err}");
    // Positions by txid, by write time and the last N (record i has txid i + 1); every JSON
    // record carries the proxy's write time.
    let lines_from = |from: &str| ok(sandbox.quire(&["read", "c", "-e", "-o", from]));
    let expect = |range: std::ops::Range<usize>| -> Vec<u8> {
        range.flat_map(|i| format!("r{i}\n").into_bytes()).collect()
    };
    assert_eq!(lines_from("txid:5"), expect(4..100));
    assert_eq!(lines_from("-10"), expect(90..100));
    let first_time = records[0]["write_time"]
        .as_str()
        .expect("write time")
        .to_string();
    assert!(records.iter().all(|r| r["write_time"].is_string()));
    assert_eq!(lines_from(&format!("@{first_time}")), expect(0..100));
    // A bad form is one clear line.
    let out = sandbox.quire(&["read", "c", "-o", "nope"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("expected head, tail"), "{err}");
    // A sealed stream ends a tail (no -e) after its last record, with exit status 0.
    ok(sandbox.quire(&["stream", "seal", "c"]));
    let out = sandbox.quire(&["tail", "c", "-o", "-2"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, expect(98..100));
    assert!(String::from_utf8_lossy(&out.stderr).contains("end of stream c"));
}

/// Log lines like the loghub HDFS sample, `i` from..to.
fn hdfs_lines(from: usize, to: usize) -> Vec<u8> {
    (from..to)
        .flat_map(|i| {
            format!(
                "081109 {:06} 148 INFO dfs.DataNode$PacketResponder: PacketResponder {} for block blk_{} terminating\n",
                203_615 + i,
                i % 3,
                (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 3
            )
            .into_bytes()
        })
        .collect()
}

/// The stream's `stream show --json`, after sealing it (its segments completed, so the
/// metadata carries their sizes).
fn sealed_show(sandbox: &Sandbox, stream: &str) -> serde_json::Value {
    ok(sandbox.quire(&["stream", "seal", stream]));
    serde_json::from_slice(&ok(sandbox.quire(&["stream", "show", stream, "--json"]))).unwrap()
}

fn segment_bytes(show: &serde_json::Value) -> u64 {
    let segs = show["metadata"]["segments"].as_array().expect("segments");
    segs.iter()
        .map(|s| s["length_bytes"].as_u64().unwrap())
        .sum()
}

fn compressed_round_trip(sandbox: &Sandbox) {
    // The same 3,000 log lines (in two writes) into a stream written with --compression lz4
    // and one written plain: the compressed one reads back identical, its positions and
    // counts are the same, and its segment holds far fewer bytes.
    let (a, b) = (hdfs_lines(0, 2000), hdfs_lines(2000, 3000));
    for (stream, how) in [("lz", "lz4"), ("plain", "none")] {
        let args =
            |from: &'static str| ["write", stream, "--txid-from", from, "--compression", how];
        ok(sandbox.quire_stdin(&args("1"), &a));
        ok(sandbox.quire_stdin(&args("2001"), &b));
    }
    let all = [a.clone(), b.clone()].concat();
    assert!(
        ok(sandbox.quire(&["read", "lz"])) == all,
        "lz4 stream reads back as written"
    );
    let lines = |s: &str, from: &str| ok(sandbox.quire(&["read", s, "-e", "-o", from]));
    let tail_of = |n: usize| -> Vec<u8> {
        let text = String::from_utf8(all.clone()).unwrap();
        let v: Vec<&str> = text.lines().collect();
        v[v.len() - n..]
            .iter()
            .flat_map(|l| format!("{l}\n").into_bytes())
            .collect()
    };
    assert!(
        lines("lz", "txid:2001") == b,
        "txid position in a compressed segment"
    );
    assert!(lines("lz", "txid:2990") == tail_of(11));
    assert!(lines("lz", "-7") == tail_of(7), "last N");
    let json = json_lines(&ok(
        sandbox.quire(&["read", "lz", "--format", "json", "-o", "-1"])
    ));
    let last_time = json[0]["write_time"]
        .as_str()
        .expect("write time")
        .to_string();
    assert!(lines("lz", &format!("@{last_time}")).ends_with(&tail_of(1)));
    assert_eq!(json[0]["txid"], 3000);
    // Every byte value, in binary frames, through a compressed write.
    let payloads: Vec<Vec<u8>> = (0..64).map(|_| (0..=255u8).collect()).collect();
    ok(sandbox.quire_stdin(
        &[
            "write",
            "lzbin",
            "--format",
            "binary",
            "--compression",
            "lz4",
        ],
        &frames(&payloads),
    ));
    assert!(ok(sandbox.quire(&["read", "lzbin", "--format", "binary"])) == frames(&payloads));
    let (lz, plain) = (sealed_show(sandbox, "lz"), sealed_show(sandbox, "plain"));
    assert_eq!(lz["record_count"], 3000, "{lz}");
    assert_eq!(lz["last_txid"], 3000);
    assert_eq!(lz["last_dlsn"], plain["last_dlsn"]);
    let (lz_bytes, plain_bytes) = (segment_bytes(&lz), segment_bytes(&plain));
    assert!(
        lz_bytes * 3 < plain_bytes,
        "compressed segments hold {lz_bytes} bytes, plain ones {plain_bytes}"
    );
    let bin = sealed_show(sandbox, "lzbin");
    assert!(segment_bytes(&bin) < 64 * 256 / 4, "{bin}");
    let bad = sandbox.quire_stdin(&["write", "lz2", "--compression", "zstd"], b"x\n");
    assert!(!bad.status.success());
}

/// The per-stream setting, first half: set on a stream made plain, shown, applied to writes
/// that carry no compression flag.
fn stream_compression_set(sandbox: &Sandbox) {
    let missing = sandbox.quire(&["stream", "compression", "nope", "lz4"]);
    assert!(!missing.status.success());
    assert_eq!(String::from_utf8_lossy(&missing.stderr).lines().count(), 1);
    ok(sandbox.quire_stdin(&["write", "sc", "--txid-from", "1"], &hdfs_lines(0, 1)));
    let text = |args: &[&str]| String::from_utf8(ok(sandbox.quire(args))).unwrap();
    assert!(
        text(&["stream", "show", "sc"]).contains("  compression: proxy default\n"),
        "a new stream follows the proxy default"
    );
    let out = text(&["stream", "compression", "sc", "lz4"]);
    assert_eq!(out, "stream sc compression: lz4 (stream)\n");
    assert!(text(&["stream", "show", "sc"]).contains("  compression: lz4 (stream)\n"));
    let show: serde_json::Value =
        serde_json::from_str(&text(&["stream", "show", "sc", "--json"])).unwrap();
    assert_eq!(show["compression"], "lz4", "{show}");
    let bad = sandbox.quire(&["stream", "compression", "sc", "zstd"]);
    assert!(!bad.status.success());
    ok(sandbox.quire_stdin(&["write", "sc", "--txid-from", "2"], &hdfs_lines(1, 2000)));
}

/// The per-stream setting, second half, after the sandbox restarted (a new proxy acquired
/// the stream): still set, still applied; the stream reads back byte for byte and its
/// segments hold under a third of the plain stream's bytes for the same lines.
fn stream_compression_after_restart(sandbox: &Sandbox) {
    let text = |args: &[&str]| String::from_utf8(ok(sandbox.quire(args))).unwrap();
    assert_eq!(
        text(&["stream", "compression", "sc"]),
        "stream sc compression: lz4 (stream)\n"
    );
    ok(sandbox.quire_stdin(
        &["write", "sc", "--txid-from", "2001"],
        &hdfs_lines(2000, 3000),
    ));
    assert!(
        ok(sandbox.quire(&["read", "sc"])) == hdfs_lines(0, 3000),
        "the stream compressed by its setting reads back as written"
    );
    let sc = sealed_show(sandbox, "sc");
    // "plain" was sealed by compressed_round_trip.
    let plain: serde_json::Value =
        serde_json::from_str(&text(&["stream", "show", "plain", "--json"])).unwrap();
    assert_eq!(sc["record_count"], 3000, "{sc}");
    let (sc_bytes, plain_bytes) = (segment_bytes(&sc), segment_bytes(&plain));
    assert!(
        sc_bytes * 3 < plain_bytes,
        "segments of the lz4 stream hold {sc_bytes} bytes, plain ones {plain_bytes}"
    );
    assert_eq!(
        text(&["stream", "compression", "sc", "default"]),
        "stream sc compression: proxy default\n"
    );
    let show: serde_json::Value =
        serde_json::from_str(&text(&["stream", "show", "sc", "--json"])).unwrap();
    assert!(show["compression"].is_null(), "{show}");
}

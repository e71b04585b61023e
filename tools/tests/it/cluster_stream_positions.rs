//! Goal (issue 26 items 1 and 3): reads positioned by txid, by write time, at the tail and at
//! the last N records return exactly the records at and after the position, once, in order,
//! each with its DLSN, txid and the proxy's write time, across many rolled segments, a segment
//! left in progress by a SIGKILLed owner, the empty segment of a writer that crashed after
//! creating it (a real abort at the fault point `proxy.segment.after_create`), a truncated head and a stream whose records all carry
//! one txid; the stream lookups in DESCRIBE_STREAM agree with what is read; a sealed stream
//! refuses writes with END_OF_STREAM (also after a restart), ends a waiting tail read cleanly
//! after its last record, and can still be truncated and deleted.
//! Method: a real `quire sandbox` (embedded metadata, bookies and proxy in one process) with
//! 4 KiB segments and 1 KiB entries, driven through `ProxyClient`; SIGKILLed once while a
//! writer runs, restarted on the same directory, aborted once at `proxy.segment.after_create`
//! (`QUIRE_FAULT_POINTS`, docs/fault-points.md), and restarted once more after the seal.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quire_client::{Dlsn, Error, ErrorCode, Position, ProxyClient};
use quire_testkit::harness::*;

const FLAGS: &[&str] = &["--segment-size-bytes", "4096", "--entry-size-bytes", "1024"];

/// One record as read back: DLSN, txid, write time (ms), payload.
type Rec = (Dlsn, u64, u64, Vec<u8>);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Reads from `from` until the stream's current end (a read that returns nothing without
/// waiting) or its end-of-stream marker; returns the records and whether the marker was met.
async fn read_to_end(c: &ProxyClient, stream: &str, from: Position) -> (Vec<Rec>, bool) {
    let mut out = Vec::new();
    let mut at = from;
    loop {
        let b = c.read_from(stream, at, 1000, Duration::ZERO).await.unwrap();
        assert_eq!(
            b.write_times_ms.len(),
            b.records.len(),
            "a write time per record"
        );
        let empty = b.records.is_empty();
        for ((d, t, p), w) in b.records.into_iter().zip(b.write_times_ms) {
            out.push((d, t, w, p));
        }
        if b.end_of_stream {
            return (out, true);
        }
        if empty {
            return (out, false);
        }
        at = b.next;
    }
}

/// Writes `n` records with txids from `txid` (each repeated `per_txid` times), in writes of
/// `batch` records; returns the wall-clock bounds around the writes.
async fn write_records(
    c: &ProxyClient,
    stream: &str,
    first: u64,
    n: u64,
    per_txid: u64,
    batch: u64,
) -> (u64, u64) {
    let before = now_ms();
    let mut i = first;
    while i < first + n {
        let end = (i + batch).min(first + n);
        let records: Vec<(u64, Vec<u8>)> = (i..end)
            .map(|k| {
                (
                    k / per_txid,
                    format!("record {k:06} {}", "x".repeat(90)).into_bytes(),
                )
            })
            .collect();
        c.write(stream, records, true).await.unwrap();
        i = end;
    }
    (before, now_ms())
}

/// Leaves a crashed writer's empty segment at the end of stream `pos`, as DistributedLog's
/// writer leaves one when it dies after creating the segment's ledger and its in-progress
/// record but before its first entry: a sandbox started with the crash point
/// `proxy.segment.after_create` (docs/fault-points.md) takes a write, starts a new segment for
/// it and aborts (SIGABRT) before adding anything; the write is never acknowledged.
fn crash_after_creating_a_segment(dir: &std::path::Path, rt: &tokio::runtime::Runtime) {
    use std::os::unix::process::ExitStatusExt;
    let crashing = Sandbox::start_env(
        dir,
        FLAGS,
        &[("QUIRE_FAULT_POINTS", "crash=proxy.segment.after_create")],
    );
    rt.block_on(async {
        let c = ProxyClient::connect(&crashing.addr).await.unwrap();
        let r = c
            .write("pos", vec![(700, b"never acknowledged".to_vec())], false)
            .await;
        assert!(r.is_err(), "the writer dies before its first entry: {r:?}");
    });
    let status = crashing.wait_exit(Duration::from_secs(30));
    assert_eq!(
        status.and_then(|s| s.signal()),
        Some(libc::SIGABRT),
        "aborted at proxy.segment.after_create: {status:?}"
    );
}

fn code(e: &Error) -> ErrorCode {
    e.code()
}

/// Checks that reading from `from` gives exactly `all[expect..]`.
async fn check_from(c: &ProxyClient, stream: &str, from: Position, all: &[Rec], expect: usize) {
    let (got, _) = read_to_end(c, stream, from).await;
    assert!(
        got == all[expect..],
        "from {from}: expected {} records from {:?}, got {} from {:?}",
        all.len() - expect,
        all.get(expect).map(|r| r.0),
        got.len(),
        got.first().map(|r| r.0)
    );
}

#[test]
fn positions_lookups_and_seal_across_rolled_segments_and_a_kill() {
    let started = std::time::Instant::now();
    let dir = temp_dir();
    let rt = runtime();
    let sandbox = Sandbox::start(dir.path(), FLAGS);
    // Many rolled segments, then a writer running while the sandbox is SIGKILLed.
    let c2 = rt.block_on(async {
        let c = ProxyClient::connect(&sandbox.addr).await.unwrap();
        let (t0, t1) = write_records(&c, "pos", 0, 400, 3, 8).await;
        let (all, _) = read_to_end(&c, "pos", Position::Head).await;
        assert_eq!(all.len(), 400);
        assert!(
            all.iter().all(|r| r.2 >= t0 && r.2 <= t1),
            "write times from the proxy's clock"
        );
        ProxyClient::connect(&sandbox.addr).await.unwrap()
    });
    let acked_before_kill = rt.spawn(async move {
        let mut acked = 400u64;
        while acked < 2000 {
            let records = (acked..acked + 4)
                .map(|k| {
                    (
                        k / 3,
                        format!("record {k:06} {}", "x".repeat(90)).into_bytes(),
                    )
                })
                .collect();
            if c2.write("pos", records, false).await.is_err() {
                break;
            }
            acked += 4;
        }
        acked
    });
    std::thread::sleep(Duration::from_millis(300));
    sandbox.kill();
    let acked = rt.block_on(acked_before_kill).unwrap();
    let sandbox = Sandbox::start(dir.path(), FLAGS);
    // More writes after the restart, in a new segment after the recovered one.
    let mid = rt.block_on(async {
        let c = ProxyClient::connect(&sandbox.addr).await.unwrap();
        write_records(&c, "pos", 2000, 100, 3, 8).await
    });
    sandbox.stop();
    crash_after_creating_a_segment(dir.path(), &rt);
    let sandbox = Sandbox::start(dir.path(), FLAGS);
    rt.block_on(async {
        let c = ProxyClient::connect(&sandbox.addr).await.unwrap();
        // The next writes go after the crashed writer's empty segment, which recovery completed.
        let after = write_records(&c, "pos", 2100, 100, 3, 8).await;
        let info = c.describe_stream("pos").await.unwrap();
        let segs = &info.metadata.segments;
        let empty = segs
            .iter()
            .position(|s| s.record_count == 0)
            .expect("the crashed writer's empty segment is listed");
        assert_eq!(segs[empty].state, quire_client::SegmentState::Completed);
        assert!(
            segs[empty + 1..].iter().any(|s| s.record_count > 0),
            "records follow it"
        );
        let (all, eos) = read_to_end(&c, "pos", Position::Head).await;
        assert!(!eos);
        // Every acknowledged record is there once, in order; the kill may have left records
        // whose answer was lost.
        let seq_nos: std::collections::BTreeSet<u64> =
            all.iter().map(|r| r.0.segment_seq_no).collect();
        assert!(seq_nos.len() >= 15, "{} segments", seq_nos.len());
        assert!(
            all.len() as u64 >= acked + 200,
            "{} read, {acked} + 200 acked",
            all.len()
        );
        assert!(all
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1 && w[0].2 <= w[1].2));
        let n = all.len();
        assert!(all[n - 200..n - 100]
            .iter()
            .all(|r| r.2 >= mid.0 && r.2 <= mid.1));
        assert!(all[n - 100..]
            .iter()
            .all(|r| r.2 >= after.0 && r.2 <= after.1));
        let info = c.describe_stream("pos").await.unwrap();
        let empty = info
            .metadata
            .segments
            .iter()
            .filter(|s| s.record_count == 0)
            .count();
        eprintln!(
            "pos: {} records in {} segments ({empty} empty), {acked} acked before the kill",
            all.len(),
            info.metadata.segments.len()
        );
        let l = info.lookups.expect("lookups");
        assert_eq!(l.first_dlsn, Some(all[0].0));
        assert_eq!(l.last_dlsn, Some(all[all.len() - 1].0));
        assert_eq!(l.record_count, all.len() as u64);
        assert_eq!(l.last_write_time_ms, Some(all[all.len() - 1].2));
        assert!(!l.sealed);

        // txid >= T: the first record with that txid (three records share each txid), also
        // around the kill and past the end (tail: nothing yet).
        for t in [
            0u64,
            1,
            50,
            133,
            300,
            acked / 3,
            acked / 3 + 1,
            660,
            666,
            699,
            700,
            701,
        ] {
            let expect = all.iter().position(|r| r.1 >= t).unwrap();
            check_from(&c, "pos", Position::TxId(t), &all, expect).await;
        }
        check_from(&c, "pos", Position::TxId(10_000), &all, all.len()).await;
        // write time >= T, at every distinct write time of a sample of records.
        for k in (0..all.len()).step_by(97).chain([all.len() - 1]) {
            let t = all[k].2;
            let expect = all.iter().position(|r| r.2 >= t).unwrap();
            check_from(&c, "pos", Position::WriteTime(t), &all, expect).await;
            check_from(
                &c,
                "pos",
                Position::WriteTime(t + 1),
                &all,
                all.iter().position(|r| r.2 > t).unwrap_or(all.len()),
            )
            .await;
        }
        check_from(&c, "pos", Position::WriteTime(0), &all, 0).await;
        // last N, including more than the stream holds.
        for n in [1usize, 2, 7, 200, 1000, all.len(), all.len() + 5] {
            check_from(
                &c,
                "pos",
                Position::LastN(n as u64),
                &all,
                all.len().saturating_sub(n),
            )
            .await;
        }

        // Tail: a waiting read gets exactly the next record written.
        let c2 = ProxyClient::connect(&sandbox.addr).await.unwrap();
        let tail = tokio::spawn(async move {
            c2.read_from("pos", Position::Tail, 10, Duration::from_secs(20))
                .await
                .unwrap()
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let w = c
            .write("pos", vec![(800, b"the next one".to_vec())], false)
            .await
            .unwrap();
        let b = tail.await.unwrap();
        assert_eq!(
            b.records,
            vec![(w.first_dlsn, 800, b"the next one".to_vec())]
        );
        let (all, _) = read_to_end(&c, "pos", Position::Head).await;

        // A truncated head: txid, time and last-N positions before it answer from the point;
        // an explicit DLSN before it stays TRUNCATED.
        let cut = all.len() / 2;
        c.truncate("pos", all[cut].0).await.unwrap();
        check_from(&c, "pos", Position::TxId(0), &all, cut).await;
        check_from(&c, "pos", Position::WriteTime(0), &all, cut).await;
        check_from(&c, "pos", Position::LastN(all.len() as u64), &all, cut).await;
        check_from(
            &c,
            "pos",
            Position::TxId(all[cut + 5].1),
            &all,
            all.iter().position(|r| r.1 >= all[cut + 5].1).unwrap(),
        )
        .await;
        let e = c
            .read_from("pos", Position::Dlsn(all[1].0), 10, Duration::ZERO)
            .await
            .unwrap_err();
        assert_eq!(code(&e), ErrorCode::Truncated, "{e}");
        let l = c.describe_stream("pos").await.unwrap().lookups.unwrap();
        assert_eq!(l.first_dlsn, Some(all[cut].0));

        // A stream whose records all carry one txid, over several segments.
        for i in 0..10u64 {
            let records = (0..10)
                .map(|k| {
                    (
                        42u64,
                        format!("same {i} {k} {}", "y".repeat(100)).into_bytes(),
                    )
                })
                .collect();
            c.write("one", records, true).await.unwrap();
        }
        let (one, _) = read_to_end(&c, "one", Position::Head).await;
        assert_eq!(one.len(), 100);
        assert!(one.last().unwrap().0.segment_seq_no > 2);
        check_from(&c, "one", Position::TxId(42), &one, 0).await;
        check_from(&c, "one", Position::TxId(7), &one, 0).await;
        check_from(&c, "one", Position::TxId(43), &one, 100).await;

        // Seal: a tail read waiting at the end gets end_of_stream after the last record;
        // writes are refused.
        let c2 = ProxyClient::connect(&sandbox.addr).await.unwrap();
        let at = Position::Dlsn(one[99].0);
        let tail = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut at = at;
            loop {
                let b = c2
                    .read_from("one", at, 10, Duration::from_secs(20))
                    .await
                    .unwrap();
                got.extend(b.records);
                if b.end_of_stream {
                    return got;
                }
                at = b.next;
            }
        });
        let last = c.seal_stream("one").await.unwrap();
        assert_eq!(last, Some(one[99].0));
        assert_eq!(
            c.seal_stream("one").await.unwrap(),
            last,
            "sealing twice changes nothing"
        );
        let got = tokio::time::timeout(Duration::from_secs(20), tail)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, vec![(one[99].0, 42, one[99].3.clone())]);
        let e = c
            .write("one", vec![(42, b"late".to_vec())], false)
            .await
            .unwrap_err();
        assert_eq!(code(&e), ErrorCode::EndOfStream, "{e}");
        let (again, eos) = read_to_end(&c, "one", Position::Head).await;
        assert!(
            eos && again == one,
            "a reader gets every record, then the end"
        );
        let b = c
            .read_from("one", Position::Tail, 10, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(
            b.end_of_stream && b.records.is_empty(),
            "a tail of a sealed stream ends at once"
        );
        assert!(
            c.describe_stream("one")
                .await
                .unwrap()
                .lookups
                .unwrap()
                .sealed
        );
    });
    sandbox.stop();
    // After a restart the seal holds; truncation and deletion still work.
    let sandbox = Sandbox::start(dir.path(), FLAGS);
    rt.block_on(async {
        let c = ProxyClient::connect(&sandbox.addr).await.unwrap();
        let e = c
            .write("one", vec![(42, b"later".to_vec())], false)
            .await
            .unwrap_err();
        assert_eq!(code(&e), ErrorCode::EndOfStream, "{e}");
        let (one, eos) = read_to_end(&c, "one", Position::Head).await;
        assert!(eos && one.len() == 100);
        c.truncate("one", one[50].0).await.unwrap();
        let (rest, eos) = read_to_end(&c, "one", Position::Head).await;
        assert!(eos && rest[..] == one[50..]);
        c.delete_stream("one").await.unwrap();
        c.write("one", vec![(1, b"a new stream".to_vec())], true)
            .await
            .unwrap();
    });
    sandbox.stop();
    eprintln!("positions test took {:?}", started.elapsed());
}

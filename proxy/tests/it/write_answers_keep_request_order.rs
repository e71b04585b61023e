//! Goal: write answers for one stream on one connection leave the proxy in request order, on
//! every path: successes, errors from the stream task in their turn (`TXID_OUT_OF_ORDER`), and
//! errors found before the write reaches the stream (`BAD_REQUEST` for a reserved txid,
//! `RECORD_TOO_LARGE`), while thousands of writes are pipelined, share entries, and other
//! streams are written on the same connection (docs/proxy-protocol.md, "Write": "Writes to a
//! stream are acknowledged in the order the proxy received them").
//! Method: three real bookies, a proxy server on a multi-threaded runtime, one raw TCP
//! connection on which 4,400 write frames are sent without waiting (3,300 to the stream under
//! test, 1,100 spread over three others) while a second task reads the answers; per stream,
//! every answer whose request id is below one already answered counts as out of order. Then
//! every acknowledged record is read back once, in order, where its answer said.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::raw::Raw;
use quire_client::protocol::{Request, Response};
use quire_client::{Dlsn, ProxyClient, ReadPosition};
use quire_proxy::{ErrorCode, StreamConfig};
use tokio::io::AsyncWriteExt;

const REQUESTS: u64 = 4_400;
const STREAM: &str = "ordered";

/// What the test expects of request `i`'s answer.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Written,
    Code(ErrorCode),
}

/// The request sent as number `i` (request id `i + 1`): its stream, records and expected answer.
fn request(i: u64) -> (String, Vec<(u64, Vec<u8>)>, Expect) {
    if i % 4 == 3 {
        // Other streams, interleaved.
        let s = format!("other-{}", i % 3);
        return (s, vec![(i, payload(i, 0))], Expect::Written);
    }
    if i % 397 == 5 {
        return (
            STREAM.into(),
            vec![(i, payload(i, 0)), (u64::MAX, payload(i, 1))],
            Expect::Code(ErrorCode::BadRequest),
        );
    }
    if i % 451 == 7 {
        // Below the stream's last txid: refused by the stream task in its turn.
        return (
            STREAM.into(),
            vec![(0, payload(i, 0))],
            Expect::Code(ErrorCode::TxidOutOfOrder),
        );
    }
    if i == 1_001 || i == 3_001 {
        return (
            STREAM.into(),
            vec![(i, vec![7; quire_client::RECORD_SIZE_BYTES_MAX + 1])],
            Expect::Code(ErrorCode::RecordTooLarge),
        );
    }
    let n = 1 + i % 3;
    let records = (0..n).map(|k| (i, payload(i, k))).collect();
    (STREAM.into(), records, Expect::Written)
}

/// 64 to 863 bytes naming request `i` and record `k` in its first 16 bytes.
fn payload(i: u64, k: u64) -> Vec<u8> {
    let len = 64 + ((i * 31 + k * 17) % 800) as usize;
    let mut p = Vec::with_capacity(len);
    p.extend_from_slice(&i.to_le_bytes());
    p.extend_from_slice(&k.to_le_bytes());
    p.extend((16..len).map(|b| (b as u64 + i) as u8));
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pipelined_write_answers_follow_request_order() {
    let c = common::cluster().await;
    // Small entries so that the 3,300 writes make hundreds of entries, several writes each,
    // and segments roll while writes are in flight.
    let config = StreamConfig {
        segment_size_bytes_max: 512 * 1024,
        entry_size_bytes_target: 16 * 1024,
        ..StreamConfig::default()
    };
    let p = common::proxy(&c, config).await;

    let sock = Raw::greeted(p.server.local_addr()).await.s;
    let (rd, mut wr) = sock.into_split();
    let mut rd = Raw::new(rd);

    let mut expected = HashMap::new();
    let mut frames = Vec::new();
    for i in 0..REQUESTS {
        let (stream, records, expect) = request(i);
        expected.insert(i + 1, (stream.clone(), records.clone(), expect));
        Request::Write {
            stream,
            create_if_missing: true,
            compress: false,
            records,
        }
        .encode(i + 1, &mut frames);
    }
    let sender = tokio::spawn(async move {
        for chunk in frames.chunks(64 * 1024) {
            wr.write_all(chunk).await.unwrap();
        }
        wr
    });

    let mut answers: Vec<(u64, Response)> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while answers.len() < REQUESTS as usize {
        let answer = tokio::time::timeout_at(deadline, rd.next())
            .await
            .expect("every write is answered within 120 s")
            .expect("the proxy closed the connection");
        answers.push(answer);
    }
    let _wr = sender.await.unwrap();

    // Per stream: answers in request-id order. An answer whose id is below one already
    // answered for its stream counts as out of order.
    let mut highest: HashMap<String, u64> = HashMap::new();
    let mut out_of_order: HashMap<String, usize> = HashMap::new();
    for (id, _) in &answers {
        let stream = &expected.get(id).expect("one answer per request").0;
        let h = highest.entry(stream.clone()).or_insert(0);
        if *id < *h {
            *out_of_order.entry(stream.clone()).or_default() += 1;
        }
        *h = (*h).max(*id);
    }
    eprintln!("out-of-order answers per stream: {out_of_order:?}");
    assert!(
        out_of_order.is_empty(),
        "answers left the proxy out of request order: {out_of_order:?} (of {REQUESTS} writes)"
    );

    let mut last_dlsn: Option<Dlsn> = None;
    let mut acked: Vec<(Dlsn, u64, u64)> = Vec::new(); // (first DLSN, request index, records)
    for (id, resp) in &answers {
        let (stream, records, expect) = expected.remove(id).expect("one answer per request");
        match (expect, resp) {
            (
                Expect::Written,
                Response::Write {
                    count,
                    first_dlsn,
                    last_dlsn: last,
                },
            ) => {
                assert_eq!(*count as usize, records.len());
                if stream == STREAM {
                    assert!(
                        last_dlsn.is_none_or(|l| l < *first_dlsn),
                        "request {id}: DLSNs grow in answer order"
                    );
                    last_dlsn = Some(*last);
                    acked.push((*first_dlsn, id - 1, records.len() as u64));
                }
            }
            (Expect::Code(want), Response::Error { code, .. }) => {
                assert_eq!(*code, want, "request {id}: {resp:?}");
            }
            (want, got) => panic!("request {id}: expected {want:?}, got {got:?}"),
        }
    }
    assert!(expected.is_empty());

    // Every acknowledged record reads back once, in order, where its answer said.
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    let mut got = Vec::new();
    let mut pos = ReadPosition::Head;
    loop {
        let b = client
            .read(STREAM, pos, 1000, 1 << 20, Duration::ZERO)
            .await
            .unwrap();
        if b.records.is_empty() {
            break;
        }
        got.extend(b.records);
        pos = b.next;
    }
    let want: usize = acked.iter().map(|a| a.2 as usize).sum();
    assert_eq!(got.len(), want, "every acknowledged record reads back once");
    let mut k = 0;
    for (first, i, n) in &acked {
        assert_eq!(
            got[k].0, *first,
            "request {i}: its records start where its answer said"
        );
        for r in 0..*n {
            let (_, txid, data) = &got[k];
            assert_eq!(*txid, *i);
            assert_eq!(*data, payload(*i, r));
            k += 1;
        }
    }
    let entries: std::collections::HashSet<(u64, u64)> = got
        .iter()
        .map(|(d, _, _)| (d.segment_seq_no, d.entry_id))
        .collect();
    eprintln!(
        "{} records of {} writes in {} entries",
        got.len(),
        acked.len(),
        entries.len()
    );
    assert!(
        entries.len() * 2 < acked.len(),
        "writes shared entries ({} entries for {} writes)",
        entries.len(),
        acked.len()
    );
}

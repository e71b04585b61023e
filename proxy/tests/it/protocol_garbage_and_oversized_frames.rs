//! Goal: malformed and oversized input to the proxy server gets an error reply or a closed
//! connection, never a crash, and the server keeps serving other clients.
//! Method: raw TCP connections sending: a request before the handshake, a bad magic, random
//! garbage, a frame length above the limit, a too-short length, malformed bodies and an
//! unknown opcode after a good handshake; after each, a normal client still works.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::raw::{hello, Raw};
use quire_client::protocol::{Request, Response};
use quire_client::{ProxyClient, ReadPosition};
use quire_proxy::ErrorCode;
use quire_wire::frame::{encode_frame, FrameHeader};

/// Sends `bytes`, then collects frames until the proxy closes the connection or goes quiet
/// for 700 ms; true when it closed.
async fn exchange(addr: SocketAddr, bytes: &[u8]) -> (Vec<(u64, Response)>, bool) {
    let mut s = Raw::connect(addr).await;
    let _ = s.send(bytes).await;
    let mut out = Vec::new();
    loop {
        match s.next_within(Duration::from_millis(700)).await {
            Err(_) => return (out, false),
            Ok(None) => return (out, true),
            Ok(Some(f)) => out.push(f),
        }
    }
}

/// Sends `bytes` and ends the client's side of the connection, then waits until the proxy has
/// read it all and closed the connection (it sees the end after the bytes, so waiting for the
/// close is waiting for the bytes to be handled, without a quiet period).
async fn send_then_end(addr: SocketAddr, bytes: &[u8]) {
    use tokio::io::AsyncWriteExt;
    let mut s = Raw::connect(addr).await;
    let _ = s.send(bytes).await;
    let _ = s.s.shutdown().await;
    s.until_closed().await;
}

fn code_of(r: &Response) -> Option<ErrorCode> {
    match r {
        Response::Error { code, .. } => Some(*code),
        _ => None,
    }
}

async fn still_serving(addr: SocketAddr) {
    let client = ProxyClient::connect(addr).await.unwrap();
    client
        .write("alive", vec![(1, b"ok".to_vec())], true)
        .await
        .unwrap();
    let b = client
        .read("alive", ReadPosition::Head, 1, 1024, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(b.records[0].2, b"ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_oversized_frames_are_refused() {
    let c = common::cluster().await;
    let p = common::proxy(&c, common::small_config()).await;
    let addr = p.server.local_addr();

    // A request before the handshake: an error, then the connection closes.
    let mut v = Vec::new();
    Request::ListStreams.encode(5, &mut v);
    let (answers, closed) = exchange(addr, &v).await;
    assert!(closed);
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].0, 5);
    assert_eq!(code_of(&answers[0].1), Some(ErrorCode::BadRequest));

    // Bad magic.
    let mut v = Vec::new();
    encode_frame(
        &mut v,
        FrameHeader {
            opcode: 1,
            flags: 0,
            status: 0,
            request_id: 1,
        },
        b"XXXX\x01\x00\x01\x00",
    );
    let (answers, closed) = exchange(addr, &v).await;
    assert!(closed);
    assert_eq!(code_of(&answers[0].1), Some(ErrorCode::BadRequest));

    // A version range we do not speak.
    let mut v = Vec::new();
    Request::Hello {
        version_min: 7,
        version_max: 9,
        token: None,
    }
    .encode(1, &mut v);
    let (answers, closed) = exchange(addr, &v).await;
    assert!(closed);
    assert_eq!(code_of(&answers[0].1), Some(ErrorCode::UnsupportedVersion));

    // Oversized and undersized length fields, before and after the handshake.
    for len in [u32::MAX, 6 << 20, 3] {
        for greet in [false, true] {
            let mut v = if greet { hello() } else { Vec::new() };
            v.extend_from_slice(&len.to_le_bytes());
            v.extend_from_slice(&[0u8; 64]);
            let (answers, closed) = exchange(addr, &v).await;
            assert!(closed, "len {len} greet {greet}");
            let last = answers.last().unwrap();
            assert_eq!(last.0, 0, "connection-level errors use request id 0");
            assert_eq!(code_of(&last.1), Some(ErrorCode::BadRequest));
        }
    }

    // Random garbage: the proxy answers or closes, and does not fall over.
    let mut x: u32 = 99;
    for round in 0..20 {
        let len = 1 + round * 37;
        let g: Vec<u8> = (0..len)
            .map(|_| {
                x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                (x >> 24) as u8
            })
            .collect();
        let mut v = if round % 2 == 0 { hello() } else { Vec::new() };
        v.extend_from_slice(&g);
        send_then_end(addr, &v).await;
    }

    // After a good handshake: malformed bodies and an unknown opcode get BAD_REQUEST with their
    // request ids, and the connection stays usable.
    let mut v = hello();
    encode_frame(
        &mut v,
        FrameHeader {
            opcode: 0x04,
            flags: 0,
            status: 0,
            request_id: 10,
        },
        &[1, 2, 3],
    );
    encode_frame(
        &mut v,
        FrameHeader {
            opcode: 0x05,
            flags: 0,
            status: 0,
            request_id: 11,
        },
        &[0xff; 40],
    );
    encode_frame(
        &mut v,
        FrameHeader {
            opcode: 0x42,
            flags: 0,
            status: 0,
            request_id: 12,
        },
        &[],
    );
    let mut tail_write = Vec::new();
    tail_write.extend_from_slice(&1u32.to_le_bytes());
    tail_write.push(b's');
    tail_write.extend_from_slice(&u32::MAX.to_le_bytes()); // absurd record count
    encode_frame(
        &mut v,
        FrameHeader {
            opcode: 0x04,
            flags: 0,
            status: 0,
            request_id: 13,
        },
        &tail_write,
    );
    Request::Hello {
        version_min: 1,
        version_max: 1,
        token: None,
    }
    .encode(14, &mut v);
    Request::ListStreams.encode(15, &mut v);
    // The Hello's answer and one per request 10 to 15; then a request sent after them is still
    // answered: the malformed bodies did not close the connection.
    let mut s = Raw::connect(addr).await;
    s.send(&v).await.unwrap();
    let answers = s.take(7).await;
    s.send(&common::raw::frame(16, &Request::ListStreams))
        .await
        .unwrap();
    let after = s.next().await;
    assert!(
        matches!(after, Some((16, Response::ListStreams { .. }))),
        "a malformed body must not close the connection: {after:?}"
    );
    let by_id = |id| {
        answers
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, r)| r.clone())
            .unwrap()
    };
    for id in 10..=14 {
        assert_eq!(
            code_of(&by_id(id)),
            Some(ErrorCode::BadRequest),
            "request {id}"
        );
    }
    assert!(matches!(by_id(15), Response::ListStreams { .. }));

    still_serving(addr).await;
}

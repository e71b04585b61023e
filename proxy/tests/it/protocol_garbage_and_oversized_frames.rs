//! Goal: malformed and oversized input to the proxy server gets an error reply or a closed
//! connection, never a crash, and the server keeps serving other clients.
//! Method: raw TCP connections sending: a request before the handshake, a bad magic, random
//! garbage, a frame length above the limit, a too-short length, malformed bodies and an
//! unknown opcode after a good handshake; after each, a normal client still works.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use quire_client::protocol::{Request, Response};
use quire_client::{ProxyClient, ReadPosition};
use quire_proxy::ErrorCode;
use quire_wire::frame::{decode_frame, encode_frame, FrameHeader};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `bytes`, then collects frames until the proxy closes the connection or goes quiet.
async fn exchange(addr: SocketAddr, bytes: &[u8]) -> (Vec<(u64, Response)>, bool) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(bytes).await;
    let mut buf = Vec::new();
    let mut out = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout(Duration::from_millis(700), s.read(&mut chunk)).await {
            Err(_) => return (out, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (out, true),
            Ok(Ok(n)) => {
                buf.extend_from_slice(&chunk[..n]);
                while let Some((f, used)) = decode_frame(&buf, 8 << 20).unwrap() {
                    out.push((f.header.request_id, Response::decode(&f).unwrap()));
                    buf.drain(..used);
                }
            }
        }
    }
}

fn hello() -> Vec<u8> {
    let mut v = Vec::new();
    Request::Hello {
        version_min: 1,
        version_max: 1,
        token: None,
    }
    .encode(1, &mut v);
    v
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
        let _ = exchange(addr, &v).await;
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
    let (answers, closed) = exchange(addr, &v).await;
    assert!(!closed, "a malformed body must not close the connection");
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

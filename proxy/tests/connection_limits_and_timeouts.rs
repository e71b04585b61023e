//! Goal: the proxy server does not hold connections for ever: a connection that never completes
//! its handshake is answered and closed after `handshake_timeout`, a handshaken connection with
//! nothing in flight is closed after `idle_timeout` (but a waiting tail read keeps it open, and
//! the client reconnects afterwards), and connections beyond `connections_max` get
//! SERVICE_UNAVAILABLE and are closed; a connection that does not read its answers stops
//! being served and is closed after `send_timeout`.
//! Method: a real cluster (three bookies, embedded metadata store) behind a proxy with small
//! limits; raw TCP connections observe what the server sends and when it closes (every wait is
//! bounded so a broken server fails the test instead of hanging it); `ProxyClient` checks the
//! client-side view.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quire_ledger::BookKeeper;
use quire_proxy::protocol::{Request, Response};
use quire_proxy::{
    Error, ErrorCode, ProxyClient, ProxyServer, ReadPosition, ServerConfig, StreamManager,
};
use quire_wire::frame::decode_frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest any single observation may take before the test calls the server broken.
const BOUND: Duration = Duration::from_secs(20);

async fn proxy_with(
    c: &common::Cluster,
    server: ServerConfig,
) -> (Arc<StreamManager>, ProxyServer) {
    let bk = BookKeeper::new(c.store.clone(), quire_ledger::ClientConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = common::small_config();
    config.owner_address = listener.local_addr().unwrap().to_string();
    let streams = StreamManager::new(c.store.clone(), bk, config);
    let server = ProxyServer::start(listener, streams.clone(), server).unwrap();
    (streams, server)
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

/// Reads frames until the server closes the connection; panics if it stays open past `BOUND`.
async fn frames_until_closed(s: &mut TcpStream) -> Vec<(u64, Response)> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout(BOUND, s.read(&mut chunk)).await {
            Err(_) => {
                panic!("the server kept the connection open for {BOUND:?}; frames so far: {out:?}")
            }
            Ok(Ok(0)) | Ok(Err(_)) => return out,
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

/// Connects and completes the handshake on a raw connection.
async fn greeted(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&hello()).await.unwrap();
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 256];
        let n = tokio::time::timeout(BOUND, s.read(&mut chunk))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed during the handshake");
        buf.extend_from_slice(&chunk[..n]);
        if let Some((f, _)) = decode_frame(&buf, 8 << 20).unwrap() {
            assert!(matches!(
                Response::decode(&f).unwrap(),
                Response::Hello { .. }
            ));
            return s;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_without_a_handshake_are_closed() {
    let c = common::cluster().await;
    let config = ServerConfig {
        handshake_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    };
    let (_streams, server) = proxy_with(&c, config).await;
    let addr = server.local_addr();

    // Silent after connecting, and a Hello cut short (10 of its 24 bytes): both are answered
    // BAD_REQUEST with request id 0 and closed.
    for sent in [Vec::new(), hello()[..10].to_vec()] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&sent).await.unwrap();
        let frames = frames_until_closed(&mut s).await;
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert_eq!(frames[0].0, 0);
        match &frames[0].1 {
            Response::Error { code, message } => {
                assert_eq!(*code, ErrorCode::BadRequest);
                assert!(message.contains("handshake"), "{message}");
            }
            other => panic!("expected an error, got {other:?}"),
        }
    }

    // A completed handshake is not subject to the handshake timeout: the connection still
    // serves after several handshake timeouts have passed.
    let client = ProxyClient::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    client.list_streams().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_but_waiting_tail_reads_are_not() {
    let c = common::cluster().await;
    let config = ServerConfig {
        idle_timeout: Duration::from_millis(1000),
        ..ServerConfig::default()
    };
    let (_streams, server) = proxy_with(&c, config).await;
    let addr = server.local_addr();

    // A handshaken connection that sends nothing more is closed, without an answer.
    let mut s = greeted(addr).await;
    let frames = frames_until_closed(&mut s).await;
    assert!(frames.is_empty(), "{frames:?}");

    // A tail read waiting longer than the idle timeout is in flight: the connection stays open
    // and the read is answered (with no records, as nothing was written).
    let client = ProxyClient::connect(addr).await.unwrap();
    client.create_stream("idle-tail").await.unwrap();
    let batch = client
        .read(
            "idle-tail",
            ReadPosition::Head,
            10,
            1 << 20,
            Duration::from_millis(2500),
        )
        .await
        .unwrap();
    assert!(batch.records.is_empty());

    // Requests spaced below the idle timeout keep the connection; their total span exceeds it.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        client.list_streams().await.unwrap();
    }

    // Left idle past the timeout, the connection is closed by the server; the client connects
    // again on its next request.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    client
        .write("idle-tail", vec![(1, b"after idle".to_vec())], false)
        .await
        .unwrap();
    let batch = client
        .read("idle-tail", ReadPosition::Head, 10, 1 << 20, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(batch.records[0].2, b"after idle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_get_service_unavailable() {
    let c = common::cluster().await;
    let config = ServerConfig {
        connections_max: 3,
        ..ServerConfig::default()
    };
    let (_streams, server) = proxy_with(&c, config).await;
    let addr = server.local_addr();

    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(greeted(addr).await);
    }

    // The fourth connection is answered SERVICE_UNAVAILABLE (request id 0) and closed, whether
    // or not it sent its Hello.
    for send_hello in [false, true] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        if send_hello {
            s.write_all(&hello()).await.unwrap();
        }
        let frames = frames_until_closed(&mut s).await;
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert_eq!(frames[0].0, 0);
        match &frames[0].1 {
            Response::Error { code, message } => {
                assert_eq!(*code, ErrorCode::ServiceUnavailable);
                assert!(
                    message.contains("maximum of 3 open connections"),
                    "{message}"
                );
            }
            other => panic!("expected an error, got {other:?}"),
        }
    }
    // The client reports the refusal as the proxy's answer.
    match ProxyClient::connect(addr).await {
        Err(
            e @ Error::Remote {
                code: ErrorCode::ServiceUnavailable,
                ..
            },
        ) => {
            assert!(
                e.to_string().contains("maximum of 3 open connections"),
                "{e}"
            );
        }
        other => panic!("expected SERVICE_UNAVAILABLE, got {other:?}"),
    }

    // Closing one connection frees its slot (once the server has seen the close).
    drop(held.pop());
    let deadline = tokio::time::Instant::now() + BOUND;
    let client = loop {
        match ProxyClient::connect(addr).await {
            Ok(client) => break client,
            Err(e)
                if e.code() == ErrorCode::ServiceUnavailable
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("the freed slot was not reused: {e}"),
        }
    };
    client
        .write("limit", vec![(1, b"x".to_vec())], true)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_its_answers_is_not_served_then_closed() {
    // Goal: pipelined reads whose answers are never read stop being served once the
    // connection's response budget (`connection_response_bytes_max`) and the socket buffers
    // are full, and the connection is closed after `send_timeout`; without the bounds all 200
    // reads (800 MB of answers) are served and the connection stays open.
    let c = common::cluster().await;
    let config = ServerConfig {
        send_timeout: Duration::from_secs(2),
        ..ServerConfig::default()
    };
    let (_streams, server) = proxy_with(&c, config).await;
    let addr = server.local_addr();
    let client = ProxyClient::connect(addr).await.unwrap();
    for i in 0..6u64 {
        client
            .write("unread", vec![(i + 1, vec![b'u'; 900_000])], true)
            .await
            .unwrap();
    }
    let mut s = greeted(addr).await;
    let mut reads = Vec::new();
    for id in 0..200u64 {
        Request::Read {
            stream: "unread".into(),
            from: ReadPosition::Head,
            max_records: 100,
            max_bytes: 4 << 20,
            wait_ms: 0,
        }
        .encode(10 + id, &mut reads);
    }
    s.write_all(&reads).await.unwrap();
    // The send timeout is what is checked: let it pass without reading.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let frames = frames_until_closed(&mut s).await;
    assert!(
        frames.len() < 50,
        "{} of 200 unread reads were answered",
        frames.len()
    );
    // Other clients are still served.
    let batch = client
        .read("unread", ReadPosition::Head, 1, 1 << 20, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(batch.records.len(), 1);
}

//! Goal: a write is never reported with an unknown outcome, nor failed, only because a proxy
//! drained or a redirect named a proxy that has gone: (a) a draining proxy ends each connection
//! with a connection-level SERVICE_UNAVAILABLE (request id 0) after the answers to what it
//! read, and closes without a reset, so the client knows that a request it got no answer for
//! was not read; (b) a client redirected to a proxy that refuses the connection asks its home
//! proxy again (within `redirects_max`) instead of failing the write with `RedirectFailed`.
//! Method: a real cluster (three bookies, embedded metadata store) behind in-process proxies;
//! a raw TCP connection observes (a); `ProxyClient` observes (b).

use crate::common;

use std::time::Duration;

use common::raw::{Raw, BOUND};
use quire_client::protocol::{Request, Response};
use quire_client::ProxyClient;
use quire_proxy::ErrorCode;

fn write_frame(request_id: u64, stream: &str) -> Vec<u8> {
    let mut v = Vec::new();
    Request::Write {
        stream: stream.into(),
        create_if_missing: true,
        compress: false,
        records: vec![(1, b"never read".to_vec())],
    }
    .encode(request_id, &mut v);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_connection_ends_with_a_connection_level_service_unavailable() {
    // Method: a write acknowledged before the drain; then a write whose frame is cut in half
    // (the proxy waits for the rest); drain. The client must read the first answer, then
    // exactly one more frame, request id 0, SERVICE_UNAVAILABLE; the rest and one more write
    // sent after it get nothing but the end of the connection; the stream of the unread
    // writes was never created.
    let c = common::cluster().await;
    let p = common::proxy(&c, common::small_config()).await;
    let mut s = Raw::greeted(p.server.local_addr()).await;
    s.send(&write_frame(2, "drain/read")).await.unwrap();
    let half = write_frame(3, "drain/unread");
    s.send(&half[..half.len() / 2]).await.unwrap();
    // The first write's answer before the drain starts.
    let first = s
        .next()
        .await
        .expect("closed before answering the first write");
    assert!(
        matches!(first, (2, Response::Write { count: 1, .. })),
        "{first:?}"
    );
    let common::Proxy { streams, server } = p;
    let drain = tokio::spawn(async move {
        let r = server.drain(&streams).await;
        drop(server);
        r
    });
    // The drained connection's last answer proves it has stopped reading: only then is the
    // rest sent (a fixed pause raced a slow drain, which then read the rest and answered it).
    let last = s.next().await;
    match &last {
        Some((
            0,
            Response::Error {
                code: ErrorCode::ServiceUnavailable,
                message,
            },
        )) => assert!(message.contains("not read"), "{message}"),
        other => panic!("expected a connection-level SERVICE_UNAVAILABLE, got {other:?}"),
    }
    // The server has shut its side; these writes may or may not reach it.
    let _ = s.send(&half[half.len() / 2..]).await;
    let _ = s.send(&write_frame(4, "drain/unread")).await;
    let after = s.until_closed().await;
    assert!(after.is_empty(), "frames after the last answer: {after:?}");
    tokio::time::timeout(BOUND, drain)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        c.store.read_stream("drain/unread").await.is_err(),
        "an unread write was carried out"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_a_refusing_proxy_goes_back_to_the_home_proxy() {
    // Method: the stream's lease is held under the address of a closed port (a proxy that
    // has gone), so the home proxy redirects there and the connection is refused; 60 ms
    // later the lease is released. The client's write must succeed through the home proxy
    // (which takes the stream) instead of failing with RedirectFailed at the first refusal.
    let c = common::cluster().await;
    let p = common::proxy(&c, common::small_config()).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    client.create_stream("moved/away").await.unwrap();
    let gone = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().to_string()
    };
    let lease = c
        .store
        .try_acquire_stream("moved/away", &gone)
        .await
        .unwrap()
        .unwrap();
    let store = c.store.clone();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(60)).await;
        store.release_stream(lease).await.unwrap();
    });
    let r = client
        .write("moved/away", vec![(1, b"after the move".to_vec())], false)
        .await;
    release.await.unwrap();
    let r = r.unwrap_or_else(|e| panic!("the write failed: {e}"));
    assert_eq!(r.count, 1);
    assert_eq!(
        c.store.stream_owner("moved/away").await.unwrap().as_deref(),
        Some(p.server.local_addr().to_string().as_str())
    );
}

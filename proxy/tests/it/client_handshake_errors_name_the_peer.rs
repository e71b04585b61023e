//! Goal: a client pointed at something that is not a Quire proxy says so, naming the address
//! and what it answered, instead of a protocol error or a plain connect timeout: a real bookie
//! port, a server answering with an HTTP status line, a listener that never answers, and one
//! that closes at once.
//! Method: a real bookie (from the test cluster) and plain TCP listeners on 127.0.0.1 in the
//! test (the HTTP-like one writes a status line after reading the hello); check the error
//! variant and its one-line message.

use crate::common;

use std::time::Duration;

use quire_client::{ClientConfig, ProxyClient};
use quire_proxy::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn quick() -> ClientConfig {
    ClientConfig {
        connect_timeout: Duration::from_millis(500),
        ..ClientConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bookie_port_is_not_a_proxy() {
    let c = common::cluster().await;
    let addr = c.bookies[0].addr();
    let e = ProxyClient::connect_with(addr, ClientConfig::default())
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::NotAProxy { .. }), "{e:?}");
    assert!(
        text.starts_with(&format!("{addr} is not a Quire proxy (it answered with ")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_silent_and_closing_listeners_are_named() {
    // An HTTP-like server: reads what the client sent and answers with a 400 status line.
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_addr = http.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = http.accept().await {
            tokio::spawn(async move {
                let mut b = [0u8; 64];
                let _ = s.read(&mut b).await;
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
                let _ = s.shutdown().await;
                let _ = s.read(&mut b).await;
            });
        }
    });
    let e = ProxyClient::connect_with(http_addr, quick())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NotAProxy { .. }), "{e:?}");
    assert_eq!(e.to_string(), format!("{http_addr} is not a Quire proxy (it answered with the text \"HTTP/1.1 400 Bad Request\" ...)"));

    // A listener whose connections are accepted and never answered.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            kept.push(s);
        }
    });
    let e = ProxyClient::connect_with(silent_addr, quick())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::HandshakeTimeout { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "{silent_addr} accepted the connection but did not answer the handshake within 0.5 s"
        )
    );
    holder.abort();

    // A listener that closes each connection at once.
    let closing = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closing_addr = closing.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = closing.accept().await {
            drop(s);
        }
    });
    let e = ProxyClient::connect_with(closing_addr, quick())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains(&format!(
            "{closing_addr} closed the connection without answering the handshake"
        )) || text.contains("reset")
            || text.contains("Broken pipe"),
        "{text}"
    );
}

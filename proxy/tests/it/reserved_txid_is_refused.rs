//! Goal: the txid u64::MAX, reserved for end-of-stream (DistributedLog's Long.MAX_VALUE), is
//! refused in writes by the proxy server and by the client, so no client can make a stream
//! unwritable; nothing of a refused write happens (not even the stream's creation).
//! Method: a real cluster behind a proxy; a raw connection sends a write whose second record
//! has txid u64::MAX (the client would not send it), then `ProxyClient::write` is tried with it;
//! afterwards the stream takes writes with the largest usable txid, twice.

use crate::common;

use std::time::Duration;

use quire_client::protocol::{Request, Response};
use quire_client::{ProxyClient, ReadPosition};
use quire_proxy::{Error, ErrorCode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txid_u64_max_is_refused_by_server_and_client() {
    let c = common::cluster().await;
    let p = common::proxy(&c, common::small_config()).await;
    let addr = p.server.local_addr();

    // Server side: a raw write with the create flag and txids [5, u64::MAX].
    let write = Request::Write {
        stream: "sealed".into(),
        create_if_missing: true,
        compress: false,
        records: vec![(5, b"a".to_vec()), (u64::MAX, b"b".to_vec())],
    };
    match common::raw::call(addr, &write).await {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::BadRequest);
            assert!(
                message.contains("record 1") && message.contains("reserved"),
                "{message}"
            );
        }
        other => panic!("expected BAD_REQUEST, got {other:?}"),
    }

    // Client side: refused before sending.
    let client = ProxyClient::connect(addr).await.unwrap();
    match client
        .write("sealed", vec![(u64::MAX, b"b".to_vec())], true)
        .await
    {
        Err(
            e @ Error::ReservedTxid {
                record_index: 0,
                txid: u64::MAX,
            },
        ) => assert_eq!(e.code(), ErrorCode::BadRequest),
        other => panic!("expected ReservedTxid, got {other:?}"),
    }

    // Neither attempt created the stream.
    assert!(!client
        .list_streams()
        .await
        .unwrap()
        .contains(&"sealed".to_string()));

    // The largest usable txid is accepted, and the stream stays writable after it. (The txid
    // before it is close to it: the txid guard refuses a jump of more than 2^40.)
    let top = u64::MAX - 1;
    client
        .write(
            "sealed",
            vec![(top - 1, b"x".to_vec()), (top, b"y".to_vec())],
            true,
        )
        .await
        .unwrap();
    client
        .write("sealed", vec![(top, b"z".to_vec())], false)
        .await
        .unwrap();
    let batch = client
        .read("sealed", ReadPosition::Head, 10, 1 << 20, Duration::ZERO)
        .await
        .unwrap();
    let got: Vec<(u64, &[u8])> = batch
        .records
        .iter()
        .map(|(_, t, p)| (*t, p.as_slice()))
        .collect();
    assert_eq!(
        got,
        vec![(top - 1, &b"x"[..]), (top, &b"y"[..]), (top, &b"z"[..])]
    );
}

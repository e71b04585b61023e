//! Goal: the txid guard (issue 12, item 6; Quire's own, DistributedLog has none). One write with
//! txid 2^64 − 2 used to poison a stream: it was accepted and every later normal write failed
//! with `TXID_OUT_OF_ORDER`. Now a txid more than `txid_jump_max` (default 2^40) above the txid
//! before it (the stream's last txid, or the previous record of the same write) is refused with
//! `TXID_TOO_FAR_AHEAD` (540) and a one-line reason, nothing of that write is written, and the
//! stream keeps taking normal writes. A stream's first record may have any txid below
//! `u64::MAX`; a jump of exactly the limit passes; `describe` shows the last txid while the
//! segment is open; a configured limit is honoured, also against the last txid a new owner
//! recovers; `None` turns the guard off.
//! Method: real bookies and the embedded metadata store behind a proxy; writes through
//! `ProxyClient` and a raw request frame, then a read-back of each stream.

use crate::common;

use std::time::Duration;

use quire_client::protocol::{Request, Response};
use quire_client::{ProxyClient, ReadPosition};
use quire_proxy::{ErrorCode, StreamConfig, TXID_JUMP_MAX_DEFAULT};

/// The largest usable txid, the one that poisoned a stream.
const POISON: u64 = u64::MAX - 1;

/// The tests' small segments with the given txid guard.
fn config_with(txid_jump_max: Option<u64>) -> StreamConfig {
    StreamConfig {
        txid_jump_max,
        ..common::small_config()
    }
}

/// Every record of `stream` from the head, as `(txid, payload)`.
async fn read_txids(client: &ProxyClient, stream: &str) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pos = ReadPosition::Head;
    loop {
        let batch = client
            .read(stream, pos, 100, 1 << 20, Duration::ZERO)
            .await
            .unwrap();
        if batch.records.is_empty() {
            return out;
        }
        out.extend(batch.records.into_iter().map(|(_, t, p)| (t, p)));
        pos = batch.next;
    }
}

/// Sends one write as a raw frame (after a handshake) and returns the proxy's answer to it.
async fn raw_write(
    addr: std::net::SocketAddr,
    stream: &str,
    records: Vec<(u64, Vec<u8>)>,
) -> Response {
    let write = Request::Write {
        stream: stream.into(),
        create_if_missing: false,
        compress: false,
        records,
    };
    common::raw::call(addr, &write).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn far_ahead_txids_are_refused_by_default_and_the_stream_stays_writable() {
    let c = common::cluster().await;
    let config = common::small_config();
    assert_eq!(TXID_JUMP_MAX_DEFAULT, 1 << 40);
    assert_eq!(
        config.txid_jump_max,
        Some(TXID_JUMP_MAX_DEFAULT),
        "on by default"
    );
    let p = common::proxy(&c, config).await;
    let addr = p.server.local_addr();
    let client = ProxyClient::connect(addr).await.unwrap();

    client
        .write("g", vec![(100, b"a".to_vec())], true)
        .await
        .unwrap();

    // The poisoning write, on the wire: its own code and a one-line reason.
    match raw_write(addr, "g", vec![(POISON, b"poison".to_vec())]).await {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::TxidTooFarAhead);
            assert_eq!(code as u16, 540);
            assert_eq!(code.name(), "TXID_TOO_FAR_AHEAD");
            assert!(
                message.contains("record 0")
                    && message.contains(&POISON.to_string())
                    && message.contains("(100)")
                    && message.contains("txid guard")
                    && !message.contains('\n'),
                "{message}"
            );
        }
        other => panic!("expected TXID_TOO_FAR_AHEAD, got {other:?}"),
    }
    // Through the client, and behind a good record: nothing of the write is written.
    let e = client
        .write("g", vec![(POISON, b"poison".to_vec())], false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::TxidTooFarAhead, "{e}");
    let e = client
        .write(
            "g",
            vec![(101, b"b".to_vec()), (POISON, b"poison".to_vec())],
            false,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::TxidTooFarAhead, "{e}");
    assert!(e.to_string().contains("record 1"), "{e}");

    // The stream still takes normal writes, and its last txid did not move.
    client
        .write("g", vec![(101, b"c".to_vec())], false)
        .await
        .unwrap();
    let info = client.describe_stream("g").await.unwrap();
    assert_eq!(info.metadata.max_txid, Some(101), "owner's live last txid");

    // A jump of exactly the limit passes, one more does not.
    let edge = 101 + TXID_JUMP_MAX_DEFAULT;
    let e = client
        .write("g", vec![(edge + 1, b"x".to_vec())], false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::TxidTooFarAhead, "{e}");
    client
        .write("g", vec![(edge, b"d".to_vec())], false)
        .await
        .unwrap();
    let info = client.describe_stream("g").await.unwrap();
    assert_eq!(info.metadata.max_txid, Some(edge));
    client
        .write("g", vec![(edge + 1, b"e".to_vec())], false)
        .await
        .unwrap();
    assert_eq!(
        read_txids(&client, "g").await,
        vec![
            (100, b"a".to_vec()),
            (101, b"c".to_vec()),
            (edge, b"d".to_vec()),
            (edge + 1, b"e".to_vec()),
        ]
    );

    // A stream's first record may have any txid below u64::MAX.
    client
        .write("first", vec![(POISON, b"y".to_vec())], true)
        .await
        .unwrap();
    client
        .write("first", vec![(POISON, b"z".to_vec())], false)
        .await
        .unwrap();
    assert_eq!(
        read_txids(&client, "first").await,
        vec![(POISON, b"y".to_vec()), (POISON, b"z".to_vec())]
    );

    // Within a stream's first write the guard applies from its second record; such a refused
    // write does not create its stream even with the create flag.
    let e = client
        .write(
            "mixed",
            vec![(5, b"m".to_vec()), (POISON, b"n".to_vec())],
            true,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::TxidTooFarAhead, "{e}");
    assert!(!client
        .list_streams()
        .await
        .unwrap()
        .contains(&"mixed".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_limit_is_honoured_across_owners_and_none_turns_the_guard_off() {
    let c = common::cluster().await;
    let limited = || config_with(Some(1000));

    // Proxy A with a limit of 1000.
    {
        let a = common::proxy(&c, limited()).await;
        let client = ProxyClient::connect(a.server.local_addr()).await.unwrap();
        client
            .write("s", vec![(1, b"a".to_vec())], true)
            .await
            .unwrap();
        let e = client
            .write("s", vec![(1002, b"x".to_vec())], false)
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::TxidTooFarAhead, "{e}");
        assert!(e.to_string().contains("more than 1000"), "{e}");
        client
            .write(
                "s",
                vec![(1001, b"b".to_vec()), (2001, b"c".to_vec())],
                false,
            )
            .await
            .unwrap();
        // Crash with the segment open: the stored max_txid has not seen 2001 yet.
        drop(client);
        drop(a);
    }
    common::wait_unowned(&c.store, "s").await;

    // Proxy B, same limit: it compares with the last txid its recovery found (2001).
    {
        let b = common::proxy(&c, limited()).await;
        let client = ProxyClient::connect(b.server.local_addr()).await.unwrap();
        let e = client
            .write("s", vec![(3002, b"x".to_vec())], false)
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::TxidTooFarAhead, "{e}");
        assert_eq!(
            client.describe_stream("s").await.unwrap().metadata.max_txid,
            Some(2001)
        );
        client
            .write("s", vec![(3001, b"d".to_vec())], false)
            .await
            .unwrap();
        assert_eq!(
            read_txids(&client, "s").await,
            vec![
                (1, b"a".to_vec()),
                (1001, b"b".to_vec()),
                (2001, b"c".to_vec()),
                (3001, b"d".to_vec()),
            ]
        );
        b.streams.shutdown().await.unwrap();
    }
    common::wait_unowned(&c.store, "s").await;

    // Proxy C without the guard: the poisoning write is taken, and then only the order rule
    // speaks, for good (what the guard exists to prevent).
    let off = config_with(None);
    let p = common::proxy(&c, off).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    client
        .write("s", vec![(POISON, b"e".to_vec())], false)
        .await
        .unwrap();
    let e = client
        .write("s", vec![(3002, b"f".to_vec())], false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::TxidOutOfOrder, "{e}");
}

//! Goal: bad input gets a clear error with the right stable code and loses nothing: a record
//! over 1,040,384 bytes, an unknown stream, an invalid name, a duplicate create, a txid below
//! the stream's last one.
//! Method: real bookies behind a proxy; each bad call through `ProxyClient` and, where the
//! client checks locally first, also through the `StreamManager` and a raw request, then a
//! read-back showing the stream holds exactly the good records.

use crate::common;

use std::time::Duration;

use quire_client::protocol::{Request, Response};
use quire_client::{ProxyClient, ReadPosition, RECORD_SIZE_BYTES_MAX};
use quire_proxy::{Error, ErrorCode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_their_error_codes() {
    let c = common::cluster().await;
    let p = common::proxy(&c, common::small_config()).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();

    // Unknown stream.
    let e = client
        .read("nope", ReadPosition::Head, 1, 1024, Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::NoSuchStream, "{e}");
    let e = client
        .write("nope", vec![(1, b"x".to_vec())], false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::NoSuchStream, "{e}");
    assert!(e.to_string().contains("nope"), "{e}");
    assert!(client.list_streams().await.unwrap().is_empty());

    // Invalid names and duplicates.
    for bad in ["", ".hidden", "a//b", "sp ace"] {
        let e = client.create_stream(bad).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidStreamName, "{bad:?}: {e}");
        let e = client
            .write(bad, vec![(1, b"x".to_vec())], true)
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidStreamName, "{bad:?}: {e}");
    }
    client.create_stream("s").await.unwrap();
    assert_eq!(
        client.create_stream("s").await.unwrap_err().code(),
        ErrorCode::StreamExists
    );

    client
        .write("s", vec![(5, b"a".to_vec()), (6, b"b".to_vec())], false)
        .await
        .unwrap();

    // Too large, by one byte: refused before anything is written, by the client, the stream
    // layer and the server.
    let big = vec![1u8; RECORD_SIZE_BYTES_MAX + 1];
    let e = client
        .write("s", vec![(7, b"ok".to_vec()), (7, big.clone())], false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::RecordTooLarge, "{e}");
    let e = p
        .streams
        .append("s", vec![(7, b"ok".to_vec()), (7, big.clone())], false)
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::RecordTooLarge { record_index: 1, size_bytes, max_bytes: 1_040_384 } if size_bytes == 1_040_385),
        "{e}"
    );
    let resp = common::raw::call(
        p.server.local_addr(),
        &Request::Write {
            stream: "s".into(),
            create_if_missing: false,
            compress: false,
            records: vec![(7, big)],
        },
    )
    .await;
    assert!(
        matches!(
            resp,
            Response::Error {
                code: ErrorCode::RecordTooLarge,
                ..
            }
        ),
        "{resp:?}"
    );
    // Exactly the limit is fine.
    let max = vec![2u8; RECORD_SIZE_BYTES_MAX];
    client
        .write("s", vec![(8, max.clone())], false)
        .await
        .unwrap();

    // txid below the last one (within a request, and against the stream).
    let e = client
        .write("s", vec![(3, b"old".to_vec())], false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::TxidOutOfOrder, "{e}");
    let e = p
        .streams
        .append("s", vec![(9, b"x".to_vec()), (8, b"y".to_vec())], false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::TxidOutOfOrder, "{e}");
    // Equal txids are allowed.
    client
        .write("s", vec![(8, b"same".to_vec())], false)
        .await
        .unwrap();

    // max_records = 0 is a bad request.
    let e = client
        .read("s", ReadPosition::Head, 0, 1024, Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::BadRequest, "{e}");

    // Nothing of the refused writes is in the stream.
    let mut got = Vec::new();
    let mut pos = ReadPosition::Head;
    loop {
        let b = client
            .read("s", pos, 100, 4 << 20, Duration::ZERO)
            .await
            .unwrap();
        if b.records.is_empty() {
            break;
        }
        got.extend(b.records.into_iter().map(|(_, t, d)| (t, d)));
        pos = b.next;
    }
    assert_eq!(
        got,
        vec![
            (5, b"a".to_vec()),
            (6, b"b".to_vec()),
            (8, max),
            (8, b"same".to_vec())
        ]
    );
}

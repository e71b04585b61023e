//! Goal: one writer per stream across proxies (DistributedLog's write lock, redirects and
//! takeover): a proxy that does not own a stream answers with a redirect naming the owner; a
//! `ProxyClient` connected to it writes and reads through the redirect and caches the owner;
//! when the owner shuts down cleanly another proxy takes the stream over and writes into a new
//! segment; when an owner dies with a segment in progress, the next owner recovers that segment
//! and writes into a new one; every acknowledged record reads back once and in order.
//! Method: real bookies in-process, one embedded metadata store, proxies A, B, C with their own
//! `StreamManager` and server on their own ports (owner identity = server address).

use crate::common;
use crate::common::{assert_reads_back, batch, read_all};

use std::time::Duration;

use quire_client::{ProxyClient, ReadPosition};
use quire_metadata::SegmentState;
use quire_proxy::{Error, ErrorCode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_owner_redirects_and_streams_move_on_shutdown_and_crash() {
    let c = common::cluster().await;
    let a = common::proxy(&c, common::small_config()).await;
    let b = common::proxy(&c, common::small_config()).await;
    let a_addr = a.server.local_addr().to_string();
    let b_addr = b.server.local_addr().to_string();
    assert_eq!(a.streams.identity(), a_addr);
    let mut expected = Vec::new();

    // A takes the stream by writing to it.
    let client_a = ProxyClient::connect(&a_addr).await.unwrap();
    let recs = batch(1, 100);
    client_a.write("owned", recs.clone(), true).await.unwrap();
    expected.extend(recs);
    assert_eq!(
        c.store.stream_owner("owned").await.unwrap().as_deref(),
        Some(a_addr.as_str())
    );

    // B refuses to write or read it, naming A.
    let e = b
        .streams
        .append("owned", batch(1000, 1), false)
        .await
        .unwrap_err();
    match &e {
        Error::OwnedElsewhere { owner, .. } => assert_eq!(owner, &a_addr),
        other => panic!("expected a redirect, got {other}"),
    }
    assert_eq!(e.code(), ErrorCode::StreamOwnedElsewhere);
    let e = b
        .streams
        .read("owned", ReadPosition::Head, 10, 1 << 20, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::OwnedElsewhere { owner, .. } if *owner == a_addr),
        "{e}"
    );
    // Unknown streams are not redirected.
    let e = b
        .streams
        .append("nobody", batch(1, 1), false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::NoSuchStream, "{e}");

    // A client of B writes and reads through the redirect and caches the owner.
    let client_b = ProxyClient::connect(&b_addr).await.unwrap();
    let recs = batch(1000, 100);
    let w = client_b.write("owned", recs.clone(), false).await.unwrap();
    expected.extend(recs);
    assert_eq!(
        w.first_dlsn.segment_seq_no, 1,
        "written by A into A's open segment"
    );
    assert_eq!(
        client_b.cached_owner("owned").as_deref(),
        Some(a_addr.as_str())
    );
    assert_reads_back(&read_all(&client_b, "owned").await, &expected);
    assert_eq!(
        c.store.stream_owner("owned").await.unwrap().as_deref(),
        Some(a_addr.as_str()),
        "B never took it"
    );

    // A shuts down cleanly: open segment completed, lease released. Its server still answers
    // (SERVICE_UNAVAILABLE), so B's client drops the cached owner and B takes the stream over.
    a.streams.shutdown().await.unwrap();
    assert_eq!(
        c.store.stream_owner("owned").await.unwrap(),
        None,
        "shutdown releases the lease"
    );
    let meta = c.store.read_stream("owned").await.unwrap().value;
    assert!(meta
        .segments
        .iter()
        .all(|s| s.state == SegmentState::Completed));
    let last_seq = meta.segments.last().unwrap().seq_no;
    let recs = batch(2000, 100);
    let w = client_b.write("owned", recs.clone(), false).await.unwrap();
    expected.extend(recs);
    assert!(
        w.first_dlsn.segment_seq_no > last_seq,
        "the new owner writes into a new segment"
    );
    assert_eq!(
        c.store.stream_owner("owned").await.unwrap().as_deref(),
        Some(b_addr.as_str())
    );
    assert_eq!(client_b.cached_owner("owned"), None);
    // The old owner's client is redirected to B now... but A is shutting down: it says so.
    let e = client_a
        .write("owned", batch(2500, 1), false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ServiceUnavailable, "{e}");

    // Proxy C: redirected to B for a while. Then B crashes (dropped without shutdown) with a
    // segment in progress; C takes over, recovers that segment and starts a new one.
    let cc = common::proxy(&c, common::small_config()).await;
    let c_addr = cc.server.local_addr().to_string();
    let client_c = ProxyClient::connect(&c_addr).await.unwrap();
    let recs = batch(3000, 200);
    client_c.write("owned", recs.clone(), false).await.unwrap();
    expected.extend(recs);
    assert_eq!(
        client_c.cached_owner("owned").as_deref(),
        Some(b_addr.as_str())
    );
    let meta = c.store.read_stream("owned").await.unwrap().value;
    let open = meta.segments.last().unwrap().clone();
    assert_eq!(
        open.state,
        SegmentState::InProgress,
        "the test needs a segment in progress"
    );
    drop(client_b);
    drop(b);
    common::wait_unowned(&c.store, "owned").await;
    // The cached owner B is unreachable: the client asks its home proxy C, which takes over.
    let recs = batch(4000, 100);
    let w = client_c.write("owned", recs.clone(), false).await.unwrap();
    expected.extend(recs);
    assert!(
        w.first_dlsn.segment_seq_no > open.seq_no,
        "a new segment after the recovered one"
    );
    assert_eq!(
        c.store.stream_owner("owned").await.unwrap().as_deref(),
        Some(c_addr.as_str())
    );
    let meta = c.store.read_stream("owned").await.unwrap().value;
    let recovered = meta
        .segments
        .iter()
        .find(|s| s.seq_no == open.seq_no)
        .unwrap();
    assert_eq!(
        recovered.state,
        SegmentState::Completed,
        "the in-progress segment was recovered"
    );
    let got = read_all(&client_c, "owned").await;
    assert_reads_back(&got, &expected);
    let in_recovered = got
        .iter()
        .filter(|r| r.0.segment_seq_no == open.seq_no)
        .count() as u64;
    assert_eq!(recovered.record_count, in_recovered);

    cc.streams.shutdown().await.unwrap();
    assert_eq!(c.store.stream_owner("owned").await.unwrap(), None);
}

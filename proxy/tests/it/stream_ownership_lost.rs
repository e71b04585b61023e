//! Goal: a proxy that loses a stream stops writing it and says so (DistributedLog: the lock is
//! checked before every write; a fenced ledger kills the writer): (1) when its lease is taken
//! away behind its back, its next write fails with OWNERSHIP_LOST, another proxy takes over and
//! recovers the in-progress segment, and a later write on the old proxy is redirected to the new
//! owner; (2) when another client recovers (fences) the ledger of the segment being written,
//! the next write fails with OWNERSHIP_LOST and the write after it re-acquires the stream and
//! goes into a new segment. In both cases every acknowledged record reads back once and in
//! order, and nothing of the refused writes appears.
//! Method: real bookies in-process; (1) an embedded store wrapped to release a lease from
//! outside (as a ZooKeeper session expiry would); (2) `recover_ledger` from a second
//! BookKeeper client on the open segment's ledger.

use crate::common;
use crate::common::{assert_reads_back, batch, read_all};

use quire_client::ProxyClient;
use quire_ledger::BookKeeper;
use quire_metadata::SegmentState;
use quire_proxy::{Error, ErrorCode};
use quire_wire::LedgerId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_taken_away_fails_next_write_then_redirects() {
    let (c, store) = common::cluster_revocable().await;
    let a = common::proxy(&c, common::small_config()).await;
    let a_addr = a.server.local_addr().to_string();
    let mut expected = Vec::new();

    let recs = batch(1, 150);
    a.streams.append("s", recs.clone(), true).await.unwrap();
    expected.extend(recs);
    let open = c
        .store
        .read_stream("s")
        .await
        .unwrap()
        .value
        .segments
        .last()
        .unwrap()
        .clone();
    assert_eq!(open.state, SegmentState::InProgress);

    // The lease goes away behind A's back.
    store.revoke("s").await;
    assert_eq!(c.store.stream_owner("s").await.unwrap(), None);
    let e = a
        .streams
        .append("s", batch(500, 10), false)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::OwnershipLost { .. }), "{e}");
    assert_eq!(e.code(), ErrorCode::OwnershipLost);

    // B takes the stream: recovers A's in-progress segment, writes into a new one.
    let b = common::proxy(&c, common::small_config()).await;
    let b_addr = b.server.local_addr().to_string();
    let recs = batch(1000, 50);
    let w = b.streams.append("s", recs.clone(), false).await.unwrap();
    expected.extend(recs);
    assert!(w.first_dlsn.segment_seq_no > open.seq_no);
    let meta = c.store.read_stream("s").await.unwrap().value;
    assert_eq!(
        meta.segments
            .iter()
            .find(|s| s.seq_no == open.seq_no)
            .unwrap()
            .state,
        SegmentState::Completed
    );

    // A later write on A tries to acquire again and is redirected to B.
    let e = a
        .streams
        .append("s", batch(2000, 1), false)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::OwnedElsewhere { owner, .. } if *owner == b_addr),
        "{e}"
    );
    // So a client of A writes through to B.
    let client_a = ProxyClient::connect(&a_addr).await.unwrap();
    let recs = batch(2000, 50);
    client_a.write("s", recs.clone(), false).await.unwrap();
    expected.extend(recs);
    assert_eq!(client_a.cached_owner("s").as_deref(), Some(b_addr.as_str()));

    assert_reads_back(&read_all(&client_a, "s").await, &expected);
    b.streams.shutdown().await.unwrap();
    a.streams.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_lost_while_idle_fails_next_write_once_then_reacquires() {
    // Goal: a loss with no write in flight is reported to the next write (OWNERSHIP_LOST, once);
    // the write after it acquires the stream again (nobody else holds it), recovers the segment
    // the lost writer left in progress and starts a new one. Method: revoke the lease between
    // writes.
    let (c, store) = common::cluster_revocable().await;
    let a = common::proxy(&c, common::small_config()).await;
    let a_addr = a.server.local_addr().to_string();
    let mut expected = batch(1, 20);
    a.streams
        .append("idle", expected.clone(), true)
        .await
        .unwrap();
    store.revoke("idle").await;
    let e = a
        .streams
        .append("idle", batch(100, 1), false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::OwnershipLost, "{e}");
    let recs = batch(200, 20);
    let w = a.streams.append("idle", recs.clone(), false).await.unwrap();
    expected.extend(recs);
    assert_eq!(
        w.first_dlsn.segment_seq_no, 2,
        "re-acquired: the old segment was recovered, a new one started"
    );
    assert_eq!(
        c.store.stream_owner("idle").await.unwrap().as_deref(),
        Some(a_addr.as_str())
    );
    let client = ProxyClient::connect(&a_addr).await.unwrap();
    assert_reads_back(&read_all(&client, "idle").await, &expected);
    a.streams.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_fenced_under_the_writer_fails_next_write_with_ownership_lost() {
    let c = common::cluster().await;
    let a = common::proxy(&c, common::small_config()).await;
    let a_addr = a.server.local_addr().to_string();
    let client = ProxyClient::connect(&a_addr).await.unwrap();
    let mut expected = Vec::new();

    let recs = batch(1, 100);
    client.write("f", recs.clone(), true).await.unwrap();
    expected.extend(recs);
    let open = c
        .store
        .read_stream("f")
        .await
        .unwrap()
        .value
        .segments
        .last()
        .unwrap()
        .clone();
    assert_eq!(open.state, SegmentState::InProgress);

    // Another client recovers (fences and closes) the ledger under the writer.
    let other = BookKeeper::new(c.store.clone(), quire_ledger::ClientConfig::default());
    let lm = other
        .recover_ledger(LedgerId(open.ledger_id))
        .await
        .unwrap();
    assert!(lm.last_entry.is_some());

    let e = client.write("f", batch(500, 10), false).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::OwnershipLost, "{e}");
    assert!(e.to_string().contains("fenced"), "{e}");
    // The writer gave the lease up.
    assert_eq!(c.store.stream_owner("f").await.unwrap(), None);

    // The next write acquires the stream again, completes the fenced segment, opens a new one.
    let recs = batch(1000, 50);
    let w = client.write("f", recs.clone(), false).await.unwrap();
    expected.extend(recs);
    assert!(w.first_dlsn.segment_seq_no > open.seq_no);
    let meta = c.store.read_stream("f").await.unwrap().value;
    let fenced = meta
        .segments
        .iter()
        .find(|s| s.seq_no == open.seq_no)
        .unwrap();
    assert_eq!(fenced.state, SegmentState::Completed);
    assert_eq!(
        fenced.last_entry, lm.last_entry,
        "the segment ends where the recovery closed the ledger"
    );

    // Everything acknowledged, once, in order; the refused write left nothing behind.
    assert_reads_back(&read_all(&client, "f").await, &expected);
    a.streams.shutdown().await.unwrap();
}

//! Goal: with ZooKeeper as the metadata store, stream ownership follows the owner's session
//! (DistributedLog: the write lock is an ephemeral node of the proxy's session): while proxy A
//! owns a stream, proxy B redirects to it; when A's session expires, A's next write fails with
//! OWNERSHIP_LOST, B takes the stream over (recovering A's in-progress segment, writing into a
//! new one), and every acknowledged record reads back once and in order.
//! Method: a real ZooKeeper (quire-testkit) and real bookies in-process; three ZooKeeper
//! sessions (bookie registry, proxy A, proxy B); A reaches ZooKeeper through a loopback relay
//! (`TcpRelay`) that the test cuts, so A's session expires: the server deletes its ephemeral
//! nodes after the session timeout, and A's client gives up reconnecting after 1.4 × that.

use crate::common;
use crate::common::{batch, read_all};

use std::sync::Arc;
use std::time::Duration;

use quire_client::ProxyClient;
use quire_metadata::{SegmentState, ZkStore};
use quire_proxy::ErrorCode;
use quire_testkit::{TcpRelay, ZooKeeperServer};

const SESSION: Duration = Duration::from_secs(6);
const PATIENCE: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_session_expiry_moves_the_stream() {
    let zk = tokio::task::spawn_blocking(ZooKeeperServer::start)
        .await
        .unwrap();
    let connect = zk.connect_string();
    let registry = ZkStore::connect(&connect, "/quire", SESSION).await.unwrap();
    let dir = tempfile::Builder::new()
        .prefix("quire-proxy-zk-test-")
        .tempdir_in("/tmp")
        .unwrap();
    let c = common::cluster_with(dir, Arc::new(registry)).await;
    let a_relay = TcpRelay::start(zk.connect_string().parse().unwrap());
    let a_store = ZkStore::connect(&a_relay.connect_string(), "/quire", SESSION)
        .await
        .unwrap();
    let b_store = ZkStore::connect(&connect, "/quire", SESSION).await.unwrap();
    let a = common::proxy_on(Arc::new(a_store.clone()), common::small_config()).await;
    let b = common::proxy_on(Arc::new(b_store.clone()), common::small_config()).await;
    let a_addr = a.server.local_addr().to_string();
    let b_addr = b.server.local_addr().to_string();
    let mut expected = Vec::new();

    // A owns the stream; a client of B writes through the redirect.
    let recs = batch(1, 150);
    a.streams.append("zs", recs.clone(), true).await.unwrap();
    expected.extend(recs);
    assert_eq!(
        c.store.stream_owner("zs").await.unwrap().as_deref(),
        Some(a_addr.as_str())
    );
    let client_b = ProxyClient::connect(&b_addr).await.unwrap();
    let recs = batch(1000, 50);
    client_b.write("zs", recs.clone(), false).await.unwrap();
    expected.extend(recs);
    assert_eq!(
        client_b.cached_owner("zs").as_deref(),
        Some(a_addr.as_str())
    );
    let open = c
        .store
        .read_stream("zs")
        .await
        .unwrap()
        .value
        .segments
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        open.state,
        SegmentState::InProgress,
        "the test needs a segment in progress"
    );

    // Expire A's session.
    let mut a_lost = a_store.session_lost();
    assert!(!*a_lost.borrow());
    a_relay.cut();
    tokio::time::timeout(PATIENCE, a_lost.wait_for(|l| *l))
        .await
        .expect("A's session must expire")
        .unwrap();
    drop(a_store);

    // A's next write is refused: it no longer owns the stream.
    let e = a
        .streams
        .append("zs", batch(2000, 10), false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::OwnershipLost, "{e}");

    // B takes the stream over at its next write.
    let recs = batch(3000, 50);
    let w = tokio::time::timeout(PATIENCE, async {
        loop {
            match b.streams.append("zs", recs.clone(), false).await {
                Ok(w) => return w,
                // A's lock node may outlive the session for a moment on the server.
                Err(quire_proxy::Error::OwnedElsewhere { .. }) => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("B could not take the stream: {e}"),
            }
        }
    })
    .await
    .expect("B takes the stream after A's session expired");
    expected.extend(recs);
    assert!(
        w.first_dlsn.segment_seq_no > open.seq_no,
        "B writes into a new segment"
    );
    assert_eq!(
        c.store.stream_owner("zs").await.unwrap().as_deref(),
        Some(b_addr.as_str())
    );
    let meta = c.store.read_stream("zs").await.unwrap().value;
    assert_eq!(
        meta.segments
            .iter()
            .find(|s| s.seq_no == open.seq_no)
            .unwrap()
            .state,
        SegmentState::Completed,
        "recovered"
    );

    // Every acknowledged record, once, in order (read through B).
    let client_b2 = ProxyClient::connect(&b_addr).await.unwrap();
    let got = read_all(&client_b2, "zs").await;
    let data: Vec<(u64, Vec<u8>)> = got.iter().map(|(_, t, d)| (*t, d.clone())).collect();
    assert_eq!(data.len(), expected.len());
    assert!(
        data == expected,
        "records differ from the acknowledged ones"
    );
    assert!(got.windows(2).all(|w| w[0].0 < w[1].0));

    b.streams.shutdown().await.unwrap();
    assert_eq!(
        c.store.stream_owner("zs").await.unwrap(),
        None,
        "shutdown deletes B's lock node"
    );
    drop((a, b, client_b, client_b2, c));
    zk.stop();
}

//! Goal: many streams per proxy (issue 29 item 2). A proxy that owns its `owned_streams_max`
//! streams answers a request that would acquire one more with `TOO_MANY_STREAMS` (524) and does
//! nothing; the streams it owns keep being served; a client that knows another proxy sends the
//! request there, and fails with `TOO_MANY_STREAMS` once every proxy refused. `LIST_STREAMS`
//! pages by prefix and page token, the last page ends with an empty token, a bad token is
//! `BAD_REQUEST`, the original whole listing still answers, and `quire stream list` prints the
//! same names in text and JSON, all pages or one.
//! Method: real ZooKeeper (quire-testkit), one `quire bookie`, two `quire proxy` children with
//! `--owned-streams-max 2` (E=Qw=Qa=1), `ProxyClient` requests, owners read back from
//! ZooKeeper with `ZkStore`, `quire stream list` as a child process.

use std::time::Duration;

use quire_client::{ClientConfig, ErrorCode, ProxyClient};
use quire_metadata::{MetadataStore, ZkStore};
use quire_testkit::harness::cluster::{Cluster, SESSION_TIMEOUT_MS};

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

async fn write_one(client: &ProxyClient, stream: &str) -> quire_client::Result<()> {
    client
        .write(stream, vec![(1, b"x".to_vec())], true)
        .await
        .map(|_| ())
}

#[test]
fn too_many_streams_redirects_and_list_streams_pages() {
    let cluster = Cluster::start();
    let _bookie = cluster.start_bookie(0, quire_testkit::free_port());
    cluster.wait_bookies("1 bookie", |l| l.contains("1 bookies registered"));
    let flags = [
        "--ensemble-size",
        "1",
        "--write-quorum",
        "1",
        "--ack-quorum",
        "1",
        "--owned-streams-max",
        "2",
        // Ownership by the first proxy asked is what this test relies on (balanced ownership,
        // on by default, is tested in cluster_balanced_ownership.rs).
        "--balance-moves-per-sec",
        "0",
    ];
    let a = cluster.start_proxy(quire_testkit::free_port(), &flags);
    let b = cluster.start_proxy(quire_testkit::free_port(), &flags);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = ZkStore::connect(
            &cluster.zookeeper(),
            &cluster.zk_root,
            Duration::from_millis(SESSION_TIMEOUT_MS),
        )
        .await
        .unwrap();
        let owner = |s: &'static str| {
            let store = &store;
            async move { store.stream_owner(s).await.unwrap() }
        };

        // A client that knows proxy A only: two streams fill A, the third is refused.
        let only_a = ProxyClient::connect(&a.addr).await.unwrap();
        write_one(&only_a, "many/s1").await.unwrap();
        write_one(&only_a, "many/s2").await.unwrap();
        let e = write_one(&only_a, "many/s3").await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::TooManyStreams, "{e}");
        assert!(e.to_string().contains("owned_streams_max"), "{e}");
        // Nothing was done: the stream was not created, and nobody owns it.
        assert!(store.read_stream("many/s3").await.is_err());
        assert_eq!(owner("many/s3").await, None);
        // The streams A owns are not affected.
        write_one(&only_a, "many/s1").await.unwrap();
        assert_eq!(owner("many/s1").await.as_deref(), Some(a.addr.as_str()));

        // A client that knows both: A refuses, B takes the stream.
        let both = ProxyClient::connect_any(ClientConfig {
            proxies: vec![a.addr.clone(), b.addr.clone()],
            ..ClientConfig::default()
        })
        .await
        .unwrap();
        assert_eq!(both.home_addr(), a.addr);
        write_one(&both, "many/s3").await.unwrap();
        assert_eq!(owner("many/s3").await.as_deref(), Some(b.addr.as_str()));
        write_one(&both, "many/s3").await.unwrap();
        write_one(&both, "many/s4").await.unwrap();
        assert_eq!(owner("many/s4").await.as_deref(), Some(b.addr.as_str()));
        // Both full: TOO_MANY_STREAMS, nothing done.
        let e = write_one(&both, "many/s5").await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::TooManyStreams, "{e}");
        assert_eq!(owner("many/s5").await, None);
        // Owned streams of both proxies are still served, through redirects too.
        for s in ["many/s1", "many/s2", "many/s3", "many/s4"] {
            write_one(&both, s).await.unwrap();
        }
        // A full proxy refuses before it looks the owner up (the stream is one more it would
        // acquire): a client whose home is B goes on to A, the owner.
        let via_b = ProxyClient::connect_any(ClientConfig {
            proxies: vec![b.addr.clone(), a.addr.clone()],
            ..ClientConfig::default()
        })
        .await
        .unwrap();
        write_one(&via_b, "many/s1").await.unwrap();

        // Paging: 5 streams under "page/", one elsewhere (creating does not acquire).
        for s in ["page/a", "page/b", "page/c", "page/d", "page/e", "zother"] {
            only_a.create_stream(s).await.unwrap();
        }
        let (p1, t1) = only_a.list_streams_page("page/", "", 2).await.unwrap();
        assert_eq!(p1, ["page/a", "page/b"]);
        assert!(!t1.is_empty());
        let (p2, t2) = only_a.list_streams_page("page/", &t1, 2).await.unwrap();
        assert_eq!(p2, ["page/c", "page/d"]);
        // The token works on any proxy.
        let (p3, t3) = via_b.list_streams_page("page/", &t2, 2).await.unwrap();
        assert_eq!(p3, ["page/e"]);
        assert_eq!(t3, "", "the last page ends the listing");
        for bad in ["nonsense", "1:zz"] {
            let e = only_a.list_streams_page("page/", bad, 2).await.unwrap_err();
            assert_eq!(e.code(), ErrorCode::BadRequest, "{e}");
        }
        // A token of another prefix is refused too.
        let (_, many_token) = only_a.list_streams_page("many/", "", 1).await.unwrap();
        let e = only_a
            .list_streams_page("page/", &many_token, 2)
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::BadRequest, "{e}");
        // The original request still lists everything.
        let all = only_a.list_streams().await.unwrap();
        assert_eq!(all.len(), 10, "{all:?}");
    });

    // The CLI: every page by default (pages of 2 here), text and JSON.
    let text = cluster.stream_admin_ok(
        &a.addr,
        &["stream", "list", "--prefix", "page/", "--page-size", "2"],
    );
    assert_eq!(text, "page/a\npage/b\npage/c\npage/d\npage/e\n");
    let doc = json(&cluster.stream_admin_ok(
        &a.addr,
        &[
            "stream",
            "list",
            "--prefix",
            "page/",
            "--page-size",
            "2",
            "--json",
        ],
    ));
    assert_eq!(
        doc,
        serde_json::json!(["page/a", "page/b", "page/c", "page/d", "page/e"])
    );
    // One page: from a token, with the next one.
    let first = json(&cluster.stream_admin_ok(
        &a.addr,
        &[
            "stream",
            "list",
            "--prefix",
            "page/",
            "--page-size",
            "3",
            "--page-token",
            "",
            "--json",
        ],
    ));
    assert_eq!(
        first["streams"],
        serde_json::json!(["page/a", "page/b", "page/c"])
    );
    let token = first["next_page_token"].as_str().unwrap().to_string();
    let rest = cluster.stream_admin_ok(
        &a.addr,
        &[
            "stream",
            "list",
            "--prefix",
            "page/",
            "--page-token",
            &token,
        ],
    );
    assert_eq!(rest, "page/d\npage/e\n");
    // `--all` from a token follows to the end.
    let rest_all = cluster.stream_admin_ok(
        &a.addr,
        &[
            "stream",
            "list",
            "--page-token",
            &token,
            "--all",
            "--prefix",
            "page/",
        ],
    );
    assert_eq!(rest_all, "page/d\npage/e\n");
    // A bad token: the command fails and says why.
    let out = quire_testkit::harness::run_quire(
        &["stream", "list", "--page-token", "nonsense"],
        &a.addr,
        None,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("BAD_REQUEST") || err.contains("bad request"),
        "{err}"
    );
    assert!(err.contains("page token"), "{err}");
}

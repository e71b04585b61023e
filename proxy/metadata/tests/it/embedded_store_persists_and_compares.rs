//! Goal: the embedded store keeps what it acknowledged across a reopen, hands out ledger ids
//! that never repeat, and refuses stale compare-and-set updates without changing anything.
//! Method: real files in a temporary directory; reopen the store from the same directory.

use quire_metadata::*;
use quire_wire::LedgerId;

fn stream(name: &str) -> StreamMetadata {
    StreamMetadata {
        name: name.into(),
        segments: vec![],
        max_txid: None,
        creation_time_ms: 1,
        truncated_before: None,
        retention: RetentionOverride::default(),
        ledger_secret_hex: None,
        sealed: false,
        compression: None,
        limits: None,
        home_region: None,
        placement: None,
    }
}

#[tokio::test]
async fn survives_reopen_and_rejects_stale_versions() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    let a = store.allocate_ledger_id().await.unwrap();
    let b = store.allocate_ledger_id().await.unwrap();
    assert!(b > a);

    let v0 = store.create_stream(&stream("s1")).await.unwrap();
    let mut m = stream("s1");
    m.max_txid = Some(5);
    let v1 = store.update_stream(&m, v0).await.unwrap();
    assert!(v1 > v0);
    m.max_txid = Some(9);
    let stale = store.update_stream(&m, v0).await;
    assert!(matches!(stale, Err(Error::BadVersion { .. })), "{stale:?}");
    assert!(matches!(
        store.create_stream(&stream("s1")).await,
        Err(Error::AlreadyExists { .. })
    ));
    assert!(matches!(
        store.create_stream(&stream("../x")).await,
        Err(Error::Invalid { .. })
    ));
    store
        .register_bookie(BookieInfo {
            id: BookieId("127.0.0.1:1".into()),
            rack: None,
            region: None,
            read_only: false,
        })
        .await
        .unwrap();
    drop(store);

    let store = EmbeddedStore::open(dir.path()).unwrap();
    let got = store.read_stream("s1").await.unwrap();
    assert_eq!(got.value.max_txid, Some(5));
    assert_eq!(got.version, v1);
    assert!(store.allocate_ledger_id().await.unwrap() > b);
    assert!(
        store.list_bookies().await.unwrap().is_empty(),
        "registrations are ephemeral"
    );
    assert_eq!(store.list_streams().await.unwrap(), vec!["s1".to_string()]);
    assert!(matches!(
        store.read_ledger(LedgerId(999)).await,
        Err(Error::NotFound { .. })
    ));
}

#[tokio::test]
async fn cookies_instance_id_and_stream_leases() {
    // Goal: the instance id is stable across reopen; cookies are created once and replaced only
    // by compare-and-set; a stream has at most one owner, and release hands it on and tells the
    // old lease it is lost.
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    let id = store.instance_id().await.unwrap();
    assert_eq!(id.len(), 32);
    let bookie = BookieId("127.0.0.1:3181".into());
    let cookie = Cookie {
        format_version: COOKIE_FORMAT_VERSION,
        bookie: bookie.clone(),
        instance_id: id.clone(),
        journal_dir: "/j".into(),
        ledger_dirs: vec!["/l".into()],
    };
    let v0 = store.write_cookie(&cookie, None).await.unwrap();
    assert!(matches!(
        store.write_cookie(&cookie, None).await,
        Err(Error::AlreadyExists { .. })
    ));
    let v1 = store.write_cookie(&cookie, Some(v0)).await.unwrap();
    assert!(matches!(
        store.write_cookie(&cookie, Some(v0)).await,
        Err(Error::BadVersion { .. })
    ));

    let lease = store
        .try_acquire_stream("s", "proxy-a")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store
            .try_acquire_stream("s", "proxy-b")
            .await
            .unwrap()
            .unwrap_err(),
        "proxy-a"
    );
    assert_eq!(
        store.stream_owner("s").await.unwrap().as_deref(),
        Some("proxy-a")
    );
    let lost = lease.lost.clone();
    store.release_stream(lease).await.unwrap();
    assert!(*lost.borrow());
    assert_eq!(store.stream_owner("s").await.unwrap(), None);
    let _b = store
        .try_acquire_stream("s", "proxy-b")
        .await
        .unwrap()
        .unwrap();
    drop(store);

    let store = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(store.instance_id().await.unwrap(), id);
    assert_eq!(store.read_cookie(&bookie).await.unwrap().version, v1);
    assert_eq!(
        store.stream_owner("s").await.unwrap(),
        None,
        "leases end with the process"
    );
}

/// Issue 24 item 3: the document holds every stream's ledger secret, so it is mode 0600 in a
/// directory of mode 0700, from its first write; a store left with looser modes (written before
/// this rule, or copied in) is narrowed when it is opened.
#[tokio::test]
async fn metadata_file_holding_ledger_secrets_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("metadata");
    let store = EmbeddedStore::open(&dir).unwrap();
    let mut m = stream("secret");
    m.ledger_secret_hex = Some("00".repeat(32));
    store.create_stream(&m).await.unwrap();
    let file = dir.join(EMBEDDED_FILE_NAME);
    assert_eq!(mode(&file), 0o600, "metadata.json");
    assert_eq!(mode(&dir), 0o700, "metadata directory");
    drop(store);

    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = EmbeddedStore::open(&dir).unwrap();
    assert_eq!(mode(&file), 0o600, "narrowed at open");
    assert_eq!(mode(&dir), 0o700, "narrowed at open");
    assert!(store.read_stream("secret").await.is_ok());
}

#[tokio::test]
async fn subscriptions_persist_and_go_with_their_stream() {
    // Goal (issue 26 item 2): subscriptions survive a reopen, compare-and-set like the other
    // records, and are deleted with their stream. Method: real files, reopen the store.
    let sub = |seq| Subscription {
        committed: TruncationPoint {
            segment_seq_no: seq,
            entry_id: 3,
            slot_index: 1,
        },
        commit_time_ms: 5,
    };
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    assert!(matches!(
        store.write_subscription("s", "a", &sub(1), None).await,
        Err(Error::NotFound { kind: "stream", .. })
    ));
    let sv = store.create_stream(&stream("s")).await.unwrap();
    let v0 = store
        .write_subscription("s", "a", &sub(1), None)
        .await
        .unwrap();
    store
        .write_subscription("s", "b", &sub(4), None)
        .await
        .unwrap();
    let v1 = store
        .write_subscription("s", "a", &sub(2), Some(v0))
        .await
        .unwrap();
    assert!(matches!(
        store.write_subscription("s", "a", &sub(3), Some(v0)).await,
        Err(Error::BadVersion { .. })
    ));
    drop(store);
    let store = EmbeddedStore::open(dir.path()).unwrap();
    let r = store.read_subscription("s", "a").await.unwrap();
    assert_eq!((r.value, r.version), (sub(2), v1));
    assert_eq!(
        store.list_subscriptions("s").await.unwrap(),
        vec![("a".to_string(), sub(2)), ("b".to_string(), sub(4))]
    );
    store.delete_subscription("s", "b").await.unwrap();
    assert!(store.delete_subscription("s", "b").await.is_err());
    store.delete_stream("s", sv).await.unwrap();
    store.create_stream(&stream("s")).await.unwrap();
    assert!(store.list_subscriptions("s").await.unwrap().is_empty());
    assert!(matches!(
        store.read_subscription("s", "a").await,
        Err(Error::NotFound { .. })
    ));
}

#[tokio::test]
async fn region_marks_persist_like_zookeeper_nodes() {
    // Goal (issue 30 item 2): the sandbox's store keeps region marks as ZooKeeper does:
    // idempotent, listed sorted, kept across a reopen until cleared; a name that could not be
    // a znode is refused. A stream with its own placement reads back unchanged.
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(
        store.unavailable_regions().await.unwrap(),
        Vec::<String>::new()
    );
    for r in ["b", "a", "b"] {
        store.set_region_unavailable(r, true).await.unwrap();
    }
    assert!(matches!(
        store.set_region_unavailable("x/y", true).await,
        Err(Error::Invalid { .. })
    ));
    let mut m = stream("placed");
    m.placement = Some(StreamPlacement {
        placement: PlacementPolicy::RegionAware,
        regions: vec!["a".into(), "b".into()],
        ..StreamPlacement::default()
    });
    store.create_stream(&m).await.unwrap();
    drop(store);

    let store = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(store.unavailable_regions().await.unwrap(), vec!["a", "b"]);
    assert!(store.region_unavailable("a").await.unwrap());
    assert_eq!(store.read_stream("placed").await.unwrap().value, m);
    store.set_region_unavailable("a", false).await.unwrap();
    store.set_region_unavailable("a", false).await.unwrap();
    drop(store);
    let store = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(store.unavailable_regions().await.unwrap(), vec!["b"]);
    assert!(!store.region_unavailable("a").await.unwrap());
}

//! Goal: ZooKeeper ACLs (issue 12 item 2, BookKeeper's `zkEnableSecurity`). A cluster whose
//! bookies, proxy and admin commands are given `--zk-auth-file` creates every znode with the
//! ACL of its digest identity only: its own processes write and read a stream as usual, while a
//! ZooKeeper session without that identity (none, or the same user with a wrong password) can
//! neither read a znode (the stream records hold the ledger secrets), nor create, change or
//! delete one, and an admin command without the file fails with a one-line "not authorized".
//!
//! Method: real ZooKeeper (quire-testkit), three `quire bookie` and one `quire proxy` child
//! process, records written and read with `ProxyClient`, the outsiders' requests sent with the
//! `zookeeper-client` crate directly.

use std::sync::Arc;
use std::time::Duration;

use quire_testkit::harness::checker::{read_all, write_records};
use quire_testkit::harness::cluster::{runtime, Cluster, SESSION_TIMEOUT_MS};
use zookeeper_client as zk;

const STREAM: &str = "acl/s";

/// A ZooKeeper session with `digest` (`user:password`) added, or none.
async fn outsider(connect: &str, digest: Option<&str>) -> zk::Client {
    let mut c =
        zk::Client::connector().with_session_timeout(Duration::from_millis(SESSION_TIMEOUT_MS));
    if let Some(d) = digest {
        c = c.with_auth("digest", d.as_bytes());
    }
    c.connect(connect).await.unwrap()
}

#[test]
fn znodes_of_a_secured_cluster_are_closed_to_other_identities() {
    let cluster = Cluster::start();
    // Identity files are written 0600, as the README tells operators (`umask 077`): a file
    // others can read makes every process log a warning, which the one-line checks below
    // would count.
    let private = |path: &std::path::Path, text: &str| {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .unwrap();
        std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
    };
    let auth = cluster.dir.path().join("zk-auth");
    private(&auth, "quire:s3cret-of-the-cluster\n");
    let auth = auth.to_str().unwrap();
    let wrong = cluster.dir.path().join("zk-auth-wrong");
    private(&wrong, "quire:a-guess\n");
    let wrong = wrong.to_str().unwrap();

    let _bookies: Vec<_> = (0..3)
        .map(|i| {
            cluster.start_bookie_with(i, quire_testkit::free_port(), &["--zk-auth-file", auth])
        })
        .collect();
    let listing = cluster.admin_ok(&["bookie", "list", "--zk-auth-file", auth]);
    assert!(listing.contains("3 bookies registered"), "{listing}");
    let proxy = cluster.start_proxy_e3(&["--zk-auth-file", auth]);
    let rt = runtime();
    let client = rt.block_on(async {
        Arc::new(
            quire_client::ProxyClient::connect(&proxy.addr)
                .await
                .unwrap(),
        )
    });
    let (acked, err) = rt.block_on(write_records(&client, STREAM, "r", 0..50));
    assert!(err.is_none(), "{err:?}");
    drop(client);

    // Admin commands: with the identity they work, without it (or with a wrong password) they
    // fail with the reason.
    let ledgers = cluster.admin_ok(&["ledger", "list", "--zk-auth-file", auth]);
    assert!(!ledgers.trim().is_empty(), "ledger list: {ledgers:?}");
    for flags in [vec![], vec!["--zk-auth-file", wrong]] {
        let mut args = vec!["ledger", "list"];
        args.extend(flags.iter().copied());
        let out = cluster.admin(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "ledger list {flags:?} succeeded: {stderr}"
        );
        assert!(
            stderr.contains("not authorized"),
            "ledger list {flags:?}: {stderr}"
        );
        assert!(
            stderr.contains("refused this session") && !stderr.contains("cannot connect"),
            "an identity refusal is not a connection failure: {stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    }

    let root = cluster.zk_root.clone();
    let stream_node = format!(
        "{root}/streams/{}",
        quire_metadata::encode_stream_name(STREAM)
    );
    rt.block_on(async {
        let owner = outsider(&cluster.zookeeper(), Some("quire:s3cret-of-the-cluster")).await;
        let (data, stat) = owner.get_data(&stream_node).await.unwrap();
        assert!(!data.is_empty(), "the stream record is there");
        let (acls, _) = owner.get_acl(&stream_node).await.unwrap();
        assert!(
            acls.iter()
                .all(|a| a.scheme() == "digest" && a.id().starts_with("quire:")),
            "the stream record's ACL names the cluster's identity only: {acls:?}"
        );
        let ledger_dirs = owner
            .list_children(&format!("{root}/ledgers"))
            .await
            .unwrap();
        assert!(!ledger_dirs.is_empty());

        for digest in [
            None,
            Some("quire:a-guess"),
            Some("intruder:s3cret-of-the-cluster"),
        ] {
            let c = outsider(&cluster.zookeeper(), digest).await;
            let what = format!("session with {digest:?}");
            for path in [root.as_str(), &format!("{root}/LAYOUT"), &stream_node] {
                assert_eq!(
                    c.get_data(path).await.unwrap_err(),
                    zk::Error::NoAuth,
                    "{what}: read {path}"
                );
            }
            assert_eq!(
                c.list_children(&root).await.unwrap_err(),
                zk::Error::NoAuth,
                "{what}: list"
            );
            assert_eq!(
                c.set_data(&stream_node, b"{}", None).await.unwrap_err(),
                zk::Error::NoAuth,
                "{what}: overwrite the stream record"
            );
            let create = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            assert_eq!(
                c.create(&format!("{root}/streams/intruder"), b"", &create)
                    .await
                    .unwrap_err(),
                zk::Error::NoAuth,
                "{what}: create a stream record"
            );
            // A delete needs DELETE on the parent.
            assert_eq!(
                c.delete(&stream_node, None).await.unwrap_err(),
                zk::Error::NoAuth,
                "{what}: delete the stream record"
            );
        }
        let (after, stat_after) = owner.get_data(&stream_node).await.unwrap();
        assert_eq!(
            (after, stat_after.version),
            (data, stat.version),
            "nothing changed"
        );
    });

    // Every acknowledged record is still there, read through the secured proxy.
    let mut got = rt.block_on(read_all(&proxy.addr, STREAM));
    let mut expected = acked;
    got.sort();
    expected.sort();
    assert!(
        got == expected,
        "records read back: {} of {}",
        got.len(),
        expected.len()
    );
}

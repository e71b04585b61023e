//! Goal: each stream's ledgers get master keys derived from the stream's own random secret
//! (docs/format/metadata.md, `ledger_secret_hex`): a new stream has a secret from its creation;
//! a stream made before secrets existed gets one with its next segment, stored by the same
//! compare-and-set; every segment's ledger key is `ledger_master_key(secret, id)`, distinct per
//! ledger and per stream; a second proxy recovers the open segment with the key from the
//! ledger metadata and every record reads back.
//! Method: three real bookies, the embedded store, 64 KiB segments; the older stream is made
//! by writing its record straight into the store without a secret.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use quire_client::{ProxyClient, ReadPosition};
use quire_metadata::{RetentionOverride, StreamMetadata};
use quire_wire::LedgerId;

async fn keys_of(c: &common::Cluster, stream: &str) -> (Vec<u8>, Vec<(u64, [u8; 20])>) {
    let meta = c.store.read_stream(stream).await.unwrap().value;
    let secret = meta
        .ledger_secret()
        .unwrap()
        .expect("the stream has a ledger secret");
    let mut keys = Vec::new();
    for s in &meta.segments {
        let lm = c
            .store
            .read_ledger(LedgerId(s.ledger_id))
            .await
            .unwrap()
            .value;
        let key = lm.master_key().unwrap();
        assert_eq!(
            key,
            quire_ledger::ledger_master_key(&secret, LedgerId(s.ledger_id)),
            "{stream}: ledger {} key from the stream's secret",
            s.ledger_id
        );
        keys.push((s.ledger_id, key.0));
    }
    (secret, keys)
}

async fn write_some(client: &ProxyClient, stream: &str, from: u64, n: u64) {
    for chunk in (from..from + n).collect::<Vec<_>>().chunks(100) {
        let records = chunk.iter().map(|&i| (i, common::payload(i))).collect();
        client.write(stream, records, false).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_derive_ledger_keys_from_their_own_secret() {
    let c = common::cluster().await;
    let p = common::proxy(&c, common::small_config()).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();

    // A stream made before secrets existed: no `ledger_secret_hex`.
    c.store
        .create_stream(&StreamMetadata {
            name: "old/s".into(),
            segments: Vec::new(),
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
        })
        .await
        .unwrap();
    client.create_stream("new/s").await.unwrap();
    let created = c.store.read_stream("new/s").await.unwrap().value;
    assert!(
        created.ledger_secret().unwrap().is_some(),
        "made at creation"
    );

    // About 300 KiB each: several 64 KiB segments, the last one left open.
    write_some(&client, "old/s", 0, 1000).await;
    write_some(&client, "new/s", 0, 1000).await;
    let (old_secret, old_keys) = keys_of(&c, "old/s").await;
    let (new_secret, new_keys) = keys_of(&c, "new/s").await;
    assert!(old_keys.len() >= 3, "segments rolled: {old_keys:?}");
    assert_ne!(old_secret, new_secret);
    let distinct: BTreeSet<[u8; 20]> = old_keys.iter().chain(&new_keys).map(|k| k.1).collect();
    assert_eq!(
        distinct.len(),
        old_keys.len() + new_keys.len(),
        "one key per ledger"
    );
    assert!(!distinct.contains(&quire_ledger::master_key(b"quire").0));

    // Another proxy takes the streams over (the first one is gone without completing its
    // segments): it recovers each open segment with the key in the ledger metadata.
    drop(client);
    drop(p);
    common::wait_unowned(&c.store, "old/s").await;
    common::wait_unowned(&c.store, "new/s").await;
    let p2 = common::proxy(&c, common::small_config()).await;
    assert_eq!(
        p2.streams.recover_all().await.unwrap(),
        2,
        "two open segments recovered"
    );
    let client = ProxyClient::connect(p2.server.local_addr()).await.unwrap();
    for stream in ["old/s", "new/s"] {
        write_some(&client, stream, 1000, 10).await;
        let mut got = Vec::new();
        let mut pos = ReadPosition::Head;
        loop {
            let b = client
                .read(stream, pos, 500, 1 << 20, Duration::ZERO)
                .await
                .unwrap();
            if b.records.is_empty() {
                break;
            }
            got.extend(b.records.into_iter().map(|(_, txid, p)| (txid, p)));
            pos = b.next;
        }
        let want: Vec<(u64, Vec<u8>)> = (0..1010).map(|i| (i, common::payload(i))).collect();
        assert!(got == want, "{stream}: {} records read back", got.len());
        // The secret did not change with the new owner.
        let (secret, _) = keys_of(&c, stream).await;
        assert_eq!(
            secret,
            if stream == "old/s" {
                old_secret.clone()
            } else {
                new_secret.clone()
            }
        );
    }
}

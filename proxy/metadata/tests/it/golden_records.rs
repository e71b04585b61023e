//! Golden fixtures of the metadata records (issue 25 item 7): the JSON each record has in a
//! ZooKeeper znode (docs/format/zookeeper-layout.md) and a whole embedded store document
//! (`metadata.json`, format version 1, docs/format/metadata.md), under
//! `proxy/metadata/tests/fixtures/`, written once and never regenerated. Today's types must read
//! them into the values below; `write_missing_fixtures` (ignored) wrote them and never
//! overwrites one.

use std::path::{Path, PathBuf};

use quire_metadata::*;
use quire_wire::LedgerId;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn bookie(n: u8) -> BookieId {
    BookieId(format!("10.0.0.{n}:3181"))
}

fn ledger() -> LedgerMetadata {
    LedgerMetadata {
        format_version: 1,
        ensemble_size: 3,
        write_quorum: 3,
        ack_quorum: 2,
        state: LedgerState::Closed,
        fragments: vec![
            Fragment {
                first_entry: 0,
                bookies: vec![bookie(1), bookie(2), bookie(3)],
            },
            Fragment {
                first_entry: 17,
                bookies: vec![bookie(1), bookie(4), bookie(3)],
            },
        ],
        last_entry: Some(41),
        length_bytes: 84_000,
        digest_type: DigestType::Crc32c,
        master_key_hex: "00112233445566778899aabbccddeeff00112233".into(),
        creation_time_ms: 1_764_979_200_000,
        custom: [("stream".to_string(), "golden/stream".to_string())].into(),
    }
}

fn stream() -> StreamMetadata {
    StreamMetadata {
        name: "golden/stream".into(),
        segments: vec![
            SegmentMetadata {
                seq_no: 1,
                ledger_id: 3,
                state: SegmentState::Completed,
                first_txid: Some(100),
                last_txid: Some(141),
                last_entry: Some(41),
                record_count: 420,
                length_bytes: 84_000,
                completion_time_ms: Some(1_764_979_260_000),
                first_write_time_ms: None,
                last_write_time_ms: None,
                last_record_entry: None,
                last_record_slot: None,
            },
            SegmentMetadata {
                seq_no: 2,
                ledger_id: 4,
                state: SegmentState::InProgress,
                first_txid: Some(142),
                last_txid: None,
                last_entry: None,
                record_count: 0,
                length_bytes: 0,
                completion_time_ms: None,
                first_write_time_ms: None,
                last_write_time_ms: None,
                last_record_entry: None,
                last_record_slot: None,
            },
        ],
        max_txid: Some(141),
        creation_time_ms: 1_764_979_200_000,
        truncated_before: Some(TruncationPoint {
            segment_seq_no: 1,
            entry_id: 10,
            slot_index: 2,
        }),
        retention: RetentionOverride {
            time_secs: Some(86_400),
            size_bytes: None,
            keep_for_subscriptions: false,
        },
        ledger_secret_hex: Some("0f".repeat(32)),
        sealed: false,
        compression: None,
        limits: None,
        home_region: None,
        placement: None,
    }
}

/// The stream record with the fields issue 26 added (seal, per-stream compression): written
/// by `write_missing_fixtures` as `znodes/stream-issue26.json`.
fn stream_issue26() -> StreamMetadata {
    let mut s = stream();
    s.sealed = true;
    s.compression = Some(StreamCompression::Lz4);
    s.retention.keep_for_subscriptions = true;
    s
}

/// The stream record with issue 29's per-stream limits (soft limits at 0 are left out):
/// written by hand as `znodes/stream-issue29.json` (issue 26's record plus `limits`).
fn stream_issue29() -> StreamMetadata {
    let mut s = stream_issue26();
    s.limits = Some(quire_metadata::RateLimits {
        records_per_sec: 1_000,
        bytes_per_sec: 1 << 20,
        outstanding_writes_max: 64,
        ..Default::default()
    });
    s
}

fn cookie() -> Cookie {
    Cookie {
        format_version: COOKIE_FORMAT_VERSION,
        bookie: bookie(1),
        instance_id: "5f0c6a1e9b2d4c3a8e7f6b5a4d3c2b1a".into(),
        journal_dir: "/var/lib/quire/journal".into(),
        ledger_dirs: vec!["/var/lib/quire/ledgers".into()],
    }
}

fn bookie_info() -> BookieInfo {
    BookieInfo {
        id: bookie(2),
        rack: Some("/dc1/rack7".into()),
        region: None,
        read_only: true,
    }
}

/// Issue 30: a registration with a region label.
fn bookie_info_issue30() -> BookieInfo {
    BookieInfo {
        id: bookie(2),
        rack: Some("/rack7".into()),
        region: Some("eu-west".into()),
        read_only: false,
    }
}

fn under_replication() -> UnderReplication {
    UnderReplication {
        missing_bookies: vec![bookie(2)],
        gaps_on: vec![bookie(3)],
        ctime_ms: 1_764_979_300_000,
    }
}

fn read<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = fixtures().join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn every_znode_record_reads_into_its_value() {
    let l: LedgerMetadata = read("znodes/ledger.json");
    assert_eq!(l, ledger());
    l.validate().unwrap();
    // A record from before `compression` existed reads as "follow the proxy default".
    assert_eq!(read::<StreamMetadata>("znodes/stream.json"), stream());
    assert_eq!(stream().compression, None);
    assert_eq!(
        read::<StreamMetadata>("znodes/stream-issue26.json"),
        stream_issue26()
    );
    let limited = read::<StreamMetadata>("znodes/stream-issue29.json");
    assert_eq!(limited, stream_issue29());
    assert_eq!(
        serde_json::to_vec(&limited).unwrap(),
        std::fs::read(fixtures().join("znodes/stream-issue29.json")).unwrap(),
        "today's record writes the same bytes"
    );
    assert_eq!(read::<Cookie>("znodes/cookie.json"), cookie());
    // A registration from before regions reads as region None (default-region).
    assert_eq!(read::<BookieInfo>("znodes/bookie-info.json"), bookie_info());
    let labelled = read::<BookieInfo>("znodes/bookie-info-issue30.json");
    assert_eq!(labelled, bookie_info_issue30());
    assert_eq!(
        serde_json::to_vec(&labelled).unwrap(),
        std::fs::read(fixtures().join("znodes/bookie-info-issue30.json")).unwrap(),
        "today's record writes the same bytes"
    );
    assert_eq!(
        read::<UnderReplication>("znodes/under-replication.json"),
        under_replication()
    );
}

#[tokio::test]
async fn a_version_1_embedded_store_opens_with_its_records() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixtures().join("embedded/metadata.json"),
        dir.path().join("metadata.json"),
    )
    .unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(
        store.read_ledger(LedgerId(3)).await.unwrap().value,
        ledger()
    );
    assert_eq!(
        store.read_stream("golden/stream").await.unwrap().value,
        stream()
    );
    assert_eq!(
        store.list_streams().await.unwrap(),
        vec!["golden/stream".to_string()]
    );
    // Ids 1..=4 were handed out: the next one is above them.
    assert_eq!(store.next_ledger_id().await.unwrap(), LedgerId(5));
    assert!(store.allocate_ledger_id().await.unwrap() >= LedgerId(5));
}

/// Writes the fixtures that do not exist yet; never overwrites one. Run by hand:
/// `cargo test --release -p quire-metadata --test it golden_records::write_missing_fixtures
/// -- --ignored`.
#[tokio::test]
#[ignore = "writes fixtures; run by hand when a record gets a new format version"]
async fn write_missing_fixtures() {
    let znodes = fixtures().join("znodes");
    std::fs::create_dir_all(&znodes).unwrap();
    let records: [(&str, Vec<u8>); 6] = [
        ("ledger.json", serde_json::to_vec(&ledger()).unwrap()),
        ("stream.json", serde_json::to_vec(&stream()).unwrap()),
        (
            "stream-issue26.json",
            serde_json::to_vec(&stream_issue26()).unwrap(),
        ),
        ("cookie.json", serde_json::to_vec(&cookie()).unwrap()),
        (
            "bookie-info.json",
            serde_json::to_vec(&bookie_info()).unwrap(),
        ),
        (
            "under-replication.json",
            serde_json::to_vec(&under_replication()).unwrap(),
        ),
    ];
    for (name, bytes) in records {
        let path = znodes.join(name);
        if !path.exists() {
            std::fs::write(path, bytes).unwrap();
        }
    }
    let embedded = fixtures().join("embedded/metadata.json");
    if !embedded.exists() {
        let scratch = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(scratch.path()).unwrap();
        for _ in 0..4 {
            store.allocate_ledger_id().await.unwrap();
        }
        store.create_ledger(LedgerId(3), &ledger()).await.unwrap();
        store.create_stream(&stream()).await.unwrap();
        drop(store);
        std::fs::create_dir_all(embedded.parent().unwrap()).unwrap();
        std::fs::copy(scratch.path().join("metadata.json"), embedded).unwrap();
    }
}

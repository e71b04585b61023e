//! Golden proxy frames (issue 25 item 7): one request and one success response per opcode and
//! an error answer, as bytes under `tests/fixtures/frames/`, written once and never regenerated.
//! Each is decoded with today's decoder and compared with the value written here, and today's
//! encoder must still produce the same bytes. `write_missing_frames` (ignored) wrote them; it
//! never overwrites a file.

use std::path::PathBuf;

use quire_wire::frame::decode_frame;

use crate::dlsn::{Dlsn, ReadPosition};
use crate::error::ErrorCode;
use crate::protocol::{Opcode, Request, Response, Token};
use crate::types::{
    RetentionChange, RetentionDefaults, RetentionOverride, SegmentMetadata, SegmentState,
    StreamInfo, StreamMetadata, TruncateResult,
};

// A test table of a few dozen frames: the size of a variant costs nothing here.
#[allow(clippy::large_enum_variant)]
enum Golden {
    /// A request and its id.
    Request(u64, Request),
    /// A response, the opcode of the request it answers, and its id.
    Response(Opcode, u64, Response),
}

fn stream_info() -> StreamInfo {
    StreamInfo {
        metadata: StreamMetadata {
            name: "logs/golden".into(),
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
                },
            ],
            max_txid: Some(141),
            creation_time_ms: 1_764_979_200_000,
            truncated_before: Some(Dlsn::new(1, 10, 2)),
            retention: RetentionOverride {
                time_secs: Some(86_400),
                size_bytes: None,
                keep_for_subscriptions: false,
            },
            compression: None,
            limits: None,
            home_region: None,
            placement: None,
        },
        owner: Some("10.0.0.9:4181".into()),
        defaults: RetentionDefaults {
            time_secs: None,
            size_bytes: Some(1 << 30),
        },
        lookups: None,
    }
}

/// Every golden frame, in groups (one function per group keeps each under 100 lines).
fn cases() -> Vec<(&'static str, Golden)> {
    [
        cases_1(),
        cases_2(),
        cases_3(),
        cases_issue26(),
        cases_producer(),
        cases_subscriptions(),
        cases_compression(),
        cases_limits(),
        cases_regions(),
        cases_placement(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

fn cases_1() -> Vec<(&'static str, Golden)> {
    use Golden::Request as Req;
    use Golden::Response as Resp;
    let stream = || "logs/golden".to_string();
    vec![
        (
            "hello-request",
            Req(
                1,
                Request::Hello {
                    version_min: 1,
                    version_max: 1,
                    token: None,
                },
            ),
        ),
        (
            "hello-token-request",
            Req(
                1,
                Request::Hello {
                    version_min: 1,
                    version_max: 1,
                    token: Some(Token(b"tenant-a.secret".to_vec())),
                },
            ),
        ),
        (
            "hello-response",
            Resp(
                Opcode::Hello,
                1,
                Response::Hello {
                    version: 1,
                    frame_size_bytes_max: 16 << 20,
                    record_size_bytes_max: 1 << 20,
                },
            ),
        ),
        (
            "create-stream-request",
            Req(2, Request::CreateStream { stream: stream() }),
        ),
        (
            "create-stream-response",
            Resp(Opcode::CreateStream, 2, Response::CreateStream),
        ),
        ("list-streams-request", Req(3, Request::ListStreams)),
        (
            "list-streams-response",
            Resp(
                Opcode::ListStreams,
                3,
                Response::ListStreams {
                    streams: vec!["logs/golden".into(), "logs/other".into()],
                },
            ),
        ),
        (
            "write-request",
            Req(
                4,
                Request::Write {
                    stream: stream(),
                    create_if_missing: true,
                    compress: false,
                    records: vec![(142, b"first record".to_vec()), (143, Vec::new())],
                },
            ),
        ),
        (
            "write-response",
            Resp(
                Opcode::Write,
                4,
                Response::Write {
                    count: 2,
                    first_dlsn: Dlsn::new(2, 0, 0),
                    last_dlsn: Dlsn::new(2, 0, 1),
                },
            ),
        ),
    ]
}

fn cases_2() -> Vec<(&'static str, Golden)> {
    use Golden::Request as Req;
    use Golden::Response as Resp;
    let stream = || "logs/golden".to_string();
    vec![
        (
            "read-request",
            Req(
                5,
                Request::Read {
                    stream: stream(),
                    from: ReadPosition::Dlsn(Dlsn::new(1, 10, 2)),
                    max_records: 100,
                    max_bytes: 1 << 20,
                    wait_ms: 500,
                    with_write_times: false,
                },
            ),
        ),
        (
            "read-head-request",
            Req(
                6,
                Request::Read {
                    stream: stream(),
                    from: ReadPosition::Head,
                    max_records: 1,
                    max_bytes: 4096,
                    wait_ms: 0,
                    with_write_times: false,
                },
            ),
        ),
        (
            "read-response",
            Resp(
                Opcode::Read,
                5,
                Response::Read {
                    next: ReadPosition::Dlsn(Dlsn::new(2, 1, 0)),
                    records: vec![
                        (Dlsn::new(2, 0, 0), 142, b"first record".to_vec()),
                        (Dlsn::new(2, 0, 1), 143, Vec::new()),
                    ],
                    write_times_ms: None,
                    end_of_stream: false,
                },
            ),
        ),
        (
            "describe-stream-request",
            Req(
                7,
                Request::DescribeStream {
                    stream: stream(),
                    home_region: false,
                    placement: false,
                },
            ),
        ),
        (
            "describe-stream-response",
            Resp(
                Opcode::DescribeStream,
                7,
                Response::DescribeStream {
                    info: stream_info(),
                },
            ),
        ),
        (
            "truncate-stream-request",
            Req(
                8,
                Request::TruncateStream {
                    stream: stream(),
                    before: Dlsn::new(2, 0, 1),
                },
            ),
        ),
        (
            "truncate-stream-response",
            Resp(
                Opcode::TruncateStream,
                8,
                Response::TruncateStream {
                    result: TruncateResult {
                        truncated_before: Dlsn::new(2, 0, 1),
                        segments_deleted: 1,
                    },
                },
            ),
        ),
        (
            "delete-stream-request",
            Req(9, Request::DeleteStream { stream: stream() }),
        ),
    ]
}

fn cases_3() -> Vec<(&'static str, Golden)> {
    use Golden::Request as Req;
    use Golden::Response as Resp;
    let stream = || "logs/golden".to_string();
    vec![
        (
            "delete-stream-response",
            Resp(
                Opcode::DeleteStream,
                9,
                Response::DeleteStream {
                    segments_deleted: 2,
                },
            ),
        ),
        (
            "set-retention-request",
            Req(
                10,
                Request::SetRetention {
                    stream: stream(),
                    time_secs: RetentionChange::Set(3600),
                    size_bytes: RetentionChange::Default,
                    keep_for_subscriptions: None,
                },
            ),
        ),
        (
            "set-retention-response",
            Resp(
                Opcode::SetRetention,
                10,
                Response::SetRetention {
                    retention: RetentionOverride {
                        time_secs: Some(3600),
                        size_bytes: None,
                        keep_for_subscriptions: false,
                    },
                },
            ),
        ),
        (
            "error-response",
            Resp(
                Opcode::Write,
                11,
                Response::Error {
                    code: ErrorCode::StreamOwnedElsewhere,
                    message: "10.0.0.9:4181".into(),
                },
            ),
        ),
    ]
}

/// Issue 26: positions, write times, end of stream, lookups, seal.
fn cases_issue26() -> Vec<(&'static str, Golden)> {
    use Golden::Request as Req;
    use Golden::Response as Resp;
    let stream = || "logs/golden".to_string();
    vec![
        (
            "read-request-txid-position",
            Req(
                12,
                Request::Read {
                    stream: stream(),
                    from: ReadPosition::TxId(142),
                    max_records: 10,
                    max_bytes: 4096,
                    wait_ms: 0,
                    with_write_times: true,
                },
            ),
        ),
        (
            "read-response-write-times-end-of-stream",
            Resp(
                Opcode::Read,
                12,
                Response::Read {
                    next: ReadPosition::Dlsn(Dlsn::new(2, 1, 0)),
                    records: vec![(Dlsn::new(2, 0, 0), 142, b"first record".to_vec())],
                    write_times_ms: Some(vec![1_764_979_260_000]),
                    end_of_stream: true,
                },
            ),
        ),
        (
            "seal-stream-request",
            Req(13, Request::SealStream { stream: stream() }),
        ),
        (
            "seal-stream-response",
            Resp(
                Opcode::SealStream,
                13,
                Response::SealStream {
                    last_dlsn: Some(Dlsn::new(2, 0, 1)),
                },
            ),
        ),
        (
            "describe-stream-response-lookups",
            Resp(
                Opcode::DescribeStream,
                14,
                Response::DescribeStream {
                    info: StreamInfo {
                        lookups: Some(Box::new(crate::types::StreamLookups {
                            first_dlsn: Some(Dlsn::new(1, 0, 0)),
                            last_dlsn: Some(Dlsn::new(1, 41, 9)),
                            record_count: 420,
                            last_write_time_ms: Some(1_764_979_260_000),
                            sealed: true,
                        })),
                        ..stream_info()
                    },
                },
            ),
        ),
    ]
}

fn encode(g: &Golden) -> Vec<u8> {
    let mut out = Vec::new();
    match g {
        Golden::Request(id, r) => r.encode(*id, &mut out),
        Golden::Response(op, id, r) => r.encode(*op as u8, *id, &mut out),
    }
    out
}

fn cases_producer() -> Vec<(&'static str, Golden)> {
    use crate::protocol::ProducerSeq;
    use Golden::Request as Req;
    use Golden::Response as Resp;
    vec![
        (
            "open-producer-session-request",
            Req(
                12,
                Request::OpenProducerSession {
                    stream: "logs/golden".into(),
                },
            ),
        ),
        (
            "open-producer-session-response",
            Resp(
                Opcode::OpenProducerSession,
                12,
                Response::OpenProducerSession {
                    session_id: 0x5eed_0000_0000_0001,
                },
            ),
        ),
        (
            "write-request-producer-session",
            Req(
                13,
                Request::ProducerWrite {
                    stream: "logs/golden".into(),
                    create_if_missing: false,
                    compress: false,
                    producer: ProducerSeq {
                        session_id: 0x5eed_0000_0000_0001,
                        first_seq: 40,
                    },
                    records: vec![(144, b"once".to_vec()), (145, b"only".to_vec())],
                },
            ),
        ),
    ]
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/frames")
}

/// Subscriptions (issue 26 item 2): opcodes 0x0C to 0x0F.
fn cases_subscriptions() -> Vec<(&'static str, Golden)> {
    use crate::subscription::SubscriptionInfo;
    use Golden::Request as Req;
    use Golden::Response as Resp;
    let stream = || "logs/golden".to_string();
    let name = || "billing".to_string();
    let info = SubscriptionInfo {
        name: name(),
        committed: Some(Dlsn::new(2, 7, 1)),
        commit_time_ms: Some(1_764_979_300_000),
        lag_records: 1234,
        lag_bytes: 56_789,
    };
    let never = SubscriptionInfo {
        name: "new".into(),
        committed: None,
        commit_time_ms: None,
        lag_records: 5000,
        lag_bytes: 1 << 20,
    };
    vec![
        (
            "commit-subscription-request",
            Req(
                12,
                Request::CommitSubscription {
                    stream: stream(),
                    name: name(),
                    position: Dlsn::new(2, 7, 1),
                },
            ),
        ),
        (
            "commit-subscription-response",
            Resp(
                Opcode::CommitSubscription,
                12,
                Response::Subscription { info: info.clone() },
            ),
        ),
        (
            "get-subscription-request",
            Req(
                13,
                Request::GetSubscription {
                    stream: stream(),
                    name: "new".into(),
                },
            ),
        ),
        (
            "get-subscription-response",
            Resp(
                Opcode::GetSubscription,
                13,
                Response::Subscription {
                    info: never.clone(),
                },
            ),
        ),
        (
            "list-subscriptions-request",
            Req(14, Request::ListSubscriptions { stream: stream() }),
        ),
        (
            "list-subscriptions-response",
            Resp(
                Opcode::ListSubscriptions,
                14,
                Response::ListSubscriptions {
                    subscriptions: vec![info, never],
                },
            ),
        ),
        (
            "delete-subscription-request",
            Req(
                15,
                Request::DeleteSubscription {
                    stream: stream(),
                    name: name(),
                },
            ),
        ),
        (
            "delete-subscription-response",
            Resp(
                Opcode::DeleteSubscription,
                15,
                Response::DeleteSubscription { existed: true },
            ),
        ),
    ]
}

/// Per-stream compression (issue 26 item 5): opcode 0x10, and a stream description whose
/// answer flags carry the stream's setting.
fn cases_compression() -> Vec<(&'static str, Golden)> {
    use crate::compression::Compression;
    use Golden::Request as Req;
    use Golden::Response as Resp;
    let mut lz4 = stream_info();
    lz4.metadata.compression = Some(Compression::Lz4);
    vec![
        (
            "set-compression-request",
            Req(
                16,
                Request::SetCompression {
                    stream: "logs/golden".into(),
                    compression: Some(Compression::Lz4),
                },
            ),
        ),
        (
            "set-compression-response",
            Resp(
                Opcode::SetCompression,
                16,
                Response::SetCompression {
                    compression: Some(Compression::Lz4),
                },
            ),
        ),
        (
            "describe-stream-response-compression",
            Resp(
                Opcode::DescribeStream,
                17,
                Response::DescribeStream { info: lz4 },
            ),
        ),
    ]
}

fn cases_limits() -> Vec<(&'static str, Golden)> {
    use crate::limits::StreamLimits;
    use Golden::Request as Req;
    use Golden::Response as Resp;
    let limits = Some(StreamLimits {
        records_per_sec: 1_000,
        bytes_per_sec: 1 << 20,
        soft_records_per_sec: 800,
        soft_bytes_per_sec: 0,
        outstanding_writes_max: 64,
    });
    let mut described = stream_info();
    described.metadata.limits = limits;
    // An answer with limits always carries the lookups before them.
    described.lookups = Some(Box::new(crate::types::StreamLookups {
        first_dlsn: Some(Dlsn::new(1, 0, 0)),
        last_dlsn: Some(Dlsn::new(1, 41, 9)),
        record_count: 420,
        last_write_time_ms: Some(1_764_979_260_000),
        sealed: false,
    }));
    vec![
        (
            "set-limits-request",
            Req(
                18,
                Request::SetLimits {
                    stream: "logs/golden".into(),
                    limits,
                },
            ),
        ),
        (
            "set-limits-response",
            Resp(Opcode::SetLimits, 18, Response::SetLimits { limits }),
        ),
        (
            "describe-stream-response-limits",
            Resp(
                Opcode::DescribeStream,
                19,
                Response::DescribeStream { info: described },
            ),
        ),
    ]
}

/// Issue 30: a described stream with a home region (answer flag 0x10, after the lookups).
fn cases_regions() -> Vec<(&'static str, Golden)> {
    let mut described = stream_info();
    described.metadata.home_region = Some("eu-west".into());
    described.lookups = Some(Box::new(crate::types::StreamLookups {
        first_dlsn: Some(Dlsn::new(1, 0, 0)),
        last_dlsn: Some(Dlsn::new(1, 41, 9)),
        record_count: 420,
        last_write_time_ms: Some(1_764_979_260_000),
        sealed: false,
    }));
    vec![
        (
            "describe-stream-request-home-region",
            Golden::Request(
                20,
                Request::DescribeStream {
                    stream: "logs/golden".into(),
                    home_region: true,
                    placement: false,
                },
            ),
        ),
        (
            "describe-stream-response-home-region",
            Golden::Response(
                Opcode::DescribeStream,
                20,
                Response::DescribeStream { info: described },
            ),
        ),
    ]
}

/// Issue 30 item 2: SET_PLACEMENT both ways, and a described stream with its own placement
/// (request flag 0x02, answer flag 0x20, the block after the home region).
fn cases_placement() -> Vec<(&'static str, Golden)> {
    use crate::placement::{PlacementPolicy, StreamPlacement};
    let placement = Some(StreamPlacement {
        placement: PlacementPolicy::RegionAware,
        min_racks_per_write_quorum: 2,
        enforce_min_racks: false,
        min_regions_for_durability: 2,
        enforce_durability: true,
        regions: vec!["eu-west".into(), "eu-central".into(), "us-east".into()],
        quorum: Some((3, 3, 2)),
    });
    let mut described = stream_info();
    described.metadata.home_region = Some("eu-west".into());
    described.metadata.placement = placement.clone();
    described.lookups = Some(Box::new(crate::types::StreamLookups {
        first_dlsn: Some(Dlsn::new(1, 0, 0)),
        last_dlsn: Some(Dlsn::new(1, 41, 9)),
        record_count: 420,
        last_write_time_ms: Some(1_764_979_260_000),
        sealed: false,
    }));
    vec![
        (
            "set-placement-request",
            Golden::Request(
                21,
                Request::SetPlacement {
                    stream: "logs/golden".into(),
                    placement: placement.clone(),
                },
            ),
        ),
        (
            "set-placement-response",
            Golden::Response(
                Opcode::SetPlacement,
                21,
                Response::SetPlacement { placement },
            ),
        ),
        (
            "describe-stream-request-placement",
            Golden::Request(
                22,
                Request::DescribeStream {
                    stream: "logs/golden".into(),
                    home_region: true,
                    placement: true,
                },
            ),
        ),
        (
            "describe-stream-response-placement",
            Golden::Response(
                Opcode::DescribeStream,
                22,
                Response::DescribeStream { info: described },
            ),
        ),
    ]
}

#[test]
fn every_golden_frame_decodes_to_its_value_and_encodes_to_its_bytes() {
    for (name, golden) in cases() {
        let path = dir().join(format!("{name}.bin"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (frame, used) = decode_frame(&bytes, u32::MAX)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .unwrap_or_else(|| panic!("{name}: frame cut short"));
        assert_eq!(used, bytes.len(), "{name}: bytes after the frame");
        match &golden {
            Golden::Request(id, want) => {
                assert_eq!(frame.header.request_id, *id, "{name}");
                assert_eq!(&Request::decode(&frame).unwrap(), want, "{name}");
            }
            Golden::Response(_, id, want) => {
                assert_eq!(frame.header.request_id, *id, "{name}");
                assert_eq!(&Response::decode(&frame).unwrap(), want, "{name}");
            }
        }
        assert_eq!(
            encode(&golden),
            bytes,
            "{name}: today's encoder writes other bytes"
        );
    }
}

#[test]
fn every_opcode_has_a_golden_request_and_response() {
    let names: Vec<&str> = cases().iter().map(|(n, _)| *n).collect();
    for op in 1u8..=u8::MAX {
        let Ok(op) = Opcode::from_u8(op) else {
            continue;
        };
        let stem = match op {
            Opcode::Hello => "hello",
            Opcode::CreateStream => "create-stream",
            Opcode::ListStreams => "list-streams",
            Opcode::Write => "write",
            Opcode::Read => "read",
            Opcode::DescribeStream => "describe-stream",
            Opcode::TruncateStream => "truncate-stream",
            Opcode::DeleteStream => "delete-stream",
            Opcode::SetRetention => "set-retention",
            Opcode::SealStream => "seal-stream",
            Opcode::OpenProducerSession => "open-producer-session",
            Opcode::CommitSubscription => "commit-subscription",
            Opcode::GetSubscription => "get-subscription",
            Opcode::ListSubscriptions => "list-subscriptions",
            Opcode::DeleteSubscription => "delete-subscription",
            Opcode::SetCompression => "set-compression",
            Opcode::SetLimits => "set-limits",
            Opcode::SetPlacement => "set-placement",
        };
        for kind in ["request", "response"] {
            assert!(
                names
                    .iter()
                    .any(|n| *n == format!("{stem}-{kind}")
                        || n.starts_with(&format!("{stem}-{kind}-"))),
                "no golden {kind} frame for {op:?}"
            );
        }
    }
}

/// Writes the frames whose file does not exist yet; never overwrites one. Run by hand:
/// `cargo test --release -p quire-client --lib golden::write_missing_frames -- --ignored`.
#[test]
#[ignore = "writes fixtures; run by hand when a new opcode or version needs its frame"]
fn write_missing_frames() {
    std::fs::create_dir_all(dir()).unwrap();
    for (name, golden) in cases() {
        let path = dir().join(format!("{name}.bin"));
        if !path.exists() {
            std::fs::write(path, encode(&golden)).unwrap();
        }
    }
}

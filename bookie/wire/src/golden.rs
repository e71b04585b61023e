//! Golden frames (issue 25 item 7): one request and one success response per opcode, the
//! version 1 and 2 handshake answers and an error answer, as bytes under
//! `tests/fixtures/frames/`, written once and never regenerated. Each is decoded with today's
//! decoder and compared with the value written here, and today's encoder must still produce the
//! same bytes (both protocol versions are current: a bookie without a cluster secret speaks 1).
//! `write_missing_frames` (ignored) wrote them; it never overwrites a file.

use std::path::PathBuf;

use crate::bookie::*;
use crate::entry::{encode_entry, EntryHeader};
use crate::frame::{decode_frame, FRAME_SIZE_BYTES_MAX_DEFAULT};
use crate::{EntryId, LedgerId, MasterKey};

enum Golden {
    Request(u64, Request<'static>),
    Response(u64, Response<'static>),
    LongPoll(u64, LongPollResponse<'static>),
    Info(u64, BookieInfo),
}

const KEY: MasterKey = MasterKey([0x5a; 20]);

fn entry(ledger: u64, id: u64, lac: Option<u64>, payload: &[u8]) -> &'static [u8] {
    let header = EntryHeader {
        ledger: LedgerId(ledger),
        entry: EntryId(id),
        lac: lac.map(EntryId),
        length_bytes: 1000 + payload.len() as u64,
    };
    Box::leak(encode_entry(header, payload).into_boxed_slice())
}

/// Every golden frame, in groups (one function per group keeps each under 100 lines).
fn cases() -> Vec<(&'static str, Golden)> {
    [cases_1(), cases_2(), cases_3()]
        .into_iter()
        .flatten()
        .collect()
}

fn cases_1() -> Vec<(&'static str, Golden)> {
    use Golden::*;
    let stored = entry(7, 3, Some(2), b"golden entry");
    vec![
        (
            "hello-request",
            Request(
                1,
                crate::bookie::Request::Hello {
                    version_min: 1,
                    version_max: 2,
                },
            ),
        ),
        (
            "hello-response-v1",
            Response(
                1,
                crate::bookie::Response::Hello {
                    version: 1,
                    shard_count: 4,
                    frame_size_bytes_max: 5 << 20,
                    auth_nonce: None,
                },
            ),
        ),
        (
            "hello-response-v2",
            Response(
                1,
                crate::bookie::Response::Hello {
                    version: 2,
                    shard_count: 4,
                    frame_size_bytes_max: 5 << 20,
                    auth_nonce: Some([0x11; 32]),
                },
            ),
        ),
        (
            "auth-request",
            Request(
                2,
                crate::bookie::Request::Auth {
                    client_nonce: [0x22; 32],
                    proof: [0x33; 32],
                },
            ),
        ),
        (
            "auth-response",
            Response(2, crate::bookie::Response::Auth { proof: [0x44; 32] }),
        ),
        (
            "add-request",
            Request(
                3,
                crate::bookie::Request::Add {
                    recovery: false,
                    master_key: KEY,
                    entry: stored,
                },
            ),
        ),
        (
            "add-recovery-request",
            Request(
                4,
                crate::bookie::Request::Add {
                    recovery: true,
                    master_key: KEY,
                    entry: stored,
                },
            ),
        ),
        (
            "add-response",
            Response(
                3,
                crate::bookie::Response::Add {
                    ledger: LedgerId(7),
                    entry: EntryId(3),
                },
            ),
        ),
    ]
}

fn cases_2() -> Vec<(&'static str, Golden)> {
    use Golden::*;
    let stored = entry(7, 3, Some(2), b"golden entry");
    vec![
        (
            "read-request",
            Request(
                5,
                crate::bookie::Request::Read {
                    ledger: LedgerId(7),
                    entry: Some(EntryId(3)),
                    fence: None,
                },
            ),
        ),
        (
            "read-last-fencing-request",
            Request(
                6,
                crate::bookie::Request::Read {
                    ledger: LedgerId(7),
                    entry: None,
                    fence: Some(KEY),
                },
            ),
        ),
        (
            "read-response",
            Response(
                5,
                crate::bookie::Response::Read {
                    ledger: LedgerId(7),
                    entry: EntryId(3),
                    data: stored,
                },
            ),
        ),
        (
            "read-lac-request",
            Request(
                7,
                crate::bookie::Request::ReadLac {
                    ledger: LedgerId(7),
                },
            ),
        ),
        (
            "read-lac-response",
            Response(
                7,
                crate::bookie::Response::ReadLac {
                    ledger: LedgerId(7),
                    lac: Some(EntryId(2)),
                    last_entry: Some(EntryId(3)),
                },
            ),
        ),
        (
            "fence-request",
            Request(
                8,
                crate::bookie::Request::Fence {
                    ledger: LedgerId(7),
                    master_key: KEY,
                },
            ),
        ),
        (
            "fence-response",
            Response(
                8,
                crate::bookie::Response::Fence {
                    ledger: LedgerId(7),
                    lac: Some(EntryId(2)),
                },
            ),
        ),
        (
            "read-lac-long-poll-request",
            Request(
                9,
                crate::bookie::Request::ReadLacLongPoll {
                    ledger: LedgerId(7),
                    previous_lac: Some(EntryId(1)),
                    timeout_ms: 2500,
                },
            ),
        ),
    ]
}

fn cases_3() -> Vec<(&'static str, Golden)> {
    use Golden::*;
    let stored = entry(7, 3, Some(2), b"golden entry");
    vec![
        (
            "read-lac-long-poll-response",
            LongPoll(
                9,
                LongPollResponse {
                    ledger: LedgerId(7),
                    lac: Some(EntryId(2)),
                    fenced: true,
                    next_entry: Some((EntryId(2), stored)),
                },
            ),
        ),
        (
            "get-bookie-info-request",
            Request(10, crate::bookie::Request::GetBookieInfo { scrub: false }),
        ),
        (
            "get-bookie-info-request-scrub",
            Request(12, crate::bookie::Request::GetBookieInfo { scrub: true }),
        ),
        (
            "get-bookie-info-response",
            Info(
                10,
                BookieInfo {
                    state: BookieState::ReadOnly,
                    shard_ledgers: vec![3, 0, 12],
                    dirs: golden_dirs(),
                    scrub: None,
                },
            ),
        ),
        (
            "get-bookie-info-response-scrub",
            Info(
                12,
                BookieInfo {
                    state: BookieState::ReadOnly,
                    shard_ledgers: vec![3, 0, 12],
                    dirs: golden_dirs(),
                    scrub: Some(vec![
                        ScrubInfo {
                            flags: SCRUB_ENABLED | SCRUB_IN_PROGRESS,
                            pass_started_ms: 1_765_000_300_000,
                            last_pass_start_ms: 1_765_000_000_000,
                            last_pass_end_ms: 1_765_000_120_000,
                            last_pass_entries: 5000,
                            last_pass_bytes: 9 << 20,
                            passes: 3,
                            entries_scanned: 15000,
                            bytes_scanned: 27 << 20,
                            damaged_found: 2,
                            damaged_now: 1,
                            repaired: 1,
                            ledgers_reported: 2,
                        },
                        ScrubInfo::default(),
                        ScrubInfo::default(),
                    ]),
                },
            ),
        ),
        (
            "failed-response",
            Response(
                11,
                crate::bookie::Response::Failed {
                    opcode: Opcode::Add,
                    status: Status::Fenced,
                    message: "ledger 7 is fenced",
                },
            ),
        ),
    ]
}

/// The directories of the golden bookie info answers.
fn golden_dirs() -> Vec<DirInfo> {
    vec![
        DirInfo {
            kind: DirKind::Journal,
            path: "/var/lib/quire/journal".into(),
            total_bytes: 1 << 40,
            free_bytes: 1 << 30,
            used_bytes: 5 << 20,
        },
        DirInfo {
            kind: DirKind::Ledger,
            path: "/var/lib/quire/ledgers".into(),
            total_bytes: 2 << 40,
            free_bytes: 0,
            used_bytes: 7 << 30,
        },
    ]
}

fn encode(g: &Golden) -> Vec<u8> {
    let mut out = Vec::new();
    match g {
        Golden::Request(id, r) => encode_request(&mut out, *id, r),
        Golden::Response(id, r) => encode_response(&mut out, *id, r),
        Golden::LongPoll(id, r) => encode_long_poll_response(&mut out, *id, r),
        Golden::Info(id, r) => encode_bookie_info_response(&mut out, *id, r),
    }
    out
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/frames")
}

#[test]
fn every_golden_frame_decodes_to_its_value_and_encodes_to_its_bytes() {
    for (name, golden) in cases() {
        let path = dir().join(format!("{name}.bin"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (frame, used) = decode_frame(&bytes, FRAME_SIZE_BYTES_MAX_DEFAULT)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .unwrap_or_else(|| panic!("{name}: frame cut short"));
        assert_eq!(used, bytes.len(), "{name}: bytes after the frame");
        match &golden {
            Golden::Request(id, want) => {
                assert_eq!(frame.header.request_id, *id, "{name}");
                assert_eq!(&decode_request(&frame).unwrap(), want, "{name}");
            }
            Golden::Response(id, want) => {
                assert_eq!(frame.header.request_id, *id, "{name}");
                assert_eq!(&decode_response(&frame).unwrap(), want, "{name}");
            }
            Golden::LongPoll(id, want) => {
                assert_eq!(frame.header.request_id, *id, "{name}");
                let got = decode_long_poll_response(&frame).unwrap();
                assert_eq!(got, LongPollReply::Ok(want.clone()), "{name}");
            }
            Golden::Info(id, want) => {
                assert_eq!(frame.header.request_id, *id, "{name}");
                let got = decode_bookie_info_response(&frame).unwrap();
                assert_eq!(got, BookieInfoReply::Ok(want.clone()), "{name}");
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
            Opcode::Add => "add",
            Opcode::Read => "read",
            Opcode::ReadLac => "read-lac",
            Opcode::Fence => "fence",
            Opcode::ReadLacLongPoll => "read-lac-long-poll",
            Opcode::GetBookieInfo => "get-bookie-info",
            Opcode::Auth => "auth",
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
/// `cargo test --release -p quire-wire --lib golden::write_missing_frames -- --ignored`.
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

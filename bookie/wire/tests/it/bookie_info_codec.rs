//! Goal: the `GetBookieInfo` request and its response codec round-trip every shape (no
//! shards or directories, several, a read-only bookie, an error answer), and the decoder
//! refuses damaged frames without panicking or allocating what the body cannot hold.
//! Method: encode, decode and compare; cut every frame at every length; flip every byte;
//! forge counts far above the body's size; forge unknown state and directory kinds.

use quire_wire::bookie::{
    decode_bookie_info_response, decode_request, decode_response, encode_bookie_info_response,
    encode_request, encode_response, BookieInfo, BookieInfoReply, BookieState, DirInfo, DirKind,
    Opcode, Request, Response, ScrubInfo, Status, BOOKIE_INFO_PATH_SIZE_BYTES_MAX, SCRUB_ENABLED,
    SCRUB_IN_PROGRESS,
};
use quire_wire::frame::{
    decode_frame, Frame, FRAME_HEADER_SIZE_BYTES, FRAME_SIZE_BYTES_MAX_DEFAULT,
};
use quire_wire::WireError;

fn samples() -> Vec<BookieInfo> {
    vec![
        BookieInfo {
            state: BookieState::Writable,
            shard_ledgers: vec![],
            dirs: vec![],
            scrub: None,
        },
        BookieInfo {
            state: BookieState::Writable,
            shard_ledgers: vec![3, 0, u64::MAX],
            dirs: vec![
                DirInfo {
                    kind: DirKind::Journal,
                    path: "/data/journal".into(),
                    total_bytes: 1 << 40,
                    free_bytes: 1 << 39,
                    used_bytes: 64 << 20,
                },
                DirInfo {
                    kind: DirKind::Ledger,
                    path: "/data/lédgers".into(),
                    total_bytes: 2 << 40,
                    free_bytes: 0,
                    used_bytes: 1 << 30,
                },
            ],
            scrub: None,
        },
        BookieInfo {
            state: BookieState::ReadOnly,
            shard_ledgers: vec![1],
            dirs: vec![DirInfo {
                kind: DirKind::Ledger,
                path: String::new(),
                total_bytes: 0,
                free_bytes: 0,
                used_bytes: 0,
            }],
            scrub: None,
        },
        BookieInfo {
            state: BookieState::Writable,
            shard_ledgers: vec![4, 5],
            dirs: vec![],
            scrub: Some(vec![
                ScrubInfo {
                    flags: SCRUB_ENABLED | SCRUB_IN_PROGRESS,
                    pass_started_ms: 7,
                    last_pass_start_ms: 1,
                    last_pass_end_ms: 2,
                    last_pass_entries: 3,
                    last_pass_bytes: 4,
                    passes: 5,
                    entries_scanned: 6,
                    bytes_scanned: u64::MAX,
                    damaged_found: 8,
                    damaged_now: 9,
                    repaired: 10,
                    ledgers_reported: 11,
                },
                ScrubInfo::default(),
            ]),
        },
        BookieInfo {
            state: BookieState::Writable,
            shard_ledgers: vec![],
            dirs: vec![],
            scrub: Some(vec![]),
        },
    ]
}

fn encoded(info: &BookieInfo) -> Vec<u8> {
    let mut out = Vec::new();
    encode_bookie_info_response(&mut out, 41, info);
    out
}

fn frame(bytes: &[u8]) -> Frame<'_> {
    let (frame, used) = decode_frame(bytes, FRAME_SIZE_BYTES_MAX_DEFAULT)
        .unwrap()
        .unwrap();
    assert_eq!(used, bytes.len());
    frame
}

#[test]
fn request_round_trips_and_refuses_a_body() {
    let mut out = Vec::new();
    encode_request(&mut out, 5, &Request::GetBookieInfo { scrub: false });
    let f = frame(&out);
    assert_eq!(f.header.opcode, Opcode::GetBookieInfo as u8);
    assert_eq!(
        decode_request(&f).unwrap(),
        Request::GetBookieInfo { scrub: false }
    );
    assert_eq!(
        f.header.flags, 0,
        "an older bookie sees the request it always saw"
    );
    let mut with = Vec::new();
    encode_request(&mut with, 6, &Request::GetBookieInfo { scrub: true });
    let f = frame(&with);
    assert_eq!(f.header.flags, quire_wire::bookie::INFO_WANT_SCRUB);
    assert_eq!(
        decode_request(&f).unwrap(),
        Request::GetBookieInfo { scrub: true }
    );
    // A body on a request that has none is refused.
    let mut body = out.clone();
    body.push(0);
    let len = u32::from_le_bytes(body[0..4].try_into().unwrap()) + 1;
    body[0..4].copy_from_slice(&len.to_le_bytes());
    assert!(matches!(
        decode_request(&frame(&body)),
        Err(WireError::TrailingBytes { .. })
    ));
}

#[test]
fn response_round_trips_and_errors_decode() {
    for info in samples() {
        let out = encoded(&info);
        let f = frame(&out);
        assert_eq!(f.header.request_id, 41);
        assert_eq!(
            decode_bookie_info_response(&f).unwrap(),
            BookieInfoReply::Ok(info.clone())
        );
        // The generic decoder refuses it rather than misreading the body.
        assert!(decode_response(&f).is_err());
    }
    let mut out = Vec::new();
    encode_response(
        &mut out,
        8,
        &Response::Failed {
            opcode: Opcode::GetBookieInfo,
            status: Status::IoError,
            message: "statvfs failed",
        },
    );
    assert_eq!(
        decode_bookie_info_response(&frame(&out)).unwrap(),
        BookieInfoReply::Failed {
            status: Status::IoError,
            message: "statvfs failed"
        }
    );
    // Another opcode's response is not a bookie-info answer.
    let mut other = Vec::new();
    encode_response(
        &mut other,
        8,
        &Response::Fence {
            ledger: quire_wire::LedgerId(1),
            lac: None,
        },
    );
    assert!(decode_bookie_info_response(&frame(&other)).is_err());
}

#[test]
fn long_paths_are_cut_on_a_char_boundary() {
    let path = "é".repeat(BOOKIE_INFO_PATH_SIZE_BYTES_MAX); // 2 bytes each
    let info = BookieInfo {
        state: BookieState::Writable,
        shard_ledgers: vec![1],
        dirs: vec![DirInfo {
            kind: DirKind::Journal,
            path: path.clone(),
            total_bytes: 1,
            free_bytes: 1,
            used_bytes: 1,
        }],
        scrub: None,
    };
    let out = encoded(&info);
    let BookieInfoReply::Ok(got) = decode_bookie_info_response(&frame(&out)).unwrap() else {
        panic!("not ok")
    };
    assert_eq!(got.dirs[0].path.len(), BOOKIE_INFO_PATH_SIZE_BYTES_MAX);
    assert!(path.starts_with(&got.dirs[0].path));
}

/// Rewrites a frame's body (and its length field).
fn with_body(out: &[u8], body: &[u8]) -> Vec<u8> {
    let mut v = out[..FRAME_HEADER_SIZE_BYTES].to_vec();
    let len = (FRAME_HEADER_SIZE_BYTES - 4 + body.len()) as u32;
    v[0..4].copy_from_slice(&len.to_le_bytes());
    v.extend_from_slice(body);
    v
}

#[test]
fn damaged_frames_are_refused_without_panic() {
    for info in samples() {
        let out = encoded(&info);
        let body = &out[FRAME_HEADER_SIZE_BYTES..];
        // Where the layout without the scrub section ends: a body cut there is that layout.
        let old_len = info.scrub.as_ref().map(|_| {
            let without = BookieInfo {
                scrub: None,
                ..info.clone()
            };
            encoded(&without).len() - FRAME_HEADER_SIZE_BYTES
        });
        // Every other shorter body is truncated; a longer one has trailing bytes (or, past
        // the layout without the section, a truncated section).
        for cut in 0..body.len() {
            let bad = with_body(&out, &body[..cut]);
            let got = decode_bookie_info_response(&frame(&bad));
            if Some(cut) == old_len {
                let want = BookieInfo {
                    scrub: None,
                    ..info.clone()
                };
                assert_eq!(got.unwrap(), BookieInfoReply::Ok(want));
                continue;
            }
            assert!(got.is_err(), "body cut at {cut} of {}", body.len());
        }
        let mut longer = body.to_vec();
        longer.push(0);
        let longer = with_body(&out, &longer);
        let got = decode_bookie_info_response(&frame(&longer));
        if info.scrub.is_some() {
            assert!(matches!(got, Err(WireError::TrailingBytes { .. })));
        } else {
            assert!(matches!(got, Err(WireError::Truncated { .. })));
        }
        // Any flipped byte decodes to something or to an error, never a panic.
        for i in 0..out.len() {
            let mut bad = out.clone();
            bad[i] ^= 0xff;
            if let Ok(Some((f, _))) = decode_frame(&bad, FRAME_SIZE_BYTES_MAX_DEFAULT) {
                let _ = decode_bookie_info_response(&f);
            }
        }
    }
}

#[test]
fn forged_counts_and_values_are_refused() {
    let out = encoded(&samples()[1]);
    // state, then a shard count of 65535 with only three shards' bytes behind it.
    let mut body = out[FRAME_HEADER_SIZE_BYTES..].to_vec();
    body[1..3].copy_from_slice(&u16::MAX.to_le_bytes());
    assert!(matches!(
        decode_bookie_info_response(&frame(&with_body(&out, &body))),
        Err(WireError::Truncated { .. })
    ));
    // Unknown state.
    let mut body = out[FRAME_HEADER_SIZE_BYTES..].to_vec();
    body[0] = 2;
    assert!(matches!(
        decode_bookie_info_response(&frame(&with_body(&out, &body))),
        Err(WireError::InvalidField { .. })
    ));
    // Unknown directory kind: the first directory starts after state, count, 3 ledgers, count.
    let mut body = out[FRAME_HEADER_SIZE_BYTES..].to_vec();
    body[1 + 2 + 24 + 2] = 9;
    assert!(matches!(
        decode_bookie_info_response(&frame(&with_body(&out, &body))),
        Err(WireError::InvalidField { .. })
    ));
    // A path length above the limit.
    let mut body = out[FRAME_HEADER_SIZE_BYTES..].to_vec();
    let at = 1 + 2 + 24 + 2 + 1 + 24;
    body[at..at + 4].copy_from_slice(&(BOOKIE_INFO_PATH_SIZE_BYTES_MAX as u32 + 1).to_le_bytes());
    assert!(decode_bookie_info_response(&frame(&with_body(&out, &body))).is_err());
    // Unknown scrub flags.
    let out4 = encoded(&samples()[3]);
    let mut body = out4[FRAME_HEADER_SIZE_BYTES..].to_vec();
    body[1 + 2 + 16 + 2 + 2] = 0x04;
    assert!(matches!(
        decode_bookie_info_response(&frame(&with_body(&out4, &body))),
        Err(WireError::InvalidField { .. })
    ));
    // A scrub shard count far above what the body holds.
    let mut body = out4[FRAME_HEADER_SIZE_BYTES..].to_vec();
    body[1 + 2 + 16 + 2..1 + 2 + 16 + 4].copy_from_slice(&u16::MAX.to_le_bytes());
    assert!(matches!(
        decode_bookie_info_response(&frame(&with_body(&out4, &body))),
        Err(WireError::Truncated { .. })
    ));
    // A path that is not UTF-8.
    let mut body = out[FRAME_HEADER_SIZE_BYTES..].to_vec();
    body[at + 4] = 0xff;
    assert!(matches!(
        decode_bookie_info_response(&frame(&with_body(&out, &body))),
        Err(WireError::InvalidField { .. })
    ));
}

//! Goal: the long-poll response has its own codec that round-trips every shape (timeout, LAC
//! moved with and without the piggybacked entry, fenced, error) and rejects damaged frames
//! without panicking. Method: encode, decode and compare; then cut every frame at every
//! length, flip every byte, and check the shared `decode_response` refuses a success body.

use quire_wire::bookie::{
    decode_long_poll_response, decode_response, encode_long_poll_response, encode_response,
    LongPollReply, LongPollResponse, Opcode, Response, Status,
};
use quire_wire::frame::{decode_frame, FRAME_SIZE_BYTES_MAX_DEFAULT};
use quire_wire::{EntryId, LedgerId};

fn samples(data: &[u8]) -> Vec<LongPollResponse<'_>> {
    vec![
        LongPollResponse {
            ledger: LedgerId(7),
            lac: None,
            fenced: false,
            next_entry: None,
        },
        LongPollResponse {
            ledger: LedgerId(7),
            lac: Some(EntryId(3)),
            fenced: false,
            next_entry: None,
        },
        LongPollResponse {
            ledger: LedgerId(7),
            lac: Some(EntryId(4)),
            fenced: false,
            next_entry: Some((EntryId(4), data)),
        },
        LongPollResponse {
            ledger: LedgerId(7),
            lac: Some(EntryId(0)),
            fenced: true,
            next_entry: Some((EntryId(0), &[])),
        },
    ]
}

#[test]
fn round_trip_and_errors() {
    let data = b"entry bytes".to_vec();
    for s in samples(&data) {
        let mut out = Vec::new();
        encode_long_poll_response(&mut out, 99, &s);
        let (frame, used) = decode_frame(&out, FRAME_SIZE_BYTES_MAX_DEFAULT)
            .unwrap()
            .unwrap();
        assert_eq!(used, out.len());
        assert_eq!(frame.header.request_id, 99);
        assert_eq!(
            decode_long_poll_response(&frame).unwrap(),
            LongPollReply::Ok(s.clone())
        );
        // The generic decoder refuses it with an error rather than misreading the body.
        assert!(decode_response(&frame).is_err());
    }
    let mut out = Vec::new();
    let failed = Response::Failed {
        opcode: Opcode::ReadLacLongPoll,
        status: Status::IoError,
        message: "disk",
    };
    encode_response(&mut out, 5, &failed);
    let (frame, _) = decode_frame(&out, FRAME_SIZE_BYTES_MAX_DEFAULT)
        .unwrap()
        .unwrap();
    assert_eq!(
        decode_long_poll_response(&frame).unwrap(),
        LongPollReply::Failed {
            status: Status::IoError,
            message: "disk"
        }
    );
    // Another opcode's response is not a long-poll response.
    let mut out = Vec::new();
    encode_response(
        &mut out,
        5,
        &Response::Add {
            ledger: LedgerId(1),
            entry: EntryId(1),
        },
    );
    let (frame, _) = decode_frame(&out, FRAME_SIZE_BYTES_MAX_DEFAULT)
        .unwrap()
        .unwrap();
    assert!(decode_long_poll_response(&frame).is_err());
}

#[test]
fn damaged_frames_are_errors_not_panics() {
    let data = b"entry bytes".to_vec();
    for s in samples(&data) {
        let mut out = Vec::new();
        encode_long_poll_response(&mut out, 1, &s);
        for cut in 0..out.len() {
            if let Ok(Some((frame, _))) = decode_frame(&out[..cut], FRAME_SIZE_BYTES_MAX_DEFAULT) {
                let _ = decode_long_poll_response(&frame);
            }
        }
        for i in 0..out.len() {
            let mut bad = out.clone();
            bad[i] ^= 0xff;
            if let Ok(Some((frame, _))) = decode_frame(&bad, FRAME_SIZE_BYTES_MAX_DEFAULT) {
                let _ = decode_long_poll_response(&frame);
            }
        }
    }
    // Unknown flag bits are refused.
    let mut out = Vec::new();
    encode_long_poll_response(&mut out, 1, &samples(&data)[1]);
    let flags_at = out.len() - 1;
    out[flags_at] = 0x80;
    let (frame, _) = decode_frame(&out, FRAME_SIZE_BYTES_MAX_DEFAULT)
        .unwrap()
        .unwrap();
    assert!(decode_long_poll_response(&frame).is_err());
}

//! Goal: taking the frames of one large read costs bytes moved in proportion to what is left
//! over, not to frames × buffer (issue 12, item 5: the proxy drained its receive buffer once
//! per frame, quadratic in a large read of small pipelined frames). Counted, not timed:
//! `RecvBuffer::moved_bytes`.
//! Method: 50,000 small frames and half of one more arrive in one read; every whole frame is
//! taken, in order; the rest of the last frame arrives in the next read and completes it. A
//! second case feeds the same bytes in uneven reads (1 to 7,000 bytes) and checks that every
//! frame still comes out once, in order.

use quire_wire::frame::{encode_frame, FrameHeader, RecvBuffer, FRAME_SIZE_BYTES_MAX_DEFAULT};

fn frame(i: u64) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(
        &mut out,
        FrameHeader {
            opcode: 2,
            flags: 0,
            status: 0,
            request_id: i,
        },
        &i.to_le_bytes(),
    );
    out
}

const FRAMES: u64 = 50_000;

fn wire() -> Vec<u8> {
    let mut wire = Vec::new();
    for i in 0..=FRAMES {
        wire.extend_from_slice(&frame(i));
    }
    wire
}

#[test]
fn a_large_read_of_small_frames_moves_only_the_leftover() {
    let wire = wire();
    let last = frame(FRAMES);
    let (head, tail) = wire.split_at(wire.len() - last.len() / 2);
    let frame_bytes = frame(0).len() as u64;

    let mut buf = RecvBuffer::new();
    buf.for_read(1 << 20).extend_from_slice(head);
    let mut ids = Vec::new();
    while let Some(f) = buf.next_frame(FRAME_SIZE_BYTES_MAX_DEFAULT).unwrap() {
        ids.push(f.header.request_id);
    }
    assert_eq!(ids, (0..FRAMES).collect::<Vec<_>>());
    assert_eq!(buf.pending(), &last[..last.len() - tail.len()]);
    buf.for_read(1 << 20).extend_from_slice(tail);
    let f = buf
        .next_frame(FRAME_SIZE_BYTES_MAX_DEFAULT)
        .unwrap()
        .unwrap();
    assert_eq!(f.header.request_id, FRAMES);
    assert!(buf.is_empty());
    // One move of the half frame left over. A drain per frame moves everything behind each
    // frame: about FRAMES² × frame_bytes / 2 bytes (here about 3·10^10).
    let leftover = (last.len() - tail.len()) as u64;
    assert_eq!(buf.moved_bytes(), leftover);
    let per_frame_drain = frame_bytes * FRAMES * (FRAMES - 1) / 2;
    assert!(buf.moved_bytes() * 1000 < per_frame_drain);
}

#[test]
fn uneven_reads_give_every_frame_once_in_order() {
    let wire = wire();
    let mut buf = RecvBuffer::new();
    let (mut at, mut step, mut reads) = (0usize, 1usize, 0u64);
    let mut ids = Vec::new();
    while at < wire.len() {
        let end = (at + step).min(wire.len());
        buf.for_read(64 << 10).extend_from_slice(&wire[at..end]);
        at = end;
        reads += 1;
        step = (step * 7 + 13) % 7_000 + 1;
        while let Some(f) = buf.next_frame(FRAME_SIZE_BYTES_MAX_DEFAULT).unwrap() {
            ids.push(f.header.request_id);
        }
    }
    assert_eq!(ids, (0..=FRAMES).collect::<Vec<_>>());
    assert!(buf.is_empty());
    // Each read moves at most one incomplete frame.
    assert!(buf.moved_bytes() <= reads * frame(0).len() as u64);
}

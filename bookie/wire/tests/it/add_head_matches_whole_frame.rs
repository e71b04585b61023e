//! Goal: an `Add` sent as a per-bookie head (frame header, master key, entry header) followed
//! by a payload shared between the bookies of the write set is byte for byte the frame
//! `encode_request` builds from the whole entry (issue 25 item 6: the ledger client no longer
//! copies the entry into each bookie's frame; the wire format stays as it was).
//! Method: for payloads of 0, 1, 1,024 and 70,000 bytes, both recovery flags and a LAC set and
//! not, `encode_add_request_head` + `encode_entry_header` + payload is compared with
//! `encode_request(Add { entry: encode_entry(..) })`, and the split form decodes back to the
//! same request.

use quire_wire::bookie::{decode_request, encode_add_request_head, encode_request, Request};
use quire_wire::entry::{encode_entry, encode_entry_header, EntryHeader};
use quire_wire::frame::{decode_frame, FRAME_SIZE_BYTES_MAX_DEFAULT};
use quire_wire::{EntryId, LedgerId, MasterKey};

#[test]
fn split_add_frame_is_the_whole_frame() {
    let key = MasterKey([7u8; 20]);
    for len in [0usize, 1, 1024, 70_000] {
        let payload: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        for (recovery, lac) in [(false, None), (true, Some(EntryId(41)))] {
            let header = EntryHeader {
                ledger: LedgerId(9),
                entry: EntryId(42),
                lac,
                length_bytes: 123_456,
            };
            let entry = encode_entry(header, &payload);
            let mut whole = Vec::new();
            let request = Request::Add {
                recovery,
                master_key: key,
                entry: &entry,
            };
            encode_request(&mut whole, 77, &request);

            let entry_head = encode_entry_header(header, &payload);
            let mut split = Vec::new();
            encode_add_request_head(&mut split, 77, recovery, key, entry_head.len() + len);
            split.extend_from_slice(&entry_head);
            split.extend_from_slice(&payload);
            assert_eq!(split, whole, "payload {len} bytes, recovery {recovery}");

            let (frame, used) = decode_frame(&split, FRAME_SIZE_BYTES_MAX_DEFAULT)
                .unwrap()
                .unwrap();
            assert_eq!(used, split.len());
            assert_eq!(decode_request(&frame).unwrap(), request);
        }
    }
}

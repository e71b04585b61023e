//! Fuzz checks for every decoder of bytes that arrive from the network or from disk (issue 12
//! item 7): bookie frames, proxy frames, record sets, journal records, entry-log records,
//! checkpoint marks, tombstone groups, file headers and index segments (current and legacy).
//!
//! Each [`Target`] takes arbitrary bytes and must return without panicking; where the decoder
//! accepts the bytes and an encoder exists, the decoded value is encoded again and decoded back,
//! and the two decodings must agree (a decoder that accepts what its encoder cannot reproduce
//! would let one replica read bytes differently from another). The same functions are called by
//! the libFuzzer targets in `libfuzzer/` (`cargo +nightly fuzz run`, see `run.sh`) and by the
//! seeded test in `tests/seeded.rs`, which runs in CI.
//!
//! Formats with a CRC32C are reached past their checksum by [`Target::reseal`]: the seeded
//! test's mutator recomputes the checksum of a mutated input, so that the structural checks
//! behind it are exercised (libFuzzer finds its way past CRC comparisons by itself).

use quire_client::protocol as proxy_protocol;
use quire_client::record_set;
use quire_engine::format as f;
use quire_engine::io::BLOCK_BYTES;
use quire_wire::bookie as bookie_wire;
use quire_wire::frame::{decode_frame, Frame, RESPONSE_BIT};

/// One fuzzed decoder.
pub struct Target {
    /// Name of the libFuzzer target and of the corpus directory.
    pub name: &'static str,
    /// Decodes `data`; panics only on a defect.
    pub check: fn(&[u8]),
    /// Valid encodings to start from.
    pub seeds: fn() -> Vec<Vec<u8>>,
    /// Recomputes the checksum(s) of a mutated input in place, where the format has one.
    pub reseal: fn(&mut [u8]),
}

/// Every target, in a fixed order.
pub const TARGETS: &[Target] = &[
    Target {
        name: "bookie_frame",
        check: check_bookie_frame,
        seeds: seeds_bookie_frame,
        reseal: no_reseal,
    },
    Target {
        name: "proxy_frame",
        check: check_proxy_frame,
        seeds: seeds_proxy_frame,
        reseal: no_reseal,
    },
    Target {
        name: "record_set",
        check: check_record_set,
        seeds: seeds_record_set,
        reseal: no_reseal,
    },
    Target {
        name: "journal_record",
        check: check_journal_record,
        seeds: seeds_journal_record,
        reseal: reseal_journal_record,
    },
    Target {
        name: "entry_log_record",
        check: check_entry_log_record,
        seeds: seeds_entry_log_record,
        reseal: reseal_entry_log_record,
    },
    Target {
        name: "checkpoint_mark",
        check: check_mark,
        seeds: seeds_mark,
        reseal: reseal_mark,
    },
    Target {
        name: "tombstone_group",
        check: check_tombstone,
        seeds: seeds_tombstone,
        reseal: reseal_tombstone,
    },
    Target {
        name: "file_header",
        check: check_file_header,
        seeds: seeds_file_header,
        reseal: reseal_file_header,
    },
    Target {
        name: "index_segment_block",
        check: check_index_block,
        seeds: seeds_index_block,
        reseal: reseal_index_block,
    },
    Target {
        name: "legacy_index_segment",
        check: check_legacy_index,
        seeds: seeds_legacy_index,
        reseal: no_reseal,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

fn no_reseal(_: &mut [u8]) {}

fn put_crc(b: &mut [u8], at: usize, covered: std::ops::Range<usize>) {
    if covered.end <= b.len() && at + 4 <= b.len() && covered.start <= covered.end {
        let crc = crc32c::crc32c(&b[covered]);
        b[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

fn u32_le(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
}

fn u64_le(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)
        .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
}

/// Frames the way a connection reads them: as many whole frames as the bytes hold.
fn frames(data: &[u8]) -> Vec<Frame<'_>> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Ok(Some((frame, used))) = decode_frame(&data[at..], 1 << 20) {
        out.push(frame);
        at += used;
    }
    out
}

fn one_frame(bytes: &[u8]) -> Frame<'_> {
    match decode_frame(bytes, u32::MAX) {
        Ok(Some((f, used))) if used == bytes.len() => f,
        other => panic!("a re-encoded frame does not decode as one frame: {other:?}"),
    }
}

/// Bookie protocol (docs/protocol.md): every frame decoded as a request and as each kind of
/// response; what decodes is encoded again and must decode to the same value.
pub fn check_bookie_frame(data: &[u8]) {
    for f in frames(data) {
        let id = f.header.request_id;
        if let Ok(req) = bookie_wire::decode_request(&f) {
            let mut out = Vec::new();
            bookie_wire::encode_request(&mut out, id, &req);
            let again = bookie_wire::decode_request(&one_frame(&out));
            assert_eq!(again.as_ref(), Ok(&req), "bookie request round trip");
        }
        if let Ok(resp) = bookie_wire::decode_response(&f) {
            let mut out = Vec::new();
            bookie_wire::encode_response(&mut out, id, &resp);
            let again = bookie_wire::decode_response(&one_frame(&out));
            assert_eq!(again.as_ref(), Ok(&resp), "bookie response round trip");
        }
        let _ = bookie_wire::decode_long_poll_response(&f);
        if let Ok(bookie_wire::BookieInfoReply::Ok(info)) =
            bookie_wire::decode_bookie_info_response(&f)
        {
            let mut out = Vec::new();
            bookie_wire::encode_bookie_info_response(&mut out, id, &info);
            let again = bookie_wire::decode_bookie_info_response(&one_frame(&out));
            assert!(
                matches!(&again, Ok(bookie_wire::BookieInfoReply::Ok(i)) if *i == info),
                "bookie info round trip: {again:?}"
            );
        }
    }
}

fn seeds_bookie_frame() -> Vec<Vec<u8>> {
    use bookie_wire::{Opcode, Request, Response, Status};
    use quire_wire::{EntryId, LedgerId, MasterKey};
    let key = MasterKey([7u8; 20]);
    let entry = quire_wire::entry::encode_entry(
        quire_wire::entry::EntryHeader {
            ledger: LedgerId(5),
            entry: EntryId(9),
            lac: Some(EntryId(8)),
            length_bytes: 3,
        },
        b"abc",
    );
    let requests = [
        Request::Hello {
            version_min: 1,
            version_max: 1,
        },
        Request::Add {
            recovery: false,
            master_key: key,
            entry: &entry,
        },
        Request::Read {
            ledger: LedgerId(5),
            entry: Some(EntryId(9)),
            fence: Some(key),
        },
        Request::Fence {
            ledger: LedgerId(5),
            master_key: key,
        },
        Request::ReadLacLongPoll {
            ledger: LedgerId(5),
            previous_lac: None,
            timeout_ms: 100,
        },
    ];
    let mut seeds = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        let mut out = Vec::new();
        bookie_wire::encode_request(&mut out, i as u64 + 1, r);
        seeds.push(out);
    }
    let responses = [
        Response::Add {
            ledger: LedgerId(5),
            entry: EntryId(9),
        },
        Response::Read {
            ledger: LedgerId(5),
            entry: EntryId(9),
            data: &entry,
        },
        Response::Failed {
            opcode: Opcode::Read,
            status: Status::NoSuchEntry,
            message: "no such entry",
        },
    ];
    for (i, r) in responses.iter().enumerate() {
        let mut out = Vec::new();
        bookie_wire::encode_response(&mut out, i as u64 + 1, r);
        seeds.push(out);
    }
    seeds
}

/// Proxy protocol (docs/proxy-protocol.md): every frame decoded as a request and as a
/// response, each encoded again and decoded to the same value.
pub fn check_proxy_frame(data: &[u8]) {
    for f in frames(data) {
        let id = f.header.request_id;
        if let Ok(req) = proxy_protocol::Request::decode(&f) {
            let mut out = Vec::new();
            req.encode(id, &mut out);
            let again = proxy_protocol::Request::decode(&one_frame(&out));
            assert_eq!(again.as_ref(), Ok(&req), "proxy request round trip");
        }
        if let Ok(resp) = proxy_protocol::Response::decode(&f) {
            let mut out = Vec::new();
            resp.encode(f.header.opcode & !RESPONSE_BIT, id, &mut out);
            let again = proxy_protocol::Response::decode(&one_frame(&out));
            assert_eq!(again.as_ref(), Ok(&resp), "proxy response round trip");
        }
    }
}

fn seeds_proxy_frame() -> Vec<Vec<u8>> {
    use proxy_protocol::{Request, Response, Token};
    let requests = [
        Request::Hello {
            version_min: 1,
            version_max: 1,
            token: None,
        },
        Request::Hello {
            version_min: 1,
            version_max: 1,
            token: Some(Token(b"t0ken".to_vec())),
        },
        Request::Write {
            stream: "s/a".into(),
            create_if_missing: true,
            compress: false,
            records: vec![(1, b"one".to_vec()), (2, b"two".to_vec())],
        },
        Request::Read {
            stream: "s/a".into(),
            from: quire_client::ReadPosition::Head,
            max_records: 10,
            max_bytes: 1 << 16,
            wait_ms: 0,
            with_write_times: false,
        },
    ];
    let mut seeds = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        let mut out = Vec::new();
        r.encode(i as u64 + 1, &mut out);
        seeds.push(out);
    }
    let mut out = Vec::new();
    Response::Error {
        code: quire_client::ErrorCode::NoSuchStream,
        message: "stream \"x\" does not exist".into(),
    }
    .encode(2, 9, &mut out);
    seeds.push(out);
    seeds
}

/// Record sets (the bytes of one stream entry, docs/proxy-protocol.md): decoded, and when
/// accepted, encoded again with the newest format and decoded to the same records.
pub fn check_record_set(data: &[u8]) {
    let Ok(set) = record_set::decode(data) else {
        return;
    };
    // Versions 1 and 2 carry no write time: the newest format writes 0 for it.
    let time = set.write_time_ms.unwrap_or(0);
    let again = match set.control_last_txid {
        Some(last) if set.end_of_stream => {
            record_set::encode_end_of_stream(set.segment_record_index, last, time)
        }
        Some(last) => record_set::encode_control(set.segment_record_index, last, time),
        None => record_set::encode_with_runs(
            set.segment_record_index,
            time,
            &set.producer_runs,
            set.records.iter().map(|r| (r.txid, r.payload)),
        ),
    };
    let back = record_set::decode(&again).expect("re-encoded record set decodes");
    assert_eq!(
        (
            back.segment_record_index,
            &back.records,
            back.control_last_txid,
            back.end_of_stream
        ),
        (
            set.segment_record_index,
            &set.records,
            set.control_last_txid,
            set.end_of_stream
        ),
        "record set round trip"
    );
    assert_eq!(back.write_time_ms, Some(time));
    assert_eq!(back.producer_runs, set.producer_runs);
}

fn seeds_record_set() -> Vec<Vec<u8>> {
    vec![
        record_set::encode(
            40,
            1_700_000_000_000,
            [
                (7u64, &b"first"[..]),
                (8, &b""[..]),
                (9, &b"third record"[..]),
            ],
        ),
        record_set::encode_control(43, 9, 1_700_000_000_000),
        record_set::encode_end_of_stream(43, 9, 1_700_000_000_000),
        record_set::encode_v1(0, [(1u64, &b"old"[..])]),
        record_set::encode_control_v2(1, 1),
    ]
}

/// The salt journal inputs are sealed with (a version 2 file's header would hold it).
pub const JOURNAL_SALT: u64 = 0x5153_4a4e_4c5f_5632;

/// Journal records (docs/format/journal.md), as replay reads them one after another, both as
/// a version 1 file's (no salt) and as a version 2 file's with [`JOURNAL_SALT`]; a record that
/// decodes is encoded again and must decode the same.
pub fn check_journal_record(data: &[u8]) {
    check_journal_records(data, &f::JournalSalt::V1);
    check_journal_records(data, &f::JournalSalt::new(JOURNAL_SALT));
}

fn check_journal_records(data: &[u8], salt: &f::JournalSalt) {
    let mut at = 0;
    while at < data.len() {
        match f::decode_record(&data[at..], salt) {
            f::RecordDecode::Ok { seq, record, len } => {
                assert!(
                    len > 0 && at + len <= data.len(),
                    "record length {len} at {at}"
                );
                let mut out = Vec::new();
                f::encode_record(&mut out, seq, &record, salt);
                match f::decode_record(&out, salt) {
                    f::RecordDecode::Ok {
                        seq: s, record: r, ..
                    } => assert!(s == seq && r == record, "journal record round trip"),
                    other => panic!("a re-encoded journal record does not decode: {other:?}"),
                }
                at += len;
            }
            _ => return,
        }
    }
}

fn seeds_journal_record() -> Vec<Vec<u8>> {
    use f::Record;
    let salt = f::JournalSalt::new(JOURNAL_SALT);
    let mut b = Vec::new();
    f::encode_record(
        &mut b,
        1,
        &Record::BatchHeader {
            record_count: 2,
            batch_bytes: 200,
        },
        &salt,
    );
    f::encode_record(
        &mut b,
        2,
        &Record::Add {
            ledger: 3,
            entry: 4,
            lac: Some(3),
            recovery: false,
            master_key: [1; 20],
            data: b"entry bytes".to_vec(),
        },
        &salt,
    );
    f::encode_record(
        &mut b,
        3,
        &Record::Fence {
            ledger: 3,
            master_key: [1; 20],
        },
        &salt,
    );
    vec![b]
}

fn reseal_journal_record(b: &mut [u8]) {
    let mut at = 0;
    while let Some(len) = u32_le(b, at + 4) {
        let total = f::RECORD_HEADER_BYTES + len as usize;
        if at + total > b.len() {
            return;
        }
        let crc = f::JournalSalt::new(JOURNAL_SALT).crc(&b[at + 4..at + total]);
        b[at..at + 4].copy_from_slice(&crc.to_le_bytes());
        at += total;
    }
}

/// Entry-log records (docs/format/entry-log.md), checked against the (ledger, entry, length)
/// that the record's own header names, as a read through the index does.
pub fn check_entry_log_record(data: &[u8]) {
    let (Some(len), Some(ledger), Some(entry)) =
        (u32_le(data, 4), u64_le(data, 8), u64_le(data, 16))
    else {
        let _ = f::decode_entry_record(data, 0, 0, 0);
        return;
    };
    if let Ok(bytes) = f::decode_entry_record(data, ledger, entry, len) {
        let mut out = Vec::new();
        f::encode_entry_record(&mut out, ledger, entry, &bytes);
        assert_eq!(out[..], data[..out.len()], "entry-log record round trip");
    }
}

fn seeds_entry_log_record() -> Vec<Vec<u8>> {
    let mut b = Vec::new();
    f::encode_entry_record(&mut b, 12, 34, b"some entry data");
    vec![b]
}

fn reseal_entry_log_record(b: &mut [u8]) {
    if let Some(len) = u32_le(b, 4) {
        let total = f::ENTRY_RECORD_HEADER_BYTES.saturating_add(len as usize);
        if total <= b.len() {
            put_crc(b, 0, 4..total);
        }
    }
}

/// Checkpoint marks (docs/format/index.md): decoded; an accepted version 2 mark is encoded
/// again and must decode the same.
pub fn check_mark(data: &[u8]) {
    if let f::MarkDecode::Ok(m) = f::decode_mark(data) {
        if m.legacy_index_bytes.is_none() {
            match f::decode_mark(&f::encode_mark(&m)) {
                f::MarkDecode::Ok(again) => assert_eq!(again, m, "mark round trip"),
                _ => panic!("a re-encoded mark does not decode: {m:?}"),
            }
        }
    }
}

fn seeds_mark() -> Vec<Vec<u8>> {
    let m = f::Mark {
        journal_file_id: 3,
        journal_offset: 8192,
        next_seq: 77,
        legacy_index_bytes: None,
        segments: vec![1, 2, 5],
        summaries: Default::default(),
    };
    let v1 = f::Mark {
        legacy_index_bytes: Some(4096),
        segments: Vec::new(),
        summaries: Default::default(),
        ..m.clone()
    };
    vec![f::encode_mark(&m), f::encode_mark_v1(&v1)]
}

fn reseal_mark(b: &mut [u8]) {
    let at = BLOCK_BYTES - 4;
    put_crc(b, at, 0..at);
}

/// Tombstone groups (deleted ledger ids, docs/format/index.md), as read one after another.
pub fn check_tombstone(data: &[u8]) {
    let mut at = 0;
    while at < data.len() {
        match f::decode_tombstone_group(&data[at..]) {
            f::TombstoneDecode::Ok { ids, padded_bytes } => {
                assert!(padded_bytes > 0, "a group takes bytes");
                let again = f::decode_tombstone_group(&f::encode_tombstone_group(&ids));
                assert!(
                    matches!(&again, f::TombstoneDecode::Ok { ids: i, .. } if *i == ids),
                    "tombstone round trip: {again:?}"
                );
                at += padded_bytes;
            }
            _ => return,
        }
    }
}

fn seeds_tombstone() -> Vec<Vec<u8>> {
    let mut b = f::encode_tombstone_group(&[4, 9, 1 << 40]);
    b.extend(f::encode_tombstone_group(&[11]));
    vec![b]
}

fn reseal_tombstone(b: &mut [u8]) {
    if let Some(count) = u32_le(b, 8) {
        let end =
            f::TOMBSTONE_GROUP_HEADER_BYTES.saturating_add((count as usize).saturating_mul(8));
        if end <= b.len() {
            put_crc(b, 4, 8..end);
        }
    }
}

/// File headers of journals (version 1, 2 or 3), entry logs and index segments; a journal header
/// that decodes with a salt is encoded again and must be the same bytes.
pub fn check_file_header(data: &[u8]) {
    for magic in [f::ENTRY_LOG_MAGIC, f::INDEX_SEGMENT_FILE_MAGIC] {
        let _ = f::decode_file_header(magic, data);
    }
    if let f::JournalHeader::Ok { file_id, salt } = f::decode_journal_header(data) {
        if let Some(v) = salt.value() {
            let again = f::encode_journal_header_version(file_id, v, salt.version());
            // Bytes 10..16 are reserved zeros the reader does not check (the CRC at 32..36
            // covers them, so it differs too when they are not zero).
            assert!(
                data[..10] == again[..10] && data[16..32] == again[16..32],
                "journal header round trip"
            );
        }
    }
}

fn seeds_file_header() -> Vec<Vec<u8>> {
    vec![
        f::encode_file_header(f::JOURNAL_MAGIC, 42),
        f::encode_journal_header(42, 0x0123_4567_89ab_cdef),
        f::encode_journal_header_version(42, 0x0123_4567_89ab_cdef, f::JOURNAL_FORMAT_SALTED),
    ]
}

fn reseal_file_header(b: &mut [u8]) {
    put_crc(b, 24, 0..24);
    put_crc(b, 32, 0..32);
}

/// One 4 KiB block of an index segment file, read as each kind of block the reader reads
/// (the header block's segment fields, a data block, an index or top block, a ledger-state
/// block), with the accessors a reader uses after the block's check.
pub fn check_index_block(data: &[u8]) {
    let block_bytes = BLOCK_BYTES;
    let mut b = data.to_vec();
    b.resize(block_bytes.max(data.len()), 0);
    let _ = f::get_segment_header(&b);
    if let Ok(n) = f::check_block(&b, f::LOCATIONS_PER_BLOCK) {
        for i in 0..n {
            let _ = f::data_key(&b, i);
            let _ = f::data_location(&b, i);
        }
    }
    if let Ok(n) = f::check_block(&b, f::KEYS_PER_BLOCK) {
        for i in 0..n {
            let _ = f::block_key(&b, i);
        }
    }
    if let Ok(states) = f::decode_ledger_block(&b) {
        if states.len() <= f::LEDGERS_PER_BLOCK {
            let again = f::decode_ledger_block(&f::encode_ledger_block(&states));
            assert_eq!(again.as_ref(), Ok(&states), "ledger-state block round trip");
        }
    }
}

fn seeds_index_block() -> Vec<Vec<u8>> {
    let loc = f::Location {
        log_id: 2,
        offset: 4096,
        data_len: 100,
    };
    // Field-by-field with a default rest, so that state fields added later get seeds too.
    #[allow(clippy::needless_update)]
    let states = vec![(
        5u64,
        f::StoredLedger {
            fenced: true,
            master_key: Some([3; 20]),
            lac: Some(9),
            last_entry: Some(10),
            ..f::StoredLedger::default()
        },
    )];
    vec![
        f::encode_data_block(&[(5, 0, loc), (5, 1, loc)]),
        f::encode_key_block(&[(5, 0), (6, 0)]),
        f::encode_ledger_block(&states),
    ]
}

fn reseal_index_block(b: &mut [u8]) {
    let block_bytes = BLOCK_BYTES;
    put_crc(b, 0, 4..block_bytes);
    // The header block's segment fields carry a CRC of their own.
    put_crc(b, 88, 32..88);
}

/// The legacy single-file index segment (`index.qix` era), read by migration.
pub fn check_legacy_index(data: &[u8]) {
    let _ = f::decode_segment(data);
}

fn seeds_legacy_index() -> Vec<Vec<u8>> {
    let loc = f::Location {
        log_id: 1,
        offset: 0,
        data_len: 10,
    };
    vec![f::encode_segment(
        &[(1, 0, loc)],
        &[(1, f::StoredLedger::default())],
    )]
}

//! The proxy protocol: requests and responses carried in [`quire_wire::frame`] frames.
//!
//! Byte-by-byte layouts are in `docs/proxy-protocol.md`. This module is a pure codec without
//! I/O; every decoder refuses hostile input with a [`WireError`] and never panics.

use quire_wire::frame::{encode_frame, Frame, FrameHeader, RESPONSE_BIT};
use quire_wire::{put_len_prefixed, Reader, WireError};

use crate::compression::{self, Compression};
use crate::dlsn::{Dlsn, ReadPosition};
use crate::error::ErrorCode;
use crate::record_set::RECORD_HEADER_SIZE_BYTES;
use crate::subscription::{self, SubscriptionInfo};
use crate::types::{
    RetentionChange, RetentionDefaults, RetentionOverride, SegmentMetadata, SegmentState,
    StreamInfo, StreamLookups, StreamMetadata, TruncateResult,
};

/// Handshake magic: ASCII "QPX1" read as a little-endian u32.
pub const PROXY_HELLO_MAGIC: u32 = u32::from_le_bytes(*b"QPX1");
/// Oldest proxy protocol version this build speaks.
pub const PROXY_PROTOCOL_VERSION_MIN: u16 = 1;
/// Newest proxy protocol version this build speaks.
pub const PROXY_PROTOCOL_VERSION_MAX: u16 = 1;
/// Longest error message sent, in bytes; longer ones are cut at a character boundary.
pub const ERROR_MESSAGE_SIZE_BYTES_MAX: usize = 1024;
/// Longest stream name field accepted on the wire (the naming rules allow 255).
pub const STREAM_NAME_FIELD_SIZE_BYTES_MAX: usize = 1024;
/// Bytes a record adds to a write request besides its payload: txid u64 + length u32.
pub const WRITE_RECORD_OVERHEAD_BYTES: usize = RECORD_HEADER_SIZE_BYTES;
/// Bytes a record adds to a read response besides its payload: DLSN 20 + txid 8 + length 4.
pub const READ_RECORD_OVERHEAD_BYTES: usize = 32;

/// The txid reserved for end-of-stream, refused in writes by the server and the client
/// (DistributedLog reserves `Long.MAX_VALUE` the same way: a stream whose last txid were this
/// value could take no further write, as txids never decrease). Every other u64 is a valid txid.
pub const TXID_RESERVED: u64 = u64::MAX;

/// The index of the first record of a write whose txid is [`TXID_RESERVED`], if any.
pub fn reserved_txid_index(records: &[(u64, Vec<u8>)]) -> Option<usize> {
    records.iter().position(|(txid, _)| *txid == TXID_RESERVED)
}

/// `Write` flag: create the stream if it does not exist.
pub const FLAG_CREATE_IF_MISSING: u8 = 0x01;
/// `Read` request flag: every record in the answer carries its write time; the answer sets
/// the same bit when it does.
pub const FLAG_READ_WRITE_TIMES: u8 = 0x01;
/// `LIST_STREAMS` request and answer flag: the paged form (prefix, page token and page size in
/// the request; names and the next page token in the answer, `list_page.rs`). Without it the
/// request is the original empty one and the answer holds every name.
pub const FLAG_LIST_PAGED: u8 = 0x01;
/// `Read` answer flag: the read reached the stream's end-of-stream marker; the records in this
/// answer (possibly none) are the stream's last, and no later read returns more.
pub const FLAG_READ_END_OF_STREAM: u8 = 0x02;
/// Bytes a record adds to a read answer that carries write times.
pub const READ_RECORD_WRITE_TIME_BYTES: usize = 8;
/// `Write` flag: the body carries a producer session's numbering ([`ProducerSeq`]) after the
/// stream name (exactly-once appends, `docs/proxy-protocol.md` "Producer sessions").
pub const FLAG_PRODUCER_SESSION: u8 = 0x02;
/// `Write` flag: store this write's records LZ4-compressed (record set version 3, flag bit0;
/// `docs/format/record-set.md`). The owner compresses every entry that holds a record of such
/// a write; readers see the records as written. A proxy before this flag ignores it.
pub const FLAG_WRITE_COMPRESS: u8 = 0x04;
/// `SetRetention` request flag: turn the stream's `keep_for_subscriptions` on (retention never
/// deletes what a subscription still needs). With [`FLAG_RETENTION_SUBSCRIPTIONS_OFF`]: refused.
/// As an answer flag of `SetRetention` and `DescribeStream`: the setting is on.
pub const FLAG_RETENTION_KEEP_FOR_SUBSCRIPTIONS: u8 = 0x01;

/// `DESCRIBE_STREAM` answer flag: the stream has a home region (issue 30), and its name (a
/// string) ends the stream info, after the lookups (always present with it) and the limits
/// block if any.
pub const FLAG_DESCRIBE_HOME_REGION: u8 = 0x10;

/// `DESCRIBE_STREAM` request flag: the client decodes the home region (answer flag
/// [`FLAG_DESCRIBE_HOME_REGION`]); without it the proxy leaves the home region out.
pub const FLAG_DESCRIBE_WANT_HOME_REGION: u8 = 0x01;

/// Longest home region name a `DESCRIBE_STREAM` answer may carry.
const REGION_FIELD_SIZE_BYTES_MAX: usize = 256;
/// `SetRetention` request flag: turn the stream's `keep_for_subscriptions` off. Neither flag:
/// left as it is.
pub const FLAG_RETENTION_SUBSCRIPTIONS_OFF: u8 = 0x02;

/// How a write in a producer session is numbered (Kafka's idempotent producer: producer id and
/// the sequence number of the batch's first record): `session_id` (never 0) from
/// `OPEN_PRODUCER_SESSION`, and the sequence number of the write's first record; its records
/// have consecutive sequence numbers `first_seq`, `first_seq + 1`, ... A session numbers its
/// records from 0 without gaps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProducerSeq {
    pub session_id: u64,
    pub first_seq: u64,
}

/// Request opcodes. Stable numbers: add new ones, never renumber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Opcode {
    /// Handshake; must be the first request on a connection.
    Hello = 0x01,
    /// Create an empty stream.
    CreateStream = 0x02,
    /// List every stream name.
    ListStreams = 0x03,
    /// Append records to a stream.
    Write = 0x04,
    /// Read records from a position, optionally waiting for new ones.
    Read = 0x05,
    /// A stream's segments, truncation point, retention and owner.
    DescribeStream = 0x06,
    /// Make every record before a DLSN unreadable and delete the segments before it.
    TruncateStream = 0x07,
    /// Delete a stream and all its segments.
    DeleteStream = 0x08,
    /// Change (or just show) a stream's retention overrides.
    SetRetention = 0x09,
    /// Seal a stream: write the end-of-stream marker; later writes fail with `END_OF_STREAM`.
    SealStream = 0x0A,
    /// Open a producer session for exactly-once writes to a stream.
    OpenProducerSession = 0x0B,
    /// Move a subscription's committed position forward (DistributedLog
    /// `advanceCommitPosition`).
    CommitSubscription = 0x0C,
    /// A subscription's committed position and lag (`getLastCommitPosition`).
    GetSubscription = 0x0D,
    /// Every subscription of a stream, with lag.
    ListSubscriptions = 0x0E,
    /// Delete a subscription (`deleteSubscriber`).
    DeleteSubscription = 0x0F,
    /// Set (or drop) a stream's own compression setting.
    SetCompression = 0x10,
    /// Set (or drop) a stream's own write limits.
    SetLimits = 0x11,
    /// Set (or drop) a stream's own placement of its new segments' ledgers.
    SetPlacement = 0x12,
}

impl Opcode {
    /// Maps a request opcode byte (without [`RESPONSE_BIT`]).
    ///
    /// # Errors
    /// `UnknownOpcode`.
    pub fn from_u8(v: u8) -> Result<Self, WireError> {
        Ok(match v {
            0x01 => Self::Hello,
            0x02 => Self::CreateStream,
            0x03 => Self::ListStreams,
            0x04 => Self::Write,
            0x05 => Self::Read,
            0x06 => Self::DescribeStream,
            0x07 => Self::TruncateStream,
            0x08 => Self::DeleteStream,
            0x09 => Self::SetRetention,
            0x0A => Self::SealStream,
            0x0B => Self::OpenProducerSession,
            0x0C => Self::CommitSubscription,
            0x0D => Self::GetSubscription,
            0x0E => Self::ListSubscriptions,
            0x0F => Self::DeleteSubscription,
            0x10 => Self::SetCompression,
            0x11 => Self::SetLimits,
            0x12 => Self::SetPlacement,
            other => return Err(WireError::UnknownOpcode(other)),
        })
    }
}

/// Longest token a handshake may carry, in bytes.
pub const TOKEN_BYTES_MAX: usize = 1024;

/// A client's bearer token (checked by the proxy's authorizer, `quire_proxy::auth`); `Debug`
/// does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(pub Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token(<{} bytes>)", self.0.len())
    }
}

/// A request from a client to a proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Handshake. Body: magic u32, version_min u16, version_max u16, then, only when the
    /// client has one, its token (u32 length + bytes, at most
    /// [`TOKEN_BYTES_MAX`]).
    Hello {
        version_min: u16,
        version_max: u16,
        token: Option<Token>,
    },
    /// Body: stream name (u32 length + bytes).
    CreateStream { stream: String },
    /// Empty body.
    ListStreams,
    /// Flag [`FLAG_LIST_PAGED`]. Body: prefix (string), page token (string, at most
    /// [`crate::list_page::PAGE_TOKEN_BYTES_MAX`] bytes; empty: the first page), page size
    /// u32 (0: the proxy's maximum, [`crate::list_page::LIST_PAGE_SIZE_MAX`]).
    ListStreamsPage {
        prefix: String,
        page_token: String,
        page_size: u32,
    },
    /// Flags: [`FLAG_CREATE_IF_MISSING`]. Body: stream name, record_count u32, then per record
    /// txid u64, payload length u32, payload.
    Write {
        stream: String,
        create_if_missing: bool,
        /// [`FLAG_WRITE_COMPRESS`]: store the records LZ4-compressed.
        compress: bool,
        records: Vec<(u64, Vec<u8>)>,
    },
    /// A `Write` (same opcode) with [`FLAG_PRODUCER_SESSION`]: body stream name, session_id
    /// u64, first_seq u64, then as `Write`. The stream's owner drops records of the session it
    /// already applied and answers with their original DLSNs.
    ProducerWrite {
        stream: String,
        create_if_missing: bool,
        /// [`FLAG_WRITE_COMPRESS`], as in `Write`.
        compress: bool,
        producer: ProducerSeq,
        records: Vec<(u64, Vec<u8>)>,
    },
    /// Body: stream name. Needs the write right on the stream.
    OpenProducerSession { stream: String },
    /// Flags: [`FLAG_READ_WRITE_TIMES`] (`with_write_times`). Body: stream name, position
    /// (kind u8 + 20 bytes: a DLSN for kinds 0-1, a u64 then 12 zero bytes for kinds 2-5),
    /// max_records u32, max_bytes u32, wait_ms u32.
    Read {
        stream: String,
        from: ReadPosition,
        max_records: u32,
        max_bytes: u32,
        wait_ms: u32,
        /// Ask for each record's write time in the answer.
        with_write_times: bool,
    },
    /// Body: stream name. `home_region` (request flag [`FLAG_DESCRIBE_WANT_HOME_REGION`]):
    /// the answer may carry the stream's home region; a client that does not set it (one
    /// before issue 30) gets the answer it can decode. `placement` (request flag
    /// [`crate::placement::FLAG_DESCRIBE_WANT_PLACEMENT`]): likewise for the stream's own
    /// placement.
    DescribeStream {
        stream: String,
        home_region: bool,
        placement: bool,
    },
    /// Body: stream name, DLSN.
    TruncateStream { stream: String, before: Dlsn },
    /// Body: stream name.
    DeleteStream { stream: String },
    /// Body: stream name, then for time and for size: action u8 (0 keep, 1 set, 2 back to
    /// the cluster default) and value u64 (0 unless set).
    SetRetention {
        stream: String,
        time_secs: RetentionChange,
        size_bytes: RetentionChange,
        /// Flags [`FLAG_RETENTION_KEEP_FOR_SUBSCRIPTIONS`] (`Some(true)`) or
        /// [`FLAG_RETENTION_SUBSCRIPTIONS_OFF`] (`Some(false)`); `None`: unchanged.
        keep_for_subscriptions: Option<bool>,
    },
    /// Body: stream name.
    SealStream { stream: String },
    /// Body: stream name, subscription name (u32 length + bytes), DLSN.
    CommitSubscription {
        stream: String,
        name: String,
        position: Dlsn,
    },
    /// Body: stream name, subscription name.
    GetSubscription { stream: String, name: String },
    /// Body: stream name.
    ListSubscriptions { stream: String },
    /// Body: stream name, subscription name.
    DeleteSubscription { stream: String, name: String },
    /// Body: stream name, setting u8 (`compression::setting_byte`: 0 back to the proxy
    /// default, 1 none, 2 lz4).
    SetCompression {
        stream: String,
        compression: Option<Compression>,
    },
    /// Body: stream name, optional limits block (`crate::limits::put_opt`: absent = back to
    /// the owning proxy's `[limits] stream_*` defaults).
    SetLimits {
        stream: String,
        limits: Option<crate::limits::StreamLimits>,
    },
    /// Body: stream name, optional placement block (`crate::placement::put_opt`: absent =
    /// back to the owning proxy's `[ledger]` placement).
    SetPlacement {
        stream: String,
        placement: Option<crate::placement::StreamPlacement>,
    },
}

/// A response from a proxy.
// `DescribeStream`'s stream info is the largest variant (with the placement, issue 30, past
// clippy's 200-byte gap): a response is made once per request and moved a few times, and
// boxing it would change every caller that matches or builds a description.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// Body: magic u32, version u16, frame_size_bytes_max u32, record_size_bytes_max u32.
    Hello {
        version: u16,
        frame_size_bytes_max: u32,
        record_size_bytes_max: u32,
    },
    /// Empty body.
    CreateStream,
    /// Body: count u32, then each name (u32 length + bytes).
    ListStreams { streams: Vec<String> },
    /// Flag [`FLAG_LIST_PAGED`]. Body: count u32, each name, then the next page token
    /// (string; empty on the last page).
    ListStreamsPage {
        streams: Vec<String>,
        next_page_token: String,
    },
    /// Body: record count u32, first DLSN, last DLSN.
    Write {
        count: u32,
        first_dlsn: Dlsn,
        last_dlsn: Dlsn,
    },
    /// Flags: [`FLAG_READ_WRITE_TIMES`] when `write_times_ms` is present,
    /// [`FLAG_READ_END_OF_STREAM`] when `end_of_stream`. Body: next position, record count
    /// u32, then per record DLSN, txid u64, [write time u64 ms,] payload length u32, payload.
    Read {
        next: ReadPosition,
        records: Vec<(Dlsn, u64, Vec<u8>)>,
        /// Each record's write time (same order), when the request asked for them.
        write_times_ms: Option<Vec<u64>>,
        /// The read reached the end-of-stream marker: nothing follows these records.
        end_of_stream: bool,
    },
    /// Body: see `docs/proxy-protocol.md` (stream info).
    DescribeStream { info: StreamInfo },
    /// Body: truncation point in force (DLSN), segments deleted u32.
    TruncateStream { result: TruncateResult },
    /// Body: segments deleted u32.
    DeleteStream { segments_deleted: u32 },
    /// Body: the overrides in force, time and size (optional u64 each).
    SetRetention { retention: RetentionOverride },
    /// Body: the DLSN of the stream's last record (present u8 + DLSN; absent for a stream
    /// without records).
    SealStream { last_dlsn: Option<Dlsn> },
    /// Body: session_id u64 (never 0).
    OpenProducerSession { session_id: u64 },
    /// Answer to commit and get: the subscription info (`crate::subscription`).
    Subscription { info: SubscriptionInfo },
    /// Body: count u32, then each subscription info.
    ListSubscriptions {
        subscriptions: Vec<SubscriptionInfo>,
    },
    /// Body: existed u8 (1: deleted, 0: there was none).
    DeleteSubscription { existed: bool },
    /// Body: the setting in force, u8 as in the request.
    SetCompression { compression: Option<Compression> },
    /// Body: the limits in force in the stream record, an optional limits block as in the
    /// request.
    SetLimits {
        limits: Option<crate::limits::StreamLimits>,
    },
    /// Body: the placement in force in the stream record, an optional placement block as in
    /// the request.
    SetPlacement {
        placement: Option<crate::placement::StreamPlacement>,
    },
    /// Any failed request: `status` in the header is the code; body: message (u32 length +
    /// UTF-8 bytes).
    Error { code: ErrorCode, message: String },
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_len_prefixed(out, s.as_bytes());
}

/// A list of stream names: count u32, then each name.
fn put_names(out: &mut Vec<u8>, names: &[String]) {
    put_u32(
        out,
        u32::try_from(names.len()).expect("stream count above u32"),
    );
    for n in names {
        put_str(out, n);
    }
}

/// A list written by [`put_names`]; the count is checked against the body's size first.
fn get_names(r: &mut Reader<'_>, body_len: usize) -> Result<Vec<String>, WireError> {
    let count = r.u32()? as usize;
    if count > body_len / 4 {
        return Err(WireError::InvalidField {
            what: "stream count",
        });
    }
    let mut names = Vec::with_capacity(count);
    for _ in 0..count {
        names.push(get_str(r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?);
    }
    Ok(names)
}

fn get_str(r: &mut Reader<'_>, max: usize, what: &'static str) -> Result<String, WireError> {
    let b = r.len_prefixed(max)?;
    String::from_utf8(b.to_vec()).map_err(|_| WireError::InvalidField { what })
}

fn put_position(out: &mut Vec<u8>, p: &ReadPosition) {
    let value = |out: &mut Vec<u8>, kind: u8, v: u64| {
        out.push(kind);
        out.extend_from_slice(&v.to_le_bytes());
        out.extend_from_slice(&[0u8; 12]);
    };
    match p {
        ReadPosition::Head => {
            out.push(0);
            Dlsn::new(0, 0, 0).encode(out);
        }
        ReadPosition::Dlsn(d) => {
            out.push(1);
            d.encode(out);
        }
        ReadPosition::Tail => value(out, 2, 0),
        ReadPosition::TxId(t) => value(out, 3, *t),
        ReadPosition::WriteTime(t) => value(out, 4, *t),
        ReadPosition::LastN(n) => value(out, 5, *n),
    }
}

fn get_position(r: &mut Reader<'_>) -> Result<ReadPosition, WireError> {
    let kind = r.u8()?;
    let d = Dlsn::decode(r)?;
    // Kinds 2-5 carry a u64 in the first 8 bytes; the other 12 must be zero.
    let value = || {
        if d.entry_id == 0 && d.slot_index == 0 {
            Ok(d.segment_seq_no)
        } else {
            Err(WireError::InvalidField {
                what: "read position value",
            })
        }
    };
    match kind {
        0 => Ok(ReadPosition::Head),
        1 => Ok(ReadPosition::Dlsn(d)),
        2 if value()? == 0 => Ok(ReadPosition::Tail),
        3 => Ok(ReadPosition::TxId(value()?)),
        4 => Ok(ReadPosition::WriteTime(value()?)),
        5 => Ok(ReadPosition::LastN(value()?)),
        _ => Err(WireError::InvalidField {
            what: "read position kind",
        }),
    }
}

fn put_opt_dlsn(out: &mut Vec<u8>, d: Option<Dlsn>) {
    out.push(u8::from(d.is_some()));
    d.unwrap_or(Dlsn::new(0, 0, 0)).encode(out);
}

fn get_opt_dlsn(r: &mut Reader<'_>, what: &'static str) -> Result<Option<Dlsn>, WireError> {
    let present = r.u8()?;
    let d = Dlsn::decode(r)?;
    match present {
        0 if d == Dlsn::new(0, 0, 0) => Ok(None),
        1 => Ok(Some(d)),
        _ => Err(WireError::InvalidField { what }),
    }
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// An optional u64: present u8 (0 or 1), then the value (0 when absent); 9 bytes.
fn put_opt_u64(out: &mut Vec<u8>, v: Option<u64>) {
    out.push(u8::from(v.is_some()));
    put_u64(out, v.unwrap_or(0));
}

fn get_opt_u64(r: &mut Reader<'_>, what: &'static str) -> Result<Option<u64>, WireError> {
    let present = r.u8()?;
    let v = r.u64()?;
    match present {
        0 if v == 0 => Ok(None),
        1 => Ok(Some(v)),
        _ => Err(WireError::InvalidField { what }),
    }
}

fn put_change(out: &mut Vec<u8>, c: &RetentionChange) {
    let (action, v) = match c {
        RetentionChange::Keep => (0u8, 0u64),
        RetentionChange::Set(v) => (1, *v),
        RetentionChange::Default => (2, 0),
    };
    out.push(action);
    put_u64(out, v);
}

fn get_change(r: &mut Reader<'_>) -> Result<RetentionChange, WireError> {
    let action = r.u8()?;
    let v = r.u64()?;
    match (action, v) {
        (0, 0) => Ok(RetentionChange::Keep),
        (1, v) => Ok(RetentionChange::Set(v)),
        (2, 0) => Ok(RetentionChange::Default),
        _ => Err(WireError::InvalidField {
            what: "retention change",
        }),
    }
}

/// Bytes of one segment in a stream info body.
const SEGMENT_INFO_SIZE_BYTES: usize = 8 + 8 + 1 + 9 + 9 + 9 + 8 + 8 + 9;

fn put_stream_info(out: &mut Vec<u8>, info: &StreamInfo) {
    let m = &info.metadata;
    put_str(out, &m.name);
    put_u64(out, m.creation_time_ms);
    put_opt_u64(out, m.max_txid);
    match m.truncated_before {
        None => {
            out.push(0);
            Dlsn::new(0, 0, 0).encode(out);
        }
        Some(t) => {
            out.push(1);
            t.encode(out);
        }
    }
    put_opt_u64(out, m.retention.time_secs);
    put_opt_u64(out, m.retention.size_bytes);
    put_opt_u64(out, info.defaults.time_secs);
    put_opt_u64(out, info.defaults.size_bytes);
    match &info.owner {
        None => out.push(0),
        Some(o) => {
            out.push(1);
            put_str(out, o);
        }
    }
    put_u32(
        out,
        u32::try_from(m.segments.len()).expect("segment count above u32"),
    );
    for s in &m.segments {
        put_u64(out, s.seq_no);
        put_u64(out, s.ledger_id);
        out.push(match s.state {
            SegmentState::InProgress => 0,
            SegmentState::Completed => 1,
        });
        put_opt_u64(out, s.first_txid);
        put_opt_u64(out, s.last_txid);
        put_opt_u64(out, s.last_entry);
        put_u64(out, s.record_count);
        put_u64(out, s.length_bytes);
        put_opt_u64(out, s.completion_time_ms);
    }
    match &info.lookups {
        Some(l) => put_lookups(out, l),
        // A block of limits or a home region always follows lookups (see `get_appended`).
        None if m.limits.is_some() || m.home_region.is_some() || m.placement.is_some() => {
            put_lookups(out, &StreamLookups::default());
        }
        None => {}
    }
    // After the lookups, in this order; each announced by its answer flag
    // (`describe_answer_flags`).
    if let Some(l) = &m.limits {
        crate::limits::put_block(out, l);
    }
    if let Some(h) = &m.home_region {
        put_str(out, h);
    }
    if let Some(p) = &m.placement {
        crate::placement::put_block(out, p);
    }
}

/// Appended after the segments (pos, issue 26): first DLSN, last DLSN, record count, last
/// write time, sealed. Absent in answers of proxies before it.
fn put_lookups(out: &mut Vec<u8>, l: &StreamLookups) {
    put_opt_dlsn(out, l.first_dlsn);
    put_opt_dlsn(out, l.last_dlsn);
    put_u64(out, l.record_count);
    put_opt_u64(out, l.last_write_time_ms);
    out.push(u8::from(l.sealed));
}

fn get_lookups(r: &mut Reader<'_>) -> Result<StreamLookups, WireError> {
    Ok(StreamLookups {
        first_dlsn: get_opt_dlsn(r, "first DLSN")?,
        last_dlsn: get_opt_dlsn(r, "last DLSN")?,
        record_count: r.u64()?,
        last_write_time_ms: get_opt_u64(r, "last write time")?,
        sealed: match r.u8()? {
            0 => false,
            1 => true,
            _ => return Err(WireError::InvalidField { what: "sealed" }),
        },
    })
}

/// What [`get_appended`] reads after a stream info's segments.
struct Appended {
    lookups: Option<Box<StreamLookups>>,
    limits: Option<crate::limits::StreamLimits>,
    home_region: Option<String>,
    placement: Option<crate::placement::StreamPlacement>,
}

/// The fields appended to a stream info after its segments: the lookups, present only in
/// answers of proxies that know them, then with answer flag
/// [`crate::limits::FLAG_DESCRIBE_LIMITS`] the limits block, then with
/// [`FLAG_DESCRIBE_HOME_REGION`] the home region, then with
/// [`crate::placement::FLAG_DESCRIBE_PLACEMENT`] the placement block. A proxy that sends either knows the lookups
/// and always sends them first: all are read in order, so a body cut between them is
/// refused, not read as other fields.
fn get_appended(rest: &[u8], flags: u8) -> Result<Appended, WireError> {
    let has_limits = flags & crate::limits::FLAG_DESCRIBE_LIMITS != 0;
    let has_home = flags & FLAG_DESCRIBE_HOME_REGION != 0;
    let has_placement = flags & crate::placement::FLAG_DESCRIBE_PLACEMENT != 0;
    if rest.is_empty() && !has_limits && !has_home && !has_placement {
        return Ok(Appended {
            lookups: None,
            limits: None,
            home_region: None,
            placement: None,
        });
    }
    let mut more = Reader::new(rest, "stream info lookups, limits and home region");
    let lookups = get_lookups(&mut more)?;
    let limits = if has_limits {
        Some(crate::limits::get_block(&mut more)?)
    } else {
        None
    };
    let home_region = if has_home {
        Some(get_str(
            &mut more,
            REGION_FIELD_SIZE_BYTES_MAX,
            "home region",
        )?)
    } else {
        None
    };
    let placement = if has_placement {
        Some(crate::placement::get_block(&mut more)?)
    } else {
        None
    };
    more.finish()?;
    Ok(Appended {
        lookups: Some(Box::new(lookups)),
        limits,
        home_region,
        placement,
    })
}

/// A stream info; `flags` (the answer's): with [`crate::limits::FLAG_DESCRIBE_LIMITS`] or
/// [`FLAG_DESCRIBE_HOME_REGION`] the lookups are present and the limits block (40 bytes) and
/// the home region (string) follow them, in that order.
fn get_stream_info(
    r: &mut Reader<'_>,
    body_len: usize,
    flags: u8,
) -> Result<StreamInfo, WireError> {
    let name = get_str(r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?;
    let creation_time_ms = r.u64()?;
    let max_txid = get_opt_u64(r, "max txid")?;
    let has_point = r.u8()?;
    let d = Dlsn::decode(r)?;
    let truncated_before = match has_point {
        0 => None,
        1 => Some(d),
        _ => {
            return Err(WireError::InvalidField {
                what: "truncation point",
            })
        }
    };
    let retention = RetentionOverride {
        time_secs: get_opt_u64(r, "retention time")?,
        size_bytes: get_opt_u64(r, "retention size")?,
        // Carried as the answer's flag; set by the caller.
        keep_for_subscriptions: false,
    };
    let defaults = RetentionDefaults {
        time_secs: get_opt_u64(r, "default retention time")?,
        size_bytes: get_opt_u64(r, "default retention size")?,
    };
    let owner = match r.u8()? {
        0 => None,
        1 => Some(get_str(r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "owner")?),
        _ => return Err(WireError::InvalidField { what: "owner" }),
    };
    let count = r.u32()? as usize;
    if count > body_len / SEGMENT_INFO_SIZE_BYTES {
        return Err(WireError::InvalidField {
            what: "segment count",
        });
    }
    let mut segments = Vec::with_capacity(count);
    for _ in 0..count {
        let seq_no = r.u64()?;
        let ledger_id = r.u64()?;
        let state = match r.u8()? {
            0 => SegmentState::InProgress,
            1 => SegmentState::Completed,
            _ => {
                return Err(WireError::InvalidField {
                    what: "segment state",
                })
            }
        };
        segments.push(SegmentMetadata {
            seq_no,
            ledger_id,
            state,
            first_txid: get_opt_u64(r, "first txid")?,
            last_txid: get_opt_u64(r, "last txid")?,
            last_entry: get_opt_u64(r, "last entry")?,
            record_count: r.u64()?,
            length_bytes: r.u64()?,
            completion_time_ms: get_opt_u64(r, "completion time")?,
        });
    }
    let Appended {
        lookups,
        limits,
        home_region,
        placement,
    } = get_appended(r.rest(), flags)?;
    Ok(StreamInfo {
        metadata: StreamMetadata {
            name,
            segments,
            max_txid,
            creation_time_ms,
            truncated_before,
            retention,
            // Carried as the answer's flags; set by the caller.
            compression: None,
            limits,
            home_region,
            placement,
        },
        owner,
        defaults,
        lookups,
    })
}

/// A write's body (`Write`, or with a producer session `ProducerWrite`); returns its flags.
fn put_write(
    body: &mut Vec<u8>,
    stream: &str,
    (create_if_missing, compress): (bool, bool),
    producer: Option<&ProducerSeq>,
    records: &[(u64, Vec<u8>)],
) -> u8 {
    let mut flags = 0;
    if create_if_missing {
        flags |= FLAG_CREATE_IF_MISSING;
    }
    if compress {
        flags |= FLAG_WRITE_COMPRESS;
    }
    let payload: usize = records
        .iter()
        .map(|(_, p)| p.len() + WRITE_RECORD_OVERHEAD_BYTES)
        .sum();
    body.reserve(4 + stream.len() + 16 + 4 + payload);
    put_str(body, stream);
    if let Some(p) = producer {
        flags |= FLAG_PRODUCER_SESSION;
        put_u64(body, p.session_id);
        put_u64(body, p.first_seq);
    }
    put_u32(
        body,
        u32::try_from(records.len()).expect("record count above u32"),
    );
    for (txid, payload) in records {
        body.extend_from_slice(&txid.to_le_bytes());
        put_len_prefixed(body, payload);
    }
    flags
}

/// The body of a `Write` or `ProducerWrite` request; returns its flags.
fn put_write_request(body: &mut Vec<u8>, req: &Request) -> u8 {
    match req {
        Request::Write {
            stream,
            create_if_missing,
            compress,
            records,
        } => put_write(body, stream, (*create_if_missing, *compress), None, records),
        Request::ProducerWrite {
            stream,
            create_if_missing,
            compress,
            producer,
            records,
        } => put_write(
            body,
            stream,
            (*create_if_missing, *compress),
            Some(producer),
            records,
        ),
        _ => unreachable!("called for write requests only"),
    }
}

/// A `Write` request's body after its header: with flag [`FLAG_PRODUCER_SESSION`] a
/// `ProducerWrite`.
fn get_write(r: &mut Reader<'_>, frame: &Frame<'_>) -> Result<Request, WireError> {
    let stream = get_str(r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?;
    let producer = if frame.header.flags & FLAG_PRODUCER_SESSION != 0 {
        Some(get_producer(r)?)
    } else {
        None
    };
    let count = r.u32()? as usize;
    // Refuse counts the body cannot hold before allocating for them.
    if count > frame.body.len() / WRITE_RECORD_OVERHEAD_BYTES {
        return Err(WireError::InvalidField {
            what: "write record count",
        });
    }
    let mut records = Vec::with_capacity(count);
    for _ in 0..count {
        let txid = r.u64()?;
        // Records above the record limit still decode: the stream layer refuses them
        // with RECORD_TOO_LARGE, a clearer answer than a malformed frame.
        let payload = r.len_prefixed(frame.body.len())?;
        records.push((txid, payload.to_vec()));
    }
    let create_if_missing = frame.header.flags & FLAG_CREATE_IF_MISSING != 0;
    let compress = frame.header.flags & FLAG_WRITE_COMPRESS != 0;
    Ok(match producer {
        None => Request::Write {
            stream,
            create_if_missing,
            compress,
            records,
        },
        Some(producer) => {
            // The last record's sequence must exist.
            if producer
                .first_seq
                .checked_add((count as u64).saturating_sub(1))
                .is_none()
            {
                return Err(WireError::InvalidField {
                    what: "producer sequence",
                });
            }
            Request::ProducerWrite {
                stream,
                create_if_missing,
                compress,
                producer,
                records,
            }
        }
    })
}

/// A `SetRetention` request's body after the stream name's; returns no flags.
fn put_set_retention(
    body: &mut Vec<u8>,
    stream: &str,
    (time_secs, size_bytes): (&RetentionChange, &RetentionChange),
) -> u8 {
    put_str(body, stream);
    put_change(body, time_secs);
    put_change(body, size_bytes);
    0
}

/// The `SetRetention` request flags for a change of `keep_for_subscriptions`.
fn keep_flags(keep: Option<bool>) -> u8 {
    match keep {
        Some(true) => FLAG_RETENTION_KEEP_FOR_SUBSCRIPTIONS,
        Some(false) => FLAG_RETENTION_SUBSCRIPTIONS_OFF,
        None => 0,
    }
}

/// The answer flag of `SetRetention` and `DescribeStream` for `retention`.
fn keep_answer_flag(retention: &RetentionOverride) -> u8 {
    if retention.keep_for_subscriptions {
        FLAG_RETENTION_KEEP_FOR_SUBSCRIPTIONS
    } else {
        0
    }
}

/// A `SetRetention` answer's body; returns its flags.
fn put_retention(body: &mut Vec<u8>, retention: &RetentionOverride) -> u8 {
    put_opt_u64(body, retention.time_secs);
    put_opt_u64(body, retention.size_bytes);
    keep_answer_flag(retention)
}

/// `SetRetention` request flags as the change of `keep_for_subscriptions`.
fn get_keep_flags(flags: u8) -> Result<Option<bool>, WireError> {
    let on = flags & FLAG_RETENTION_KEEP_FOR_SUBSCRIPTIONS != 0;
    match (on, flags & FLAG_RETENTION_SUBSCRIPTIONS_OFF != 0) {
        (true, true) => Err(WireError::InvalidField {
            what: "retention flags",
        }),
        (false, false) => Ok(None),
        _ => Ok(Some(on)),
    }
}

/// A write's producer numbering; session id 0 is refused.
fn get_producer(r: &mut Reader<'_>) -> Result<ProducerSeq, WireError> {
    let session_id = r.u64()?;
    let first_seq = r.u64()?;
    if session_id == 0 {
        return Err(WireError::InvalidField {
            what: "producer session id",
        });
    }
    Ok(ProducerSeq {
        session_id,
        first_seq,
    })
}

/// Cuts `s` to at most `max` bytes at a character boundary.
pub fn truncate_message(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Request {
    /// The request's opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Hello { .. } => Opcode::Hello,
            Request::CreateStream { .. } => Opcode::CreateStream,
            Request::ListStreams | Request::ListStreamsPage { .. } => Opcode::ListStreams,
            Request::Write { .. } | Request::ProducerWrite { .. } => Opcode::Write,
            Request::OpenProducerSession { .. } => Opcode::OpenProducerSession,
            Request::Read { .. } => Opcode::Read,
            Request::DescribeStream { .. } => Opcode::DescribeStream,
            Request::TruncateStream { .. } => Opcode::TruncateStream,
            Request::DeleteStream { .. } => Opcode::DeleteStream,
            Request::SetRetention { .. } => Opcode::SetRetention,
            Request::SealStream { .. } => Opcode::SealStream,
            Request::CommitSubscription { .. } => Opcode::CommitSubscription,
            Request::GetSubscription { .. } => Opcode::GetSubscription,
            Request::ListSubscriptions { .. } => Opcode::ListSubscriptions,
            Request::DeleteSubscription { .. } => Opcode::DeleteSubscription,
            Request::SetCompression { .. } => Opcode::SetCompression,
            Request::SetLimits { .. } => Opcode::SetLimits,
            Request::SetPlacement { .. } => Opcode::SetPlacement,
        }
    }

    /// The stream a request is about, if any.
    pub fn stream(&self) -> Option<&str> {
        match self {
            Request::Hello { .. } | Request::ListStreams | Request::ListStreamsPage { .. } => None,
            Request::CreateStream { stream }
            | Request::Write { stream, .. }
            | Request::ProducerWrite { stream, .. }
            | Request::OpenProducerSession { stream }
            | Request::Read { stream, .. }
            | Request::DescribeStream { stream, .. }
            | Request::TruncateStream { stream, .. }
            | Request::DeleteStream { stream }
            | Request::SetRetention { stream, .. }
            | Request::SetCompression { stream, .. }
            | Request::SetLimits { stream, .. }
            | Request::SetPlacement { stream, .. }
            | Request::SealStream { stream }
            | Request::CommitSubscription { stream, .. }
            | Request::GetSubscription { stream, .. }
            | Request::ListSubscriptions { stream }
            | Request::DeleteSubscription { stream, .. } => Some(stream),
        }
    }

    /// Appends the whole frame of this request to `out`.
    pub fn encode(&self, request_id: u64, out: &mut Vec<u8>) {
        let mut body = Vec::new();
        let mut flags = 0u8;
        match self {
            Request::Hello {
                version_min,
                version_max,
                token,
            } => put_hello(&mut body, (*version_min, *version_max), token.as_ref()),
            Request::CreateStream { stream } => put_str(&mut body, stream),
            Request::ListStreams => {}
            Request::ListStreamsPage {
                prefix,
                page_token,
                page_size,
            } => {
                flags |= FLAG_LIST_PAGED;
                put_str(&mut body, prefix);
                put_str(&mut body, page_token);
                put_u32(&mut body, *page_size);
            }
            Request::Write { .. } | Request::ProducerWrite { .. } => {
                flags = put_write_request(&mut body, self)
            }
            Request::OpenProducerSession { stream } => put_str(&mut body, stream),
            Request::Read { .. } => flags = put_read_request(&mut body, self),
            Request::DescribeStream {
                stream,
                home_region,
                placement,
            } => {
                if *home_region {
                    flags |= FLAG_DESCRIBE_WANT_HOME_REGION;
                }
                if *placement {
                    flags |= crate::placement::FLAG_DESCRIBE_WANT_PLACEMENT;
                }
                put_str(&mut body, stream);
            }
            Request::DeleteStream { stream }
            | Request::SealStream { stream }
            | Request::ListSubscriptions { stream } => put_str(&mut body, stream),
            Request::CommitSubscription {
                stream,
                name,
                position,
            } => {
                put_str(&mut body, stream);
                put_str(&mut body, name);
                position.encode(&mut body);
            }
            Request::GetSubscription { stream, name }
            | Request::DeleteSubscription { stream, name } => {
                put_str(&mut body, stream);
                put_str(&mut body, name);
            }
            Request::TruncateStream { stream, before } => {
                put_str(&mut body, stream);
                before.encode(&mut body);
            }
            Request::SetRetention {
                stream,
                time_secs,
                size_bytes,
                keep_for_subscriptions,
            } => {
                flags = put_set_retention(&mut body, stream, (time_secs, size_bytes));
                flags |= keep_flags(*keep_for_subscriptions);
            }
            Request::SetCompression {
                stream,
                compression,
            } => {
                put_str(&mut body, stream);
                body.push(compression::setting_byte(*compression));
            }
            Request::SetLimits { stream, limits } => {
                put_str(&mut body, stream);
                crate::limits::put_opt(&mut body, limits);
            }
            Request::SetPlacement { stream, placement } => {
                put_str(&mut body, stream);
                crate::placement::put_opt(&mut body, placement);
            }
        }
        let header = FrameHeader {
            opcode: self.opcode() as u8,
            flags,
            status: 0,
            request_id,
        };
        encode_frame(out, header, &body);
    }

    /// Decodes a request frame.
    ///
    /// # Errors
    /// `UnknownOpcode`, `BadMagic`, `Truncated`, `TrailingBytes`, `InvalidField`.
    pub fn decode(frame: &Frame<'_>) -> Result<Self, WireError> {
        let op = Opcode::from_u8(frame.header.opcode)?;
        let mut r = Reader::new(frame.body, "proxy request");
        let req = match op {
            Opcode::Hello => get_hello(&mut r)?,
            Opcode::CreateStream => Request::CreateStream {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
            },
            Opcode::ListStreams if frame.header.flags & FLAG_LIST_PAGED != 0 => {
                Request::ListStreamsPage {
                    prefix: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "prefix")?,
                    page_token: get_str(
                        &mut r,
                        crate::list_page::PAGE_TOKEN_BYTES_MAX,
                        "page token",
                    )?,
                    page_size: r.u32()?,
                }
            }
            Opcode::ListStreams => Request::ListStreams,
            Opcode::Write => get_write(&mut r, frame)?,
            Opcode::OpenProducerSession => Request::OpenProducerSession {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
            },
            Opcode::Read => Request::Read {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
                from: get_position(&mut r)?,
                max_records: r.u32()?,
                max_bytes: r.u32()?,
                wait_ms: r.u32()?,
                with_write_times: frame.header.flags & FLAG_READ_WRITE_TIMES != 0,
            },
            Opcode::DescribeStream => Request::DescribeStream {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
                home_region: frame.header.flags & FLAG_DESCRIBE_WANT_HOME_REGION != 0,
                placement: frame.header.flags & crate::placement::FLAG_DESCRIBE_WANT_PLACEMENT != 0,
            },
            Opcode::TruncateStream => Request::TruncateStream {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
                before: Dlsn::decode(&mut r)?,
            },
            Opcode::DeleteStream => Request::DeleteStream {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
            },
            Opcode::SetRetention => Request::SetRetention {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
                time_secs: get_change(&mut r)?,
                size_bytes: get_change(&mut r)?,
                keep_for_subscriptions: get_keep_flags(frame.header.flags)?,
            },
            Opcode::SealStream => Request::SealStream {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
            },
            Opcode::CommitSubscription => Request::CommitSubscription {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
                name: subscription::get_name(&mut r)?,
                position: Dlsn::decode(&mut r)?,
            },
            Opcode::GetSubscription => Request::GetSubscription {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
                name: subscription::get_name(&mut r)?,
            },
            Opcode::ListSubscriptions => Request::ListSubscriptions {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
            },
            Opcode::DeleteSubscription => Request::DeleteSubscription {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
                name: subscription::get_name(&mut r)?,
            },
            Opcode::SetCompression => Request::SetCompression {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
                compression: compression::setting_from_byte(r.u8()?)?,
            },
            Opcode::SetLimits => Request::SetLimits {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
                limits: crate::limits::get_opt(&mut r)?,
            },
            Opcode::SetPlacement => Request::SetPlacement {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
                placement: crate::placement::get_opt(&mut r)?,
            },
        };
        r.finish()?;
        Ok(req)
    }
}

impl Response {
    /// Appends the whole frame of this response to `out`; `request_opcode` is the opcode byte of
    /// the request answered (any byte for errors to undecodable requests).
    pub fn encode(&self, request_opcode: u8, request_id: u64, out: &mut Vec<u8>) {
        let mut body = Vec::new();
        let mut status = 0u16;
        let mut flags = 0u8;
        match self {
            Response::Hello {
                version,
                frame_size_bytes_max,
                record_size_bytes_max,
            } => {
                put_u32(&mut body, PROXY_HELLO_MAGIC);
                body.extend_from_slice(&version.to_le_bytes());
                put_u32(&mut body, *frame_size_bytes_max);
                put_u32(&mut body, *record_size_bytes_max);
            }
            Response::CreateStream => {}
            Response::ListStreams { streams } => put_names(&mut body, streams),
            Response::ListStreamsPage {
                streams,
                next_page_token,
            } => {
                flags |= FLAG_LIST_PAGED;
                put_names(&mut body, streams);
                put_str(&mut body, next_page_token);
            }
            Response::Write {
                count,
                first_dlsn,
                last_dlsn,
            } => {
                put_u32(&mut body, *count);
                first_dlsn.encode(&mut body);
                last_dlsn.encode(&mut body);
            }
            Response::Read {
                next,
                records,
                write_times_ms,
                end_of_stream,
            } => {
                if let Some(times) = write_times_ms {
                    assert_eq!(times.len(), records.len(), "one write time per record");
                    flags |= FLAG_READ_WRITE_TIMES;
                }
                if *end_of_stream {
                    flags |= FLAG_READ_END_OF_STREAM;
                }
                put_position(&mut body, next);
                put_u32(
                    &mut body,
                    u32::try_from(records.len()).expect("record count above u32"),
                );
                for (i, (dlsn, txid, payload)) in records.iter().enumerate() {
                    dlsn.encode(&mut body);
                    body.extend_from_slice(&txid.to_le_bytes());
                    if let Some(times) = write_times_ms {
                        put_u64(&mut body, times[i]);
                    }
                    put_len_prefixed(&mut body, payload);
                }
            }
            Response::DescribeStream { info } => flags = put_described(&mut body, info),
            Response::TruncateStream { result } => {
                result.truncated_before.encode(&mut body);
                put_u32(&mut body, result.segments_deleted);
            }
            Response::DeleteStream { segments_deleted } => put_u32(&mut body, *segments_deleted),
            Response::SetRetention { retention } => flags = put_retention(&mut body, retention),
            Response::SealStream { last_dlsn } => put_opt_dlsn(&mut body, *last_dlsn),
            Response::OpenProducerSession { session_id } => put_u64(&mut body, *session_id),
            Response::Subscription { info } => subscription::put_info(&mut body, info),
            Response::ListSubscriptions { subscriptions } => {
                subscription::put_list(&mut body, subscriptions)
            }
            Response::DeleteSubscription { existed } => body.push(u8::from(*existed)),
            Response::SetCompression { compression: c } => body.push(compression::setting_byte(*c)),
            Response::SetLimits { limits } => crate::limits::put_opt(&mut body, limits),
            Response::SetPlacement { placement } => crate::placement::put_opt(&mut body, placement),
            Response::Error { code, message } => {
                assert!(
                    *code != ErrorCode::Ok,
                    "an error response needs a non-zero code"
                );
                status = *code as u16;
                put_str(
                    &mut body,
                    truncate_message(message, ERROR_MESSAGE_SIZE_BYTES_MAX),
                );
            }
        }
        let header = FrameHeader {
            opcode: request_opcode | RESPONSE_BIT,
            flags,
            status,
            request_id,
        };
        encode_frame(out, header, &body);
    }

    /// Decodes a response frame.
    ///
    /// # Errors
    /// `UnknownOpcode` (including a frame without [`RESPONSE_BIT`]), `UnknownStatus`, `BadMagic`,
    /// `Truncated`, `TrailingBytes`, `InvalidField`.
    pub fn decode(frame: &Frame<'_>) -> Result<Self, WireError> {
        if frame.header.opcode & RESPONSE_BIT == 0 {
            return Err(WireError::UnknownOpcode(frame.header.opcode));
        }
        let mut r = Reader::new(frame.body, "proxy response");
        if frame.header.status != 0 {
            let code = ErrorCode::from_u16(frame.header.status)
                .ok_or(WireError::UnknownStatus(frame.header.status))?;
            let message = String::from_utf8_lossy(r.len_prefixed(frame.body.len())?).into_owned();
            r.finish()?;
            return Ok(Response::Error { code, message });
        }
        let op = Opcode::from_u8(frame.header.opcode & !RESPONSE_BIT)?;
        let resp = match op {
            Opcode::Hello => {
                let magic = r.u32()?;
                if magic != PROXY_HELLO_MAGIC {
                    return Err(WireError::BadMagic { found: magic });
                }
                Response::Hello {
                    version: r.u16()?,
                    frame_size_bytes_max: r.u32()?,
                    record_size_bytes_max: r.u32()?,
                }
            }
            Opcode::CreateStream => Response::CreateStream,
            Opcode::ListStreams if frame.header.flags & FLAG_LIST_PAGED != 0 => {
                Response::ListStreamsPage {
                    streams: get_names(&mut r, frame.body.len())?,
                    next_page_token: get_str(
                        &mut r,
                        crate::list_page::PAGE_TOKEN_BYTES_MAX,
                        "page token",
                    )?,
                }
            }
            Opcode::ListStreams => Response::ListStreams {
                streams: get_names(&mut r, frame.body.len())?,
            },
            Opcode::Write => Response::Write {
                count: r.u32()?,
                first_dlsn: Dlsn::decode(&mut r)?,
                last_dlsn: Dlsn::decode(&mut r)?,
            },
            Opcode::Read => decode_read_answer(&mut r, frame)?,
            Opcode::DescribeStream => {
                let mut info = get_stream_info(&mut r, frame.body.len(), frame.header.flags)?;
                apply_describe_flags(&mut info, frame.header.flags)?;
                Response::DescribeStream { info }
            }
            Opcode::TruncateStream => Response::TruncateStream {
                result: TruncateResult {
                    truncated_before: Dlsn::decode(&mut r)?,
                    segments_deleted: r.u32()?,
                },
            },
            Opcode::DeleteStream => Response::DeleteStream {
                segments_deleted: r.u32()?,
            },
            Opcode::SetRetention => Response::SetRetention {
                retention: RetentionOverride {
                    time_secs: get_opt_u64(&mut r, "retention time")?,
                    size_bytes: get_opt_u64(&mut r, "retention size")?,
                    keep_for_subscriptions: frame.header.flags
                        & FLAG_RETENTION_KEEP_FOR_SUBSCRIPTIONS
                        != 0,
                },
            },
            Opcode::SealStream => Response::SealStream {
                last_dlsn: get_opt_dlsn(&mut r, "last DLSN")?,
            },
            Opcode::OpenProducerSession => Response::OpenProducerSession {
                session_id: match r.u64()? {
                    0 => {
                        return Err(WireError::InvalidField {
                            what: "producer session id",
                        })
                    }
                    id => id,
                },
            },
            Opcode::CommitSubscription | Opcode::GetSubscription => Response::Subscription {
                info: subscription::get_info(&mut r)?,
            },
            Opcode::ListSubscriptions => Response::ListSubscriptions {
                subscriptions: subscription::get_list(&mut r, frame.body.len())?,
            },
            Opcode::DeleteSubscription => Response::DeleteSubscription {
                existed: subscription::get_flag(&mut r, "subscription existed flag")?,
            },
            Opcode::SetCompression => set_compression_answer(&mut r)?,
            Opcode::SetLimits => Response::SetLimits {
                limits: crate::limits::get_opt(&mut r)?,
            },
            Opcode::SetPlacement => set_placement_answer(&mut r)?,
        };
        r.finish()?;
        Ok(resp)
    }
}

/// A `DESCRIBE_STREAM` answer's body; returns its flags ([`describe_answer_flags`]).
fn put_described(body: &mut Vec<u8>, info: &StreamInfo) -> u8 {
    put_stream_info(body, info);
    describe_answer_flags(info)
}

/// The `DESCRIBE_STREAM` answer flags: keep for subscriptions, the stream's compression, its
/// limits and its home region.
fn describe_answer_flags(info: &StreamInfo) -> u8 {
    let limits = if info.metadata.limits.is_some() {
        crate::limits::FLAG_DESCRIBE_LIMITS
    } else {
        0
    };
    let home = if info.metadata.home_region.is_some() {
        FLAG_DESCRIBE_HOME_REGION
    } else {
        0
    };
    let placement = if info.metadata.placement.is_some() {
        crate::placement::FLAG_DESCRIBE_PLACEMENT
    } else {
        0
    };
    keep_answer_flag(&info.metadata.retention)
        | compression::describe_flags(info.metadata.compression)
        | limits
        | home
        | placement
}

/// Sets what a `DESCRIBE_STREAM` answer carries in its flags (see [`describe_answer_flags`]).
fn apply_describe_flags(info: &mut StreamInfo, flags: u8) -> Result<(), WireError> {
    info.metadata.retention.keep_for_subscriptions =
        flags & FLAG_RETENTION_KEEP_FOR_SUBSCRIPTIONS != 0;
    info.metadata.compression = compression::setting_from_describe_flags(flags)?;
    Ok(())
}

/// A `SET_PLACEMENT` answer's body: the placement in force.
fn set_placement_answer(r: &mut Reader<'_>) -> Result<Response, WireError> {
    Ok(Response::SetPlacement {
        placement: crate::placement::get_opt(r)?,
    })
}

/// A `SET_COMPRESSION` answer's body: the setting in force.
fn set_compression_answer(r: &mut Reader<'_>) -> Result<Response, WireError> {
    Ok(Response::SetCompression {
        compression: compression::setting_from_byte(r.u8()?)?,
    })
}

/// A `READ` answer's body; the frame's flags say whether records carry write times.
/// The body of a HELLO request: magic, version range, and the token when there is one.
fn put_hello(body: &mut Vec<u8>, (version_min, version_max): (u16, u16), token: Option<&Token>) {
    put_u32(body, PROXY_HELLO_MAGIC);
    body.extend_from_slice(&version_min.to_le_bytes());
    body.extend_from_slice(&version_max.to_le_bytes());
    if let Some(t) = token {
        put_len_prefixed(body, &t.0);
    }
}

/// Decodes a HELLO request's body ([`put_hello`]).
///
/// # Errors
/// `BadMagic`, `Truncated`, `TrailingBytes`, `InvalidField` (a token over `TOKEN_BYTES_MAX`).
fn get_hello(r: &mut Reader<'_>) -> Result<Request, WireError> {
    let magic = r.u32()?;
    if magic != PROXY_HELLO_MAGIC {
        return Err(WireError::BadMagic { found: magic });
    }
    let version_min = r.u16()?;
    let version_max = r.u16()?;
    let rest = r.rest();
    let token = if rest.is_empty() {
        None
    } else {
        let mut t = Reader::new(rest, "proxy handshake token");
        let bytes = t.len_prefixed(TOKEN_BYTES_MAX)?.to_vec();
        t.finish()?;
        Some(Token(bytes))
    };
    Ok(Request::Hello {
        version_min,
        version_max,
        token,
    })
}

/// The body of a READ request; returns its frame flags.
fn put_read_request(body: &mut Vec<u8>, request: &Request) -> u8 {
    let Request::Read {
        stream,
        from,
        max_records,
        max_bytes,
        wait_ms,
        with_write_times,
    } = request
    else {
        return 0;
    };
    put_str(body, stream);
    put_position(body, from);
    put_u32(body, *max_records);
    put_u32(body, *max_bytes);
    put_u32(body, *wait_ms);
    if *with_write_times {
        FLAG_READ_WRITE_TIMES
    } else {
        0
    }
}

fn decode_read_answer(r: &mut Reader<'_>, frame: &Frame<'_>) -> Result<Response, WireError> {
    let flags = frame.header.flags;
    if flags & !(FLAG_READ_WRITE_TIMES | FLAG_READ_END_OF_STREAM) != 0 {
        return Err(WireError::InvalidField {
            what: "read answer flags",
        });
    }
    let with_times = flags & FLAG_READ_WRITE_TIMES != 0;
    let next = get_position(r)?;
    let count = r.u32()? as usize;
    if count > frame.body.len() / READ_RECORD_OVERHEAD_BYTES {
        return Err(WireError::InvalidField {
            what: "read record count",
        });
    }
    let mut records = Vec::with_capacity(count);
    let mut times = Vec::with_capacity(if with_times { count } else { 0 });
    for _ in 0..count {
        let dlsn = Dlsn::decode(r)?;
        let txid = r.u64()?;
        if with_times {
            times.push(r.u64()?);
        }
        let payload = r.len_prefixed(frame.body.len())?;
        records.push((dlsn, txid, payload.to_vec()));
    }
    Ok(Response::Read {
        next,
        records,
        write_times_ms: with_times.then_some(times),
        end_of_stream: flags & FLAG_READ_END_OF_STREAM != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_wire::frame::decode_frame;

    fn req_round_trip(req: Request) {
        let mut buf = Vec::new();
        req.encode(9, &mut buf);
        let (frame, used) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        assert_eq!(used, buf.len());
        assert_eq!(frame.header.request_id, 9);
        assert_eq!(Request::decode(&frame).unwrap(), req);
        // Every truncation of the body is refused.
        for cut in 0..frame.body.len() {
            let f = Frame {
                header: frame.header,
                body: &frame.body[..cut],
            };
            match (&req, Request::decode(&f)) {
                // The token is optional: a handshake cut right before it is one without it.
                (
                    Request::Hello {
                        version_min,
                        version_max,
                        token: Some(_),
                    },
                    Ok(cut_req),
                ) if cut == 8 => assert_eq!(
                    cut_req,
                    Request::Hello {
                        version_min: *version_min,
                        version_max: *version_max,
                        token: None,
                    }
                ),
                (_, r) => assert!(r.is_err(), "{req:?} cut {cut}"),
            }
        }
    }

    fn resp_round_trip(op: Opcode, resp: Response) {
        let mut buf = Vec::new();
        resp.encode(op as u8, 5, &mut buf);
        let (frame, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        assert_eq!(Response::decode(&frame).unwrap(), resp);
        for cut in 0..frame.body.len() {
            let f = Frame {
                header: frame.header,
                body: &frame.body[..cut],
            };
            assert!(Response::decode(&f).is_err(), "{resp:?} cut {cut}");
        }
    }

    #[test]
    fn requests_round_trip() {
        // Goal: every request survives encode/decode and every truncated body is refused.
        req_round_trip(Request::Hello {
            version_min: 1,
            version_max: 3,
            token: None,
        });
        req_round_trip(Request::Hello {
            version_min: 1,
            version_max: 1,
            token: Some(Token(b"t0ken".to_vec())),
        });
        req_round_trip(Request::CreateStream {
            stream: "a/b".into(),
        });
        req_round_trip(Request::Write {
            stream: "s".into(),
            create_if_missing: true,
            compress: false,
            records: vec![(1, b"x".to_vec()), (1, vec![]), (u64::MAX, vec![9; 300])],
        });
        req_round_trip(Request::Read {
            stream: "s".into(),
            from: ReadPosition::Head,
            max_records: 10,
            max_bytes: 100,
            wait_ms: 5,
            with_write_times: false,
        });
        req_round_trip(Request::Read {
            stream: "s".into(),
            from: ReadPosition::Dlsn(Dlsn::new(2, 3, 4)),
            max_records: 1,
            max_bytes: 2,
            wait_ms: 0,
            with_write_times: false,
        });
        for from in [
            ReadPosition::Tail,
            ReadPosition::TxId(u64::MAX),
            ReadPosition::WriteTime(1_700_000_000_000),
            ReadPosition::LastN(0),
        ] {
            req_round_trip(Request::Read {
                stream: "s".into(),
                from,
                max_records: 1,
                max_bytes: 2,
                wait_ms: 3,
                with_write_times: true,
            });
        }
        req_round_trip(Request::SealStream { stream: "s".into() });
        req_round_trip(Request::ProducerWrite {
            stream: "s".into(),
            create_if_missing: false,
            compress: true,
            producer: ProducerSeq {
                session_id: 0x1234_5678_9abc,
                first_seq: 77,
            },
            records: vec![(5, b"x".to_vec()), (6, vec![])],
        });
        req_round_trip(Request::OpenProducerSession { stream: "s".into() });
        for home_region in [false, true] {
            for placement in [false, true] {
                req_round_trip(Request::DescribeStream {
                    stream: "s".into(),
                    home_region,
                    placement,
                });
            }
        }
        req_round_trip(Request::DeleteStream {
            stream: "a/b".into(),
        });
        req_round_trip(Request::TruncateStream {
            stream: "s".into(),
            before: Dlsn::new(3, 4, 5),
        });
        req_round_trip(Request::SetRetention {
            stream: "s".into(),
            time_secs: RetentionChange::Set(3600),
            size_bytes: RetentionChange::Default,
            keep_for_subscriptions: Some(true),
        });
        req_round_trip(Request::SetRetention {
            stream: "s".into(),
            time_secs: RetentionChange::Keep,
            size_bytes: RetentionChange::Set(u64::MAX),
            keep_for_subscriptions: Some(false),
        });
        let mut buf = Vec::new();
        Request::ListStreams.encode(1, &mut buf);
        let (f, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        assert_eq!(Request::decode(&f).unwrap(), Request::ListStreams);
    }

    #[test]
    fn set_compression_round_trips() {
        // Goal: SET_COMPRESSION's three settings both ways; a byte past lz4 is refused.
        for compression in [None, Some(Compression::None), Some(Compression::Lz4)] {
            req_round_trip(Request::SetCompression {
                stream: "s".into(),
                compression,
            });
            resp_round_trip(
                Opcode::SetCompression,
                Response::SetCompression { compression },
            );
        }
        // A setting byte past lz4 is refused, never taken as a default.
        let mut buf = Vec::new();
        Response::SetCompression { compression: None }.encode(
            Opcode::SetCompression as u8,
            1,
            &mut buf,
        );
        *buf.last_mut().unwrap() = 3;
        let (frame, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        assert!(Response::decode(&frame).is_err());
    }

    #[test]
    fn set_limits_and_described_limits_round_trip() {
        // Goal: SET_LIMITS both ways (limits and back to the defaults); a described stream's
        // limits after its lookups (always present with them); a flagged answer too short is refused.
        let l = crate::limits::StreamLimits {
            records_per_sec: 100,
            bytes_per_sec: 1 << 20,
            soft_records_per_sec: 80,
            soft_bytes_per_sec: 0,
            outstanding_writes_max: 4,
        };
        for limits in [None, Some(l)] {
            req_round_trip(Request::SetLimits {
                stream: "s".into(),
                limits,
            });
            resp_round_trip(Opcode::SetLimits, Response::SetLimits { limits });
        }
        for lookups in [
            Some(Box::<StreamLookups>::default()),
            Some(Box::new(StreamLookups {
                record_count: 7,
                sealed: true,
                ..StreamLookups::default()
            })),
        ] {
            let info = StreamInfo {
                metadata: StreamMetadata {
                    name: "t/a".into(),
                    limits: Some(l),
                    ..StreamMetadata::default()
                },
                owner: None,
                defaults: RetentionDefaults::default(),
                lookups,
            };
            resp_round_trip(Opcode::DescribeStream, Response::DescribeStream { info });
        }
        let mut buf = Vec::new();
        let info = StreamInfo {
            metadata: StreamMetadata {
                name: "t/a".into(),
                limits: Some(l),
                ..StreamMetadata::default()
            },
            owner: None,
            defaults: RetentionDefaults::default(),
            lookups: Some(Box::default()),
        };
        Response::DescribeStream { info }.encode(Opcode::DescribeStream as u8, 5, &mut buf);
        let (frame, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        let f = Frame {
            header: frame.header,
            body: &frame.body[..frame.body.len() - 40],
        };
        assert!(Response::decode(&f).is_err());
    }

    #[test]
    fn described_home_region_round_trips_after_the_limits() {
        // Goal: a described stream's home region (answer flag 0x10) survives encode/decode
        // with and without limits before it, with lookups left out by the sender (they are
        // always sent with it); an answer cut inside the region name, or with the flag and no
        // region, is refused; an answer without the flag reads as no home.
        let l = crate::limits::StreamLimits {
            records_per_sec: 5,
            ..crate::limits::StreamLimits::default()
        };
        let info = |limits, home: Option<&str>| StreamInfo {
            metadata: StreamMetadata {
                name: "t/h".into(),
                limits,
                home_region: home.map(str::to_string),
                ..StreamMetadata::default()
            },
            owner: None,
            defaults: RetentionDefaults::default(),
            lookups: Some(Box::default()),
        };
        for limits in [None, Some(l)] {
            resp_round_trip(
                Opcode::DescribeStream,
                Response::DescribeStream {
                    info: info(limits, Some("eu-west")),
                },
            );
        }
        let mut without_lookups = info(None, Some("eu-west"));
        without_lookups.lookups = None;
        let mut buf = Vec::new();
        Response::DescribeStream {
            info: without_lookups,
        }
        .encode(Opcode::DescribeStream as u8, 5, &mut buf);
        let (frame, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        assert_eq!(
            frame.header.flags & FLAG_DESCRIBE_HOME_REGION,
            FLAG_DESCRIBE_HOME_REGION
        );
        let Response::DescribeStream { info: got } = Response::decode(&frame).unwrap() else {
            panic!("not a describe answer");
        };
        assert_eq!(got.metadata.home_region.as_deref(), Some("eu-west"));
        for cut in [1, 4 + "eu-west".len()] {
            let f = Frame {
                header: frame.header,
                body: &frame.body[..frame.body.len() - cut],
            };
            assert!(Response::decode(&f).is_err(), "cut {cut}");
        }
        let mut buf = Vec::new();
        Response::DescribeStream {
            info: info(None, None),
        }
        .encode(Opcode::DescribeStream as u8, 6, &mut buf);
        let (frame, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        assert_eq!(frame.header.flags & FLAG_DESCRIBE_HOME_REGION, 0);
        let Response::DescribeStream { info: got } = Response::decode(&frame).unwrap() else {
            panic!("not a describe answer");
        };
        assert_eq!(got.metadata.home_region, None);
    }

    #[test]
    fn set_placement_and_described_placement_round_trip() {
        // Goal (issue 30 item 2): SET_PLACEMENT both ways (a placement and back to the
        // proxy's); a described stream's placement (answer flag 0x20) survives with and
        // without a home region before it; an answer cut inside the block is refused.
        use crate::placement::{PlacementPolicy, StreamPlacement, FLAG_DESCRIBE_PLACEMENT};
        let p = StreamPlacement {
            placement: PlacementPolicy::RegionAware,
            regions: vec!["a".into(), "b".into()],
            quorum: Some((3, 3, 2)),
            ..StreamPlacement::default()
        };
        for placement in [None, Some(p.clone())] {
            req_round_trip(Request::SetPlacement {
                stream: "s".into(),
                placement: placement.clone(),
            });
            resp_round_trip(Opcode::SetPlacement, Response::SetPlacement { placement });
        }
        for home in [None, Some("eu-west")] {
            let info = StreamInfo {
                metadata: StreamMetadata {
                    name: "t/p".into(),
                    home_region: home.map(str::to_string),
                    placement: Some(p.clone()),
                    ..StreamMetadata::default()
                },
                owner: None,
                defaults: RetentionDefaults::default(),
                lookups: None,
            };
            let mut buf = Vec::new();
            Response::DescribeStream { info }.encode(Opcode::DescribeStream as u8, 5, &mut buf);
            let (frame, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
            assert_ne!(frame.header.flags & FLAG_DESCRIBE_PLACEMENT, 0);
            let Response::DescribeStream { info: got } = Response::decode(&frame).unwrap() else {
                panic!("not a describe answer");
            };
            assert_eq!(got.metadata.placement.as_ref(), Some(&p));
            assert_eq!(got.metadata.home_region.as_deref(), home);
            for cut in [1, 3] {
                let f = Frame {
                    header: frame.header,
                    body: &frame.body[..frame.body.len() - cut],
                };
                assert!(Response::decode(&f).is_err(), "cut {cut}");
            }
        }
    }

    #[test]
    fn subscription_frames_round_trip() {
        // Goal: opcodes 0x0C-0x0F survive encode/decode, every cut body is refused, and a
        // hostile list count or flag byte is refused before allocating.
        use crate::subscription::SubscriptionInfo;
        req_round_trip(Request::CommitSubscription {
            stream: "s".into(),
            name: "n".into(),
            position: Dlsn::new(1, 2, 3),
        });
        req_round_trip(Request::GetSubscription {
            stream: "s".into(),
            name: "n".into(),
        });
        req_round_trip(Request::ListSubscriptions { stream: "s".into() });
        req_round_trip(Request::DeleteSubscription {
            stream: "s".into(),
            name: "n".into(),
        });
        let info = |committed| SubscriptionInfo {
            name: "n".into(),
            committed,
            commit_time_ms: committed.map(|_| 7),
            lag_records: 3,
            lag_bytes: 9,
        };
        resp_round_trip(
            Opcode::CommitSubscription,
            Response::Subscription {
                info: info(Some(Dlsn::new(1, 0, 0))),
            },
        );
        resp_round_trip(
            Opcode::GetSubscription,
            Response::Subscription { info: info(None) },
        );
        resp_round_trip(
            Opcode::ListSubscriptions,
            Response::ListSubscriptions {
                subscriptions: vec![info(None), info(Some(Dlsn::INITIAL))],
            },
        );
        resp_round_trip(
            Opcode::ListSubscriptions,
            Response::ListSubscriptions {
                subscriptions: vec![],
            },
        );
        resp_round_trip(
            Opcode::DeleteSubscription,
            Response::DeleteSubscription { existed: false },
        );
        let frame = |op: Opcode, body: &[u8]| {
            let mut buf = Vec::new();
            let header = FrameHeader {
                opcode: op as u8 | RESPONSE_BIT,
                flags: 0,
                status: 0,
                request_id: 1,
            };
            encode_frame(&mut buf, header, body);
            buf
        };
        for (op, body) in [
            (Opcode::ListSubscriptions, u32::MAX.to_le_bytes().to_vec()),
            (Opcode::DeleteSubscription, vec![2]),
            (Opcode::GetSubscription, {
                let mut b = Vec::new();
                subscription::put_info(&mut b, &info(None));
                b[5] = 2;
                b
            }),
        ] {
            let buf = frame(op, &body);
            let (f, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
            assert!(Response::decode(&f).is_err(), "{op:?} {body:?}");
        }
    }

    #[test]
    fn responses_round_trip() {
        // Goal: every response survives encode/decode, errors keep code and message.
        resp_round_trip(
            Opcode::Hello,
            Response::Hello {
                version: 1,
                frame_size_bytes_max: 5 << 20,
                record_size_bytes_max: 7,
            },
        );
        resp_round_trip(
            Opcode::ListStreams,
            Response::ListStreams {
                streams: vec!["a".into(), "b/c".into()],
            },
        );
        resp_round_trip(
            Opcode::Write,
            Response::Write {
                count: 3,
                first_dlsn: Dlsn::new(1, 0, 0),
                last_dlsn: Dlsn::new(1, 0, 2),
            },
        );
        resp_round_trip(
            Opcode::Read,
            Response::Read {
                next: ReadPosition::Dlsn(Dlsn::new(1, 1, 0)),
                records: vec![
                    (Dlsn::new(1, 0, 0), 4, b"hi".to_vec()),
                    (Dlsn::new(1, 0, 1), 4, vec![]),
                ],
                write_times_ms: None,
                end_of_stream: false,
            },
        );
        resp_round_trip(
            Opcode::Read,
            Response::Read {
                next: ReadPosition::Dlsn(Dlsn::new(1, 1, 0)),
                records: vec![
                    (Dlsn::new(1, 0, 0), 4, b"hi".to_vec()),
                    (Dlsn::new(1, 0, 1), 4, vec![]),
                ],
                write_times_ms: Some(vec![1_700_000_000_000, 1_700_000_000_001]),
                end_of_stream: true,
            },
        );
        resp_round_trip(
            Opcode::Read,
            Response::Read {
                next: ReadPosition::Dlsn(Dlsn::new(1, 1, 0)),
                records: vec![],
                write_times_ms: Some(vec![]),
                end_of_stream: true,
            },
        );
        resp_round_trip(
            Opcode::Write,
            Response::Error {
                code: ErrorCode::RecordTooLarge,
                message: "too big".into(),
            },
        );
        resp_round_trip(
            Opcode::TruncateStream,
            Response::TruncateStream {
                result: TruncateResult {
                    truncated_before: Dlsn::new(4, 0, 0),
                    segments_deleted: 3,
                },
            },
        );
        resp_round_trip(
            Opcode::DeleteStream,
            Response::DeleteStream {
                segments_deleted: 2,
            },
        );
        resp_round_trip(
            Opcode::SetRetention,
            Response::SetRetention {
                retention: RetentionOverride {
                    time_secs: None,
                    size_bytes: Some(5),
                    keep_for_subscriptions: true,
                },
            },
        );
        let mut buf = Vec::new();
        Response::CreateStream.encode(Opcode::CreateStream as u8, 1, &mut buf);
        let (f, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        assert_eq!(Response::decode(&f).unwrap(), Response::CreateStream);
    }

    #[test]
    fn seal_and_producer_session_responses_round_trip() {
        resp_round_trip(
            Opcode::SealStream,
            Response::SealStream {
                last_dlsn: Some(Dlsn::new(4, 5, 6)),
            },
        );
        resp_round_trip(Opcode::SealStream, Response::SealStream { last_dlsn: None });
        resp_round_trip(
            Opcode::OpenProducerSession,
            Response::OpenProducerSession { session_id: 42 },
        );
    }

    #[test]
    fn describe_response_round_trips() {
        // Goal: a stream description survives encode/decode with every segment field.
        let seg = |seq_no, state, t: Option<u64>| SegmentMetadata {
            seq_no,
            ledger_id: seq_no + 100,
            state,
            first_txid: Some(1),
            last_txid: t,
            last_entry: t,
            record_count: 7,
            length_bytes: 70,
            completion_time_ms: t,
        };
        let info = |lookups| StreamInfo {
            metadata: StreamMetadata {
                name: "logs/a".into(),
                segments: vec![seg(2, SegmentState::Completed, Some(9))],
                ..StreamMetadata::default()
            },
            owner: None,
            defaults: RetentionDefaults::default(),
            lookups,
        };
        // The lookups are appended: an answer without them (an older proxy's) still decodes.
        let with = info(Some(Box::new(StreamLookups {
            first_dlsn: Some(Dlsn::new(2, 0, 0)),
            last_dlsn: Some(Dlsn::new(2, 9, 3)),
            record_count: 7,
            last_write_time_ms: Some(1_700_000_000_000),
            sealed: true,
        })));
        let mut buf = Vec::new();
        Response::DescribeStream { info: with.clone() }.encode(
            Opcode::DescribeStream as u8,
            5,
            &mut buf,
        );
        let (frame, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        assert_eq!(
            Response::decode(&frame).unwrap(),
            Response::DescribeStream { info: with }
        );
        let lookups_len = 21 + 21 + 8 + 9 + 1;
        for cut in frame.body.len() - lookups_len + 1..frame.body.len() {
            let f = Frame {
                header: frame.header,
                body: &frame.body[..cut],
            };
            assert!(Response::decode(&f).is_err(), "cut {cut}");
        }
        let f = Frame {
            header: frame.header,
            body: &frame.body[..frame.body.len() - lookups_len],
        };
        assert_eq!(
            Response::decode(&f).unwrap(),
            Response::DescribeStream { info: info(None) }
        );
        resp_round_trip(
            Opcode::DescribeStream,
            Response::DescribeStream {
                info: StreamInfo {
                    metadata: StreamMetadata {
                        name: "logs/a".into(),
                        segments: vec![
                            seg(2, SegmentState::Completed, Some(9)),
                            seg(3, SegmentState::InProgress, None),
                        ],
                        max_txid: Some(9),
                        creation_time_ms: 12,
                        truncated_before: Some(Dlsn::new(2, 1, 0)),
                        retention: RetentionOverride {
                            time_secs: Some(60),
                            size_bytes: None,
                            keep_for_subscriptions: true,
                        },
                        compression: Some(Compression::Lz4),
                        limits: None,
                        home_region: None,
                        placement: None,
                    },
                    owner: Some("127.0.0.1:4181".into()),
                    defaults: RetentionDefaults {
                        time_secs: None,
                        size_bytes: Some(1 << 30),
                    },
                    lookups: None,
                },
            },
        );
    }

    #[test]
    fn read_positions_are_checked() {
        // Goal: kinds 2-5 carry their value in the first 8 bytes and zeros after; a non-zero
        // rest, a tail with a value or an unknown kind is refused.
        let mut body = Vec::new();
        put_position(&mut body, &ReadPosition::TxId(0x0102));
        assert_eq!(body[0], 3);
        assert_eq!(&body[1..9], &0x0102u64.to_le_bytes());
        assert_eq!(&body[9..], &[0u8; 12]);
        for (kind, v, rest) in [(3u8, 1u64, 1u8), (2, 1, 0), (6, 0, 0), (2, 0, 9)] {
            let mut b = vec![kind];
            b.extend_from_slice(&v.to_le_bytes());
            b.extend_from_slice(&[rest; 12]);
            assert!(
                get_position(&mut Reader::new(&b, "t")).is_err(),
                "kind {kind} value {v} rest {rest}"
            );
        }
    }

    #[test]
    fn hostile_bodies_are_refused() {
        // Goal: bad magic, unknown opcode, absurd counts and bad UTF-8 give errors, not panics.
        let hdr = |opcode| FrameHeader {
            opcode,
            flags: 0,
            status: 0,
            request_id: 1,
        };
        let body = [0u8; 8];
        assert!(matches!(
            Request::decode(&Frame {
                header: hdr(1),
                body: &body
            }),
            Err(WireError::BadMagic { .. })
        ));
        assert!(matches!(
            Request::decode(&Frame {
                header: hdr(0x7f),
                body: &[]
            }),
            Err(WireError::UnknownOpcode(0x7f))
        ));
        let mut b = Vec::new();
        put_str(&mut b, "s");
        put_u32(&mut b, u32::MAX);
        assert!(Request::decode(&Frame {
            header: hdr(4),
            body: &b
        })
        .is_err());
        let mut b = Vec::new();
        put_len_prefixed(&mut b, &[0xff, 0xfe]);
        assert!(Request::decode(&Frame {
            header: hdr(2),
            body: &b
        })
        .is_err());
        let mut x: u32 = 7;
        for len in 0..300usize {
            let g: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                    (x >> 24) as u8
                })
                .collect();
            for op in 0..12u8 {
                let _ = Request::decode(&Frame {
                    header: hdr(op),
                    body: &g,
                });
                let _ = Response::decode(&Frame {
                    header: hdr(op | RESPONSE_BIT),
                    body: &g,
                });
            }
        }
    }

    #[test]
    fn write_compress_flag_round_trips() {
        // Goal: the write flag 0x04 (store LZ4-compressed) is set by `compress` alone and read
        // back; the body is the same as without it.
        let write = |compress| Request::Write {
            stream: "s".into(),
            create_if_missing: false,
            compress,
            records: vec![(1, b"x".to_vec())],
        };
        let (mut plain, mut packed) = (Vec::new(), Vec::new());
        write(false).encode(1, &mut plain);
        write(true).encode(1, &mut packed);
        let (p, _) = decode_frame(&plain, 1 << 20).unwrap().unwrap();
        let (c, _) = decode_frame(&packed, 1 << 20).unwrap().unwrap();
        assert_eq!((p.header.flags, c.header.flags), (0, FLAG_WRITE_COMPRESS));
        assert_eq!(p.body, c.body);
        assert_eq!(Request::decode(&c).unwrap(), write(true));
    }

    #[test]
    fn producer_write_layout_and_refusals() {
        // Goal: pin the producer write's documented layout (flag 0x02; session id and first
        // sequence after the stream name) and refuse session id 0 and a last sequence past
        // u64::MAX. Method: encode one, compare the body byte by byte, then patch it.
        let req = Request::ProducerWrite {
            stream: "s".into(),
            create_if_missing: true,
            compress: false,
            producer: ProducerSeq {
                session_id: 9,
                first_seq: 3,
            },
            records: vec![(7, b"ab".to_vec())],
        };
        let mut buf = Vec::new();
        req.encode(1, &mut buf);
        let (frame, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        assert_eq!(
            frame.header.flags,
            FLAG_CREATE_IF_MISSING | FLAG_PRODUCER_SESSION
        );
        let expect: Vec<u8> = [
            &1u32.to_le_bytes()[..],
            b"s",
            &9u64.to_le_bytes(),
            &3u64.to_le_bytes(),
            &1u32.to_le_bytes(),
            &7u64.to_le_bytes(),
            &2u32.to_le_bytes(),
            b"ab",
        ]
        .concat();
        assert_eq!(frame.body, &expect[..]);
        let mut zero = expect.clone();
        zero[5..13].copy_from_slice(&0u64.to_le_bytes());
        let f = Frame {
            header: frame.header,
            body: &zero,
        };
        assert!(Request::decode(&f).is_err(), "session id 0");
        // One record at sequence u64::MAX is the last one a session can write; two overflow.
        let mut last = expect.clone();
        last[13..21].copy_from_slice(&u64::MAX.to_le_bytes());
        let f = Frame {
            header: frame.header,
            body: &last,
        };
        assert!(Request::decode(&f).is_ok(), "last sequence u64::MAX");
        let past = Request::ProducerWrite {
            stream: "s".into(),
            create_if_missing: false,
            compress: false,
            producer: ProducerSeq {
                session_id: 9,
                first_seq: u64::MAX,
            },
            records: vec![(7, b"a".to_vec()), (7, b"b".to_vec())],
        };
        let mut buf = Vec::new();
        past.encode(2, &mut buf);
        let (f, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        assert!(Request::decode(&f).is_err(), "sequence overflow");
        // Without the flag the same body is a malformed plain write.
        let mut h = frame.header;
        h.flags = FLAG_CREATE_IF_MISSING;
        assert!(Request::decode(&Frame {
            header: h,
            body: &expect
        })
        .is_err());
    }

    #[test]
    fn long_error_messages_are_cut_on_a_char_boundary() {
        // Goal: an over-long multibyte message is cut below the limit without splitting a char.
        let s = "é".repeat(ERROR_MESSAGE_SIZE_BYTES_MAX);
        let t = truncate_message(&s, ERROR_MESSAGE_SIZE_BYTES_MAX);
        assert!(t.len() <= ERROR_MESSAGE_SIZE_BYTES_MAX);
        assert!(t.chars().all(|c| c == 'é'));
    }
}

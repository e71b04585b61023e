//! The proxy protocol's result types: what writes, reads, describes, truncations and retention
//! changes answer. The stream layer in quire-proxy returns the same types (its describe answer
//! is converted from the metadata store's records).

use serde::Serialize;

use crate::dlsn::{Dlsn, ReadPosition};

/// What an acknowledged write returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteResult {
    /// DLSN of the first record written.
    pub first_dlsn: Dlsn,
    /// DLSN of the last record written.
    pub last_dlsn: Dlsn,
    /// Records written.
    pub count: u64,
}

/// Where a read starts: the head, a DLSN, the tail, a txid, a write time or the last N
/// records (the proxy protocol's `READ` position kinds 0-5).
pub use crate::dlsn::ReadPosition as Position;

/// Records returned by one read, in log order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBatch {
    /// `(dlsn, txid, payload)` per record, DLSNs strictly increasing.
    pub records: Vec<(Dlsn, u64, Vec<u8>)>,
    /// Each record's write time in ms since the Unix epoch (the owning proxy's clock when it
    /// packed the record's entry; 0 for records written before write times existed), in the
    /// order of `records`. Empty when the proxy did not send them (an older proxy).
    pub write_times_ms: Vec<u64>,
    /// Where the next read continues: just after the last record returned; when nothing was
    /// returned, the position asked for (`Head`, a DLSN) or the DLSN a tail, txid, time or
    /// last-N position resolved to, so that a tail read resumed from it misses nothing.
    pub next: ReadPosition,
    /// The read reached the end-of-stream marker of a sealed stream: these records are the
    /// stream's last and no later read returns more (DistributedLog's
    /// `EndOfStreamException` to a reader, here a flag so the records come first).
    pub end_of_stream: bool,
}

/// What a stream looks like: its metadata record, its owner and the retention defaults of the
/// proxy that answered (`DESCRIBE_STREAM`, `quire stream show`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    /// The stream's record: segments (state, ledger, txids, last entry, record and byte
    /// counts, completion time), max txid, truncation point and retention overrides. When the
    /// answering proxy owns the stream, the segment being written shows its acknowledged
    /// entries, records and bytes so far (the stored record has them only once completed).
    pub metadata: StreamMetadata,
    /// The proxy that owns the stream now (`host:port`), if any.
    pub owner: Option<String>,
    /// The answering proxy's cluster-wide retention defaults (overridden per stream by
    /// `metadata.retention`).
    pub defaults: RetentionDefaults,
    /// Stream-level lookups (first/last DLSN, record count, last write time, sealed); `None`
    /// from proxies before they existed.
    pub lookups: Option<Box<StreamLookups>>,
}

/// A stream's lookups, as DistributedLog's `getFirstDLSN`, `getLastDLSN` and
/// `getLogRecordCount` (the last txid is `StreamMetadata::max_txid`). The owner answers them
/// for the segment it is writing from its acknowledged progress; another proxy knows only the
/// completed segments (`docs/proxy-protocol.md`, DESCRIBE_STREAM).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StreamLookups {
    /// DLSN of the first readable record (at or after the truncation point); `None` when no
    /// record is readable.
    pub first_dlsn: Option<Dlsn>,
    /// DLSN of the last record; `None` when the stream holds none (or, from a non-owner, when
    /// only the open segment holds records).
    pub last_dlsn: Option<Dlsn>,
    /// Records in the segments still listed (a segment deleted by truncation or retention no
    /// longer counts; records before the truncation point in a kept segment still do).
    pub record_count: u64,
    /// Write time of the last record (ms since the Unix epoch), when known.
    pub last_write_time_ms: Option<u64>,
    /// The stream was sealed (`SEAL_STREAM`).
    pub sealed: bool,
}

/// A stream's metadata record as the proxy protocol carries it (`DESCRIBE_STREAM`): the wire
/// view of the metadata store's stream record (DistributedLog's log metadata plus its segment
/// list), without what only the owning proxy uses (the stream's ledger secret is never sent).
/// Serializes with the record's field names (`quire stream show --json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StreamMetadata {
    /// The stream's name.
    pub name: String,
    /// Log segments, oldest first (seq nos increasing).
    pub segments: Vec<SegmentMetadata>,
    /// Highest txid written to the stream, if any.
    pub max_txid: Option<u64>,
    /// When the stream was created, ms since the Unix epoch.
    pub creation_time_ms: u64,
    /// Records before this position are truncated (DistributedLog's `minActiveDLSN`); `None`:
    /// never truncated.
    pub truncated_before: Option<Dlsn>,
    /// The stream's retention overrides (`None` fields: the cluster default applies).
    pub retention: RetentionOverride,
    /// The stream's own compression setting (`SET_COMPRESSION`); `None`: the owning proxy's
    /// `[streams] compression` default applies. Carried as `DESCRIBE_STREAM` answer flags
    /// ([`crate::compression::FLAG_DESCRIBE_COMPRESSION_LZ4`] and `_NONE`).
    pub compression: Option<crate::compression::Compression>,
    /// The stream's own write limits (`SET_LIMITS`); `None`: the owning proxy's
    /// `[limits] stream_*` defaults apply. Carried after the stream info when the
    /// `DESCRIBE_STREAM` answer has [`crate::limits::FLAG_DESCRIBE_LIMITS`].
    pub limits: Option<crate::limits::StreamLimits>,
    /// The stream's home region (issue 30 item 4: the region of the proxy that created it,
    /// whose proxies own it when one is up); `None`: no home (a stream created before regions,
    /// or a proxy before them answered). Carried at the end of the stream info when the
    /// `DESCRIBE_STREAM` answer has [`crate::protocol::FLAG_DESCRIBE_HOME_REGION`].
    pub home_region: Option<String>,
    /// The stream's own placement (`SET_PLACEMENT`, issue 30 item 2); `None`: the owning
    /// proxy's `[ledger]` placement applies (or the client did not ask, or a proxy before it
    /// answered). Carried at the end of the stream info when the `DESCRIBE_STREAM` answer has
    /// [`crate::placement::FLAG_DESCRIBE_PLACEMENT`].
    pub placement: Option<crate::placement::StreamPlacement>,
}

/// One log segment of a stream as the proxy protocol carries it (DistributedLog
/// `LogSegmentMetadata`): a ledger holding a contiguous range of the stream's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SegmentMetadata {
    /// Log segment sequence number, from 1 (the first field of the DLSNs in it).
    pub seq_no: u64,
    /// The ledger holding the segment's entries.
    pub ledger_id: u64,
    /// Being written, or completed (closed, immutable).
    pub state: SegmentState,
    /// Txid of the segment's first record, if any.
    pub first_txid: Option<u64>,
    /// Txid of the segment's last record, if known.
    pub last_txid: Option<u64>,
    /// Id of the segment's last entry (the ledger's last entry once closed), if known.
    pub last_entry: Option<u64>,
    /// Records in the segment.
    pub record_count: u64,
    /// Payload bytes of the segment's records.
    pub length_bytes: u64,
    /// When the segment was completed, ms since the Unix epoch.
    pub completion_time_ms: Option<u64>,
}

/// Whether a log segment is still being written (DistributedLog's in-progress and completed
/// segments).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum SegmentState {
    /// The owner is writing it; its ledger is open.
    InProgress,
    /// Closed: its ledger is closed and its last entry, txid and counts are final.
    Completed,
}

/// A stream's retention overrides (`SET_RETENTION`'s answer, `StreamMetadata::retention`);
/// `None`: the cluster default ([`RetentionDefaults`]) applies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RetentionOverride {
    /// Completed segments older than this many seconds are deleted.
    pub time_secs: Option<u64>,
    /// Oldest completed segments are deleted while the stream holds more payload bytes.
    pub size_bytes: Option<u64>,
    /// Retention keeps what the stream's subscriptions still need (never deletes a segment at
    /// or after their smallest committed position); off by default. Carried as answer flag
    /// [`crate::protocol::FLAG_RETENTION_KEEP_FOR_SUBSCRIPTIONS`] of `DESCRIBE_STREAM` and
    /// `SET_RETENTION`; `false` from a proxy before it.
    pub keep_for_subscriptions: bool,
}

/// Cluster-wide retention defaults of a proxy (`--retention-time-secs`,
/// `--retention-size-bytes`); `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionDefaults {
    /// Completed segments older than this many seconds are deleted.
    pub time_secs: Option<u64>,
    /// Oldest completed segments are deleted while the stream holds more payload bytes.
    pub size_bytes: Option<u64>,
}

/// What a truncation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TruncateResult {
    /// The truncation point in force afterwards: the one asked for, or the earlier-set later
    /// one (the point never moves backwards).
    pub truncated_before: Dlsn,
    /// Whole segments deleted (their records all lay before the point).
    pub segments_deleted: u32,
}

/// A change to one retention setting of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetentionChange {
    /// Leave it as it is.
    Keep,
    /// Override the cluster default with this value (seconds or bytes, at least 1).
    Set(u64),
    /// Drop the override: the cluster default applies again.
    Default,
}

/// Longest retention time accepted: 100 years of seconds. Longer values are refused as
/// mistakes (a unit confusion) rather than taken as "forever"; leaving retention unset keeps
/// segments forever.
pub const RETENTION_TIME_SECS_MAX: u64 = 100 * 365 * 24 * 3600;
/// Largest retention size accepted: 1 EiB (2^60 bytes), far above any cluster.
pub const RETENTION_SIZE_BYTES_MAX: u64 = 1 << 60;

/// Checks a retention time: 1 to [`RETENTION_TIME_SECS_MAX`] seconds.
///
/// # Errors
/// A one-line reason for 0 (which would delete every completed segment at once: truncate
/// instead) or a value above the maximum.
pub fn check_retention_time_secs(v: u64) -> std::result::Result<u64, String> {
    match v {
        0 => Err("retention time 0 would delete every completed segment at once; use a truncation for that, or at least 1 s".into()),
        v if v > RETENTION_TIME_SECS_MAX => Err(format!(
            "retention time {v} s is above the maximum of {RETENTION_TIME_SECS_MAX} s (100 years); leave it unset to keep segments forever"
        )),
        v => Ok(v),
    }
}

/// Checks a retention size: 1 to [`RETENTION_SIZE_BYTES_MAX`] bytes.
///
/// # Errors
/// A one-line reason for 0 or a value above the maximum.
pub fn check_retention_size_bytes(v: u64) -> std::result::Result<u64, String> {
    match v {
        0 => Err("retention size 0 would delete every completed segment at once; use a truncation for that, or at least 1 byte".into()),
        v if v > RETENTION_SIZE_BYTES_MAX => Err(format!(
            "retention size {v} bytes is above the maximum of {RETENTION_SIZE_BYTES_MAX} bytes (1 EiB); leave it unset for no size limit"
        )),
        v => Ok(v),
    }
}

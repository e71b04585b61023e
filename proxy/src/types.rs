//! Result types shared by the stream layer, the server and the client.

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

/// Records returned by one read, in log order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBatch {
    /// `(dlsn, txid, payload)` per record, DLSNs strictly increasing.
    pub records: Vec<(Dlsn, u64, Vec<u8>)>,
    /// Where the next read continues: just after the last record returned, or the position
    /// asked for when nothing was returned.
    pub next: ReadPosition,
}

/// What a stream looks like: its metadata record, its owner and the retention defaults of the
/// proxy that answered (`DESCRIBE_STREAM`, `quire stream show`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    /// The stream's record: segments (state, ledger, txids, last entry, record and byte
    /// counts, completion time), max txid, truncation point and retention overrides. When the
    /// answering proxy owns the stream, the segment being written shows its acknowledged
    /// entries, records and bytes so far (the stored record has them only once completed).
    pub metadata: quire_metadata::StreamMetadata,
    /// The proxy that owns the stream now (`host:port`), if any.
    pub owner: Option<String>,
    /// The answering proxy's cluster-wide retention defaults (overridden per stream by
    /// `metadata.retention`).
    pub defaults: RetentionDefaults,
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

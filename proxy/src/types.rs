//! The stream layer's result types: the proxy protocol's own (from quire-client, so that the
//! server sends what the stream layer returns without converting) and the stream layer's
//! describe answer, which holds the metadata store's record and is converted to the protocol's
//! [`quire_client::StreamInfo`] by the server.

pub use quire_client::types::{
    check_retention_size_bytes, check_retention_time_secs, ReadBatch, RetentionChange,
    RetentionDefaults, TruncateResult, WriteResult, RETENTION_SIZE_BYTES_MAX,
    RETENTION_TIME_SECS_MAX,
};

/// What a stream looks like: its metadata record, its owner and the retention defaults of the
/// proxy that answered (`StreamManager::describe`; the server sends it as `DESCRIBE_STREAM`'s
/// answer, converted with `From` into [`quire_client::StreamInfo`]).
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

/// The protocol's view of the metadata record: everything but the stream's ledger secret,
/// which only the owning proxy uses and which is never sent.
impl From<StreamInfo> for quire_client::StreamInfo {
    fn from(info: StreamInfo) -> Self {
        let m = info.metadata;
        quire_client::StreamInfo {
            metadata: quire_client::StreamMetadata {
                name: m.name,
                segments: m.segments.iter().map(wire_segment).collect(),
                max_txid: m.max_txid,
                creation_time_ms: m.creation_time_ms,
                truncated_before: m
                    .truncated_before
                    .map(|t| quire_client::Dlsn::new(t.segment_seq_no, t.entry_id, t.slot_index)),
                retention: wire_retention(m.retention),
            },
            owner: info.owner,
            defaults: info.defaults,
        }
    }
}

/// A segment's metadata record as the protocol carries it.
fn wire_segment(s: &quire_metadata::SegmentMetadata) -> quire_client::SegmentMetadata {
    quire_client::SegmentMetadata {
        seq_no: s.seq_no,
        ledger_id: s.ledger_id,
        state: match s.state {
            quire_metadata::SegmentState::InProgress => quire_client::SegmentState::InProgress,
            quire_metadata::SegmentState::Completed => quire_client::SegmentState::Completed,
        },
        first_txid: s.first_txid,
        last_txid: s.last_txid,
        last_entry: s.last_entry,
        record_count: s.record_count,
        length_bytes: s.length_bytes,
        completion_time_ms: s.completion_time_ms,
    }
}

/// A stream's retention overrides as the protocol carries them (`SET_RETENTION`'s answer). A
/// function, not `From`: both types belong to other crates.
pub fn wire_retention(o: quire_metadata::RetentionOverride) -> quire_client::RetentionOverride {
    quire_client::RetentionOverride {
        time_secs: o.time_secs,
        size_bytes: o.size_bytes,
    }
}

//! The commands a stream's task takes from its queue (one channel per stream, applied in
//! submission order) and their answers: a leaf of the stream layer's module graph.

use quire_metadata::RetentionOverride;
use tokio::sync::oneshot;

use crate::dlsn::Dlsn;
use crate::error::Result;
use crate::types::{RetentionChange, TruncateResult, WriteResult};

/// A request to a stream's task (`writer::Writer::run`).
pub(super) enum Command {
    Append {
        records: Vec<(u64, Vec<u8>)>,
        /// Set for a write in a producer session (`producer.rs`).
        producer: Option<crate::protocol::ProducerSeq>,
        reply: oneshot::Sender<Result<WriteResult>>,
        /// The write asked for LZ4 (write flag 0x04, `compress.rs`).
        compress: bool,
    },
    Close {
        reply: oneshot::Sender<Result<()>>,
    },
    /// The balancer's move (`placement.rs`): like `Close` (adds in flight awaited, the open
    /// segment completed, the lease given up), then the task ends and what is queued is
    /// redirected to `StreamShared::moved_to`.
    Release {
        reply: oneshot::Sender<Result<()>>,
    },
    /// See [`super::StreamManager::truncate`].
    Truncate {
        before: Dlsn,
        reply: oneshot::Sender<Result<TruncateResult>>,
    },
    /// See [`super::StreamManager::delete_stream`].
    Delete {
        reply: oneshot::Sender<Result<u32>>,
    },
    /// See [`super::StreamManager::sweep`]: the lifecycle tick, then the orphan ledgers among
    /// the candidates; with `release_unless_used`, the stream is given up afterwards unless
    /// requests beyond that count used it.
    Sweep {
        orphan_candidates: Vec<u64>,
        release_unless_used: Option<u64>,
        reply: oneshot::Sender<Result<StreamSweep>>,
    },
    /// See [`super::StreamManager::seal_stream`].
    Seal {
        reply: oneshot::Sender<Result<Option<Dlsn>>>,
    },
    /// See [`super::StreamManager::set_retention`].
    SetRetention {
        time_secs: RetentionChange,
        size_bytes: RetentionChange,
        keep_for_subscriptions: Option<bool>,
        reply: oneshot::Sender<Result<RetentionOverride>>,
    },
    /// See [`super::StreamManager::set_compression`].
    SetCompression {
        compression: Option<quire_metadata::StreamCompression>,
        reply: oneshot::Sender<Result<Option<quire_metadata::StreamCompression>>>,
    },
    /// See [`super::StreamManager::set_limits`].
    SetLimits {
        limits: Option<quire_metadata::RateLimits>,
        reply: oneshot::Sender<Result<Option<quire_metadata::RateLimits>>>,
    },
    /// See [`super::StreamManager::set_placement`].
    SetPlacement {
        placement: Option<quire_metadata::StreamPlacement>,
        reply: oneshot::Sender<Result<Option<quire_metadata::StreamPlacement>>>,
    },
}

/// What the stream task reports for its part of a sweep.
pub(super) struct StreamSweep {
    pub(super) orphans_deleted: Vec<u64>,
}

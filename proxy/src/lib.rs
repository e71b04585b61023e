//! Quire's stream layer (DistributedLog semantics on the ledger client) and its proxy server.
//! The proxy client, the protocol codec, DLSNs and record sets are in quire-client, which this
//! crate uses for the codec and whose error and result types the stream layer returns.
//!
//! # Public API
//!
//! Stream layer ([`stream`]), used in-process by the proxy server:
//! * `StreamManager::new(metadata: Arc<dyn MetadataStore>, bookkeeper: quire_ledger::BookKeeper,
//!   config: StreamConfig) -> Arc<StreamManager>`
//! * `create_stream(&self, name: &str) -> Result<()>`, `list_streams(&self) -> Result<Vec<String>>`
//! * `append(&self, name: &str, records: Vec<(u64, Vec<u8>)>, create_if_missing: bool)
//!   -> Result<WriteResult>`: records are `(txid, payload)`; resolves when all are durable.
//! * `read(&self, name: &str, from: ReadPosition, max_records: u32, max_bytes: u32,
//!   wait: Duration) -> Result<ReadBatch>`: tail reads wait up to `wait`.
//! * Data lifecycle (run by the stream's owner; see `docs/proxy-protocol.md`, "Stream
//!   lifecycle"): `describe(&str) -> Result<StreamInfo>`, `truncate(&str, Dlsn) ->
//!   Result<TruncateResult>`, `delete_stream(&str) -> Result<u32>`, `set_retention(&str,
//!   RetentionChange, RetentionChange) -> Result<RetentionOverride>`; time rolling and
//!   retention run by themselves (`StreamConfig::segment_roll_interval`, `retention_time`,
//!   `retention_size_bytes`). Reads before the truncation point fail with `Error::Truncated`.
//! * Txids only grow within a stream (`Error::TxidOutOfOrder`), and the txid guard refuses one
//!   more than `StreamConfig::txid_jump_max` (default 2^40) above the txid before it
//!   (`Error::TxidTooFarAhead`), so that one stray txid cannot make a stream unwritable.
//! * `recover_all(&self) -> Result<usize>`: recovers every stream now rather than at first use.
//! * `sweep(&self) -> Result<SweepReport>`: one lifecycle sweep over every stream (retention on
//!   streams nobody owns, orphan ledger metadata); also run every `lifecycle_sweep_interval`.
//! * `shutdown(&self) -> Result<()>`: completes open segments and releases stream leases.
//! * One writer per stream: a manager takes a stream's lease under its identity
//!   (`StreamConfig::owner_address`, its advertised `host:port`; `identity()`) before it
//!   recovers or writes the stream; `Error::OwnedElsewhere { owner }` (redirect) when another
//!   proxy holds it, `Error::OwnershipLost` once it lost it.
//!
//! Proxy server ([`server`]): `ProxyServer::start(listener: TcpListener, streams:
//! Arc<StreamManager>, config: ServerConfig) -> Result<ProxyServer>` (or `ProxyServer::bind(addr,
//! ..).await`, or `serve(listener, streams, config).await`); `local_addr()`, `shutdown()`.
//!
//! Every failure is an [`Error`] (quire-client's, the protocol's error type); [`Error::code`]
//! gives the stable [`ErrorCode`] the server answers with.
//!
//! Positions are `quire_client::Dlsn`s `(segment seq no, entry id, slot)`, ordered
//! lexicographically, text form `1:0:0`. Formats: `docs/proxy-protocol.md` (wire),
//! `docs/format/record-set.md` (entry payloads).

pub mod auth;
pub mod error;
mod limits;
mod metrics;
pub mod quota;
pub mod server;
mod settings;
pub mod stream;
mod stream_metrics;
pub mod types;

// The codec modules moved to quire-client; these crate-private names keep the stream layer's and
// the server's `crate::dlsn` / `crate::protocol` / `crate::record_set` paths as they were.
use quire_client::{dlsn, protocol, record_set};

pub use error::{Error, ErrorCode, Result};
pub use metrics::{ProxyMetrics, ZERO_ERROR_CODES};
/// Also quire-client's: the server's catch-up reads run on it.
pub use quire_client::{catch_up_read_runtime, CATCH_UP_READ_NICE};
pub use quota::{LimitConfig, RateLimits};
pub use server::{serve, ProxyServer, ServerConfig};
pub use settings::{LimitSettings, ServerSettings, StreamSettings};
pub use stream::{
    OwnedStreamSize, StreamConfig, StreamManager, SweepReport, BALANCE_MOVES_PER_SEC_DEFAULT,
    LEDGER_LABEL_SEGMENT, LEDGER_LABEL_STREAM, TXID_JUMP_MAX_DEFAULT,
};
pub use stream_metrics::{OTHER_STREAM, STREAM_SERIES_MAX};
pub use types::StreamInfo;

//! Quire's proxy client and the proxy protocol: everything an application needs to talk to
//! Quire's proxies, and nothing of the servers (no ledger client, no metadata store, no
//! ZooKeeper client). It holds what DistributedLog splits between its `distributedlog-protocol`
//! module (DLSN, record sets, status codes and exceptions) and its proxy client.
//!
//! # Public API
//!
//! Proxy client ([`ProxyClient`]): `ProxyClient::connect(addr).await -> Result<ProxyClient>`
//! (or `connect_with(addr, ClientConfig)`), then `create_stream(&str)`, `list_streams()`,
//! `write(&str, Vec<(u64, Vec<u8>)>, create_if_missing) -> Result<WriteResult>` (split into
//! several requests when over the frame limit), `read(&str, ReadPosition, max_records,
//! max_bytes, wait: Duration) -> Result<ReadBatch>`, `describe_stream(&str) ->
//! Result<StreamInfo>`, `truncate(&str, Dlsn) -> Result<TruncateResult>`,
//! `delete_stream(&str) -> Result<u32>`, `set_retention(&str, RetentionChange,
//! RetentionChange) -> Result<RetentionOverride>`. Writes and reads follow
//! `STREAM_OWNED_ELSEWHERE` redirects to the stream's owner (bounded by
//! `ClientConfig::redirects_max`) and cache it (`cached_owner(&str)`). Inside: `connection`
//! (one TCP/TLS connection to one proxy: handshake, framing, pipelined requests by request id)
//! and `routing` (which proxy to ask: home proxy, ownership cache, redirects).
//!
//! Failover and exactly-once ([`ClientConfig::proxies`], [`ProxyClient::connect_any`]): a
//! client may know several proxies; an unreachable home proxy or one answering
//! `SERVICE_UNAVAILABLE` is skipped for the next. Proxies per region
//! ([`ClientConfig::regions`], [`RegionProxies`], local region first; issue 30): the client
//! takes its home proxy from the first region that answers, and moves to the next region when
//! a region's proxies are unreachable or answer `REGION_UNAVAILABLE` (519: the region is
//! marked as taking no new streams). A write whose outcome is unknown (connection
//! lost after sending, `OWNERSHIP_LOST`, `STORAGE_ERROR`) fails with
//! [`Error::WriteOutcomeUnknown`] and is never resent by `write`; a [`Producer`] (producer
//! session: `open_producer_session`, `write_in_session`) resends it with the same sequence
//! numbers and the stream's owner drops what it already applied. A [`Reader`] tails a stream
//! and resumes at its next DLSN after a failure. [`blocking`] wraps them for programs
//! without tokio. Examples: `proxy/client/examples/`.
//!
//! Every failure is an [`Error`]; [`Error::code`] gives its stable [`ErrorCode`] (a proxy's
//! answer arrives as `Error::Remote { code, message }`), and `Display` is one line. The proxy
//! server (quire-proxy) fails with the same type and answers with its code.
//!
//! Codec ([`protocol`]): `Request` and `Response` with `encode` / `decode` over
//! `quire_wire::frame` frames, pure and without I/O; decoders refuse hostile input with a
//! `WireError`, never a panic. Its wire types ([`types`]) are this crate's own, not the
//! metadata store's: the server converts its records into them.
//!
//! Positions are [`Dlsn`]s `(segment seq no, entry id, slot)`, ordered lexicographically, text
//! form `1:0:0`. Entry payloads are [`record_set`]s. Formats: `docs/proxy-protocol.md` (wire),
//! `docs/format/record-set.md` (entry payloads).
//!
//! [`catch_up_read_runtime`]: a tokio runtime at a lower OS priority for a reader working
//! through a backlog (the proxy's catch-up reads, a scanning client).

pub mod blocking;
pub mod client;
pub mod compression;
pub mod config;
mod connection;
pub mod dlsn;
pub mod error;
pub mod limits;
pub mod list_page;
pub mod placement;
pub mod producer;
pub mod protocol;
pub mod record_set;
mod routing;
pub mod runtime;
pub mod subscription;
pub mod tail;
pub mod types;

pub use client::ProxyClient;
pub use config::{ClientConfig, RegionProxies};
pub use dlsn::{Dlsn, ParseDlsnError, ReadPosition};
pub use error::{Error, ErrorCode, Result};
pub use producer::{Producer, ProducerConfig};
pub use protocol::{ProducerSeq, Token};
/// The rustls client configuration [`ClientConfig::tls`] holds.
pub use quire_tls::rustls::ClientConfig as TlsClientConfig;
pub use record_set::{ENTRY_SIZE_BYTES_MAX, RECORD_SIZE_BYTES_MAX};
pub use runtime::{catch_up_read_runtime, CATCH_UP_READ_NICE};
pub use subscription::SubscriptionInfo;
pub use tail::Reader;
pub use types::{
    check_retention_size_bytes, check_retention_time_secs, Position, ReadBatch, RetentionChange,
    RetentionDefaults, RetentionOverride, SegmentMetadata, SegmentState, StreamInfo, StreamLookups,
    StreamMetadata, TruncateResult, WriteResult, RETENTION_SIZE_BYTES_MAX, RETENTION_TIME_SECS_MAX,
};

#[cfg(test)]
mod golden;

#[cfg(test)]
mod tests {
    #[test]
    fn depends_on_no_server_crate() {
        // Goal (issue 25, item 3): an application that talks to proxies builds no ledger
        // client, metadata store or ZooKeeper client. Method: read this crate's manifest and
        // check every workspace crate it names is quire-wire or quire-tls, and nothing names
        // zookeeper or metadata.
        let manifest = include_str!("../Cargo.toml");
        let deps: Vec<&str> = manifest
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with('#') && !l.starts_with('[') && l.contains('='))
            .filter_map(|l| l.split(['=', '.', ' ']).next())
            .collect();
        for dep in &deps {
            assert!(
                !dep.starts_with("quire-") || ["quire-wire", "quire-tls"].contains(dep),
                "quire-client depends on {dep}"
            );
            assert!(
                !dep.contains("zookeeper") && !dep.contains("metadata"),
                "quire-client depends on {dep}"
            );
        }
        assert!(deps.contains(&"quire-wire"), "{deps:?}");
    }
}

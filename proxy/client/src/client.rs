//! The proxy client: pipelined connections to proxies, usable from any tokio runtime.
//!
//! A [`ProxyClient`] holds a `Router` (which proxy to ask: the home proxy, a stream's cached
//! owner, redirects; `routing`) over `connection`s (one per proxy, pipelined
//! requests); this module turns each operation into its request and its answer into a result,
//! and splits writes to fit the proxy's frame limit.

use std::time::Duration;

use quire_wire::frame::FRAME_HEADER_SIZE_BYTES;
use tokio::net::ToSocketAddrs;

mod subscriptions;

use crate::config::ClientConfig;
use crate::dlsn::{Dlsn, ReadPosition};
use crate::error::{Error, Result};
use crate::protocol::{Request, Response, TXID_RESERVED, WRITE_RECORD_OVERHEAD_BYTES};
use crate::routing::Router;
use crate::types::{
    ReadBatch, RetentionChange, RetentionOverride, StreamInfo, TruncateResult, WriteResult,
};

/// A client of the proxy tier: a connection to its home proxy, plus connections to the owners
/// of streams it was redirected to. Requests are pipelined: any number of calls may be in
/// flight from a shared `&ProxyClient` at once.
///
/// # Threading
/// Shared (`Send + Sync`); call from any tokio task.
pub struct ProxyClient {
    router: Router,
}

impl std::fmt::Debug for ProxyClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyClient")
            .field("home", &self.router.home_addr)
            .field("frame_size_bytes_max", &self.frame_size_bytes_max())
            .finish()
    }
}

impl ProxyClient {
    /// Connects to a home proxy and performs the handshake, with default settings.
    ///
    /// # Errors
    /// `Io` if the address cannot be reached (or closes the connection without answering);
    /// `HandshakeTimeout` if it accepts the connection but does not answer the handshake within
    /// `ClientConfig::connect_timeout`; `NotAProxy` if it answers with something that is not a
    /// proxy's handshake answer (a bookie, an HTTP server); `Remote` if the proxy refuses the
    /// connection (`SERVICE_UNAVAILABLE` at its connection limit); `UnsupportedVersion`.
    pub async fn connect(addr: impl ToSocketAddrs) -> Result<Self> {
        Self::connect_with(addr, ClientConfig::default()).await
    }

    /// Connects with explicit settings.
    ///
    /// # Errors
    /// As [`ProxyClient::connect`].
    pub async fn connect_with(addr: impl ToSocketAddrs, config: ClientConfig) -> Result<Self> {
        Ok(Self {
            router: Router::connect(addr, config).await?,
        })
    }

    /// The frame limit the home proxy announced. Writes are split to fit it.
    pub fn frame_size_bytes_max(&self) -> u32 {
        self.router.home_limits().0
    }

    /// The record limit the home proxy announced.
    pub fn record_size_bytes_max(&self) -> u32 {
        self.router.home_limits().1
    }

    /// The owner this client last learned for `stream` from a redirect, if any.
    pub fn cached_owner(&self, stream: &str) -> Option<String> {
        self.router.cached_owner(stream)
    }

    /// Creates an empty stream.
    ///
    /// # Errors
    /// `Remote` with `StreamExists`, `InvalidStreamName` or `Metadata`; `Io` on connection loss.
    pub async fn create_stream(&self, stream: &str) -> Result<()> {
        match self
            .router
            .home()
            .await?
            .call(
                &Request::CreateStream {
                    stream: stream.to_string(),
                },
                Duration::ZERO,
            )
            .await?
        {
            Response::CreateStream => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Names of every stream, sorted.
    ///
    /// # Errors
    /// `Remote` with `Metadata`; `Io` on connection loss.
    pub async fn list_streams(&self) -> Result<Vec<String>> {
        match self
            .router
            .home()
            .await?
            .call(&Request::ListStreams, Duration::ZERO)
            .await?
        {
            Response::ListStreams { streams } => Ok(streams),
            other => Err(unexpected(&other)),
        }
    }

    /// Appends `records` (`(txid, payload)`, txids non-decreasing) to `stream` and returns once
    /// every record is durable on the bookies' ack quorum.
    ///
    /// A write whose request would exceed the proxy's frame limit is split into several
    /// requests sent one after another; they land in order. Record sizes and the txid order
    /// inside `records` are checked before anything is sent.
    ///
    /// # Errors
    /// `RecordTooLarge`, `ReservedTxid` (a txid is `u64::MAX`, reserved for end-of-stream as in
    /// DistributedLog) or `TxidOutOfOrder` (nothing sent); `Remote` with the proxy's code
    /// (`NoSuchStream`, `TxidOutOfOrder`, `Storage`, `OwnershipLost` (outcome unknown, not
    /// retried), ...); `RedirectFailed` when the stream's owner cannot be reached through
    /// redirects. If a later part of a split write fails, the earlier parts stay written; the
    /// error message says how many records were acknowledged.
    ///
    /// Each part goes to the stream's owner: the cached one, else the home proxy, following
    /// `STREAM_OWNED_ELSEWHERE` redirects.
    pub async fn write(
        &self,
        stream: &str,
        records: Vec<(u64, Vec<u8>)>,
        create_if_missing: bool,
    ) -> Result<WriteResult> {
        check_records(&records, self.record_size_bytes_max() as usize)?;
        // Room for the records in one frame: the limit minus the header, name and count, with
        // some slack.
        let budget =
            self.frame_size_bytes_max() as usize - FRAME_HEADER_SIZE_BYTES - stream.len() - 64;
        let mut result: Option<WriteResult> = None;
        let mut rest = records;
        while !rest.is_empty() {
            let mut used = 0usize;
            let mut n = 0usize;
            for (_, p) in &rest {
                let size = p.len() + WRITE_RECORD_OVERHEAD_BYTES;
                if n > 0 && used + size > budget {
                    break;
                }
                used += size;
                n += 1;
            }
            let tail = rest.split_off(n);
            let chunk = std::mem::replace(&mut rest, tail);
            let written = result.map_or(0, |r| r.count);
            let req = Request::Write {
                stream: stream.to_string(),
                create_if_missing,
                records: chunk,
            };
            let resp = self.router.call_stream(stream, &req, Duration::ZERO).await;
            let resp = match resp {
                Err(Error::Remote { code, message }) if written > 0 => {
                    return Err(Error::Remote {
                        code,
                        message: format!(
                            "{message} (after {written} records of this write were acknowledged)"
                        ),
                    })
                }
                other => other?,
            };
            match resp {
                Response::Write {
                    count,
                    first_dlsn,
                    last_dlsn,
                } => {
                    result = Some(match result {
                        None => WriteResult {
                            first_dlsn,
                            last_dlsn,
                            count: u64::from(count),
                        },
                        Some(r) => WriteResult {
                            first_dlsn: r.first_dlsn,
                            last_dlsn,
                            count: r.count + u64::from(count),
                        },
                    });
                }
                other => return Err(unexpected(&other)),
            }
        }
        Ok(result.expect("at least one chunk was written"))
    }

    /// Reads up to `max_records` records and about `max_bytes` payload bytes from `from`
    /// (at least one record when one is available). When nothing is available yet, waits up to
    /// `wait` for new records (tailing); an empty batch means none arrived in time.
    ///
    /// # Errors
    /// `Remote` with `NoSuchStream`, `BadRequest` or `Storage`; `RedirectFailed` when the
    /// stream's owner (who serves its reads) cannot be reached; `Io` on connection loss.
    pub async fn read(
        &self,
        stream: &str,
        from: ReadPosition,
        max_records: u32,
        max_bytes: u32,
        wait: Duration,
    ) -> Result<ReadBatch> {
        let wait_ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
        let req = Request::Read {
            stream: stream.to_string(),
            from,
            max_records,
            max_bytes,
            wait_ms,
        };
        match self.router.call_stream(stream, &req, wait).await? {
            Response::Read { next, records } => Ok(ReadBatch { records, next }),
            other => Err(unexpected(&other)),
        }
    }

    /// A stream's segments (state, ledger, DLSN range through the last entry, record and byte
    /// counts, completion times), truncation point, retention overrides and the proxy's
    /// defaults, and its owner. Answered by the home proxy from the metadata store (not
    /// redirected); the segment being written shows its progress only when the home proxy owns
    /// the stream.
    ///
    /// # Errors
    /// `Remote` with `NoSuchStream`, `InvalidStreamName` or `Metadata`; `Io`.
    pub async fn describe_stream(&self, stream: &str) -> Result<StreamInfo> {
        let req = Request::DescribeStream {
            stream: stream.to_string(),
        };
        match self.router.home().await?.call(&req, Duration::ZERO).await? {
            Response::DescribeStream { info } => Ok(info),
            other => Err(unexpected(&other)),
        }
    }

    /// Truncates `stream` before `before`: every record before it becomes unreadable at once
    /// and whole segments before it are deleted; the point never moves backwards (see
    /// `quire_proxy::StreamManager::truncate`). Sent to the stream's owner, following redirects.
    ///
    /// # Errors
    /// `Remote` with `BadRequest` (beyond the end, or no record), `NoSuchStream`,
    /// `OwnershipLost` (nothing changed; retry), `Metadata`; `RedirectFailed`; `Io`.
    pub async fn truncate(&self, stream: &str, before: Dlsn) -> Result<TruncateResult> {
        let req = Request::TruncateStream {
            stream: stream.to_string(),
            before,
        };
        match self
            .router
            .call_stream(stream, &req, Duration::ZERO)
            .await?
        {
            Response::TruncateStream { result } => Ok(result),
            other => Err(unexpected(&other)),
        }
    }

    /// Deletes `stream` and all its segments; returns how many segments went. The name can be
    /// used again at once. Sent to the stream's owner, following redirects.
    ///
    /// # Errors
    /// `Remote` with `NoSuchStream`, `OwnershipLost` (nothing deleted; retry), `Metadata`;
    /// `RedirectFailed`; `Io`.
    pub async fn delete_stream(&self, stream: &str) -> Result<u32> {
        let req = Request::DeleteStream {
            stream: stream.to_string(),
        };
        let r = self.router.call_stream(stream, &req, Duration::ZERO).await;
        self.router.forget_owner(stream);
        match r? {
            Response::DeleteStream { segments_deleted } => Ok(segments_deleted),
            other => Err(unexpected(&other)),
        }
    }

    /// Changes `stream`'s retention overrides and returns those in force. Sent to the stream's
    /// owner, following redirects.
    ///
    /// # Errors
    /// `Remote` with `BadRequest` (0 or above the maximum), `NoSuchStream`, `OwnershipLost`,
    /// `Metadata`; `RedirectFailed`; `Io`.
    pub async fn set_retention(
        &self,
        stream: &str,
        time_secs: RetentionChange,
        size_bytes: RetentionChange,
    ) -> Result<RetentionOverride> {
        let req = Request::SetRetention {
            stream: stream.to_string(),
            time_secs,
            size_bytes,
        };
        match self
            .router
            .call_stream(stream, &req, Duration::ZERO)
            .await?
        {
            Response::SetRetention { retention } => Ok(retention),
            other => Err(unexpected(&other)),
        }
    }
}

/// Checks a write before anything is sent: at least one record, none above `record_max`
/// bytes, no reserved txid, txids non-decreasing.
///
/// # Errors
/// `BadRequest`, `RecordTooLarge`, `ReservedTxid`, `TxidOutOfOrder`.
fn check_records(records: &[(u64, Vec<u8>)], record_max: usize) -> Result<()> {
    if records.is_empty() {
        return Err(Error::BadRequest {
            reason: "a write needs at least one record".into(),
        });
    }
    for (i, (txid, p)) in records.iter().enumerate() {
        if p.len() > record_max {
            return Err(Error::RecordTooLarge {
                record_index: i,
                size_bytes: p.len(),
                max_bytes: record_max,
            });
        }
        if *txid == TXID_RESERVED {
            return Err(Error::ReservedTxid {
                record_index: i,
                txid: *txid,
            });
        }
        if i > 0 && *txid < records[i - 1].0 {
            return Err(Error::TxidOutOfOrder {
                record_index: i,
                txid: *txid,
                last_txid: records[i - 1].0,
            });
        }
    }
    Ok(())
}

fn unexpected(r: &Response) -> Error {
    Error::Internal(format!("unexpected response {r:?}"))
}

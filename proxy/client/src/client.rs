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
use crate::error::{Error, ErrorCode, Result};
use crate::protocol::{ProducerSeq, Request, Response, TXID_RESERVED, WRITE_RECORD_OVERHEAD_BYTES};
use crate::routing::Router;
use crate::types::{
    Position, ReadBatch, RetentionChange, RetentionOverride, StreamInfo, TruncateResult,
    WriteResult,
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
            .field("home", &self.router.home_addr())
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

    /// Connects to the first proxy of `config.proxies` that answers; the others are where the
    /// client fails over to (`ClientConfig::proxies`).
    ///
    /// # Errors
    /// `BadRequest` for an empty list; else the last proxy's error, as
    /// [`ProxyClient::connect`].
    pub async fn connect_any(config: ClientConfig) -> Result<Self> {
        Ok(Self {
            router: Router::connect_list(config).await?,
        })
    }

    /// The address of the proxy this client sends its requests to first (its home proxy; it
    /// changes on failover).
    pub fn home_addr(&self) -> String {
        self.router.home_addr()
    }

    /// Opens a producer session on `stream` for exactly-once writes
    /// ([`ProxyClient::write_in_session`]; the high-level [`crate::Producer`] numbers and
    /// retries them). Answered by the home proxy (failing over to the next proxy when the
    /// connection is lost: opening is idempotent); the stream need not exist yet.
    ///
    /// # Errors
    /// `Remote` with `InvalidStreamName`, `RequestDenied` (no write right); `Io`.
    pub async fn open_producer_session(&self, stream: &str) -> Result<u64> {
        let req = Request::OpenProducerSession {
            stream: stream.to_string(),
        };
        let mut answer = self.router.home().await?.call(&req, Duration::ZERO).await;
        if matches!(answer, Err(Error::Io { .. })) {
            answer = self.router.home().await?.call(&req, Duration::ZERO).await;
        }
        match answer? {
            Response::OpenProducerSession { session_id } => Ok(session_id),
            other => Err(unexpected(&other)),
        }
    }

    /// Appends `records` as one write of a producer session: `producer.first_seq` is the
    /// sequence number of the first record, the others follow. The stream's owner does not
    /// write again what the session already applied: a retry of an applied write (same
    /// session and sequences) is answered with the original DLSNs (Kafka's idempotent
    /// producer). The write must fit one request (no split: a retry must be the same write);
    /// [`ProxyClient::session_write_bytes_max`] says how much fits.
    ///
    /// # Errors
    /// As [`ProxyClient::write`], plus `BadRequest` when it does not fit one request,
    /// `Remote` with `ProducerSequenceGap` or `ProducerSessionExpired` (nothing written), and
    /// `WriteOutcomeUnknown` (retry it unchanged: that is what sessions are for).
    pub async fn write_in_session(
        &self,
        stream: &str,
        producer: ProducerSeq,
        records: Vec<(u64, Vec<u8>)>,
        create_if_missing: bool,
    ) -> Result<WriteResult> {
        check_records(&records, self.record_size_bytes_max() as usize)?;
        let size: usize = records
            .iter()
            .map(|(_, p)| p.len() + WRITE_RECORD_OVERHEAD_BYTES)
            .sum();
        if size > self.session_write_bytes_max(stream) {
            return Err(Error::BadRequest {
                reason: format!(
                    "a producer session write of {size} bytes does not fit one request of the proxy's frame limit ({} bytes of records); write fewer records at once",
                    self.session_write_bytes_max(stream)
                ),
            });
        }
        let count = records.len();
        let req = Request::ProducerWrite {
            stream: stream.to_string(),
            create_if_missing,
            compress: self.router.compress_writes(),
            producer,
            records,
        };
        let resp = self.router.call_stream(stream, &req, Duration::ZERO).await;
        match resp.map_err(|e| outcome_unknown(stream, e))? {
            Response::Write {
                count: n,
                first_dlsn,
                last_dlsn,
            } if n as usize == count => Ok(WriteResult {
                first_dlsn,
                last_dlsn,
                count: u64::from(n),
            }),
            other => Err(unexpected(&other)),
        }
    }

    /// Record bytes (payloads plus 12 bytes a record) one producer session write to `stream`
    /// may carry: the home proxy's frame limit less the request's header.
    pub fn session_write_bytes_max(&self, stream: &str) -> usize {
        (self.frame_size_bytes_max() as usize)
            .saturating_sub(FRAME_HEADER_SIZE_BYTES + stream.len() + 64)
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

    /// Creates an empty stream through the home proxy (whose region becomes the stream's
    /// home), moving on to the next region's proxy when the home proxy's region is marked
    /// unavailable (`ClientConfig::regions`).
    ///
    /// # Errors
    /// `Remote` with `StreamExists`, `InvalidStreamName`, `Metadata` or `RegionUnavailable`
    /// (every region refused); `Io` on connection loss.
    pub async fn create_stream(&self, stream: &str) -> Result<()> {
        match self
            .router
            .call_home(
                stream,
                &Request::CreateStream {
                    stream: stream.to_string(),
                },
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

    /// One page of the stream names starting with `prefix` (empty: all), sorted, after
    /// `page_token` (empty: the first page), at most `page_size` names (0, or above 1,000:
    /// the proxy's maximum of 1,000, [`crate::list_page::LIST_PAGE_SIZE_MAX`]). Returns the
    /// names and the token of the next page, empty after the last one. A proxy that answers
    /// with fewer names than asked may still have more (a token's grant filters pages): only
    /// the empty token ends the listing.
    ///
    /// A proxy before paging refuses the paged request (`BAD_REQUEST`, trailing bytes); then
    /// this lists every name with the original request and picks the page from it locally.
    ///
    /// # Errors
    /// `Remote` with `BadRequest` (a token no proxy wrote, or one of another prefix) or
    /// `Metadata`; `Io` on connection loss.
    pub async fn list_streams_page(
        &self,
        prefix: &str,
        page_token: &str,
        page_size: u32,
    ) -> Result<(Vec<String>, String)> {
        let req = Request::ListStreamsPage {
            prefix: prefix.to_string(),
            page_token: page_token.to_string(),
            page_size,
        };
        let conn = self.router.home().await?;
        match conn.call(&req, Duration::ZERO).await {
            Ok(Response::ListStreamsPage {
                streams,
                next_page_token,
            }) => Ok((streams, next_page_token)),
            Ok(other) => Err(unexpected(&other)),
            Err(Error::Remote {
                code: ErrorCode::BadRequest,
                message,
            }) if message.contains("trailing") => {
                let all = self.list_streams().await?;
                crate::list_page::select(&all, prefix, page_token, page_size)
                    .map_err(|reason| Error::BadRequest { reason })
            }
            Err(e) => Err(e),
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
    /// (`NoSuchStream`, `TxidOutOfOrder`, ...); `WriteOutcomeUnknown` when the connection was
    /// lost after the request was sent or the owner answered `OWNERSHIP_LOST` or
    /// `STORAGE_ERROR` (the records may or may not be in the stream; never retried here: use
    /// a producer session, [`crate::Producer`], for writes that may be retried);
    /// `RedirectFailed` when the stream's owner cannot be reached through redirects (nothing
    /// was written). If a later part of a split write fails, the earlier parts stay written; the
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
                compress: self.router.compress_writes(),
                records: chunk,
            };
            let resp = self
                .router
                .call_stream(stream, &req, Duration::ZERO)
                .await
                .map_err(|e| outcome_unknown(stream, e));
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
    /// (at least one record when one is available), each with its DLSN, txid and write time.
    /// `from` is any [`ReadPosition`]: the head, a DLSN, the tail, the first txid ≥ T, the
    /// first write time ≥ T or the last N records. When nothing is available yet, waits up to
    /// `wait` for new records (tailing); an empty batch means none arrived in time (continue
    /// from its `next`). A batch with `end_of_stream` set is the sealed stream's last.
    ///
    /// # Errors
    /// `Remote` with `NoSuchStream`, `BadRequest`, `Truncated` (an explicit DLSN before the
    /// truncation point) or `Storage`; `RedirectFailed` when a proxy older than follower reads
    /// redirects the read to an owner that cannot be reached; `Io` on connection loss.
    /// The read goes to the home proxy, which serves it whoever owns the stream (from its
    /// follower of the stream, docs/proxy-protocol.md "Read"); the owner is not needed.
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
            with_write_times: true,
        };
        let mut answer = self.router.call_read(stream, &req, wait).await;
        if let Err(e) = &answer {
            // A read changes nothing: after a lost connection or an owner going away it is
            // sent once more, routed afresh (failing over to the next proxy).
            if retry_read(e) {
                tracing::debug!(stream, error = %e, "read failed; sending it again");
                answer = self.router.call_read(stream, &req, wait).await;
            }
        }
        match answer? {
            Response::Read {
                next,
                records,
                write_times_ms,
                end_of_stream,
            } => Ok(ReadBatch {
                records,
                write_times_ms: write_times_ms.unwrap_or_default(),
                next,
                end_of_stream,
            }),
            other => Err(unexpected(&other)),
        }
    }

    /// [`ProxyClient::read`] from a [`Position`] with the largest byte budget one answer can
    /// carry: up to `max_records` records from `from`, waiting up to `wait` when none is
    /// readable there yet (a `Tail` position, or a txid / time past the end, always waits).
    ///
    /// # Errors
    /// As [`ProxyClient::read`].
    pub async fn read_from(
        &self,
        stream: &str,
        from: Position,
        max_records: u32,
        wait: Duration,
    ) -> Result<ReadBatch> {
        let max_bytes = self.frame_size_bytes_max().saturating_sub(64 * 1024).max(1);
        self.read(stream, from, max_records, max_bytes, wait).await
    }

    /// Seals `stream` (DistributedLog `markEndOfStream`): the owner writes the end-of-stream
    /// marker after the last acknowledged record, completes the segment and marks the stream
    /// sealed; later writes fail with `END_OF_STREAM` and readers that reach the marker get
    /// `end_of_stream`. Returns the DLSN of the stream's last record (`None`: no record).
    /// Sealing a sealed stream changes nothing and answers the same. Sent to the owner,
    /// following redirects; needs the admin right.
    ///
    /// # Errors
    /// `Remote` with `NoSuchStream`, `OwnershipLost`, `Storage`, `Metadata`, `RequestDenied`;
    /// `RedirectFailed`; `Io`.
    pub async fn seal_stream(&self, stream: &str) -> Result<Option<Dlsn>> {
        let req = Request::SealStream {
            stream: stream.to_string(),
        };
        match self
            .router
            .call_stream(stream, &req, Duration::ZERO)
            .await?
        {
            Response::SealStream { last_dlsn } => Ok(last_dlsn),
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
            home_region: true,
            placement: true,
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
        self.set_retention_with(stream, time_secs, size_bytes, None)
            .await
    }

    /// [`ProxyClient::set_retention`], also turning the stream's `keep_for_subscriptions` on
    /// (`Some(true)`: retention never deletes a segment at or after the smallest committed
    /// position of its subscriptions) or off (`Some(false)`); `None` leaves it. A proxy before
    /// the setting ignores it (the answer then shows it off).
    ///
    /// # Errors
    /// As [`ProxyClient::set_retention`].
    pub async fn set_retention_with(
        &self,
        stream: &str,
        time_secs: RetentionChange,
        size_bytes: RetentionChange,
        keep_for_subscriptions: Option<bool>,
    ) -> Result<RetentionOverride> {
        let req = Request::SetRetention {
            stream: stream.to_string(),
            time_secs,
            size_bytes,
            keep_for_subscriptions,
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

    /// Sets a stream's own compression (`SET_COMPRESSION`, carried out by its owner):
    /// `Some(Lz4)` stores every entry the owner writes LZ4-compressed, `Some(None)` stores
    /// entries plain unless a write asks (`write_with`'s compress flag), `None` goes back to
    /// the owning proxy's `[streams] compression` default. Readers see the same records
    /// whatever the setting. Returns the setting in force.
    ///
    /// # Errors
    /// `NO_SUCH_STREAM`, `NOT_OWNER` after redirects, `BAD_REQUEST` (unknown opcode) from a
    /// proxy before per-stream compression, connection errors.
    pub async fn set_compression(
        &self,
        stream: &str,
        compression: Option<crate::compression::Compression>,
    ) -> Result<Option<crate::compression::Compression>> {
        let req = Request::SetCompression {
            stream: stream.to_string(),
            compression,
        };
        match self
            .router
            .call_stream(stream, &req, Duration::ZERO)
            .await?
        {
            Response::SetCompression { compression } => Ok(compression),
            other => Err(unexpected(&other)),
        }
    }

    /// Sets a stream's own write limits (`SET_LIMITS`, carried out and enforced by its
    /// owner): `Some(l)` replaces the owning proxy's `[limits] stream_*` defaults for this
    /// stream (limits all 0 count as `None`), `None` goes back to them. Returns the limits in
    /// force in the stream record.
    ///
    /// # Errors
    /// `NO_SUCH_STREAM`, `NOT_OWNER` after redirects, `REQUEST_DENIED` without the admin
    /// right, `BAD_REQUEST` (unknown opcode) from a proxy before per-stream limits,
    /// connection errors.
    pub async fn set_limits(
        &self,
        stream: &str,
        limits: Option<crate::limits::StreamLimits>,
    ) -> Result<Option<crate::limits::StreamLimits>> {
        let req = Request::SetLimits {
            stream: stream.to_string(),
            limits,
        };
        match self
            .router
            .call_stream(stream, &req, Duration::ZERO)
            .await?
        {
            Response::SetLimits { limits } => Ok(limits),
            other => Err(unexpected(&other)),
        }
    }

    /// Sets a stream's own placement (`SET_PLACEMENT`, carried out by its owner, issue 30
    /// item 2): `Some(p)` replaces the owning proxy's `[ledger]` placement keys (and, when
    /// `p.quorum` is set, its quorum) for the ledgers of the stream's segments from the next
    /// one on; each such ledger records it, and autorecovery and decommission replace its
    /// bookies by it. `None` goes back to the proxy's settings. Segments already written keep
    /// their placement. Returns the placement in force in the stream record.
    ///
    /// # Errors
    /// `NO_SUCH_STREAM`, `NOT_OWNER` after redirects, `REQUEST_DENIED` without the admin
    /// right, `BAD_REQUEST` for a placement that breaks its rules (a minimum of 0, a region
    /// named twice, E >= Qw >= Qa >= 1, an enforced region-aware Qa below its minimum) and
    /// (unknown opcode) from a proxy before per-stream placement, connection errors.
    pub async fn set_placement(
        &self,
        stream: &str,
        placement: Option<crate::placement::StreamPlacement>,
    ) -> Result<Option<crate::placement::StreamPlacement>> {
        let req = Request::SetPlacement {
            stream: stream.to_string(),
            placement,
        };
        match self
            .router
            .call_stream(stream, &req, Duration::ZERO)
            .await?
        {
            Response::SetPlacement { placement } => Ok(placement),
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

/// Whether a failed read is sent once more: the connection was lost, or the owner went away.
fn retry_read(e: &Error) -> bool {
    matches!(
        e,
        Error::Io { .. }
            | Error::RedirectFailed { .. }
            | Error::Remote {
                code: ErrorCode::OwnershipLost | ErrorCode::ServiceUnavailable,
                ..
            }
    )
}

/// A write's error as the client reports it: `WriteOutcomeUnknown` when the records may or
/// may not be in the stream (the connection was lost after the request was sent, or the owner
/// answered `OWNERSHIP_LOST` or `STORAGE_ERROR`: DistributedLog's "the write may or may not
/// have been stored"); any other error as it is (nothing was written).
pub(crate) fn outcome_unknown(stream: &str, e: Error) -> Error {
    let code = match &e {
        // Refused before anything went out: nothing was sent.
        Error::Io { op, source }
            if *op == "send request" && source.kind() == std::io::ErrorKind::NotConnected =>
        {
            return e
        }
        Error::Io { .. } => ErrorCode::Internal,
        Error::Remote {
            code: code @ (ErrorCode::OwnershipLost | ErrorCode::Storage),
            ..
        } => *code,
        _ => return e,
    };
    Error::WriteOutcomeUnknown {
        stream: stream.to_string(),
        code,
        reason: e.to_string(),
    }
}

fn unexpected(r: &Response) -> Error {
    Error::Internal(format!("unexpected response {r:?}"))
}

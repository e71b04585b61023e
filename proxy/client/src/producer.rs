//! The exactly-once producer: a producer session that numbers its writes and retries them
//! through failover (Kafka's idempotent producer over Quire's proxies).
//!
//! A [`Producer`] opens a session on its stream (`OPEN_PRODUCER_SESSION`), gives every record
//! the next sequence number of the session, and sends each write as a producer session write.
//! When a write's outcome is unknown (the connection was lost after sending, the owner lost
//! the stream or its bookies failed) or its owner cannot be reached (killed, shutting down),
//! the same write, with the same sequences, is sent again, through the next proxy if need
//! be, until it is answered or [`ProducerConfig::retry_for`] has passed: the stream's owner,
//! new or not, drops what the session already applied and answers with the original DLSNs,
//! so each record is in the stream once.
//!
//! When it gives up on a write whose outcome is unknown it fails with
//! [`Error::WriteOutcomeUnknown`] and never reuses that write's sequences: the next write
//! opens a new session. A write refused as `PRODUCER_SESSION_EXPIRED` that was never possibly
//! applied (the owner no longer knows the session, for example after more than the dedup
//! window of other writes) is sent again in a new session.

use std::sync::Arc;
use std::time::Duration;

use crate::client::ProxyClient;
use crate::error::{Error, ErrorCode, Result};
use crate::protocol::{ProducerSeq, WRITE_RECORD_OVERHEAD_BYTES};
use crate::types::WriteResult;

/// Pause before the first retry of a write; doubled per retry up to [`RETRY_BACKOFF_MAX`].
const RETRY_BACKOFF_START: Duration = Duration::from_millis(50);
/// Longest pause between retries.
const RETRY_BACKOFF_MAX: Duration = Duration::from_millis(500);

/// A producer's settings.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// How long one write is retried (through failover) before the producer gives up with
    /// the last error. Default 60 s: longer than a proxy's ZooKeeper session timeout, after
    /// which another proxy can take a killed owner's streams.
    pub retry_for: Duration,
    /// Create the stream with its first write if it does not exist.
    pub create_if_missing: bool,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            retry_for: Duration::from_secs(60),
            create_if_missing: true,
        }
    }
}

/// An exactly-once writer of one stream (see the module docs).
///
/// # Threading
/// One write at a time (`&mut self`); the [`ProxyClient`] under it may be shared.
pub struct Producer {
    client: Arc<ProxyClient>,
    stream: String,
    config: ProducerConfig,
    session_id: u64,
    next_seq: u64,
    /// Set when a write gave up with an unknown outcome: its sequences may be applied, so
    /// the next write starts a new session rather than reuse them.
    needs_new_session: bool,
    retries: u64,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("stream", &self.stream)
            .field("session_id", &format_args!("{:#x}", self.session_id))
            .field("next_seq", &self.next_seq)
            .finish()
    }
}

impl Producer {
    /// Opens a producer session on `stream`.
    ///
    /// # Errors
    /// As [`ProxyClient::open_producer_session`].
    pub async fn open(
        client: Arc<ProxyClient>,
        stream: &str,
        config: ProducerConfig,
    ) -> Result<Self> {
        let session_id = open_session(&client, stream, config.retry_for).await?;
        Ok(Self {
            client,
            stream: stream.to_string(),
            config,
            session_id,
            next_seq: 0,
            needs_new_session: false,
            retries: 0,
        })
    }

    /// The current session's id.
    pub fn session_id(&self) -> u64 {
        self.session_id
    }

    /// The sequence number the next record gets in the current session.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Writes sent again so far (after an unknown outcome or an unreachable owner).
    pub fn retries(&self) -> u64 {
        self.retries
    }

    /// The client under this producer.
    pub fn client(&self) -> &Arc<ProxyClient> {
        &self.client
    }

    /// Appends `records` (`(txid, payload)`, txids non-decreasing) exactly once, retrying
    /// through failover. Records that do not fit one request go as several writes of the
    /// session, in order; the result spans them all.
    ///
    /// # Errors
    /// What a write fails with that a retry cannot help (`TxidOutOfOrder`, `RecordTooLarge`,
    /// `NoSuchStream`, `RequestDenied`, ...; nothing of that write was written), or, once
    /// `retry_for` has passed, `WriteOutcomeUnknown` (after an unknown outcome) or the last
    /// error (nothing written). Earlier parts of a split write stay written.
    pub async fn write(&mut self, records: Vec<(u64, Vec<u8>)>) -> Result<WriteResult> {
        let budget = self.client.session_write_bytes_max(&self.stream);
        let mut total: Option<WriteResult> = None;
        let mut rest = records;
        while !rest.is_empty() {
            let mut used = 0;
            let n = rest
                .iter()
                .take_while(|(_, p)| {
                    used += p.len() + WRITE_RECORD_OVERHEAD_BYTES;
                    used <= budget
                })
                .count()
                .max(1);
            let tail = rest.split_off(n);
            let chunk = std::mem::replace(&mut rest, tail);
            let r = self.write_one(chunk).await?;
            total = Some(match total {
                None => r,
                Some(t) => WriteResult {
                    first_dlsn: t.first_dlsn,
                    last_dlsn: r.last_dlsn,
                    count: t.count + r.count,
                },
            });
        }
        total.ok_or_else(|| Error::BadRequest {
            reason: "a write needs at least one record".into(),
        })
    }

    /// One numbered write, retried as the module docs say.
    async fn write_one(&mut self, records: Vec<(u64, Vec<u8>)>) -> Result<WriteResult> {
        if self.needs_new_session {
            self.new_session().await?;
        }
        let deadline = tokio::time::Instant::now() + self.config.retry_for;
        let mut backoff = RETRY_BACKOFF_START;
        let mut maybe_applied = false;
        loop {
            let p = ProducerSeq {
                session_id: self.session_id,
                first_seq: self.next_seq,
            };
            let r = self
                .client
                .write_in_session(
                    &self.stream,
                    p,
                    records.clone(),
                    self.config.create_if_missing,
                )
                .await;
            let e = match r {
                Ok(w) => {
                    self.next_seq += records.len() as u64;
                    return Ok(w);
                }
                Err(e) => e,
            };
            maybe_applied |= matches!(e, Error::WriteOutcomeUnknown { .. });
            if e.code() == ErrorCode::ProducerSessionExpired && !maybe_applied {
                // Never applied, and the owner has forgotten the session: a new one.
                tracing::debug!(stream = %self.stream, error = %e, "producer session expired; opening a new one");
                self.new_session().await?;
                continue;
            }
            if !retriable(&e) || tokio::time::Instant::now() >= deadline {
                return Err(self.give_up(e, maybe_applied));
            }
            tracing::debug!(stream = %self.stream, error = %e, seq = p.first_seq, "producer write failed; sending it again");
            self.retries += 1;
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
        }
    }

    /// The error a write ends with; after a possibly applied attempt, an unknown outcome,
    /// and the session is not used again.
    fn give_up(&mut self, e: Error, maybe_applied: bool) -> Error {
        if !maybe_applied {
            return e;
        }
        self.needs_new_session = true;
        match e {
            e @ Error::WriteOutcomeUnknown { .. } => e,
            other => Error::WriteOutcomeUnknown {
                stream: self.stream.clone(),
                code: other.code(),
                reason: format!("an earlier attempt's outcome is unknown, then: {other}"),
            },
        }
    }

    async fn new_session(&mut self) -> Result<()> {
        self.session_id = open_session(&self.client, &self.stream, self.config.retry_for).await?;
        self.next_seq = 0;
        self.needs_new_session = false;
        Ok(())
    }
}

/// Opens a session, retrying while no proxy answers, up to `retry_for`.
async fn open_session(client: &ProxyClient, stream: &str, retry_for: Duration) -> Result<u64> {
    let deadline = tokio::time::Instant::now() + retry_for;
    let mut backoff = RETRY_BACKOFF_START;
    loop {
        match client.open_producer_session(stream).await {
            Ok(id) => return Ok(id),
            Err(e) if retriable(&e) && tokio::time::Instant::now() < deadline => {
                tracing::debug!(stream, error = %e, "cannot open a producer session yet");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Errors after which the same producer write may be sent again: an unknown outcome, the
/// owner (or any proxy) could not be reached or was going away, or a hard rate limit refused
/// the write (`OVER_CAPACITY`: nothing was written, so backing off and sending it again is
/// safe, as DistributedLog's client backs off from `OverCapacityException`); nothing else is
/// retried.
pub(crate) fn retriable(e: &Error) -> bool {
    match e {
        Error::WriteOutcomeUnknown { .. }
        | Error::RedirectFailed { .. }
        | Error::Io { .. }
        | Error::HandshakeTimeout { .. } => true,
        Error::Remote { code, .. } => matches!(
            code,
            ErrorCode::ServiceUnavailable
                | ErrorCode::OwnershipLost
                | ErrorCode::Storage
                | ErrorCode::StreamOwnedElsewhere
                | ErrorCode::Metadata
                | ErrorCode::OverCapacity
        ),
        _ => false,
    }
}

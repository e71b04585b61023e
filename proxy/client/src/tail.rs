//! A tailing reader that survives the death of its proxy: it reads a stream from a position
//! and keeps its next position (a DLSN), so that after a failure it asks again from there,
//! through the next proxy (`ClientConfig::proxies`) or the stream's new owner.

use std::sync::Arc;
use std::time::Duration;

use crate::client::ProxyClient;
use crate::dlsn::{Dlsn, ReadPosition};
use crate::error::Result;
use crate::producer::retriable;

/// Pause before reading again after a failure; doubled per failure up to 500 ms.
const RETRY_BACKOFF_START: Duration = Duration::from_millis(50);

/// A tailing reader of one stream (DistributedLog's `AsyncLogReader` over the proxy client).
///
/// Its position is the DLSN of the next record to read: the checkpoint an application
/// stores (or commits to a subscription) to resume with [`Reader::new`] from
/// `ReadPosition::Dlsn(position)`.
pub struct Reader {
    client: Arc<ProxyClient>,
    stream: String,
    from: ReadPosition,
    /// Records per read (at most).
    pub max_records: u32,
    /// Payload bytes per read (about).
    pub max_bytes: u32,
    /// How long a read waits at the tail for new records.
    pub wait: Duration,
    /// How long failing reads are retried before [`Reader::next_batch`] gives up.
    pub retry_for: Duration,
    failures: u64,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("stream", &self.stream)
            .field("from", &self.from)
            .finish()
    }
}

impl Reader {
    /// A reader of `stream` from `from` (defaults: 1,000 records or 1 MiB per read, waits 1 s
    /// at the tail, retries failures for 60 s).
    pub fn new(client: Arc<ProxyClient>, stream: &str, from: ReadPosition) -> Self {
        Self {
            client,
            stream: stream.to_string(),
            from,
            max_records: 1000,
            max_bytes: 1 << 20,
            wait: Duration::from_secs(1),
            retry_for: Duration::from_secs(60),
            failures: 0,
        }
    }

    /// Where the next read starts: the head until the first record was read, then the DLSN
    /// after the last record returned.
    pub fn position(&self) -> ReadPosition {
        self.from
    }

    /// The DLSN of the next record to read, once one was read (the checkpoint).
    pub fn next_dlsn(&self) -> Option<Dlsn> {
        match self.from {
            ReadPosition::Dlsn(d) => Some(d),
            _ => None,
        }
    }

    /// Failed reads retried so far (failovers).
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// The next records `(DLSN, txid, payload)` in order, waiting up to `wait` at the tail;
    /// empty when none arrived in time. A read that fails because its proxy died or the owner
    /// moved is sent again from the same position (through the next proxy) until `retry_for`
    /// has passed, so no record is skipped or returned twice.
    ///
    /// # Errors
    /// What a retry cannot help (`NoSuchStream`, `Truncated`, `RequestDenied`, ...), or the
    /// last error once `retry_for` has passed.
    pub async fn next_batch(&mut self) -> Result<Vec<(Dlsn, u64, Vec<u8>)>> {
        let deadline = tokio::time::Instant::now() + self.retry_for;
        let mut backoff = RETRY_BACKOFF_START;
        loop {
            let r = self
                .client
                .read(
                    &self.stream,
                    self.from,
                    self.max_records,
                    self.max_bytes,
                    self.wait,
                )
                .await;
            match r {
                Ok(batch) => {
                    if let ReadPosition::Dlsn(d) = batch.next {
                        self.from = ReadPosition::Dlsn(d);
                    }
                    return Ok(batch.records);
                }
                Err(e) if retriable(&e) && tokio::time::Instant::now() < deadline => {
                    self.failures += 1;
                    tracing::debug!(stream = %self.stream, error = %e, from = ?self.from, "read failed; reading again from the same position");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

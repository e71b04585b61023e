//! A blocking API for programs without tokio: [`Client`], [`Producer`] and [`Reader`] wrap
//! the async ones and run them on a small tokio runtime the client owns (one worker thread,
//! so the connections' reader tasks go on between calls).
//!
//! Do not call these from inside a tokio runtime (blocking there panics); use the async API.

use std::sync::Arc;
use std::time::Duration;

use crate::config::ClientConfig;
use crate::dlsn::{Dlsn, ReadPosition};
use crate::error::{Error, Result};
use crate::producer::ProducerConfig;
use crate::subscription::SubscriptionInfo;
use crate::types::{ReadBatch, StreamInfo, WriteResult};

/// A blocking [`crate::ProxyClient`] with its own runtime.
#[derive(Clone)]
pub struct Client {
    rt: Arc<tokio::runtime::Runtime>,
    inner: Arc<crate::ProxyClient>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("blocking::Client")
            .field("inner", &self.inner)
            .finish()
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("quire-client")
        .enable_all()
        .build()
        .map_err(|e| Error::Io {
            op: "start the client runtime",
            source: e,
        })
}

impl Client {
    /// Connects to `addr` (failing over to `config.proxies`).
    ///
    /// # Errors
    /// As [`crate::ProxyClient::connect`]; `Io` when the runtime cannot start.
    pub fn connect(addr: &str, config: ClientConfig) -> Result<Self> {
        let rt = runtime()?;
        let inner = rt.block_on(crate::ProxyClient::connect_with(addr, config))?;
        Ok(Self {
            rt: Arc::new(rt),
            inner: Arc::new(inner),
        })
    }

    /// Connects to the first proxy of `config.proxies` that answers.
    ///
    /// # Errors
    /// As [`crate::ProxyClient::connect_any`].
    pub fn connect_any(config: ClientConfig) -> Result<Self> {
        let rt = runtime()?;
        let inner = rt.block_on(crate::ProxyClient::connect_any(config))?;
        Ok(Self {
            rt: Arc::new(rt),
            inner: Arc::new(inner),
        })
    }

    /// The async client under it.
    pub fn async_client(&self) -> &Arc<crate::ProxyClient> {
        &self.inner
    }

    /// See [`crate::ProxyClient::create_stream`].
    ///
    /// # Errors
    /// As there.
    pub fn create_stream(&self, stream: &str) -> Result<()> {
        self.rt.block_on(self.inner.create_stream(stream))
    }

    /// See [`crate::ProxyClient::write`] (no retry: an unknown outcome is reported).
    ///
    /// # Errors
    /// As there.
    pub fn write(
        &self,
        stream: &str,
        records: Vec<(u64, Vec<u8>)>,
        create_if_missing: bool,
    ) -> Result<WriteResult> {
        self.rt
            .block_on(self.inner.write(stream, records, create_if_missing))
    }

    /// See [`crate::ProxyClient::read`].
    ///
    /// # Errors
    /// As there.
    pub fn read(
        &self,
        stream: &str,
        from: ReadPosition,
        max_records: u32,
        max_bytes: u32,
        wait: Duration,
    ) -> Result<ReadBatch> {
        self.rt
            .block_on(self.inner.read(stream, from, max_records, max_bytes, wait))
    }

    /// See [`crate::ProxyClient::describe_stream`].
    ///
    /// # Errors
    /// As there.
    pub fn describe_stream(&self, stream: &str) -> Result<StreamInfo> {
        self.rt.block_on(self.inner.describe_stream(stream))
    }

    /// See [`crate::ProxyClient::commit_subscription`] (forward only).
    ///
    /// # Errors
    /// As there.
    pub fn commit_subscription(
        &self,
        stream: &str,
        name: &str,
        position: Dlsn,
    ) -> Result<SubscriptionInfo> {
        self.rt
            .block_on(self.inner.commit_subscription(stream, name, position))
    }

    /// See [`crate::ProxyClient::subscription`].
    ///
    /// # Errors
    /// As there.
    pub fn subscription(&self, stream: &str, name: &str) -> Result<SubscriptionInfo> {
        self.rt.block_on(self.inner.subscription(stream, name))
    }

    /// An exactly-once producer on `stream` ([`crate::Producer`]).
    ///
    /// # Errors
    /// As [`crate::Producer::open`].
    pub fn producer(&self, stream: &str, config: ProducerConfig) -> Result<Producer> {
        let inner = self
            .rt
            .block_on(crate::Producer::open(self.inner.clone(), stream, config))?;
        Ok(Producer {
            rt: self.rt.clone(),
            inner,
        })
    }

    /// A tailing reader of `stream` from `from` ([`crate::Reader`]).
    pub fn reader(&self, stream: &str, from: ReadPosition) -> Reader {
        Reader {
            rt: self.rt.clone(),
            inner: crate::Reader::new(self.inner.clone(), stream, from),
        }
    }
}

/// A blocking [`crate::Producer`].
#[derive(Debug)]
pub struct Producer {
    rt: Arc<tokio::runtime::Runtime>,
    inner: crate::Producer,
}

impl Producer {
    /// See [`crate::Producer::write`].
    ///
    /// # Errors
    /// As there.
    pub fn write(&mut self, records: Vec<(u64, Vec<u8>)>) -> Result<WriteResult> {
        self.rt.block_on(self.inner.write(records))
    }

    /// The async producer under it.
    pub fn inner(&self) -> &crate::Producer {
        &self.inner
    }
}

/// A blocking [`crate::Reader`].
#[derive(Debug)]
pub struct Reader {
    rt: Arc<tokio::runtime::Runtime>,
    inner: crate::Reader,
}

impl Reader {
    /// See [`crate::Reader::next_batch`].
    ///
    /// # Errors
    /// As there.
    pub fn next_batch(&mut self) -> Result<Vec<(Dlsn, u64, Vec<u8>)>> {
        self.rt.block_on(self.inner.next_batch())
    }

    /// The DLSN of the next record to read, once one was read (the checkpoint).
    pub fn next_dlsn(&self) -> Option<Dlsn> {
        self.inner.next_dlsn()
    }

    /// The async reader under it, for its settings (`max_records`, `wait`, ...).
    pub fn settings(&mut self) -> &mut crate::Reader {
        &mut self.inner
    }
}

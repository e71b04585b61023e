//! A metadata store for tests that can take a stream lease away from its holder, as a
//! ZooKeeper session expiry would: the real [`EmbeddedStore`] underneath, plus a record of the
//! lease tokens it handed out so that `revoke` can release one from outside, optional
//! delays on stream and owner reads (a ZooKeeper round trip, which the embedded store does not
//! take), and gates that hold the reads of chosen stream records until the test opens them (an
//! acquisition held half-way for as long as a test needs).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use quire_metadata::{
    BookieId, BookieInfo, Cookie, EmbeddedStore, LedgerMetadata, MetadataStore, Result,
    StreamLease, StreamMetadata, Version, Versioned,
};
use quire_wire::LedgerId;

pub struct Revocable {
    pub inner: EmbeddedStore,
    /// stream -> (owner, token) of the lease last handed out.
    tokens: Mutex<HashMap<String, (String, String)>>,
    /// Added before every `read_stream` answer.
    pub read_stream_delay: Mutex<std::time::Duration>,
    /// Added before every `stream_owner` answer.
    pub stream_owner_delay: Mutex<std::time::Duration>,
    /// stream -> gate its `read_stream` calls wait at until the gate is closed (`open`).
    gates: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

impl Revocable {
    pub fn new(inner: EmbeddedStore) -> Arc<Self> {
        Arc::new(Self {
            inner,
            tokens: Mutex::new(HashMap::new()),
            read_stream_delay: Mutex::default(),
            stream_owner_delay: Mutex::default(),
            gates: Mutex::default(),
        })
    }

    /// From now on, reads of `stream`'s record wait until [`Revocable::open`]: an acquisition
    /// of it stops at its first step.
    pub fn hold(&self, stream: &str) {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        self.gates.lock().unwrap().insert(stream.to_string(), gate);
    }

    /// Lets the reads of `stream`'s record held by [`Revocable::hold`] go on, and later ones
    /// through at once.
    pub fn open(&self, stream: &str) {
        if let Some(gate) = self.gates.lock().unwrap().remove(stream) {
            gate.close();
        }
    }

    /// Releases the current lease of `stream` behind its holder's back; its `lost` flag rises.
    pub async fn revoke(&self, stream: &str) {
        let (owner, token) = self
            .tokens
            .lock()
            .unwrap()
            .get(stream)
            .cloned()
            .expect("a lease was handed out");
        let (_tx, lost) = tokio::sync::watch::channel(false);
        self.inner
            .release_stream(StreamLease {
                stream: stream.to_string(),
                owner,
                lost,
                token,
            })
            .await
            .unwrap();
    }
}

#[async_trait]
impl MetadataStore for Revocable {
    async fn register_bookie(&self, info: BookieInfo) -> Result<()> {
        self.inner.register_bookie(info).await
    }
    async fn unregister_bookie(&self, id: &BookieId) -> Result<()> {
        self.inner.unregister_bookie(id).await
    }
    async fn list_bookies(&self) -> Result<Vec<BookieInfo>> {
        self.inner.list_bookies().await
    }
    async fn list_bookie_registrations(&self) -> Result<Vec<quire_metadata::BookieRegistration>> {
        self.inner.list_bookie_registrations().await
    }
    async fn allocate_ledger_id(&self) -> Result<LedgerId> {
        self.inner.allocate_ledger_id().await
    }
    async fn next_ledger_id(&self) -> Result<LedgerId> {
        self.inner.next_ledger_id().await
    }
    async fn create_ledger(&self, id: LedgerId, meta: &LedgerMetadata) -> Result<Version> {
        self.inner.create_ledger(id, meta).await
    }
    async fn read_ledger(&self, id: LedgerId) -> Result<Versioned<LedgerMetadata>> {
        self.inner.read_ledger(id).await
    }
    async fn update_ledger(
        &self,
        id: LedgerId,
        meta: &LedgerMetadata,
        expected: Version,
    ) -> Result<Version> {
        self.inner.update_ledger(id, meta, expected).await
    }
    async fn delete_ledger(&self, id: LedgerId, expected: Version) -> Result<()> {
        self.inner.delete_ledger(id, expected).await
    }
    async fn list_ledgers(&self) -> Result<Vec<LedgerId>> {
        self.inner.list_ledgers().await
    }
    async fn create_stream(&self, meta: &StreamMetadata) -> Result<Version> {
        self.inner.create_stream(meta).await
    }
    async fn read_stream(&self, name: &str) -> Result<Versioned<StreamMetadata>> {
        let gate = self.gates.lock().unwrap().get(name).cloned();
        if let Some(gate) = gate {
            // No permit is ever added: this returns once the gate is closed.
            let _ = gate.acquire().await;
        }
        let delay = *self.read_stream_delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        self.inner.read_stream(name).await
    }
    async fn update_stream(&self, meta: &StreamMetadata, expected: Version) -> Result<Version> {
        self.inner.update_stream(meta, expected).await
    }
    async fn update_stream_stamped(
        &self,
        meta: &StreamMetadata,
        expected: Version,
    ) -> Result<quire_metadata::Stamped> {
        self.inner.update_stream_stamped(meta, expected).await
    }
    async fn delete_stream(&self, name: &str, expected: Version) -> Result<()> {
        self.inner.delete_stream(name, expected).await
    }
    async fn list_streams(&self) -> Result<Vec<String>> {
        self.inner.list_streams().await
    }
    async fn read_subscription(
        &self,
        stream: &str,
        name: &str,
    ) -> Result<Versioned<quire_metadata::Subscription>> {
        self.inner.read_subscription(stream, name).await
    }
    async fn write_subscription(
        &self,
        stream: &str,
        name: &str,
        sub: &quire_metadata::Subscription,
        expected: Option<Version>,
    ) -> Result<Version> {
        self.inner
            .write_subscription(stream, name, sub, expected)
            .await
    }
    async fn list_subscriptions(
        &self,
        stream: &str,
    ) -> Result<Vec<(String, quire_metadata::Subscription)>> {
        self.inner.list_subscriptions(stream).await
    }
    async fn delete_subscription(&self, stream: &str, name: &str) -> Result<()> {
        self.inner.delete_subscription(stream, name).await
    }
    async fn instance_id(&self) -> Result<String> {
        self.inner.instance_id().await
    }
    async fn read_cookie(&self, bookie: &BookieId) -> Result<Versioned<Cookie>> {
        self.inner.read_cookie(bookie).await
    }
    async fn write_cookie(&self, cookie: &Cookie, expected: Option<Version>) -> Result<Version> {
        self.inner.write_cookie(cookie, expected).await
    }
    async fn try_acquire_stream(
        &self,
        stream: &str,
        owner: &str,
    ) -> Result<std::result::Result<StreamLease, String>> {
        let r = self.inner.try_acquire_stream(stream, owner).await?;
        if let Ok(lease) = &r {
            self.tokens.lock().unwrap().insert(
                stream.to_string(),
                (lease.owner.clone(), lease.token.clone()),
            );
        }
        Ok(r)
    }
    async fn stream_owner(&self, stream: &str) -> Result<Option<String>> {
        let delay = *self.stream_owner_delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        self.inner.stream_owner(stream).await
    }
    async fn release_stream(&self, lease: StreamLease) -> Result<()> {
        self.inner.release_stream(lease).await
    }
}

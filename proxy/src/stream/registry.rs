//! The table of streams this proxy has acquired (DistributedLog's write proxy keeps the same
//! per-stream map): acquiring a stream (lease, recovery of its in-progress segments, its
//! task), finding an acquisition and sending commands to its task. Readers, the sweep and the
//! manager's facade work through it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use quire_ledger::BookKeeper;
use quire_metadata::{validate_stream_name, MetadataStore, StreamMetadata};
use tokio::sync::{mpsc, oneshot, watch, OnceCell};

use super::clock::LayerStats;
use super::command::Command;
use super::follower::{FollowerContext, Followers};
use super::ownership::{self, Ownership, StreamHandle};
use super::placement::{Placement, LOAD_WINDOW_TICKS};
use super::record::StreamRecord;
use super::shared::{now_ms, StreamShared};
use super::tail_cache::TailState;
use super::writer::Writer;
use super::StreamConfig;
use crate::error::{Error, FromMetadata, Result};

/// An acquisition slot: initialised once by the first request that acquires the stream.
type Slot = Arc<OnceCell<Arc<StreamHandle>>>;

/// The streams this proxy holds and what acquiring one needs.
///
/// # Threading
/// Shared (`Send + Sync`); the table is under one mutex, never held across an await.
pub(super) struct Registry {
    pub(super) metadata: Arc<dyn MetadataStore>,
    pub(super) bookkeeper: BookKeeper,
    pub(super) config: Arc<StreamConfig>,
    /// The identity leases are taken under (`ownership::owner_identity`).
    pub(super) identity: String,
    streams: Mutex<HashMap<String, Slot>>,
    shutting_down: AtomicBool,
    /// The runtime the manager was made on: stream tasks run there even when an acquisition
    /// happens inside a catch-up read on the lower-priority read runtime.
    pub(super) runtime: Option<tokio::runtime::Handle>,
    /// The metadata store's clock as seen from here, and counts across streams (metrics).
    pub(super) layer: Arc<LayerStats>,
    /// The streams this proxy reads without owning them (`follower.rs`).
    pub(super) followers: Followers,
    /// Acquisitions under way (reserved against `owned_streams_max`, see [`Registry::reserve`]).
    acquiring: AtomicUsize,
    /// Acquisitions refused with `TooManyStreams` since start (metrics).
    pub(super) too_many_refusals: AtomicU64,
    /// The live proxies and this one's registration (`placement.rs`).
    pub(super) placement: Placement,
}

/// One acquisition counted against `owned_streams_max` until its handle is in the table.
struct Reservation<'a>(&'a AtomicUsize);

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One acquisition counted in `LayerStats::acquiring` for as long as it runs.
struct Acquiring<'a>(&'a LayerStats);

impl<'a> Acquiring<'a> {
    fn new(layer: &'a LayerStats) -> Self {
        layer.acquiring.fetch_add(1, Ordering::Relaxed);
        Self(layer)
    }
}

impl Drop for Acquiring<'_> {
    fn drop(&mut self) {
        self.0.acquiring.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Registry {
    /// An empty table on the current tokio runtime (if any).
    pub(super) fn new(
        metadata: Arc<dyn MetadataStore>,
        bookkeeper: BookKeeper,
        config: StreamConfig,
    ) -> Self {
        let layer: Arc<LayerStats> = Arc::default();
        Self {
            metadata,
            bookkeeper,
            identity: ownership::owner_identity(&config.owner_address),
            placement: Placement::new(
                &config.owner_address,
                &config.owner_address,
                config.balance_moves_per_sec,
            )
            .with_labels(config.owner_labels.clone())
            .with_load(config.balance_load_threshold_percent, layer.clone()),
            config: Arc::new(config),
            streams: Mutex::new(HashMap::new()),
            shutting_down: AtomicBool::new(false),
            runtime: tokio::runtime::Handle::try_current().ok(),
            layer,
            followers: Followers::default(),
            acquiring: AtomicUsize::new(0),
            too_many_refusals: AtomicU64::new(0),
        }
    }

    /// What a follower started by this registry needs.
    pub(super) fn follower_context(&self) -> FollowerContext {
        FollowerContext {
            metadata: self.metadata.clone(),
            bookkeeper: self.bookkeeper.clone(),
            layer: self.layer.clone(),
            cache_bytes_max: self.config.follower_cache_bytes_max,
            idle_timeout: self.config.follower_idle_timeout,
            runtime: self.runtime.clone(),
            stopping: self.followers.stopping.clone(),
        }
    }

    /// Counts one more acquisition of `name` against `owned_streams_max`: `TooManyStreams`
    /// (nothing done) when the streams owned and the acquisitions under way already reach it
    /// (DistributedLog's `maxAcquiredPartitionsPerProxy` check before it acquires a stream).
    /// The count holds until the reservation is dropped, after the handle is in the table, so
    /// concurrent acquisitions never take the proxy past the limit. `None` without a limit.
    fn reserve(&self, name: &str) -> Result<Option<Reservation<'_>>> {
        let Some(max) = self.config.owned_streams_max else {
            return Ok(None);
        };
        let under_way = self.acquiring.fetch_add(1, Ordering::SeqCst);
        let reservation = Reservation(&self.acquiring);
        if self.owned_count() + under_way >= max {
            self.too_many_refusals.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(stream = name, max, "refusing to acquire one more stream");
            return Err(Error::TooManyStreams {
                stream: name.to_string(),
                proxy: self.identity.clone(),
                max,
            });
        }
        Ok(Some(reservation))
    }

    /// `ShuttingDown` once [`Registry::begin_shutdown`] ran.
    pub(super) fn check_running(&self) -> Result<()> {
        if self.is_shutting_down() {
            Err(Error::ShuttingDown)
        } else {
            Ok(())
        }
    }

    /// True once the manager shuts down.
    pub(super) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Refuses new requests from now on; returns the slots to close.
    pub(super) fn begin_shutdown(&self) -> Vec<Slot> {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.followers.stop();
        self.streams
            .lock()
            .expect("streams lock")
            .values()
            .cloned()
            .collect()
    }

    /// The acquisition of `name` this proxy holds, if any (lost or not).
    pub(super) fn acquired(&self, name: &str) -> Option<Arc<StreamHandle>> {
        self.streams
            .lock()
            .expect("streams lock")
            .get(name)
            .and_then(|c| c.get().cloned())
    }

    /// The acquisition of `name` if this proxy holds it and has not lost it.
    pub(super) fn owned(&self, name: &str) -> Option<Arc<StreamHandle>> {
        self.acquired(name).filter(|h| h.lost_reason().is_none())
    }

    /// Whether this proxy holds `name`'s acquisition and has not lost it, like
    /// [`Registry::owned`] without handing out the handle.
    pub(super) fn is_owned(&self, name: &str) -> bool {
        let streams = self.streams.lock().expect("streams lock");
        streams
            .get(name)
            .and_then(|c| c.get())
            .is_some_and(|h| h.lost_reason().is_none())
    }

    /// Streams acquired and not lost.
    pub(super) fn owned_count(&self) -> usize {
        let streams = self.streams.lock().expect("streams lock");
        streams
            .values()
            .filter(|cell| cell.get().is_some_and(|h| h.lost_reason().is_none()))
            .count()
    }

    /// Every acquisition held and not lost (for metrics read at scrape time).
    pub(super) fn owned_all(&self) -> Vec<Arc<StreamHandle>> {
        let streams = self.streams.lock().expect("streams lock");
        streams
            .values()
            .filter_map(|cell| cell.get().filter(|h| h.lost_reason().is_none()).cloned())
            .collect()
    }

    /// Takes a balancer tick's mark of every owned stream's write counts and returns the most
    /// (bytes, records) one stream took over the last [`LOAD_WINDOW_TICKS`] ticks, each
    /// dimension on its own (`placement.rs`: the load no move can split).
    pub(super) fn hottest_stream_written(&self) -> (u64, u64) {
        self.owned_all().iter().fold((0, 0), |(b, r), h| {
            let mut written = h.shared.written.lock().expect("written lock");
            let (hb, hr) = written.sample(LOAD_WINDOW_TICKS);
            (b.max(hb), r.max(hr))
        })
    }

    /// Forgets `name`'s acquisition if it ended by deleting the stream, so that the name can
    /// be used again at once.
    pub(super) fn forget_deleted(&self, name: &str) {
        let mut streams = self.streams.lock().expect("streams lock");
        if streams
            .get(name)
            .and_then(|c| c.get())
            .is_some_and(|h| h.shared.deleted.load(Ordering::SeqCst))
        {
            streams.remove(name);
        }
    }

    /// Creates an empty stream record with a fresh ledger secret and this proxy's region as
    /// its home; `RegionUnavailable` (nothing created) when this proxy's region is marked
    /// unavailable.
    ///
    /// # Errors
    /// `InvalidStreamName`, `StreamExists`, `RegionUnavailable`, `Metadata`, `ShuttingDown`.
    pub(super) async fn create_stream(&self, name: &str) -> Result<()> {
        self.check_running()?;
        validate_stream_name(name).map_err(|e| Error::from_metadata(name, "create stream", e))?;
        self.check_region_mark(name).await?;
        self.create_record(name).await
    }

    /// `RegionUnavailable` when an operator marked this proxy's region as taking no new
    /// streams (`regions/unavailable/<region>`, issue 30 item 4; DistributedLog's
    /// `REGION_UNAVAILABLE`); one metadata read. Called only on the way to creating or
    /// acquiring a stream, so the streams this proxy owns keep being served.
    ///
    /// # Errors
    /// `RegionUnavailable`; `Metadata` when the mark cannot be read.
    async fn check_region_mark(&self, name: &str) -> Result<()> {
        if self.region_marked(name, self.placement.region()).await? {
            return Err(self.region_unavailable(name));
        }
        Ok(())
    }

    /// Whether `region` is marked as taking no new streams (one metadata read); a read
    /// failure is `Metadata`, never taken for a mark.
    async fn region_marked(&self, name: &str, region: &str) -> Result<bool> {
        self.metadata
            .region_unavailable(region)
            .await
            .map_err(|e| Error::from_metadata(name, "read region mark", e))
    }

    /// The `RegionUnavailable` answer for `name` from this proxy's region.
    fn region_unavailable(&self, name: &str) -> Error {
        Error::RegionUnavailable {
            stream: name.to_string(),
            proxy: self.identity.clone(),
            region: self.placement.region().to_string(),
        }
    }

    /// Where a stream nobody here owns goes instead (issue 30 item 4): its current owner when
    /// this proxy's region is marked unavailable and someone owns it (else
    /// `RegionUnavailable`), or a live proxy of its home region when that is another region,
    /// not marked unavailable (`Placement::home_redirect`). `Ok(())`: acquire it here.
    /// `local_marked`: this proxy's region mark when the caller already read it (a stream it
    /// just created), so it is read once per acquisition.
    ///
    /// # Errors
    /// `OwnedElsewhere`, `RegionUnavailable`; `Metadata` when a mark or the owner cannot be
    /// read (a failed read is not taken for a mark).
    async fn region_rules(
        &self,
        name: &str,
        home: Option<&str>,
        local_marked: Option<bool>,
    ) -> Result<()> {
        let local_marked = match local_marked {
            Some(m) => m,
            None => self.region_marked(name, self.placement.region()).await?,
        };
        if local_marked {
            return match self.owner_of(name).await? {
                Some(owner) => Err(Error::OwnedElsewhere {
                    stream: name.to_string(),
                    owner,
                }),
                None => Err(self.region_unavailable(name)),
            };
        }
        let Some(home) = home else {
            return Ok(());
        };
        let Some(to) = self.placement.home_redirect(name, home) else {
            return Ok(());
        };
        if self.region_marked(name, home).await? {
            return Ok(());
        }
        Err(Error::OwnedElsewhere {
            stream: name.to_string(),
            owner: self.owner_of(name).await?.unwrap_or(to),
        })
    }

    /// The stream's current owner in the metadata store.
    async fn owner_of(&self, name: &str) -> Result<Option<String>> {
        self.metadata
            .stream_owner(name)
            .await
            .map_err(|e| Error::from_metadata(name, "read stream owner", e))
    }

    /// Writes a new stream record (see [`Registry::create_stream`]).
    async fn create_record(&self, name: &str) -> Result<()> {
        let meta = StreamMetadata {
            name: name.to_string(),
            segments: Vec::new(),
            max_txid: None,
            creation_time_ms: now_ms(),
            truncated_before: None,
            retention: quire_metadata::RetentionOverride::default(),
            // The master keys of the stream's ledgers are derived from it (`segment.rs`).
            ledger_secret_hex: Some(quire_metadata::encode_hex(
                &quire_ledger::new_ledger_secret(),
            )),
            sealed: false,
            compression: None,
            limits: None,
            home_region: Some(self.placement.region().to_string()),
            placement: None,
        };
        self.metadata
            .create_stream(&meta)
            .await
            .map_err(|e| Error::from_metadata(name, "create stream", e))?;
        Ok(())
    }

    /// Names of every stream, sorted.
    ///
    /// # Errors
    /// `Metadata`.
    pub(super) async fn list_streams(&self) -> Result<Vec<String>> {
        self.metadata
            .list_streams()
            .await
            .map_err(|e| Error::from_metadata("", "list streams", e))
    }

    /// The handle of `name`, acquiring the stream (taking its lease, recovering its
    /// in-progress segments and starting its task) the first time, and again after ownership
    /// was lost. With `report_loss`, a loss no request has been told about yet is returned as
    /// `OwnershipLost` once (so a writer learns that its stream moved) before acquiring again.
    pub(super) async fn stream(
        &self,
        name: &str,
        create_if_missing: bool,
        report_loss: bool,
    ) -> Result<Arc<StreamHandle>> {
        for _ in 0..3 {
            self.check_running()?;
            let cell = self
                .streams
                .lock()
                .expect("streams lock")
                .entry(name.to_string())
                .or_default()
                .clone();
            // Held until the handle is in the table (see `reserve`).
            let mut reservation = None;
            let result = cell
                .get_or_try_init(|| async {
                    reservation = self.reserve(name)?;
                    self.acquire(name, create_if_missing).await
                })
                .await
                .cloned();
            drop(reservation);
            let handle = match result {
                Ok(h) => h,
                Err(e) => {
                    // Do not keep entries for names that failed (unknown or invalid streams,
                    // streams owned elsewhere), but only when no other request holds the entry:
                    // one waiting on it may be initialising it right now (a write creating the
                    // stream this read did not find), and a request arriving after a removal
                    // would start a second acquisition that finds the first one's lease and
                    // answers with a redirect to this same proxy. Clones are made only under
                    // the table's lock, so with ours dropped under it the count is exact.
                    let mut streams = self.streams.lock().expect("streams lock");
                    drop(cell);
                    if streams
                        .get(name)
                        .is_some_and(|c| c.get().is_none() && Arc::strong_count(c) == 1)
                    {
                        streams.remove(name);
                    }
                    return Err(e);
                }
            };
            let Some(reason) = handle.lost_reason() else {
                handle.shared.requests.fetch_add(1, Ordering::SeqCst);
                return Ok(handle);
            };
            // This acquisition is over: forget it, so the next attempt acquires afresh.
            {
                let mut streams = self.streams.lock().expect("streams lock");
                if streams.get(name).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                    streams.remove(name);
                }
            }
            // A deleted stream is not a lost one: acquire afresh (finding no stream, or
            // creating a new one); nor is one given back after a sweep.
            if report_loss
                && !handle.shared.deleted.load(Ordering::SeqCst)
                && !handle.shared.released.load(Ordering::SeqCst)
                && !handle.shared.loss_reported.swap(true, Ordering::SeqCst)
            {
                return Err(Error::OwnershipLost {
                    stream: name.to_string(),
                    reason,
                });
            }
        }
        Err(Error::OwnershipLost {
            stream: name.to_string(),
            reason: "ownership was lost again right after each acquisition".into(),
        })
    }

    /// Why an acquisition that took the lease must give it back: a drain began meanwhile
    /// (`OwnedElsewhere` naming the stream's preferred owner among the others) or a shutdown
    /// (`ShuttingDown`). A drain's hand-over and its shutdown each close the streams in the
    /// table when they start, so an acquisition still under way then (several seconds when
    /// ZooKeeper answers slowly) would keep its lease after the proxy exits, and the stream
    /// would be stuck until the proxy's session expired (seen in perf/examples/many_streams).
    fn stopped_meanwhile(&self, name: &str, home: Option<&String>) -> Option<Error> {
        if self.is_shutting_down() {
            return Some(Error::ShuttingDown);
        }
        if !self.placement.leaving() {
            return None;
        }
        let preferred = self
            .placement
            .preferred_elsewhere(name, home.map(String::as_str));
        Some(
            preferred.map_or(Error::ShuttingDown, |owner| Error::OwnedElsewhere {
                stream: name.to_string(),
                owner,
            }),
        )
    }

    /// Acquires `name`: reads (or, with `create_if_missing`, creates) its record, takes its
    /// lease without waiting, recovers its in-progress segments and starts its task.
    ///
    /// # Errors
    /// `InvalidStreamName`, `NoSuchStream`, `OwnedElsewhere` (also a redirect to the stream's
    /// home region), `RegionUnavailable`, `Metadata`, `Storage` (`TooManyStreams` comes from
    /// the reservation before it).
    async fn acquire(&self, name: &str, create_if_missing: bool) -> Result<Arc<StreamHandle>> {
        validate_stream_name(name).map_err(|e| Error::from_metadata(name, "acquire stream", e))?;
        let _counted = Acquiring::new(&self.layer);
        let started = quire_clock::now();
        // This proxy's region mark, when read on the way to creating the stream.
        let mut local_marked = None;
        let meta = match self.metadata.read_stream(name).await {
            Ok(m) => m,
            Err(quire_metadata::Error::NotFound { .. }) if create_if_missing => {
                self.check_region_mark(name).await?;
                local_marked = Some(false);
                match self.create_record(name).await {
                    Ok(()) | Err(Error::StreamExists { .. }) => {}
                    Err(e) => return Err(e),
                }
                self.metadata
                    .read_stream(name)
                    .await
                    .map_err(|e| Error::from_metadata(name, "read stream", e))?
            }
            Err(e) => return Err(Error::from_metadata(name, "read stream", e)),
        };
        // Regions: the mark on this proxy's region, then the stream's home region.
        let home = meta.value.home_region.clone();
        self.region_rules(name, home.as_deref(), local_marked)
            .await?;
        // Balanced placement: a stream nobody owns goes to its preferred live proxy.
        if let Some(preferred) = self.placement.preferred_elsewhere(name, home.as_deref()) {
            return Err(Error::OwnedElsewhere {
                stream: name.to_string(),
                owner: self.owner_of(name).await?.unwrap_or(preferred),
            });
        }
        let read_ms = quire_clock::elapsed(started).as_millis() as u64;
        // The write lock, without waiting (DistributedLog proxy: lockTimeoutSeconds=0).
        let lease = match self.metadata.try_acquire_stream(name, &self.identity).await {
            Ok(Ok(lease)) => lease,
            Ok(Err(owner)) => {
                return Err(Error::OwnedElsewhere {
                    stream: name.to_string(),
                    owner,
                })
            }
            Err(e) => return Err(Error::from_metadata(name, "acquire stream lease", e)),
        };
        let lease_ms = (quire_clock::elapsed(started).as_millis() as u64).saturating_sub(read_ms);
        let lease_lost = lease.lost.clone();
        let (tail_tx, tail_rx) = watch::channel(TailState::from_metadata(&meta.value));
        let shared = Arc::new(StreamShared::default());
        if let Some(h) = home {
            let _ = shared.home_region.set(h);
        }
        let record = StreamRecord {
            name: name.to_string(),
            metadata: self.metadata.clone(),
            bookkeeper: self.bookkeeper.clone(),
            config: self.config.clone(),
            layer: self.layer.clone(),
            meta,
            tail: tail_tx,
            shared: shared.clone(),
        };
        let owner = Ownership::new(name, self.metadata.clone(), shared.clone(), lease);
        let mut writer = Writer::new(record, owner);
        if let Err(e) = writer.recover().await {
            // A segment whose ledger cannot be recovered now (a bookie of its write quorum down
            // with no replacement) does not keep the stream from being served: its entries up
            // to the LAC the live bookies hold are readable, appends are answered with the
            // recovery's error, and the task retries recovery (see `Unrecovered`).
            if !writer.serves_unrecovered() {
                writer.release_lease().await;
                return Err(e);
            }
            tracing::warn!(stream = name, error = %e, "serving the stream without recovering its in-progress segment");
        }
        if let Some(e) = self.stopped_meanwhile(name, shared.home_region.get()) {
            writer.release_lease().await;
            return Err(e);
        }
        let (tx, rx) = mpsc::channel(self.config.append_queue_max);
        match &self.runtime {
            Some(rt) => drop(rt.spawn(writer.run(rx))),
            None => drop(tokio::spawn(writer.run(rx))),
        }
        self.count_acquired(name, started, read_ms, lease_ms);
        Ok(Arc::new(StreamHandle {
            name: name.to_string(),
            commands: tx,
            tail: tail_rx,
            shared,
            lease_lost,
        }))
    }

    /// Counts an acquisition of `name` that began at `started` and logs its phases in ms:
    /// reading the record (and the region and placement rules), taking the lease, then
    /// recovering and starting the task (issue 29's join and drain: where an acquisition's
    /// time goes). `under_way` counts this one.
    fn count_acquired(&self, name: &str, started: std::time::Instant, read_ms: u64, lease_ms: u64) {
        self.layer.acquired.fetch_add(1, Ordering::Relaxed);
        let total_ms = quire_clock::elapsed(started).as_millis() as u64;
        tracing::info!(
            stream = name,
            owner = %self.identity,
            read_ms,
            lease_ms,
            recover_ms = total_ms.saturating_sub(read_ms + lease_ms),
            under_way = self.layer.acquiring.load(Ordering::Relaxed),
            "acquired stream"
        );
    }

    /// Sends a command to the task of stream `name` (acquiring it, see `stream`), acquiring
    /// again when the acquisition found was just given back after a sweep. Returns the handle
    /// the command went to.
    pub(super) async fn send_to_stream(
        &self,
        name: &str,
        create_if_missing: bool,
        report_loss: bool,
        mut cmd: Command,
    ) -> Result<Arc<StreamHandle>> {
        for _ in 0..3 {
            let handle = self.stream(name, create_if_missing, report_loss).await?;
            match handle.commands.send(cmd).await {
                Ok(()) => return Ok(handle),
                Err(tokio::sync::mpsc::error::SendError(back))
                    if handle.shared.released.load(Ordering::SeqCst) =>
                {
                    cmd = back;
                }
                Err(_) => return Err(self.ended_error(&handle)),
            }
        }
        Err(Error::OwnershipLost {
            stream: name.to_string(),
            reason: "the stream was given back after a sweep again right after each acquisition"
                .into(),
        })
    }

    /// Sends a command to a stream's task; when the task has ended, the reason: the stream was
    /// lost, deleted, or the manager is stopping.
    pub(super) async fn send_command(&self, handle: &StreamHandle, cmd: Command) -> Result<()> {
        if handle.commands.send(cmd).await.is_ok() {
            return Ok(());
        }
        Err(self.ended_error(handle))
    }

    /// Why a stream task no longer takes commands.
    fn ended_error(&self, handle: &StreamHandle) -> Error {
        if handle.shared.deleted.load(Ordering::SeqCst) {
            Error::NoSuchStream {
                stream: handle.name.clone(),
            }
        } else {
            match handle.lost_reason() {
                Some(reason) => {
                    handle.shared.loss_reported.store(true, Ordering::SeqCst);
                    Error::OwnershipLost {
                        stream: handle.name.clone(),
                        reason,
                    }
                }
                None => Error::ShuttingDown,
            }
        }
    }

    /// Runs one lifecycle command on the stream's owner task (acquiring the stream if nobody
    /// owns it) and waits for its answer.
    pub(super) async fn owner_command<T>(
        &self,
        name: &str,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> Command,
    ) -> Result<T> {
        self.check_running()?;
        let (reply, rx) = oneshot::channel();
        let handle = self.send_to_stream(name, false, false, make(reply)).await?;
        match rx.await {
            Ok(r) => r,
            // The task ended without answering: it lost the stream or stopped.
            Err(_) => Err(match handle.lost_reason() {
                Some(reason) => Error::OwnershipLost {
                    stream: name.to_string(),
                    reason,
                },
                None => Error::ShuttingDown,
            }),
        }
    }
}

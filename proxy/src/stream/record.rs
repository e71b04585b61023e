//! The stream record as its writer holds it (DistributedLog's log segment metadata under the
//! stream's znode), with the handles that read and update it: every change is a
//! compare-and-set against the version held, and each change is published to `describe`
//! (`StreamShared::view`) and to readers (the tail watch).

use std::sync::Arc;

use quire_ledger::BookKeeper;
use quire_metadata::{MetadataStore, SegmentState, StreamMetadata, Versioned};
use tokio::sync::watch;

use super::clock::LayerStats;
use super::ownership::Ownership;
use super::shared::{now_ms, StreamShared};
use super::tail_cache::TailState;
use super::StreamConfig;
use crate::error::{Error, FromMetadata, Result};

/// A stream's record and the handles its writer needs (metadata store, ledger client,
/// settings, proxy-wide clock sample), owned by the stream task.
pub(super) struct StreamRecord {
    pub(super) name: String,
    pub(super) metadata: Arc<dyn MetadataStore>,
    pub(super) bookkeeper: BookKeeper,
    pub(super) config: Arc<StreamConfig>,
    /// The proxy-wide clock sample and counters.
    pub(super) layer: Arc<LayerStats>,
    /// The record and its version as this writer last wrote or read it.
    pub(super) meta: Versioned<StreamMetadata>,
    /// The readers' view of the segments.
    pub(super) tail: watch::Sender<TailState>,
    pub(super) shared: Arc<StreamShared>,
}

impl StreamRecord {
    /// A metadata store error as the stream layer's error for `op`.
    pub(super) fn meta_err(&self, op: &'static str, e: quire_metadata::Error) -> Error {
        Error::from_metadata(&self.name, op, e)
    }

    /// `NoSuchStream` for this stream.
    pub(super) fn gone(&self) -> Error {
        Error::NoSuchStream {
            stream: self.name.clone(),
        }
    }

    /// Takes `meta` as the stream record and shows it to `describe` together with the open
    /// segment's progress, dropping that progress once the record no longer has its segment
    /// in progress (one lock: a describe never sees a roll half done).
    pub(super) fn set_meta(&mut self, meta: Versioned<StreamMetadata>) {
        let mut view = self.shared.view.lock().expect("view lock");
        if let Some((seq, ..)) = view.live {
            if !meta
                .value
                .segments
                .iter()
                .any(|s| s.seq_no == seq && s.state == SegmentState::InProgress)
            {
                view.live = None;
                view.live_last_record = None;
            }
        }
        view.meta = Some(Arc::new(meta.clone()));
        self.meta = meta;
    }

    /// Compare-and-set of the stream record against the version this writer holds; on success
    /// `meta` becomes the writer's record. The store's stamp of the update is compared with
    /// this proxy's clock (`clock.rs`). Errors are the store's.
    pub(super) async fn cas_stream(
        &mut self,
        meta: StreamMetadata,
    ) -> std::result::Result<(), quire_metadata::Error> {
        let before = now_ms();
        let stamped = self
            .metadata
            .update_stream_stamped(&meta, self.meta.version)
            .await?;
        self.layer
            .clock
            .record(before, now_ms(), stamped.store_time_ms);
        self.set_meta(Versioned {
            value: meta,
            version: stamped.version,
        });
        Ok(())
    }

    /// Makes sure the store's clock was sampled lately (`clock::SAMPLE_MAX_AGE`), by rewriting
    /// the stream record unchanged when it was not (the sweep's rewrite does the same).
    ///
    /// # Errors
    /// `OwnershipLost` (lease gone, or another writer's version), `Metadata`.
    pub(super) async fn sample_store_clock(&mut self, ownership: &Ownership) -> Result<()> {
        if self.layer.clock.fresh() {
            return Ok(());
        }
        ownership.check()?;
        let same = self.meta.value.clone();
        self.cas_stream(same)
            .await
            .map_err(|e| ownership.update_err("sample the metadata store's clock", e))
    }

    /// A completion time for the stream record: now on the metadata store's clock, at the
    /// latest the last sample allows (`clock.rs`), so that no proxy's clock makes a segment
    /// look older than it is.
    pub(super) fn completion_time_ms(&self) -> u64 {
        self.layer.clock.store_now_latest_ms(now_ms())
    }

    /// Publishes the record's segments to readers, with the readable end of the segment being
    /// written (`open`: seq no and the writer's LAC, not in the record) and of a segment left
    /// unrecovered (`unrecovered`: seq no and the LAC its live bookies hold).
    pub(super) fn publish(
        &self,
        open: Option<(u64, Option<u64>)>,
        unrecovered: Option<(u64, Option<u64>)>,
    ) {
        self.tail
            .send_replace(TailState::from_metadata(&self.meta.value));
        if let Some((seq, lac)) = open {
            self.tail.send_modify(|t| {
                if let Some(s) = t.segments.iter_mut().find(|s| s.seq_no == seq) {
                    s.readable_last_entry = lac;
                }
            });
        }
        if let Some((seq, lac)) = unrecovered {
            self.tail.send_modify(|t| {
                if let Some(s) = t
                    .segments
                    .iter_mut()
                    .find(|s| s.seq_no == seq && !s.completed)
                {
                    s.readable_last_entry = lac;
                }
            });
        }
    }
}

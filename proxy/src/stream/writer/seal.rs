//! Sealing a stream (DistributedLog `markEndOfStream`): the stream task writes the
//! end-of-stream marker (record set v3 with the end-of-stream flag, `docs/format/record-set.md`)
//! after the last acknowledged record, completes the segment and marks the stream `sealed` in
//! its record. From then on every write fails with `END_OF_STREAM` (also under a later owner:
//! the flag is in the record, and recovery sets it again from a marker whose completion did not
//! reach the record); readers stop at the marker.

use super::Writer;
use crate::dlsn::Dlsn;
use crate::error::{Error, Result};
use crate::record_set;
use crate::stream::lookups::lookups;
use crate::stream::segment;
use crate::stream::shared::same_kind;

impl Writer {
    /// See `StreamManager::seal_stream`. Returns the answer (the DLSN of the stream's last
    /// record) and whether the task goes on. Sealing a sealed stream changes nothing.
    pub(in crate::stream) async fn seal(&mut self) -> (Result<Option<Dlsn>>, bool) {
        if self.rec.meta.value.sealed {
            return (Ok(lookups(&self.rec.meta.value).last_dlsn), true);
        }
        if let Err(e) = self.ownership.check() {
            return self.lifecycle_answer(Err(e)).await;
        }
        // Appends taken before the seal finish first: they are before the marker. A failed
        // add leaves the writer dead; it is recovered before the marker is written.
        if !self.drain().await {
            return (Err(self.ownership.lost_error()), false);
        }
        if !self.segments.healthy {
            if let Err(e) = self.recover().await {
                return self.lifecycle_answer(Err(e)).await;
            }
        }
        // Recovery may have found a marker whose seal did not reach the record.
        if !self.rec.meta.value.sealed {
            if let Err(e) = self.write_end_of_stream().await {
                let go_on = self.on_write_failure(same_kind(&e)).await;
                return (Err(e), go_on);
            }
        }
        (Ok(lookups(&self.rec.meta.value).last_dlsn), true)
    }

    /// Writes the marker into the open segment (a new one when none is open), waits for it,
    /// completes the segment and sets `sealed` in the record by compare-and-set.
    async fn write_end_of_stream(&mut self) -> Result<()> {
        if self.segments.current.is_none() {
            let first_write_time = segment::write_time_floor_ms(&self.rec.meta.value);
            let txid = self.last_txid.unwrap_or(0);
            self.segments
                .open_segment(&mut self.rec, &self.ownership, txid, first_write_time)
                .await?;
        }
        self.send_recordless_entry(record_set::encode_end_of_stream, "end-of-stream marker");
        while !self.entries.is_empty() {
            self.complete_oldest().await?;
        }
        self.segments
            .complete_current(&mut self.rec, &self.ownership)
            .await?;
        self.segments.discard_spare(&self.rec).await;
        let mut meta = self.rec.meta.value.clone();
        meta.sealed = true;
        self.rec
            .cas_stream(meta)
            .await
            .map_err(|e| self.ownership.update_err("seal stream", e))?;
        self.segments.publish(&self.rec);
        tracing::info!(stream = %self.rec.name, seq_no = self.rec.meta.value.segments.last().map(|s| s.seq_no), "stream sealed: end-of-stream marker written");
        Ok(())
    }

    /// The refusal of a write to a sealed stream.
    pub(in crate::stream) fn end_of_stream_error(&self) -> Error {
        Error::EndOfStream {
            stream: self.rec.name.clone(),
        }
    }
}

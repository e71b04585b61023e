//! Pacing of the engine's bulk writes (checkpoint entry-log and index writes, journal
//! pre-creation) so that they never crowd out a journal sync (performance.md, design
//! implication 4: on one shared disk an unthrottled bulk writer pushed a 4 KiB fdatasync from
//! ~3 ms to ~180 ms p99).
//!
//! Two rules, both applied before every bulk chunk of at most [`BULK_CHUNK_BYTES`]:
//! 1. a token bucket bounds the bulk rate to `bytes_per_second` (burst: one second's worth);
//! 2. a chunk is not submitted while a journal write or fdatasync is in flight: it waits for
//!    that one journal operation to finish (only that one, so bulk work cannot starve), which
//!    keeps at most one bulk chunk queued in the device ahead of a journal flush.
//!
//! And one more after each chunk: once `sync_every_bytes` bulk bytes have been written since the
//! last bulk sync, the file just written is synced (admitted like a chunk), so the bulk data
//! reaches the medium in small pieces instead of one large flush at the end of a checkpoint or a
//! journal pre-creation, which a concurrent journal fdatasync would wait behind (the role of
//! BookKeeper's `flushEntrylogBytes`).

use std::cell::Cell;
use std::io as stdio;
use std::time::{Duration, Instant};

use crate::io::StorageFile;
use crate::sync::Notify;

/// Largest bulk write submitted at once, in bytes.
pub const BULK_CHUNK_BYTES: usize = 256 * 1024;

/// Shard-local pacing state shared by the journal writer and the bulk writers.
pub struct Throttle {
    bytes_per_second: u64,
    tokens: Cell<f64>,
    refilled: Cell<Instant>,
    journal_busy: Cell<bool>,
    sync_every_bytes: u64,
    unsynced: Cell<u64>,
    journal_done: Notify,
    waited: Cell<u64>,
}

impl Throttle {
    /// `bytes_per_second == 0` disables the rate limit (the journal-deferral rule still holds);
    /// `sync_every_bytes == 0` disables the intermediate syncs.
    pub fn new(bytes_per_second: u64, sync_every_bytes: u64) -> Self {
        Self {
            bytes_per_second,
            tokens: Cell::new(bytes_per_second as f64),
            refilled: Cell::new(quire_clock::now()),
            journal_busy: Cell::new(false),
            sync_every_bytes,
            unsynced: Cell::new(0),
            journal_done: Notify::default(),
            waited: Cell::new(0),
        }
    }

    /// Counts `bytes` of bulk data written; true when they bring the bytes written since the
    /// last intermediate sync to `sync_every_bytes` (the caller then syncs, see
    /// [`Throttle::admit`], and the count starts again).
    pub fn note_written(&self, bytes: usize) -> bool {
        if self.sync_every_bytes == 0 {
            return false;
        }
        let n = self.unsynced.get() + bytes as u64;
        if n >= self.sync_every_bytes {
            self.unsynced.set(0);
            true
        } else {
            self.unsynced.set(n);
            false
        }
    }

    /// The journal writer calls this around each batch write + sync.
    pub fn journal_busy(&self, busy: bool) {
        self.journal_busy.set(busy);
        if !busy {
            self.journal_done.notify_all();
        }
    }

    /// Times a bulk chunk had to wait (for tokens or for a journal operation).
    pub fn waits(&self) -> u64 {
        self.waited.get()
    }

    /// Waits until a bulk chunk of `bytes` may be submitted.
    pub async fn admit(&self, bytes: usize) {
        let mut waited = false;
        if self.journal_busy.get() {
            waited = true;
            let seen = self.journal_done.generation();
            self.journal_done.changed_since(seen).await;
        }
        if self.bytes_per_second > 0 {
            let rate = self.bytes_per_second as f64;
            loop {
                let now = quire_clock::now();
                let elapsed = now.duration_since(self.refilled.get()).as_secs_f64();
                self.refilled.set(now);
                let tokens = (self.tokens.get() + elapsed * rate).min(rate);
                if tokens >= bytes as f64 || tokens >= rate {
                    self.tokens.set(tokens - bytes as f64);
                    break;
                }
                self.tokens.set(tokens);
                waited = true;
                let missing = bytes as f64 - tokens;
                let wait = Duration::from_secs_f64((missing / rate).max(0.000_1));
                glommio::timer::sleep(wait).await;
            }
        }
        if waited {
            self.waited.set(self.waited.get() + 1);
        }
    }
}

/// Writes `data` at `pos` in chunks of at most [`BULK_CHUNK_BYTES`], each admitted by the
/// throttle (rate limit, and never while a journal write or sync is in flight). On error returns
/// the offset of the failed chunk.
pub(crate) async fn bulk_write<F: StorageFile>(
    file: &F,
    pos: u64,
    data: &[u8],
    throttle: Option<&Throttle>,
) -> Result<(), (u64, stdio::Error)> {
    let mut done = 0usize;
    while done < data.len() {
        let n = (data.len() - done).min(BULK_CHUNK_BYTES);
        if let Some(t) = throttle {
            t.admit(n).await;
        }
        let at = pos + done as u64;
        file.write_at(at, &data[done..done + n])
            .await
            .map_err(|e| (at, e))?;
        done += n;
        if let Some(t) = throttle {
            if t.note_written(n) {
                t.admit(0).await;
                file.fdatasync().await.map_err(|e| {
                    let kind = e.kind();
                    (
                        at,
                        stdio::Error::new(kind, format!("intermediate fdatasync: {e}")),
                    )
                })?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intermediate_syncs_come_every_sync_every_bytes() {
        // Goal: note_written asks for a sync exactly when the bytes since the last one reach
        // the threshold, and never when the threshold is 0.
        // Method: feed 256 KiB chunks against a 1 MiB threshold and a 0 threshold.
        let t = Throttle::new(0, 1 << 20);
        let asks: Vec<bool> = (0..9).map(|_| t.note_written(256 << 10)).collect();
        assert_eq!(
            asks,
            [false, false, false, true, false, false, false, true, false]
        );
        // A chunk larger than the threshold asks at once.
        assert!(t.note_written(3 << 20));
        let off = Throttle::new(0, 0);
        assert!((0..100).all(|_| !off.note_written(1 << 20)));
    }
}

//! The journal writer: group commit (BookKeeper `journalMaxGroupWaitMSec`, default 0 here,
//! and `journalBufferedWritesThreshold`), one write and one fdatasync per batch, rolls to the
//! next file. What a durable batch makes visible (write cache, ledger table, LAC watchers) is
//! not the writer's business: it hands each synced batch to the engine facade as a
//! [`DurableBatch`], which the facade's journal task applies before the adds are answered.

use std::cell::Cell;
use std::io as stdio;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::future;

use super::files::JournalFiles;
use super::{Journal, JournalCursor, JournalPos, Pending};
use crate::files::io_err;
use crate::format::{
    encode_record, pad_to_block, stamp_batch, stamped_len, JournalSalt, Record,
    BATCH_HEADER_PAYLOAD_BYTES, FILE_HEADER_BYTES, RECORD_HEADER_BYTES,
};
use crate::io::{Storage, StorageFile};
use crate::sync::Closed;
use crate::throttle::Throttle;
use crate::{EngineConfig, Error};

/// The next journal file is created in the background once the current one is this full
/// (numerator over 2: half full).
const PRECREATE_AT_FILL_HALVES: u64 = 1;

/// Journal steps slower than this are logged: they hold every add of the shard back, and a
/// client times out an add after 5 s (BookKeeper reports journal sync latency the same way).
const JOURNAL_SLOW_WARN: Duration = Duration::from_millis(500);

fn warn_if_slow(step: &str, journal_id: u64, started: Instant) {
    let took = quire_clock::elapsed(started);
    if took >= JOURNAL_SLOW_WARN {
        tracing::warn!(
            journal = journal_id,
            took_ms = took.as_millis() as u64,
            "slow {step}"
        );
    }
}

/// What one synced batch made durable, handed by the writer to the facade (its outbox): the
/// facade sets the journal's durable end to `pos`, applies `records` in order (ledger table,
/// write cache), notes them finished, completes them and wakes the LAC watchers of their
/// ledgers, all with no await in between, so a checkpoint's snapshot of the write cache always
/// holds exactly the records up to the durable end.
pub(crate) struct DurableBatch {
    /// The journal's durable end after this batch.
    pub pos: JournalPos,
    /// The batch's records, in journal order.
    pub records: Vec<Pending>,
}

/// How long a batch's write and its sync took.
#[derive(Default)]
struct Timings {
    write: Cell<Duration>,
    sync: Cell<Duration>,
}

/// The journal writer's context: the journal (queue, cursor, failure latch), its files (rolls),
/// the bulk-write throttle it pauses while a write or sync is in flight, the engine's closed
/// flag, and its scratch buffer.
pub(crate) struct JournalWriter<S: Storage> {
    journal: Rc<Journal<S::File>>,
    files: JournalFiles<S>,
    throttle: Rc<Throttle>,
    closed: Closed,
    cfg: Rc<EngineConfig>,
    /// One buffer for every batch: its pages stay mapped, so a batch costs neither fresh
    /// allocations nor page faults (a new one was zero-filled by the kernel per batch).
    buf: Vec<u8>,
    /// The batch's records before they are laid out in stamped sectors (version 3), kept for
    /// the same reason.
    logical: Vec<u8>,
}

impl<S: Storage + 'static> JournalWriter<S> {
    /// The writer of `journal`. A file replay sealed is never written again: its successor is
    /// prepared now, so the first batch does not wait for it.
    pub fn new(
        journal: Rc<Journal<S::File>>,
        files: JournalFiles<S>,
        throttle: Rc<Throttle>,
        closed: Closed,
        cfg: Rc<EngineConfig>,
    ) -> Self {
        let sealed = journal
            .cursor
            .borrow()
            .as_ref()
            .filter(|c| c.sealed)
            .map(|c| c.file_id);
        if let Some(id) = sealed {
            files.start_precreate(id + 1);
        }
        Self {
            journal,
            files,
            throttle,
            closed,
            cfg,
            buf: Vec::new(),
            logical: Vec::new(),
        }
    }

    /// Forms batches from the queue and journals them until one becomes durable, which it
    /// returns for the facade to apply; `None` once the engine is closed and the queue drained
    /// (the writer then marks itself stopped). Batches that fail are completed with the error
    /// here.
    pub async fn next_durable(&mut self) -> Option<DurableBatch> {
        loop {
            if !self.wait_for_work().await {
                self.journal.writer_running.set(false);
                self.journal.writer_done.notify();
                return None;
            }
            self.wait_for_group().await;
            let batch = self.take_batch();
            if batch.is_empty() {
                continue;
            }
            if self.journal.failed.borrow().is_some() {
                self.journal.note_finished(batch.len());
                for p in batch {
                    let e = self.journal.check_failed().expect_err("journal failed");
                    p.done.complete(Err(e));
                }
                continue;
            }
            if let Some(durable) = self.write_batch(batch).await {
                return Some(durable);
            }
        }
    }

    /// Step 1: waits until a record is queued (`true`), or the engine is closed with the queue
    /// drained (`false`).
    async fn wait_for_work(&self) -> bool {
        loop {
            if !self.journal.queue.borrow().is_empty() {
                return true;
            }
            if self.closed.get() {
                return false;
            }
            self.journal.writer_signal.wait().await;
        }
    }

    /// Step 2 (group commit): waits until the oldest record is `group_commit_wait_max` old or
    /// `group_commit_bytes_max` bytes are queued.
    async fn wait_for_group(&self) {
        let journal = &self.journal;
        loop {
            if journal.queue_bytes.get() >= self.cfg.group_commit_bytes_max || self.closed.get() {
                break;
            }
            let Some(oldest) = journal.queue.borrow().front().map(|p| p.enqueued) else {
                break;
            };
            let age = quire_clock::elapsed(oldest);
            if age >= self.cfg.group_commit_wait_max {
                break;
            }
            let left = self.cfg.group_commit_wait_max - age;
            future::or(glommio::timer::sleep(left), journal.writer_signal.wait()).await;
        }
    }

    /// Step 3: takes the next batch off the queue (at most `group_commit_bytes_max` bytes, at
    /// least one record) and wakes the adds waiting for queue room.
    fn take_batch(&self) -> Vec<Pending> {
        let journal = &self.journal;
        let mut q = journal.queue.borrow_mut();
        let mut taken = 0usize;
        let mut batch = Vec::new();
        while let Some(p) = q.front() {
            if !batch.is_empty() && taken + p.bytes > self.cfg.group_commit_bytes_max {
                break;
            }
            taken += p.bytes;
            batch.push(q.pop_front().expect("front exists"));
        }
        journal.queue_bytes.set(journal.queue_bytes.get() - taken);
        journal.room.notify_all();
        batch
    }

    /// Step 4: journals one group-commit batch: roll to the next file if it does not fit,
    /// write, fdatasync. Returns the durable batch, or `None` after completing its records
    /// with the failure.
    async fn write_batch(&mut self, batch: Vec<Pending>) -> Option<DurableBatch> {
        let mut cursor = self
            .journal
            .cursor
            .borrow_mut()
            .take()
            .expect("journal cursor is present while the writer runs");
        let first_seq = cursor.next_seq;
        // `Pending::bytes` is each record's encoded size, so the header (which states the
        // batch's size) is written first and the records straight behind it: one copy of each.
        let body_bytes: usize = batch.iter().map(|p| p.bytes).sum();
        let header_bytes = RECORD_HEADER_BYTES + BATCH_HEADER_PAYLOAD_BYTES;
        let batch_bytes = u32::try_from(header_bytes + body_bytes).expect("a batch fits u32 bytes");
        // A version 3 file (the only kind this build writes to) stores 504 bytes per sector.
        let padded = stamped_len(batch_bytes as usize) as u64;

        // Set once this batch's bytes start going to the journal: a failure after that leaves
        // the journal in an unknown state, one before (in the roll) leaves it as it was.
        let journal_touched = Cell::new(false);
        let timings = Timings::default();
        let mut buf = std::mem::take(&mut self.buf);
        let result: Result<(), Error> = async {
            self.roll_if_full(&mut cursor, padded).await?;
            // Encoded once the file is known: records are sealed with its salt.
            encode_batch(
                &mut buf,
                &mut self.logical,
                &batch,
                first_seq,
                batch_bytes,
                &cursor.salt,
            );
            journal_touched.set(true);
            self.write_and_sync(&cursor, &buf, &timings).await
        }
        .await;
        let written = buf.len();
        self.buf = buf;
        match result {
            Ok(()) => Some(self.durable(cursor, batch, first_seq, written, &timings)),
            Err(e) => {
                self.fail_batch(cursor, batch, e, journal_touched.get());
                None
            }
        }
    }

    /// Rolls `cursor` to the next journal file when it is sealed or a batch of `padded` bytes
    /// does not fit the current one (a file holds at least one batch, however big).
    async fn roll_if_full(
        &self,
        cursor: &mut JournalCursor<S::File>,
        padded: u64,
    ) -> Result<(), Error> {
        if !(cursor.sealed
            || (cursor.pos + padded > self.cfg.journal_file_size_bytes
                && cursor.pos > FILE_HEADER_BYTES as u64))
        {
            return Ok(());
        }
        let id = cursor.file_id + 1;
        let started = quire_clock::now();
        let next = self.files.next_journal_file(id).await?;
        warn_if_slow("journal roll (waiting for the next file)", id, started);
        *cursor = JournalCursor {
            file_id: id,
            file: Rc::new(next.file),
            salt: next.salt,
            pos: FILE_HEADER_BYTES as u64,
            next_seq: cursor.next_seq,
            sealed: false,
        };
        Ok(())
    }

    /// Writes `buf` at the cursor and makes it durable (one `O_DSYNC` write when
    /// `journal_dsync_writes`, else a write and an fdatasync), with bulk writes paused
    /// meanwhile; records the times in `timings`.
    async fn write_and_sync(
        &self,
        cursor: &JournalCursor<S::File>,
        buf: &[u8],
        timings: &Timings,
    ) -> Result<(), Error> {
        let path = self.journal.path(cursor.file_id);
        self.throttle.journal_busy(true);
        let started = quire_clock::now();
        let r = async {
            if self.cfg.journal_dsync_writes {
                // One request: the write completes once durable. Its whole time counts as sync
                // time (what the batch waited for durability); the write time stays zero.
                let r = cursor
                    .file
                    .write_durable_at(cursor.pos, buf)
                    .await
                    .map_err(io_err("journal durable write", &path, cursor.pos));
                warn_if_slow("journal durable write", cursor.file_id, started);
                timings.sync.set(quire_clock::elapsed(started));
                return r;
            }
            cursor.file.write_at(cursor.pos, buf).await.map_err(io_err(
                "journal write",
                &path,
                cursor.pos,
            ))?;
            warn_if_slow("journal write", cursor.file_id, started);
            let synced = quire_clock::now();
            timings.write.set(synced - started);
            let r = cursor.file.fdatasync().await.map_err(io_err(
                "journal fdatasync",
                &path,
                cursor.pos,
            ));
            warn_if_slow("journal fdatasync", cursor.file_id, synced);
            timings.sync.set(quire_clock::elapsed(synced));
            r
        }
        .await;
        self.throttle.journal_busy(false);
        r
    }

    /// Step 5 (success): advances the cursor past the `written` bytes, reports the batch to
    /// the observer (before the adds are acknowledged, so that a scrape after an
    /// acknowledgement always counts it), starts pre-creating the next file once this one is
    /// half full, and returns the batch for the facade to apply.
    fn durable(
        &self,
        mut cursor: JournalCursor<S::File>,
        batch: Vec<Pending>,
        first_seq: u64,
        written: usize,
        timings: &Timings,
    ) -> DurableBatch {
        let journal = &self.journal;
        journal.sync_count.set(journal.sync_count.get() + 1);
        cursor.pos += written as u64;
        cursor.next_seq = first_seq + 1 + batch.len() as u64;
        let pos = JournalPos {
            file_id: cursor.file_id,
            offset: cursor.pos,
            next_seq: cursor.next_seq,
        };
        let observer = journal.observer.borrow().clone();
        if let Some(o) = &observer {
            o.batch_durable(&crate::JournalBatch {
                records: batch.len(),
                bytes: written,
                write: timings.write.get(),
                sync: timings.sync.get(),
                queued: journal.queue_len(),
            });
            for p in &batch {
                if matches!(p.record, Record::Add { .. }) {
                    o.add_durable(quire_clock::elapsed(p.enqueued));
                }
            }
        }
        let precreate_at = self.cfg.journal_file_size_bytes * PRECREATE_AT_FILL_HALVES / 2;
        if cursor.pos >= precreate_at {
            self.files.start_precreate(cursor.file_id + 1);
        }
        *journal.cursor.borrow_mut() = Some(cursor);
        DurableBatch {
            pos,
            records: batch,
        }
    }

    /// Step 5 (failure): completes the batch and everything still queued with `e`. A failure
    /// once the batch's bytes went to the journal (`journal_touched`) latches the journal
    /// failed; a failed roll does not.
    fn fail_batch(
        &self,
        cursor: JournalCursor<S::File>,
        batch: Vec<Pending>,
        e: Error,
        journal_touched: bool,
    ) {
        let journal = &self.journal;
        let (op, path, off, kind, msg) = match &e {
            Error::Io {
                op,
                path,
                file_offset_bytes,
                source,
            } => (
                *op,
                path.clone(),
                *file_offset_bytes,
                source.kind(),
                source.to_string(),
            ),
            other => (
                "journal",
                journal.path(cursor.file_id),
                cursor.pos,
                stdio::ErrorKind::Other,
                other.to_string(),
            ),
        };
        if journal_touched {
            tracing::error!("journal failed, every later add fails until restart: {e}");
            *journal.failed.borrow_mut() = Some((kind, e.to_string()));
        } else {
            // The roll to the next file failed (e.g. ENOSPC while pre-writing it): nothing of
            // this batch reached the journal, the current file is intact, and the next batch
            // tries the roll again, so adds work again once space is freed.
            tracing::error!("journal roll failed; the adds queued now fail: {e}");
        }
        *journal.cursor.borrow_mut() = Some(cursor);
        let failure = || Error::Io {
            op,
            path: path.clone(),
            file_offset_bytes: off,
            source: stdio::Error::new(kind, msg.clone()),
        };
        journal.note_finished(batch.len());
        for p in batch {
            p.done.complete(Err(failure()));
        }
        let rest: Vec<Pending> = journal.queue.borrow_mut().drain(..).collect();
        journal.queue_bytes.set(0);
        journal.room.notify_all();
        journal.note_finished(rest.len());
        for p in rest {
            p.done.complete(Err(failure()));
        }
    }
}

/// Encodes `batch` into `buf` (replacing its contents): the batch header stating
/// `batch_bytes`, the records numbered from `first_seq + 1`, sealed with `salt`; in a version 3
/// file laid out in sectors stamped for `first_seq` (built in `logical` first), else padded to
/// a block.
fn encode_batch(
    buf: &mut Vec<u8>,
    logical: &mut Vec<u8>,
    batch: &[Pending],
    first_seq: u64,
    batch_bytes: u32,
    salt: &JournalSalt,
) {
    let stamp_salt = salt.value().filter(|_| salt.sectors_stamped());
    let out = if stamp_salt.is_some() {
        &mut *logical
    } else {
        &mut *buf
    };
    out.clear();
    out.reserve(stamped_len(batch_bytes as usize));
    encode_record(
        out,
        first_seq,
        &Record::BatchHeader {
            record_count: batch.len() as u32,
            batch_bytes,
        },
        salt,
    );
    for (i, p) in batch.iter().enumerate() {
        encode_record(out, first_seq + 1 + i as u64, &p.record, salt);
    }
    assert_eq!(
        out.len(),
        batch_bytes as usize,
        "journal records encode to the sizes they were queued with"
    );
    match stamp_salt {
        Some(v) => stamp_batch(logical, v, first_seq, buf),
        None => pad_to_block(buf),
    }
}

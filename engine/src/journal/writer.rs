//! The journal writer task: group commit (BookKeeper `journalMaxGroupWaitMSec`, default 0 here,
//! and `journalBufferedWritesThreshold`), one write and one fdatasync per batch, rolls to the
//! next file, and what a durable batch makes visible (write cache, ledger table, LAC watchers).

use std::cell::Cell;
use std::io as stdio;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::future;

use super::files::{next_journal_file, start_precreate};
use super::{JournalCursor, JournalPos, Pending};
use crate::engine::Inner;
use crate::files::io_err;
use crate::format::{
    encode_record, pad_to_block, round_up_block, Record, BATCH_HEADER_PAYLOAD_BYTES,
    FILE_HEADER_BYTES, RECORD_HEADER_BYTES,
};
use crate::io::{Storage, StorageFile};
use crate::Error;

/// The next journal file is created in the background once the current one is this full
/// (numerator over 2: half full).
const PRECREATE_AT_FILL_HALVES: u64 = 1;

/// Journal steps slower than this are logged: they hold every add of the shard back, and a
/// client times out an add after 5 s (BookKeeper reports journal sync latency the same way).
const JOURNAL_SLOW_WARN: Duration = Duration::from_millis(500);

fn warn_if_slow(step: &str, journal_id: u64, started: Instant) {
    let took = started.elapsed();
    if took >= JOURNAL_SLOW_WARN {
        tracing::warn!(
            journal = journal_id,
            took_ms = took.as_millis() as u64,
            "slow {step}"
        );
    }
}

/// The writer task: forms batches from the queue until the engine is closed and the queue
/// drained.
pub(crate) async fn writer_loop<S: Storage + 'static>(inner: Rc<Inner<S>>) {
    let journal = &inner.journal;
    // One buffer for every batch: its pages stay mapped, so a batch costs neither fresh
    // allocations nor page faults (a new one was zero-filled by the kernel per batch).
    let mut buf = Vec::new();
    // A file replay sealed is never written again: its successor is prepared now, so the first
    // batch does not wait for it.
    let sealed = journal
        .cursor
        .borrow()
        .as_ref()
        .filter(|c| c.sealed)
        .map(|c| c.file_id);
    if let Some(id) = sealed {
        start_precreate(&inner, id + 1);
    }
    loop {
        // Wait for work, or exit once closed and drained.
        loop {
            if !journal.queue.borrow().is_empty() {
                break;
            }
            if inner.closed.get() {
                journal.writer_running.set(false);
                journal.writer_done.notify();
                return;
            }
            journal.writer_signal.wait().await;
        }
        // Group: wait until the oldest add is `group_commit_wait_max` old or enough bytes queued.
        loop {
            if journal.queue_bytes.get() >= inner.cfg.group_commit_bytes_max || inner.closed.get() {
                break;
            }
            let Some(oldest) = journal.queue.borrow().front().map(|p| p.enqueued) else {
                break;
            };
            let age = oldest.elapsed();
            if age >= inner.cfg.group_commit_wait_max {
                break;
            }
            let left = inner.cfg.group_commit_wait_max - age;
            future::or(glommio::timer::sleep(left), journal.writer_signal.wait()).await;
        }
        let batch: Vec<Pending> = {
            let mut q = journal.queue.borrow_mut();
            let mut taken = 0usize;
            let mut batch = Vec::new();
            while let Some(p) = q.front() {
                if !batch.is_empty() && taken + p.bytes > inner.cfg.group_commit_bytes_max {
                    break;
                }
                taken += p.bytes;
                batch.push(q.pop_front().expect("front exists"));
            }
            journal.queue_bytes.set(journal.queue_bytes.get() - taken);
            journal.room.notify_all();
            batch
        };
        if batch.is_empty() {
            continue;
        }
        if journal.failed.borrow().is_some() {
            journal.note_finished(batch.len());
            for p in batch {
                let e = journal.check_failed().expect_err("journal failed");
                p.done.complete(Err(e));
            }
            continue;
        }
        write_batch(&inner, batch, &mut buf).await;
    }
}

/// Journals one group-commit batch: roll to the next file if it does not fit, write,
/// fdatasync, then complete every add of the batch. `buf` is the writer's scratch buffer
/// (its contents are replaced).
async fn write_batch<S: Storage + 'static>(
    inner: &Rc<Inner<S>>,
    batch: Vec<Pending>,
    buf: &mut Vec<u8>,
) {
    let journal = &inner.journal;
    let mut cursor = journal
        .cursor
        .borrow_mut()
        .take()
        .expect("journal cursor is present while the writer runs");
    let first_seq = cursor.next_seq;
    // `Pending::bytes` is each record's encoded size, so the header (which states the batch's
    // size) is written first and the records straight behind it: one copy of each record.
    let body_bytes: usize = batch.iter().map(|p| p.bytes).sum();
    let header_bytes = RECORD_HEADER_BYTES + BATCH_HEADER_PAYLOAD_BYTES;
    let batch_bytes = u32::try_from(header_bytes + body_bytes).expect("a batch fits u32 bytes");
    let padded = round_up_block(u64::from(batch_bytes));

    // Set once this batch's bytes start going to the journal: a failure after that leaves the
    // journal in an unknown state, one before (in the roll) leaves it as it was.
    let journal_touched = Cell::new(false);
    let (write_took, sync_took) = (Cell::new(Duration::ZERO), Cell::new(Duration::ZERO));
    let result: Result<(), Error> = async {
        if cursor.sealed
            || (cursor.pos + padded > inner.cfg.journal_file_size_bytes
                && cursor.pos > FILE_HEADER_BYTES as u64)
        {
            let id = cursor.file_id + 1;
            let started = Instant::now();
            let next = next_journal_file(inner, id).await?;
            warn_if_slow("journal roll (waiting for the next file)", id, started);
            cursor = JournalCursor {
                file_id: id,
                file: Rc::new(next.file),
                salt: next.salt,
                pos: FILE_HEADER_BYTES as u64,
                next_seq: cursor.next_seq,
                sealed: false,
            };
        }
        // Encoded once the file is known: records are sealed with its salt.
        buf.clear();
        buf.reserve(padded as usize);
        encode_record(
            buf,
            first_seq,
            &Record::BatchHeader {
                record_count: batch.len() as u32,
                batch_bytes,
            },
            &cursor.salt,
        );
        for (i, p) in batch.iter().enumerate() {
            encode_record(buf, first_seq + 1 + i as u64, &p.record, &cursor.salt);
        }
        assert_eq!(
            buf.len(),
            batch_bytes as usize,
            "journal records encode to the sizes they were queued with"
        );
        pad_to_block(buf);
        let buf = &buf[..];
        let path = journal.path(cursor.file_id);
        journal_touched.set(true);
        inner.throttle.journal_busy(true);
        let started = Instant::now();
        let r = async {
            if inner.cfg.journal_dsync_writes {
                // One request: the write completes once durable. Its whole time counts as sync
                // time (what the batch waited for durability); the write time stays zero.
                let r = cursor
                    .file
                    .write_durable_at(cursor.pos, buf)
                    .await
                    .map_err(io_err("journal durable write", &path, cursor.pos));
                warn_if_slow("journal durable write", cursor.file_id, started);
                sync_took.set(started.elapsed());
                return r;
            }
            cursor.file.write_at(cursor.pos, buf).await.map_err(io_err(
                "journal write",
                &path,
                cursor.pos,
            ))?;
            warn_if_slow("journal write", cursor.file_id, started);
            let synced = Instant::now();
            write_took.set(synced - started);
            let r = cursor.file.fdatasync().await.map_err(io_err(
                "journal fdatasync",
                &path,
                cursor.pos,
            ));
            warn_if_slow("journal fdatasync", cursor.file_id, synced);
            sync_took.set(synced.elapsed());
            r
        }
        .await;
        inner.throttle.journal_busy(false);
        r
    }
    .await;
    match result {
        Ok(()) => {
            journal.sync_count.set(journal.sync_count.get() + 1);
            cursor.pos += buf.len() as u64;
            cursor.next_seq = first_seq + 1 + batch.len() as u64;
            let durable = JournalPos {
                file_id: cursor.file_id,
                offset: cursor.pos,
                next_seq: cursor.next_seq,
            };
            // Reported before the adds are acknowledged, so that a scrape after an
            // acknowledgement always counts it.
            let observer = inner.journal_observer.borrow().clone();
            if let Some(o) = &observer {
                o.batch_durable(&crate::JournalBatch {
                    records: batch.len(),
                    bytes: buf.len(),
                    write: write_took.get(),
                    sync: sync_took.get(),
                    queued: journal.queue_len(),
                });
                for p in &batch {
                    if matches!(p.record, Record::Add { .. }) {
                        o.add_durable(p.enqueued.elapsed());
                    }
                }
            }
            let mut dones = Vec::with_capacity(batch.len());
            let mut touched: Vec<u64> = Vec::new();
            journal.durable.set(durable);
            for p in batch {
                let ledger = match &p.record {
                    Record::Add { ledger, .. } | Record::Fence { ledger, .. } => *ledger,
                    Record::BatchHeader { .. } => {
                        unreachable!("batch headers are not queued")
                    }
                };
                if touched.last() != Some(&ledger) {
                    touched.push(ledger);
                }
                inner.apply_durable(p.record);
                dones.push(p.done);
            }
            if inner.write_cache.over_bound() {
                inner.checkpointer.request();
            }
            let precreate_at = inner.cfg.journal_file_size_bytes * PRECREATE_AT_FILL_HALVES / 2;
            if cursor.pos >= precreate_at {
                start_precreate(inner, cursor.file_id + 1);
            }
            *journal.cursor.borrow_mut() = Some(cursor);
            journal.note_finished(dones.len());
            for d in dones {
                d.complete(Ok(()));
            }
            touched.sort_unstable();
            touched.dedup();
            if !inner.lac_watchers.is_empty() {
                for ledger in touched {
                    inner.lac_watchers.wake(ledger);
                }
            }
        }
        Err(e) => {
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
            if journal_touched.get() {
                tracing::error!("journal failed, every later add fails until restart: {e}");
                *journal.failed.borrow_mut() = Some((kind, e.to_string()));
            } else {
                // The roll to the next file failed (e.g. ENOSPC while pre-writing it): nothing
                // of this batch reached the journal, the current file is intact, and the next
                // batch tries the roll again, so adds work again once space is freed.
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
}

//! The journal: the queue of adds and fences waiting for group commit, the writer's cursor, the
//! durable end, the failure latch and the journal files (docs/format/journal.md; BookKeeper's
//! `Journal` with `journalMaxGroupWaitMSec` / `journalBufferedWritesThreshold` group commit,
//! file rolls with pre-allocation or reuse, and replay from the last mark); `writer` runs the
//! group commit, `files` creates, reuses, pre-creates, lists and retires journal files, `replay`
//! rebuilds the in-memory state from the files on open.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io as stdio;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::TaskQueueHandle;

use crate::files::journal_name;
use crate::format::{
    JournalSalt, Record, ADD_FIXED_BYTES, FENCE_PAYLOAD_BYTES, RECORD_HEADER_BYTES,
};
use crate::sync::{Completion, Notify, Signal};
use crate::{Error, JournalObserver};

pub(crate) mod files;
pub(crate) mod replay;
pub(crate) mod replay_crash;
pub(crate) mod writer;

/// End of the durable journal: where the next batch goes and its first sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JournalPos {
    pub file_id: u64,
    pub offset: u64,
    pub next_seq: u64,
}

/// The file the writer appends to, and where.
pub(crate) struct JournalCursor<F> {
    pub file_id: u64,
    pub file: Rc<F>,
    /// The salt of this use of the file (from its header): what its records are sealed with.
    pub salt: JournalSalt,
    pub pos: u64,
    pub next_seq: u64,
    /// No batch is written to this file again: the next batch rolls to a new file. Set by
    /// replay when the file's end holds a dropped batch (so no later batch can be completed
    /// by its records) or the file is version 1 or 2 (the writer writes version 3 only).
    pub sealed: bool,
}

/// A journal file ready for its first batch, and the salt its header holds.
pub(crate) struct NewJournalFile<F> {
    pub file: F,
    pub salt: JournalSalt,
}

impl<F> JournalCursor<F> {
    fn position(&self) -> JournalPos {
        JournalPos {
            file_id: self.file_id,
            offset: self.pos,
            next_seq: self.next_seq,
        }
    }
}

/// A record waiting for its batch, and who waits for it to be durable.
pub(crate) struct Pending {
    pub record: Record,
    pub bytes: usize,
    pub enqueued: Instant,
    pub done: Rc<Completion<Result<(), Error>>>,
}

/// A journal file being created in the background: its id and the task creating it.
type Precreate<F> = (u64, glommio::Task<Result<NewJournalFile<F>, Error>>);

/// The journal of one shard.
pub(crate) struct Journal<F> {
    dir: PathBuf,
    queue: RefCell<VecDeque<Pending>>,
    /// Record bytes in `queue`.
    queue_bytes: Cell<usize>,
    /// Owned by the writer task while it runs (taken out across awaits).
    cursor: RefCell<Option<JournalCursor<F>>>,
    /// What the last sync made durable; the write cache holds exactly the records up to here.
    durable: Cell<JournalPos>,
    /// Set once a journal write or sync failed; the journal is then in an unknown state and
    /// every later add fails (restart and replay to recover). The kind of the first error (e.g.
    /// `StorageFull` for ENOSPC) and its message, both repeated in every later error.
    failed: RefCell<Option<(stdio::ErrorKind, String)>>,
    writer_signal: Signal,
    /// Notified whenever the writer takes records off the queue: adds waiting for room
    /// ([`Journal::wait_for_room`]) look again.
    pub(crate) room: Notify,
    writer_done: Signal,
    writer_running: Cell<bool>,
    sync_count: Cell<u64>,
    /// The background creation of the next journal file: (its id, the task).
    precreate: RefCell<Option<Precreate<F>>>,
    /// Task queue of journal pre-creation (the engine's background queue).
    background_tq: TaskQueueHandle,
    /// Ids of fully checkpointed journal files kept for reuse, oldest first (at most
    /// `EngineConfig::journal_reuse_files`). An id taken out of it belongs to whoever took it,
    /// so a reuse and a removal never race for one file.
    pub(crate) reusable: RefCell<VecDeque<u64>>,
    /// Records queued since open.
    submitted: Cell<u64>,
    /// Records the writer completed since open, durable or failed; records complete in queue
    /// order, so every record among the first `finished` queued is complete.
    finished: Cell<u64>,
    /// Notified whenever `finished` grows.
    finished_notify: Notify,
    /// Metrics hook the writer reports every durable batch and add to
    /// (`Engine::set_journal_observer`).
    observer: RefCell<Option<Rc<dyn JournalObserver>>>,
}

impl<F> Journal<F> {
    /// The journal in `dir`, continuing at `cursor` (where replay ended), with the checkpointed
    /// files `reusable` (ascending ids) kept for reuse.
    pub fn new(
        dir: PathBuf,
        cursor: JournalCursor<F>,
        background_tq: TaskQueueHandle,
        reusable: Vec<u64>,
    ) -> Self {
        Self {
            dir,
            queue: RefCell::new(VecDeque::new()),
            queue_bytes: Cell::new(0),
            durable: Cell::new(cursor.position()),
            cursor: RefCell::new(Some(cursor)),
            failed: RefCell::new(None),
            writer_signal: Signal::default(),
            room: Notify::default(),
            writer_done: Signal::default(),
            writer_running: Cell::new(false),
            sync_count: Cell::new(0),
            precreate: RefCell::new(None),
            background_tq,
            reusable: RefCell::new(reusable.into()),
            submitted: Cell::new(0),
            finished: Cell::new(0),
            finished_notify: Notify::default(),
            observer: RefCell::new(None),
        }
    }

    /// Sets the hook the writer reports durable batches and adds to (replacing an earlier one).
    pub fn set_observer(&self, observer: Rc<dyn JournalObserver>) {
        *self.observer.borrow_mut() = Some(observer);
    }

    /// Moves the durable end to `pos`, which a sync just reached (the facade, as it applies
    /// the batch: the write cache holds exactly the records up to the durable end).
    pub fn set_durable(&self, pos: JournalPos) {
        self.durable.set(pos);
    }

    /// Path of journal file `id`.
    pub fn path(&self, id: u64) -> PathBuf {
        self.dir.join(journal_name(id))
    }

    /// What the last sync made durable.
    pub fn durable(&self) -> JournalPos {
        self.durable.get()
    }

    /// Records queued and not yet taken by the writer.
    pub fn queue_len(&self) -> usize {
        self.queue.borrow().len()
    }

    /// Number of journal fdatasyncs since open.
    pub fn sync_count(&self) -> u64 {
        self.sync_count.get()
    }

    /// `Err` (an `Io` repeating the first failure) once a journal write or sync failed.
    pub fn check_failed(&self) -> Result<(), Error> {
        match &*self.failed.borrow() {
            None => Ok(()),
            Some((kind, msg)) => {
                let durable = self.durable.get();
                Err(Error::Io {
                    op: "journal write (journal failed earlier)",
                    path: self.path(durable.file_id),
                    file_offset_bytes: durable.offset,
                    source: stdio::Error::new(*kind, msg.clone()),
                })
            }
        }
    }

    /// Records queued since open (the next one queued is number `submitted() + 1`).
    pub fn submitted(&self) -> u64 {
        self.submitted.get()
    }

    /// Notes that the writer completed `n` more records (in queue order), durable or failed,
    /// and wakes [`Journal::wait_finished`].
    pub fn note_finished(&self, n: usize) {
        self.finished.set(self.finished.get() + n as u64);
        assert!(
            self.finished.get() <= self.submitted.get(),
            "no record completes before it is queued"
        );
        self.finished_notify.notify_all();
    }

    /// Resolves once the writer completed the first `count` records queued since open (each
    /// durable and applied, or failed). The writer drains its queue even after a close, so
    /// this always resolves.
    pub async fn wait_finished(&self, count: u64) {
        loop {
            let seen = self.finished_notify.generation();
            if self.finished.get() >= count {
                return;
            }
            self.finished_notify.changed_since(seen).await;
        }
    }

    /// Whether the writer completed the first `count` records queued since open.
    pub fn has_finished(&self, count: u64) -> bool {
        self.finished.get() >= count
    }

    /// Record bytes queued and not yet taken by the writer.
    pub fn queue_bytes(&self) -> usize {
        self.queue_bytes.get()
    }

    /// Back-pressure on adds (`EngineConfig::journal_queue_bytes_max`): resolves once at most
    /// `bytes_max` record bytes are queued, waiting for the writer to take batches.
    ///
    /// # Errors
    /// `JournalQueueFull` when the queue is still above `bytes_max` after `wait_max`.
    /// # Cancellation
    /// Dropping the future only gives up the wait.
    pub async fn wait_for_room(&self, bytes_max: usize, wait_max: Duration) -> Result<(), Error> {
        let started = quire_clock::now();
        loop {
            let seen = self.room.generation();
            let queued = self.queue_bytes.get();
            if queued <= bytes_max {
                return Ok(());
            }
            let waited = quire_clock::elapsed(started);
            let Some(left) = wait_max.checked_sub(waited) else {
                return Err(Error::JournalQueueFull {
                    queued_bytes: queued,
                    waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                });
            };
            futures_lite::future::or(self.room.changed_since(seen), async {
                glommio::timer::sleep(left).await;
            })
            .await;
        }
    }

    /// Queues `record` for the next group commit and resolves once it is durable (or failed).
    pub async fn submit(&self, record: Record) -> Result<(), Error> {
        let bytes = match &record {
            Record::Add { data, .. } => RECORD_HEADER_BYTES + ADD_FIXED_BYTES + data.len(),
            _ => RECORD_HEADER_BYTES + FENCE_PAYLOAD_BYTES,
        };
        let done = Completion::new();
        self.queue.borrow_mut().push_back(Pending {
            record,
            bytes,
            enqueued: quire_clock::now(),
            done: done.clone(),
        });
        self.queue_bytes.set(self.queue_bytes.get() + bytes);
        self.submitted.set(self.submitted.get() + 1);
        self.writer_signal.notify();
        done.wait().await
    }

    /// Marks the writer task as running (before it is spawned).
    pub fn writer_started(&self) {
        self.writer_running.set(true);
    }

    /// Wakes the writer (so that it sees a close).
    pub fn wake_writer(&self) {
        self.writer_signal.notify();
    }

    /// Waits until the writer (woken by [`Journal::wake_writer`] after a close) drained the
    /// queue and exited; then waits for a pre-creation in progress (a cancelled one would only
    /// leave a temp file, which the next open deletes; finishing it keeps the directory tidy).
    pub async fn stop(&self) {
        while self.writer_running.get() {
            self.writer_done.wait().await;
        }
        let pre = self.precreate.borrow_mut().take();
        if let Some((id, task)) = pre {
            if let Err(e) = task.await {
                tracing::warn!("background creation of journal {id} failed: {e}");
            }
        }
    }
}

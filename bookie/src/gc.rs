//! Garbage collection on each shard (BookKeeper's `GarbageCollectorThread` with
//! `ScanAndCompareGarbageCollector`): every `gc_interval` the shard takes its local ledger set,
//! asks the metadata side which of those ledgers are deleted, and runs the engine's GC with the
//! answer ([`quire_engine::Engine::collect_garbage`]: tombstones, entry-log deletion,
//! scheduled compaction).
//!
//! The bookie does not depend on the metadata store: the process that starts it (tools) holds
//! the receiving end of [`deleted_ledgers_channel`] and answers each [`DeletedLedgersQuery`].
//! Two safety rules hold on this side whatever the answer:
//! * a ledger is a candidate only if the shard already held it at the previous run, so a ledger
//!   whose metadata was just created (and that a lagging metadata replica may not show yet) is
//!   never asked about;
//! * an answer that does not come within [`GC_ANSWER_WAIT_MAX`], or names a ledger that was not
//!   asked about, deletes nothing (it is dropped, or filtered to the candidates).

use std::collections::HashSet;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::future;
use quire_engine::Engine;

/// Default time between GC runs (BookKeeper `gcWaitTime`, 600 000 ms).
pub const GC_INTERVAL_DEFAULT: Duration = Duration::from_secs(600);
/// Longest wait for the metadata side's answer; past it the run deletes no ledger.
pub const GC_ANSWER_WAIT_MAX: Duration = Duration::from_secs(60);

/// One question of a shard's GC: which of `candidates` no longer exist in the metadata store.
#[derive(Debug)]
pub struct DeletedLedgersQuery {
    /// Ledger ids held by the shard since at least its previous GC run, sorted.
    pub candidates: Vec<u64>,
    reply: flume::Sender<Vec<u64>>,
}

impl DeletedLedgersQuery {
    /// Answers with the candidates whose metadata is definitely gone (the store said "no such
    /// ledger"). A failed, timed-out or partial read must leave a ledger out: only ledgers
    /// listed here are deleted. Dropping the query without answering deletes nothing.
    pub fn answer(self, deleted: Vec<u64>) {
        // The shard may have given up waiting; then nothing is deleted.
        let _ = self.reply.send(deleted);
    }
}

/// The sending end, given to the bookie in [`crate::BookieConfig::gc_deleted_ledgers`].
#[derive(Debug, Clone)]
pub struct DeletedLedgers(flume::Sender<DeletedLedgersQuery>);

/// The receiving end, kept by whoever can read the metadata store.
#[derive(Debug)]
pub struct DeletedLedgersQueries(flume::Receiver<DeletedLedgersQuery>);

impl DeletedLedgersQueries {
    /// The next question; `None` once every bookie holding the sending end has stopped.
    pub async fn next(&self) -> Option<DeletedLedgersQuery> {
        self.0.recv_async().await.ok()
    }
}

/// A channel for GC questions: the sender goes into the bookie configuration, the receiver to
/// the metadata side. Any runtime may receive (flume).
pub fn deleted_ledgers_channel() -> (DeletedLedgers, DeletedLedgersQueries) {
    let (tx, rx) = flume::bounded(16);
    (DeletedLedgers(tx), DeletedLedgersQueries(rx))
}

impl DeletedLedgers {
    /// Asks which of `candidates` are deleted and waits for the answer, on any runtime;
    /// `None` if the receiving end is gone or dropped the question.
    pub async fn query(&self, candidates: Vec<u64>) -> Option<Vec<u64>> {
        let (reply, answer) = flume::bounded(1);
        let query = DeletedLedgersQuery { candidates, reply };
        self.0.send_async(query).await.ok()?;
        answer.recv_async().await.ok()
    }
}

/// Asks which of `candidates` are deleted; an empty answer on any failure.
async fn ask(metadata: &DeletedLedgers, candidates: Vec<u64>) -> Vec<u64> {
    let asked: HashSet<u64> = candidates.iter().copied().collect();
    let asked_and_answered = metadata.query(candidates);
    let timed_out = async {
        glommio::timer::sleep(GC_ANSWER_WAIT_MAX).await;
        None
    };
    match future::or(asked_and_answered, timed_out).await {
        Some(deleted) => deleted.into_iter().filter(|l| asked.contains(l)).collect(),
        None => {
            tracing::warn!("no answer from the metadata side: this GC run deletes no ledger");
            Vec::new()
        }
    }
}

/// The GC loop of one shard: a run every `interval` until cancelled.
pub(crate) async fn gc_loop(
    engine: Rc<Engine>,
    shard: usize,
    interval: Duration,
    metadata: Option<DeletedLedgers>,
) {
    let mut held_before: HashSet<u64> = HashSet::new();
    loop {
        glommio::timer::sleep(interval).await;
        let held = engine.ledger_ids();
        let candidates: Vec<u64> = held
            .iter()
            .copied()
            .filter(|l| held_before.contains(l))
            .collect();
        held_before = held.into_iter().collect();
        let deleted = match (&metadata, candidates.is_empty()) {
            (Some(m), false) => ask(m, candidates).await,
            _ => Vec::new(),
        };
        match engine.collect_garbage(&deleted).await {
            Ok(run) => tracing::info!(
                shard,
                ledgers_deleted = run.ledgers_deleted,
                entry_logs_deleted = run.entry_logs_deleted,
                entry_logs_compacted = run.entry_logs_compacted,
                bytes_reclaimed = run.bytes_reclaimed,
                "garbage collection run"
            ),
            Err(quire_engine::Error::Closed) => return,
            Err(e) => tracing::error!(shard, error = %e, "garbage collection run failed"),
        }
    }
}

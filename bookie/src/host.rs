//! Executor threads shared by the shards of several bookies in one process.
//!
//! A bookie normally gives each shard its own glommio executor thread, one per core. The
//! sandbox runs several bookies in one process: one thread per shard of every bookie would put
//! more executors than cores on the host, and each of them wakes for every replica of every
//! add. A [`ShardHost`] keeps one executor per core (the shard-per-core rule of the design) and
//! places the shards of every bookie started with it on those executors, round robin, so one
//! wake-up serves the replicas that arrive together and one `io_uring_enter` submits their
//! journal writes (perf/README.md, "Shards of several bookies on shared executors").
//!
//! A shard on a host behaves as on its own thread: it has its own engine, task queues,
//! listener and control channels. Differences: its thread is not joined when its bookie stops
//! (the host's threads end when the last [`ShardHost`] handle is dropped and every shard placed
//! on it has finished), and a panic in one shard ends every shard on the same executor.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use glommio::{ExecutorJoinHandle, LocalExecutorBuilder, Placement};

/// A shard's main future, built on the executor that runs it (it is not `Send`).
pub(crate) type ShardJob = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// A handle on a set of executor threads that run shards of any number of bookies. Cheap to
/// clone; the threads stop once every handle is dropped and their shards have finished.
#[derive(Clone)]
pub struct ShardHost {
    inner: Arc<HostInner>,
}

struct HostInner {
    senders: Vec<flume::Sender<ShardJob>>,
    next: AtomicUsize,
    threads: Mutex<Vec<ExecutorJoinHandle<()>>>,
}

impl std::fmt::Debug for ShardHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardHost")
            .field("executors", &self.inner.senders.len())
            .finish()
    }
}

impl ShardHost {
    /// Starts `executors` glommio executor threads named `quire-host-{i}`, each with
    /// `io_memory_bytes` of DMA memory; executor `i` is pinned to `cpu_set[i % len]` when
    /// `cpu_set` is not empty, else unpinned.
    ///
    /// # Errors
    /// `executors` is 0, or an executor cannot start (the message says which).
    pub fn start(
        executors: usize,
        cpu_set: &[usize],
        io_memory_bytes: usize,
    ) -> Result<ShardHost, String> {
        if executors == 0 {
            return Err("a shard host needs at least one executor".into());
        }
        let mut senders = Vec::with_capacity(executors);
        let mut threads = Vec::with_capacity(executors);
        for i in 0..executors {
            let (tx, rx) = flume::unbounded::<ShardJob>();
            let placement = match cpu_set {
                [] => Placement::Unbound,
                cpus => Placement::Fixed(cpus[i % cpus.len()]),
            };
            let spawned = LocalExecutorBuilder::new(placement)
                .name(&format!("quire-host-{i}"))
                .io_memory(io_memory_bytes)
                .spawn(move || async move {
                    let mut shards = Vec::new();
                    while let Ok(job) = rx.recv_async().await {
                        shards.push(glommio::spawn_local(job()));
                    }
                    // Every handle is gone: wait for the shards placed here to finish.
                    for s in shards {
                        s.await;
                    }
                });
            match spawned {
                Ok(t) => {
                    senders.push(tx);
                    threads.push(t);
                }
                Err(e) => {
                    drop(senders);
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(format!("cannot start shard host executor {i}: {e}"));
                }
            }
        }
        Ok(ShardHost {
            inner: Arc::new(HostInner {
                senders,
                next: AtomicUsize::new(0),
                threads: Mutex::new(threads),
            }),
        })
    }

    /// Number of executor threads.
    pub fn executors(&self) -> usize {
        self.inner.senders.len()
    }

    /// Runs `job` on the next executor, round robin over every shard ever placed.
    pub(crate) fn place(&self, job: ShardJob) -> Result<(), String> {
        let i = self.inner.next.fetch_add(1, Ordering::Relaxed) % self.inner.senders.len();
        self.inner.senders[i]
            .send(job)
            .map_err(|_| format!("shard host executor {i} has exited"))
    }
}

impl Drop for HostInner {
    fn drop(&mut self) {
        self.senders.clear();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for (i, t) in threads.into_iter().enumerate() {
            if let Err(e) = t.join() {
                tracing::error!(executor = i, error = %e, "shard host executor failed");
            }
        }
    }
}

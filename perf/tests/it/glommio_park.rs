//! Regression tests for the glommio executor that parked with runnable tasks (the lost journal
//! I/O of perf/README.md, "A shard that waited on its journal writes"; the patch is listed in
//! vendor/glommio/QUIRE-PATCHES.md).
//!
//! glommio 0.9.0 parked its thread whenever the preemption signal (a completion in the latency
//! ring) arrived after its I/O poll and before it ran the first task queue, even though task
//! queues were active. With a preemption timer of a microsecond that signal is nearly always
//! there by then, so the unpatched executor hangs within a few iterations; each test runs the
//! executor on its own thread and fails if it has not finished within a minute (a hang guard,
//! not a timing check: the work itself takes milliseconds).

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use glommio::io::OpenOptions;
use glommio::{LocalExecutorBuilder, Placement};

const HANG_GUARD: Duration = Duration::from_secs(60);

/// Runs `body` on a fresh thread and fails the test if it does not finish within [`HANG_GUARD`].
fn must_finish(what: &str, body: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let worker = thread::spawn(move || {
        body();
        let _ = tx.send(());
    });
    match rx.recv_timeout(HANG_GUARD) {
        Ok(()) => worker.join().expect("worker panicked"),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: the executor parked with runnable work and never woke up")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            let _ = worker.join();
            panic!("{what}: the worker panicked");
        }
    }
}

#[test]
fn an_executor_preempted_before_its_first_queue_still_runs_its_tasks() {
    // Goal: the executor's main task runs even when every loop starts with a preemption
    // signal pending. Method: 1,000 trivial `run`s with a 1 µs preemption timer; each one needs
    // the executor to run its (runnable) main task after the timer has fired.
    must_finish("trivial runs", || {
        let ex = LocalExecutorBuilder::new(Placement::Unbound)
            .preempt_timer(Duration::from_micros(1))
            .io_memory(1 << 20)
            .make()
            .expect("executor");
        for i in 0..1_000u32 {
            assert_eq!(ex.run(async move { i }), i);
        }
    });
}

#[test]
fn a_completed_disk_write_wakes_a_task_that_runs() {
    // Goal: a task whose O_DIRECT write (and fdatasync) completed is run, not left in an
    // active task queue while the executor sleeps. Method: 256 sequential 4 KiB writes with a
    // sync every 16, each awaited, on an executor with a 1 µs preemption timer; then the file
    // is read back to check that every write landed.
    must_finish("disk writes", || {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).expect("tempdir");
        let path = dir.path().join("writes");
        // A non-empty file first: glommio's iopoll probe misjudges a device whose first DMA
        // file is empty (reference/infra.md §3).
        std::fs::write(dir.path().join("probe"), vec![1u8; 4096]).expect("probe");
        let probe = dir.path().join("probe");
        let ex = LocalExecutorBuilder::new(Placement::Unbound)
            .preempt_timer(Duration::from_micros(1))
            .io_memory(1 << 20)
            .make()
            .expect("executor");
        ex.run(async move {
            glommio::io::DmaFile::open(&probe)
                .await
                .expect("open probe")
                .close()
                .await
                .expect("close probe");
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .dma_open(&path)
                .await
                .expect("open");
            for i in 0..256u64 {
                let mut buf = f.alloc_dma_buffer(4096);
                buf.as_bytes_mut().fill(i as u8);
                assert_eq!(f.write_at(buf, i * 4096).await.expect("write"), 4096);
                if i % 16 == 15 {
                    f.fdatasync().await.expect("fdatasync");
                }
            }
            f.close().await.expect("close");
        });
        let data = std::fs::read(dir.path().join("writes")).expect("read back");
        assert_eq!(data.len(), 256 * 4096);
        for (i, block) in data.chunks(4096).enumerate() {
            assert!(block.iter().all(|&b| b == i as u8), "block {i} wrong");
        }
    });
}

//! A runtime for catch-up reads at a lower OS priority.
//!
//! A reader working through a backlog (a proxy's catch-up reads from bookies, a scanning
//! client such as quire-perf's isolation scanner) should take the cores only when tail writes
//! do not need them. It lives here, beside the client, so that a client process gets it
//! without the server crate; the proxy server uses the same function.

/// How much lower than a process's own threads its catch-up read threads run: nice +10
/// gives a thread about a tenth of the CPU weight of a nice-0 thread under Linux's scheduler,
/// so a scan slows down when tail writes need the cores and runs at full speed when they do
/// not.
pub const CATCH_UP_READ_NICE: i32 = 10;

/// Builds a runtime for catch-up reads: the proxy server's
/// (`quire_proxy::ServerConfig::catch_up_read_runtime`, also the ledger client's read
/// connections, `quire_ledger::BookKeeper::with_read_runtime`) or a scanning client's.
/// `threads` workers (at least 1), each of which lowers its own scheduling priority by `nice`
/// when it starts (Linux keeps the nice value per thread). A thread that cannot lower it logs a warning and runs at the normal
/// priority.
///
/// # Errors
/// The runtime's threads could not be started.
pub fn catch_up_read_runtime(
    threads: usize,
    nice: i32,
) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("quire-catch-up-read")
        .on_thread_start(move || {
            // SAFETY: gettid and setpriority take no pointers; they change only this thread.
            let rc = unsafe {
                let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                libc::setpriority(libc::PRIO_PROCESS, tid, nice)
            };
            if rc != 0 {
                tracing::warn!(
                    nice,
                    error = %std::io::Error::last_os_error(),
                    "cannot lower the priority of a catch-up read thread"
                );
            }
        })
        .enable_all()
        .build()
}

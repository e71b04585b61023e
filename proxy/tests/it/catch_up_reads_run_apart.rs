//! Goal: reads that must fetch from the bookies (catch-up reads) are told apart from tail reads,
//! run on the lower-priority catch-up read runtime over their own bookie connections, and still
//! return every record once and in order.
//! Method: three real bookies behind a proxy whose tail cache holds only 16 KiB; write about
//! 300 KiB so the first entries leave the cache; check the classification at the head, at the
//! tail and for an unknown stream; check the catch-up runtime has no task before the first
//! catch-up read and holds the read connections' tasks after it; read everything back through
//! the server from the head and compare; check the runtime's thread runs at the lowered
//! priority (the nice value in /proc).

use crate::common;

use std::time::Duration;

use quire_client::{ProxyClient, ReadPosition};
use quire_ledger::BookKeeper;
use quire_proxy::{catch_up_read_runtime, ProxyServer, ServerConfig, StreamConfig, StreamManager};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_reads_run_on_their_own_runtime_and_connections() {
    let c = common::cluster().await;
    let read_rt = catch_up_read_runtime(1, 7).unwrap();
    let bk = BookKeeper::with_read_runtime(
        c.store.clone(),
        quire_ledger::ClientConfig::default(),
        read_rt.handle().clone(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = StreamConfig {
        owner_address: listener.local_addr().unwrap().to_string(),
        tail_cache_bytes_max: 16 * 1024,
        ..common::small_config()
    };
    let streams = StreamManager::new(c.store.clone(), bk, config);
    let server = ProxyServer::start(
        listener,
        streams.clone(),
        ServerConfig {
            catch_up_read_runtime: Some(read_rt.handle().clone()),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let client = ProxyClient::connect(server.local_addr()).await.unwrap();

    let mut written = Vec::new();
    let mut last = None;
    for i in 0..1000u64 {
        let w = client
            .write("scan", vec![(i, common::payload(i))], true)
            .await
            .unwrap();
        written.push(common::payload(i));
        last = Some(w.last_dlsn);
    }
    let last = last.unwrap();

    // Only the tail cache and the stream task exist so far: nothing runs on the read runtime.
    assert_eq!(read_rt.metrics().num_alive_tasks(), 0);
    assert!(streams.is_catch_up_read("scan", ReadPosition::Head));
    // The last record's entry is still cached: a reader there is a tail reader.
    assert!(!streams.is_catch_up_read("scan", ReadPosition::Dlsn(last)));
    assert!(!streams.is_catch_up_read("no-such-stream", ReadPosition::Head));

    let mut got = Vec::new();
    let mut pos = ReadPosition::Head;
    while got.len() < written.len() {
        let b = client
            .read("scan", pos, 100, 64 * 1024, Duration::ZERO)
            .await
            .unwrap();
        assert!(!b.records.is_empty(), "read stopped at {pos:?}");
        for (i, (_, txid, payload)) in b.records.into_iter().enumerate() {
            assert_eq!(txid, got.len() as u64, "record {i} of a batch out of order");
            got.push(payload);
        }
        pos = b.next;
    }
    assert_eq!(got, written);
    // The read connections (a reader and a writer task per bookie) live on the read runtime.
    let alive = read_rt.metrics().num_alive_tasks();
    assert!(
        alive >= 2,
        "expected the read lane's connection tasks on the catch-up runtime, found {alive} tasks"
    );

    let nice = catch_up_thread_nice().expect("a quire-catch-up- thread in /proc/self/task");
    assert_eq!(nice, 7);
    read_rt.shutdown_background();
}

/// The nice value of this process's first thread named `quire-catch-up-*` (field 19 of
/// `/proc/self/task/<tid>/stat`).
fn catch_up_thread_nice() -> Option<i64> {
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path();
        let comm = std::fs::read_to_string(path.join("comm")).ok()?;
        if !comm.starts_with("quire-catch-up") {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("stat")).ok()?;
        // Fields after the ")" that closes the command name start at field 3.
        let rest = &stat[stat.rfind(')')? + 2..];
        return rest.split(' ').nth(19 - 3)?.parse().ok();
    }
    None
}

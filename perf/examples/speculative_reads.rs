//! Speculative reads benchmark (issue 30 item 3): read latency with one slow replica, with the
//! ledger client's speculative reads on (its defaults: 50 ms floor, adaptive, 2 s ceiling)
//! against off (timeout 0), alternated in one run.
//!
//! Set-up: three real bookies in this process (quire-testkit, one shard each, O_DIRECT
//! journals and entry logs under QUIRE_SPEC_BENCH_DIR, default /tmp) and the embedded metadata
//! store; one closed E=3 Qw=3 Qa=2 ledger of `ENTRIES` 1 KiB entries; then its metadata names,
//! at ensemble position 0, a loopback TCP relay in front of that bookie that holds every chunk
//! QUIRE_SPEC_BENCH_DELAY_MS (default 100) each way: a replica that answers, late (a stalled
//! disk, a far region). A third of the entries have it first in their write set. Per round,
//! one client with speculation off, then one with it on (fresh clients, so that neither learns
//! from the other) each read QUIRE_SPEC_BENCH_READS (default 150) entries, one at a time, from
//! a random start; latency is each read's, from call to payload.
//!
//! Run: `cargo run --release -p quire-perf --example speculative_reads` (settings from the
//! environment: QUIRE_SPEC_BENCH_ROUNDS, default 3, and the ones above).

// A benchmark's stopwatch is the real clock, whatever clock the code under test reads
// (quire_clock seam, clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use quire_ledger::{BookKeeper, ClientConfig, LedgerOptions};
use quire_metadata::{BookieId, EmbeddedStore, MetadataStore};
use quire_testkit::bookies::start_registered_bookies;
use quire_testkit::TcpRelay;
use quire_wire::{EntryId, LedgerId};

const ENTRIES: u64 = 3_000;
const ENTRY_BYTES: usize = 1024;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Reads `reads` entries one at a time from `first`, wrapping; returns each read's latency.
async fn read_phase(
    client: &BookKeeper,
    ledger: LedgerId,
    first: u64,
    reads: u64,
) -> Histogram<u64> {
    let reader = client.open_ledger(ledger).await.expect("open the ledger");
    let mut h = Histogram::<u64>::new(3).expect("histogram");
    for i in 0..reads {
        let e = (first + i) % ENTRIES;
        let t = Instant::now();
        let payload = reader.read(EntryId(e)).await.expect("read");
        h.record(t.elapsed().as_micros() as u64).expect("record");
        assert_eq!(payload.len(), ENTRY_BYTES, "entry {e}");
    }
    h
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let delay_ms = env_u64("QUIRE_SPEC_BENCH_DELAY_MS", 100);
    let reads = env_u64("QUIRE_SPEC_BENCH_READS", 150);
    let rounds = env_u64("QUIRE_SPEC_BENCH_ROUNDS", 3);
    let base = std::env::var("QUIRE_SPEC_BENCH_DIR").unwrap_or_else(|_| "/tmp".into());
    let dir = tempfile::Builder::new()
        .prefix("quire-spec-bench-")
        .tempdir_in(base)
        .expect("temporary directory");
    let store = EmbeddedStore::open(&dir.path().join("meta")).expect("metadata store");
    let bookies = start_registered_bookies(dir.path(), 3, &store).await;
    let store: Arc<dyn MetadataStore> = Arc::new(store);

    let writer_client = BookKeeper::new(store.clone(), ClientConfig::default());
    let writer = writer_client
        .create_ledger(LedgerOptions {
            ensemble_size: 3,
            write_quorum: 3,
            ack_quorum: 2,
            password: b"speculative-bench".to_vec(),
            custom: Default::default(),
        })
        .await
        .expect("create the ledger");
    let mut pending = Vec::new();
    for e in 0..ENTRIES {
        pending.push(writer.add(vec![(e % 251) as u8; ENTRY_BYTES]));
        if pending.len() == 64 {
            for p in pending.drain(..) {
                p.await.expect("add");
            }
        }
    }
    for p in pending {
        p.await.expect("add");
    }
    writer.close().await.expect("close");
    let ledger = writer.id();

    let current = store.read_ledger(ledger).await.expect("ledger metadata");
    let mut meta = current.value.clone();
    let relay = TcpRelay::start(meta.fragments[0].bookies[0].0.parse().expect("address"));
    relay.delay(Some(Duration::from_millis(delay_ms)));
    meta.fragments[0].bookies[0] = BookieId(relay.connect_string());
    store
        .update_ledger(ledger, &meta, current.version)
        .await
        .expect("point position 0 at the relay");

    println!(
        "one replica of three {delay_ms} ms late each way; {reads} reads per phase, {rounds} rounds"
    );
    println!("round | off p50 | off p99 | on p50 | on p99 | p99 off/on | speculative sent/won");
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let first = quire_clock::random::<u64>() % ENTRIES;
        let off = BookKeeper::new(
            store.clone(),
            ClientConfig {
                speculative_read_timeout: Duration::ZERO,
                ..ClientConfig::default()
            },
        );
        let h_off = read_phase(&off, ledger, first, reads).await;
        let on = BookKeeper::new(store.clone(), ClientConfig::default());
        let h_on = read_phase(&on, ledger, first, reads).await;
        let counts = on.speculative_reads();
        let ratio = h_off.value_at_quantile(0.99) as f64 / h_on.value_at_quantile(0.99) as f64;
        ratios.push(ratio);
        println!(
            "{round} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {ratio:.2} | {}/{}",
            ms(h_off.value_at_quantile(0.5)),
            ms(h_off.value_at_quantile(0.99)),
            ms(h_on.value_at_quantile(0.5)),
            ms(h_on.value_at_quantile(0.99)),
            counts.sent,
            counts.won,
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!("median p99 off/on: {:.2}", ratios[ratios.len() / 2]);
    drop(relay);
    drop(bookies);
}

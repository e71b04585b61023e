//! Multi-region benchmarks (issue 30, "How it is checked", third bullet), run inside the test
//! bed's namespaces by ansible/ci/regions-bench.sh against the bed's real ZooKeeper and bookies
//! (TLS, cluster secret and ZooKeeper digest from the bed's environment, `regions-bed.sh env`).
//!
//! `regions_bench write` (in region a): the cost of an ack quorum that spans regions. Per round,
//! two arms alternate, each on a fresh ledger written open loop at QUIRE_RB_RATE (default 200)
//! 1 KiB entries per second for QUIRE_RB_SECS (default 20) seconds, latency from each entry's
//! scheduled send to its acknowledgement (so that a stall delays the entries queued behind it,
//! as it would a real writer's):
//! * `inside`: E=Qw=Qa=2 on region a's two bookies only. No placement setting limits a ledger
//!   to one region, so the arm's client places at random (`default`) and keeps the first ledger
//!   whose ensemble is region a's two bookies, deleting the others (empty) it made on the way.
//! * `span`: E=Qw=3, Qa=2 under `region-aware` placement with min_regions_for_durability = 2
//!   (the bed's policy): one bookie per region, so every ack quorum needs a second region.
//!
//! The ids of the `span` ledgers (closed) go to QUIRE_RB_LEDGERS for the read benchmark.
//!
//! `regions_bench read` (in another region, QUIRE_RB_REGION, e.g. c): catch-up reads of those
//! closed ledgers written in region a, one entry at a time (QUIRE_RB_READS per phase, default
//! 300, from a random start, after 10 untimed reads that open the connections and a 1 s pause
//! in which the client's background listing of the bookies' labels lands), latency from
//! call to payload. Per round four fresh clients, one per combination of the read order
//! (`[ledger] reorder_read_sequence`: local-first against write-set order, which for an
//! entry's write set starting at position `e mod E` is a uniformly random first replica) and
//! speculative reads (`speculative_read_timeout` 50 ms, adaptive, against 0: off), in turn.
//!
//! Every phase prints one line of JSON (arm, round, count, p50/p99/p999/max in µs, ledger,
//! bookies with their regions; for reads the speculative reads sent and won by the timed reads). Settings:
//! QUIRE_BED_ZOOKEEPER, QUIRE_ZK_AUTH_FILE, QUIRE_BOOKIE_TLS_{CA,CERT,KEY}_FILE,
//! QUIRE_CLUSTER_SECRET_FILE, QUIRE_RB_ZK_ROOT (default /quire), QUIRE_RB_ROUNDS (default 3),
//! QUIRE_RB_REGION (the client's region label; default a for write, c for read), QUIRE_RB_TAG
//! (a label copied into every line, e.g. the delay).

// A benchmark's stopwatch is the real clock, whatever clock the code under test reads
// (quire_clock seam, clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use quire_ledger::placement::{PlacementSettings, Policy};
use quire_ledger::{BookKeeper, ClientConfig, LedgerOptions, LedgerWriter};
use quire_metadata::{BookieId, MetadataStore, ZkDigest, ZkStore};
use quire_wire::{EntryId, LedgerId};

const ENTRY_BYTES: usize = 1024;
const WARM_READS: u64 = 10;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn env_str(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn need(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} not set (eval \"$(regions-bed.sh env)\")"))
}

/// What every client of the run shares: the metadata store, TLS, the cluster secret, the
/// region of every registered bookie.
struct Bed {
    store: Arc<dyn MetadataStore>,
    base: ClientConfig,
    regions: HashMap<BookieId, String>,
    tag: String,
}

impl Bed {
    async fn connect(region: &str) -> Bed {
        let servers = need("QUIRE_BED_ZOOKEEPER");
        let root = env_str("QUIRE_RB_ZK_ROOT", "/quire");
        let digest = std::env::var("QUIRE_ZK_AUTH_FILE").ok().map(|p| {
            ZkDigest::parse(&std::fs::read_to_string(&p).expect("read the ZooKeeper auth file"))
                .expect("ZooKeeper auth file")
        });
        let store =
            ZkStore::connect_with_auth(&servers, &root, Duration::from_secs(10), digest.as_ref())
                .await
                .expect("connect to the bed's ZooKeeper");
        let store: Arc<dyn MetadataStore> = Arc::new(store);
        let tls = std::env::var("QUIRE_BOOKIE_TLS_CA_FILE").ok().map(|ca| {
            quire_tls::ClientTls {
                ca_file: PathBuf::from(ca),
                cert_file: std::env::var("QUIRE_BOOKIE_TLS_CERT_FILE")
                    .ok()
                    .map(PathBuf::from),
                key_file: std::env::var("QUIRE_BOOKIE_TLS_KEY_FILE")
                    .ok()
                    .map(PathBuf::from),
            }
            .client_config()
            .expect("bookie TLS files")
        });
        let cluster_secret = std::env::var("QUIRE_CLUSTER_SECRET_FILE").ok().map(|p| {
            quire_wire::auth::ClusterSecret::from_hex(
                &std::fs::read_to_string(&p).expect("read the cluster secret"),
            )
            .expect("cluster secret")
        });
        let regions = store
            .list_bookies()
            .await
            .expect("list the bookies")
            .into_iter()
            .map(|b| (b.id, b.region.unwrap_or_else(|| "?".into())))
            .collect();
        let base = ClientConfig {
            tls,
            cluster_secret,
            region: Some(region.to_string()),
            ..ClientConfig::default()
        };
        Bed {
            store,
            base,
            regions,
            tag: env_str("QUIRE_RB_TAG", ""),
        }
    }

    fn client(&self, config: ClientConfig) -> BookKeeper {
        BookKeeper::new(self.store.clone(), config)
    }

    /// "10.210.1.21:3181 (a)" for each bookie of `ids`.
    fn located(&self, ids: &[BookieId]) -> Vec<String> {
        ids.iter()
            .map(|b| format!("{} ({})", b.0, self.regions.get(b).map_or("?", |r| r)))
            .collect()
    }
}

fn options(e: u8, qw: u8, qa: u8) -> LedgerOptions {
    LedgerOptions {
        ensemble_size: e,
        write_quorum: qw,
        ack_quorum: qa,
        password: b"regions-bench".to_vec(),
        custom: Default::default(),
    }
}

/// A ledger of E=Qw=Qa=2 on two bookies of `region`: random placement, retried; the ledgers
/// placed elsewhere are closed empty and their metadata deleted.
async fn ledger_inside(bed: &Bed, client: &BookKeeper, region: &str) -> LedgerWriter {
    for _ in 0..300 {
        let w = client
            .create_ledger(options(2, 2, 2))
            .await
            .expect("create a ledger");
        if w.ensemble()
            .iter()
            .all(|b| bed.regions.get(b).is_some_and(|r| r == region))
        {
            return w;
        }
        w.close().await.expect("close an unused ledger");
        let v = bed.store.read_ledger(w.id()).await.expect("its metadata");
        bed.store
            .delete_ledger(w.id(), v.version)
            .await
            .expect("delete an unused ledger");
    }
    panic!("no ledger placed on two bookies of region {region} in 300 tries");
}

fn summary(h: &Histogram<u64>) -> String {
    format!(
        "\"count\":{},\"p50_us\":{},\"p99_us\":{},\"p999_us\":{},\"max_us\":{}",
        h.len(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max()
    )
}

/// Writes `secs` seconds of 1 KiB entries open loop at `rate` per second; latency of each from
/// its scheduled send to its acknowledgement.
async fn open_loop(writer: &LedgerWriter, rate: u64, secs: u64) -> Histogram<u64> {
    // Untimed: the connections to this ledger's ensemble are made before the clock starts.
    for i in 0..5u8 {
        writer.add(vec![i; ENTRY_BYTES]).await.expect("warm-up add");
    }
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new(3).expect("histogram")));
    let interval = Duration::from_nanos(1_000_000_000 / rate.max(1));
    let start = tokio::time::Instant::now();
    let mut acks = Vec::new();
    for i in 0..rate * secs {
        let scheduled = start + interval * u32::try_from(i).expect("entries per phase");
        tokio::time::sleep_until(scheduled).await;
        let add = writer.add(vec![(i % 251) as u8; ENTRY_BYTES]);
        let hist = hist.clone();
        acks.push(tokio::spawn(async move {
            add.await.expect("add");
            let us = scheduled.elapsed().as_micros() as u64;
            hist.lock().expect("histogram").record(us).expect("record");
        }));
    }
    for a in acks {
        a.await.expect("ack task");
    }
    let h = hist.lock().expect("histogram").clone();
    h
}

async fn write_bench(bed: &Bed, region: &str) {
    let rate = env_u64("QUIRE_RB_RATE", 200);
    let secs = env_u64("QUIRE_RB_SECS", 20);
    let rounds = env_u64("QUIRE_RB_ROUNDS", 3);
    let ledgers_file = need("QUIRE_RB_LEDGERS");
    let inside_client = bed.client(bed.base.clone());
    let span_client = bed.client(ClientConfig {
        placement: PlacementSettings {
            placement: Policy::RegionAware,
            min_regions_for_durability: 2,
            enforce_durability: true,
            ..PlacementSettings::default()
        },
        ..bed.base.clone()
    });
    let mut span_ledgers = Vec::new();
    for round in 0..rounds {
        for arm in ["inside", "span"] {
            let writer = if arm == "inside" {
                ledger_inside(bed, &inside_client, region).await
            } else {
                span_client
                    .create_ledger(options(3, 3, 2))
                    .await
                    .expect("create a region-aware ledger")
            };
            let t = Instant::now();
            let h = open_loop(&writer, rate, secs).await;
            let meta = writer.close().await.expect("close");
            let bookies: Vec<String> = meta
                .fragments
                .iter()
                .map(|f| format!("{}: {}", f.first_entry, bed.located(&f.bookies).join(", ")))
                .collect();
            if arm == "span" {
                span_ledgers.push(writer.id().0.to_string());
            }
            println!(
                "{{\"bench\":\"write\",\"tag\":{:?},\"arm\":\"{arm}\",\"round\":{round},\"rate\":{rate},\
                 \"secs\":{:.1},{},\"ledger\":{},\"shape\":\"{}/{}/{}\",\"fragments\":{:?}}}",
                bed.tag,
                t.elapsed().as_secs_f64(),
                summary(&h),
                writer.id().0,
                meta.ensemble_size,
                meta.write_quorum,
                meta.ack_quorum,
                bookies
            );
        }
    }
    std::fs::write(&ledgers_file, span_ledgers.join("\n") + "\n").expect("write the ledger list");
}

/// Reads `reads` entries of `ledger` one at a time from a random start, after WARM_READS
/// untimed ones; each read's latency, call to payload.
/// Also returns the speculative reads (sent, won) of the timed reads.
async fn read_phase(
    client: &BookKeeper,
    ledger: LedgerId,
    reads: u64,
) -> (Histogram<u64>, u64, u64) {
    let reader = client.open_ledger(ledger).await.expect("open the ledger");
    let entries = reader
        .metadata()
        .last_entry
        .expect("a closed, written ledger")
        + 1;
    let first = quire_clock::random::<u64>() % entries;
    let mut h = Histogram::<u64>::new(3).expect("histogram");
    let mut before = client.speculative_reads();
    for i in 0..WARM_READS + reads {
        if i == WARM_READS {
            // The first read of a client with labels lists the registry for the bookies'
            // labels in the background (`locality`); let it land before the clock starts, as
            // in a proxy that has been up a while.
            tokio::time::sleep(Duration::from_secs(1)).await;
            before = client.speculative_reads();
        }
        let e = (first + i) % entries;
        let t = Instant::now();
        let payload = reader.read(EntryId(e)).await.expect("read");
        if i >= WARM_READS {
            h.record(t.elapsed().as_micros() as u64).expect("record");
        }
        assert_eq!(payload.len(), ENTRY_BYTES, "entry {e}");
    }
    let after = client.speculative_reads();
    (h, after.sent - before.sent, after.won - before.won)
}

async fn read_bench(bed: &Bed) {
    let reads = env_u64("QUIRE_RB_READS", 300);
    let rounds = env_u64("QUIRE_RB_ROUNDS", 3);
    let ledgers: Vec<LedgerId> = std::fs::read_to_string(need("QUIRE_RB_LEDGERS"))
        .expect("read the ledger list")
        .split_whitespace()
        .map(|s| LedgerId(s.parse().expect("ledger id")))
        .collect();
    assert!(!ledgers.is_empty(), "no ledgers to read");
    let combos = [
        ("local-first", true, true),
        ("write-set", false, true),
        ("local-first", true, false),
        ("write-set", false, false),
    ];
    for round in 0..rounds {
        let ledger = ledgers[round as usize % ledgers.len()];
        for (order, reorder, speculate) in combos {
            let mut config = bed.base.clone();
            config.placement.reorder_read_sequence = reorder;
            if !speculate {
                config.speculative_read_timeout = Duration::ZERO;
            }
            let client = bed.client(config);
            let (h, sent, won) = read_phase(&client, ledger, reads).await;
            let meta = bed.store.read_ledger(ledger).await.expect("metadata").value;
            println!(
                "{{\"bench\":\"read\",\"tag\":{:?},\"order\":\"{order}\",\"speculative\":{speculate},\
                 \"round\":{round},{},\"speculative_sent\":{},\"speculative_won\":{},\"ledger\":{},\
                 \"bookies\":{:?}}}",
                bed.tag,
                summary(&h),
                sent,
                won,
                ledger.0,
                bed.located(&meta.fragments[0].bookies)
            );
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    match mode.as_str() {
        "write" => {
            let region = env_str("QUIRE_RB_REGION", "a");
            let bed = Bed::connect(&region).await;
            write_bench(&bed, &region).await;
        }
        "read" => {
            let region = env_str("QUIRE_RB_REGION", "c");
            let bed = Bed::connect(&region).await;
            read_bench(&bed).await;
        }
        _ => {
            eprintln!("usage: regions_bench write|read (see the file's docs for the settings)");
            std::process::exit(2);
        }
    }
}

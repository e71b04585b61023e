//! Noisy neighbour (issue 29 item 4 and "How it is checked"): a quiet tenant writing at a
//! modest paced rate beside a noisy tenant offering 10× its quota, against the same run
//! without the noise, interleaved A/B/A/B (A: quiet alone, B: quiet + noise).
//!
//! Tenants are streams with quotas of their own (`SET_LIMITS`, `ProxyClient::set_limits`):
//! the noisy stream gets a hard `--quota` records/s, the quiet stream none. Each phase uses
//! fresh streams. In each phase:
//! - **quiet**: `--quiet-rate` writes/s of one `--size`-byte record for `--secs` s, open loop
//!   (latency from each write's scheduled time): p50 and p99 of its acknowledgements;
//! - **noise** (B only): `--quota × --factor` records/s offered as writes of `--batch` records,
//!   also open loop; every write is answered (acknowledged or `OVER_CAPACITY`): the share of
//!   noisy records refused, and the records acknowledged per second (what the quota let in).
//!
//! Prints one line per phase and the ratio of the quiet tenant's mean p99 with/without the
//! noise (target: at most 1.25) and the noisy tenant's refused share. Usage:
//! `cargo run --release -p quire-perf --example noisy_neighbour -- --proxy 127.0.0.1:4181`

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use hdrhistogram::Histogram;
use quire_client::limits::StreamLimits;
use quire_client::{ErrorCode, ProxyClient};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:4181")]
    proxy: String,
    /// The quiet tenant's writes per second (one record each).
    #[arg(long, default_value_t = 200)]
    quiet_rate: u64,
    /// The noisy tenant's hard quota, records per second.
    #[arg(long, default_value_t = 500)]
    quota: u64,
    /// The noisy tenant offers this many times its quota.
    #[arg(long, default_value_t = 10)]
    factor: u64,
    /// Records per noisy write.
    #[arg(long, default_value_t = 10)]
    batch: u64,
    /// Record payload bytes.
    #[arg(long, default_value_t = 100)]
    size: usize,
    #[arg(long, default_value_t = 5)]
    secs: u64,
    /// A/B pairs.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
}

/// Open loop on `stream`: `rate` writes/s of `batch` records for `secs`. Returns the latency
/// histogram of acknowledged writes (µs), records acknowledged, records refused
/// `OVER_CAPACITY`, other failures.
async fn paced(
    client: Arc<ProxyClient>,
    stream: String,
    (rate, batch, size, secs): (u64, u64, usize, u64),
) -> (Histogram<u64>, u64, u64, u64) {
    let hist = Rc::new(RefCell::new(Histogram::<u64>::new(3).unwrap()));
    let counts = Rc::new([Cell::new(0u64), Cell::new(0), Cell::new(0)]);
    let t0 = quire_clock::now();
    let mut tasks = Vec::new();
    for i in 0..rate * secs {
        let at = t0 + Duration::from_nanos(i * 1_000_000_000 / rate);
        tokio::time::sleep_until(at.into()).await;
        let (client, stream, hist, counts) =
            (client.clone(), stream.clone(), hist.clone(), counts.clone());
        let records: Vec<_> = (0..batch)
            .map(|j| (i * batch + j + 1, vec![b'q'; size]))
            .collect();
        tasks.push(tokio::task::spawn_local(async move {
            match client.write(&stream, records, true).await {
                Ok(w) => {
                    let us = quire_clock::elapsed(at).as_micros() as u64;
                    hist.borrow_mut().record(us.max(1)).unwrap();
                    counts[0].set(counts[0].get() + w.count);
                }
                Err(e) if e.code() == ErrorCode::OverCapacity => {
                    counts[1].set(counts[1].get() + batch);
                }
                Err(e) => {
                    eprintln!("{stream}: {e}");
                    counts[2].set(counts[2].get() + 1);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let h = hist.borrow().clone();
    (h, counts[0].get(), counts[1].get(), counts[2].get())
}

/// One phase; returns (quiet p99 ms, noisy refused share if noisy).
async fn phase(
    args: &Args,
    client: &Arc<ProxyClient>,
    tag: &str,
    noisy: bool,
) -> (f64, Option<f64>) {
    let quiet = format!("perf/nn/{tag}-quiet");
    client.create_stream(&quiet).await.expect("create quiet");
    let noise = if noisy {
        let stream = format!("perf/nn/{tag}-noisy");
        client.create_stream(&stream).await.expect("create noisy");
        let quota = StreamLimits {
            records_per_sec: args.quota,
            ..StreamLimits::default()
        };
        client
            .set_limits(&stream, Some(quota))
            .await
            .expect("set limits");
        let rate = args.quota * args.factor / args.batch;
        let shape = (rate, args.batch, args.size, args.secs);
        Some(tokio::task::spawn_local(paced(
            client.clone(),
            stream,
            shape,
        )))
    } else {
        None
    };
    let shape = (args.quiet_rate, 1, args.size, args.secs);
    let (h, acked, refused, failed) = paced(client.clone(), quiet, shape).await;
    let (p50, p99) = (
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
    );
    let mut line = format!(
        "{tag}: quiet {} w/s p50 {p50:.2} ms p99 {p99:.2} ms ({acked} acked, {refused} refused, {failed} failed)",
        args.quiet_rate
    );
    let mut share = None;
    if let Some(n) = noise {
        let (_, ok, refused, failed) = n.await.unwrap();
        let offered = ok + refused;
        share = Some(refused as f64 / offered.max(1) as f64);
        line += &format!(
            "; noisy offered {} rec/s (quota {}): {:.1} % refused OVER_CAPACITY, {:.0} rec/s acked, {failed} failed",
            args.quota * args.factor,
            args.quota,
            100.0 * share.unwrap_or(0.0),
            ok as f64 / args.secs as f64
        );
    }
    println!("{line}");
    (p99, share)
}

async fn run(args: Args) {
    let client = Arc::new(ProxyClient::connect(&args.proxy).await.expect("connect"));
    let run_id = quire_clock::unix_ms();
    let (mut alone, mut noisy, mut shares) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.rounds {
        for with_noise in [false, true] {
            let tag = format!("{run_id}-{round}-{}", if with_noise { "B" } else { "A" });
            let (p99, share) = phase(&args, &client, &tag, with_noise).await;
            if with_noise {
                noisy.push(p99);
                shares.extend(share);
            } else {
                alone.push(p99);
            }
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    println!(
        "over {} A/B rounds: quiet p99 with/without noise {:.3} (mean {:.2} / {:.2} ms), noisy refused share {:.3}",
        args.rounds,
        mean(&noisy) / mean(&alone).max(f64::MIN_POSITIVE),
        mean(&noisy),
        mean(&alone),
        mean(&shares)
    );
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, run(args));
}

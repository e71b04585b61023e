//! Same-run cost of a producer session (issue 26 item 4: exactly-once writes; "a producer
//! session costs at most 5 % of throughput and p99 at 1,000 records/s").
//!
//! Against one proxy (a `quire sandbox`), alternating plain writes and producer session writes
//! (`ProxyClient::write_in_session`, numbered in order) in the same run, `--rounds` times:
//! - **paced**: one record a write at `--rate` writes/s for `--secs` s, open loop (latency
//!   from each write's scheduled time, so a stall counts for every write it delayed);
//! - **throughput**: `--in-flight` writes of one record outstanding at all times for
//!   `--secs` s, records acknowledged per second.
//!
//! Session writes are sent from tasks of a current-thread runtime in sequence order (tokio's
//! mutexes are FIFO), so the owner sees them in order; a write refused for a sequence gap is
//! counted and printed. Usage:
//! `cargo run --release -p quire-perf --example producer_session_cost -- --proxy 127.0.0.1:4181`

use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use hdrhistogram::Histogram;
use quire_client::{ProducerSeq, ProxyClient};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:4181")]
    proxy: String,
    /// Writes (one record each) per second in the paced runs.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    #[arg(long, default_value_t = 5)]
    secs: u64,
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    #[arg(long, default_value_t = 100)]
    payload_bytes: usize,
}

/// One writer: plain, or a producer session with its next sequence number.
struct Writer {
    client: Arc<ProxyClient>,
    stream: String,
    session: Option<(u64, AtomicU64)>,
    txid: AtomicU64,
    gaps: AtomicU64,
    payload: Vec<u8>,
}

impl Writer {
    /// Sends one write; returns whether it was acknowledged.
    async fn write(&self) -> bool {
        let txid = self.txid.fetch_add(1, Ordering::SeqCst) + 1;
        let records = vec![(txid, self.payload.clone())];
        let r = match &self.session {
            None => self.client.write(&self.stream, records, true).await,
            Some((session_id, next)) => {
                let first_seq = next.fetch_add(1, Ordering::SeqCst);
                let p = ProducerSeq {
                    session_id: *session_id,
                    first_seq,
                };
                self.client
                    .write_in_session(&self.stream, p, records, true)
                    .await
            }
        };
        if let Err(e) = &r {
            if e.code() == quire_client::ErrorCode::ProducerSequenceGap {
                self.gaps.fetch_add(1, Ordering::SeqCst);
            } else {
                eprintln!("write failed: {e}");
            }
        }
        r.is_ok()
    }
}

/// Open loop at `rate` for `secs`: latency percentiles (ms) from the scheduled times.
async fn paced(w: Rc<Writer>, rate: u64, secs: u64) -> (f64, f64) {
    let hist = Rc::new(std::cell::RefCell::new(Histogram::<u64>::new(3).unwrap()));
    let t0 = quire_clock::now();
    let n = rate * secs;
    let mut tasks = Vec::with_capacity(n as usize);
    for i in 0..n {
        let at = t0 + Duration::from_nanos(i * 1_000_000_000 / rate);
        tokio::time::sleep_until(at.into()).await;
        let (w, hist) = (w.clone(), hist.clone());
        tasks.push(tokio::task::spawn_local(async move {
            if w.write().await {
                let us = quire_clock::elapsed(at).as_micros() as u64;
                hist.borrow_mut().record(us.max(1)).unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let h = hist.borrow();
    (
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
    )
}

/// Closed loop with `in_flight` writes outstanding for `secs`: records acknowledged a second.
async fn throughput(w: Rc<Writer>, in_flight: usize, secs: u64) -> f64 {
    let end = quire_clock::now() + Duration::from_secs(secs);
    let acked = Rc::new(std::cell::Cell::new(0u64));
    let tasks: Vec<_> = (0..in_flight)
        .map(|_| {
            let (w, acked) = (w.clone(), acked.clone());
            tokio::task::spawn_local(async move {
                while quire_clock::now() < end {
                    if w.write().await {
                        acked.set(acked.get() + 1);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    acked.get() as f64 / secs as f64
}

async fn run(args: Args) {
    let client = Arc::new(ProxyClient::connect(&args.proxy).await.expect("connect"));
    let run_id = quire_clock::unix_ms();
    let mut rows: Vec<(String, f64, f64, f64)> = Vec::new();
    for round in 0..args.rounds {
        for session in [false, true] {
            let stream = format!("perf/session-cost/{run_id}-{round}-{session}");
            let session = if session {
                let id = client.open_producer_session(&stream).await.unwrap();
                Some((id, AtomicU64::new(0)))
            } else {
                None
            };
            let mode = if session.is_some() {
                "session"
            } else {
                "plain"
            };
            let w = Rc::new(Writer {
                client: client.clone(),
                stream,
                session,
                txid: AtomicU64::new(0),
                gaps: AtomicU64::new(0),
                payload: vec![b'x'; args.payload_bytes],
            });
            let (p50, p99) = paced(w.clone(), args.rate, args.secs).await;
            let tput = throughput(w.clone(), args.in_flight, args.secs).await;
            let gaps = w.gaps.load(Ordering::SeqCst);
            println!(
                "round {round} {mode:>7}: paced {} w/s p50 {p50:.2} ms p99 {p99:.2} ms; throughput {tput:.0} records/s ({} in flight); sequence gaps {gaps}",
                args.rate, args.in_flight
            );
            rows.push((mode.to_string(), p50, p99, tput));
        }
    }
    let avg = |mode: &str, f: fn(&(String, f64, f64, f64)) -> f64| {
        let v: Vec<f64> = rows.iter().filter(|r| r.0 == mode).map(f).collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    let (pp99, sp99) = (avg("plain", |r| r.2), avg("session", |r| r.2));
    let (pt, st) = (avg("plain", |r| r.3), avg("session", |r| r.3));
    println!(
        "mean over {} rounds: p99 plain {pp99:.2} ms, session {sp99:.2} ms (session/plain {:.3}); throughput plain {pt:.0}, session {st:.0} records/s (session/plain {:.3})",
        args.rounds,
        sp99 / pp99,
        st / pt
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

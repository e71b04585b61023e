//! LZ4 end to end through a proxy (issue 26 item 5: "measure ratio and CPU on the loghub
//! samples"), same run, interleaved rounds: compression `none` vs `lz4` set per stream
//! (`SET_COMPRESSION`, `ProxyClient::set_compression`), the loghub samples' lines written as
//! records through one proxy (a `quire sandbox`).
//!
//! Each round makes two fresh streams, one per setting (order alternating between rounds), and
//! for each runs:
//! - **paced**: `--rate` writes/s of `--lines` lines each for `--secs` s, open loop (latency
//!   from each write's scheduled time): p50 and p99;
//! - **throughput**: `--in-flight` such writes outstanding for `--secs` s: records/s, and the
//!   proxy process's CPU per record from `/proc/PID/stat` (utime + stime of every thread,
//!   `--proxy-pid`; the sandbox's bookies are in the same process, so this is the whole
//!   write path's CPU);
//! - **stored bytes**: the stream is sealed (its segments completed) and the segments' stored
//!   bytes (`length_bytes`, what the bookies hold per copy) are divided by the payload bytes
//!   written.
//!
//! Prints one line per stream and the ratios lz4/none of the means. Usage:
//! `cargo run --release -p quire-perf --example lz4_through_proxy -- --proxy 127.0.0.1:4181
//! --proxy-pid PID`

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use hdrhistogram::Histogram;
use quire_client::compression::Compression;
use quire_client::ProxyClient;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:4181")]
    proxy: String,
    /// Pid of the proxy (or sandbox) process, for CPU per record; none: CPU not measured.
    #[arg(long)]
    proxy_pid: Option<u32>,
    /// Writes per second in the paced runs.
    #[arg(long, default_value_t = 200)]
    rate: u64,
    /// Lines (records) per write.
    #[arg(long, default_value_t = 10)]
    lines: usize,
    #[arg(long, default_value_t = 5)]
    secs: u64,
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    #[arg(long, default_value_t = 16)]
    in_flight: usize,
}

/// Writes the loghub lines to one stream, cycling through them.
struct Writer {
    client: Arc<ProxyClient>,
    stream: String,
    lines: Rc<Vec<Vec<u8>>>,
    per_write: usize,
    next: Cell<usize>,
    txid: Cell<u64>,
    payload_bytes: Cell<u64>,
}

impl Writer {
    /// Sends one write of `per_write` lines; returns the records acknowledged.
    async fn write(&self) -> u64 {
        let mut records = Vec::with_capacity(self.per_write);
        for _ in 0..self.per_write {
            let i = self.next.get();
            self.next.set((i + 1) % self.lines.len());
            self.txid.set(self.txid.get() + 1);
            records.push((self.txid.get(), self.lines[i].clone()));
        }
        let bytes: u64 = records.iter().map(|(_, p)| p.len() as u64).sum();
        match self.client.write(&self.stream, records, true).await {
            Ok(r) => {
                self.payload_bytes.set(self.payload_bytes.get() + bytes);
                r.count
            }
            Err(e) => {
                eprintln!("write failed: {e}");
                0
            }
        }
    }
}

/// Open loop at `rate` writes/s for `secs`: p50 and p99 latency in ms.
async fn paced(w: Rc<Writer>, rate: u64, secs: u64) -> (f64, f64) {
    let hist = Rc::new(RefCell::new(Histogram::<u64>::new(3).unwrap()));
    let t0 = quire_clock::now();
    let mut tasks = Vec::new();
    for i in 0..rate * secs {
        let at = t0 + Duration::from_nanos(i * 1_000_000_000 / rate);
        tokio::time::sleep_until(at.into()).await;
        let (w, hist) = (w.clone(), hist.clone());
        tasks.push(tokio::task::spawn_local(async move {
            if w.write().await > 0 {
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

/// Closed loop, `in_flight` writes outstanding for `secs`: records/s and the proxy's CPU
/// microseconds per record (`None` without a pid).
async fn throughput(w: Rc<Writer>, args: &Args) -> (f64, Option<f64>) {
    let pid = args.proxy_pid.map(|p| p.to_string());
    let cpu = |pid: &Option<String>| {
        pid.as_ref()
            .and_then(|p| quire_perf::procfs::read_cpu_ticks(p).ok())
    };
    let before = cpu(&pid);
    let end = quire_clock::now() + Duration::from_secs(args.secs);
    let acked = Rc::new(Cell::new(0u64));
    let tasks: Vec<_> = (0..args.in_flight)
        .map(|_| {
            let (w, acked) = (w.clone(), acked.clone());
            tokio::task::spawn_local(async move {
                while quire_clock::now() < end {
                    acked.set(acked.get() + w.write().await);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let per_record = match (before, cpu(&pid)) {
        (Some(b), Some(a)) if acked.get() > 0 => {
            let s = quire_perf::procfs::cpu_seconds(b, a, quire_perf::procfs::clock_ticks_per_s());
            Some(s * 1e6 / acked.get() as f64)
        }
        _ => None,
    };
    (acked.get() as f64 / args.secs as f64, per_record)
}

/// Stored bytes over payload bytes, after sealing (completed segments carry their sizes).
async fn stored_ratio(w: &Writer) -> f64 {
    w.client.seal_stream(&w.stream).await.expect("seal");
    let info = w.client.describe_stream(&w.stream).await.expect("describe");
    let stored: u64 = info.metadata.segments.iter().map(|s| s.length_bytes).sum();
    stored as f64 / w.payload_bytes.get().max(1) as f64
}

/// The loghub samples' non-empty lines, in file order.
fn loghub_lines() -> Vec<Vec<u8>> {
    let mut lines = Vec::new();
    for file in quire_testkit::loghub::files() {
        let bytes = std::fs::read(&file).expect("read sample");
        lines.extend(
            bytes
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(<[u8]>::to_vec),
        );
    }
    lines
}

/// One measurement: setting, p99 ms, records/s, CPU µs/record, stored/payload.
type Row = (Compression, f64, f64, Option<f64>, f64);

async fn measure(args: &Args, client: &Arc<ProxyClient>, stream: String, c: Compression) -> Row {
    client.create_stream(&stream).await.expect("create");
    client
        .set_compression(&stream, Some(c))
        .await
        .expect("set compression");
    let w = Rc::new(Writer {
        client: client.clone(),
        stream,
        lines: Rc::new(loghub_lines()),
        per_write: args.lines,
        next: Cell::new(0),
        txid: Cell::new(0),
        payload_bytes: Cell::new(0),
    });
    let (p50, p99) = paced(w.clone(), args.rate, args.secs).await;
    let (tput, cpu) = throughput(w.clone(), args).await;
    let ratio = stored_ratio(&w).await;
    let cpu_text = cpu.map_or("-".to_string(), |c| format!("{c:.1}"));
    println!(
        "{c:>4}: paced {} w/s x {} lines p50 {p50:.2} ms p99 {p99:.2} ms; throughput {tput:.0} records/s ({} in flight), proxy CPU {cpu_text} us/record; stored/payload {ratio:.3}",
        args.rate, args.lines, args.in_flight
    );
    (c, p99, tput, cpu, ratio)
}

async fn run(args: Args) {
    let client = Arc::new(ProxyClient::connect(&args.proxy).await.expect("connect"));
    let run_id = quire_clock::unix_ms();
    let mut rows: Vec<Row> = Vec::new();
    for round in 0..args.rounds {
        let order = if round % 2 == 0 {
            [Compression::None, Compression::Lz4]
        } else {
            [Compression::Lz4, Compression::None]
        };
        for c in order {
            print!("round {round} ");
            let stream = format!("perf/lz4/{run_id}-{round}-{c}");
            rows.push(measure(&args, &client, stream, c).await);
        }
    }
    let mean = |c: Compression, f: fn(&Row) -> Option<f64>| {
        let v: Vec<f64> = rows.iter().filter(|r| r.0 == c).filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let ratio = |f: fn(&Row) -> Option<f64>| match (
        mean(Compression::Lz4, f),
        mean(Compression::None, f),
    ) {
        (Some(l), Some(n)) if n > 0.0 => format!("{:.3}", l / n),
        _ => "-".to_string(),
    };
    println!(
        "lz4/none over {} rounds: throughput {}, p99 {}, stored bytes {}, proxy CPU per record {}",
        args.rounds,
        ratio(|r| Some(r.2)),
        ratio(|r| Some(r.1)),
        ratio(|r| Some(r.4)),
        ratio(|r| r.3),
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

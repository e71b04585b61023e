//! `quire-perf`: drives a running Quire cluster with open-loop load, measures latency and
//! throughput against the same run's raw-device baseline, checks SLOs, writes reports;
//! `quire-perf workload` runs the common replicated-log workload (one JSON line per mode).
//! See perf/README.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use quire_perf::baseline::{BaselineConfig, BaselineFile, BaselineResult, SyncMode};
use quire_perf::common_workload::{self as cw, Mode, Params};
use quire_perf::plot::{render_svg, Series};
use quire_perf::progress::Progress;
use quire_perf::report::{
    derive_metrics, human_summary, overloaded_metrics, reference, Report, RunResults, REPORT_FORMAT,
};
use quire_perf::slo;
use quire_perf::workloads::{Cluster, LoadShape};

/// The default SLO file (the issue 4 targets), used when `--slo` is not given.
const DEFAULT_SLO: &str = include_str!("../slo.toml");

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
enum Workload {
    /// Raw-device baseline (before and after the others).
    Baseline,
    /// Tail-write latency at --rate.
    TailWrite,
    /// Maximum sustainable durable throughput.
    Throughput,
    /// Append → tailing reader delivery latency.
    TailRead,
    /// Catch-up read throughput over a backlog.
    CatchUp,
    /// Tail-write latency alone, then during a catch-up scan.
    Isolation,
}

/// Open-loop latency-SLO harness for a running Quire cluster.
#[derive(Debug, Parser, serde::Serialize)]
#[command(
    name = "quire-perf",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Args {
    /// Another harness instead of the SLO workloads.
    #[command(subcommand)]
    #[serde(skip)]
    command: Option<Command>,
    /// Proxy address (`quire sandbox` prints it).
    #[arg(long, env = "QUIRE_PROXY", required = true)]
    proxy: Option<String>,
    /// Workloads to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_values = ["baseline", "tail-write", "throughput", "tail-read", "catch-up", "isolation"])]
    workloads: Vec<Workload>,
    /// SLO file (TOML); default: the built-in copy of perf/slo.toml.
    #[arg(long)]
    slo: Option<PathBuf>,
    /// Where to write the JSON report.
    #[arg(long, default_value = "quire-perf-report.json")]
    json: PathBuf,
    /// Where to write the latency plot (SVG).
    #[arg(long, default_value = "quire-perf-latency.svg")]
    plot: PathBuf,
    /// Offered rate of the fixed-rate workloads, records/s.
    #[arg(long, default_value_t = 2000.0)]
    rate: f64,
    /// Payload bytes per record.
    #[arg(long, default_value_t = 1024)]
    record_bytes: usize,
    /// Records per write call.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Streams each write workload spreads its records over.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// Writer connections to the proxy.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Unrecorded warm-up at the start of each fixed-rate run, seconds.
    #[arg(long, default_value_t = 3.0)]
    warmup_seconds: f64,
    /// Recorded span of each fixed-rate run, seconds.
    #[arg(long, default_value_t = 12.0)]
    seconds: f64,
    /// OS nice value of the isolation run's scanner thread. The scanner stands for a reader on
    /// another host; on one machine its own decoding would otherwise take the cores from the
    /// cluster under test. 0 makes it compete at the cluster's priority; values below 0 (above
    /// the cluster) are refused.
    #[arg(long, default_value_t = quire_client::CATCH_UP_READ_NICE,
          value_parser = clap::value_parser!(i32).range(0..=19))]
    scanner_nice: i32,
    /// Write calls outstanding at most (later sends wait and are measured late).
    #[arg(long, default_value_t = 1000)]
    in_flight_max: usize,
    /// Longest wait for outstanding writes after a schedule ends, seconds.
    #[arg(long, default_value_t = 10.0)]
    drain_timeout_seconds: f64,
    /// First rate of the throughput search, records/s.
    #[arg(long, default_value_t = 1000.0)]
    throughput_start_rate: f64,
    /// Highest rate the throughput search tries, records/s.
    #[arg(long, default_value_t = 256_000.0)]
    throughput_max_rate: f64,
    /// Bisection steps after the doubling phase of the throughput search.
    #[arg(long, default_value_t = 3)]
    throughput_refine_steps: u32,
    /// Recorded span of each throughput step, seconds (after a 1 s warm-up).
    #[arg(long, default_value_t = 5.0)]
    throughput_step_seconds: f64,
    /// p99 bound of the throughput search, ms; default: the SLO file's `throughput_p99_ms_max`
    /// (the built-in file: 20), else its `throughput_p99_ratio_to_raw_append_p99_max` × the
    /// start baseline's append p99, else 20 (`slo::THROUGHPUT_P99_MS_DEFAULT`).
    #[arg(long)]
    throughput_p99_ms: Option<f64>,
    /// Raw bandwidth divisor of the throughput ratio: copies written per payload byte
    /// (Qw 3 × journal + entry log = 6).
    #[arg(long, default_value_t = 6.0)]
    write_amplification: f64,
    /// Backlog written for the catch-up and isolation workloads, MiB.
    #[arg(long, default_value_t = 128)]
    backlog_mib: u64,
    /// The sandbox's data directory; the baseline file goes there (the journals' filesystem).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Directory for the baseline's scratch file, on the journal device (overrides --data-dir).
    #[arg(long)]
    baseline_dir: Option<PathBuf>,
    /// Size of the baseline's pre-written scratch file, MiB.
    #[arg(long, default_value_t = 256)]
    baseline_file_mib: u64,
    /// Duration of each baseline test (durable appends, sequential writes), seconds.
    #[arg(long, default_value_t = 4.0)]
    baseline_seconds: f64,
    /// How the baseline makes each 4 KiB append durable.
    #[arg(long, value_enum, default_value_t = SyncMode::Fdatasync)]
    baseline_sync: SyncMode,
    /// Take the baseline only before the workloads, not also after.
    #[arg(long)]
    baseline_once: bool,
    /// Prefix of the streams the run creates (default: quire-perf-<unix ms>).
    #[arg(long)]
    stream_prefix: Option<String>,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
    /// CA certificate (PEM) that signs the proxy's certificate: connect with TLS.
    #[arg(long)]
    tls_ca_file: Option<std::path::PathBuf>,
    /// Client certificate (PEM), for a proxy that requires one.
    #[arg(long)]
    tls_cert_file: Option<std::path::PathBuf>,
    /// Key of the client certificate (PEM).
    #[arg(long)]
    tls_key_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The common replicated-log workload of ../shared/bench: one JSON line per mode.
    ///
    /// The workload of the shared reference workload.md, as ../shared/bench runs it against
    /// other systems: latency, latency-open, throughput and tail, each on a new stream, one
    /// JSON line per mode on stdout (and appended to --out), a table on stderr. Exit status 0 when every mode is clean (no failed or unacknowledged
    /// append, nothing missing, duplicated or out of order), 1 otherwise, 2 on a harness error.
    Workload(WorkloadArgs),
}

#[derive(Debug, clap::Args)]
struct WorkloadArgs {
    /// Proxy address.
    #[arg(long, env = "QUIRE_PROXY")]
    proxy: String,
    /// Modes to run, comma-separated, in this order.
    #[arg(long, value_enum, value_delimiter = ',',
          default_values = ["latency", "latency-open", "throughput", "tail"])]
    modes: Vec<Mode>,
    /// Record size, bytes (16-byte header included).
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Records per second of latency, latency-open and tail.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Measured seconds per mode.
    #[arg(long, default_value_t = 20.0)]
    duration: f64,
    /// Unmeasured seconds before them.
    #[arg(long, default_value_t = 5.0)]
    warmup: f64,
    /// Appends outstanding in throughput.
    #[arg(long, default_value_t = 256)]
    inflight: usize,
    /// Unacknowledged appends at most in latency-open and tail.
    #[arg(long, default_value_t = 1024)]
    outstanding: usize,
    /// Seconds given to acks and deliveries after the end.
    #[arg(long, default_value_t = 5.0)]
    drain: f64,
    /// Worker threads of the client's tokio runtime.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Seconds of pause between modes.
    #[arg(long, default_value_t = 2.0)]
    pause: f64,
    /// Free text copied into every JSON line.
    #[arg(long, default_value = "")]
    label: String,
    /// Also append the JSON lines to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// A process of the cluster whose CPU time (all threads) is reported per mode; repeat for
    /// several (for the sandbox: the one `quire sandbox` process).
    #[arg(long = "cpu-pid")]
    cpu_pids: Vec<u32>,
    /// The sandbox's data directory: the quorum of each mode's ledgers is read from its
    /// metadata file into peer_info.
    #[arg(long)]
    sandbox_dir: Option<PathBuf>,
    /// The JSON lines' `peer`.
    #[arg(long, default_value = "quire")]
    peer: String,
    /// Free text for peer_info.version (e.g. the commit the cluster runs); default: this
    /// quire-perf's version.
    #[arg(long)]
    peer_version: Option<String>,
    /// Prefix of the streams (default: quire-perf-workload-<unix ms>).
    #[arg(long)]
    stream_prefix: Option<String>,
}

fn secs(s: f64, what: &str) -> Result<Duration> {
    if !s.is_finite() || s < 0.0 {
        bail!("{what} must be a non-negative number of seconds, not {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::Workload(w)) = args.command {
        return match run_workload(w) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("quire-perf workload: error: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    match run(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("quire-perf: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<bool> {
    if let Some(ca) = &args.tls_ca_file {
        quire_perf::client::set_tls(
            ca.clone(),
            args.tls_cert_file.clone(),
            args.tls_key_file.clone(),
        )?;
    }
    let proxy = args
        .proxy
        .clone()
        .context("--proxy is required (or QUIRE_PROXY)")?;
    let slo_text = match &args.slo {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("cannot read SLO file {}", p.display()))?,
        None => DEFAULT_SLO.to_string(),
    };
    let slos = slo::parse(&slo_text).with_context(|| {
        format!(
            "SLO file {}",
            args.slo
                .as_ref()
                .map_or("(built-in)".into(), |p| p.display().to_string())
        )
    })?;
    if !(args.rate.is_finite() && args.rate > 0.0) {
        bail!("--rate must be above 0");
    }
    if args.record_bytes < quire_perf::payload::PAYLOAD_HEADER_SIZE_BYTES {
        bail!(
            "--record-bytes must be at least {}",
            quire_perf::payload::PAYLOAD_HEADER_SIZE_BYTES
        );
    }
    if args.batch == 0 || args.streams == 0 {
        bail!("--batch and --streams must be at least 1");
    }
    let shape = LoadShape {
        rate_records_per_s: args.rate,
        warmup: secs(args.warmup_seconds, "--warmup-seconds")?,
        duration: secs(args.seconds, "--seconds")?,
        record_size_bytes: args.record_bytes,
        batch: args.batch,
        streams: args.streams,
        in_flight_max: args.in_flight_max,
        drain_timeout: secs(args.drain_timeout_seconds, "--drain-timeout-seconds")?,
    };
    let has = |w: Workload| args.workloads.contains(&w);
    let baseline_dir = args.baseline_dir.clone().or_else(|| args.data_dir.clone());
    if has(Workload::Baseline) && baseline_dir.is_none() {
        bail!("the baseline needs a directory on the journal device: give --data-dir (the sandbox's) or --baseline-dir, or leave `baseline` out of --workloads");
    }
    let started_unix_ms = quire_clock::unix_ms();
    let prefix = args
        .stream_prefix
        .clone()
        .unwrap_or_else(|| format!("quire-perf-{started_unix_ms}"));
    let progress = Progress::new(args.quiet);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let scan_rt =
        quire_client::catch_up_read_runtime(1, args.scanner_nice).context("scanner runtime")?;
    let mut results = RunResults::default();
    let baseline = match (&baseline_dir, has(Workload::Baseline)) {
        (Some(dir), true) => {
            progress.phase(
                &format!(
                    "pre-writing the {} MiB baseline file in {}",
                    args.baseline_file_mib,
                    dir.display()
                ),
                Duration::from_secs(2),
            );
            Some((
                BaselineFile::prepare(dir, args.baseline_file_mib << 20)?,
                BaselineConfig {
                    dir: dir.clone(),
                    file_size_bytes: args.baseline_file_mib << 20,
                    test_duration: secs(args.baseline_seconds, "--baseline-seconds")?,
                    sync: args.baseline_sync,
                    seq_block_size_bytes: 1 << 20,
                },
            ))
        }
        _ => None,
    };
    let measure_baseline = |label: &str| -> Result<Option<BaselineResult>> {
        let Some((file, cfg)) = &baseline else {
            return Ok(None);
        };
        progress.phase(
            &format!("raw-device baseline ({label})"),
            cfg.test_duration * 2,
        );
        let r = file.measure(cfg)?;
        progress.println(&format!(
            "  baseline ({label}): append {}; sequential {:.1} MiB/s",
            r.append,
            r.seq_write_bytes_per_s / 1048576.0
        ));
        Ok(Some(r))
    };
    results.baseline_start = measure_baseline("start")?;
    let p99_max = slo::throughput_p99_bound_ms(
        &slos,
        args.throughput_p99_ms,
        results.baseline_start.as_ref().map(|b| b.append.p99_ms),
        slo::THROUGHPUT_P99_MS_DEFAULT,
    );

    rt.block_on(async {
        let cluster = Cluster::connect(
            &proxy,
            args.connections,
            prefix.clone(),
            started_unix_ms,
            progress.clone(),
            scan_rt.handle().clone(),
        )
        .await?;
        if has(Workload::TailWrite) {
            let r = cluster.tail_write(&shape, "tail-write").await?;
            progress.println(&format!("  tail-write: {}", r.latency));
            results.tail_write = Some(r);
        }
        if has(Workload::Throughput) {
            let step = LoadShape {
                warmup: Duration::from_secs(1),
                duration: secs(args.throughput_step_seconds, "--throughput-step-seconds")?,
                drain_timeout: Duration::from_secs(5),
                ..shape
            };
            let r = cluster
                .throughput(
                    &step,
                    args.throughput_start_rate,
                    args.throughput_max_rate,
                    args.throughput_refine_steps,
                    p99_max,
                    args.write_amplification,
                    Duration::from_secs(3),
                )
                .await?;
            results.throughput = Some(r);
        }
        if has(Workload::TailRead) {
            let r = cluster.tail_read(&shape).await?;
            progress.println(&format!("  tail-read: delivery {}", r.delivery));
            results.tail_read = Some(r);
        }
        if has(Workload::CatchUp) || has(Workload::Isolation) {
            let backlog = cluster
                .fill_backlog(args.backlog_mib << 20, args.record_bytes)
                .await?;
            progress.println(&format!(
                "  backlog: {} records in {:.1} s",
                backlog.records, backlog.fill_seconds
            ));
            if has(Workload::CatchUp) {
                let r = cluster.catch_up(&backlog).await?;
                progress.println(&format!(
                    "  catch-up: {:.1} MiB/s",
                    r.bytes_per_s() / 1048576.0
                ));
                results.catch_up = Some(r);
            }
            if has(Workload::Isolation) {
                let r = cluster.isolation(&shape, &backlog).await?;
                progress.println(&format!(
                    "  isolation: alone p99 {:.3} ms, with scan p99 {:.3} ms",
                    r.alone.latency.p99_ms, r.with_scan.latency.p99_ms
                ));
                results.isolation = Some(r);
            }
        }
        anyhow::Ok(())
    })?;
    if !args.baseline_once {
        results.baseline_end = measure_baseline("end")?;
    }
    drop(baseline);
    progress.finish();

    let metrics = derive_metrics(&results);
    let overloaded = overloaded_metrics(&results);
    let outcomes = slo::evaluate(&slos, &metrics, &overloaded);
    let passed = slo::all_passed(&outcomes);
    let report = Report {
        format: REPORT_FORMAT.to_string(),
        started_unix_ms,
        config: serde_json::to_value(&args).context("serialise the settings")?,
        reference: reference(
            results.baseline_start.as_ref(),
            results.baseline_end.as_ref(),
        ),
        results,
        metrics,
        overloaded_metrics: overloaded,
        slo: outcomes,
        passed,
    };
    std::fs::write(&args.json, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("cannot write {}", args.json.display()))?;
    std::fs::write(
        &args.plot,
        render_svg(&plot_title(&args), &plot_series(&report.results)),
    )
    .with_context(|| format!("cannot write {}", args.plot.display()))?;
    print!("{}", human_summary(&report));
    println!(
        "report: {}  plot: {}",
        args.json.display(),
        args.plot.display()
    );
    Ok(passed)
}

fn plot_title(args: &Args) -> String {
    format!(
        "quire-perf latency distribution ({:.0} rec/s, {} B records, {} stream(s))",
        args.rate, args.record_bytes, args.streams
    )
}

fn plot_series(r: &RunResults) -> Vec<Series> {
    let mut out = Vec::new();
    let mut add = |label: String, points: &[(f64, f64)]| {
        out.push(Series {
            label,
            points: points.to_vec(),
        })
    };
    if let Some(b) = &r.baseline_start {
        add("raw 4 KiB durable append".into(), &b.append_distribution);
    }
    if let Some(t) = &r.tail_write {
        add(
            format!("tail-write {:.0}/s", t.rate_records_per_s),
            &t.distribution,
        );
    }
    if let Some(t) = &r.tail_read {
        add("tail-read delivery".into(), &t.delivery_distribution);
    }
    if let Some(i) = &r.isolation {
        add("isolation: alone".into(), &i.alone.distribution);
        add("isolation: with scan".into(), &i.with_scan.distribution);
    }
    if let Some(t) = &r.throughput {
        if let Some(best) = t.steps.iter().filter(|s| s.passed).max_by(|a, b| {
            a.run
                .rate_records_per_s
                .total_cmp(&b.run.rate_records_per_s)
        }) {
            add(
                format!(
                    "throughput {:.0}/s (best ok step)",
                    best.run.rate_records_per_s
                ),
                &best.run.distribution,
            );
        }
    }
    out
}

/// Whether a mode's figures make a clean result (workload.md: a run with errors or missing
/// records is reported with them and does not count).
fn clean(v: &serde_json::Value) -> bool {
    let zero = |k: &str| v[k].as_u64().unwrap_or(0) == 0;
    [
        "errors",
        "unacked_after_drain",
        "abandoned_after_drain",
        "missing_measured",
        "duplicates",
        "out_of_order",
        "reader_errors",
    ]
    .iter()
    .all(|k| zero(k))
}

fn run_workload(a: WorkloadArgs) -> Result<bool> {
    if a.size < quire_perf::record::RECORD_HEADER_SIZE_BYTES {
        bail!(
            "--size must be at least {} (stamp and sequence number)",
            quire_perf::record::RECORD_HEADER_SIZE_BYTES
        );
    }
    if a.rate == 0 || a.inflight == 0 || a.outstanding == 0 || a.threads == 0 {
        bail!("--rate, --inflight, --outstanding and --threads must be at least 1");
    }
    let p = Params {
        size: a.size,
        rate: a.rate,
        duration: secs(a.duration, "--duration")?,
        warmup: secs(a.warmup, "--warmup")?,
        inflight: a.inflight,
        outstanding: a.outstanding,
        drain: secs(a.drain, "--drain")?,
    };
    if p.duration.is_zero() {
        bail!("--duration must be above 0");
    }
    let pause = secs(a.pause, "--pause")?;
    let prefix = a
        .stream_prefix
        .clone()
        .unwrap_or_else(|| format!("quire-perf-workload-{}", quire_clock::unix_ms()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.threads)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let mut out_file = match &a.out {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open {}", path.display()))?,
        ),
        None => None,
    };
    let mut rows = Vec::new();
    let mut all_clean = true;
    rt.block_on(async {
        let target = cw::Target::connect(&a.proxy, prefix, a.cpu_pids.clone()).await?;
        // The limit is the proxy's (told at connect); a record above it fails every append, so
        // a run would measure nothing but errors.
        let record_limit = target.writer.record_size_bytes_max() as usize;
        if p.size > record_limit {
            bail!(
                "--size {} is above the proxy's record limit of {record_limit} bytes",
                p.size
            );
        }
        let processes: Vec<serde_json::Value> = a
            .cpu_pids
            .iter()
            .map(|pid| {
                serde_json::json!({"pid": pid, "cmdline": quire_perf::procfs::cmdline(&pid.to_string())})
            })
            .collect();
        for (i, mode) in a.modes.iter().enumerate() {
            if i > 0 {
                // Let the previous mode's background work (syncs, checkpoints) settle.
                tokio::time::sleep(pause).await;
            }
            let limit = p.warmup + p.duration + p.drain + Duration::from_secs(60);
            let (mut v, stream) = tokio::time::timeout(limit, target.run(*mode, &p))
                .await
                .with_context(|| format!("{} did not finish within {limit:?}", mode.name()))??;
            let quorum = match &a.sandbox_dir {
                Some(dir) => cw::quorum_from_sandbox(dir, &stream),
                None => serde_json::json!({"error": "not read (give --sandbox-dir for a sandbox); \
                    the proxy protocol does not report ledger quorums"}),
            };
            let version = a.peer_version.clone().unwrap_or_else(|| {
                format!(
                    "quire {} (this quire-perf build's version; the proxy does not report its own)",
                    env!("CARGO_PKG_VERSION")
                )
            });
            v["peer"] = a.peer.clone().into();
            v["mode"] = mode.name().into();
            v["label"] = a.label.clone().into();
            v["unix_time"] = (quire_clock::unix_ms() / 1000).into();
            v["stream"] = stream.into();
            v["peer_info"] = serde_json::json!({
                "system": "quire",
                "version": version,
                "proxy": a.proxy,
                "frame_size_bytes_max": target.writer.frame_size_bytes_max(),
                "record_size_bytes_max": target.writer.record_size_bytes_max(),
                "durability": cw::DURABILITY,
                "quorum": quorum,
                "processes": processes,
                "client": format!(
                    "quire-perf workload: quire_client::ProxyClient, one connection for the \
                     appends (ordered submission) and one for the tail reader; tokio with {} \
                     worker threads; paced sends from a thread of their own (nanosleep, 1 ns \
                     timer slack)",
                    a.threads
                ),
            });
            v["host"] = quire_perf::procfs::host_json();
            v["clean"] = clean(&v).into();
            all_clean &= clean(&v);
            let line = serde_json::to_string(&v)?;
            println!("{line}");
            if let Some(f) = &mut out_file {
                use std::io::Write;
                writeln!(f, "{line}").context("cannot append to --out")?;
            }
            let row = cw::human_row(mode.name(), &v);
            eprintln!("{row}");
            rows.push(row);
        }
        anyhow::Ok(())
    })?;
    rt.shutdown_timeout(Duration::from_secs(2));
    eprintln!("\n{}", cw::HUMAN_HEADER);
    for r in &rows {
        eprintln!("{r}");
    }
    eprintln!(
        "(latency: service time; latency-open: from schedule; throughput: ack; tail: end to end; \
         rec/s achieved; cpu: the --cpu-pid processes in the measured window)"
    );
    Ok(all_clean)
}

//! `quire-perf`: drives a running Quire cluster with open-loop load, measures latency and
//! throughput against the same run's raw-device baseline, checks SLOs, writes reports.
//! See perf/README.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use quire_perf::baseline::{BaselineConfig, BaselineFile, BaselineResult, SyncMode};
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
#[command(name = "quire-perf", version)]
struct Args {
    /// Proxy address (`quire sandbox` prints it).
    #[arg(long, env = "QUIRE_PROXY")]
    proxy: String,
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
    #[arg(long, default_value_t = quire_proxy::CATCH_UP_READ_NICE,
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
    /// p99 bound of the throughput search, ms; default: the SLO file's `throughput_p99_ms_max`,
    /// else its `throughput_p99_ratio_to_raw_append_p99_max` × the start baseline's append p99,
    /// else 10.
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
}

fn secs(s: f64, what: &str) -> Result<Duration> {
    if !s.is_finite() || s < 0.0 {
        bail!("{what} must be a non-negative number of seconds, not {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

fn main() -> ExitCode {
    let args = Args::parse();
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
    let started_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
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
        quire_proxy::catch_up_read_runtime(1, args.scanner_nice).context("scanner runtime")?;
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
        10.0,
    );

    rt.block_on(async {
        let cluster = Cluster::connect(
            &args.proxy,
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

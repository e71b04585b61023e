//! Process metrics and build information, exposed by every `--metrics-listen` endpoint
//! (docs/metrics.md). Names follow the Prometheus client libraries' process collector, so
//! standard dashboards and rules work: `process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
//! `process_max_fds`, `process_start_time_seconds`, `process_threads`; and
//! `quire_fault_points_active` (1 when `QUIRE_FAULT_POINTS` armed fault points, docs/fault-points.md) and
//! `quire_build_info{version,git_commit}` (always 1; `git_commit` is `unknown` when the build
//! had no git checkout). Read from `/proc/self` at scrape time (Linux `proc(5)`).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// The commit the binary was built from (`QUIRE_GIT_COMMIT` at build time, set by build.rs).
pub const GIT_COMMIT: &str = match option_env!("QUIRE_GIT_COMMIT") {
    Some(c) => c,
    None => "unknown",
};

/// What `/proc/self` says about this process.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct ProcessFigures {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub open_fds: u64,
    pub max_fds: u64,
    pub start_time_seconds: f64,
    pub threads: u64,
}

/// Reads the figures now; a figure that cannot be read stays 0 (a scrape never fails for it).
pub fn read_process() -> ProcessFigures {
    let mut f = ProcessFigures::default();
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // Fields after the command name (which may hold spaces), from field 3 (state).
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
            let v: Vec<&str> = rest.split_whitespace().collect();
            let num = |i: usize| v.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
            // stat(5) numbering: utime 14, stime 15, num_threads 20, starttime 22, vsize 23,
            // rss 24; `v[0]` is field 3.
            f.cpu_seconds = (num(11) + num(12)) as f64 / ticks;
            f.threads = num(17);
            f.virtual_bytes = num(20);
            f.resident_bytes = num(21) * page;
            f.start_time_seconds = boot_time_seconds() + num(19) as f64 / ticks;
        }
    }
    f.open_fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the plain struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        f.max_fds = lim.rlim_cur;
    }
    f
}

/// `btime` of /proc/stat: the boot time in seconds since the Unix epoch.
fn boot_time_seconds() -> f64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    git_commit: &'static str,
}

/// The collector of the process figures and build information.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let f = read_process();
        let cpu = ConstCounter::new(f.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time spent, in seconds.",
            None,
            MetricType::Counter,
        )?)?;
        let gauges: [(&str, &str, f64); 7] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                f.resident_bytes as f64,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                f.virtual_bytes as f64,
            ),
            (
                "process_open_fds",
                "Open file descriptors.",
                f.open_fds as f64,
            ),
            (
                "process_max_fds",
                "Most open file descriptors allowed (RLIMIT_NOFILE).",
                f.max_fds as f64,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds.",
                f.start_time_seconds,
            ),
            (
                "process_threads",
                "Threads of the process.",
                f.threads as f64,
            ),
            (
                "quire_fault_points_active",
                "1 when QUIRE_FAULT_POINTS armed fault points in this process (tests only; docs/fault-points.md), else 0.",
                f64::from(u8::from(quire_faults::active())),
            ),
        ];
        for (name, help, v) in gauges {
            let g = ConstGauge::new(v);
            g.encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "quire_build_info",
            "Always 1; the labels name the build (version, git commit).",
            None,
            MetricType::Gauge,
        )?;
        let labels = BuildLabels {
            version: env!("CARGO_PKG_VERSION"),
            git_commit: GIT_COMMIT,
        };
        ConstGauge::new(1i64).encode(family.encode_family(&labels)?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        // Goal: the figures are this process's, not zeros: it has a resident set, open
        // files (stdin at least), a thread and a start time after boot.
        let _burn: u64 = (0..2_000_000u64).fold(0, |a, b| a.wrapping_add(b * b));
        let f = read_process();
        assert!(f.resident_bytes > 1 << 20, "{f:?}");
        assert!(f.open_fds >= 1 && f.max_fds >= f.open_fds, "{f:?}");
        assert!(f.threads >= 1, "{f:?}");
        let now = quire_clock::unix_ms() as f64 / 1000.0;
        assert!(
            f.start_time_seconds > 1e9 && f.start_time_seconds <= now + 1.0,
            "{f:?}"
        );
        assert!(f.cpu_seconds >= 0.0, "{f:?}");
    }
}

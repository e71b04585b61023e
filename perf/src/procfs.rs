//! What the common workload's report says about the host and the processes under test, read
//! from Linux's /proc: CPU time of given processes (`/proc/PID/stat`), CPU count, load average
//! and pressure stall figures (`/proc/loadavg`, `/proc/pressure/{cpu,io}`).

use std::path::Path;

/// Why a `/proc/PID/stat` text could not be read as CPU times.
#[derive(Debug, thiserror::Error)]
pub enum StatError {
    /// The file could not be read (the process is gone, or /proc is not mounted).
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The text has no `(comm)` field closed by `)`.
    #[error("no closing ')' after the command name")]
    NoCommand,
    /// Fewer fields than `stime` (field 15) after the command name.
    #[error("only {fields} fields after the command name, need 13 to reach stime")]
    TooShort {
        /// Fields found after `)`.
        fields: usize,
    },
    /// `utime` or `stime` is not a decimal number.
    #[error("field {field} is {text:?}, not a number of clock ticks")]
    NotANumber {
        /// 1-based field number as proc(5) counts them (14 = utime, 15 = stime).
        field: usize,
        /// What was there.
        text: String,
    },
}

/// CPU time of one process, in clock ticks (`sysconf(_SC_CLK_TCK)` per second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTicks {
    /// Time in user mode (proc(5) field 14, `utime`), all threads of the process.
    pub utime: u64,
    /// Time in kernel mode (field 15, `stime`), all threads of the process.
    pub stime: u64,
}

impl CpuTicks {
    /// `utime + stime`.
    pub fn total(&self) -> u64 {
        self.utime + self.stime
    }
}

/// Parses the text of `/proc/PID/stat`. The command name (field 2) is in parentheses and may
/// itself hold spaces and `)`, so fields are counted after the *last* `)`: there field 3
/// (`state`) comes first and `utime`/`stime` are the 12th and 13th.
///
/// For a process (thread-group leader) the kernel sums the times of all its threads, live and
/// exited, so one reading covers every thread of a multi-threaded server such as `quire
/// sandbox` (bookie shards, proxy runtime, metadata).
///
/// # Errors
/// [`StatError::NoCommand`], [`StatError::TooShort`], [`StatError::NotANumber`].
pub fn parse_stat(text: &str) -> Result<CpuTicks, StatError> {
    let close = text.rfind(')').ok_or(StatError::NoCommand)?;
    let fields: Vec<&str> = text[close + 1..].split_ascii_whitespace().collect();
    if fields.len() < 13 {
        return Err(StatError::TooShort {
            fields: fields.len(),
        });
    }
    let num = |i: usize| {
        fields[i].parse::<u64>().map_err(|_| StatError::NotANumber {
            field: i + 3,
            text: fields[i].to_string(),
        })
    };
    Ok(CpuTicks {
        utime: num(11)?,
        stime: num(12)?,
    })
}

/// Reads `/proc/PID/stat` of `pid` (use `"self"` for this process).
///
/// # Errors
/// [`StatError::Read`] if the process is gone; parse errors as [`parse_stat`].
pub fn read_cpu_ticks(pid: &str) -> Result<CpuTicks, StatError> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|source| StatError::Read {
        path: path.clone(),
        source,
    })?;
    parse_stat(&text)
}

/// Clock ticks per second of `/proc/PID/stat`'s times (`sysconf(_SC_CLK_TCK)`, 100 on every
/// common Linux build; 100 if sysconf fails).
pub fn clock_ticks_per_s() -> u64 {
    // SAFETY: sysconf reads a constant of the system; no memory is involved.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// CPU seconds between two readings of the same process at `ticks_per_s` (0 if the second is
/// below the first, which only a recycled pid can cause).
pub fn cpu_seconds(before: CpuTicks, after: CpuTicks, ticks_per_s: u64) -> f64 {
    after.total().saturating_sub(before.total()) as f64 / ticks_per_s.max(1) as f64
}

/// The process's command line (`/proc/PID/cmdline`, NULs as spaces), if readable.
pub fn cmdline(pid: &str) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let text: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    Some(text.join(" "))
}

/// The "some avg10" figure (percent of the last 10 s in which some task waited) of a pressure
/// stall file's text, as in `/proc/pressure/cpu`.
pub fn parse_psi_some_avg10(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_ascii_whitespace()
        .find_map(|f| f.strip_prefix("avg10="))?
        .parse()
        .ok()
}

/// "some avg10" of `/proc/pressure/<what>` (`cpu`, `io`, `memory`), if the kernel has PSI.
pub fn psi_some_avg10(what: &str) -> Option<f64> {
    parse_psi_some_avg10(&std::fs::read_to_string(Path::new("/proc/pressure").join(what)).ok()?)
}

/// The 1, 5 and 15 minute load averages, as `/proc/loadavg` writes them ("0.52 0.61 0.70").
pub fn loadavg() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(
        text.split_ascii_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// The workload report's `host` object: `{cpus, loadavg_at_end, cpu_pressure_avg10,
/// io_pressure_avg10}` (CPUs this process may run on; pressures in percent, `null` without PSI).
pub fn host_json() -> serde_json::Value {
    serde_json::json!({
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "loadavg_at_end": loadavg(),
        "cpu_pressure_avg10": psi_some_avg10("cpu"),
        "io_pressure_avg10": psi_some_avg10("io"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: utime and stime are fields 14 and 15 of proc(5), counted after the command name
    // even when that name holds spaces and parentheses. Method: a real line of a sandbox
    // (fields as the kernel writes them) and the same with a hostile command name.
    #[test]
    fn parses_utime_and_stime() {
        let line = "4242 (quire) S 1 4242 4242 0 -1 4194560 12000 0 0 0 1234 567 0 0 20 0 9 0 \
                    100 500000000 8000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            parse_stat(line).unwrap(),
            CpuTicks {
                utime: 1234,
                stime: 567
            }
        );
        let hostile = line.replace("(quire)", "(a) b) (c d)");
        assert_eq!(parse_stat(&hostile).unwrap().total(), 1801);
    }

    // Goal: malformed text is an error naming what is wrong, never a panic. Method: no ')',
    // too few fields, a non-number in utime.
    #[test]
    fn malformed_stat_is_an_error() {
        assert!(matches!(
            parse_stat("4242 quire S 1"),
            Err(StatError::NoCommand)
        ));
        assert!(matches!(
            parse_stat("4242 (quire) S 1 2 3"),
            Err(StatError::TooShort { fields: 4 })
        ));
        let bad = "1 (x) S 1 1 1 0 -1 0 0 0 0 0 12x 5 0";
        match parse_stat(bad) {
            Err(StatError::NotANumber { field: 14, text }) => assert_eq!(text, "12x"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            read_cpu_ticks("999999999"),
            Err(StatError::Read { .. })
        ));
    }

    // Goal: CPU seconds are the tick difference over the tick rate, and this process's own
    // reading grows while it computes. Method: arithmetic on known ticks; then spin until this
    // thread used 300 ms of CPU and read /proc/self/stat before and after (the process total
    // includes that thread, so it grew by at least 0.2 s even at a 100 Hz tick's granularity).
    #[test]
    fn cpu_seconds_of_a_spinning_process() {
        let a = CpuTicks {
            utime: 100,
            stime: 50,
        };
        let b = CpuTicks {
            utime: 250,
            stime: 75,
        };
        assert_eq!(cpu_seconds(a, b, 100), 1.75);
        assert_eq!(cpu_seconds(b, a, 100), 0.0);
        let hz = clock_ticks_per_s();
        let before = read_cpu_ticks("self").unwrap();
        // Spin until this thread itself has run 300 ms (its own CPU clock), however busy the
        // machine is.
        let thread_cpu_ns = || {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: a valid pointer to a timespec we own.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
        };
        let start = thread_cpu_ns();
        let mut x = 1u64;
        while thread_cpu_ns() - start < 300_000_000 {
            x = crate::record::xorshift64(x);
        }
        std::hint::black_box(x);
        let after = read_cpu_ticks("self").unwrap();
        let s = cpu_seconds(before, after, hz);
        assert!(s >= 0.2, "{s} CPU s for 300 ms of spinning");
    }

    // Goal: the pressure figure is the "some" line's avg10. Method: the kernel's format.
    #[test]
    fn pressure_avg10() {
        let text = "some avg10=1.53 avg60=0.87 avg300=0.40 total=123456\n\
                    full avg10=0.20 avg60=0.10 avg300=0.05 total=2345\n";
        assert_eq!(parse_psi_some_avg10(text), Some(1.53));
        assert_eq!(parse_psi_some_avg10("full avg10=2.0"), None);
        let host = host_json();
        let mut keys: Vec<&String> = host.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "cpu_pressure_avg10",
                "cpus",
                "io_pressure_avg10",
                "loadavg_at_end"
            ]
        );
        assert!(host["cpus"].as_u64().unwrap() >= 1);
    }
}

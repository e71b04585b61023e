//! The progress line: counters the workloads bump, drawn on stderr by indicatif a few times per
//! second (hidden when stderr is not a terminal; a plain line per phase is printed instead).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Counters of the phase in progress.
#[derive(Debug, Default)]
pub struct Counters {
    /// Sends issued.
    pub sent: AtomicU64,
    /// Sends acknowledged.
    pub done: AtomicU64,
    /// Sends that failed.
    pub errors: AtomicU64,
    /// Records read (tail and catch-up readers).
    pub read: AtomicU64,
}

impl Counters {
    fn reset(&self) {
        for c in [&self.sent, &self.done, &self.errors, &self.read] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

struct Phase {
    name: String,
    started: Instant,
    planned: Duration,
}

/// The progress display shared by all workloads.
pub struct Progress {
    /// Counters of the current phase.
    pub counters: Arc<Counters>,
    phase: Mutex<Phase>,
    bar: ProgressBar,
    tty: bool,
    quiet: bool,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress").finish_non_exhaustive()
    }
}

impl Progress {
    /// A progress line on stderr; `quiet` hides it entirely.
    pub fn new(quiet: bool) -> Arc<Self> {
        let tty = !quiet && std::io::IsTerminal::is_terminal(&std::io::stderr());
        let bar = if quiet {
            ProgressBar::hidden()
        } else {
            ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(4))
        };
        bar.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("constant template"));
        let p = Arc::new(Self {
            counters: Arc::new(Counters::default()),
            phase: Mutex::new(Phase {
                name: String::new(),
                started: quire_clock::now(),
                planned: Duration::ZERO,
            }),
            bar,
            tty,
            quiet,
        });
        let weak = Arc::downgrade(&p);
        std::thread::Builder::new()
            .name("perf-progress".into())
            .spawn(move || {
                while let Some(p) = weak.upgrade() {
                    p.bar.set_message(p.line());
                    p.bar.tick();
                    drop(p);
                    std::thread::sleep(Duration::from_millis(250));
                }
            })
            .expect("spawn progress thread");
        p
    }

    /// Starts a phase named `name` expected to take about `planned`; resets the counters.
    pub fn phase(&self, name: &str, planned: Duration) {
        self.counters.reset();
        *self.phase.lock().expect("phase lock") = Phase {
            name: name.to_string(),
            started: quire_clock::now(),
            planned,
        };
        if !self.tty && !self.quiet {
            eprintln!("quire-perf: {name} (about {:.0} s)", planned.as_secs_f64());
        }
    }

    /// Prints a line above the progress line.
    pub fn println(&self, line: &str) {
        if self.tty {
            self.bar.println(line);
        } else if !self.quiet {
            eprintln!("{line}");
        }
    }

    /// Removes the progress line.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    fn line(&self) -> String {
        let ph = self.phase.lock().expect("phase lock");
        let c = &self.counters;
        let (sent, done, errors, read) = (
            c.sent.load(Ordering::Relaxed),
            c.done.load(Ordering::Relaxed),
            c.errors.load(Ordering::Relaxed),
            c.read.load(Ordering::Relaxed),
        );
        format!(
            "{}: {:.1}/{:.0} s  sent {sent}  acked {done}  in flight {}  errors {errors}  read {read}",
            ph.name,
            quire_clock::elapsed(ph.started).as_secs_f64(),
            ph.planned.as_secs_f64(),
            sent.saturating_sub(done + errors),
        )
    }
}

//! `quire-chaos`: the chaos runner's command line (see the library docs and README.md's
//! "Chaos runs").
//!
//! - `quire-chaos run [--seed S] [--schedules N] [--budget 5m] [--window-ms 3000]`: starts a
//!   cluster and plays the schedules of seeds S, S+1, …, S+N-1 (S from the clock when not
//!   given) until N are done or the budget is spent; exit 0 when every schedule is clean, 1
//!   on a violation, 2 when there was none but the cluster did not recover after a schedule.
//! - `quire-chaos show --seed S [--schedules N]`: prints the schedules without running them.
//! - `--pinned` instead of `--seed`: the regression schedules ([`quire_chaos::pinned`]).

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "quire-chaos",
    about = "Seeded fault schedules over a real Quire cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a cluster and play schedules on it, checking each with the history checker.
    Run {
        #[command(flatten)]
        seeds: Seeds,
        /// Stop starting schedules after this long (e.g. 90s, 5m, 2h).
        #[arg(long, default_value = "5m", value_parser = quire_chaos::parse_budget)]
        budget: Duration,
        /// The `quire` binary the processes run (default: `quire` beside this executable).
        #[arg(long)]
        quire_bin: Option<std::path::PathBuf>,
    },
    /// Print the schedules of the seeds without running them.
    Show {
        #[command(flatten)]
        seeds: Seeds,
    },
}

#[derive(clap::Args)]
struct Seeds {
    /// The first schedule's seed (the k-th schedule's is seed + k); default: from the clock.
    #[arg(long)]
    seed: Option<u64>,
    /// Number of schedules.
    #[arg(long, default_value_t = 1000)]
    schedules: u64,
    /// Faults start within this many milliseconds of a schedule's start.
    #[arg(long, default_value_t = 3000)]
    window_ms: u64,
    /// Keep the bookies on the host disk and draw no full-disk faults (the default when not
    /// root: small loop-mounted disks need root).
    #[arg(long)]
    no_disk_faults: bool,
    /// Play the pinned regression schedules (each finding, as its seed drew it when found)
    /// instead of drawing from seeds.
    #[arg(long, conflicts_with = "seed")]
    pinned: bool,
}

impl Seeds {
    fn list(&self) -> (u64, impl Iterator<Item = u64>) {
        let first = self.seed.unwrap_or_else(quire_chaos::clock_seed);
        let n = self.schedules;
        (first, (0..n).map(move |k| first.wrapping_add(k)))
    }

    /// The pinned schedules with `--pinned`, else the schedules the seeds draw.
    fn schedules(&self) -> Vec<quire_chaos::Schedule> {
        if self.pinned {
            return quire_chaos::pinned::pinned();
        }
        let shape = self.shape();
        let list = self.list().1;
        list.map(|s| quire_chaos::Schedule::draw(s, shape))
            .collect()
    }

    fn shape(&self) -> quire_chaos::Shape {
        let disks = !self.no_disk_faults && quire_chaos::is_root();
        quire_chaos::shape(Duration::from_millis(self.window_ms), disks)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Show { seeds } => {
            for schedule in seeds.schedules() {
                print!("{schedule}");
            }
            ExitCode::SUCCESS
        }
        Command::Run {
            seeds,
            budget,
            quire_bin,
        } => {
            set_quire_bin(quire_bin);
            quire_chaos::stop_on_signals();
            let schedules = seeds.schedules();
            println!(
                "chaos: first seed {}, up to {} schedules, budget {budget:?}",
                schedules.first().map_or(0, |s| s.seed),
                schedules.len()
            );
            let mut runner = quire_chaos::Runner::start(seeds.shape());
            let summary = runner.run_schedules(schedules, budget);
            if !summary.failed().is_empty() {
                ExitCode::from(1)
            } else if !summary.unrecovered().is_empty() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}

/// Points the harness at the `quire` binary: `--quire-bin`, else `QUIRE_TEST_BIN`, else
/// `quire` beside this executable (both are in `target/release` after a workspace build).
fn set_quire_bin(flag: Option<std::path::PathBuf>) {
    let bin = flag.or_else(|| {
        if std::env::var_os("QUIRE_TEST_BIN").is_some() {
            return None;
        }
        let exe = std::env::current_exe().ok()?;
        Some(exe.parent()?.join("quire"))
    });
    if let Some(bin) = bin {
        // Single-threaded here: nothing has started a thread yet.
        std::env::set_var("QUIRE_TEST_BIN", bin);
    }
}

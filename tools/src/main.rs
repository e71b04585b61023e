//! `quire`: the command-line front of Quire.
//!
//! * `quire sandbox` runs a whole cluster in one process: the embedded metadata store, three
//!   bookies and a proxy.
//! * `quire write`, `quire read` and `quire tail` move records between files or pipes and
//!   streams through a proxy.
//!
//! * `quire bookie --config FILE` and `quire proxy --config FILE` run one bookie or one proxy of
//!   a multi-process cluster whose metadata lives in ZooKeeper.
//! * `quire ledger show|recover` and `quire bookie list` inspect and repair the cluster through
//!   its metadata store.
//! * `quire stream list|show|truncate|delete|retention` manage streams through a proxy.
//! * `quire autorecovery` runs a standalone autorecovery daemon (one also runs inside every
//!   `quire bookie` by default); `quire autorecovery status` and `quire ledger list
//!   --under-replicated` show its work.
//!
//! Errors are one line on stderr and a non-zero exit status.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

// One module per command.
// Time in tools/src goes through the quire_clock seam (issue 25 item 5, clippy.toml).
mod autorecovery;
mod bookie;
mod client;
mod cluster;
mod cluster_region;
mod config_show;
mod debug;
mod ledger;
mod proxy;
mod sandbox;
mod stream;
mod tls;
mod token;

// What the commands share.
mod admin;
mod config;
#[cfg(test)]
mod defaults_test;
mod flags;
mod gc;
mod metadata;
mod metrics_http;
mod options;
mod process_metrics;
mod secret_file;
mod zk_metrics;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Proxy address used when neither `--proxy` nor `QUIRE_PROXY` is given; the sandbox's default
/// listen address (DistributedLog's write proxy listens on a fixed well-known port too).
pub const PROXY_ADDR_DEFAULT: &str = "127.0.0.1:4181";

#[derive(Parser, Debug)]
#[command(
    name = "quire",
    version,
    about = "Quire: a replicated log service (DistributedLog on BookKeeper, in Rust)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a one-machine cluster: embedded metadata store, bookies and a proxy, until
    /// interrupted. Restarted on the same data directory, it serves everything it
    /// acknowledged before.
    Sandbox(sandbox::SandboxArgs),
    /// Append records (by default one per input line: the line without its LF, CR and every
    /// other byte kept; or `--format json|binary`), creating the stream if needed. Prints the
    /// count and the first and last DLSN.
    Write(client::WriteArgs),
    /// Print a stream's records (by default each followed by LF; or `--format json|binary`).
    Read(client::ReadArgs),
    /// Like read, then keep printing new records as they are acknowledged.
    Tail(client::ReadArgs),
    /// Run one bookie (`--config FILE`, flags override its keys) until SIGINT/SIGTERM; or
    /// `quire bookie list`, `quire bookie info ADDR`.
    // Boxed: its many optional settings make it much larger than the other commands.
    Bookie(Box<bookie::BookieArgs>),
    /// Run one proxy (`--config FILE`, flags override its keys) until SIGINT/SIGTERM; or
    /// `quire proxy list`.
    // Boxed like `Bookie`, for the same reason.
    Proxy(Box<proxy::ProxyArgs>),
    /// Ledger admin: `list [--under-replicated]`, `show LEDGER`, `recover LEDGER`.
    Ledger(ledger::LedgerArgs),
    /// Run a standalone autorecovery daemon (auditor candidate and replication worker) until
    /// SIGINT/SIGTERM; or `quire autorecovery status`.
    Autorecovery(autorecovery::AutorecoveryArgs),
    /// Stream admin through a proxy: `list`, `show STREAM`, `truncate STREAM DLSN`,
    /// `delete STREAM`, `retention STREAM [--time-secs N] [--size-bytes N]`.
    Stream(stream::StreamArgs),
    /// Proxy tokens: `new NAME [--read P] [--write P] [--admin P]` makes a token and its entry
    /// for the proxies' `auth_tokens_file`.
    Token(token::TokenArgs),
    /// Make a test or small-cluster CA and one certificate for the given names:
    /// `--out DIR --san HOST [--san HOST ...]` writes ca.pem, node.pem, node.key.
    TlsCerts(tls::TlsCertsArgs),
    /// Print a shell completion script: `quire completions bash|zsh|fish` (e.g.
    /// `quire completions bash > /etc/bash_completion.d/quire`).
    Completions(CompletionsArgs),
    /// Cluster health from the metadata store: `status [--json]` (exit status 1 if unhealthy);
    /// region marks: `region unavailable|available REGION`, `region list`.
    Cluster(cluster::ClusterArgs),
    /// `show --role bookie|proxy|autorecovery [--config FILE] [-- FLAGS]`: a process's
    /// effective configuration, secrets redacted.
    Config(config_show::ConfigArgs),
    /// `bundle -o FILE.tar.gz`: configuration, metrics, logs, listings and clocks for a report.
    Debug(debug::DebugArgs),
}

/// `quire completions` options.
#[derive(clap::Args, Debug)]
struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// Prints the completion script of `shell` for the whole command line.
fn completions(args: CompletionsArgs) -> anyhow::Result<()> {
    let mut cmd = command();
    clap_complete::generate(args.shell, &mut cmd, "quire", &mut std::io::stdout());
    Ok(())
}

/// Makes every panic, on any thread, end the process after the default report (the message and
/// location on stderr): fail-stop, as BookKeeper's bookie exits on an unexpected error, so that a
/// shard, journal or proxy task that panicked never leaves a half-working process behind; a
/// restart replays the journal. This replaces `panic = "abort"` in the release profile, which
/// made cargo build every library twice when binaries and tests are built together (the test
/// harness needs unwinding), and catches panics that a runtime would otherwise contain in a task.
fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
}

/// The command line, with each config-file flag's (and each sandbox flag's of a crate key) help
/// showing its default (read from the crates' `Default`s, [`flags::with_defaults`]) and the
/// processes' ZooKeeper flags their own, not their admin subcommands'
/// ([`flags::process_zookeeper_flags`]).
fn command() -> clap::Command {
    use config::{keys_of, AUTORECOVERY_KEYS, BOOKIE_KEYS, PROXY_KEYS};
    use flags::{process_zookeeper_flags, with_defaults};
    Cli::command()
        .mut_subcommand("bookie", |c| {
            let c = process_zookeeper_flags(c);
            with_defaults(c, &keys_of(BOOKIE_KEYS), &config::BookieFile::default())
        })
        .mut_subcommand("proxy", |c| {
            let c = process_zookeeper_flags(c);
            with_defaults(c, &keys_of(PROXY_KEYS), &config::ProxyFile::default())
        })
        .mut_subcommand("autorecovery", |c| {
            let c = process_zookeeper_flags(c);
            let defaults = config::AutorecoveryFile::default();
            with_defaults(c, &keys_of(AUTORECOVERY_KEYS), &defaults)
        })
        .mut_subcommand("sandbox", |c| {
            with_defaults(c, &keys_of(sandbox::KEYS), &sandbox::Defaults::default())
        })
}

/// A process started with a config file whose ZooKeeper settings an environment variable
/// replaced says so once: the variable wins over the file, which an operator reading only the
/// file would not expect.
fn warn_env_over_file(matches: &clap::ArgMatches) {
    let Some((name, sub)) = matches.subcommand() else {
        return;
    };
    if !["bookie", "proxy", "autorecovery"].contains(&name) || sub.subcommand().is_some() {
        return;
    }
    let Ok(Some(mut files)) = sub.try_get_raw("config") else {
        return;
    };
    let Some(file) = files.next() else {
        return;
    };
    for (var, value) in flags::env_overrides(sub) {
        tracing::warn!(
            "{var}={value} replaces the [zookeeper] setting of {}, if it has one",
            file.to_string_lossy()
        );
    }
}

fn main() -> ExitCode {
    abort_on_panic();
    let matches = command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Colour codes only on a terminal: a log file or journald gets plain text.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("QUIRE_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    warn_env_over_file(&matches);
    if quire_faults::init() {
        tracing::warn!(
            "{} is set: fault points are armed; this process fails requests and aborts on purpose (tests only, docs/fault-points.md)",
            quire_faults::ENV
        );
    }
    let result = match cli.command {
        Command::Sandbox(args) => sandbox::run(args),
        Command::Write(args) => client::write(args),
        Command::Read(args) => client::read(args),
        Command::Tail(args) => client::tail(args),
        Command::Bookie(args) => bookie::run(*args),
        Command::Proxy(args) => proxy::run(*args),
        Command::Ledger(args) => ledger::run(args),
        Command::Autorecovery(args) => autorecovery::run(args),
        Command::Stream(args) => stream::run(args),
        Command::Token(args) => token::run(args),
        Command::TlsCerts(args) => tls::certs(args),
        Command::Completions(args) => completions(args),
        Command::Cluster(args) => cluster::run(args),
        Command::Config(args) => config_show::run(args),
        Command::Debug(args) => debug::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error and its causes joined. Many errors already print their
            // source in their own message; a cause whose text is already there is skipped.
            let mut line = e.to_string();
            for cause in e.chain().skip(1) {
                let text = cause.to_string();
                if text.contains(&line) {
                    // The cause already says everything the context said, and more.
                    line = text;
                } else if !line.contains(&text) {
                    line.push_str(": ");
                    line.push_str(&text);
                }
            }
            eprintln!("quire: error: {line}");
            ExitCode::FAILURE
        }
    }
}

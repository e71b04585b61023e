//! A tailing consumer that checkpoints its position (issue 26 item 6), on the blocking API.
//!
//! ```text
//! cargo run --release -p quire-client --example tailing_consumer -- \
//!     --proxies 127.0.0.1:4181[,HOST:PORT...] --stream logs/app [--from head|DLSN] \
//!     [--sub NAME] [--count N] [--exit-at-end]
//! ```
//!
//! Against `quire sandbox` (its proxy listens on 127.0.0.1:4181 by default). Prints each
//! record as `DLSN<TAB>txid<TAB>payload` (payload as lossy UTF-8) on stdout and, after each
//! batch, `checkpoint DLSN` on stderr: the DLSN of the next record, which `--from` takes to
//! resume exactly after the last record printed. With `--sub NAME` it starts where
//! subscription NAME was committed (else at `--from`) and commits each checkpoint to it
//! (DistributedLog's `SubscriptionsStore`), so a restarted consumer resumes by itself. When a proxy dies the reader goes on through
//! the next one of `--proxies` (or the stream's new owner) from the same position.

use std::io::Write;
use std::time::Duration;

use quire_client::blocking::Client;
use quire_client::{ClientConfig, Dlsn, ReadPosition};

struct Args {
    proxies: Vec<String>,
    stream: String,
    from: ReadPosition,
    sub: Option<String>,
    count: Option<u64>,
    exit_at_end: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        proxies: vec!["127.0.0.1:4181".into()],
        stream: String::new(),
        from: ReadPosition::Head,
        sub: None,
        count: None,
        exit_at_end: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--proxies" => args.proxies = value()?.split(',').map(str::to_string).collect(),
            "--stream" => args.stream = value()?,
            "--from" => {
                args.from = value()?
                    .parse()
                    .map_err(|e| format!("--from: {e} (head or a DLSN such as 1:0:0)"))?
            }
            "--sub" => args.sub = Some(value()?),
            "--count" => args.count = Some(value()?.parse().map_err(|e| format!("--count: {e}"))?),
            "--exit-at-end" => args.exit_at_end = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.stream.is_empty() {
        return Err("--stream is required".into());
    }
    Ok(args)
}

/// Records how far the consumer got: printed (for `--from`) and, with `--sub`, committed to
/// the subscription. A failed commit is reported and the consumer goes on: the next commit
/// covers it, and a restart resumes at most one batch early (at-least-once).
fn checkpoint(client: &Client, args: &Args, next: Dlsn) {
    eprintln!("checkpoint {next}");
    if let Some(name) = &args.sub {
        if let Err(e) = client.commit_subscription(&args.stream, name, next) {
            eprintln!("tailing_consumer: commit of subscription {name}: {e}");
        }
    }
}

/// Where to start: the subscription's committed position when it has one, else `--from`.
fn start(client: &Client, args: &Args) -> Result<ReadPosition, String> {
    let Some(name) = &args.sub else {
        return Ok(args.from);
    };
    let info = client
        .subscription(&args.stream, name)
        .map_err(|e| format!("subscription {name}: {e}"))?;
    Ok(info.committed.map_or(args.from, ReadPosition::Dlsn))
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("tailing_consumer: {e}");
            std::process::exit(2);
        }
    };
    let config = ClientConfig {
        proxies: args.proxies.clone(),
        ..ClientConfig::default()
    };
    let client = match Client::connect_any(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tailing_consumer: {e}");
            std::process::exit(1);
        }
    };
    let from = match start(&client, &args) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("tailing_consumer: {e}");
            std::process::exit(1);
        }
    };
    let mut reader = client.reader(&args.stream, from);
    reader.settings().wait = Duration::from_secs(1);
    let mut printed = 0u64;
    let stdout = std::io::stdout();
    loop {
        let batch = match reader.next_batch() {
            Ok(b) => b,
            Err(e) => {
                eprintln!("tailing_consumer: {e}");
                std::process::exit(1);
            }
        };
        if batch.is_empty() && args.exit_at_end {
            return;
        }
        let mut out = stdout.lock();
        for (dlsn, txid, payload) in batch {
            let _ = writeln!(out, "{dlsn}\t{txid}\t{}", String::from_utf8_lossy(&payload));
            printed += 1;
            if args.count == Some(printed) {
                let _ = out.flush();
                // The position after this record, for the next run's --from.
                checkpoint(&client, &args, next_after(dlsn));
                return;
            }
        }
        let _ = out.flush();
        if let Some(next) = reader.next_dlsn() {
            checkpoint(&client, &args, next);
        }
    }
}

/// The position right after `dlsn`'s record: the next slot (a read from a slot past the end
/// of its entry moves on to the next entry).
fn next_after(dlsn: Dlsn) -> Dlsn {
    Dlsn::new(dlsn.segment_seq_no, dlsn.entry_id, dlsn.slot_index + 1)
}

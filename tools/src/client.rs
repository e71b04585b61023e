//! `quire write`, `quire read` and `quire tail`: records between files or pipes and streams.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use quire_client::{Dlsn, ProxyClient, ReadPosition, RECORD_SIZE_BYTES_MAX};

/// Where to find the proxy: `--proxy`, else `QUIRE_PROXY`, else the sandbox default.
#[derive(Args, Debug)]
pub struct ProxyArg {
    /// Proxy address (host:port).
    #[arg(long, env = "QUIRE_PROXY", default_value = crate::PROXY_ADDR_DEFAULT)]
    pub proxy: String,
    /// Token for a proxy that requires one (`quire token new`); prefer QUIRE_TOKEN, which
    /// other users cannot see in the process list.
    #[arg(long, env = "QUIRE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    #[command(flatten)]
    pub tls: crate::tls::ProxyTlsArgs,
}

/// `quire write` options.
#[derive(Args, Debug)]
pub struct WriteArgs {
    /// Stream to append to; created if it does not exist.
    stream: String,
    /// Input file; standard input when absent.
    file: Option<PathBuf>,
    #[command(flatten)]
    proxy: ProxyArg,
}

/// `quire read` options.
#[derive(Args, Debug)]
pub struct ReadArgs {
    /// Stream to read.
    stream: String,
    /// Start at `head` or at a DLSN written as `SEGMENT:ENTRY:SLOT` (as `quire write` prints).
    #[arg(long, default_value = "head")]
    from: String,
    #[command(flatten)]
    proxy: ProxyArg,
}

/// `quire tail` options.
#[derive(Args, Debug)]
pub struct TailArgs {
    /// Stream to follow.
    stream: String,
    /// Start at `head` or at a DLSN.
    #[arg(long, default_value = "head")]
    from: String,
    #[command(flatten)]
    proxy: ProxyArg,
}

/// Records per write request.
const WRITE_BATCH_RECORDS_MAX: usize = 4096;
/// Payload bytes per write request.
const WRITE_BATCH_SIZE_BYTES_MAX: usize = 2 * 1024 * 1024;
/// Records per read request.
const READ_BATCH_RECORDS_MAX: u32 = 4096;
/// Payload bytes per read request.
const READ_BATCH_SIZE_BYTES_MAX: u32 = 2 * 1024 * 1024;
/// How long one tail read waits for new records before asking again.
const TAIL_WAIT: Duration = Duration::from_secs(10);

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

pub(crate) async fn connect(proxy: &ProxyArg) -> Result<ProxyClient> {
    let config = quire_client::ClientConfig {
        token: proxy
            .token
            .as_ref()
            .map(|t| quire_client::protocol::Token(t.trim().as_bytes().to_vec())),
        tls: proxy.tls.client_config()?,
        // The certificate must carry the host as given (a name or an IP address).
        tls_server_name: Some(proxy.proxy.clone()),
        ..quire_client::ClientConfig::default()
    };
    match ProxyClient::connect_with(&proxy.proxy, config).await {
        Ok(client) => Ok(client),
        // The proxy is there; the TLS settings disagree, and the error says how.
        Err(e @ quire_proxy::Error::Tls { .. }) => Err(e.into()),
        Err(e) => Err(anyhow::Error::new(e).context(format!(
            "cannot reach the proxy at {} (is a sandbox running?)",
            proxy.proxy
        ))),
    }
}

fn parse_from(from: &str) -> Result<ReadPosition> {
    if from == "head" {
        return Ok(ReadPosition::Head);
    }
    let dlsn: Dlsn = from.parse().map_err(|e| {
        anyhow::anyhow!("--from {from:?} is neither 'head' nor a DLSN like 1:0:0 ({e})")
    })?;
    Ok(ReadPosition::Dlsn(dlsn))
}

/// The txid of a record: wall-clock milliseconds, never below the previous one
/// (DistributedLog's write proxy does the same with its `TimeSequencer`).
fn next_txid(last: &mut u64) -> u64 {
    let now = quire_clock::unix_ms();
    *last = (*last).max(now);
    *last
}

/// Runs `quire write`.
pub fn write(args: WriteArgs) -> Result<()> {
    let input: Box<dyn Read> = match &args.file {
        Some(path) => Box::new(
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?,
        ),
        None => Box::new(std::io::stdin().lock()),
    };
    let rt = runtime()?;
    rt.block_on(async {
        let client = connect(&args.proxy).await?;
        let mut input = BufReader::with_capacity(1 << 20, input);
        let mut batch: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut batch_bytes = 0;
        let mut txid = 0;
        let mut total = 0u64;
        let mut line_number = 0u64;
        let mut last = None;
        loop {
            let mut line = Vec::new();
            let n = input.read_until(b'\n', &mut line).context("cannot read input")?;
            if n > 0 {
                line_number += 1;
                if line.last() == Some(&b'\n') {
                    line.pop();
                }
                if line.len() > RECORD_SIZE_BYTES_MAX {
                    // Checked before the batch holding the lines before it is sent, so what
                    // was written is exactly the batches already sent.
                    let written = match total {
                        0 => "nothing was written".to_string(),
                        n => format!("lines 1 to {n} were written, nothing after them"),
                    };
                    bail!(
                        "line {line_number} is {} bytes, above the record limit of {RECORD_SIZE_BYTES_MAX} bytes; {written}",
                        line.len()
                    );
                }
                batch_bytes += line.len();
                batch.push((next_txid(&mut txid), line));
            }
            let full = batch.len() >= WRITE_BATCH_RECORDS_MAX || batch_bytes >= WRITE_BATCH_SIZE_BYTES_MAX;
            if (n == 0 || full) && !batch.is_empty() {
                let count = batch.len() as u64;
                let result = client
                    .write(&args.stream, std::mem::take(&mut batch), true)
                    .await
                    .with_context(|| {
                        format!(
                            "write to stream {:?} failed after {total} records were acknowledged; the {count} records \
                             of the failed batch (lines {} to {}) may or may not have been stored, check with `quire read` before resuming",
                            args.stream,
                            total + 1,
                            total + count
                        )
                    })?;
                total += count;
                last = Some(result.last_dlsn);
                batch_bytes = 0;
            }
            if n == 0 {
                break;
            }
        }
        if last.is_none() {
            // Empty input still creates the stream, as the command promises.
            match client.create_stream(&args.stream).await {
                Ok(()) => {}
                Err(e) if e.code() == quire_proxy::ErrorCode::StreamExists => {}
                Err(e) => return Err(e).with_context(|| format!("cannot create stream {:?}", args.stream)),
            }
        }
        match last {
            Some(dlsn) => println!("{dlsn} {total}"),
            None => println!("- 0"),
        }
        Ok(())
    })
}

/// Runs `quire read`.
pub fn read(args: ReadArgs) -> Result<()> {
    let from = parse_from(&args.from)?;
    runtime()?.block_on(copy_out(&args.proxy, &args.stream, from, false))
}

/// Runs `quire tail`.
pub fn tail(args: TailArgs) -> Result<()> {
    let from = parse_from(&args.from)?;
    runtime()?.block_on(copy_out(&args.proxy, &args.stream, from, true))
}

async fn copy_out(
    proxy: &ProxyArg,
    stream: &str,
    mut from: ReadPosition,
    follow: bool,
) -> Result<()> {
    let client = connect(proxy).await?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    loop {
        let wait = if follow { TAIL_WAIT } else { Duration::ZERO };
        let batch = client
            .read(
                stream,
                from,
                READ_BATCH_RECORDS_MAX,
                READ_BATCH_SIZE_BYTES_MAX,
                wait,
            )
            .await
            .with_context(|| format!("read of stream {stream:?} failed"))?;
        let empty = batch.records.is_empty();
        for record in &batch.records {
            if let Err(e) = out.write_all(&record.2).and_then(|()| out.write_all(b"\n")) {
                return broken_pipe_is_fine(e);
            }
        }
        from = batch.next;
        if empty && !follow {
            break;
        }
        if follow || empty {
            if let Err(e) = out.flush() {
                return broken_pipe_is_fine(e);
            }
        }
    }
    out.flush().or_else(broken_pipe_is_fine)
}

/// A reader that closed our stdout (e.g. `quire tail s | head`) ends the command quietly.
fn broken_pipe_is_fine(e: std::io::Error) -> Result<()> {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Ok(())
    } else {
        Err(e).context("cannot write to standard output")
    }
}

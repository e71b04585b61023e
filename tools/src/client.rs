//! `quire write`, `quire read` and `quire tail`: records between files or pipes and streams
//! (formats in `client/format.rs`, start positions in `client/position.rs`).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use quire_client::ProxyClient;

use format::Format;

mod format;
pub(crate) mod position;
mod read;
mod subs;
mod write;

pub use subs::run as subs;

/// Where to find the proxy: `--proxy`, else `QUIRE_PROXY`, else the sandbox default.
#[derive(Args, Debug, Clone)]
pub struct ProxyArg {
    /// Proxy address (host:port).
    #[arg(long, env = "QUIRE_PROXY", default_value = crate::PROXY_ADDR_DEFAULT)]
    pub proxy: String,
    /// Token for a proxy that requires one (`quire token new`); prefer QUIRE_TOKEN, which
    /// other users cannot see in the process list.
    #[arg(long, env = "QUIRE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Proxies per region, `REGION=host:port[,host:port...]`, repeated, the local region
    /// first (QUIRE_REGION_PROXIES: the same, separated by `;`). When given, the client
    /// takes its proxy from the first region that answers and fails over to the next region
    /// when a region's proxies are unreachable or answer REGION_UNAVAILABLE; `--proxy` is then
    /// not used.
    #[arg(long = "region-proxies", value_name = "REGION=HOST:PORT,...", env = "QUIRE_REGION_PROXIES", value_delimiter = ';', value_parser = quire_client::RegionProxies::parse)]
    pub region_proxies: Vec<quire_client::RegionProxies>,
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
    /// Input format: `line` (records between delimiters), `json` (one object per line:
    /// `payload`, optional `payload_encoding` utf8|base64 and `txid`), `binary` (4-byte
    /// little-endian length, then the payload, per record).
    #[arg(long, value_enum, default_value = "line")]
    format: Format,
    /// Record delimiter of `--format line` (escapes \n \r \t \0 \\ \xHH).
    #[arg(long, default_value = "\\n", value_parser = Delimiter::parse)]
    delimiter: Delimiter,
    /// Txids count up from N (records whose JSON gives a txid keep it); else the clock's ms.
    #[arg(long, value_name = "N")]
    txid_from: Option<u64>,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    /// `lz4`: ask the proxy to store these records LZ4-compressed (write flag 0x04; readers
    /// see them as written); `none`: as the stream's setting says (proxy `[streams]
    /// compression`).
    #[arg(long, default_value = "none", value_name = "none|lz4", value_parser = parse_compression)]
    compression: quire_client::compression::Compression,
    #[command(flatten)]
    proxy: ProxyArg,
}

fn parse_compression(s: &str) -> Result<quire_client::compression::Compression, String> {
    s.parse()
}

/// A record delimiter (`--delimiter`): the bytes of the text, escapes resolved.
#[derive(Debug, Clone)]
pub struct Delimiter(pub Vec<u8>);

impl Delimiter {
    fn parse(s: &str) -> std::result::Result<Self, String> {
        format::parse_delimiter(s).map(Delimiter)
    }
}

/// `quire read` and `quire tail` options.
#[derive(Args, Debug)]
pub struct ReadArgs {
    /// Stream to read.
    stream: String,
    #[command(flatten)]
    opts: ReadOpts,
    #[command(flatten)]
    proxy: ProxyArg,
}

/// How `quire read` and `quire tail` read and print.
#[derive(Args, Debug)]
pub struct ReadOpts {
    /// Start at `head` (the default; with `--sub`, its committed position), `tail`, a DLSN
    /// `SEGMENT:ENTRY:SLOT` (as `quire write` prints), `txid:T` (first txid >= T),
    /// `@2026-12-06T10:00:00Z`, `@-1h` (write time), or `-N` (last N records).
    #[arg(short = 'o', long = "from", allow_hyphen_values = true)]
    from: Option<String>,
    /// Stop after N records.
    #[arg(short = 'c', long = "count", value_name = "N")]
    count: Option<u64>,
    /// Exit at the end the stream has when the command starts (records written later are
    /// not printed).
    #[arg(short = 'e', long = "exit-at-end")]
    exit_at_end: bool,
    /// Output format: `line` (payload then delimiter), `json` (one object per line: dlsn,
    /// txid, write_time, payload, payload_encoding utf8|base64), `binary` (4-byte
    /// little-endian length, then the payload, per record).
    #[arg(long, value_enum, default_value = "line")]
    format: Format,
    /// Record delimiter of `--format line` (escapes \n \r \t \0 \\ \xHH).
    #[arg(long, default_value = "\\n", value_parser = Delimiter::parse)]
    delimiter: Delimiter,
    /// Read as subscription NAME: start at its committed position (unless `--from` is
    /// given) and commit the position after each printed batch (at-least-once: a batch
    /// printed but not committed is printed again by the next run).
    #[arg(long, value_name = "NAME")]
    sub: Option<String>,
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

pub(crate) async fn connect(proxy: &ProxyArg) -> Result<ProxyClient> {
    connect_with(proxy, quire_client::compression::Compression::None).await
}

/// [`connect`] with the compression the client's writes ask for.
async fn connect_with(
    proxy: &ProxyArg,
    compression: quire_client::compression::Compression,
) -> Result<ProxyClient> {
    let config = quire_client::ClientConfig {
        compression,
        token: proxy
            .token
            .as_ref()
            .map(|t| quire_client::protocol::Token(t.trim().as_bytes().to_vec())),
        tls: proxy.tls.client_config()?,
        // The certificate must carry the host as given (a name or an IP address).
        tls_server_name: Some(proxy.proxy.clone()),
        ..quire_client::ClientConfig::default()
    };
    if !proxy.region_proxies.is_empty() {
        let config = quire_client::ClientConfig {
            regions: proxy.region_proxies.clone(),
            tls_server_name: None,
            ..config
        };
        return ProxyClient::connect_any(config)
            .await
            .context("cannot reach a proxy of any region given by --region-proxies");
    }
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

/// Runs `quire write`.
pub fn write(args: WriteArgs) -> Result<()> {
    let input: Box<dyn BufRead> = match &args.file {
        Some(path) => Box::new(BufReader::with_capacity(
            1 << 20,
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?,
        )),
        None => Box::new(BufReader::with_capacity(1 << 20, std::io::stdin().lock())),
    };
    runtime()?.block_on(async {
        let client = connect_with(&args.proxy, args.compression).await?;
        write::run(&client, &args, input).await
    })
}

/// Runs `quire read`.
pub fn read(args: ReadArgs) -> Result<()> {
    copy_out(args, false)
}

/// Runs `quire tail`.
pub fn tail(args: ReadArgs) -> Result<()> {
    copy_out(args, true)
}

fn copy_out(args: ReadArgs, follow: bool) -> Result<()> {
    let given = match &args.opts.from {
        Some(text) => Some(read::start_position(text)?),
        None => None,
    };
    runtime()?.block_on(async {
        let client = connect(&args.proxy).await?;
        let (stream, opts) = (&args.stream, &args.opts);
        let Some(name) = &opts.sub else {
            let start = given.unwrap_or(quire_client::ReadPosition::Head);
            return read::run(&client, stream, opts, start, follow, read::NoHook).await;
        };
        let hook = read::CommitHook::new(&client, stream, name);
        let start = match given {
            Some(p) => p,
            None => hook.committed().await?,
        };
        read::run(&client, stream, opts, start, follow, hook).await
    })
}

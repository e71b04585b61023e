//! `quire debug bundle -o FILE.tar.gz`: what an operator sends with a bug report, in one gzip
//! tar archive (rpk's `debug bundle`). Every part is best effort: a part that cannot be had
//! (a process that does not answer, a missing file) is named in `errors.txt` and the bundle is
//! still written. Parts:
//! * `config/<role>-<n>.toml`: each `--config ROLE=FILE`'s effective configuration, redacted
//!   as `quire config show` does ([`crate::config_show`]);
//! * `metrics/<host_port>.txt`: `GET /metrics` of each `--metrics ADDR` and of each given
//!   configuration's `metrics_listen`;
//! * `logs/<n>-<name>`: the last `--log-bytes` (4 MiB) of each `--log PATH`;
//! * `listing/<n>.tsv`: every file under each `--data-dir DIR` and each bookie
//!   configuration's journal and ledger directories: path, size in bytes, modification time
//!   (RFC 3339); names and sizes only, never contents;
//! * `clock.json`: the offset of ZooKeeper's clock from the local one (the `mtime` ZooKeeper
//!   stamps on an ephemeral znode this command creates and deletes, against the midpoint of
//!   the local request time; the bookie protocol carries no time) and of each metrics
//!   endpoint's HTTP `Date` header (1 s resolution);
//! * `cluster-status.json`: `quire cluster status --json`, when ZooKeeper is given;
//! * `MANIFEST.txt`: when, on which host, by which version, and the parts.

use std::io::{Read, Seek, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};

use crate::config_show::Role;
use crate::flags::ZooKeeperFlags;
use crate::stream::format_time_ms;

/// `quire debug` subcommands.
#[derive(Args, Debug)]
pub struct DebugArgs {
    #[command(subcommand)]
    pub command: DebugCommand,
}

/// `quire debug` subcommands.
#[derive(Subcommand, Debug)]
pub enum DebugCommand {
    /// Gather configuration (redacted), metrics, logs, data directory listings, clock offsets
    /// and the cluster status into one .tar.gz for a bug report.
    Bundle(BundleArgs),
}

/// `quire debug bundle` options.
#[derive(Args, Debug)]
pub struct BundleArgs {
    /// The archive to write (gzip-compressed tar).
    #[arg(short, long)]
    pub output: PathBuf,
    /// A process's configuration file, `bookie=FILE`, `proxy=FILE` or `autorecovery=FILE`
    /// (repeatable): included redacted; its metrics endpoint and directories are gathered.
    #[arg(long, value_name = "ROLE=FILE")]
    pub config: Vec<String>,
    /// A metrics endpoint `host:port` to fetch `/metrics` from (repeatable).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Vec<String>,
    /// A log file to include the end of (repeatable).
    #[arg(long, value_name = "PATH")]
    pub log: Vec<PathBuf>,
    /// How much of the end of each log to include, in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub log_bytes: u64,
    /// A data directory to list (names and sizes; repeatable).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Vec<PathBuf>,
    #[command(flatten)]
    pub metadata: ZooKeeperFlags,
}

/// Files listed per directory at most (a listing of a huge tree stays readable).
const LISTING_FILES_MAX: usize = 100_000;

/// The archive being built: its parts and the errors met.
struct Bundle {
    parts: Vec<(String, Vec<u8>)>,
    errors: Vec<String>,
}

impl Bundle {
    fn add(&mut self, name: String, data: Vec<u8>) {
        self.parts.push((name, data));
    }
    fn fail(&mut self, what: String, e: &anyhow::Error) {
        self.errors.push(format!("{what}: {e:#}"));
    }
}

/// Runs `quire debug`.
pub fn run(args: DebugArgs) -> Result<()> {
    let DebugCommand::Bundle(args) = args.command;
    let mut b = Bundle {
        parts: Vec::new(),
        errors: Vec::new(),
    };
    let (metrics, dirs) = configs(&args, &mut b);
    let mut metrics_addrs = args.metrics.clone();
    metrics_addrs.extend(metrics);
    let mut endpoint_clocks = Vec::new();
    for addr in &metrics_addrs {
        match fetch_metrics(addr) {
            Ok((body, clock)) => {
                b.add(format!("metrics/{}.txt", addr.replace(':', "_")), body);
                endpoint_clocks
                    .push(serde_json::json!({ "endpoint": addr, "http_date_offset_ms": clock }));
            }
            Err(e) => b.fail(format!("metrics {addr}"), &e),
        }
    }
    for (n, log) in args.log.iter().enumerate() {
        match tail(log, args.log_bytes) {
            Ok(data) => {
                let name = log
                    .file_name()
                    .map_or("log".into(), |n| n.to_string_lossy());
                b.add(format!("logs/{n}-{name}"), data);
            }
            Err(e) => b.fail(format!("log {}", log.display()), &e),
        }
    }
    let mut all_dirs = args.data_dir.clone();
    all_dirs.extend(dirs);
    for (n, dir) in all_dirs.iter().enumerate() {
        match listing(dir) {
            Ok(text) => b.add(format!("listing/{n}.tsv"), text.into_bytes()),
            Err(e) => b.fail(format!("listing {}", dir.display()), &e),
        }
    }
    let zk_offset = zookeeper_parts(&args.metadata, &mut b);
    let clock = serde_json::json!({
        "local_time": format_time_ms(quire_clock::unix_ms()),
        "zookeeper_offset_ms": zk_offset,
        "metrics_endpoints": endpoint_clocks,
    });
    b.add("clock.json".into(), serde_json::to_vec_pretty(&clock)?);
    let errors = b.errors.join("\n") + "\n";
    b.add("errors.txt".into(), errors.into_bytes());
    let manifest = manifest(&b);
    b.add("MANIFEST.txt".into(), manifest.into_bytes());
    write_archive(&args.output, &b.parts)?;
    println!(
        "debug bundle {}: {} parts, {} errors (see errors.txt in it)",
        args.output.display(),
        b.parts.len(),
        b.errors.len()
    );
    Ok(())
}

/// Adds each `--config ROLE=FILE` (redacted); returns the metrics endpoints and the data
/// directories the configurations name.
fn configs(args: &BundleArgs, b: &mut Bundle) -> (Vec<String>, Vec<PathBuf>) {
    let (mut metrics, mut dirs) = (Vec::new(), Vec::new());
    for (n, spec) in args.config.iter().enumerate() {
        let parsed = spec
            .split_once('=')
            .ok_or_else(|| anyhow!("expected ROLE=FILE"))
            .and_then(|(role, file)| {
                let role =
                    <Role as clap::ValueEnum>::from_str(role, true).map_err(|e| anyhow!(e))?;
                crate::config_show::effective(role, Some(PathBuf::from(file)), &[])
            });
        let shown = match parsed {
            Ok(s) => s,
            Err(e) => {
                b.fail(format!("config {spec}"), &e);
                continue;
            }
        };
        let s = &shown.settings;
        if let Some(m) = s.get("metrics_listen").and_then(toml::Value::as_str) {
            metrics.push(m.to_string());
        }
        for key in ["journal_dir", "ledger_dir"] {
            if let Some(d) = s
                .get("bookie")
                .and_then(|t| t.get(key))
                .and_then(|v| v.as_str())
            {
                dirs.push(PathBuf::from(d));
            }
        }
        match toml::to_string_pretty(&shown.settings) {
            Ok(text) => b.add(format!("config/{}-{n}.toml", shown.role), text.into_bytes()),
            Err(e) => b.fail(format!("config {spec}"), &anyhow::Error::from(e)),
        }
    }
    (metrics, dirs)
}

/// `GET /metrics` over HTTP/1.0 (the endpoint closes after answering): the body, and the
/// offset in ms of the response's `Date` header from the local clock, when it has one.
fn fetch_metrics(addr: &str) -> Result<(Vec<u8>, Option<i64>)> {
    let sock: SocketAddr = addr
        .parse()
        .with_context(|| format!("{addr}: expected host:port"))?;
    let timeout = Duration::from_secs(3);
    let mut s = TcpStream::connect_timeout(&sock, timeout).context("cannot connect")?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let before = quire_clock::unix_ms();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = Vec::new();
    s.take(64 << 20)
        .read_to_end(&mut response)
        .context("cannot read the response")?;
    let after = quire_clock::unix_ms();
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("not an HTTP response"))?;
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let ok = head.starts_with("HTTP/1.") && head.split_whitespace().nth(1) == Some("200");
    if !ok {
        bail!("answered {}", head.lines().next().unwrap_or_default());
    }
    let date = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("date").then(|| v.trim().to_string())
    });
    let offset = date
        .and_then(|d| parse_http_date_ms(&d))
        .map(|t| t as i64 - ((before + after) / 2) as i64);
    Ok((response[split + 4..].to_vec(), offset))
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`, RFC 9110) as ms since the epoch.
fn parse_http_date_ms(s: &str) -> Option<u64> {
    let f: Vec<&str> = s.split_whitespace().collect();
    let [_, day, mon, year, time, "GMT"] = f.as_slice() else {
        return None;
    };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let m = MONTHS.iter().position(|x| x == mon)? + 1;
    let text = format!("{year}-{m:02}-{day:0>2}T{time}Z");
    crate::client::position::parse_rfc3339_ms(&text).ok()
}

/// The last `bytes` bytes of a file.
fn tail(path: &Path, bytes: u64) -> Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    f.seek(std::io::SeekFrom::Start(len.saturating_sub(bytes)))?;
    let mut data = Vec::new();
    f.take(bytes).read_to_end(&mut data)?;
    Ok(data)
}

/// Every file under `dir`: `path<TAB>size<TAB>mtime`, sorted, without contents.
fn listing(dir: &Path) -> Result<String> {
    let mut rows = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in
            std::fs::read_dir(&d).with_context(|| format!("cannot list {}", d.display()))?
        {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                stack.push(entry.path());
                continue;
            }
            let mtime = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or("-".into(), |d| format_time_ms(d.as_millis() as u64));
            rows.push(format!(
                "{}\t{}\t{mtime}",
                entry.path().display(),
                meta.len()
            ));
            if rows.len() >= LISTING_FILES_MAX {
                rows.push(format!(
                    "... more than {LISTING_FILES_MAX} files, listing cut"
                ));
                stack.clear();
                break;
            }
        }
    }
    rows.sort();
    Ok(format!("path\tsize_bytes\tmodified\n{}\n", rows.join("\n")))
}

/// With ZooKeeper given: the cluster status and ZooKeeper's clock offset in ms (`None`
/// without ZooKeeper or on failure, named in `errors.txt`).
fn zookeeper_parts(flags: &ZooKeeperFlags, b: &mut Bundle) -> Option<i64> {
    flags.zookeeper.as_ref()?;
    let result = crate::admin::with_zk_store(flags, async |store| {
        let status = crate::cluster::read_status(&store, true).await;
        let offset = zookeeper_offset_ms(&store).await;
        Ok((status, offset))
    });
    let (status, offset) = match result {
        Ok(r) => r,
        Err(e) => {
            b.fail("zookeeper".into(), &e);
            return None;
        }
    };
    match status.and_then(|s| Ok(serde_json::to_vec_pretty(&s)?)) {
        Ok(json) => b.add("cluster-status.json".into(), json),
        Err(e) => b.fail("cluster status".into(), &e),
    }
    offset
        .map_err(|e| b.fail("zookeeper clock".into(), &e))
        .ok()
}

/// ZooKeeper's clock minus the local one, in ms: the `mtime` ZooKeeper's leader stamps on an
/// ephemeral znode created now, against the midpoint of the local times around the create.
async fn zookeeper_offset_ms(store: &quire_metadata::ZkStore) -> Result<i64> {
    use zookeeper_client as zk;
    let path = format!("{}/debug-clock-{}", store.root(), std::process::id());
    // The cluster's own ACL when the session has a digest identity (CREATOR_ALL); ZooKeeper
    // refuses it to a session without one, which then creates an open node.
    let acls = zk::Acls::creator_all();
    let before = quire_clock::unix_ms();
    let created = store
        .client()
        .create(&path, b"", &zk::CreateMode::Ephemeral.with_acls(acls))
        .await;
    let after = quire_clock::unix_ms();
    let (stat, _) = match created {
        Ok(r) => r,

        Err(zk::Error::InvalidAcl) => {
            let options = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
            store.client().create(&path, b"", &options).await?
        }
        Err(e) => return Err(e).with_context(|| format!("cannot create {path}")),
    };
    let _ = store.client().delete(&path, None).await;
    Ok(stat.mtime - ((before + after) / 2) as i64)
}

fn manifest(b: &Bundle) -> String {
    let mut out = format!(
        "quire debug bundle\nquire version: {}\nmade at: {}\nparts:\n",
        env!("CARGO_PKG_VERSION"),
        format_time_ms(quire_clock::unix_ms())
    );
    for (name, data) in &b.parts {
        out.push_str(&format!("  {name} ({} bytes)\n", data.len()));
    }
    out.push_str(&format!("errors: {}\n", b.errors.len()));
    out
}

/// Writes `parts` as a gzip-compressed tar (each a regular file, mode 0644, stamped now).
fn write_archive(path: &Path, parts: &[(String, Vec<u8>)]) -> Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let now = quire_clock::unix_ms() / 1000;
    for (name, data) in parts {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(now);
        header.set_cksum();
        tar.append_data(&mut header, format!("quire-debug/{name}"), data.as_slice())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let gz = tar.into_inner()?;
    gz.finish()?.sync_all()?;
    Ok(())
}

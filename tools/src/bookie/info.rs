//! `quire bookie info ADDR`: a handshake and one `GetBookieInfo` request over the bookie
//! protocol (docs/protocol.md), printed as text or JSON; with ZooKeeper flags, also the
//! bookie's region and rack from its registration (what placement sees, as `quire bookie
//! list` shows them).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

/// `quire bookie info` options.
#[derive(Args, Debug)]
pub struct InfoArgs {
    /// The bookie's address (host:port, its bookie id).
    pub addr: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// TLS to the bookie.
    #[command(flatten)]
    pub bookie_tls: crate::tls::BookieTlsArgs,
    /// Where the bookie's registration (its region and rack labels) is read; without
    /// `--zookeeper` the labels are not shown.
    #[command(flatten)]
    pub metadata: crate::flags::ZooKeeperFlags,
}

/// A bookie's topology labels as its registration carries them (issue 30 item 1).
#[derive(Debug, Default)]
enum Labels {
    /// No ZooKeeper given, or it could not be read (a warning said why).
    #[default]
    Unknown,
    /// ZooKeeper holds no registration for the address.
    NotRegistered,
    /// The registration's labels (`None`: unlabelled).
    Registered {
        region: Option<String>,
        rack: Option<String>,
    },
}

impl Labels {
    /// The labels of bookie `addr` from the registrations ZooKeeper holds; `Unknown` without
    /// `--zookeeper` (or `QUIRE_ZOOKEEPER`), and, with a warning on stderr, when ZooKeeper
    /// cannot be read: the bookie's own answer is still shown.
    fn read(addr: &str, metadata: &crate::flags::ZooKeeperFlags) -> Self {
        if metadata.zookeeper.is_none() {
            return Self::Unknown;
        }
        let found = crate::admin::with_store(metadata, async |store| {
            let bookies = store.list_bookies().await.context("cannot list bookies")?;
            Ok(bookies.into_iter().find(|b| b.id.0 == addr))
        });
        match found {
            Ok(Some(b)) => Self::Registered {
                region: b.region,
                rack: b.rack,
            },
            Ok(None) => Self::NotRegistered,
            Err(e) => {
                eprintln!("quire: warning: cannot read the registration of bookie {addr}: {e:#}");
                Self::Unknown
            }
        }
    }

    /// The `labels:` line's value.
    fn text(&self) -> String {
        match self {
            Self::Unknown => "unknown (give --zookeeper to read the bookie's registration)".into(),
            Self::NotRegistered => "none (the bookie is not registered)".into(),
            Self::Registered { region, rack } => {
                let l = crate::cluster::labels(region.as_deref(), rack.as_deref());
                if l.is_empty() {
                    "none (registered without region or rack)".into()
                } else {
                    l.trim_start().to_string()
                }
            }
        }
    }

    /// `registered` (null: unknown), `region`, `rack` for `--json`.
    fn json(&self) -> (Option<bool>, Option<&str>, Option<&str>) {
        match self {
            Self::Unknown => (None, None, None),
            Self::NotRegistered => (Some(false), None, None),
            Self::Registered { region, rack } => (Some(true), region.as_deref(), rack.as_deref()),
        }
    }
}

/// How long `quire bookie info` waits to connect, and then for each answer.
const INFO_TIMEOUT: Duration = Duration::from_secs(10);

/// `quire bookie info ADDR`: a handshake and one `GetBookieInfo` request
/// (docs/protocol.md), printed as text or JSON.
pub fn run(args: InfoArgs) -> Result<()> {
    use quire_wire::bookie::{BookieState, DirKind};
    let info = fetch_bookie_info(
        &args.addr,
        args.bookie_tls.client_config()?,
        args.bookie_tls.cluster_secret()?,
    )?;
    let addr = &args.addr;
    let labels = Labels::read(addr, &args.metadata);
    let state = match info.state {
        BookieState::Writable => "writable",
        BookieState::ReadOnly => "read-only",
    };
    let kind = |k: DirKind| match k {
        DirKind::Journal => "journal",
        DirKind::Ledger => "ledger",
    };
    let ledgers: u64 = info.shard_ledgers.iter().sum();
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if args.json {
        let dirs: Vec<serde_json::Value> = info
            .dirs
            .iter()
            .map(|d| {
                serde_json::json!({
                    "kind": kind(d.kind),
                    "path": d.path,
                    "total_bytes": d.total_bytes,
                    "free_bytes": d.free_bytes,
                    "used_bytes": d.used_bytes,
                })
            })
            .collect();
        let (registered, region, rack) = labels.json();
        let v = serde_json::json!({
            "bookie": addr,
            "state": state,
            "registered": registered,
            "region": region,
            "rack": rack,
            "shards": info.shard_ledgers.len(),
            "ledgers": ledgers,
            "shard_ledgers": info.shard_ledgers,
            "dirs": dirs,
            "scrub": info.scrub.as_deref().map(scrub_json),
        });
        writeln!(out, "{v}")?;
    } else {
        writeln!(out, "bookie {addr}")?;
        writeln!(out, "state: {state}")?;
        let per_shard: Vec<String> = info.shard_ledgers.iter().map(u64::to_string).collect();
        writeln!(
            out,
            "shards: {} (ledgers per shard: {})",
            info.shard_ledgers.len(),
            per_shard.join(", ")
        )?;
        writeln!(out, "ledgers: {ledgers}")?;
        writeln!(out, "labels: {}", labels.text())?;
        for d in &info.dirs {
            let fs_used = d.total_bytes.saturating_sub(d.free_bytes);
            let pct = if d.total_bytes == 0 {
                0.0
            } else {
                100.0 * fs_used as f64 / d.total_bytes as f64
            };
            writeln!(
                out,
                "{} {}: bookie files {}, file system {} free of {} ({pct:.1}% used)",
                kind(d.kind),
                d.path,
                human_bytes(d.used_bytes),
                human_bytes(d.free_bytes),
                human_bytes(d.total_bytes)
            )?;
        }
        write_scrub_text(&mut out, info.scrub.as_deref())?;
    }
    out.flush()?;
    Ok(())
}

/// A UTC time for `ms` since the epoch, `-` for 0 (none).
fn time_or_dash(ms: u64) -> String {
    if ms == 0 {
        "-".into()
    } else {
        crate::stream::format_time_ms(ms)
    }
}

/// The scrub section as JSON: the bookie's totals (sums over shards; the latest pass times
/// of any shard) and each shard's figures (docs/cli-formats.md).
fn scrub_json(shards: &[quire_wire::bookie::ScrubInfo]) -> serde_json::Value {
    use quire_wire::bookie::{SCRUB_ENABLED, SCRUB_IN_PROGRESS};
    let one = |s: &quire_wire::bookie::ScrubInfo| {
        serde_json::json!({
            "enabled": s.flags & SCRUB_ENABLED != 0,
            "in_progress": s.flags & SCRUB_IN_PROGRESS != 0,
            "pass_started_ms": s.pass_started_ms,
            "last_pass_start_ms": s.last_pass_start_ms,
            "last_pass_end_ms": s.last_pass_end_ms,
            "last_pass_entries": s.last_pass_entries,
            "last_pass_bytes": s.last_pass_bytes,
            "passes": s.passes,
            "entries_scanned": s.entries_scanned,
            "bytes_scanned": s.bytes_scanned,
            "damaged_found": s.damaged_found,
            "damaged_now": s.damaged_now,
            "repaired": s.repaired,
            "ledgers_reported": s.ledgers_reported,
        })
    };
    let t = ScrubTotals::of(shards);
    serde_json::json!({
        "in_progress": t.in_progress,
        "passes": t.passes,
        "last_pass_end_ms": t.last_end_ms,
        "entries_scanned": t.entries,
        "bytes_scanned": t.bytes,
        "damaged_found": t.found,
        "damaged_now": t.now,
        "repaired": t.repaired,
        "ledgers_reported": t.reported,
        "shards": shards.iter().map(one).collect::<Vec<_>>(),
    })
}

/// The scrub figures summed over shards.
#[derive(Default)]
struct ScrubTotals {
    in_progress: usize,
    passes: u64,
    last_end_ms: u64,
    entries: u64,
    bytes: u64,
    found: u64,
    now: u64,
    repaired: u64,
    reported: u64,
}

impl ScrubTotals {
    fn of(shards: &[quire_wire::bookie::ScrubInfo]) -> Self {
        let mut t = Self::default();
        for s in shards {
            t.in_progress += usize::from(s.flags & quire_wire::bookie::SCRUB_IN_PROGRESS != 0);
            t.passes += s.passes;
            t.last_end_ms = t.last_end_ms.max(s.last_pass_end_ms);
            t.entries += s.entries_scanned;
            t.bytes += s.bytes_scanned;
            t.found += s.damaged_found;
            t.now += s.damaged_now;
            t.repaired += s.repaired;
            t.reported += s.ledgers_reported;
        }
        t
    }
}

/// The scrub section as text: a totals line, then one line per shard.
fn write_scrub_text(
    out: &mut impl std::io::Write,
    shards: Option<&[quire_wire::bookie::ScrubInfo]>,
) -> Result<()> {
    use quire_wire::bookie::{SCRUB_ENABLED, SCRUB_IN_PROGRESS};
    let Some(shards) = shards else {
        writeln!(
            out,
            "scrub: not reported (the bookie predates the scrub figures)"
        )?;
        return Ok(());
    };
    let t = ScrubTotals::of(shards);
    writeln!(
        out,
        "scrub: {} passes, {} entries ({}) checked, damaged entries: {} found, {} not yet repaired, \
         {} repaired; {} ledgers reported for repair; passes in progress: {}",
        t.passes,
        t.entries,
        human_bytes(t.bytes),
        t.found,
        t.now,
        t.repaired,
        t.reported,
        t.in_progress
    )?;
    for (i, s) in shards.iter().enumerate() {
        let state = if s.flags & SCRUB_ENABLED == 0 {
            "off".to_string()
        } else if s.flags & SCRUB_IN_PROGRESS != 0 {
            format!("pass in progress since {}", time_or_dash(s.pass_started_ms))
        } else {
            "idle".to_string()
        };
        writeln!(
            out,
            "scrub shard {i}: {state}; last pass {} to {}: {} entries, {}",
            time_or_dash(s.last_pass_start_ms),
            time_or_dash(s.last_pass_end_ms),
            s.last_pass_entries,
            human_bytes(s.last_pass_bytes)
        )?;
    }
    Ok(())
}

/// `n` bytes with a binary unit, e.g. `64.0 MiB`.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Connects to `addr`, shakes hands (version 2 with the cluster secret, checking the
/// bookie's proof; version 1 without) and asks for the bookie info.
fn fetch_bookie_info(
    addr: &str,
    tls: Option<std::sync::Arc<quire_tls::rustls::ClientConfig>>,
    secret: Option<quire_wire::auth::ClusterSecret>,
) -> Result<quire_wire::bookie::BookieInfo> {
    use quire_wire::blocking::{BookieConnection, ConnectionError};
    use quire_wire::bookie::{decode_bookie_info_response, BookieInfoReply, Request};
    use std::net::ToSocketAddrs;
    let sock = addr
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve bookie address {addr}"))?
        .next()
        .with_context(|| format!("bookie address {addr} resolves to nothing"))?;
    let tcp = std::net::TcpStream::connect_timeout(&sock, INFO_TIMEOUT)
        .with_context(|| format!("cannot connect to bookie {addr}"))?;
    tcp.set_read_timeout(Some(INFO_TIMEOUT))?;
    tcp.set_write_timeout(Some(INFO_TIMEOUT))?;
    let plain = tls.is_none();
    let (first, first_read) = (FirstBytes::default(), FirstBytes::default());
    let stream: Box<dyn ReadWrite> = match tls {
        None => Box::new(Recording {
            inner: tcp,
            first: first.clone(),
            wrote: first_read.clone(),
        }),
        Some(config) => {
            let name = quire_tls::server_name(addr)?;
            let session = quire_tls::rustls::ClientConnection::new(config, name)
                .with_context(|| format!("TLS to bookie {addr}"))?;
            Box::new(quire_tls::rustls::StreamOwned::new(session, tcp))
        }
    };
    let mut conn = match BookieConnection::connect(stream, secret.as_ref()) {
        Ok(c) => c,
        Err(ConnectionError::BadProof) => bail!(
            "bookie {addr}: its proof of the cluster secret does not match ours: it is not a \
             bookie of this cluster"
        ),
        Err(_) if plain && expects_tls(&first, &first_read) => bail!(
            "bookie {addr} expects TLS: it answered our first plain frame with a TLS record or \
             closed the connection; give --bookie-tls-ca-file (and --bookie-tls-cert-file, \
             --bookie-tls-key-file if it requires client certificates)"
        ),
        Err(e) => return Err(e).with_context(|| format!("handshake with bookie {addr}")),
    };
    let answer = conn
        .call(&Request::GetBookieInfo { scrub: true })
        .with_context(|| format!("bookie info from bookie {addr}"))?;
    let reply = decode_bookie_info_response(&answer.frame())
        .with_context(|| format!("bad bookie info answer from bookie {addr}"))?;
    match reply {
        BookieInfoReply::Ok(info) => Ok(info),
        BookieInfoReply::Failed { status, message } => {
            bail!("bookie {addr} answered {status:?}: {message}")
        }
    }
}

/// A plain or TLS connection for `quire bookie info`.
trait ReadWrite: std::io::Read + std::io::Write {}
impl<T: std::io::Read + std::io::Write> ReadWrite for T {}

/// Up to 8 bytes seen first on a connection (read or written), shared with the caller.
#[derive(Clone, Default)]
struct FirstBytes(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl FirstBytes {
    fn record(&self, bytes: &[u8]) {
        let mut v = self.0.lock().expect("first bytes lock");
        let room = 8usize.saturating_sub(v.len());
        v.extend_from_slice(&bytes[..room.min(bytes.len())]);
    }
    fn get(&self) -> Vec<u8> {
        self.0.lock().expect("first bytes lock").clone()
    }
}

/// A plain connection that records the first bytes it reads and writes, so that a failed
/// handshake can tell a TLS bookie from other failures.
struct Recording<S> {
    inner: S,
    first: FirstBytes,
    wrote: FirstBytes,
}

impl<S: std::io::Read> std::io::Read for Recording<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.first.record(&buf[..n]);
        Ok(n)
    }
}

impl<S: std::io::Write> std::io::Write for Recording<S> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.wrote.record(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// After a failed plain handshake: the bookie answered our first frame with a TLS record (a
/// TLS server reads our frame as a bad record and sends an alert, content type 21, version
/// 3.x: RFC 8446 §5.1) or closed the connection without a byte, once our frame was sent.
fn expects_tls(read: &FirstBytes, wrote: &FirstBytes) -> bool {
    let read = read.get();
    let alert = read.len() >= 2 && read[0] == 0x15 && read[1] == 0x03;
    alert || (read.is_empty() && !wrote.get().is_empty())
}

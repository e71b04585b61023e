//! `quire stream`: stream admin through a proxy (`--proxy` / `QUIRE_PROXY`), so that it works
//! the same against the sandbox (whose embedded store no other process can open) and a
//! ZooKeeper cluster, and so that changes are made by the stream's owner (DistributedLog's
//! proxy `truncate` / `delete` operations; DistributedLog's `show`):
//! * `quire stream list`, `quire stream show STREAM`: names; segments, truncation point,
//!   retention, last txid (what the proxy's txid guard compares a write with) and owner;
//! * `quire stream truncate STREAM DLSN`, `quire stream delete STREAM`;
//! * `quire stream retention STREAM [--time-secs N|default] [--size-bytes N|default]`;
//! * `quire stream subs STREAM [--delete NAME]`: subscriptions with their lag;
//! * `quire stream limits STREAM [--records-per-sec N ...] | default`: write limits;
//! * `quire stream placement STREAM [--create] [--policy P --regions a,b ...] | default`: the
//!   placement of its segments' ledgers.
//!
//! Output is text for people, or one JSON document with `--json`.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use quire_client::compression::Compression;
use quire_client::{RetentionChange, SegmentState, StreamInfo};

use crate::admin::OutputArgs;

mod limits;
pub use limits::StreamLimitsArgs;
mod placement;
pub use placement::StreamPlacementArgs;

/// `quire stream` subcommands.
#[derive(Args, Debug)]
pub struct StreamArgs {
    #[command(subcommand)]
    pub command: StreamCommand,
}

/// `quire stream` subcommands. They talk to a proxy (`--proxy` / `QUIRE_PROXY`), so they work
/// the same against the sandbox and a ZooKeeper cluster.
#[derive(Subcommand, Debug)]
pub enum StreamCommand {
    /// List every stream, sorted.
    List(StreamListArgs),
    /// Print a stream's segments (seq no, ledger, state, DLSN range, records, bytes,
    /// completion time), truncation point, retention, last txid and current owner. The last
    /// txid is the owner's (acknowledged or in flight) when the proxy asked owns the stream,
    /// else the last one of the completed segments.
    Show(StreamNameArgs),
    /// Make every record before DLSN unreadable at once and delete the whole segments before
    /// it (DistributedLog `truncate`). The point never moves backwards; a DLSN beyond the end of
    /// the stream is refused.
    Truncate(StreamTruncateArgs),
    /// Delete a stream and all its segments; the name can be used again.
    Delete(StreamDeleteArgs),
    /// Show a stream's retention, or set its overrides of the cluster defaults.
    Retention(StreamRetentionArgs),
    /// Seal a stream (DistributedLog `markEndOfStream`): write the end-of-stream marker after
    /// its last record; later writes fail with END_OF_STREAM and readers end cleanly at the
    /// marker. The stream can still be truncated and deleted.
    Seal(StreamDeleteArgs),
    /// List a stream's subscriptions (committed position, lag in records and bytes, commit
    /// time), or delete one with `--delete NAME` (admin right).
    Subs(StreamSubsArgs),
    /// Show a stream's compression, or set it: `lz4` (the owner stores every entry
    /// LZ4-compressed), `none` (plain unless a write asks), `default` (the owning proxy's
    /// `[streams] compression`). Applies from the owner's next entry on; readers see the same
    /// records either way.
    Compression(StreamCompressionArgs),
    /// Show a stream's own write limits, or set them (`--records-per-sec N --bytes-per-sec N
    /// --soft-records-per-sec N --soft-bytes-per-sec N --outstanding-writes-max N`, those left
    /// out 0 = none), or `default` to go back to the owning proxy's `[limits] stream_*`. A
    /// write over a hard limit gets OVER_CAPACITY (517), nothing written.
    Limits(StreamLimitsArgs),
    /// Show a stream's own placement, or set it (`--policy default|rack-aware|region-aware
    /// --min-racks N --enforce-min-racks --min-regions N --no-enforce-durability --regions a,b
    /// --quorum E,Qw,Qa`, those left out at the `[ledger]` defaults; `--create` creates the
    /// stream first), or `default` to go back to the owning proxy's `[ledger]` settings.
    /// Applies from the stream's next segment; each ledger keeps the placement it was made
    /// under, which autorecovery and decommission follow.
    Placement(StreamPlacementArgs),
}

/// `quire stream compression` options. Without a setting it only shows.
#[derive(Args, Debug)]
pub struct StreamCompressionArgs {
    /// Stream name.
    pub stream: String,
    /// `lz4`, `none` or `default`.
    #[arg(value_name = "lz4|none|default", value_parser = parse_compression_setting)]
    pub setting: Option<CompressionSetting>,
    #[command(flatten)]
    pub proxy: crate::client::ProxyArg,
}

/// A `quire stream compression` setting: the stream's own (`Some`) or the proxy default.
#[derive(Debug, Clone, Copy)]
pub struct CompressionSetting(pub Option<Compression>);

fn parse_compression_setting(v: &str) -> std::result::Result<CompressionSetting, String> {
    if v == "default" {
        return Ok(CompressionSetting(None));
    }
    v.parse::<Compression>()
        .map(|c| CompressionSetting(Some(c)))
        .map_err(|e| format!("{e}, nor \"default\""))
}

/// The `compression:` line of `stream show` and `stream compression`.
fn format_compression(c: Option<Compression>) -> String {
    match c {
        Some(c) => format!("{c} (stream)"),
        None => "proxy default".to_string(),
    }
}

/// `quire stream compression`.
async fn compression(a: StreamCompressionArgs) -> Result<()> {
    let client = crate::client::connect(&a.proxy).await?;
    let now = match a.setting {
        Some(CompressionSetting(c)) => client
            .set_compression(&a.stream, c)
            .await
            .with_context(|| format!("cannot set the compression of stream {:?}", a.stream))?,
        None => {
            client
                .describe_stream(&a.stream)
                .await
                .with_context(|| format!("stream {:?}", a.stream))?
                .metadata
                .compression
        }
    };
    println!(
        "stream {} compression: {}",
        a.stream,
        format_compression(now)
    );
    Ok(())
}

/// `quire stream subs` options.
#[derive(Args, Debug)]
pub struct StreamSubsArgs {
    /// Stream name.
    pub stream: String,
    /// Delete this subscription instead of listing.
    #[arg(long, value_name = "NAME")]
    pub delete: Option<String>,
    #[command(flatten)]
    pub proxy: crate::client::ProxyArg,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `quire stream list` options. Every page is followed by default (the whole listing, as
/// before paging); `--page-token` prints one page and the token of the next.
#[derive(Args, Debug)]
pub struct StreamListArgs {
    /// Only the streams whose names start with this.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Names per request (the proxy answers at most 1,000; 0: its maximum).
    #[arg(long, default_value_t = 0)]
    pub page_size: u32,
    /// Print the page starting at this token (from an earlier `--page-token` listing) and the
    /// next page's token, instead of every page; with `--all`, every page from it on.
    #[arg(long)]
    pub page_token: Option<String>,
    /// Follow page tokens to the last page (the default without `--page-token`).
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub proxy: crate::client::ProxyArg,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `quire stream list`: every page (a JSON array of names), or with `--page-token` and
/// without `--all` one page (JSON: `{"streams": [...], "next_page_token": "..."}`; text: the
/// names, then `next page token: T` on stderr unless it is the last page).
async fn list(a: &StreamListArgs) -> Result<()> {
    let client = crate::client::connect(&a.proxy).await?;
    let one_page = a.page_token.is_some() && !a.all;
    let mut token = a.page_token.clone().unwrap_or_default();
    let mut names = Vec::new();
    loop {
        let (page, next) = client
            .list_streams_page(&a.prefix, &token, a.page_size)
            .await
            .context("cannot list streams")?;
        names.extend(page);
        token = next;
        if one_page || token.is_empty() {
            break;
        }
    }
    if one_page && a.output.json {
        let v = serde_json::json!({ "streams": names, "next_page_token": token });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if a.output.json {
        println!("{}", serde_json::to_string_pretty(&names)?);
    } else {
        for n in &names {
            println!("{n}");
        }
        if one_page && !token.is_empty() {
            eprintln!("next page token: {token}");
        }
    }
    Ok(())
}

/// A stream name and output options.
#[derive(Args, Debug)]
pub struct StreamNameArgs {
    /// Stream name.
    pub stream: String,
    #[command(flatten)]
    pub proxy: crate::client::ProxyArg,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `quire stream truncate` options.
#[derive(Args, Debug)]
pub struct StreamTruncateArgs {
    /// Stream name.
    pub stream: String,
    /// First position kept, `SEGMENT:ENTRY:SLOT` (as `quire write` prints).
    pub dlsn: quire_client::Dlsn,
    #[command(flatten)]
    pub proxy: crate::client::ProxyArg,
}

/// `quire stream delete` options.
#[derive(Args, Debug)]
pub struct StreamDeleteArgs {
    /// Stream name.
    pub stream: String,
    #[command(flatten)]
    pub proxy: crate::client::ProxyArg,
}

/// `quire stream retention` options. Without `--time-secs` or `--size-bytes` it only shows.
#[derive(Args, Debug)]
pub struct StreamRetentionArgs {
    /// Stream name.
    pub stream: String,
    /// Delete completed segments older than N seconds (1 to 100 years), or `default` to use
    /// the cluster default again.
    #[arg(long, value_parser = parse_retention_time)]
    pub time_secs: Option<RetentionChange>,
    /// Delete the oldest completed segments while the stream holds more than N bytes (1 to
    /// 2^60), or `default` to use the cluster default again.
    #[arg(long, value_parser = parse_retention_size)]
    pub size_bytes: Option<RetentionChange>,
    /// `on`: retention never deletes a segment at or after the smallest committed position of
    /// the stream's subscriptions (off by default); `off`: retention as without it.
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    pub keep_for_subscriptions: Option<bool>,
    #[command(flatten)]
    pub proxy: crate::client::ProxyArg,
    #[command(flatten)]
    pub output: OutputArgs,
}

fn parse_retention(
    v: &str,
    check: fn(u64) -> std::result::Result<u64, String>,
) -> std::result::Result<RetentionChange, String> {
    if v == "default" {
        return Ok(RetentionChange::Default);
    }
    let n: u64 = v
        .parse()
        .map_err(|_| format!("{v:?} is neither a whole number nor 'default'"))?;
    check(n).map(RetentionChange::Set)
}

fn parse_on_off(v: &str) -> std::result::Result<bool, String> {
    match v {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{other:?} is neither on nor off")),
    }
}

fn parse_retention_time(v: &str) -> std::result::Result<RetentionChange, String> {
    parse_retention(v, quire_client::check_retention_time_secs)
}

fn parse_retention_size(v: &str) -> std::result::Result<RetentionChange, String> {
    parse_retention(v, quire_client::check_retention_size_bytes)
}

/// Runs `quire stream ...`.
pub fn run(args: StreamArgs) -> Result<()> {
    let rt = crate::client::runtime()?;
    let result = rt.block_on(async {
        match args.command {
            StreamCommand::List(a) => list(&a).await,
            StreamCommand::Show(a) => {
                let info = describe_live(&a.proxy, &a.stream).await?;
                if a.output.json {
                    println!("{}", serde_json::to_string_pretty(&info_json(&info))?);
                } else {
                    print!("{}", format_stream(&info)?);
                }
                Ok(())
            }
            StreamCommand::Truncate(a) => {
                let client = crate::client::connect(&a.proxy).await?;
                let r = client
                    .truncate(&a.stream, a.dlsn)
                    .await
                    .with_context(|| format!("cannot truncate stream {:?}", a.stream))?;
                if r.truncated_before > a.dlsn {
                    println!(
                        "stream {} was already truncated before {} (the point never moves back); nothing changed",
                        a.stream, r.truncated_before
                    );
                } else {
                    println!(
                        "stream {} truncated before {}: {} segments deleted",
                        a.stream, r.truncated_before, r.segments_deleted
                    );
                }
                Ok(())
            }
            StreamCommand::Delete(a) => {
                let client = crate::client::connect(&a.proxy).await?;
                let n = client
                    .delete_stream(&a.stream)
                    .await
                    .with_context(|| format!("cannot delete stream {:?}", a.stream))?;
                println!("stream {} deleted ({n} segments)", a.stream);
                Ok(())
            }
            StreamCommand::Seal(a) => seal(a).await,
            StreamCommand::Subs(a) => crate::client::subs(a).await,
            StreamCommand::Compression(a) => compression(a).await,
            StreamCommand::Limits(a) => limits::limits(a).await,
            StreamCommand::Placement(a) => placement::placement(a).await,
            StreamCommand::Retention(a) => {
                let client = crate::client::connect(&a.proxy).await?;
                let keep = a.keep_for_subscriptions;
                if a.time_secs.is_some() || a.size_bytes.is_some() || keep.is_some() {
                    client
                        .set_retention_with(
                            &a.stream,
                            a.time_secs.unwrap_or(RetentionChange::Keep),
                            a.size_bytes.unwrap_or(RetentionChange::Keep),
                            keep,
                        )
                        .await
                        .with_context(|| {
                            format!("cannot set the retention of stream {:?}", a.stream)
                        })?;
                }
                let info = client
                    .describe_stream(&a.stream)
                    .await
                    .with_context(|| format!("stream {:?}", a.stream))?;
                if a.output.json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&info_json(&info)["retention"])?
                    );
                } else {
                    print!("{}", format_retention(&info));
                }
                Ok(())
            }
        }
    });
    rt.shutdown_timeout(Duration::from_secs(2));
    result
}

/// How long `stream show` waits for the owner a non-owner proxy names.
const OWNER_TIMEOUT: Duration = Duration::from_secs(5);

/// The stream as its owner sees it: a proxy that does not own the stream knows only the
/// stored record (the last txid of the completed segments, nothing of the open one), so the
/// owner it names is asked too (its advertised address is the one proxies redirect clients to,
/// DistributedLog's ownership redirect). If the owner does not answer, the asked proxy's view
/// stands, with a warning on stderr.
async fn describe_live(proxy: &crate::client::ProxyArg, stream: &str) -> Result<StreamInfo> {
    let client = crate::client::connect(proxy).await?;
    let info = client
        .describe_stream(stream)
        .await
        .with_context(|| format!("stream {stream:?}"))?;
    let Some(owner) = info.owner.clone().filter(|o| *o != proxy.proxy) else {
        return Ok(info);
    };
    let at_owner = crate::client::ProxyArg {
        proxy: owner.clone(),
        region_proxies: Vec::new(),
        ..proxy.clone()
    };
    let asked = async {
        let client = crate::client::connect(&at_owner).await?;
        Ok::<_, anyhow::Error>(client.describe_stream(stream).await?)
    };
    // A frozen or unreachable owner must not hold the answer up.
    let asked = tokio::time::timeout(OWNER_TIMEOUT, asked)
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {OWNER_TIMEOUT:?}")));
    match asked {
        Ok(live) => Ok(live),
        Err(e) => {
            eprintln!("quire: warning: the stream's owner {owner} did not answer ({e:#}); the last txid shown is that of the completed segments");
            Ok(info)
        }
    }
}

/// `quire stream seal`.
async fn seal(a: StreamDeleteArgs) -> Result<()> {
    let client = crate::client::connect(&a.proxy).await?;
    let last = client
        .seal_stream(&a.stream)
        .await
        .with_context(|| format!("cannot seal stream {:?}", a.stream))?;
    match last {
        Some(d) => println!("stream {} sealed after its last record {d}", a.stream),
        None => println!("stream {} sealed (it holds no record)", a.stream),
    }
    Ok(())
}

/// One side of a retention setting: the stream's override, else the default, else none.
fn effective(over: Option<u64>, default: Option<u64>) -> (Option<u64>, &'static str) {
    match (over, default) {
        (Some(v), _) => (Some(v), "stream"),
        (None, Some(v)) => (Some(v), "cluster default"),
        (None, None) => (None, "none"),
    }
}

fn info_json(info: &StreamInfo) -> serde_json::Value {
    let m = &info.metadata;
    let (t, ts) = effective(m.retention.time_secs, info.defaults.time_secs);
    let (z, zs) = effective(m.retention.size_bytes, info.defaults.size_bytes);
    serde_json::json!({
        "owner": info.owner,
        "home_region": m.home_region,
        "last_txid": m.max_txid,
        "truncated_before": m.truncated_before.map(|t| t.to_string()),
        "first_dlsn": info.lookups.as_deref().and_then(|l| l.first_dlsn).map(|d| d.to_string()),
        "last_dlsn": info.lookups.as_deref().and_then(|l| l.last_dlsn).map(|d| d.to_string()),
        "record_count": info.lookups.as_deref().map(|l| l.record_count),
        "last_write_time_ms": info.lookups.as_deref().and_then(|l| l.last_write_time_ms),
        "sealed": info.lookups.as_deref().map(|l| l.sealed),
        "compression": m.compression,
        "limits": m.limits,
        "placement": m.placement,
        "retention": {
            "time_secs": t, "time_secs_from": ts,
            "size_bytes": z, "size_bytes_from": zs,
            "override": m.retention,
            "cluster_default": { "time_secs": info.defaults.time_secs, "size_bytes": info.defaults.size_bytes },
        },
        "metadata": m,
    })
}

fn format_retention(info: &StreamInfo) -> String {
    let m = &info.metadata;
    let (t, ts) = effective(m.retention.time_secs, info.defaults.time_secs);
    let (z, zs) = effective(m.retention.size_bytes, info.defaults.size_bytes);
    let show = |v: Option<u64>, unit: &str, from: &str| match v {
        Some(v) => format!("{v} {unit} ({from})"),
        None => "none (kept forever)".to_string(),
    };
    let subs = if m.retention.keep_for_subscriptions {
        "  retention keeps what subscriptions need\n"
    } else {
        ""
    };
    format!(
        "  retention time: {}\n  retention size: {}\n{subs}",
        show(t, "s", ts),
        show(z, "bytes", zs)
    )
}

/// Milliseconds since the epoch as UTC `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub(crate) fn format_time_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

fn format_stream(info: &StreamInfo) -> Result<String> {
    let meta = &info.metadata;
    let mut out = String::new();
    writeln!(out, "stream {}", meta.name)?;
    writeln!(
        out,
        "  owner:    {}",
        info.owner.as_deref().unwrap_or("none")
    )?;
    writeln!(
        out,
        "  home region: {}",
        meta.home_region.as_deref().unwrap_or("none")
    )?;
    writeln!(
        out,
        "  last txid: {}",
        meta.max_txid.map_or("none".to_string(), |t| t.to_string())
    )?;
    writeln!(
        out,
        "  truncated before: {}",
        meta.truncated_before
            .map_or("none".to_string(), |t| t.to_string())
    )?;
    if let Some(l) = &info.lookups {
        let dlsn = |d: Option<quire_client::Dlsn>| d.map_or("none".to_string(), |d| d.to_string());
        writeln!(out, "  first DLSN: {}", dlsn(l.first_dlsn))?;
        writeln!(out, "  last DLSN: {}", dlsn(l.last_dlsn))?;
        writeln!(out, "  records: {}", l.record_count)?;
        writeln!(
            out,
            "  last write: {}",
            l.last_write_time_ms
                .map_or("none".to_string(), format_time_ms)
        )?;
        writeln!(out, "  sealed: {}", if l.sealed { "yes" } else { "no" })?;
    }
    writeln!(
        out,
        "  compression: {}",
        format_compression(meta.compression)
    )?;
    writeln!(out, "  limits: {}", limits::format_limits(meta.limits))?;
    writeln!(
        out,
        "  placement: {}",
        placement::format_placement(meta.placement.as_ref())
    )?;
    out.push_str(&format_retention(info));
    writeln!(out, "  segments: {}", meta.segments.len())?;
    if !meta.segments.is_empty() {
        writeln!(
            out,
            "  {:>6} {:>8} {:<11} {:<27} {:>9} {:>12}  completed",
            "seq", "ledger", "state", "DLSN range", "records", "bytes"
        )?;
    }
    for s in &meta.segments {
        // A segment's DLSNs run from SEQ:0:0 up to (not including) SEQ:(last entry + 1):0;
        // for the segment being written, as far as acknowledged when the proxy asked owns it.
        let range = match s.last_entry {
            Some(last) => format!("{}:0:0 .. <{}:{}:0", s.seq_no, s.seq_no, last + 1),
            None if s.state == SegmentState::Completed => "empty".to_string(),
            None => format!("{}:0:0 ..", s.seq_no),
        };
        let known = s.state == SegmentState::Completed || s.last_entry.is_some();
        let (state, records, bytes) = match s.state {
            SegmentState::Completed => (
                "completed",
                s.record_count.to_string(),
                s.length_bytes.to_string(),
            ),
            SegmentState::InProgress if known => (
                "in progress",
                s.record_count.to_string(),
                s.length_bytes.to_string(),
            ),
            SegmentState::InProgress => ("in progress", "-".into(), "-".into()),
        };
        let completed = s.completion_time_ms.map_or("-".to_string(), format_time_ms);
        writeln!(
            out,
            "  {:>6} {:>8} {:<11} {:<27} {:>9} {:>12}  {}",
            s.seq_no, s.ledger_id, state, range, records, bytes, completed
        )?;
    }
    Ok(out)
}

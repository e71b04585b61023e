//! `quire stream limits STREAM [--records-per-sec N] [--bytes-per-sec N] [--soft-...] | default`:
//! a stream's own write limits (`SET_LIMITS`, docs/proxy-protocol.md "Limits"), enforced by its
//! owner in place of the owning proxy's `[limits] stream_*` defaults.

use anyhow::{bail, Context, Result};
use clap::Args;
use quire_client::limits::StreamLimits;

/// `quire stream limits` options. Without a limit and without `default` it only shows.
#[derive(Args, Debug)]
pub struct StreamLimitsArgs {
    /// Stream name.
    pub stream: String,
    /// `default`: drop the stream's own limits (the proxy's `[limits] stream_*` apply).
    #[arg(value_name = "default", value_parser = ["default"])]
    pub default: Option<String>,
    /// Hard limit, records per second (over it: OVER_CAPACITY); 0 = none.
    #[arg(long)]
    pub records_per_sec: Option<u64>,
    /// Hard limit, record payload bytes per second; 0 = none.
    #[arg(long)]
    pub bytes_per_sec: Option<u64>,
    /// Soft limit, records per second (logged and counted only); 0 = none.
    #[arg(long)]
    pub soft_records_per_sec: Option<u64>,
    /// Soft limit, record payload bytes per second; 0 = none.
    #[arg(long)]
    pub soft_bytes_per_sec: Option<u64>,
    /// Most writes to the stream accepted and not yet answered; 0 = none.
    #[arg(long)]
    pub outstanding_writes_max: Option<u64>,
    #[command(flatten)]
    pub proxy: crate::client::ProxyArg,
}

impl StreamLimitsArgs {
    /// The limits given as flags (those left out are 0), or `None` if no flag was given.
    fn given(&self) -> Option<StreamLimits> {
        let f = [
            self.records_per_sec,
            self.bytes_per_sec,
            self.soft_records_per_sec,
            self.soft_bytes_per_sec,
            self.outstanding_writes_max,
        ];
        f.iter().any(Option::is_some).then(|| StreamLimits {
            records_per_sec: f[0].unwrap_or(0),
            bytes_per_sec: f[1].unwrap_or(0),
            soft_records_per_sec: f[2].unwrap_or(0),
            soft_bytes_per_sec: f[3].unwrap_or(0),
            outstanding_writes_max: f[4].unwrap_or(0),
        })
    }
}

/// The `limits:` value of `stream show` and `stream limits`: the stream's own limits, or
/// "proxy defaults".
pub fn format_limits(l: Option<StreamLimits>) -> String {
    let Some(l) = l else {
        return "proxy defaults".to_string();
    };
    let mut parts = Vec::new();
    for (v, what) in [
        (l.records_per_sec, "records/s"),
        (l.bytes_per_sec, "bytes/s"),
        (l.soft_records_per_sec, "soft records/s"),
        (l.soft_bytes_per_sec, "soft bytes/s"),
        (l.outstanding_writes_max, "outstanding writes"),
    ] {
        if v > 0 {
            parts.push(format!("{v} {what}"));
        }
    }
    if parts.is_empty() {
        parts.push("none".to_string());
    }
    format!("{} (stream)", parts.join(", "))
}

/// `quire stream limits`.
pub async fn limits(a: StreamLimitsArgs) -> Result<()> {
    let given = a.given();
    if given.is_some() && a.default.is_some() {
        bail!("give limits or `default`, not both");
    }
    let client = crate::client::connect(&a.proxy).await?;
    let now = if given.is_some() || a.default.is_some() {
        client
            .set_limits(&a.stream, given)
            .await
            .with_context(|| format!("cannot set the limits of stream {:?}", a.stream))?
    } else {
        client
            .describe_stream(&a.stream)
            .await
            .with_context(|| format!("stream {:?}", a.stream))?
            .metadata
            .limits
    };
    println!("stream {} limits: {}", a.stream, format_limits(now));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_print_the_set_ones_or_the_proxy_defaults() {
        assert_eq!(format_limits(None), "proxy defaults");
        let l = StreamLimits {
            records_per_sec: 100,
            outstanding_writes_max: 4,
            ..Default::default()
        };
        assert_eq!(
            format_limits(Some(l)),
            "100 records/s, 4 outstanding writes (stream)"
        );
    }
}

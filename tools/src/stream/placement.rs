//! `quire stream placement STREAM [--create] [--policy P] [--min-regions N] [--regions a,b]
//! [--quorum E,Qw,Qa] [...] | default`: a stream's own placement of its segments' ledgers
//! (`SET_PLACEMENT`, docs/proxy-protocol.md "Placement", issue 30 item 2), used by its owner
//! from the next segment on in place of the owning proxy's `[ledger]` placement keys.

use anyhow::{bail, Context, Result};
use clap::Args;
use quire_client::placement::{PlacementPolicy, StreamPlacement};

/// `quire stream placement` options. Without a placement flag and without `default` it only
/// shows.
#[derive(Args, Debug)]
pub struct StreamPlacementArgs {
    /// Stream name.
    pub stream: String,
    /// `default`: drop the stream's own placement (the proxy's `[ledger]` keys apply).
    #[arg(value_name = "default", value_parser = ["default"])]
    pub default: Option<String>,
    /// Create the stream first (its home is the region of the proxy that creates it), so its
    /// first segment is placed by what the other flags set.
    #[arg(long)]
    pub create: bool,
    /// `default` (random), `rack-aware` or `region-aware`.
    #[arg(long)]
    pub policy: Option<PlacementPolicy>,
    /// Rack-aware: racks each write set spans at least (default 2).
    #[arg(long)]
    pub min_racks: Option<u8>,
    /// Rack-aware: fail a ledger that cannot span them (default: best effort).
    #[arg(long)]
    pub enforce_min_racks: bool,
    /// Region-aware: regions every ack quorum spans at least (default 2).
    #[arg(long)]
    pub min_regions: Option<u8>,
    /// Region-aware: take the best spread rather than fail a ledger that cannot keep
    /// `--min-regions` (default: enforced).
    #[arg(long)]
    pub no_enforce_durability: bool,
    /// The only regions the ledgers' bookies may come from, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub regions: Vec<String>,
    /// The stream's own quorum `E,Qw,Qa` (default: the proxy's `ensemble_size`,
    /// `write_quorum`, `ack_quorum`).
    #[arg(long, value_parser = parse_quorum)]
    pub quorum: Option<(u8, u8, u8)>,
    #[command(flatten)]
    pub proxy: crate::client::ProxyArg,
}

/// `E,Qw,Qa` as three numbers 1 to 255.
fn parse_quorum(s: &str) -> Result<(u8, u8, u8), String> {
    let parts: Vec<&str> = s.split(',').collect();
    let n = |p: &str| p.trim().parse::<u8>().map_err(|e| format!("{p:?}: {e}"));
    match parts.as_slice() {
        [e, w, a] => Ok((n(e)?, n(w)?, n(a)?)),
        _ => Err(format!("expected E,Qw,Qa (three numbers), got {s:?}")),
    }
}

impl StreamPlacementArgs {
    /// The placement the flags give (keys left out take the `[ledger]` defaults), or `None`
    /// when no placement flag was given.
    fn given(&self) -> Option<StreamPlacement> {
        let any = self.policy.is_some()
            || self.min_racks.is_some()
            || self.enforce_min_racks
            || self.min_regions.is_some()
            || self.no_enforce_durability
            || !self.regions.is_empty()
            || self.quorum.is_some();
        let d = StreamPlacement::default();
        any.then(|| StreamPlacement {
            placement: self.policy.unwrap_or(d.placement),
            min_racks_per_write_quorum: self.min_racks.unwrap_or(d.min_racks_per_write_quorum),
            enforce_min_racks: self.enforce_min_racks,
            min_regions_for_durability: self.min_regions.unwrap_or(d.min_regions_for_durability),
            enforce_durability: !self.no_enforce_durability,
            regions: self.regions.clone(),
            quorum: self.quorum,
        })
    }
}

/// The `placement:` value of `stream show` and `stream placement`: the stream's own, or
/// "proxy [ledger] settings".
pub fn format_placement(p: Option<&StreamPlacement>) -> String {
    match p {
        None => "proxy [ledger] settings".to_string(),
        Some(p) => format!("{p} (stream)"),
    }
}

/// `quire stream placement`.
pub async fn placement(a: StreamPlacementArgs) -> Result<()> {
    let given = a.given();
    if given.is_some() && a.default.is_some() {
        bail!("give placement flags or `default`, not both");
    }
    let client = crate::client::connect(&a.proxy).await?;
    if a.create {
        client
            .create_stream(&a.stream)
            .await
            .with_context(|| format!("cannot create stream {:?}", a.stream))?;
    }
    let now = if given.is_some() || a.default.is_some() {
        client
            .set_placement(&a.stream, given)
            .await
            .with_context(|| format!("cannot set the placement of stream {:?}", a.stream))?
    } else {
        client
            .describe_stream(&a.stream)
            .await
            .with_context(|| format!("stream {:?}", a.stream))?
            .metadata
            .placement
    };
    println!(
        "stream {} placement: {}",
        a.stream,
        format_placement(now.as_ref())
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_flag_and_printed_placement() {
        assert_eq!(parse_quorum("3,3,2"), Ok((3, 3, 2)));
        assert!(parse_quorum("3,3").is_err());
        assert!(parse_quorum("3,x,2").is_err());
        assert_eq!(format_placement(None), "proxy [ledger] settings");
        let local = StreamPlacement {
            regions: vec!["a".into()],
            quorum: Some((2, 2, 2)),
            ..StreamPlacement::default()
        };
        assert_eq!(
            format_placement(Some(&local)),
            "default regions=a quorum=2/2/2 (stream)"
        );
    }
}

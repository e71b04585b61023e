//! A stream's own placement on the wire (`SET_PLACEMENT`, opcode 0x12, and the
//! `DESCRIBE_STREAM` answer; docs/proxy-protocol.md, "Placement"; issue 30 item 2).
//!
//! A placement block: policy u8 (0 default, 1 rack-aware, 2 region-aware),
//! min_racks_per_write_quorum u8, min_regions_for_durability u8, flags u8 (bit0
//! enforce_min_racks, bit1 enforce_durability, bit2 a quorum follows; other bits 0), with
//! bit2 E u8, Qw u8, Qa u8, then the region count u8 and each region as a u16 length and
//! UTF-8 bytes (1 to 255). An optional block is a present u8 (0: none, the owning proxy's
//! `[ledger]` placement applies; 1: a block follows).

use quire_wire::{Reader, WireError};
use serde::Serialize;

/// `DESCRIBE_STREAM` request flag: the client decodes the stream's placement (answer flag
/// [`FLAG_DESCRIBE_PLACEMENT`]); without it the proxy leaves the placement out, so older
/// clients still decode every answer.
pub const FLAG_DESCRIBE_WANT_PLACEMENT: u8 = 0x02;

/// `DESCRIBE_STREAM` answer flag: the stream has a placement of its own, and a placement
/// block ends the stream info (after the lookups, the limits block and the home region).
pub const FLAG_DESCRIBE_PLACEMENT: u8 = 0x20;

/// Longest region name in a placement block, in bytes.
pub const REGION_NAME_BYTES_MAX: usize = 255;

const ENFORCE_MIN_RACKS: u8 = 0x01;
const ENFORCE_DURABILITY: u8 = 0x02;
const HAS_QUORUM: u8 = 0x04;

/// A placement policy (BookKeeper's ensemble placement policies).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementPolicy {
    /// Random (`DefaultEnsemblePlacementPolicy`).
    #[default]
    Default,
    /// Racks per write set (`RackawareEnsemblePlacementPolicy`).
    RackAware,
    /// Regions per ack quorum (`RegionAwareEnsemblePlacementPolicy`).
    RegionAware,
}

impl std::fmt::Display for PlacementPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PlacementPolicy::Default => "default",
            PlacementPolicy::RackAware => "rack-aware",
            PlacementPolicy::RegionAware => "region-aware",
        })
    }
}

impl std::str::FromStr for PlacementPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "default" => Ok(PlacementPolicy::Default),
            "rack-aware" => Ok(PlacementPolicy::RackAware),
            "region-aware" => Ok(PlacementPolicy::RegionAware),
            other => Err(format!(
                "unknown placement {other:?}: expected default, rack-aware or region-aware"
            )),
        }
    }
}

/// A stream's own placement of its new segments' ledgers, replacing the owning proxy's
/// `[ledger]` placement keys (a change applies from the stream's next segment; each ledger
/// records the placement it was made under, which autorecovery and decommission keep).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct StreamPlacement {
    /// The policy.
    pub placement: PlacementPolicy,
    /// Racks each write set spans under rack-aware (`minNumRacksPerWriteQuorum`), 1 to 255.
    pub min_racks_per_write_quorum: u8,
    /// Fail a rack-aware placement that cannot keep it.
    pub enforce_min_racks: bool,
    /// Regions every ack quorum spans under region-aware (`minRegionsForDurability`), 1 to
    /// 255.
    pub min_regions_for_durability: u8,
    /// Fail a region-aware placement that cannot keep it (`enforceDurability`).
    pub enforce_durability: bool,
    /// The only regions the ledgers' bookies may come from; empty: every region.
    pub regions: Vec<String>,
    /// The stream's own (E, Qw, Qa); `None`: the proxy's quorum.
    pub quorum: Option<(u8, u8, u8)>,
}

impl Default for StreamPlacement {
    /// The `[ledger]` keys' defaults: random, 2 racks not enforced, 2 regions enforced.
    fn default() -> Self {
        Self {
            placement: PlacementPolicy::Default,
            min_racks_per_write_quorum: 2,
            enforce_min_racks: false,
            min_regions_for_durability: 2,
            enforce_durability: true,
            regions: Vec::new(),
            quorum: None,
        }
    }
}

impl std::fmt::Display for StreamPlacement {
    /// One line, e.g. `region-aware min_regions=2 enforce_durability=true regions=a,b`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.placement)?;
        match self.placement {
            PlacementPolicy::RackAware => write!(
                f,
                " min_racks={} enforce_min_racks={}",
                self.min_racks_per_write_quorum, self.enforce_min_racks
            )?,
            PlacementPolicy::RegionAware => write!(
                f,
                " min_regions={} enforce_durability={}",
                self.min_regions_for_durability, self.enforce_durability
            )?,
            PlacementPolicy::Default => {}
        }
        if self.regions.is_empty() {
            f.write_str(" regions=all")?;
        } else {
            write!(f, " regions={}", self.regions.join(","))?;
        }
        if let Some((e, w, a)) = self.quorum {
            write!(f, " quorum={e}/{w}/{a}")?;
        }
        Ok(())
    }
}

/// Appends a placement block. Regions past 255, and bytes of a name past
/// [`REGION_NAME_BYTES_MAX`], are not sent (the proxy refuses such a placement anyway).
pub fn put_block(out: &mut Vec<u8>, p: &StreamPlacement) {
    out.push(match p.placement {
        PlacementPolicy::Default => 0,
        PlacementPolicy::RackAware => 1,
        PlacementPolicy::RegionAware => 2,
    });
    out.push(p.min_racks_per_write_quorum);
    out.push(p.min_regions_for_durability);
    let mut flags = 0;
    if p.enforce_min_racks {
        flags |= ENFORCE_MIN_RACKS;
    }
    if p.enforce_durability {
        flags |= ENFORCE_DURABILITY;
    }
    if p.quorum.is_some() {
        flags |= HAS_QUORUM;
    }
    out.push(flags);
    if let Some((e, w, a)) = p.quorum {
        out.extend_from_slice(&[e, w, a]);
    }
    let regions = &p.regions[..p.regions.len().min(255)];
    out.push(regions.len() as u8);
    for r in regions {
        let mut end = r.len().min(REGION_NAME_BYTES_MAX);
        while !r.is_char_boundary(end) {
            end -= 1;
        }
        out.extend_from_slice(&(end as u16).to_le_bytes());
        out.extend_from_slice(&r.as_bytes()[..end]);
    }
}

/// Reads a placement block.
///
/// # Errors
/// `WireError` on a short body, an unknown policy or flag bit, or a region name that is empty,
/// over [`REGION_NAME_BYTES_MAX`] bytes or not UTF-8.
pub fn get_block(r: &mut Reader<'_>) -> Result<StreamPlacement, WireError> {
    let placement = match r.u8()? {
        0 => PlacementPolicy::Default,
        1 => PlacementPolicy::RackAware,
        2 => PlacementPolicy::RegionAware,
        _ => {
            return Err(WireError::InvalidField {
                what: "placement policy",
            })
        }
    };
    let min_racks_per_write_quorum = r.u8()?;
    let min_regions_for_durability = r.u8()?;
    let flags = r.u8()?;
    if flags & !(ENFORCE_MIN_RACKS | ENFORCE_DURABILITY | HAS_QUORUM) != 0 {
        return Err(WireError::InvalidField {
            what: "placement flags",
        });
    }
    let quorum = if flags & HAS_QUORUM != 0 {
        Some((r.u8()?, r.u8()?, r.u8()?))
    } else {
        None
    };
    let count = usize::from(r.u8()?);
    let mut regions = Vec::with_capacity(count);
    for _ in 0..count {
        let len = usize::from(u16::from_le_bytes([r.u8()?, r.u8()?]));
        if len == 0 || len > REGION_NAME_BYTES_MAX {
            return Err(WireError::InvalidField {
                what: "placement region",
            });
        }
        let mut bytes = Vec::with_capacity(len);
        for _ in 0..len {
            bytes.push(r.u8()?);
        }
        regions.push(
            String::from_utf8(bytes).map_err(|_| WireError::InvalidField {
                what: "placement region",
            })?,
        );
    }
    Ok(StreamPlacement {
        placement,
        min_racks_per_write_quorum,
        enforce_min_racks: flags & ENFORCE_MIN_RACKS != 0,
        min_regions_for_durability,
        enforce_durability: flags & ENFORCE_DURABILITY != 0,
        regions,
        quorum,
    })
}

/// Appends an optional placement block (present u8, then the block).
pub fn put_opt(out: &mut Vec<u8>, p: &Option<StreamPlacement>) {
    match p {
        None => out.push(0),
        Some(p) => {
            out.push(1);
            put_block(out, p);
        }
    }
}

/// Reads an optional placement block.
///
/// # Errors
/// As [`get_block`], and a present byte other than 0 or 1.
pub fn get_opt(r: &mut Reader<'_>) -> Result<Option<StreamPlacement>, WireError> {
    match r.u8()? {
        0 => Ok(None),
        1 => get_block(r).map(Some),
        _ => Err(WireError::InvalidField {
            what: "placement present flag",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip_and_bad_bytes_are_errors() {
        // Goal: every field survives encode/decode; a damaged block is a WireError, never a
        // panic. Method: round trips, then every prefix and a few flipped bytes.
        let cases = [
            StreamPlacement::default(),
            StreamPlacement {
                placement: PlacementPolicy::RegionAware,
                min_regions_for_durability: 3,
                enforce_durability: false,
                regions: vec!["a".into(), "région-b".into()],
                quorum: Some((5, 3, 3)),
                ..StreamPlacement::default()
            },
            StreamPlacement {
                placement: PlacementPolicy::RackAware,
                min_racks_per_write_quorum: 3,
                enforce_min_racks: true,
                ..StreamPlacement::default()
            },
        ];
        for p in cases {
            let mut out = Vec::new();
            put_opt(&mut out, &Some(p.clone()));
            let mut r = Reader::new(&out, "test");
            assert_eq!(get_opt(&mut r).unwrap(), Some(p.clone()));
            r.finish().unwrap();
            for cut in 0..out.len() {
                let mut r = Reader::new(&out[..cut], "test");
                assert!(get_opt(&mut r).is_err(), "{p:?} cut at {cut}");
            }
        }
        let mut none = Vec::new();
        put_opt(&mut none, &None);
        assert_eq!(none, [0]);
        for bad in [
            [2u8].as_slice(),
            &[1, 3, 2, 2, 0, 0],
            &[1, 0, 2, 2, 0x08, 0],
            &[1, 0, 2, 2, 0, 1, 0, 0],
        ] {
            let mut r = Reader::new(bad, "test");
            assert!(get_opt(&mut r).is_err(), "{bad:?}");
        }
    }
}

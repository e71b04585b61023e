//! A stream's own placement (issue 30 item 2, "chosen per stream or per cluster"): the
//! placement policy, its rule's parameters, the regions its ledgers may use and optionally
//! its own quorum shape, stored in the stream record (`StreamMetadata::placement`, set by
//! `SET_PLACEMENT`) and recorded in the metadata of every ledger made under it (the custom
//! key [`LEDGER_PLACEMENT_KEY`]), so that ensemble changes, recovery, autorecovery and
//! decommission replace that ledger's bookies by the same rule. DistributedLog chooses the
//! placement per writer (its `BookKeeperClient` is built from the stream's configuration);
//! BookKeeper stores no placement in a ledger, so a BookKeeper auditor replaces by the
//! cluster's policy: the recorded placement is Quire's addition.
//!
//! The types live here, below the ledger client, because both the stream record and the
//! ledger record carry them; `quire_ledger::placement` applies them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Error;

/// The custom-metadata key of a ledger made under a stream's own placement: its value is the
/// [`StreamPlacement`] as JSON (docs/format/metadata.md). Absent: the ledger was placed by the
/// cluster's `[ledger]` settings, and is replaced by them.
pub const LEDGER_PLACEMENT_KEY: &str = "quire.placement";

/// Most regions a placement may name (one byte on the wire).
pub const PLACEMENT_REGIONS_MAX: usize = 255;

/// A placement policy (`[ledger] placement`, or a stream's own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementPolicy {
    /// Random (BookKeeper `DefaultEnsemblePlacementPolicy`).
    #[default]
    Default,
    /// Racks per write set (BookKeeper `RackawareEnsemblePlacementPolicy`).
    RackAware,
    /// Regions per ack quorum (BookKeeper `RegionAwareEnsemblePlacementPolicy`).
    RegionAware,
}

impl PlacementPolicy {
    /// The wire byte (0 default, 1 rack-aware, 2 region-aware; docs/proxy-protocol.md).
    pub fn to_byte(self) -> u8 {
        match self {
            PlacementPolicy::Default => 0,
            PlacementPolicy::RackAware => 1,
            PlacementPolicy::RegionAware => 2,
        }
    }

    /// The policy of a wire byte; `None` for an unknown one.
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(PlacementPolicy::Default),
            1 => Some(PlacementPolicy::RackAware),
            2 => Some(PlacementPolicy::RegionAware),
            _ => None,
        }
    }
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

/// A ledger quorum shape: ensemble size E, write quorum Qw, ack quorum Qa (E >= Qw >= Qa >= 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuorumShape {
    /// Ensemble size E.
    pub ensemble_size: u8,
    /// Write quorum Qw.
    pub write_quorum: u8,
    /// Ack quorum Qa.
    pub ack_quorum: u8,
}

/// A stream's own placement, replacing the owning proxy's `[ledger]` placement keys (all of
/// them: a field left out of a request takes the key's documented default, not the proxy's
/// value) for the ledgers of its new segments. `reorder_read_sequence` stays the reader's own.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamPlacement {
    /// The policy (`[ledger] placement`).
    pub placement: PlacementPolicy,
    /// Racks each write set spans at least under rack-aware (`minNumRacksPerWriteQuorum`),
    /// 1 to 255.
    pub min_racks_per_write_quorum: u8,
    /// Fail a rack-aware placement that cannot keep it (`enforceMinNumRacksPerWriteQuorum`).
    pub enforce_min_racks: bool,
    /// Regions every ack quorum spans at least under region-aware (DistributedLog
    /// `minRegionsForDurability`), 1 to 255.
    pub min_regions_for_durability: u8,
    /// Fail a region-aware placement that cannot keep it (BookKeeper `enforceDurability`).
    pub enforce_durability: bool,
    /// The regions whose bookies the ledgers may use (DistributedLog's regions to write;
    /// bookies without a label are in `default-region`); empty: every region.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<String>,
    /// The stream's own quorum shape; `None`: the proxy's `ensemble_size`, `write_quorum`,
    /// `ack_quorum`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quorum: Option<QuorumShape>,
}

impl Default for StreamPlacement {
    /// The `[ledger]` keys' defaults: random, 2 racks not enforced, 2 regions enforced, every
    /// region, the proxy's quorum.
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

impl StreamPlacement {
    /// Checks the rules a placement must keep before it is stored: minimums of at least 1,
    /// at most [`PLACEMENT_REGIONS_MAX`] distinct region names of 1 to 255 bytes without
    /// control characters, E >= Qw >= Qa >= 1, and under an enforced region-aware policy with
    /// a quorum, Qa >= `min_regions_for_durability` (a smaller Qa can never span them).
    ///
    /// # Errors
    /// `Invalid` naming the broken rule.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |reason: String| {
            Err(Error::Invalid {
                what: "placement",
                reason,
            })
        };
        if self.min_racks_per_write_quorum == 0 || self.min_regions_for_durability == 0 {
            return bad(
                "min_racks_per_write_quorum and min_regions_for_durability are 1 to 255".into(),
            );
        }
        if self.regions.len() > PLACEMENT_REGIONS_MAX {
            return bad(format!(
                "{} regions, at most {PLACEMENT_REGIONS_MAX}",
                self.regions.len()
            ));
        }
        for (i, r) in self.regions.iter().enumerate() {
            if r.is_empty() || r.len() > 255 || r.chars().any(char::is_control) {
                return bad(format!("region {r:?} is not 1 to 255 printable bytes"));
            }
            if self.regions[..i].contains(r) {
                return bad(format!("region {r:?} is named twice"));
            }
        }
        if let Some(q) = self.quorum {
            let (e, w, a) = (q.ensemble_size, q.write_quorum, q.ack_quorum);
            if !(e >= w && w >= a && a >= 1) {
                return bad(format!("need E >= Qw >= Qa >= 1, got E={e} Qw={w} Qa={a}"));
            }
            if self.placement == PlacementPolicy::RegionAware
                && self.enforce_durability
                && a < self.min_regions_for_durability
            {
                return bad(format!(
                    "an ack quorum of {a} cannot span min_regions_for_durability = {} regions",
                    self.min_regions_for_durability
                ));
            }
        }
        Ok(())
    }

    /// Records this placement in a ledger's custom metadata ([`LEDGER_PLACEMENT_KEY`]).
    pub fn record(&self, custom: &mut BTreeMap<String, String>) {
        // A struct of plain fields always serialises.
        let json = serde_json::to_string(self).expect("placement serialises");
        custom.insert(LEDGER_PLACEMENT_KEY.to_string(), json);
    }

    /// The placement recorded in a ledger's custom metadata; `None` when there is none (the
    /// cluster's placement applies).
    ///
    /// # Errors
    /// `Invalid` when the recorded value does not parse or breaks [`Self::validate`].
    pub fn recorded(custom: &BTreeMap<String, String>) -> Result<Option<Self>, Error> {
        let Some(json) = custom.get(LEDGER_PLACEMENT_KEY) else {
            return Ok(None);
        };
        let p: Self = serde_json::from_str(json).map_err(|e| Error::Invalid {
            what: "recorded placement",
            reason: format!("{LEDGER_PLACEMENT_KEY} = {json:?}: {e}"),
        })?;
        p.validate()?;
        Ok(Some(p))
    }
}

impl std::fmt::Display for StreamPlacement {
    /// One line: `region-aware min_regions=2 enforce_durability=true regions=a,b,c quorum=3/3/2`
    /// (the rack keys only for rack-aware, the region keys only for region-aware).
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
        if let Some(q) = self.quorum {
            write!(
                f,
                " quorum={}/{}/{}",
                q.ensemble_size, q.write_quorum, q.ack_quorum
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region_aware() -> StreamPlacement {
        StreamPlacement {
            placement: PlacementPolicy::RegionAware,
            regions: vec!["a".into(), "b".into(), "c".into()],
            quorum: Some(QuorumShape {
                ensemble_size: 3,
                write_quorum: 3,
                ack_quorum: 2,
            }),
            ..StreamPlacement::default()
        }
    }

    #[test]
    fn recorded_placement_round_trips_through_custom_metadata() {
        // Goal: what a ledger records is what re-replication reads back; no key reads as none;
        // a damaged value is a clear error, not a panic.
        let mut custom = BTreeMap::new();
        assert_eq!(StreamPlacement::recorded(&custom).unwrap(), None);
        let p = region_aware();
        p.record(&mut custom);
        assert_eq!(StreamPlacement::recorded(&custom).unwrap(), Some(p));
        custom.insert(
            LEDGER_PLACEMENT_KEY.into(),
            "{\"placement\":\"nowhere\"}".into(),
        );
        let err = StreamPlacement::recorded(&custom).unwrap_err().to_string();
        assert!(err.contains("quire.placement"), "{err}");
    }

    #[test]
    fn stored_form_leaves_out_empty_fields() {
        // Goal: the JSON stored in stream and ledger records (docs/format/metadata.md).
        let local = StreamPlacement {
            regions: vec!["a".into()],
            ..StreamPlacement::default()
        };
        assert_eq!(
            serde_json::to_string(&local).unwrap(),
            "{\"placement\":\"default\",\"min_racks_per_write_quorum\":2,\
             \"enforce_min_racks\":false,\"min_regions_for_durability\":2,\
             \"enforce_durability\":true,\"regions\":[\"a\"]}"
        );
        assert_eq!(
            region_aware().to_string(),
            "region-aware min_regions=2 enforce_durability=true regions=a,b,c quorum=3/3/2"
        );
    }

    #[test]
    fn validate_names_the_broken_rule() {
        assert!(region_aware().validate().is_ok());
        let cases: Vec<(StreamPlacement, &str)> = vec![
            (
                StreamPlacement {
                    min_regions_for_durability: 0,
                    ..StreamPlacement::default()
                },
                "1 to 255",
            ),
            (
                StreamPlacement {
                    regions: vec!["a".into(), "a".into()],
                    ..StreamPlacement::default()
                },
                "named twice",
            ),
            (
                StreamPlacement {
                    regions: vec![String::new()],
                    ..StreamPlacement::default()
                },
                "printable",
            ),
            (
                StreamPlacement {
                    quorum: Some(QuorumShape {
                        ensemble_size: 2,
                        write_quorum: 3,
                        ack_quorum: 2,
                    }),
                    ..StreamPlacement::default()
                },
                "E >= Qw",
            ),
            (
                StreamPlacement {
                    min_regions_for_durability: 3,
                    ..region_aware()
                },
                "cannot span",
            ),
        ];
        for (p, want) in cases {
            let err = p.validate().unwrap_err().to_string();
            assert!(err.contains(want), "{p:?}: {err}");
        }
        for b in 0..=3u8 {
            let p = PlacementPolicy::from_byte(b);
            assert_eq!(p.map(PlacementPolicy::to_byte), (b < 3).then_some(b));
        }
    }
}

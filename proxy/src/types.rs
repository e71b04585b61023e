//! The stream layer's result types: the proxy protocol's own (from quire-client, so that the
//! server sends what the stream layer returns without converting) and the stream layer's
//! describe answer, which holds the metadata store's record and is converted to the protocol's
//! [`quire_client::StreamInfo`] by the server.

pub use quire_client::types::{
    check_retention_size_bytes, check_retention_time_secs, ReadBatch, RetentionChange,
    RetentionDefaults, TruncateResult, WriteResult, RETENTION_SIZE_BYTES_MAX,
    RETENTION_TIME_SECS_MAX,
};

/// What a stream looks like: its metadata record, its owner and the retention defaults of the
/// proxy that answered (`StreamManager::describe`; the server sends it as `DESCRIBE_STREAM`'s
/// answer, converted with `From` into [`quire_client::StreamInfo`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    /// The stream's record: segments (state, ledger, txids, last entry, record and byte
    /// counts, completion time), max txid, truncation point and retention overrides. When the
    /// answering proxy owns the stream, the segment being written shows its acknowledged
    /// entries, records and bytes so far (the stored record has them only once completed).
    pub metadata: quire_metadata::StreamMetadata,
    /// The proxy that owns the stream now (`host:port`), if any.
    pub owner: Option<String>,
    /// The answering proxy's cluster-wide retention defaults (overridden per stream by
    /// `metadata.retention`).
    pub defaults: RetentionDefaults,
    /// First/last DLSN, record count, last write time, sealed (computed from `metadata`).
    pub lookups: quire_client::StreamLookups,
}

/// The protocol's view of the metadata record: everything but the stream's ledger secret,
/// which only the owning proxy uses and which is never sent.
impl From<StreamInfo> for quire_client::StreamInfo {
    fn from(info: StreamInfo) -> Self {
        let m = info.metadata;
        quire_client::StreamInfo {
            metadata: quire_client::StreamMetadata {
                name: m.name,
                segments: m.segments.iter().map(wire_segment).collect(),
                max_txid: m.max_txid,
                creation_time_ms: m.creation_time_ms,
                truncated_before: m
                    .truncated_before
                    .map(|t| quire_client::Dlsn::new(t.segment_seq_no, t.entry_id, t.slot_index)),
                retention: wire_retention(m.retention),
                compression: wire_compression(m.compression),
                limits: m.limits.map(wire_limits),
                home_region: m.home_region,
                placement: m.placement.map(wire_placement),
            },
            owner: info.owner,
            defaults: info.defaults,
            lookups: Some(Box::new(info.lookups)),
        }
    }
}

/// A segment's metadata record as the protocol carries it.
fn wire_segment(s: &quire_metadata::SegmentMetadata) -> quire_client::SegmentMetadata {
    quire_client::SegmentMetadata {
        seq_no: s.seq_no,
        ledger_id: s.ledger_id,
        state: match s.state {
            quire_metadata::SegmentState::InProgress => quire_client::SegmentState::InProgress,
            quire_metadata::SegmentState::Completed => quire_client::SegmentState::Completed,
        },
        first_txid: s.first_txid,
        last_txid: s.last_txid,
        last_entry: s.last_entry,
        record_count: s.record_count,
        length_bytes: s.length_bytes,
        completion_time_ms: s.completion_time_ms,
    }
}

/// A stream's own compression setting as the protocol carries it (`SET_COMPRESSION`,
/// `DESCRIBE_STREAM` flags).
pub fn wire_compression(
    c: Option<quire_metadata::StreamCompression>,
) -> Option<quire_client::compression::Compression> {
    use quire_client::compression::Compression;
    c.map(|c| match c {
        quire_metadata::StreamCompression::None => Compression::None,
        quire_metadata::StreamCompression::Lz4 => Compression::Lz4,
    })
}

/// A stream's own limits as the protocol carries them (`SET_LIMITS`, `DESCRIBE_STREAM`).
pub fn wire_limits(l: quire_metadata::RateLimits) -> quire_client::limits::StreamLimits {
    quire_client::limits::StreamLimits {
        records_per_sec: l.records_per_sec,
        bytes_per_sec: l.bytes_per_sec,
        soft_records_per_sec: l.soft_records_per_sec,
        soft_bytes_per_sec: l.soft_bytes_per_sec,
        outstanding_writes_max: l.outstanding_writes_max,
    }
}

/// A stream's limits from the protocol's form (the inverse of [`wire_limits`]).
pub fn stored_limits(l: quire_client::limits::StreamLimits) -> quire_metadata::RateLimits {
    quire_metadata::RateLimits {
        records_per_sec: l.records_per_sec,
        bytes_per_sec: l.bytes_per_sec,
        soft_records_per_sec: l.soft_records_per_sec,
        soft_bytes_per_sec: l.soft_bytes_per_sec,
        outstanding_writes_max: l.outstanding_writes_max,
    }
}

/// A stream's own placement as the protocol carries it (`SET_PLACEMENT`, `DESCRIBE_STREAM`).
pub fn wire_placement(
    p: quire_metadata::StreamPlacement,
) -> quire_client::placement::StreamPlacement {
    use quire_client::placement::PlacementPolicy as Wire;
    use quire_metadata::PlacementPolicy as Stored;
    quire_client::placement::StreamPlacement {
        placement: match p.placement {
            Stored::Default => Wire::Default,
            Stored::RackAware => Wire::RackAware,
            Stored::RegionAware => Wire::RegionAware,
        },
        min_racks_per_write_quorum: p.min_racks_per_write_quorum,
        enforce_min_racks: p.enforce_min_racks,
        min_regions_for_durability: p.min_regions_for_durability,
        enforce_durability: p.enforce_durability,
        regions: p.regions,
        quorum: p
            .quorum
            .map(|q| (q.ensemble_size, q.write_quorum, q.ack_quorum)),
    }
}

/// A stream's placement from the protocol's form (the inverse of [`wire_placement`]).
pub fn stored_placement(
    p: quire_client::placement::StreamPlacement,
) -> quire_metadata::StreamPlacement {
    use quire_client::placement::PlacementPolicy as Wire;
    use quire_metadata::PlacementPolicy as Stored;
    quire_metadata::StreamPlacement {
        placement: match p.placement {
            Wire::Default => Stored::Default,
            Wire::RackAware => Stored::RackAware,
            Wire::RegionAware => Stored::RegionAware,
        },
        min_racks_per_write_quorum: p.min_racks_per_write_quorum,
        enforce_min_racks: p.enforce_min_racks,
        min_regions_for_durability: p.min_regions_for_durability,
        enforce_durability: p.enforce_durability,
        regions: p.regions,
        quorum: p.quorum.map(|(e, w, a)| quire_metadata::QuorumShape {
            ensemble_size: e,
            write_quorum: w,
            ack_quorum: a,
        }),
    }
}

/// A stream's compression setting from the protocol's form (the inverse of
/// [`wire_compression`]).
pub fn stored_compression(
    c: Option<quire_client::compression::Compression>,
) -> Option<quire_metadata::StreamCompression> {
    use quire_client::compression::Compression;
    c.map(|c| match c {
        Compression::None => quire_metadata::StreamCompression::None,
        Compression::Lz4 => quire_metadata::StreamCompression::Lz4,
    })
}

/// A stream's retention overrides as the protocol carries them (`SET_RETENTION`'s answer). A
/// function, not `From`: both types belong to other crates.
pub fn wire_retention(o: quire_metadata::RetentionOverride) -> quire_client::RetentionOverride {
    quire_client::RetentionOverride {
        time_secs: o.time_secs,
        size_bytes: o.size_bytes,
        keep_for_subscriptions: o.keep_for_subscriptions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_client::protocol::{Opcode, Response};
    use quire_metadata::{
        RetentionOverride, SegmentMetadata, SegmentState, StreamMetadata, TruncationPoint,
    };
    use quire_wire::frame::decode_frame;

    fn seg(seq_no: u64, state: SegmentState, t: Option<u64>) -> SegmentMetadata {
        SegmentMetadata {
            seq_no,
            ledger_id: seq_no + 100,
            state,
            first_txid: Some(seq_no * 10),
            last_txid: t,
            last_entry: t,
            record_count: seq_no + 7,
            length_bytes: seq_no + 70,
            completion_time_ms: t,
            first_write_time_ms: None,
            last_write_time_ms: None,
            last_record_entry: None,
            last_record_slot: None,
        }
    }

    fn sample_lookups() -> quire_client::StreamLookups {
        quire_client::StreamLookups {
            first_dlsn: Some(quire_client::Dlsn::new(2, 1, 4)),
            last_dlsn: Some(quire_client::Dlsn::new(3, 5, 0)),
            record_count: 19,
            last_write_time_ms: Some(77),
            sealed: true,
        }
    }

    #[test]
    fn describe_answer_carries_the_record_but_not_the_secret() {
        // Goal: the protocol's stream description holds every field of the stream's metadata
        // record except its ledger secret. Method: convert a record with every field set,
        // encode it as a DESCRIBE_STREAM answer, decode it and compare field by field, and
        // look for the secret's text in the frame.
        let secret = "5ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2";
        let info = StreamInfo {
            metadata: StreamMetadata {
                name: "logs/a".into(),
                segments: vec![
                    seg(2, SegmentState::Completed, Some(9)),
                    seg(3, SegmentState::InProgress, None),
                ],
                max_txid: Some(9),
                creation_time_ms: 12,
                truncated_before: Some(TruncationPoint {
                    segment_seq_no: 2,
                    entry_id: 1,
                    slot_index: 4,
                }),
                retention: RetentionOverride {
                    time_secs: Some(60),
                    size_bytes: None,
                    keep_for_subscriptions: false,
                },
                ledger_secret_hex: Some(secret.into()),
                sealed: false,
                compression: None,
                limits: None,
                home_region: Some("ra".into()),
                placement: Some(quire_metadata::StreamPlacement {
                    placement: quire_metadata::PlacementPolicy::RegionAware,
                    regions: vec!["ra".into(), "rb".into()],
                    quorum: Some(quire_metadata::QuorumShape {
                        ensemble_size: 3,
                        write_quorum: 3,
                        ack_quorum: 2,
                    }),
                    ..quire_metadata::StreamPlacement::default()
                }),
            },
            owner: Some("127.0.0.1:4181".into()),
            defaults: RetentionDefaults {
                time_secs: None,
                size_bytes: Some(1 << 30),
            },
            lookups: sample_lookups(),
        };
        let wire: quire_client::StreamInfo = info.clone().into();
        let mut buf = Vec::new();
        Response::DescribeStream { info: wire }.encode(Opcode::DescribeStream as u8, 3, &mut buf);
        assert!(!buf.windows(secret.len()).any(|w| w == secret.as_bytes()));
        let (frame, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        let Response::DescribeStream { info: got } = Response::decode(&frame).unwrap() else {
            panic!("not a describe answer");
        };
        let m = &got.metadata;
        assert_eq!(m.name, "logs/a");
        assert_eq!(m.max_txid, Some(9));
        assert_eq!(m.creation_time_ms, 12);
        assert_eq!(m.truncated_before, Some(quire_client::Dlsn::new(2, 1, 4)));
        assert_eq!(m.retention.time_secs, Some(60));
        assert_eq!(m.retention.size_bytes, None);
        assert_eq!(m.home_region.as_deref(), Some("ra"));
        let placement = m.placement.clone().map(super::stored_placement);
        assert_eq!(placement, info.metadata.placement);
        assert_eq!(got.owner, info.owner);
        assert_eq!(
            (got.defaults, got.lookups),
            (info.defaults, Some(Box::new(info.lookups)))
        );
        assert_eq!(m.segments.len(), 2);
        for (w, s) in m.segments.iter().zip(&info.metadata.segments) {
            assert_eq!(
                (
                    w.seq_no,
                    w.ledger_id,
                    w.first_txid,
                    w.last_txid,
                    w.last_entry
                ),
                (
                    s.seq_no,
                    s.ledger_id,
                    s.first_txid,
                    s.last_txid,
                    s.last_entry
                )
            );
            assert_eq!(
                (w.record_count, w.length_bytes, w.completion_time_ms),
                (s.record_count, s.length_bytes, s.completion_time_ms)
            );
            let state = match s.state {
                SegmentState::InProgress => quire_client::SegmentState::InProgress,
                SegmentState::Completed => quire_client::SegmentState::Completed,
            };
            assert_eq!(w.state, state);
        }
    }

    #[test]
    fn retention_overrides_keep_every_field_on_the_wire() {
        assert_eq!(
            wire_retention(RetentionOverride {
                time_secs: None,
                size_bytes: Some(5),
                keep_for_subscriptions: true,
            }),
            quire_client::RetentionOverride {
                time_secs: None,
                size_bytes: Some(5),
                keep_for_subscriptions: true,
            }
        );
    }
}

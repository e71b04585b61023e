//! A stream's own write limits on the wire (`SET_LIMITS`, opcode 0x11, and the
//! `DESCRIBE_STREAM` answer; docs/proxy-protocol.md, "Limits").
//!
//! A limits block is five u64 (little-endian): records/s, bytes/s, soft records/s, soft
//! bytes/s, outstanding writes; 0 is "no limit" (DistributedLog's `-1`). An optional block is a
//! present u8 (0: none, the owning proxy's `[limits] stream_*` defaults apply; 1: a block
//! follows).

use quire_wire::{Reader, WireError};
use serde::Serialize;

/// `DESCRIBE_STREAM` answer flag: the stream has limits of its own, and a limits block ends
/// the stream info (after the lookups).
pub const FLAG_DESCRIBE_LIMITS: u8 = 0x08;

/// Size of a limits block: five u64.
pub const BLOCK_SIZE_BYTES: usize = 40;

/// A stream's own write limits (the stream record's `limits`): hard rates refuse a write with
/// `OVER_CAPACITY`, soft ones only count it; 0: that limit is off. Rates are per second over a
/// token bucket holding one second's worth.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
pub struct StreamLimits {
    /// Hard limit, records per second.
    pub records_per_sec: u64,
    /// Hard limit, record payload bytes per second.
    pub bytes_per_sec: u64,
    /// Soft limit, records per second (logged and counted only).
    pub soft_records_per_sec: u64,
    /// Soft limit, record payload bytes per second.
    pub soft_bytes_per_sec: u64,
    /// Most writes to the stream accepted by its owner and not yet answered.
    pub outstanding_writes_max: u64,
}

impl StreamLimits {
    fn fields(&self) -> [u64; 5] {
        [
            self.records_per_sec,
            self.bytes_per_sec,
            self.soft_records_per_sec,
            self.soft_bytes_per_sec,
            self.outstanding_writes_max,
        ]
    }

    /// Whether every limit is off.
    pub fn is_unlimited(&self) -> bool {
        self.fields() == [0; 5]
    }
}

/// Appends a limits block.
pub fn put_block(out: &mut Vec<u8>, l: &StreamLimits) {
    for v in l.fields() {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Reads a limits block.
///
/// # Errors
/// `WireError` on a short body.
pub fn get_block(r: &mut Reader<'_>) -> Result<StreamLimits, WireError> {
    Ok(StreamLimits {
        records_per_sec: r.u64()?,
        bytes_per_sec: r.u64()?,
        soft_records_per_sec: r.u64()?,
        soft_bytes_per_sec: r.u64()?,
        outstanding_writes_max: r.u64()?,
    })
}

/// Appends an optional limits block (present u8, then the block).
pub fn put_opt(out: &mut Vec<u8>, l: &Option<StreamLimits>) {
    match l {
        None => out.push(0),
        Some(l) => {
            out.push(1);
            put_block(out, l);
        }
    }
}

/// Reads an optional limits block.
///
/// # Errors
/// `WireError` on a short body or a present byte other than 0 or 1.
pub fn get_opt(r: &mut Reader<'_>) -> Result<Option<StreamLimits>, WireError> {
    match r.u8()? {
        0 => Ok(None),
        1 => get_block(r).map(Some),
        _ => Err(WireError::InvalidField {
            what: "limits present flag",
        }),
    }
}

//! The payload of a benchmark record: who it is and when it was meant to be sent, so that a
//! tailing reader in the same process can measure delivery latency from the intended send time.
//!
//! Layout (little-endian), then filler up to the record size:
//! ```text
//! 0..4    magic "QPRF"
//! 4..12   sequence number within the run (u64)
//! 12..20  intended send time, nanoseconds since the run's clock base (u64)
//! ```

/// Bytes the header takes; records are at least this large.
pub const PAYLOAD_HEADER_SIZE_BYTES: usize = 20;

const MAGIC: &[u8; 4] = b"QPRF";

/// Builds a payload of `size_bytes` (at least [`PAYLOAD_HEADER_SIZE_BYTES`]) for record `seq`
/// due `intended_ns` nanoseconds after the clock base.
pub fn encode(seq: u64, intended_ns: u64, size_bytes: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(size_bytes.max(PAYLOAD_HEADER_SIZE_BYTES));
    p.extend_from_slice(MAGIC);
    p.extend_from_slice(&seq.to_le_bytes());
    p.extend_from_slice(&intended_ns.to_le_bytes());
    // Filler that is not all zeros, so nothing below can shortcut it.
    let mut x = seq as u8;
    while p.len() < size_bytes {
        p.push(x);
        x = x.wrapping_mul(31).wrapping_add(7);
    }
    p
}

/// `(seq, intended_ns)` of a benchmark payload, or `None` for anything else (a marker record,
/// another writer's record, a short record).
pub fn decode(p: &[u8]) -> Option<(u64, u64)> {
    if p.len() < PAYLOAD_HEADER_SIZE_BYTES || &p[0..4] != MAGIC {
        return None;
    }
    let seq = u64::from_le_bytes(p[4..12].try_into().ok()?);
    let ns = u64::from_le_bytes(p[12..20].try_into().ok()?);
    Some((seq, ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a payload round-trips and has the requested size; foreign bytes decode to None.
    #[test]
    fn round_trip_and_foreign_bytes() {
        let p = encode(42, 1_234_567, 1024);
        assert_eq!(p.len(), 1024);
        assert_eq!(decode(&p), Some((42, 1_234_567)));
        assert_eq!(encode(1, 2, 0).len(), PAYLOAD_HEADER_SIZE_BYTES);
        assert_eq!(decode(b"marker"), None);
        assert_eq!(decode(&[0u8; 64]), None);
        assert_eq!(decode(&p[..19]), None);
    }
}

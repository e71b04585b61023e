//! The entry layout that ledger clients build and bookies store verbatim.
//!
//! It follows BookKeeper's `DigestManager` layout with the CRC32C digest type, in
//! little-endian:
//!
//! ```text
//! offset size field
//!  0     8    ledger_id
//!  8     8    entry_id
//! 16     8    lac_plus_one      the writer's LAC when it sent the entry, plus one (0 = none yet)
//! 24     8    length_bytes      cumulative payload bytes of the ledger up to and including this entry
//! 32     4    crc32c            over bytes 0..32, then over the payload
//! 36     ..   payload
//! ```
//!
//! A bookie reads ledger id, entry id and LAC from the header and never checks the digest;
//! readers verify it (BookKeeper rule: "the bookie stores the entry bytes verbatim").

use crate::{EntryId, LedgerId, Reader, WireError};

/// Bytes before the payload.
pub const ENTRY_HEADER_SIZE_BYTES: usize = 36;

/// The fixed fields of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryHeader {
    /// Ledger the entry belongs to.
    pub ledger: LedgerId,
    /// Position in the ledger.
    pub entry: EntryId,
    /// The writer's last-add-confirmed when it sent this entry (the piggybacked LAC).
    pub lac: Option<EntryId>,
    /// Cumulative payload length of the ledger through this entry, in bytes.
    pub length_bytes: u64,
}

/// Builds an entry: header, CRC32C digest, payload.
pub fn encode_entry(header: EntryHeader, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ENTRY_HEADER_SIZE_BYTES + payload.len());
    out.extend_from_slice(&encode_entry_header(header, payload));
    out.extend_from_slice(payload);
    out
}

/// The first [`ENTRY_HEADER_SIZE_BYTES`] bytes of the entry [`encode_entry`] builds (fields and
/// the CRC32C digest over them and `payload`), without copying the payload: a writer that
/// sends the payload from a buffer it shares (one per bookie of the write set) sends these
/// bytes in front of it.
pub fn encode_entry_header(header: EntryHeader, payload: &[u8]) -> [u8; ENTRY_HEADER_SIZE_BYTES] {
    let mut out = [0u8; ENTRY_HEADER_SIZE_BYTES];
    out[0..8].copy_from_slice(&header.ledger.0.to_le_bytes());
    out[8..16].copy_from_slice(&header.entry.0.to_le_bytes());
    out[16..24].copy_from_slice(&lac_to_wire(header.lac).to_le_bytes());
    out[24..32].copy_from_slice(&header.length_bytes.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[..32]), payload);
    out[32..36].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Reads the header without checking the digest: what a bookie does on add.
///
/// # Errors
/// `Truncated` if `bytes` is shorter than the header.
pub fn peek_header(bytes: &[u8]) -> Result<EntryHeader, WireError> {
    let mut r = Reader::new(bytes, "entry header");
    let ledger = LedgerId(r.u64()?);
    let entry = r.u64()?;
    if entry == u64::MAX {
        // Reserved: LACs travel as id + 1, which this id would overflow.
        return Err(WireError::InvalidField {
            what: "entry id u64::MAX is reserved",
        });
    }
    let entry = EntryId(entry);
    let lac = lac_from_wire(r.u64()?);
    let length_bytes = r.u64()?;
    let _crc = r.u32()?;
    Ok(EntryHeader {
        ledger,
        entry,
        lac,
        length_bytes,
    })
}

/// Verifies the digest and returns the header and payload: what a reader does.
///
/// # Errors
/// `Truncated` for a short entry, `DigestMismatch` when the CRC32C is wrong.
pub fn verify_entry(bytes: &[u8]) -> Result<(EntryHeader, &[u8]), WireError> {
    let header = peek_header(bytes)?;
    let stored = u32::from_le_bytes([bytes[32], bytes[33], bytes[34], bytes[35]]);
    let payload = &bytes[ENTRY_HEADER_SIZE_BYTES..];
    let computed = crc32c::crc32c_append(crc32c::crc32c(&bytes[..32]), payload);
    if stored != computed {
        return Err(WireError::DigestMismatch { stored, computed });
    }
    Ok((header, payload))
}

/// Verifies the digest and that the entry is the one asked for.
///
/// # Errors
/// As [`verify_entry`], plus `WrongEntry` if the header names another ledger or entry.
pub fn verify_expected(
    bytes: &[u8],
    ledger: LedgerId,
    entry: EntryId,
) -> Result<(EntryHeader, &[u8]), WireError> {
    let (header, payload) = verify_entry(bytes)?;
    if header.ledger != ledger || header.entry != entry {
        return Err(WireError::WrongEntry {
            ledger: ledger.0,
            entry: entry.0,
            found_ledger: header.ledger.0,
            found_entry: header.entry.0,
        });
    }
    Ok((header, payload))
}

/// Encodes an optional entry id as `id + 1`, with 0 for none (BookKeeper uses -1).
///
/// # Panics
/// On entry id `u64::MAX`, which no decoder accepts ([`peek_header`] refuses it), so only a
/// programming error can bring it here.
pub fn lac_to_wire(lac: Option<EntryId>) -> u64 {
    lac.map_or(0, |e| {
        e.0.checked_add(1).expect("entry id u64::MAX is reserved")
    })
}

/// Decodes `id + 1` / 0 back into an optional entry id.
pub fn lac_from_wire(v: u64) -> Option<EntryId> {
    v.checked_sub(1).map(EntryId)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_round_trip_and_digest_check() {
        // Goal: encoding then verifying gives back the same header and payload, and one
        // flipped bit anywhere is caught by the digest.
        let h = EntryHeader {
            ledger: LedgerId(7),
            entry: EntryId(3),
            lac: Some(EntryId(2)),
            length_bytes: 99,
        };
        let bytes = encode_entry(h, b"payload bytes");
        let (h2, p) = verify_expected(&bytes, LedgerId(7), EntryId(3)).unwrap();
        assert_eq!(h2, h);
        assert_eq!(p, b"payload bytes");
        for i in 0..bytes.len() {
            if (32..36).contains(&i) {
                continue;
            }
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(verify_entry(&bad).is_err(), "flip at {i} not caught");
        }
        assert!(matches!(
            verify_expected(&bytes, LedgerId(7), EntryId(4)),
            Err(WireError::WrongEntry { .. })
        ));
        assert!(matches!(
            verify_entry(&bytes[..20]),
            Err(WireError::Truncated { .. })
        ));
    }

    #[test]
    fn the_reserved_entry_id_is_refused() {
        // Goal: entry id u64::MAX, whose LAC encoding would overflow, never decodes.
        let h = EntryHeader {
            ledger: LedgerId(1),
            entry: EntryId(0),
            lac: None,
            length_bytes: 0,
        };
        let mut bytes = encode_entry(h, b"");
        bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            peek_header(&bytes),
            Err(WireError::InvalidField { .. })
        ));
    }

    #[test]
    fn no_lac_is_encoded_as_zero() {
        assert_eq!(lac_to_wire(None), 0);
        assert_eq!(lac_from_wire(0), None);
        assert_eq!(
            lac_from_wire(lac_to_wire(Some(EntryId(0)))),
            Some(EntryId(0))
        );
    }
}

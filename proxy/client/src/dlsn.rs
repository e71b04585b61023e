//! DLSN: the position of one record in a stream (DistributedLog `DLSN`).

use std::fmt;
use std::str::FromStr;

use quire_wire::{Reader, WireError};

/// Bytes of a DLSN on the wire: segment seq no u64, entry id u64, slot u32.
pub const DLSN_SIZE_BYTES: usize = 20;

/// A record's position: (log segment sequence number, entry id in the segment's ledger, slot of
/// the record in the entry's record set). Ordered lexicographically over the three fields, so the
/// derived `Ord` (field order) is the log order.
///
/// Text form: `seq:entry:slot`, for example `1:0:0` (the first record of a stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Dlsn {
    /// Log segment sequence number, from 1.
    pub segment_seq_no: u64,
    /// Entry id inside the segment's ledger, from 0.
    pub entry_id: u64,
    /// Index of the record inside the entry's record set, from 0.
    pub slot_index: u32,
}

impl Dlsn {
    /// The first position of any stream (DistributedLog `InitialDLSN`).
    pub const INITIAL: Dlsn = Dlsn {
        segment_seq_no: 1,
        entry_id: 0,
        slot_index: 0,
    };

    /// Builds a DLSN.
    pub const fn new(segment_seq_no: u64, entry_id: u64, slot_index: u32) -> Self {
        Self {
            segment_seq_no,
            entry_id,
            slot_index,
        }
    }

    /// Appends the 20-byte little-endian wire form.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.segment_seq_no.to_le_bytes());
        out.extend_from_slice(&self.entry_id.to_le_bytes());
        out.extend_from_slice(&self.slot_index.to_le_bytes());
    }

    /// Reads the 20-byte wire form.
    ///
    /// # Errors
    /// `WireError::Truncated` if fewer than 20 bytes remain.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(Self {
            segment_seq_no: r.u64()?,
            entry_id: r.u64()?,
            slot_index: r.u32()?,
        })
    }
}

impl fmt::Display for Dlsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}",
            self.segment_seq_no, self.entry_id, self.slot_index
        )
    }
}

/// The text of a DLSN did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid DLSN {text:?}: expected seq:entry:slot, three decimal numbers")]
pub struct ParseDlsnError {
    /// The text given.
    pub text: String,
}

impl FromStr for Dlsn {
    type Err = ParseDlsnError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseDlsnError {
            text: s.to_string(),
        };
        let mut parts = s.trim().split(':');
        let (Some(a), Some(b), Some(c), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(err());
        };
        let num = |p: &str| -> Result<u64, ParseDlsnError> {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err());
            }
            p.parse::<u64>().map_err(|_| err())
        };
        let slot = u32::try_from(num(c)?).map_err(|_| err())?;
        Ok(Dlsn::new(num(a)?, num(b)?, slot))
    }
}

/// Where a read starts (`READ`'s `from`; DistributedLog's reader positions).
///
/// The positions other than `Dlsn` are found by the stream's owner from the segment metadata
/// and a bounded binary search inside one segment (`docs/proxy-protocol.md`, READ positions);
/// the read answer's `next` is always `Head` or a `Dlsn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadPosition {
    /// The first record of the stream (the truncation point, if any).
    Head,
    /// The record at this DLSN, or the first one after it if none is there.
    Dlsn(Dlsn),
    /// The next record to be written: the read waits for it (up to its wait).
    Tail,
    /// The first record whose txid is at least this (DistributedLog
    /// `getDLSNNotLessThanTxId`); past the last txid: as `Tail`.
    TxId(u64),
    /// The first record whose write time (the owning proxy's clock when it packed the record's
    /// entry, ms since the Unix epoch; never the client's) is at least this; past the last
    /// write time: as `Tail`.
    WriteTime(u64),
    /// The last N records (from the head when the stream holds fewer; N = 0: as `Tail`).
    LastN(u64),
}

impl fmt::Display for ReadPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadPosition::Head => f.write_str("head"),
            ReadPosition::Dlsn(d) => d.fmt(f),
            ReadPosition::Tail => f.write_str("tail"),
            ReadPosition::TxId(t) => write!(f, "txid:{t}"),
            ReadPosition::WriteTime(t) => write!(f, "time_ms:{t}"),
            ReadPosition::LastN(n) => write!(f, "last:{n}"),
        }
    }
}

impl FromStr for ReadPosition {
    type Err = ParseDlsnError;

    /// Parses `head`, `tail`, `txid:T`, `time_ms:T`, `last:N` or a DLSN text (the forms
    /// `Display` writes).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("head") {
            return Ok(ReadPosition::Head);
        }
        if t.eq_ignore_ascii_case("tail") {
            return Ok(ReadPosition::Tail);
        }
        let num = |v: &str| {
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(ParseDlsnError {
                    text: s.to_string(),
                });
            }
            v.parse::<u64>().map_err(|_| ParseDlsnError {
                text: s.to_string(),
            })
        };
        if let Some(v) = t.strip_prefix("txid:") {
            return num(v).map(ReadPosition::TxId);
        }
        if let Some(v) = t.strip_prefix("time_ms:") {
            return num(v).map(ReadPosition::WriteTime);
        }
        if let Some(v) = t.strip_prefix("last:") {
            return num(v).map(ReadPosition::LastN);
        }
        t.parse().map(ReadPosition::Dlsn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_lexicographic() {
        // Goal: Ord follows (segment, entry, slot); method: compare neighbours at each level.
        let a = Dlsn::new(1, 5, 9);
        assert!(a < Dlsn::new(1, 5, 10));
        assert!(a < Dlsn::new(1, 6, 0));
        assert!(a < Dlsn::new(2, 0, 0));
        assert!(Dlsn::new(2, 0, 0) > Dlsn::new(1, u64::MAX, u32::MAX));
        assert!(Dlsn::INITIAL < Dlsn::new(1, 0, 1));
    }

    #[test]
    fn text_round_trip_and_rejects() {
        // Goal: Display and FromStr agree; method: round-trip, then feed malformed strings.
        for d in [
            Dlsn::INITIAL,
            Dlsn::new(7, 123, 4),
            Dlsn::new(u64::MAX, u64::MAX, u32::MAX),
        ] {
            assert_eq!(d.to_string().parse::<Dlsn>().unwrap(), d);
        }
        assert_eq!("1:0:0".parse::<Dlsn>().unwrap(), Dlsn::INITIAL);
        for bad in [
            "",
            "1:0",
            "1:0:0:0",
            "a:b:c",
            "1:-1:0",
            "1::0",
            "1:0:4294967296",
            "+1:0:0",
        ] {
            assert!(bad.parse::<Dlsn>().is_err(), "{bad}");
        }
        assert_eq!("head".parse::<ReadPosition>().unwrap(), ReadPosition::Head);
        assert_eq!(
            "2:3:4".parse::<ReadPosition>().unwrap(),
            ReadPosition::Dlsn(Dlsn::new(2, 3, 4))
        );
        for p in [
            ReadPosition::Tail,
            ReadPosition::TxId(7),
            ReadPosition::WriteTime(1_700_000_000_000),
            ReadPosition::LastN(3),
        ] {
            assert_eq!(p.to_string().parse::<ReadPosition>().unwrap(), p);
        }
        for bad in ["txid:", "txid:-1", "last:x", "time_ms:1.5"] {
            assert!(bad.parse::<ReadPosition>().is_err(), "{bad}");
        }
    }

    #[test]
    fn wire_round_trip() {
        // Goal: the 20-byte form round-trips and a short buffer is refused.
        let d = Dlsn::new(3, 1 << 40, 77);
        let mut buf = Vec::new();
        d.encode(&mut buf);
        assert_eq!(buf.len(), DLSN_SIZE_BYTES);
        let mut r = Reader::new(&buf, "dlsn");
        assert_eq!(Dlsn::decode(&mut r).unwrap(), d);
        assert!(Dlsn::decode(&mut Reader::new(&buf[..19], "dlsn")).is_err());
    }
}

//! Znode names and paths: stream names escaped into one path component, bookie ids checked to
//! be one, ledger ids split into buckets of 10 000 as BookKeeper's hierarchical ledger manager
//! does, and the path of every record under the root.

use quire_wire::LedgerId;

use super::ZkStore;
use crate::{BookieId, Error, Result};

/// Encodes a stream name into one znode name: `%` becomes `%25` and `/` becomes `%2F`; every
/// other allowed character (ASCII letters, digits, `-`, `_`, `.`) stays as it is. Valid names
/// never start with `.`, so the result is never `.` or `..`.
pub fn encode_stream_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

/// Inverse of [`encode_stream_name`].
///
/// # Errors
/// `Invalid` for a `%` not followed by `25` or `2F`.
pub fn decode_stream_name(encoded: &str) -> Result<String> {
    let mut out = String::with_capacity(encoded.len());
    let mut rest = encoded;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let esc = rest.get(i..i + 3);
        match esc {
            Some("%25") => out.push('%'),
            Some("%2F") => out.push('/'),
            _ => {
                return Err(Error::Invalid {
                    what: "encoded stream name",
                    reason: format!("{encoded:?}: '%' must be followed by 25 or 2F"),
                })
            }
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Checks that a bookie id can be one znode name.
pub(super) fn validate_bookie_id(id: &BookieId) -> Result<()> {
    let s = id.0.as_str();
    if s.is_empty()
        || s == "."
        || s == ".."
        || s.contains('/')
        || s.chars().any(char::is_control)
        || s.len() > 255
    {
        return Err(Error::Invalid {
            what: "bookie id",
            reason: format!("{s:?} must be 1 to 255 bytes without '/' or control characters, and not '.' or '..'"),
        });
    }
    Ok(())
}

/// Ledger ids as 20 decimal digits, split BookKeeper-style so no directory holds more than
/// 10 000 ledgers: `ledgers/<first 16 digits>/L<last 4 digits>`.
pub(super) fn ledger_bucket_and_leaf(id: LedgerId) -> (String, String) {
    let d = format!("{:020}", id.0);
    (d[..16].to_string(), format!("L{}", &d[16..]))
}

/// Ledger ids per bucket (the last four decimal digits are the leaf).
pub(super) const LEDGERS_PER_BUCKET: u64 = 10_000;

/// The ledger id of bucket `bucket` and leaf `leaf` (inverse of [`ledger_bucket_and_leaf`]);
/// `None` unless they are 16 digits and `L` + 4 digits making a u64.
pub(super) fn ledger_id_of(bucket: &str, leaf: &str) -> Option<LedgerId> {
    let digits = leaf.strip_prefix('L')?;
    let all_digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(bucket, 16) || !all_digits(digits, 4) {
        return None;
    }
    format!("{bucket}{digits}").parse().ok().map(LedgerId)
}

impl ZkStore {
    pub(super) fn path(&self, rel: &str) -> String {
        format!("{}/{rel}", self.inner.root)
    }

    pub(super) fn ledger_path(&self, id: LedgerId) -> String {
        let (bucket, leaf) = ledger_bucket_and_leaf(id);
        self.path(&format!("ledgers/{bucket}/{leaf}"))
    }

    pub(super) fn stream_path(&self, name: &str) -> String {
        self.path(&format!("streams/{}", encode_stream_name(name)))
    }

    pub(super) fn lock_dir(&self, name: &str) -> String {
        self.path(&format!("locks/{}", encode_stream_name(name)))
    }

    pub(super) fn bookie_path(&self, id: &BookieId, read_only: bool) -> String {
        self.path(&format!(
            "bookies/{}/{}",
            if read_only { "readonly" } else { "available" },
            id.0
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_name_encoding_round_trips_and_is_one_component() {
        for name in ["a", "logs/hdfs-2k", "a/b/c.d_e-f"] {
            let enc = encode_stream_name(name);
            assert!(!enc.contains('/'), "{enc}");
            assert_eq!(decode_stream_name(&enc).unwrap(), name);
        }
        assert_eq!(encode_stream_name("x/y"), "x%2Fy");
        for bad in ["%", "%2", "%41", "a%2f"] {
            assert!(decode_stream_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ledger_paths_split_into_buckets_of_ten_thousand() {
        assert_eq!(
            ledger_bucket_and_leaf(LedgerId(1)),
            ("0000000000000000".into(), "L0001".into())
        );
        assert_eq!(
            ledger_bucket_and_leaf(LedgerId(123_456_789)),
            ("0000000000012345".into(), "L6789".into())
        );
        let (b, l) = ledger_bucket_and_leaf(LedgerId(u64::MAX));
        assert_eq!((b.len(), l.len()), (16, 5));
        for id in [0, 1, 9_999, 10_000, 123_456_789, u64::MAX] {
            let (b, l) = ledger_bucket_and_leaf(LedgerId(id));
            assert_eq!(ledger_id_of(&b, &l), Some(LedgerId(id)));
        }
        for (b, l) in [
            ("0000000000000000", "0001"),
            ("0000000000000000", "L001"),
            ("000000000000000", "L0001"),
            ("000000000000000x", "L0001"),
            ("9999999999999999", "L9999"),
        ] {
            assert_eq!(ledger_id_of(b, l), None, "{b}/{l}");
        }
    }
}

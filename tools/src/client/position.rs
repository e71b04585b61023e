//! `quire read/tail -o/--from`: where a read starts, in the forms kcat and rpk users know.
//!
//! * `head`: the first record kept (DistributedLog `InitialDLSN` or the truncation point);
//! * `tail`: the next record to be written (a tail from here prints only new records);
//! * `SEG:ENTRY:SLOT`: a DLSN (as `quire write` prints);
//! * `txid:T`: the first record with txid ≥ T (DistributedLog `getDLSNNotLessThanTxId`);
//! * `@2026-12-06T10:00:00Z` (RFC 3339, any offset), `@-1h` (relative: `ms`, `s`, `m`, `h`,
//!   `d`) or `@1765015200000` (ms since the epoch): the first record the proxy wrote at or
//!   after that wall-clock time (the server's write time, never the client's clock);
//! * `-N`: the last N records.

use std::fmt;

use quire_client::{Dlsn, ReadPosition};

/// A start position as given on the command line, times resolved to ms since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartPosition {
    /// The first record kept.
    Head,
    /// The next record to be written.
    Tail,
    /// The record at this DLSN, or the first after it.
    Dlsn(Dlsn),
    /// The first record with txid ≥ this.
    TxidAtLeast(u64),
    /// The first record written at or after this time, ms since the Unix epoch.
    WrittenAtOrAfterMs(u64),
    /// The last N records (N ≥ 1).
    LastRecords(u64),
}

impl fmt::Display for StartPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartPosition::Head => f.write_str("head"),
            StartPosition::Tail => f.write_str("tail"),
            StartPosition::Dlsn(d) => d.fmt(f),
            StartPosition::TxidAtLeast(t) => write!(f, "txid:{t}"),
            StartPosition::WrittenAtOrAfterMs(ms) => write!(f, "@{}", format_rfc3339_ms(*ms)),
            StartPosition::LastRecords(n) => write!(f, "-{n}"),
        }
    }
}

impl StartPosition {
    /// Parses the text of `-o/--from`; relative times count back from `now_ms`.
    ///
    /// # Errors
    /// A one-line reason naming the forms accepted.
    pub fn parse(text: &str, now_ms: u64) -> Result<Self, String> {
        let t = text.trim();
        let bad = |why: &str| {
            format!(
                "--from {text:?}: {why}; expected head, tail, a DLSN like 1:0:0, txid:T, \
                 @RFC3339 time, @-1h, or -N (last N records)"
            )
        };
        if t.eq_ignore_ascii_case("head") {
            return Ok(StartPosition::Head);
        }
        if t.eq_ignore_ascii_case("tail") {
            return Ok(StartPosition::Tail);
        }
        if let Some(v) = t.strip_prefix("txid:") {
            return digits(v)
                .map(StartPosition::TxidAtLeast)
                .ok_or_else(|| bad("the txid is not a whole number"));
        }
        if let Some(n) = t.strip_prefix('-') {
            return match digits(n) {
                Some(0) => Err(bad("the last 0 records is nothing to read")),
                Some(n) => Ok(StartPosition::LastRecords(n)),
                None => Err(bad("the count is not a whole number")),
            };
        }
        if let Some(time) = t.strip_prefix('@') {
            return parse_time(time, now_ms)
                .map(StartPosition::WrittenAtOrAfterMs)
                .map_err(|why| bad(&why));
        }
        t.parse::<Dlsn>()
            .map(StartPosition::Dlsn)
            .map_err(|_| bad("not a known form"))
    }

    /// The proxy protocol's position for this start (`docs/proxy-protocol.md`, "Read
    /// positions"). A proxy older than these kinds answers the ones beyond head and DLSN with
    /// `BAD_REQUEST`.
    pub fn to_read_position(self) -> ReadPosition {
        match self {
            StartPosition::Head => ReadPosition::Head,
            StartPosition::Tail => ReadPosition::Tail,
            StartPosition::Dlsn(d) => ReadPosition::Dlsn(d),
            StartPosition::TxidAtLeast(t) => ReadPosition::TxId(t),
            StartPosition::WrittenAtOrAfterMs(ms) => ReadPosition::WriteTime(ms),
            StartPosition::LastRecords(n) => ReadPosition::LastN(n),
        }
    }
}

/// A non-empty run of ASCII digits as a u64.
fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The text after `@`: `-<n><unit>` relative to `now_ms`, ms since the epoch, or RFC 3339.
fn parse_time(s: &str, now_ms: u64) -> Result<u64, String> {
    if let Some(rel) = s.strip_prefix('-') {
        let split = rel.find(|c: char| !c.is_ascii_digit()).unwrap_or(rel.len());
        let (n, unit) = rel.split_at(split);
        let n = digits(n).ok_or("a relative time needs a number, as in @-1h")?;
        let unit_ms: u64 = match unit {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(format!("unknown time unit {unit:?} (ms, s, m, h or d)")),
        };
        let back = n
            .checked_mul(unit_ms)
            .ok_or("the relative time is too large")?;
        return Ok(now_ms.saturating_sub(back));
    }
    if let Some(ms) = digits(s) {
        return Ok(ms);
    }
    parse_rfc3339_ms(s)
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)` to ms since the epoch (fractions below
/// a millisecond are dropped).
///
/// # Errors
/// A one-line reason for any other text, an out-of-range field or a time before 1970.
pub fn parse_rfc3339_ms(s: &str) -> Result<u64, String> {
    let err = || format!("{s:?} is not an RFC 3339 time like 2026-12-06T10:00:00Z");
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
        return Err(err());
    }
    if !matches!(b[10], b'T' | b't' | b' ') {
        return Err(err());
    }
    let num = |r: std::ops::Range<usize>| digits(&s[r]).ok_or_else(err);
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || sec > 60
    {
        return Err(err());
    }
    let mut rest = &s[19..];
    let mut frac_ms = 0;
    if let Some(f) = rest.strip_prefix('.') {
        let n = f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len());
        if n == 0 {
            return Err(err());
        }
        let mut padded = f[..n.min(3)].to_string();
        while padded.len() < 3 {
            padded.push('0');
        }
        frac_ms = digits(&padded).ok_or_else(err)?;
        rest = &f[n..];
    }
    let offset_secs: i64 = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && rest.as_bytes()[3] == b':' => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return Err(err()),
            };
            let (oh, om) = (
                digits(&rest[1..3]).ok_or_else(err)?,
                digits(&rest[4..6]).ok_or_else(err)?,
            );
            if oh > 23 || om > 59 {
                return Err(err());
            }
            sign * (oh * 3600 + om * 60) as i64
        }
        _ => return Err(err()),
    };
    let days = days_from_civil(y as i64, mo as i64, d as i64);
    let secs = days * 86_400 + (h * 3600 + mi * 60 + sec) as i64 - offset_secs;
    u64::try_from(secs)
        .map(|s| s * 1000 + frac_ms)
        .map_err(|_| format!("{s:?} is before 1970"))
}

fn days_in_month(y: u64, m: u64) -> u64 {
    let leap = (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400);
    match m {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Milliseconds since the epoch as UTC RFC 3339 with milliseconds, `2026-12-06T10:00:00.000Z`.
pub fn format_rfc3339_ms(ms: u64) -> String {
    crate::stream::format_time_ms(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_765_015_200_000; // 2025-12-06T10:00:00Z

    #[test]
    fn every_form_parses() {
        // Goal: each documented form of --from gives its position; method: one text per form.
        let p = |s: &str| StartPosition::parse(s, NOW).unwrap();
        assert_eq!(p("head"), StartPosition::Head);
        assert_eq!(p("HEAD"), StartPosition::Head);
        assert_eq!(p("tail"), StartPosition::Tail);
        assert_eq!(p("2:3:4"), StartPosition::Dlsn(Dlsn::new(2, 3, 4)));
        assert_eq!(p("txid:42"), StartPosition::TxidAtLeast(42));
        assert_eq!(p("-10"), StartPosition::LastRecords(10));
        assert_eq!(
            p("@-1h"),
            StartPosition::WrittenAtOrAfterMs(NOW - 3_600_000)
        );
        assert_eq!(p("@-90s"), StartPosition::WrittenAtOrAfterMs(NOW - 90_000));
        assert_eq!(
            p("@-2d"),
            StartPosition::WrittenAtOrAfterMs(NOW - 172_800_000)
        );
        assert_eq!(p("@-250ms"), StartPosition::WrittenAtOrAfterMs(NOW - 250));
        assert_eq!(p("@123"), StartPosition::WrittenAtOrAfterMs(123));
        assert_eq!(
            p("@2025-12-06T10:00:00Z"),
            StartPosition::WrittenAtOrAfterMs(NOW)
        );
        assert_eq!(
            p("@2025-12-06T11:30:00.5+01:30"),
            StartPosition::WrittenAtOrAfterMs(NOW + 500)
        );
        assert_eq!(
            p("@1970-01-01T00:00:00.123456Z"),
            StartPosition::WrittenAtOrAfterMs(123)
        );
        assert_eq!(
            p("@2024-02-29T00:00:00Z"),
            StartPosition::WrittenAtOrAfterMs(1_709_164_800_000)
        );
    }

    #[test]
    fn bad_forms_are_refused_in_one_line() {
        // Goal: every malformed --from is a one-line error naming the accepted forms.
        for bad in [
            "",
            "txid:",
            "txid:-1",
            "-0",
            "-x",
            "@",
            "@-1y",
            "@-h",
            "@2025-13-01T00:00:00Z",
            "@2025-02-29T00:00:00Z",
            "@2025-12-06T10:00:00",
            "@2025-12-06T24:00:00Z",
            "@1969-12-31T23:59:59Z",
            "@2025-12-06T10:00:00.Z",
            "1:2",
            "tails",
        ] {
            let e = StartPosition::parse(bad, NOW).unwrap_err();
            assert!(
                !e.contains('\n') && e.contains("expected head, tail"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn display_round_trips_and_protocol_mapping() {
        // Goal: Display gives text that parses back; every form maps to its protocol position.
        for p in [
            StartPosition::Head,
            StartPosition::Tail,
            StartPosition::Dlsn(Dlsn::new(1, 2, 3)),
            StartPosition::TxidAtLeast(9),
            StartPosition::WrittenAtOrAfterMs(NOW + 7),
            StartPosition::LastRecords(5),
        ] {
            assert_eq!(StartPosition::parse(&p.to_string(), 0).unwrap(), p);
        }
        for (start, want) in [
            (StartPosition::Head, ReadPosition::Head),
            (StartPosition::Tail, ReadPosition::Tail),
            (StartPosition::TxidAtLeast(1), ReadPosition::TxId(1)),
            (
                StartPosition::WrittenAtOrAfterMs(NOW),
                ReadPosition::WriteTime(NOW),
            ),
            (StartPosition::LastRecords(5), ReadPosition::LastN(5)),
        ] {
            assert_eq!(start.to_read_position(), want);
        }
    }
}

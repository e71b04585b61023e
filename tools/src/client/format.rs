//! Record formats of `quire read/tail` (output) and `quire write` (input):
//!
//! * `line`: each record is the bytes between delimiters (`--delimiter`, LF by default); a
//!   record cannot hold the delimiter.
//! * `json`: one JSON object per line (JSON Lines). Output: `dlsn` ("1:0:0"), `txid`,
//!   `write_time` (RFC 3339 UTC with ms, or null when the proxy did not send one), `payload`
//!   and `payload_encoding` ("utf8" when the payload is valid UTF-8, else "base64", standard
//!   alphabet with padding). Input: `payload` (required), `payload_encoding` ("utf8" by
//!   default, or "base64") and `txid` (optional); other fields (`dlsn`, `write_time`) are
//!   ignored, so `quire read --format json` output can be written back.
//! * `binary`: length-prefixed frames, each a 4-byte little-endian payload length then the
//!   payload; any byte value, nothing between frames (docs/cli-formats.md).

use std::io::{self, BufRead, Write};

use base64::Engine as _;
use quire_client::Dlsn;

/// How records are written out or read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Records separated by the delimiter (LF by default).
    Line,
    /// One JSON object per line.
    Json,
    /// 4-byte little-endian length, then the payload, per record.
    Binary,
}

/// Bytes of a binary frame's length prefix.
pub const FRAME_LENGTH_SIZE_BYTES: usize = 4;

/// One record as `quire read` prints it.
#[derive(Debug, Clone, Copy)]
pub struct OutRecord<'a> {
    /// The record's position.
    pub dlsn: Dlsn,
    /// The record's txid.
    pub txid: u64,
    /// When the owning proxy wrote it, ms since the epoch, if the proxy said.
    pub write_time_ms: Option<u64>,
    /// The record's payload.
    pub payload: &'a [u8],
}

/// Parses `--delimiter`: the text with `\n`, `\r`, `\t`, `\0`, `\\` and `\xHH` escapes.
///
/// # Errors
/// An empty delimiter or a bad escape, in one line.
pub fn parse_delimiter(s: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let e = match bytes.next() {
            Some(b'n') => b'\n',
            Some(b'r') => b'\r',
            Some(b't') => b'\t',
            Some(b'0') => 0,
            Some(b'\\') => b'\\',
            Some(b'x') => {
                let hex = [bytes.next(), bytes.next()];
                let [Some(h), Some(l)] = hex else {
                    return Err(format!("--delimiter {s:?}: \\x needs two hex digits"));
                };
                u8::from_str_radix(&String::from_utf8_lossy(&[h, l]), 16)
                    .map_err(|_| format!("--delimiter {s:?}: \\x needs two hex digits"))?
            }
            _ => {
                return Err(format!(
                    "--delimiter {s:?}: unknown escape (\\n \\r \\t \\0 \\\\ \\xHH)"
                ))
            }
        };
        out.push(e);
    }
    if out.is_empty() {
        return Err("--delimiter must not be empty".into());
    }
    Ok(out)
}

/// The JSON object of one record (`--format json`).
pub fn record_json(r: &OutRecord<'_>) -> serde_json::Value {
    let (payload, encoding) = match std::str::from_utf8(r.payload) {
        Ok(text) => (text.to_string(), "utf8"),
        Err(_) => (
            base64::engine::general_purpose::STANDARD.encode(r.payload),
            "base64",
        ),
    };
    serde_json::json!({
        "dlsn": r.dlsn.to_string(),
        "txid": r.txid,
        "write_time": r.write_time_ms.map(super::position::format_rfc3339_ms),
        "payload": payload,
        "payload_encoding": encoding,
    })
}

/// Writes one record in `format`.
///
/// # Errors
/// The output's I/O error.
pub fn write_record(
    out: &mut impl Write,
    format: Format,
    delimiter: &[u8],
    r: &OutRecord<'_>,
) -> io::Result<()> {
    match format {
        Format::Line => {
            out.write_all(r.payload)?;
            out.write_all(delimiter)
        }
        Format::Json => {
            serde_json::to_writer(&mut *out, &record_json(r))?;
            out.write_all(b"\n")
        }
        Format::Binary => {
            let len = u32::try_from(r.payload.len()).expect("records are below 4 GiB");
            out.write_all(&len.to_le_bytes())?;
            out.write_all(r.payload)
        }
    }
}

/// Reads one binary frame. `Ok(None)` at a clean end of input (no byte of a new frame).
///
/// # Errors
/// `InvalidData` for a length above `max_bytes` (nothing allocated for it) or an input ending
/// inside a frame; the reader's I/O errors.
pub fn read_frame(input: &mut impl BufRead, max_bytes: usize) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; FRAME_LENGTH_SIZE_BYTES];
    let mut got = 0;
    while got < len.len() {
        match input.read(&mut len[got..])? {
            0 if got == 0 => return Ok(None),
            0 => return Err(truncated("the frame length")),
            n => got += n,
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > max_bytes {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes, above the record limit of {max_bytes} bytes"),
        ));
    }
    let mut payload = vec![0; len];
    input.read_exact(&mut payload).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => truncated("the payload"),
        _ => e,
    })?;
    Ok(Some(payload))
}

fn truncated(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the input ends inside {what} of a frame"),
    )
}

/// Reads the bytes up to the next `delimiter` (removed), or to the end of input. `Ok(None)` at
/// the end of input with nothing read.
///
/// # Errors
/// The reader's I/O errors.
pub fn read_delimited(input: &mut impl BufRead, delimiter: &[u8]) -> io::Result<Option<Vec<u8>>> {
    let last = *delimiter.last().expect("delimiters are not empty");
    let mut buf = Vec::new();
    loop {
        if input.read_until(last, &mut buf)? == 0 {
            return Ok((!buf.is_empty()).then_some(buf));
        }
        if buf.ends_with(delimiter) {
            buf.truncate(buf.len() - delimiter.len());
            return Ok(Some(buf));
        }
    }
}

/// One record of `--format json` input: its payload and optional txid.
///
/// # Errors
/// A one-line reason: not a JSON object, no string `payload`, a bad `payload_encoding` or
/// base64, a `txid` that is not a u64.
pub fn parse_json_record(line: &[u8]) -> Result<(Option<u64>, Vec<u8>), String> {
    let v: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| format!("not JSON: {e}"))?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    let payload = obj
        .get("payload")
        .and_then(|p| p.as_str())
        .ok_or("no string field \"payload\"")?;
    let payload = match obj.get("payload_encoding").map(|e| e.as_str()) {
        None | Some(Some("utf8")) => payload.as_bytes().to_vec(),
        Some(Some("base64")) => base64::engine::general_purpose::STANDARD
            .decode(payload)
            .map_err(|e| format!("payload is not base64: {e}"))?,
        Some(_) => return Err("payload_encoding must be \"utf8\" or \"base64\"".into()),
    };
    let txid = match obj.get("txid") {
        None | Some(serde_json::Value::Null) => None,
        Some(t) => Some(
            t.as_u64()
                .ok_or("txid must be a whole number from 0 to 2^64-2")?,
        ),
    };
    Ok((txid, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_frames_round_trip_every_byte_value() {
        // Goal: frames carry any bytes, an empty payload included, and read back the same.
        let payloads: Vec<Vec<u8>> = vec![(0..=255).collect(), vec![], b"\n\r\0".to_vec()];
        let mut buf = Vec::new();
        for p in &payloads {
            let r = OutRecord {
                dlsn: Dlsn::INITIAL,
                txid: 1,
                write_time_ms: None,
                payload: p,
            };
            write_record(&mut buf, Format::Binary, b"\n", &r).unwrap();
        }
        assert_eq!(&buf[..4], &256u32.to_le_bytes());
        assert_eq!(buf.len(), 3 * 4 + 256 + 3);
        let mut input = &buf[..];
        for p in &payloads {
            assert_eq!(read_frame(&mut input, 1024).unwrap().as_ref(), Some(p));
        }
        assert_eq!(read_frame(&mut input, 1024).unwrap(), None);
    }

    #[test]
    fn bad_binary_frames_are_errors() {
        // Goal: a truncated length, a truncated payload and an over-limit length are
        // InvalidData errors, never a panic or a huge allocation.
        for (bad, what) in [
            (&[1u8, 0][..], "inside the frame length"),
            (&[5, 0, 0, 0, b'a'][..], "inside the payload"),
            (&[0xff, 0xff, 0xff, 0xff][..], "above the record limit"),
        ] {
            let e = read_frame(&mut &bad[..], 1024).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(e.to_string().contains(what), "{e}");
        }
    }

    #[test]
    fn delimiters_parse_and_split() {
        // Goal: escapes parse; multi-byte delimiters split; a last piece without delimiter counts.
        assert_eq!(parse_delimiter("\\n").unwrap(), b"\n");
        assert_eq!(parse_delimiter("\\x00|\\t").unwrap(), b"\0|\t");
        assert!(parse_delimiter("").is_err());
        assert!(parse_delimiter("\\q").is_err());
        assert!(parse_delimiter("\\x4").is_err());
        let mut input = &b"a||b|c||||d"[..];
        let mut got = Vec::new();
        while let Some(r) = read_delimited(&mut input, b"||").unwrap() {
            got.push(String::from_utf8(r).unwrap());
        }
        assert_eq!(got, ["a", "b|c", "", "d"]);
    }

    #[test]
    fn json_records_round_trip() {
        // Goal: JSON output parses back as input, UTF-8 and binary payloads alike.
        for payload in [&b"hello \"w\" \xc3\xa9"[..], &[0xff, 0, 10][..]] {
            let r = OutRecord {
                dlsn: Dlsn::new(1, 2, 3),
                txid: 7,
                write_time_ms: Some(1000),
                payload,
            };
            let v = record_json(&r);
            assert_eq!(v["dlsn"], "1:2:3");
            assert_eq!(v["write_time"], "1970-01-01T00:00:01.000Z");
            let line = serde_json::to_vec(&v).unwrap();
            assert_eq!(
                parse_json_record(&line).unwrap(),
                (Some(7), payload.to_vec())
            );
        }
        assert_eq!(
            parse_json_record(br#"{"payload":"x"}"#).unwrap(),
            (None, b"x".to_vec())
        );
        for bad in [
            &b"[1]"[..],
            b"{}",
            br#"{"payload":"x","txid":-1}"#,
            br#"{"payload":"!","payload_encoding":"base64"}"#,
            b"nope",
        ] {
            assert!(parse_json_record(bad).is_err());
        }
    }
}

//! The proxy protocol: requests and responses carried in [`quire_wire::frame`] frames.
//!
//! Byte-by-byte layouts are in `docs/proxy-protocol.md`. This module is a pure codec without
//! I/O; every decoder refuses hostile input with a [`WireError`] and never panics.

use quire_wire::frame::{encode_frame, Frame, FrameHeader, RESPONSE_BIT};
use quire_wire::{put_len_prefixed, Reader, WireError};

use crate::dlsn::{Dlsn, ReadPosition};
use crate::error::ErrorCode;
use crate::record_set::RECORD_HEADER_SIZE_BYTES;

/// Handshake magic: ASCII "QPX1" read as a little-endian u32.
pub const PROXY_HELLO_MAGIC: u32 = u32::from_le_bytes(*b"QPX1");
/// Oldest proxy protocol version this build speaks.
pub const PROXY_PROTOCOL_VERSION_MIN: u16 = 1;
/// Newest proxy protocol version this build speaks.
pub const PROXY_PROTOCOL_VERSION_MAX: u16 = 1;
/// Longest error message sent, in bytes; longer ones are cut at a character boundary.
pub const ERROR_MESSAGE_SIZE_BYTES_MAX: usize = 1024;
/// Longest stream name field accepted on the wire (the naming rules allow 255).
pub const STREAM_NAME_FIELD_SIZE_BYTES_MAX: usize = 1024;
/// Bytes a record adds to a write request besides its payload: txid u64 + length u32.
pub const WRITE_RECORD_OVERHEAD_BYTES: usize = RECORD_HEADER_SIZE_BYTES;
/// Bytes a record adds to a read response besides its payload: DLSN 20 + txid 8 + length 4.
pub const READ_RECORD_OVERHEAD_BYTES: usize = 32;

/// The txid reserved for end-of-stream, refused in writes by the server and the client
/// (DistributedLog reserves `Long.MAX_VALUE` the same way: a stream whose last txid were this
/// value could take no further write, as txids never decrease). Every other u64 is a valid txid.
pub const TXID_RESERVED: u64 = u64::MAX;

/// The index of the first record of a write whose txid is [`TXID_RESERVED`], if any.
pub fn reserved_txid_index(records: &[(u64, Vec<u8>)]) -> Option<usize> {
    records.iter().position(|(txid, _)| *txid == TXID_RESERVED)
}

/// `Write` flag: create the stream if it does not exist.
pub const FLAG_CREATE_IF_MISSING: u8 = 0x01;

/// Request opcodes. Stable numbers: add new ones, never renumber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Opcode {
    /// Handshake; must be the first request on a connection.
    Hello = 0x01,
    /// Create an empty stream.
    CreateStream = 0x02,
    /// List every stream name.
    ListStreams = 0x03,
    /// Append records to a stream.
    Write = 0x04,
    /// Read records from a position, optionally waiting for new ones.
    Read = 0x05,
}

impl Opcode {
    /// Maps a request opcode byte (without [`RESPONSE_BIT`]).
    ///
    /// # Errors
    /// `UnknownOpcode`.
    pub fn from_u8(v: u8) -> Result<Self, WireError> {
        Ok(match v {
            0x01 => Self::Hello,
            0x02 => Self::CreateStream,
            0x03 => Self::ListStreams,
            0x04 => Self::Write,
            0x05 => Self::Read,
            other => return Err(WireError::UnknownOpcode(other)),
        })
    }
}

/// A request from a client to a proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Handshake. Body: magic u32, version_min u16, version_max u16.
    Hello { version_min: u16, version_max: u16 },
    /// Body: stream name (u32 length + bytes).
    CreateStream { stream: String },
    /// Empty body.
    ListStreams,
    /// Flags: [`FLAG_CREATE_IF_MISSING`]. Body: stream name, record_count u32, then per record
    /// txid u64, payload length u32, payload.
    Write {
        stream: String,
        create_if_missing: bool,
        records: Vec<(u64, Vec<u8>)>,
    },
    /// Body: stream name, position (kind u8 + DLSN 20 bytes), max_records u32, max_bytes u32,
    /// wait_ms u32.
    Read {
        stream: String,
        from: ReadPosition,
        max_records: u32,
        max_bytes: u32,
        wait_ms: u32,
    },
}

/// A response from a proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// Body: magic u32, version u16, frame_size_bytes_max u32, record_size_bytes_max u32.
    Hello {
        version: u16,
        frame_size_bytes_max: u32,
        record_size_bytes_max: u32,
    },
    /// Empty body.
    CreateStream,
    /// Body: count u32, then each name (u32 length + bytes).
    ListStreams { streams: Vec<String> },
    /// Body: record count u32, first DLSN, last DLSN.
    Write {
        count: u32,
        first_dlsn: Dlsn,
        last_dlsn: Dlsn,
    },
    /// Body: next position, record count u32, then per record DLSN, txid u64, payload length
    /// u32, payload.
    Read {
        next: ReadPosition,
        records: Vec<(Dlsn, u64, Vec<u8>)>,
    },
    /// Any failed request: `status` in the header is the code; body: message (u32 length +
    /// UTF-8 bytes).
    Error { code: ErrorCode, message: String },
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_len_prefixed(out, s.as_bytes());
}

fn get_str(r: &mut Reader<'_>, max: usize, what: &'static str) -> Result<String, WireError> {
    let b = r.len_prefixed(max)?;
    String::from_utf8(b.to_vec()).map_err(|_| WireError::InvalidField { what })
}

fn put_position(out: &mut Vec<u8>, p: &ReadPosition) {
    match p {
        ReadPosition::Head => {
            out.push(0);
            Dlsn::new(0, 0, 0).encode(out);
        }
        ReadPosition::Dlsn(d) => {
            out.push(1);
            d.encode(out);
        }
    }
}

fn get_position(r: &mut Reader<'_>) -> Result<ReadPosition, WireError> {
    let kind = r.u8()?;
    let d = Dlsn::decode(r)?;
    match kind {
        0 => Ok(ReadPosition::Head),
        1 => Ok(ReadPosition::Dlsn(d)),
        _ => Err(WireError::InvalidField {
            what: "read position kind",
        }),
    }
}

/// Cuts `s` to at most `max` bytes at a character boundary.
pub fn truncate_message(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Request {
    /// The request's opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Hello { .. } => Opcode::Hello,
            Request::CreateStream { .. } => Opcode::CreateStream,
            Request::ListStreams => Opcode::ListStreams,
            Request::Write { .. } => Opcode::Write,
            Request::Read { .. } => Opcode::Read,
        }
    }

    /// Appends the whole frame of this request to `out`.
    pub fn encode(&self, request_id: u64, out: &mut Vec<u8>) {
        let mut body = Vec::new();
        let mut flags = 0u8;
        match self {
            Request::Hello {
                version_min,
                version_max,
            } => {
                put_u32(&mut body, PROXY_HELLO_MAGIC);
                body.extend_from_slice(&version_min.to_le_bytes());
                body.extend_from_slice(&version_max.to_le_bytes());
            }
            Request::CreateStream { stream } => put_str(&mut body, stream),
            Request::ListStreams => {}
            Request::Write {
                stream,
                create_if_missing,
                records,
            } => {
                if *create_if_missing {
                    flags |= FLAG_CREATE_IF_MISSING;
                }
                let payload: usize = records
                    .iter()
                    .map(|(_, p)| p.len() + WRITE_RECORD_OVERHEAD_BYTES)
                    .sum();
                body.reserve(4 + stream.len() + 4 + payload);
                put_str(&mut body, stream);
                put_u32(
                    &mut body,
                    u32::try_from(records.len()).expect("record count above u32"),
                );
                for (txid, payload) in records {
                    body.extend_from_slice(&txid.to_le_bytes());
                    put_len_prefixed(&mut body, payload);
                }
            }
            Request::Read {
                stream,
                from,
                max_records,
                max_bytes,
                wait_ms,
            } => {
                put_str(&mut body, stream);
                put_position(&mut body, from);
                put_u32(&mut body, *max_records);
                put_u32(&mut body, *max_bytes);
                put_u32(&mut body, *wait_ms);
            }
        }
        let header = FrameHeader {
            opcode: self.opcode() as u8,
            flags,
            status: 0,
            request_id,
        };
        encode_frame(out, header, &body);
    }

    /// Decodes a request frame.
    ///
    /// # Errors
    /// `UnknownOpcode`, `BadMagic`, `Truncated`, `TrailingBytes`, `InvalidField`.
    pub fn decode(frame: &Frame<'_>) -> Result<Self, WireError> {
        let op = Opcode::from_u8(frame.header.opcode)?;
        let mut r = Reader::new(frame.body, "proxy request");
        let req = match op {
            Opcode::Hello => {
                let magic = r.u32()?;
                if magic != PROXY_HELLO_MAGIC {
                    return Err(WireError::BadMagic { found: magic });
                }
                Request::Hello {
                    version_min: r.u16()?,
                    version_max: r.u16()?,
                }
            }
            Opcode::CreateStream => Request::CreateStream {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
            },
            Opcode::ListStreams => Request::ListStreams,
            Opcode::Write => {
                let stream = get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?;
                let count = r.u32()? as usize;
                // Refuse counts the body cannot hold before allocating for them.
                if count > frame.body.len() / WRITE_RECORD_OVERHEAD_BYTES {
                    return Err(WireError::InvalidField {
                        what: "write record count",
                    });
                }
                let mut records = Vec::with_capacity(count);
                for _ in 0..count {
                    let txid = r.u64()?;
                    // Records above the record limit still decode: the stream layer refuses them
                    // with RECORD_TOO_LARGE, a clearer answer than a malformed frame.
                    let payload = r.len_prefixed(frame.body.len())?;
                    records.push((txid, payload.to_vec()));
                }
                Request::Write {
                    stream,
                    create_if_missing: frame.header.flags & FLAG_CREATE_IF_MISSING != 0,
                    records,
                }
            }
            Opcode::Read => Request::Read {
                stream: get_str(&mut r, STREAM_NAME_FIELD_SIZE_BYTES_MAX, "stream name")?,
                from: get_position(&mut r)?,
                max_records: r.u32()?,
                max_bytes: r.u32()?,
                wait_ms: r.u32()?,
            },
        };
        r.finish()?;
        Ok(req)
    }
}

impl Response {
    /// Appends the whole frame of this response to `out`; `request_opcode` is the opcode byte of
    /// the request answered (any byte for errors to undecodable requests).
    pub fn encode(&self, request_opcode: u8, request_id: u64, out: &mut Vec<u8>) {
        let mut body = Vec::new();
        let mut status = 0u16;
        match self {
            Response::Hello {
                version,
                frame_size_bytes_max,
                record_size_bytes_max,
            } => {
                put_u32(&mut body, PROXY_HELLO_MAGIC);
                body.extend_from_slice(&version.to_le_bytes());
                put_u32(&mut body, *frame_size_bytes_max);
                put_u32(&mut body, *record_size_bytes_max);
            }
            Response::CreateStream => {}
            Response::ListStreams { streams } => {
                put_u32(
                    &mut body,
                    u32::try_from(streams.len()).expect("stream count above u32"),
                );
                for s in streams {
                    put_str(&mut body, s);
                }
            }
            Response::Write {
                count,
                first_dlsn,
                last_dlsn,
            } => {
                put_u32(&mut body, *count);
                first_dlsn.encode(&mut body);
                last_dlsn.encode(&mut body);
            }
            Response::Read { next, records } => {
                put_position(&mut body, next);
                put_u32(
                    &mut body,
                    u32::try_from(records.len()).expect("record count above u32"),
                );
                for (dlsn, txid, payload) in records {
                    dlsn.encode(&mut body);
                    body.extend_from_slice(&txid.to_le_bytes());
                    put_len_prefixed(&mut body, payload);
                }
            }
            Response::Error { code, message } => {
                assert!(
                    *code != ErrorCode::Ok,
                    "an error response needs a non-zero code"
                );
                status = *code as u16;
                put_str(
                    &mut body,
                    truncate_message(message, ERROR_MESSAGE_SIZE_BYTES_MAX),
                );
            }
        }
        let header = FrameHeader {
            opcode: request_opcode | RESPONSE_BIT,
            flags: 0,
            status,
            request_id,
        };
        encode_frame(out, header, &body);
    }

    /// Decodes a response frame.
    ///
    /// # Errors
    /// `UnknownOpcode` (including a frame without [`RESPONSE_BIT`]), `UnknownStatus`, `BadMagic`,
    /// `Truncated`, `TrailingBytes`, `InvalidField`.
    pub fn decode(frame: &Frame<'_>) -> Result<Self, WireError> {
        if frame.header.opcode & RESPONSE_BIT == 0 {
            return Err(WireError::UnknownOpcode(frame.header.opcode));
        }
        let mut r = Reader::new(frame.body, "proxy response");
        if frame.header.status != 0 {
            let code = ErrorCode::from_u16(frame.header.status)
                .ok_or(WireError::UnknownStatus(frame.header.status))?;
            let message = String::from_utf8_lossy(r.len_prefixed(frame.body.len())?).into_owned();
            r.finish()?;
            return Ok(Response::Error { code, message });
        }
        let op = Opcode::from_u8(frame.header.opcode & !RESPONSE_BIT)?;
        let resp = match op {
            Opcode::Hello => {
                let magic = r.u32()?;
                if magic != PROXY_HELLO_MAGIC {
                    return Err(WireError::BadMagic { found: magic });
                }
                Response::Hello {
                    version: r.u16()?,
                    frame_size_bytes_max: r.u32()?,
                    record_size_bytes_max: r.u32()?,
                }
            }
            Opcode::CreateStream => Response::CreateStream,
            Opcode::ListStreams => {
                let count = r.u32()? as usize;
                if count > frame.body.len() / 4 {
                    return Err(WireError::InvalidField {
                        what: "stream count",
                    });
                }
                let mut streams = Vec::with_capacity(count);
                for _ in 0..count {
                    streams.push(get_str(
                        &mut r,
                        STREAM_NAME_FIELD_SIZE_BYTES_MAX,
                        "stream name",
                    )?);
                }
                Response::ListStreams { streams }
            }
            Opcode::Write => Response::Write {
                count: r.u32()?,
                first_dlsn: Dlsn::decode(&mut r)?,
                last_dlsn: Dlsn::decode(&mut r)?,
            },
            Opcode::Read => {
                let next = get_position(&mut r)?;
                let count = r.u32()? as usize;
                if count > frame.body.len() / READ_RECORD_OVERHEAD_BYTES {
                    return Err(WireError::InvalidField {
                        what: "read record count",
                    });
                }
                let mut records = Vec::with_capacity(count);
                for _ in 0..count {
                    let dlsn = Dlsn::decode(&mut r)?;
                    let txid = r.u64()?;
                    let payload = r.len_prefixed(frame.body.len())?;
                    records.push((dlsn, txid, payload.to_vec()));
                }
                Response::Read { next, records }
            }
        };
        r.finish()?;
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_wire::frame::decode_frame;

    fn req_round_trip(req: Request) {
        let mut buf = Vec::new();
        req.encode(9, &mut buf);
        let (frame, used) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        assert_eq!(used, buf.len());
        assert_eq!(frame.header.request_id, 9);
        assert_eq!(Request::decode(&frame).unwrap(), req);
        // Every truncation of the body is refused.
        for cut in 0..frame.body.len() {
            let f = Frame {
                header: frame.header,
                body: &frame.body[..cut],
            };
            assert!(Request::decode(&f).is_err(), "{req:?} cut {cut}");
        }
    }

    fn resp_round_trip(op: Opcode, resp: Response) {
        let mut buf = Vec::new();
        resp.encode(op as u8, 5, &mut buf);
        let (frame, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        assert_eq!(Response::decode(&frame).unwrap(), resp);
        for cut in 0..frame.body.len() {
            let f = Frame {
                header: frame.header,
                body: &frame.body[..cut],
            };
            assert!(Response::decode(&f).is_err(), "{resp:?} cut {cut}");
        }
    }

    #[test]
    fn requests_round_trip() {
        // Goal: every request survives encode/decode and every truncated body is refused.
        req_round_trip(Request::Hello {
            version_min: 1,
            version_max: 3,
        });
        req_round_trip(Request::CreateStream {
            stream: "a/b".into(),
        });
        req_round_trip(Request::Write {
            stream: "s".into(),
            create_if_missing: true,
            records: vec![(1, b"x".to_vec()), (1, vec![]), (u64::MAX, vec![9; 300])],
        });
        req_round_trip(Request::Read {
            stream: "s".into(),
            from: ReadPosition::Head,
            max_records: 10,
            max_bytes: 100,
            wait_ms: 5,
        });
        req_round_trip(Request::Read {
            stream: "s".into(),
            from: ReadPosition::Dlsn(Dlsn::new(2, 3, 4)),
            max_records: 1,
            max_bytes: 2,
            wait_ms: 0,
        });
        let mut buf = Vec::new();
        Request::ListStreams.encode(1, &mut buf);
        let (f, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        assert_eq!(Request::decode(&f).unwrap(), Request::ListStreams);
    }

    #[test]
    fn responses_round_trip() {
        // Goal: every response survives encode/decode, errors keep code and message.
        resp_round_trip(
            Opcode::Hello,
            Response::Hello {
                version: 1,
                frame_size_bytes_max: 5 << 20,
                record_size_bytes_max: 7,
            },
        );
        resp_round_trip(
            Opcode::ListStreams,
            Response::ListStreams {
                streams: vec!["a".into(), "b/c".into()],
            },
        );
        resp_round_trip(
            Opcode::Write,
            Response::Write {
                count: 3,
                first_dlsn: Dlsn::new(1, 0, 0),
                last_dlsn: Dlsn::new(1, 0, 2),
            },
        );
        resp_round_trip(
            Opcode::Read,
            Response::Read {
                next: ReadPosition::Dlsn(Dlsn::new(1, 1, 0)),
                records: vec![
                    (Dlsn::new(1, 0, 0), 4, b"hi".to_vec()),
                    (Dlsn::new(1, 0, 1), 4, vec![]),
                ],
            },
        );
        resp_round_trip(
            Opcode::Write,
            Response::Error {
                code: ErrorCode::RecordTooLarge,
                message: "too big".into(),
            },
        );
        let mut buf = Vec::new();
        Response::CreateStream.encode(Opcode::CreateStream as u8, 1, &mut buf);
        let (f, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        assert_eq!(Response::decode(&f).unwrap(), Response::CreateStream);
    }

    #[test]
    fn hostile_bodies_are_refused() {
        // Goal: bad magic, unknown opcode, absurd counts and bad UTF-8 give errors, not panics.
        let hdr = |opcode| FrameHeader {
            opcode,
            flags: 0,
            status: 0,
            request_id: 1,
        };
        let body = [0u8; 8];
        assert!(matches!(
            Request::decode(&Frame {
                header: hdr(1),
                body: &body
            }),
            Err(WireError::BadMagic { .. })
        ));
        assert!(matches!(
            Request::decode(&Frame {
                header: hdr(0x7f),
                body: &[]
            }),
            Err(WireError::UnknownOpcode(0x7f))
        ));
        let mut b = Vec::new();
        put_str(&mut b, "s");
        put_u32(&mut b, u32::MAX);
        assert!(Request::decode(&Frame {
            header: hdr(4),
            body: &b
        })
        .is_err());
        let mut b = Vec::new();
        put_len_prefixed(&mut b, &[0xff, 0xfe]);
        assert!(Request::decode(&Frame {
            header: hdr(2),
            body: &b
        })
        .is_err());
        let mut x: u32 = 7;
        for len in 0..300usize {
            let g: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                    (x >> 24) as u8
                })
                .collect();
            for op in 0..8u8 {
                let _ = Request::decode(&Frame {
                    header: hdr(op),
                    body: &g,
                });
                let _ = Response::decode(&Frame {
                    header: hdr(op | RESPONSE_BIT),
                    body: &g,
                });
            }
        }
    }

    #[test]
    fn long_error_messages_are_cut_on_a_char_boundary() {
        // Goal: an over-long multibyte message is cut below the limit without splitting a char.
        let s = "é".repeat(ERROR_MESSAGE_SIZE_BYTES_MAX);
        let t = truncate_message(&s, ERROR_MESSAGE_SIZE_BYTES_MAX);
        assert!(t.len() <= ERROR_MESSAGE_SIZE_BYTES_MAX);
        assert!(t.chars().all(|c| c == 'é'));
    }
}

//! Bookie requests and responses carried in [`crate::frame`] frames.
//!
//! The layouts are listed byte by byte in `docs/protocol.md`. A connection starts with
//! [`Request::Hello`]; until the bookie has answered it, any other request is refused with
//! [`Status::BadRequest`] and the connection is closed. In version 2 ([`PROTOCOL_VERSION_AUTH`])
//! the Hello answer carries a nonce and the client must then pass [`Request::Auth`] with a
//! proof of the cluster secret ([`crate::auth`]); until it has, any other request is refused
//! with [`Status::Unauthorized`] and the connection is closed.

use crate::auth::{AuthNonce, AuthProof, AUTH_NONCE_SIZE_BYTES, AUTH_PROOF_SIZE_BYTES};
use crate::entry::{lac_from_wire, lac_to_wire};
use crate::frame::{
    encode_frame, Frame, FrameHeader, FRAME_HEADER_SIZE_BYTES, FRAME_LEN_MIN, RESPONSE_BIT,
};
use crate::{
    put_len_prefixed, EntryId, LedgerId, MasterKey, Reader, WireError, MASTER_KEY_SIZE_BYTES,
};

/// Magic in the handshake: ASCII "QBK1" read as a little-endian u32.
pub const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"QBK1");
/// Oldest bookie protocol version this build speaks.
pub const PROTOCOL_VERSION_MIN: u16 = 1;
/// Newest bookie protocol version this build speaks.
pub const PROTOCOL_VERSION_MAX: u16 = 2;
/// The version with the cluster-secret handshake: its Hello answer carries the bookie's
/// nonce and [`Request::Auth`] must follow. Version 1 has no authentication; a bookie with a
/// cluster secret speaks only version 2, one without speaks only version 1.
pub const PROTOCOL_VERSION_AUTH: u16 = 2;
/// Longest error message a bookie sends, in bytes; longer ones are cut.
pub const ERROR_MESSAGE_SIZE_BYTES_MAX: usize = 1024;

/// Request opcodes. Stable numbers: add new ones, never renumber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Opcode {
    /// Handshake: magic and the version range of the client.
    Hello = 0x01,
    /// Add one entry (BookKeeper `ADD_ENTRY`).
    Add = 0x02,
    /// Read one entry, or the last one (BookKeeper `READ_ENTRY`, entry -1).
    Read = 0x03,
    /// Read the bookie's view of the LAC and its last entry id (BookKeeper `READ_LAC`).
    ReadLac = 0x04,
    /// Fence a ledger so that normal adds are refused (BookKeeper fencing read).
    Fence = 0x05,
    /// Long-poll read of the LAC with the next entry piggybacked (BookKeeper `READ_ENTRY`
    /// with `previousLAC` and a timeout). Its success response has its own layout:
    /// [`LongPollResponse`], decoded with [`decode_long_poll_response`].
    ReadLacLongPoll = 0x06,
    /// The bookie's state, shards, ledger counts and disk figures (BookKeeper
    /// `GET_BOOKIE_INFO`). Its success response has its own layout: [`BookieInfo`], decoded
    /// with [`decode_bookie_info_response`].
    GetBookieInfo = 0x07,
    /// Version 2 handshake, after Hello: the client's nonce and its proof of the cluster
    /// secret; the bookie answers with its own proof ([`crate::auth`]). BookKeeper's
    /// `AUTH` request, with a fixed challenge-response instead of a SASL exchange.
    Auth = 0x08,
}

impl Opcode {
    /// Maps a request opcode byte (without [`RESPONSE_BIT`]) to an opcode.
    ///
    /// # Errors
    /// `UnknownOpcode`.
    pub fn from_u8(v: u8) -> Result<Self, WireError> {
        Ok(match v {
            0x01 => Self::Hello,
            0x02 => Self::Add,
            0x03 => Self::Read,
            0x04 => Self::ReadLac,
            0x05 => Self::Fence,
            0x06 => Self::ReadLacLongPoll,
            0x07 => Self::GetBookieInfo,
            0x08 => Self::Auth,
            other => return Err(WireError::UnknownOpcode(other)),
        })
    }
}

/// `Add` flag: recovery add, accepted even when the ledger is fenced (BookKeeper `RECOVERY_ADD`).
pub const FLAG_RECOVERY_ADD: u8 = 0x01;
/// `Read` flag: fence the ledger before answering; the body carries the master key.
pub const FLAG_FENCE: u8 = 0x01;
/// `Read` flag: read the last entry the bookie holds (BookKeeper entry id -1).
pub const FLAG_READ_LAST: u8 = 0x02;
/// Longest wait a bookie grants one long-poll request, in milliseconds; a request asking for
/// more waits this long.
pub const LONG_POLL_TIMEOUT_MS_MAX: u32 = 60_000;
/// Long-poll response body flag: the ledger is fenced.
pub const LONG_POLL_FENCED: u8 = 0x01;
/// Long-poll response body flag: the next entry follows.
pub const LONG_POLL_HAS_ENTRY: u8 = 0x02;

/// Response status codes, numbered as BookKeeper's v2 return codes where one exists.
/// Stable numbers: add new ones, never renumber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// The bookie holds nothing of this ledger (`ENOLEDGER`): a definitive negative answer.
    NoSuchLedger = 1,
    /// The bookie's index lacks this entry (`ENOENTRY`): a definitive negative answer, only
    /// ever given from the index, never from an I/O error.
    NoSuchEntry = 2,
    /// Malformed or unexpected request (`EBADREQ`).
    BadRequest = 100,
    /// The bookie failed to read or write its disks (`EIO`).
    IoError = 101,
    /// Wrong master key for the ledger (`EUA`).
    Unauthorized = 102,
    /// No common protocol version (`EBADVERSION`).
    BadVersion = 103,
    /// The ledger is fenced; normal adds are refused (`EFENCED`).
    Fenced = 104,
    /// The bookie is read-only (`EREADONLY`).
    ReadOnly = 105,
    /// The bookie is overloaded; retry later (`ETOOMANYREQUESTS`).
    TooManyRequests = 106,
    /// The entry or frame is larger than the bookie accepts.
    TooLarge = 108,
    /// The bookie already stores (or is storing) this entry with other bytes; nothing was
    /// stored. A re-add of the same bytes (a recovery add) succeeds. Quire's own status:
    /// BookKeeper overwrites the entry.
    EntryMismatch = 109,
}

impl Status {
    /// Maps a wire value to a status.
    ///
    /// # Errors
    /// `UnknownStatus`.
    pub fn from_u16(v: u16) -> Result<Self, WireError> {
        Ok(match v {
            0 => Self::Ok,
            1 => Self::NoSuchLedger,
            2 => Self::NoSuchEntry,
            100 => Self::BadRequest,
            101 => Self::IoError,
            102 => Self::Unauthorized,
            103 => Self::BadVersion,
            104 => Self::Fenced,
            105 => Self::ReadOnly,
            106 => Self::TooManyRequests,
            108 => Self::TooLarge,
            109 => Self::EntryMismatch,
            other => return Err(WireError::UnknownStatus(other)),
        })
    }
}

/// A request from a client to a bookie. Borrowed from the receive buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// Handshake. Body: magic u32, version_min u16, version_max u16.
    Hello { version_min: u16, version_max: u16 },
    /// Add an entry. Body: master key (20 bytes), then the entry bytes ([`crate::entry`]).
    Add {
        recovery: bool,
        master_key: MasterKey,
        entry: &'a [u8],
    },
    /// Read an entry. Body: ledger u64, entry u64 (ignored with `FLAG_READ_LAST`), then the
    /// master key (20 bytes) iff `FLAG_FENCE`.
    Read {
        ledger: LedgerId,
        entry: Option<EntryId>,
        fence: Option<MasterKey>,
    },
    /// Read the LAC. Body: ledger u64.
    ReadLac { ledger: LedgerId },
    /// Fence a ledger. Body: ledger u64, master key (20 bytes).
    Fence {
        ledger: LedgerId,
        master_key: MasterKey,
    },
    /// Long-poll the LAC. Body: ledger u64, previous_lac_plus_one u64 (0 = none), timeout_ms
    /// u32. The bookie answers once its LAC passes `previous_lac`, the ledger is fenced, or
    /// `timeout_ms` (at most [`LONG_POLL_TIMEOUT_MS_MAX`]) elapsed.
    ReadLacLongPoll {
        ledger: LedgerId,
        previous_lac: Option<EntryId>,
        timeout_ms: u32,
    },
    /// Ask for the bookie's [`BookieInfo`]. Empty body; header flag [`INFO_WANT_SCRUB`] when
    /// `scrub` (the answer then carries [`BookieInfo::scrub`]). Like every request but
    /// `Hello`, only after the handshake.
    GetBookieInfo { scrub: bool },
    /// Prove the cluster secret (version 2, after Hello). Body: client_nonce (32 bytes),
    /// proof (32 bytes) = HMAC-SHA256(secret, client label ‖ server nonce ‖ client nonce).
    Auth {
        client_nonce: AuthNonce,
        proof: AuthProof,
    },
}

/// The success response to [`Request::ReadLacLongPoll`]. Body: ledger u64, lac_plus_one u64
/// (0 = none), flags u8 ([`LONG_POLL_FENCED`], [`LONG_POLL_HAS_ENTRY`]), then iff
/// `LONG_POLL_HAS_ENTRY`: entry id u64 and the stored entry bytes verbatim (the rest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LongPollResponse<'a> {
    pub ledger: LedgerId,
    /// The bookie's LAC when it answered; not past the request's `previous_lac` on a timeout.
    pub lac: Option<EntryId>,
    pub fenced: bool,
    /// Entry `previous_lac + 1` (0 for none) when the LAC passed `previous_lac` and the bookie
    /// holds it.
    pub next_entry: Option<(EntryId, &'a [u8])>,
}

/// A decoded long-poll answer: success, or the error the bookie answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LongPollReply<'a> {
    Ok(LongPollResponse<'a>),
    Failed { status: Status, message: &'a str },
}

/// Appends the success response frame of a long-poll request to `out`. Errors are sent with
/// [`encode_response`] and [`Response::Failed`] (opcode [`Opcode::ReadLacLongPoll`]).
pub fn encode_long_poll_response(
    out: &mut Vec<u8>,
    request_id: u64,
    response: &LongPollResponse<'_>,
) {
    let mut body = Vec::with_capacity(25 + response.next_entry.map_or(0, |(_, d)| d.len() + 8));
    body.extend_from_slice(&response.ledger.0.to_le_bytes());
    body.extend_from_slice(&lac_to_wire(response.lac).to_le_bytes());
    let mut flags = 0u8;
    if response.fenced {
        flags |= LONG_POLL_FENCED;
    }
    if response.next_entry.is_some() {
        flags |= LONG_POLL_HAS_ENTRY;
    }
    body.push(flags);
    if let Some((entry, data)) = response.next_entry {
        body.extend_from_slice(&entry.0.to_le_bytes());
        body.extend_from_slice(data);
    }
    let header = FrameHeader {
        opcode: Opcode::ReadLacLongPoll as u8 | RESPONSE_BIT,
        flags: 0,
        status: Status::Ok as u16,
        request_id,
    };
    encode_frame(out, header, &body);
}

/// Decodes the response frame of a long-poll request (success or error).
///
/// # Errors
/// `InvalidField` for a frame that is not a long-poll response or has unknown body flags;
/// `UnknownStatus`, `Truncated`, `TrailingBytes`.
pub fn decode_long_poll_response<'a>(frame: &Frame<'a>) -> Result<LongPollReply<'a>, WireError> {
    let h = frame.header;
    if h.opcode != Opcode::ReadLacLongPoll as u8 | RESPONSE_BIT {
        return Err(WireError::InvalidField {
            what: "long-poll response opcode",
        });
    }
    let status = Status::from_u16(h.status)?;
    if status != Status::Ok {
        return match decode_response(frame)? {
            Response::Failed {
                status, message, ..
            } => Ok(LongPollReply::Failed { status, message }),
            _ => Err(WireError::InvalidField {
                what: "long-poll error response",
            }),
        };
    }
    let mut r = Reader::new(frame.body, "long-poll response body");
    let ledger = LedgerId(r.u64()?);
    let lac = lac_from_wire(r.u64()?);
    let flags = r.u8()?;
    if flags & !(LONG_POLL_FENCED | LONG_POLL_HAS_ENTRY) != 0 {
        return Err(WireError::InvalidField {
            what: "long-poll response flags",
        });
    }
    let next_entry = if flags & LONG_POLL_HAS_ENTRY != 0 {
        Some((EntryId(r.u64()?), r.rest()))
    } else {
        None
    };
    r.finish()?;
    Ok(LongPollReply::Ok(LongPollResponse {
        ledger,
        lac,
        fenced: flags & LONG_POLL_FENCED != 0,
        next_entry,
    }))
}

/// A successful response body, or the error a bookie answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response<'a> {
    /// Body: version u16, shard_count u16, frame_size_bytes_max u32, then in version 2 the
    /// bookie's nonce (32 bytes) for [`Request::Auth`].
    Hello {
        version: u16,
        shard_count: u16,
        frame_size_bytes_max: u32,
        auth_nonce: Option<AuthNonce>,
    },
    /// Body: the bookie's proof (32 bytes) = HMAC-SHA256(secret, bookie label ‖ server nonce
    /// ‖ client nonce). Sent only after the client's proof checked.
    Auth { proof: AuthProof },
    /// Body: ledger u64, entry u64. Sent only once the entry is durable on this bookie.
    Add { ledger: LedgerId, entry: EntryId },
    /// Body: ledger u64, entry u64, then the stored entry bytes verbatim.
    Read {
        ledger: LedgerId,
        entry: EntryId,
        data: &'a [u8],
    },
    /// Body: ledger u64, lac_plus_one u64, last_entry_plus_one u64 (0 = none).
    ReadLac {
        ledger: LedgerId,
        lac: Option<EntryId>,
        last_entry: Option<EntryId>,
    },
    /// Body: ledger u64, lac_plus_one u64. Sent only once the fence is durable.
    Fence {
        ledger: LedgerId,
        lac: Option<EntryId>,
    },
    /// Any failed request: the status is non-zero and the body is a u32-length-prefixed
    /// UTF-8 message for humans.
    Failed {
        opcode: Opcode,
        status: Status,
        message: &'a str,
    },
}

fn array32(r: &mut Reader<'_>) -> Result<[u8; 32], WireError> {
    const _: () = assert!(AUTH_NONCE_SIZE_BYTES == 32 && AUTH_PROOF_SIZE_BYTES == 32);
    let mut a = [0u8; 32];
    a.copy_from_slice(r.bytes(32)?);
    Ok(a)
}

fn key(r: &mut Reader<'_>) -> Result<MasterKey, WireError> {
    let mut k = [0u8; MASTER_KEY_SIZE_BYTES];
    k.copy_from_slice(r.bytes(MASTER_KEY_SIZE_BYTES)?);
    Ok(MasterKey(k))
}

/// Appends the first bytes of an `Add` request frame to `out`: the frame header (its length
/// counting an entry of `entry_len` bytes) and the master key. The frame is complete once the
/// entry's `entry_len` bytes follow; together they are byte for byte what [`encode_request`]
/// writes for the same `Add`, so a client can send one shared entry buffer behind a small
/// header of its own per bookie (a vectored write) instead of copying the entry into each
/// bookie's frame.
///
/// # Panics
/// If the frame would exceed 4 GiB; entries are bounded far below that.
pub fn encode_add_request_head(
    out: &mut Vec<u8>,
    request_id: u64,
    recovery: bool,
    master_key: MasterKey,
    entry_len: usize,
) {
    let body_len = MASTER_KEY_SIZE_BYTES + entry_len;
    let frame_len = u32::try_from(body_len + FRAME_LEN_MIN as usize).expect("frame above 4 GiB");
    out.reserve(FRAME_HEADER_SIZE_BYTES + MASTER_KEY_SIZE_BYTES);
    out.extend_from_slice(&frame_len.to_le_bytes());
    out.push(Opcode::Add as u8);
    out.push(if recovery { FLAG_RECOVERY_ADD } else { 0 });
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
    out.extend_from_slice(&master_key.0);
}

/// Appends a request frame to `out`.
pub fn encode_request(out: &mut Vec<u8>, request_id: u64, request: &Request<'_>) {
    let mut body = Vec::new();
    let (opcode, flags) = match *request {
        Request::Hello {
            version_min,
            version_max,
        } => {
            body.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
            body.extend_from_slice(&version_min.to_le_bytes());
            body.extend_from_slice(&version_max.to_le_bytes());
            (Opcode::Hello, 0)
        }
        Request::Add {
            recovery,
            master_key,
            entry,
        } => {
            body.reserve(MASTER_KEY_SIZE_BYTES + entry.len());
            body.extend_from_slice(&master_key.0);
            body.extend_from_slice(entry);
            (Opcode::Add, if recovery { FLAG_RECOVERY_ADD } else { 0 })
        }
        Request::Read {
            ledger,
            entry,
            fence,
        } => {
            body.extend_from_slice(&ledger.0.to_le_bytes());
            body.extend_from_slice(&entry.map_or(0, |e| e.0).to_le_bytes());
            let mut flags = if entry.is_none() { FLAG_READ_LAST } else { 0 };
            if let Some(k) = fence {
                body.extend_from_slice(&k.0);
                flags |= FLAG_FENCE;
            }
            (Opcode::Read, flags)
        }
        Request::ReadLac { ledger } => {
            body.extend_from_slice(&ledger.0.to_le_bytes());
            (Opcode::ReadLac, 0)
        }
        Request::Fence { ledger, master_key } => {
            body.extend_from_slice(&ledger.0.to_le_bytes());
            body.extend_from_slice(&master_key.0);
            (Opcode::Fence, 0)
        }
        Request::ReadLacLongPoll {
            ledger,
            previous_lac,
            timeout_ms,
        } => {
            body.extend_from_slice(&ledger.0.to_le_bytes());
            body.extend_from_slice(&lac_to_wire(previous_lac).to_le_bytes());
            body.extend_from_slice(&timeout_ms.to_le_bytes());
            (Opcode::ReadLacLongPoll, 0)
        }
        Request::GetBookieInfo { scrub } => (
            Opcode::GetBookieInfo,
            if scrub { INFO_WANT_SCRUB } else { 0 },
        ),
        Request::Auth {
            client_nonce,
            proof,
        } => {
            body.extend_from_slice(&client_nonce);
            body.extend_from_slice(&proof);
            (Opcode::Auth, 0)
        }
    };
    encode_frame(
        out,
        FrameHeader {
            opcode: opcode as u8,
            flags,
            status: 0,
            request_id,
        },
        &body,
    );
}

/// Decodes a request frame.
///
/// # Errors
/// `UnknownOpcode`, `Truncated`, `TrailingBytes`, `BadMagic`, or `InvalidField` for a frame
/// that is a response or carries a status.
pub fn decode_request<'a>(frame: &Frame<'a>) -> Result<Request<'a>, WireError> {
    let h = frame.header;
    if h.opcode & RESPONSE_BIT != 0 || h.status != 0 {
        return Err(WireError::InvalidField {
            what: "request opcode/status",
        });
    }
    let mut r = Reader::new(frame.body, "request body");
    let req = match Opcode::from_u8(h.opcode)? {
        Opcode::Hello => {
            let magic = r.u32()?;
            if magic != HELLO_MAGIC {
                return Err(WireError::BadMagic { found: magic });
            }
            Request::Hello {
                version_min: r.u16()?,
                version_max: r.u16()?,
            }
        }
        Opcode::Add => {
            let master_key = key(&mut r)?;
            let entry = r.rest();
            crate::entry::peek_header(entry)?;
            Request::Add {
                recovery: h.flags & FLAG_RECOVERY_ADD != 0,
                master_key,
                entry,
            }
        }
        Opcode::Read => {
            let ledger = LedgerId(r.u64()?);
            let entry = r.u64()?;
            let entry = if h.flags & FLAG_READ_LAST != 0 {
                None
            } else {
                Some(EntryId(entry))
            };
            let fence = if h.flags & FLAG_FENCE != 0 {
                Some(key(&mut r)?)
            } else {
                None
            };
            Request::Read {
                ledger,
                entry,
                fence,
            }
        }
        Opcode::ReadLac => Request::ReadLac {
            ledger: LedgerId(r.u64()?),
        },
        Opcode::Fence => Request::Fence {
            ledger: LedgerId(r.u64()?),
            master_key: key(&mut r)?,
        },
        Opcode::ReadLacLongPoll => Request::ReadLacLongPoll {
            ledger: LedgerId(r.u64()?),
            previous_lac: lac_from_wire(r.u64()?),
            timeout_ms: r.u32()?,
        },
        // Unknown flag bits are ignored: a newer client asking for sections this bookie does
        // not know gets the ones it knows (and an older bookie ignored every flag).
        Opcode::GetBookieInfo => Request::GetBookieInfo {
            scrub: h.flags & INFO_WANT_SCRUB != 0,
        },
        Opcode::Auth => Request::Auth {
            client_nonce: array32(&mut r)?,
            proof: array32(&mut r)?,
        },
    };
    r.finish()?;
    Ok(req)
}

/// Appends a response frame for request `request_id` to `out`.
pub fn encode_response(out: &mut Vec<u8>, request_id: u64, response: &Response<'_>) {
    let mut body = Vec::new();
    let (opcode, status) = match *response {
        Response::Hello {
            version,
            shard_count,
            frame_size_bytes_max,
            auth_nonce,
        } => {
            body.extend_from_slice(&version.to_le_bytes());
            body.extend_from_slice(&shard_count.to_le_bytes());
            body.extend_from_slice(&frame_size_bytes_max.to_le_bytes());
            if let Some(n) = auth_nonce {
                body.extend_from_slice(&n);
            }
            (Opcode::Hello, Status::Ok)
        }
        Response::Auth { proof } => {
            body.extend_from_slice(&proof);
            (Opcode::Auth, Status::Ok)
        }
        Response::Add { ledger, entry } => {
            body.extend_from_slice(&ledger.0.to_le_bytes());
            body.extend_from_slice(&entry.0.to_le_bytes());
            (Opcode::Add, Status::Ok)
        }
        Response::Read {
            ledger,
            entry,
            data,
        } => {
            body.reserve(16 + data.len());
            body.extend_from_slice(&ledger.0.to_le_bytes());
            body.extend_from_slice(&entry.0.to_le_bytes());
            body.extend_from_slice(data);
            (Opcode::Read, Status::Ok)
        }
        Response::ReadLac {
            ledger,
            lac,
            last_entry,
        } => {
            body.extend_from_slice(&ledger.0.to_le_bytes());
            body.extend_from_slice(&lac_to_wire(lac).to_le_bytes());
            body.extend_from_slice(&lac_to_wire(last_entry).to_le_bytes());
            (Opcode::ReadLac, Status::Ok)
        }
        Response::Fence { ledger, lac } => {
            body.extend_from_slice(&ledger.0.to_le_bytes());
            body.extend_from_slice(&lac_to_wire(lac).to_le_bytes());
            (Opcode::Fence, Status::Ok)
        }
        Response::Failed {
            opcode,
            status,
            message,
        } => {
            let mut cut = message.len().min(ERROR_MESSAGE_SIZE_BYTES_MAX);
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            put_len_prefixed(&mut body, &message.as_bytes()[..cut]);
            (opcode, status)
        }
    };
    let header = FrameHeader {
        opcode: opcode as u8 | RESPONSE_BIT,
        flags: 0,
        status: status as u16,
        request_id,
    };
    encode_frame(out, header, &body);
}

/// Decodes a response frame.
///
/// # Errors
/// `UnknownOpcode`, `UnknownStatus`, `Truncated`, `TrailingBytes`, or `InvalidField` for a
/// frame without the response bit or with a non-UTF-8 error message.
pub fn decode_response<'a>(frame: &Frame<'a>) -> Result<Response<'a>, WireError> {
    let h = frame.header;
    if h.opcode & RESPONSE_BIT == 0 {
        return Err(WireError::InvalidField {
            what: "response bit",
        });
    }
    let opcode = Opcode::from_u8(h.opcode & !RESPONSE_BIT)?;
    let status = Status::from_u16(h.status)?;
    let mut r = Reader::new(frame.body, "response body");
    let resp = if status != Status::Ok {
        let msg = r.len_prefixed(ERROR_MESSAGE_SIZE_BYTES_MAX)?;
        let message = std::str::from_utf8(msg).map_err(|_| WireError::InvalidField {
            what: "error message",
        })?;
        Response::Failed {
            opcode,
            status,
            message,
        }
    } else {
        match opcode {
            Opcode::Hello => {
                let version = r.u16()?;
                let shard_count = r.u16()?;
                let frame_size_bytes_max = r.u32()?;
                // The version decides the layout: a version-2 answer carries the nonce.
                let auth_nonce = if version >= PROTOCOL_VERSION_AUTH {
                    Some(array32(&mut r)?)
                } else {
                    None
                };
                Response::Hello {
                    version,
                    shard_count,
                    frame_size_bytes_max,
                    auth_nonce,
                }
            }
            Opcode::Auth => Response::Auth {
                proof: array32(&mut r)?,
            },
            Opcode::Add => Response::Add {
                ledger: LedgerId(r.u64()?),
                entry: EntryId(r.u64()?),
            },
            Opcode::Read => Response::Read {
                ledger: LedgerId(r.u64()?),
                entry: EntryId(r.u64()?),
                data: r.rest(),
            },
            Opcode::ReadLac => Response::ReadLac {
                ledger: LedgerId(r.u64()?),
                lac: lac_from_wire(r.u64()?),
                last_entry: lac_from_wire(r.u64()?),
            },
            Opcode::Fence => Response::Fence {
                ledger: LedgerId(r.u64()?),
                lac: lac_from_wire(r.u64()?),
            },
            // Its layout is not a `Response` variant (see `decode_long_poll_response`).
            Opcode::ReadLacLongPoll => {
                return Err(WireError::InvalidField {
                    what: "long-poll success response (decode it with decode_long_poll_response)",
                })
            }
            Opcode::GetBookieInfo => {
                return Err(WireError::InvalidField {
                    what:
                        "bookie info success response (decode it with decode_bookie_info_response)",
                })
            }
        }
    };
    r.finish()?;
    Ok(resp)
}

/// Picks the protocol version for a handshake: the highest both ranges share.
///
/// # Errors
/// `NoCommonVersion` when the ranges do not overlap.
pub fn negotiate_version(peer_min: u16, peer_max: u16) -> Result<u16, WireError> {
    negotiate_version_in(
        peer_min,
        peer_max,
        PROTOCOL_VERSION_MIN,
        PROTOCOL_VERSION_MAX,
    )
}

/// [`negotiate_version`] against our range `ours_min..=ours_max` (a bookie with a cluster
/// secret speaks only [`PROTOCOL_VERSION_AUTH`], one without only version 1).
///
/// # Errors
/// `NoCommonVersion` when the ranges do not overlap.
pub fn negotiate_version_in(
    peer_min: u16,
    peer_max: u16,
    ours_min: u16,
    ours_max: u16,
) -> Result<u16, WireError> {
    let v = peer_max.min(ours_max);
    if v < peer_min.max(ours_min) {
        return Err(WireError::NoCommonVersion {
            peer_min,
            peer_max,
            ours_min,
            ours_max,
        });
    }
    Ok(v)
}

/// Longest directory path a [`BookieInfo`] carries, in bytes; a longer one is refused by the
/// decoder (the encoder cuts it at a character boundary).
pub const BOOKIE_INFO_PATH_SIZE_BYTES_MAX: usize = 4096;

/// Whether a bookie takes adds (BookKeeper's writable / read-only bookie state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum BookieState {
    /// Takes adds and reads.
    Writable = 0,
    /// Refuses adds with [`Status::ReadOnly`]; serves reads.
    ReadOnly = 1,
}

/// `GetBookieInfo` request header flag: answer with the scrub section ([`ScrubInfo`] per
/// shard). A request without it gets the layout of builds before the scrubber's section, so
/// older clients (which refuse trailing bytes) still decode the answer.
pub const INFO_WANT_SCRUB: u8 = 0x01;

/// [`ScrubInfo::flags`] bit: the shard's scrubber is on.
pub const SCRUB_ENABLED: u8 = 0x01;
/// [`ScrubInfo::flags`] bit: a pass is under way.
pub const SCRUB_IN_PROGRESS: u8 = 0x02;

/// One shard's scrubber figures in a [`BookieInfo`], as the shard last published them (at most
/// 500 ms old). Times are milliseconds since the Unix epoch, 0 for none; counts are since the
/// bookie started. Wire: flags u8 then twelve u64 in field order (97 bytes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubInfo {
    /// [`SCRUB_ENABLED`], [`SCRUB_IN_PROGRESS`]; other bits are refused by the decoder.
    pub flags: u8,
    /// Start of the pass under way (0: none runs).
    pub pass_started_ms: u64,
    /// Start and end of the last completed pass (0: none yet).
    pub last_pass_start_ms: u64,
    pub last_pass_end_ms: u64,
    /// Entry-log records and bytes the last completed pass checked.
    pub last_pass_entries: u64,
    pub last_pass_bytes: u64,
    /// Completed passes.
    pub passes: u64,
    /// Entry-log records and bytes checked, all passes.
    pub entries_scanned: u64,
    pub bytes_scanned: u64,
    /// Damaged entries found (each once until repaired), still damaged at the last pass's
    /// end, and later found replaced by an intact copy (repaired).
    pub damaged_found: u64,
    pub damaged_now: u64,
    pub repaired: u64,
    /// Ledgers with damaged entries sent to be marked under-replicated (once per pass that
    /// still finds them).
    pub ledgers_reported: u64,
}

/// Bytes of one [`ScrubInfo`] on the wire.
const SCRUB_INFO_BYTES: usize = 1 + 12 * 8;

/// Which of a bookie's directories a [`DirInfo`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum DirKind {
    /// The journal root (one subdirectory per shard).
    Journal = 1,
    /// The ledger root: entry logs and index (one subdirectory per shard).
    Ledger = 2,
}

/// Disk figures of one bookie directory, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirInfo {
    pub kind: DirKind,
    /// The directory as the bookie was configured with it.
    pub path: String,
    /// Size of the file system holding it.
    pub total_bytes: u64,
    /// Space available to the bookie on that file system.
    pub free_bytes: u64,
    /// Space the bookie's files under the directory take.
    pub used_bytes: u64,
}

/// The success response to [`Request::GetBookieInfo`] (BookKeeper `GET_BOOKIE_INFO`, which
/// answers total and free disk space; this one adds state, shards and ledgers).
///
/// Body: state u8 ([`BookieState`]); shard_count u16, then per shard its ledger count u64;
/// dir_count u16, then per directory: kind u8 ([`DirKind`]), total_bytes u64, free_bytes u64,
/// used_bytes u64, path (u32 length, then UTF-8 bytes, at most
/// [`BOOKIE_INFO_PATH_SIZE_BYTES_MAX`]); then, only when asked ([`INFO_WANT_SCRUB`]), the
/// scrub section: scrub_shard_count u16, then per shard a [`ScrubInfo`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BookieInfo {
    pub state: BookieState,
    /// Ledgers held by each shard, indexed by shard.
    pub shard_ledgers: Vec<u64>,
    pub dirs: Vec<DirInfo>,
    /// Each shard's scrubber figures, indexed by shard; `None` when not asked for, or from a
    /// bookie built before the section (it ignores the flag).
    pub scrub: Option<Vec<ScrubInfo>>,
}

impl ScrubInfo {
    fn fields(&self) -> [u64; 12] {
        [
            self.pass_started_ms,
            self.last_pass_start_ms,
            self.last_pass_end_ms,
            self.last_pass_entries,
            self.last_pass_bytes,
            self.passes,
            self.entries_scanned,
            self.bytes_scanned,
            self.damaged_found,
            self.damaged_now,
            self.repaired,
            self.ledgers_reported,
        ]
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let flags = r.u8()?;
        if flags & !(SCRUB_ENABLED | SCRUB_IN_PROGRESS) != 0 {
            return Err(WireError::InvalidField {
                what: "bookie info scrub flags",
            });
        }
        let mut v = [0u64; 12];
        for x in v.iter_mut() {
            *x = r.u64()?;
        }
        let [pass_started_ms, last_pass_start_ms, last_pass_end_ms, last_pass_entries, last_pass_bytes, passes, entries_scanned, bytes_scanned, damaged_found, damaged_now, repaired, ledgers_reported] =
            v;
        Ok(Self {
            flags,
            pass_started_ms,
            last_pass_start_ms,
            last_pass_end_ms,
            last_pass_entries,
            last_pass_bytes,
            passes,
            entries_scanned,
            bytes_scanned,
            damaged_found,
            damaged_now,
            repaired,
            ledgers_reported,
        })
    }
}

/// A decoded bookie-info answer: success, or the error the bookie answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BookieInfoReply<'a> {
    Ok(BookieInfo),
    Failed { status: Status, message: &'a str },
}

/// Appends the success response frame of a bookie-info request to `out`.
///
/// # Panics
/// If more than `u16::MAX` shards or directories are given (a bookie has at most
/// `u16::MAX` shards and two directories).
pub fn encode_bookie_info_response(out: &mut Vec<u8>, request_id: u64, info: &BookieInfo) {
    let mut body = Vec::with_capacity(5 + 8 * info.shard_ledgers.len() + 64 * info.dirs.len());
    body.push(info.state as u8);
    let shards = u16::try_from(info.shard_ledgers.len()).expect("at most u16::MAX shards");
    body.extend_from_slice(&shards.to_le_bytes());
    for l in &info.shard_ledgers {
        body.extend_from_slice(&l.to_le_bytes());
    }
    let dirs = u16::try_from(info.dirs.len()).expect("at most u16::MAX directories");
    body.extend_from_slice(&dirs.to_le_bytes());
    for d in &info.dirs {
        body.push(d.kind as u8);
        body.extend_from_slice(&d.total_bytes.to_le_bytes());
        body.extend_from_slice(&d.free_bytes.to_le_bytes());
        body.extend_from_slice(&d.used_bytes.to_le_bytes());
        let mut cut = d.path.len().min(BOOKIE_INFO_PATH_SIZE_BYTES_MAX);
        while !d.path.is_char_boundary(cut) {
            cut -= 1;
        }
        put_len_prefixed(&mut body, &d.path.as_bytes()[..cut]);
    }
    if let Some(scrub) = &info.scrub {
        let n = u16::try_from(scrub.len()).expect("at most u16::MAX shards");
        body.extend_from_slice(&n.to_le_bytes());
        for s in scrub {
            body.push(s.flags);
            for v in s.fields() {
                body.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    let header = FrameHeader {
        opcode: Opcode::GetBookieInfo as u8 | RESPONSE_BIT,
        flags: 0,
        status: Status::Ok as u16,
        request_id,
    };
    encode_frame(out, header, &body);
}

/// Decodes the response frame of a bookie-info request (success or error).
///
/// # Errors
/// `InvalidField` for a frame that is not a bookie-info response, an unknown state or
/// directory kind, or a non-UTF-8 path; `UnknownStatus`, `Truncated` (also for counts larger
/// than the body holds), `TrailingBytes`.
pub fn decode_bookie_info_response<'a>(
    frame: &Frame<'a>,
) -> Result<BookieInfoReply<'a>, WireError> {
    let h = frame.header;
    if h.opcode != Opcode::GetBookieInfo as u8 | RESPONSE_BIT {
        return Err(WireError::InvalidField {
            what: "bookie info response opcode",
        });
    }
    let status = Status::from_u16(h.status)?;
    if status != Status::Ok {
        return match decode_response(frame)? {
            Response::Failed {
                status, message, ..
            } => Ok(BookieInfoReply::Failed { status, message }),
            _ => Err(WireError::InvalidField {
                what: "bookie info error response",
            }),
        };
    }
    let mut r = Reader::new(frame.body, "bookie info response body");
    let state = match r.u8()? {
        0 => BookieState::Writable,
        1 => BookieState::ReadOnly,
        _ => {
            return Err(WireError::InvalidField {
                what: "bookie state",
            })
        }
    };
    let shards = r.u16()? as usize;
    // Counts come from the peer: never allocate more than the body can hold.
    let mut shard_ledgers = Vec::with_capacity(shards.min(frame.body.len() / 8));
    for _ in 0..shards {
        shard_ledgers.push(r.u64()?);
    }
    let dir_count = r.u16()? as usize;
    let mut dirs = Vec::with_capacity(dir_count.min(frame.body.len() / 29));
    for _ in 0..dir_count {
        let kind = match r.u8()? {
            1 => DirKind::Journal,
            2 => DirKind::Ledger,
            _ => {
                return Err(WireError::InvalidField {
                    what: "bookie info directory kind",
                })
            }
        };
        let total_bytes = r.u64()?;
        let free_bytes = r.u64()?;
        let used_bytes = r.u64()?;
        let path = r.len_prefixed(BOOKIE_INFO_PATH_SIZE_BYTES_MAX)?;
        let path = std::str::from_utf8(path)
            .map_err(|_| WireError::InvalidField {
                what: "bookie info directory path",
            })?
            .to_string();
        dirs.push(DirInfo {
            kind,
            path,
            total_bytes,
            free_bytes,
            used_bytes,
        });
    }
    // The scrub section is there only when asked for and the bookie knows it.
    let scrub = if r.at_end() {
        None
    } else {
        let n = r.u16()? as usize;
        let mut v = Vec::with_capacity(n.min(frame.body.len() / SCRUB_INFO_BYTES));
        for _ in 0..n {
            v.push(ScrubInfo::decode(&mut r)?);
        }
        Some(v)
    };
    r.finish()?;
    Ok(BookieInfoReply::Ok(BookieInfo {
        state,
        shard_ledgers,
        dirs,
        scrub,
    }))
}

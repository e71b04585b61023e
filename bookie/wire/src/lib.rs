//! The bookie wire protocol and the entry format, as pure codecs with no I/O.
//!
//! Byte-by-byte layouts live in `docs/protocol.md` at the repository root; this crate is the
//! only code that reads or writes them. Everything here is little-endian.
//!
//! * [`frame`]: the length-prefixed frame header shared by the bookie and proxy protocols,
//!   with an incremental decoder that never panics on hostile input.
//! * [`bookie`]: bookie requests and responses (handshake, add, read, read LAC, fence, long-poll
//!   read of the LAC).
//! * [`auth`]: the cluster secret and the HMAC-SHA256 proofs of the version-2 handshake.
//! * [`entry`]: the BookKeeper entry layout (ledger id, entry id, LAC, cumulative length,
//!   CRC32C digest, payload) that clients build and bookies store verbatim.

pub mod auth;
pub mod blocking;
pub mod bookie;
pub mod entry;
pub mod frame;

mod types;

#[cfg(test)]
mod golden;
pub use types::{EntryId, LedgerId, MasterKey, MASTER_KEY_SIZE_BYTES};

/// Everything a decoder can reject. Every variant is an answer to bad input, never a bug.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The frame's length field is below the fixed header size.
    #[error("frame length {frame_len} is shorter than the {min} byte header")]
    FrameTooShort { frame_len: u32, min: u32 },
    /// The frame's length field is above the negotiated maximum.
    #[error("frame length {frame_len} exceeds the limit of {max} bytes")]
    FrameTooLarge { frame_len: u32, max: u32 },
    /// A body ended before a field it must contain.
    #[error("{what}: body is {len} bytes, needs at least {need}")]
    Truncated {
        what: &'static str,
        len: usize,
        need: usize,
    },
    /// A body carried bytes after its last field.
    #[error("{what}: {extra} unexpected trailing bytes")]
    TrailingBytes { what: &'static str, extra: usize },
    /// The opcode is not one this version knows.
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The status code is not one this version knows.
    #[error("unknown status code {0}")]
    UnknownStatus(u16),
    /// The handshake carried the wrong magic number.
    #[error("bad handshake magic {found:#010x}")]
    BadMagic { found: u32 },
    /// No protocol version is shared by both ends.
    #[error("no common protocol version: peer speaks {peer_min}..={peer_max}, we speak {ours_min}..={ours_max}")]
    NoCommonVersion {
        peer_min: u16,
        peer_max: u16,
        ours_min: u16,
        ours_max: u16,
    },
    /// An entry's stored CRC32C does not match its bytes.
    #[error("entry digest mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    DigestMismatch { stored: u32, computed: u32 },
    /// An entry's header names a different ledger or entry than the one asked for.
    #[error("entry header says ledger {found_ledger} entry {found_entry}, expected ledger {ledger} entry {entry}")]
    WrongEntry {
        ledger: u64,
        entry: u64,
        found_ledger: u64,
        found_entry: u64,
    },
    /// A field holds a value outside its domain (named by `what`).
    #[error("invalid field: {what}")]
    InvalidField { what: &'static str },
}

/// Little-endian cursor over a byte slice; every read is bounds-checked.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Starts reading `buf`; `what` names the structure in error messages.
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, what, pos: 0 }
    }

    /// Takes the next `n` bytes.
    ///
    /// # Errors
    /// `WireError::Truncated` when fewer than `n` bytes remain.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(WireError::Truncated {
                what: self.what,
                len: self.buf.len(),
                need: self.pos.saturating_add(n),
            })?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// Reads one byte.
    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.bytes(1)?[0])
    }

    /// Reads a little-endian u16.
    pub fn u16(&mut self) -> Result<u16, WireError> {
        let b = self.bytes(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    /// Reads a little-endian u32.
    pub fn u32(&mut self) -> Result<u32, WireError> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Reads a little-endian u64.
    pub fn u64(&mut self) -> Result<u64, WireError> {
        let b = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// Reads a u32 length followed by that many bytes, refusing lengths above `max`.
    pub fn len_prefixed(&mut self, max: usize) -> Result<&'a [u8], WireError> {
        let len = self.u32()? as usize;
        if len > max {
            return Err(WireError::InvalidField { what: self.what });
        }
        self.bytes(len)
    }

    /// Whether every byte has been read.
    pub fn at_end(&self) -> bool {
        self.pos == self.buf.len()
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let out = &self.buf[self.pos..];
        self.pos = self.buf.len();
        out
    }

    /// Fails if any byte is left unread.
    ///
    /// # Errors
    /// `WireError::TrailingBytes`.
    pub fn finish(self) -> Result<(), WireError> {
        let extra = self.buf.len() - self.pos;
        if extra == 0 {
            Ok(())
        } else {
            Err(WireError::TrailingBytes {
                what: self.what,
                extra,
            })
        }
    }
}

/// Appends a u32 length and the bytes. Panics only if `bytes` exceeds 4 GiB, which the frame
/// limit rules out long before.
pub fn put_len_prefixed(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("length-prefixed field above 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

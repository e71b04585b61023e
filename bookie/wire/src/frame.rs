//! The frame header shared by the bookie and proxy protocols.
//!
//! ```text
//! offset size field
//!  0     4    frame_len   bytes after this field (= 12 + body length), little-endian
//!  4     1    opcode      request opcode; responses set bit 0x80
//!  5     1    flags       opcode-specific bits
//!  6     2    status      0 in requests; a status code in responses
//!  8     8    request_id  chosen by the client, echoed by the server (pipelining)
//! 16     ..   body
//! ```

use crate::WireError;

/// Bytes of the fixed frame header, including the length field.
pub const FRAME_HEADER_SIZE_BYTES: usize = 16;
/// Smallest legal `frame_len` value: the header after the length field.
pub const FRAME_LEN_MIN: u32 = 12;
/// Default largest frame either side accepts: 5 MiB, BookKeeper's `nettyMaxFrameSizeBytes`.
pub const FRAME_SIZE_BYTES_MAX_DEFAULT: u32 = 5 * 1024 * 1024;
/// Bit set in the opcode of every response.
pub const RESPONSE_BIT: u8 = 0x80;

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Request opcode, with [`RESPONSE_BIT`] set in responses.
    pub opcode: u8,
    /// Opcode-specific flag bits.
    pub flags: u8,
    /// Status code (responses only; 0 in requests).
    pub status: u16,
    /// Correlates a response with its request on a pipelined connection.
    pub request_id: u64,
}

/// One whole frame borrowed from a receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The fixed header.
    pub header: FrameHeader,
    /// The body, `frame_len - 12` bytes.
    pub body: &'a [u8],
}

/// Appends a whole frame (header and body) to `out`.
///
/// # Panics
/// If the body would make `frame_len` overflow u32; callers bound bodies far below that.
pub fn encode_frame(out: &mut Vec<u8>, header: FrameHeader, body: &[u8]) {
    let frame_len = u32::try_from(body.len() + FRAME_LEN_MIN as usize).expect("frame above 4 GiB");
    out.reserve(FRAME_HEADER_SIZE_BYTES + body.len());
    out.extend_from_slice(&frame_len.to_le_bytes());
    out.push(header.opcode);
    out.push(header.flags);
    out.extend_from_slice(&header.status.to_le_bytes());
    out.extend_from_slice(&header.request_id.to_le_bytes());
    out.extend_from_slice(body);
}

/// Tries to take one frame from the front of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed, or `Ok(Some((frame, consumed)))`.
/// The length field is checked before the body arrives, so an oversized frame is refused
/// without buffering it.
///
/// # Errors
/// `FrameTooShort` or `FrameTooLarge` for a length outside `[12, frame_size_bytes_max]`;
/// the connection cannot be resynchronised after either and should be closed.
pub fn decode_frame(
    buf: &[u8],
    frame_size_bytes_max: u32,
) -> Result<Option<(Frame<'_>, usize)>, WireError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let frame_len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if frame_len < FRAME_LEN_MIN {
        return Err(WireError::FrameTooShort {
            frame_len,
            min: FRAME_LEN_MIN,
        });
    }
    if frame_len > frame_size_bytes_max {
        return Err(WireError::FrameTooLarge {
            frame_len,
            max: frame_size_bytes_max,
        });
    }
    let total = 4 + frame_len as usize;
    if buf.len() < total {
        return Ok(None);
    }
    let mut r = crate::Reader::new(&buf[4..total], "frame header");
    let opcode = r.u8()?;
    let flags = r.u8()?;
    let status = r.u16()?;
    let request_id = r.u64()?;
    let body = r.rest();
    Ok(Some((
        Frame {
            header: FrameHeader {
                opcode,
                flags,
                status,
                request_id,
            },
            body,
        },
        total,
    )))
}

/// A receive buffer that hands out whole frames from its front and drops the bytes handed out
/// with one move per read, not one per frame: draining each frame off the front of a `Vec`
/// moves the rest of the buffer every time, which is quadratic in the frames of one large read.
///
/// Use: append what the socket gives to [`RecvBuffer::for_read`], then take frames with
/// [`RecvBuffer::next_frame`] until it answers `Ok(None)`.
#[derive(Debug, Default)]
pub struct RecvBuffer {
    bytes: Vec<u8>,
    /// Bytes at the front already handed out as frames.
    start: usize,
    /// Bytes moved by [`RecvBuffer::compact`] since creation (the cost of dropping consumed
    /// bytes, counted so that tests can check it without timing).
    moved_bytes: u64,
}

impl From<Vec<u8>> for RecvBuffer {
    /// A buffer holding `bytes`, received and not handed out yet.
    fn from(bytes: Vec<u8>) -> Self {
        Self {
            bytes,
            ..Self::default()
        }
    }
}

impl RecvBuffer {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the next whole frame, as [`decode_frame`] does; `Ok(None)` when more bytes are
    /// needed. The frame borrows the buffer until the next call.
    ///
    /// # Errors
    /// `FrameTooShort` or `FrameTooLarge` (as [`decode_frame`]); the connection cannot be
    /// resynchronised after either and should be closed.
    pub fn next_frame(
        &mut self,
        frame_size_bytes_max: u32,
    ) -> Result<Option<Frame<'_>>, WireError> {
        match decode_frame(&self.bytes[self.start..], frame_size_bytes_max)? {
            Some((frame, used)) => {
                self.start += used;
                Ok(Some(frame))
            }
            None => Ok(None),
        }
    }

    /// Whether every byte received was handed out.
    pub fn is_empty(&self) -> bool {
        self.start == self.bytes.len()
    }

    /// Bytes received and not handed out yet.
    pub fn pending(&self) -> &[u8] {
        &self.bytes[self.start..]
    }

    /// The vector to append newly received bytes to, after dropping the bytes handed out (one
    /// move of what is left). A buffer that then holds at most half of `keep_bytes` and more
    /// than `keep_bytes` of capacity gives the memory back, so one large frame does not pin it
    /// for the life of a connection (nor while the next frame's first bytes sit behind it).
    pub fn for_read(&mut self, keep_bytes: usize) -> &mut Vec<u8> {
        self.compact();
        if self.bytes.capacity() > keep_bytes && self.bytes.len() <= keep_bytes / 2 {
            if self.bytes.is_empty() {
                self.bytes = Vec::new();
            } else {
                self.bytes.shrink_to(keep_bytes);
            }
        }
        &mut self.bytes
    }

    /// Drops the bytes handed out, moving the rest (an incomplete frame) to the front once.
    pub fn compact(&mut self) {
        if self.start == 0 {
            return;
        }
        let rest = self.bytes.len() - self.start;
        self.bytes.copy_within(self.start.., 0);
        self.bytes.truncate(rest);
        self.moved_bytes += rest as u64;
        self.start = 0;
    }

    /// Bytes moved by compaction since the buffer was made.
    pub fn moved_bytes(&self) -> u64 {
        self.moved_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_partial_input() {
        // Goal: a frame survives encode/decode, and every strict prefix asks for more bytes.
        let header = FrameHeader {
            opcode: 2,
            flags: 1,
            status: 0,
            request_id: 77,
        };
        let mut buf = Vec::new();
        encode_frame(&mut buf, header, b"hello");
        for cut in 0..buf.len() {
            assert_eq!(
                decode_frame(&buf[..cut], 1024).unwrap(),
                None,
                "prefix {cut}"
            );
        }
        let (frame, used) = decode_frame(&buf, 1024).unwrap().unwrap();
        assert_eq!(used, buf.len());
        assert_eq!(frame.header, header);
        assert_eq!(frame.body, b"hello");
    }

    #[test]
    fn length_out_of_bounds_is_refused_before_the_body() {
        // Goal: a hostile length is refused from the first four bytes alone.
        assert_eq!(
            decode_frame(&3u32.to_le_bytes(), 1024),
            Err(WireError::FrameTooShort {
                frame_len: 3,
                min: 12
            })
        );
        assert_eq!(
            decode_frame(&u32::MAX.to_le_bytes(), 1024),
            Err(WireError::FrameTooLarge {
                frame_len: u32::MAX,
                max: 1024
            })
        );
    }
}

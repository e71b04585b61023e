//! A blocking bookie connection over any byte stream (plain TCP, or rustls' `StreamOwned` over
//! TCP): the handshake of docs/protocol.md §2 (version 1, or version 2 with the cluster secret's
//! challenge-response, checking the bookie's proof), then requests and their answer frames.
//! It serves the admin commands (`quire bookie info`) and the tests; the ledger client has its
//! own pipelined async connection (proxy/ledger).
//!
//! Timeouts are the stream's: set `set_read_timeout` on the `TcpStream` before wrapping it.

use std::io::{self, Read, Write};

use crate::auth::{new_nonce, ClusterSecret, SecretError};
use crate::bookie::{
    decode_response, encode_request, Request, Response, Status, PROTOCOL_VERSION_AUTH,
};
use crate::frame::{decode_frame, Frame};
use crate::WireError;

/// Largest answer frame a [`BookieConnection`] accepts unless told otherwise, in bytes.
pub const ANSWER_SIZE_BYTES_MAX_DEFAULT: u32 = 64 << 20;

/// What can go wrong on a blocking bookie connection.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("bookie connection: {0}")]
    Io(#[from] io::Error),
    #[error("bookie sent a bad frame: {0}")]
    Wire(#[from] WireError),
    #[error("bookie closed the connection")]
    Closed,
    #[error("bookie refused the {what} ({status:?}): {message}")]
    Refused {
        what: &'static str,
        status: Status,
        message: String,
    },
    #[error("bookie answered the {what} with {answer}")]
    Unexpected { what: &'static str, answer: String },
    #[error("the bookie's proof of the cluster secret does not match")]
    BadProof,
    #[error("cluster secret handshake: {0}")]
    Secret(#[from] SecretError),
}

/// One answer frame, owned; decode it with [`AnswerFrame::response`] or, for the long-poll and
/// bookie-info answers with their own layouts, with the decoders of [`crate::bookie`] on
/// [`AnswerFrame::frame`].
#[derive(Debug, Clone)]
pub struct AnswerFrame {
    bytes: Vec<u8>,
}

impl AnswerFrame {
    /// The frame (header and body), borrowed.
    pub fn frame(&self) -> Frame<'_> {
        decode_frame(&self.bytes, u32::MAX)
            .ok()
            .flatten()
            .map(|(f, _)| f)
            .expect("an AnswerFrame holds one whole frame that decoded once")
    }

    /// The request id the answer carries.
    pub fn request_id(&self) -> u64 {
        self.frame().header.request_id
    }

    /// The answer decoded as a [`Response`].
    ///
    /// # Errors
    /// Those of [`decode_response`].
    pub fn response(&self) -> Result<Response<'_>, WireError> {
        decode_response(&self.frame())
    }
}

/// A blocking connection to one bookie. Requests get ids 1, 2, ... in the order sent.
#[derive(Debug)]
pub struct BookieConnection<S> {
    stream: S,
    buf: Vec<u8>,
    next_id: u64,
    answer_size_bytes_max: u32,
}

impl<S: Read + Write> BookieConnection<S> {
    /// Wraps a connected stream; nothing is sent yet.
    pub fn new(stream: S) -> Self {
        Self {
            stream,
            buf: Vec::new(),
            next_id: 1,
            answer_size_bytes_max: ANSWER_SIZE_BYTES_MAX_DEFAULT,
        }
    }

    /// Wraps `stream` and passes the handshake: version 1 without a secret, version 2 (Hello,
    /// then Auth, checking the bookie's proof) with one.
    ///
    /// # Errors
    /// As [`BookieConnection::handshake`].
    pub fn connect(stream: S, secret: Option<&ClusterSecret>) -> Result<Self, ConnectionError> {
        let mut c = Self::new(stream);
        c.handshake(secret)?;
        Ok(c)
    }

    /// The handshake of docs/protocol.md §2. A bookie with a cluster secret speaks only
    /// version 2, one without only version 1.
    ///
    /// # Errors
    /// `Refused` with the bookie's status (e.g. `BadVersion`, `Unauthorized`), `BadProof` if
    /// the bookie does not prove the same secret, `Unexpected`, `Io`, `Wire`, `Closed`.
    pub fn handshake(&mut self, secret: Option<&ClusterSecret>) -> Result<(), ConnectionError> {
        let version = if secret.is_some() {
            PROTOCOL_VERSION_AUTH
        } else {
            1
        };
        let hello = self.call(&Request::Hello {
            version_min: version,
            version_max: version,
        })?;
        let server_nonce = match hello.response()? {
            Response::Hello { auth_nonce, .. } => auth_nonce,
            other => return Err(refused_or_unexpected("handshake", other)),
        };
        let Some(secret) = secret else {
            return Ok(());
        };
        let Some(server_nonce) = server_nonce else {
            return Err(ConnectionError::Unexpected {
                what: "handshake",
                answer: "a Hello without the nonce of the cluster-secret handshake".into(),
            });
        };
        let client_nonce = new_nonce()?;
        let auth = self.call(&Request::Auth {
            client_nonce,
            proof: secret.client_proof(&server_nonce, &client_nonce),
        })?;
        match auth.response()? {
            Response::Auth { proof } => {
                if secret.verify_bookie_proof(&server_nonce, &client_nonce, &proof) {
                    Ok(())
                } else {
                    Err(ConnectionError::BadProof)
                }
            }
            other => Err(refused_or_unexpected("cluster secret proof", other)),
        }
    }

    /// Sends `request` and waits for the next answer frame (requests answered in order: send
    /// one at a time, or use [`BookieConnection::send`] and [`BookieConnection::recv`]).
    ///
    /// # Errors
    /// `Io`, `Wire`, `Closed`.
    pub fn call(&mut self, request: &Request<'_>) -> Result<AnswerFrame, ConnectionError> {
        self.send(request)?;
        self.recv()?.ok_or(ConnectionError::Closed)
    }

    /// Sends `request` with the next request id, which it returns.
    ///
    /// # Errors
    /// `Io`.
    pub fn send(&mut self, request: &Request<'_>) -> Result<u64, ConnectionError> {
        let id = self.send_all(std::slice::from_ref(request))?;
        Ok(id)
    }

    /// Sends every request of `requests` in one write, with consecutive ids from the returned
    /// one; their answers may come in any order (match them by [`AnswerFrame::request_id`]).
    ///
    /// # Errors
    /// `Io`.
    pub fn send_all(&mut self, requests: &[Request<'_>]) -> Result<u64, ConnectionError> {
        let first = self.next_id;
        let mut out = Vec::new();
        for r in requests {
            encode_request(&mut out, self.next_id, r);
            self.next_id += 1;
        }
        self.stream.write_all(&out)?;
        self.stream.flush()?;
        Ok(first)
    }

    /// Receives the next answer frame; `None` when the bookie closed the connection (EOF or
    /// reset) between frames.
    ///
    /// # Errors
    /// `Io` (a read timeout included), `Wire` for a frame that does not decode, `Closed` when
    /// the connection ends inside a frame.
    pub fn recv(&mut self) -> Result<Option<AnswerFrame>, ConnectionError> {
        loop {
            if let Some((_, used)) = decode_frame(&self.buf, self.answer_size_bytes_max)? {
                let bytes: Vec<u8> = self.buf.drain(..used).collect();
                return Ok(Some(AnswerFrame { bytes }));
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = match self.stream.read(&mut chunk) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => 0,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(ConnectionError::Closed)
                };
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The stream, to send raw bytes (tests of bad input) or set options.
    pub fn stream_mut(&mut self) -> &mut S {
        &mut self.stream
    }
}

fn refused_or_unexpected(what: &'static str, answer: Response<'_>) -> ConnectionError {
    match answer {
        Response::Failed {
            status, message, ..
        } => ConnectionError::Refused {
            what,
            status,
            message: message.to_string(),
        },
        other => ConnectionError::Unexpected {
            what,
            answer: format!("{other:?}"),
        },
    }
}

//! Raw proxy-protocol connections (docs/proxy-protocol.md) for the tests that look at frames,
//! request ids and closes themselves, below `ProxyClient`: the Hello frame, a connection that
//! decodes answer frames from a buffer kept between reads, and one-request calls. Every wait
//! is bounded by [`BOUND`], so a broken server fails the test instead of hanging it.

use std::net::SocketAddr;
use std::time::Duration;

use quire_client::protocol::{Request, Response, Token};
use quire_wire::frame::decode_frame;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest any single observation may take before a test calls the server broken.
pub const BOUND: Duration = Duration::from_secs(20);

/// Largest frame these tests decode (the proxy's default frame limit is below it).
const FRAME_BYTES_MAX: u32 = 8 << 20;

/// `req` encoded as one frame with `request_id`.
pub fn frame(request_id: u64, req: &Request) -> Vec<u8> {
    let mut out = Vec::new();
    req.encode(request_id, &mut out);
    out
}

/// The Hello request (request id 1, protocol version 1) with `token`, if any.
pub fn hello_with(token: Option<&[u8]>) -> Vec<u8> {
    frame(
        1,
        &Request::Hello {
            version_min: 1,
            version_max: 1,
            token: token.map(|t| Token(t.to_vec())),
        },
    )
}

/// The Hello request (request id 1, protocol version 1) without a token.
pub fn hello() -> Vec<u8> {
    hello_with(None)
}

/// One raw connection (or the read half of one): `(request id, answer)` frames decoded from
/// what it receives, bytes past a frame kept for the next one.
pub struct Raw<S = TcpStream> {
    pub s: S,
    buf: Vec<u8>,
}

impl Raw<TcpStream> {
    /// Connects to `addr` without sending anything.
    pub async fn connect(addr: SocketAddr) -> Raw {
        Raw::new(TcpStream::connect(addr).await.unwrap())
    }

    /// Connects to `addr` and completes the handshake ([`hello`]; the answer must be Hello).
    pub async fn greeted(addr: SocketAddr) -> Raw {
        let mut raw = Raw::connect(addr).await;
        raw.send(&hello()).await.unwrap();
        match raw.next().await {
            Some((_, Response::Hello { .. })) => raw,
            other => panic!("expected the Hello answer, got {other:?}"),
        }
    }
}

impl<S> Raw<S> {
    pub fn new(s: S) -> Raw<S> {
        Raw { s, buf: Vec::new() }
    }
}

impl<S: AsyncWrite + Unpin> Raw<S> {
    /// Writes `bytes` (any number of frames, or part of one) at once.
    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.s.write_all(bytes).await
    }
}

impl<S: AsyncRead + Unpin> Raw<S> {
    /// The next answer frame; `None` once the server closed or reset the connection. Panics if
    /// nothing arrives within [`BOUND`] or a frame does not decode.
    pub async fn next(&mut self) -> Option<(u64, Response)> {
        self.next_within(BOUND).await.unwrap_or_else(|_| {
            panic!("the server sent no frame and kept the connection open for {BOUND:?}")
        })
    }

    /// As [`Raw::next`], but `Err` when no whole frame arrives within `quiet`.
    pub async fn next_within(
        &mut self,
        quiet: Duration,
    ) -> Result<Option<(u64, Response)>, tokio::time::error::Elapsed> {
        let deadline = tokio::time::Instant::now() + quiet;
        loop {
            if let Some((f, used)) = decode_frame(&self.buf, FRAME_BYTES_MAX).unwrap() {
                let answer = (f.header.request_id, Response::decode(&f).unwrap());
                self.buf.drain(..used);
                return Ok(Some(answer));
            }
            let mut chunk = [0u8; 4096];
            match tokio::time::timeout_at(deadline, self.s.read(&mut chunk)).await? {
                Ok(0) | Err(_) => return Ok(None),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Every frame until the server closes the connection (a reset also ends it: what was not
    /// read by then is lost). Panics if it stays open and quiet for [`BOUND`].
    pub async fn until_closed(&mut self) -> Vec<(u64, Response)> {
        let mut out = Vec::new();
        loop {
            match self.next_within(BOUND).await {
                Ok(Some(f)) => out.push(f),
                Ok(None) => return out,
                Err(_) => panic!(
                    "the server kept the connection open for {BOUND:?}; frames so far: {out:?}"
                ),
            }
        }
    }

    /// The next `n` frames; panics if the connection closes first.
    pub async fn take(&mut self, n: usize) -> Vec<(u64, Response)> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            match self.next().await {
                Some(f) => out.push(f),
                None => panic!("the server closed the connection after {out:?}"),
            }
        }
        out
    }
}

/// Sends the Hello and `req` (request id 2) in one write on a fresh connection and returns the
/// answer to `req`.
pub async fn call(addr: SocketAddr, req: &Request) -> Response {
    let mut raw = Raw::connect(addr).await;
    let mut out = hello();
    req.encode(2, &mut out);
    raw.send(&out).await.unwrap();
    let mut answers = raw.take(2).await;
    assert!(
        matches!(answers[0].1, Response::Hello { .. }),
        "{answers:?}"
    );
    let (id, answer) = answers.pop().unwrap();
    assert_eq!(id, 2, "{answer:?}");
    answer
}

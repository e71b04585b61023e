//! Goal: the connection to a stream's owner outlives one request's timeout (other requests
//! keep using it; at 10,000 streams a join made clients open thousands of connections to the
//! joining proxy when each timeout dropped one), and a connection the owner closed is
//! replaced by a new one. Method: two small proxies on real TCP (127.0.0.1) speaking the
//! proxy protocol: a home one that redirects every stream request to an owner one, which
//! answers `CREATE_STREAM` at once except for the stream "stuck" (never answered) and closes
//! its connections on demand; the owner counts the connections it accepted.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quire_wire::frame::{RecvBuffer, FRAME_SIZE_BYTES_MAX_DEFAULT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::Router;
use crate::config::ClientConfig;
use crate::error::{Error, ErrorCode};
use crate::protocol::{Request, Response, PROXY_PROTOCOL_VERSION_MAX};

/// How a test proxy answers a request other than the handshake: `None` leaves it unanswered.
type Answer = fn(&Request) -> Option<Response>;

/// A test proxy on 127.0.0.1: its address, the connections it accepted, and a sender that
/// closes every connection open when bumped.
struct TestProxy {
    addr: String,
    accepted: Arc<AtomicUsize>,
    close: watch::Sender<u32>,
}

async fn start(answer: Answer) -> TestProxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let (close, closed) = watch::channel(0u32);
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            count.fetch_add(1, Ordering::SeqCst);
            let mut closed = closed.clone();
            closed.mark_unchanged();
            tokio::spawn(async move {
                tokio::select! {
                    _ = serve(sock, answer) => {}
                    _ = closed.changed() => {} // drops the socket: the client sees EOF
                }
            });
        }
    });
    TestProxy {
        addr,
        accepted,
        close,
    }
}

/// One connection: the handshake, then each request answered as `answer` says.
async fn serve(mut sock: TcpStream, answer: Answer) {
    let mut buf = RecvBuffer::new();
    loop {
        let mut out = Vec::new();
        while let Some(frame) = buf.next_frame(FRAME_SIZE_BYTES_MAX_DEFAULT).unwrap() {
            let req = Request::decode(&frame).unwrap();
            let opcode = frame.header.opcode;
            let id = frame.header.request_id;
            let resp = match req {
                Request::Hello { .. } => Some(Response::Hello {
                    version: PROXY_PROTOCOL_VERSION_MAX,
                    frame_size_bytes_max: FRAME_SIZE_BYTES_MAX_DEFAULT,
                    record_size_bytes_max: 1024 * 1024,
                }),
                other => answer(&other),
            };
            if let Some(resp) = resp {
                resp.encode(opcode, id, &mut out);
            }
        }
        if !out.is_empty() && sock.write_all(&out).await.is_err() {
            return;
        }
        let mut chunk = [0u8; 4096];
        match sock.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.for_read(1 << 20).extend_from_slice(&chunk[..n]),
        }
    }
}

fn create(stream: &str) -> Request {
    Request::CreateStream {
        stream: stream.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_keeps_the_owner_connection_and_a_closed_one_is_replaced() {
    let owner = start(|req| match req {
        Request::CreateStream { stream } if stream == "stuck" => None,
        _ => Some(Response::CreateStream),
    })
    .await;
    // The home proxy sends every stream to the owner, whose address it must know: leak it
    // into a static the plain-fn answer can read.
    static OWNER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    OWNER.set(owner.addr.clone()).unwrap();
    let home = start(|_| {
        Some(Response::Error {
            code: ErrorCode::StreamOwnedElsewhere,
            message: OWNER.get().unwrap().clone(),
        })
    })
    .await;
    let config = ClientConfig {
        request_timeout: Duration::from_millis(500),
        ..ClientConfig::default()
    };
    let router = Router::connect(home.addr.as_str(), config).await.unwrap();
    let wait = Duration::ZERO;

    router.call_stream("a", &create("a"), wait).await.unwrap();
    assert_eq!(owner.accepted.load(Ordering::SeqCst), 1);

    // One request times out at the owner, while the connection is fine.
    let e = router
        .call_stream("stuck", &create("stuck"), wait)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::TimedOut),
        "{e:?}"
    );
    // The next requests, for this stream (routed afresh through home) and another, go over
    // the same connection.
    router.call_stream("b", &create("b"), wait).await.unwrap();
    router.call_stream("a", &create("a"), wait).await.unwrap();
    assert_eq!(
        owner.accepted.load(Ordering::SeqCst),
        1,
        "a request's timeout must not drop the connection other requests use"
    );

    // The owner closes its connections: the first request after that may fail (it may have
    // been sent when the close came), but the connection is replaced by a new one.
    owner.close.send_modify(|n| *n += 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut ok = false;
    for _ in 0..3 {
        if router.call_stream("a", &create("a"), wait).await.is_ok() {
            ok = true;
            break;
        }
    }
    assert!(
        ok,
        "no request succeeded after the owner closed its connection"
    );
    assert_eq!(owner.accepted.load(Ordering::SeqCst), 2);
    // And that new connection is kept too.
    router.call_stream("b", &create("b"), wait).await.unwrap();
    assert_eq!(owner.accepted.load(Ordering::SeqCst), 2);
    drop(home);
}

//! The `--metrics-listen ADDR` endpoint of `quire bookie`, `quire proxy` and `quire sandbox`:
//! `GET /metrics` answers the registry in the OpenMetrics text format (which Prometheus
//! scrapes), encoded by `prometheus-client`; `GET /healthz` answers `200 ok` while the process
//! serves and `503` before it serves (replay, registration) and once it is stopping.
//!
//! It runs beside the data path, not in it: hyper's HTTP/1.1 server on a one-thread tokio
//! runtime of its own, serving connections concurrently, so that one slow or idle client
//! cannot keep health checks waiting (issue 24). Each connection must send a whole request head
//! within [`HEADER_READ_TIMEOUT`] (also the longest a kept-alive connection may sit idle), may
//! stay at most [`CONNECTION_LIFETIME_MAX`] in all, and at most [`CONNECTIONS_MAX`] are open
//! at once (beyond that a new one is closed at once).

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::registry::Registry;

/// Longest request head (request line and headers) read; a longer one gets `431`.
pub const REQUEST_HEAD_BYTES_MAX: usize = 8 * 1024;
/// A connection that does not send a whole request head within this (from its start, or from
/// its previous answer when kept alive) is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a connection stays open, whatever it does (a client that does not read its answer).
pub const CONNECTION_LIFETIME_MAX: Duration = Duration::from_secs(60);
/// Most connections open at once; more are closed as they are accepted.
pub const CONNECTIONS_MAX: usize = 256;
/// Content type of `/metrics` (what `prometheus-client`'s text encoder writes).
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the endpoint serves: the registry (filled as parts start) and the health flag.
#[derive(Clone, Default)]
pub struct Exposition {
    /// Metrics to encode on each scrape. Parts register into it while the endpoint runs.
    pub registry: Arc<Mutex<Registry>>,
    /// `/healthz` answers 200 while this is true.
    pub serving: Arc<AtomicBool>,
}

impl Exposition {
    /// Sets what `/healthz` answers: 200 while `serving`, else 503.
    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Release);
    }

    /// Registers metrics: `f` gets the registry.
    pub fn register(&self, f: impl FnOnce(&mut Registry)) {
        let mut r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut r);
    }
}

/// Binds `listen` and serves `exposition` from a background thread (its own one-thread tokio
/// runtime) for the life of the process. Returns the bound address (port 0 picks a free one).
/// Adds the process metrics and build information ([`crate::process_metrics`]) to the
/// registry.
///
/// # Errors
/// The address cannot be bound, or the thread cannot start.
pub fn start(listen: SocketAddr, exposition: Exposition) -> Result<SocketAddr> {
    let listener = TcpListener::bind(listen)
        .with_context(|| format!("cannot listen for metrics on {listen}"))?;
    exposition.register(|r| {
        r.register_collector(Box::new(crate::process_metrics::ProcessCollector));
    });
    let addr = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the metrics runtime")?;
    std::thread::Builder::new()
        .name("quire-metrics-http".into())
        .spawn(move || runtime.block_on(serve(listener, exposition)))
        .context("cannot start the metrics thread")?;
    Ok(addr)
}

/// Accepts connections and serves each in its own task.
async fn serve(listener: TcpListener, exposition: Exposition) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "metrics endpoint cannot use its socket");
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_header_size(REQUEST_HEAD_BYTES_MAX)
        .keep_alive(true);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, limit = CONNECTIONS_MAX, "metrics endpoint: closing a connection over the limit");
            continue;
        };
        let exposition = exposition.clone();
        let conn = http.serve_connection(
            hyper_util::rt::TokioIo::new(stream),
            hyper::service::service_fn(move |req| {
                let answer = answer(&req, &exposition);
                async move { Ok::<_, Infallible>(answer) }
            }),
        );
        tokio::spawn(async move {
            match tokio::time::timeout(CONNECTION_LIFETIME_MAX, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics connection failed"),
                Err(_) => tracing::debug!(%peer, "metrics connection closed at its lifetime limit"),
            }
            drop(slot);
        });
    }
}

/// The answer to one request.
fn answer(req: &Request<Incoming>, exposition: &Exposition) -> Response<Full<Bytes>> {
    let (status, content_type, body) = route(req.method(), req.uri().path(), exposition);
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// (status, content type, body) of a request for `path` (the query string does not select
/// anything: Prometheus may add one).
fn route(
    method: &Method,
    path: &str,
    exposition: &Exposition,
) -> (StatusCode, &'static str, String) {
    if method != Method::GET {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET is served\n".into(),
        );
    }
    match path {
        "/metrics" => {
            let mut out = String::new();
            let registry = exposition
                .registry
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match prometheus_client::encoding::text::encode(&mut out, &registry) {
                Ok(()) => (StatusCode::OK, OPENMETRICS_CONTENT_TYPE, out),
                Err(e) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    format!("encoding failed: {e}\n"),
                ),
            }
        }
        "/healthz" => {
            if exposition.serving.load(Ordering::Acquire) {
                (StatusCode::OK, "text/plain", "ok\n".into())
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "not serving\n".into(),
                )
            }
        }
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "try /metrics or /healthz\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    //! Goal: the endpoint answers both paths over real TCP, follows the health flag, and
    //! refuses other methods, paths and oversized heads. Method: a real listener on 127.0.0.1:0
    //! and raw HTTP/1.1 requests.

    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    /// Sends `request` and reads the answer: its head, then `Content-Length` bytes of body.
    fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request).unwrap();
        let mut out = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&out).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let len = text[..end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length: ")
                            .map(|v| v.trim().parse::<usize>().unwrap())
                    })
                    .unwrap_or(0);
                if out.len() >= end + 4 + len {
                    return text;
                }
            }
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return String::from_utf8_lossy(&out).to_string(),
                Ok(n) => out.extend_from_slice(&chunk[..n]),
            }
        }
    }

    #[test]
    fn serves_metrics_and_health() {
        let exposition = Exposition::default();
        let counter = Counter::<u64>::default();
        exposition.register(|r| r.register("test_things", "Things", counter.clone()));
        counter.inc_by(3);
        let addr = start("127.0.0.1:0".parse().unwrap(), exposition.clone()).unwrap();

        let health = get(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(health.starts_with("HTTP/1.1 503 "), "{health}");
        exposition.set_serving(true);
        let health = get(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(health.starts_with("HTTP/1.1 200 OK"), "{health}");
        assert!(health.ends_with("\r\n\r\nok\n"), "{health}");

        let metrics = get(addr, b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(metrics.starts_with("HTTP/1.1 200 OK"), "{metrics}");
        assert!(metrics.contains(OPENMETRICS_CONTENT_TYPE));
        assert!(metrics.contains("\ntest_things_total 3\n"), "{metrics}");
        assert!(metrics.contains("\nprocess_open_fds "), "{metrics}");
        assert!(
            metrics.contains("\nquire_build_info{version=\""),
            "{metrics}"
        );
        assert!(metrics.ends_with("# EOF\n"), "{metrics}");

        assert!(get(addr, b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
        assert!(get(addr, b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        let mut huge = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        huge.extend(std::iter::repeat_n(b'a', REQUEST_HEAD_BYTES_MAX + 10));
        assert!(get(addr, &huge).starts_with("HTTP/1.1 431 "));
        exposition.set_serving(false);
        assert!(get(addr, b"GET /healthz HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 503 "));
    }

    #[test]
    fn healthz_answers_beside_idle_and_slow_loris_connections() {
        // Issue 24 item 6. Goal: 50 connections that send nothing and one that trickles its
        // request head a byte at a time do not delay a health check: each of 5 checks is
        // answered within 1 s; the idle ones are closed after the header timeout.
        let exposition = Exposition::default();
        exposition.set_serving(true);
        let addr = start("127.0.0.1:0".parse().unwrap(), exposition).unwrap();
        let idle: Vec<TcpStream> = (0..50).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let mut slow = TcpStream::connect(addr).unwrap();
        slow.write_all(b"GET /met").unwrap();
        let loris = std::thread::spawn(move || {
            for b in b"rics HTTP/1.1\r\n".iter().take(3) {
                std::thread::sleep(Duration::from_millis(300));
                if slow.write_all(&[*b]).is_err() {
                    break;
                }
            }
            slow
        });
        for _ in 0..5 {
            let asked = quire_clock::now();
            let health = get(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
            let took = quire_clock::elapsed(asked);
            assert!(health.starts_with("HTTP/1.1 200 OK"), "{health}");
            assert!(
                took < Duration::from_secs(1),
                "/healthz took {took:?} beside idle and slow connections"
            );
        }
        let _slow = loris.join().unwrap();
        // The idle connections are closed by the header timeout, not held for ever.
        let mut first = idle.into_iter().next().unwrap();
        first
            .set_read_timeout(Some(HEADER_READ_TIMEOUT + Duration::from_secs(5)))
            .unwrap();
        let mut byte = [0u8; 1];
        let closed = matches!(first.read(&mut byte), Ok(0) | Err(_));
        assert!(closed, "an idle connection outlived the header timeout");
    }
}

//! The `--metrics-listen ADDR` endpoint of `quire bookie`, `quire proxy` and `quire sandbox`:
//! `GET /metrics` answers the registry in the OpenMetrics text format (which Prometheus
//! scrapes), encoded by `prometheus-client`; `GET /healthz` answers `200 ok` while the process
//! serves and `503` before it serves (replay, registration) and once it is stopping.
//!
//! Two GET paths need no HTTP framework: one std thread accepts and answers each connection in
//! turn (scrapes are rare and small), reading at most [`REQUEST_HEAD_BYTES_MAX`] bytes of
//! request head with a timeout, then closes the connection (`Connection: close`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use prometheus_client::registry::Registry;

/// Longest request head (request line and headers) read; a longer one gets `431`.
pub const REQUEST_HEAD_BYTES_MAX: usize = 8 * 1024;
/// A client that does not send its whole request head within this time is dropped.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(5);
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

/// Binds `listen` and serves `exposition` from a background thread for the life of the
/// process. Returns the bound address (port 0 picks a free one).
///
/// # Errors
/// The address cannot be bound.
pub fn start(listen: SocketAddr, exposition: Exposition) -> Result<SocketAddr> {
    let listener = TcpListener::bind(listen)
        .with_context(|| format!("cannot listen for metrics on {listen}"))?;
    let addr = listener.local_addr()?;
    std::thread::Builder::new()
        .name("quire-metrics-http".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(stream) => {
                        if let Err(e) = answer(stream, &exposition) {
                            tracing::debug!(error = %e, "metrics request failed");
                        }
                    }
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "metrics accept failed");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })
        .context("cannot start the metrics thread")?;
    Ok(addr)
}

/// Reads one request head and answers it.
fn answer(mut stream: TcpStream, exposition: &Exposition) -> std::io::Result<()> {
    stream.set_read_timeout(Some(REQUEST_READ_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_READ_TIMEOUT))?;
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let complete = loop {
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            break true;
        }
        if head.len() > REQUEST_HEAD_BYTES_MAX {
            break false;
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&chunk[..n]);
    };
    let (status, content_type, body) = if !complete {
        (
            "431 Request Header Fields Too Large",
            "text/plain",
            "request head too large\n".to_string(),
        )
    } else {
        route(&head, exposition)
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(response.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

/// The answer to a complete request head: (status line, content type, body).
fn route(head: &[u8], exposition: &Exposition) -> (&'static str, &'static str, String) {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    // The query string (Prometheus may add one) does not select anything here.
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" {
        return (
            "405 Method Not Allowed",
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
                Ok(()) => ("200 OK", OPENMETRICS_CONTENT_TYPE, out),
                Err(e) => (
                    "500 Internal Server Error",
                    "text/plain",
                    format!("encoding failed: {e}\n"),
                ),
            }
        }
        "/healthz" => {
            if exposition.serving.load(Ordering::Acquire) {
                ("200 OK", "text/plain", "ok\n".into())
            } else {
                (
                    "503 Service Unavailable",
                    "text/plain",
                    "not serving\n".into(),
                )
            }
        }
        _ => (
            "404 Not Found",
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

    fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
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
        assert!(metrics.ends_with("# EOF\n"), "{metrics}");

        assert!(get(addr, b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
        assert!(get(addr, b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        let mut huge = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        huge.extend(std::iter::repeat_n(b'a', REQUEST_HEAD_BYTES_MAX + 10));
        assert!(get(addr, &huge).starts_with("HTTP/1.1 431 "));
        exposition.set_serving(false);
        assert!(get(addr, b"GET /healthz HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 503 "));
    }
}

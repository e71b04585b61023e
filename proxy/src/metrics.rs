//! The proxy's Prometheus metrics (docs/metrics.md is the reference an operator reads).
//!
//! Names (OpenMetrics; counters get `_total` appended by the encoder):
//! * `quire_proxy_requests{op}`: requests answered, by operation (every operation's series
//!   exists from the start, at 0).
//! * `quire_proxy_request_errors{op,code}`: requests answered with an error; `code` is the
//!   documented name of the status (docs/proxy-protocol.md, "Errors": `STORAGE_ERROR`,
//!   `NO_SUCH_STREAM`, ...). Redirects are not errors (below). The series of the common
//!   failures of writes and reads ([`ZERO_ERROR_CODES`]) exist from the start, at 0, so that
//!   a rate over them reads 0 on a healthy proxy rather than "no data".
//! * `quire_proxy_redirects{op}`: requests answered `STREAM_OWNED_ELSEWHERE` (302), the normal
//!   answer of a proxy that does not own the stream (DistributedLog's `FOUND`).
//! * `quire_proxy_write_latency`, `quire_proxy_read_latency`, `quire_proxy_read_wait_latency`
//!   (histograms, seconds, from the request frame read to its answer queued for the
//!   connection): a read that found something to answer at once (records, the end of the
//!   stream or an error) is in `read_latency`; a read that had to wait for a write (a tail
//!   read's long poll, up to its `wait_ms`) is in `read_wait_latency`.
//! * `quire_proxy_bytes_in`, `quire_proxy_bytes_out`: record payload bytes written, read.
//! * `quire_proxy_auth_failures{reason}`, `quire_proxy_connections_refused{reason}` (every
//!   reason's series at 0 from the start), `quire_proxy_connections_open` (gauge),
//!   `quire_proxy_connections_accepted`.
//! * Per stream ([`crate::stream_metrics`]): `quire_proxy_stream_records{stream}`,
//!   `quire_proxy_stream_bytes{stream}`, `quire_proxy_stream_last_write_seconds{stream}`,
//!   `quire_proxy_stream_segments{stream}`.
//! * `quire_proxy_streams_owned`, sampled at scrape time from the [`StreamManager`], and
//!   `quire_proxy_streams_refused` (acquisitions refused at `owned_streams_max`),
//!   `quire_proxy_acquisitions_under_way` and `quire_proxy_acquisitions`.
//!
//! Adding a metric: a field here, made in [`ProxyMetrics::new`], registered in
//! [`ProxyMetrics::register`], recorded where its event happens (server.rs), and a line in
//! docs/metrics.md.
//!
//! # Threading
//! `Send + Sync`; recording is atomics (counters) or one short lock per histogram.

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use crate::error::ErrorCode;
use crate::protocol::{Opcode, Response};
use crate::stream::StreamManager;
use crate::stream_metrics::StreamSeries;

/// The error codes whose `quire_proxy_request_errors{op,code}` series are made at start (at
/// 0) for writes and reads: what an alert on the error rate of a healthy cluster looks at.
pub const ZERO_ERROR_CODES: [ErrorCode; 6] = [
    ErrorCode::Storage,
    ErrorCode::OwnershipLost,
    ErrorCode::Metadata,
    ErrorCode::Internal,
    ErrorCode::ServiceUnavailable,
    ErrorCode::RequestDenied,
];

/// Every `reason` of `quire_proxy_connections_refused`.
const REFUSAL_REASONS: [&str; 5] = [
    "per_address_limit",
    "auth_failures",
    "connection_limit",
    "handshake_evicted",
    "not_reading",
];

/// Every `reason` of `quire_proxy_auth_failures`.
const AUTH_FAILURE_REASONS: [&str; 2] = ["missing_token", "unknown_token"];

/// Every opcode a client may send, for the `op` series made at start.
const OPCODES: [Opcode; 18] = [
    Opcode::Hello,
    Opcode::CreateStream,
    Opcode::ListStreams,
    Opcode::Write,
    Opcode::Read,
    Opcode::DescribeStream,
    Opcode::TruncateStream,
    Opcode::DeleteStream,
    Opcode::SetRetention,
    Opcode::SealStream,
    Opcode::OpenProducerSession,
    Opcode::CommitSubscription,
    Opcode::GetSubscription,
    Opcode::ListSubscriptions,
    Opcode::DeleteSubscription,
    Opcode::SetCompression,
    Opcode::SetLimits,
    Opcode::SetPlacement,
];

/// Upper bounds of the latency buckets, in seconds (the bookie's, so panels line up).
const LATENCY_BUCKETS_SECONDS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// The proxy's metrics; see the module documentation for names and meanings.
#[derive(Debug)]
pub struct ProxyMetrics {
    requests: Family<OpLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    redirects: Family<OpLabels, Counter>,
    write_latency: Histogram,
    read_latency: Histogram,
    read_wait_latency: Histogram,
    bytes_in: Counter,
    bytes_out: Counter,
    auth_failures: Family<ReasonLabels, Counter>,
    connections_refused: Family<ReasonLabels, Counter>,
    connections_open: Gauge,
    connections_accepted: Counter,
    streams: StreamSeries,
    limit_refused: Family<LimitLabels, Counter>,
    limit_soft_exceeded: Family<LimitLabels, Counter>,
}

/// The labels of the limit counters: `scope` (proxy, stream, token) and `kind` (records,
/// bytes, outstanding).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    scope: &'static str,
    kind: &'static str,
}

/// The `reason` label of refusals.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// The `op` label: the request's opcode name in lower case.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

/// The labels of an error answer: the operation and the error code's documented name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    op: &'static str,
    code: &'static str,
}

/// The `op` label of a request opcode byte.
fn op_name(opcode: u8) -> &'static str {
    match Opcode::from_u8(opcode) {
        Ok(Opcode::Hello) => "hello",
        Ok(Opcode::CreateStream) => "create_stream",
        Ok(Opcode::ListStreams) => "list_streams",
        Ok(Opcode::Write) => "write",
        Ok(Opcode::Read) => "read",
        Ok(Opcode::DescribeStream) => "describe_stream",
        Ok(Opcode::TruncateStream) => "truncate_stream",
        Ok(Opcode::DeleteStream) => "delete_stream",
        Ok(Opcode::SetRetention) => "set_retention",
        Ok(Opcode::SealStream) => "seal_stream",
        Ok(Opcode::OpenProducerSession) => "open_producer_session",
        Ok(Opcode::CommitSubscription) => "commit_subscription",
        Ok(Opcode::GetSubscription) => "get_subscription",
        Ok(Opcode::ListSubscriptions) => "list_subscriptions",
        Ok(Opcode::DeleteSubscription) => "delete_subscription",
        Ok(Opcode::SetCompression) => "set_compression",
        Ok(Opcode::SetLimits) => "set_limits",
        Ok(Opcode::SetPlacement) => "set_placement",
        Err(_) => "unknown",
    }
}

/// Decrements `quire_proxy_connections_open` when the connection it was taken for ends.
#[derive(Debug)]
pub(crate) struct OpenConnection(Gauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl ProxyMetrics {
    /// Fresh metrics, all zero, with the series listed in the module documentation made.
    pub fn new() -> Arc<Self> {
        let m = Self {
            requests: Family::default(),
            errors: Family::default(),
            redirects: Family::default(),
            write_latency: Histogram::new(LATENCY_BUCKETS_SECONDS),
            read_latency: Histogram::new(LATENCY_BUCKETS_SECONDS),
            read_wait_latency: Histogram::new(LATENCY_BUCKETS_SECONDS),
            bytes_in: Counter::default(),
            bytes_out: Counter::default(),
            auth_failures: Family::default(),
            connections_refused: Family::default(),
            connections_open: Gauge::default(),
            connections_accepted: Counter::default(),
            streams: StreamSeries::default(),
            limit_refused: Family::default(),
            limit_soft_exceeded: Family::default(),
        };
        m.make_zero_series();
        Arc::new(m)
    }

    /// Makes the series that must be exposed before their first event.
    fn make_zero_series(&self) {
        for opcode in OPCODES {
            let op = op_name(opcode as u8);
            let _ = self.requests.get_or_create(&OpLabels { op });
        }
        for op in ["write", "read"] {
            let _ = self.redirects.get_or_create(&OpLabels { op });
            for code in ZERO_ERROR_CODES {
                let code = code.name();
                let _ = self.errors.get_or_create(&ErrorLabels { op, code });
            }
        }
        for reason in REFUSAL_REASONS {
            let _ = self
                .connections_refused
                .get_or_create(&ReasonLabels { reason });
        }
        for reason in AUTH_FAILURE_REASONS {
            let _ = self.auth_failures.get_or_create(&ReasonLabels { reason });
        }
        for scope in ["proxy", "stream", "token"] {
            for kind in ["records", "bytes", "outstanding"] {
                let _ = self
                    .limit_refused
                    .get_or_create(&LimitLabels { scope, kind });
            }
            for kind in ["records", "bytes"] {
                let _ = self
                    .limit_soft_exceeded
                    .get_or_create(&LimitLabels { scope, kind });
            }
        }
    }

    /// Registers every metric in `registry`; `streams` is sampled for
    /// `quire_proxy_streams_owned` and the per-stream segment counts at each scrape.
    pub fn register(&self, registry: &mut Registry, streams: Arc<StreamManager>) {
        let families: [(&str, &str, &Family<OpLabels, Counter>); 2] = [
            (
                "quire_proxy_requests",
                "Requests answered, by operation",
                &self.requests,
            ),
            (
                "quire_proxy_redirects",
                "Requests answered STREAM_OWNED_ELSEWHERE (302, not an error), by operation",
                &self.redirects,
            ),
        ];
        for (name, help, family) in families {
            registry.register(name, help, family.clone());
        }
        registry.register(
            "quire_proxy_request_errors",
            "Requests answered with an error, by operation and documented error code (redirects excluded)",
            self.errors.clone(),
        );
        let histograms = [
            ("quire_proxy_write_latency", "Seconds from a write request read to its answer queued", &self.write_latency),
            ("quire_proxy_read_latency", "Seconds from a read request read to its answer queued, for reads answered without waiting for a write", &self.read_latency),
            ("quire_proxy_read_wait_latency", "Seconds from a read request read to its answer queued, for reads that waited for a write (long poll)", &self.read_wait_latency),
        ];
        for (name, help, h) in histograms {
            registry.register(name, help, h.clone());
        }
        let counters = [
            (
                "quire_proxy_bytes_in",
                "Record payload bytes received in write requests",
                &self.bytes_in,
            ),
            (
                "quire_proxy_bytes_out",
                "Record payload bytes sent in read answers",
                &self.bytes_out,
            ),
            (
                "quire_proxy_connections_accepted",
                "Connections admitted (past the connection bounds)",
                &self.connections_accepted,
            ),
        ];
        for (name, help, c) in counters {
            registry.register(name, help, c.clone());
        }
        registry.register(
            "quire_proxy_connections_open",
            "Client connections open now",
            self.connections_open.clone(),
        );
        registry.register_collector(streams.metrics_collector());
        registry.register(
            "quire_proxy_auth_failures",
            "Handshakes refused for their token, by reason (missing_token, unknown_token)",
            self.auth_failures.clone(),
        );
        registry.register(
            "quire_proxy_connections_refused",
            "Connections closed by the connection bounds, by reason",
            self.connections_refused.clone(),
        );
        registry.register(
            "quire_proxy_limit_refused",
            "Writes refused OVER_CAPACITY by a hard limit, by scope (proxy, stream, token) and kind (records, bytes, outstanding)",
            self.limit_refused.clone(),
        );
        registry.register(
            "quire_proxy_limit_soft_exceeded",
            "Writes accepted over a soft rate limit, by scope (proxy, stream, token) and kind (records, bytes)",
            self.limit_soft_exceeded.clone(),
        );
        self.streams.register(registry, streams.clone());
        quire_ledger::metrics::metrics().register(registry);
        registry.register_collector(Box::new(StreamsOwned(streams)));
    }

    /// Counts a connection closed by a bound.
    pub(crate) fn refused(&self, reason: &'static str) {
        self.connections_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts a write refused by a hard limit (`OVER_CAPACITY`).
    pub(crate) fn limit_refused(&self, scope: &'static str, kind: &'static str) {
        self.limit_refused
            .get_or_create(&LimitLabels { scope, kind })
            .inc();
    }

    /// Counts a write accepted over a soft limit.
    pub(crate) fn limit_soft_exceeded(&self, scope: &'static str, kind: &'static str) {
        self.limit_soft_exceeded
            .get_or_create(&LimitLabels { scope, kind })
            .inc();
    }

    /// Counts a handshake refused for its token (`missing_token`, `unknown_token`).
    pub(crate) fn auth_failed(&self, reason: &'static str) {
        self.auth_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts an admitted connection; the guard counts it closed when dropped.
    pub(crate) fn connection_opened(&self) -> OpenConnection {
        self.connections_accepted.inc();
        self.connections_open.inc();
        OpenConnection(self.connections_open.clone())
    }

    /// Counts a write's records as submitted to `stream`.
    pub(crate) fn write_submitted(&self, stream: &str, records: &[(u64, Vec<u8>)]) {
        let bytes: usize = records.iter().map(|(_, p)| p.len()).sum();
        self.bytes_in.inc_by(bytes as u64);
        self.streams
            .written(stream, records.len() as u64, bytes as u64);
    }

    /// Records one answered request; `waited`: a read that waited for a write.
    pub(crate) fn record(&self, opcode: u8, received: Instant, resp: &Response, waited: bool) {
        let op = op_name(opcode);
        self.requests.get_or_create(&OpLabels { op }).inc();
        let took = received.elapsed().as_secs_f64();
        match op {
            "write" => self.write_latency.observe(took),
            "read" if waited => self.read_wait_latency.observe(took),
            "read" => self.read_latency.observe(took),
            _ => {}
        }
        match resp {
            Response::Error {
                code: ErrorCode::StreamOwnedElsewhere,
                ..
            } => {
                self.redirects.get_or_create(&OpLabels { op }).inc();
            }
            Response::Error { code, .. } => {
                let code = code.name();
                self.errors.get_or_create(&ErrorLabels { op, code }).inc();
            }
            Response::Read { records, .. } => {
                let bytes: usize = records.iter().map(|(_, _, p)| p.len()).sum();
                self.bytes_out.inc_by(bytes as u64);
            }
            _ => {}
        }
    }
}

tokio::task_local! {
    /// Set by [`mark_read_waiting`] when the read of the request this task answers waited for a
    /// write; read by [`record_answer`].
    static READ_WAITED: Cell<bool>;
}

/// Runs a request's task with the flag [`mark_read_waiting`] sets and [`record_answer`] reads.
pub(crate) fn with_read_flag<F: Future>(task: F) -> impl Future<Output = F::Output> {
    READ_WAITED.scope(Cell::new(false), task)
}

/// Records `resp` in `metrics` if there are metrics, as a waiting read when [`mark_read_waiting`]
/// said so in this task.
pub(crate) fn record_answer(
    metrics: &Option<Arc<ProxyMetrics>>,
    opcode: u8,
    received: Instant,
    resp: &Response,
) {
    if let Some(m) = metrics {
        let waited = READ_WAITED.try_with(Cell::get).unwrap_or(false);
        m.record(opcode, received, resp, waited);
    }
}

/// Marks the read of the request this task answers as a waiting one (a long poll at the
/// tail): the stream reader calls it when nothing is readable and it starts to wait for a
/// write, so the answer's latency goes to `quire_proxy_read_wait_latency`. A no-op outside a
/// task started by [`with_read_flag`].
pub(crate) fn mark_read_waiting() {
    let _ = READ_WAITED.try_with(|w| w.set(true));
}

/// `quire_proxy_streams_owned`, read from the manager at scrape time.
#[derive(Debug)]
struct StreamsOwned(Arc<StreamManager>);

impl Collector for StreamsOwned {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::result::Result<(), std::fmt::Error> {
        let g = ConstGauge::new(self.0.owned_stream_count() as i64);
        g.encode(encoder.encode_descriptor(
            "quire_proxy_streams_owned",
            "Streams this proxy holds the lease of and serves.",
            None,
            g.metric_type(),
        )?)?;
        let g = ConstGauge::new(self.0.acquisitions_under_way());
        g.encode(encoder.encode_descriptor(
            "quire_proxy_acquisitions_under_way",
            "Stream acquisitions (lease, recovery, task start) under way now.",
            None,
            g.metric_type(),
        )?)?;
        let c = ConstCounter::new(self.0.acquisitions());
        c.encode(encoder.encode_descriptor(
            "quire_proxy_acquisitions",
            "Stream acquisitions completed since start.",
            None,
            c.metric_type(),
        )?)?;
        let c = ConstCounter::new(self.0.too_many_streams_refusals());
        c.encode(encoder.encode_descriptor(
            "quire_proxy_streams_refused",
            "Stream acquisitions refused with TOO_MANY_STREAMS ([streams] owned_streams_max).",
            None,
            c.metric_type(),
        )?)
    }
}

#[cfg(test)]
mod tests {
    //! Goal: a fresh registry exposes the families an operator's rates read (errors at 0 with
    //! documented code names), redirects are kept apart from errors, and waiting reads apart
    //! from served ones. Method: record answers and encode the registry.

    use super::*;
    use crate::dlsn::ReadPosition;

    fn encoded(m: &ProxyMetrics) -> String {
        let mut r = Registry::default();
        r.register("quire_proxy_requests", "x", m.requests.clone());
        r.register("quire_proxy_request_errors", "x", m.errors.clone());
        r.register("quire_proxy_redirects", "x", m.redirects.clone());
        r.register("quire_proxy_read_latency", "x", m.read_latency.clone());
        r.register(
            "quire_proxy_read_wait_latency",
            "x",
            m.read_wait_latency.clone(),
        );
        r.register(
            "quire_proxy_connections_refused",
            "x",
            m.connections_refused.clone(),
        );
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        out
    }

    #[test]
    fn fresh_families_redirects_and_read_split() {
        let m = ProxyMetrics::new();
        let text = encoded(&m);
        for want in [
            "quire_proxy_request_errors_total{op=\"write\",code=\"STORAGE_ERROR\"} 0",
            "quire_proxy_requests_total{op=\"write\"} 0",
            "quire_proxy_redirects_total{op=\"read\"} 0",
            "quire_proxy_connections_refused_total{reason=\"not_reading\"} 0",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        let redirect = Response::Error {
            code: ErrorCode::StreamOwnedElsewhere,
            message: "127.0.0.1:1".into(),
        };
        let missing = Response::Error {
            code: ErrorCode::NoSuchStream,
            message: "s".into(),
        };
        let read = Response::Read {
            next: ReadPosition::Head,
            records: Vec::new(),
            write_times_ms: None,
            end_of_stream: false,
        };
        let now = Instant::now();
        m.record(Opcode::Write as u8, now, &redirect, false);
        m.record(Opcode::Read as u8, now, &missing, false);
        m.record(Opcode::Read as u8, now, &read, true);
        let text = encoded(&m);
        assert!(
            text.contains("quire_proxy_redirects_total{op=\"write\"} 1"),
            "{text}"
        );
        assert!(!text.contains("STREAM_OWNED_ELSEWHERE"), "{text}");
        assert!(
            text.contains(
                "quire_proxy_request_errors_total{op=\"read\",code=\"NO_SUCH_STREAM\"} 1"
            ),
            "{text}"
        );
        assert!(!text.contains("NoSuchStream"), "{text}");
        assert!(
            text.contains("quire_proxy_read_wait_latency_count 1"),
            "{text}"
        );
        // The NO_SUCH_STREAM read was answered at once: served, not waiting.
        assert!(text.contains("quire_proxy_read_latency_count 1"), "{text}");
    }
}

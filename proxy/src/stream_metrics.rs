//! Per-stream metrics of a proxy, with bounded cardinality.
//!
//! A proxy counts the writes it submits to each stream it owns: `quire_proxy_stream_records`
//! and `quire_proxy_stream_bytes` (counters: rate them for records/s and bytes/s),
//! `quire_proxy_stream_last_write_seconds` (gauge: Unix time of the last write submitted;
//! `time() - it` is the last write's age). All labelled `stream`.
//!
//! Read at scrape time, for every stream this proxy owns now (whether or not it was written
//! through it; [`StreamManager::owned_stream_sizes`]): `quire_proxy_stream_segments` (gauge:
//! log segments) and `quire_proxy_stream_retained_bytes` (gauge: bytes of its segments, the
//! figure size retention compares with its limit, DistributedLog's retention by size). A
//! proxy that does not own a stream exposes neither for it; the owner's series is the one.
//! At most [`STREAM_SERIES_MAX`] owned streams get series of their own (those with a write
//! series first, then the others by name); the rest are summed under [`OTHER_STREAM`].
//!
//! Cardinality of the write series: the first [`STREAM_SERIES_MAX`] streams written through this proxy since it
//! started get a series of their own; writes to any other stream are folded into the series
//! labelled [`OTHER_STREAM`] (`_other`; a stream of that very name shares the series, as
//! docs/metrics.md says). A deleted
//! stream keeps its series until the proxy restarts, so that counters never go back.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::stream::{OwnedStreamSize, StreamManager};

/// Streams with a series of their own (the first written since the proxy started).
pub const STREAM_SERIES_MAX: usize = 100;
/// The `stream` label of the series the others are folded into.
pub const OTHER_STREAM: &str = "_other";

/// What is counted for one series.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    records: u64,
    bytes: u64,
    /// Milliseconds since the Unix epoch of the last write submitted; 0: none.
    last_write_ms: u64,
}

/// The per-stream series: at most [`STREAM_SERIES_MAX`] named ones and [`OTHER_STREAM`].
#[derive(Debug, Default, Clone)]
pub(crate) struct StreamSeries {
    inner: Arc<Mutex<Table>>,
}

#[derive(Debug, Default)]
struct Table {
    named: HashMap<String, Counts>,
    other: Counts,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StreamLabels {
    stream: String,
}

impl StreamSeries {
    /// Counts a write of `records` records of `bytes` payload bytes submitted to `stream` now.
    pub(crate) fn written(&self, stream: &str, records: u64, bytes: u64) {
        let now_ms = quire_clock::unix_ms();
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let t = &mut *guard;
        // A stream with its series is found without allocating its name; only a stream's
        // first write (below the cap) allocates the key.
        let counts = if t.named.contains_key(stream) {
            t.named.get_mut(stream).expect("present")
        } else if t.named.len() < STREAM_SERIES_MAX {
            t.named.entry(stream.to_string()).or_default()
        } else {
            &mut t.other
        };
        counts.records += records;
        counts.bytes += bytes;
        counts.last_write_ms = counts.last_write_ms.max(now_ms);
    }

    /// Registers the collector that encodes the series (segments read from `streams`).
    pub(crate) fn register(&self, registry: &mut Registry, streams: Arc<StreamManager>) {
        registry.register_collector(Box::new(StreamCollector {
            series: self.clone(),
            streams,
        }));
    }

    /// (label, counts) of every series, [`OTHER_STREAM`] last, named ones sorted.
    fn snapshot(&self) -> Vec<(String, Counts)> {
        let t = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut rows: Vec<(String, Counts)> =
            t.named.iter().map(|(k, v)| (k.clone(), *v)).collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows.push((OTHER_STREAM.to_string(), t.other));
        rows
    }
}

#[derive(Debug)]
struct StreamCollector {
    series: StreamSeries,
    streams: Arc<StreamManager>,
}

type Pick = fn(&Counts) -> u64;
type SizePick = fn(&OwnedStreamSize) -> i64;

impl Collector for StreamCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = self.series.snapshot();
        let counters: [(&str, &str, Pick); 2] = [
            (
                "quire_proxy_stream_records",
                "Records submitted for writing to the stream through this proxy (its owner).",
                |c| c.records,
            ),
            (
                "quire_proxy_stream_bytes",
                "Record payload bytes submitted for writing to the stream through this proxy.",
                |c| c.bytes,
            ),
        ];
        for (name, help, pick) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (stream, counts) in &rows {
                let labels = StreamLabels {
                    stream: stream.clone(),
                };
                ConstCounter::new(pick(counts)).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "quire_proxy_stream_last_write_seconds",
            "Unix time of the last write submitted to the stream (0: none since the proxy started).",
            None,
            MetricType::Gauge,
        )?;
        for (stream, counts) in &rows {
            let labels = StreamLabels {
                stream: stream.clone(),
            };
            let secs = counts.last_write_ms as f64 / 1000.0;
            ConstGauge::new(secs).encode(family.encode_family(&labels)?)?;
        }
        let written: HashSet<&str> = rows.iter().map(|(name, _)| name.as_str()).collect();
        let sizes = size_rows(self.streams.owned_stream_sizes(), &written);
        let gauges: [(&str, &str, SizePick); 2] = [
            (
                "quire_proxy_stream_segments",
                "Log segments of the stream, for the streams this proxy owns now.",
                |s| s.segments as i64,
            ),
            (
                "quire_proxy_stream_retained_bytes",
                "Bytes of the stream's segments (what size retention compares with its limit), for the streams this proxy owns now.",
                |s| i64::try_from(s.retained_bytes).unwrap_or(i64::MAX),
            ),
        ];
        for (name, help, pick) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for size in &sizes {
                let labels = StreamLabels {
                    stream: size.name.clone(),
                };
                ConstGauge::new(pick(size)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The size series of the owned streams `sizes`, at most [`STREAM_SERIES_MAX`] named ones:
/// streams in `written` (those with a write series) first, then the others by name; the rest
/// summed under [`OTHER_STREAM`], which is there only when something was summed.
fn size_rows(mut sizes: Vec<OwnedStreamSize>, written: &HashSet<&str>) -> Vec<OwnedStreamSize> {
    sizes.sort_by(|a, b| {
        let key = |s: &OwnedStreamSize| (!written.contains(s.name.as_str()), s.name.clone());
        key(a).cmp(&key(b))
    });
    if sizes.len() <= STREAM_SERIES_MAX {
        return sizes;
    }
    let rest = sizes.split_off(STREAM_SERIES_MAX);
    sizes.push(OwnedStreamSize {
        name: OTHER_STREAM.to_string(),
        segments: rest.iter().map(|s| s.segments).sum(),
        retained_bytes: rest.iter().map(|s| s.retained_bytes).sum(),
    });
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_past_the_cap_fold_into_other() {
        // Goal: the number of series stays bounded whatever the number of streams.
        let s = StreamSeries::default();
        for i in 0..STREAM_SERIES_MAX + 5 {
            s.written(&format!("s{i:04}"), 2, 10);
        }
        s.written("s0000", 1, 5);
        let rows = s.snapshot();
        assert_eq!(rows.len(), STREAM_SERIES_MAX + 1);
        let (label, other) = rows.last().unwrap();
        assert_eq!(label, OTHER_STREAM);
        assert_eq!((other.records, other.bytes), (10, 50));
        assert_eq!((rows[0].1.records, rows[0].1.bytes), (3, 15));
        assert!(rows[0].1.last_write_ms > 0);
    }

    #[test]
    fn owned_streams_past_the_cap_are_summed_into_other() {
        // Goal: the size series stay bounded whatever the number of owned streams, and a
        // stream with a write series keeps its own size series.
        let sizes = (0..STREAM_SERIES_MAX + 3)
            .map(|i| OwnedStreamSize {
                name: format!("s{i:04}"),
                segments: 1,
                retained_bytes: 10,
            })
            .collect();
        let last = format!("s{:04}", STREAM_SERIES_MAX + 2);
        let rows = size_rows(sizes, &HashSet::from([last.as_str()]));
        assert_eq!(rows.len(), STREAM_SERIES_MAX + 1);
        assert_eq!(rows[0].name, last);
        let other = rows.last().unwrap();
        assert_eq!(other.name, OTHER_STREAM);
        assert_eq!((other.segments, other.retained_bytes), (3, 30));
        let few = size_rows(rows[..3].to_vec(), &HashSet::new());
        assert_eq!(few.len(), 3, "nothing summed, no {OTHER_STREAM} series");
    }
}

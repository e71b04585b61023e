//! Goal: a bookie's metrics count exactly what it served, and `GetBookieInfo` reports its
//! shards, ledgers, state and directories. Method: a real two-shard bookie with metrics, one
//! ledger on each shard; pipeline adds, reads, a refused add and a read of a missing entry
//! over the wire; encode the registry (what `/metrics` serves) and compare every count with
//! what was sent; then ask `GetBookieInfo` and check it against the configuration and disk.

use crate::common;

use crate::common::{entry, Client, Resp, KEY, OTHER_KEY};
use prometheus_client::registry::Registry;
use quire_bookie::metrics::BookieMetrics;
use quire_bookie::{shard_of, Bookie};
use quire_wire::bookie::{BookieState, DirKind, Request, Status};
use std::time::{Duration, Instant};

/// The value of the sample `name{labels}` (labels exactly as printed), or `None`.
fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    let key = if labels.is_empty() {
        format!("{name} ")
    } else {
        format!("{name}{{{labels}}} ")
    };
    text.lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .map(|v| v.trim().parse().expect("numeric sample"))
}

fn scrape(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
    out
}

const ADDS_PER_LEDGER: u64 = 50;

#[test]
fn metrics_count_what_the_bookie_served_and_info_reports_it() {
    let dir = common::tempdir();
    let mut config = common::config(dir.path(), 2);
    let metrics = BookieMetrics::new();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    config.metrics = Some(metrics.for_bookie("b1", 2));
    let bookie = Bookie::start(config.clone()).unwrap();
    metrics.add_status("b1", bookie.status());

    let ledgers: Vec<u64> = (0..2)
        .map(|s| (500..).find(|l| shard_of(*l, 2) == s).unwrap())
        .collect();
    let (mut c, _) = Client::handshake(bookie.addr());
    let mut sent_bytes = 0u64;
    let mut ids = Vec::new();
    for e in 0..ADDS_PER_LEDGER {
        for &l in &ledgers {
            let data = entry(l, e);
            sent_bytes += data.len() as u64;
            ids.push(c.send(&Request::Add {
                recovery: false,
                master_key: KEY,
                entry: &data,
            }));
        }
    }
    for _ in &ids {
        let (_, r) = c.recv().unwrap();
        assert!(matches!(r, Resp::Add { .. }), "{r:?}");
    }
    // One refused add (another master key) and five reads, one of a missing entry, on shard 0.
    let refused = c.add(OTHER_KEY, &entry(ledgers[0], ADDS_PER_LEDGER), false);
    assert_eq!(refused.status(), Status::Unauthorized);
    for e in 0..4 {
        assert!(matches!(c.read(ledgers[0], Some(e)), Resp::Read { .. }));
    }
    assert_eq!(
        c.read(ledgers[0], Some(10_000)).status(),
        Status::NoSuchEntry
    );

    let text = scrape(&registry);
    let add = "bookkeeper_server_ADD_ENTRY_REQUEST";
    let read = "bookkeeper_server_READ_ENTRY_REQUEST";
    // Request latencies are recorded on the shard that read the request (it may forward the
    // add to the owner); journal figures on the owner.
    let total = |name: &str, labels: &dyn Fn(usize) -> String| -> f64 {
        (0..2)
            .map(|s| sample(&text, name, &labels(s)).unwrap_or(0.0))
            .sum()
    };
    let ok = |s: usize| format!("bookie=\"b1\",shard=\"{s}\",success=\"true\"");
    let failed = |s: usize| format!("bookie=\"b1\",shard=\"{s}\",success=\"false\"");
    // Every answered add is one sample; the journal saw exactly the accepted ones.
    assert_eq!(
        total(&format!("{add}_count"), &ok),
        2.0 * ADDS_PER_LEDGER as f64,
        "{text}"
    );
    assert_eq!(total(&format!("{add}_count"), &failed), 1.0);
    // The +Inf bucket holds every sample.
    assert_eq!(
        total(&format!("{add}_bucket"), &|s| format!(
            "le=\"+Inf\",{}",
            ok(s)
        )),
        2.0 * ADDS_PER_LEDGER as f64,
        "{text}"
    );
    for shard in 0..2 {
        let sh = format!("bookie=\"b1\",shard=\"{shard}\"");
        assert_eq!(
            sample(&text, "bookie_journal_JOURNAL_ADD_ENTRY_count", &sh),
            Some(ADDS_PER_LEDGER as f64)
        );
        // Group commit: at least one sync, never more than one per add.
        let syncs = sample(&text, "bookie_journal_JOURNAL_SYNC_count", &sh).unwrap();
        assert!(
            (1.0..=ADDS_PER_LEDGER as f64).contains(&syncs),
            "shard {shard}: {syncs} syncs"
        );
        assert!(sample(&text, "bookie_journal_JOURNAL_SYNC_sum", &sh).unwrap() > 0.0);
        assert!(sample(&text, "bookie_journal_JOURNAL_WRITE_BYTES_total", &sh).unwrap() > 0.0);
    }
    assert_eq!(total(&format!("{read}_count"), &ok), 4.0);
    assert_eq!(total(&format!("{read}_count"), &failed), 1.0);
    let added: f64 = (0..2)
        .map(|s| {
            sample(
                &text,
                "bookie_BOOKIE_ADD_ENTRY_BYTES_total",
                &format!("bookie=\"b1\",shard=\"{s}\""),
            )
            .unwrap()
        })
        .sum();
    assert_eq!(added, sent_bytes as f64);
    assert_eq!(
        sample(&text, "bookie_SERVER_STATUS", "bookie=\"b1\""),
        Some(1.0)
    );
    let journal_labels = format!(
        "bookie=\"b1\",dir=\"journal\",path=\"{}\"",
        config.journal_dir.display()
    );
    assert!(
        sample(&text, "bookie_dir_used_bytes", &journal_labels).unwrap() > 0.0,
        "{text}"
    );

    // Shards publish their ledger counts every 500 ms; the reads above came from the write
    // cache, which the published hit counter shows too.
    let deadline = Instant::now() + Duration::from_secs(5);
    let info = loop {
        let Resp::Info(info) = c.call(&Request::GetBookieInfo { scrub: false }) else {
            panic!("no info")
        };
        if info.shard_ledgers == [1, 1] || Instant::now() > deadline {
            break info;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(info.shard_ledgers, vec![1, 1]);
    assert_eq!(info.state, BookieState::Writable);
    assert_eq!(info.dirs.len(), 2);
    assert_eq!(info.dirs[0].kind, DirKind::Journal);
    assert_eq!(info.dirs[0].path, config.journal_dir.display().to_string());
    assert_eq!(info.dirs[1].kind, DirKind::Ledger);
    assert_eq!(info.dirs[1].path, config.ledger_dir.display().to_string());
    for d in &info.dirs {
        assert!(d.total_bytes >= d.free_bytes && d.total_bytes > 0, "{d:?}");
    }
    // Two shards' pre-written journal files (1 MiB each here) at least.
    assert!(info.dirs[0].used_bytes >= 2 << 20, "{:?}", info.dirs[0]);
    let text = scrape(&registry);
    assert_eq!(
        sample(&text, "bookie_ledgers_count", "bookie=\"b1\",shard=\"1\""),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "bookie_write_cache_hits_total",
            "bookie=\"b1\",shard=\"0\""
        ),
        Some(4.0),
        "{text}"
    );
    drop(c);
    bookie.shutdown().unwrap();
}

#[test]
fn info_before_the_handshake_is_refused() {
    // Goal: GetBookieInfo follows the connection rules of every other request.
    let dir = common::tempdir();
    let bookie = common::start(dir.path(), 1);
    let mut c = Client::connect(bookie.addr());
    let r = c.call(&Request::GetBookieInfo { scrub: false });
    assert_eq!(r.status(), Status::BadRequest);
    assert!(c.recv().is_none(), "the connection is closed");
    bookie.shutdown().unwrap();
}

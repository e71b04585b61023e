//! Issue 13, item 1: "A bookie that re-registers serves ledgers only after its start finished."
//!
//! Goal: a bookie SIGKILLed and restarted on its data, with tens of megabytes of journal to
//! replay (checkpoints far apart, so the whole journal is replayed), appears in the bookie
//! registry only after its journal replay is done (its "engine open" log line) and accepts
//! connections only after that too; once registered it serves every entry it held, and the
//! shared checker finds every acknowledged record once and in order with every replica equal,
//! the restarted bookie's included.
//! Method: real ZooKeeper, three `quire bookie` processes (E=3 Qw=3 Qa=2, so every bookie holds
//! every entry) with `--checkpoint-interval-ms 3600000`, a `quire proxy`; about 40 MB of 1 KiB
//! records written, the bookie SIGKILLed, its old registration left to expire with its
//! session, then the bookie restarted with `QUIRE_LOG=info`. While it starts, one thread polls
//! the registry every 2 ms and another tries to connect to its port every 2 ms, each noting
//! the wall-clock time of its first success; these must not precede the timestamp of the
//! process's own "engine open" line (logged when replay ended, before the port is bound).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use quire_client::ProxyClient;
use quire_metadata::{BookieId, MetadataStore};
use quire_testkit::harness::checker::{check_stream, entries_missing, write_padded_records, Acked};
use quire_testkit::harness::cluster::{runtime, Cluster};

const STREAM: &str = "restart/replay";
const RECORDS: usize = 40_000;
const PAD: usize = 1000;
/// Journal replay (from the "cookie checked" line, just before the bookie server starts, to
/// "engine open") must take at least this long for the test to tell "registered after replay"
/// from "registered during it" at a 2 ms polling interval.
const REPLAY_MIN: Duration = Duration::from_millis(50);
const BOOKIE_FLAGS: &[&str] = &["--checkpoint-interval-ms", "3600000"];

/// When the registry first named the bookie (µs since the epoch), and the registration's epoch.
type Sighting = (u64, Option<u64>);

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// The UTC timestamp (`YYYY-MM-DDTHH:MM:SS.ffffffZ`, as the tracing formatter prints it) of a
/// log line, in microseconds since the epoch.
fn log_time_us(line: &str) -> Option<u64> {
    let b = line.as_bytes();
    let start = (0..b.len().saturating_sub(20)).find(|&i| {
        b[i..i + 4].iter().all(u8::is_ascii_digit) && b[i + 4] == b'-' && b[i + 10] == b'T'
    })?;
    let t = &line[start..];
    let num = |r: std::ops::Range<usize>| t.get(r)?.parse::<i64>().ok();
    let days = days_from_civil(num(0..4)?, num(5..7)?, num(8..10)?);
    let secs = days * 86400 + num(11..13)? * 3600 + num(14..16)? * 60 + num(17..19)?;
    let frac_end = t[20..].find('Z')? + 20;
    let frac = &t[20..frac_end];
    let micros = format!("{frac:0<6}")[..6].parse::<i64>().ok()?;
    Some((secs * 1_000_000 + micros) as u64)
}

#[test]
fn a_restarted_bookie_registers_only_after_its_journal_replay() {
    let cluster = Cluster::start();
    let ports: Vec<u16> = (0..3).map(|_| quire_testkit::free_port()).collect();
    let mut bookies: Vec<_> = (0..3)
        .map(|i| cluster.start_bookie_with(i, ports[i], BOOKIE_FLAGS))
        .collect();
    cluster.wait_bookies("3 bookies", |l| l.contains("3 bookies registered"));
    let proxy = cluster.start_proxy_e3(&[]);
    let rt = runtime();
    let client = rt.block_on(async { Arc::new(ProxyClient::connect(&proxy.addr).await.unwrap()) });
    let mut acked: Vec<Acked> = Vec::new();
    for chunk in (0..RECORDS).step_by(2000) {
        let (got, err) = rt.block_on(write_padded_records(
            &client,
            STREAM,
            STREAM,
            chunk..chunk + 2000,
            PAD,
        ));
        assert!(err.is_none(), "a write failed: {err:?}");
        acked.extend(got);
    }

    // SIGKILL: the journal holds everything since the bookie started (no checkpoint yet).
    let victim = 2;
    let id = BookieId(format!("127.0.0.1:{}", ports[victim]));
    bookies.remove(victim).kill();
    let store = Arc::new(rt.block_on(cluster.zk_store()));
    let registration = |store: &quire_metadata::ZkStore| {
        rt.block_on(store.list_bookie_registrations())
            .unwrap()
            .into_iter()
            .find(|b| b.info.id == id)
            .map(|b| b.epoch)
    };
    let old = registration(&store).expect("the old registration is there until its session ends");
    let deadline = Instant::now() + Duration::from_secs(60);
    while registration(&store).is_some() {
        assert!(
            Instant::now() < deadline,
            "the old registration never expired"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Watchers: the first time the registry names the bookie, and the first time its port
    // accepts a connection.
    // Each runs until it succeeds (both happen before the bookie's serving line, which the
    // start below waits for; a watcher stopped at that line could miss a success between two
    // of its polls), or gives up after 60 s.
    let give_up = Instant::now() + Duration::from_secs(60);
    let registered_us: Arc<Mutex<Option<Sighting>>> = Arc::default();
    let registry_watch = {
        let (seen, store, id) = (registered_us.clone(), store.clone(), id.clone());
        let handle = rt.handle().clone();
        std::thread::spawn(move || {
            while Instant::now() < give_up {
                let listed = handle.block_on(store.list_bookie_registrations()).unwrap();
                if let Some(b) = listed.into_iter().find(|b| b.info.id == id) {
                    *seen.lock().unwrap() = Some((now_us(), b.epoch));
                    return;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let accepted_us: Arc<Mutex<Option<u64>>> = Arc::default();
    let port_watch = {
        let (seen, addr) = (accepted_us.clone(), id.0.clone());
        std::thread::spawn(move || {
            while Instant::now() < give_up {
                if std::net::TcpStream::connect(&addr).is_ok() {
                    *seen.lock().unwrap() = Some(now_us());
                    return;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let spawned_us = now_us();
    let restarted = cluster.start_bookie_logging(victim, ports[victim], BOOKIE_FLAGS, Some("info"));
    let serving_us = now_us();
    registry_watch.join().unwrap();
    port_watch.join().unwrap();

    let log = restarted.stderr.lock().unwrap().clone();
    let open_line = log
        .lines()
        .find(|l| l.contains("engine open"))
        .unwrap_or_else(|| panic!("no \"engine open\" line from the restarted bookie: {log}"));
    let open_us = log_time_us(open_line).expect("a timestamp on the log line");
    let cookie_us = log
        .lines()
        .find(|l| l.contains("cookie checked"))
        .and_then(log_time_us)
        .unwrap_or_else(|| panic!("no \"cookie checked\" line from the restarted bookie: {log}"));
    let (reg_us, epoch) = registered_us
        .lock()
        .unwrap()
        .expect("the registry named the bookie within 60 s");
    let accept_us = accepted_us
        .lock()
        .unwrap()
        .expect("the port accepted within 60 s");
    let ms = |a: u64, b: u64| (a as f64 - b as f64) / 1000.0;
    eprintln!(
        "restart: journal replay {:.1} ms (\"cookie checked\" to \"engine open\", {:.1} ms after \
         spawn); port first accepted {:.1} ms and registry first named the bookie {:.1} ms after \
         that; serving line {:.1} ms after it",
        ms(open_us, cookie_us),
        ms(open_us, spawned_us),
        ms(accept_us, open_us),
        ms(reg_us, open_us),
        ms(serving_us, open_us)
    );
    assert_ne!(epoch, old, "a new registration");
    assert!(
        Duration::from_micros(open_us.saturating_sub(cookie_us)) >= REPLAY_MIN,
        "the replay took {:.1} ms: too short to tell the order apart",
        ms(open_us, cookie_us)
    );
    assert!(
        reg_us > open_us,
        "the bookie was registered {:.1} ms before its replay ended",
        ms(open_us, reg_us)
    );
    assert!(
        accept_us > open_us,
        "the bookie accepted a connection {:.1} ms before its replay ended",
        ms(open_us, accept_us)
    );

    // Once registered it holds every entry it held before the kill.
    rt.block_on(async {
        let missing = entries_missing(&store).await;
        assert!(
            missing.is_empty(),
            "{} replicas missing after the restart, first {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
        let report = check_stream(
            &proxy.addr,
            store.as_ref() as &dyn MetadataStore,
            STREAM,
            &acked,
            &[],
        )
        .await;
        assert_eq!(report.records.len(), acked.len());
    });
    proxy.stop();
    restarted.stop();
    for b in bookies {
        b.stop();
    }
}

//! What runs against the cluster during a schedule, every operation recorded in a
//! [`History`] (one per stream): on fresh streams of the schedule,
//!
//! - a plain writer (no producer session) on `chaos/SEED/plain`: one to three records per
//!   write, txid = record number; a write whose outcome is unknown is sent again unchanged (a
//!   blind retry, which may land twice; the checker allows exactly that);
//! - a session writer on `chaos/SEED/session` through a [`Producer`] (exactly once: it retries
//!   through failover itself; after an error the next write carries new records);
//! - a tailing reader on each stream from its head, and a catch-up reader that starts from the
//!   head of the plain stream halfway through the fault window;
//! - a truncation of the plain stream at 70 % of the window, at the last record every plain
//!   reader has passed (a consumer's truncation: readers behind the point would be refused).
//!
//! Every client fails over between all proxies (`ClientConfig::proxies`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quire_client::{
    ClientConfig, Error, ErrorCode, Producer, ProducerConfig, ProxyClient, WriteResult,
};
use quire_testkit::harness::checker::read_stream;
use quire_testkit::harness::recorded::{self, outcome_of_error};
use quire_testkit::history::{Dlsn, History, Outcome, Record, Session};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

/// Longest wait for one write call; its outcome is unknown after it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Counts of a writer's outcomes.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub ok: u64,
    pub failed: u64,
    pub unknown: u64,
    /// The last error a write ended with, if any.
    pub last_error: Option<String>,
    /// The longest time between two acknowledgements of the writer (one write at a time):
    /// the pause a writer saw across failovers, drains and joins (issue 29 item 3 bounds it).
    pub longest_pause: Duration,
    last_ack: Option<std::time::Instant>,
}

/// The operations of one schedule, running on the runner's tokio runtime.
pub struct Workload {
    pub plain: Arc<History>,
    pub session: Arc<History>,
    pub plain_stream: String,
    pub session_stream: String,
    stop_writers: Arc<AtomicBool>,
    stop_readers: Arc<AtomicBool>,
    /// Acknowledged writes so far, plain and session.
    acks: [Arc<AtomicU64>; 2],
    writers: Vec<JoinHandle<Tally>>,
    readers: Vec<JoinHandle<usize>>,
    timers: Vec<JoinHandle<()>>,
    proxies: Vec<String>,
}

/// A client of every proxy, failing over in order from the first (short timeouts: a stopped
/// proxy must not hold a writer for long).
pub async fn client(proxies: &[String]) -> Result<Arc<ProxyClient>, Error> {
    let config = ClientConfig {
        proxies: proxies.to_vec(),
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
        ..ClientConfig::default()
    };
    ProxyClient::connect_any(config).await.map(Arc::new)
}

impl Workload {
    /// Starts the writers and readers of schedule `seed`; the catch-up reader and the
    /// truncation start on timers within `window`.
    ///
    /// # Errors
    /// When no proxy can be connected to.
    pub fn start(
        rt: &Runtime,
        proxies: Vec<String>,
        seed: u64,
        window: Duration,
    ) -> Result<Workload, Error> {
        let clients = rt.block_on(async {
            Ok::<_, Error>([
                client(&proxies).await?,
                client(&proxies).await?,
                client(&proxies).await?,
            ])
        })?;
        let mut w = Workload {
            plain: Arc::new(History::new()),
            session: Arc::new(History::new()),
            plain_stream: format!("chaos/{seed}/plain"),
            session_stream: format!("chaos/{seed}/session"),
            stop_writers: Arc::new(AtomicBool::new(false)),
            stop_readers: Arc::new(AtomicBool::new(false)),
            acks: [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))],
            writers: Vec::new(),
            readers: Vec::new(),
            timers: Vec::new(),
            proxies,
        };
        let [wc, sc, rc] = clients;
        let _guard = rt.enter();
        w.writers.push(tokio::spawn(plain_writer(
            w.plain.clone(),
            wc,
            w.plain_stream.clone(),
            w.stop_writers.clone(),
            w.acks[0].clone(),
        )));
        w.writers.push(tokio::spawn(session_writer(
            w.session.clone(),
            sc,
            w.session_stream.clone(),
            w.stop_writers.clone(),
            w.acks[1].clone(),
        )));
        w.readers.push(w.tail(&rc, true, "tail"));
        w.readers.push(w.tail(&rc, false, "tail"));
        w.start_timers(rc, window);
        Ok(w)
    }

    fn tail(&self, client: &Arc<ProxyClient>, plain: bool, name: &str) -> JoinHandle<usize> {
        let (h, s) = if plain {
            (&self.plain, &self.plain_stream)
        } else {
            (&self.session, &self.session_stream)
        };
        tokio::spawn(recorded::tail(
            h.clone(),
            client.clone(),
            s.clone(),
            name.into(),
            self.stop_readers.clone(),
        ))
    }

    fn start_timers(&mut self, client: Arc<ProxyClient>, window: Duration) {
        let (h, s, stop) = (
            self.plain.clone(),
            self.plain_stream.clone(),
            self.stop_readers.clone(),
        );
        let c = client.clone();
        let catch_up = tokio::spawn(async move {
            tokio::time::sleep(window / 2).await;
            recorded::tail(h, c, s, "catch-up".into(), stop).await
        });
        self.readers.push(catch_up);
        let (h, s) = (self.plain.clone(), self.plain_stream.clone());
        self.timers.push(tokio::spawn(async move {
            tokio::time::sleep(window * 7 / 10).await;
            truncate_behind_readers(&h, &client, &s, &["tail", "catch-up"]).await;
        }));
    }

    /// Acknowledged writes so far (plain, session).
    pub fn acks(&self) -> (u64, u64) {
        (
            self.acks[0].load(Ordering::Acquire),
            self.acks[1].load(Ordering::Acquire),
        )
    }

    /// Waits until both writers had a write acknowledged after `since` (from [`Workload::acks`])
    /// or `limit` passed; whether they did.
    pub fn wait_resumed(&self, since: (u64, u64), limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            let now = self.acks();
            if now.0 > since.0 && now.1 > since.1 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Stops the writers, then the readers (each reads on until it has caught up), waiting up
    /// to 60 s for each task; returns the writers' tallies (plain, session) and the records each
    /// reader read (a task that did not end in time is aborted and counts `None`).
    pub fn stop(self, rt: &Runtime) -> ((Tally, Tally), Vec<Option<usize>>) {
        self.stop_writers.store(true, Ordering::Release);
        let tallies: Vec<Tally> = self
            .writers
            .into_iter()
            .map(|t| join(rt, t).unwrap_or_default())
            .collect();
        self.stop_readers.store(true, Ordering::Release);
        let reads = self.readers.into_iter().map(|t| join(rt, t)).collect();
        for t in self.timers {
            let _ = join(rt, t);
        }
        let mut tallies = tallies.into_iter();
        let plain = tallies.next().unwrap_or_default();
        ((plain, tallies.next().unwrap_or_default()), reads)
    }

    /// The proxies the workload's clients use.
    pub fn proxies(&self) -> &[String] {
        &self.proxies
    }
}

fn join<T>(rt: &Runtime, task: JoinHandle<T>) -> Option<T> {
    let abort = task.abort_handle();
    match rt.block_on(async { tokio::time::timeout(Duration::from_secs(60), task).await }) {
        Ok(Ok(v)) => Some(v),
        _ => {
            abort.abort();
            None
        }
    }
}

fn outcome(r: &Result<WriteResult, Error>) -> Outcome {
    match r {
        Ok(w) => Outcome::Ok {
            first: w.first_dlsn.into(),
            last: w.last_dlsn.into(),
        },
        Err(e) => outcome_of_error(e),
    }
}

fn txid_out_of_order(e: &Error) -> bool {
    matches!(
        e,
        Error::TxidOutOfOrder { .. }
            | Error::Remote {
                code: ErrorCode::TxidOutOfOrder,
                ..
            }
    )
}

fn count(t: &mut Tally, o: &Outcome, acks: &AtomicU64) {
    match o {
        Outcome::Ok { .. } => {
            t.ok += 1;
            acks.fetch_add(1, Ordering::AcqRel);
            let now = std::time::Instant::now();
            if let Some(last) = t.last_ack {
                t.longest_pause = t.longest_pause.max(now - last);
            }
            t.last_ack = Some(now);
        }
        Outcome::Failed(e) => {
            t.failed += 1;
            t.last_error = Some(format!("failed: {e}"));
        }
        Outcome::Unknown(e) => {
            t.unknown += 1;
            t.last_error = Some(format!("unknown: {e}"));
        }
    }
}

async fn plain_writer(
    h: Arc<History>,
    client: Arc<ProxyClient>,
    stream: String,
    stop: Arc<AtomicBool>,
    acks: Arc<AtomicU64>,
) -> Tally {
    let mut tally = Tally::default();
    let mut next = 0u64;
    while !stop.load(Ordering::Acquire) {
        let n = 1 + next % 3;
        let records: Vec<(u64, Vec<u8>)> = (next..next + n)
            .map(|i| (i + 1, format!("plain-{i:08}").into_bytes()))
            .collect();
        let op = h.write_invoked("writer", records.clone(), None);
        let r = tokio::time::timeout(WRITE_TIMEOUT, client.write(&stream, records, true)).await;
        let (o, landed_later) = match r {
            Ok(r) => (outcome(&r), r.as_ref().is_err_and(txid_out_of_order)),
            Err(_) => (
                Outcome::Unknown(format!("no answer within {WRITE_TIMEOUT:?}")),
                false,
            ),
        };
        h.write_done(op, o.clone());
        count(&mut tally, &o, &acks);
        // Acknowledged: the next records. Refused for a txid below the stream's last: an earlier
        // attempt whose outcome was unknown did land (DistributedLog's txid check refuses the
        // blind retry), so the next records too. Else (refused, unknown) the same records again:
        // a blind retry after an unknown outcome may land twice, which the checker allows.
        if matches!(o, Outcome::Ok { .. }) || landed_later {
            next += n;
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tally
}

async fn open_producer(client: &Arc<ProxyClient>, stream: &str) -> Option<Producer> {
    let config = ProducerConfig {
        retry_for: Duration::from_secs(15),
        create_if_missing: true,
    };
    let open = Producer::open(client.clone(), stream, config);
    match tokio::time::timeout(WRITE_TIMEOUT, open).await {
        Ok(Ok(p)) => Some(p),
        _ => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            None
        }
    }
}

async fn session_writer(
    h: Arc<History>,
    client: Arc<ProxyClient>,
    stream: String,
    stop: Arc<AtomicBool>,
    acks: Arc<AtomicU64>,
) -> Tally {
    let mut tally = Tally::default();
    let mut producer: Option<Producer> = None;
    let mut next = 0u64;
    while !stop.load(Ordering::Acquire) {
        if producer.is_none() {
            producer = open_producer(&client, &stream).await;
            continue;
        }
        let p = producer.as_mut().expect("opened above");
        let records = vec![(next + 1, format!("session-{next:08}").into_bytes())];
        let session = Session {
            id: p.session_id(),
            seq: p.next_seq(),
        };
        let op = h.write_invoked("producer", records.clone(), Some(session));
        let r = p.write(records).await;
        let o = outcome(&r);
        h.write_done(op, o.clone());
        count(&mut tally, &o, &acks);
        // Never re-send a record the producer gave up on: a session write is retried by the
        // producer only, so each record of this writer is in at most one write.
        next += 1;
        if !matches!(o, Outcome::Ok { .. }) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tally
}

/// The last DLSN each of `readers` has read in `h` (readers that have read nothing are still at
/// the head and need nothing).
fn reader_positions(h: &History, readers: &[&str]) -> Vec<Dlsn> {
    let ops = h.ops();
    readers
        .iter()
        .filter_map(|name| {
            ops.iter()
                .filter(|o| o.process == *name)
                .filter_map(|o| match &o.kind {
                    quire_testkit::history::OpKind::Read {
                        records: Some(r), ..
                    } => r.last().map(|r| r.dlsn),
                    _ => None,
                })
                .max()
        })
        .collect()
}

/// Truncates `stream` before the last record every reader of `readers` has read (so no reader
/// is left behind the point), recording it in `h`; nothing when no reader has read yet.
async fn truncate_behind_readers(h: &History, c: &ProxyClient, stream: &str, readers: &[&str]) {
    let Some(point) = reader_positions(h, readers).into_iter().min() else {
        return;
    };
    let op = h.truncate_invoked(point);
    let r = tokio::time::timeout(WRITE_TIMEOUT, c.truncate(stream, point.into())).await;
    if let Ok(Ok(_)) = r {
        h.done(op);
    }
}

/// The whole of `stream` read from its head through any of `proxies` (the final log the checker
/// compares the history with), retrying failed connects and reads for up to `retry_for`.
///
/// # Errors
/// The last read error when the stream could not be read to its end in time.
pub async fn final_log(
    proxies: &[String],
    stream: &str,
    retry_for: Duration,
) -> Result<Vec<Record>, String> {
    let deadline = tokio::time::Instant::now() + retry_for;
    let client = loop {
        match client(proxies).await {
            Ok(c) => break c,
            Err(e) if tokio::time::Instant::now() > deadline => return Err(e.to_string()),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    match read_stream(&client, stream, left).await {
        Ok(records) => Ok(records
            .into_iter()
            .map(|(d, t, p)| Record::new(d.into(), t, p))
            .collect()),
        Err(e) => Err(format!("read back of {stream}: {e}")),
    }
}

// QUIRE TEMPORARY DEBUG INSTRUMENTATION (to be removed): follows every disk I/O source through
// the reactor so that a plain thread can say where a stuck one is. Enabled only when the
// environment variable QUIRE_GLOMMIO_TRACE is set; otherwise every hook is one relaxed load.
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex, Once,
    },
    time::{Duration, Instant},
};

pub(crate) struct Entry {
    exec: usize,
    kind: &'static str,
    ring: &'static str,
    queued: Instant,
    dispatched: Option<Instant>,
    completed: Option<(Instant, i64, bool)>,
    polls: u32,
    last_poll: Option<Instant>,
    next_report: Duration,
}

#[derive(Default, Clone)]
pub(crate) struct ExecSnap {
    pub(crate) note: String,
    pub(crate) at: Option<Instant>,
    pub(crate) sleeping_since: Option<Instant>,
    pub(crate) queues: String,
}

struct State {
    sources: HashMap<usize, Entry>,
    execs: HashMap<usize, ExecSnap>,
}

static ON: AtomicBool = AtomicBool::new(false);
static INIT: Once = Once::new();
static STATE: Mutex<Option<State>> = Mutex::new(None);

pub(crate) fn on() -> bool {
    INIT.call_once(|| {
        if std::env::var_os("QUIRE_GLOMMIO_TRACE").is_some() {
            *STATE.lock().unwrap() = Some(State {
                sources: HashMap::new(),
                execs: HashMap::new(),
            });
            ON.store(true, Ordering::Release);
            std::thread::Builder::new()
                .name("glommio-trace".into())
                .spawn(dumper)
                .unwrap();
        }
    });
    ON.load(Ordering::Relaxed)
}

fn with<R>(f: impl FnOnce(&mut State) -> R) -> Option<R> {
    if !on() {
        return None;
    }
    let mut g = STATE.lock().unwrap();
    g.as_mut().map(f)
}

pub(crate) fn queued(key: usize, exec: usize, kind: &'static str, ring: &'static str) {
    with(|s| {
        s.sources.insert(
            key,
            Entry {
                exec,
                kind,
                ring,
                queued: Instant::now(),
                dispatched: None,
                completed: None,
                polls: 0,
                last_poll: None,
                next_report: Duration::from_secs(2),
            },
        )
    });
}

pub(crate) fn dispatched(key: usize) {
    with(|s| {
        if let Some(e) = s.sources.get_mut(&key) {
            e.dispatched = Some(Instant::now());
        }
    });
}

pub(crate) fn completed(key: usize, res: i64, woke: bool) {
    with(|s| {
        if let Some(e) = s.sources.get_mut(&key) {
            e.completed = Some((Instant::now(), res, woke));
        }
    });
}

pub(crate) fn polled(key: usize) {
    with(|s| {
        if let Some(e) = s.sources.get_mut(&key) {
            e.polls += 1;
            e.last_poll = Some(Instant::now());
        }
    });
}

pub(crate) fn dropped(key: usize) {
    with(|s| s.sources.remove(&key));
}

pub(crate) fn exec_note(exec: usize, f: impl FnOnce(&mut ExecSnap)) {
    with(|s| {
        let e = s.execs.entry(exec).or_default();
        f(e);
    });
}

fn dumper() {
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = Instant::now();
        let mut g = STATE.lock().unwrap();
        let s = g.as_mut().unwrap();
        let mut stuck_execs = Vec::new();
        for (key, e) in s.sources.iter_mut() {
            let age = now - e.queued;
            if age < e.next_report {
                continue;
            }
            e.next_report = age + Duration::from_secs(5);
            let state = match (e.dispatched, e.completed) {
                (None, _) => "IN USER-SPACE SUBMISSION QUEUE (never dispatched)".to_string(),
                (Some(_), None) => "DISPATCHED TO KERNEL, no completion consumed".to_string(),
                (Some(_), Some((at, res, woke))) => format!(
                    "COMPLETED {:?} ago res {} woke_waiters {} (polled since: {})",
                    now - at,
                    res,
                    woke,
                    e.last_poll.map(|p| p > at).unwrap_or(false)
                ),
            };
            eprintln!(
                "GLOMMIO-TRACE exec {} source {:#x} {} on {} ring pending {:?}: {}; dispatched {:?} \
                 after queueing; polls {} last poll {:?} ago",
                e.exec,
                key,
                e.kind,
                e.ring,
                age,
                state,
                e.dispatched.map(|d| d - e.queued),
                e.polls,
                e.last_poll.map(|p| now - p)
            );
            stuck_execs.push(e.exec);
        }
        stuck_execs.sort();
        stuck_execs.dedup();
        for x in stuck_execs {
            if let Some(e) = s.execs.get(&x) {
                eprintln!(
                    "GLOMMIO-TRACE exec {} last reactor note {:?} ago: {}; sleeping for {:?}; queues: {}",
                    x,
                    e.at.map(|a| now - a),
                    e.note,
                    e.sleeping_since.map(|a| now - a),
                    e.queues
                );
            }
        }
    }
}

//! The proxy port's process-wide bounds against hostile clients (docs/proxy-protocol.md,
//! "Connection limits and timeouts" and "Memory bounds"):
//!
//! * [`Admission`]: open connections per client address (Kafka's `max.connections.per.ip`, the
//!   bookie's `connections_per_ip_max`) and the connections still in their handshake, of which
//!   there are at most `handshakes_max`: beyond it the one longest in its handshake is closed
//!   to make room, so strangers who never finish a handshake cannot keep anyone else out
//!   (the way a listen queue drops its oldest half-open connection under a SYN flood).
//! * [`ResponsePool`]: the process-wide response budget, shared fairly between client
//!   addresses: bytes freed go first to the waiting address that holds the least.
//! * [`AuthFailures`]: failed token checks per client address, for the rate-limited warning,
//!   the delay of the refusal and the temporary refusal of an address that keeps failing.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Per-address connection counts and the connections in their handshake.
#[derive(Debug)]
pub(crate) struct Admission {
    per_ip_max: usize,
    handshakes_max: usize,
    state: Mutex<AdmissionState>,
}

#[derive(Debug, Default)]
struct AdmissionState {
    per_ip: HashMap<IpAddr, usize>,
    /// Connections in their handshake, oldest first; firing the sender closes the connection.
    handshaking: BTreeMap<u64, oneshot::Sender<()>>,
    next_handshake: u64,
}

/// One connection's count in its address's total, given back when dropped.
#[derive(Debug)]
pub(crate) struct IpSlot {
    admission: Arc<Admission>,
    ip: IpAddr,
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut s = lock(&self.admission.state);
        if let Some(n) = s.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                s.per_ip.remove(&self.ip);
            }
        }
    }
}

/// A connection's place among those in their handshake; dropped (or [`Handshake::done`]) when
/// the handshake is over. `evicted` fires if the connection is to close to make room.
#[derive(Debug)]
pub(crate) struct Handshake {
    admission: Arc<Admission>,
    id: u64,
    pub(crate) evicted: oneshot::Receiver<()>,
}

impl Handshake {
    /// The handshake succeeded: the connection no longer counts as in its handshake.
    pub(crate) fn done(self) {}
}

impl Drop for Handshake {
    fn drop(&mut self) {
        lock(&self.admission.state).handshaking.remove(&self.id);
    }
}

impl Admission {
    pub(crate) fn new(per_ip_max: usize, handshakes_max: usize) -> Arc<Self> {
        Arc::new(Self {
            per_ip_max: per_ip_max.max(1),
            handshakes_max: handshakes_max.max(1),
            state: Mutex::default(),
        })
    }

    /// Counts a new connection from `ip`, or `None` when `ip` has its maximum open already.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<IpSlot> {
        let mut s = lock(&self.state);
        let n = s.per_ip.entry(ip).or_insert(0);
        if *n >= self.per_ip_max {
            return None;
        }
        *n += 1;
        Some(IpSlot {
            admission: self.clone(),
            ip,
        })
    }

    /// Open connections from `ip`.
    #[cfg(test)]
    pub(crate) fn open_from(&self, ip: IpAddr) -> usize {
        lock(&self.state).per_ip.get(&ip).copied().unwrap_or(0)
    }

    /// Registers a connection starting its handshake; at `handshakes_max`, the connection
    /// longest in its handshake is told to close.
    pub(crate) fn start_handshake(self: &Arc<Self>) -> Handshake {
        let (tx, rx) = oneshot::channel();
        let mut s = lock(&self.state);
        while s.handshaking.len() >= self.handshakes_max {
            match s.handshaking.pop_first() {
                Some((_, oldest)) => {
                    let _ = oldest.send(());
                }
                None => break,
            }
        }
        let id = s.next_handshake;
        s.next_handshake += 1;
        s.handshaking.insert(id, tx);
        Handshake {
            admission: self.clone(),
            id,
            evicted: rx,
        }
    }

    /// Tells the connection longest in its handshake to close (to make room under the
    /// connection limit); false if none is in its handshake.
    pub(crate) fn evict_oldest_handshake(&self) -> bool {
        let mut s = lock(&self.state);
        while let Some((_, oldest)) = s.handshaking.pop_first() {
            if oldest.send(()).is_ok() {
                return true;
            }
        }
        false
    }
}

/// The process-wide response budget (`ServerConfig::response_bytes_max`), one unit a byte,
/// taken before a request with a large answer runs and given back when its answer has been
/// written. When bytes come free they go to the waiting request whose client address holds
/// the fewest bytes (the earliest among equals), so that the connections of one address that
/// do not read their answers cannot keep another address waiting behind them.
#[derive(Debug)]
pub(crate) struct ResponsePool {
    max: usize,
    state: Mutex<PoolState>,
    /// Requests waiting for bytes; while above zero, writers that make no headway are closed
    /// after `ServerConfig::pressure_send_timeout`.
    waiting: AtomicUsize,
    /// Woken when a request starts waiting.
    pub(crate) pressure: Notify,
}

#[derive(Debug, Default)]
struct PoolState {
    used: usize,
    held_by_ip: HashMap<IpAddr, usize>,
    waiters: BTreeMap<u64, Waiter>,
    next_waiter: u64,
}

#[derive(Debug)]
struct Waiter {
    ip: IpAddr,
    bytes: usize,
    granted: oneshot::Sender<()>,
}

/// Bytes of the [`ResponsePool`] held by one request until its answer is written; `held`
/// is its connection's running total.
#[derive(Debug)]
pub(crate) struct PoolGrant {
    pool: Arc<ResponsePool>,
    ip: IpAddr,
    bytes: usize,
    held: Arc<AtomicUsize>,
}

impl Drop for PoolGrant {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes, Ordering::AcqRel);
        self.pool.give_back(self.ip, self.bytes);
    }
}

impl ResponsePool {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            state: Mutex::default(),
            waiting: AtomicUsize::new(0),
            pressure: Notify::new(),
        })
    }

    /// Whether some request is waiting for bytes.
    pub(crate) fn under_pressure(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }

    /// Takes `bytes` (at most the whole pool) for a request of a client at `ip`, waiting
    /// while the pool cannot give them; `held` counts them for the connection. Cancel-safe.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        ip: IpAddr,
        bytes: usize,
        held: &Arc<AtomicUsize>,
    ) -> PoolGrant {
        let bytes = bytes.min(self.max);
        // Made only once the bytes are taken: its drop gives them back.
        let grant = || {
            held.fetch_add(bytes, Ordering::AcqRel);
            PoolGrant {
                pool: self.clone(),
                ip,
                bytes,
                held: held.clone(),
            }
        };
        let (id, rx) = {
            let mut s = lock(&self.state);
            if s.waiters.is_empty() && s.used + bytes <= self.max {
                s.used += bytes;
                *s.held_by_ip.entry(ip).or_insert(0) += bytes;
                drop(s);
                return grant();
            }
            let (tx, rx) = oneshot::channel();
            let id = s.next_waiter;
            s.next_waiter += 1;
            s.waiters.insert(
                id,
                Waiter {
                    ip,
                    bytes,
                    granted: tx,
                },
            );
            (id, rx)
        };
        self.waiting.fetch_add(1, Ordering::AcqRel);
        self.pressure.notify_waiters();
        /// Withdraws the waiter if the wait is cancelled; gives the bytes back if they were
        /// granted meanwhile.
        struct Waiting<'a> {
            pool: &'a ResponsePool,
            id: u64,
            ip: IpAddr,
            bytes: usize,
            armed: bool,
        }
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.pool.waiting.fetch_sub(1, Ordering::AcqRel);
                if self.armed {
                    let removed = lock(&self.pool.state).waiters.remove(&self.id).is_some();
                    if !removed {
                        self.pool.give_back(self.ip, self.bytes);
                    }
                }
            }
        }
        let mut waiting = Waiting {
            pool: self,
            id,
            ip,
            bytes,
            armed: true,
        };
        // The sender lives in the waiter until granted, and a grant sends before dropping it.
        let _ = rx.await;
        waiting.armed = false;
        drop(waiting);
        grant()
    }

    fn give_back(&self, ip: IpAddr, bytes: usize) {
        let mut s = lock(&self.state);
        s.used -= bytes;
        if let Some(n) = s.held_by_ip.get_mut(&ip) {
            *n -= bytes;
            if *n == 0 {
                s.held_by_ip.remove(&ip);
            }
        }
        // Grant the waiters in fairness order while the next one fits.
        loop {
            let next = s
                .waiters
                .iter()
                .min_by_key(|(id, w)| (s.held_by_ip.get(&w.ip).copied().unwrap_or(0), **id))
                .map(|(id, w)| (*id, w.bytes));
            let Some((id, bytes)) = next else { break };
            if s.used + bytes > self.max {
                break;
            }
            let w = s.waiters.remove(&id).expect("just found");
            s.used += bytes;
            *s.held_by_ip.entry(w.ip).or_insert(0) += bytes;
            if w.granted.send(()).is_err() {
                // Its wait was cancelled between our lookup and now: impossible while we hold
                // the lock (a cancelled waiter removes itself under it), but stay exact.
                s.used -= bytes;
                if let Some(n) = s.held_by_ip.get_mut(&w.ip) {
                    *n -= bytes;
                    if *n == 0 {
                        s.held_by_ip.remove(&w.ip);
                    }
                }
            }
        }
    }

    /// Bytes taken now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        lock(&self.state).used
    }
}

/// At most one warning per this interval about connections refused at accept (per-address
/// limit, refused address), and per address about its failed handshakes; the others are
/// counted in the next one.
pub(crate) const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Rate limit of a warning: at most one per [`REFUSAL_LOG_INTERVAL`].
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LogThrottle {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogThrottle {
    /// `Some(n)`: log now, `n` events were not logged since the last time.
    pub(crate) fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < REFUSAL_LOG_INTERVAL => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// First failures from one address within [`AUTH_FAILURE_WINDOW`] answered at once.
pub(crate) const AUTH_FAILURES_FREE: u32 = 5;
/// The refusal of each failure after the free ones is delayed by this, doubled per further
/// failure up to [`AUTH_FAILURE_DELAY_MAX`].
pub(crate) const AUTH_FAILURE_DELAY_START: Duration = Duration::from_millis(100);
/// Longest delay of a refusal.
pub(crate) const AUTH_FAILURE_DELAY_MAX: Duration = Duration::from_secs(2);
/// An address with this many failures within the window is refused outright (its connections
/// closed when accepted) until the window ends.
pub(crate) const AUTH_FAILURES_REFUSE: u32 = 10;
/// Failures are counted over a window that ends this long after the last one.
pub(crate) const AUTH_FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Addresses tracked at once; beyond it the ones whose window has ended are forgotten first,
/// then the oldest, so that a flood of addresses cannot grow the table without bound.
const AUTH_FAILURE_ADDRESSES_MAX: usize = 4096;

/// Failed handshakes (unknown or missing token) per client address.
#[derive(Debug, Default)]
pub(crate) struct AuthFailures {
    state: Mutex<HashMap<IpAddr, FailureRecord>>,
}

#[derive(Debug, Clone, Copy)]
struct FailureRecord {
    count: u32,
    last: Instant,
    log: LogThrottle,
}

/// What to do about one failed handshake.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct FailureVerdict {
    /// Failures from the address within the window, this one included.
    pub(crate) count: u32,
    /// How long to hold the refusal back.
    pub(crate) delay: Duration,
    /// `Some(n)`: warn now, `n` earlier failures from the address were not warned about.
    pub(crate) warn: Option<u64>,
}

impl AuthFailures {
    /// Records a failed handshake from `ip` at `now`.
    pub(crate) fn failed(&self, ip: IpAddr, now: Instant) -> FailureVerdict {
        let mut s = lock(&self.state);
        if s.len() >= AUTH_FAILURE_ADDRESSES_MAX && !s.contains_key(&ip) {
            s.retain(|_, r| now.saturating_duration_since(r.last) < AUTH_FAILURE_WINDOW);
            if s.len() >= AUTH_FAILURE_ADDRESSES_MAX {
                if let Some(oldest) = s.iter().min_by_key(|(_, r)| r.last).map(|(ip, _)| *ip) {
                    s.remove(&oldest);
                }
            }
        }
        let r = s.entry(ip).or_insert(FailureRecord {
            count: 0,
            last: now,
            log: LogThrottle::default(),
        });
        if now.saturating_duration_since(r.last) >= AUTH_FAILURE_WINDOW {
            r.count = 0;
        }
        r.count = r.count.saturating_add(1);
        r.last = now;
        let warn = r.log.allow(now);
        let delay = match r.count.checked_sub(AUTH_FAILURES_FREE + 1) {
            None => Duration::ZERO,
            Some(k) => AUTH_FAILURE_DELAY_START
                .saturating_mul(1u32 << k.min(16))
                .min(AUTH_FAILURE_DELAY_MAX),
        };
        FailureVerdict {
            count: r.count,
            delay,
            warn,
        }
    }

    /// A successful handshake from `ip`: its failures are forgotten.
    pub(crate) fn succeeded(&self, ip: IpAddr) {
        let mut s = lock(&self.state);
        if !s.is_empty() {
            s.remove(&ip);
        }
    }

    /// Whether connections from `ip` are refused at `now` (too many recent failures), and
    /// until when.
    pub(crate) fn refused_until(&self, ip: IpAddr, now: Instant) -> Option<Instant> {
        let s = lock(&self.state);
        let r = s.get(&ip)?;
        let until = r.last + AUTH_FAILURE_WINDOW;
        (r.count >= AUTH_FAILURES_REFUSE && now < until).then_some(until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn connections_per_address_are_limited_and_given_back() {
        // Goal: one address cannot hold more than its share; a closed connection frees it.
        let a = Admission::new(2, 8);
        let x = ip("127.0.0.1");
        let s1 = a.admit(x).unwrap();
        let _s2 = a.admit(x).unwrap();
        assert!(a.admit(x).is_none(), "third connection from one address");
        assert!(a.admit(ip("127.0.0.2")).is_some(), "another address");
        drop(s1);
        assert_eq!(a.open_from(x), 1);
        assert!(a.admit(x).is_some());
    }

    #[test]
    fn the_oldest_handshake_is_evicted_at_the_limit() {
        // Goal: at `handshakes_max`, a new connection closes the one longest in its handshake,
        // and a finished handshake no longer counts.
        let a = Admission::new(100, 2);
        let mut h1 = a.start_handshake();
        let mut h2 = a.start_handshake();
        h2.evicted.try_recv().unwrap_err();
        let mut h3 = a.start_handshake();
        assert!(h1.evicted.try_recv().is_ok(), "the oldest was evicted");
        assert!(h2.evicted.try_recv().is_err());
        h2.done();
        let _h4 = a.start_handshake();
        assert!(
            h3.evicted.try_recv().is_err(),
            "room was made by the finished one"
        );
        assert!(a.evict_oldest_handshake());
        assert!(h3.evicted.try_recv().is_ok());
    }

    #[tokio::test]
    async fn freed_response_bytes_go_to_the_address_holding_least() {
        // Goal: an address that holds the pool cannot keep another address waiting behind its
        // own queued requests; the pool never gives more than its size.
        let pool = ResponsePool::new(100);
        let held = Arc::new(AtomicUsize::new(0));
        let (hog, other) = (ip("127.0.0.1"), ip("127.0.0.2"));
        let g1 = pool.acquire(hog, 60, &held).await;
        let g2 = pool.acquire(hog, 40, &held).await;
        assert_eq!(pool.used(), 100);
        let p = pool.clone();
        let h = held.clone();
        let hog_waits = tokio::spawn(async move { p.acquire(hog, 50, &h).await });
        tokio::task::yield_now().await;
        let p = pool.clone();
        let h = held.clone();
        let other_waits = tokio::spawn(async move { p.acquire(other, 50, &h).await });
        while !pool.under_pressure() || lock(&pool.state).waiters.len() < 2 {
            tokio::task::yield_now().await;
        }
        drop(g1);
        let got = other_waits.await.unwrap();
        assert!(
            !hog_waits.is_finished(),
            "the hog waited first but holds more"
        );
        drop(got);
        drop(g2);
        let g3 = hog_waits.await.unwrap();
        assert_eq!(pool.used(), 50);
        drop(g3);
        assert_eq!(pool.used(), 0);
        assert_eq!(held.load(Ordering::Acquire), 0);
        assert!(!pool.under_pressure());

        // A cancelled wait leaves nothing behind.
        let g = pool.acquire(hog, 100, &held).await;
        let p = pool.clone();
        let h = held.clone();
        let cancelled = tokio::spawn(async move { p.acquire(other, 10, &h).await });
        while !pool.under_pressure() {
            tokio::task::yield_now().await;
        }
        cancelled.abort();
        let _ = cancelled.await;
        drop(g);
        assert_eq!(pool.used(), 0);
        assert!(!pool.under_pressure());
    }

    #[test]
    fn repeated_auth_failures_are_delayed_then_refused_and_warned_rarely() {
        // Goal: the first failures are answered at once, then each is held back longer, up to
        // a cap; an address that keeps failing is refused until its window ends; warnings are
        // at most one per interval per address; a success forgets the address.
        let f = AuthFailures::default();
        let x = ip("127.0.0.1");
        let mut now = Instant::now();
        let mut warned = 0;
        let mut delays = Vec::new();
        for _ in 0..20 {
            let v = f.failed(x, now);
            warned += usize::from(v.warn.is_some());
            delays.push(v.delay);
            now += Duration::from_millis(10);
        }
        assert!(delays[..AUTH_FAILURES_FREE as usize]
            .iter()
            .all(|d| d.is_zero()));
        assert_eq!(
            delays[AUTH_FAILURES_FREE as usize],
            AUTH_FAILURE_DELAY_START
        );
        assert!(delays.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*delays.last().unwrap(), AUTH_FAILURE_DELAY_MAX);
        assert_eq!(warned, 1, "one warning within the log interval");
        assert!(f.refused_until(x, now).is_some());
        assert!(f.refused_until(ip("127.0.0.2"), now).is_none());
        let later = now + REFUSAL_LOG_INTERVAL;
        let v = f.failed(x, later);
        assert_eq!(v.warn, Some(19));
        assert!(f.refused_until(x, later + AUTH_FAILURE_WINDOW).is_none());
        f.succeeded(x);
        assert!(f.refused_until(x, later).is_none());
        assert_eq!(f.failed(x, later).delay, Duration::ZERO);
    }
}

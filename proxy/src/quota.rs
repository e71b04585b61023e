//! Write rate limits and quotas (issue 29 item 4; docs/proxy-protocol.md, "Limits"): records
//! per second, record payload bytes per second and outstanding writes, at three scopes:
//!
//! * `proxy`: everything this proxy writes (`[limits] proxy_*`; DistributedLog's
//!   `rpsHardServiceLimit`, `bpsHardServiceLimit`);
//! * `stream`: one stream's writes, at its owner (the stream record's `limits`, set with
//!   `SET_LIMITS`, else `[limits] stream_*`; DL's per-stream `rpsHardWriteLimit`,
//!   `bpsHardWriteLimit`, `perWriterOutstandingWriteLimit`);
//! * `token`: one tenant's writes through this proxy (the `[[token]]` entry's limits in
//!   `auth_tokens_file`).
//!
//! A write is charged to every scope it belongs to and refused with `OVER_CAPACITY` (DL 517),
//! nothing charged and nothing written, when any hard limit would be exceeded. A soft limit
//! never refuses: the write is counted (`quire_proxy_limit_soft_exceeded`) and logged at most
//! once a second. Rates are token buckets whose burst is one second of the rate; a write
//! larger than the burst passes when the bucket is full and leaves it in debt.
//!
//! The proxy and token scopes are per proxy: with N proxies a tenant can write N times its
//! quota (DistributedLog's service limits have the same property).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

pub use quire_metadata::RateLimits;

use crate::limits::LogThrottle;

/// Idle per-stream and per-token entries are forgotten past this many entries (only those
/// with no outstanding write and full buckets, which a new entry reproduces exactly).
const ENTRIES_SOFT_MAX: usize = 4096;

/// The `[limits]` defaults: the proxy scope, and every stream without limits of its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitConfig {
    /// Limits on everything this proxy writes.
    pub proxy: RateLimits,
    /// Limits of each stream whose record sets none.
    pub stream: RateLimits,
}

/// A token bucket of `rate` units per second holding at most one second's worth. Time is
/// passed in (`now`, from any fixed origin) so tests are deterministic.
#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    rate: f64,
    level: f64,
    at: Duration,
}

impl Bucket {
    /// A full bucket of `rate` per second.
    pub(crate) fn new(rate: u64, now: Duration) -> Self {
        Self {
            rate: rate as f64,
            level: rate as f64,
            at: now,
        }
    }

    fn refill(&mut self, now: Duration) {
        let dt = now.saturating_sub(self.at).as_secs_f64();
        self.level = (self.level + dt * self.rate).min(self.rate);
        self.at = self.at.max(now);
    }

    /// Whether `n` units may be taken now (a full bucket passes any `n`).
    pub(crate) fn has(&mut self, n: u64, now: Duration) -> bool {
        self.refill(now);
        self.level >= (n as f64).min(self.rate)
    }

    /// Takes `n` units (after [`Bucket::has`]); the level may go below zero.
    pub(crate) fn take(&mut self, n: u64) {
        self.level -= n as f64;
    }

    fn is_full(&mut self, now: Duration) -> bool {
        self.refill(now);
        self.level >= self.rate
    }
}

/// The buckets and outstanding count of one scope.
#[derive(Debug)]
struct Scope {
    limits: RateLimits,
    /// Hard records, hard bytes, soft records, soft bytes (`None`: that limit is off).
    buckets: [Option<Bucket>; 4],
    outstanding: u64,
}

/// Limit names, in the order of [`Scope::buckets`].
const KINDS: [&str; 4] = ["records", "bytes", "records", "bytes"];

impl Scope {
    fn new(limits: RateLimits, now: Duration) -> Self {
        let b = |r: u64| (r > 0).then(|| Bucket::new(r, now));
        Self {
            limits,
            buckets: [
                b(limits.records_per_sec),
                b(limits.bytes_per_sec),
                b(limits.soft_records_per_sec),
                b(limits.soft_bytes_per_sec),
            ],
            outstanding: 0,
        }
    }

    /// The first hard limit the write would exceed: (kind, detail).
    fn hard_refusal(&mut self, records: u64, bytes: u64, now: Duration) -> Option<Refused> {
        let max = self.limits.outstanding_writes_max;
        if max > 0 && self.outstanding >= max {
            return Some(("outstanding", format!("{max} writes outstanding")));
        }
        for (i, n) in [records, bytes].into_iter().enumerate() {
            if let Some(b) = &mut self.buckets[i] {
                if !b.has(n, now) {
                    let rate = [self.limits.records_per_sec, self.limits.bytes_per_sec][i];
                    return Some((KINDS[i], format!("{rate} {}/s", KINDS[i])));
                }
            }
        }
        None
    }

    /// Charges an admitted write; returns the kinds of soft limits it exceeds.
    fn charge(&mut self, records: u64, bytes: u64, now: Duration) -> Vec<&'static str> {
        self.outstanding += 1;
        let mut soft = Vec::new();
        for (i, n) in [records, bytes, records, bytes].into_iter().enumerate() {
            if let Some(b) = &mut self.buckets[i] {
                if i < 2 || b.has(n, now) {
                    b.take(n);
                } else {
                    // Over a soft rate: counted, not charged, so the count is the excess.
                    soft.push(KINDS[i]);
                }
            }
        }
        soft
    }

    fn idle(&mut self, now: Duration) -> bool {
        self.outstanding == 0 && self.buckets.iter_mut().flatten().all(|b| b.is_full(now))
    }
}

type Refused = (&'static str, String);

#[derive(Debug, Default)]
struct State {
    proxy: Option<Scope>,
    streams: HashMap<String, Scope>,
    tokens: HashMap<String, Scope>,
    soft_log: LogThrottle,
}

/// The limiter shared by every connection of one proxy server.
#[derive(Debug)]
pub struct Limiter {
    config: LimitConfig,
    origin: Instant,
    state: Mutex<State>,
}

/// A write refused by a hard limit (`OVER_CAPACITY`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `proxy`, `stream` or `token`.
    pub scope: &'static str,
    /// `records`, `bytes` or `outstanding`.
    pub kind: &'static str,
    /// The limit, for the error message (`100 records/s`).
    pub detail: String,
}

/// What one write asks of the limiter.
#[derive(Debug, Clone, Copy)]
pub struct Charge<'a> {
    /// The stream written.
    pub stream: &'a str,
    /// The stream record's own limits, if it has some.
    pub stream_limits: Option<RateLimits>,
    /// The token's name and limits, on a proxy that requires tokens.
    pub token: Option<(&'a str, RateLimits)>,
    /// Records in the write.
    pub records: u64,
    /// Record payload bytes in the write.
    pub bytes: u64,
}

/// An admitted write's place in the outstanding counts, given back when dropped (once its
/// answer is queued). `soft` lists the soft limits it exceeded, as (scope, kind).
#[derive(Debug)]
pub struct Admitted {
    limiter: Option<Arc<Limiter>>,
    stream: Option<String>,
    token: Option<String>,
    proxy: bool,
    /// Soft limits this write exceeded: (scope, kind).
    pub soft: Vec<(&'static str, &'static str)>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let Some(l) = &self.limiter else { return };
        let mut s = l.state.lock().unwrap_or_else(|p| p.into_inner());
        let dec = |sc: Option<&mut Scope>| {
            if let Some(sc) = sc {
                sc.outstanding = sc.outstanding.saturating_sub(1);
            }
        };
        if self.proxy {
            dec(s.proxy.as_mut());
        }
        if let Some(st) = &self.stream {
            dec(s.streams.get_mut(st));
        }
        if let Some(t) = &self.token {
            dec(s.tokens.get_mut(t));
        }
    }
}

impl Limiter {
    /// A limiter with the `[limits]` defaults `config`.
    pub fn new(config: LimitConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
            origin: Instant::now(),
            state: Mutex::default(),
        })
    }

    /// Admits or refuses one write now; see [`Limiter::admit_at`].
    ///
    /// # Errors
    /// [`Refusal`]: the first hard limit (proxy, then stream, then token) the write exceeds.
    pub fn admit(self: &Arc<Self>, c: Charge<'_>) -> Result<Admitted, Refusal> {
        self.admit_at(c, self.origin.elapsed())
    }

    /// Admits a write at time `now` (from the limiter's origin): refused if any scope's hard
    /// limit would be exceeded (nothing is charged then), else charged to every scope.
    ///
    /// # Errors
    /// [`Refusal`], naming the scope and the limit.
    pub fn admit_at(self: &Arc<Self>, c: Charge<'_>, now: Duration) -> Result<Admitted, Refusal> {
        let stream_limits = c.stream_limits.unwrap_or(self.config.stream);
        let token_limits = c.token.map(|t| t.1).unwrap_or_default();
        let proxy_on = !self.config.proxy.is_unlimited();
        let mut admitted = Admitted {
            limiter: None,
            stream: None,
            token: None,
            proxy: proxy_on,
            soft: Vec::new(),
        };
        if !proxy_on && stream_limits.is_unlimited() && token_limits.is_unlimited() {
            return Ok(admitted);
        }
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let s = &mut *guard;
        if s.streams.len() + s.tokens.len() > ENTRIES_SOFT_MAX {
            s.streams.retain(|_, sc| !sc.idle(now));
            s.tokens.retain(|_, sc| !sc.idle(now));
        }
        let mut scopes: Vec<(&'static str, &mut Scope)> = Vec::with_capacity(3);
        if proxy_on {
            let p = s
                .proxy
                .get_or_insert_with(|| Scope::new(self.config.proxy, now));
            scopes.push(("proxy", p));
        }
        if !stream_limits.is_unlimited() {
            scopes.push((
                "stream",
                scope_of(&mut s.streams, c.stream, stream_limits, now),
            ));
            admitted.stream = Some(c.stream.to_string());
        }
        if let Some((name, limits)) = c.token {
            scopes.push(("token", scope_of(&mut s.tokens, name, limits, now)));
            admitted.token = Some(name.to_string());
        }
        for (scope, sc) in scopes.iter_mut() {
            if let Some((kind, detail)) = sc.hard_refusal(c.records, c.bytes, now) {
                return Err(Refusal {
                    scope,
                    kind,
                    detail,
                });
            }
        }
        for (scope, sc) in scopes {
            for kind in sc.charge(c.records, c.bytes, now) {
                admitted.soft.push((scope, kind));
            }
        }
        if !admitted.soft.is_empty() {
            let at = self.origin + now;
            if let Some(suppressed) = s.soft_log.allow(at) {
                tracing::warn!(stream = c.stream, token = ?c.token.map(|t| t.0),
                    exceeded = ?admitted.soft, suppressed,
                    "write over a soft limit (accepted; counted in quire_proxy_limit_soft_exceeded)");
            }
        }
        admitted.limiter = Some(self.clone());
        Ok(admitted)
    }
}

/// The scope of `name` in `map`, made (or remade, when its limits changed) with `limits`.
fn scope_of<'m>(
    map: &'m mut HashMap<String, Scope>,
    name: &str,
    limits: RateLimits,
    now: Duration,
) -> &'m mut Scope {
    let sc = map
        .entry(name.to_string())
        .or_insert_with(|| Scope::new(limits, now));
    if sc.limits != limits {
        let outstanding = sc.outstanding;
        *sc = Scope::new(limits, now);
        sc.outstanding = outstanding;
    }
    sc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_bucket_refills_at_its_rate_up_to_one_second() {
        // Goal: the bucket's arithmetic, with an injected clock.
        let mut b = Bucket::new(100, ms(0));
        assert!(b.has(100, ms(0)));
        b.take(100);
        assert!(!b.has(1, ms(0)));
        assert!(!b.has(11, ms(100)), "10 units back after 100 ms");
        assert!(b.has(10, ms(100)));
        b.take(10);
        // Long idle: never more than one second's worth.
        assert!(b.has(100, ms(60_000)));
        b.take(100);
        assert!(!b.has(1, ms(60_000)));
        // A take larger than the burst passes on a full bucket and leaves it in debt.
        let mut big = Bucket::new(10, ms(0));
        assert!(big.has(50, ms(0)));
        big.take(50);
        assert!(!big.has(1, ms(4_000)), "still 10 in debt after 4 s");
        assert!(big.has(10, ms(6_000)));
    }

    fn charge<'a>(stream: &'a str, token: Option<(&'a str, RateLimits)>, n: u64) -> Charge<'a> {
        Charge {
            stream,
            stream_limits: None,
            token,
            records: n,
            bytes: n * 100,
        }
    }

    #[test]
    fn every_scope_is_charged_and_any_hard_limit_refuses() {
        let per_stream = RateLimits {
            records_per_sec: 10,
            ..Default::default()
        };
        let l = Limiter::new(LimitConfig {
            proxy: RateLimits {
                bytes_per_sec: 3_000,
                ..Default::default()
            },
            stream: per_stream,
        });
        let t = RateLimits {
            records_per_sec: 15,
            ..Default::default()
        };
        let tok = Some(("tenant", t));
        assert!(l.admit_at(charge("a", tok, 10), ms(0)).is_ok());
        let e = l.admit_at(charge("a", tok, 1), ms(0)).unwrap_err();
        assert_eq!((e.scope, e.kind), ("stream", "records"));
        // Another stream of the same tenant: the token has 5 left.
        let e = l.admit_at(charge("b", tok, 6), ms(0)).unwrap_err();
        assert_eq!((e.scope, e.kind), ("token", "records"));
        // The refusal charged nothing: 5 still pass.
        assert!(l.admit_at(charge("b", tok, 5), ms(0)).is_ok());
        // The proxy's bytes: 1,500 of 3,000 used; a tokenless write of 16 records is refused
        // by the proxy (1,600 bytes) before the stream is asked.
        let e = l.admit_at(charge("c", None, 16), ms(0)).unwrap_err();
        assert_eq!((e.scope, e.kind), ("proxy", "bytes"));
        // A stream's own limits replace the default.
        let own = Charge {
            stream_limits: Some(RateLimits {
                records_per_sec: 1_000,
                ..Default::default()
            }),
            ..charge("a", None, 12)
        };
        assert!(l.admit_at(own, ms(0)).is_ok());
    }

    #[test]
    fn outstanding_writes_are_given_back_when_answered() {
        let l = Limiter::new(LimitConfig {
            proxy: RateLimits::default(),
            stream: RateLimits {
                outstanding_writes_max: 2,
                ..Default::default()
            },
        });
        let a = l.admit_at(charge("s", None, 1), ms(0)).unwrap();
        let _b = l.admit_at(charge("s", None, 1), ms(0)).unwrap();
        let e = l.admit_at(charge("s", None, 1), ms(0)).unwrap_err();
        assert_eq!((e.scope, e.kind), ("stream", "outstanding"));
        assert!(l.admit_at(charge("other", None, 1), ms(0)).is_ok());
        drop(a);
        assert!(l.admit_at(charge("s", None, 1), ms(0)).is_ok());
    }

    #[test]
    fn soft_limits_only_count_and_no_limits_keep_no_state() {
        let l = Limiter::new(LimitConfig {
            proxy: RateLimits {
                soft_records_per_sec: 5,
                ..Default::default()
            },
            stream: RateLimits::default(),
        });
        let a = l.admit_at(charge("s", None, 5), ms(0)).unwrap();
        assert!(a.soft.is_empty());
        let b = l.admit_at(charge("s", None, 5), ms(0)).unwrap();
        assert_eq!(b.soft, vec![("proxy", "records")]);
        let c = l.admit_at(charge("s", None, 5), ms(1_000)).unwrap();
        assert!(c.soft.is_empty(), "refilled after a second");
        let off = Limiter::new(LimitConfig::default());
        for i in 0..100 {
            assert!(off
                .admit_at(charge(&format!("s{i}"), None, 1_000), ms(0))
                .is_ok());
        }
        assert!(off.state.lock().unwrap().streams.is_empty());
    }
}

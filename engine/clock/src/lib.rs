//! The one place Quire reads the time and draws non-cryptographic randomness (issue 25, item 5).
//!
//! Every crate of the workspace calls [`now`], [`system_now`], [`elapsed`], [`rng`] and
//! [`random`] instead of `Instant::now`, `SystemTime::now`, `Instant::elapsed`,
//! `rand::thread_rng` and `rand::random`; the workspace's `clippy.toml` forbids the latter
//! everywhere but in this crate (`disallowed-methods`), so a new call site cannot bypass the seam.
//!
//! # Shape, and why
//!
//! * **Free functions reading real time by default.** Production code calls `quire_clock::now()`
//!   where it called `Instant::now()`: same line, same type, no clock value to thread through
//!   every constructor. The only cost is one read of a `const`-initialised thread-local `Cell`
//!   (no lazy init, no destructor) before the real clock is read: below what a loop can measure
//!   beside `clock_gettime` (23 ns per call for both on the 2-core development machine, test
//!   `now_costs_little_beside_the_real_clock`).
//!   No cargo feature: a feature on this crate would change the hash of every crate above it and
//!   make the test and release builds compile the workspace twice.
//! * **Per thread.** A [`ManualClock`] or a [`SeededRng`] is installed for the current thread
//!   only. Quire's executors are single-threaded (one glommio executor per bookie shard, tokio
//!   current-thread runtimes in tests and the coming simulator), so a test or a simulator that
//!   runs one node per thread drives that node's time and randomness, and tests running in
//!   parallel never see each other's clock. A tokio *multi-thread* runtime moves tasks between
//!   threads: install nothing there, or install the same clock on every worker.
//! * **Guards.** Installing returns a guard; dropping it restores what was installed before (real
//!   time, or an outer manual clock), so a panicking test cannot leak its clock into the next test
//!   run on the same thread.
//!
//! A `Clock` value passed into every component was considered: it makes the dependency visible in
//! signatures, but it has to be threaded through the constructor of every component that reads
//! time (engine subsystems, bookie connections, the ledger client, stream writers, the perf
//! loader), through six crates, and a simulator still needs one clock per node, i.e. per executor
//! thread, which is what the thread-local gives without touching those signatures.
//!
//! # What the seam does not cover
//!
//! * **Runtime timers.** `glommio::timer::sleep` and `tokio::time::{sleep, sleep_until}` keep
//!   running on real time, and `tokio::time::Instant` (used for tokio deadlines) is tokio's own
//!   clock, which tokio's `test-util` `pause`/`advance` drives; mixing the two would make a
//!   deadline computed on a manual clock fire at the wrong real time. Code under a manual clock
//!   sees time move only when the test advances it; its sleeps still take real time.
//! * **Secrets.** Keys, tokens, cookies and ledger secrets come from cryptographic generators
//!   seeded by the OS and must never be seedable: `ring::rand::SystemRandom` (the cluster secret
//!   and the bookie handshake's nonces, bookie/wire/src/auth.rs), `OsRng` for proxy tokens
//!   (tools/src/token.rs) and `rand::thread_rng` for a ledger's secret (proxy/ledger, allowed
//!   there by name).
//! * **The journal's salt** (engine/src/journal/files.rs, `getrandom`): not a secret, but it
//!   must differ between uses of a journal file, also across a restart; a seeded generator
//!   re-installed with the same seed after a simulated crash would repeat it and let an earlier
//!   use's records pass as current. It stays on the OS source.
//!
//! The seam is for jitter, placement shuffles, ids and every reading of time.

// The seam is the one place allowed to read the real clock and the thread's RNG (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::time::{Duration, Instant, SystemTime};

use rand::rngs::{StdRng, ThreadRng};
use rand::{RngCore, SeedableRng};

/// A manual reading of both clocks: the monotonic one and the wall clock, advanced together.
#[derive(Debug, Clone, Copy)]
struct Manual {
    instant: Instant,
    system: SystemTime,
}

thread_local! {
    static MANUAL: Cell<Option<Manual>> = const { Cell::new(None) };
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Now on the monotonic clock: `Instant::now()`, or this thread's [`ManualClock`] if one is
/// installed.
#[inline]
pub fn now() -> Instant {
    match MANUAL.with(Cell::get) {
        Some(m) => m.instant,
        None => Instant::now(),
    }
}

/// Now on the wall clock: `SystemTime::now()`, or this thread's [`ManualClock`] if one is
/// installed.
#[inline]
pub fn system_now() -> SystemTime {
    match MANUAL.with(Cell::get) {
        Some(m) => m.system,
        None => SystemTime::now(),
    }
}

/// Time since `since` on [`now`]'s clock (zero if `since` is later): `since.elapsed()` through
/// the seam.
#[inline]
pub fn elapsed(since: Instant) -> Duration {
    now().saturating_duration_since(since)
}

/// Milliseconds since the Unix epoch on [`system_now`]'s clock (0 for a clock before 1970).
#[inline]
pub fn unix_ms() -> u64 {
    system_now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The non-cryptographic random source for the current thread: `rand::thread_rng()`, or this
/// thread's [`SeededRng`] if one is installed. Use it at once (`shuffle(&mut quire_clock::rng())`);
/// it is `!Send`. Not for secrets (see the crate docs).
#[inline]
pub fn rng() -> Rng {
    if SEEDED.with(|s| s.borrow().is_some()) {
        Rng(Source::Seeded)
    } else {
        Rng(Source::Thread(rand::thread_rng()))
    }
}

/// A random value from [`rng`]: `rand::random()` through the seam.
pub fn random<T>() -> T
where
    rand::distributions::Standard: rand::distributions::Distribution<T>,
{
    rand::Rng::gen(&mut rng())
}

/// The handle [`rng`] returns; implements [`rand::RngCore`], so every `rand::Rng` method applies.
#[derive(Debug)]
pub struct Rng(Source);

#[derive(Debug)]
enum Source {
    Thread(ThreadRng),
    /// Draws from this thread's seeded generator at each call (or, if its guard was dropped
    /// since, from the thread's real generator).
    Seeded,
}

impl Rng {
    fn with<R>(&mut self, f: impl FnOnce(&mut dyn RngCore) -> R) -> R {
        match &mut self.0 {
            Source::Thread(t) => f(t),
            Source::Seeded => SEEDED.with(|s| match s.borrow_mut().as_mut() {
                Some(r) => f(r),
                None => f(&mut rand::thread_rng()),
            }),
        }
    }
}

impl RngCore for Rng {
    fn next_u32(&mut self) -> u32 {
        self.with(|r| r.next_u32())
    }
    fn next_u64(&mut self) -> u64 {
        self.with(|r| r.next_u64())
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.with(|r| r.fill_bytes(dest))
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.with(|r| r.try_fill_bytes(dest))
    }
}

/// A manual clock for the current thread: [`now`] and [`system_now`] stand still until
/// [`ManualClock::advance`] moves them. Starts at the real time of installation. Dropping it
/// restores the clock installed before (real time unless clocks were nested). `!Send`: it belongs
/// to the thread it was installed on.
#[derive(Debug)]
#[must_use = "the manual clock is uninstalled when this guard is dropped"]
pub struct ManualClock {
    previous: Option<Manual>,
    _thread: PhantomData<*const ()>,
}

impl ManualClock {
    /// Installs a manual clock on this thread, reading the current real time.
    pub fn install() -> Self {
        Self::install_at(SystemTime::now())
    }

    /// Installs a manual clock on this thread whose wall clock reads `system` (the monotonic
    /// clock starts at the current real `Instant`; only its differences mean anything).
    pub fn install_at(system: SystemTime) -> Self {
        let m = Manual {
            instant: Instant::now(),
            system,
        };
        Self {
            previous: MANUAL.with(|c| c.replace(Some(m))),
            _thread: PhantomData,
        }
    }

    /// Moves both clocks of this thread forward by `by`.
    pub fn advance(&self, by: Duration) {
        MANUAL.with(|c| {
            let m = c
                .get()
                .expect("a manual clock is installed while its guard lives");
            c.set(Some(Manual {
                instant: m.instant + by,
                system: m.system + by,
            }));
        });
    }

    /// Sets the wall clock alone (an operator stepping it, NTP slewing it); the monotonic clock
    /// does not move, as on a real machine.
    pub fn set_system(&self, to: SystemTime) {
        MANUAL.with(|c| {
            let m = c
                .get()
                .expect("a manual clock is installed while its guard lives");
            c.set(Some(Manual { system: to, ..m }));
        });
    }
}

impl Drop for ManualClock {
    fn drop(&mut self) {
        MANUAL.with(|c| c.set(self.previous));
    }
}

/// A seeded, reproducible RNG for the current thread: [`rng`] and [`random`] draw from a
/// `StdRng` seeded with `seed` until the guard is dropped. `!Send`.
#[derive(Debug)]
#[must_use = "the seeded RNG is uninstalled when this guard is dropped"]
pub struct SeededRng {
    previous: Option<StdRng>,
    _thread: PhantomData<*const ()>,
}

impl SeededRng {
    /// Installs a `StdRng::seed_from_u64(seed)` on this thread.
    pub fn install(seed: u64) -> Self {
        Self {
            previous: SEEDED.with(|s| s.replace(Some(StdRng::seed_from_u64(seed)))),
            _thread: PhantomData,
        }
    }
}

impl Drop for SeededRng {
    fn drop(&mut self) {
        let previous = self.previous.take();
        SEEDED.with(|s| *s.borrow_mut() = previous);
    }
}

#[cfg(test)]
mod tests;

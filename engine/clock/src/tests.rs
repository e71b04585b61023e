use std::time::{Duration, Instant, SystemTime};

use rand::seq::SliceRandom;
use rand::Rng as _;

use super::*;

#[test]
fn the_manual_clock_moves_only_when_advanced() {
    let clock = ManualClock::install();
    let (t0, s0) = (now(), system_now());
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(now(), t0, "real time passed, the manual clock stood still");
    assert_eq!(system_now(), s0);
    assert_eq!(elapsed(t0), Duration::ZERO);

    clock.advance(Duration::from_secs(90));
    assert_eq!(now() - t0, Duration::from_secs(90));
    assert_eq!(
        system_now().duration_since(s0).unwrap(),
        Duration::from_secs(90)
    );
    assert_eq!(elapsed(t0), Duration::from_secs(90));

    // Stepping the wall clock back does not move the monotonic clock.
    clock.set_system(SystemTime::UNIX_EPOCH + Duration::from_millis(1_000));
    assert_eq!(unix_ms(), 1_000);
    assert_eq!(now() - t0, Duration::from_secs(90));

    drop(clock);
    let real = now();
    std::thread::sleep(Duration::from_millis(2));
    assert!(now() > real, "real time again once the guard is dropped");
}

#[test]
fn nested_clocks_restore_the_outer_one() {
    let outer = ManualClock::install();
    let t0 = now();
    {
        let inner = ManualClock::install_at(SystemTime::UNIX_EPOCH);
        inner.advance(Duration::from_secs(1));
        assert_eq!(unix_ms(), 1_000);
    }
    assert_eq!(now(), t0);
    outer.advance(Duration::from_millis(3));
    assert_eq!(now() - t0, Duration::from_millis(3));
}

#[test]
fn two_threads_do_not_see_each_others_manual_clock() {
    let clock = ManualClock::install();
    let t0 = now();
    clock.advance(Duration::from_secs(3600));
    let other = std::thread::spawn(|| {
        // Real time on this thread: it moves by itself and is not an hour ahead.
        let a = now();
        std::thread::sleep(Duration::from_millis(2));
        let b = now();
        let theirs = ManualClock::install();
        theirs.advance(Duration::from_secs(7));
        (a, b, now() - b)
    });
    let (a, b, advanced) = other.join().unwrap();
    assert!(b > a, "the other thread reads the real clock");
    assert!(a < t0 + Duration::from_secs(3600));
    assert!(advanced >= Duration::from_secs(7));
    // Its advance did not move ours.
    assert_eq!(now() - t0, Duration::from_secs(3600));
}

#[test]
fn a_seeded_rng_repeats_its_sequence() {
    let draw = || {
        let _seeded = SeededRng::install(42);
        let mut v: Vec<u32> = (0..16).collect();
        v.shuffle(&mut rng());
        (v, random::<u64>(), rng().gen_range(0..1_000_000u32))
    };
    let first = draw();
    assert_eq!(first, draw(), "same seed, same shuffle and draws");
    let other = {
        let _seeded = SeededRng::install(43);
        random::<u64>()
    };
    assert_ne!(first.1, other);
    // Unseeded again: the thread's real generator (two draws of 128 bits do not collide).
    assert_ne!(random::<u128>(), random::<u128>());
}

#[test]
fn a_seeded_rng_is_per_thread() {
    let _seeded = SeededRng::install(7);
    let here = random::<u64>();
    let there = std::thread::spawn(|| {
        let _seeded = SeededRng::install(7);
        random::<u64>()
    })
    .join()
    .unwrap();
    assert_eq!(
        here, there,
        "each thread has its own generator from the same seed"
    );
}

/// The seam costs little in production: `now()` against `Instant::now()`, printed with
/// `--nocapture`; the bound is loose (shared CI machines) and only catches a gross regression.
#[test]
fn now_costs_little_beside_the_real_clock() {
    const N: u32 = 200_000;
    let time = |f: &dyn Fn() -> Instant| {
        let t = Instant::now();
        for _ in 0..N {
            std::hint::black_box(f());
        }
        t.elapsed() / N
    };
    let (mut seam, mut real) = (Duration::MAX, Duration::MAX);
    for _ in 0..5 {
        real = real.min(time(&Instant::now));
        seam = seam.min(time(&now));
    }
    println!("Instant::now {real:?}, quire_clock::now {seam:?} per call");
    assert!(
        seam < real * 2 + Duration::from_nanos(20),
        "{seam:?} vs {real:?}"
    );
}

// Quire patch (QUIRE-PATCHES.md, "symmetric sleep fences"): this file used to issue
// `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` (or an `mprotect` TLB-shootdown trick) every
// time an executor went to sleep, and only a compiler fence on the waker's side. That is an
// asymmetric fence: cheap for wakers, but each sleep is a system call that interrupts (IPI)
// every CPU currently running a thread of the process. With several executors per process
// (a Quire bookie has one per shard, the sandbox three bookies) executors sleep thousands of
// times a second, and the IPIs cost more than everything the wakers save.
//
// The protocol these fences serve (`SleepNotifier` in sys/mod.rs, `Reactor::wait` in
// sys/uring.rs) is Dekker's:
//
//   sleeper                                   waker (another thread)
//   S1: should_notify.store(true)             W1: publish (push to a channel, queue a waker)
//   S2: sleeper_fence()                       W2: waker_fence()
//   S3: look at every channel and queue       W3: should_notify.compare_exchange(true, false)
//   S4: nothing found -> sleep until the          and, if it succeeded, write the eventfd
//       eventfd (or I/O, or a timer) fires
//
// Both fences are SeqCst, so they are ordered in the single total order S of SeqCst
// operations. If S2 precedes W2 in S, then W3, which is sequenced after W2, reads the value
// stored by S1 or a later one (C++20 [atomics.order]: a modification sequenced before a SeqCst
// fence X is seen by a read sequenced after a SeqCst fence Y that follows X in S). Reading
// `true`, the waker writes the eventfd, whose counter the sleeper's pending eventfd read
// consumes even if the write comes before the sleeper is in the kernel. A later value is
// `false`, written by the sleeper's own `wake_up()` once it woke, or by another waker's
// successful exchange, which then writes the eventfd and so wakes the sleeper. Either way the
// sleeper is or will be awake and runs another round before it can sleep again; that round's
// S1 comes after the `false` that W3 read in the modification order, so by the same rule its
// fence cannot precede W2 in S (W3 would then have read that `true` or later): that round is
// the next case. If W2 precedes S2 in S, then S3 (sequenced after S2) sees W1,
// or a later state of the channel, and the sleeper does not sleep. Either way a published
// item is never left behind a sleeping executor. The rule needs both fences; the exchange's
// own ordering does not matter. A SeqCst fence is one `mfence` (or locked instruction) on
// x86-64, tens of nanoseconds at most, on each side.

use core::sync::atomic;

/// The sleeper's fence: between storing `should_notify = true` and the last look at remote
/// channels and queued wakers before sleeping. Pairs with [`waker_fence`].
#[inline]
pub(crate) fn sleeper_fence() {
    atomic::fence(atomic::Ordering::SeqCst);
}

/// The waker's fence: between publishing work for another executor and reading its
/// `should_notify`. Pairs with [`sleeper_fence`].
#[inline]
pub(crate) fn waker_fence() {
    atomic::fence(atomic::Ordering::SeqCst);
}

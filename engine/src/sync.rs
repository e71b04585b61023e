//! Tiny single-threaded synchronisation helpers (shard-local, `!Send`).

use std::cell::{Cell, RefCell};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

/// The engine's closed flag, one shared copy per engine: set once by `Engine::close`, read by
/// every background task (journal writer, checkpointer, merger, garbage collection) to stop at
/// its next step.
#[derive(Clone, Default)]
pub(crate) struct Closed(Rc<Cell<bool>>);

impl Closed {
    /// Whether the engine is closed.
    pub fn get(&self) -> bool {
        self.0.get()
    }

    /// Marks the engine closed; returns whether it already was.
    pub fn close(&self) -> bool {
        self.0.replace(true)
    }
}

/// A level-triggered wake-up flag with one waiter: `notify` sets it, `wait` resolves once it is
/// set and clears it.
#[derive(Default)]
pub struct Signal {
    set: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Signal {
    pub fn notify(&self) {
        self.set.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    pub async fn wait(&self) {
        poll_fn(|cx| {
            if self.set.replace(false) {
                Poll::Ready(())
            } else {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// A one-shot result slot shared by a producer and one consumer.
pub struct Completion<T> {
    value: RefCell<Option<T>>,
    waker: RefCell<Option<Waker>>,
}

impl<T> Completion<T> {
    pub fn new() -> Rc<Self> {
        Rc::new(Self {
            value: RefCell::new(None),
            waker: RefCell::new(None),
        })
    }

    pub fn complete(&self, v: T) {
        let old = self.value.borrow_mut().replace(v);
        assert!(old.is_none(), "a completion is completed once");
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    pub async fn wait(&self) -> T {
        poll_fn(|cx| match self.value.borrow_mut().take() {
            Some(v) => Poll::Ready(v),
            None => {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// A broadcast wake-up for any number of waiters, with a generation counter: `notify_all`
/// bumps the generation and wakes everyone registered; a waiter that saw generation `g`
/// resolves once the generation differs from `g`. No busy polling; waiters that go away
/// (dropped futures) unregister themselves.
///
/// Registering, re-polling and unregistering a waiter are O(1) (wakers in a map by waiter id),
/// so n parked waiters (long polls of one ledger) cost O(n) in all, not O(n²).
#[derive(Default)]
pub struct Notify {
    generation: Cell<u64>,
    next_id: Cell<u64>,
    wakers: RefCell<HashMap<WaiterId, Waker>>,
}

/// The key of one waiter of a [`Notify`]. `Hash` and `PartialEq` are written out (both over
/// the id alone) only so that unit tests can count the comparisons.
#[derive(Clone, Copy, Debug)]
struct WaiterId(u64);

impl std::hash::Hash for WaiterId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl PartialEq for WaiterId {
    fn eq(&self, other: &Self) -> bool {
        #[cfg(test)]
        tests::WAITER_ID_COMPARISONS.with(|c| c.set(c.get() + 1));
        self.0 == other.0
    }
}

impl Eq for WaiterId {}

impl Notify {
    pub fn generation(&self) -> u64 {
        self.generation.get()
    }

    /// Bumps the generation and wakes every registered waiter, in the order they registered.
    /// O(n log n) in the waiters.
    pub fn notify_all(&self) {
        self.generation.set(self.generation.get().wrapping_add(1));
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        // In the order the waiters registered (the map has none), so that waiters competing
        // for room run first come, first served.
        let mut wakers: Vec<(WaiterId, Waker)> = wakers.into_iter().collect();
        wakers.sort_unstable_by_key(|(id, _)| id.0);
        for (_, w) in wakers {
            w.wake();
        }
    }

    /// Resolves once `notify_all` ran after the generation was `seen`.
    pub async fn changed_since(&self, seen: u64) {
        struct Unregister<'a>(&'a Notify, WaiterId);
        impl Drop for Unregister<'_> {
            fn drop(&mut self) {
                self.0.wakers.borrow_mut().remove(&self.1);
            }
        }
        let id = WaiterId(self.next_id.get());
        self.next_id.set(id.0 + 1);
        let _guard = Unregister(self, id);
        poll_fn(|cx| {
            if self.generation.get() != seen {
                return Poll::Ready(());
            }
            match self.wakers.borrow_mut().entry(id) {
                Entry::Occupied(mut w) => w.get_mut().clone_from(cx.waker()),
                Entry::Vacant(v) => {
                    v.insert(cx.waker().clone());
                }
            }
            Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::task::Context;

    thread_local! {
        /// Comparisons of waiter ids on this thread: the work a `Notify` does to find a
        /// waiter's waker, counted instead of timed.
        pub(super) static WAITER_ID_COMPARISONS: Cell<u64> = const { Cell::new(0) };
    }

    #[test]
    fn parked_waiters_cost_constant_work_each() {
        // Goal: parking, re-polling, cancelling and waking n waiters costs O(n) in all, not
        // O(n²) (n parked long polls of one ledger used to scan a list of n wakers on every
        // poll and every drop). Method: 4,000 waiters on one `Notify`, each polled twice while
        // parked, half of them dropped, the rest woken; the waiter-id comparisons are counted
        // (a scanned list makes about 3n²/2, here 2.4·10^7; a map about 3n).
        const N: u64 = 4_000;
        let notify = Notify::default();
        let seen = notify.generation();
        let mut waiters: Vec<_> = (0..N)
            .map(|_| Box::pin(notify.changed_since(seen)))
            .collect();
        let mut cx = Context::from_waker(Waker::noop());
        WAITER_ID_COMPARISONS.with(|c| c.set(0));
        for _ in 0..2 {
            for w in &mut waiters {
                assert!(w.as_mut().poll(&mut cx).is_pending());
            }
        }
        assert_eq!(notify.wakers.borrow().len(), N as usize);
        waiters.truncate(N as usize / 2);
        assert_eq!(notify.wakers.borrow().len(), N as usize / 2);
        notify.notify_all();
        for w in &mut waiters {
            assert!(w.as_mut().poll(&mut cx).is_ready());
        }
        drop(waiters);
        assert!(notify.wakers.borrow().is_empty());
        let comparisons = WAITER_ID_COMPARISONS.with(Cell::get);
        assert!(
            comparisons <= 10 * N,
            "{comparisons} waiter-id comparisons for {N} waiters"
        );
    }
}

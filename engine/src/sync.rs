//! Two tiny single-threaded synchronisation helpers (shard-local, `!Send`).

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

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
#[derive(Default)]
pub struct Notify {
    generation: Cell<u64>,
    next_id: Cell<u64>,
    wakers: RefCell<Vec<(u64, Waker)>>,
}

impl Notify {
    pub fn generation(&self) -> u64 {
        self.generation.get()
    }

    pub fn notify_all(&self) {
        self.generation.set(self.generation.get().wrapping_add(1));
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for (_, w) in wakers {
            w.wake();
        }
    }

    /// Resolves once `notify_all` ran after the generation was `seen`.
    pub async fn changed_since(&self, seen: u64) {
        struct Unregister<'a>(&'a Notify, u64);
        impl Drop for Unregister<'_> {
            fn drop(&mut self) {
                self.0.wakers.borrow_mut().retain(|(id, _)| *id != self.1);
            }
        }
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let _guard = Unregister(self, id);
        poll_fn(|cx| {
            if self.generation.get() != seen {
                return Poll::Ready(());
            }
            let mut wakers = self.wakers.borrow_mut();
            match wakers.iter_mut().find(|(i, _)| *i == id) {
                Some((_, w)) => w.clone_from(cx.waker()),
                None => wakers.push((id, cx.waker().clone())),
            }
            Poll::Pending
        })
        .await
    }
}

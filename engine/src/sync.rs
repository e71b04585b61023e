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
        Rc::new(Self { value: RefCell::new(None), waker: RefCell::new(None) })
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

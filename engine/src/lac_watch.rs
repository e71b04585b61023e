//! Long-poll LAC watchers: per ledger, a wake-up that the facade's journal task fires when an
//! add or fence of that ledger becomes durable (BookKeeper's long-poll `READ_ENTRY` with
//! `previousLAC`, bookkeeper.md §1.3, where the bookie parks the read on a per-ledger watcher).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Instant;

use futures_lite::future;

use crate::sync::{Closed, Notify};
use crate::Error;

/// The parked long polls of a shard; an item exists only while someone waits on its ledger.
#[derive(Default)]
pub(crate) struct LacWatchers {
    by_ledger: RefCell<HashMap<u64, Rc<Notify>>>,
}

impl LacWatchers {
    /// Waits until `state()`'s LAC of `ledger` is past `previous`, the ledger is fenced,
    /// `deadline` passed, or `closed` is set (`Err(Closed)`); returns the last `(lac, fenced)`.
    /// Dropping the future unregisters the waiter.
    pub async fn wait(
        &self,
        ledger: u64,
        previous: Option<u64>,
        deadline: Instant,
        closed: &Closed,
        state: impl Fn() -> (Option<u64>, bool),
    ) -> Result<(Option<u64>, bool), Error> {
        let notify = self
            .by_ledger
            .borrow_mut()
            .entry(ledger)
            .or_default()
            .clone();
        let result = loop {
            if closed.get() {
                break Err(Error::Closed);
            }
            let (lac, fenced) = state();
            let now = quire_clock::now();
            if lac > previous || fenced || now >= deadline {
                break Ok((lac, fenced));
            }
            let seen = notify.generation();
            future::or(
                notify.changed_since(seen),
                glommio::timer::sleep(deadline - now),
            )
            .await;
        };
        // The map and this waiter hold the only references: nobody else waits on the ledger.
        if Rc::strong_count(&notify) == 2 {
            self.by_ledger.borrow_mut().remove(&ledger);
        }
        drop(notify);
        result
    }

    /// Whether nobody waits at all (the writer then skips the per-ledger wake-ups).
    pub fn is_empty(&self) -> bool {
        self.by_ledger.borrow().is_empty()
    }

    /// Wakes the waiters of `ledger`, if any.
    pub fn wake(&self, ledger: u64) {
        let w = self.by_ledger.borrow().get(&ledger).cloned();
        if let Some(w) = w {
            w.notify_all();
        }
    }

    /// Wakes every waiter (on close).
    pub fn wake_all(&self) {
        let watchers: Vec<Rc<Notify>> = self.by_ledger.borrow().values().cloned().collect();
        for w in watchers {
            w.notify_all();
        }
    }

    /// Number of waiters parked on `ledger` now.
    pub fn waiters(&self, ledger: u64) -> usize {
        self.by_ledger
            .borrow()
            .get(&ledger)
            .map_or(0, |n| Rc::strong_count(n) - 1)
    }
}

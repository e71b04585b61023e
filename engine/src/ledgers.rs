//! The ledger table of one shard: per ledger its master key, fence flag, LAC and last entry, and
//! which ledgers changed since the last checkpoint (BookKeeper's ledger metadata index of
//! `DbLedgerStorage`: fencing, master keys, the LAC as the max of the stored entries' LACs).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use crate::format::StoredLedger;
use crate::{Error, LedgerState};

/// In-memory state of one ledger.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ledger {
    pub master_key: Option<[u8; 20]>,
    pub fenced: bool,
    pub lac: Option<u64>,
    pub last_entry: Option<u64>,
    /// The last entry as of the last checkpoint that stored this ledger's state: no entry
    /// above it is in the index, so a checkpoint looks up a previous location (a rewrite by a
    /// recovery add) only for entries up to it.
    pub indexed_last: Option<u64>,
}

impl Ledger {
    /// The state as the index stored it.
    pub fn from_stored(s: StoredLedger) -> Self {
        Self {
            master_key: s.master_key,
            fenced: s.fenced,
            lac: s.lac,
            last_entry: s.last_entry,
            indexed_last: s.last_entry,
        }
    }

    fn stored(&self) -> StoredLedger {
        StoredLedger {
            fenced: self.fenced,
            master_key: self.master_key,
            lac: self.lac,
            last_entry: self.last_entry,
        }
    }
}

/// Every ledger this shard knows, and the ones changed since the last checkpoint snapshot.
pub(crate) struct Ledgers {
    table: RefCell<HashMap<u64, Ledger>>,
    /// Ledgers whose state changed since the last checkpoint snapshot.
    dirty: RefCell<HashSet<u64>>,
    /// Deleted ledgers (their tombstones are durable): never admitted, never re-created.
    deleted: RefCell<HashSet<u64>>,
}

impl Ledgers {
    /// The table as the index stored it; nothing dirty.
    pub fn new(table: HashMap<u64, Ledger>) -> Self {
        Self {
            table: RefCell::new(table),
            dirty: RefCell::new(HashSet::new()),
            deleted: RefCell::new(HashSet::new()),
        }
    }

    /// Forgets `ledger` for good: its state goes and every later add or fence of it is
    /// refused with `LedgerDeleted` (the caller made its tombstone durable first).
    pub fn delete(&self, ledger: u64) {
        self.table.borrow_mut().remove(&ledger);
        self.dirty.borrow_mut().remove(&ledger);
        self.deleted.borrow_mut().insert(ledger);
    }

    /// Whether `ledger` was deleted.
    pub fn is_deleted(&self, ledger: u64) -> bool {
        self.deleted.borrow().contains(&ledger)
    }

    /// Ids of every ledger with a state here, sorted.
    pub fn ids(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.table.borrow().keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Admits a normal or recovery add before it is journaled: a deleted ledger refuses it
    /// (`LedgerDeleted`, whatever the master key: an add never re-creates a deleted ledger);
    /// the first add sets the master key; a different key is `Unauthorized`; a fenced ledger refuses a normal add (`Fenced`),
    /// while recovery adds pass, as in BookKeeper.
    pub fn admit_add(
        &self,
        ledger: u64,
        master_key: [u8; 20],
        recovery: bool,
    ) -> Result<(), Error> {
        if self.is_deleted(ledger) {
            return Err(Error::LedgerDeleted { ledger });
        }
        let mut table = self.table.borrow_mut();
        let l = table.entry(ledger).or_default();
        match l.master_key {
            Some(k) if k != master_key => return Err(Error::Unauthorized { ledger }),
            Some(_) => {}
            None => l.master_key = Some(master_key),
        }
        if l.fenced && !recovery {
            return Err(Error::Fenced { ledger });
        }
        self.dirty.borrow_mut().insert(ledger);
        Ok(())
    }

    /// Fences `ledger` before its fence record is journaled (BookKeeper fencing: later normal
    /// adds are refused at once). A deleted ledger is `LedgerDeleted`. An unknown ledger is created with this master key; a
    /// different key is `Unauthorized`.
    pub fn fence(&self, ledger: u64, master_key: [u8; 20]) -> Result<(), Error> {
        if self.is_deleted(ledger) {
            return Err(Error::LedgerDeleted { ledger });
        }
        let mut table = self.table.borrow_mut();
        let l = table.entry(ledger).or_default();
        match l.master_key {
            Some(k) if k != master_key => return Err(Error::Unauthorized { ledger }),
            Some(_) => {}
            None => l.master_key = Some(master_key),
        }
        l.fenced = true;
        self.dirty.borrow_mut().insert(ledger);
        Ok(())
    }

    /// Applies a durable add: the last entry and the LAC become the max of the stored ones.
    pub fn apply_add(&self, ledger: u64, entry: u64, lac: Option<u64>, master_key: [u8; 20]) {
        let mut table = self.table.borrow_mut();
        let l = table.entry(ledger).or_default();
        if l.master_key.is_none() {
            l.master_key = Some(master_key);
        }
        l.last_entry = l.last_entry.max(Some(entry));
        l.lac = l.lac.max(lac);
        self.dirty.borrow_mut().insert(ledger);
    }

    /// Applies a durable fence.
    pub fn apply_fence(&self, ledger: u64, master_key: [u8; 20]) {
        let mut table = self.table.borrow_mut();
        let l = table.entry(ledger).or_default();
        if l.master_key.is_none() {
            l.master_key = Some(master_key);
        }
        l.fenced = true;
        self.dirty.borrow_mut().insert(ledger);
    }

    /// Number of ledgers in the table.
    pub fn len(&self) -> usize {
        self.table.borrow().len()
    }

    /// The public state of `ledger`, `None` if never seen.
    pub fn state(&self, ledger: u64) -> Option<LedgerState> {
        self.table.borrow().get(&ledger).map(|l| LedgerState {
            fenced: l.fenced,
            lac: l.lac,
            last_entry: l.last_entry,
        })
    }

    /// Whether the shard knows `ledger`, and its last entry.
    pub fn last_entry(&self, ledger: u64) -> Option<Option<u64>> {
        self.table.borrow().get(&ledger).map(|l| l.last_entry)
    }

    /// `(lac, fenced)` of `ledger`; `(None, false)` for an unknown one.
    pub fn lac_and_fenced(&self, ledger: u64) -> (Option<u64>, bool) {
        self.table
            .borrow()
            .get(&ledger)
            .map_or((None, false), |l| (l.lac, l.fenced))
    }

    /// The LAC of `ledger`.
    pub fn lac(&self, ledger: u64) -> Option<u64> {
        self.table.borrow().get(&ledger).and_then(|l| l.lac)
    }

    /// Takes the changed ledgers for a checkpoint: their stored form, sorted by ledger id.
    pub fn take_dirty(&self) -> Vec<(u64, StoredLedger)> {
        let table = self.table.borrow();
        let dirty: Vec<u64> = self.dirty.borrow_mut().drain().collect();
        let mut ledgers: Vec<(u64, StoredLedger)> = dirty
            .iter()
            .filter_map(|id| table.get(id).map(|l| (*id, l.stored())))
            .collect();
        ledgers.sort_by_key(|(id, _)| *id);
        ledgers
    }

    /// Whether entry `entry` of `ledger` may already be in the index (see
    /// [`Ledger::indexed_last`]).
    pub fn may_be_indexed(&self, ledger: u64, entry: u64) -> bool {
        self.table
            .borrow()
            .get(&ledger)
            .and_then(|l| l.indexed_last)
            .is_some_and(|last| entry <= last)
    }

    /// Records that a checkpoint stored these states (and so indexed their entries).
    pub fn checkpointed(&self, stored: &[(u64, StoredLedger)]) {
        let mut table = self.table.borrow_mut();
        for (id, s) in stored {
            if let Some(l) = table.get_mut(id) {
                l.indexed_last = l.indexed_last.max(s.last_entry);
            }
        }
    }

    /// The stored form of every ledger's state now (a damaged index segment's rebuild).
    pub fn stored_states(&self) -> std::collections::BTreeMap<u64, StoredLedger> {
        self.table
            .borrow()
            .iter()
            .map(|(id, l)| (*id, l.stored()))
            .collect()
    }

    /// Marks `ids` changed again (a checkpoint that took them failed).
    pub fn mark_dirty(&self, ids: impl IntoIterator<Item = u64>) {
        self.dirty.borrow_mut().extend(ids);
    }
}

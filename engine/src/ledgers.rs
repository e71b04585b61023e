//! The ledger table of one shard: per ledger its master key, fence flag, LAC and last entry, and
//! which ledgers changed since the last checkpoint (BookKeeper's ledger metadata index of
//! `DbLedgerStorage`: fencing, master keys, the LAC as the max of the stored entries' LACs).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use crate::format::{Record, StoredLedger};
use crate::write_cache::WriteCache;
use crate::{Error, LedgerState};

/// Most distinct master keys a ledger with no bound key keeps fences for; a fence with one more
/// key is refused (`Unauthorized`), so that strangers cannot grow a ledger's state without bound.
pub(crate) const FENCE_KEYS_MAX: usize = 16;

/// In-memory state of one ledger.
///
/// # Key binding (why a stranger's fence cannot block the real writer)
/// A ledger's master key is *bound* by its first add (normal or recovery). A fence of a ledger
/// whose key is not bound yet does not bind it (BookKeeper would create the ledger with the
/// fencer's key): it records the fencing key in `fence_keys`, "fenced for holders of this
/// key". The first add binds its own key: if that key is one of `fence_keys`, the ledger is
/// fenced (a normal add gets `Fenced`); otherwise those fences came from someone without the
/// ledger's key and are dropped.
///
/// This keeps BookKeeper's fencing guarantee (after a bookie answered a fence with key K, it
/// never acknowledges a normal add with key K): K stays in `fence_keys` until an add binds a
/// key; binding K keeps the ledger fenced, binding another key refuses every later add or fence
/// with K (`Unauthorized`). Recovery fences with the key from the ledger metadata, so the
/// writer it cuts off stays cut off.
///
/// `fenced` with no bound key means fenced for every key (a state rebuilt from the entry logs,
/// docs/format/index.md "Damaged segments"): whatever key binds, the ledger stays fenced.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ledger {
    /// The bound key (`None` until the first add).
    pub master_key: Option<[u8; 20]>,
    /// Fenced for the bound key; with no bound key, fenced for every key.
    pub fenced: bool,
    /// Keys fenced while no key was bound (empty once `master_key` is set; at most
    /// [`FENCE_KEYS_MAX`]).
    pub fence_keys: Vec<[u8; 20]>,
    pub lac: Option<u64>,
    pub last_entry: Option<u64>,
    /// The last entry as of the last checkpoint that stored this ledger's state: no entry
    /// above it is in the index, so a checkpoint looks up a previous location (a rewrite by a
    /// recovery add) only for entries up to it.
    pub indexed_last: Option<u64>,
    /// The largest entry id admitted since open or stored durably: an add above it cannot be
    /// a re-add (nothing stored, nothing in flight), so it skips every stored-copy check.
    pub admitted_last: Option<u64>,
    /// [`crate::journal::Journal::submitted`] count right after the last add of this ledger
    /// was queued: once the journal finished that many records, none of its adds is in
    /// flight.
    pub admitted_seq: u64,
}

impl Ledger {
    /// The state as the index stored it.
    pub fn from_stored(s: StoredLedger) -> Self {
        Self {
            master_key: s.master_key,
            fenced: s.fenced,
            fence_keys: if s.master_key.is_some() {
                Vec::new()
            } else {
                s.fence_keys
            },
            lac: s.lac,
            last_entry: s.last_entry,
            indexed_last: s.last_entry,
            admitted_last: s.last_entry,
            admitted_seq: 0,
        }
    }

    fn stored(&self) -> StoredLedger {
        StoredLedger {
            fenced: self.fenced,
            master_key: self.master_key,
            fence_keys: self.fence_keys.clone(),
            lac: self.lac,
            last_entry: self.last_entry,
        }
    }

    /// Whether an add with `key` finds the ledger fenced; `Unauthorized` if another key is
    /// bound.
    fn fenced_for(&self, ledger: u64, key: [u8; 20]) -> Result<bool, Error> {
        match self.master_key {
            Some(k) if k != key => Err(Error::Unauthorized { ledger }),
            Some(_) => Ok(self.fenced),
            None => Ok(self.fenced || self.fence_keys.contains(&key)),
        }
    }

    /// Binds `key` if no key is bound yet; `fenced` is [`Ledger::fenced_for`] of it.
    fn bind(&mut self, key: [u8; 20], fenced: bool) {
        if self.master_key.is_none() {
            self.master_key = Some(key);
            self.fenced = fenced;
            self.fence_keys = Vec::new();
        }
    }

    /// Records a fence with `key` (its admission or its durable record): fenced for the bound
    /// key; with none, `key` joins `fence_keys`. `Unauthorized` for another bound key, or for a
    /// key beyond [`FENCE_KEYS_MAX`].
    fn fence(&mut self, ledger: u64, key: [u8; 20]) -> Result<(), Error> {
        match self.master_key {
            Some(k) if k != key => return Err(Error::Unauthorized { ledger }),
            Some(_) => self.fenced = true,
            // Already fenced for every key.
            None if self.fenced => {}
            None if self.fence_keys.contains(&key) => {}
            None if self.fence_keys.len() >= FENCE_KEYS_MAX => {
                return Err(Error::Unauthorized { ledger })
            }
            None => self.fence_keys.push(key),
        }
        Ok(())
    }
}

/// What [`Ledgers::admit_add`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Admitted: the caller journals the add now, with no await in between.
    Admitted,
    /// Not admitted yet: the entry is at or below the ledger's largest admitted entry, so this
    /// shard may store it or have it in flight. The caller compares with those copies and asks
    /// again with `stored_checked`. `in_flight_until`: the journal's finished count after which
    /// none of this ledger's earlier adds is in flight.
    MaybeStored { in_flight_until: u64 },
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

    /// Admits a normal or recovery add of entry `entry` before it is journaled, in one lookup
    /// of the table: a deleted ledger refuses it (`LedgerDeleted`, whatever the master key: an
    /// add never re-creates a deleted ledger); a key other than the bound one is `Unauthorized`;
    /// a fenced ledger refuses a normal add (`Fenced`), while recovery adds pass, as in
    /// BookKeeper (fences before the first add: see [`Ledger`]). An entry above the ledger's
    /// largest admitted entry is admitted: its key is bound if none was, and `seq` (the
    /// journal's submitted count once this add is queued) recorded. One at or below it is
    /// [`Admission::MaybeStored`] unless `stored_checked` (the caller found no other copy, or
    /// the same bytes, with no await since). A refusal changes nothing.
    pub fn admit_add(
        &self,
        ledger: u64,
        entry: u64,
        master_key: [u8; 20],
        recovery: bool,
        seq: u64,
        stored_checked: bool,
    ) -> Result<Admission, Error> {
        if self.is_deleted(ledger) {
            return Err(Error::LedgerDeleted { ledger });
        }
        let mut table = self.table.borrow_mut();
        let l = table.entry(ledger).or_default();
        let fenced = l.fenced_for(ledger, master_key)?;
        if fenced && !recovery {
            return Err(Error::Fenced { ledger });
        }
        if !stored_checked && l.admitted_last.is_some_and(|last| entry <= last) {
            return Ok(Admission::MaybeStored {
                in_flight_until: l.admitted_seq,
            });
        }
        l.bind(master_key, fenced);
        l.admitted_last = l.admitted_last.max(Some(entry));
        l.admitted_seq = seq;
        self.dirty.borrow_mut().insert(ledger);
        Ok(Admission::Admitted)
    }

    /// Fences `ledger` before its fence record is journaled (BookKeeper fencing: later normal
    /// adds with this key are refused at once). A deleted ledger is `LedgerDeleted`; a bound
    /// key other than `master_key` is `Unauthorized`. A ledger with no bound key records the
    /// fence for `master_key` only (see [`Ledger`]); one more than [`FENCE_KEYS_MAX`] distinct
    /// keys is `Unauthorized`.
    pub fn fence(&self, ledger: u64, master_key: [u8; 20]) -> Result<(), Error> {
        if self.is_deleted(ledger) {
            return Err(Error::LedgerDeleted { ledger });
        }
        let mut table = self.table.borrow_mut();
        table.entry(ledger).or_default().fence(ledger, master_key)?;
        self.dirty.borrow_mut().insert(ledger);
        Ok(())
    }

    /// Applies a durable add: binds its key if none is bound yet (replay does it here, as
    /// `admit_add` did before the add was journaled); the last entry and the LAC become the
    /// max of the stored ones.
    pub fn apply_add(&self, ledger: u64, entry: u64, lac: Option<u64>, master_key: [u8; 20]) {
        let mut table = self.table.borrow_mut();
        let l = table.entry(ledger).or_default();
        if l.master_key.is_none() {
            let fenced = l.fenced || l.fence_keys.contains(&master_key);
            l.bind(master_key, fenced);
        }
        l.last_entry = l.last_entry.max(Some(entry));
        l.admitted_last = l.admitted_last.max(Some(entry));
        l.lac = l.lac.max(lac);
        self.dirty.borrow_mut().insert(ledger);
    }

    /// Applies a durable fence. One whose key is not the key an add bound since (the fence
    /// was admitted before that add) is moot and changes nothing.
    pub fn apply_fence(&self, ledger: u64, master_key: [u8; 20]) {
        let mut table = self.table.borrow_mut();
        let l = table.entry(ledger).or_default();
        // An error here is a moot fence (another key bound since) or, in a replay, a key over
        // the bound, which admission refused and never journaled.
        if l.fence(ledger, master_key).is_ok() {
            self.dirty.borrow_mut().insert(ledger);
        }
    }

    /// Whether a recovery add may replace this shard's readable copy of entry `entry` of
    /// `ledger` with other bytes (docs/protocol.md §Add, "Replacing a stored entry"): only on
    /// a ledger fenced for its bound key (a recoverer fenced it, so no normal add is
    /// acknowledged here any more) and only above the LAC this shard holds (an entry at or
    /// below a LAC was confirmed and is never replaced). The caller checked the key.
    pub fn may_replace(&self, ledger: u64, entry: u64) -> bool {
        self.table.borrow().get(&ledger).is_some_and(|l| {
            l.master_key.is_some() && l.fenced && l.lac.is_none_or(|lac| entry > lac)
        })
    }

    /// Number of ledgers in the table.
    pub fn len(&self) -> usize {
        self.table.borrow().len()
    }

    /// The public state of `ledger`, `None` if never seen. `fenced` is for the bound key (or
    /// every key); fences recorded before any add bound a key are not reported, so that a
    /// stranger's fence does not make readers of the real ledger think it sealed.
    pub fn state(&self, ledger: u64) -> Option<LedgerState> {
        self.table.borrow().get(&ledger).map(|l| LedgerState {
            fenced: l.fenced,
            lac: l.lac,
            last_entry: l.last_entry,
        })
    }

    /// The master key bound to `ledger` by its first add, if any (none for a ledger never
    /// seen, only fenced, or rebuilt fenced with no key).
    pub fn bound_key(&self, ledger: u64) -> Option<[u8; 20]> {
        self.table.borrow().get(&ledger).and_then(|l| l.master_key)
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

    /// Takes the rebuilt states of ledgers whose state a damaged index segment lost at open,
    /// each merged with what the table holds for it (older segments' state and the journal
    /// replay: fences stay, the largest LAC and last entry win, a bound key stays bound), and
    /// marks them changed so that the next checkpoint stores them.
    pub fn restore_rebuilt(&self, states: Vec<(u64, StoredLedger)>) {
        for (id, rebuilt) in states {
            if self.is_deleted(id) {
                continue;
            }
            let mut merged = std::collections::BTreeMap::new();
            crate::index::rebuild::merge_surviving(&mut merged, id, rebuilt);
            let now = self.table.borrow().get(&id).map(|l| l.stored());
            if let Some(now) = now {
                crate::index::rebuild::merge_surviving(&mut merged, id, now);
            }
            let st = merged.remove(&id).expect("merged above");
            self.table.borrow_mut().insert(id, Ledger::from_stored(st));
            self.dirty.borrow_mut().insert(id);
        }
    }

    /// Marks `ids` changed again (a checkpoint that took them failed).
    pub fn mark_dirty(&self, ids: impl IntoIterator<Item = u64>) {
        self.dirty.borrow_mut().extend(ids);
    }
}

/// Applies a durable journal record to the ledger table and the write cache: the facade's
/// journal task after each sync, and replay on open (BookKeeper makes an entry visible to
/// reads and advances the LAC only once its journal write is durable).
pub(crate) fn apply_durable(ledgers: &Ledgers, write_cache: &WriteCache, record: Record) {
    // An add or fence journaled before its ledger was deleted (in flight at the deletion, or
    // replayed from before it) must not bring the ledger back.
    let ledger = match &record {
        Record::Add { ledger, .. } | Record::Fence { ledger, .. } => *ledger,
        Record::BatchHeader { .. } => unreachable!("batch headers are not applied"),
    };
    if ledgers.is_deleted(ledger) {
        return;
    }
    match record {
        Record::Add {
            ledger,
            entry,
            lac,
            master_key,
            data,
            ..
        } => {
            ledgers.apply_add(ledger, entry, lac, master_key);
            write_cache.insert(ledger, entry, data);
        }
        Record::Fence { ledger, master_key } => ledgers.apply_fence(ledger, master_key),
        Record::BatchHeader { .. } => unreachable!("batch headers are not applied"),
    }
}

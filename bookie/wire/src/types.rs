//! Identifier newtypes shared by every layer above the engine.

use std::fmt;

/// A ledger id, unique in a cluster, allocated by the metadata store (BookKeeper `ledgerId`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LedgerId(pub u64);

/// The position of an entry in its ledger, dense from 0 (BookKeeper `entryId`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntryId(pub u64);

impl fmt::Display for LedgerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Size of a ledger master key: SHA-1 of the ledger password, as in BookKeeper.
pub const MASTER_KEY_SIZE_BYTES: usize = 20;

/// The per-ledger master key a writer presents with every add and fence (BookKeeper
/// `masterKey`). A bookie remembers the first key it sees for a ledger and refuses others.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct MasterKey(pub [u8; MASTER_KEY_SIZE_BYTES]);

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MasterKey(")?;
        for b in &self.0[..4] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

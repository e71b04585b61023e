//! The index: where every checkpointed entry lives in the entry logs, kept in memory and made
//! durable as one appended segment per checkpoint in `index.qix`, together with the changed
//! ledger states (docs/format/index.md; the role of BookKeeper `DbLedgerStorage`'s entry
//! location index and ledger index).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::files::{check_header, corrupt, io_err};
use crate::format::{
    decode_segment, encode_file_header, Location, Mark, FILE_HEADER_BYTES, INDEX_MAGIC,
};
use crate::io::{Storage, StorageFile};
use crate::ledgers::Ledger;
use crate::throttle::{bulk_write, Throttle};
use crate::Error;

/// Name of the index file in the ledger directory.
pub(crate) const INDEX_FILE: &str = "index.qix";

/// Entry locations by ledger, and the index file they are appended to.
pub(crate) struct Index<F> {
    /// (ledger → entry → location) of every entry in the entry logs.
    entries: RefCell<HashMap<u64, BTreeMap<u64, Location>>>,
    file: Rc<F>,
    path: PathBuf,
}

impl<F: StorageFile> Index<F> {
    /// Reads the committed part of the index (`mark.index_bytes`) in `ledger_dir`: the entry
    /// locations and the last stored state of every ledger.
    ///
    /// # Errors
    /// `Corrupt` if the file is shorter than the mark commits, its header or a segment fails its
    /// check; `UnsupportedFormat`; `Io`.
    pub async fn load<S: Storage<File = F>>(
        storage: &S,
        ledger_dir: &Path,
        mark: &Mark,
    ) -> Result<(Self, HashMap<u64, Ledger>), Error> {
        let path = ledger_dir.join(INDEX_FILE);
        let file = storage
            .open(&path, false)
            .await
            .map_err(io_err("open index", &path, 0))?;
        let committed = file
            .read_at(0, mark.index_bytes as usize)
            .await
            .map_err(io_err("read index", &path, 0))?;
        if (committed.len() as u64) < mark.index_bytes {
            return Err(corrupt(
                &path,
                committed.len() as u64,
                format!(
                    "index is {} bytes but the checkpoint mark commits {}",
                    committed.len(),
                    mark.index_bytes
                ),
            ));
        }
        check_header(&path, INDEX_MAGIC, &committed, 0)?;
        let mut ledgers: HashMap<u64, Ledger> = HashMap::new();
        let mut entries: HashMap<u64, BTreeMap<u64, Location>> = HashMap::new();
        let mut at = FILE_HEADER_BYTES;
        while at < committed.len() {
            let seg = decode_segment(&committed[at..]).map_err(|r| corrupt(&path, at as u64, r))?;
            for (ledger, entry, loc) in seg.locations {
                entries.entry(ledger).or_default().insert(entry, loc);
            }
            for (ledger, s) in seg.ledgers {
                ledgers.insert(
                    ledger,
                    Ledger {
                        master_key: s.master_key,
                        fenced: s.fenced,
                        lac: s.lac,
                        last_entry: s.last_entry,
                    },
                );
            }
            at += seg.padded_bytes as usize;
        }
        let index = Index {
            entries: RefCell::new(entries),
            file: Rc::new(file),
            path,
        };
        Ok((index, ledgers))
    }

    /// Calls `f` with the locations of `ledger`'s entries, `None` if the index has none.
    pub fn with_ledger<T>(
        &self,
        ledger: u64,
        f: impl FnOnce(Option<&BTreeMap<u64, Location>>) -> T,
    ) -> T {
        f(self.entries.borrow().get(&ledger))
    }

    /// Makes a checkpoint's new locations visible to readers.
    pub fn publish(&self, locations: &[(u64, u64, Location)]) {
        let mut entries = self.entries.borrow_mut();
        for &(ledger, entry, loc) in locations {
            entries.entry(ledger).or_default().insert(entry, loc);
        }
    }

    /// Drops every location of `ledger` from the in-memory index (a deleted ledger, garbage
    /// collection); returns how many there were. The durable record of the deletion is the
    /// tombstone file (docs/format/tombstones.md), applied again at every open.
    pub fn remove_ledger(&self, ledger: u64) -> usize {
        self.entries
            .borrow_mut()
            .remove(&ledger)
            .map_or(0, |m| m.len())
    }

    /// The current location of entry `entry` of `ledger`, if indexed.
    pub fn location(&self, ledger: u64, entry: u64) -> Option<Location> {
        self.entries
            .borrow()
            .get(&ledger)
            .and_then(|m| m.get(&entry).copied())
    }

    /// Calls `f` with every (ledger, entry, location) indexed, in no particular order (building
    /// the per-entry-log usage at open).
    pub fn for_each_location(&self, mut f: impl FnMut(u64, u64, Location)) {
        for (&ledger, m) in self.entries.borrow().iter() {
            for (&entry, &loc) in m {
                f(ledger, entry, loc);
            }
        }
    }

    /// Writes one encoded segment at `at` (the committed length) through the bulk throttle and
    /// syncs the file. Nothing is committed until the mark names the new length.
    pub async fn append_segment(
        &self,
        at: u64,
        segment: &[u8],
        throttle: &Throttle,
    ) -> Result<(), Error> {
        bulk_write(self.file.as_ref(), at, segment, Some(throttle))
            .await
            .map_err(|(off, e)| io_err("index write", &self.path, off)(e))?;
        self.file
            .fdatasync()
            .await
            .map_err(io_err("index fdatasync", &self.path, at))
    }
}

/// Creates an empty index (header only, synced) in `ledger_dir`, for a fresh directory pair.
pub(crate) async fn create_index<S: Storage>(storage: &S, ledger_dir: &Path) -> Result<(), Error> {
    let path = ledger_dir.join(INDEX_FILE);
    let f = storage
        .open(&path, true)
        .await
        .map_err(io_err("create index", &path, 0))?;
    f.write_at(0, &encode_file_header(INDEX_MAGIC, 0))
        .await
        .map_err(io_err("index header write", &path, 0))?;
    f.fdatasync()
        .await
        .map_err(io_err("index fdatasync", &path, 0))?;
    Ok(())
}

//! The version 1 index, `index.qix` (docs/format/index.md, "Version 1"): one append-only file of
//! segments, one per checkpoint, committed up to the length a version 1 mark names. Read once at
//! open to migrate it into an index segment file (`migrate.rs`); never written.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use crate::files::{check_header, corrupt, io_err};
use crate::format::{decode_segment, Location, StoredLedger, FILE_HEADER_BYTES, INDEX_MAGIC};
use crate::io::{Storage, StorageFile};
use crate::Error;

/// Name of the version 1 index file in the ledger directory.
pub(crate) const INDEX_FILE: &str = "index.qix";

/// What a version 1 index holds: the newest location of every entry, sorted, and the newest
/// state of every ledger.
pub(crate) struct LegacyIndex {
    pub locations: BTreeMap<(u64, u64), Location>,
    pub ledgers: HashMap<u64, StoredLedger>,
}

/// Reads the committed `index_bytes` of `index.qix` in `ledger_dir`.
///
/// # Errors
/// `Corrupt` if the file is shorter than the mark commits, or its header or a segment fails its
/// check; `UnsupportedFormat`; `Io`.
pub(crate) async fn load_legacy<S: Storage>(
    storage: &S,
    ledger_dir: &Path,
    index_bytes: u64,
) -> Result<LegacyIndex, Error> {
    let path = ledger_dir.join(INDEX_FILE);
    let file = storage
        .open(&path, false)
        .await
        .map_err(io_err("open index", &path, 0))?;
    let committed =
        file.read_at(0, index_bytes as usize)
            .await
            .map_err(io_err("read index", &path, 0))?;
    if (committed.len() as u64) < index_bytes {
        return Err(corrupt(
            &path,
            committed.len() as u64,
            format!(
                "index is {} bytes but the checkpoint mark commits {index_bytes}",
                committed.len()
            ),
        ));
    }
    check_header(&path, INDEX_MAGIC, &committed, 0)?;
    let mut out = LegacyIndex {
        locations: BTreeMap::new(),
        ledgers: HashMap::new(),
    };
    let mut at = FILE_HEADER_BYTES;
    while at < committed.len() {
        let seg = decode_segment(&committed[at..]).map_err(|r| corrupt(&path, at as u64, r))?;
        for (ledger, entry, loc) in seg.locations {
            out.locations.insert((ledger, entry), loc);
        }
        out.ledgers.extend(seg.ledgers);
        at += seg.padded_bytes as usize;
    }
    Ok(out)
}

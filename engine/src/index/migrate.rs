//! Migration of a version 1 index (`index.qix` and a version 1 mark) into the segment files of
//! version 2, at open. Order (crash argument): the new segment is written and synced and the
//! directory synced; then a version 2 mark naming it replaces the version 1 mark (temp file,
//! fdatasync, rename, directory sync); only then is `index.qix` removed. A crash before the new
//! mark leaves the version 1 mark and `index.qix` in force (the unnamed segment is removed at
//! the next open, which migrates again); after it, the leftover `index.qix` is removed at open.

use std::path::Path;

use crate::checkpoint::write_mark;
use crate::files::io_err;
use crate::format::{Mark, StoredLedger};
use crate::index::legacy::{load_legacy, INDEX_FILE};
use crate::index::segment::{parse_segment_name, SegmentWriter};
use crate::io::Storage;
use crate::Error;

/// Migrates the version 1 index that `mark` (a version 1 mark) commits; returns the version 2
/// mark now in force.
///
/// # Errors
/// Those of reading the old index (`Corrupt`, `UnsupportedFormat`, `Io`), and `Io` from
/// writing the new files.
pub(crate) async fn migrate<S: Storage>(
    storage: &S,
    dir: &Path,
    mark: &Mark,
) -> Result<Mark, Error> {
    let index_bytes = mark
        .legacy_index_bytes
        .expect("only a version 1 mark is migrated");
    let old = load_legacy(storage, dir, index_bytes).await?;
    let names = storage
        .list(dir)
        .await
        .map_err(io_err("list ledger dir", dir, 0))?;
    let id = names
        .iter()
        .filter_map(|n| parse_segment_name(n))
        .max()
        .unwrap_or(0)
        + 1;
    let mut w = SegmentWriter::create(storage, dir, id, None).await?;
    for (&(ledger, entry), &loc) in &old.locations {
        w.push(ledger, entry, loc).await?;
    }
    let mut ledgers: Vec<(u64, StoredLedger)> = old.ledgers.into_iter().collect();
    ledgers.sort_by_key(|(l, _)| *l);
    let seg = w.finish(&ledgers).await?;
    storage
        .sync_dir(dir)
        .await
        .map_err(io_err("sync ledger dir", dir, 0))?;
    let new_mark = Mark {
        legacy_index_bytes: None,
        ..mark.with_segments(vec![seg.id], seg.described())
    };
    write_mark(storage, dir, &new_mark).await?;
    tracing::info!(
        "migrated index.qix ({} locations, {} ledgers) into {}",
        seg.header.entry_count,
        seg.header.ledger_count,
        seg.path.display()
    );
    let old_path = dir.join(INDEX_FILE);
    storage
        .remove(&old_path)
        .await
        .map_err(io_err("remove migrated index", &old_path, 0))?;
    storage
        .sync_dir(dir)
        .await
        .map_err(io_err("sync ledger dir", dir, 0))?;
    Ok(new_mark)
}

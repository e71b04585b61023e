//! The crash point `engine.replay@<fraction>` (docs/fault-points.md): aborts the process once
//! that fraction of the journal records this open replays has been applied, to test that a
//! bookie killed during its startup replay replays fully on the next start.

use super::replay::{read_journal, scan_file};
use crate::files::journal_name;
use crate::format::{Mark, FILE_HEADER_BYTES};
use crate::io::Storage;
use crate::EngineConfig;

/// The crash point's name.
pub(crate) const POINT: &str = "engine.replay";

/// When the crash point is armed: after how many applied records replay aborts (counted by a
/// first scan of the files `ids` from `mark`, made only then). `None` when it is not armed or
/// the journal holds nothing to replay.
pub(crate) async fn crash_after<S: Storage>(
    storage: &S,
    cfg: &EngineConfig,
    ids: &[u64],
    mark: &Mark,
) -> Option<u64> {
    let fraction = quire_faults::crash_fraction(POINT)?;
    let mut seq = mark.next_seq;
    let mut records = 0u64;
    for (i, &id) in ids.iter().enumerate() {
        let path = cfg.journal_dir.join(journal_name(id));
        // Replay itself reports a file it cannot read; the count stops there.
        let Ok(image) = read_journal(storage, &path, id).await else {
            break;
        };
        let start = if i == 0 {
            mark.journal_offset
        } else {
            FILE_HEADER_BYTES as u64
        };
        scan_file(&image.img, &image.salt, start, &mut seq, &mut |_| {
            records += 1
        });
    }
    eprintln!("{POINT}: {records} records to replay, aborting at fraction {fraction}");
    (records > 0).then(|| ((records as f64 * fraction).ceil() as u64).max(1))
}

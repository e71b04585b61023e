//! Disk-use checks for data-lifecycle tests (truncation, retention, deletion followed by bookie
//! garbage collection), read from a bookie's ledger directory from outside the process:
//!
//! * [`entry_log_bytes`]: the bytes of its entry-log files (`entrylog-*.qel`,
//!   docs/format/entry-log.md), in every shard subdirectory;
//! * [`tombstoned_ledgers`]: the ledgers its garbage collection deleted, from the durable
//!   tombstone file `deleted-ledgers.qdl` of each shard (docs/format/tombstones.md), which GC
//!   writes before it drops a ledger's entries;
//! * [`settled_entry_log_bytes`] and [`wait_until_reclaimed`], the before and after of a
//!   lifecycle test: every bookie's entry-log bytes once checkpoints have moved the written
//!   entries into entry logs, and the wait until every bookie has tombstoned the deleted
//!   ledgers and its entry-log bytes went below the figure from before.
//!
//! Why tombstones: entry-log bytes can also go down without any deletion (a major compaction
//! of padding), so "bytes went down" alone could pass for the wrong reason; a bookie lists a
//! ledger in its tombstones only once its GC found the ledger's metadata gone and deleted it.
//!
//! The "before" figure is the weak point: a running bookie does not tell another process how
//! far its checkpoints got (the engine's `gc_stats` and checkpoint mark are in-process), so
//! [`settled_entry_log_bytes`] waits until the figures stay the same over `readings` readings
//! `every` apart, more than one checkpoint interval each. A checkpoint slower than that makes
//! the figure early, i.e. too small, which makes the later "went below" check stricter, not
//! looser.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Bytes of the entry-log files under `ledger_dir`, its subdirectories (shards) included. A
/// file that vanishes while being listed (deleted by GC) counts 0.
pub fn entry_log_bytes(ledger_dir: &Path) -> u64 {
    let mut n = 0;
    let Ok(entries) = std::fs::read_dir(ledger_dir) else {
        return 0;
    };
    for e in entries.flatten() {
        let Ok(meta) = e.metadata() else { continue };
        let name = e.file_name().to_string_lossy().into_owned();
        if meta.is_dir() {
            n += entry_log_bytes(&e.path());
        } else if name.starts_with("entrylog-") && name.ends_with(".qel") {
            n += meta.len();
        }
    }
    n
}

/// The ledger ids in the tombstone files (`deleted-ledgers.qdl`) under `ledger_dir` and its
/// subdirectories: the ledgers this bookie's garbage collection deleted. Reads the groups
/// after the 4 KiB header (magic `QTMB`, count, ids) until a block that is not a group; the
/// CRC is not checked (the bookie does that at open), so a group being written may show up
/// early, which only makes a test wait less for a deletion that is under way.
pub fn tombstoned_ledgers(ledger_dir: &Path) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir(ledger_dir) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            out.extend(tombstoned_ledgers(&path));
        } else if e.file_name() == "deleted-ledgers.qdl" {
            if let Ok(bytes) = std::fs::read(&path) {
                out.extend(parse_tombstones(&bytes));
            }
        }
    }
    out
}

const BLOCK: usize = 4096;

fn parse_tombstones(bytes: &[u8]) -> Vec<u64> {
    let mut ids = Vec::new();
    let mut at = BLOCK;
    while at + 16 <= bytes.len() && &bytes[at..at + 4] == b"QTMB" {
        let count =
            u32::from_le_bytes(bytes[at + 8..at + 12].try_into().expect("4 bytes")) as usize;
        let end = at + 16 + 8 * count;
        if end > bytes.len() {
            break;
        }
        for i in 0..count {
            let o = at + 16 + 8 * i;
            ids.push(u64::from_le_bytes(
                bytes[o..o + 8].try_into().expect("8 bytes"),
            ));
        }
        at = end.div_ceil(BLOCK) * BLOCK;
    }
    ids
}

/// Every bookie's entry-log bytes (one figure per ledger directory, in order) once they are
/// non-zero and the same on `readings` readings `every` apart (give `every` more than one
/// checkpoint interval). Panics after `timeout`.
pub fn settled_entry_log_bytes(
    ledger_dirs: &[PathBuf],
    every: Duration,
    readings: usize,
    timeout: Duration,
) -> Vec<u64> {
    let read = || -> Vec<u64> { ledger_dirs.iter().map(|d| entry_log_bytes(d)).collect() };
    let deadline = quire_clock::now() + timeout;
    let mut last = read();
    let mut same = 1;
    while same < readings {
        assert!(
            quire_clock::now() < deadline,
            "entry logs did not settle within {timeout:?}: {last:?}"
        );
        std::thread::sleep(every);
        let now = read();
        same = if now == last && now.iter().all(|&b| b > 0) {
            same + 1
        } else {
            1
        };
        last = now;
    }
    last
}

/// Waits until, on every bookie (ledger directory `ledger_dirs[i]`), garbage collection has
/// tombstoned every ledger of `deleted` and the entry-log bytes are below `before[i]`; returns
/// the entry-log bytes then. Panics after `timeout`, naming what each bookie still lacks.
pub fn wait_until_reclaimed(
    ledger_dirs: &[PathBuf],
    before: &[u64],
    deleted: &BTreeSet<u64>,
    timeout: Duration,
) -> Vec<u64> {
    assert_eq!(ledger_dirs.len(), before.len(), "one figure per bookie");
    let deadline = quire_clock::now() + timeout;
    loop {
        let now: Vec<u64> = ledger_dirs.iter().map(|d| entry_log_bytes(d)).collect();
        let missing: Vec<BTreeSet<u64>> = ledger_dirs
            .iter()
            .map(|d| {
                deleted
                    .difference(&tombstoned_ledgers(d))
                    .copied()
                    .collect()
            })
            .collect();
        let done =
            missing.iter().all(BTreeSet::is_empty) && now.iter().zip(before).all(|(n, b)| n < b);
        if done {
            return now;
        }
        assert!(
            quire_clock::now() < deadline,
            "bookies did not reclaim the deleted ledgers {deleted:?} within {timeout:?}: \
             entry-log bytes before {before:?}, now {now:?}; not yet tombstoned per bookie {missing:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstone_groups_are_read_until_the_first_non_group_block() {
        // Goal: the reader follows docs/format/tombstones.md: groups from offset 4096, each
        // padded to 4 KiB, ending at a zero block or a truncated group.
        let mut f = vec![0u8; BLOCK];
        f[..8].copy_from_slice(b"QUIRETMB");
        let group = |ids: &[u64]| {
            let mut g = vec![0u8; 16];
            g[..4].copy_from_slice(b"QTMB");
            g[8..12].copy_from_slice(&(ids.len() as u32).to_le_bytes());
            for id in ids {
                g.extend_from_slice(&id.to_le_bytes());
            }
            g.resize(g.len().div_ceil(BLOCK) * BLOCK, 0);
            g
        };
        f.extend(group(&[3, 9]));
        f.extend(group(&(1000..1600).collect::<Vec<_>>()));
        f.extend(vec![0u8; BLOCK]);
        f.extend(group(&[77]));
        let ids = parse_tombstones(&f);
        assert_eq!(ids.len(), 602);
        assert_eq!(&ids[..3], &[3, 9, 1000]);
        assert!(!ids.contains(&77), "a group after a zero block is not read");
        let mut cut = group(&[5, 6]);
        cut.truncate(20);
        let mut g = vec![0u8; BLOCK];
        g.extend(cut);
        assert!(parse_tombstones(&g).is_empty(), "a cut group is not read");
        assert!(parse_tombstones(&[]).is_empty());
    }
}

//! Shared helpers for the engine's integration tests.
#![allow(dead_code)]

pub mod sim_faults;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};
use quire_engine::{Engine, EngineConfig, Error};

/// Runs `f` on a fresh glommio executor with little DMA memory (memlock is 8 MiB here) and
/// waits for it. Ending the executor drops every background task of engines opened in it, which
/// is how tests simulate a crash: nothing is closed or flushed.
pub fn run<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(f)
        .expect("spawn executor")
        .join()
        .expect("executor panicked");
}

/// A temporary directory on ext4 /tmp (never tmpfs: O_DIRECT would be silently off).
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("quire-engine-")
        .tempdir_in("/tmp")
        .expect("tempdir")
}

/// Small files and no background checkpoint, so tests control when checkpoints happen.
pub fn config(dir: &Path) -> EngineConfig {
    let mut c = EngineConfig::new(dir.join("journal"), dir.join("ledgers"));
    c.journal_file_size_bytes = 1 << 20;
    c.group_commit_wait_max = Duration::from_millis(1);
    c.checkpoint_interval = Duration::from_secs(3600);
    c
}

pub const KEY: [u8; 20] = [7u8; 20];

/// Entry bytes that identify (ledger, entry) and end with a non-zero byte.
pub fn payload(ledger: u64, entry: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(ledger * 7 + entry) as u8 | 1)
        .collect();
    if len >= 16 {
        v[..8].copy_from_slice(&ledger.to_le_bytes());
        v[8..16].copy_from_slice(&entry.to_le_bytes());
    }
    v
}

/// Adds entry `entry` of `ledger` holding `payload(ledger, entry, len)`, with LAC `entry - 1`
/// (none for entry 0), as a normal (not recovery) add.
pub async fn add_payload(
    engine: &Engine,
    ledger: u64,
    entry: u64,
    len: usize,
) -> Result<(), Error> {
    engine
        .add_entry(
            ledger,
            entry,
            KEY,
            entry.checked_sub(1),
            payload(ledger, entry, len),
            false,
        )
        .await
}

/// [`config`] with a `cache_bytes` write cache whose checkpoints are paced at 512 KiB/s (no
/// intermediate syncs) and 8 MiB journal files: a checkpoint of a full cache takes long enough
/// for adds to find the cache full behind it.
pub fn slow_checkpoint_config(dir: &Path, cache_bytes: usize) -> EngineConfig {
    let mut c = config(dir);
    c.write_cache_bytes_max = cache_bytes;
    c.background_write_bytes_per_second = 512 << 10;
    c.background_sync_bytes = 0;
    c.journal_file_size_bytes = 8 << 20;
    c
}

/// Journal files in `dir`, sorted by id.
pub fn journal_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "qj"))
        .collect();
    v.sort();
    v
}

/// A batch header found in a journal file image: its byte offset, seq and record count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchAt {
    pub offset: usize,
    pub seq: u64,
    pub record_count: u32,
    /// The batch's logical length, header included (its header's `batch_bytes`).
    pub batch_bytes: u32,
    /// Bytes from the batch header's start to its first record.
    pub header_bytes: usize,
}

/// Every valid batch header of this use of a journal file, at 4 KiB block starts, decoded with
/// the salt of the file's header (docs/format/journal.md §Header, §Records).
pub fn batch_headers(img: &[u8]) -> Vec<BatchAt> {
    use quire_engine::format as f;
    let f::JournalHeader::Ok { salt, .. } = f::decode_journal_header(img) else {
        panic!("not a journal file header");
    };
    (4096..img.len())
        .step_by(4096)
        .filter_map(|at| match f::decode_record(&img[at..], &salt) {
            f::RecordDecode::Ok {
                seq,
                record:
                    f::Record::BatchHeader {
                        record_count,
                        batch_bytes,
                    },
                len,
            } => Some(BatchAt {
                offset: at,
                seq,
                record_count,
                batch_bytes,
                header_bytes: len,
            }),
            _ => None,
        })
        .collect()
}

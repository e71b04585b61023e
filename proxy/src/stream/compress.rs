//! LZ4 on the write path (issue 26 item 5), transparent to readers: the writer stores an
//! entry's records section LZ4-compressed (record set version 3, flag bit0,
//! `docs/format/record-set.md`) when the proxy's `[streams] compression` is `"lz4"`
//! ([`super::StreamConfig::compression`]) or when any write with a record in the entry asked
//! (write flag `0x04`, `docs/proxy-protocol.md`): one entry packs several writes, and
//! compressing it whole is the only way to honour each write's request (DistributedLog
//! compresses a whole record set the same way). Every reader of entries (reads and positions
//! through `reader::fetch_entry`, segment recovery, the producer-session rebuild) decompresses
//! first ([`plain_entry`]), so clients see the records as written.

use std::borrow::Cow;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::record_set;
use quire_client::compression::{self, Compression};
use quire_metadata::StreamCompression;

/// Whether the owner compresses every entry of the stream `rec` (whatever its writes ask):
/// the stream's own setting (`StreamMetadata::compression`, `SET_COMPRESSION`) when it has
/// one, else the proxy's `[streams] compression` default.
pub(super) fn stream_compresses(rec: &super::record::StreamRecord) -> bool {
    match rec.meta.value.compression {
        Some(c) => c == StreamCompression::Lz4,
        None => rec.config.compression == Compression::Lz4,
    }
}

/// An entry as the writer adds it (`stored`) and as readers decode it (`plain`): the same
/// `Arc` unless the entry is stored compressed. The writer hands `plain` to the tail cache, so
/// tail readers never decompress what this proxy wrote (each would otherwise decompress the
/// same entry again), and the cache's byte bound counts the plain bytes it holds.
pub(super) struct StoredEntry {
    pub(super) stored: Arc<Vec<u8>>,
    pub(super) plain: Arc<Vec<u8>>,
}

/// The payload the writer adds for the plain record set `plain`: LZ4-compressed when
/// `compress` and compression makes it smaller (an incompressible entry is stored plain,
/// so compression never grows an entry past the record-set limit), else `plain` itself.
pub(super) fn stored_entry(plain: Vec<u8>, compress: bool) -> StoredEntry {
    let plain = Arc::new(plain);
    let packed = if compress {
        compression::compress_entry(&plain)
    } else {
        None
    };
    match packed {
        Some(packed) => StoredEntry {
            stored: Arc::new(packed),
            plain,
        },
        None => StoredEntry {
            stored: plain.clone(),
            plain,
        },
    }
}

/// Entry `entry` of ledger `ledger` of `stream` as `record_set::decode` reads it:
/// decompressed when stored LZ4-compressed (bounded by the record-set limit before
/// allocating), else borrowed.
///
/// # Errors
/// `Storage` ("decompress record set") for a compressed entry that does not decompress: a
/// corrupt entry, never a panic.
pub(super) fn plain_entry<'p>(
    stream: &str,
    ledger: u64,
    entry: u64,
    payload: &'p [u8],
) -> Result<Cow<'p, [u8]>> {
    record_set::decode_entry(payload).map_err(|e| Error::Storage {
        stream: stream.to_string(),
        op: "decompress record set",
        source: format!("ledger {ledger} entry {entry}: {e}").into(),
    })
}

/// [`plain_entry`] for a shared payload (the tail cache's, or one read from the bookies):
/// the same `Arc` when the entry is plain.
///
/// # Errors
/// As [`plain_entry`].
pub(super) fn plain_shared(
    stream: &str,
    ledger: u64,
    entry: u64,
    payload: Arc<Vec<u8>>,
) -> Result<Arc<Vec<u8>>> {
    match plain_entry(stream, ledger, entry, &payload)? {
        Cow::Borrowed(_) => Ok(payload),
        Cow::Owned(plain) => Ok(Arc::new(plain)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_entries_read_back_as_written() {
        // Goal: what the writer stores reads back (through plain_entry) as the plain set,
        // compressed only when asked and smaller; a corrupt block is a Storage error.
        let line = b"081109 203615 148 INFO dfs.DataNode$PacketResponder: PacketResponder 1";
        let plain = record_set::encode(0, 7, (0..50u64).map(|t| (t, &line[..])));
        let kept = stored_entry(plain.clone(), false);
        assert_eq!(*kept.stored, plain);
        assert!(
            Arc::ptr_eq(&kept.stored, &kept.plain),
            "one buffer when plain"
        );
        let entry = stored_entry(plain.clone(), true);
        let packed = entry.stored.to_vec();
        assert!(packed.len() < plain.len() / 3, "{}", packed.len());
        // What goes to the tail cache is the plain set: it decodes as it is, where the stored
        // one is refused until decompressed.
        assert_eq!(*entry.plain, plain);
        assert!(record_set::decode(&entry.plain).is_ok());
        assert!(record_set::decode(&entry.stored).is_err());
        assert_eq!(&*plain_entry("s", 1, 0, &packed).unwrap(), &plain[..]);
        let shared = Arc::new(plain.clone());
        assert!(Arc::ptr_eq(
            &plain_shared("s", 1, 0, shared.clone()).unwrap(),
            &shared
        ));
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let noise: Vec<u8> = (0..3000)
            .map(|_| {
                // xorshift64: incompressible bytes.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        let random = record_set::encode(0, 7, [(1u64, &noise[..])]);
        assert_eq!(
            *stored_entry(random.clone(), true).stored,
            random,
            "kept plain"
        );
        let mut bad = packed.clone();
        bad.truncate(packed.len() - 2);
        let e = plain_entry("s", 1, 2, &bad).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Storage {
                    op: "decompress record set",
                    ..
                }
            ),
            "{e}"
        );
    }
}

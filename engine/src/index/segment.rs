//! One index segment file (`index-{id:016x}.qis`, docs/format/index.md): writing it once,
//! sorted, in one pass ([`SegmentWriter`]), and reading it: a point lookup is a binary search
//! in the in-memory top keys, then in one index block, then in one data block, both through the
//! block cache ([`Segment::find`]); sequential reads go through a [`SegCursor`].

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::files::{check_header, corrupt, io_err, parse_id};
use crate::format::{
    block_key, check_block, data_key, data_location, decode_ledger_block, encode_data_block,
    encode_file_header, encode_key_block, encode_ledger_block, get_segment_header,
    join_ledger_records, ledger_records, put_segment_header, Key, Location, SegmentHeader,
    SegmentSummary, StoredLedger, DATA_BLOCKS_PER_GROUP, INDEX_SEGMENT_FILE_MAGIC, KEYS_PER_BLOCK,
    LEDGERS_PER_BLOCK, LOCATIONS_PER_BLOCK,
};
use crate::index::cache::BlockCache;
use crate::io::{Storage, StorageFile, BLOCK_BYTES};
use crate::throttle::{bulk_write, Throttle};
use crate::Error;

/// Name of index segment file `id`.
pub(crate) fn segment_name(id: u64) -> String {
    format!("index-{id:016x}.qis")
}

/// The id of an index segment file name, `None` for other names.
pub(crate) fn parse_segment_name(name: &str) -> Option<u64> {
    parse_id(name, "index-", ".qis")
}

/// Bytes the writer buffers before one write.
const WRITE_BUFFER_BYTES: usize = 1 << 20;
/// Data blocks a cursor reads at once when it bypasses the cache (merges, open scans).
const CURSOR_CHUNK_BLOCKS: u64 = 16;

/// An open, immutable index segment: its header and top keys in memory, the rest on disk.
pub(crate) struct Segment<F> {
    pub id: u64,
    pub path: PathBuf,
    /// `None` for a stand-in ([`Segment::hollow`]): every read of it fails with `Corrupt`.
    file: Option<Rc<F>>,
    pub header: SegmentHeader,
    /// First key of every group (its first data block).
    top: Vec<Key>,
    /// What the checkpoint mark records of it, once known (from the writer, the mark, or the
    /// open's reading of its header and ledger states).
    summary: Cell<Option<SegmentSummary>>,
}

impl<F: StorageFile> Segment<F> {
    /// Opens segment `id` in `dir`: checks the header and reads the top keys.
    ///
    /// # Errors
    /// `Corrupt` for a bad header, a bad top block or a file shorter than its header says;
    /// `UnsupportedFormat`; `Io`.
    pub async fn open<S: Storage<File = F>>(
        storage: &S,
        dir: &Path,
        id: u64,
    ) -> Result<Self, Error> {
        let path = dir.join(segment_name(id));
        let file =
            storage
                .open(&path, false)
                .await
                .map_err(io_err("open index segment", &path, 0))?;
        let b = file.read_at(0, BLOCK_BYTES).await.map_err(io_err(
            "read index segment header",
            &path,
            0,
        ))?;
        check_header(&path, INDEX_SEGMENT_FILE_MAGIC, &b, id)?;
        let header = get_segment_header(&b).map_err(|r| corrupt(&path, 0, r))?;
        let size = file
            .size()
            .await
            .map_err(io_err("stat index segment", &path, 0))?;
        if size < header.total_blocks() * BLOCK_BYTES as u64 {
            return Err(corrupt(
                &path,
                size,
                format!(
                    "index segment is {size} bytes, its header says {} blocks",
                    header.total_blocks()
                ),
            ));
        }
        let mut seg = Segment {
            id,
            path,
            file: Some(Rc::new(file)),
            header,
            top: Vec::new(),
            summary: Cell::new(None),
        };
        let groups = header.groups() as usize;
        let mut top = Vec::with_capacity(groups);
        for t in 0..header.top_blocks() {
            let n = header.top_at() + t;
            let (b, count) = seg.read_block(n, KEYS_PER_BLOCK).await?;
            top.extend((0..count).map(|i| block_key(&b, i)));
        }
        if top.len() != groups || top.windows(2).any(|w| w[0] >= w[1]) {
            return Err(seg.bad(
                header.top_at(),
                format!(
                    "{} top keys for {groups} groups, or out of order",
                    top.len()
                ),
            ));
        }
        seg.top = top;
        Ok(seg)
    }

    /// A stand-in for live segment `id` at `path` that is missing or whose header or top
    /// blocks are unreadable, known only from the summary the checkpoint mark holds for it:
    /// it covers the summary's key range (so lookups there wait for its rebuild) and every read
    /// of it fails with `Corrupt`. Its replacement takes its place once rebuilt.
    pub(crate) fn hollow(id: u64, path: PathBuf, s: SegmentSummary) -> Self {
        Segment {
            id,
            path,
            file: None,
            header: SegmentHeader {
                entry_count: s.entry_count,
                data_blocks: 0,
                ledger_count: 0,
                min_key: s.min_key,
                max_key: s.max_key,
            },
            top: Vec::new(),
            summary: Cell::new(Some(s)),
        }
    }

    /// Whether this is a stand-in without a readable file ([`Segment::hollow`]).
    pub(crate) fn is_hollow(&self) -> bool {
        self.file.is_none()
    }

    /// The file, or `Corrupt` for a stand-in.
    fn file(&self) -> Result<&F, Error> {
        self.file.as_deref().ok_or_else(|| {
            corrupt(
                &self.path,
                0,
                "index segment is missing or its header is unreadable; it is being rebuilt",
            )
        })
    }

    /// The summary the checkpoint mark records for it, with its id, if known.
    pub(crate) fn described(&self) -> Option<(u64, SegmentSummary)> {
        self.summary.get().map(|s| (self.id, s))
    }

    /// The summary, if known.
    pub(crate) fn summary(&self) -> Option<SegmentSummary> {
        self.summary.get()
    }

    /// Records the summary found for it (at open).
    pub(crate) fn describe(&self, s: SegmentSummary) {
        self.summary.set(Some(s));
    }

    pub(crate) fn bad(&self, block: u64, reason: impl Into<String>) -> Error {
        corrupt(&self.path, block * BLOCK_BYTES as u64, reason)
    }

    /// Reads and checks block `n` (not through the cache); returns it and its item count.
    pub(crate) async fn read_block(
        &self,
        n: u64,
        per_block: usize,
    ) -> Result<(Vec<u8>, usize), Error> {
        let at = n * BLOCK_BYTES as u64;
        let b = self.file()?.read_at(at, BLOCK_BYTES).await.map_err(io_err(
            "read index segment",
            &self.path,
            at,
        ))?;
        let count = check_block(&b, per_block).map_err(|r| self.bad(n, r))?;
        Ok((b, count))
    }

    /// Block `n` through the cache (checked when read).
    async fn cached_block(
        &self,
        cache: &RefCell<BlockCache>,
        n: u64,
        per_block: usize,
    ) -> Result<Rc<Vec<u8>>, Error> {
        if let Some(b) = cache.borrow_mut().get((self.id, n)) {
            return Ok(b);
        }
        let (b, _) = self.read_block(n, per_block).await?;
        let b = Rc::new(b);
        cache.borrow_mut().insert((self.id, n), b.clone());
        Ok(b)
    }

    /// Bytes this open segment keeps in memory.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.top.capacity() * std::mem::size_of::<Key>()
            + self.path.as_os_str().len()
    }

    /// Whether `key` is inside the segment's key range.
    pub(crate) fn covers(&self, key: Key) -> bool {
        self.header.entry_count > 0 && key >= self.header.min_key && key <= self.header.max_key
    }

    /// The data block (number among data blocks) whose range holds `key`: binary search in the
    /// top keys, then in that group's index block. `None` below the first key.
    async fn data_block_for(
        &self,
        cache: &RefCell<BlockCache>,
        key: Key,
    ) -> Result<Option<u64>, Error> {
        let g = self.top.partition_point(|k| *k <= key);
        if g == 0 {
            return Ok(None);
        }
        let g = (g - 1) as u64;
        let n = self.header.index_block_at(g);
        let b = self.cached_block(cache, n, KEYS_PER_BLOCK).await?;
        let count = crate::format::u16_at(&b, 4) as usize;
        let (mut lo, mut hi) = (0usize, count);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if block_key(&b, mid) <= key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo == 0 {
            return Err(self.bad(n, "index block's first key is above its group's top key"));
        }
        Ok(Some(g * DATA_BLOCKS_PER_GROUP + (lo - 1) as u64))
    }

    /// Position of the first location with a key `>= key` in data block `d`: (index, count).
    fn lower_bound(b: &[u8], count: usize, key: Key) -> usize {
        let (mut lo, mut hi) = (0usize, count);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if data_key(b, mid) < key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The location of `key` in this segment, if it holds one.
    pub async fn find(
        &self,
        cache: &RefCell<BlockCache>,
        key: Key,
    ) -> Result<Option<Location>, Error> {
        if !self.covers(key) {
            return Ok(None);
        }
        let Some(d) = self.data_block_for(cache, key).await? else {
            return Ok(None);
        };
        let b = self
            .cached_block(cache, self.header.data_block_at(d), LOCATIONS_PER_BLOCK)
            .await?;
        let count = crate::format::u16_at(&b, 4) as usize;
        let i = Self::lower_bound(&b, count, key);
        Ok((i < count && data_key(&b, i) == key).then(|| data_location(&b, i)))
    }

    /// Reads and checks every block but the data blocks, past the cache: the header, each
    /// group's index block, the top blocks and the ledger-state blocks (the scrubber; the data
    /// blocks are checked by a scan of the locations).
    pub(crate) async fn check_non_data_blocks(&self) -> Result<(), Error> {
        let b = self.file()?.read_at(0, BLOCK_BYTES).await.map_err(io_err(
            "read index segment header",
            &self.path,
            0,
        ))?;
        check_header(&self.path, INDEX_SEGMENT_FILE_MAGIC, &b, self.id)?;
        for g in 0..self.header.groups() {
            self.read_block(self.header.index_block_at(g), KEYS_PER_BLOCK)
                .await?;
        }
        for t in 0..self.header.top_blocks() {
            self.read_block(self.header.top_at() + t, KEYS_PER_BLOCK)
                .await?;
        }
        self.ledger_states().await.map(|_| ())
    }

    /// Reads the ledger states, one per ledger (a fence-only ledger's records joined), sorted
    /// by ledger (not cached: only at open and by merges).
    pub async fn ledger_states(&self) -> Result<Vec<(u64, StoredLedger)>, Error> {
        self.file()?;
        let mut out = Vec::with_capacity(self.header.ledger_count as usize);
        for i in 0..self.header.ledger_blocks() {
            let n = self.header.ledgers_at() + i;
            let (b, _) = self.read_block(n, LEDGERS_PER_BLOCK).await?;
            out.extend(decode_ledger_block(&b).map_err(|r| self.bad(n, r))?);
        }
        if out.len() as u64 != self.header.ledger_count {
            return Err(self.bad(
                self.header.ledgers_at(),
                "ledger-state count differs from header",
            ));
        }
        Ok(join_ledger_records(out))
    }
}

/// Reads a segment's locations in key order from a start key, either through the block cache
/// (short reads: read-ahead plans) or bypassing it in chunks of blocks (merges, scans), so a
/// long scan does not evict the blocks lookups use.
pub(crate) struct SegCursor<F> {
    seg: Rc<Segment<F>>,
    cached: bool,
    /// Next data block to load.
    next_block: u64,
    buf: Vec<(Key, Location)>,
    pos: usize,
}

impl<F: StorageFile> SegCursor<F> {
    /// A cursor at the first location of `seg` with a key `>= from`.
    pub async fn seek(
        seg: Rc<Segment<F>>,
        cache: &RefCell<BlockCache>,
        from: Key,
        cached: bool,
    ) -> Result<Self, Error> {
        // A stand-in has no blocks to read: its keys must not look absent.
        seg.file()?;
        let mut c = SegCursor {
            next_block: 0,
            seg,
            cached,
            buf: Vec::new(),
            pos: 0,
        };
        let h = c.seg.header;
        if h.entry_count == 0 || from > h.max_key {
            c.next_block = h.data_blocks;
            return Ok(c);
        }
        if from <= h.min_key {
            return Ok(c);
        }
        let d = c.seg.data_block_for(cache, from).await?.unwrap_or(0);
        c.next_block = d;
        c.load(cache).await?;
        while c.pos < c.buf.len() && c.buf[c.pos].0 < from {
            c.pos += 1;
        }
        Ok(c)
    }

    /// Loads the next block (cached) or chunk of blocks (uncached) into the buffer.
    async fn load(&mut self, cache: &RefCell<BlockCache>) -> Result<(), Error> {
        self.buf.clear();
        self.pos = 0;
        let h = self.seg.header;
        if self.next_block >= h.data_blocks {
            return Ok(());
        }
        let d = self.next_block;
        let blocks: Vec<Rc<Vec<u8>>> = if self.cached {
            let n = h.data_block_at(d);
            vec![self.seg.cached_block(cache, n, LOCATIONS_PER_BLOCK).await?]
        } else {
            // Contiguous data blocks: up to the end of the group.
            let group_end = (d / DATA_BLOCKS_PER_GROUP + 1) * DATA_BLOCKS_PER_GROUP;
            let end = (d + CURSOR_CHUNK_BLOCKS).min(group_end).min(h.data_blocks);
            let first = h.data_block_at(d);
            let at = first * BLOCK_BYTES as u64;
            let len = (end - d) as usize * BLOCK_BYTES;
            let b = self.seg.file()?.read_at(at, len).await.map_err(io_err(
                "read index segment",
                &self.seg.path,
                at,
            ))?;
            if b.len() < len {
                return Err(self.seg.bad(first, "index segment cut short"));
            }
            b.chunks(BLOCK_BYTES).map(|c| Rc::new(c.to_vec())).collect()
        };
        for (i, b) in blocks.iter().enumerate() {
            let n = h.data_block_at(d + i as u64);
            let count = check_block(b, LOCATIONS_PER_BLOCK).map_err(|r| self.seg.bad(n, r))?;
            for j in 0..count {
                let k = data_key(b, j);
                if self.buf.last().is_some_and(|(last, _)| *last >= k) {
                    return Err(self.seg.bad(n, "index segment keys out of order"));
                }
                self.buf.push((k, data_location(b, j)));
            }
        }
        self.next_block = d + blocks.len() as u64;
        Ok(())
    }

    /// The next location without moving past it; `None` at the end.
    pub async fn peek(
        &mut self,
        cache: &RefCell<BlockCache>,
    ) -> Result<Option<(Key, Location)>, Error> {
        while self.pos >= self.buf.len() {
            if self.next_block >= self.seg.header.data_blocks {
                return Ok(None);
            }
            self.load(cache).await?;
        }
        Ok(Some(self.buf[self.pos]))
    }

    /// Moves past the location `peek` returned.
    pub fn advance(&mut self) {
        self.pos += 1;
    }
}

/// Writes a new segment file in one pass from locations in increasing key order: data blocks
/// with an index block after every group, then the top keys, the ledger states and, last, the
/// header block; then one fdatasync. The file is not live until a mark names it.
pub(crate) struct SegmentWriter<'t, F> {
    id: u64,
    path: PathBuf,
    file: F,
    throttle: Option<&'t Throttle>,
    header: SegmentHeader,
    pending: Vec<(u64, u64, Location)>,
    group_keys: Vec<Key>,
    top: Vec<Key>,
    out: Vec<u8>,
    /// Block number where `out` starts.
    out_block: u64,
    /// Smallest and largest entry-log id of the locations pushed.
    logs: Option<(u64, u64)>,
}

impl<'t, F: StorageFile> SegmentWriter<'t, F> {
    /// Creates segment file `id` in `dir`.
    pub async fn create<S: Storage<File = F>>(
        storage: &S,
        dir: &Path,
        id: u64,
        throttle: Option<&'t Throttle>,
    ) -> Result<Self, Error> {
        let path = dir.join(segment_name(id));
        let file =
            storage
                .open(&path, true)
                .await
                .map_err(io_err("create index segment", &path, 0))?;
        Ok(Self {
            id,
            path,
            file,
            throttle,
            header: SegmentHeader::default(),
            pending: Vec::with_capacity(LOCATIONS_PER_BLOCK),
            group_keys: Vec::new(),
            top: Vec::new(),
            out: Vec::new(),
            out_block: 1,
            logs: None,
        })
    }

    /// Appends one location; keys must increase strictly.
    pub async fn push(&mut self, ledger: u64, entry: u64, loc: Location) -> Result<(), Error> {
        let key = (ledger, entry);
        let h = &mut self.header;
        assert!(
            h.entry_count == 0 || key > h.max_key,
            "segment keys must increase"
        );
        if h.entry_count == 0 {
            h.min_key = key;
        }
        h.max_key = key;
        h.entry_count += 1;
        self.logs = Some(self.logs.map_or((loc.log_id, loc.log_id), |(lo, hi)| {
            (lo.min(loc.log_id), hi.max(loc.log_id))
        }));
        self.pending.push((ledger, entry, loc));
        if self.pending.len() == LOCATIONS_PER_BLOCK {
            self.end_data_block();
            if self.out.len() >= WRITE_BUFFER_BYTES {
                self.flush().await?;
            }
        }
        Ok(())
    }

    fn end_data_block(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let first = (self.pending[0].0, self.pending[0].1);
        if self.group_keys.is_empty() {
            self.top.push(first);
        }
        self.group_keys.push(first);
        self.out
            .extend_from_slice(&encode_data_block(&self.pending));
        self.pending.clear();
        self.header.data_blocks += 1;
        if self.group_keys.len() == KEYS_PER_BLOCK {
            self.end_group();
        }
    }

    fn end_group(&mut self) {
        if !self.group_keys.is_empty() {
            self.out
                .extend_from_slice(&encode_key_block(&self.group_keys));
            self.group_keys.clear();
        }
    }

    async fn flush(&mut self) -> Result<(), Error> {
        if self.out.is_empty() {
            return Ok(());
        }
        let at = self.out_block * BLOCK_BYTES as u64;
        bulk_write(&self.file, at, &self.out, self.throttle)
            .await
            .map_err(|(off, e)| io_err("index segment write", &self.path, off)(e))?;
        self.out_block += (self.out.len() / BLOCK_BYTES) as u64;
        self.out.clear();
        Ok(())
    }

    /// Writes what is left, the ledger states (sorted by ledger) and the header, syncs the file
    /// and returns the open segment.
    pub async fn finish(mut self, ledgers: &[(u64, StoredLedger)]) -> Result<Segment<F>, Error> {
        self.end_data_block();
        self.end_group();
        for chunk in self.top.chunks(KEYS_PER_BLOCK) {
            self.out.extend_from_slice(&encode_key_block(chunk));
        }
        // A fence-only ledger takes one record per key (docs/format/index.md).
        let records = ledger_records(ledgers);
        for chunk in records.chunks(LEDGERS_PER_BLOCK) {
            self.out.extend_from_slice(&encode_ledger_block(chunk));
        }
        self.header.ledger_count = records.len() as u64;
        self.flush().await?;
        debug_assert_eq!(self.out_block, self.header.total_blocks());
        let mut head = encode_file_header(INDEX_SEGMENT_FILE_MAGIC, self.id);
        put_segment_header(&mut head, &self.header);
        bulk_write(&self.file, 0, &head, self.throttle)
            .await
            .map_err(|(off, e)| io_err("index segment header write", &self.path, off)(e))?;
        if let Some(t) = self.throttle {
            t.admit(0).await;
        }
        self.file
            .fdatasync()
            .await
            .map_err(io_err("index segment fdatasync", &self.path, 0))?;
        let summary = SegmentSummary {
            entry_count: self.header.entry_count,
            min_key: self.header.min_key,
            max_key: self.header.max_key,
            ledgers: ledgers
                .iter()
                .map(|x| x.0)
                .min()
                .zip(ledgers.iter().map(|x| x.0).max()),
            logs: self.logs,
        };
        Ok(Segment {
            id: self.id,
            path: self.path,
            file: Some(Rc::new(self.file)),
            header: self.header,
            top: self.top,
            summary: Cell::new(Some(summary)),
        })
    }
}

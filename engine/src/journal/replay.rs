//! Journal replay on open (docs/format/journal.md §Recovery; BookKeeper's journal replay from
//! the last mark): scans the files from the checkpoint mark, applies every complete batch, finds
//! where the journal ends (zeros, a torn tail, which is dropped, or a reused file's older bytes;
//! a file with anything but zeros after its end is sealed), and refuses to open when durable
//! data follows a bad record.

use std::path::Path;
use std::rc::Rc;

use super::JournalCursor;
use crate::files::{corrupt, io_err, journal_name};
use crate::format::{
    decode_journal_header, decode_record, round_up_block, stamped_len, stamped_offset, stamped_run,
    unstamp_sectors, JournalHeader, JournalSalt, Mark, Record, RecordDecode, RecordKind,
    FILE_HEADER_BYTES, FORMAT_V1, JOURNAL_FORMAT_STAMPED, RECORD_HEADER_BYTES,
    STAMPED_SECTOR_BYTES,
};
use crate::io::{Storage, StorageFile, BLOCK_BYTES};
use crate::{EngineConfig, Error};

/// Why replay stopped inside a file.
pub(super) enum Stop {
    /// No batch starts at this batch boundary: zeros, end of file, or a batch header of this
    /// file use with a seq below the expected one.
    End(u64),
    /// A bad record at `bad_at`; `resume` is where writing would continue (block aligned).
    /// `whole`: every sector of the bad batch carries its stamp (version 3), so its write
    /// reached the medium whole and the damage came after it (rot), not from a crash.
    Bad {
        bad_at: u64,
        resume: u64,
        reason: String,
        whole: bool,
    },
}

/// Scans one journal file image from `start`, applying good records. Returns where it stopped.
pub(super) fn scan_file(
    img: &[u8],
    salt: &JournalSalt,
    start: u64,
    expected_seq: &mut u64,
    apply: &mut impl FnMut(Record),
) -> Stop {
    if salt.sectors_stamped() {
        return scan_stamped(img, salt, start, expected_seq, apply);
    }
    let mut pos = start as usize;
    loop {
        if pos >= img.len() {
            return Stop::End(pos as u64);
        }
        let (batch_bytes, count) = match batch_header(img, salt, pos, *expected_seq) {
            Ok(h) => h,
            Err(stop) => return stop,
        };
        let (records, end) = match batch_records(img, salt, pos, *expected_seq, count, batch_bytes)
        {
            Ok(r) => r,
            Err(stop) => return stop,
        };
        *expected_seq += records.len() as u64 + 1;
        for r in records {
            apply(r);
        }
        pos = round_up_block(end as u64) as usize;
    }
}

/// A stop at a bad record at `at`, writing resuming at `resume`.
fn bad(at: usize, resume: usize, reason: String) -> Stop {
    Stop::Bad {
        bad_at: at as u64,
        resume: resume as u64,
        reason,
        whole: false,
    }
}

/// [`scan_file`] for a version 3 file: each batch is read through its stamped sectors (its
/// header from the first sector, its records from the sectors `batch_bytes` spans), and a bad
/// batch is checked for being whole: every sector of its extent stamped for its seq.
fn scan_stamped(
    img: &[u8],
    salt: &JournalSalt,
    start: u64,
    expected_seq: &mut u64,
    apply: &mut impl FnMut(Record),
) -> Stop {
    let stamp_salt = salt.value().expect("a version 3 file has a salt");
    let mut pos = start as usize;
    let mut logical = Vec::new();
    loop {
        if pos >= img.len() {
            return Stop::End(pos as u64);
        }
        logical.clear();
        unstamp_sectors(
            &img[pos..(pos + STAMPED_SECTOR_BYTES).min(img.len())],
            &mut logical,
        );
        let (batch_bytes, count) = match batch_header(&logical, salt, 0, *expected_seq) {
            Ok(h) => h,
            Err(Stop::End(_)) => return Stop::End(pos as u64),
            Err(Stop::Bad { reason, .. }) => {
                return Stop::Bad {
                    bad_at: pos as u64,
                    resume: pos as u64,
                    reason,
                    whole: whole_despite_header(&img[pos..], salt, stamp_salt, *expected_seq),
                }
            }
        };
        let extent = stamped_len(batch_bytes).max(BLOCK_BYTES);
        let disk = &img[pos..(pos + extent).min(img.len())];
        logical.clear();
        unstamp_sectors(disk, &mut logical);
        match batch_records(&logical, salt, 0, *expected_seq, count, batch_bytes) {
            Ok((records, _)) => {
                *expected_seq += records.len() as u64 + 1;
                for r in records {
                    apply(r);
                }
                pos += extent;
            }
            Err(stop) => {
                let Stop::Bad { bad_at, reason, .. } = stop else {
                    return stop;
                };
                let stamped = stamped_run(disk, stamp_salt, *expected_seq) * STAMPED_SECTOR_BYTES;
                return Stop::Bad {
                    bad_at: (pos + stamped_offset(bad_at as usize)) as u64,
                    resume: pos as u64,
                    reason,
                    whole: disk.len() == extent && stamped == extent,
                };
            }
        }
    }
}

/// Whether a version 3 batch whose header record is bad (so its length is unknown) reached the
/// medium whole: the sectors stamped for `seq` in a row from its start (`disk`) must hold
/// records with the next seqs up to zeros, and span exactly the sectors such records take. A
/// torn write loses sectors, so its stamped run ends early; a batch damaged in its header and
/// elsewhere too cannot be measured and counts as torn.
fn whole_despite_header(disk: &[u8], salt: &JournalSalt, stamp_salt: u64, seq: u64) -> bool {
    let run = stamped_run(disk, stamp_salt, seq);
    if run == 0 {
        return false;
    }
    let mut logical = Vec::new();
    unstamp_sectors(&disk[..run * STAMPED_SECTOR_BYTES], &mut logical);
    let mut q = RECORD_HEADER_BYTES + salt.batch_header_payload_bytes();
    let mut next = seq + 1;
    loop {
        match logical.get(q..).map(|b| decode_record(b, salt)) {
            Some(RecordDecode::Ok { seq: got, len, .. }) if got == next => {
                q += len;
                next += 1;
            }
            Some(RecordDecode::Zeros) => break,
            _ => return false,
        }
    }
    next > seq + 1 && stamped_len(q) == run * STAMPED_SECTOR_BYTES
}

/// Scan step 1: the batch header at `pos` (its batch's bytes and record count), or where the
/// scan stops: the end (zeros, or an older batch of this file's use) or a bad record.
fn batch_header(
    img: &[u8],
    salt: &JournalSalt,
    pos: usize,
    expected_seq: u64,
) -> Result<(usize, u32), Stop> {
    match decode_record(&img[pos..], salt) {
        RecordDecode::Zeros => Err(Stop::End(pos as u64)),
        RecordDecode::Short => Err(bad(
            pos,
            pos,
            "record cut short (file ends inside it or its length is garbled)".into(),
        )),
        RecordDecode::Bad(r) => Err(bad(pos, pos, r)),
        RecordDecode::Ok {
            seq,
            record:
                Record::BatchHeader {
                    record_count,
                    batch_bytes,
                },
            ..
        } => {
            if seq < expected_seq {
                return Err(Stop::End(pos as u64));
            }
            if seq != expected_seq {
                return Err(bad(
                    pos,
                    pos,
                    format!("batch header has seq {seq}, expected {expected_seq}"),
                ));
            }
            Ok((batch_bytes as usize, record_count))
        }
        RecordDecode::Ok { seq, .. } => Err(bad(
            pos,
            pos,
            format!("record with seq {seq} where a batch header was expected"),
        )),
    }
}

/// Scan step 2: the `count` records of the batch whose header (seq `header_seq`) is at `pos`,
/// and where the batch ends, once all of it checks out (a torn batch was never acknowledged,
/// so none of it is kept and writing resumes at its first block).
fn batch_records(
    img: &[u8],
    salt: &JournalSalt,
    pos: usize,
    header_seq: u64,
    count: u32,
    batch_bytes: usize,
) -> Result<(Vec<Record>, usize), Stop> {
    let mut seq = header_seq + 1;
    let mut records = Vec::with_capacity(count.min(1 << 16) as usize);
    let mut q = pos + RECORD_HEADER_BYTES + salt.batch_header_payload_bytes();
    for _ in 0..count {
        match decode_record(&img[q..], salt) {
            RecordDecode::Ok {
                seq: got,
                record,
                len,
            } => {
                if got != seq {
                    return Err(bad(q, pos, format!("record has seq {got}, expected {seq}")));
                }
                if matches!(record, Record::BatchHeader { .. }) {
                    return Err(bad(q, pos, "batch header inside a batch".into()));
                }
                records.push(record);
                seq += 1;
                q += len;
            }
            RecordDecode::Zeros => return Err(bad(q, pos, "zeros inside a batch".into())),
            RecordDecode::Short => {
                return Err(bad(
                    q,
                    pos,
                    "record cut short (file ends inside it or its length is garbled)".into(),
                ))
            }
            RecordDecode::Bad(r) => return Err(bad(q, pos, r)),
        }
    }
    if q != pos + batch_bytes {
        return Err(bad(
            q,
            pos,
            format!(
                "batch header says {batch_bytes} bytes, records end at {}",
                q - pos
            ),
        ));
    }
    Ok((records, q))
}

/// The first block-aligned offset at or after `from` holding a valid batch header with
/// `seq >= min_seq`, if any.
pub(crate) fn find_later_batch(
    img: &[u8],
    salt: &JournalSalt,
    from: u64,
    min_seq: u64,
) -> Option<(u64, u64)> {
    let mut at = round_up_block(from) as usize;
    while at < img.len() {
        if let Some(seq) = batch_header_at(img, salt, at) {
            if seq >= min_seq {
                return Some((at as u64, seq));
            }
        }
        at += BLOCK_BYTES;
    }
    None
}

/// The seq of the valid batch header record at `at`, if one is there. Checks the length and
/// kind fields before the CRC, so that scanning a reused file's old payload bytes stays cheap.
fn batch_header_at(img: &[u8], salt: &JournalSalt, at: usize) -> Option<u64> {
    let h = img.get(at..at + RECORD_HEADER_BYTES)?;
    let payload_len = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes"));
    let kind = u16::from_le_bytes(h[16..18].try_into().expect("2 bytes"));
    if payload_len as usize != salt.batch_header_payload_bytes()
        || kind != RecordKind::BatchHeader as u16
    {
        return None;
    }
    match decode_record(&img[at..], salt) {
        RecordDecode::Ok {
            seq,
            record: Record::BatchHeader { .. },
            ..
        } => Some(seq),
        _ => None,
    }
}

/// A journal file read whole: the open file, its bytes, and the salt of its header.
pub(crate) struct JournalImage<F> {
    pub file: F,
    pub img: Vec<u8>,
    pub salt: JournalSalt,
}

/// Checks a journal file header (version 1 or 2, file id `id`) and returns its salt.
fn check_journal_header(path: &Path, b: &[u8], id: u64) -> Result<JournalSalt, Error> {
    match decode_journal_header(b) {
        JournalHeader::Ok { file_id, salt } if file_id == id => Ok(salt),
        JournalHeader::Ok { file_id, .. } => Err(corrupt(
            path,
            0,
            format!("file header names id {file_id:#x}, file name says {id:#x}"),
        )),
        JournalHeader::Unsupported(found) => Err(Error::UnsupportedFormat {
            path: path.to_path_buf(),
            found,
            oldest: FORMAT_V1,
            newest: JOURNAL_FORMAT_STAMPED,
        }),
        JournalHeader::Bad(reason) => Err(corrupt(path, 0, reason)),
    }
}

pub(crate) async fn read_journal<S: Storage>(
    storage: &S,
    path: &Path,
    id: u64,
) -> Result<JournalImage<S::File>, Error> {
    let f = storage
        .open(path, false)
        .await
        .map_err(io_err("open journal", path, 0))?;
    let size = f.size().await.map_err(io_err("stat journal", path, 0))?;
    let img = f
        .read_at(0, size as usize)
        .await
        .map_err(io_err("read journal", path, 0))?;
    let salt = check_journal_header(path, &img, id)?;
    Ok(JournalImage { file: f, img, salt })
}

/// Replays the journal files `ids` (the first is the mark's) from `mark`, handing every record
/// of every complete batch to `apply` in order; returns the writer's cursor (the durable end).
/// Implements the end-of-journal, torn-tail and corruption rules of journal.md §Recovery.
pub(crate) async fn replay<S: Storage>(
    storage: &S,
    cfg: &EngineConfig,
    ids: &[u64],
    mark: &Mark,
    apply: &mut impl FnMut(Record),
) -> Result<JournalCursor<S::File>, Error> {
    let mut expected_seq = mark.next_seq;
    let path_of = |id: u64| cfg.journal_dir.join(journal_name(id));
    let mut loaded = None;
    for (i, &id) in ids.iter().enumerate() {
        let path = path_of(id);
        let image = match loaded.take() {
            Some(l) => l,
            None => read_journal(storage, &path, id).await?,
        };
        let start = if i == 0 {
            mark.journal_offset
        } else {
            FILE_HEADER_BYTES as u64
        };
        let stop = scan_file(&image.img, &image.salt, start, &mut expected_seq, apply);
        let end = match stop {
            Stop::End(at) => FileEnd {
                stopped_at: at,
                resume: at,
                reason: None,
                whole: false,
            },
            Stop::Bad {
                bad_at,
                resume,
                reason,
                whole,
            } => FileEnd {
                stopped_at: bad_at,
                resume,
                reason: Some(reason),
                whole,
            },
        };
        // Batches are written in order, one at a time: after this file's last batch nothing in
        // it has a seq this high, so finding one means damage, not a crash.
        if let Some((at, seq)) =
            find_later_batch(&image.img, &image.salt, end.stopped_at + 1, expected_seq)
        {
            return Err(corrupt(
                &path,
                end.stopped_at,
                format!(
                    "{}; not the end of the journal: a durable batch with seq {seq} follows at byte offset {at}",
                    end.describe()
                ),
            ));
        }
        if ids.len() > i + 1 {
            let next = next_file(storage, &path_of, &ids[i + 1..], expected_seq).await;
            if let Some(next) = next.map_err(|e| e.in_file(&path, &end))? {
                loaded = Some(next);
                continue;
            }
        }
        return end_here(
            storage,
            &path_of,
            id,
            image,
            &end,
            expected_seq,
            &ids[i + 1..],
        )
        .await;
    }
    unreachable!("ids is non-empty and the last file returns")
}

/// Where replay stopped in one file: the offset of the end or of the bad record, where writing
/// would resume, what was bad (`None`: zeros), and whether the bad batch's write reached the
/// medium whole (every sector stamped, version 3).
struct FileEnd {
    stopped_at: u64,
    resume: u64,
    reason: Option<String>,
    whole: bool,
}

impl FileEnd {
    fn describe(&self) -> String {
        match &self.reason {
            Some(r) => r.clone(),
            None => "no batch here (zeros)".to_string(),
        }
    }
}

/// Why the journal cannot end in the current file.
enum NotTheEnd {
    Io(Error),
    /// A durable batch with the expected seq or later is in file `.0` at `.1`, seq `.2`.
    LaterBatch(u64, u64, u64),
}

impl NotTheEnd {
    /// The error, for the file `path` that stopped at `end`.
    fn in_file(self, path: &Path, end: &FileEnd) -> Error {
        match self {
            NotTheEnd::Io(e) => e,
            NotTheEnd::LaterBatch(lid, at, seq) => corrupt(
                path,
                end.stopped_at,
                format!(
                    "{}; not the end of the journal: a durable batch with seq {seq} follows at {}:{at}",
                    end.describe(),
                    path.with_file_name(journal_name(lid)).display()
                ),
            ),
        }
    }
}

/// Replay step 2: whether the journal continues in the next file `later[0]`: it does only if
/// its first batch carries `expected_seq` (the writer rolled there after this file's last
/// batch; a dropped batch in between would make that seq higher), and then the file is
/// returned. Otherwise no later file may hold a batch with `expected_seq` or later.
async fn next_file<S: Storage>(
    storage: &S,
    path_of: &impl Fn(u64) -> std::path::PathBuf,
    later: &[u64],
    expected_seq: u64,
) -> Result<Option<JournalImage<S::File>>, NotTheEnd> {
    let next_id = later[0];
    let next = read_journal(storage, &path_of(next_id), next_id)
        .await
        .map_err(NotTheEnd::Io)?;
    if batch_header_at(&next.img, &next.salt, FILE_HEADER_BYTES) == Some(expected_seq) {
        return Ok(Some(next));
    }
    let first = FILE_HEADER_BYTES as u64;
    if let Some((at, seq)) = find_later_batch(&next.img, &next.salt, first, expected_seq) {
        return Err(NotTheEnd::LaterBatch(next_id, at, seq));
    }
    for &lid in &later[1..] {
        let l = read_journal(storage, &path_of(lid), lid)
            .await
            .map_err(NotTheEnd::Io)?;
        if let Some((at, seq)) = find_later_batch(&l.img, &l.salt, first, expected_seq) {
            return Err(NotTheEnd::LaterBatch(lid, at, seq));
        }
    }
    Ok(None)
}

/// Replay step 3: journal file `id` holds the end of the journal. A bad batch here is the
/// tail of the one write in flight at a crash (never acknowledged), or a reused file's older
/// bytes: dropped. The file is sealed (the next batch goes to a new file) whenever any byte
/// after the end is not zero: a dropped batch's records (seqs from the expected one on) could
/// otherwise complete a later batch written at the same offset with the same seq and torn after
/// a record boundary. That holds also where the end looks clean because the torn write lost its
/// first sectors but kept later ones. A version 1 or 2 file is sealed too, so the writer only
/// writes version 3 batches. A bad batch that reached the medium whole (every sector stamped,
/// version 3) is not a torn write but damage after it was written: `Error::Corrupt`. The files `later` hold no batch of this journal (pre-created ones: zeros,
/// or a reused file's older batches) and are removed.
async fn end_here<S: Storage>(
    storage: &S,
    path_of: &impl Fn(u64) -> std::path::PathBuf,
    id: u64,
    image: JournalImage<S::File>,
    end: &FileEnd,
    expected_seq: u64,
    later: &[u64],
) -> Result<JournalCursor<S::File>, Error> {
    let JournalImage { file, img, salt } = image;
    if end.whole {
        // Rule 4's exception (journal.md §Recovery): no crash leaves a bad batch whose every
        // sector carries its stamp; it was written whole, maybe synced and acknowledged.
        return Err(corrupt(
            &path_of(id),
            end.stopped_at,
            format!(
                "{}; the journal's last batch reached the medium whole (every sector carries \
                 its stamp), so it was damaged after it was written, not torn by a crash",
                end.describe()
            ),
        ));
    }
    let resume = end.resume;
    let residue = img
        .get(resume as usize..)
        .is_some_and(|rest| rest.iter().any(|&b| b != 0));
    if let Some(r) = &end.reason {
        tracing::info!(
            "journal {}: the journal ends at byte offset {resume}; the bytes after it (a \
             write cut by a crash, or a reused file's older use) are dropped: {r}",
            path_of(id).display()
        );
    }
    let sealed = residue || !salt.sectors_stamped();
    for &lid in later {
        let lpath = path_of(lid);
        storage.remove(&lpath).await.map_err(io_err(
            "remove journal after the end of the journal",
            &lpath,
            0,
        ))?;
    }
    Ok(JournalCursor {
        file_id: id,
        file: Rc::new(file),
        salt,
        pos: resume,
        next_seq: expected_seq,
        sealed,
    })
}

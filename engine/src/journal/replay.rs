//! Journal replay on open (docs/format/journal.md §Recovery; BookKeeper's journal replay from
//! the last mark): scans the files from the checkpoint mark, applies every complete batch, drops
//! a torn tail (zeroing it), and refuses to open when a bad record is followed by durable data.

use std::path::Path;
use std::rc::Rc;

use super::JournalCursor;
use crate::files::{check_header, corrupt, io_err, journal_name};
use crate::format::{
    decode_record, round_up_block, Mark, Record, RecordDecode, BATCH_HEADER_PAYLOAD_BYTES,
    FILE_HEADER_BYTES, JOURNAL_MAGIC, RECORD_HEADER_BYTES,
};
use crate::io::{Storage, StorageFile, BLOCK_BYTES};
use crate::{EngineConfig, Error};

/// Why replay stopped inside a file.
enum Stop {
    /// Zeros or end of file at a batch boundary: clean end of this file.
    Clean(u64),
    /// A bad record at `bad_at`; `resume` is where writing would continue (block aligned).
    Bad {
        bad_at: u64,
        resume: u64,
        reason: String,
    },
}

/// Scans one journal file image from `start`, applying good records. Returns where it stopped.
fn scan_file(
    img: &[u8],
    start: u64,
    expected_seq: &mut u64,
    apply: &mut impl FnMut(Record),
) -> Stop {
    let mut pos = start as usize;
    loop {
        if pos >= img.len() {
            return Stop::Clean(pos as u64);
        }
        let bad = |at: usize, resume: usize, reason: String| Stop::Bad {
            bad_at: at as u64,
            resume: resume as u64,
            reason,
        };
        let (batch_bytes, count) = match decode_record(&img[pos..]) {
            RecordDecode::Zeros => return Stop::Clean(pos as u64),
            RecordDecode::Short => {
                return bad(
                    pos,
                    pos,
                    "record cut short (file ends inside it or its length is garbled)".into(),
                )
            }
            RecordDecode::Bad(r) => return bad(pos, pos, r),
            RecordDecode::Ok {
                seq,
                record:
                    Record::BatchHeader {
                        record_count,
                        batch_bytes,
                    },
                ..
            } => {
                if seq != *expected_seq {
                    return bad(
                        pos,
                        pos,
                        format!("batch header has seq {seq}, expected {}", *expected_seq),
                    );
                }
                (batch_bytes as usize, record_count)
            }
            RecordDecode::Ok { seq, .. } => {
                return bad(
                    pos,
                    pos,
                    format!("record with seq {seq} where a batch header was expected"),
                );
            }
        };
        let mut seq = *expected_seq + 1;
        let mut records = Vec::with_capacity(count.min(1 << 16) as usize);
        let mut q = pos + RECORD_HEADER_BYTES + BATCH_HEADER_PAYLOAD_BYTES;
        // A batch is applied only once all of it checks out: a torn batch was never acknowledged,
        // so none of it is kept and writing resumes at its first block.
        for _ in 0..count {
            match decode_record(&img[q..]) {
                RecordDecode::Ok {
                    seq: got,
                    record,
                    len,
                } => {
                    if got != seq {
                        return bad(q, pos, format!("record has seq {got}, expected {seq}"));
                    }
                    if matches!(record, Record::BatchHeader { .. }) {
                        return bad(q, pos, "batch header inside a batch".into());
                    }
                    records.push(record);
                    seq += 1;
                    q += len;
                }
                RecordDecode::Zeros => return bad(q, pos, "zeros inside a batch".into()),
                RecordDecode::Short => {
                    return bad(
                        q,
                        pos,
                        "record cut short (file ends inside it or its length is garbled)".into(),
                    )
                }
                RecordDecode::Bad(r) => return bad(q, pos, r),
            }
        }
        if q != pos + batch_bytes {
            return bad(
                q,
                pos,
                format!(
                    "batch header says {batch_bytes} bytes, records end at {}",
                    q - pos
                ),
            );
        }
        for r in records {
            apply(r);
        }
        *expected_seq = seq;
        pos = round_up_block(q as u64) as usize;
    }
}

/// The first block-aligned offset at or after `from` holding a valid batch header with
/// `seq >= min_seq`, if any.
pub(crate) fn find_later_batch(img: &[u8], from: u64, min_seq: u64) -> Option<(u64, u64)> {
    let mut at = round_up_block(from) as usize;
    while at < img.len() {
        if let RecordDecode::Ok {
            seq,
            record: Record::BatchHeader { .. },
            ..
        } = decode_record(&img[at..])
        {
            if seq >= min_seq {
                return Some((at as u64, seq));
            }
        }
        at += BLOCK_BYTES;
    }
    None
}

pub(crate) async fn read_journal<S: Storage>(
    storage: &S,
    path: &Path,
    id: u64,
) -> Result<(S::File, Vec<u8>), Error> {
    let f = storage
        .open(path, false)
        .await
        .map_err(io_err("open journal", path, 0))?;
    let size = f.size().await.map_err(io_err("stat journal", path, 0))?;
    let img = f
        .read_at(0, size as usize)
        .await
        .map_err(io_err("read journal", path, 0))?;
    check_header(path, JOURNAL_MAGIC, &img, id)?;
    Ok((f, img))
}

/// Replays the journal files `ids` (the first is the mark's) from `mark`, handing every record
/// of every complete batch to `apply` in order; returns the writer's cursor (the durable end).
/// Implements the torn-tail vs. corruption rule of journal.md §Recovery.
pub(crate) async fn replay<S: Storage>(
    storage: &S,
    cfg: &EngineConfig,
    ids: &[u64],
    mark: &Mark,
    apply: &mut impl FnMut(Record),
) -> Result<JournalCursor<S::File>, Error> {
    let mut expected_seq = mark.next_seq;
    for (i, &id) in ids.iter().enumerate() {
        let path = cfg.journal_dir.join(journal_name(id));
        let (file, img) = read_journal(storage, &path, id).await?;
        let start = if i == 0 {
            mark.journal_offset
        } else {
            FILE_HEADER_BYTES as u64
        };
        match scan_file(&img, start, &mut expected_seq, apply) {
            Stop::Clean(end) => {
                if i + 1 == ids.len() {
                    return Ok(JournalCursor {
                        file_id: id,
                        file: Rc::new(file),
                        pos: end,
                        next_seq: expected_seq,
                    });
                }
            }
            Stop::Bad {
                bad_at,
                resume,
                reason,
            } => {
                // Durable data after the bad record means it is not a torn tail.
                let mut later = find_later_batch(&img, bad_at + 1, expected_seq)
                    .map(|(at, seq)| (path.clone(), at, seq));
                if later.is_none() {
                    for &lid in &ids[i + 1..] {
                        let lpath = cfg.journal_dir.join(journal_name(lid));
                        let (_, limg) = read_journal(storage, &lpath, lid).await?;
                        if let Some((at, seq)) =
                            find_later_batch(&limg, FILE_HEADER_BYTES as u64, expected_seq)
                        {
                            later = Some((lpath, at, seq));
                            break;
                        }
                    }
                }
                if let Some((lpath, at, seq)) = later {
                    return Err(corrupt(
                        &path,
                        bad_at,
                        format!(
                            "{reason}; not a torn tail: a durable batch with seq {seq} follows at {}:{at}",
                            lpath.display()
                        ),
                    ));
                }
                tracing::warn!(
                    "journal {}: dropping torn tail at byte offset {bad_at}: {reason}",
                    path.display()
                );
                // Zero the torn bytes so that no stale record can be mistaken for data later.
                let last_nonzero = img
                    .iter()
                    .rposition(|&b| b != 0)
                    .map_or(0, |p| p as u64 + 1);
                let zero_end = round_up_block(last_nonzero.max(resume));
                if zero_end > resume {
                    let zeros = vec![0u8; (zero_end - resume) as usize];
                    file.write_at(resume, &zeros).await.map_err(io_err(
                        "journal zero torn tail",
                        &path,
                        resume,
                    ))?;
                    file.fdatasync()
                        .await
                        .map_err(io_err("journal fdatasync", &path, resume))?;
                }
                for &lid in &ids[i + 1..] {
                    let lpath = cfg.journal_dir.join(journal_name(lid));
                    storage.remove(&lpath).await.map_err(io_err(
                        "remove journal after torn tail",
                        &lpath,
                        0,
                    ))?;
                }
                return Ok(JournalCursor {
                    file_id: id,
                    file: Rc::new(file),
                    pos: resume,
                    next_seq: expected_seq,
                });
            }
        }
    }
    unreachable!("ids is non-empty and the last file returns")
}

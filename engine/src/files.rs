//! File names of the engine's directories and the errors that name a file: every `Error::Io`
//! and `Error::Corrupt` carries the path and byte offset involved (docs/format/*.md names the
//! files; the header check follows the shared file header of `format`).

use std::io as stdio;
use std::path::Path;

use crate::format::{decode_file_header, HeaderCheck, FORMAT_CURRENT, FORMAT_OLDEST_READABLE};
use crate::Error;

/// Name of journal file `id`.
pub(crate) fn journal_name(id: u64) -> String {
    format!("journal-{id:016x}.qj")
}

/// Name of entry log `id`.
pub(crate) fn entry_log_name(id: u64) -> String {
    format!("entrylog-{id:016x}.qel")
}

/// The id in `{prefix}{id:016x}{suffix}`, or `None` for any other name.
pub(crate) fn parse_id(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let hex = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Turns an OS error of `op` on `path` at `file_offset_bytes` into `Error::Io`.
pub(crate) fn io_err(
    op: &'static str,
    path: &Path,
    file_offset_bytes: u64,
) -> impl FnOnce(stdio::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io {
        op,
        path,
        file_offset_bytes,
        source,
    }
}

/// `Error::Corrupt` for `path` at `file_offset_bytes`.
pub(crate) fn corrupt(path: &Path, file_offset_bytes: u64, reason: impl Into<String>) -> Error {
    Error::Corrupt {
        path: path.to_path_buf(),
        file_offset_bytes,
        reason: reason.into(),
    }
}

/// Checks the file header at the start of `b`: `magic`, a readable version, and file id `id`.
pub(crate) fn check_header(path: &Path, magic: [u8; 8], b: &[u8], id: u64) -> Result<(), Error> {
    match decode_file_header(magic, b) {
        HeaderCheck::Ok { file_id, .. } if file_id == id => Ok(()),
        HeaderCheck::Ok { file_id, .. } => Err(corrupt(
            path,
            0,
            format!("file header names id {file_id:#x}, file name says {id:#x}"),
        )),
        HeaderCheck::Unsupported(found) => Err(Error::UnsupportedFormat {
            path: path.to_path_buf(),
            found,
            oldest: FORMAT_OLDEST_READABLE,
            newest: FORMAT_CURRENT,
        }),
        HeaderCheck::Bad(reason) => Err(corrupt(path, 0, reason)),
    }
}

//! Result types shared by the stream layer, the server and the client.

use crate::dlsn::{Dlsn, ReadPosition};

/// What an acknowledged write returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteResult {
    /// DLSN of the first record written.
    pub first_dlsn: Dlsn,
    /// DLSN of the last record written.
    pub last_dlsn: Dlsn,
    /// Records written.
    pub count: u64,
}

/// Records returned by one read, in log order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBatch {
    /// `(dlsn, txid, payload)` per record, DLSNs strictly increasing.
    pub records: Vec<(Dlsn, u64, Vec<u8>)>,
    /// Where the next read continues: just after the last record returned, or the position
    /// asked for when nothing was returned.
    pub next: ReadPosition,
}

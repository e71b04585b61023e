//! What [`super::History::check`] found: findings, each with the slice of history that shows it.

use std::fmt;

use super::{Op, OpKind, Outcome, Record};

/// The kinds of violation the checker reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// An acknowledged record is missing from the final log (and was not truncated or deleted).
    LostWrite,
    /// An acknowledged record is in the final log, but not at the DLSN it was acknowledged
    /// with, or another record sits there, or its txid differs from the one written.
    MisplacedWrite,
    /// Two acknowledged writes were given overlapping DLSN ranges.
    AckConflict,
    /// A record appears more often than it was written, or more than once although a producer
    /// session wrote it (retries without a session that may have landed twice are listed in
    /// [`Report::allowed_duplicates`] instead).
    Duplicate,
    /// The final log holds a record no write could have put there: never written, or written
    /// only by writes that failed definitely.
    Unexpected,
    /// A reader got a record the final log does not hold at that DLSN (Jepsen's aborted read).
    AbortedRead,
    /// A reader's view went backwards or repeated a DLSN.
    OrderInversion,
    /// A reader's view skipped records of the final log (contiguity from its start position).
    Gap,
    /// DLSNs go backwards or repeat in the final log.
    DlsnBackwards,
    /// Txids go backwards in the final log or in a reader's view.
    TxidBackwards,
    /// Two readers got different records at one DLSN.
    ReadersDisagree,
    /// A read invoked after a truncation had returned got a record before the truncation point.
    ReadPastTruncation,
    /// A write invoked after a seal (end of stream) had returned was acknowledged.
    WriteAfterSeal,
}

/// One violation: its kind, what is wrong, and the operations involved (in invocation order,
/// rendered with the records that matter).
#[derive(Debug, Clone)]
pub struct Finding {
    pub kind: Kind,
    pub message: String,
    /// Ids of the operations involved, in invocation order.
    pub ops: Vec<usize>,
    /// The slice of history that shows it, one line per operation.
    pub slice: Vec<String>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:?}: {}", self.kind, self.message)?;
        for line in &self.slice {
            writeln!(f, "    {line}")?;
        }
        Ok(())
    }
}

/// Everything the checker found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Violations, grouped by kind in [`Kind`]'s order.
    pub findings: Vec<Finding>,
    /// Duplicates a blind retry explains (a write with an unknown outcome re-sent without a
    /// producer session): allowed, listed for the test to look at.
    pub allowed_duplicates: Vec<Finding>,
    /// Operations checked and records in the final log.
    pub ops: usize,
    pub final_records: usize,
}

impl Report {
    /// The findings of one kind.
    pub fn of(&self, kind: Kind) -> Vec<&Finding> {
        self.findings.iter().filter(|f| f.kind == kind).collect()
    }

    /// Whether nothing was found.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }

    /// Panics with every finding and its slice of history unless the report is clean.
    pub fn assert_clean(&self) {
        assert!(self.is_clean(), "history check failed:\n{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} findings over {} operations and {} final records",
            self.findings.len(),
            self.ops,
            self.final_records
        )?;
        for finding in &self.findings {
            write!(f, "{finding}")?;
        }
        if !self.allowed_duplicates.is_empty() {
            writeln!(f, "allowed duplicates: {}", self.allowed_duplicates.len())?;
        }
        Ok(())
    }
}

/// A payload as text for reports: lossy UTF-8, at most 40 characters.
pub(super) fn show_payload(p: &[u8]) -> String {
    let s = String::from_utf8_lossy(p);
    let mut out: String = s.chars().take(40).collect();
    if s.chars().count() > 40 {
        out.push('…');
    }
    format!("{out:?}")
}

/// A record as text: `dlsn txid "payload"`.
pub(super) fn show_record(r: &Record) -> String {
    format!("{} txid {} {}", r.dlsn, r.txid, show_payload(&r.payload))
}

/// One operation as a line of a slice: id, process, logical times, what it did and its result
/// (a read shows its record count and DLSN range; the finding's message names the records).
pub(super) fn show_op(op: &Op) -> String {
    let done = op.completed.map_or("…".to_string(), |t| t.to_string());
    let head = format!("op {} [{}] t{}..{}", op.id, op.process, op.invoked, done);
    let body = match &op.kind {
        OpKind::Write {
            records,
            session,
            outcome,
        } => {
            let recs: Vec<String> = records
                .iter()
                .take(4)
                .map(|(t, p)| format!("txid {t} {}", show_payload(p)))
                .collect();
            let more = records.len().saturating_sub(4);
            let more = if more > 0 {
                format!(" +{more} more")
            } else {
                String::new()
            };
            let sess = session.map_or(String::new(), |s| format!(" session {}#{}", s.id, s.seq));
            let out = match outcome {
                None => "in flight".to_string(),
                Some(Outcome::Ok { first, last }) => format!("ok {first}..{last}"),
                Some(Outcome::Failed(e)) => format!("failed ({e})"),
                Some(Outcome::Unknown(e)) => format!("unknown ({e})"),
            };
            format!("write [{}{more}]{sess} -> {out}", recs.join(", "))
        }
        OpKind::Read { from, records } => match records {
            None => format!("read from {from:?} -> no answer"),
            Some(r) if r.is_empty() => format!("read from {from:?} -> 0 records"),
            Some(r) => format!(
                "read from {from:?} -> {} records {}..{}",
                r.len(),
                r[0].dlsn,
                r[r.len() - 1].dlsn
            ),
        },
        OpKind::Truncate { point } => format!("truncate before {point}"),
        OpKind::Seal => "seal".to_string(),
        OpKind::Delete => "delete".to_string(),
    };
    format!("{head} {body}")
}

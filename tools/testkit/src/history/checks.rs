//! The checks behind [`super::History::check`], one function per family of [`Kind`].

use std::collections::{BTreeMap, HashMap};

use super::report::{show_op, show_record, Finding, Kind, Report};
use super::{Dlsn, Op, OpKind, Outcome, ReadFrom, Record};

type IdFn<'a> = &'a dyn Fn(&[u8]) -> Vec<u8>;

/// What every check looks things up in.
struct Ctx<'a> {
    ops: &'a [Op],
    log: &'a [Record],
    id: IdFn<'a>,
    /// Final log: index by DLSN, indices by record id.
    at: HashMap<Dlsn, usize>,
    copies: HashMap<Vec<u8>, Vec<usize>>,
    /// Write ops by record id.
    writes_of: HashMap<Vec<u8>, Vec<usize>>,
    /// The latest truncation point that is or may be in force: completed, or with no known
    /// outcome and at or before the final log's first record (the final log starts at or
    /// after it). Records before it may be gone.
    floor: Dlsn,
    report: Report,
}

/// Runs every check of `ops` against `log`.
pub(super) fn run(ops: &[Op], log: &[Record], id: IdFn<'_>) -> Report {
    let mut cx = Ctx::new(ops, log, id);
    final_log_order(&mut cx);
    acked_writes(&mut cx);
    ack_conflicts(&mut cx);
    copies_in_log(&mut cx);
    readers(&mut cx);
    reads_past_truncation(&mut cx);
    readers_disagree(&mut cx);
    writes_after_seal(&mut cx);
    let mut report = cx.report;
    report.findings.sort_by_key(|f| f.kind);
    report.ops = ops.len();
    report.final_records = log.len();
    report
}

impl<'a> Ctx<'a> {
    fn new(ops: &'a [Op], log: &'a [Record], id: IdFn<'a>) -> Self {
        let mut copies: HashMap<Vec<u8>, Vec<usize>> = HashMap::new();
        let mut at = HashMap::new();
        for (i, r) in log.iter().enumerate() {
            copies.entry(id(&r.payload)).or_default().push(i);
            at.entry(r.dlsn).or_insert(i);
        }
        let mut writes_of: HashMap<Vec<u8>, Vec<usize>> = HashMap::new();
        let mut floor = Dlsn::INITIAL;
        // A truncation whose answer was lost (a timeout, a proxy killed) may have been applied:
        // it was, unless the final log still holds a record before its point (the point never
        // moves backwards, DistributedLog's rule).
        let head = log.first().map(|r| r.dlsn);
        for op in ops {
            match &op.kind {
                OpKind::Write { records, .. } => {
                    for (_, p) in records {
                        writes_of.entry(id(p)).or_default().push(op.id);
                    }
                }
                OpKind::Truncate { point }
                    if op.completed.is_some() || head.is_none_or(|h| *point <= h) =>
                {
                    floor = floor.max(*point)
                }
                _ => {}
            }
        }
        Self {
            ops,
            log,
            id,
            at,
            copies,
            writes_of,
            floor,
            report: Report::default(),
        }
    }

    /// Adds a finding over `ops` (sorted, deduplicated), with `extra` lines (records) after
    /// the operations.
    fn find(&mut self, kind: Kind, message: String, ops: &[usize], extra: Vec<String>) {
        let f = self.finding(kind, message, ops, extra);
        self.report.findings.push(f);
    }

    fn finding(&self, kind: Kind, message: String, ops: &[usize], extra: Vec<String>) -> Finding {
        let mut ops = ops.to_vec();
        ops.sort_by_key(|&i| (self.ops[i].invoked, i));
        ops.dedup();
        let mut slice: Vec<String> = ops.iter().map(|&i| show_op(&self.ops[i])).collect();
        slice.extend(extra);
        Finding {
            kind,
            message,
            ops,
            slice,
        }
    }

    /// The writes that wrote the record with `payload`.
    fn writers(&self, payload: &[u8]) -> Vec<usize> {
        self.writes_of
            .get(&(self.id)(payload))
            .cloned()
            .unwrap_or_default()
    }

    /// The time of the last completed deletion's invocation: writes that completed before it
    /// are gone legitimately.
    fn deleted_at(&self) -> Option<u64> {
        self.ops
            .iter()
            .filter(|o| matches!(o.kind, OpKind::Delete) && o.completed.is_some())
            .map(|o| o.invoked)
            .max()
    }
}

/// DLSNs strictly increase and txids never decrease along the final log.
fn final_log_order(cx: &mut Ctx<'_>) {
    for w in cx.log.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let mut ops = cx.writers(&a.payload);
        ops.extend(cx.writers(&b.payload));
        let lines = vec![
            format!("final log: {}", show_record(a)),
            format!("final log: {}", show_record(b)),
        ];
        if b.dlsn <= a.dlsn {
            let m = format!("final log DLSN {} follows {}", b.dlsn, a.dlsn);
            cx.find(Kind::DlsnBackwards, m, &ops, lines);
        } else if b.txid < a.txid {
            let m = format!(
                "final log txid {} at {} follows txid {} at {}",
                b.txid, b.dlsn, a.txid, a.dlsn
            );
            cx.find(Kind::TxidBackwards, m, &ops, lines);
        }
    }
}

/// Each acknowledged record is in the final log at its acknowledged DLSN range, in order, with
/// its txid, unless truncated or deleted.
fn acked_writes(cx: &mut Ctx<'_>) {
    let deleted_at = cx.deleted_at();
    for op in cx.ops {
        let OpKind::Write {
            records,
            outcome: Some(Outcome::Ok { first, last }),
            ..
        } = &op.kind
        else {
            continue;
        };
        let gone = deleted_at.is_some_and(|t| op.completed.is_some_and(|c| c < t));
        if gone || *last < cx.floor {
            continue;
        }
        // A write cut by the truncation point: only its last record must remain.
        let must: Vec<usize> = if *first < cx.floor {
            vec![records.len() - 1]
        } else {
            (0..records.len()).collect()
        };
        check_one_ack(cx, op.id, records, (*first, *last), &must);
    }
}

fn check_one_ack(
    cx: &mut Ctx<'_>,
    op: usize,
    records: &[(u64, Vec<u8>)],
    (first, last): (Dlsn, Dlsn),
    must: &[usize],
) {
    let mut prev: Option<usize> = None;
    for &i in must {
        let (txid, payload) = &records[i];
        let found = cx
            .copies
            .get(&(cx.id)(payload))
            .cloned()
            .unwrap_or_default();
        let Some(&at) = found
            .iter()
            .find(|&&x| cx.log[x].dlsn >= first && cx.log[x].dlsn <= last)
        else {
            if found.is_empty() {
                let m = format!(
                    "acknowledged record {} ({first}..{last}) is not in the final log",
                    super::report::show_payload(payload)
                );
                cx.find(Kind::LostWrite, m, &[op], vec![]);
            } else {
                let lines = found
                    .iter()
                    .map(|&x| format!("final log: {}", show_record(&cx.log[x])))
                    .collect();
                let m = format!(
                    "acknowledged record {} is outside its acknowledged range {first}..{last}",
                    super::report::show_payload(payload)
                );
                cx.find(Kind::MisplacedWrite, m, &[op], lines);
            }
            return;
        };
        let r = &cx.log[at];
        let edge = (i == 0 && r.dlsn != first) || (i == records.len() - 1 && r.dlsn != last);
        let order = prev.is_some_and(|p| at != p + 1);
        if edge || order || r.txid != *txid {
            let m = format!("record {i} of the write is misplaced or altered in the final log (acknowledged {first}..{last}, txid {txid})");
            cx.find(
                Kind::MisplacedWrite,
                m,
                &[op],
                vec![format!("final log: {}", show_record(r))],
            );
            return;
        }
        prev = Some(at);
    }
}

/// No two acknowledged writes share a DLSN.
fn ack_conflicts(cx: &mut Ctx<'_>) {
    let mut acks: Vec<(Dlsn, Dlsn, usize)> = cx
        .ops
        .iter()
        .filter_map(|o| match &o.kind {
            OpKind::Write {
                outcome: Some(Outcome::Ok { first, last }),
                ..
            } => Some((*first, *last, o.id)),
            _ => None,
        })
        .collect();
    acks.sort();
    for w in acks.windows(2) {
        if w[1].0 <= w[0].1 {
            let m = format!(
                "acknowledgements {}..{} and {}..{} overlap",
                w[0].0, w[0].1, w[1].0, w[1].1
            );
            cx.find(Kind::AckConflict, m, &[w[0].2, w[1].2], vec![]);
        }
    }
}

/// Each record of the final log was written by a write that may have succeeded, and appears no
/// more often than its writes allow.
fn copies_in_log(cx: &mut Ctx<'_>) {
    let mut ids: Vec<(&Vec<u8>, &Vec<usize>)> = cx.copies.iter().collect();
    ids.sort_by_key(|(_, at)| at[0]);
    let ids: Vec<(Vec<u8>, Vec<usize>)> = ids
        .into_iter()
        .map(|(a, b)| (a.clone(), b.clone()))
        .collect();
    for (id, at) in ids {
        let writes = cx.writes_of.get(&id).cloned().unwrap_or_default();
        let lines: Vec<String> = at
            .iter()
            .map(|&x| format!("final log: {}", show_record(&cx.log[x])))
            .collect();
        let may_land: Vec<usize> = writes
            .iter()
            .copied()
            .filter(|&w| {
                !matches!(
                    &cx.ops[w].kind,
                    OpKind::Write {
                        outcome: Some(Outcome::Failed(_)),
                        ..
                    }
                )
            })
            .collect();
        let sessions = writes.iter().any(|&w| {
            matches!(
                &cx.ops[w].kind,
                OpKind::Write {
                    session: Some(_),
                    ..
                }
            )
        });
        let blind_retry = may_land.iter().any(|&w| {
            matches!(
                &cx.ops[w].kind,
                OpKind::Write {
                    outcome: Some(Outcome::Unknown(_)) | None,
                    ..
                }
            )
        });
        if may_land.is_empty() {
            let m = if writes.is_empty() {
                "the final log holds a record never written".to_string()
            } else {
                "the final log holds a record whose every write failed".to_string()
            };
            cx.find(Kind::Unexpected, m, &writes, lines);
        } else if at.len() > 1 && (sessions || at.len() > may_land.len() || !blind_retry) {
            let m = format!(
                "a record written {} time(s) appears {} times in the final log",
                writes.len(),
                at.len()
            );
            cx.find(Kind::Duplicate, m, &writes, lines);
        } else if at.len() > 1 {
            let m = format!(
                "a record retried after an unknown outcome appears {} times",
                at.len()
            );
            let f = cx.finding(Kind::Duplicate, m, &writes, lines);
            cx.report.allowed_duplicates.push(f);
        }
    }
}

/// Each reader's view: records in the final log (aborted reads), DLSNs and txids increasing,
/// contiguous from its start position (gaps).
fn readers(cx: &mut Ctx<'_>) {
    let mut by_reader: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in cx.ops {
        if matches!(op.kind, OpKind::Read { .. }) {
            by_reader.entry(op.process.as_str()).or_default().push(op);
        }
    }
    for reads in by_reader.values() {
        let view: Vec<(&Record, usize)> = reads
            .iter()
            .filter_map(|o| match &o.kind {
                OpKind::Read {
                    records: Some(r), ..
                } => Some(r.iter().map(move |r| (r, o.id))),
                _ => None,
            })
            .flatten()
            .collect();
        for &(r, op) in &view {
            aborted_read(cx, r, op);
        }
        view_start(cx, reads, &view);
        for w in view.windows(2) {
            view_step(cx, w[0], w[1]);
        }
    }
}

/// A record read must be in the final log at its DLSN (when not truncated) and must have been
/// written by a write that may have succeeded.
fn aborted_read(cx: &mut Ctx<'_>, r: &Record, op: usize) {
    let writes = cx.writers(&r.payload);
    let landed = writes.iter().any(|&w| {
        !matches!(
            &cx.ops[w].kind,
            OpKind::Write {
                outcome: Some(Outcome::Failed(_)),
                ..
            }
        )
    });
    let in_log = cx.at.get(&r.dlsn).map(|&i| &cx.log[i]);
    // A read that returned before a deletion was invoked read the deleted stream.
    let done = cx.ops[op].completed.unwrap_or(u64::MAX);
    let deleted = cx.deleted_at().is_some_and(|t| done < t);
    let bad = !landed || (!deleted && r.dlsn >= cx.floor && in_log != Some(r));
    if bad {
        let mut ops = writes.clone();
        ops.push(op);
        let mut lines = vec![format!("read: {}", show_record(r))];
        lines.push(match in_log {
            Some(l) => format!("final log: {}", show_record(l)),
            None => format!("final log: nothing at {}", r.dlsn),
        });
        let m = format!(
            "op {op} read a record at {} that is not in the final log",
            r.dlsn
        );
        cx.find(Kind::AbortedRead, m, &ops, lines);
    }
}

/// The view's first record is the first one of the final log at or after its start position
/// (or after a truncation point in force by the time the read returned).
fn view_start(cx: &mut Ctx<'_>, reads: &[&Op], view: &[(&Record, usize)]) {
    let Some(&(first, op)) = view.first() else {
        return;
    };
    let start = match reads.first().map(|o| &o.kind) {
        Some(OpKind::Read {
            from: ReadFrom::Head,
            ..
        }) => Dlsn::INITIAL,
        Some(OpKind::Read {
            from: ReadFrom::Dlsn(d),
            ..
        }) => *d,
        _ => return,
    };
    let done = cx.ops[op].completed.unwrap_or(u64::MAX);
    let truncated = cx
        .ops
        .iter()
        .filter_map(|o| match o.kind {
            OpKind::Truncate { point } if o.invoked < done => Some(point),
            _ => None,
        })
        .max()
        .unwrap_or(Dlsn::INITIAL);
    let start = start.max(truncated);
    let skipped: Vec<&Record> = cx
        .log
        .iter()
        .filter(|r| r.dlsn >= start && r.dlsn < first.dlsn)
        .collect();
    if let Some(s) = skipped.first() {
        let mut ops = cx.writers(&s.payload);
        ops.push(reads[0].id);
        ops.push(op);
        let m = format!("reader {:?} started at {start} but its first record is {}: {} record(s) of the final log skipped", cx.ops[op].process, first.dlsn, skipped.len());
        let lines = vec![
            format!("final log: {}", show_record(s)),
            format!("read: {}", show_record(first)),
        ];
        cx.find(Kind::Gap, m, &ops, lines);
    }
}

/// Two consecutive records of a view: DLSN and txid order, and no final-log record between them.
fn view_step(cx: &mut Ctx<'_>, (a, oa): (&Record, usize), (b, ob): (&Record, usize)) {
    let lines = vec![
        format!("read by op {oa}: {}", show_record(a)),
        format!("read by op {ob}: {}", show_record(b)),
    ];
    let who = cx.ops[ob].process.clone();
    if b.dlsn <= a.dlsn {
        let m = format!("reader {who:?} got {} after {}", b.dlsn, a.dlsn);
        return cx.find(Kind::OrderInversion, m, &[oa, ob], lines);
    }
    if b.txid < a.txid {
        let m = format!("reader {who:?} got txid {} after txid {}", b.txid, a.txid);
        return cx.find(Kind::TxidBackwards, m, &[oa, ob], lines);
    }
    let (Some(&ia), Some(&ib)) = (cx.at.get(&a.dlsn), cx.at.get(&b.dlsn)) else {
        return;
    };
    if ib > ia + 1 {
        let s = &cx.log[ia + 1];
        let mut ops = cx.writers(&s.payload);
        ops.extend([oa, ob]);
        let mut lines = lines;
        lines.insert(1, format!("final log (skipped): {}", show_record(s)));
        let m = format!(
            "reader {who:?} skipped {} record(s) of the final log between {} and {}",
            ib - ia - 1,
            a.dlsn,
            b.dlsn
        );
        cx.find(Kind::Gap, m, &ops, lines);
    }
}

/// A read invoked after a truncation returned gets nothing before its point.
fn reads_past_truncation(cx: &mut Ctx<'_>) {
    for t in cx.ops {
        let (OpKind::Truncate { point }, Some(done)) = (&t.kind, t.completed) else {
            continue;
        };
        for op in cx.ops.iter().filter(|o| o.invoked > done) {
            let OpKind::Read {
                records: Some(recs),
                ..
            } = &op.kind
            else {
                continue;
            };
            if let Some(r) = recs.iter().find(|r| r.dlsn < *point) {
                let m = format!(
                    "op {} read {} after the truncation before {point} returned",
                    op.id, r.dlsn
                );
                cx.find(
                    Kind::ReadPastTruncation,
                    m,
                    &[t.id, op.id],
                    vec![format!("read: {}", show_record(r))],
                );
            }
        }
    }
}

/// Every read that returned a record at one DLSN returned the same record.
fn readers_disagree(cx: &mut Ctx<'_>) {
    let mut seen: HashMap<Dlsn, (&Record, usize)> = HashMap::new();
    let mut found = Vec::new();
    for op in cx.ops {
        let OpKind::Read {
            records: Some(recs),
            ..
        } = &op.kind
        else {
            continue;
        };
        for r in recs {
            match seen.get(&r.dlsn) {
                Some(&(s, o)) if s != r => found.push((s, o, r, op.id)),
                Some(_) => {}
                None => {
                    seen.insert(r.dlsn, (r, op.id));
                }
            }
        }
    }
    for (s, o, r, op) in found {
        let m = format!("ops {o} and {op} got different records at {}", r.dlsn);
        let lines = vec![
            format!("read by op {o}: {}", show_record(s)),
            format!("read by op {op}: {}", show_record(r)),
        ];
        cx.find(Kind::ReadersDisagree, m, &[o, op], lines);
    }
}

/// No write invoked after a seal returned is acknowledged (DistributedLog's end of stream).
fn writes_after_seal(cx: &mut Ctx<'_>) {
    for s in cx.ops {
        let (OpKind::Seal, Some(done)) = (&s.kind, s.completed) else {
            continue;
        };
        for w in cx.ops.iter().filter(|o| o.invoked > done) {
            if let OpKind::Write {
                outcome: Some(Outcome::Ok { .. }),
                ..
            } = &w.kind
            {
                let m = format!("write op {} was acknowledged after the seal returned", w.id);
                cx.find(Kind::WriteAfterSeal, m, &[s.id, w.id], vec![]);
            }
        }
    }
}

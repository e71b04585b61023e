//! The checker's own tests: a clean history passes; each kind of violation, planted alone in
//! an otherwise clean history, is reported, and the report names the operations involved.

use super::*;

fn d(entry: u64, slot: u32) -> Dlsn {
    Dlsn::new(1, entry, slot)
}

fn rec(entry: u64, slot: u32, txid: u64, p: &str) -> Record {
    Record::new(d(entry, slot), txid, p.as_bytes().to_vec())
}

fn recs(items: &[(u64, &str)]) -> Vec<(u64, Vec<u8>)> {
    items
        .iter()
        .map(|(t, p)| (*t, p.as_bytes().to_vec()))
        .collect()
}

/// A clean run: writer w writes a0 (1:0:0), then a1 and a2 in one write (1:1:0..1:1:1); reader
/// r reads from the head in two reads; the final log is the three records.
fn clean() -> (History, Vec<Record>) {
    let h = History::new();
    h.write_ok("w", recs(&[(1, "a0")]), d(0, 0), d(0, 0));
    h.write_ok("w", recs(&[(2, "a1"), (3, "a2")]), d(1, 0), d(1, 1));
    let r = h.read_invoked("r", ReadFrom::Head);
    h.read_done(r, vec![rec(0, 0, 1, "a0")]);
    let r = h.read_invoked("r", ReadFrom::Other);
    h.read_done(r, vec![rec(1, 0, 2, "a1"), rec(1, 1, 3, "a2")]);
    let log = vec![rec(0, 0, 1, "a0"), rec(1, 0, 2, "a1"), rec(1, 1, 3, "a2")];
    (h, log)
}

/// Checks that `report` has exactly one finding, of `kind`, whose text names each of `ops`.
fn only(report: &Report, kind: Kind, ops: &[usize]) -> String {
    assert_eq!(report.findings.len(), 1, "one finding expected:\n{report}");
    let f = &report.findings[0];
    assert_eq!(f.kind, kind, "{report}");
    let text = f.to_string();
    for op in ops {
        assert!(f.ops.contains(op), "op {op} is involved:\n{text}");
        assert!(
            text.contains(&format!("op {op} ")),
            "the text names op {op}:\n{text}"
        );
    }
    text
}

#[test]
fn a_clean_history_passes() {
    let (h, log) = clean();
    let report = h.check(&log);
    report.assert_clean();
    assert!(report.allowed_duplicates.is_empty());
    assert_eq!((report.ops, report.final_records), (4, 3));
}

#[test]
fn a_lost_acknowledged_write_is_reported() {
    let (h, log) = clean();
    let lost = h.write_ok("w2", recs(&[(4, "b0")]), d(2, 0), d(2, 0));
    only(&h.check(&log), Kind::LostWrite, &[lost]);
}

#[test]
fn a_record_away_from_its_acknowledged_dlsn_is_reported() {
    let (h, mut log) = clean();
    let w = h.write_ok("w2", recs(&[(4, "b0")]), d(2, 0), d(2, 0));
    log.push(rec(3, 0, 4, "b0"));
    only(&h.check(&log), Kind::MisplacedWrite, &[w]);
}

#[test]
fn overlapping_acknowledgements_are_reported() {
    let (h, log) = clean();
    let w = h.write_invoked("w2", recs(&[(4, "b0")]), None);
    h.write_done(
        w,
        Outcome::Ok {
            first: d(1, 1),
            last: d(1, 1),
        },
    );
    // b0 is also lost (another record sits at its DLSN): two findings, one of each kind.
    let report = h.check(&log);
    let conflict = report.of(Kind::AckConflict);
    assert_eq!(conflict.len(), 1, "{report}");
    assert_eq!(conflict[0].ops, vec![1, w]);
    assert!(
        conflict[0].to_string().contains("op 1 ")
            && conflict[0].to_string().contains(&format!("op {w} "))
    );
}

#[test]
fn a_record_written_once_appearing_twice_is_a_duplicate() {
    let (h, mut log) = clean();
    log.push(rec(2, 0, 3, "a2"));
    let text = only(&h.check(&log), Kind::Duplicate, &[1]);
    assert!(text.contains("1:2:0") && text.contains("1:1:1"), "{text}");
}

#[test]
fn a_blind_retry_after_an_unknown_outcome_may_land_twice() {
    let (h, mut log) = clean();
    let first = h.write_invoked("w2", recs(&[(4, "b0")]), None);
    h.write_done(first, Outcome::Unknown("timeout".into()));
    let retry = h.write_ok("w2", recs(&[(4, "b0")]), d(3, 0), d(3, 0));
    log.push(rec(2, 0, 4, "b0"));
    log.push(rec(3, 0, 4, "b0"));
    let report = h.check(&log);
    report.assert_clean();
    assert_eq!(report.allowed_duplicates.len(), 1);
    assert_eq!(report.allowed_duplicates[0].ops, vec![first, retry]);
}

#[test]
fn a_retry_with_a_producer_session_must_not_land_twice() {
    let (h, mut log) = clean();
    let s = Some(Session { id: 7, seq: 0 });
    let first = h.write_invoked("w2", recs(&[(4, "b0")]), s);
    h.write_done(first, Outcome::Unknown("timeout".into()));
    let retry = h.write_invoked("w2", recs(&[(4, "b0")]), s);
    h.write_done(
        retry,
        Outcome::Ok {
            first: d(3, 0),
            last: d(3, 0),
        },
    );
    log.push(rec(2, 0, 4, "b0"));
    log.push(rec(3, 0, 4, "b0"));
    let text = only(&h.check(&log), Kind::Duplicate, &[first, retry]);
    assert!(text.contains("session 7#0"), "{text}");
}

#[test]
fn a_failed_write_in_the_final_log_is_unexpected() {
    let (h, mut log) = clean();
    let w = h.write_invoked("w2", recs(&[(4, "b0")]), None);
    h.write_done(w, Outcome::Failed("NoSuchStream".into()));
    log.push(rec(2, 0, 4, "b0"));
    only(&h.check(&log), Kind::Unexpected, &[w]);
}

#[test]
fn a_read_of_a_record_not_in_the_final_log_is_an_aborted_read() {
    let (h, log) = clean();
    let w = h.write_invoked("w2", recs(&[(4, "b0")]), None);
    h.write_done(w, Outcome::Unknown("connection lost".into()));
    let r = h.read_invoked("r2", ReadFrom::Dlsn(d(2, 0)));
    h.read_done(r, vec![rec(2, 0, 4, "b0")]);
    only(&h.check(&log), Kind::AbortedRead, &[w, r]);
}

#[test]
fn a_reader_going_backwards_is_an_order_inversion() {
    let (h, log) = clean();
    let r1 = h.read_invoked("r2", ReadFrom::Dlsn(d(1, 0)));
    h.read_done(r1, vec![rec(1, 0, 2, "a1"), rec(1, 1, 3, "a2")]);
    let r2 = h.read_invoked("r2", ReadFrom::Other);
    h.read_done(r2, vec![rec(1, 1, 3, "a2")]);
    only(&h.check(&log), Kind::OrderInversion, &[r1, r2]);
}

#[test]
fn a_reader_skipping_a_record_has_a_gap() {
    let (h, log) = clean();
    let r = h.read_invoked("r2", ReadFrom::Head);
    h.read_done(r, vec![rec(0, 0, 1, "a0"), rec(1, 1, 3, "a2")]);
    let text = only(&h.check(&log), Kind::Gap, &[1, r]);
    assert!(
        text.contains("skipped") && text.contains("\"a1\""),
        "{text}"
    );
}

#[test]
fn a_reader_starting_past_its_position_has_a_gap() {
    let (h, log) = clean();
    let r = h.read_invoked("r2", ReadFrom::Dlsn(d(0, 0)));
    h.read_done(r, vec![rec(1, 0, 2, "a1")]);
    only(&h.check(&log), Kind::Gap, &[0, r]);
}

#[test]
fn dlsns_going_backwards_in_the_final_log_are_reported() {
    let (h, mut log) = clean();
    log.swap(1, 2);
    let report = h.check(&log);
    let f = report.of(Kind::DlsnBackwards);
    assert_eq!(f.len(), 1, "{report}");
    assert!(f[0].to_string().contains("op 1 "), "{}", f[0]);
}

#[test]
fn txids_going_backwards_are_reported() {
    let h = History::new();
    let a = h.write_ok("w", recs(&[(5, "a0")]), d(0, 0), d(0, 0));
    let b = h.write_ok("w", recs(&[(4, "a1")]), d(1, 0), d(1, 0));
    let log = vec![rec(0, 0, 5, "a0"), rec(1, 0, 4, "a1")];
    only(&h.check(&log), Kind::TxidBackwards, &[a, b]);
}

#[test]
fn two_readers_seeing_different_records_at_one_dlsn_are_reported() {
    let (h, log) = clean();
    let w = h.write_invoked("w2", recs(&[(4, "b0")]), None);
    h.write_done(w, Outcome::Unknown("timeout".into()));
    let r1 = h.read_invoked("r1", ReadFrom::Dlsn(d(1, 0)));
    h.read_done(r1, vec![rec(1, 0, 2, "a1")]);
    let r2 = h.read_invoked("r2", ReadFrom::Dlsn(d(1, 0)));
    h.read_done(r2, vec![rec(1, 0, 4, "b0")]);
    let report = h.check(&log);
    let f = report.of(Kind::ReadersDisagree);
    assert_eq!(f.len(), 1, "{report}");
    // r read a1 at 1:1:0 first (op 3); r1 agrees with it, r2 does not.
    assert_eq!(f[0].ops, vec![3, r2]);
    assert!(f[0].to_string().contains(&format!("op {r2} ")), "{}", f[0]);
    let _ = r1;
    // r2's record is not in the final log either: also an aborted read.
    assert_eq!(report.of(Kind::AbortedRead).len(), 1, "{report}");
}

#[test]
fn a_record_before_a_truncation_read_after_it_returned_is_reported() {
    let (h, _) = clean();
    let t = h.truncate_invoked(d(1, 0));
    h.done(t);
    let r = h.read_invoked("r2", ReadFrom::Head);
    h.read_done(r, vec![rec(0, 0, 1, "a0"), rec(1, 0, 2, "a1")]);
    let log = vec![rec(1, 0, 2, "a1"), rec(1, 1, 3, "a2")];
    only(&h.check(&log), Kind::ReadPastTruncation, &[t, r]);
}

#[test]
fn truncated_and_deleted_records_are_not_lost() {
    // The same history with a truncation before 1:1:0 and a final log from there on is clean:
    // a0 and a1 are gone legitimately, and reads before the truncation saw them.
    let (h, _) = clean();
    let t = h.truncate_invoked(d(1, 1));
    h.done(t);
    h.check(&[rec(1, 1, 3, "a2")]).assert_clean();
    let del = h.delete_invoked();
    h.done(del);
    h.check(&[]).assert_clean();
}

#[test]
fn a_truncation_without_an_answer_may_have_been_applied() {
    // Goal: a truncation whose answer was lost (its proxy killed, a timeout) may have taken
    // effect, so the records before its point missing from the final log are not lost writes
    // (found by the chaos soak, seed 110774121609494: a proxy applied the truncation and was
    // killed before it answered); while the final log still holds a record before the point,
    // it was not applied, and a missing record is lost.
    // Method: the clean history plus a truncation before 1:1:1 that never completed; final log
    // from 1:1:1 on (clean), then a final log without 1:1:0 but with 1:0:0 (1:1:0 lost).
    let (h, _) = clean();
    h.truncate_invoked(d(1, 1));
    h.check(&[rec(1, 1, 3, "a2")]).assert_clean();
    let report = h.check(&[rec(0, 0, 1, "a0"), rec(1, 1, 3, "a2")]);
    assert!(
        report.findings.iter().any(|f| f.kind == Kind::LostWrite),
        "{report}"
    );
}

#[test]
fn a_write_acknowledged_after_a_seal_is_reported() {
    let (h, mut log) = clean();
    let s = h.seal_invoked();
    h.done(s);
    let w = h.write_ok("w", recs(&[(4, "b0")]), d(2, 0), d(2, 0));
    log.push(rec(2, 0, 4, "b0"));
    only(&h.check(&log), Kind::WriteAfterSeal, &[s, w]);
}

#[test]
fn a_record_id_function_identifies_padded_payloads() {
    let h = History::with_record_id(|p| p.split(|&b| b == b'.').next().unwrap_or(p).to_vec());
    h.write_ok("w", recs(&[(1, "a0....")]), d(0, 0), d(0, 0));
    let log = vec![rec(0, 0, 1, "a0...."), rec(1, 0, 1, "a0..")];
    only(&h.check(&log), Kind::Duplicate, &[0]);
}

#[test]
fn records_read_counts_each_readers_completed_reads_only() {
    let (h, _) = clean();
    assert_eq!(h.records_read("r"), 3);
    assert_eq!(h.records_read("w"), 0);
    assert_eq!(h.records_read("nobody"), 0);
    // A read in flight and a failed read return nothing yet.
    let pending = h.read_invoked("r", ReadFrom::Other);
    let failed = h.read_invoked("r", ReadFrom::Other);
    h.read_failed(failed);
    assert_eq!(h.records_read("r"), 3);
    h.read_done(pending, vec![rec(2, 0, 4, "a3")]);
    assert_eq!(h.records_read("r"), 4);
}

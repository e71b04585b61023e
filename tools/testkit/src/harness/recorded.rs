//! Client-side operations that record themselves in a [`History`] (the history checker,
//! [`crate::history`]): writers, a tailing reader, and the final read-back of a stream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quire_client::{Error, ErrorCode, ProxyClient, ReadPosition};

use super::checker::Acked;
use crate::history::{History, Outcome, ReadFrom, Record};

/// How a write error leaves the write, following the error's contract in quire_client: the
/// refusals that say "nothing of the request was written" (a redirect to the owner, an unknown
/// stream, the txid and size guards, a denied request) are [`Outcome::Failed`]; everything else
/// (a storage error, lost ownership, a broken connection, a timeout) is [`Outcome::Unknown`].
pub fn outcome_of_error(e: &Error) -> Outcome {
    let definite = match e {
        Error::OwnedElsewhere { .. }
        | Error::NoSuchStream { .. }
        | Error::InvalidStreamName { .. }
        | Error::RecordTooLarge { .. }
        | Error::ReservedTxid { .. }
        | Error::TxidOutOfOrder { .. }
        | Error::TxidTooFarAhead { .. }
        | Error::RequestDenied { .. } => true,
        Error::Remote { code, .. } => matches!(
            code,
            ErrorCode::StreamOwnedElsewhere
                | ErrorCode::NoSuchStream
                | ErrorCode::InvalidStreamName
                | ErrorCode::RecordTooLarge
                | ErrorCode::TxidOutOfOrder
                | ErrorCode::TxidTooFarAhead
                | ErrorCode::RequestDenied
        ),
        _ => false,
    };
    if definite {
        Outcome::Failed(e.to_string())
    } else {
        Outcome::Unknown(e.to_string())
    }
}

/// [`super::checker::write_records`] recorded in `history` under the writer name `prefix`:
/// the records `{prefix}-{i:08}` for `i` in `range`, one per request, up to 16 in flight, all
/// with txid 1; stops at the first failure after collecting the writes in flight. Returns what
/// was acknowledged and the first error.
pub async fn write_records(
    history: &Arc<History>,
    client: &Arc<ProxyClient>,
    stream: &str,
    prefix: &str,
    range: std::ops::Range<usize>,
) -> (Vec<Acked>, Option<Error>) {
    let mut acked = Vec::new();
    let mut in_flight = std::collections::VecDeque::new();
    let mut first_err = None;
    let mut iter = range;
    loop {
        while in_flight.len() < 16 && first_err.is_none() {
            let Some(i) = iter.next() else { break };
            let payload = format!("{prefix}-{i:08}").into_bytes();
            let op = history.write_invoked(prefix, vec![(1, payload.clone())], None);
            let (c, s, h) = (client.clone(), stream.to_string(), history.clone());
            let task = tokio::spawn(async move {
                let r = c.write(&s, vec![(1, payload.clone())], true).await;
                h.write_done(op, record_outcome(&r));
                r.map(|r| (r.first_dlsn, payload))
            });
            in_flight.push_back(task);
        }
        let Some(task) = in_flight.pop_front() else {
            return (acked, first_err);
        };
        match task.await.expect("write task") {
            Ok(a) => acked.push(a),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
}

fn record_outcome(r: &Result<quire_client::WriteResult, Error>) -> Outcome {
    match r {
        Ok(w) => Outcome::Ok {
            first: w.first_dlsn.into(),
            last: w.last_dlsn.into(),
        },
        Err(e) => outcome_of_error(e),
    }
}

fn records_of(batch: &quire_client::ReadBatch) -> Vec<Record> {
    batch
        .records
        .iter()
        .map(|(d, t, p)| Record::new((*d).into(), *t, p.clone()))
        .collect()
}

/// A tailing reader recorded in `history` as `name`: reads `stream` from its head with
/// long polls of 100 ms, each read continuing where the last one ended, until `stop` is set and
/// a read returns nothing. A failed read is recorded and retried from the same position (the
/// proxy or bookie it needs may be down for a while). Returns the records it read.
pub async fn tail(
    history: Arc<History>,
    client: Arc<ProxyClient>,
    stream: String,
    name: String,
    stop: Arc<AtomicBool>,
) -> usize {
    let mut from = ReadPosition::Head;
    let mut seen = 0;
    let mut first = true;
    loop {
        let at = if first {
            ReadFrom::Head
        } else {
            ReadFrom::Other
        };
        let op = history.read_invoked(&name, at);
        match client
            .read(&stream, from, 256, 1 << 20, Duration::from_millis(100))
            .await
        {
            Ok(batch) => {
                let records = records_of(&batch);
                history.read_done(op, records.clone());
                first = false;
                seen += records.len();
                from = batch.next;
                if records.is_empty() && stop.load(Ordering::Acquire) {
                    return seen;
                }
            }
            Err(_) => {
                history.read_failed(op);
                if stop.load(Ordering::Acquire) {
                    return seen;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The final log of `stream`: every record from its head to its end, read through `proxy`
/// (retrying for up to 60 s while the owner is unreachable), as the checker takes it.
pub async fn final_log(proxy: &str, stream: &str) -> Vec<Record> {
    super::checker::read_all_records(proxy, stream)
        .await
        .into_iter()
        .map(|(d, t, p)| Record::new(d.into(), t, p))
        .collect()
}

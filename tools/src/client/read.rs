//! `quire read` and `quire tail`: a stream's records to standard output in `line`, `json` or
//! `binary` format, from a start position, optionally at most `-c N` records and, with `-e`,
//! only up to the end the stream had when the command started.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result};
use quire_client::{Dlsn, ProxyClient, ReadPosition, SegmentState, StreamMetadata};

use super::format::{write_record, OutRecord};
use super::position::StartPosition;
use super::ReadOpts;

/// Records per read request.
const READ_BATCH_RECORDS_MAX: u32 = 4096;
/// Payload bytes per read request.
const READ_BATCH_SIZE_BYTES_MAX: u32 = 2 * 1024 * 1024;
/// How long one tail read waits for new records before asking again.
const TAIL_WAIT: Duration = Duration::from_secs(10);

/// The position just past the stream's last acknowledged record, from its metadata:
/// `SEQ:(last entry + 1):0` of the last segment holding entries, `1:0:0` for a stream without
/// any. `None` when a segment being written does not say how far it is acknowledged (the
/// answering proxy does not own the stream, or the segment has no entry yet).
pub fn end_of(meta: &StreamMetadata) -> Option<Dlsn> {
    let mut end = Dlsn::INITIAL;
    for s in &meta.segments {
        match (s.state, s.last_entry) {
            (_, Some(last)) => end = end.max(Dlsn::new(s.seq_no, last + 1, 0)),
            (SegmentState::InProgress, None) => return None,
            (SegmentState::Completed, None) => {}
        }
    }
    Some(end)
}

/// Prints records of `stream` from `start` as `opts` says; `follow` keeps waiting for new
/// records (`quire tail`) unless `-e` is given. Returns where the next read would start.
///
/// # Errors
/// A failed read (one line), an output error other than a closed pipe.
pub async fn run(
    client: &ProxyClient,
    stream: &str,
    opts: &ReadOpts,
    start: ReadPosition,
    follow: bool,
    mut after_batch: impl AsyncBatchHook,
) -> Result<()> {
    // -e: the end the stream has now; records written after that are not printed.
    let end = match opts.exit_at_end {
        true => describe_end(client, stream).await,
        false => None,
    };
    let follow = follow && !opts.exit_at_end;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    let mut from = start;
    let mut printed = 0u64;
    loop {
        let want = match opts.count {
            Some(c) => u32::try_from((c - printed).min(u64::from(READ_BATCH_RECORDS_MAX)))
                .expect("bounded"),
            None => READ_BATCH_RECORDS_MAX,
        };
        if want == 0 {
            break;
        }
        let wait = if follow { TAIL_WAIT } else { Duration::ZERO };
        let batch = client
            .read(stream, from, want, READ_BATCH_SIZE_BYTES_MAX, wait)
            .await
            .with_context(|| format!("read of stream {stream:?} failed"))?;
        let empty = batch.records.is_empty();
        let mut past_end = false;
        for (i, (dlsn, txid, payload)) in batch.records.iter().enumerate() {
            if end.is_some_and(|e| *dlsn >= e) {
                past_end = true;
                break;
            }
            let r = OutRecord {
                dlsn: *dlsn,
                txid: *txid,
                // 0: an entry written before record set version 3 carries no write time.
                write_time_ms: batch.write_times_ms.get(i).copied().filter(|t| *t != 0),
                payload,
            };
            if let Err(e) = write_record(&mut out, opts.format, &opts.delimiter.0, &r) {
                return broken_pipe_is_fine(e);
            }
            printed += 1;
            from = ReadPosition::Dlsn(next_after(*dlsn));
        }
        if !past_end {
            from = batch.next;
        }
        if !empty || follow {
            if let Err(e) = out.flush() {
                return broken_pipe_is_fine(e);
            }
            after_batch.done(from).await?;
        }
        if batch.end_of_stream && !past_end {
            // A sealed stream's last record was printed: a tail ends too (exit 0).
            eprintln!("quire: end of stream {stream} (sealed)");
            break;
        }
        let at_end = matches!((from, end), (ReadPosition::Dlsn(f), Some(e)) if f >= e);
        if past_end || at_end || (empty && !follow) {
            if printed == 0 {
                say_nothing_to_read(client, stream, start).await;
            }
            break;
        }
    }
    out.flush().or_else(broken_pipe_is_fine)
}

/// What to do once a batch is printed and flushed (commit a subscription), given the position
/// after it.
pub trait AsyncBatchHook {
    /// Called after each printed batch.
    fn done(&mut self, next: ReadPosition) -> impl std::future::Future<Output = Result<()>>;
}

/// No hook.
pub struct NoHook;

impl AsyncBatchHook for NoHook {
    async fn done(&mut self, _next: ReadPosition) -> Result<()> {
        Ok(())
    }
}

/// `--sub NAME`: commits the position after each printed batch to subscription NAME.
pub struct CommitHook<'a> {
    client: &'a ProxyClient,
    stream: &'a str,
    name: &'a str,
    last: Option<Dlsn>,
}

impl<'a> CommitHook<'a> {
    /// Commits to subscription `name` of `stream` through `client`.
    pub fn new(client: &'a ProxyClient, stream: &'a str, name: &'a str) -> Self {
        Self {
            client,
            stream,
            name,
            last: None,
        }
    }

    /// Where the subscription resumes: its committed position, or the head when it has none.
    ///
    /// # Errors
    /// The proxy's answer, in one line.
    pub async fn committed(&self) -> Result<ReadPosition> {
        let info = self
            .client
            .subscription(self.stream, self.name)
            .await
            .with_context(|| {
                format!(
                    "cannot read subscription {:?} of stream {:?}",
                    self.name, self.stream
                )
            })?;
        Ok(info
            .committed
            .map_or(ReadPosition::Head, ReadPosition::Dlsn))
    }
}

impl AsyncBatchHook for CommitHook<'_> {
    async fn done(&mut self, next: ReadPosition) -> Result<()> {
        let ReadPosition::Dlsn(d) = next else {
            return Ok(());
        };
        if self.last == Some(d) {
            return Ok(());
        }
        self.client
            .commit_subscription(self.stream, self.name, d)
            .await
            .with_context(|| {
                format!(
                    "cannot commit {d} for subscription {:?} of stream {:?}",
                    self.name, self.stream
                )
            })?;
        self.last = Some(d);
        Ok(())
    }
}

/// The position just after `d` in the same entry (a read from there continues at the next
/// record, in this entry or the next).
fn next_after(d: Dlsn) -> Dlsn {
    match d.slot_index.checked_add(1) {
        Some(slot) => Dlsn::new(d.segment_seq_no, d.entry_id, slot),
        None => Dlsn::new(d.segment_seq_no, d.entry_id + 1, 0),
    }
}

async fn describe_end(client: &ProxyClient, stream: &str) -> Option<Dlsn> {
    let info = client.describe_stream(stream).await.ok()?;
    end_of(&info.metadata)
}

/// A read that printed nothing says why on stderr (exit status stays 0, as kcat's).
async fn say_nothing_to_read(client: &ProxyClient, stream: &str, start: ReadPosition) {
    let end = describe_end(client, stream).await;
    match (start, end) {
        (_, Some(Dlsn::INITIAL)) => {
            eprintln!("quire: stream {stream} holds no records; nothing to read")
        }
        (ReadPosition::Dlsn(d), Some(e)) if d >= e => eprintln!(
            "quire: {d} is past the end of stream {stream} (its records end before {e}); nothing to read"
        ),
        _ => eprintln!("quire: no record of stream {stream} at or after {start}; nothing to read"),
    }
}

/// A reader that closed our stdout (e.g. `quire tail s | head`) ends the command quietly.
fn broken_pipe_is_fine(e: std::io::Error) -> Result<()> {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Ok(())
    } else {
        Err(e).context("cannot write to standard output")
    }
}

/// Parses and maps `-o/--from` to the protocol's position.
///
/// # Errors
/// A bad text, in one line.
pub fn start_position(text: &str) -> Result<ReadPosition> {
    let start = StartPosition::parse(text, quire_clock::unix_ms()).map_err(anyhow::Error::msg)?;
    Ok(start.to_read_position())
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_client::SegmentMetadata;

    fn seg(seq_no: u64, state: SegmentState, last_entry: Option<u64>) -> SegmentMetadata {
        SegmentMetadata {
            seq_no,
            ledger_id: seq_no,
            state,
            first_txid: None,
            last_txid: None,
            last_entry,
            record_count: 0,
            length_bytes: 0,
            completion_time_ms: None,
        }
    }

    #[test]
    fn end_of_stream_from_segments() {
        // Goal: the -e bound is just past the last acknowledged entry; unknown when the
        // segment being written does not say.
        use SegmentState::*;
        let mut m = StreamMetadata::default();
        assert_eq!(end_of(&m), Some(Dlsn::INITIAL));
        m.segments = vec![seg(1, Completed, Some(4)), seg(2, Completed, None)];
        assert_eq!(end_of(&m), Some(Dlsn::new(1, 5, 0)));
        m.segments.push(seg(3, InProgress, Some(0)));
        assert_eq!(end_of(&m), Some(Dlsn::new(3, 1, 0)));
        m.segments.push(seg(4, InProgress, None));
        assert_eq!(end_of(&m), None);
        assert_eq!(next_after(Dlsn::new(1, 2, u32::MAX)), Dlsn::new(1, 3, 0));
    }
}

//! `quire write`: records from a file or standard input, in `line`, `json` or `binary` format,
//! appended in batches; txids from the input (JSON `txid`), from `--txid-from N` counting up,
//! or from the clock (wall-clock ms, never decreasing: DistributedLog's `TimeSequencer`).

use std::io::BufRead;

use anyhow::{bail, Context, Result};
use quire_client::{Dlsn, ProxyClient, RECORD_SIZE_BYTES_MAX};

use super::format::{parse_json_record, read_delimited, read_frame, Format};
use super::WriteArgs;

/// Records per write request.
const WRITE_BATCH_RECORDS_MAX: usize = 4096;
/// Payload bytes per write request.
const WRITE_BATCH_SIZE_BYTES_MAX: usize = 2 * 1024 * 1024;

/// Reads records of one input format, counting them for error messages.
pub struct RecordReader<R> {
    input: R,
    format: Format,
    delimiter: Vec<u8>,
    /// Records (lines, frames) read so far, blank JSON lines included.
    pub number: u64,
}

impl<R: BufRead> RecordReader<R> {
    /// Reads `format` records from `input`; `delimiter` separates `line` records.
    pub fn new(input: R, format: Format, delimiter: Vec<u8>) -> Self {
        Self {
            input,
            format,
            delimiter,
            number: 0,
        }
    }

    /// The word for one unit of input in messages: `line` or `frame`.
    pub fn unit(&self) -> &'static str {
        match self.format {
            Format::Binary => "frame",
            Format::Line | Format::Json => "line",
        }
    }

    /// The next record: `(txid given in the input, payload)`; `Ok(None)` at the end.
    ///
    /// # Errors
    /// A one-line reason naming the line or frame: bad JSON, a truncated or oversized frame,
    /// an input error.
    pub fn next_record(&mut self) -> Result<Option<(Option<u64>, Vec<u8>)>> {
        loop {
            let n = self.number + 1;
            let unit = self.unit();
            let item = match self.format {
                Format::Binary => read_frame(&mut self.input, RECORD_SIZE_BYTES_MAX)
                    .with_context(|| format!("{unit} {n} of the input"))?,
                Format::Line => {
                    read_delimited(&mut self.input, &self.delimiter).context("cannot read input")?
                }
                Format::Json => {
                    read_delimited(&mut self.input, b"\n").context("cannot read input")?
                }
            };
            let Some(bytes) = item else { return Ok(None) };
            self.number = n;
            if self.format != Format::Json {
                return Ok(Some((None, bytes)));
            }
            if bytes.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let record = parse_json_record(&bytes)
                .map_err(|why| anyhow::anyhow!("{unit} {n} of the input: {why}"))?;
            return Ok(Some(record));
        }
    }
}

/// Gives each record its txid: the input's, else `--txid-from` counting up, else the clock;
/// never below the previous record's (the proxy refuses decreasing txids).
#[derive(Debug, Clone, Default)]
pub struct Txids {
    /// The next txid `--txid-from` gives, if set.
    pub next_from: Option<u64>,
    /// The previous record's txid.
    pub last: Option<u64>,
}

impl Txids {
    /// The txid of the next record, `given` by the input or not.
    ///
    /// # Errors
    /// A txid below the previous one, or the reserved txid 2^64-1.
    pub fn assign(&mut self, given: Option<u64>, now_ms: u64) -> Result<u64, String> {
        let floor = self.last.unwrap_or(0);
        let txid = match given {
            Some(t) if t < floor => {
                return Err(format!(
                    "txid {t} is below the previous record's txid {floor} (txids never decrease)"
                ))
            }
            Some(t) => t,
            None => match self.next_from {
                Some(n) => n.max(floor),
                None => now_ms.max(floor),
            },
        };
        if txid == quire_client::protocol::TXID_RESERVED {
            return Err(format!("txid {txid} is reserved"));
        }
        if given.is_none() {
            if let Some(n) = &mut self.next_from {
                *n = txid + 1;
            }
        }
        self.last = Some(txid);
        Ok(txid)
    }
}

/// What a `quire write` did so far.
#[derive(Debug, Default)]
struct Progress {
    records: u64,
    first: Option<(Dlsn, u64)>,
    last: Option<(Dlsn, u64)>,
}

/// Runs `quire write` against a connected client.
pub async fn run(client: &ProxyClient, args: &WriteArgs, input: Box<dyn BufRead>) -> Result<()> {
    let mut reader = RecordReader::new(input, args.format, args.delimiter.0.clone());
    let mut txids = Txids {
        next_from: args.txid_from,
        last: None,
    };
    let mut batch: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut batch_bytes = 0;
    let mut progress = Progress::default();
    loop {
        let record = read_one(&mut reader, &progress)?;
        let end = record.is_none();
        if let Some((given, payload)) = record {
            let txid = txids.assign(given, quire_clock::unix_ms()).map_err(|why| {
                anyhow::anyhow!(
                    "{} {}: {why}; {}",
                    reader.unit(),
                    reader.number,
                    written(&progress, reader.unit())
                )
            })?;
            batch_bytes += payload.len();
            batch.push((txid, payload));
        }
        let full =
            batch.len() >= WRITE_BATCH_RECORDS_MAX || batch_bytes >= WRITE_BATCH_SIZE_BYTES_MAX;
        if (end || full) && !batch.is_empty() {
            send(client, args, std::mem::take(&mut batch), &mut progress).await?;
            batch_bytes = 0;
        }
        if end {
            break;
        }
    }
    if progress.records == 0 {
        // Empty input still creates the stream, as the command promises.
        match client.create_stream(&args.stream).await {
            Ok(()) => {}
            Err(e) if e.code() == quire_proxy::ErrorCode::StreamExists => {}
            Err(e) => {
                return Err(e).with_context(|| format!("cannot create stream {:?}", args.stream))
            }
        }
    }
    print_result(args, &progress)
}

/// Reads one record, refusing one above the record limit before the batch before it is sent,
/// so that what was written is exactly the batches already sent.
fn read_one<R: BufRead>(
    reader: &mut RecordReader<R>,
    progress: &Progress,
) -> Result<Option<(Option<u64>, Vec<u8>)>> {
    let record = reader
        .next_record()
        .map_err(|e| e.context(written(progress, reader.unit())))?;
    if let Some((_, payload)) = &record {
        if payload.len() > RECORD_SIZE_BYTES_MAX {
            bail!(
                "{} {} is {} bytes, above the record limit of {RECORD_SIZE_BYTES_MAX} bytes; {}",
                reader.unit(),
                reader.number,
                payload.len(),
                written(progress, reader.unit())
            );
        }
    }
    Ok(record)
}

fn written(progress: &Progress, unit: &str) -> String {
    match progress.records {
        0 => "nothing was written".to_string(),
        n => format!("{unit}s 1 to {n} were written, nothing after them"),
    }
}

async fn send(
    client: &ProxyClient,
    args: &WriteArgs,
    batch: Vec<(u64, Vec<u8>)>,
    progress: &mut Progress,
) -> Result<()> {
    let count = batch.len() as u64;
    let (first_txid, last_txid) = (batch[0].0, batch[batch.len() - 1].0);
    let total = progress.records;
    let result = client
        .write(&args.stream, batch, true)
        .await
        .with_context(|| {
            format!(
                "write to stream {:?} failed after {total} records were acknowledged; the {count} records \
                 of the failed batch (records {} to {}) may or may not have been stored, check with `quire read` before resuming",
                args.stream,
                total + 1,
                total + count
            )
        })?;
    progress.records += count;
    progress
        .first
        .get_or_insert((result.first_dlsn, first_txid));
    progress.last = Some((result.last_dlsn, last_txid));
    Ok(())
}

fn print_result(args: &WriteArgs, p: &Progress) -> Result<()> {
    if args.json {
        let v = serde_json::json!({
            "stream": args.stream,
            "records": p.records,
            "first_dlsn": p.first.map(|f| f.0.to_string()),
            "last_dlsn": p.last.map(|l| l.0.to_string()),
            "first_txid": p.first.map(|f| f.1),
            "last_txid": p.last.map(|l| l.1),
        });
        println!("{v}");
        return Ok(());
    }
    let s = if p.records == 1 { "" } else { "s" };
    match (p.first, p.last) {
        (Some((first, _)), Some((last, _))) => println!(
            "wrote {} record{s} to {}: first {first}, last {last}",
            p.records, args.stream
        ),
        _ => println!("wrote 0 records to {} (the stream exists)", args.stream),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn txids_from_input_counter_and_clock() {
        // Goal: --txid-from counts up, input txids win and move the floor, the clock never
        // goes back, and a decreasing or reserved txid is refused.
        let mut t = Txids {
            next_from: Some(100),
            last: None,
        };
        assert_eq!(t.assign(None, 5), Ok(100));
        assert_eq!(t.assign(None, 5), Ok(101));
        assert_eq!(t.assign(Some(500), 5), Ok(500));
        assert_eq!(t.assign(None, 5), Ok(500));
        assert_eq!(t.assign(None, 5), Ok(501));
        assert!(t
            .assign(Some(7), 5)
            .unwrap_err()
            .contains("below the previous"));
        let mut c = Txids::default();
        assert_eq!(c.assign(None, 1000), Ok(1000));
        assert_eq!(c.assign(None, 900), Ok(1000));
        assert_eq!(c.assign(Some(2000), 900), Ok(2000));
        assert_eq!(c.assign(None, 1500), Ok(2000));
        assert!(c
            .assign(Some(u64::MAX), 0)
            .unwrap_err()
            .contains("reserved"));
    }

    #[test]
    fn reader_numbers_records_and_skips_blank_json_lines() {
        // Goal: JSON input skips blank lines but counts them, and a bad line names its number.
        let input = &b"{\"payload\":\"a\",\"txid\":3}\n\n{\"payload\":\"b\"}\nnot json\n"[..];
        let mut r = RecordReader::new(input, Format::Json, b"\n".to_vec());
        assert_eq!(r.next_record().unwrap(), Some((Some(3), b"a".to_vec())));
        assert_eq!(r.next_record().unwrap(), Some((None, b"b".to_vec())));
        let e = r.next_record().unwrap_err().to_string();
        assert!(e.starts_with("line 4 of the input: not JSON"), "{e}");
    }
}

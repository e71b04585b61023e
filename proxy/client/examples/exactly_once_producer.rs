//! An exactly-once producer (issue 26 item 4): each line of stdin becomes one record of a
//! producer session, written once even when the stream's owner dies and the write is retried
//! through another proxy.
//!
//! ```text
//! seq 1 1000 | cargo run --release -p quire-client --example exactly_once_producer -- \
//!     --proxies 127.0.0.1:4181[,HOST:PORT...] --stream logs/app [--batch 100]
//! ```
//!
//! Against `quire sandbox` (its proxy listens on 127.0.0.1:4181). Each record's txid is its
//! line number (from 1). Prints `first_dlsn last_dlsn count` per write; a write whose outcome
//! stays unknown after the producer's retries (60 s) ends the program with exit code 3.

use std::io::BufRead;
use std::sync::Arc;

use quire_client::{ClientConfig, Error, Producer, ProducerConfig, ProxyClient};

struct Args {
    proxies: Vec<String>,
    stream: String,
    batch: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        proxies: vec!["127.0.0.1:4181".into()],
        stream: String::new(),
        batch: 100,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--proxies" => args.proxies = value()?.split(',').map(str::to_string).collect(),
            "--stream" => args.stream = value()?,
            "--batch" => args.batch = value()?.parse().map_err(|e| format!("--batch: {e}"))?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.stream.is_empty() || args.batch == 0 {
        return Err("--stream is required and --batch must be at least 1".into());
    }
    Ok(args)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("exactly_once_producer: {e}");
            std::process::exit(2);
        }
    };
    let config = ClientConfig {
        proxies: args.proxies.clone(),
        ..ClientConfig::default()
    };
    let run = async {
        let client = Arc::new(ProxyClient::connect_any(config).await?);
        let mut producer = Producer::open(client, &args.stream, ProducerConfig::default()).await?;
        let mut batch = Vec::with_capacity(args.batch);
        let mut txid = 0u64;
        let mut lines = std::io::stdin().lock().lines();
        loop {
            let line = lines.next().transpose().map_err(|e| Error::Io {
                op: "read stdin",
                source: e,
            })?;
            if let Some(line) = &line {
                txid += 1;
                batch.push((txid, line.clone().into_bytes()));
            }
            if batch.len() == args.batch || (line.is_none() && !batch.is_empty()) {
                let w = producer.write(std::mem::take(&mut batch)).await?;
                println!("{} {} {}", w.first_dlsn, w.last_dlsn, w.count);
            }
            if line.is_none() {
                return Ok::<_, Error>(producer.retries());
            }
        }
    };
    match run.await {
        Ok(retries) => eprintln!("done ({retries} writes retried)"),
        Err(e @ Error::WriteOutcomeUnknown { .. }) => {
            eprintln!("exactly_once_producer: {e}");
            std::process::exit(3);
        }
        Err(e) => {
            eprintln!("exactly_once_producer: {e}");
            std::process::exit(1);
        }
    }
}

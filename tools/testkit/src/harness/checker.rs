//! The one checker shared by the cluster tests: given the records acknowledged to writers, it
//! reads the stream back through a proxy and checks DistributedLog's and BookKeeper's promises:
//!
//! 1. every acknowledged record appears exactly once, at the DLSN it was acknowledged with,
//!    in acknowledgement-DLSN order;
//! 2. DLSNs only grow along the stream;
//! 3. every replica of every entry is byte-identical: each entry of each segment's ledger is
//!    read over the bookie wire protocol from every bookie of its write set in the fragment
//!    that holds it (ledger metadata from the metadata store). Closed ledgers must have every
//!    entry up to their last entry on every reachable bookie of its write set; entries of a
//!    ledger still open must be on at least Qa bookies where they hold an acknowledged record.
//!    [`Replicas::AckQuorum`] relaxes the closed-ledger rule to what BookKeeper promises after
//!    recovery alone (at least Qa of the write set), for runs where a bookie was unreachable
//!    and came back (see [`Replicas`]).

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use quire_client::{Dlsn, ProxyClient, ReadPosition};
use quire_metadata::{BookieId, LedgerState, MetadataStore};
use quire_wire::bookie::{decode_response, Request, Response, Status};
use quire_wire::{EntryId, LedgerId};

/// A record acknowledged to a writer: its DLSN and payload.
pub type Acked = (Dlsn, Vec<u8>);

/// What the checker saw, for further assertions by the test.
#[derive(Debug)]
pub struct Report {
    /// Every record read back, in order.
    pub records: Vec<(Dlsn, Vec<u8>)>,
    /// Entries whose replicas were compared, and replicas read.
    pub entries_checked: usize,
    pub replicas_read: usize,
    /// Entries of closed ledgers found on fewer than their whole write set (but on at least
    /// Qa of it), as "ledger L entry E missing on [bookies]": only [`Replicas::AckQuorum`]
    /// lets a check pass with any.
    pub under_replicated: Vec<String>,
}

/// What check 3 demands of a closed ledger's entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replicas {
    /// Every entry on every reachable bookie of its write set: holds when no bookie of a
    /// ledger's ensemble missed adds and came back (or autorecovery has repaired it).
    WholeWriteSet,
    /// Every entry on at least Qa bookies of its write set; the rest are reported in
    /// [`Report::under_replicated`]. This is BookKeeper's promise after recovery: an entry is
    /// acknowledged once Qa bookies of its write set hold it, and the LAC a bookie carries
    /// only covers such entries. A writer replaces a failed bookie from LAC + 1 on
    /// (`LedgerHandle` ensemble change), so entries at or below the LAC that the failed bookie
    /// missed stay on Qa bookies in the old fragment; `LedgerRecoveryOp` reads and rewrites
    /// only from LAC + 1. Copying the missing replicas is autorecovery's work (the auditor's
    /// `LedgerChecker`), not recovery's.
    AckQuorum,
}

/// Runs every check; panics with a description of the first violation.
///
/// `down` lists bookies known to be dead: their replicas are not read. Closed ledgers must
/// hold every entry on their whole write set ([`Replicas::WholeWriteSet`]).
pub async fn check_stream(
    proxy: &str,
    store: &dyn MetadataStore,
    stream: &str,
    acked: &[Acked],
    down: &[BookieId],
) -> Report {
    check_stream_with(proxy, store, stream, acked, down, Replicas::WholeWriteSet).await
}

/// [`check_stream`] with the closed-ledger rule of check 3 given by `replicas`.
pub async fn check_stream_with(
    proxy: &str,
    store: &dyn MetadataStore,
    stream: &str,
    acked: &[Acked],
    down: &[BookieId],
    replicas: Replicas,
) -> Report {
    let records = read_all(proxy, stream).await;
    check_records(&records, acked);
    let mut under_replicated = Vec::new();
    let (entries_checked, replicas_read) =
        check_replicas(store, stream, acked, down, replicas, &mut under_replicated).await;
    Report {
        records,
        entries_checked,
        replicas_read,
        under_replicated,
    }
}

/// Checks 1 and 2 on what a reader got: DLSNs grow, and each acknowledged record is there once,
/// at the DLSN it was acknowledged with.
fn check_records(records: &[(Dlsn, Vec<u8>)], acked: &[Acked]) {
    // 2. DLSNs only grow.
    for w in records.windows(2) {
        assert!(
            w[0].0 < w[1].0,
            "DLSNs must grow: {} then {}",
            w[0].0,
            w[1].0
        );
    }
    // 1. Each acknowledged record exactly once, where it was acknowledged, in order.
    let by_dlsn: HashMap<Dlsn, &[u8]> = records.iter().map(|(d, p)| (*d, p.as_slice())).collect();
    let mut acked_sorted: Vec<&Acked> = acked.iter().collect();
    acked_sorted.sort_by_key(|a| a.0);
    for w in acked_sorted.windows(2) {
        assert!(
            w[0].0 != w[1].0,
            "two acknowledgements share DLSN {}",
            w[0].0
        );
    }
    let mut payload_count: HashMap<&[u8], usize> = HashMap::new();
    for (_, p) in records {
        *payload_count.entry(p.as_slice()).or_default() += 1;
    }
    for (dlsn, payload) in &acked_sorted {
        match by_dlsn.get(dlsn) {
            Some(p) => assert!(
                p == payload,
                "record at {dlsn} differs from what was acknowledged there"
            ),
            None => panic!(
                "acknowledged record at {dlsn} is missing ({} records read)",
                records.len()
            ),
        }
        assert_eq!(
            payload_count[payload.as_slice()],
            1,
            "acknowledged record at {dlsn} appears more than once"
        );
    }
}

/// Check 3: every replica of each entry up to the last acknowledged (or the closed ledger's
/// last) is present where the ledger must hold it (`replicas`) and byte-identical; returns the
/// entries checked and the replicas read, and adds closed-ledger entries short of their whole
/// write set to `under`.
async fn check_replicas(
    store: &dyn MetadataStore,
    stream: &str,
    acked: &[Acked],
    down: &[BookieId],
    replicas: Replicas,
    under: &mut Vec<String>,
) -> (usize, usize) {
    let meta = store
        .read_stream(stream)
        .await
        .expect("read stream metadata")
        .value;
    let mut entries_checked = 0;
    let mut replicas_read = 0;
    let mut reader = ReplicaReader::default();
    let acked_entries: BTreeSet<(u64, u64)> = acked
        .iter()
        .map(|(d, _)| (d.segment_seq_no, d.entry_id))
        .collect();
    for seg in &meta.segments {
        let ledger = store
            .read_ledger(LedgerId(seg.ledger_id))
            .await
            .expect("read ledger metadata")
            .value;
        let (closed, last) = match ledger.state {
            LedgerState::Closed => (true, ledger.last_entry),
            _ => (
                false,
                acked_entries
                    .range((seg.seq_no, 0)..=(seg.seq_no, u64::MAX))
                    .map(|e| e.1)
                    .next_back(),
            ),
        };
        let Some(last) = last else { continue };
        for entry in 0..=last {
            let closed = closed.then_some((replicas, &mut *under));
            let checked = check_entry(
                &mut reader,
                seg,
                &ledger,
                entry,
                closed,
                &acked_entries,
                down,
            );
            replicas_read += checked;
            entries_checked += 1;
        }
    }
    (entries_checked, replicas_read)
}

/// The replicas of one entry: present and identical; returns how many were read. `closed`:
/// the ledger is closed, with the rule its entries are held to and where to list entries
/// short of their write set.
fn check_entry(
    reader: &mut ReplicaReader,
    seg: &quire_metadata::SegmentMetadata,
    ledger: &quire_metadata::LedgerMetadata,
    entry: u64,
    closed: Option<(Replicas, &mut Vec<String>)>,
    acked_entries: &BTreeSet<(u64, u64)>,
    down: &[BookieId],
) -> usize {
    let fragment = ledger.fragment_for(EntryId(entry));
    let mut copies: Vec<(String, Vec<u8>)> = Vec::new();
    let mut missing = Vec::new();
    for pos in quire_ledger::quorum::write_set(entry, ledger.ensemble_size, ledger.write_quorum) {
        let bookie = &fragment.bookies[pos];
        if down.contains(bookie) {
            continue;
        }
        match reader.read(&bookie.0, seg.ledger_id, entry) {
            Ok(Some(bytes)) => copies.push((bookie.0.clone(), bytes)),
            Ok(None) => missing.push(bookie.0.clone()),
            Err(e) => panic!(
                "bookie {bookie} (not listed as down) cannot serve ledger {} entry {entry}: {e}",
                seg.ledger_id
            ),
        }
    }
    if let Some((replicas, under)) = closed {
        let at_least_qa = copies.len() + down.len() >= usize::from(ledger.ack_quorum);
        assert!(
            missing.is_empty() || (replicas == Replicas::AckQuorum && at_least_qa),
            "closed ledger {} (segment {}) entry {entry} is missing on {missing:?} ({} replicas, Qa {})",
            seg.ledger_id,
            seg.seq_no,
            copies.len(),
            ledger.ack_quorum
        );
        if !missing.is_empty() {
            under.push(format!(
                "ledger {} entry {entry} missing on {missing:?}",
                seg.ledger_id
            ));
        }
    } else if acked_entries.contains(&(seg.seq_no, entry)) {
        assert!(
            copies.len() + down.len() >= usize::from(ledger.ack_quorum),
            "open ledger {} entry {entry} holds acknowledged records but only {} replicas",
            seg.ledger_id,
            copies.len()
        );
    }
    for (bookie, bytes) in &copies[1.min(copies.len())..] {
        assert!(
            *bytes == copies[0].1,
            "ledger {} entry {entry}: replica on {bookie} differs from the one on {}",
            seg.ledger_id,
            copies[0].0
        );
    }
    copies.len()
}

/// Reads a whole stream with `client`, from its head to its current end: each record as
/// (DLSN, txid, payload), in order. A failed read (a redirect to a dead owner whose lease has
/// not expired yet, a proxy restarting) is retried every 200 ms for up to `retry_for`.
///
/// # Errors
/// The last read error, once `retry_for` has passed.
pub async fn read_stream(
    client: &ProxyClient,
    stream: &str,
    retry_for: Duration,
) -> Result<Vec<(Dlsn, u64, Vec<u8>)>, quire_client::Error> {
    let deadline = tokio::time::Instant::now() + retry_for;
    let mut from = ReadPosition::Head;
    let mut out = Vec::new();
    loop {
        match client
            .read(stream, from, 4096, 2 << 20, Duration::ZERO)
            .await
        {
            Ok(b) if b.records.is_empty() => return Ok(out),
            Ok(b) => {
                out.extend(b.records);
                from = b.next;
            }
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Reads a whole stream through `proxy` ([`read_stream`], retrying for up to 60 s): each
/// record as (DLSN, txid, payload).
///
/// # Panics
/// When the proxy cannot be reached or the stream cannot be read to its end in 60 s.
pub async fn read_all_records(proxy: &str, stream: &str) -> Vec<(Dlsn, u64, Vec<u8>)> {
    let client = connect_proxy(proxy)
        .await
        .expect("connect to proxy for read-back");
    read_stream(&client, stream, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("read back of {stream} through {proxy} failed: {e}"))
}

/// [`read_all_records`] as (DLSN, payload) pairs.
pub async fn read_all(proxy: &str, stream: &str) -> Vec<(Dlsn, Vec<u8>)> {
    let records = read_all_records(proxy, stream).await;
    records.into_iter().map(|(d, _, p)| (d, p)).collect()
}

/// TLS to bookies from `QUIRE_BOOKIE_TLS_CA_FILE` (and `_CERT_FILE`, `_KEY_FILE`), the
/// variables `quire ledger` and `quire autorecovery` read: set by ansible/ci/deploy-test.sh
/// for its TLS cluster; unset, plain TCP.
pub fn bookie_tls_from_env() -> Option<std::sync::Arc<quire_tls::rustls::ClientConfig>> {
    tls_from_env("QUIRE_BOOKIE_TLS")
}

/// TLS to proxies from `QUIRE_TLS_CA_FILE` (and `_CERT_FILE`, `_KEY_FILE`), the variables of
/// `quire write` and `read`; unset, plain TCP.
pub fn proxy_tls_from_env() -> Option<std::sync::Arc<quire_tls::rustls::ClientConfig>> {
    tls_from_env("QUIRE_TLS")
}

fn tls_from_env(prefix: &str) -> Option<std::sync::Arc<quire_tls::rustls::ClientConfig>> {
    let var = |name: &str| std::env::var_os(format!("{prefix}_{name}")).map(Into::into);
    let tls = quire_tls::ClientTls {
        ca_file: var("CA_FILE")?,
        cert_file: var("CERT_FILE"),
        key_file: var("KEY_FILE"),
    };
    Some(
        tls.client_config()
            .expect("TLS settings from the environment"),
    )
}

/// Connects to a proxy, with TLS when `QUIRE_TLS_CA_FILE` is set and presenting the token in
/// `QUIRE_TOKEN` when set (the variables of `quire write` and `read`; ansible/ci/deploy-test.sh
/// sets them for its cluster, which requires both).
pub async fn connect_proxy(addr: &str) -> Result<ProxyClient, quire_client::Error> {
    let config = quire_client::ClientConfig {
        tls: proxy_tls_from_env(),
        tls_server_name: Some(addr.to_string()),
        token: std::env::var_os("QUIRE_TOKEN")
            .map(|t| quire_client::protocol::Token(t.into_encoded_bytes())),
        ..quire_client::ClientConfig::default()
    };
    ProxyClient::connect_with(addr, config).await
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// Reads one entry from one bookie over the bookie wire protocol: `Ok(None)` when the bookie
/// says it has no such entry or ledger. With TLS when `QUIRE_BOOKIE_TLS_CA_FILE` is set.
/// Opens a connection for this one read; [`ReplicaReader`] keeps one per bookie.
pub fn read_entry(bookie: &str, ledger: u64, entry: u64) -> Result<Option<Vec<u8>>, String> {
    read_on(&mut connect_bookie(bookie)?, ledger, entry)
}

type BookieConn = quire_wire::blocking::BookieConnection<Box<dyn ReadWrite>>;

/// A handshaken connection to `bookie` with the test cluster's secret (and TLS from the
/// environment, as [`read_entry`]).
fn connect_bookie(bookie: &str) -> Result<BookieConn, String> {
    let tcp = TcpStream::connect(bookie).map_err(|e| format!("connect: {e}"))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let conn: Box<dyn ReadWrite> = match bookie_tls_from_env() {
        None => Box::new(tcp),
        Some(config) => {
            let name = quire_tls::server_name(bookie).map_err(|e| e.to_string())?;
            let session = quire_tls::rustls::ClientConnection::new(config, name)
                .map_err(|e| format!("TLS: {e}"))?;
            Box::new(quire_tls::rustls::StreamOwned::new(session, tcp))
        }
    };
    quire_wire::blocking::BookieConnection::connect(conn, Some(super::test_cluster_secret()))
        .map_err(|e| e.to_string())
}

fn read_on(conn: &mut BookieConn, ledger: u64, entry: u64) -> Result<Option<Vec<u8>>, String> {
    let reply = conn
        .call(&Request::Read {
            ledger: LedgerId(ledger),
            entry: Some(EntryId(entry)),
            fence: None,
        })
        .map_err(|e| e.to_string())?;
    let frame = reply.frame();
    match decode_response(&frame).map_err(|e| e.to_string())? {
        Response::Read { data, .. } => Ok(Some(data.to_vec())),
        Response::Failed {
            status: Status::NoSuchEntry | Status::NoSuchLedger,
            ..
        } => Ok(None),
        other => Err(format!("unexpected read answer {other:?}")),
    }
}

/// Reads entries from bookies over one connection per bookie, kept between reads: a check of
/// thousands of replicas would otherwise spend most of its time on a TCP connect, a handshake
/// and a secret exchange per entry. A connection that fails is dropped and the read tried once
/// on a new one, so a restarted bookie is read again.
#[derive(Default)]
pub struct ReplicaReader {
    conns: HashMap<String, BookieConn>,
}

impl ReplicaReader {
    /// As [`read_entry`], on this reader's connection to `bookie`.
    pub fn read(
        &mut self,
        bookie: &str,
        ledger: u64,
        entry: u64,
    ) -> Result<Option<Vec<u8>>, String> {
        if let Some(conn) = self.conns.get_mut(bookie) {
            if let Ok(answer) = read_on(conn, ledger, entry) {
                return Ok(answer);
            }
            self.conns.remove(bookie);
        }
        let mut conn = connect_bookie(bookie)?;
        let answer = read_on(&mut conn, ledger, entry)?;
        self.conns.insert(bookie.to_string(), conn);
        Ok(answer)
    }
}

/// Writes the records `{prefix}-{i}` for `i` in `range` to `stream`, one record per request
/// with up to 16 requests in flight, and returns what was acknowledged. At the first failed
/// write it stops sending, collects the answers of the writes in flight, and returns the error
/// with the acknowledgements. Every record has txid 1 (txids may repeat; in-flight requests
/// may reach the proxy in any order).
pub async fn write_records(
    client: &std::sync::Arc<ProxyClient>,
    stream: &str,
    prefix: &str,
    range: std::ops::Range<usize>,
) -> (Vec<Acked>, Option<quire_client::Error>) {
    write_padded_records(client, stream, prefix, range, 0).await
}

/// [`write_records`] with `pad` bytes of `.` after each record's name, for records of a given
/// size.
pub async fn write_padded_records(
    client: &std::sync::Arc<ProxyClient>,
    stream: &str,
    prefix: &str,
    range: std::ops::Range<usize>,
    pad: usize,
) -> (Vec<Acked>, Option<quire_client::Error>) {
    let mut acked = Vec::new();
    let mut in_flight = std::collections::VecDeque::new();
    let mut iter = range;
    loop {
        while in_flight.len() < 16 {
            let Some(i) = iter.next() else { break };
            let payload = format!("{prefix}-{i:08}{}", ".".repeat(pad)).into_bytes();
            let (c, s, p) = (client.clone(), stream.to_string(), payload.clone());
            in_flight.push_back((
                payload,
                tokio::spawn(async move { c.write(&s, vec![(1, p)], true).await }),
            ));
        }
        let Some((payload, task)) = in_flight.pop_front() else {
            return (acked, None);
        };
        match task.await.expect("write task") {
            Ok(r) => acked.push((r.first_dlsn, payload)),
            Err(e) => {
                for (p, t) in in_flight {
                    if let Ok(Ok(r)) = t.await {
                        acked.push((r.first_dlsn, p));
                    }
                }
                return (acked, Some(e));
            }
        }
    }
}

/// `(ledger, entry, bookie)` for every entry of every ledger's fragments with a known end
/// ([`quire_ledger::fragment_range`]) that a bookie of its write set does not hold (or cannot
/// be asked for: the error is counted as missing, with the bookie named).
pub async fn entries_missing(store: &quire_metadata::ZkStore) -> Vec<(u64, u64, String)> {
    use quire_metadata::MetadataStore;
    let mut missing = Vec::new();
    let mut reader = ReplicaReader::default();
    for id in store.list_ledgers().await.expect("list ledgers") {
        let Ok(meta) = store.read_ledger(id).await else {
            continue;
        };
        let meta = meta.value;
        for (i, f) in meta.fragments.iter().enumerate() {
            let Ok(Some((first, last))) = quire_ledger::fragment_range(&meta, i) else {
                continue;
            };
            for entry in first..=last {
                for pos in
                    quire_ledger::quorum::write_set(entry, meta.ensemble_size, meta.write_quorum)
                {
                    let b = &f.bookies[pos].0;
                    if !matches!(reader.read(b, id.0, entry), Ok(Some(_))) {
                        missing.push((id.0, entry, b.clone()));
                    }
                }
            }
        }
    }
    missing
}

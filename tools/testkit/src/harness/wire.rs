//! A minimal synchronous client of the bookie wire protocol (`docs/protocol.md`) for tests
//! that talk to one bookie directly: one handshaken connection, one request at a time. It
//! plays a legitimate client: the handshake proves the cluster secret (version 2).

use std::net::TcpStream;
use std::time::Duration;

use quire_wire::auth::ClusterSecret;
use quire_wire::blocking::{AnswerFrame, BookieConnection};
use quire_wire::bookie::{Request, Response, Status};
use quire_wire::entry::{encode_entry, EntryHeader};
use quire_wire::{EntryId, LedgerId, MasterKey};

/// The master key of every ledger these tests write.
pub const KEY: MasterKey = MasterKey([7; 20]);

/// What a bookie answered, reduced to what the test checks.
#[derive(Debug, PartialEq)]
pub enum Answer {
    Ok,
    Data(Vec<u8>),
    Failed(Status),
}

impl Answer {
    fn of(frame: &AnswerFrame) -> Answer {
        match frame.response().expect("response") {
            Response::Read { data, .. } => Answer::Data(data.to_vec()),
            Response::Failed { status, .. } => Answer::Failed(status),
            _ => Answer::Ok,
        }
    }
}

/// One handshaken bookie wire connection (quire_wire's blocking client).
pub struct Wire {
    conn: BookieConnection<TcpStream>,
}

impl Wire {
    /// Connects and authenticates with the test clusters' secret
    /// ([`super::test_cluster_secret`]).
    pub fn connect(addr: &str) -> Wire {
        Self::connect_with(addr, super::test_cluster_secret())
    }

    /// Connects and authenticates with `secret` (a sandbox's, say).
    pub fn connect_with(addr: &str, secret: &ClusterSecret) -> Wire {
        let conn = TcpStream::connect(addr).expect("connect to the bookie");
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let conn = BookieConnection::connect(conn, Some(secret)).expect("handshake");
        Wire { conn }
    }

    pub fn call(&mut self, req: &Request<'_>) -> Answer {
        Answer::of(&self.conn.call(req).expect("bookie answer"))
    }

    /// Sends every request of `reqs` at once (one write, request ids in order), then reads
    /// their answers, returned in request order (the bookie may answer in any order).
    #[allow(dead_code)] // not every test binary that includes this module uses it
    pub fn call_pipelined(&mut self, reqs: &[Request<'_>]) -> Vec<Answer> {
        let first = self.conn.send_all(reqs).expect("send");
        let mut answers: Vec<Option<Answer>> = (0..reqs.len()).map(|_| None).collect();
        for _ in 0..reqs.len() {
            let frame = self
                .conn
                .recv()
                .expect("receive")
                .expect("bookie closed the connection");
            let slot = (frame.request_id() - first) as usize;
            assert!(
                answers[slot].replace(Answer::of(&frame)).is_none(),
                "answered twice"
            );
        }
        answers.into_iter().map(|a| a.expect("answered")).collect()
    }

    pub fn add(&mut self, ledger: u64, entry: u64, recovery: bool) -> Answer {
        let data = entry_bytes(ledger, entry);
        self.call(&Request::Add {
            recovery,
            master_key: KEY,
            entry: &data,
        })
    }

    pub fn read(&mut self, ledger: u64, entry: u64) -> Answer {
        self.call(&Request::Read {
            ledger: LedgerId(ledger),
            entry: Some(EntryId(entry)),
            fence: None,
        })
    }
}

pub fn entry_bytes(ledger: u64, entry: u64) -> Vec<u8> {
    let payload = format!("ledger {ledger} entry {entry} ")
        .repeat(100)
        .into_bytes();
    entry_with_payload(ledger, entry, &payload)
}

/// Entry `entry` of `ledger` holding `payload`, with LAC `entry - 1` and the length field
/// `payload.len() × (entry + 1)` (as if every entry had this size).
#[allow(dead_code)] // not every test binary that includes this module uses it
pub fn entry_with_payload(ledger: u64, entry: u64, payload: &[u8]) -> Vec<u8> {
    encode_entry(
        EntryHeader {
            ledger: LedgerId(ledger),
            entry: EntryId(entry),
            lac: entry.checked_sub(1).map(EntryId),
            length_bytes: payload.len() as u64 * (entry + 1),
        },
        payload,
    )
}

/// Creates the metadata of ledger `ledger` (E = Qw = Qa = `bookies.len()`, open, master key
/// [`KEY`]) in `store`, so that bookies that bind keys only for ledgers the metadata store
/// holds (docs/protocol.md §Add, "When a key binds") accept [`Wire::add`] to it.
#[allow(dead_code)] // not every test binary that includes this module uses it
pub async fn create_ledger_metadata(
    store: &dyn quire_metadata::MetadataStore,
    ledger: u64,
    bookies: &[String],
) {
    let n = bookies.len() as u8;
    let meta = quire_metadata::LedgerMetadata {
        format_version: quire_metadata::LEDGER_METADATA_FORMAT_VERSION,
        ensemble_size: n,
        write_quorum: n,
        ack_quorum: n,
        state: quire_metadata::LedgerState::Open,
        fragments: vec![quire_metadata::Fragment {
            first_entry: 0,
            bookies: bookies
                .iter()
                .map(|b| quire_metadata::BookieId(b.clone()))
                .collect(),
        }],
        last_entry: None,
        length_bytes: 0,
        digest_type: quire_metadata::DigestType::Crc32c,
        master_key_hex: quire_metadata::master_key_hex(&KEY),
        creation_time_ms: 0,
        custom: Default::default(),
    };
    store
        .create_ledger(LedgerId(ledger), &meta)
        .await
        .expect("create ledger metadata");
}

//! A minimal synchronous client of the bookie wire protocol (`docs/protocol.md`) for tests
//! that talk to one bookie directly: one handshaken connection, one request at a time. It
//! plays a legitimate client: the handshake proves the cluster secret (version 2).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use quire_wire::auth::ClusterSecret;
use quire_wire::bookie::{decode_response, encode_request, Request, Response, Status};
use quire_wire::entry::{encode_entry, EntryHeader};
use quire_wire::frame::{decode_frame, FRAME_SIZE_BYTES_MAX_DEFAULT};
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

/// One handshaken bookie wire connection.
pub struct Wire {
    conn: TcpStream,
    buf: Vec<u8>,
    next_id: u64,
}

/// Passes the version-2 handshake on `conn` (Hello, then Auth with `secret`) and checks the
/// bookie's proof; `buf` keeps bytes received past the answers.
pub fn authenticate<S: Read + Write + ?Sized>(
    conn: &mut S,
    buf: &mut Vec<u8>,
    secret: &ClusterSecret,
) -> Result<(), String> {
    let mut call = |req: &Request<'_>, id: u64| -> Result<Response<'static>, String> {
        let mut out = Vec::new();
        encode_request(&mut out, id, req);
        conn.write_all(&out).map_err(|e| format!("send: {e}"))?;
        conn.flush().map_err(|e| format!("send: {e}"))?;
        loop {
            if let Some((frame, used)) =
                decode_frame(buf, FRAME_SIZE_BYTES_MAX_DEFAULT).map_err(|e| e.to_string())?
            {
                let r = match decode_response(&frame).map_err(|e| e.to_string())? {
                    Response::Hello { auth_nonce, .. } => Response::Hello {
                        version: 2,
                        shard_count: 0,
                        frame_size_bytes_max: 0,
                        auth_nonce,
                    },
                    Response::Auth { proof } => Response::Auth { proof },
                    other => return Err(format!("handshake answered with {other:?}")),
                };
                buf.drain(..used);
                return Ok(r);
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = conn.read(&mut chunk).map_err(|e| format!("receive: {e}"))?;
            if n == 0 {
                return Err("bookie closed the connection during the handshake".into());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    let Response::Hello {
        auth_nonce: Some(server_nonce),
        ..
    } = call(
        &Request::Hello {
            version_min: 2,
            version_max: 2,
        },
        u64::MAX - 1,
    )?
    else {
        return Err("Hello answer without a nonce".into());
    };
    let client_nonce = quire_wire::auth::new_nonce().map_err(|e| e.to_string())?;
    let Response::Auth { proof } = call(
        &Request::Auth {
            client_nonce,
            proof: secret.client_proof(&server_nonce, &client_nonce),
        },
        u64::MAX,
    )?
    else {
        return Err("no Auth answer".into());
    };
    if !secret.verify_bookie_proof(&server_nonce, &client_nonce, &proof) {
        return Err("the bookie's proof of the cluster secret does not match".into());
    }
    Ok(())
}

impl Wire {
    /// Connects and authenticates with the test clusters' secret
    /// ([`super::test_cluster_secret`]).
    pub fn connect(addr: &str) -> Wire {
        Self::connect_with(addr, super::test_cluster_secret())
    }

    /// Connects and authenticates with `secret` (a sandbox's, say).
    pub fn connect_with(addr: &str, secret: &ClusterSecret) -> Wire {
        let mut conn = TcpStream::connect(addr).expect("connect to the bookie");
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut buf = Vec::new();
        authenticate(&mut conn, &mut buf, secret).expect("handshake");
        Wire {
            conn,
            buf,
            next_id: 1,
        }
    }

    pub fn call(&mut self, req: &Request<'_>) -> Answer {
        let mut out = Vec::new();
        encode_request(&mut out, self.next_id, req);
        self.next_id += 1;
        self.conn.write_all(&out).expect("send");
        loop {
            if let Some((frame, used)) =
                decode_frame(&self.buf, FRAME_SIZE_BYTES_MAX_DEFAULT).expect("frame")
            {
                let answer = match decode_response(&frame).expect("response") {
                    Response::Read { data, .. } => Answer::Data(data.to_vec()),
                    Response::Failed { status, .. } => Answer::Failed(status),
                    _ => Answer::Ok,
                };
                self.buf.drain(..used);
                return answer;
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = self.conn.read(&mut chunk).expect("receive");
            assert!(n > 0, "bookie closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Sends every request of `reqs` at once (one write, request ids in order), then reads
    /// their answers, returned in request order (the bookie may answer in any order).
    #[allow(dead_code)] // not every test binary that includes this module uses it
    pub fn call_pipelined(&mut self, reqs: &[Request<'_>]) -> Vec<Answer> {
        let mut out = Vec::new();
        let first = self.next_id;
        for r in reqs {
            encode_request(&mut out, self.next_id, r);
            self.next_id += 1;
        }
        self.conn.write_all(&out).expect("send");
        let mut answers: Vec<Option<Answer>> = (0..reqs.len()).map(|_| None).collect();
        let mut left = reqs.len();
        while left > 0 {
            if let Some((frame, used)) =
                decode_frame(&self.buf, FRAME_SIZE_BYTES_MAX_DEFAULT).expect("frame")
            {
                let slot = (frame.header.request_id - first) as usize;
                let answer = match decode_response(&frame).expect("response") {
                    Response::Read { data, .. } => Answer::Data(data.to_vec()),
                    Response::Failed { status, .. } => Answer::Failed(status),
                    _ => Answer::Ok,
                };
                self.buf.drain(..used);
                assert!(answers[slot].replace(answer).is_none(), "answered twice");
                left -= 1;
                continue;
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = self.conn.read(&mut chunk).expect("receive");
            assert!(n > 0, "bookie closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
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

//! Shared helpers for the bookie integration tests: a real bookie on 127.0.0.1 with its
//! directories under /tmp, and a blocking std::net client speaking the wire protocol through
//! quire_wire.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use quire_bookie::{Bookie, BookieConfig};
use quire_wire::blocking::BookieConnection;
use quire_wire::bookie::{
    decode_long_poll_response, decode_response, LongPollReply, Opcode, Request, Response, Status,
};
use quire_wire::entry::{encode_entry, EntryHeader};
use quire_wire::frame::{FrameHeader, RESPONSE_BIT};
use quire_wire::{EntryId, LedgerId, MasterKey};

pub const KEY: MasterKey = MasterKey([7; 20]);
pub const OTHER_KEY: MasterKey = MasterKey([8; 20]);

/// A fresh directory under /tmp (ext4 here, so O_DIRECT works; /dev/shm would not).
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("quire-bookie-test-")
        .tempdir_in("/tmp")
        .expect("tempdir")
}

/// A test configuration: any free port, small journal files, `shards` shards, and a disk usage
/// threshold of 100 %: `dir` is on the host's disk, whose usage other work decides, so only a
/// really full disk may turn these bookies read-only.
pub fn config(dir: &Path, shards: usize) -> BookieConfig {
    let mut c = BookieConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        dir.join("journal"),
        dir.join("ledgers"),
    );
    c.shards = shards;
    c.engine.journal_file_size_bytes = 1 << 20;
    c.disk_usage_threshold = 1.0;
    c.disk_usage_lwm_threshold = 0.99;
    c
}

pub fn start(dir: &Path, shards: usize) -> Bookie {
    Bookie::start(config(dir, shards)).expect("bookie starts")
}

/// A response with owned bytes, so tests can keep it after the receive buffer moves on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    Hello {
        version: u16,
        shard_count: u16,
        frame_size_bytes_max: u32,
    },
    /// A version-2 Hello answer: the bookie's nonce for `Auth`.
    HelloV2 {
        version: u16,
        nonce: [u8; 32],
    },
    Auth {
        proof: [u8; 32],
    },
    Add {
        ledger: u64,
        entry: u64,
    },
    Read {
        ledger: u64,
        entry: u64,
        data: Vec<u8>,
    },
    ReadLac {
        ledger: u64,
        lac: Option<u64>,
        last_entry: Option<u64>,
    },
    Fence {
        ledger: u64,
        lac: Option<u64>,
    },
    LongPoll {
        ledger: u64,
        lac: Option<u64>,
        fenced: bool,
        next_entry: Option<(u64, Vec<u8>)>,
    },
    Info(quire_wire::bookie::BookieInfo),
    Failed {
        opcode: Opcode,
        status: Status,
        message: String,
    },
}

impl Resp {
    pub fn status(&self) -> Status {
        match self {
            Resp::Failed { status, .. } => *status,
            _ => Status::Ok,
        }
    }
}

fn own(r: Response<'_>) -> Resp {
    match r {
        Response::Hello {
            version,
            auth_nonce: Some(nonce),
            ..
        } => Resp::HelloV2 { version, nonce },
        Response::Hello {
            version,
            shard_count,
            frame_size_bytes_max,
            auth_nonce: None,
        } => Resp::Hello {
            version,
            shard_count,
            frame_size_bytes_max,
        },
        Response::Auth { proof } => Resp::Auth { proof },
        Response::Add { ledger, entry } => Resp::Add {
            ledger: ledger.0,
            entry: entry.0,
        },
        Response::Read {
            ledger,
            entry,
            data,
        } => Resp::Read {
            ledger: ledger.0,
            entry: entry.0,
            data: data.to_vec(),
        },
        Response::ReadLac {
            ledger,
            lac,
            last_entry,
        } => Resp::ReadLac {
            ledger: ledger.0,
            lac: lac.map(|e| e.0),
            last_entry: last_entry.map(|e| e.0),
        },
        Response::Fence { ledger, lac } => Resp::Fence {
            ledger: ledger.0,
            lac: lac.map(|e| e.0),
        },
        Response::Failed {
            opcode,
            status,
            message,
        } => Resp::Failed {
            opcode,
            status,
            message: message.to_string(),
        },
    }
}

/// A blocking client on one connection.
/// A blocking client on one connection (quire_wire's `BookieConnection`, answers decoded into
/// [`Resp`]).
pub struct Client {
    conn: BookieConnection<TcpStream>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            conn: BookieConnection::new(stream),
        }
    }

    /// The socket, to send raw bytes or change its options.
    pub fn stream(&mut self) -> &mut TcpStream {
        self.conn.stream_mut()
    }

    /// Connects and completes the handshake; returns the client and the Hello response.
    pub fn handshake(addr: SocketAddr) -> (Client, Resp) {
        let mut c = Client::connect(addr);
        let hello = c.call(&Request::Hello {
            version_min: 1,
            version_max: 1,
        });
        assert!(matches!(hello, Resp::Hello { version: 1, .. }), "{hello:?}");
        (c, hello)
    }

    /// Connects and passes the version-2 handshake with `secret` (Hello, then Auth), checking
    /// the bookie's proof.
    pub fn handshake_with_secret(
        addr: SocketAddr,
        secret: &quire_wire::auth::ClusterSecret,
    ) -> Client {
        let mut c = Client::connect(addr);
        let hello = c.call(&Request::Hello {
            version_min: 2,
            version_max: 2,
        });
        let Resp::HelloV2 { version: 2, nonce } = hello else {
            panic!("expected a version-2 Hello answer, got {hello:?}");
        };
        let client_nonce = quire_wire::auth::new_nonce().unwrap();
        let auth = c.call(&Request::Auth {
            client_nonce,
            proof: secret.client_proof(&nonce, &client_nonce),
        });
        let Resp::Auth { proof } = auth else {
            panic!("expected an Auth answer, got {auth:?}");
        };
        assert!(secret.verify_bookie_proof(&nonce, &client_nonce, &proof));
        c
    }

    /// Sends a request with a fresh request id and returns that id.
    pub fn send(&mut self, request: &Request<'_>) -> u64 {
        self.conn.send(request).expect("send")
    }

    /// Receives the next response frame: its header and the decoded response. `None` when
    /// the bookie closed the connection (EOF or reset).
    pub fn recv(&mut self) -> Option<(FrameHeader, Resp)> {
        let answer = self.conn.recv().expect("valid frame from bookie")?;
        let frame = answer.frame();
        let header = frame.header;
        let resp = if header.opcode == Opcode::ReadLacLongPoll as u8 | RESPONSE_BIT {
            match decode_long_poll_response(&frame).expect("valid long-poll response from bookie") {
                LongPollReply::Ok(r) => Resp::LongPoll {
                    ledger: r.ledger.0,
                    lac: r.lac.map(|e| e.0),
                    fenced: r.fenced,
                    next_entry: r.next_entry.map(|(e, d)| (e.0, d.to_vec())),
                },
                LongPollReply::Failed { status, message } => Resp::Failed {
                    opcode: Opcode::ReadLacLongPoll,
                    status,
                    message: message.to_string(),
                },
            }
        } else if header.opcode == Opcode::GetBookieInfo as u8 | RESPONSE_BIT {
            match quire_wire::bookie::decode_bookie_info_response(&frame)
                .expect("valid bookie info response from bookie")
            {
                quire_wire::bookie::BookieInfoReply::Ok(info) => Resp::Info(info),
                quire_wire::bookie::BookieInfoReply::Failed { status, message } => Resp::Failed {
                    opcode: Opcode::GetBookieInfo,
                    status,
                    message: message.to_string(),
                },
            }
        } else {
            own(decode_response(&frame).expect("valid response from bookie"))
        };
        Some((header, resp))
    }

    /// Sends one request and waits for its response (no other request in flight).
    pub fn call(&mut self, request: &Request<'_>) -> Resp {
        let id = self.send(request);
        let (header, resp) = self.recv().expect("response before close");
        assert_eq!(header.request_id, id, "response answers the request sent");
        resp
    }

    pub fn add(&mut self, key: MasterKey, entry: &[u8], recovery: bool) -> Resp {
        self.call(&Request::Add {
            recovery,
            master_key: key,
            entry,
        })
    }

    pub fn read(&mut self, ledger: u64, entry: Option<u64>) -> Resp {
        self.call(&Request::Read {
            ledger: LedgerId(ledger),
            entry: entry.map(EntryId),
            fence: None,
        })
    }

    pub fn read_lac(&mut self, ledger: u64) -> Resp {
        self.call(&Request::ReadLac {
            ledger: LedgerId(ledger),
        })
    }

    pub fn fence(&mut self, ledger: u64, key: MasterKey) -> Resp {
        self.call(&Request::Fence {
            ledger: LedgerId(ledger),
            master_key: key,
        })
    }
}

/// Entry `entry` of `ledger` with the writer's LAC `entry - 1` and a payload naming both.
pub fn entry(ledger: u64, entry: u64) -> Vec<u8> {
    let payload = format!("ledger {ledger} entry {entry}");
    let header = EntryHeader {
        ledger: LedgerId(ledger),
        entry: EntryId(entry),
        lac: entry.checked_sub(1).map(EntryId),
        length_bytes: entry.wrapping_add(1).wrapping_mul(payload.len() as u64),
    };
    encode_entry(header, payload.as_bytes())
}

//! Goal (issue 24 item 2): with `BookieConfig::ledger_keys` set, a key binds only for a ledger
//! the metadata side says exists with that key (docs/protocol.md §Add, "When a key binds"):
//! an unknown ledger's add is `Unauthorized` and its fence `NoSuchLedger`, with nothing stored;
//! another key is `Unauthorized`; no answer is `TooManyRequests` and is not remembered; the
//! pipelined first adds of a ledger share one question, and a ledger with a bound key (or a
//! cached answer) is not asked about again.
//! Method: a real bookie with two shards (so some requests cross shards), and a metadata side
//! played by a thread that answers each question after 200 ms from a table, counting them.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{entry, Client, Resp, KEY, OTHER_KEY};
use quire_bookie::{ledger_keys_channel, Bookie, LedgerKeyAnswer};
use quire_wire::bookie::{Request, Status};
use quire_wire::{EntryId, LedgerId};

/// What the played metadata side answers per ledger (`None`: drop the question unanswered),
/// and how many questions it got per ledger.
#[derive(Default)]
struct Side {
    answers: HashMap<u64, Option<LedgerKeyAnswer>>,
    asked: HashMap<u64, usize>,
}

fn start_with_side(dir: &std::path::Path, side: Arc<Mutex<Side>>) -> Bookie {
    let (keys, queries) = ledger_keys_channel();
    std::thread::spawn(move || {
        while let Some(q) = futures_lite::future::block_on(queries.next()) {
            let side = side.clone();
            std::thread::spawn(move || {
                // Late, so that requests arriving together find the question in flight.
                std::thread::sleep(Duration::from_millis(200));
                let mut s = side.lock().unwrap();
                *s.asked.entry(q.ledger).or_default() += 1;
                match s.answers.get(&q.ledger).cloned() {
                    Some(Some(a)) => q.answer(a),
                    Some(None) => drop(q),
                    None => q.answer(LedgerKeyAnswer::NoSuchLedger),
                }
            });
        }
    });
    let mut config = common::config(dir, 2);
    config.ledger_keys = Some(keys);
    Bookie::start(config).expect("bookie starts")
}

fn status(r: &Resp) -> Status {
    r.status()
}

#[test]
fn keys_bind_only_for_ledgers_the_metadata_side_has_with_that_key() {
    let dir = common::tempdir();
    let side = Arc::new(Mutex::new(Side::default()));
    {
        let mut s = side.lock().unwrap();
        let exists = |k: quire_wire::MasterKey| Some(LedgerKeyAnswer::Exists { master_key: k.0 });
        s.answers.insert(100, exists(KEY));
        s.answers.insert(102, exists(OTHER_KEY));
        s.answers.insert(
            103,
            Some(LedgerKeyAnswer::Unavailable("store unreachable".into())),
        );
        s.answers.insert(104, exists(KEY));
        s.answers.insert(105, None);
    }
    let bookie = start_with_side(dir.path(), side.clone());
    let (mut c, _) = Client::handshake(bookie.addr());

    // Pipelined first adds of a known ledger: one question, every add stored.
    let ids: Vec<u64> = (0..8)
        .map(|e| {
            let data = entry(100, e);
            c.send(&Request::Add {
                recovery: false,
                master_key: KEY,
                entry: &data,
            })
        })
        .collect();
    let mut answered = HashMap::new();
    for _ in 0..8 {
        let (h, r) = c.recv().expect("response");
        answered.insert(h.request_id, r);
    }
    for (e, id) in ids.iter().enumerate() {
        assert_eq!(
            answered[id],
            Resp::Add {
                ledger: 100,
                entry: e as u64
            }
        );
    }
    assert_eq!(
        side.lock().unwrap().asked.get(&100),
        Some(&1),
        "one question"
    );
    // Bound now: no more questions, and another key is refused by the engine itself.
    assert_eq!(
        c.add(KEY, &entry(100, 8), false),
        Resp::Add {
            ledger: 100,
            entry: 8
        }
    );
    assert_eq!(
        status(&c.add(OTHER_KEY, &entry(100, 9), true)),
        Status::Unauthorized
    );
    assert_eq!(
        side.lock().unwrap().asked.get(&100),
        Some(&1),
        "no question once bound"
    );

    // Unknown ledger: nothing binds, nothing is stored.
    assert_eq!(
        status(&c.add(KEY, &entry(101, 0), false)),
        Status::Unauthorized
    );
    assert_eq!(
        status(&c.add(KEY, &entry(101, 0), true)),
        Status::Unauthorized
    );
    assert_eq!(status(&c.fence(101, KEY)), Status::NoSuchLedger);
    let fencing_read = c.call(&Request::Read {
        ledger: LedgerId(101),
        entry: Some(EntryId(0)),
        fence: Some(KEY),
    });
    assert_eq!(status(&fencing_read), Status::NoSuchLedger);
    assert_eq!(status(&c.read(101, Some(0))), Status::NoSuchLedger);
    assert_eq!(status(&c.read_lac(101)), Status::NoSuchLedger);

    // Known ledger, another key.
    assert_eq!(
        status(&c.add(KEY, &entry(102, 0), false)),
        Status::Unauthorized
    );
    assert_eq!(status(&c.fence(102, KEY)), Status::Unauthorized);
    assert_eq!(status(&c.read_lac(102)), Status::NoSuchLedger);

    // No answer: retryable, not remembered; once the store answers, the add goes through.
    assert_eq!(
        status(&c.add(KEY, &entry(103, 0), false)),
        Status::TooManyRequests
    );
    assert_eq!(status(&c.fence(103, KEY)), Status::TooManyRequests);
    assert_eq!(status(&c.read_lac(103)), Status::NoSuchLedger);
    side.lock()
        .unwrap()
        .answers
        .insert(103, Some(LedgerKeyAnswer::Exists { master_key: KEY.0 }));
    assert_eq!(
        c.add(KEY, &entry(103, 0), false),
        Resp::Add {
            ledger: 103,
            entry: 0
        }
    );
    // A question dropped unanswered is retryable too.
    assert_eq!(
        status(&c.add(KEY, &entry(105, 0), false)),
        Status::TooManyRequests
    );

    // Fences bind nothing, so the positive answer is what saves the second question.
    assert_eq!(
        c.fence(104, KEY),
        Resp::Fence {
            ledger: 104,
            lac: None
        }
    );
    assert_eq!(
        c.fence(104, KEY),
        Resp::Fence {
            ledger: 104,
            lac: None
        }
    );
    assert_eq!(
        side.lock().unwrap().asked.get(&104),
        Some(&1),
        "cached answer"
    );
    assert_eq!(status(&c.add(KEY, &entry(104, 0), false)), Status::Fenced);

    drop(c);
    bookie.shutdown().expect("clean shutdown");
}

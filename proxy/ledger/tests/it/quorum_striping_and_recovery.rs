//! Goal: the ledger client follows BookKeeper's quorum rules against real bookies: with E=3,
//! Qw=2, Qa=2 entry e is stored on ensemble positions e mod 3 and (e + 1) mod 3 and nowhere
//! else; acks (and the LAC) come back in entry order; a closed ledger reads back; recovery
//! fences the old writer and closes the ledger at the last entry a quorum holds; two recoveries
//! at once agree.
//! Method: three real bookie servers (one shard each) on 127.0.0.1 with O_DIRECT journals in a
//! temporary directory; the embedded metadata store; each bookie is then asked directly, over
//! the wire protocol, which entries it holds.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use quire_bookie::Bookie;
use quire_ledger::{BookKeeper, ClientConfig, Error, LedgerOptions};
use quire_metadata::{EmbeddedStore, LedgerState, MetadataStore};
use quire_testkit::bookies::start_registered_bookies;
use quire_wire::bookie::{decode_response, encode_request, Request, Response, Status};
use quire_wire::frame::decode_frame;
use quire_wire::{EntryId, LedgerId};

struct Cluster {
    _dir: tempfile::TempDir,
    bookies: Vec<Bookie>,
    store: Arc<dyn MetadataStore>,
}

async fn cluster() -> Cluster {
    let dir = tempfile::Builder::new()
        .prefix("quire-ledger-")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let store = EmbeddedStore::open(&dir.path().join("meta")).unwrap();
    let bookies = start_registered_bookies(dir.path(), 3, &store).await;
    Cluster {
        _dir: dir,
        bookies,
        store: Arc::new(store),
    }
}

/// Asks one bookie directly whether it holds `entry` of `ledger`.
fn bookie_has(addr: &str, ledger: LedgerId, entry: u64) -> bool {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut buf = Vec::new();
    encode_request(
        &mut buf,
        1,
        &Request::Hello {
            version_min: 1,
            version_max: 1,
        },
    );
    encode_request(
        &mut buf,
        2,
        &Request::Read {
            ledger,
            entry: Some(EntryId(entry)),
            fence: None,
        },
    );
    s.write_all(&buf).unwrap();
    let mut got = Vec::new();
    let mut answers = Vec::new();
    while answers.len() < 2 {
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "bookie closed the connection");
        got.extend_from_slice(&chunk[..n]);
        while let Some((frame, used)) = decode_frame(&got, 1 << 24).unwrap() {
            answers.push(match decode_response(&frame).unwrap() {
                Response::Read { .. } => Ok(()),
                Response::Failed { status, .. } => Err(status),
                _ => Err(Status::Ok),
            });
            got.drain(..used);
        }
    }
    match answers[1] {
        Ok(()) => true,
        Err(Status::NoSuchEntry | Status::NoSuchLedger) => false,
        Err(other) => panic!("bookie {addr} answered {other:?}"),
    }
}

fn options(e: u8, w: u8, a: u8) -> LedgerOptions {
    LedgerOptions {
        ensemble_size: e,
        write_quorum: w,
        ack_quorum: a,
        password: b"pw".to_vec(),
        custom: BTreeMap::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn striping_e3_qw2_qa2_and_in_order_acks() {
    let c = cluster().await;
    let bk = BookKeeper::new(c.store.clone(), ClientConfig::default());
    let writer = bk.create_ledger(options(3, 2, 2)).await.unwrap();
    // Pipeline 60 adds before awaiting any; record the order in which futures resolve.
    let futures: Vec<_> = (0..60u32)
        .map(|i| writer.add(format!("entry {i}").into_bytes()))
        .collect();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for f in futures {
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let id = f.await.unwrap();
            order.lock().unwrap().push(id.0);
            id
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap(), EntryId(i as u64));
    }
    assert_eq!(writer.lac(), Some(EntryId(59)));
    let meta = writer.close().await.unwrap();
    assert_eq!(meta.state, LedgerState::Closed);
    assert_eq!(meta.last_entry, Some(59));

    // Striping: entry e lives exactly on positions e mod 3 and (e + 1) mod 3.
    let ensemble = &meta.fragments[0].bookies;
    for e in 0..60u64 {
        for (pos, b) in ensemble.iter().enumerate() {
            let expected = pos as u64 == e % 3 || pos as u64 == (e + 1) % 3;
            assert_eq!(
                bookie_has(&b.0, writer.id(), e),
                expected,
                "entry {e} on position {pos}"
            );
        }
    }
    let reader = bk.open_ledger(writer.id()).await.unwrap();
    for e in 0..60u64 {
        assert_eq!(
            reader.read(EntryId(e)).await.unwrap(),
            format!("entry {e}").into_bytes()
        );
    }
    assert!(matches!(
        reader.read(EntryId(60)).await,
        Err(Error::NoSuchEntry { .. })
    ));
    drop(c.bookies);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_fences_the_writer_and_concurrent_recoveries_agree() {
    let c = cluster().await;
    let bk = BookKeeper::new(c.store.clone(), ClientConfig::default());
    let writer = bk.create_ledger(options(3, 3, 2)).await.unwrap();
    for i in 0..25u32 {
        writer.add(vec![i as u8; 100]).await.unwrap();
    }
    // Two recoverers at once, on separate clients (separate connections).
    let bk2 = BookKeeper::new(c.store.clone(), ClientConfig::default());
    let (a, b) = tokio::join!(
        bk.recover_ledger(writer.id()),
        bk2.recover_ledger(writer.id())
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.last_entry, Some(24));
    assert_eq!(a.last_entry, b.last_entry);
    assert_eq!(a.length_bytes, 2500);
    assert_eq!(a.state, LedgerState::Closed);
    // The old writer is fenced: its next add fails and says so.
    let err = writer.add(vec![1]).await.unwrap_err();
    assert!(matches!(err, Error::Fenced { .. }), "{err}");
    drop(c.bookies);
}

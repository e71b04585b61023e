//! Goal: the stream lifecycle operations keep exactly the records they promise (issue 9, parts
//! 1 and 4): truncation makes everything before the point unreadable at once, deletes the whole
//! segments before it with their ledger metadata, never moves backwards and refuses a point
//! beyond the end; deleting a stream while it is written removes it and every segment's ledger
//! metadata and frees the name; retention by size and by age deletes the oldest completed
//! segments only, without holes; time rolling rolls only segments that hold a record; and a
//! proxy whose view of the stream is stale (another writer changed the record) deletes nothing;
//! describing a size-retained stream while it rolls always shows the segment being written
//! with its counts (issue 23, item 5).
//! Method: three real bookies in-process, the embedded store, a proxy server on 127.0.0.1 and
//! `ProxyClient` over TCP; every check reads the records back and compares them with the
//! acknowledged ones by DLSN.

use crate::common;

use std::time::{Duration, Instant};

use quire_client::{Dlsn, ProxyClient, ReadPosition, RetentionChange, RetentionOverride};
use quire_metadata::{MetadataStore, SegmentState};
use quire_proxy::{Error, ErrorCode, StreamConfig};
use quire_wire::LedgerId;

type Rec = (Dlsn, u64, Vec<u8>);

async fn read_from(
    client: &ProxyClient,
    stream: &str,
    from: ReadPosition,
) -> Result<Vec<Rec>, Error> {
    let mut out = Vec::new();
    let mut pos = from;
    loop {
        let b = client
            .read(stream, pos, 500, 1 << 20, Duration::ZERO)
            .await?;
        if b.records.is_empty() {
            return Ok(out);
        }
        out.extend(b.records);
        pos = b.next;
    }
}

/// Writes records `first..first+n` one request of 10 each; returns them with their DLSNs.
async fn write(client: &ProxyClient, stream: &str, first: u64, n: u64) -> Vec<Rec> {
    let mut out = Vec::new();
    let mut t = first;
    while t < first + n {
        let k = 10.min(first + n - t);
        let recs: Vec<(u64, Vec<u8>)> = (t..t + k).map(|i| (i, common::payload(i))).collect();
        let w = client.write(stream, recs.clone(), true).await.unwrap();
        assert_eq!(w.count, k);
        // DLSNs within one write are consecutive slots of its entries; recover each record's
        // DLSN by reading the write's range back.
        let got = client
            .read(
                stream,
                ReadPosition::Dlsn(w.first_dlsn),
                k as u32,
                1 << 20,
                Duration::ZERO,
            )
            .await
            .unwrap();
        assert_eq!(got.records.len() as u64, k);
        assert_eq!(got.records.last().unwrap().0, w.last_dlsn);
        out.extend(got.records);
        t += k;
    }
    out
}

async fn ledger_exists(store: &dyn MetadataStore, id: u64) -> bool {
    match store.read_ledger(LedgerId(id)).await {
        Ok(_) => true,
        Err(quire_metadata::Error::NotFound { .. }) => false,
        Err(e) => panic!("read ledger {id}: {e}"),
    }
}

fn code(e: &Error) -> ErrorCode {
    e.code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_hides_earlier_records_deletes_whole_segments_and_never_moves_back() {
    let c = common::cluster_with_gc().await;
    let p = common::proxy(&c, common::small_config()).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    let all = write(&client, "t", 1, 700).await;
    let before = c.store.read_stream("t").await.unwrap().value;
    assert!(
        before.segments.len() >= 4,
        "{} segments",
        before.segments.len()
    );

    // A point in the middle of a later segment.
    let k = 450;
    let point = all[k].0;
    let whole: Vec<_> = before
        .segments
        .iter()
        .filter(|s| s.seq_no < point.segment_seq_no)
        .map(|s| s.ledger_id)
        .collect();
    assert!(!whole.is_empty());
    let before_truncate = common::settled_entry_log_bytes(&c).await;
    let r = client.truncate("t", point).await.unwrap();
    assert_eq!(r.truncated_before, point);
    assert_eq!(r.segments_deleted as usize, whole.len());

    // From the head: exactly the records from the point on.
    let got = read_from(&client, "t", ReadPosition::Head).await.unwrap();
    assert!(got == all[k..], "head read after truncation");
    // From the point itself: the same.
    assert!(
        read_from(&client, "t", ReadPosition::Dlsn(point))
            .await
            .unwrap()
            == all[k..]
    );
    // From any earlier DLSN, in a deleted segment or in the kept one: TRUNCATED.
    for d in [all[0].0, all[k - 1].0, Dlsn::new(0, 0, 0)] {
        let e = read_from(&client, "t", ReadPosition::Dlsn(d))
            .await
            .unwrap_err();
        assert_eq!(code(&e), ErrorCode::Truncated, "{e}");
        assert!(e.to_string().contains(&point.to_string()), "{e}");
    }
    // The deleted segments' ledger metadata is gone, the rest is there.
    for id in &whole {
        assert!(
            !ledger_exists(&*c.store, *id).await,
            "ledger {id} still has metadata"
        );
    }
    let after = c.store.read_stream("t").await.unwrap().value;
    for s in &after.segments {
        assert!(ledger_exists(&*c.store, s.ledger_id).await);
    }
    assert_eq!(after.segments[0].seq_no, point.segment_seq_no);
    // Every bookie's GC finds the deleted segments' ledgers without metadata and drops
    // their entries: it tombstones them, its entry logs shrink, and the kept records still
    // read back exactly.
    common::wait_until_reclaimed(&c, &before_truncate, whole.iter().copied().collect()).await;
    assert!(
        read_from(&client, "t", ReadPosition::Head).await.unwrap() == all[k..],
        "head read after bookie GC"
    );

    // Never backwards: an earlier point changes nothing and answers the point in force.
    let r = client.truncate("t", all[10].0).await.unwrap();
    assert_eq!((r.truncated_before, r.segments_deleted), (point, 0));
    assert!(read_from(&client, "t", ReadPosition::Head).await.unwrap() == all[k..]);

    // Beyond the end: refused, nothing changes.
    let last = all.last().unwrap().0;
    // (+3: an idle writer may have added one control entry, without records, after the last
    // record's entry, which moves the end to `last.entry_id + 2`.)
    for beyond in [
        Dlsn::new(last.segment_seq_no, last.entry_id + 3, 0),
        Dlsn::new(last.segment_seq_no + 5, 0, 0),
    ] {
        let e = client.truncate("t", beyond).await.unwrap_err();
        assert_eq!(code(&e), ErrorCode::BadRequest, "{e}");
        assert!(e.to_string().contains("beyond its end"), "{e}");
    }
    assert!(read_from(&client, "t", ReadPosition::Head).await.unwrap() == all[k..]);

    // At the last record: only it stays; new writes after it are readable.
    let r = client.truncate("t", last).await.unwrap();
    assert_eq!(r.truncated_before, last);
    let more = write(&client, "t", 1000, 30).await;
    let got = read_from(&client, "t", ReadPosition::Head).await.unwrap();
    let mut expected = vec![all.last().unwrap().clone()];
    expected.extend(more.iter().cloned());
    assert!(got == expected, "after truncating at the last record");

    // DESCRIBE_STREAM shows the point, and segments from the kept one on.
    let info = client.describe_stream("t").await.unwrap();
    assert_eq!(
        info.metadata.truncated_before.map(|t| Dlsn::new(
            t.segment_seq_no,
            t.entry_id,
            t.slot_index
        )),
        Some(last)
    );
    assert_eq!(
        info.owner.as_deref(),
        Some(p.server.local_addr().to_string().as_str())
    );
    assert!(info
        .metadata
        .segments
        .iter()
        .all(|s| s.seq_no >= last.segment_seq_no));
    p.streams.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncating_everything_then_writing_keeps_dlsns_growing() {
    // Goal: after a truncation at the end that deletes every segment (the last one completed),
    // the next segment's number continues past the point, so new records are readable and
    // DLSNs never go back. Method: roll by a clean shutdown, truncate at the end, write.
    let c = common::cluster().await;
    let p = common::proxy(&c, common::small_config()).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    let all = write(&client, "e", 1, 200).await;
    p.streams.shutdown().await.unwrap();
    drop(p);
    common::wait_unowned(&c.store, "e").await;
    let p = common::proxy(&c, common::small_config()).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    let last = all.last().unwrap().0;
    let end = Dlsn::new(last.segment_seq_no, last.entry_id + 1, 0);
    let r = client.truncate("e", end).await.unwrap();
    assert_eq!(r.truncated_before, end);
    let meta = c.store.read_stream("e").await.unwrap().value;
    assert!(meta.segments.is_empty(), "{:?}", meta.segments);
    assert!(read_from(&client, "e", ReadPosition::Head)
        .await
        .unwrap()
        .is_empty());
    let more = write(&client, "e", 500, 20).await;
    assert!(more[0].0 > end, "{} after {end}", more[0].0);
    assert!(read_from(&client, "e", ReadPosition::Head).await.unwrap() == more);
    // An empty stream cannot be truncated beyond its start.
    client.create_stream("empty").await.unwrap();
    let e = client
        .truncate("empty", Dlsn::new(1, 0, 0))
        .await
        .unwrap_err();
    assert_eq!(code(&e), ErrorCode::BadRequest, "{e}");
    p.streams.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_while_written_removes_everything_and_frees_the_name() {
    let c = common::cluster().await;
    let p = common::proxy(&c, common::small_config()).await;
    let addr = p.server.local_addr();
    let client = ProxyClient::connect(addr).await.unwrap();
    write(&client, "d", 1, 300).await;
    // A writer keeps appending (without the create flag) while the stream is deleted.
    let writer = tokio::spawn(async move {
        let client = ProxyClient::connect(addr).await.unwrap();
        let mut t = 10_000u64;
        loop {
            match client
                .write("d", vec![(t, common::payload(t))], false)
                .await
            {
                Ok(_) => t += 1,
                Err(e) => return (t - 10_000, e),
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ledgers: Vec<u64> = c
        .store
        .read_stream("d")
        .await
        .unwrap()
        .value
        .segments
        .iter()
        .map(|s| s.ledger_id)
        .collect();
    let deleted = client.delete_stream("d").await.unwrap();
    let (acked_during, e) = writer.await.unwrap();
    assert!(acked_during > 0, "the writer was writing during the delete");
    assert_eq!(
        code(&e),
        ErrorCode::NoSuchStream,
        "write after the delete: {e}"
    );
    assert!(deleted as usize >= ledgers.len());
    // Everything is gone: the record, every ledger's metadata (the open one included).
    assert!(matches!(
        c.store.read_stream("d").await,
        Err(quire_metadata::Error::NotFound { .. })
    ));
    let now: Vec<u64> = ledgers.clone();
    for id in now {
        assert!(
            !ledger_exists(&*c.store, id).await,
            "ledger {id} still has metadata"
        );
    }
    assert!(!client
        .list_streams()
        .await
        .unwrap()
        .contains(&"d".to_string()));
    let e = read_from(&client, "d", ReadPosition::Head)
        .await
        .unwrap_err();
    assert_eq!(code(&e), ErrorCode::NoSuchStream);
    let e = client.delete_stream("d").await.unwrap_err();
    assert_eq!(code(&e), ErrorCode::NoSuchStream);
    // The name is free: a new stream starts from scratch.
    let fresh = write(&client, "d", 1, 20).await;
    assert_eq!(fresh[0].0, Dlsn::new(1, 0, 0));
    assert!(read_from(&client, "d", ReadPosition::Head).await.unwrap() == fresh);
    p.streams.shutdown().await.unwrap();
}

/// Polls `cond` every 50 ms for up to 15 s.
async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    mut cond: impl FnMut() -> F,
) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(15) {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within 15 s");
}

/// Checks that the stream's readable records are exactly the acknowledged ones from its first
/// kept segment on, and that any earlier one is refused.
async fn check_suffix(
    c: &common::Cluster,
    client: &ProxyClient,
    stream: &str,
    all: &[Rec],
) -> usize {
    let meta = c.store.read_stream(stream).await.unwrap().value;
    let first_seq = meta.segments[0].seq_no;
    let k = all
        .iter()
        .position(|r| r.0.segment_seq_no >= first_seq)
        .unwrap();
    let got = read_from(client, stream, ReadPosition::Head).await.unwrap();
    assert!(
        got == all[k..],
        "readable records are exactly those of the kept segments"
    );
    if k > 0 {
        let e = read_from(client, stream, ReadPosition::Dlsn(all[k - 1].0))
            .await
            .unwrap_err();
        assert_eq!(code(&e), ErrorCode::Truncated, "{e}");
    }
    k
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_by_size_deletes_oldest_segments_only() {
    let c = common::cluster().await;
    let config = StreamConfig {
        lifecycle_check_interval: Duration::from_millis(100),
        ..common::small_config()
    };
    let p = common::proxy(&c, config).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    client.create_stream("z").await.unwrap();
    // 0 and absurd values are refused; a valid one is set and shown.
    for bad in [0, quire_client::RETENTION_SIZE_BYTES_MAX + 1] {
        let e = client
            .set_retention("z", RetentionChange::Keep, RetentionChange::Set(bad))
            .await
            .unwrap_err();
        assert_eq!(code(&e), ErrorCode::BadRequest, "{e}");
    }
    let limit = 150 * 1024;
    let r = client
        .set_retention("z", RetentionChange::Keep, RetentionChange::Set(limit))
        .await
        .unwrap();
    assert_eq!(
        r,
        RetentionOverride {
            time_secs: None,
            size_bytes: Some(limit),
            keep_for_subscriptions: false,
        }
    );
    let all = write(&client, "z", 1, 1500).await;
    eventually("size retention", || async {
        let m = c.store.read_stream("z").await.unwrap().value;
        let completed: u64 = m
            .segments
            .iter()
            .filter(|s| s.state == SegmentState::Completed)
            .map(|s| s.length_bytes)
            .sum();
        completed <= limit
    })
    .await;
    let info = client.describe_stream("z").await.unwrap();
    assert_eq!(info.metadata.retention.size_bytes, Some(limit));
    let total: u64 = info.metadata.segments.iter().map(|s| s.length_bytes).sum();
    assert!(
        info.metadata.segments[0].seq_no > 1,
        "old segments were deleted"
    );
    // No more than needed: with one more (64 KiB) segment the stream would be above the limit.
    assert!(
        total + 64 * 1024 + 8 * 1024 > limit,
        "kept {total} bytes for a limit of {limit}"
    );
    // Only this stream made ledgers here, and ledger ids grow with segments: every ledger id
    // below the first kept segment's is a deleted segment's, and its metadata must be gone.
    // The stream record changes first and the ledgers go after it (DistributedLog's order), so
    // the deletions may still be under way when the record shows the new first segment.
    let first_kept = info.metadata.segments[0].ledger_id;
    for id in 0..first_kept {
        eventually(&format!("ledger {id} metadata deleted"), || async {
            !ledger_exists(&*c.store, id).await
        })
        .await;
    }
    for s in &info.metadata.segments {
        assert!(ledger_exists(&*c.store, s.ledger_id).await);
    }
    let k = check_suffix(&c, &client, "z", &all).await;
    assert!(k > 0);
    p.streams.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_by_age_and_time_rolling() {
    let c = common::cluster().await;
    let config = StreamConfig {
        segment_roll_interval: Some(Duration::from_millis(1500)),
        retention_time: Some(Duration::from_secs(3)),
        lifecycle_check_interval: Duration::from_millis(100),
        ..common::small_config()
    };
    let p = common::proxy(&c, config).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    // Many small writes well within one roll interval go into one segment (no roll per
    // record).
    let first = write(&client, "a", 1, 40).await;
    assert!(first.iter().all(|r| r.0.segment_seq_no == 1));
    let seg1_ledger = c.store.read_stream("a").await.unwrap().value.segments[0].ledger_id;
    // The segment rolls by time once it is old enough, with nothing written meanwhile.
    eventually("time roll", || async {
        c.store.read_stream("a").await.unwrap().value.segments[0].state == SegmentState::Completed
    })
    .await;
    let rolled_at = Instant::now();
    // An idle stream with no open segment does not roll again (no empty segments).
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        c.store.read_stream("a").await.unwrap().value.segments.len(),
        1
    );
    let second = write(&client, "a", 100, 20).await;
    assert!(second.iter().all(|r| r.0.segment_seq_no == 2));
    // Segment 1 expires 3 s after its completion, segment 2 is younger and stays.
    eventually("age retention", || async {
        c.store.read_stream("a").await.unwrap().value.segments[0].seq_no == 2
    })
    .await;
    assert!(
        rolled_at.elapsed() >= Duration::from_millis(2500),
        "deleted too early: {:?}",
        rolled_at.elapsed()
    );
    // The record changes before the ledger is deleted: wait for the second step too.
    eventually("segment 1's ledger metadata deleted", || async {
        !ledger_exists(&*c.store, seg1_ledger).await
    })
    .await;
    assert!(read_from(&client, "a", ReadPosition::Head).await.unwrap() == second);
    let e = read_from(&client, "a", ReadPosition::Dlsn(first[0].0))
        .await
        .unwrap_err();
    assert_eq!(code(&e), ErrorCode::Truncated);
    // A per-stream override wins over the default: "keep" stays as long as asked.
    client.create_stream("keep").await.unwrap();
    client
        .set_retention("keep", RetentionChange::Set(3600), RetentionChange::Keep)
        .await
        .unwrap();
    let kept = write(&client, "keep", 1, 10).await;
    eventually("time roll of keep", || async {
        c.store.read_stream("keep").await.unwrap().value.segments[0].state
            == SegmentState::Completed
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        read_from(&client, "keep", ReadPosition::Head)
            .await
            .unwrap()
            == kept
    );
    // And back to the default: it goes.
    client
        .set_retention("keep", RetentionChange::Default, RetentionChange::Keep)
        .await
        .unwrap();
    eventually("default retention after reset", || async {
        c.store
            .read_stream("keep")
            .await
            .unwrap()
            .value
            .segments
            .is_empty()
    })
    .await;
    // The owner publishes its new view just after the store's write returns, so a read from the
    // head in between may still start in the deleted segment and then meet TRUNCATED (as a
    // DistributedLog reader overtaken by truncation does): the head is empty once the owner's
    // view has caught up.
    eventually("an empty head after retention", || async {
        match read_from(&client, "keep", ReadPosition::Head).await {
            Ok(records) => records.is_empty(),
            Err(e) if code(&e) == ErrorCode::Truncated => false,
            Err(e) => panic!("reading keep from the head: {e}"),
        }
    })
    .await;
    p.streams.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_with_a_stale_view_deletes_nothing() {
    // Goal: deletions are protected by the compare-and-set on the stream record: a proxy that
    // believes it owns the stream while another writer has changed the record (a lost lease it
    // has not noticed yet) removes no segment and deletes no ledger, answers OWNERSHIP_LOST and
    // gives the stream up. Method: change the record behind the owner's back, then truncate
    // through the owner.
    let c = common::cluster().await;
    let p = common::proxy(&c, common::small_config()).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    let all = write(&client, "s", 1, 500).await;
    let v = c.store.read_stream("s").await.unwrap();
    c.store.update_stream(&v.value, v.version).await.unwrap();
    let e = client.truncate("s", all[400].0).await.unwrap_err();
    assert_eq!(code(&e), ErrorCode::OwnershipLost, "{e}");
    let after = c.store.read_stream("s").await.unwrap().value;
    assert_eq!(after.segments.len(), v.value.segments.len());
    assert_eq!(after.truncated_before, None);
    for s in &v.value.segments {
        assert!(ledger_exists(&*c.store, s.ledger_id).await);
    }
    // The next request acquires the stream afresh; every acknowledged record is there.
    assert!(read_from(&client, "s", ReadPosition::Head).await.unwrap() == all);
    p.streams.shutdown().await.unwrap();
}

/// `count` writers on their own connections, each with one single-record write to `stream`
/// in flight until `stop()`; each returns how many writes it made.
fn spawn_writers(
    addr: std::net::SocketAddr,
    stream: &'static str,
    count: u64,
    stop: impl Fn() -> bool + Clone + Send + 'static,
) -> Vec<tokio::task::JoinHandle<u64>> {
    (0..count)
        .map(|w| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let client = ProxyClient::connect(addr).await.unwrap();
                let mut n = 0u64;
                while !stop() {
                    let recs = vec![(1, common::payload(w * 1_000_000 + n))];
                    client.write(stream, recs, false).await.unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_acts_while_writes_keep_coming() {
    // Goal: retention runs while the stream takes a steady flow of writes, and what stays
    // readable is a suffix of what was acknowledged. (This load does not keep the append queue
    // full all the time, so it does not by itself show that the tick cannot be starved; the
    // tick's place first in the stream task's select does.) Method: 8 writers with one write each in flight for 4 s under a 100 KiB
    // size limit; the stream's first segment must move on before the writers stop.
    let c = common::cluster().await;
    let config = StreamConfig {
        lifecycle_check_interval: Duration::from_millis(100),
        retention_size_bytes: Some(100 * 1024),
        ..common::small_config()
    };
    let p = common::proxy(&c, config).await;
    let addr = p.server.local_addr();
    let client = ProxyClient::connect(addr).await.unwrap();
    client.create_stream("busy").await.unwrap();
    let stop = Instant::now() + Duration::from_secs(4);
    let writers = spawn_writers(addr, "busy", 8, move || Instant::now() >= stop);
    let mut moved_while_writing = false;
    while Instant::now() < stop {
        let m = c.store.read_stream("busy").await.unwrap().value;
        if m.segments.first().is_some_and(|s| s.seq_no > 1) {
            moved_while_writing = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut total = 0;
    for w in writers {
        total += w.await.unwrap();
    }
    assert!(total > 0);
    assert!(
        moved_while_writing,
        "retention never ran during {total} writes"
    );
    let m = c.store.read_stream("busy").await.unwrap().value;
    let first = m.segments[0].seq_no;
    let got = read_from(&client, "busy", ReadPosition::Head)
        .await
        .unwrap();
    assert!(got.iter().all(|r| r.0.segment_seq_no >= first));
    assert!(got.windows(2).all(|w| w[0].0 < w[1].0));
    p.streams.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_during_a_roll_shows_the_in_progress_segment_counts() {
    // Goal (issue 23, item 5): a describe of a size-retained stream taken while it rolls never
    // shows the segment being written with fewer records than an earlier describe showed for
    // it (the field report: the in-progress segment with 0 records and 0 bytes, so that a
    // monitor summing retained bytes saw the stream empty for a moment). Method: a store whose
    // owner reads take 5 ms (a ZooKeeper round trip; a describe reads the record, then the
    // owner), 64 KiB segments under a 100 KiB size limit, 4 writers rolling the stream over
    // and over while describes run back to back; for every segment seq no, the record count
    // shown must never go down from one describe to a later one.
    let (c, store) = common::cluster_revocable().await;
    *store.stream_owner_delay.lock().unwrap() = Duration::from_millis(5);
    let config = StreamConfig {
        lifecycle_check_interval: Duration::from_millis(100),
        retention_size_bytes: Some(100 * 1024),
        ..common::small_config()
    };
    let p = common::proxy(&c, config).await;
    let addr = p.server.local_addr();
    let client = ProxyClient::connect(addr).await.unwrap();
    client.create_stream("mon").await.unwrap();
    client
        .write("mon", vec![(0, common::payload(0))], false)
        .await
        .unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = done.clone();
    let writers = spawn_writers(addr, "mon", 4, move || {
        stop.load(std::sync::atomic::Ordering::SeqCst)
    });
    // seq no -> most records any describe showed for it so far.
    let mut seen: std::collections::HashMap<u64, u64> = Default::default();
    let mut snapshots = 0u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last_seq = 0;
    // Twenty rolls while describing.
    while last_seq < 21 {
        assert!(
            Instant::now() < deadline,
            "the stream rolled only to {last_seq} in 60 s"
        );
        let info = client.describe_stream("mon").await.unwrap();
        snapshots += 1;
        for s in &info.metadata.segments {
            let most = seen.entry(s.seq_no).or_default();
            assert!(
                s.record_count >= *most,
                "describe {snapshots} shows segment {} ({:?}) with {} records ({} bytes) after an earlier describe showed {}: {:?}",
                s.seq_no,
                s.state,
                s.record_count,
                s.length_bytes,
                *most,
                info.metadata.segments
            );
            *most = s.record_count;
            last_seq = last_seq.max(s.seq_no);
        }
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    for w in writers {
        w.await.unwrap();
    }
    p.streams.shutdown().await.unwrap();
}

/// Issue 24 item 8: on one connection, requests pipelined after a `DELETE_STREAM` are applied
/// after the delete (docs/proxy-protocol.md, "Delete stream"): write, delete, write, write,
/// write sent in one go get their answers with the delete's first, the write without the create
/// flag gets `NO_SUCH_STREAM`, and the writes with it make a new stream that starts at 1:0:0;
/// the record written before the delete is gone with the old stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_pipelined_after_a_delete_on_one_connection_follow_it() {
    use quire_client::protocol::{Request, Response};

    let c = common::cluster().await;
    let p = common::proxy(&c, common::small_config()).await;
    let addr = p.server.local_addr();
    let client = ProxyClient::connect(addr).await.unwrap();
    write(&client, "wd", 1, 5).await;

    let mut s = common::raw::Raw::connect(addr).await;
    let mut out = common::raw::hello();
    let w = |txid: u64, create: bool| Request::Write {
        stream: "wd".into(),
        create_if_missing: create,
        compress: false,
        records: vec![(txid, common::payload(txid))],
    };
    w(6, true).encode(2, &mut out);
    Request::DeleteStream {
        stream: "wd".into(),
    }
    .encode(3, &mut out);
    w(7, false).encode(4, &mut out);
    w(8, true).encode(5, &mut out);
    w(9, true).encode(6, &mut out);
    // One write to the socket: the proxy reads every request before any is answered.
    s.send(&out).await.unwrap();
    // The Hello's answer and the five requests' answers.
    let answers = s.take(6).await;
    let at = |id: u64| answers.iter().position(|(i, _)| *i == id).unwrap();
    let answer = |id: u64| &answers[at(id)].1;
    assert!(
        matches!(answer(2), Response::Write { .. }),
        "{:?}",
        answer(2)
    );
    assert!(
        matches!(answer(3), Response::DeleteStream { segments_deleted } if *segments_deleted >= 1),
        "{:?}",
        answer(3)
    );
    for later in [4, 5, 6] {
        assert!(
            at(3) < at(later),
            "request {later} was answered before the delete: {answers:?}"
        );
    }
    assert!(
        matches!(
            answer(4),
            Response::Error {
                code: ErrorCode::NoSuchStream,
                ..
            }
        ),
        "a write without the create flag queued behind the delete: {:?}",
        answer(4)
    );
    match (answer(5), answer(6)) {
        (
            Response::Write {
                first_dlsn: a,
                last_dlsn: _,
                ..
            },
            Response::Write { first_dlsn: b, .. },
        ) => {
            assert_eq!(*a, Dlsn::new(1, 0, 0), "a new stream");
            assert!(b > a);
        }
        other => panic!("writes with the create flag after the delete: {other:?}"),
    }
    let left: Vec<u64> = read_from(&client, "wd", ReadPosition::Head)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, t, _)| t)
        .collect();
    assert_eq!(left, vec![8, 9], "only the writes made after the delete");
    p.streams.shutdown().await.unwrap();
}

/// Goal: with `keep_for_subscriptions` on (issue 26 item 2), size retention deletes only the
/// segments wholly before the smallest committed subscription position, keeps them while the
/// subscription lags, and deletes them once it commits past; the setting shows in the answer
/// and in `DESCRIBE_STREAM`. Method: a stream over several 64 KiB segments, a subscription
/// committed inside its third segment, size retention of 1 byte (which alone would delete
/// every completed segment); the store's record is watched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_what_subscriptions_need() {
    let c = common::cluster().await;
    let config = StreamConfig {
        lifecycle_check_interval: Duration::from_millis(100),
        subscriptions_per_stream_max: 2,
        ..common::small_config()
    };
    let p = common::proxy(&c, config).await;
    let client = ProxyClient::connect(p.server.local_addr()).await.unwrap();
    let all = write(&client, "k", 1, 1500).await;
    let last_seg = all.last().unwrap().0.segment_seq_no;
    assert!(last_seg >= 5, "{last_seg} segments");
    let r = client
        .set_retention_with(
            "k",
            RetentionChange::Keep,
            RetentionChange::Keep,
            Some(true),
        )
        .await
        .unwrap();
    assert!(r.keep_for_subscriptions);
    let info = client.describe_stream("k").await.unwrap();
    assert!(info.metadata.retention.keep_for_subscriptions);
    let k = all.iter().position(|r| r.0.segment_seq_no == 3).unwrap() + 2;
    client
        .commit_subscription("k", "lag", all[k].0)
        .await
        .unwrap();
    client
        .set_retention("k", RetentionChange::Keep, RetentionChange::Set(1))
        .await
        .unwrap();
    let first_seg = || async { c.store.read_stream("k").await.unwrap().value.segments[0].seq_no };
    eventually("segments before the subscription deleted", || async {
        first_seg().await == 3
    })
    .await;
    // Several lifecycle checks later the subscription's segment is still there, and it reads
    // on from its position.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(first_seg().await, 3);
    let rest = read_from(&client, "k", ReadPosition::Dlsn(all[k].0))
        .await
        .unwrap();
    assert!(
        rest == all[k..],
        "the lagging subscription reads every record it needs"
    );
    // Once it commits past, retention takes the rest (the segment being written stays).
    let end = all.last().unwrap().0;
    client.commit_subscription("k", "lag", end).await.unwrap();
    eventually("segments deleted after the commit", || async {
        first_seg().await == last_seg
    })
    .await;
    // Turned off: the setting goes from the record.
    let r = client
        .set_retention_with(
            "k",
            RetentionChange::Keep,
            RetentionChange::Keep,
            Some(false),
        )
        .await
        .unwrap();
    assert!(!r.keep_for_subscriptions);
    subscriptions_are_bounded(&client, &all).await;
    p.streams.shutdown().await.unwrap();
}

/// Goal: `subscriptions_per_stream_max` (here 2) bounds a stream's subscriptions: the first
/// commit of one name too many fails with `TOO_MANY_SUBSCRIPTIONS` and stores nothing;
/// commits to existing names go on; after a delete a new name fits again. Runs inside
/// `retention_keeps_what_subscriptions_need` (its proxy and its stream "k", which has the
/// subscription "lag"), sharing its cluster.
async fn subscriptions_are_bounded(client: &ProxyClient, all: &[Rec]) {
    let at = all[10].0;
    client.commit_subscription("k", "two", at).await.unwrap();
    let e = client
        .commit_subscription("k", "three", at)
        .await
        .unwrap_err();
    assert_eq!(code(&e), ErrorCode::TooManySubscriptions, "{e}");
    assert!(
        e.to_string().contains("subscriptions_per_stream_max"),
        "{e}"
    );
    let names: Vec<String> = client
        .list_subscriptions("k")
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["lag", "two"], "nothing stored for the refused name");
    client
        .commit_subscription("k", "two", all[20].0)
        .await
        .unwrap();
    assert!(client.delete_subscription("k", "two").await.unwrap());
    client.commit_subscription("k", "three", at).await.unwrap();
}

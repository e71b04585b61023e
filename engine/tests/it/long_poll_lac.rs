//! Goal: the long-poll LAC read (BookKeeper READ_ENTRY with previousLAC and a timeout) parks
//! until the ledger's LAC passes `previous`, is woken by the add that moves it (no polling),
//! answers with the next entry piggybacked, answers with the unchanged LAC on timeout, answers
//! at once for a fenced ledger, parks on a ledger the shard has not seen yet, and fails with
//! `Closed` when the engine closes under it.
//! Method: a real engine on O_DIRECT files; waiters are spawned tasks on the same executor,
//! observed through `lac_waiters` and their results; adds carry piggybacked LACs as a ledger
//! client would send them.

use std::rc::Rc;
use std::time::Duration;

use crate::common::{config, payload, run, tempdir, KEY};
use quire_engine::{Engine, Error, LacUpdate};

const LONG: Duration = Duration::from_secs(30);

/// Lets spawned tasks run until they park.
async fn settle() {
    for _ in 0..10 {
        glommio::yield_if_needed().await;
        glommio::executor().yield_task_queue_now().await;
    }
}

#[test]
fn parks_wakes_on_add_and_piggybacks_next_entry() {
    let dir = tempdir();
    let cfg = config(dir.path());
    run(move || async move {
        let engine = Engine::open(cfg).await.unwrap();
        engine
            .add_entry(1, 0, KEY, None, payload(1, 0, 100), false)
            .await
            .unwrap();
        engine
            .add_entry(1, 1, KEY, Some(0), payload(1, 1, 100), false)
            .await
            .unwrap();
        assert_eq!(engine.ledger_state(1).unwrap().lac, Some(0));

        // LAC already past `previous`: answers at once with entry previous + 1.
        let u = engine.wait_for_lac(1, None, LONG).await.unwrap();
        assert_eq!(
            u,
            LacUpdate {
                lac: Some(0),
                fenced: false,
                next_entry: Some((0, payload(1, 0, 100)))
            }
        );

        // LAC == previous: parks until an add moves it.
        let e = engine.clone();
        let waiter = glommio::spawn_local(async move { e.wait_for_lac(1, Some(0), LONG).await });
        settle().await;
        assert_eq!(engine.lac_waiters(1), 1, "the long-poll is parked");
        // An add to another ledger does not answer it.
        engine
            .add_entry(2, 0, KEY, None, payload(2, 0, 10), false)
            .await
            .unwrap();
        settle().await;
        assert_eq!(
            engine.lac_waiters(1),
            1,
            "still parked after another ledger's add"
        );
        engine
            .add_entry(1, 2, KEY, Some(1), payload(1, 2, 100), false)
            .await
            .unwrap();
        let u = waiter.await.unwrap();
        assert_eq!(u.lac, Some(1));
        assert_eq!(u.next_entry, Some((1, payload(1, 1, 100))));
        assert_eq!(
            engine.lac_waiters(1),
            0,
            "the watcher is gone once nobody waits"
        );
        engine.close().await.unwrap();
    });
}

#[test]
fn times_out_with_unchanged_lac_and_unregisters() {
    let dir = tempdir();
    let cfg = config(dir.path());
    run(move || async move {
        let engine = Engine::open(cfg).await.unwrap();
        engine
            .add_entry(1, 0, KEY, None, payload(1, 0, 10), false)
            .await
            .unwrap();
        engine
            .add_entry(1, 1, KEY, Some(0), payload(1, 1, 10), false)
            .await
            .unwrap();
        let u = engine
            .wait_for_lac(1, Some(0), Duration::from_millis(30))
            .await
            .unwrap();
        assert_eq!(
            u,
            LacUpdate {
                lac: Some(0),
                fenced: false,
                next_entry: None
            }
        );
        assert_eq!(engine.lac_waiters(1), 0);
        // A dropped (cancelled) waiter unregisters too.
        let e = engine.clone();
        let waiter = glommio::spawn_local(async move { e.wait_for_lac(1, Some(0), LONG).await });
        settle().await;
        assert_eq!(engine.lac_waiters(1), 1);
        drop(waiter);
        settle().await;
        assert_eq!(engine.lac_waiters(1), 0);
        engine.close().await.unwrap();
    });
}

#[test]
fn unknown_ledger_parks_fence_and_close_answer() {
    let dir = tempdir();
    let cfg = config(dir.path());
    run(move || async move {
        let engine: Rc<Engine> = Engine::open(cfg).await.unwrap();
        // A ledger never seen: parks; its first entry (LAC none) does not pass `None`, the
        // second (LAC 0) does, and entry 0 comes piggybacked.
        let e = engine.clone();
        let waiter = glommio::spawn_local(async move { e.wait_for_lac(5, None, LONG).await });
        settle().await;
        assert_eq!(engine.lac_waiters(5), 1);
        engine
            .add_entry(5, 0, KEY, None, payload(5, 0, 10), false)
            .await
            .unwrap();
        settle().await;
        assert_eq!(engine.lac_waiters(5), 1, "LAC still none");
        engine
            .add_entry(5, 1, KEY, Some(0), payload(5, 1, 10), false)
            .await
            .unwrap();
        let u = waiter.await.unwrap();
        assert_eq!(
            u,
            LacUpdate {
                lac: Some(0),
                fenced: false,
                next_entry: Some((0, payload(5, 0, 10)))
            }
        );

        // Fencing answers a parked long-poll at once, without a piggybacked entry.
        let e = engine.clone();
        let waiter = glommio::spawn_local(async move { e.wait_for_lac(5, Some(0), LONG).await });
        settle().await;
        assert_eq!(engine.lac_waiters(5), 1);
        engine.fence(5, KEY).await.unwrap();
        let u = waiter.await.unwrap();
        assert_eq!(
            u,
            LacUpdate {
                lac: Some(0),
                fenced: true,
                next_entry: None
            }
        );

        // Closing the engine answers a parked long-poll with Closed.
        let e = engine.clone();
        let waiter = glommio::spawn_local(async move { e.wait_for_lac(6, None, LONG).await });
        settle().await;
        assert_eq!(engine.lac_waiters(6), 1);
        engine.close().await.unwrap();
        assert!(matches!(waiter.await, Err(Error::Closed)));
    });
}

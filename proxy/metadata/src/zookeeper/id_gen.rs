//! Ledger id generation: a counter znode incremented by compare-and-set (in place of
//! BookKeeper's sequential-znode id generator), so ids are unique across processes and restarts.

use quire_wire::LedgerId;
use tokio::sync::oneshot;
use zookeeper_client as zk;

use super::records::{from_json, to_json, zk_err};
use super::ZkStore;
use crate::{Error, Result};

/// The counter's value: the id [`allocate_ledger_id`] tries next.
pub(super) async fn next_ledger_id(store: &ZkStore) -> Result<LedgerId> {
    let p = store.path("idgen/ledger");
    let (bytes, _) = store.get_data(&p).await.map_err(|e| zk_err("get", &p, e))?;
    Ok(LedgerId(from_json(&p, &bytes)?))
}

/// Requests of one store waiting for an id, and the lock of the round that serves them.
///
/// Concurrent allocations of one process share one compare-and-set: at 10,000 streams a
/// proxy taking over thousands of streams starts hundreds of segments at once, and each
/// allocation on its own lost the counter's compare-and-set to the others over and over (one
/// winner per round, every loser's write still sent to ZooKeeper), so a new segment waited
/// 10-50 s (issue 29, perf/README.md). Ids are still reserved only for requests waiting now,
/// so the counter stays just past the last id handed out.
#[derive(Default)]
pub(super) struct IdRounds {
    waiting: std::sync::Mutex<Vec<oneshot::Sender<Option<LedgerId>>>>,
    round: tokio::sync::Mutex<()>,
}

/// The next unused ledger id. The first waiter to find no round running takes every request
/// waiting then and allocates one id for each ([`allocate_many`]); the others get theirs
/// from it. When a round fails, each of its requests allocates alone and returns its own
/// error.
pub(super) async fn allocate_ledger_id(store: &ZkStore) -> Result<LedgerId> {
    let rounds = &store.inner.id_rounds;
    let (tx, mut rx) = oneshot::channel();
    rounds.waiting.lock().expect("id waiters lock").push(tx);
    loop {
        let _round = tokio::select! {
            biased;
            served = &mut rx => match served {
                Ok(Some(id)) => return Ok(id),
                // The round failed (or its task was dropped): try alone.
                _ => return Ok(allocate_many(store, 1).await?[0]),
            },
            round = rounds.round.lock() => round,
        };
        let batch = std::mem::take(&mut *rounds.waiting.lock().expect("id waiters lock"));
        if batch.is_empty() {
            continue; // an earlier round served this request: `rx` is ready
        }
        match allocate_many(store, batch.len()).await {
            Ok(ids) => {
                for (tx, id) in batch.into_iter().zip(ids) {
                    let _ = tx.send(Some(id));
                }
            }
            Err(_) => {
                for tx in batch {
                    let _ = tx.send(None);
                }
            }
        }
    }
}

/// Reserves `n` ids by compare-and-set increments of the counter `idgen/ledger` (the next id
/// to hand out, JSON number, starting at 1), skipping ids whose ledger node already exists
/// (created with an explicit id). Ids are never handed out twice, even across processes and
/// restarts, as long as the layout is not deleted; a lost CAS retries, and an id whose
/// allocation reply was lost to a connection failure is simply never used.
async fn allocate_many(store: &ZkStore, n: usize) -> Result<Vec<LedgerId>> {
    let c = &store.inner.client;
    let p = store.path("idgen/ledger");
    let mut ids = Vec::with_capacity(n);
    while ids.len() < n {
        let want = (n - ids.len()) as u64;
        let (bytes, stat) = store.get_data(&p).await.map_err(|e| zk_err("get", &p, e))?;
        let next: u64 = from_json(&p, &bytes)?;
        let bumped = next.checked_add(want).ok_or_else(|| Error::Corrupt {
            path: p.clone(),
            reason: "ledger id counter is exhausted".into(),
        })?;
        match c
            .set_data(
                &p,
                &to_json("ledger id counter", &bumped)?,
                Some(stat.version),
            )
            .await
        {
            Ok(_) => {}
            Err(zk::Error::BadVersion) => continue,
            Err(e) => return Err(zk_err("set", &p, e)),
        }
        for id in (next..bumped).map(LedgerId) {
            let lp = store.ledger_path(id);
            match c.check_stat(&lp).await {
                Ok(None) => ids.push(id),
                Ok(Some(_)) => {}
                Err(e) => return Err(zk_err("exists", &lp, e)),
            }
        }
    }
    Ok(ids)
}

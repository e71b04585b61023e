//! Ledger id generation: a counter znode incremented by compare-and-set (in place of
//! BookKeeper's sequential-znode id generator), so ids are unique across processes and restarts.

use quire_wire::LedgerId;
use zookeeper_client as zk;

use super::records::{from_json, to_json, zk_err};
use super::ZkStore;
use crate::{Error, Result};

/// Compare-and-set increment of the counter `idgen/ledger` (the next id to hand out, JSON
/// number, starting at 1); ids whose ledger node already exists (created with an explicit
/// id) are skipped. Ids are never handed out twice, even across processes and restarts, as
/// long as the layout is not deleted; a lost CAS retries, and an id whose allocation reply
/// was lost to a connection failure is simply never used.
/// The counter's value: the id [`allocate_ledger_id`] tries next.
pub(super) async fn next_ledger_id(store: &ZkStore) -> Result<LedgerId> {
    let p = store.path("idgen/ledger");
    let (bytes, _) = store.get_data(&p).await.map_err(|e| zk_err("get", &p, e))?;
    Ok(LedgerId(from_json(&p, &bytes)?))
}

pub(super) async fn allocate_ledger_id(store: &ZkStore) -> Result<LedgerId> {
    let c = &store.inner.client;
    let p = store.path("idgen/ledger");
    loop {
        let (bytes, stat) = store.get_data(&p).await.map_err(|e| zk_err("get", &p, e))?;
        let next: u64 = from_json(&p, &bytes)?;
        let bumped = next.checked_add(1).ok_or_else(|| Error::Corrupt {
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
        let id = LedgerId(next);
        let lp = store.ledger_path(id);
        match c.check_stat(&lp).await {
            Ok(None) => return Ok(id),
            Ok(Some(_)) => continue,
            Err(e) => return Err(zk_err("exists", &lp, e)),
        }
    }
}

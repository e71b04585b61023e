//! The embedded store's autorecovery records ([`UnderReplicationStore`]): marks and
//! decommissions are persisted in the document like every other record; replication locks and
//! auditor candidates live in memory and end with the process (or the candidate's handle), as
//! ZooKeeper's ephemeral nodes end with their session.

use std::sync::{Arc, Mutex as SyncMutex};

use async_trait::async_trait;
use quire_wire::LedgerId;
use tokio::sync::watch;

use super::{check_version, EmbeddedStore};
use crate::autorecovery::{AuditorElection, UnderReplicationStore};
use crate::{
    AutorecoveryState, BookieId, Decommission, Error, ReplicationLock, Result, UnderReplication,
    Version, Versioned,
};

/// How often a waiting candidate looks at the election again (in-process, so cheap).
const ELECTION_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Process-lifetime autorecovery state: what ZooKeeper keeps in ephemeral nodes.
#[derive(Debug, Default)]
pub(super) struct Ephemeral {
    /// Ledger id to the worker holding its replication lock.
    locks: std::collections::BTreeMap<u64, String>,
    /// Election sequence number to candidate name; the lowest is the auditor.
    candidates: std::collections::BTreeMap<u64, String>,
    next_seq: u64,
}

fn ephemeral(store: &EmbeddedStore) -> std::sync::MutexGuard<'_, Ephemeral> {
    // A panic while holding this lock leaves plain maps behind: still consistent.
    store
        .ephemeral
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn mark_not_found(ledger: LedgerId) -> Error {
    Error::NotFound {
        kind: "under-replication mark",
        key: ledger.to_string(),
    }
}

#[async_trait]
impl UnderReplicationStore for EmbeddedStore {
    async fn mark_under_replicated(&self, ledger: LedgerId, bookies: &[BookieId]) -> Result<()> {
        let mut doc = self.inner.lock().await;
        match doc.under_replicated.get_mut(&ledger.0) {
            Some((mark, version)) => {
                if !crate::autorecovery::add_sorted(&mut mark.missing_bookies, bookies) {
                    return Ok(());
                }
                version.0 += 1;
            }
            None => {
                let mut mark = UnderReplication {
                    missing_bookies: Vec::new(),
                    gaps_on: Vec::new(),
                    ctime_ms: quire_clock::unix_ms(),
                };
                crate::autorecovery::add_sorted(&mut mark.missing_bookies, bookies);
                doc.under_replicated.insert(ledger.0, (mark, Version(0)));
            }
        }
        self.persist(&doc).await
    }

    async fn read_under_replicated(&self, ledger: LedgerId) -> Result<Versioned<UnderReplication>> {
        let doc = self.inner.lock().await;
        let (value, version) = doc
            .under_replicated
            .get(&ledger.0)
            .cloned()
            .ok_or_else(|| mark_not_found(ledger))?;
        Ok(Versioned { value, version })
    }

    async fn list_under_replicated(&self) -> Result<Vec<(LedgerId, Versioned<UnderReplication>)>> {
        let doc = self.inner.lock().await;
        Ok(doc
            .under_replicated
            .iter()
            .map(|(&id, (value, version))| {
                let v = Versioned {
                    value: value.clone(),
                    version: *version,
                };
                (LedgerId(id), v)
            })
            .collect())
    }

    async fn clear_under_replicated(&self, ledger: LedgerId, expected: Version) -> Result<()> {
        let mut doc = self.inner.lock().await;
        let Some((_, found)) = doc.under_replicated.get(&ledger.0) else {
            return Ok(());
        };
        let kind = "under-replication mark";
        check_version(kind, ledger.to_string(), expected, *found)?;
        doc.under_replicated.remove(&ledger.0);
        self.persist(&doc).await
    }

    async fn try_lock_under_replicated(
        &self,
        ledger: LedgerId,
        owner: &str,
    ) -> Result<Option<ReplicationLock>> {
        let mut e = ephemeral(self);
        if e.locks.contains_key(&ledger.0) {
            return Ok(None);
        }
        e.locks.insert(ledger.0, owner.to_string());
        Ok(Some(ReplicationLock {
            ledger,
            token: format!("{}:{owner}", ledger.0),
        }))
    }

    async fn release_replication_lock(&self, lock: ReplicationLock) -> Result<()> {
        let mut e = ephemeral(self);
        // Only the holder's own token releases it (a stale handle must not free another's).
        let holder = e.locks.get(&lock.ledger.0);
        if holder.is_some_and(|w| lock.token == format!("{}:{w}", lock.ledger.0)) {
            e.locks.remove(&lock.ledger.0);
        }
        Ok(())
    }

    async fn start_decommission(&self, bookie: &BookieId) -> Result<bool> {
        let mut doc = self.inner.lock().await;
        if doc.decommissioning.contains_key(bookie) {
            return Ok(false);
        }
        doc.decommissioning.insert(
            bookie.clone(),
            Decommission {
                start_ms: quire_clock::unix_ms(),
                ..Decommission::default()
            },
        );
        self.persist(&doc).await?;
        Ok(true)
    }

    async fn decommissioning(&self) -> Result<Vec<BookieId>> {
        let doc = self.inner.lock().await;
        Ok(doc.decommissioning.keys().cloned().collect())
    }

    async fn decommissions(&self) -> Result<Vec<(BookieId, Decommission)>> {
        let doc = self.inner.lock().await;
        Ok(doc
            .decommissioning
            .iter()
            .map(|(b, d)| (b.clone(), *d))
            .collect())
    }

    async fn record_decommission_copy(
        &self,
        bookie: &BookieId,
        bytes: u64,
        entries: u64,
    ) -> Result<()> {
        let mut doc = self.inner.lock().await;
        let Some(d) = doc.decommissioning.get_mut(bookie) else {
            return Ok(());
        };
        d.bytes_copied = d.bytes_copied.saturating_add(bytes);
        d.entries_copied = d.entries_copied.saturating_add(entries);
        self.persist(&doc).await
    }

    async fn end_decommission(&self, bookie: &BookieId) -> Result<()> {
        let mut doc = self.inner.lock().await;
        if doc.decommissioning.remove(bookie).is_none() {
            return Ok(());
        }
        self.persist(&doc).await
    }

    async fn delete_cookie(&self, bookie: &BookieId, expected: Version) -> Result<()> {
        let mut doc = self.inner.lock().await;
        let found = doc
            .cookies
            .get(bookie)
            .map(|(_, v)| *v)
            .ok_or(Error::NotFound {
                kind: "cookie",
                key: bookie.0.clone(),
            })?;
        check_version("cookie", bookie.0.clone(), expected, found)?;
        doc.cookies.remove(bookie);
        self.persist(&doc).await
    }

    async fn join_auditor_election(&self, name: &str) -> Result<Box<dyn AuditorElection>> {
        let seq = {
            let mut e = ephemeral(self);
            e.next_seq += 1;
            let seq = e.next_seq;
            e.candidates.insert(seq, name.to_string());
            seq
        };
        Ok(Box::new(EmbeddedCandidate {
            ephemeral: self.ephemeral.clone(),
            seq,
            name: name.to_string(),
        }))
    }

    async fn autorecovery_state(&self) -> Result<AutorecoveryState> {
        let e = ephemeral(self);
        Ok(AutorecoveryState {
            candidates: e.candidates.values().cloned().collect(),
            locks: e
                .locks
                .iter()
                .map(|(&l, w)| (LedgerId(l), w.clone()))
                .collect(),
        })
    }

    fn session_lost(&self) -> watch::Receiver<bool> {
        self.session.subscribe()
    }
}

/// An auditor candidate of the embedded store: leaves the election when dropped.
struct EmbeddedCandidate {
    ephemeral: Arc<SyncMutex<Ephemeral>>,
    seq: u64,
    name: String,
}

impl EmbeddedCandidate {
    fn state(&self) -> std::sync::MutexGuard<'_, Ephemeral> {
        self.ephemeral
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for EmbeddedCandidate {
    fn drop(&mut self) {
        let seq = self.seq;
        self.state().candidates.remove(&seq);
    }
}

#[async_trait]
impl AuditorElection for EmbeddedCandidate {
    fn name(&self) -> &str {
        &self.name
    }

    async fn wait_until_elected(&self) -> Result<()> {
        while !self.is_elected().await? {
            tokio::time::sleep(ELECTION_POLL).await;
        }
        Ok(())
    }

    async fn is_elected(&self) -> Result<bool> {
        Ok(self.state().candidates.keys().next() == Some(&self.seq))
    }
}

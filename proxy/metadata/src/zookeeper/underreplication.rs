//! Autorecovery's znodes (BookKeeper `ZkLedgerUnderreplicationManager` and
//! `ZkLedgerAuditorManager`, reduced): under-replicated ledger marks, the replication workers'
//! per-ledger locks, and the auditor election. Layout in `docs/format/zookeeper-layout.md`,
//! "Autorecovery".
//!
//! * `underreplication/ledgers/<bucket>/L<leaf>` (persistent): an [`UnderReplication`] mark,
//!   bucketed like the ledger's own node.
//! * `underreplication/locks/L<20 digits>` (ephemeral): the worker holding the ledger.
//! * `underreplication/auditorelection/V_<seq>` (ephemeral-sequential): one per auditor
//!   candidate; the lowest sequence number is the auditor.
//!
//! The directories are created on first use, so a layout created before autorecovery existed
//! needs no migration (the layout version stays 1).

use std::time::Duration;

use quire_wire::LedgerId;
use zookeeper_client as zk;

use super::paths::{ledger_bucket_and_leaf, ledger_id_of, validate_bookie_id};
use super::records::{from_json, to_json, zk_err};
use super::ZkStore;
use crate::{
    BookieId, Decommission, Error, ReplicationLock, Result, UnderReplication, Version, Versioned,
};

/// Prefix of the auditor election's ephemeral-sequential children (BookKeeper's `V_`).
const ELECTION_PREFIX: &str = "V_";
/// How often a mark update starts over after losing a race.
const MARK_ATTEMPTS_MAX: usize = 16;

fn now_ms() -> u64 {
    quire_clock::unix_ms()
}

/// Sequence number of an election child, `u64::MAX` for a name that is not one.
fn election_seq(child: &str) -> u64 {
    child
        .strip_prefix(ELECTION_PREFIX)
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX)
}

/// One auditor candidate's place in the election (BookKeeper `AuditorElector`): its
/// ephemeral-sequential node. The candidate is the auditor while its node is the lowest; the
/// node, and so the candidacy, ends with the store's session or [`AuditorCandidate::resign`].
#[derive(Debug)]
pub struct AuditorCandidate {
    store: ZkStore,
    path: String,
    name: String,
}

/// Who holds what in autorecovery, for `quire autorecovery status`.
#[derive(Debug, Clone, Default)]
pub struct AutorecoveryState {
    /// Auditor candidates by election order (their identities); the first is the auditor.
    pub candidates: Vec<String>,
    /// Ledgers a worker holds, with the worker's identity.
    pub locks: Vec<(LedgerId, String)>,
}

impl ZkStore {
    /// Creates every missing node of `path` (persistent, empty), like `mkdir -p`.
    async fn ensure_dir(&self, path: &str) -> Result<()> {
        self.inner
            .client
            .mkdir(path, &self.persistent())
            .await
            .map_err(|e| zk_err("mkdir", path, e))
    }

    fn under_replicated_path(&self, id: LedgerId) -> String {
        let (bucket, leaf) = ledger_bucket_and_leaf(id);
        self.path(&format!("underreplication/ledgers/{bucket}/{leaf}"))
    }

    fn replication_lock_path(&self, id: LedgerId) -> String {
        self.path(&format!("underreplication/locks/L{:020}", id.0))
    }

    /// Marks `ledger` under-replicated because of `bookies` (BookKeeper
    /// `markLedgerUnderreplicated`): creates its mark, or adds the bookies to an existing one
    /// by compare-and-set (its `ctime_ms` stays). Idempotent.
    ///
    /// # Errors
    /// `ZooKeeper`; `Corrupt` for an unreadable existing mark.
    pub async fn mark_under_replicated(
        &self,
        ledger: LedgerId,
        bookies: &[BookieId],
    ) -> Result<()> {
        self.extend_mark(ledger, |m| {
            crate::autorecovery::add_sorted(&mut m.missing_bookies, bookies)
        })
        .await
    }

    /// Marks `ledger` under-replicated because a writer reported that `bookies` miss entries
    /// of it ([`UnderReplication::gaps_on`]); otherwise as [`ZkStore::mark_under_replicated`].
    ///
    /// # Errors
    /// `ZooKeeper`; `Corrupt` for an unreadable existing mark.
    pub async fn mark_gaps(&self, ledger: LedgerId, bookies: &[BookieId]) -> Result<()> {
        self.extend_mark(ledger, |m| {
            crate::autorecovery::add_sorted(&mut m.gaps_on, bookies)
        })
        .await
    }

    /// Creates `ledger`'s mark with `add` applied to an empty one, or applies `add` to the
    /// existing mark by compare-and-set; `add` returns whether it changed the mark.
    async fn extend_mark(
        &self,
        ledger: LedgerId,
        add: impl Fn(&mut UnderReplication) -> bool,
    ) -> Result<()> {
        let c = &self.inner.client;
        let p = self.under_replicated_path(ledger);
        for _ in 0..MARK_ATTEMPTS_MAX {
            match c.get_data(&p).await {
                Ok((bytes, stat)) => {
                    let mut mark: UnderReplication = from_json(&p, &bytes)?;
                    if !add(&mut mark) {
                        return Ok(());
                    }
                    let data = to_json("under-replication mark", &mark)?;
                    match c.set_data(&p, &data, Some(stat.version)).await {
                        Ok(_) => return Ok(()),
                        Err(zk::Error::BadVersion | zk::Error::NoNode) => continue,
                        Err(e) => return Err(zk_err("set", &p, e)),
                    }
                }
                Err(zk::Error::NoNode) => {
                    let mut mark = UnderReplication {
                        missing_bookies: Vec::new(),
                        gaps_on: Vec::new(),
                        ctime_ms: now_ms(),
                    };
                    add(&mut mark);
                    let data = to_json("under-replication mark", &mark)?;
                    match c.create(&p, &data, &self.persistent()).await {
                        Ok(_) => return Ok(()),
                        Err(zk::Error::NodeExists) => continue,
                        Err(zk::Error::NoNode) => {
                            let bucket = &p[..p.rfind('/').unwrap_or(p.len())];
                            self.ensure_dir(bucket).await?;
                        }
                        Err(e) => return Err(zk_err("create", &p, e)),
                    }
                }
                Err(e) => return Err(zk_err("get", &p, e)),
            }
        }
        Err(Error::ZooKeeper {
            op: "mark under-replicated",
            path: p,
            source: zk::Error::UnexpectedError(format!(
                "the mark changed {MARK_ATTEMPTS_MAX} times while updating it"
            )),
        })
    }

    /// Reads one ledger's mark; `NotFound` when it is not marked.
    ///
    /// # Errors
    /// `NotFound`, `ZooKeeper`, `Corrupt`.
    pub async fn read_under_replicated(
        &self,
        ledger: LedgerId,
    ) -> Result<Versioned<UnderReplication>> {
        self.get(
            "under-replication mark",
            &ledger.to_string(),
            &self.under_replicated_path(ledger),
        )
        .await
    }

    /// Every marked ledger with its mark, by ascending ledger id (BookKeeper
    /// `listLedgersToRereplicate`). Marks removed while listing are skipped.
    ///
    /// # Errors
    /// `ZooKeeper`; `Corrupt` for a child that is not a ledger leaf or an unreadable mark.
    pub async fn list_under_replicated(
        &self,
    ) -> Result<Vec<(LedgerId, Versioned<UnderReplication>)>> {
        let c = &self.inner.client;
        let dir = self.path("underreplication/ledgers");
        let buckets = match c.list_children(&dir).await {
            Ok(b) => b,
            Err(zk::Error::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(zk_err("list", &dir, e)),
        };
        let mut out = Vec::new();
        for b in &buckets {
            let bp = format!("{dir}/{b}");
            let leaves = match c.list_children(&bp).await {
                Ok(l) => l,
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(zk_err("list", &bp, e)),
            };
            for leaf in &leaves {
                let id = ledger_id_of(b, leaf).ok_or_else(|| Error::Corrupt {
                    path: format!("{bp}/{leaf}"),
                    reason: "not an under-replication mark (expected a 16-digit bucket and L + 4 digits)".into(),
                })?;
                match self.read_under_replicated(id).await {
                    Ok(v) => out.push((id, v)),
                    Err(Error::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        out.sort_by_key(|(id, _)| *id);
        Ok(out)
    }

    /// Removes a ledger's mark if it is still at `expected` (BookKeeper
    /// `markLedgerReplicated`): a mark the auditor extended meanwhile stays, for another pass.
    /// A mark already gone is not an error.
    ///
    /// # Errors
    /// `BadVersion`, `ZooKeeper`.
    pub async fn clear_under_replicated(&self, ledger: LedgerId, expected: Version) -> Result<()> {
        match self
            .cas_delete(
                "under-replication mark",
                &ledger.to_string(),
                &self.under_replicated_path(ledger),
                expected,
            )
            .await
        {
            Ok(()) | Err(Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Claims a marked ledger for one worker (BookKeeper's `locks/urL...`): creates the
    /// ephemeral lock node holding `owner`. `None` when another worker holds it.
    ///
    /// # Errors
    /// `ZooKeeper`.
    pub async fn try_lock_under_replicated(
        &self,
        ledger: LedgerId,
        owner: &str,
    ) -> Result<Option<ReplicationLock>> {
        let c = &self.inner.client;
        let p = self.replication_lock_path(ledger);
        for _ in 0..2 {
            match c.create(&p, owner.as_bytes(), &self.ephemeral()).await {
                Ok(_) => {
                    return Ok(Some(ReplicationLock { ledger, token: p }));
                }
                Err(zk::Error::NodeExists) => return Ok(None),
                Err(zk::Error::NoNode) => {
                    self.ensure_dir(&self.path("underreplication/locks"))
                        .await?;
                }
                Err(e) => return Err(zk_err("create", &p, e)),
            }
        }
        Err(zk_err("create", &p, zk::Error::NoNode))
    }

    /// Releases a worker's claim; a lock already gone (expired session) is not an error.
    ///
    /// # Errors
    /// `ZooKeeper`.
    pub async fn release_replication_lock(&self, lock: ReplicationLock) -> Result<()> {
        match self.inner.client.delete(&lock.token, None).await {
            Ok(())
            | Err(zk::Error::NoNode | zk::Error::SessionExpired | zk::Error::ClientClosed) => {
                Ok(())
            }
            Err(e) => Err(zk_err("delete", &lock.token, e)),
        }
    }

    fn decommission_path(&self, bookie: &BookieId) -> Result<String> {
        validate_bookie_id(bookie)?;
        Ok(self.path(&format!("underreplication/decommission/{}", bookie.0)))
    }

    /// Records that `bookie` is being decommissioned (`underreplication/decommission/<id>`,
    /// persistent, holding the start time in milliseconds since the Unix epoch as JSON):
    /// replication workers then treat its replicas as lost even while it is registered.
    /// Returns `false` when it already was (a resumed decommission).
    ///
    /// # Errors
    /// `Invalid` for a bad bookie id, `ZooKeeper`.
    pub async fn start_decommission(&self, bookie: &BookieId) -> Result<bool> {
        let p = self.decommission_path(bookie)?;
        let record = Decommission {
            start_ms: now_ms(),
            ..Decommission::default()
        };
        let data = to_json("decommission record", &record)?;
        for _ in 0..2 {
            match self
                .inner
                .client
                .create(&p, &data, &self.persistent())
                .await
            {
                Ok(_) => return Ok(true),
                Err(zk::Error::NodeExists) => return Ok(false),
                Err(zk::Error::NoNode) => {
                    self.ensure_dir(&self.path("underreplication/decommission"))
                        .await?
                }
                Err(e) => return Err(zk_err("create", &p, e)),
            }
        }
        Err(zk_err("create", &p, zk::Error::NoNode))
    }

    /// A one-shot ZooKeeper watch for a running bookie to follow the decommission records:
    /// it completes when a record is created or deleted (`underreplication/decommission`'s
    /// children change; progress updates of a record's data do not wake it), when that
    /// directory is created if it is missing, or when the session ends. Arm it, then read the
    /// records: a change after the read completes it, so none is missed (ZooKeeper's watch
    /// rule: set by the read, fired once by the next change).
    ///
    /// # Errors
    /// `ZooKeeper` (the watch could not be set).
    pub async fn watch_decommissions(
        &self,
    ) -> Result<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
        let dir = self.path("underreplication/decommission");
        let c = &self.inner.client;
        let watcher = match c.list_and_watch_children(&dir).await {
            Ok((_, w)) => w,
            Err(zk::Error::NoNode) => {
                let (stat, w) = c
                    .check_and_watch_stat(&dir)
                    .await
                    .map_err(|e| zk_err("exists", &dir, e))?;
                if stat.is_some() {
                    // Created between the two reads: wake at once, the caller arms again.
                    return Ok(Box::pin(std::future::ready(())));
                }
                w
            }
            Err(e) => return Err(zk_err("list", &dir, e)),
        };
        Ok(Box::pin(async move {
            watcher.changed().await;
        }))
    }

    /// The bookies being decommissioned, sorted.
    ///
    /// # Errors
    /// `ZooKeeper`.
    pub async fn decommissioning(&self) -> Result<Vec<BookieId>> {
        let dir = self.path("underreplication/decommission");
        match self.list_children(&dir).await {
            Ok(mut c) => {
                c.sort();
                Ok(c.into_iter().map(BookieId).collect())
            }
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(zk_err("list", &dir, e)),
        }
    }

    /// The decommissions under way with their records (a node gone meanwhile is skipped).
    ///
    /// # Errors
    /// `Corrupt`, `ZooKeeper`.
    pub async fn decommissions(&self) -> Result<Vec<(BookieId, Decommission)>> {
        let mut out = Vec::new();
        for bookie in self.decommissioning().await? {
            let p = self.decommission_path(&bookie)?;
            match self.get_data(&p).await {
                Ok((bytes, _)) => out.push((bookie, from_json(&p, &bytes)?)),
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(zk_err("get", &p, e)),
            }
        }
        Ok(out)
    }

    /// Adds a worker's copy to `bookie`'s decommission record by compare-and-set (retried on
    /// a concurrent change); no record is not an error.
    ///
    /// # Errors
    /// `Invalid`, `Corrupt`, `ZooKeeper`.
    pub async fn record_decommission_copy(
        &self,
        bookie: &BookieId,
        bytes: u64,
        entries: u64,
    ) -> Result<()> {
        let c = &self.inner.client;
        let p = self.decommission_path(bookie)?;
        for _ in 0..MARK_ATTEMPTS_MAX {
            let (data, stat) = match c.get_data(&p).await {
                Ok(v) => v,
                Err(zk::Error::NoNode) => return Ok(()),
                Err(e) => return Err(zk_err("get", &p, e)),
            };
            let mut record: Decommission = from_json(&p, &data)?;
            record.bytes_copied = record.bytes_copied.saturating_add(bytes);
            record.entries_copied = record.entries_copied.saturating_add(entries);
            let data = to_json("decommission record", &record)?;
            match c.set_data(&p, &data, Some(stat.version)).await {
                Ok(_) => return Ok(()),
                Err(zk::Error::BadVersion) => continue,
                Err(zk::Error::NoNode) => return Ok(()),
                Err(e) => return Err(zk_err("set", &p, e)),
            }
        }
        Err(zk_err("set", &p, zk::Error::BadVersion))
    }

    /// Ends a decommission (deletes its node; already gone is not an error).
    ///
    /// # Errors
    /// `Invalid`, `ZooKeeper`.
    pub async fn end_decommission(&self, bookie: &BookieId) -> Result<()> {
        let p = self.decommission_path(bookie)?;
        match self.inner.client.delete(&p, None).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(zk_err("delete", &p, e)),
        }
    }

    /// Deletes a bookie's cookie at `expected` (BookKeeper `cookie_delete`, the last step of
    /// a decommission: the bookie's directories can then be wiped and reused).
    ///
    /// # Errors
    /// `Invalid`, `NotFound`, `BadVersion`, `ZooKeeper`.
    pub async fn delete_cookie(&self, bookie: &BookieId, expected: Version) -> Result<()> {
        validate_bookie_id(bookie)?;
        self.cas_delete(
            "cookie",
            &bookie.0,
            &self.path(&format!("cookies/{}", bookie.0)),
            expected,
        )
        .await
    }

    /// Enters the auditor election as `name` (BookKeeper `AuditorElector.submitElectionTask`):
    /// creates an ephemeral-sequential `underreplication/auditorelection/V_` node holding it.
    ///
    /// # Errors
    /// `ZooKeeper`.
    pub async fn join_auditor_election(&self, name: &str) -> Result<AuditorCandidate> {
        let c = &self.inner.client;
        let dir = self.path("underreplication/auditorelection");
        let prefix = format!("{dir}/{ELECTION_PREFIX}");
        for _ in 0..2 {
            match c
                .create(&prefix, name.as_bytes(), &self.ephemeral_sequential())
                .await
            {
                Ok((_, seq)) => {
                    return Ok(AuditorCandidate {
                        store: self.clone(),
                        path: format!("{prefix}{seq}"),
                        name: name.to_string(),
                    })
                }
                Err(zk::Error::NoNode) => self.ensure_dir(&dir).await?,
                Err(e) => return Err(zk_err("create", &prefix, e)),
            }
        }
        Err(zk_err("create", &prefix, zk::Error::NoNode))
    }

    /// The election's children, sorted by sequence number (the first is the auditor).
    async fn election_children(&self) -> Result<Vec<String>> {
        let dir = self.path("underreplication/auditorelection");
        let mut children = match self.list_children(&dir).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(zk_err("list", &dir, e)),
        };
        children.retain(|c| c.starts_with(ELECTION_PREFIX));
        children.sort_by_key(|c| election_seq(c));
        Ok(children)
    }

    /// The candidates in election order and the ledgers workers hold: who the auditor is
    /// (the first candidate) and what is being re-replicated now.
    ///
    /// # Errors
    /// `ZooKeeper`; `Corrupt` for a node whose data is not UTF-8.
    pub async fn autorecovery_state(&self) -> Result<AutorecoveryState> {
        let c = &self.inner.client;
        let mut state = AutorecoveryState::default();
        let dir = self.path("underreplication/auditorelection");
        for child in self.election_children().await? {
            let p = format!("{dir}/{child}");
            match c.get_data(&p).await {
                Ok((bytes, _)) => state.candidates.push(utf8(&p, bytes)?),
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(zk_err("get", &p, e)),
            }
        }
        let dir = self.path("underreplication/locks");
        let locks = match c.list_children(&dir).await {
            Ok(l) => l,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(zk_err("list", &dir, e)),
        };
        for child in locks {
            let Some(id) = child.strip_prefix('L').and_then(|d| d.parse().ok()) else {
                continue;
            };
            let p = format!("{dir}/{child}");
            match c.get_data(&p).await {
                Ok((bytes, _)) => state.locks.push((LedgerId(id), utf8(&p, bytes)?)),
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(zk_err("get", &p, e)),
            }
        }
        state.locks.sort();
        Ok(state)
    }
}

fn utf8(path: &str, bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).map_err(|_| Error::Corrupt {
        path: path.to_string(),
        reason: "not UTF-8".into(),
    })
}

impl AuditorCandidate {
    /// The identity this candidate entered with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits until this candidate is the auditor: its node is the lowest. Each round watches
    /// the node just before its own (no herd on the auditor's node), as BookKeeper's and
    /// ZooKeeper's leader-election recipe does.
    ///
    /// # Errors
    /// `ZooKeeper`, among them when the session is lost or the node was deleted (by an
    /// operator): the candidate must then enter again with a new session.
    pub async fn wait_until_elected(&self) -> Result<()> {
        let c = &self.store.inner.client;
        let mine = self.path.rsplit('/').next().unwrap_or_default().to_string();
        let dir = self.path[..self.path.len() - mine.len() - 1].to_string();
        let mut lost = self.store.session_lost();
        loop {
            let children = self.store.election_children().await?;
            let Some(at) = children.iter().position(|c| *c == mine) else {
                return Err(zk_err("auditor election", &self.path, zk::Error::NoNode));
            };
            if at == 0 {
                return Ok(());
            }
            let before = format!("{dir}/{}", children[at - 1]);
            let (stat, watcher) = match c.check_and_watch_stat(&before).await {
                Ok(x) => x,
                Err(e) => return Err(zk_err("exists", &before, e)),
            };
            if stat.is_none() {
                continue;
            }
            tokio::select! {
                _ = watcher.changed() => {}
                _ = lost.wait_for(|l| *l) => {
                    return Err(zk_err("auditor election", &self.path, zk::Error::SessionExpired));
                }
                // Connection trouble can swallow a watch event: look again now and then.
                () = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
        }
    }

    /// Whether this candidate's node still exists and is the lowest.
    ///
    /// # Errors
    /// `ZooKeeper`.
    pub async fn is_elected(&self) -> Result<bool> {
        let children = self.store.election_children().await?;
        Ok(children
            .first()
            .is_some_and(|c| self.path.ends_with(&format!("/{c}"))))
    }

    /// Leaves the election (deletes the node); an auditor hands over at once.
    ///
    /// # Errors
    /// `ZooKeeper`.
    pub async fn resign(self) -> Result<()> {
        match self.store.inner.client.delete(&self.path, None).await {
            Ok(())
            | Err(zk::Error::NoNode | zk::Error::SessionExpired | zk::Error::ClientClosed) => {
                Ok(())
            }
            Err(e) => Err(zk_err("delete", &self.path, e)),
        }
    }
}

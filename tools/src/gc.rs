//! The metadata side of the bookie.
//!
//! [`answer_ledger_keys`] tells the shards whether a ledger exists and with which master key,
//! before a key binds on a bookie (docs/protocol.md §Add, "When a key binds").
//!
//! [`answer_deleted_ledgers`] answers garbage collection's "which of these ledgers are
//! deleted?" ([`quire_bookie::DeletedLedgersQuery`]) by reading each candidate's metadata
//! (BookKeeper's `verifyMetadataOnGC`: every candidate is re-read on its own). Only a
//! definite "no such ledger" counts as deleted: a read that fails, times out, or comes from a
//! store that failed earlier in the same answer leaves the ledger out, so a metadata outage
//! can never delete data. Nor does an id at or above the ledger id counter: it was never
//! allocated, and tombstoning it would make the bookie refuse the real ledger that gets the id
//! later. Since keys bind only for ledgers the store holds, no new state arises for such ids;
//! only state left by a version before that rule can be there (ARCHITECTURE.md, "Ledger ids
//! nobody can squat or fill").

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use quire_bookie::{DeletedLedgersQueries, DeletedLedgersQuery};
use quire_metadata::MetadataStore;

/// Longest wait for one ledger's metadata read.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between two metadata reads (BookKeeper `gcMetadataOpRateLimit`, 1000 per second).
const READ_PAUSE: Duration = Duration::from_millis(1);

/// Makes a (new) connection to the metadata store, e.g. after a ZooKeeper session expired.
pub type Connect = Box<
    dyn Fn() -> Pin<Box<dyn Future<Output = anyhow::Result<Arc<dyn MetadataStore>>> + Send>>
        + Send
        + Sync,
>;

/// Answers every query until all bookies holding the sending end stopped. `store` is used
/// until a read fails other than with "not found"; the next query then connects anew.
pub async fn answer_deleted_ledgers(
    queries: DeletedLedgersQueries,
    store: Arc<dyn MetadataStore>,
    connect: Connect,
) {
    let mut store = Some(store);
    while let Some(q) = queries.next().await {
        if store.is_none() {
            match connect().await {
                Ok(s) => store = Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "GC: metadata store unreachable; no ledger deleted this run");
                    drop(q);
                    continue;
                }
            }
        }
        let s = store.clone().expect("connected above");
        let (deleted, healthy) = deleted_among(&*s, &q).await;
        if !healthy {
            store = None;
        }
        q.answer(deleted);
    }
}

/// The candidates of `q` whose metadata read answered "not found", and whether every read
/// got an answer.
async fn deleted_among(store: &dyn MetadataStore, q: &DeletedLedgersQuery) -> (Vec<u64>, bool) {
    // Read before the candidates: an id at or above it is not yet allocated at this moment.
    let next_id = match tokio::time::timeout(READ_TIMEOUT, store.next_ledger_id()).await {
        Ok(Ok(id)) => id.0,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "GC: ledger id counter read failed; no ledger deleted this run");
            return (Vec::new(), false);
        }
        Err(_) => {
            tracing::warn!("GC: ledger id counter read timed out; no ledger deleted this run");
            return (Vec::new(), false);
        }
    };
    let mut deleted = Vec::new();
    for &id in q.candidates.iter().filter(|&&id| id < next_id) {
        match tokio::time::timeout(READ_TIMEOUT, store.read_ledger(quire_wire::LedgerId(id))).await
        {
            Ok(Ok(_)) => {}
            Ok(Err(quire_metadata::Error::NotFound { .. })) => deleted.push(id),
            Ok(Err(e)) => {
                tracing::warn!(ledger = id, error = %e, "GC: ledger metadata read failed; no ledger deleted this run");
                return (Vec::new(), false);
            }
            Err(_) => {
                tracing::warn!(
                    ledger = id,
                    "GC: ledger metadata read timed out; no ledger deleted this run"
                );
                return (Vec::new(), false);
            }
        }
        tokio::time::sleep(READ_PAUSE).await;
    }
    (deleted, true)
}

/// Metadata reads of [`answer_ledger_keys`] in flight at most: a client that adds to many
/// unknown ledger ids at once costs the metadata store this many reads at a time, and its
/// requests wait (then `TooManyRequests`) rather than the store.
const KEY_READS_IN_FLIGHT_MAX: usize = 64;

/// Answers the shards' "does ledger L exist, and with which master key?"
/// ([`quire_bookie::LedgerKeyQuery`], asked before a key binds on a bookie) until every bookie
/// holding the sending end stopped, each question on a task of its own (at most
/// [`KEY_READS_IN_FLIGHT_MAX`] at once). "No such ledger" is said only after a "not found"
/// read again after a sync ([`MetadataStore::read_ledger_synced`]: a ZooKeeper follower behind
/// the leader cannot deny a ledger another session just created); a failed or timed-out read, or a key that is not
/// 40 hex digits, is `Unavailable` (the bookie answers `TooManyRequests` and binds nothing).
/// `store` is used until a read fails other than with "not found" (an expired ZooKeeper
/// session, say, after the process was stopped longer than its session timeout): the question
/// is then asked once more on a new connection, which the next questions share, and only a
/// second failure is `Unavailable`. Answering the first failure would turn the first add of
/// every new ledger on a bookie that just came back into `TooManyRequests`, which the writer
/// takes as a failed bookie (an ensemble change away from a healthy one).
pub async fn answer_ledger_keys(
    queries: quire_bookie::LedgerKeyQueries,
    store: Arc<dyn MetadataStore>,
    connect: Connect,
) {
    let connection = Arc::new(KeyStore {
        current: tokio::sync::Mutex::new(Some(store)),
        connect,
    });
    let reads = Arc::new(tokio::sync::Semaphore::new(KEY_READS_IN_FLIGHT_MAX));
    while let Some(q) = queries.next().await {
        let Ok(permit) = reads.clone().acquire_owned().await else {
            return;
        };
        let connection = connection.clone();
        tokio::spawn(async move {
            let id = quire_wire::LedgerId(q.ledger);
            let answer = match connection.store(None).await {
                Err(e) => Err(e),
                Ok(s) => match key_of(&*s, id).await {
                    Err(e) => {
                        tracing::warn!(ledger = q.ledger, error = %e, "ledger keys: metadata read failed; asking again on a new connection");
                        match connection.store(Some(&s)).await {
                            Ok(fresh) => key_of(&*fresh, id).await,
                            Err(e) => Err(e),
                        }
                    }
                    answer => answer,
                },
            };
            let answer = answer.unwrap_or_else(|e| {
                tracing::warn!(ledger = q.ledger, error = %e, "ledger keys: no answer");
                quire_bookie::LedgerKeyAnswer::Unavailable(e)
            });
            q.answer(answer);
            drop(permit);
        });
    }
}

/// The metadata-store connection [`answer_ledger_keys`] shares between its questions.
struct KeyStore {
    current: tokio::sync::Mutex<Option<Arc<dyn MetadataStore>>>,
    connect: Connect,
}

impl KeyStore {
    /// The connection to ask on; with `failed`, one that is not `failed` (a new connection,
    /// unless another question replaced it already). `Err` when connecting fails.
    async fn store(
        &self,
        failed: Option<&Arc<dyn MetadataStore>>,
    ) -> Result<Arc<dyn MetadataStore>, String> {
        let mut current = self.current.lock().await;
        let stale = match (current.as_ref(), failed) {
            (None, _) => true,
            (Some(c), Some(f)) => Arc::ptr_eq(c, f),
            (Some(_), None) => false,
        };
        if stale {
            *current = None;
            match (self.connect)().await {
                Ok(s) => *current = Some(s),
                Err(e) => return Err(format!("metadata store unreachable: {e}")),
            }
        }
        Ok(current.clone().expect("connected above"))
    }
}

/// One ledger's key as the metadata store holds it. A plain read first (the writer's ledger is
/// there: one read, no sync); only a "not found" is checked again after a sync, as it may come
/// from a follower behind the leader. `Err` when the store failed (worth a new connection);
/// a timeout or a key that is not 40 hex digits is `Ok(Unavailable)`.
async fn key_of(
    store: &dyn MetadataStore,
    id: quire_wire::LedgerId,
) -> Result<quire_bookie::LedgerKeyAnswer, String> {
    use quire_bookie::LedgerKeyAnswer;
    let read = async {
        match store.read_ledger(id).await {
            Err(quire_metadata::Error::NotFound { .. }) => store.read_ledger_synced(id).await,
            other => other,
        }
    };
    match tokio::time::timeout(READ_TIMEOUT, read).await {
        Ok(Ok(meta)) => Ok(match meta.value.master_key() {
            Ok(k) => LedgerKeyAnswer::Exists { master_key: k.0 },
            Err(e) => {
                tracing::warn!(ledger = id.0, error = %e, "ledger keys: the ledger's metadata holds no readable master key");
                LedgerKeyAnswer::Unavailable(e.to_string())
            }
        }),
        Ok(Err(quire_metadata::Error::NotFound { .. })) => Ok(LedgerKeyAnswer::NoSuchLedger),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Ok(LedgerKeyAnswer::Unavailable(format!(
            "metadata read timed out after {READ_TIMEOUT:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_metadata::{
        BookieId, DigestType, EmbeddedStore, Fragment, LedgerMetadata, LedgerState,
        LEDGER_METADATA_FORMAT_VERSION,
    };

    #[test]
    fn key_questions_get_the_metadata_key_or_a_definite_no() {
        // Goal: a ledger with metadata is answered with its key, one without with
        // NoSuchLedger, one whose key is not 40 hex digits with Unavailable (never a refusal
        // that could be wrong). Method: an embedded store with two ledgers, one of them with a
        // broken key, asked through the bookie's channel.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir_in("/tmp").unwrap();
            let store = EmbeddedStore::open(&dir.path().join("m")).unwrap();
            let key = quire_wire::MasterKey([0x3c; 20]);
            let mut meta = LedgerMetadata {
                format_version: LEDGER_METADATA_FORMAT_VERSION,
                ensemble_size: 1,
                write_quorum: 1,
                ack_quorum: 1,
                state: LedgerState::Open,
                fragments: vec![Fragment {
                    first_entry: 0,
                    bookies: vec![BookieId("127.0.0.1:1".into())],
                }],
                last_entry: None,
                length_bytes: 0,
                digest_type: DigestType::Crc32c,
                master_key_hex: quire_metadata::master_key_hex(&key),
                creation_time_ms: 0,
                custom: Default::default(),
            };
            let good = store.allocate_ledger_id().await.unwrap();
            store.create_ledger(good, &meta).await.unwrap();
            let broken = store.allocate_ledger_id().await.unwrap();
            meta.master_key_hex = "not a key".into();
            store.create_ledger(broken, &meta).await.unwrap();
            let store: Arc<dyn MetadataStore> = Arc::new(store);
            let (tx, rx) = quire_bookie::ledger_keys_channel();
            let s2 = store.clone();
            let answerer = tokio::spawn(answer_ledger_keys(
                rx,
                store.clone(),
                Box::new(move || {
                    let s = s2.clone();
                    Box::pin(async move { Ok(s) })
                }),
            ));
            use quire_bookie::LedgerKeyAnswer;
            assert_eq!(
                tx.query(good.0).await,
                Some(LedgerKeyAnswer::Exists { master_key: key.0 })
            );
            assert_eq!(
                tx.query(broken.0 + 1).await,
                Some(LedgerKeyAnswer::NoSuchLedger)
            );
            assert_eq!(tx.query(1 << 62).await, Some(LedgerKeyAnswer::NoSuchLedger));
            assert!(matches!(
                tx.query(broken.0).await,
                Some(LedgerKeyAnswer::Unavailable(_))
            ));
            drop(tx);
            answerer.await.unwrap();
        });
    }

    #[test]
    fn only_ledgers_whose_metadata_is_gone_are_answered_deleted() {
        // Goal: the answer names exactly the allocated candidates with no metadata, never an id
        // the counter has not reached. Method: an embedded store with one ledger created and
        // the next id allocated but never created; ask about both and two ids above the counter
        // through the bookie's channel.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir_in("/tmp").unwrap();
            let store = EmbeddedStore::open(&dir.path().join("m")).unwrap();
            let id = store.allocate_ledger_id().await.unwrap();
            let meta = LedgerMetadata {
                format_version: LEDGER_METADATA_FORMAT_VERSION,
                ensemble_size: 1,
                write_quorum: 1,
                ack_quorum: 1,
                state: LedgerState::Open,
                fragments: vec![Fragment {
                    first_entry: 0,
                    bookies: vec![BookieId("127.0.0.1:1".into())],
                }],
                last_entry: None,
                length_bytes: 0,
                digest_type: DigestType::Crc32c,
                master_key_hex: String::new(),
                creation_time_ms: 0,
                custom: Default::default(),
            };
            store.create_ledger(id, &meta).await.unwrap();
            let missing = store.allocate_ledger_id().await.unwrap();
            // Never allocated: a stranger's fence could have left a state for these.
            let next = store.next_ledger_id().await.unwrap().0;
            assert_eq!(next, missing.0 + 1);
            let store: Arc<dyn MetadataStore> = Arc::new(store);
            let (tx, rx) = quire_bookie::deleted_ledgers_channel();
            let s2 = store.clone();
            let answerer = tokio::spawn(answer_deleted_ledgers(
                rx,
                store.clone(),
                Box::new(move || {
                    let s = s2.clone();
                    Box::pin(async move { Ok(s) })
                }),
            ));
            let got = tx.query(vec![id.0, missing.0, next, next + 30]).await;
            assert_eq!(got, Some(vec![missing.0]));
            drop(tx);
            answerer.await.unwrap();
        });
    }
}

//! Subscriptions (DistributedLog's `SubscriptionsStore`): named reader positions per stream,
//! kept in the metadata store so that any proxy answers them (no ownership, no redirect).
//! A commit only moves forward (`advanceCommitPosition`: a smaller DLSN is a no-op answered
//! with the position in force), applied by compare-and-set on the subscription's record.
//! Lag is computed from the stream's segment metadata as this proxy describes it.

use quire_metadata::{Subscription, TruncationPoint};

use super::StreamManager;
use crate::dlsn::Dlsn;
use crate::error::{Error, FromMetadata, Result};
use quire_client::SubscriptionInfo;

/// Compare-and-set attempts of one commit against concurrent commits of the same name.
const COMMIT_ATTEMPTS_MAX: usize = 16;

/// The commit rule: the position to store when `asked` is committed over `current`, or
/// `None` when nothing changes (`asked` is not after `current`).
pub fn advance(current: Option<Dlsn>, asked: Dlsn) -> Option<Dlsn> {
    match current {
        Some(c) if asked <= c => None,
        _ => Some(asked),
    }
}

/// Records and payload bytes from `committed` (the head when `None`) to the end of the
/// stream, from its segment metadata: whole segments after the committed one count exactly;
/// inside the committed segment the share of its entries from the committed entry on is
/// taken (records per entry assumed even; the slot is not counted).
pub fn lag(meta: &quire_metadata::StreamMetadata, committed: Option<Dlsn>) -> (u64, u64) {
    let mut records = 0u64;
    let mut bytes = 0u64;
    for s in &meta.segments {
        let share = match committed {
            None => (1, 1),
            Some(c) if s.seq_no > c.segment_seq_no => (1, 1),
            Some(c) if s.seq_no < c.segment_seq_no => (0, 1),
            // The entries holding records: a control entry after the last record (an idle
            // writer's, or the end-of-stream marker) holds none.
            Some(c) => match s.last_record_entry.or(s.last_entry) {
                Some(last) => (
                    last.saturating_add(1).saturating_sub(c.entry_id),
                    last.saturating_add(1),
                ),
                None => (0, 1),
            },
        };
        let part = |v: u64| (u128::from(v) * u128::from(share.0) / u128::from(share.1)) as u64;
        records = records.saturating_add(part(s.record_count));
        bytes = bytes.saturating_add(part(s.length_bytes));
    }
    (records, bytes)
}

fn to_dlsn(t: TruncationPoint) -> Dlsn {
    Dlsn::new(t.segment_seq_no, t.entry_id, t.slot_index)
}

fn to_point(d: Dlsn) -> TruncationPoint {
    TruncationPoint {
        segment_seq_no: d.segment_seq_no,
        entry_id: d.entry_id,
        slot_index: d.slot_index,
    }
}

/// A metadata error of a subscription call: a bad subscription name is the client's
/// `BadRequest`; the rest as for streams.
fn sub_err(stream: &str, op: &'static str, e: quire_metadata::Error) -> Error {
    match e {
        quire_metadata::Error::Invalid {
            what: "subscription name",
            reason,
        } => Error::BadRequest { reason },
        other => Error::from_metadata(stream, op, other),
    }
}

impl StreamManager {
    /// Commits `position` for subscription `name` of `stream` (created on first commit) and
    /// returns the subscription in force with its lag. Forward only: a position at or before
    /// the committed one changes nothing.
    ///
    /// # Errors
    /// `NoSuchStream`, `InvalidStreamName`, `BadRequest` (a bad name, or a position past the
    /// segment after the last one), `Metadata`.
    pub async fn commit_subscription(
        &self,
        stream: &str,
        name: &str,
        position: Dlsn,
    ) -> Result<SubscriptionInfo> {
        let info = self.describe(stream).await?;
        let last_seq = info.metadata.segments.last().map_or(0, |s| s.seq_no);
        if position.segment_seq_no > last_seq + 1 {
            return Err(Error::BadRequest {
                reason: format!(
                    "cannot commit {position} for subscription {name:?}: stream {stream:?} has no segment {} yet",
                    position.segment_seq_no
                ),
            });
        }
        let store = &self.registry.metadata;
        for _ in 0..COMMIT_ATTEMPTS_MAX {
            let current = match store.read_subscription(stream, name).await {
                Ok(v) => Some(v),
                Err(quire_metadata::Error::NotFound { .. }) => None,
                Err(e) => return Err(sub_err(stream, "read subscription", e)),
            };
            if current.is_none() {
                self.check_subscription_cap(stream, name).await?;
            }
            let in_force = current.as_ref().map(|v| to_dlsn(v.value.committed));
            let Some(next) = advance(in_force, position) else {
                let sub = current.expect("a no-op needs a committed position").value;
                return Ok(self.info(&info.metadata, name, Some(sub)));
            };
            let sub = Subscription {
                committed: to_point(next),
                commit_time_ms: quire_clock::unix_ms(),
            };
            match store
                .write_subscription(stream, name, &sub, current.map(|v| v.version))
                .await
            {
                Ok(_) => return Ok(self.info(&info.metadata, name, Some(sub))),
                // Another commit of the same name won the race: read it and decide again.
                Err(
                    quire_metadata::Error::BadVersion { .. }
                    | quire_metadata::Error::AlreadyExists { .. },
                ) => continue,
                Err(e) => return Err(sub_err(stream, "commit subscription", e)),
            }
        }
        Err(Error::Internal(format!(
            "subscription {name:?} of stream {stream:?} changed {COMMIT_ATTEMPTS_MAX} times during one commit"
        )))
    }

    /// Refuses a new subscription `name` when `stream` has
    /// [`super::StreamConfig::subscriptions_per_stream_max`] already. Two first commits of new
    /// names racing on two proxies may both pass: the cap bounds growth, not an exact count.
    ///
    /// # Errors
    /// `TooManySubscriptions`, `Metadata`.
    async fn check_subscription_cap(&self, stream: &str, name: &str) -> Result<()> {
        let max = self.registry.config.subscriptions_per_stream_max;
        let have = self
            .registry
            .metadata
            .list_subscriptions(stream)
            .await
            .map_err(|e| sub_err(stream, "list subscriptions", e))?
            .len();
        if have >= max {
            return Err(Error::TooManySubscriptions {
                stream: stream.to_string(),
                name: name.to_string(),
                max,
            });
        }
        Ok(())
    }

    /// Subscription `name` of `stream` with its lag; `committed: None` when there is none.
    ///
    /// # Errors
    /// `NoSuchStream`, `InvalidStreamName`, `BadRequest` (a bad name), `Metadata`.
    pub async fn subscription(&self, stream: &str, name: &str) -> Result<SubscriptionInfo> {
        let info = self.describe(stream).await?;
        let sub = match self.registry.metadata.read_subscription(stream, name).await {
            Ok(v) => Some(v.value),
            Err(quire_metadata::Error::NotFound { .. }) => None,
            Err(e) => return Err(sub_err(stream, "read subscription", e)),
        };
        Ok(self.info(&info.metadata, name, sub))
    }

    /// Every subscription of `stream`, sorted by name, with lag.
    ///
    /// # Errors
    /// `NoSuchStream`, `InvalidStreamName`, `Metadata`.
    pub async fn list_subscriptions(&self, stream: &str) -> Result<Vec<SubscriptionInfo>> {
        let info = self.describe(stream).await?;
        let subs = self
            .registry
            .metadata
            .list_subscriptions(stream)
            .await
            .map_err(|e| sub_err(stream, "list subscriptions", e))?;
        Ok(subs
            .into_iter()
            .map(|(name, sub)| self.info(&info.metadata, &name, Some(sub)))
            .collect())
    }

    /// Deletes subscription `name` of `stream`; `false` when there was none.
    ///
    /// # Errors
    /// `NoSuchStream`, `InvalidStreamName`, `BadRequest` (a bad name), `Metadata`.
    pub async fn delete_subscription(&self, stream: &str, name: &str) -> Result<bool> {
        quire_metadata::validate_stream_name(stream)
            .map_err(|e| Error::from_metadata(stream, "delete subscription", e))?;
        match self
            .registry
            .metadata
            .delete_subscription(stream, name)
            .await
        {
            Ok(()) => Ok(true),
            Err(quire_metadata::Error::NotFound { .. }) => {
                // Say NoSuchStream rather than "nothing deleted" for a missing stream.
                self.describe(stream).await?;
                Ok(false)
            }
            Err(e) => Err(sub_err(stream, "delete subscription", e)),
        }
    }

    fn info(
        &self,
        meta: &quire_metadata::StreamMetadata,
        name: &str,
        sub: Option<Subscription>,
    ) -> SubscriptionInfo {
        let committed = sub.map(|s| to_dlsn(s.committed));
        let (lag_records, lag_bytes) = lag(meta, committed);
        SubscriptionInfo {
            name: name.to_string(),
            committed,
            commit_time_ms: sub.map(|s| s.commit_time_ms),
            lag_records,
            lag_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_metadata::{SegmentMetadata, SegmentState, StreamMetadata};

    #[test]
    fn commit_moves_forward_only() {
        // Goal: DistributedLog's advanceCommitPosition rule: the first commit is stored, a
        // later position replaces it, an equal or earlier one changes nothing.
        let d = Dlsn::new;
        assert_eq!(advance(None, d(1, 0, 0)), Some(d(1, 0, 0)));
        assert_eq!(advance(Some(d(1, 5, 0)), d(1, 5, 1)), Some(d(1, 5, 1)));
        assert_eq!(advance(Some(d(1, 5, 0)), d(2, 0, 0)), Some(d(2, 0, 0)));
        assert_eq!(advance(Some(d(1, 5, 0)), d(1, 5, 0)), None);
        assert_eq!(advance(Some(d(2, 0, 0)), d(1, 9, 9)), None);
    }

    fn seg(seq_no: u64, last_entry: Option<u64>, records: u64, bytes: u64) -> SegmentMetadata {
        SegmentMetadata {
            seq_no,
            ledger_id: seq_no,
            state: SegmentState::Completed,
            first_txid: None,
            last_txid: None,
            last_entry,
            record_count: records,
            length_bytes: bytes,
            completion_time_ms: None,
            first_write_time_ms: None,
            last_write_time_ms: None,
            last_record_entry: None,
            last_record_slot: None,
        }
    }

    #[test]
    fn lag_counts_whole_segments_and_a_share_of_the_committed_one() {
        // Goal: lag from the segment metadata: everything when nothing is committed, whole
        // later segments, the committed segment's remaining share of entries, nothing before.
        let meta = StreamMetadata {
            name: "s".into(),
            segments: vec![
                seg(1, Some(9), 100, 1000),
                seg(2, Some(3), 40, 400),
                seg(3, None, 0, 0),
            ],
            max_txid: None,
            creation_time_ms: 0,
            truncated_before: None,
            retention: Default::default(),
            ledger_secret_hex: None,
            sealed: false,
            compression: None,
            limits: None,
            home_region: None,
            placement: None,
        };
        assert_eq!(lag(&meta, None), (140, 1400));
        // A control entry after the last record (entry 1 here) holds no record: committed past
        // the last record, nothing is left.
        let mut idle = meta.clone();
        idle.segments.truncate(1);
        idle.segments[0].last_entry = Some(1);
        idle.segments[0].last_record_entry = Some(0);
        assert_eq!(lag(&idle, Some(Dlsn::new(1, 1, 0))), (0, 0));
        assert_eq!(lag(&meta, Some(Dlsn::new(1, 0, 0))), (140, 1400));
        assert_eq!(lag(&meta, Some(Dlsn::new(1, 5, 0))), (90, 900));
        assert_eq!(lag(&meta, Some(Dlsn::new(2, 0, 0))), (40, 400));
        assert_eq!(lag(&meta, Some(Dlsn::new(2, 4, 0))), (0, 0));
        assert_eq!(lag(&meta, Some(Dlsn::new(3, 0, 0))), (0, 0));
        assert_eq!(lag(&meta, Some(Dlsn::new(9, 0, 0))), (0, 0));
    }
}

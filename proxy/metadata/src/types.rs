//! The records the metadata store keeps. They serialize with serde; the embedded store writes
//! them as JSON (see `docs/format/metadata.md`).

use std::collections::BTreeMap;

use quire_wire::{EntryId, MasterKey};
use serde::{Deserialize, Serialize};

use crate::Error;

/// A bookie's identity: its advertised `host:port` (BookKeeper's default bookie id).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BookieId(pub String);

impl std::fmt::Display for BookieId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One entry of the bookie registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BookieInfo {
    /// Identity, also the address clients connect to.
    pub id: BookieId,
    /// Optional rack label for placement (none: BookKeeper's `/default-rack`).
    pub rack: Option<String>,
    /// Optional region label for placement (none: BookKeeper's `default-region`); absent in
    /// records written before regions, which read as none.
    pub region: Option<String>,
    /// A read-only bookie serves reads but takes no new ledgers.
    pub read_only: bool,
}

/// One registry entry with the identity of the registration that holds it, so that a client
/// can tell a bookie that registered anew (restarted, or moved between writable and read-only)
/// from one whose registration merely persists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BookieRegistration {
    /// What the bookie registered.
    pub info: BookieInfo,
    /// Differs between two registrations of the same bookie: the creation zxid of its
    /// ephemeral znode in ZooKeeper (a new session or a move between `available` and
    /// `readonly` creates a new node), a per-store counter of `register_bookie` calls in the
    /// embedded store. `None` where a store cannot tell.
    pub epoch: Option<u64>,
}

/// Ledger lifecycle (BookKeeper `LedgerMetadata.State`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LedgerState {
    /// A writer may be adding entries.
    Open,
    /// A recoverer has fenced the ledger and is closing it.
    InRecovery,
    /// Sealed: `last_entry` and `length_bytes` are final.
    Closed,
}

/// Entry digest type (BookKeeper `DigestType`); Quire writes only CRC32C.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DigestType {
    /// CRC32C over the entry header and payload.
    Crc32c,
}

/// One fragment of a ledger: the ensemble that holds entries from `first_entry` on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fragment {
    /// First entry id written to this ensemble.
    pub first_entry: u64,
    /// Bookies by ensemble position; entry e goes to positions (e + i) mod E, i < Qw.
    pub bookies: Vec<BookieId>,
}

/// Ledger metadata (BookKeeper `LedgerMetadata`).
/// `Debug` prints `master_key_hex` as `<redacted>`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerMetadata {
    /// Metadata layout version of this record.
    pub format_version: u32,
    /// Ensemble size E.
    pub ensemble_size: u8,
    /// Write quorum Qw.
    pub write_quorum: u8,
    /// Ack quorum Qa.
    pub ack_quorum: u8,
    /// Lifecycle state.
    pub state: LedgerState,
    /// Fragments in entry order; the first starts at entry 0.
    pub fragments: Vec<Fragment>,
    /// Last entry of a closed ledger (`None` for an empty or open one).
    pub last_entry: Option<u64>,
    /// Payload bytes of a closed ledger.
    pub length_bytes: u64,
    /// Digest of every entry.
    pub digest_type: DigestType,
    /// The master key, which a recoverer presents to fence and re-add: SHA-1("ledger" ‖
    /// secret ‖ ledger id big-endian) from the writer's secret (`ledger_secret_hex` of its
    /// stream), or SHA-1("ledger" ‖ "quire") in ledgers written before secrets existed.
    pub master_key_hex: String,
    /// Milliseconds since the Unix epoch.
    pub creation_time_ms: u64,
    /// Free-form labels (e.g. the stream a segment belongs to).
    pub custom: BTreeMap<String, String>,
}

impl std::fmt::Debug for LedgerMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerMetadata")
            .field("format_version", &self.format_version)
            .field("ensemble_size", &self.ensemble_size)
            .field("write_quorum", &self.write_quorum)
            .field("ack_quorum", &self.ack_quorum)
            .field("state", &self.state)
            .field("fragments", &self.fragments)
            .field("last_entry", &self.last_entry)
            .field("length_bytes", &self.length_bytes)
            .field("digest_type", &self.digest_type)
            .field("master_key_hex", &"<redacted>")
            .field("creation_time_ms", &self.creation_time_ms)
            .field("custom", &self.custom)
            .finish()
    }
}

/// Current ledger metadata layout version.
pub const LEDGER_METADATA_FORMAT_VERSION: u32 = 1;

impl LedgerMetadata {
    /// Checks E >= Qw >= Qa >= 1 and that every fragment has E bookies (BookKeeper's
    /// ledger-creation rule).
    ///
    /// # Errors
    /// `Invalid` naming the broken rule.
    pub fn validate(&self) -> Result<(), Error> {
        let (e, w, a) = (self.ensemble_size, self.write_quorum, self.ack_quorum);
        if !(e >= w && w >= a && a >= 1) {
            return Err(Error::Invalid {
                what: "ledger quorum",
                reason: format!("need E >= Qw >= Qa >= 1, got E={e} Qw={w} Qa={a}"),
            });
        }
        if self.fragments.is_empty() || self.fragments[0].first_entry != 0 {
            return Err(Error::Invalid {
                what: "ledger fragments",
                reason: "first fragment must start at entry 0".into(),
            });
        }
        for f in &self.fragments {
            if f.bookies.len() != usize::from(e) {
                return Err(Error::Invalid {
                    what: "ledger fragments",
                    reason: format!(
                        "fragment at {} has {} bookies, E={e}",
                        f.first_entry,
                        f.bookies.len()
                    ),
                });
            }
        }
        if self
            .fragments
            .windows(2)
            .any(|w| w[0].first_entry >= w[1].first_entry)
        {
            return Err(Error::Invalid {
                what: "ledger fragments",
                reason: "fragments out of order".into(),
            });
        }
        Ok(())
    }

    /// The fragment that holds `entry`.
    pub fn fragment_for(&self, entry: EntryId) -> &Fragment {
        self.fragments
            .iter()
            .rev()
            .find(|f| f.first_entry <= entry.0)
            .unwrap_or(&self.fragments[0])
    }

    /// The master key, decoded.
    ///
    /// # Errors
    /// `Invalid` when `master_key_hex` is not 40 hex digits.
    pub fn master_key(&self) -> Result<MasterKey, Error> {
        let bad = || Error::Invalid {
            what: "master key",
            reason: format!("{:?} is not 40 hex digits", self.master_key_hex),
        };
        let s = self.master_key_hex.as_bytes();
        if s.len() != 40 {
            return Err(bad());
        }
        let mut k = [0u8; 20];
        for (i, pair) in s.chunks(2).enumerate() {
            let hex = std::str::from_utf8(pair).map_err(|_| bad())?;
            k[i] = u8::from_str_radix(hex, 16).map_err(|_| bad())?;
        }
        Ok(MasterKey(k))
    }
}

/// Encodes a master key as 40 lower-case hex digits.
pub fn master_key_hex(key: &MasterKey) -> String {
    key.0.iter().map(|b| format!("{b:02x}")).collect()
}

/// State of one log segment (DistributedLog `inprogress_` / `logrecs_` znodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SegmentState {
    /// Being written; its ledger is open.
    InProgress,
    /// Sealed; its ledger is closed and `last_entry` is final.
    Completed,
}

/// One log segment of a stream: one ledger (DistributedLog `LogSegmentMetadata`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentMetadata {
    /// Log segment sequence number, the first part of every DLSN in it; starts at 1.
    pub seq_no: u64,
    /// The ledger that stores it.
    pub ledger_id: u64,
    /// Lifecycle state.
    pub state: SegmentState,
    /// txid of its first record.
    pub first_txid: Option<u64>,
    /// txid of its last record (completed segments).
    pub last_txid: Option<u64>,
    /// Last entry id (completed segments; `None` if it holds no entry).
    pub last_entry: Option<u64>,
    /// Records in it (completed segments).
    pub record_count: u64,
    /// Payload bytes in it (completed segments).
    pub length_bytes: u64,
    /// When it was completed, in milliseconds since the Unix epoch (DistributedLog
    /// `completionTime`, the age time-based retention goes by); `None` while in progress and
    /// for segments completed before this field existed.
    #[serde(default)]
    pub completion_time_ms: Option<u64>,
    /// Write time (the owning proxy's wall clock, ms since the Unix epoch, as stamped in the
    /// record set) of its first record; set when the segment starts (the first entry carries
    /// it). `None` for segments written before write times existed. Positions by time
    /// (`READ` from write time >= T) search segments by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_write_time_ms: Option<u64>,
    /// Write time of its last record; set when the segment completes, or by recovery from its
    /// last entry. `None` while in progress, for an empty segment and for segments written
    /// before write times existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_write_time_ms: Option<u64>,
    /// Entry and slot of its last record (its DLSN is `seq_no:entry:slot`); set with
    /// `last_write_time_ms`. The last entry may be a control entry or the end-of-stream marker,
    /// which hold no record, so `last_entry` alone does not give it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_record_entry: Option<u64>,
    /// Slot of its last record in `last_record_entry`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_record_slot: Option<u32>,
}

/// A truncation point: a DLSN as its three parts (`segment_seq_no:entry_id:slot_index`).
/// Every record before it is unreadable (DistributedLog's `minActiveDLSN` of a stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TruncationPoint {
    /// Log segment sequence number.
    pub segment_seq_no: u64,
    /// Entry id within the segment.
    pub entry_id: u64,
    /// Record index within the entry.
    pub slot_index: u32,
}

/// A stream's own retention settings, overriding the cluster defaults field by field
/// (DistributedLog `retentionPeriodHours`, per stream through its dynamic config). `None`: the
/// cluster default applies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionOverride {
    /// Completed segments older than this many seconds (by completion time) are deleted.
    #[serde(default)]
    pub time_secs: Option<u64>,
    /// Oldest completed segments are deleted while the stream's segments hold more than this
    /// many payload bytes.
    #[serde(default)]
    pub size_bytes: Option<u64>,
    /// Retention keeps what subscriptions still need (issue 26; off by default): time and size
    /// retention never delete a segment at or after the smallest committed position of the
    /// stream's subscriptions (DistributedLog leaves this to the application, which truncates
    /// at its readers' positions). A stream with no subscription retains as without it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_for_subscriptions: bool,
}

/// Stream metadata (DistributedLog log znode with its `ledgers` and `maxtxid` children).
/// `Debug` prints `ledger_secret_hex` as `<redacted>`: records end up in logs and panics.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamMetadata {
    /// Stream name.
    pub name: String,
    /// Segments by ascending `seq_no`.
    pub segments: Vec<SegmentMetadata>,
    /// Highest txid written (DistributedLog `maxtxid`).
    pub max_txid: Option<u64>,
    /// Milliseconds since the Unix epoch.
    pub creation_time_ms: u64,
    /// Records before this point are unreadable; it never moves backwards. `None`: nothing
    /// was truncated.
    #[serde(default)]
    pub truncated_before: Option<TruncationPoint>,
    /// Per-stream retention overrides.
    #[serde(default)]
    pub retention: RetentionOverride,
    /// The secret the master keys of the stream's ledgers are derived from, as hex (32 random
    /// bytes, made when the stream is created; `quire_ledger::ledger_master_key`). Only the
    /// owning proxy uses it; it is never sent to clients. `None` in a stream made before
    /// secrets existed, until the owner starts its next segment (which stores one in the same
    /// compare-and-set); its older ledgers keep their key in their own metadata, which is what
    /// recovery uses (docs/format/metadata.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger_secret_hex: Option<String>,
    /// True once the stream was sealed (`SEAL_STREAM`): its last segment ends with the
    /// end-of-stream marker and every later write fails with `END_OF_STREAM` (DistributedLog
    /// sets the log's `maxtxid` to `Long.MAX_VALUE` for the same effect).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sealed: bool,
    /// How the owner stores this stream's entries (`SET_COMPRESSION`, issue 26 item 5):
    /// `Some(Lz4)` compresses every entry it writes, `Some(None)` none (a write's own LZ4
    /// flag still compresses its entry); `None`, and every record made before this field
    /// existed: the owning proxy's `[streams] compression` default applies. DistributedLog
    /// sets its codec per writer (`compressionType` in the stream's dynamic config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<StreamCompression>,
    /// The stream's own write limits (`SET_LIMITS`, issue 29 item 4), enforced by its owner;
    /// `None`, and every record made before this field existed: the owning proxy's
    /// `[limits] stream_*` defaults apply. DistributedLog keeps per-stream limits in the
    /// stream's dynamic config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RateLimits>,
    /// The region the stream was created in, its *home* (the creating proxy's `region`,
    /// issue 30 item 4): a proxy of another region that would acquire the stream redirects to
    /// a live proxy of this region when one is registered (DistributedLog's region-local
    /// ownership). `None`, and every record made before this field existed: no home, any
    /// proxy may own it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home_region: Option<String>,
    /// The stream's own placement (`SET_PLACEMENT`, issue 30 item 2), used by its owner for
    /// every new segment's ledger (a change applies from the next segment on) and recorded
    /// in that ledger's metadata; `None`, and every record made before this field existed:
    /// the owning proxy's `[ledger]` placement applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<crate::StreamPlacement>,
}

/// Write limits of one scope (a proxy, a stream or a token): a hard limit refuses a write
/// that would exceed it with `OVER_CAPACITY` (nothing written), a soft one only logs and
/// counts it. Rates are enforced by a token bucket per scope whose burst is one second of the
/// rate. Every field 0 (the default): no limit, as DistributedLog's `-1`. Stored in a stream
/// record as an object with these keys (those at 0 left out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimits {
    /// Hard limit, records per second (DL `rpsHardWriteLimit` / `rpsHardServiceLimit`).
    #[serde(skip_serializing_if = "is_zero")]
    pub records_per_sec: u64,
    /// Hard limit, record payload bytes per second (DL `bpsHardWriteLimit`).
    #[serde(skip_serializing_if = "is_zero")]
    pub bytes_per_sec: u64,
    /// Soft limit, records per second (DL `rpsSoftWriteLimit`): logged and counted only.
    #[serde(skip_serializing_if = "is_zero")]
    pub soft_records_per_sec: u64,
    /// Soft limit, record payload bytes per second (DL `bpsSoftWriteLimit`).
    #[serde(skip_serializing_if = "is_zero")]
    pub soft_bytes_per_sec: u64,
    /// Most writes accepted and not yet answered (DL `perWriterOutstandingWriteLimit`).
    #[serde(skip_serializing_if = "is_zero")]
    pub outstanding_writes_max: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl RateLimits {
    /// Whether no limit is set (every field 0).
    pub fn is_unlimited(&self) -> bool {
        *self == RateLimits::default()
    }
}

/// A stream's own compression setting ([`StreamMetadata::compression`]), stored as
/// `"none"` or `"lz4"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamCompression {
    /// Entries stored as they are (unless a write asks for LZ4).
    None,
    /// Every entry's records section LZ4-compressed (record set v3, flag bit0).
    Lz4,
}

impl std::fmt::Debug for StreamMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamMetadata")
            .field("name", &self.name)
            .field("segments", &self.segments)
            .field("max_txid", &self.max_txid)
            .field("creation_time_ms", &self.creation_time_ms)
            .field("truncated_before", &self.truncated_before)
            .field("retention", &self.retention)
            .field("sealed", &self.sealed)
            .field("compression", &self.compression)
            .field("limits", &self.limits)
            .field("home_region", &self.home_region)
            .field("placement", &self.placement)
            .field(
                "ledger_secret_hex",
                &self.ledger_secret_hex.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl StreamMetadata {
    /// The stream's ledger secret, decoded; `None` if it has none yet.
    ///
    /// # Errors
    /// `Invalid` when `ledger_secret_hex` is empty or not an even number of hex digits.
    pub fn ledger_secret(&self) -> Result<Option<Vec<u8>>, Error> {
        let Some(h) = &self.ledger_secret_hex else {
            return Ok(None);
        };
        match decode_hex(h) {
            Some(secret) if !secret.is_empty() => Ok(Some(secret)),
            _ => Err(Error::Invalid {
                what: "stream ledger secret",
                reason: format!(
                    "{} characters, not a non-empty even number of hex digits",
                    h.len()
                ),
            }),
        }
    }
}

/// Encodes bytes as lower-case hex digits, two per byte.
pub fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decodes hex digits (either case) into bytes; `None` unless `s` is an even number of them.
pub fn decode_hex(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    b.chunks(2)
        .map(|pair| {
            let digits = std::str::from_utf8(pair).ok()?;
            u8::from_str_radix(digits, 16).ok()
        })
        .collect()
}

/// A bookie's cookie (BookKeeper `Cookie`): who the bookie is and which directories hold its
/// data, stored both in the metadata store and in each of its directories. A bookie whose
/// directories carry no cookie while the store has one (a wiped disk), or whose cookie differs
/// (a swapped disk, another cluster), refuses to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cookie {
    /// Cookie layout version.
    pub format_version: u32,
    /// The bookie it belongs to.
    pub bookie: BookieId,
    /// The cluster it belongs to ([`crate::MetadataStore::instance_id`]).
    pub instance_id: String,
    /// The journal directory, as configured.
    pub journal_dir: String,
    /// The ledger directories, as configured.
    pub ledger_dirs: Vec<String>,
}

/// Current cookie layout version.
pub const COOKIE_FORMAT_VERSION: u32 = 1;

/// Exclusive ownership of a stream (DistributedLog's write lock), held until released or lost.
#[derive(Debug)]
pub struct StreamLease {
    /// The stream owned.
    pub stream: String,
    /// The owner's identity, e.g. the proxy's address, which other proxies redirect clients to.
    pub owner: String,
    /// Becomes `true` once ownership is lost (ZooKeeper session expiry, lock node deleted).
    /// A writer must stop before its next write once it sees `true`.
    pub lost: tokio::sync::watch::Receiver<bool>,
    /// Implementation-specific handle (the lock node's path for ZooKeeper).
    pub token: String,
}

/// An under-replicated ledger mark (BookKeeper `UnderreplicatedLedgerFormat`): the auditor
/// found fragments of the ledger on bookies that are gone (or being decommissioned), or
/// replicas that lack entries, or a writer reported a bookie that missed entries it confirmed
/// without it; a replication worker is to copy the entries to other bookies or back in place.
/// Kept until a worker has done so for every listed bookie, or the ledger is deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnderReplication {
    /// The bookies whose replicas are missing, sorted, without duplicates (the auditor's: a
    /// listed bookie that is not registered is treated as lost).
    pub missing_bookies: Vec<BookieId>,
    /// Bookies a ledger writer reported as missing some entries (adds to them failed and were
    /// not re-sent elsewhere), sorted, without duplicates. Their entries are copied back in
    /// place once they are registered; such a report alone never makes a bookie count as lost
    /// (only the auditor decides that, after `lostBookieRecoveryDelay`). Absent in marks made
    /// before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gaps_on: Vec<BookieId>,
    /// When the ledger was first marked, in milliseconds since the Unix epoch (BookKeeper's
    /// `ctime`): how long it has waited, and the start of an open ledger's grace period.
    pub ctime_ms: u64,
}

/// Exclusive claim of one under-replicated ledger by a replication worker (BookKeeper's
/// `underreplication/locks/urL...`): an ephemeral znode that dies with the worker's session.
#[derive(Debug, Clone)]
pub struct ReplicationLock {
    /// The ledger claimed.
    pub ledger: quire_wire::LedgerId,
    /// The lock node's path.
    pub token: String,
}

/// Longest stream name, in bytes.
pub const STREAM_NAME_SIZE_BYTES_MAX: usize = 255;

/// Checks a stream name: 1 to 255 bytes of ASCII letters, digits, `-`, `_`, `.` and `/`, not
/// starting with `.` or `/` and without `//` (DistributedLog's names follow ZooKeeper path rules;
/// this is a stricter, portable subset).
///
/// # Errors
/// `Invalid` saying which rule the name breaks.
pub fn validate_stream_name(name: &str) -> Result<(), Error> {
    let bad = |reason: &str| {
        Err(Error::Invalid {
            what: "stream name",
            reason: format!("{name:?}: {reason}"),
        })
    };
    if name.is_empty() || name.len() > STREAM_NAME_SIZE_BYTES_MAX {
        return bad("must be 1 to 255 bytes");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
    {
        return bad("only ASCII letters, digits, '-', '_', '.' and '/' are allowed");
    }
    if name.starts_with('.') || name.starts_with('/') || name.ends_with('/') || name.contains("//")
    {
        return bad("must not start with '.' or '/', end with '/', or contain '//'");
    }
    if name.split('/').any(|part| part == "." || part == "..") {
        return bad("must not contain '.' or '..' path components (ZooKeeper paths forbid them)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_names() {
        for ok in ["a", "logs/hdfs-2k", "A.b_c-1"] {
            assert!(validate_stream_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", ".hidden", "/abs", "a//b", "sp ace", "tail/", "ü", "a/../b", "a/./b", "a/..",
        ] {
            assert!(validate_stream_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn stream_records_without_lifecycle_fields_still_parse() {
        // Goal: records written before truncation, retention and completion times existed read
        // back with those fields empty. Method: parse such a record's JSON.
        let old = r#"{"name":"s","segments":[{"seq_no":1,"ledger_id":7,"state":"Completed",
            "first_txid":1,"last_txid":2,"last_entry":0,"record_count":2,"length_bytes":10}],
            "max_txid":2,"creation_time_ms":5}"#;
        let m: StreamMetadata = serde_json::from_str(old).unwrap();
        assert_eq!(m.truncated_before, None);
        assert_eq!(m.retention, RetentionOverride::default());
        assert_eq!(m.segments[0].completion_time_ms, None);
    }

    #[test]
    fn proxy_records_without_load_fields_still_parse() {
        // Goal: a registry record written before load balancing (no load, no weight) reads
        // with no load and the full weight, so a mixed-version cluster places as before.
        let old = r#"{"address":"127.0.0.1:1","owned_streams":3,"heartbeat":9,"updated_ms":5}"#;
        let p: ProxyInfo = serde_json::from_str(old).unwrap();
        assert_eq!(p.write_bytes_per_sec, 0);
        assert_eq!(p.write_records_per_sec, 0);
        assert_eq!(p.weight_milli, PROXY_WEIGHT_FULL);
        let back: ProxyInfo = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn ledger_secret_is_optional_and_checked() {
        // Goal: a stream record without a secret (made before secrets existed) reads as None
        // and is written without the field; a secret round-trips; a bad one is `Invalid`.
        // Method: JSON in and out.
        let old = r#"{"name":"s","segments":[],"max_txid":null,"creation_time_ms":5}"#;
        let mut m: StreamMetadata = serde_json::from_str(old).unwrap();
        assert_eq!(m.ledger_secret().unwrap(), None);
        assert!(!serde_json::to_string(&m)
            .unwrap()
            .contains("ledger_secret_hex"));
        let secret: Vec<u8> = (0..32).collect();
        m.ledger_secret_hex = Some(encode_hex(&secret));
        let back: StreamMetadata =
            serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back.ledger_secret().unwrap(), Some(secret));
        for bad in ["", "abc", "zz", "é1"] {
            m.ledger_secret_hex = Some(bad.into());
            assert!(m.ledger_secret().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn debug_output_never_holds_a_secret_or_a_master_key() {
        let mut s: StreamMetadata = serde_json::from_str(
            r#"{"name":"s","segments":[],"max_txid":null,"creation_time_ms":5}"#,
        )
        .unwrap();
        s.ledger_secret_hex = Some("c0ffee".repeat(8));
        let text = format!("{s:?}");
        assert!(
            !text.contains("c0ffee") && text.contains("<redacted>"),
            "{text}"
        );
        let mut l = sample();
        l.master_key_hex = master_key_hex(&MasterKey([0xab; 20]));
        let text = format!("{l:?}");
        assert!(
            !text.contains("abab") && text.contains("<redacted>"),
            "{text}"
        );
    }

    #[test]
    fn master_key_hex_round_trip() {
        let k = MasterKey([0xab; 20]);
        let mut m = sample();
        m.master_key_hex = master_key_hex(&k);
        assert_eq!(m.master_key().unwrap(), k);
        m.master_key_hex = "zz".into();
        assert!(m.master_key().is_err());
    }

    fn sample() -> LedgerMetadata {
        LedgerMetadata {
            format_version: LEDGER_METADATA_FORMAT_VERSION,
            ensemble_size: 3,
            write_quorum: 2,
            ack_quorum: 2,
            state: LedgerState::Open,
            fragments: vec![Fragment {
                first_entry: 0,
                bookies: vec![
                    BookieId("a".into()),
                    BookieId("b".into()),
                    BookieId("c".into()),
                ],
            }],
            last_entry: None,
            length_bytes: 0,
            digest_type: DigestType::Crc32c,
            master_key_hex: String::new(),
            creation_time_ms: 0,
            custom: BTreeMap::new(),
        }
    }

    #[test]
    fn quorum_shape_is_checked() {
        let mut m = sample();
        assert!(m.validate().is_ok());
        m.ack_quorum = 3;
        assert!(m.validate().is_err());
        m.ack_quorum = 0;
        m.write_quorum = 0;
        assert!(m.validate().is_err());
    }
}

/// A decommission under way (`quire bookie decommission`): when it started and what the
/// replication workers copied for it so far (each adds the bytes and entries of a fragment it
/// copied away from the bookie). Kept in `underreplication/decommission/<id>` (ZooKeeper) or the
/// embedded document; a record written before these counters were kept (the start time alone,
/// a bare number) reads with zero counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "DecommissionFormat")]
pub struct Decommission {
    /// Start, in milliseconds since the Unix epoch.
    pub start_ms: u64,
    /// Entry bytes the workers copied off the bookie so far.
    pub bytes_copied: u64,
    /// Entries the workers copied off the bookie so far.
    pub entries_copied: u64,
}

/// The stored forms of a [`Decommission`]: the start time alone (older records), or the record.
#[derive(Deserialize)]
#[serde(untagged)]
enum DecommissionFormat {
    Start(u64),
    Record {
        start_ms: u64,
        #[serde(default)]
        bytes_copied: u64,
        #[serde(default)]
        entries_copied: u64,
    },
}

impl From<DecommissionFormat> for Decommission {
    fn from(f: DecommissionFormat) -> Self {
        match f {
            DecommissionFormat::Start(start_ms) => Self {
                start_ms,
                ..Self::default()
            },
            DecommissionFormat::Record {
                start_ms,
                bytes_copied,
                entries_copied,
            } => Self {
                start_ms,
                bytes_copied,
                entries_copied,
            },
        }
    }
}

/// A live proxy in the proxy registry (`proxies/<address>` in ZooKeeper, an EPHEMERAL node of
/// the proxy's session; kept in memory by the embedded store), with its load summary. Each
/// proxy rewrites its own record every balancer tick, bumping `heartbeat`, so that the others
/// can tell a proxy that stopped (its `heartbeat` no longer moves) before its session expires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyInfo {
    /// The proxy's advertised `host:port`: its stream-lease identity and where clients are
    /// redirected to.
    pub address: String,
    /// Streams the proxy owns now (acquired and not lost).
    pub owned_streams: u64,
    /// Bumped by every rewrite of the record (one per balancer tick).
    pub heartbeat: u64,
    /// The proxy's wall clock at the rewrite, in milliseconds since the Unix epoch (shown by
    /// `quire proxy list`; liveness is judged by `heartbeat`, not by comparing clocks).
    pub updated_ms: u64,
    /// The proxy's region label (`region` in its config; none: `default-region`). Absent in
    /// records from before regions and left out when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The proxy's rack label (`rack` in its config; none: `/default-rack`), as `region`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
    /// Record payload bytes per second written to the streams the proxy owns, over its last
    /// few balancer ticks (its load for load-aware placement). Absent in records from before
    /// load balancing: 0.
    #[serde(default)]
    pub write_bytes_per_sec: u64,
    /// Records per second written to the streams the proxy owns, as `write_bytes_per_sec`.
    #[serde(default)]
    pub write_records_per_sec: u64,
    /// The proxy's capacity weight in weighted rendezvous placement, in thousandths
    /// ([`PROXY_WEIGHT_FULL`] = 1.0, the weight of every proxy not above the load threshold).
    /// Absent in records from before load balancing: [`PROXY_WEIGHT_FULL`].
    #[serde(default = "proxy_weight_full")]
    pub weight_milli: u32,
    /// Stream acquisitions the proxy had under way at the rewrite (a request found the stream
    /// unowned there: lease, recovery, task start). The other proxies' balancers hold back
    /// their moves toward a proxy that is behind (back-pressure, issue 29). Absent in records
    /// from before it: 0.
    #[serde(default)]
    pub acquiring: u64,
}

/// [`ProxyInfo::weight_milli`] of a proxy that is not shedding load: 1000 (1.0).
pub const PROXY_WEIGHT_FULL: u32 = 1000;

fn proxy_weight_full() -> u32 {
    PROXY_WEIGHT_FULL
}

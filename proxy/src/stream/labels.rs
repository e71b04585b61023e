//! The labels a segment's ledger carries in its custom metadata (the stream's name and the
//! segment's sequence number), by which the lifecycle sweep finds orphan ledgers, and the
//! deletion of a labelled ledger's metadata: a leaf of the stream layer's module graph.

use std::collections::BTreeSet;

use quire_metadata::StreamMetadata;
use quire_wire::LedgerId;

/// The `custom` key of a segment's ledger metadata that names its stream.
pub const LEDGER_LABEL_STREAM: &str = "quire.stream";
/// The `custom` key of a segment's ledger metadata that holds its segment sequence number.
pub const LEDGER_LABEL_SEGMENT: &str = "quire.segment_seq_no";

/// Deletes ledger `id`'s metadata if it is still labelled with `stream`; true once it is gone
/// (also when someone else deleted it). A failed read or delete leaves it (logged).
pub(super) async fn delete_labelled_ledger(
    metadata: &dyn quire_metadata::MetadataStore,
    stream: &str,
    id: u64,
) -> bool {
    for _ in 0..3 {
        let v = match metadata.read_ledger(LedgerId(id)).await {
            Ok(v) => v,
            Err(quire_metadata::Error::NotFound { .. }) => return true,
            Err(e) => {
                tracing::warn!(stream, ledger = id, error = %e, "cannot read an orphan ledger's metadata; it stays");
                return false;
            }
        };
        if v.value.custom.get(LEDGER_LABEL_STREAM).map(String::as_str) != Some(stream) {
            return false;
        }
        match metadata.delete_ledger(LedgerId(id), v.version).await {
            Ok(()) | Err(quire_metadata::Error::NotFound { .. }) => {
                tracing::info!(stream, ledger = id, "deleted orphan ledger metadata");
                return true;
            }
            Err(quire_metadata::Error::BadVersion { .. }) => continue,
            Err(e) => {
                tracing::warn!(stream, ledger = id, error = %e, "cannot delete an orphan ledger's metadata; it stays");
                return false;
            }
        }
    }
    false
}

/// The orphans among `candidates` (ledgers labelled with the stream): those its record does
/// not list, other than `spare` (the ledger a roll made ready, the writer's own).
pub(super) fn orphans(meta: &StreamMetadata, spare: Option<u64>, candidates: Vec<u64>) -> Vec<u64> {
    let listed: BTreeSet<u64> = meta
        .segments
        .iter()
        .map(|s| s.ledger_id)
        .chain(spare)
        .collect();
    candidates
        .into_iter()
        .filter(|id| !listed.contains(id))
        .collect()
}

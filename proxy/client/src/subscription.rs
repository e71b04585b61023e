//! Subscriptions on the wire (opcodes 0x0C commit, 0x0D get, 0x0E list, 0x0F delete;
//! DistributedLog's `SubscriptionsStore`): the answer type and its codec.
//!
//! A subscription info is: name (u32 length + bytes), committed present u8 (0 or 1), committed
//! DLSN (20 bytes, zero when absent), commit_time_ms u64 (0 when absent), lag_records u64,
//! lag_bytes u64.

use quire_wire::{put_len_prefixed, Reader, WireError};

use crate::dlsn::Dlsn;

/// Longest subscription name field accepted on the wire (the naming rules allow 255).
pub const SUBSCRIPTION_NAME_FIELD_SIZE_BYTES_MAX: usize = 1024;
/// Smallest encoded subscription info (empty name): 4 + 1 + 20 + 8 + 8 + 8 bytes.
pub const SUBSCRIPTION_INFO_SIZE_BYTES_MIN: usize = 49;

/// A subscription as a proxy reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SubscriptionInfo {
    /// The subscription's name.
    pub name: String,
    /// Where the subscriber resumes (the first record it has not processed); `None`: nothing
    /// committed yet (a reader starts at the head).
    pub committed: Option<Dlsn>,
    /// When the position last moved, ms since the Unix epoch (the committing proxy's clock).
    pub commit_time_ms: Option<u64>,
    /// Records from the committed position to the end of the stream, from the segment
    /// metadata (exact over whole segments; inside the committed position's segment,
    /// estimated by entries, records per entry taken as even).
    pub lag_records: u64,
    /// Payload bytes over the same span, estimated the same way.
    pub lag_bytes: u64,
}

pub(crate) fn put_info(out: &mut Vec<u8>, s: &SubscriptionInfo) {
    put_len_prefixed(out, s.name.as_bytes());
    out.push(u8::from(s.committed.is_some()));
    s.committed.unwrap_or(Dlsn::new(0, 0, 0)).encode(out);
    out.extend_from_slice(&s.commit_time_ms.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&s.lag_records.to_le_bytes());
    out.extend_from_slice(&s.lag_bytes.to_le_bytes());
}

pub(crate) fn get_name(r: &mut Reader<'_>) -> Result<String, WireError> {
    let b = r.len_prefixed(SUBSCRIPTION_NAME_FIELD_SIZE_BYTES_MAX)?;
    String::from_utf8(b.to_vec()).map_err(|_| WireError::InvalidField {
        what: "subscription name",
    })
}

/// A u8 that must be 0 (false) or 1 (true).
pub(crate) fn get_flag(r: &mut Reader<'_>, what: &'static str) -> Result<bool, WireError> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(WireError::InvalidField { what }),
    }
}

pub(crate) fn get_info(r: &mut Reader<'_>) -> Result<SubscriptionInfo, WireError> {
    let name = get_name(r)?;
    let present = get_flag(r, "subscription committed flag")?;
    let committed = Dlsn::decode(r)?;
    let time = r.u64()?;
    Ok(SubscriptionInfo {
        name,
        committed: present.then_some(committed),
        commit_time_ms: present.then_some(time),
        lag_records: r.u64()?,
        lag_bytes: r.u64()?,
    })
}

/// Decodes a list answer: count u32, then each info.
pub(crate) fn get_list(
    r: &mut Reader<'_>,
    body_len: usize,
) -> Result<Vec<SubscriptionInfo>, WireError> {
    let count = r.u32()? as usize;
    // Refuse counts the body cannot hold before allocating for them.
    if count > body_len / SUBSCRIPTION_INFO_SIZE_BYTES_MIN {
        return Err(WireError::InvalidField {
            what: "subscription count",
        });
    }
    (0..count).map(|_| get_info(r)).collect()
}

/// Encodes a list answer.
pub(crate) fn put_list(out: &mut Vec<u8>, subs: &[SubscriptionInfo]) {
    out.extend_from_slice(
        &u32::try_from(subs.len())
            .expect("subscription count above u32")
            .to_le_bytes(),
    );
    for s in subs {
        put_info(out, s);
    }
}

//! The scrubber on each shard (issue 28 item 5; BookKeeper's local scrubber,
//! `localScrubPeriod` / `localScrubRateLimit`): every `interval` a pass of the engine's
//! scrubber ([`quire_engine::Engine::scrub`]) re-reads the shard's index segments and every
//! indexed entry-log record at `rate_bytes_per_sec`, and checks their CRCs.
//!
//! Damage is reported three ways: a warning per damaged entry naming ledger, entry, entry log
//! and offset (the engine's), the shard's figures (metrics `bookie_scrub_*`, docs/metrics.md),
//! and the ledgers of the damaged entries sent to the metadata side ([`DamagedLedgers`]),
//! which marks each under-replicated naming this bookie. Repair is autorecovery's: a
//! replication worker claims the mark and, since the named bookie is registered, copies the
//! fragment's entries it cannot read back onto it in place with recovery adds
//! (`BookKeeper::repair_fragment_in_place`; docs/protocol.md §Add, "Replacing a stored
//! entry"). Until then every read of a damaged entry answers `IoError`, never `NoSuchEntry`
//! nor other bytes, so the ledger client reads another replica. A damaged ledger is sent
//! again after every pass that still finds it (marking is idempotent), so a mark cleared
//! without a repair (e.g. the worker found the bookie away) is made again.

use std::collections::BTreeSet;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use quire_engine::Engine;

use crate::metrics::BookieStatus;

/// Default time between the end of a scrub pass and the start of the next (BookKeeper's
/// `localScrubPeriod` is off by default; Quire scrubs daily).
pub const SCRUB_INTERVAL_DEFAULT: Duration = Duration::from_secs(24 * 3600);
/// Default entry-log read rate of a pass, per shard, in bytes per second (slow: 1 TiB takes
/// about three days at 4 MiB/s).
pub const SCRUB_RATE_BYTES_PER_SEC_DEFAULT: u64 = 4 << 20;

/// The scrubber's settings on every shard ([`crate::BookieConfig::scrub`]).
#[derive(Debug, Clone)]
pub struct ScrubConfig {
    /// Whether shards scrub at all. Default true.
    pub enabled: bool,
    /// Time between the end of a pass and the start of the next; the first pass starts one
    /// interval after the shard opened. Default [`SCRUB_INTERVAL_DEFAULT`].
    pub interval: Duration,
    /// Entry-log bytes a pass reads per second on each shard; 0 is unpaced. Default
    /// [`SCRUB_RATE_BYTES_PER_SEC_DEFAULT`].
    pub rate_bytes_per_sec: u64,
    /// Where the ledgers of damaged entries go (see [`damaged_ledgers_channel`]). `None`: the
    /// damage is only reported (log, metrics), nothing asks for a repair.
    pub damaged_ledgers: Option<DamagedLedgers>,
}

impl Default for ScrubConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: SCRUB_INTERVAL_DEFAULT,
            rate_bytes_per_sec: SCRUB_RATE_BYTES_PER_SEC_DEFAULT,
            damaged_ledgers: None,
        }
    }
}

/// The sending end, given to the bookie in [`ScrubConfig::damaged_ledgers`].
#[derive(Debug, Clone)]
pub struct DamagedLedgers(flume::Sender<u64>);

/// The receiving end, kept by whoever can mark ledgers under-replicated.
#[derive(Debug)]
pub struct DamagedLedgerReports(flume::Receiver<u64>);

impl DamagedLedgerReports {
    /// The next ledger holding a damaged entry on this bookie; `None` once every shard holding
    /// the sending end has stopped.
    pub async fn next(&self) -> Option<u64> {
        self.0.recv_async().await.ok()
    }
}

/// A channel for the ledgers the scrubber found damaged: the sender goes into the bookie
/// configuration, the receiver to the metadata side. Any runtime may receive (flume).
pub fn damaged_ledgers_channel() -> (DamagedLedgers, DamagedLedgerReports) {
    let (tx, rx) = flume::bounded(1024);
    (DamagedLedgers(tx), DamagedLedgerReports(rx))
}

/// The scrub loop of one shard: a pass every `config.interval` until cancelled. Marks the
/// shard's scrubber on in `status` (`GetBookieInfo`) and counts the ledgers it reports.
pub(crate) async fn scrub_loop(
    engine: Rc<Engine>,
    shard: usize,
    config: ScrubConfig,
    status: Arc<BookieStatus>,
) {
    let info = |f: &mut dyn FnMut(&mut quire_wire::bookie::ScrubInfo)| {
        if let Some(m) = status.scrub.get(shard) {
            f(&mut m.lock().unwrap_or_else(|p| p.into_inner()));
        }
    };
    info(&mut |i| i.flags |= quire_wire::bookie::SCRUB_ENABLED);
    loop {
        glommio::timer::sleep(config.interval).await;
        match engine.scrub(config.rate_bytes_per_sec).await {
            Ok(pass) => {
                let ledgers: BTreeSet<u64> = pass.damaged.iter().map(|d| d.ledger).collect();
                tracing::info!(
                    shard,
                    entries = pass.entries_scanned,
                    bytes = pass.bytes_scanned,
                    damaged = pass.damaged.len(),
                    index_segments_damaged = pass.index_segments_damaged,
                    repaired = pass.repaired,
                    secs = pass.duration.as_secs_f64(),
                    "scrub pass"
                );
                if let Some(to) = &config.damaged_ledgers {
                    for l in ledgers {
                        // A full channel drops the report: the next pass sends it again.
                        if to.0.try_send(l).is_ok() {
                            info(&mut |i| i.ledgers_reported += 1);
                        }
                    }
                }
            }
            Err(quire_engine::Error::Closed) => return,
            Err(e) => tracing::error!(shard, error = %e, "scrub pass failed"),
        }
    }
}

//! The balancer (`placement.rs` has the rules): every [`BALANCE_TICK`] the proxy-registry
//! heartbeat and view, then rate-limited releases of owned streams whose preferred owner is
//! another live proxy, through the registry like the lifecycle sweep (`sweep.rs`); and a
//! drain's hand-over ([`hand_over`]), the same releases for every owned stream at once.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::oneshot;

use super::command::Command;
use super::ownership::StreamHandle;
use super::placement::BALANCE_TICK;
use super::registry::Registry;

/// Streams a drain's hand-over releases at a time: each release completes a segment (a
/// ledger close and a metadata write), so a proxy owning thousands does not send ZooKeeper
/// and the bookies thousands at once.
const HAND_OVER_PARALLEL: usize = 64;

/// Longest wait of a drain for the other live proxies to read the registry after this proxy
/// left it: ten ticks, as ZooKeeper answering in over a second under load slows their ticks.
/// Past it the hand-over goes on anyway; a lagging proxy's redirect back here then fails to
/// connect once this proxy closes, and the client asks its own proxies again (`routing.rs`).
const LEAVE_SEEN_MAX: Duration = Duration::from_secs(10);
/// How often a leaving proxy reads the registry while it waits for the others.
const LEAVE_POLL: Duration = Duration::from_millis(200);

/// Waits, at most [`LEAVE_SEEN_MAX`], until every other proxy live in this proxy's view has
/// read the registry after this proxy left it; returns whether they all did. A proxy's tick
/// writes its record (heartbeat `n`) and then reads the registry (`Placement::tick`). With
/// `h` the heartbeat first read here after the leave, the write of `h + 1` ends after that
/// read, so the registry read of its tick starts after the leave and its view is applied
/// before the write of `h + 2`: a heartbeat of `h + 2` or more proves the view has dropped
/// this proxy. A proxy whose record is gone (it left too) is not waited for.
async fn await_views(reg: &Registry) -> bool {
    let peers = reg.placement.live_peers();
    let mut first: HashMap<String, u64> = HashMap::new();
    let waiting = async {
        loop {
            match reg.metadata.list_proxies().await {
                Ok(list) => {
                    let mut behind = 0;
                    for p in &peers {
                        let Some(info) = list.iter().find(|i| &i.address == p) else {
                            continue;
                        };
                        let h = *first.entry(p.clone()).or_insert(info.heartbeat);
                        behind += usize::from(info.heartbeat < h + 2);
                    }
                    if behind == 0 {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading the proxy registry during a drain failed")
                }
            }
            tokio::time::sleep(LEAVE_POLL).await;
        }
    };
    let seen = tokio::time::timeout(LEAVE_SEEN_MAX, waiting).await.is_ok();
    if !seen {
        tracing::warn!(
            waited_ms = LEAVE_SEEN_MAX.as_millis() as u64,
            "not every other proxy read the registry after this one left; handing over anyway"
        );
    }
    seen
}

/// Marks `handle` as moving to `to` (queued and later requests are redirected there); false
/// when a release is already queued.
fn claim(reg: &Registry, handle: &StreamHandle, to: String) -> bool {
    let mut moved = handle.shared.moved_to.lock().expect("moved lock");
    if moved.is_some() {
        return false;
    }
    tracing::info!(stream = %handle.name, %to, "releasing the stream to its preferred owner");
    *moved = Some(to);
    reg.layer
        .released_for_balance
        .fetch_add(1, Ordering::Relaxed);
    true
}

/// Has the stream task release a claimed stream: in-flight adds awaited, the open segment
/// completed, the lease given up (`Writer::release_moved`).
async fn release(handle: Arc<StreamHandle>) {
    let (reply, rx) = oneshot::channel();
    if handle
        .commands
        .send(Command::Release { reply })
        .await
        .is_ok()
    {
        if let Ok(Err(e)) = rx.await {
            tracing::warn!(stream = %handle.name, error = %e, "completing the segment of a released stream failed; its next owner recovers it");
        }
    }
}

/// A drain's first step with balancing on: leaves the registry, keeps serving until the
/// other proxies have dropped this one from their views ([`await_views`], at most
/// [`LEAVE_SEEN_MAX`]; a fixed wait of 1.5 ticks was too short when ZooKeeper answered
/// slowly, and the others redirected released streams back here), then releases
/// every owned stream to its preferred owner among them, [`HAND_OVER_PARALLEL`] at a time, as
/// the balancer does. A writer of a stream sees one redirect and a pause of about its own
/// release; a stream whose release has not come yet is served here meanwhile (not refused
/// with `SERVICE_UNAVAILABLE`, which after a few hops ends in the client giving up while the
/// lease still names this proxy). Returns the streams released; 0 (nothing done but leaving
/// the registry) with balancing off or no other live proxy.
pub(super) async fn hand_over(reg: &Registry) -> usize {
    if !reg.placement.leave(&*reg.metadata).await {
        return 0;
    }
    let started = quire_clock::now();
    let seen = await_views(reg).await;
    let waited = quire_clock::elapsed(started);
    let mut released = 0;
    let owned = reg.owned_all();
    for batch in owned.chunks(HAND_OVER_PARALLEL) {
        let mut tasks = tokio::task::JoinSet::new();
        for handle in batch {
            let home = handle.shared.home_region.get().map(String::as_str);
            let Some(to) = reg.placement.preferred_elsewhere(&handle.name, home) else {
                continue;
            };
            if claim(reg, handle, to) {
                released += 1;
                tasks.spawn(release(handle.clone()));
            }
        }
        while tasks.join_next().await.is_some() {}
    }
    tracing::info!(
        released,
        views_seen = seen,
        views_wait_ms = waited.as_millis() as u64,
        releases_ms = quire_clock::elapsed(started)
            .saturating_sub(waited)
            .as_millis() as u64,
        "handed the owned streams over to the other proxies"
    );
    released
}

/// The balancer: every [`BALANCE_TICK`], the registry heartbeat and view, then up to
/// `moves_per_sec` releases per second of owned streams preferred elsewhere. Ends when the
/// manager is dropped or shuts down.
pub(super) async fn balance_loop(registry: Weak<Registry>, moves_per_sec: u32) {
    let mut tick = tokio::time::interval(BALANCE_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let per_tick = f64::from(moves_per_sec) * BALANCE_TICK.as_secs_f64();
    let mut budget = 0.0f64;
    loop {
        tick.tick().await;
        let Some(reg) = registry.upgrade() else {
            return;
        };
        if reg.is_shutting_down() {
            return;
        }
        let hottest = reg.hottest_stream_written();
        if let Err(e) = reg
            .placement
            .tick(&*reg.metadata, reg.owned_count(), hottest)
            .await
        {
            tracing::warn!(error = %e, "proxy registry heartbeat failed");
            continue;
        }
        if !reg.placement.enabled() {
            continue; // registered for the view only: balancing is off
        }
        if reg.placement.leaving() {
            // A drain's hand-over moves the streams once the others have seen this proxy
            // leave; a move before that would be redirected back here.
            continue;
        }
        budget = (budget + per_tick).min(per_tick.max(1.0));
        // A home region marked unavailable takes no streams back.
        let marked = reg.metadata.unavailable_regions().await.unwrap_or_default();
        for handle in reg.owned_all() {
            if budget < 1.0 {
                break;
            }
            // A stream owned outside its home region goes home once a proxy there is live.
            let home = handle.shared.home_region.get().map(String::as_str);
            let to = home
                .filter(|h| !marked.iter().any(|m| m == h))
                .and_then(|h| reg.placement.home_redirect(&handle.name, h))
                .or_else(|| reg.placement.preferred_elsewhere(&handle.name, home));
            let Some(to) = to else {
                continue;
            };
            if !claim(&reg, &handle, to) {
                continue; // a release is already queued
            }
            budget -= 1.0;
            drop(tokio::spawn(release(handle)));
        }
    }
}

/// Starts the registry tick and the balancer on `rt` when the proxy registers (with an
/// advertised address); with balancing off (`balance_moves_per_sec = 0`) it moves nothing.
pub(super) fn start(registry: &Arc<Registry>, rt: &tokio::runtime::Handle) {
    if registry.placement.registers() {
        let moves = registry.config.balance_moves_per_sec;
        drop(rt.spawn(balance_loop(Arc::downgrade(registry), moves)));
    }
}

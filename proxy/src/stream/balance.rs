//! The balancer (`placement.rs` has the rules): every [`BALANCE_TICK`] the proxy-registry
//! heartbeat and view, then rate-limited releases of owned streams whose preferred owner is
//! another live proxy, through the registry like the lifecycle sweep (`sweep.rs`); and a
//! drain's hand-over ([`hand_over`]), the same releases for every owned stream at once.
//! Both keep a window of moves under way, a move lasting until the new owner has acquired
//! the stream, and the balancer sends none to a proxy that publishes many acquisitions under
//! way (back-pressure, issue 29: releases must not outrun the acquisitions that follow them).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::oneshot;

use super::command::Command;
use super::ownership::StreamHandle;
use super::placement::BALANCE_TICK;
use super::registry::Registry;

/// Moves a drain's hand-over keeps under way at once ([`move_stream`]: the release, then the
/// wait for the new owner's acquisition). Each release completes a segment (a ledger close
/// and a metadata write) and each acquisition takes a lease and starts one, so a proxy
/// owning thousands does not send ZooKeeper and the bookies thousands at once, and the
/// proxies taking over never have more streams released to them than they acquire.
const HAND_OVER_PARALLEL: usize = 64;

/// Moves the balancer keeps under way at once (as [`HAND_OVER_PARALLEL`]): on top of
/// `balance_moves_per_sec`, the pace of moves follows the acquisitions the proxies taking
/// over achieve. At 10,000 streams (perf/README.md) three proxies releasing 100 a second
/// each toward a joining one released thousands of streams it could not acquire in time, and
/// their writers' requests waited there past the clients' 30 s timeout.
const MOVE_WINDOW: usize = 32;

/// A proxy that published this many acquisitions under way is behind: no new move goes to it
/// until it publishes fewer, and a move toward it waits for its acquisition (see
/// [`settle`]).
const TARGET_BEHIND: u64 = 32;

/// How often a move reads whether its stream has a new owner.
const SETTLE_POLL: Duration = Duration::from_millis(500);

/// A move whose stream nobody has acquired after this long, toward a proxy that is not
/// behind, is taken for a stream nobody writes (it is acquired on its first request): it
/// stops holding a place in the window.
const SETTLE_IDLE: Duration = Duration::from_secs(2);

/// Longest a move holds its place in the window.
const SETTLE_MAX: Duration = Duration::from_secs(20);

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

/// Waits until the stream `name`, released toward `to`, has a new owner (its lease is
/// taken), or [`SETTLE_IDLE`] passed while `to` is not behind (it published fewer than
/// [`TARGET_BEHIND`] acquisitions under way: nobody asked for the stream yet), or
/// [`SETTLE_MAX`] passed. Returns whether an owner was seen. One metadata read per
/// [`SETTLE_POLL`]; a read failure ends the wait (the window must not stall on it).
async fn settle(registry: &Weak<Registry>, name: &str, to: &str) -> bool {
    let started = quire_clock::now();
    loop {
        tokio::time::sleep(SETTLE_POLL).await;
        let Some(reg) = registry.upgrade() else {
            return false;
        };
        match reg.metadata.stream_owner(name).await {
            Ok(Some(_)) => return true,
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(stream = name, error = %e, "cannot read the owner of a moved stream");
                return false;
            }
        }
        let waited = quire_clock::elapsed(started);
        let behind = reg.placement.peer_acquiring(to) >= TARGET_BEHIND;
        if waited >= SETTLE_MAX || (waited >= SETTLE_IDLE && !behind) {
            return false;
        }
    }
}

/// One move: the release of a claimed stream ([`release`]), then the wait for its new owner
/// ([`settle`]); the caller's window holds its place until then.
async fn move_stream(registry: Weak<Registry>, handle: Arc<StreamHandle>, to: String) {
    let started = quire_clock::now();
    release(handle.clone()).await;
    let released_ms = quire_clock::elapsed(started).as_millis() as u64;
    let taken = settle(&registry, &handle.name, &to).await;
    tracing::debug!(
        stream = %handle.name,
        %to,
        released_ms,
        settled_ms = quire_clock::elapsed(started).as_millis() as u64,
        taken,
        "moved stream"
    );
}

/// A drain's first step with balancing on: leaves the registry, keeps serving until the
/// other proxies have dropped this one from their views ([`await_views`], at most
/// [`LEAVE_SEEN_MAX`]; a fixed wait of 1.5 ticks was too short when ZooKeeper answered
/// slowly, and the others redirected released streams back here), then releases
/// every owned stream to its preferred owner among them, [`HAND_OVER_PARALLEL`] moves under
/// way at a time (a move ends when the new owner has acquired the stream, see
/// [`move_stream`]), as the balancer does. A writer of a stream sees one redirect and a pause of about its own
/// release; a stream whose release has not come yet is served here meanwhile (not refused
/// with `SERVICE_UNAVAILABLE`, which after a few hops ends in the client giving up while the
/// lease still names this proxy). Returns the streams released; 0 (nothing done but leaving
/// the registry) with balancing off or no other live proxy.
pub(super) async fn hand_over(reg: &Arc<Registry>) -> usize {
    if !reg.placement.leave(&*reg.metadata).await {
        return 0;
    }
    let started = quire_clock::now();
    let seen = await_views(reg).await;
    let waited = quire_clock::elapsed(started);
    let mut released = 0;
    let mut moves = tokio::task::JoinSet::new();
    for handle in reg.owned_all() {
        while moves.len() >= HAND_OVER_PARALLEL {
            moves.join_next().await;
        }
        let home = handle.shared.home_region.get().map(String::as_str);
        let Some(to) = reg.placement.preferred_elsewhere(&handle.name, home) else {
            continue;
        };
        if claim(reg, &handle, to.clone()) {
            released += 1;
            moves.spawn(move_stream(Arc::downgrade(reg), handle, to));
        }
    }
    while moves.join_next().await.is_some() {}
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

/// One move counted in the balancer's window while it is under way.
struct InWindow(Arc<AtomicUsize>);

impl Drop for InWindow {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The balancer: every [`BALANCE_TICK`], the registry heartbeat and view, then up to
/// `moves_per_sec` moves per second of owned streams preferred elsewhere, at most
/// [`MOVE_WINDOW`] under way ([`move_stream`]) and none toward a proxy that is behind
/// ([`TARGET_BEHIND`]). Ends when the manager is dropped or shuts down.
pub(super) async fn balance_loop(registry: Weak<Registry>, moves_per_sec: u32) {
    let mut tick = tokio::time::interval(BALANCE_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let per_tick = f64::from(moves_per_sec) * BALANCE_TICK.as_secs_f64();
    let mut budget = 0.0f64;
    let under_way = Arc::new(AtomicUsize::new(0));
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
            // leave; a move before that would be redirected back here. Its moves wait on
            // the others' acquisitions under way: keep the view fresh.
            if let Err(e) = reg.placement.refresh_view(&*reg.metadata).await {
                tracing::warn!(error = %e, "reading the proxy registry during a drain failed");
            }
            continue;
        }
        budget = (budget + per_tick).min(per_tick.max(1.0));
        // A home region marked unavailable takes no streams back.
        let marked = reg.metadata.unavailable_regions().await.unwrap_or_default();
        for handle in reg.owned_all() {
            if budget < 1.0 || under_way.load(Ordering::SeqCst) >= MOVE_WINDOW {
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
            if reg.placement.peer_acquiring(&to) >= TARGET_BEHIND {
                continue; // back-pressure: it has not acquired what it was given yet
            }
            if !claim(&reg, &handle, to.clone()) {
                continue; // a release is already queued
            }
            budget -= 1.0;
            under_way.fetch_add(1, Ordering::SeqCst);
            let counted = InWindow(under_way.clone());
            let weak = registry.clone();
            drop(tokio::spawn(async move {
                move_stream(weak, handle, to).await;
                drop(counted);
            }));
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

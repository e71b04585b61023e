//! The balancer (`placement.rs` has the rules): every [`BALANCE_TICK`] the proxy-registry
//! heartbeat and view, then rate-limited releases of owned streams whose preferred owner is
//! another live proxy, through the registry like the lifecycle sweep (`sweep.rs`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use tokio::sync::oneshot;

use super::command::Command;
use super::placement::BALANCE_TICK;
use super::registry::Registry;

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
        if let Err(e) = reg.placement.tick(&*reg.metadata, reg.owned_count()).await {
            tracing::warn!(error = %e, "proxy registry heartbeat failed");
            continue;
        }
        if !reg.placement.enabled() {
            continue; // registered for the view only: balancing is off
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
            {
                let mut moved = handle.shared.moved_to.lock().expect("moved lock");
                if moved.is_some() {
                    continue; // a release is already queued
                }
                *moved = Some(to.clone());
            }
            budget -= 1.0;
            reg.layer
                .released_for_balance
                .fetch_add(1, Ordering::Relaxed);
            tracing::info!(stream = %handle.name, %to, "releasing the stream to its preferred owner");
            drop(tokio::spawn(async move {
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

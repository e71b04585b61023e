//! ZooKeeper session metrics of a process (docs/metrics.md): every ZooKeeper session the
//! process opens through [`crate::metadata::MetadataAddress::connect_zk`] (a bookie's
//! registration, its autorecovery daemon's, a proxy's) is tracked while it lives.
//! * `quire_zookeeper_sessions`: gauge, sessions open now;
//! * `quire_zookeeper_sessions_connected`: gauge, those connected now (ZooKeeper's
//!   `SyncConnected` or `ConnectedReadOnly`; a session between servers is not);
//! * `quire_zookeeper_sessions_lost`: counter, sessions that ended expired, closed or with an
//!   authentication failure (`ZkStore::session_lost`): what a bookie's registration and a
//!   proxy's stream leases die of.

use std::sync::{Arc, Mutex, OnceLock, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use quire_metadata::ZkStore;

#[derive(Default)]
struct Sessions {
    open: Mutex<Vec<Weak<ZkStore>>>,
    lost: Counter,
}

fn sessions() -> &'static Sessions {
    static S: OnceLock<Sessions> = OnceLock::new();
    S.get_or_init(Sessions::default)
}

/// Tracks `store`'s session from now on (called from a tokio runtime: a task counts its loss).
pub fn track(store: &Arc<ZkStore>) {
    let s = sessions();
    let mut open = s.open.lock().unwrap_or_else(|p| p.into_inner());
    open.retain(|w| w.strong_count() > 0);
    open.push(Arc::downgrade(store));
    let mut lost = store.session_lost();
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            if lost.wait_for(|l| *l).await.is_ok() {
                sessions().lost.inc();
            }
        });
    }
}

/// Registers the session metrics in `registry`.
pub fn register(registry: &mut Registry) {
    registry.register(
        "quire_zookeeper_sessions_lost",
        "ZooKeeper sessions of this process that expired, closed or failed authentication",
        sessions().lost.clone(),
    );
    registry.register_collector(Box::new(SessionGauges));
}

#[derive(Debug)]
struct SessionGauges;

impl Collector for SessionGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use zookeeper_client::SessionState;
        let stores: Vec<Arc<ZkStore>> = sessions()
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|s| !*s.session_lost().borrow())
            .collect();
        let connected = stores
            .iter()
            .filter(|s| {
                matches!(
                    s.client().state(),
                    SessionState::SyncConnected | SessionState::ConnectedReadOnly
                )
            })
            .count();
        for (name, help, v) in [
            (
                "quire_zookeeper_sessions",
                "ZooKeeper sessions of this process open now.",
                stores.len(),
            ),
            (
                "quire_zookeeper_sessions_connected",
                "ZooKeeper sessions of this process connected to a server now.",
                connected,
            ),
        ] {
            let g = ConstGauge::new(v as i64);
            g.encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
        }
        Ok(())
    }
}

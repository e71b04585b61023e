//! Balanced ownership over the live proxies: the proxy registry, placement by rendezvous
//! hashing (a leaf: `registry.rs` asks it before taking a lease), and what the balancer
//! (`balance.rs`) does with it.
//!
//! * **Registry.** Every proxy with an advertised address (balancing on or off, see below)
//!   writes its [`ProxyInfo`] (owned
//!   streams, a heartbeat counter) into the metadata store every [`BALANCE_TICK`] (ZooKeeper:
//!   the EPHEMERAL node `proxies/<address>`, gone with its session) and reads everyone's. A
//!   proxy counts as live while its heartbeat moved within the last [`STALE_TICKS`] ticks by
//!   the reader's own clock (no clock comparison across machines), so a stopped or partitioned
//!   proxy stops receiving streams within about 5 s, before its session expires.
//! * **Every proxy registers.** A proxy with an advertised address keeps its record and its
//!   view of the others (with their regions) also with balancing off
//!   (`balance_moves_per_sec = 0`): the view is what home-region redirects need; only the
//!   moves below need balancing on.
//! * **Home region** (issue 30 item 4). A stream records the region it was created in
//!   (`StreamMetadata::home_region`). A proxy of another region asked to acquire it redirects
//!   to the live proxy of the home region with the highest rendezvous weight for the stream
//!   ([`Placement::home_redirect`]; every proxy computes the same one, so redirects do not
//!   bounce), unless that region is marked unavailable; with no live proxy there it acquires
//!   the stream itself. Inside the home region, balancing weighs that region's proxies only,
//!   so a redirect to the home region is never sent back out of it.
//! * **Placement.** A stream's preferred owner is the live proxy with the highest rendezvous
//!   weight `weight(stream, proxy)` (highest-random-weight hashing, Thaler and Ravishankar).
//!   Chosen over a ring because with a handful of proxies it spreads evenly without virtual
//!   nodes, a join moves exactly the streams whose new top is the joiner (about 1/N of them)
//!   and a leave moves only the leaver's, and because weights are fixed per (stream, proxy):
//!   a proxy redirects only to a proxy of strictly higher weight than itself, so a chain of
//!   redirects between proxies with different views climbs and cannot loop (no livelock; the
//!   client's `redirects_max` bounds it too). Load is not a tie-breaker (ties need equal 64-bit
//!   weights; they fall to the larger address).
//! * A proxy asked for a stream that nobody owns and whose preferred owner is another live
//!   proxy answers `STREAM_OWNED_ELSEWHERE` with that address instead of taking it
//!   (`registry.rs`). A stream someone owns stays where it is until the balancer moves it.
//! * **Balancer** (`balance.rs`, which works through the registry). Each tick a proxy releases owned streams whose preferred owner is another
//!   live proxy, at most `balance_moves_per_sec` per second, through the writer's release
//!   path (in-flight adds awaited, the open segment completed, the lease given up): queued and
//!   later requests for it are redirected to the new owner, which acquires it on the next
//!   request. So a joining proxy takes its share within about share / rate seconds plus a
//!   tick or two; a drained proxy leaves the registry first, keeps serving for a tick and a
//!   half while the others drop it from their views, then releases every stream to its
//!   preferred owner among them like the balancer (`balance::hand_over`: without that wait the
//!   others kept redirecting released streams to the stopping proxy, and writers failed), and
//!   a dead one's leases expire with its session.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use quire_metadata::{MetadataStore, ProxyInfo};

use super::shared::now_ms;

/// How often a proxy rewrites its registry record, reads the others' and balances.
pub(super) const BALANCE_TICK: Duration = Duration::from_secs(1);
/// A proxy whose heartbeat has not moved for this many ticks is not live.
pub(super) const STALE_TICKS: u32 = 5;

/// The rendezvous weight of `proxy` for `stream`: 64-bit FNV-1a over the proxy address, a 0
/// byte and the stream name, then the SplitMix64 finalizer (FNV alone mixes its last bytes
/// poorly). Stable across processes, versions and platforms: every proxy must compute the
/// same placement.
pub fn rendezvous_weight(stream: &str, proxy: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in proxy.bytes().chain([0u8]).chain(stream.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The preferred owner of `stream` among `proxies`: the highest weight, ties to the larger
/// address. `None` for no proxies.
pub fn preferred_owner<'a>(
    stream: &str,
    proxies: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    proxies
        .into_iter()
        .max_by_key(|p| (rendezvous_weight(stream, p), *p))
}

/// This proxy's view of the live proxies and its own registration.
pub(super) struct Placement {
    identity: String,
    /// Region and rack for the registry record.
    labels: (Option<String>, Option<String>),
    /// Off without an advertised address or with `balance_moves_per_sec = 0`.
    enabled: bool,
    /// Registers and keeps a view of the others: on with an advertised address.
    registers: bool,
    /// The other proxies seen live at the last tick, with their regions (unlabelled:
    /// `default-region`).
    live: Mutex<Vec<(String, String)>>,
    /// Each other proxy's last heartbeat and when it was seen to change (by this clock).
    seen: Mutex<HashMap<String, (u64, Instant)>>,
    /// The heartbeat counter; `None` once stopped (a drain): never registers again.
    heartbeat: tokio::sync::Mutex<Option<u64>>,
    /// Set by [`Placement::leave`]: this proxy no longer counts itself as a candidate owner.
    leaving: std::sync::atomic::AtomicBool,
}

impl Placement {
    pub(super) fn new(identity: &str, owner_address: &str, moves_per_sec: u32) -> Self {
        Self {
            identity: identity.to_string(),
            labels: (None, None),
            enabled: !owner_address.is_empty() && moves_per_sec > 0,
            registers: !owner_address.is_empty(),
            live: Mutex::default(),
            seen: Mutex::default(),
            heartbeat: tokio::sync::Mutex::new(Some(0)),
            leaving: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The region and rack written in this proxy's registry record.
    pub(super) fn with_labels(mut self, labels: (Option<String>, Option<String>)) -> Self {
        self.labels = labels;
        self
    }

    pub(super) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether [`Placement::leave`] ran (a drain's hand-over is under way).
    pub(super) fn leaving(&self) -> bool {
        self.leaving.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether this proxy registers (and so runs the registry tick).
    pub(super) fn registers(&self) -> bool {
        self.registers
    }

    /// This proxy's region (`default-region` when unlabelled).
    pub(super) fn region(&self) -> &str {
        self.labels
            .0
            .as_deref()
            .unwrap_or(quire_ledger::placement::DEFAULT_REGION)
    }

    /// The preferred owner of `stream` when it is another live proxy. With `home` this
    /// proxy's own region, only the live proxies of that region are weighed (see the module
    /// docs); otherwise all of them.
    pub(super) fn preferred_elsewhere(&self, stream: &str, home: Option<&str>) -> Option<String> {
        if !self.enabled {
            return None;
        }
        let live = self.live.lock().expect("live lock");
        let same_region = home == Some(self.region());
        // A leaving proxy (a drain) weighs only the others: every stream is preferred elsewhere.
        let me = (!self.leaving()).then_some(self.identity.as_str());
        let all = live
            .iter()
            .filter(|(_, r)| !same_region || r == self.region())
            .map(|(a, _)| a.as_str())
            .chain(me);
        preferred_owner(stream, all)
            .filter(|p| *p != self.identity)
            .map(str::to_string)
    }

    /// Where a stream whose home region is `home` goes instead of being acquired here: the
    /// live proxy of `home` with the highest rendezvous weight for it, when `home` is another
    /// region than this proxy's and one of its proxies is live; `None`: acquire it here.
    pub(super) fn home_redirect(&self, stream: &str, home: &str) -> Option<String> {
        if !self.registers || home == self.region() {
            return None;
        }
        let live = self.live.lock().expect("live lock");
        let in_home = live
            .iter()
            .filter(|(_, r)| r == home)
            .map(|(a, _)| a.as_str());
        preferred_owner(stream, in_home).map(str::to_string)
    }

    /// Takes a registry listing read at `now` as the new view of the live proxies.
    fn update_view(&self, list: Vec<ProxyInfo>, now: Instant) {
        let stale = BALANCE_TICK * STALE_TICKS;
        let mut seen = self.seen.lock().expect("seen lock");
        let mut live = Vec::new();
        let mut present = HashMap::new();
        for info in list {
            if info.address == self.identity {
                continue;
            }
            let changed = match seen.get(&info.address) {
                Some((hb, at)) if *hb == info.heartbeat => *at,
                _ => now,
            };
            if now.duration_since(changed) < stale {
                let region = info
                    .region
                    .clone()
                    .unwrap_or_else(|| quire_ledger::placement::DEFAULT_REGION.to_string());
                live.push((info.address.clone(), region));
            }
            present.insert(info.address, (info.heartbeat, changed));
        }
        *seen = present;
        *self.live.lock().expect("live lock") = live;
    }

    /// Rewrites this proxy's record (unless stopped) and reads the registry.
    pub(super) async fn tick(
        &self,
        metadata: &dyn MetadataStore,
        owned: usize,
    ) -> quire_metadata::Result<()> {
        {
            let mut hb = self.heartbeat.lock().await;
            let Some(n) = hb.as_mut() else {
                return Ok(());
            };
            *n += 1;
            let info = ProxyInfo {
                address: self.identity.clone(),
                owned_streams: owned as u64,
                heartbeat: *n,
                updated_ms: now_ms(),
                region: self.labels.0.clone(),
                rack: self.labels.1.clone(),
            };
            metadata.register_proxy(&info).await?;
        }
        let list = metadata.list_proxies().await?;
        self.update_view(list, quire_clock::now());
        Ok(())
    }

    /// Leaves the registry for good (a drain), keeping the view of the others: from now on
    /// [`Placement::preferred_elsewhere`] names another live proxy for every stream, and the
    /// others drop this one from their views at their next tick. Returns whether balancing is
    /// on and another proxy is live (the streams then have somewhere to go); false also when
    /// already left.
    pub(super) async fn leave(&self, metadata: &dyn MetadataStore) -> bool {
        if !self.registers {
            return false;
        }
        let mut hb = self.heartbeat.lock().await;
        if hb.take().is_none() {
            return false;
        }
        self.leaving
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Err(e) = metadata.unregister_proxy(&self.identity).await {
            tracing::warn!(error = %e, "leaving the proxy registry failed");
        }
        self.enabled && !self.live.lock().expect("live lock").is_empty()
    }

    /// The live proxies of this proxy's view (without itself), as addresses.
    pub(super) fn live_peers(&self) -> Vec<String> {
        let live = self.live.lock().expect("live lock");
        live.iter().map(|(a, _)| a.clone()).collect()
    }

    /// Leaves the registry for good (a drain or shutdown; a no-op after [`Placement::leave`]
    /// but for the view) and forgets the view, so that the other proxies stop redirecting
    /// streams here at their next tick.
    pub(super) async fn stop(&self, metadata: &dyn MetadataStore) {
        self.leave(metadata).await;
        self.live.lock().expect("live lock").clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_proxies_share_streams_evenly_and_a_fourth_takes_only_its_share() {
        // Goal: rendezvous placement spreads 3000 names within ±10 % of the mean over three
        // proxies, and adding a fourth moves only streams to the newcomer (about a quarter).
        let three = ["127.0.0.1:4001", "127.0.0.1:4002", "127.0.0.1:4003"];
        let four = [three[0], three[1], three[2], "127.0.0.1:4004"];
        let mut counts = HashMap::new();
        let mut moved = 0;
        for i in 0..3000 {
            let s = format!("stream-{i}");
            let a = preferred_owner(&s, three).unwrap();
            *counts.entry(a).or_insert(0) += 1;
            let b = preferred_owner(&s, four).unwrap();
            if a != b {
                assert_eq!(b, four[3], "{s} moved between old proxies");
                moved += 1;
            }
        }
        for (p, n) in counts {
            assert!((900..=1100).contains(&n), "{p} got {n} of 3000");
        }
        assert!((600..=900).contains(&moved), "{moved} moved to the fourth");
    }

    #[test]
    fn home_redirect_goes_to_the_top_live_proxy_of_the_home_region() {
        // Goal: a proxy outside the home region names the home region's top-weighted live
        // proxy (the same from every proxy), none when the home region has no live proxy or is
        // its own; inside the home region balancing weighs only that region's proxies.
        let info = |a: &str, r: &str| ProxyInfo {
            address: a.into(),
            owned_streams: 0,
            heartbeat: 1,
            updated_ms: 0,
            region: Some(r.into()),
            rack: None,
        };
        let b = Placement::new("b:1", "b:1", 0).with_labels((Some("rb".into()), None));
        let t0 = quire_clock::now();
        b.update_view(
            vec![info("a:1", "ra"), info("a:2", "ra"), info("c:1", "rc")],
            t0,
        );
        let want = preferred_owner("s", ["a:1", "a:2"]).unwrap();
        assert_eq!(b.home_redirect("s", "ra").as_deref(), Some(want));
        assert_eq!(b.home_redirect("s", "rb"), None);
        assert_eq!(b.home_redirect("s", "rx"), None);
        assert_eq!(
            b.preferred_elsewhere("s", Some("ra")),
            None,
            "balancing is off"
        );
        let a = Placement::new("a:1", "a:1", 10).with_labels((Some("ra".into()), None));
        a.update_view(vec![info("a:2", "ra"), info("b:1", "rb")], t0);
        for i in 0..50 {
            let s = format!("s{i}");
            let p = a.preferred_elsewhere(&s, Some("ra"));
            assert!(p.is_none() || p.as_deref() == Some("a:2"), "{s} -> {p:?}");
        }
    }

    #[test]
    fn a_leaving_proxy_prefers_the_others_for_every_stream() {
        // Goal: once a proxy leaves (a drain's hand-over), it names another live proxy as the
        // preferred owner of every stream, the one the remaining proxies agree on.
        let info = |a: &str| ProxyInfo {
            address: a.into(),
            owned_streams: 0,
            heartbeat: 1,
            updated_ms: 0,
            region: None,
            rack: None,
        };
        let p = Placement::new("a:1", "a:1", 10);
        p.update_view(vec![info("b:1"), info("c:1")], quire_clock::now());
        let mine = (0..300)
            .filter(|i| p.preferred_elsewhere(&format!("s{i}"), None).is_none())
            .count();
        assert!(
            mine > 50,
            "only {mine} of 300 preferred here before leaving"
        );
        p.leaving.store(true, std::sync::atomic::Ordering::SeqCst);
        for i in 0..300 {
            let s = format!("s{i}");
            let want = preferred_owner(&s, ["b:1", "c:1"]);
            assert_eq!(p.preferred_elsewhere(&s, None).as_deref(), want, "{s}");
        }
    }

    #[test]
    fn a_proxy_whose_heartbeat_stops_leaves_the_view() {
        let p = Placement::new("a:1", "a:1", 10);
        let info = |hb| ProxyInfo {
            address: "b:1".into(),
            owned_streams: 0,
            heartbeat: hb,
            updated_ms: 0,
            region: None,
            rack: None,
        };
        let t0 = quire_clock::now();
        p.update_view(vec![info(1)], t0);
        assert_eq!(p.live.lock().unwrap().len(), 1);
        p.update_view(vec![info(1)], t0 + BALANCE_TICK * STALE_TICKS);
        assert!(p.live.lock().unwrap().is_empty());
        p.update_view(vec![info(2)], t0 + BALANCE_TICK * (STALE_TICKS + 1));
        assert_eq!(p.live.lock().unwrap().len(), 1);
    }
}

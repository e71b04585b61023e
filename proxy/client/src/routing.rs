//! Which proxy to ask: the home proxy, the cached owner of a stream, or the owner a redirect
//! named.
//!
//! A client talks to the proxy it was connected to (its *home* proxy). A request for a stream
//! that another proxy owns is answered with a redirect (`STREAM_OWNED_ELSEWHERE`, the owner's
//! address as message); the [`Router`] then connects to the owner (connections are kept, one
//! per proxy), remembers the owner of the stream and resends, up to
//! [`ClientConfig::redirects_max`] times, as DistributedLog's client does with `FOUND` and its
//! ownership cache. Later requests for that stream go straight to the cached owner.
//!
//! A redirect whose target refuses the connection (a drained proxy that has closed, named by
//! a proxy whose view of the live proxies still lags) sends the request back to the home
//! proxy, which by then may name the new owner, within the same `redirects_max` hops; so does
//! a request whose connection closed before it went out. A drained proxy's last answer on a
//! connection is a connection-level `SERVICE_UNAVAILABLE` (request id 0): every request it
//! did not answer before it was not read, and is sent elsewhere as below.
//!
//! Failover: the client may know several proxies (the address connected to, then
//! [`ClientConfig::proxies`]). When its home proxy cannot be reached (connect errors, no
//! handshake answer) or answers `SERVICE_UNAVAILABLE` (shutting down, or at its connection
//! limit), the next address in the list becomes the home proxy, round robin, as
//! DistributedLog's client skips a host marked down. A request already sent when a connection
//! is lost is never resent here: whether it may be is the caller's decision (reads are;
//! writes only inside a producer session, see `producer.rs`).
//!
//! Regions: with [`ClientConfig::regions`] the list is the local region's proxies, then the
//! next region's, and so on (then `ClientConfig::proxies`), so an unreachable or shutting-down
//! region is passed over by the same failover. A home proxy answering `REGION_UNAVAILABLE`
//! (its region is marked as taking no new streams) makes the first proxy of the next region
//! not yet refused the home proxy, and the request is sent again there (nothing was done);
//! once every region refused, the request fails with that answer.
//!
//! Return to the local region: once the home proxy is outside the local region (the first of
//! [`ClientConfig::regions`]), the client tries the local region's proxies again every
//! [`ClientConfig::local_region_retry`], on the first request after that much time: the first
//! local proxy that answers the handshake becomes the home proxy. If it answers a request
//! `REGION_UNAVAILABLE` (the mark is still there), the failover above takes the client away
//! again and the back-off starts over; if no local proxy answers, the home stays where it is
//! until the next try. A request pays for one such try at most (a connect, bounded by
//! `connect_timeout` per local proxy).
//!
//! `TOO_MANY_STREAMS` (the proxy owns its `owned_streams_max` streams and did nothing) is
//! redirectable, as in DistributedLog: the request goes to the next proxy of the list that has
//! not refused it, for this stream only (the home proxy stays), and fails with
//! `TOO_MANY_STREAMS` once every proxy known has refused or cannot be reached. A proxy that
//! takes the stream is remembered as its owner.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quire_tls::rustls::pki_types::ServerName;
use tokio::net::ToSocketAddrs;
use tokio::time::Instant;

use crate::config::ClientConfig;
use crate::connection::Connection;
use crate::error::{Error, ErrorCode, Result};
use crate::protocol::{Request, Response};

/// Pause before following a redirect again within one request (DistributedLog
/// `redirectBackoffStartMs`); doubled per hop up to [`REDIRECT_BACKOFF_MAX`].
const REDIRECT_BACKOFF_START: Duration = Duration::from_millis(25);
/// Longest pause between redirects (DistributedLog `redirectBackoffMaxMs`).
const REDIRECT_BACKOFF_MAX: Duration = Duration::from_millis(100);

/// The connections of one client and the ownership cache that picks among them.
pub(crate) struct Router {
    /// Every proxy this client may take as its home: the address connected to first, then
    /// the proxies of `ClientConfig::regions` and `ClientConfig::proxies` (without repeats).
    proxies: Vec<String>,
    /// Each proxy's region, as an index into `ClientConfig::regions` (`regions.len()`: the
    /// unlabelled group of `ClientConfig::proxies`), parallel to `proxies`.
    groups: Vec<usize>,
    /// The name the first proxy's certificate carries (TLS only), checked again on reconnects.
    home_name: Option<ServerName<'static>>,
    /// The index in `proxies` of the home proxy and the connection to it; replaced when the
    /// proxy closed it (idle timeout, restart) or a failover picked another proxy.
    home: Mutex<(usize, Arc<Connection>)>,
    /// Held while the home connection is replaced, so that concurrent callers reconnect once.
    reconnecting: tokio::sync::Mutex<()>,
    config: ClientConfig,
    /// Connections to other proxies, by the address their redirects named.
    others: tokio::sync::Mutex<HashMap<String, Arc<Connection>>>,
    /// Ownership cache: stream -> owner address (DistributedLog `OwnershipCache`).
    owners: Mutex<HashMap<String, String>>,
    /// Reads go to the home proxy, which serves them whoever owns the stream (follower reads);
    /// only a proxy that still redirects reads (an older one) puts the owner it named here,
    /// Only a proxy that still redirects reads (an older one) puts the owner it named here,
    /// and later reads of that stream go there.
    read_owners: Mutex<HashMap<String, String>>,
    /// When the local region is tried again (see the module docs, "Return to the local
    /// region"); `None` while the home proxy is in the local region or without regions.
    local_retry_at: Mutex<Option<Instant>>,
}

/// Where one routed request stands between its attempts.
struct Route {
    /// The proxy to send to next; `None`: the home proxy.
    target: Option<String>,
    /// Whether `target` came from the ownership cache (not from a redirect just answered).
    from_cache: bool,
    /// Redirects (and owners found shutting down) so far.
    hops: u32,
    /// The pause before the next redirect is followed.
    backoff: Duration,
    /// A read: routed by `Router::read_owners`, not the ownership cache.
    reads: bool,
    /// The regions (`Router::groups`) whose proxy answered this request
    /// `REGION_UNAVAILABLE`.
    unavailable: Vec<usize>,
    /// Proxies that answered this request `TOO_MANY_STREAMS` (or could not be reached when
    /// tried after one did), and the last such answer; `target` is then a proxy to try.
    too_many: Option<(Vec<String>, Error)>,
}

impl Route {
    /// A route to `target` (from a route cache), else to the home proxy, before any attempt.
    fn new(target: Option<String>, reads: bool) -> Self {
        Self {
            from_cache: target.is_some(),
            target,
            hops: 0,
            backoff: REDIRECT_BACKOFF_START,
            reads,
            unavailable: Vec::new(),
            too_many: None,
        }
    }
}

impl Router {
    /// Connects to the home proxy.
    ///
    /// # Errors
    /// As `Connection::connect`.
    pub(crate) async fn connect(addr: impl ToSocketAddrs, config: ClientConfig) -> Result<Self> {
        let first = Connection::connect(addr, config.clone(), None).await;
        let home = match first {
            Ok(c) => c,
            Err(e) if config.proxies.is_empty() && config.regions.is_empty() => return Err(e),
            Err(e) => {
                tracing::debug!(error = %e, "the first proxy is unreachable; trying the others");
                return Self::connect_list(config).await;
            }
        };
        let proxies = Self::listed(Some(home.addr.clone()), &config);
        Ok(Self::with_home(proxies, 0, home, config))
    }

    /// `first` (the address connected to, if any), the proxies of `config.regions` in order,
    /// then `config.proxies`, each once.
    fn listed(first: Option<String>, config: &ClientConfig) -> Vec<String> {
        let all = config
            .regions
            .iter()
            .flat_map(|r| r.proxies.iter())
            .chain(config.proxies.iter())
            .cloned();
        let mut proxies: Vec<String> = Vec::new();
        for a in first.into_iter().chain(all) {
            if !proxies.contains(&a) {
                proxies.push(a);
            }
        }
        proxies
    }

    /// The region group of `addr` (see `Router::groups`).
    fn group_of(config: &ClientConfig, addr: &str) -> usize {
        config
            .regions
            .iter()
            .position(|r| r.proxies.iter().any(|p| p == addr))
            .unwrap_or(config.regions.len())
    }

    /// Connects to the first of `config.proxies` that answers.
    ///
    /// # Errors
    /// `BadRequest` for an empty list; else the last proxy's connect error.
    pub(crate) async fn connect_list(config: ClientConfig) -> Result<Self> {
        let proxies = Self::listed(None, &config);
        let mut last = Error::BadRequest {
            reason: "no proxy address given".into(),
        };
        for (i, addr) in proxies.iter().enumerate() {
            match Connection::connect(addr.as_str(), config.clone(), None).await {
                Ok(c) => return Ok(Self::with_home(proxies.clone(), i, c, config)),
                Err(e) => {
                    tracing::debug!(proxy = %addr, error = %e, "proxy unreachable; trying the next");
                    last = e;
                }
            }
        }
        Err(last)
    }

    fn with_home(proxies: Vec<String>, i: usize, home: Connection, config: ClientConfig) -> Self {
        let groups: Vec<usize> = proxies.iter().map(|p| Self::group_of(&config, p)).collect();
        let local_retry_at = Self::retry_after_leaving(&config, groups[i], None);
        Self {
            proxies,
            groups,
            home_name: home.tls_name.clone(),
            home: Mutex::new((i, Arc::new(home))),
            reconnecting: tokio::sync::Mutex::new(()),
            config,
            others: tokio::sync::Mutex::new(HashMap::new()),
            owners: Mutex::new(HashMap::new()),
            read_owners: Mutex::new(HashMap::new()),
            local_retry_at: Mutex::new(local_retry_at),
        }
    }

    /// When to try the local region again once the home proxy is in region group `group`:
    /// `None` in the local region (or without regions), else `previous` if a try is already
    /// planned, else one `local_region_retry` from now.
    fn retry_after_leaving(
        config: &ClientConfig,
        group: usize,
        previous: Option<Instant>,
    ) -> Option<Instant> {
        if config.regions.is_empty() || group == 0 {
            return None;
        }
        previous.or_else(|| Some(Instant::now() + config.local_region_retry))
    }

    /// Makes proxy `i` the home proxy, over `conn`, and plans the return to the local region
    /// when `i` is outside it.
    fn set_home(&self, i: usize, conn: Arc<Connection>) {
        *self.home.lock().expect("home lock") = (i, conn);
        let mut at = self.local_retry_at.lock().expect("local retry lock");
        *at = Self::retry_after_leaving(&self.config, self.groups[i], *at);
    }

    /// Whether the local region is due to be tried again.
    fn local_retry_due(&self) -> bool {
        self.local_retry_at
            .lock()
            .expect("local retry lock")
            .is_some_and(|at| Instant::now() >= at)
    }

    /// Connects to proxy `i` of the list (the first one checked against the first
    /// certificate name).
    async fn connect_index(&self, i: usize) -> Result<Connection> {
        let name = if i == 0 { self.home_name.clone() } else { None };
        Connection::connect(self.proxies[i].as_str(), self.config.clone(), name).await
    }

    /// Tries the local region's proxies in order and makes the first that answers the home
    /// proxy; when none answers, the next try is one `local_region_retry` away. Called with
    /// `reconnecting` held.
    async fn return_to_local(&self) {
        for i in (0..self.proxies.len()).filter(|i| self.groups[*i] == 0) {
            match self.connect_index(i).await {
                Ok(c) => {
                    tracing::debug!(proxy = %self.proxies[i], "back to the local region");
                    self.set_home(i, Arc::new(c));
                    return;
                }
                Err(e) => {
                    tracing::debug!(proxy = %self.proxies[i], error = %e, "local proxy unreachable")
                }
            }
        }
        *self.local_retry_at.lock().expect("local retry lock") =
            Some(Instant::now() + self.config.local_region_retry);
    }

    /// Whether this client's writes ask for LZ4 (`ClientConfig::compression`).
    pub(crate) fn compress_writes(&self) -> bool {
        self.config.compression == crate::compression::Compression::Lz4
    }

    /// The home proxy's address.
    pub(crate) fn home_addr(&self) -> String {
        self.home.lock().expect("home lock").1.addr.clone()
    }

    /// The frame and record limits the home proxy announced.
    pub(crate) fn home_limits(&self) -> (u32, u32) {
        let home = &self.home.lock().expect("home lock").1;
        (home.frame_size_bytes_max, home.record_size_bytes_max)
    }

    /// The owner this client last learned for `stream` from a redirect, if any.
    pub(crate) fn cached_owner(&self, stream: &str) -> Option<String> {
        self.owners
            .lock()
            .expect("owners lock")
            .get(stream)
            .cloned()
    }

    /// Drops `stream` from the ownership cache: its next request asks the home proxy.
    pub(crate) fn forget_owner(&self, stream: &str) {
        self.owners.lock().expect("owners lock").remove(stream);
    }

    /// The map a route is cached in: the ownership cache, or for reads `read_owners`.
    fn route_cache(&self, reads: bool) -> &Mutex<HashMap<String, String>> {
        if reads {
            &self.read_owners
        } else {
            &self.owners
        }
    }

    fn forget_route(&self, stream: &str, reads: bool) {
        self.route_cache(reads)
            .lock()
            .expect("owners lock")
            .remove(stream);
    }

    /// The connection to the home proxy, connecting again (with a new handshake) if the proxy
    /// closed the previous one, for example after its idle timeout, and failing over to the
    /// next proxy of the list when it cannot be reached. Safe: nothing of the request about to
    /// be sent went over the closed connection.
    ///
    /// # Errors
    /// The last proxy's connect error when none of them answers.
    pub(crate) async fn home(&self) -> Result<Arc<Connection>> {
        if self.local_retry_due() {
            let _one = self.reconnecting.lock().await;
            if self.local_retry_due() {
                self.return_to_local().await;
            }
        }
        let (index, current) = self.home.lock().expect("home lock").clone();
        if !current.is_closed() {
            return Ok(current);
        }
        let _one = self.reconnecting.lock().await;
        let (now, conn) = self.home.lock().expect("home lock").clone();
        if now != index || !conn.is_closed() {
            return Ok(conn); // another caller reconnected meanwhile
        }
        self.reconnect_home(index).await
    }

    /// Connects to the proxies from `start` on, round robin, and makes the first that answers
    /// the home proxy.
    async fn reconnect_home(&self, start: usize) -> Result<Arc<Connection>> {
        let mut last = None;
        for k in 0..self.proxies.len() {
            let i = (start + k) % self.proxies.len();
            let addr = &self.proxies[i];
            tracing::debug!(proxy = %addr, "connecting to the home proxy");
            match self.connect_index(i).await {
                Ok(c) => {
                    let c = Arc::new(c);
                    self.set_home(i, c.clone());
                    return Ok(c);
                }
                Err(e) => {
                    tracing::debug!(proxy = %addr, error = %e, "proxy unreachable");
                    last = Some(e);
                }
            }
        }
        Err(last.expect("at least one proxy"))
    }

    /// Gives up the home proxy (it answered `SERVICE_UNAVAILABLE`): the next request
    /// connects to the next proxy of the list.
    async fn skip_home(&self, conn: &Connection) {
        let _one = self.reconnecting.lock().await;
        let (index, current) = self.home.lock().expect("home lock").clone();
        if current.addr != conn.addr || self.proxies.len() < 2 {
            return;
        }
        if let Err(e) = self.reconnect_home(index + 1).await {
            tracing::debug!(error = %e, "no other proxy answers");
        }
    }

    /// The connection to `addr`: the home one, a kept one, or a new one.
    async fn connection_to(&self, addr: &str) -> Result<Arc<Connection>> {
        if addr == self.home_addr() {
            return self.home().await;
        }
        let mut others = self.others.lock().await;
        if let Some(c) = others.get(addr) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let name = match &self.config.tls {
            Some(_) => Some(quire_tls::server_name(addr).map_err(|e| Error::Tls {
                addr: addr.to_string(),
                reason: e.to_string(),
            })?),
            None => None,
        };
        let c = Arc::new(Connection::connect(addr, self.config.clone(), name).await?);
        others.insert(addr.to_string(), c.clone());
        Ok(c)
    }

    async fn drop_connection(&self, addr: &str) {
        self.others.lock().await.remove(addr);
    }

    /// Sends a request about `stream` to its owner as far as known (the cached owner, else the
    /// home proxy) and follows redirects.
    ///
    /// # Errors
    /// The connection's errors; `RedirectFailed` when the owner cannot be reached, the
    /// redirects go round more than `redirects_max` times, or the owner is an earlier session
    /// of the proxy that redirects.
    pub(crate) async fn call_stream(
        &self,
        stream: &str,
        req: &Request,
        extra_wait: Duration,
    ) -> Result<Response> {
        self.call_routed(stream, req, extra_wait, false).await
    }

    /// As [`Router::call_stream`], for a read: sent to the home proxy, which serves it from
    /// its follower of the stream when another proxy owns it (docs/proxy-protocol.md, "Read"),
    /// so readers spread over the proxies their clients chose. A redirect (from a proxy older
    /// than follower reads) is still followed, and remembered for this stream's later reads.
    ///
    /// # Errors
    /// As [`Router::call_stream`].
    pub(crate) async fn call_read(
        &self,
        stream: &str,
        req: &Request,
        extra_wait: Duration,
    ) -> Result<Response> {
        self.call_routed(stream, req, extra_wait, true).await
    }

    /// Sends a request that the home proxy answers itself (`CREATE_STREAM` of `stream`),
    /// moving on to the next region's proxy when it answers `REGION_UNAVAILABLE` (see the
    /// module docs).
    ///
    /// # Errors
    /// The connection's errors; `REGION_UNAVAILABLE` once every region refused.
    pub(crate) async fn call_home(&self, stream: &str, req: &Request) -> Result<Response> {
        let mut route = Route::new(None, false);
        loop {
            let conn = self.home().await?;
            match conn.call(req, Duration::ZERO).await {
                Err(
                    e @ Error::Remote {
                        code: ErrorCode::RegionUnavailable,
                        ..
                    },
                ) => {
                    if let Some(done) = self.next_region(stream, &conn, &mut route, e).await {
                        return done;
                    }
                }
                other => return other,
            }
        }
    }

    async fn call_routed(
        &self,
        stream: &str,
        req: &Request,
        extra_wait: Duration,
        reads: bool,
    ) -> Result<Response> {
        let target = self
            .route_cache(reads)
            .lock()
            .expect("owners lock")
            .get(stream)
            .cloned();
        let mut route = Route::new(target, reads);
        loop {
            let Some(conn) = self.route_connection(stream, &mut route).await? else {
                continue;
            };
            let answer = conn.call(req, extra_wait).await;
            if let Some(done) = self.follow(stream, &conn, &mut route, answer).await {
                return done;
            }
        }
    }

    /// The connection to the route's target. `Ok(None)`: the cached owner was unreachable and
    /// the route now goes to the home proxy (nothing was sent).
    async fn route_connection(
        &self,
        stream: &str,
        route: &mut Route,
    ) -> Result<Option<Arc<Connection>>> {
        let Some(addr) = route.target.clone() else {
            return self.home().await.map(Some);
        };
        match self.connection_to(&addr).await {
            Ok(c) => Ok(Some(c)),
            Err(e) if route.too_many.is_some() => {
                tracing::debug!(stream, proxy = %addr, error = %e, "proxy unreachable");
                self.next_with_room(route, addr).map(|()| None)
            }
            Err(e) if route.from_cache => {
                // A stale cache entry: nothing was sent, ask the home proxy instead.
                tracing::debug!(stream, owner = %addr, error = %e, "cached owner unreachable");
                self.forget_route(stream, route.reads);
                route.target = None;
                route.from_cache = false;
                Ok(None)
            }
            Err(e) => {
                // The owner a redirect named refuses the connection (it stopped, or the
                // redirecting proxy's view of the live proxies lags a drain): nothing was
                // sent, so ask the home proxy again, which by then may name the new owner,
                // within the same redirect budget.
                self.forget_route(stream, route.reads);
                route.hops += 1;
                if route.hops > self.config.redirects_max {
                    return Err(Error::RedirectFailed {
                        stream: stream.to_string(),
                        owner: addr,
                        reason: format!(
                            "cannot connect: {e} (after {} redirects)",
                            self.config.redirects_max
                        ),
                    });
                }
                tracing::debug!(stream, owner = %addr, error = %e, "redirect target unreachable; asking the home proxy again");
                tokio::time::sleep(route.backoff).await;
                route.backoff = (route.backoff * 2).min(REDIRECT_BACKOFF_MAX);
                route.target = None;
                route.from_cache = false;
                Ok(None)
            }
        }
    }

    /// Acts on one answer from `conn`: `Some` is the request's outcome; `None`: send again,
    /// where `route` now points.
    async fn follow(
        &self,
        stream: &str,
        conn: &Connection,
        route: &mut Route,
        answer: Result<Response>,
    ) -> Option<Result<Response>> {
        match answer {
            Err(Error::Remote {
                code: ErrorCode::StreamOwnedElsewhere,
                message: owner,
            }) => self
                .redirect(stream, conn, route, owner)
                .await
                .err()
                .map(Err),
            Err(Error::Remote {
                code: ErrorCode::ServiceUnavailable,
                ..
            }) if route.target.is_none() && self.proxies.len() > 1 => {
                // The home proxy is shutting down or full: the next proxy of the list
                // becomes home, and asks again (nothing was done with the request).
                route.hops += 1;
                if route.hops > self.config.redirects_max {
                    return Some(Err(self.gave_up(stream, conn.addr.clone())));
                }
                self.skip_home(conn).await;
                None
            }
            Err(Error::Remote {
                code: ErrorCode::ServiceUnavailable,
                ..
            }) if route.target.is_some() => self.owner_unavailable(stream, conn, route).await,
            Err(
                e @ Error::Remote {
                    code: ErrorCode::RegionUnavailable,
                    ..
                },
            ) => self.next_region(stream, conn, route, e).await,
            Err(
                e @ Error::Remote {
                    code: ErrorCode::OwnershipLost,
                    ..
                },
            ) => {
                self.forget_route(stream, route.reads);
                Some(Err(e))
            }
            Err(
                e @ Error::Remote {
                    code: ErrorCode::TooManyStreams,
                    ..
                },
            ) => {
                // Nothing was done: try a proxy that has not refused (DistributedLog treats
                // TOO_MANY_STREAMS as redirectable).
                self.forget_route(stream, route.reads);
                route.too_many.get_or_insert_with(|| (Vec::new(), e));
                tracing::debug!(stream, proxy = %conn.addr, "proxy owns too many streams");
                self.next_with_room(route, conn.addr.clone()).err().map(Err)
            }
            Ok(r) if route.too_many.is_some() => {
                if let Some(addr) = &route.target {
                    self.route_cache(route.reads)
                        .lock()
                        .expect("owners lock")
                        .insert(stream.to_string(), addr.clone());
                }
                Some(Ok(r))
            }
            Err(Error::Io { op, source })
                if op == "send request" && source.kind() == std::io::ErrorKind::NotConnected =>
            {
                self.unsent(stream, route, Error::Io { op, source }).await
            }
            Err(e @ Error::Io { .. }) => {
                // The request may or may not have been processed: never resend it, but route
                // the next request afresh. One request's timeout says nothing of the
                // connection; any other error drops it, and only it (not a newer one to the
                // same proxy that another request opened meanwhile).
                if route.target.is_some() {
                    let timed_out = matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::TimedOut);
                    if !timed_out {
                        let mut others = self.others.lock().await;
                        if others
                            .get(&conn.addr)
                            .is_some_and(|c| std::ptr::eq(&**c, conn))
                        {
                            others.remove(&conn.addr);
                        }
                    }
                    self.forget_route(stream, route.reads);
                }
                Some(Err(e))
            }
            other => Some(other),
        }
    }

    /// `SERVICE_UNAVAILABLE` from the owner we were sent to: it is shutting down and did
    /// nothing with the request (DistributedLog: SERVICE_UNAVAILABLE marks the host down and
    /// the request goes elsewhere), so ask the home proxy who owns the stream now. `None`: send
    /// again; `Some` (gave up) after `redirects_max` hops.
    async fn owner_unavailable(
        &self,
        stream: &str,
        conn: &Connection,
        route: &mut Route,
    ) -> Option<Result<Response>> {
        route.hops += 1;
        self.forget_route(stream, route.reads);
        if route.hops > self.config.redirects_max {
            return Some(Err(self.gave_up(stream, conn.addr.clone())));
        }
        self.drop_connection(&conn.addr).await;
        route.target = None;
        route.from_cache = false;
        None
    }

    /// The connection closed before the request went out (a drained proxy's last answer
    /// arrived meanwhile): nothing was sent, so route it afresh. `None`: send again; `Some(e)`
    /// after `redirects_max` hops.
    async fn unsent(&self, stream: &str, route: &mut Route, e: Error) -> Option<Result<Response>> {
        route.hops += 1;
        if route.hops > self.config.redirects_max {
            return Some(Err(e));
        }
        if let Some(addr) = route.target.take() {
            self.drop_connection(&addr).await;
            self.forget_route(stream, route.reads);
        }
        route.from_cache = false;
        None
    }

    /// Acts on `REGION_UNAVAILABLE` from `conn` (nothing was done): marks its region as
    /// refused for this request, makes the first proxy of a region not yet refused the home
    /// proxy and sends again there. `Some(e)` (the answer) when every region refused, no other
    /// region's proxy answers, or after `redirects_max` hops.
    async fn next_region(
        &self,
        stream: &str,
        conn: &Connection,
        route: &mut Route,
        e: Error,
    ) -> Option<Result<Response>> {
        self.forget_route(stream, route.reads);
        route.hops += 1;
        route.unavailable.push(self.group_of_addr(&conn.addr));
        tracing::debug!(stream, proxy = %conn.addr, "region unavailable; trying the next region");
        let next = (0..self.proxies.len()).find(|i| !route.unavailable.contains(&self.groups[*i]));
        let (Some(next), true) = (next, route.hops <= self.config.redirects_max) else {
            return Some(Err(e));
        };
        let _one = self.reconnecting.lock().await;
        match self.reconnect_home(next).await {
            Ok(home) if !route.unavailable.contains(&self.group_of_addr(&home.addr)) => {
                route.target = None;
                route.from_cache = false;
                None
            }
            Ok(_) => Some(Err(e)),
            Err(err) => {
                tracing::debug!(error = %err, "no proxy of another region answers");
                Some(Err(e))
            }
        }
    }

    /// The region group of a proxy of the list (`usize::MAX` for one not in it).
    fn group_of_addr(&self, addr: &str) -> usize {
        self.proxies
            .iter()
            .position(|p| p == addr)
            .map_or(usize::MAX, |i| self.groups[i])
    }

    /// Marks `refused` as having no room for this request's stream and points the route at the
    /// next proxy of the list that has not refused it.
    ///
    /// # Errors
    /// The last `TOO_MANY_STREAMS` answer when every proxy known refused.
    fn next_with_room(&self, route: &mut Route, refused: String) -> Result<()> {
        let (tried, _) = route.too_many.as_mut().expect("set before");
        tried.push(refused);
        match self.proxies.iter().find(|p| !tried.contains(p)) {
            Some(next) => {
                route.target = Some(next.clone());
                route.from_cache = false;
                Ok(())
            }
            None => Err(route.too_many.take().expect("set before").1),
        }
    }

    /// Follows a `STREAM_OWNED_ELSEWHERE` answer from `conn` naming `owner`: caches the owner
    /// and points the route at it, after a backoff from the second hop on.
    ///
    /// # Errors
    /// `RedirectFailed` when the owner is `conn`'s own address (an earlier session of the same
    /// proxy) or after `redirects_max` hops.
    async fn redirect(
        &self,
        stream: &str,
        conn: &Connection,
        route: &mut Route,
        owner: String,
    ) -> Result<()> {
        route.hops += 1;
        if owner == conn.addr {
            self.forget_route(stream, route.reads);
            return Err(Error::RedirectFailed {
                stream: stream.to_string(),
                owner,
                reason: "the owner is an earlier session of this same proxy (it restarted); \
                         the stream frees up once that ZooKeeper session expires, retry after the session timeout"
                    .into(),
            });
        }
        if route.hops > self.config.redirects_max {
            self.forget_route(stream, route.reads);
            return Err(self.gave_up(stream, owner));
        }
        if route.hops > 1 {
            tokio::time::sleep(route.backoff).await;
            route.backoff = (route.backoff * 2).min(REDIRECT_BACKOFF_MAX);
        }
        tracing::debug!(stream, %owner, hops = route.hops, "following redirect");
        self.route_cache(route.reads)
            .lock()
            .expect("owners lock")
            .insert(stream.to_string(), owner.clone());
        route.target = Some(owner);
        route.from_cache = false;
        Ok(())
    }

    fn gave_up(&self, stream: &str, owner: String) -> Error {
        Error::RedirectFailed {
            stream: stream.to_string(),
            owner,
            reason: format!("gave up after {} redirects", self.config.redirects_max),
        }
    }
}

#[cfg(test)]
#[path = "routing_tests.rs"]
mod tests;

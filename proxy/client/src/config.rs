//! The client's settings.

use std::sync::Arc;
use std::time::Duration;

use crate::compression::Compression;
use crate::protocol::Token;

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Longest wait for the TCP connection, and then again for the proxy's answer to the
    /// handshake (`HandshakeTimeout` when it does not come).
    pub connect_timeout: Duration,
    /// Longest wait for a response, on top of a read's own `wait`.
    pub request_timeout: Duration,
    /// Redirects followed for one request before giving up with `RedirectFailed`
    /// (DistributedLog's `maxRedirects`, there unbounded by default).
    pub redirects_max: u32,
    /// The token sent in every handshake (this client's connections to its home proxy and to
    /// the proxies it is redirected to), for proxies that require one (`quire_proxy::auth`);
    /// `None` (the default): none is sent. A proxy that requires a token refuses the
    /// connection with `UNAUTHENTICATED` (401) when it is missing or unknown.
    pub token: Option<Token>,
    /// TLS to every proxy, from `quire_tls::ClientTls::client_config` (the CA that signs the
    /// proxies' certificates and, where they require one, this client's certificate); `None`,
    /// the default, is plain TCP.
    pub tls: Option<Arc<quire_tls::rustls::ClientConfig>>,
    /// The name the home proxy's certificate must carry; `None`: the IP address connected to.
    /// Proxies reached by a redirect are checked against the host of the address they
    /// advertise.
    pub tls_server_name: Option<String>,
    /// More proxies (`host:port`) to fail over to, in order after the address connected to:
    /// when the home proxy cannot be reached or answers `SERVICE_UNAVAILABLE`, the next one
    /// becomes home (see `ProxyClient::connect_any`). Empty (the default): only the address
    /// connected to.
    pub proxies: Vec<String>,
    /// Proxies per region, the client's local region first (issue 30 item 4, DistributedLog's
    /// per-region proxy sets): the client takes its home proxy from the first region whose
    /// proxies answer, and moves on to the next region's when every proxy of a region is
    /// unreachable, shutting down, or answers `REGION_UNAVAILABLE` (519: the region is marked
    /// as taking no new streams). Tried before [`ClientConfig::proxies`], which count as one
    /// more, unlabelled region. Empty (the default): no regions.
    pub regions: Vec<RegionProxies>,
    /// With [`ClientConfig::regions`]: how long after its home proxy left the local region
    /// (the first of `regions`) the client tries the local region's proxies again, and again
    /// after each try that found none answering or that met `REGION_UNAVAILABLE` (see
    /// `routing.rs`, "Return to the local region"). Default 30 s.
    pub local_region_retry: Duration,
    /// How the proxy is asked to store this client's writes: [`Compression::Lz4`] sets the
    /// write flag `FLAG_WRITE_COMPRESS` on every write (plain and producer session writes),
    /// so the owner stores their entries LZ4-compressed; `None` (the default) leaves it to the
    /// stream's own setting. Readers see the same records either way.
    pub compression: Compression,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            redirects_max: 4,
            token: None,
            tls: None,
            tls_server_name: None,
            proxies: Vec::new(),
            regions: Vec::new(),
            local_region_retry: Duration::from_secs(30),
            compression: Compression::None,
        }
    }
}

/// The proxies of one region ([`ClientConfig::regions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionProxies {
    /// The region's name (the proxies' `region` setting); only used in messages and logs.
    pub region: String,
    /// Its proxies (`host:port`), in the order they are tried.
    pub proxies: Vec<String>,
}

impl RegionProxies {
    /// Parses `REGION=host:port,host:port` (the CLI's `--region-proxies`).
    ///
    /// # Errors
    /// A message naming what is missing: no `=`, an empty region, or no proxy.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (region, list) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?}: expected REGION=host:port[,host:port...]"))?;
        let proxies: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
        if region.trim().is_empty() || proxies.is_empty() {
            return Err(format!(
                "{text:?}: expected REGION=host:port[,host:port...] with a region and at least one proxy"
            ));
        }
        Ok(Self {
            region: region.trim().to_string(),
            proxies,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::RegionProxies;

    #[test]
    fn region_proxies_parse_and_refuse_bad_text() {
        let r = RegionProxies::parse("east=127.0.0.1:1, 127.0.0.1:2").unwrap();
        assert_eq!(r.region, "east");
        assert_eq!(r.proxies, ["127.0.0.1:1", "127.0.0.1:2"]);
        for bad in ["east", "=127.0.0.1:1", "east=", "east= , "] {
            assert!(RegionProxies::parse(bad).is_err(), "{bad}");
        }
    }
}

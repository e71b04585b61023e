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
            compression: Compression::None,
        }
    }
}

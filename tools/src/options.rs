//! The checked options of `quire bookie` and `quire proxy`, built from their files
//! ([`crate::config::BookieFile`], [`crate::config::ProxyFile`]): each table's `validate()`,
//! then the process's own checks (listen and advertised addresses, cluster secret, TLS files).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};

use crate::autorecovery::AutorecoveryOptions;
use crate::config::{keys_of, named, BookieFile, ProxyFile, BOOKIE_KEYS, PROXY_KEYS};
use crate::metadata::MetadataAddress;

fn missing(key: &str) -> anyhow::Error {
    let flag = key.replace('_', "-");
    anyhow!("missing setting {key}: set it in the config file or with --{flag}")
}

/// A checked bookie configuration.
#[derive(Debug, Clone)]
pub struct BookieOptions {
    pub metadata: MetadataAddress,
    /// The bookie id, `host:port` clients connect to.
    pub advertised: String,
    pub rack: Option<String>,
    /// Region label recorded in the registry (`None`: default-region).
    pub region: Option<String>,
    pub metrics_listen: Option<SocketAddr>,
    pub bookie: quire_bookie::BookieConfig,
    /// The autorecovery daemon to run inside the bookie (`None`: disabled).
    pub autorecovery: Option<AutorecoveryOptions>,
}

/// A checked proxy configuration.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    pub metadata: MetadataAddress,
    pub listen: SocketAddr,
    /// The proxy's identity as a stream owner and the address other proxies redirect to.
    pub advertised: String,
    /// Region and rack labels, in the proxy registry record.
    pub labels: (Option<String>, Option<String>),
    /// Placement of new ensembles and replacements (`[ledger]`).
    pub placement: quire_ledger::placement::PlacementSettings,
    pub streams: quire_proxy::StreamConfig,
    pub drain_timeout: Duration,
    pub metrics_listen: Option<SocketAddr>,
    pub auth: Option<Arc<quire_proxy::auth::Authorizer>>,
    pub tls: Option<quire_tls::ServerTls>,
    pub bookie_tls: Option<quire_tls::ClientTls>,
    pub cluster_secret: quire_wire::auth::ClusterSecret,
    /// The proxy port's bounds (`[server]`); its other fields are the defaults.
    pub server: quire_proxy::ServerConfig,
}

fn check_listen_and_advertised(
    listen: Option<SocketAddr>,
    advertised: Option<String>,
) -> Result<(SocketAddr, String)> {
    let listen = listen.ok_or_else(|| missing("listen"))?;
    if listen.port() == 0 {
        bail!("invalid setting listen = {listen}: the port must be fixed (it is part of the id other processes know this process by)");
    }
    let advertised = match advertised {
        Some(a) => a,
        None if listen.ip().is_unspecified() => {
            bail!("missing setting advertised: listen = {listen} is a wildcard address, so set the address others reach this process at with advertised = \"host:port\" or --advertised")
        }
        None => listen.to_string(),
    };
    if advertised.contains(',') || !quire_metadata::is_host_port_list(&advertised) {
        bail!("invalid setting advertised = {advertised:?}: expected host:port");
    }
    Ok((listen, advertised))
}

fn cluster_secret(file: Option<&Path>) -> Result<quire_wire::auth::ClusterSecret> {
    // Bookies admit only their cluster's processes (issue 24): no secret, no start.
    let path = file.ok_or_else(|| missing("cluster_secret_file"))?;
    crate::secret_file::read_cluster_secret(path, "cluster_secret_file")
}

impl BookieFile {
    /// Checks every table and builds the bookie's configuration.
    ///
    /// # Errors
    /// One line naming the first missing or invalid key.
    pub fn resolve(self) -> Result<BookieOptions> {
        let keys = keys_of(BOOKIE_KEYS);
        let metadata = MetadataAddress::from_config(&self.zookeeper, &keys)?;
        let (listen, advertised) = check_listen_and_advertised(self.listen, self.advertised)?;
        let mut bookie = self
            .bookie
            .to_config(listen)
            .map_err(|e| named(e, "bookie", &keys))?;
        self.engine
            .validate()
            .map_err(|e| named(e, "engine", &keys))?;
        self.compaction
            .validate()
            .map_err(|e| named(e, "compaction", &keys))?;
        self.engine.apply(&mut bookie.engine);
        self.compaction.apply(&mut bookie.engine);
        let secret = cluster_secret(self.cluster_secret_file.as_deref())?;
        bookie.cluster_secret = Some(secret);
        bookie.tls = self.tls.resolve()?;
        self.autorecovery
            .validate()
            .map_err(|e| named(e, "autorecovery", &keys))?;
        self.ledger
            .validate()
            .map_err(|e| named(e, "ledger", &keys))?;
        let mut autorecovery = self.autorecovery.options();
        autorecovery.placement = self.ledger.clone();
        autorecovery.cluster_secret = Some(secret);
        if let (Some(tls), true) = (&bookie.tls, self.autorecovery.enabled) {
            // The bookie's own autorecovery talks to the other (TLS) bookies as a client: it
            // trusts tls.ca_file and presents the bookie's certificate (BookKeeper's bookie
            // uses its keystore for both sides too).
            let Some(ca_file) = tls.ca_file.clone() else {
                bail!("missing setting tls.ca_file: TLS is on and this bookie's autorecovery connects to the other bookies, so it needs the CA that signs their certificates (or set [autorecovery] enabled = false)");
            };
            let (cert_file, key_file) = (Some(tls.cert_file.clone()), Some(tls.key_file.clone()));
            let client = quire_tls::ClientTls {
                ca_file,
                cert_file,
                key_file,
            };
            autorecovery.bookie_tls = Some(client.client_config()?);
        }
        Ok(BookieOptions {
            metadata,
            advertised,
            rack: self.rack,
            region: self.region,
            metrics_listen: self.metrics_listen,
            bookie,
            autorecovery: self.autorecovery.enabled.then_some(autorecovery),
        })
    }
}

impl ProxyFile {
    /// Checks every table and builds the proxy's configuration.
    ///
    /// # Errors
    /// One line naming the first missing or invalid key.
    pub fn resolve(self) -> Result<ProxyOptions> {
        let keys = keys_of(PROXY_KEYS);
        self.server
            .validate()
            .map_err(|e| named(e, "server", &keys))?;
        let mut server = quire_proxy::ServerConfig::default();
        self.server.apply(&mut server);
        self.limits
            .validate()
            .map_err(|e| named(e, "limits", &keys))?;
        self.limits.apply(&mut server);
        let metadata = MetadataAddress::from_config(&self.zookeeper, &keys)?;
        let (listen, advertised) = check_listen_and_advertised(self.listen, self.advertised)?;
        let cluster_secret = cluster_secret(self.cluster_secret_file.as_deref())?;
        self.streams
            .validate()
            .map_err(|e| named(e, "streams", &keys))?;
        let mut streams = quire_proxy::StreamConfig::default();
        self.streams.apply(&mut streams);
        self.ledger
            .validate()
            .map_err(|e| named(e, "ledger", &keys))?;
        let drain_ms = self.drain_timeout_ms;
        if !(100..=3_600_000).contains(&drain_ms) {
            bail!("invalid setting drain_timeout_ms = {drain_ms}: expected 100 to 3600000");
        }
        let auth = self
            .auth_tokens_file
            .as_deref()
            .map(crate::token::load_authorizer);
        Ok(ProxyOptions {
            server,
            metadata,
            listen,
            advertised,
            labels: (self.region, self.rack),
            placement: self.ledger,
            streams,
            drain_timeout: Duration::from_millis(drain_ms),
            metrics_listen: self.metrics_listen,
            auth: auth.transpose()?.map(Arc::new),
            tls: self.tls.resolve()?,
            bookie_tls: self.bookie_tls.resolve()?,
            cluster_secret,
        })
    }
}

//! How the harness connects to the proxy: plain TCP, or TLS when `--tls-ca-file` is given.
//!
//! Set once at start ([`set_tls`]); every connection of every workload then uses it, so that
//! the same workloads measure a TLS cluster (perf/README.md, "TLS on and off").

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};
use quire_client::{ClientConfig, ProxyClient};

static TLS: OnceLock<Option<Arc<quire_client::TlsClientConfig>>> = OnceLock::new();

/// Turns TLS on for every later connection: `ca_file` signs the proxy's certificate; `cert`
/// and `key` are the client certificate, for proxies that require one.
///
/// # Errors
/// A file cannot be read or the settings do not go together.
pub fn set_tls(ca_file: PathBuf, cert: Option<PathBuf>, key: Option<PathBuf>) -> Result<()> {
    let config = quire_tls::ClientTls {
        ca_file,
        cert_file: cert,
        key_file: key,
    }
    .client_config()
    .context("TLS settings")?;
    let _ = TLS.set(Some(config));
    Ok(())
}

/// Connects to the proxy at `addr` with the harness's TLS setting.
///
/// # Errors
/// As [`ProxyClient::connect_with`].
pub async fn connect(addr: &str) -> quire_client::Result<ProxyClient> {
    let config = ClientConfig {
        tls: TLS.get().cloned().flatten(),
        tls_server_name: Some(addr.to_string()),
        ..ClientConfig::default()
    };
    ProxyClient::connect_with(addr, config).await
}

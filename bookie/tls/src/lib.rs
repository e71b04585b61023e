//! TLS settings shared by every Quire server and client: rustls configurations built from PEM
//! files, with the `ring` crypto provider.
//!
//! The bookie port, the proxy port, the ledger client (proxy → bookie, admin tools → bookie) and
//! the proxy client (CLI → proxy) all take their TLS from here, so that one set of file-path
//! settings means the same on every hop. The settings follow BookKeeper's:
//! `tlsProvider` is always rustls with `ring`; `tlsCertificatePath` / `tlsKeyStore` are
//! [`ServerTls::cert_file`] / [`ServerTls::key_file`] (and the client's [`ClientTls::cert_file`] /
//! [`ClientTls::key_file`]); `tlsTrustStore` is `ca_file`; `tlsClientAuthentication` is
//! [`ClientAuth::Require`].
//!
//! With the `gen` feature, [`gen`] makes a CA and certificates it signs (for tests and
//! `quire tls-certs`).
//!
//! This crate does no network I/O; the servers and clients wrap their own sockets
//! (tokio-rustls on tokio, futures-rustls on glommio).

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

#[cfg(feature = "gen")]
pub mod gen;

pub use rustls;

/// Errors building a TLS configuration. Each names the file and the setting it came from.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A PEM file could not be read or holds nothing usable.
    #[error("{setting} {path}: {reason}")]
    File {
        setting: &'static str,
        path: PathBuf,
        reason: String,
    },
    /// rustls refused the certificates or key (for example a key that does not match the
    /// certificate).
    #[error("TLS configuration: {0}")]
    Config(String),
    /// Settings that do not go together, such as a client certificate without its key.
    #[error("TLS settings: {0}")]
    Settings(String),
}

/// Whether a TLS server asks its clients for a certificate (BookKeeper's
/// `tlsClientAuthentication`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientAuth {
    /// Any client that completes the handshake is served.
    #[default]
    None,
    /// A client must present a certificate signed by the server's `ca_file` (mutual TLS).
    Require,
}

impl ClientAuth {
    /// Parses `"none"` or `"require"` (the config-file and flag spelling).
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "none" => Ok(Self::None),
            "require" => Ok(Self::Require),
            other => Err(Error::Settings(format!(
                "tls_client_auth must be \"none\" or \"require\", not {other:?}"
            ))),
        }
    }
}

impl fmt::Display for ClientAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Require => "require",
        })
    }
}

/// A server's TLS files: its certificate chain and key, and the CA that signs client
/// certificates when they are required.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTls {
    /// PEM certificate chain, leaf first (`tls_cert_file`; BookKeeper `tlsCertificatePath`).
    pub cert_file: PathBuf,
    /// PEM private key, PKCS#8, PKCS#1 or SEC1 (`tls_key_file`; BookKeeper `tlsKeyStore`).
    pub key_file: PathBuf,
    /// PEM CA certificates trusted for client certificates (`tls_ca_file`; BookKeeper
    /// `tlsTrustStore`). Required with [`ClientAuth::Require`].
    pub ca_file: Option<PathBuf>,
    /// `tls_client_auth`; BookKeeper `tlsClientAuthentication`.
    pub client_auth: ClientAuth,
}

impl ServerTls {
    /// Reads the files and builds the server configuration (TLS 1.2 and 1.3, `ring`).
    ///
    /// Errors: a file missing, unreadable or without a certificate / key ([`Error::File`]);
    /// client authentication required without `ca_file` ([`Error::Settings`]); a key that does
    /// not match the certificate ([`Error::Config`]).
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = read_certs("tls_cert_file", &self.cert_file)?;
        let key = read_key("tls_key_file", &self.key_file)?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(e.to_string()))?;
        let builder = match self.client_auth {
            ClientAuth::None => builder.with_no_client_auth(),
            ClientAuth::Require => {
                let Some(ca_file) = &self.ca_file else {
                    return Err(Error::Settings(
                        "tls_client_auth = \"require\" needs tls_ca_file (the CA that signs client certificates)".into(),
                    ));
                };
                let roots = read_roots("tls_ca_file", ca_file)?;
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| Error::Config(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder
            .with_single_cert(certs, key)
            .map_err(|e| Error::Config(e.to_string()))?;
        Ok(Arc::new(config))
    }
}

/// A client's TLS files: the CA that signs the servers' certificates, and the client's own
/// certificate and key for servers that require one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM CA certificates trusted for server certificates (BookKeeper `tlsTrustStore`).
    pub ca_file: PathBuf,
    /// PEM client certificate chain (BookKeeper `tlsCertificatePath` on the client). Set
    /// together with `key_file`, or neither.
    pub cert_file: Option<PathBuf>,
    /// PEM client private key (BookKeeper `tlsKeyStore` on the client).
    pub key_file: Option<PathBuf>,
}

impl ClientTls {
    /// Reads the files and builds the client configuration (TLS 1.2 and 1.3, `ring`).
    ///
    /// Errors: as [`ServerTls::server_config`]; a certificate without a key, or a key without
    /// a certificate, is [`Error::Settings`].
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = Arc::new(read_roots("tls_ca_file", &self.ca_file)?);
        let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| Error::Config(e.to_string()))?;
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(e.to_string()))?
            .with_webpki_verifier(verifier);
        let config = match (&self.cert_file, &self.key_file) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert_file), Some(key_file)) => {
                let certs = read_certs("tls_cert_file", cert_file)?;
                let key = read_key("tls_key_file", key_file)?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| Error::Config(e.to_string()))?
            }
            _ => {
                return Err(Error::Settings(
                    "a client certificate needs both tls_cert_file and tls_key_file".into(),
                ))
            }
        };
        Ok(Arc::new(config))
    }
}

/// The name a client checks the server's certificate against, from a `host:port` address:
/// an IP address (matched against the certificate's IP SANs) or a DNS name.
///
/// Errors: a host that is neither ([`Error::Settings`]).
pub fn server_name(addr: &str) -> Result<ServerName<'static>, Error> {
    let host = host_of(addr);
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ServerName::IpAddress(ip.into()));
    }
    ServerName::try_from(host.to_string())
        .map_err(|e| Error::Settings(format!("server name {host:?} from {addr:?}: {e}")))
}

/// The host part of `host:port`, `[v6]:port`, or a bare host.
fn host_of(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match addr.rsplit_once(':') {
        // A bare IPv6 address has more than one colon.
        Some((host, port)) if !host.contains(':') && port.parse::<u16>().is_ok() => host,
        _ => addr,
    }
}

/// Says what a failed handshake most likely means, in one line, for logs and errors: rustls'
/// own messages for a plaintext peer ("received corrupt message") are not self-explanatory.
pub fn describe_handshake_error(e: &std::io::Error) -> String {
    let text = e.to_string();
    if text.contains("corrupt message") || text.contains("InvalidContentType") {
        format!("{text} (is the peer speaking TLS? a plaintext peer on a TLS port, or the reverse)")
    } else if e.kind() == std::io::ErrorKind::UnexpectedEof {
        format!("{text} (the peer closed during the TLS handshake: plaintext port, or it refused our certificate)")
    } else {
        text
    }
}

/// Whether `bytes`, the first a plaintext peer received, start a TLS record (handshake 0x16 or
/// alert 0x15, version 3.x): a sign the other side speaks TLS. No Quire frame starts so: its
/// first four bytes are a little-endian length, and these would make it 197 KB or more, which
/// no handshake response is.
pub fn looks_like_tls_record(bytes: &[u8]) -> bool {
    matches!(bytes, [0x15 | 0x16, 0x03, ..])
}

fn file_error(setting: &'static str, path: &Path, reason: impl fmt::Display) -> Error {
    Error::File {
        setting,
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn read_certs(setting: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(setting, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(setting, path, e))?;
    if certs.is_empty() {
        return Err(file_error(setting, path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

fn read_key(setting: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_error(setting, path, e))
}

fn read_roots(setting: &'static str, path: &Path) -> Result<RootCertStore, Error> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(setting, path)? {
        roots
            .add(cert)
            .map_err(|e| file_error(setting, path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_of_handles_ipv4_ipv6_and_names() {
        assert_eq!(host_of("127.0.0.1:3181"), "127.0.0.1");
        assert_eq!(host_of("[::1]:3181"), "::1");
        assert_eq!(host_of("bookie-1.example:3181"), "bookie-1.example");
        assert_eq!(host_of("::1"), "::1");
        assert_eq!(host_of("localhost"), "localhost");
        assert!(matches!(
            server_name("127.0.0.1:1").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name("b1:1").unwrap(),
            ServerName::DnsName(_)
        ));
    }

    #[test]
    fn client_auth_parses_both_spellings_only() {
        assert_eq!(ClientAuth::parse("none").unwrap(), ClientAuth::None);
        assert_eq!(ClientAuth::parse("require").unwrap(), ClientAuth::Require);
        assert!(ClientAuth::parse("optional").is_err());
    }

    #[test]
    fn missing_and_empty_files_are_named_errors() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let server = ServerTls {
            cert_file: empty.clone(),
            key_file: dir.path().join("absent.pem"),
            ca_file: None,
            client_auth: ClientAuth::None,
        };
        let e = server.server_config().unwrap_err().to_string();
        assert!(
            e.contains("tls_cert_file") && e.contains("empty.pem"),
            "{e}"
        );
        let client = ClientTls {
            ca_file: dir.path().join("absent.pem"),
            cert_file: None,
            key_file: None,
        };
        let e = client.client_config().unwrap_err().to_string();
        assert!(e.contains("tls_ca_file") && e.contains("absent.pem"), "{e}");
    }

    #[test]
    fn require_without_ca_and_cert_without_key_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".into()]).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&ca).unwrap();
        let cert_file = dir.path().join("c.pem");
        let key_file = dir.path().join("k.pem");
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, ca.serialize_pem()).unwrap();
        let server = ServerTls {
            cert_file: cert_file.clone(),
            key_file: key_file.clone(),
            ca_file: None,
            client_auth: ClientAuth::Require,
        };
        assert!(matches!(server.server_config(), Err(Error::Settings(_))));
        let server = ServerTls {
            client_auth: ClientAuth::None,
            ..server
        };
        server.server_config().unwrap();
        let client = ClientTls {
            ca_file: cert_file.clone(),
            cert_file: Some(cert_file),
            key_file: None,
        };
        assert!(matches!(client.client_config(), Err(Error::Settings(_))));
    }
}

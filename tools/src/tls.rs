//! TLS settings of the `quire` command: the server keys of `quire bookie` and `quire proxy`,
//! the client flags of commands that reach a proxy or bookies, and `quire tls-certs`.
//!
//! The keys follow BookKeeper's TLS settings: `[tls] cert_file` (`tlsCertificatePath`),
//! `key_file` (`tlsKeyStore`), `ca_file` (`tlsTrustStore`), `client_auth`
//! (`tlsClientAuthentication`, `"none"` or `"require"`). Everything is off unless set.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use quire_tls::{ClientAuth, ClientTls, ServerTls};

/// The `[tls]` table of `quire bookie` and `quire proxy`: TLS on the process's own port
/// (BookKeeper `tlsCertificatePath`, `tlsKeyStore`, `tlsTrustStore`,
/// `tlsClientAuthentication`). Off unless `cert_file` and `key_file` are set.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerTlsSettings {
    /// PEM certificate chain of this server.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// PEM CA certificates trusted for clients' certificates (and, in a bookie, for the other
    /// bookies' certificates its autorecovery meets).
    pub ca_file: Option<PathBuf>,
    /// `none` (unset) or `require`: whether clients must present a certificate `ca_file`
    /// signed (mutual TLS).
    pub client_auth: Option<String>,
}

impl ServerTlsSettings {
    /// Checks the table and reads its files (see [`server_tls`]); errors name `tls.KEY`.
    ///
    /// # Errors
    /// One line naming the key.
    pub fn resolve(&self) -> Result<Option<ServerTls>> {
        server_tls(
            "tls.",
            self.cert_file.clone(),
            self.key_file.clone(),
            self.ca_file.clone(),
            self.client_auth.as_deref(),
        )
    }
}

/// The `[bookie_tls]` table of `quire proxy` and `quire autorecovery`: TLS to the bookies,
/// on when `ca_file` (the CA that signs the bookies' certificates) is set.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientTlsSettings {
    /// PEM CA certificate that signs the bookies' certificates (BookKeeper `tlsTrustStore`).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate presented to bookies that require one (mutual TLS).
    pub cert_file: Option<PathBuf>,
    /// PEM key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

impl ClientTlsSettings {
    /// Checks the table and reads its files (see [`client_tls`]); errors name
    /// `bookie_tls.KEY`.
    ///
    /// # Errors
    /// One line naming the key.
    pub fn resolve(&self) -> Result<Option<ClientTls>> {
        client_tls(
            "bookie_tls.",
            self.ca_file.clone(),
            self.cert_file.clone(),
            self.key_file.clone(),
        )
    }
}

/// Checks a server's TLS keys: none set is plain TCP; otherwise both `cert_file` and
/// `key_file`, and `ca_file` when `client_auth = "require"`. Reads the files once, so that a
/// bad file fails at start with the key's name (`prefix` followed by the key: `tls.` or
/// `tls_`).
///
/// # Errors
/// One line naming the setting.
pub fn server_tls(
    prefix: &str,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    client_auth: Option<&str>,
) -> Result<Option<ServerTls>> {
    let client_auth = match client_auth {
        Some(s) => {
            ClientAuth::parse(s).with_context(|| format!("invalid setting {prefix}client_auth"))?
        }
        None => ClientAuth::None,
    };
    let (cert_file, key_file) = match (cert_file, key_file) {
        (None, None) => {
            if client_auth == ClientAuth::Require {
                bail!("invalid setting {prefix}client_auth = \"require\": TLS is off (set {prefix}cert_file and {prefix}key_file)");
            }
            return Ok(None);
        }
        (Some(c), Some(k)) => (c, k),
        (Some(_), None) => bail!("missing setting {prefix}key_file: {prefix}cert_file is set"),
        (None, Some(_)) => bail!("missing setting {prefix}cert_file: {prefix}key_file is set"),
    };
    crate::secret_file::warn_if_exposed(&key_file, &format!("{prefix}key_file"));
    let tls = ServerTls {
        cert_file,
        key_file,
        ca_file,
        client_auth,
    };
    tls.server_config()?;
    Ok(Some(tls))
}

/// Checks a client's TLS settings: no CA file is plain TCP; a certificate needs its key and a
/// CA file.
///
/// # Errors
/// One line naming the setting (`prefix` followed by the key, such as `bookie_tls.ca_file`
/// or the flag name `bookie_tls_ca_file`).
pub fn client_tls(
    prefix: &str,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
) -> Result<Option<ClientTls>> {
    let Some(ca_file) = ca_file else {
        if cert_file.is_some() || key_file.is_some() {
            bail!("missing setting {prefix}ca_file: a client certificate is set, but TLS is on only with the CA file that signs the servers' certificates");
        }
        return Ok(None);
    };
    if let Some(key) = &key_file {
        crate::secret_file::warn_if_exposed(key, &format!("{prefix}key_file"));
    }
    let tls = ClientTls {
        ca_file,
        cert_file,
        key_file,
    };
    tls.client_config()?;
    Ok(Some(tls))
}

/// TLS flags of commands that talk to a proxy (`quire write`, `read`, `tail`, `stream`).
#[derive(Args, Debug, Default, Clone)]
pub struct ProxyTlsArgs {
    /// CA certificate (PEM) that signs the proxy's certificate; turns TLS on.
    #[arg(long, env = "QUIRE_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate (PEM), for proxies that require one.
    #[arg(long, env = "QUIRE_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// Key of the client certificate (PEM).
    #[arg(long, env = "QUIRE_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
}

impl ProxyTlsArgs {
    /// The rustls client configuration, or `None` for plain TCP.
    ///
    /// # Errors
    /// One line naming the flag or file.
    pub fn client_config(&self) -> Result<Option<Arc<quire_tls::rustls::ClientConfig>>> {
        let tls = client_tls(
            "tls_",
            self.tls_ca_file.clone(),
            self.tls_cert_file.clone(),
            self.tls_key_file.clone(),
        )?;
        Ok(match tls {
            Some(t) => Some(t.client_config()?),
            None => None,
        })
    }
}

/// TLS flags of admin commands that talk to bookies (`quire ledger`, `quire autorecovery`).
#[derive(Args, Debug, Default, Clone)]
pub struct BookieTlsArgs {
    /// CA certificate (PEM) that signs the bookies' certificates; turns TLS to bookies on.
    #[arg(long, env = "QUIRE_BOOKIE_TLS_CA_FILE")]
    pub bookie_tls_ca_file: Option<PathBuf>,
    /// Client certificate (PEM), for bookies that require one.
    #[arg(long, env = "QUIRE_BOOKIE_TLS_CERT_FILE")]
    pub bookie_tls_cert_file: Option<PathBuf>,
    /// Key of the client certificate (PEM).
    #[arg(long, env = "QUIRE_BOOKIE_TLS_KEY_FILE")]
    pub bookie_tls_key_file: Option<PathBuf>,
    /// File holding the cluster secret (the bookies' `cluster_secret_file`): bookies admit
    /// only their cluster's processes.
    #[arg(long, env = "QUIRE_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
}

impl BookieTlsArgs {
    /// The cluster secret from `--cluster-secret-file`, if given.
    ///
    /// # Errors
    /// One line naming the flag and file.
    pub fn cluster_secret(&self) -> Result<Option<quire_wire::auth::ClusterSecret>> {
        self.cluster_secret_file
            .as_deref()
            .map(|p| crate::secret_file::read_cluster_secret(p, "--cluster-secret-file"))
            .transpose()
    }

    /// The rustls client configuration, or `None` for plain TCP.
    ///
    /// # Errors
    /// One line naming the flag or file.
    pub fn client_config(&self) -> Result<Option<Arc<quire_tls::rustls::ClientConfig>>> {
        let tls = client_tls(
            "bookie_tls_",
            self.bookie_tls_ca_file.clone(),
            self.bookie_tls_cert_file.clone(),
            self.bookie_tls_key_file.clone(),
        )?;
        Ok(match tls {
            Some(t) => Some(t.client_config()?),
            None => None,
        })
    }
}

/// `quire tls-certs` options.
#[derive(Args, Debug)]
pub struct TlsCertsArgs {
    /// Directory to write `ca.pem`, `node.pem` and `node.key` into (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// A name the certificate must carry: an IP address or DNS name that clients dial
    /// (repeat for each host).
    #[arg(long = "san", required = true)]
    pub sans: Vec<String>,
}

/// Runs `quire tls-certs`: a new CA and one certificate for every name in `--san`, good for
/// servers and clients alike, so that one set of files serves a small cluster's bookies,
/// proxies and their mutual TLS. Existing files are kept (it refuses to overwrite them), so
/// re-running it (as Ansible does) changes nothing.
///
/// # Errors
/// One line: a file exists already, or cannot be written.
pub fn certs(args: TlsCertsArgs) -> Result<()> {
    let existing: Vec<_> = ["ca.pem", "node.pem", "node.key"]
        .iter()
        .map(|f| args.out.join(f))
        .filter(|p| p.exists())
        .collect();
    if !existing.is_empty() {
        bail!(
            "{} exists already; remove ca.pem, node.pem and node.key to make a new CA",
            existing[0].display()
        );
    }
    // The key is private: the directory is the owner's only (it is written 0600 in it).
    crate::secret_file::create_private_dir(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let files = quire_tls::gen::write_pki(&args.out, &args.sans)?;
    println!(
        "wrote {}, {} and {} (for {})",
        files.ca_file.display(),
        files.cert_file.display(),
        files.key_file.display(),
        args.sans.join(", ")
    );
    Ok(())
}

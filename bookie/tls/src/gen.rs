//! Certificate generation with rcgen: a CA, and certificates it signs that serve both as a
//! server certificate and as a client certificate (mutual TLS between proxies and bookies).
//!
//! For tests (a fresh CA per test) and `quire tls-certs` (a deployment's CA, made once on the
//! Ansible controller). Keys are ECDSA P-256; certificates are valid from 2024 to 2124, so a
//! test never fails on a clock.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use crate::Error;

/// A certificate authority held in memory.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

fn gen_error(e: rcgen::Error) -> Error {
    Error::Config(format!("certificate generation: {e}"))
}

fn params(common_name: &str, sans: &[String]) -> Result<CertificateParams, Error> {
    let mut params = CertificateParams::new(sans.to_vec()).map_err(gen_error)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2124, 1, 1);
    Ok(params)
}

impl Ca {
    /// A new self-signed CA named `common_name`.
    pub fn new(common_name: &str) -> Result<Self, Error> {
        let key = KeyPair::generate().map_err(gen_error)?;
        let mut p = params(common_name, &[])?;
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = p.self_signed(&key).map_err(gen_error)?;
        Ok(Self { cert, key })
    }

    /// The CA certificate, PEM: the `tls_ca_file` of every server and client that trusts it.
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// Signs a new key's certificate for `sans` (IP addresses or DNS names; a server
    /// certificate must name the address clients dial). Returns (certificate PEM, key PEM).
    /// The certificate is good for both server and client authentication.
    pub fn issue(&self, common_name: &str, sans: &[String]) -> Result<(String, String), Error> {
        let key = KeyPair::generate().map_err(gen_error)?;
        let mut p = params(common_name, sans)?;
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = p
            .signed_by(&key, &self.cert, &self.key)
            .map_err(gen_error)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// The files [`write_pki`] made.
#[derive(Debug, Clone)]
pub struct PkiFiles {
    /// The CA certificate.
    pub ca_file: PathBuf,
    /// A certificate for `sans` signed by the CA, usable by servers and clients.
    pub cert_file: PathBuf,
    /// Its key.
    pub key_file: PathBuf,
}

/// Makes a CA and one certificate for `sans` in `dir`: `ca.pem`, `node.pem`, `node.key`
/// (the key file with mode 0600). Errors: generation, or writing a file ([`Error::File`]).
pub fn write_pki(dir: &Path, sans: &[String]) -> Result<PkiFiles, Error> {
    let ca = Ca::new("quire test CA")?;
    let (cert, key) = ca.issue("quire node", sans)?;
    let files = PkiFiles {
        ca_file: dir.join("ca.pem"),
        cert_file: dir.join("node.pem"),
        key_file: dir.join("node.key"),
    };
    write_file(&files.ca_file, &ca.cert_pem(), false)?;
    write_file(&files.cert_file, &cert, false)?;
    write_file(&files.key_file, &key, true)?;
    Ok(files)
}

/// Writes `text` to `path`; a private key is made readable by its owner only.
pub fn write_file(path: &Path, text: &str, private: bool) -> Result<(), Error> {
    let err = |e: std::io::Error| Error::File {
        setting: "generated file",
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // A private key is created 0600, never readable by others even for a moment.
    let mode = if private { 0o600 } else { 0o644 };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(err)?;
    if private {
        // An existing file keeps its mode on open: narrow it before writing the key.
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(err)?;
    }
    f.write_all(text.as_bytes()).map_err(err)?;
    Ok(())
}

//! The cluster secret and the proofs of the version-2 handshake (`docs/protocol.md` §2).
//!
//! Every process of a cluster (bookies, proxies, autorecovery, admin commands that talk to
//! bookies) holds the same 32-byte secret. A connection proves it both ways with HMAC-SHA256
//! over both sides' nonces, so the secret never travels and a recorded handshake cannot be
//! replayed on another connection (the bookie's nonce is new each time). This plays the role
//! of BookKeeper's SASL DIGEST-MD5 bookie authentication (`bookieAuthProviderFactoryClass`).
//! The two proofs use different labels, so a bookie's answer can never serve as a client's
//! proof, and the other way round.

use std::fmt;

use ring::hmac;

/// Size of the cluster secret, in bytes.
pub const CLUSTER_SECRET_SIZE_BYTES: usize = 32;
/// Size of each handshake nonce, in bytes.
pub const AUTH_NONCE_SIZE_BYTES: usize = 32;
/// Size of a proof (HMAC-SHA256 output), in bytes.
pub const AUTH_PROOF_SIZE_BYTES: usize = 32;

/// Domain-separation label of the client's proof.
const CLIENT_LABEL: &[u8] = b"quire bookie auth v2: client\0";
/// Domain-separation label of the bookie's proof.
const BOOKIE_LABEL: &[u8] = b"quire bookie auth v2: bookie\0";

/// A handshake nonce.
pub type AuthNonce = [u8; AUTH_NONCE_SIZE_BYTES];
/// A handshake proof.
pub type AuthProof = [u8; AUTH_PROOF_SIZE_BYTES];

/// Why a cluster secret could not be made or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The text is not 64 hexadecimal digits.
    #[error("a cluster secret is {} hexadecimal digits (32 bytes); found {found} characters that are not", CLUSTER_SECRET_SIZE_BYTES * 2)]
    BadHex { found: usize },
    /// The system random source failed.
    #[error("the system random source failed")]
    Random,
}

/// The secret shared by every process of one cluster. `Debug` never shows it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ClusterSecret([u8; CLUSTER_SECRET_SIZE_BYTES]);

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// A secret from its 32 bytes.
    pub fn from_bytes(bytes: [u8; CLUSTER_SECRET_SIZE_BYTES]) -> Self {
        Self(bytes)
    }

    /// A new secret from the system's random source.
    ///
    /// # Errors
    /// `Random` when the random source fails.
    pub fn generate() -> Result<Self, SecretError> {
        let mut b = [0u8; CLUSTER_SECRET_SIZE_BYTES];
        fill_random(&mut b)?;
        Ok(Self(b))
    }

    /// Parses the file form: 64 hexadecimal digits, surrounding whitespace ignored.
    ///
    /// # Errors
    /// `BadHex`.
    pub fn from_hex(text: &str) -> Result<Self, SecretError> {
        let t = text.trim();
        let bad = SecretError::BadHex { found: t.len() };
        if t.len() != CLUSTER_SECRET_SIZE_BYTES * 2 {
            return Err(bad);
        }
        let mut b = [0u8; CLUSTER_SECRET_SIZE_BYTES];
        for (i, pair) in t.as_bytes().chunks(2).enumerate() {
            let hi = hex_digit(pair[0]).ok_or(bad.clone())?;
            let lo = hex_digit(pair[1]).ok_or(bad.clone())?;
            b[i] = hi << 4 | lo;
        }
        Ok(Self(b))
    }

    /// The file form: 64 lowercase hexadecimal digits and a newline.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(CLUSTER_SECRET_SIZE_BYTES * 2 + 1);
        for b in self.0 {
            s.push_str(&format!("{b:02x}"));
        }
        s.push('\n');
        s
    }

    fn proof(&self, label: &[u8], server_nonce: &AuthNonce, client_nonce: &AuthNonce) -> AuthProof {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.0);
        let mut ctx = hmac::Context::with_key(&key);
        ctx.update(label);
        ctx.update(server_nonce);
        ctx.update(client_nonce);
        let mut out = [0u8; AUTH_PROOF_SIZE_BYTES];
        out.copy_from_slice(ctx.sign().as_ref());
        out
    }

    fn verify(
        &self,
        label: &[u8],
        server_nonce: &AuthNonce,
        client_nonce: &AuthNonce,
        proof: &AuthProof,
    ) -> bool {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.0);
        let mut msg = Vec::with_capacity(label.len() + 2 * AUTH_NONCE_SIZE_BYTES);
        msg.extend_from_slice(label);
        msg.extend_from_slice(server_nonce);
        msg.extend_from_slice(client_nonce);
        // Constant time: a mismatch's position leaks nothing.
        hmac::verify(&key, &msg, proof).is_ok()
    }

    /// The client's proof in `Auth`: HMAC-SHA256(secret, client label ‖ server nonce ‖ client
    /// nonce).
    pub fn client_proof(&self, server_nonce: &AuthNonce, client_nonce: &AuthNonce) -> AuthProof {
        self.proof(CLIENT_LABEL, server_nonce, client_nonce)
    }

    /// Whether `proof` is the client proof for these nonces (constant-time comparison).
    pub fn verify_client_proof(
        &self,
        server_nonce: &AuthNonce,
        client_nonce: &AuthNonce,
        proof: &AuthProof,
    ) -> bool {
        self.verify(CLIENT_LABEL, server_nonce, client_nonce, proof)
    }

    /// The bookie's proof in its `Auth` answer: HMAC-SHA256(secret, bookie label ‖ server
    /// nonce ‖ client nonce).
    pub fn bookie_proof(&self, server_nonce: &AuthNonce, client_nonce: &AuthNonce) -> AuthProof {
        self.proof(BOOKIE_LABEL, server_nonce, client_nonce)
    }

    /// Whether `proof` is the bookie proof for these nonces (constant-time comparison).
    pub fn verify_bookie_proof(
        &self,
        server_nonce: &AuthNonce,
        client_nonce: &AuthNonce,
        proof: &AuthProof,
    ) -> bool {
        self.verify(BOOKIE_LABEL, server_nonce, client_nonce, proof)
    }
}

/// A new nonce from the system's random source.
///
/// # Errors
/// `Random` when the random source fails.
pub fn new_nonce() -> Result<AuthNonce, SecretError> {
    let mut n = [0u8; AUTH_NONCE_SIZE_BYTES];
    fill_random(&mut n)?;
    Ok(n)
}

fn fill_random(out: &mut [u8]) -> Result<(), SecretError> {
    use ring::rand::SecureRandom;
    ring::rand::SystemRandom::new()
        .fill(out)
        .map_err(|_| SecretError::Random)
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_verify_only_with_the_same_secret_nonces_and_side() {
        // Goal: a proof checks only against the secret, nonces and side it was made for.
        let s = ClusterSecret::generate().unwrap();
        let other = ClusterSecret::generate().unwrap();
        let (ns, nc) = (new_nonce().unwrap(), new_nonce().unwrap());
        let p = s.client_proof(&ns, &nc);
        assert!(s.verify_client_proof(&ns, &nc, &p));
        assert!(!other.verify_client_proof(&ns, &nc, &p));
        assert!(!s.verify_client_proof(&nc, &ns, &p));
        assert!(!s.verify_bookie_proof(&ns, &nc, &p), "sides are separated");
        let b = s.bookie_proof(&ns, &nc);
        assert_ne!(b, p);
        assert!(s.verify_bookie_proof(&ns, &nc, &b));
    }

    #[test]
    fn hex_round_trip_and_bad_text() {
        let s = ClusterSecret::generate().unwrap();
        assert_eq!(ClusterSecret::from_hex(&s.to_hex()).unwrap(), s);
        assert_eq!(
            ClusterSecret::from_hex(&format!("  {}  ", s.to_hex().to_uppercase())).unwrap(),
            s
        );
        assert!(ClusterSecret::from_hex("abc").is_err());
        assert!(ClusterSecret::from_hex(&"zz".repeat(32)).is_err());
        assert!(!format!("{s:?}").contains(&s.to_hex()[..8]));
    }
}

//! Proxy tokens: the token file `quire proxy` reads (`auth_tokens_file`) and `quire token new`,
//! which makes a token and the file entry for it.
//!
//! The file is TOML, one `[[token]]` table per token, holding the SHA-256 of the token (never
//! the token) and its rights as stream-name prefixes (`""`: every stream):
//!
//! ```toml
//! [[token]]
//! name = "ingest"
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! read = ["logs/"]
//! write = ["logs/"]
//! admin = []
//! # The tenant's write limits on each proxy (docs/proxy-protocol.md, "Limits"); 0 or left
//! # out: none. Hard: OVER_CAPACITY; soft: logged and counted.
//! records_per_sec = 1000
//! bytes_per_sec = 1048576
//! soft_records_per_sec = 800
//! soft_bytes_per_sec = 0
//! outstanding_writes_max = 100
//! ```

use std::path::Path;

use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};
use quire_proxy::auth::{token_digest_hex, Authorizer, Grant};
use rand::RngCore;
use serde::Deserialize;

/// `quire token` subcommands.
#[derive(Args, Debug)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Subcommand, Debug)]
enum TokenCommand {
    /// Make a new random token: prints the token (give it to the client, as `--token` or
    /// `QUIRE_TOKEN`) on standard error and the `[[token]]` entry for the proxies' token file
    /// on standard output.
    New(NewArgs),
}

#[derive(Args, Debug)]
struct NewArgs {
    /// The token's name, shown in the proxies' logs and refusals.
    name: String,
    /// A stream-name prefix the token may read (repeatable; "" for every stream).
    #[arg(long)]
    read: Vec<String>,
    /// A stream-name prefix the token may write and create (repeatable).
    #[arg(long)]
    write: Vec<String>,
    /// A stream-name prefix the token may truncate, delete and set retention on (repeatable).
    #[arg(long)]
    admin: Vec<String>,
}

/// Random bytes in a token (256 bits).
const TOKEN_RANDOM_BYTES: usize = 32;

/// Runs `quire token`.
pub fn run(args: TokenArgs) -> Result<()> {
    let TokenCommand::New(a) = args.command;
    let mut bytes = [0u8; TOKEN_RANDOM_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let token: String = std::iter::once("qt_".to_string())
        .chain(bytes.iter().map(|b| format!("{b:02x}")))
        .collect();
    let list = |v: &[String]| {
        let quoted: Vec<String> = v.iter().map(|p| format!("{p:?}")).collect();
        format!("[{}]", quoted.join(", "))
    };
    eprintln!(
        "token for {:?} (shown once; the file holds only its SHA-256):",
        a.name
    );
    eprintln!("{token}");
    println!("[[token]]");
    println!("name = {:?}", a.name);
    println!("sha256 = {:?}", token_digest_hex(token.as_bytes()));
    println!("read = {}", list(&a.read));
    println!("write = {}", list(&a.write));
    println!("admin = {}", list(&a.admin));
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    #[serde(default)]
    token: Vec<TokenEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    sha256: String,
    #[serde(default)]
    read: Vec<String>,
    #[serde(default)]
    write: Vec<String>,
    #[serde(default)]
    admin: Vec<String>,
    /// The tenant's write limits on each proxy (quire_proxy::quota, "token" scope):
    /// `records_per_sec`, `bytes_per_sec`, `soft_records_per_sec`, `soft_bytes_per_sec`,
    /// `outstanding_writes_max`; left out or 0: none.
    #[serde(default)]
    records_per_sec: u64,
    #[serde(default)]
    bytes_per_sec: u64,
    #[serde(default)]
    soft_records_per_sec: u64,
    #[serde(default)]
    soft_bytes_per_sec: u64,
    #[serde(default)]
    outstanding_writes_max: u64,
}

/// Reads a token file into the proxy's [`Authorizer`].
///
/// # Errors
/// One line: the file cannot be read or parsed, it holds no token, or a digest is malformed
/// or repeated.
pub fn load_authorizer(path: &Path) -> Result<Authorizer> {
    // Digests only, but a readable list of names and rights still helps an attacker.
    crate::secret_file::warn_if_exposed(path, "auth_tokens_file");
    let file: TokenFile = crate::config::read_toml(path)?;
    if file.token.is_empty() {
        return Err(anyhow!(
            "token file {} holds no [[token]]: every client would be refused",
            path.display()
        ));
    }
    Authorizer::new(file.token.into_iter().map(|t| {
        (
            t.sha256,
            Grant {
                name: t.name,
                read: t.read,
                write: t.write,
                admin: t.admin,
                limits: quire_proxy::RateLimits {
                    records_per_sec: t.records_per_sec,
                    bytes_per_sec: t.bytes_per_sec,
                    soft_records_per_sec: t.soft_records_per_sec,
                    soft_bytes_per_sec: t.soft_bytes_per_sec,
                    outstanding_writes_max: t.outstanding_writes_max,
                },
            },
        )
    }))
    .map_err(|e| anyhow!("token file {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_loads_and_bad_ones_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokens.toml");
        let digest = token_digest_hex(b"qt_abc");
        std::fs::write(
            &p,
            format!("[[token]]\nname = \"ingest\"\nsha256 = \"{digest}\"\nwrite = [\"logs/\"]\n"),
        )
        .unwrap();
        let a = load_authorizer(&p).unwrap();
        let g = a.authenticate(b"qt_abc").unwrap();
        assert_eq!(
            (g.name.as_str(), g.write.as_slice()),
            ("ingest", &["logs/".to_string()][..])
        );
        assert!(g.limits.is_unlimited(), "no limits unless stated");
        std::fs::write(
            &p,
            format!("[[token]]\nname = \"t\"\nsha256 = \"{digest}\"\nrecords_per_sec = 50\noutstanding_writes_max = 4\n"),
        )
        .unwrap();
        let a = load_authorizer(&p).unwrap();
        let l = a.authenticate(b"qt_abc").unwrap().limits;
        assert_eq!(
            (l.records_per_sec, l.bytes_per_sec, l.outstanding_writes_max),
            (50, 0, 4)
        );
        for (text, says) in [
            ("", "holds no [[token]]"),
            (
                "[[token]]\nname = \"x\"\nsha256 = \"12\"\n",
                "64 hex digits",
            ),
            (
                "[[token]]\nname = \"x\"\nsha256 = \"12\"\nrights = []\n",
                "unknown field",
            ),
        ] {
            std::fs::write(&p, text).unwrap();
            let e = format!("{:#}", load_authorizer(&p).unwrap_err());
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }
}

//! `quire config show --role bookie|proxy|autorecovery [--config FILE] [--json] [-- FLAGS]`:
//! the configuration a `quire bookie`, `quire proxy` or `quire autorecovery` started with the
//! same file, environment and flags would run with (rpk's `cluster config get`, BookKeeper's
//! `bookieformat`-less `ServerConfiguration` dump). The merging is the process's own:
//! [`crate::config::load`] of the role's file type over the crates' defaults, the flags after
//! `--` parsed by the role's own flag set (so their environment variables, `QUIRE_ZOOKEEPER`
//! and the others, count as they would), then the role's checks; a failing check is shown, not
//! fatal, so that a configuration can be inspected on a machine that lacks its files.
//!
//! Secrets: no configuration key holds a secret value; secrets live in files whose paths are
//! keys ([`SECRET_FILE_KEYS`]: the cluster secret, the ZooKeeper digest identity, the proxy's
//! token keys, the TLS private keys). Their paths are shown, their contents never are (this
//! command does not read them for output). Any key whose name says it holds a secret value
//! (`secret`, `password`, `token`, `private_key`, not ending in `_file`) is printed as
//! `<redacted>`, so that a key added later cannot leak through this command.

use std::path::PathBuf;

use anyhow::{anyhow, Result};
use clap::{Args, FromArgMatches, Subcommand, ValueEnum};
use serde::Serialize;

use crate::config::{keys_of, AUTORECOVERY_KEYS, BOOKIE_KEYS, PROXY_KEYS};

/// Keys whose value is the path of a file holding a secret: shown as paths, never read here.
pub const SECRET_FILE_KEYS: &[&str] = &[
    "cluster_secret_file",
    "zookeeper.auth_file",
    "auth_tokens_file",
    "tls.key_file",
    "bookie_tls.key_file",
];

/// What replaces a secret value.
pub const REDACTED: &str = "<redacted>";

/// `quire config` subcommands.
#[derive(Args, Debug)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub command: ConfigCommand,
}

/// `quire config` subcommands.
#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Print a process's effective configuration (file, environment and flags merged as the
    /// process does), secrets redacted, as TOML or `--json`. The process's flags go after
    /// `--`: `quire config show --role bookie --config b.toml -- --shards 2`.
    Show(ShowArgs),
}

/// The process whose configuration to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    Bookie,
    Proxy,
    Autorecovery,
}

/// `quire config show` options.
#[derive(Args, Debug)]
pub struct ShowArgs {
    /// Which process's configuration.
    #[arg(long, value_enum)]
    pub role: Role,
    /// The process's TOML configuration file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print one JSON document instead of TOML.
    #[arg(long)]
    pub json: bool,
    /// The process's own flags (after `--`), as it would be started with.
    #[arg(last = true, allow_hyphen_values = true)]
    pub flags: Vec<String>,
}

/// An effective configuration, redacted.
#[derive(Debug, Serialize)]
pub struct Shown {
    pub role: &'static str,
    pub config_file: Option<PathBuf>,
    /// Keys holding paths of secret files (shown) and keys redacted by name.
    pub secret_keys: Vec<String>,
    /// The process's checks: `None` when they pass, else the error the process would stop with.
    pub error: Option<String>,
    pub settings: toml::Value,
}

/// Runs `quire config`.
pub fn run(args: ConfigArgs) -> Result<()> {
    let ConfigCommand::Show(args) = args.command;
    let shown = effective(args.role, args.config.clone(), &args.flags)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&shown)?);
        return Ok(());
    }
    print!("{}", to_toml(&shown)?);
    Ok(())
}

/// Parses `flags` with the flag set `F` of a process named `name`.
fn parse_flags<F: clap::Args + FromArgMatches>(name: &'static str, flags: &[String]) -> Result<F> {
    let command = F::augment_args(clap::Command::new(name).no_binary_name(true));
    let matches = command
        .try_get_matches_from(flags)
        .map_err(|e| anyhow!("invalid {name} flag: {}", first_line(&e.to_string())))?;
    Ok(F::from_arg_matches(&matches)?)
}

fn first_line(s: &str) -> String {
    s.lines()
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .to_string()
}

/// The role's merged, checked and redacted configuration.
///
/// # Errors
/// An unreadable or malformed file, or invalid flags (the process would not start either).
pub fn effective(role: Role, config: Option<PathBuf>, flags: &[String]) -> Result<Shown> {
    let path = config.as_deref();
    let (name, value, error) = match role {
        Role::Bookie => {
            let flags: crate::flags::BookieFlags = parse_flags("quire bookie", flags)?;
            let file: crate::config::BookieFile =
                crate::config::load(path, &keys_of(BOOKIE_KEYS), &flags)?;
            let value = toml::Value::try_from(&file)?;
            ("bookie", value, file.resolve().err())
        }
        Role::Proxy => {
            let flags: crate::flags::ProxyFlags = parse_flags("quire proxy", flags)?;
            let file: crate::config::ProxyFile =
                crate::config::load(path, &keys_of(PROXY_KEYS), &flags)?;
            let value = toml::Value::try_from(&file)?;
            ("proxy", value, file.resolve().err())
        }
        Role::Autorecovery => {
            let flags: crate::flags::AutorecoveryFlags = parse_flags("quire autorecovery", flags)?;
            let file: crate::config::AutorecoveryFile =
                crate::config::load(path, &keys_of(AUTORECOVERY_KEYS), &flags)?;
            let value = toml::Value::try_from(&file)?;
            let error = crate::config::MetadataAddress::from_config(
                &file.zookeeper,
                &keys_of(AUTORECOVERY_KEYS),
            )
            .err();
            ("autorecovery", value, error)
        }
    };
    let mut settings = value;
    let mut secret_keys: Vec<String> = SECRET_FILE_KEYS.iter().map(|k| k.to_string()).collect();
    redact(&mut settings, "", &mut secret_keys);
    Ok(Shown {
        role: name,
        config_file: config,
        secret_keys,
        error: error.map(|e| format!("{e:#}")),
        settings,
    })
}

/// Whether a key's name says it holds a secret value (not a path to one).
pub fn is_secret_name(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    !key.ends_with("_file")
        && ["secret", "password", "token", "private_key", "passphrase"]
            .iter()
            .any(|w| key.contains(w))
}

/// Replaces every secret-named value under `value` (at dotted path `at`) by [`REDACTED`],
/// adding its path to `redacted`.
fn redact(value: &mut toml::Value, at: &str, redacted: &mut Vec<String>) {
    let toml::Value::Table(table) = value else {
        return;
    };
    for (key, v) in table.iter_mut() {
        let path = if at.is_empty() {
            key.clone()
        } else {
            format!("{at}.{key}")
        };
        if v.is_table() {
            redact(v, &path, redacted);
        } else if is_secret_name(key) {
            *v = toml::Value::String(REDACTED.into());
            redacted.push(path);
        }
    }
}

/// The TOML form: a header of comments (role, file, secrets, check result), then the keys.
fn to_toml(shown: &Shown) -> Result<String> {
    let mut out = format!("# effective configuration of quire {}", shown.role);
    if let Some(file) = &shown.config_file {
        out.push_str(&format!(" (file {})", file.display()));
    }
    out.push_str(
        "\n# unset optional keys are not shown; secret keys (paths shown, contents never): ",
    );
    out.push_str(&shown.secret_keys.join(", "));
    out.push('\n');
    match &shown.error {
        None => out.push_str("# checks: pass\n\n"),
        Some(e) => out.push_str(&format!("# checks: FAIL: {e}\n\n")),
    }
    out.push_str(&toml::to_string_pretty(&shown.settings)?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_are_redacted_and_paths_are_not() {
        assert!(is_secret_name("cluster_secret"));
        assert!(is_secret_name("zk_password"));
        assert!(is_secret_name("token"));
        assert!(!is_secret_name("cluster_secret_file"));
        assert!(!is_secret_name("key_file"));
        assert!(!is_secret_name("listen"));
        let mut v: toml::Value =
            toml::from_str("a = 1\n[t]\nadmin_token = \"abc\"\nkey_file = \"/k\"\n").unwrap();
        let mut keys = Vec::new();
        redact(&mut v, "", &mut keys);
        assert_eq!(v["t"]["admin_token"].as_str(), Some(REDACTED));
        assert_eq!(v["t"]["key_file"].as_str(), Some("/k"));
        assert_eq!(keys, vec!["t.admin_token".to_string()]);
    }
}

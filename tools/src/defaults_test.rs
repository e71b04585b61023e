//! Every default is written once (issue 25, item 2): the crates' `Default` is the only place.
//! This test checks that each default shown by `quire bookie|proxy|autorecovery --help`,
//! stated in tools/examples/*.toml, and stated in the Ansible templates rendered with the
//! roles' defaults (by ansible/ci/render-config.py, python3 with jinja2) equals the crate's
//! `Default`, and that the example files and rendered templates parse. Changing a default in
//! one place only (a crate, an example, a role's defaults/main.yml) makes it fail.

use std::collections::BTreeMap;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::{
    from_text, keys_of, AutorecoveryFile, BookieFile, Key, ProxyFile, Table, AUTORECOVERY_KEYS,
    BOOKIE_KEYS, PROXY_KEYS,
};

/// Keys that have a default but whose value in an example or a template is the site's.
const SITE: &[&str] = &["zookeeper.servers"];

/// Every leaf of a TOML value, by dotted path.
fn leaves(value: &toml::Value) -> BTreeMap<String, toml::Value> {
    fn walk(prefix: &str, v: &toml::Value, out: &mut BTreeMap<String, toml::Value>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&path, v, out);
                }
            }
            leaf => {
                out.insert(prefix.to_string(), leaf.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", value, &mut out);
    out
}

fn defaults_of<T: Serialize + Default>() -> BTreeMap<String, toml::Value> {
    leaves(&toml::Value::try_from(T::default()).unwrap())
}

/// Checks one file's text: it parses as `T` in today's tables (no old spelling), and every
/// key it states that has a default states that default. Returns the stated keys.
fn check_file<T>(name: &str, text: &str, tables: &[Table]) -> BTreeMap<String, toml::Value>
where
    T: Serialize + DeserializeOwned + Default,
{
    let keys = keys_of(tables);
    let none = BTreeMap::<String, String>::new();
    from_text::<T>(Some(text), Path::new(name), &keys, &none)
        .unwrap_or_else(|e| panic!("{name} does not parse: {e:#}"));
    let stated = leaves(&toml::from_str::<toml::Value>(text).unwrap());
    let defaults = defaults_of::<T>();
    for (path, value) in &stated {
        assert!(
            keys.iter().any(|k| &k.path == path),
            "{name}: {path} is not a key of today's tables (an old spelling?)"
        );
        if let (Some(default), false) = (defaults.get(path), SITE.contains(&path.as_str())) {
            assert_eq!(
                value, default,
                "{name} states {path} = {value}, the default is {default}"
            );
        }
    }
    stated
}

#[test]
fn example_files_state_every_default() {
    // Goal: the examples state every key that has a default, with the crate's value.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    let b = check_file::<BookieFile>("bookie.toml", &read("bookie.toml"), BOOKIE_KEYS);
    let p = check_file::<ProxyFile>("proxy.toml", &read("proxy.toml"), PROXY_KEYS);
    for (name, stated, defaults) in [
        ("bookie.toml", b, defaults_of::<BookieFile>()),
        ("proxy.toml", p, defaults_of::<ProxyFile>()),
    ] {
        for path in defaults.keys() {
            assert!(
                stated.contains_key(path),
                "{name} does not show {path} (default {})",
                defaults[path]
            );
        }
    }
}

fn render(role: &str, template: &str, vars: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ansible/ci/render-config.py");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .args([role, template])
        .args(vars)
        .output()
        .expect("python3 runs (the template check needs python3 with jinja2 and PyYAML)");
    assert!(
        out.status.success(),
        "{} {role} {template} {vars:?}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn ansible_templates_render_parse_and_state_the_defaults() {
    // Goal: the roles' config templates, rendered with the roles' defaults (TLS, ACLs and
    // tokens on and off), parse and state the crates' defaults.
    for vars in [
        &[][..],
        &[
            "quire_tls=false",
            "quire_zk_acl=false",
            "quire_auth_tokens=false",
        ][..],
        &["quire_bookie_cpu_set=[0]", "quire_bookie_rack=r1"][..],
    ] {
        let b = render("bookie", "bookie.toml.j2", vars);
        let stated = check_file::<BookieFile>("bookie.toml.j2", &b, BOOKIE_KEYS);
        assert!(stated.contains_key("engine.group_commit_wait_us"), "{b}");
        let p = render("proxy", "proxy.toml.j2", vars);
        let stated = check_file::<ProxyFile>("proxy.toml.j2", &p, PROXY_KEYS);
        assert!(stated.contains_key("streams.ack_quorum"), "{p}");
    }
}

#[test]
fn ansible_extra_config_reaches_the_rendered_files() {
    // Issue 27 item 6. Goal: any key of bookie.toml / proxy.toml passes through the roles'
    // extra-config variables (per group, and per host over it), in a table the template has
    // or one it has not, at the top level too, and the result parses with the value given.
    let b = render(
        "bookie",
        "bookie.toml.j2",
        &[
            "quire_bookie_extra_config={bookie: {gc_interval_secs: 7}, engine: {entry_log_size_bytes: 16777216}, compaction: {minor_threshold: 0.3}}",
            "quire_bookie_host_extra_config={bookie: {gc_interval_secs: 9}}",
        ],
    );
    let file = toml::from_str::<toml::Value>(&b).unwrap();
    from_text::<BookieFile>(
        Some(&b),
        Path::new("bookie.toml.j2"),
        &keys_of(BOOKIE_KEYS),
        &BTreeMap::<String, String>::new(),
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{b}"));
    assert_eq!(
        file["bookie"]["gc_interval_secs"].as_integer(),
        Some(9),
        "{b}"
    );
    assert_eq!(
        file["engine"]["entry_log_size_bytes"].as_integer(),
        Some(16777216),
        "{b}"
    );
    assert_eq!(
        file["compaction"]["minor_threshold"].as_float(),
        Some(0.3),
        "{b}"
    );
    assert_eq!(
        file["metrics_listen"].as_str(),
        Some("10.0.0.1:9181"),
        "{b}"
    );
    let p = render(
        "proxy",
        "proxy.toml.j2",
        &[
            "quire_tls=false",
            "quire_proxy_extra_config={streams: {retention_time_secs: 86400}, server: {handshakes_max: 9}}",
        ],
    );
    let file = toml::from_str::<toml::Value>(&p).unwrap();
    from_text::<ProxyFile>(
        Some(&p),
        Path::new("proxy.toml.j2"),
        &keys_of(PROXY_KEYS),
        &BTreeMap::<String, String>::new(),
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{p}"));
    assert_eq!(
        file["streams"]["retention_time_secs"].as_integer(),
        Some(86400),
        "{p}"
    );
    assert_eq!(
        file["server"]["handshakes_max"].as_integer(),
        Some(9),
        "{p}"
    );
    assert_eq!(
        file["metrics_listen"].as_str(),
        Some("10.0.0.1:9182"),
        "{p}"
    );
}

/// Whether `text` states a default by hand ("default 2000", "default: 0.95").
fn states_a_default(text: &str) -> bool {
    let lower = text.to_lowercase();
    lower.match_indices("default").any(|(i, w)| {
        let rest = lower[i + w.len()..].trim_start_matches([' ', ':', '=', 'i', 's']);
        rest.starts_with(|c: char| c.is_ascii_digit())
    })
}

/// `--flag` → the `X` of its `[default: X]` in `help`; panics on a default stated by hand in
/// a flag's doc.
fn shown_defaults(help: &str) -> BTreeMap<String, String> {
    let mut shown = BTreeMap::new();
    let mut flag = String::new();
    for line in help.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("--") {
            flag = rest.split([' ', '=']).next().unwrap().replace('-', "_");
        }
        let (before, rest) = line.split_once("[default: ").unwrap_or((line, ""));
        assert!(!states_a_default(before), "--{flag}: {line}");
        if rest.is_empty() {
            continue;
        }
        let value = rest.split(']').next().unwrap();
        shown.insert(flag.clone(), value.to_string());
    }
    shown
}

fn check_help<T: Serialize + Default>(sub: &str, tables: &[Table]) {
    let mut command = crate::command();
    let help = command
        .find_subcommand_mut(sub)
        .unwrap()
        .render_long_help()
        .to_string();
    let shown = shown_defaults(&help);
    let defaults = defaults_of::<T>();
    let keys: Vec<Key> = keys_of(tables);
    for Key { flag, path, .. } in &keys {
        let want = defaults.get(path).map(|v| match v {
            toml::Value::String(s) => s.clone(),
            v => v.to_string(),
        });
        assert_eq!(
            shown.get(*flag),
            want.as_ref(),
            "quire {sub} --help: --{flag} ({path})"
        );
    }
    assert!(!shown.is_empty(), "{help}");
}

#[test]
fn help_shows_the_crates_defaults() {
    // Goal: `--help` shows, for each flag of a key, exactly the crate's default, and no flag's
    // doc states a default of its own.
    check_help::<BookieFile>("bookie", BOOKIE_KEYS);
    check_help::<ProxyFile>("proxy", PROXY_KEYS);
    check_help::<AutorecoveryFile>("autorecovery", AUTORECOVERY_KEYS);
    // The sandbox's flags of crate keys, whose docs stated "default 0.95" and the like.
    check_help::<crate::sandbox::Defaults>("sandbox", crate::sandbox::KEYS);
    // The doc of --group-commit-wait-us said "default 2000" while the engine's was 0.
    assert!(states_a_default(
        "in microseconds (BookKeeper `journalMaxGroupWaitMSec`; default 2000)"
    ));
    assert!(!states_a_default("Default retention time of every stream"));
}

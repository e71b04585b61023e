//! Tests of [`super`]: the files' tables, flags over them, old spellings, and the checks'
//! messages (moved here from config.rs, with the same assertions, the keys in their tables).

use std::time::Duration;

use super::*;
use crate::flags::{BookieFlags, ProxyFlags, ZooKeeperFlags};

/// A cluster secret file for the tests' settings (every bookie and proxy needs one).
fn test_secret_file() -> PathBuf {
    static FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let path = std::env::temp_dir()
            .join(format!("quire-config-test-{}", std::process::id()))
            .join("cluster-secret");
        let secret = quire_wire::auth::ClusterSecret::generate().unwrap();
        crate::secret_file::write_private(&path, secret.to_hex().as_bytes(), true).unwrap();
        path
    })
    .clone()
}

/// Flags with only `cluster_secret_file` set.
fn bookie_flags() -> BookieFlags {
    BookieFlags {
        cluster_secret_file: Some(test_secret_file()),
        ..Default::default()
    }
}

/// Flags with only `cluster_secret_file` set.
fn proxy_flags() -> ProxyFlags {
    ProxyFlags {
        cluster_secret_file: Some(test_secret_file()),
        ..Default::default()
    }
}

fn bookie_file(text: &str, flags: &BookieFlags) -> Result<BookieFile> {
    from_text(
        Some(text),
        Path::new("t.toml"),
        &keys_of(BOOKIE_KEYS),
        flags,
    )
}

fn proxy_file(text: &str, flags: &ProxyFlags) -> Result<ProxyFile> {
    from_text(Some(text), Path::new("t.toml"), &keys_of(PROXY_KEYS), flags)
}

fn bookie_from(text: &str) -> Result<BookieOptions> {
    bookie_file(text, &bookie_flags())?.resolve()
}

fn proxy_from(text: &str) -> Result<ProxyOptions> {
    proxy_file(text, &proxy_flags())?.resolve()
}

/// A bookie file in today's layout; `[bookie]` keys may follow it directly.
const BOOKIE: &str = "listen = \"127.0.0.1:1\"\n[zookeeper]\nservers = \"h:1\"\n[bookie]\njournal_dir = \"/j\"\nledger_dir = \"/l\"\n";
/// A bookie file from before the tables (every key aliased).
const OLD_BOOKIE: &str =
    "zookeeper = \"h:1\"\njournal_dir = \"/j\"\nledger_dir = \"/l\"\nlisten = \"127.0.0.1:1\"\n";
/// A proxy file in today's layout; `[streams]` keys may follow it directly.
const PROXY: &str = "listen = \"127.0.0.1:4181\"\n[zookeeper]\nservers = \"h:1\"\n[streams]\n";

#[test]
fn bookie_and_proxy_refuse_to_start_without_a_cluster_secret() {
    // Goal: every real bookie and proxy admits only its cluster (issue 24): without
    // `cluster_secret_file` neither starts, and the error names the setting.
    let e = bookie_file(BOOKIE, &BookieFlags::default())
        .unwrap()
        .resolve()
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("missing setting cluster_secret_file"),
        "{e}"
    );
    let e = proxy_file(PROXY, &ProxyFlags::default())
        .unwrap()
        .resolve()
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("missing setting cluster_secret_file"),
        "{e}"
    );
    let o = bookie_from(BOOKIE).unwrap();
    assert!(o.bookie.cluster_secret.is_some());
    assert!(o.autorecovery.unwrap().cluster_secret.is_some());
}

#[test]
fn bookie_file_and_flag_override() {
    // Goal: file values are read, flags win, defaults fill the rest.
    let text = r#"
        listen = "127.0.0.1:3181"
        metrics_listen = "127.0.0.1:9181"
        [zookeeper]
        servers = "127.0.0.1:2181"
        [bookie]
        journal_dir = "/data/j"
        ledger_dir = "/data/l"
        shards = 2
        gc_interval_secs = 30
        [engine]
        group_commit_wait_us = 500
    "#;
    let flags = BookieFlags {
        shards: Some(3),
        rack: Some("r1".into()),
        ..bookie_flags()
    };
    let o = bookie_file(text, &flags).unwrap().resolve().unwrap();
    assert_eq!(o.bookie.shards, 3);
    assert_eq!(o.rack.as_deref(), Some("r1"));
    assert_eq!(o.advertised, "127.0.0.1:3181");
    assert_eq!(o.metadata.zk_root, "/quire");
    assert_eq!(o.metrics_listen, Some("127.0.0.1:9181".parse().unwrap()));
    assert_eq!(
        o.bookie.engine.group_commit_wait_max,
        Duration::from_micros(500)
    );
    assert_eq!(o.bookie.gc_interval, Duration::from_secs(30));
    let o = bookie_from(BOOKIE).unwrap();
    assert_eq!(o.bookie.gc_interval, quire_bookie::GC_INTERVAL_DEFAULT);
}

#[test]
fn old_files_load_or_name_the_new_key() {
    // Goal: a key of the previous release's Ansible templates, at the top level, still loads
    // as its table's key (so does the whole old template set); any other moved key fails
    // with one line naming its table and new name; an old spelling next to its new table
    // fails too; errors after the rewrite keep the file's line numbers.
    let o = bookie_from(&format!(
        "{OLD_BOOKIE}zk_root = \"/q\"\nshards = 2\ngroup_commit_wait_us = 7\ndisk_usage_threshold = 0.8\n"
    ))
    .unwrap();
    assert_eq!(o.metadata.zookeeper, "h:1");
    assert_eq!(o.metadata.zk_root, "/q");
    assert_eq!(o.bookie.shards, 2);
    assert_eq!(
        o.bookie.engine.group_commit_wait_max,
        Duration::from_micros(7)
    );
    assert_eq!(o.bookie.disk_usage_threshold, 0.8);
    let o =
        proxy_from("zookeeper = \"h:1\"\nlisten = \"127.0.0.1:4181\"\nack_quorum = 1\n").unwrap();
    assert_eq!(o.streams.ack_quorum, 1);
    for (old, new) in [
        (
            "minor_compaction_threshold = 0.1",
            "key minor_compaction_threshold has moved: write it as minor_threshold in the [compaction] table",
        ),
        (
            "journal_queue_bytes_max = 1048576",
            "write it as journal_queue_bytes_max in the [engine] table",
        ),
        (
            "autorecovery_enabled = false",
            "write it as enabled in the [autorecovery] table",
        ),
    ] {
        let e = bookie_from(&format!("{OLD_BOOKIE}{old}\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(new) && e.lines().count() == 1, "{old}: {e}");
    }
    let e = proxy_from("zookeeper = \"h:1\"\nlisten = \"127.0.0.1:4181\"\ntxid_jump_max = 0\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("write it as txid_jump_max in the [streams] table"),
        "{e}"
    );
    let e = bookie_from(&format!("shards = 2\n{BOOKIE}"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("key shards has moved: write it as shards in the [bookie] table"),
        "{e}"
    );
    let e = bookie_from("zookeeper = \"h:1\"\n\nshards = \"two\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 3"), "{e}");
}

#[test]
fn flags_override_keys_in_tables() {
    // Goal: a flag reaches its key's table, over the file's value; `--zookeeper` alone is a
    // whole metadata address.
    let flags = BookieFlags {
        zk: ZooKeeperFlags {
            zk_root: Some("/other".into()),
            ..Default::default()
        },
        minor_compaction_threshold: Some(0.3),
        journal_queue_bytes_max: Some(1 << 20),
        autorecovery_enabled: Some(false),
        ..bookie_flags()
    };
    let text = format!("{BOOKIE}[compaction]\nminor_threshold = 0.1\n");
    let o = bookie_file(&text, &flags).unwrap().resolve().unwrap();
    assert_eq!(o.metadata.zk_root, "/other");
    assert_eq!(o.bookie.engine.minor_compaction_threshold, 0.3);
    assert_eq!(o.bookie.engine.journal_queue_bytes_max, 1 << 20);
    assert!(o.autorecovery.is_none());
    let args = ZooKeeperFlags {
        zookeeper: Some("h:1".into()),
        zk_root: None,
        zk_session_timeout_ms: None,
        zk_auth_file: None,
    };
    let a = args.resolve().unwrap();
    assert_eq!(
        (a.zookeeper.as_str(), a.zk_root.as_str()),
        ("h:1", "/quire")
    );
    let e = ZooKeeperFlags {
        zookeeper: None,
        ..args
    }
    .resolve()
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("missing setting zookeeper") && e.contains("--zookeeper"),
        "{e}"
    );
}

#[test]
fn bookie_engine_bounds_are_read_and_checked() {
    // Goal: `journal_queue_bytes_max` and `entry_log_readers_max` reach the engine
    // configuration, default to the engine's defaults, and a too small value is one line
    // naming the setting.
    let o = bookie_from(&format!(
        "{BOOKIE}[engine]\njournal_queue_bytes_max = 1048576\nentry_log_readers_max = 8"
    ))
    .unwrap();
    assert_eq!(o.bookie.engine.journal_queue_bytes_max, 1 << 20);
    assert_eq!(o.bookie.engine.entry_log_readers_max, 8);
    let d = bookie_from(BOOKIE).unwrap().bookie.engine;
    assert_eq!(d.journal_queue_bytes_max, 64 << 20);
    assert_eq!(d.entry_log_readers_max, 256);
    for (bad, want) in [
        (
            "journal_queue_bytes_max = 4096",
            "invalid setting engine.journal_queue_bytes_max = 4096",
        ),
        (
            "entry_log_readers_max = 0",
            "invalid setting engine.entry_log_readers_max = 0",
        ),
    ] {
        let e = bookie_from(&format!("{BOOKIE}[engine]\n{bad}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want) && e.lines().count() == 1, "{bad}: {e}");
    }
}

#[test]
fn bookie_compaction_settings_are_read_and_checked() {
    // Goal: the compaction, entry-log and checkpoint keys reach the engine configuration;
    // thresholds outside [0, 1], minor >= major and too small sizes are one line by name.
    let o = bookie_from(&format!(
        "{BOOKIE}[compaction]\nminor_threshold = 0.1\nminor_interval_secs = 5\n\
         major_threshold = 0.5\nmajor_interval_secs = 0\n[engine]\n\
         entry_log_size_bytes = 131072\ncheckpoint_interval_ms = 250\n\
         index_cache_bytes_max = 1048576"
    ))
    .unwrap();
    let e = &o.bookie.engine;
    assert_eq!(e.minor_compaction_threshold, 0.1);
    assert_eq!(e.minor_compaction_interval, Duration::from_secs(5));
    assert_eq!(e.major_compaction_threshold, 0.5);
    assert_eq!(e.major_compaction_interval, Duration::ZERO);
    assert_eq!(e.entry_log_size_bytes_max, 131072);
    assert_eq!(e.checkpoint_interval, Duration::from_millis(250));
    assert_eq!(e.index_cache_bytes_max, 1 << 20);
    let d = bookie_from(BOOKIE).unwrap().bookie.engine;
    assert_eq!(d.index_cache_bytes_max, 16 << 20);
    assert_eq!(
        (d.minor_compaction_threshold, d.major_compaction_threshold),
        (0.2, 0.8)
    );
    for (bad, want) in [
        (
            "[compaction]\nminor_threshold = -0.1",
            "invalid setting compaction.minor_threshold",
        ),
        (
            "[compaction]\nmajor_threshold = 1.5",
            "invalid setting compaction.major_threshold",
        ),
        (
            "[compaction]\nminor_threshold = 0.9",
            "must be below the major one",
        ),
        (
            "[compaction]\nmajor_threshold = 0.1",
            "must be below the major one",
        ),
        (
            "[engine]\nentry_log_size_bytes = 4096",
            "invalid setting engine.entry_log_size_bytes",
        ),
        (
            "[engine]\ncheckpoint_interval_ms = 0",
            "invalid setting engine.checkpoint_interval_ms",
        ),
        (
            "[engine]\nindex_cache_bytes_max = 4096",
            "invalid setting engine.index_cache_bytes_max",
        ),
    ] {
        let e = bookie_from(&format!("{BOOKIE}{bad}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want) && e.lines().count() == 1, "{bad}: {e}");
    }
}

#[test]
fn bookie_cpu_set_is_read_and_checked() {
    // Goal: `cpu_set` reaches the bookie's configuration; an empty list, a repeated CPU
    // and a CPU this process cannot run on are refused by name. Method: CPU 0 is in the
    // affinity mask of the test process and CPU 1023 is not, on the machines that run the
    // tests (neither restricts the mask nor has 1,024 CPUs).
    let o = bookie_from(&format!("{BOOKIE}cpu_set = [0]")).unwrap();
    assert_eq!(o.bookie.cpu_set, vec![0]);
    let o = bookie_from(BOOKIE).unwrap();
    assert!(o.bookie.cpu_set.is_empty(), "unpinned by default");
    for (set, want) in [
        ("[]", "list at least one CPU"),
        ("[0, 0]", "CPU 0 is listed twice"),
        ("[1023]", "CPU 1023 is not available"),
    ] {
        let e = bookie_from(&format!("{BOOKIE}cpu_set = {set}"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("invalid setting bookie.cpu_set") && e.contains(want),
            "{set}: {e}"
        );
    }
}

#[test]
fn bookie_errors_name_the_setting() {
    // Goal: each missing or invalid setting is reported by name.
    let base =
        "[zookeeper]\nservers = \"h:1\"\n[bookie]\njournal_dir = \"/j\"\nledger_dir = \"/l\"\n";
    let e = bookie_from(base).unwrap_err().to_string();
    assert!(e.contains("missing setting listen"), "{e}");
    let e = bookie_from(&format!("listen = \"0.0.0.0:3181\"\n{base}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing setting advertised"), "{e}");
    let e = bookie_from(&format!("listen = \"127.0.0.1:0\"\n{base}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("the port must be fixed"), "{e}");
    let e = bookie_from("listen = \"127.0.0.1:1\"\n[bookie]\njournal_dir = \"/j\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing setting zookeeper"), "{e}");
    let e = bookie_from("[zookeeper]\nservers = \"nohost\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("invalid setting zookeeper"), "{e}");
    let e = bookie_from("[bookie]\njournal = \"/j\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `journal`"), "{e}");
    let e = bookie_from(&format!("listen = \"127.0.0.1:1\"\n{base}shards = 0"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("invalid setting bookie.shards = 0"), "{e}");
    let e = bookie_from(
        "listen = \"127.0.0.1:1\"\n[zookeeper]\nservers = \"h:1\"\n[bookie]\nledger_dir = \"/l\"",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("missing setting bookie.journal_dir") && e.contains("--journal-dir"),
        "{e}"
    );
}

#[test]
fn tls_settings_are_read_and_checked() {
    // Goal: TLS is off by default; the TLS keys reach the bookie's configuration and its
    // autorecovery's client; incomplete TLS settings are refused by name.
    let dir = tempfile::tempdir().unwrap();
    let pki = quire_tls::gen::write_pki(dir.path(), &["127.0.0.1".into()]).unwrap();
    let o = bookie_from(BOOKIE).unwrap();
    assert!(o.bookie.tls.is_none(), "plain TCP by default");
    let (cert, key, ca) = (
        pki.cert_file.display(),
        pki.key_file.display(),
        pki.ca_file.display(),
    );
    let full = format!(
        "{BOOKIE}[tls]\ncert_file = \"{cert}\"\nkey_file = \"{key}\"\nca_file = \"{ca}\"\nclient_auth = \"require\"\n"
    );
    let o = bookie_from(&full).unwrap();
    let tls = o.bookie.tls.expect("TLS on");
    assert_eq!(tls.client_auth, quire_tls::ClientAuth::Require);
    assert!(o.autorecovery.expect("on").bookie_tls.is_some());
    for (text, want) in [
        (
            format!("{BOOKIE}[tls]\ncert_file = \"{cert}\"\n"),
            "missing setting tls.key_file",
        ),
        (
            format!("{BOOKIE}[tls]\nclient_auth = \"require\"\n"),
            "TLS is off",
        ),
        (full.replace("require", "sometimes"), "tls.client_auth"),
        (
            format!("{BOOKIE}[tls]\ncert_file = \"{cert}\"\nkey_file = \"{key}\"\n"),
            "missing setting tls.ca_file",
        ),
        (
            full.replace(&ca.to_string(), "/nonexistent/ca.pem"),
            "/nonexistent/ca.pem",
        ),
    ] {
        let e = format!("{:#}", bookie_from(&text).unwrap_err());
        assert!(e.contains(want), "{want}: {e}");
    }
}

#[test]
fn bookie_disk_usage_settings_are_read_and_checked() {
    // Goal: the read-only mode keys reach the bookie's configuration with BookKeeper's
    // defaults, and bad values are refused by name.
    let o = bookie_from(BOOKIE).unwrap();
    assert_eq!(
        (
            o.bookie.disk_usage_threshold,
            o.bookie.disk_usage_lwm_threshold,
            o.bookie.disk_check_interval
        ),
        (0.95, 0.90, Duration::from_secs(10))
    );
    let o = bookie_from(&format!(
        "{BOOKIE}disk_usage_threshold = 0.8\ndisk_usage_lwm_threshold = 0.7\ndisk_check_interval_ms = 250"
    ))
    .unwrap();
    assert_eq!(o.bookie.disk_usage_threshold, 0.8);
    assert_eq!(o.bookie.disk_usage_lwm_threshold, 0.7);
    assert_eq!(o.bookie.disk_check_interval, Duration::from_millis(250));
    let o = bookie_from(&format!("{BOOKIE}disk_usage_threshold = 0.5")).unwrap();
    assert_eq!(o.bookie.disk_usage_lwm_threshold, 0.5);
    for (text, want) in [
        (
            "disk_usage_threshold = 1.5",
            "invalid setting bookie.disk_usage_threshold = 1.5",
        ),
        (
            "disk_usage_threshold = 0.0",
            "invalid setting bookie.disk_usage_threshold = 0",
        ),
        (
            "disk_usage_lwm_threshold = 0.99",
            "invalid setting bookie.disk_usage_lwm_threshold = 0.99",
        ),
        (
            "disk_check_interval_ms = 0",
            "invalid setting bookie.disk_check_interval_ms = 0",
        ),
    ] {
        let e = bookie_from(&format!("{BOOKIE}{text}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{text}: {e}");
    }
}

#[test]
fn proxy_quorum_is_checked() {
    // Goal: the proxy refuses a quorum shape that breaks E >= Qw >= Qa >= 1.
    let text = format!("{PROXY}ensemble_size = 2");
    let e = proxy_from(&text).unwrap_err().to_string();
    assert!(e.contains("need E >= Qw >= Qa >= 1"), "{e}");
    let flags = ProxyFlags {
        write_quorum: Some(2),
        ..proxy_flags()
    };
    let o = proxy_file(&text, &flags).unwrap().resolve().unwrap();
    assert_eq!(
        (
            o.streams.ensemble_size,
            o.streams.write_quorum,
            o.streams.ack_quorum
        ),
        (2, 2, 2)
    );
}

#[test]
fn proxy_lifecycle_settings_are_read_and_checked() {
    // Goal: segment_roll_secs (0 = off), retention_time_secs and retention_size_bytes reach
    // the stream config; 0 and absurd retention values are one clear line.
    let parse = |extra: &str| proxy_from(&format!("{PROXY}{extra}"));
    let o =
        parse("segment_roll_secs = 60\nretention_time_secs = 3600\nretention_size_bytes = 1000")
            .unwrap();
    assert_eq!(
        o.streams.segment_roll_interval,
        Some(Duration::from_secs(60))
    );
    assert_eq!(o.streams.retention_time, Some(Duration::from_secs(3600)));
    assert_eq!(o.streams.retention_size_bytes, Some(1000));
    let o = parse("segment_roll_secs = 0").unwrap();
    assert_eq!(o.streams.segment_roll_interval, None);
    let o = parse("segment_roll_overshoot_bytes = 4096\nsegment_roll_overshoot_secs = 5").unwrap();
    assert_eq!(o.streams.segment_roll_overshoot_bytes_max, 4096);
    assert_eq!(
        o.streams.segment_roll_overshoot_time_max,
        Duration::from_secs(5)
    );
    let o = parse("lifecycle_sweep_secs = 30").unwrap();
    assert_eq!(
        o.streams.lifecycle_sweep_interval,
        Some(Duration::from_secs(30))
    );
    let o = parse("lifecycle_sweep_secs = 0").unwrap();
    assert_eq!(o.streams.lifecycle_sweep_interval, None);
    let e = parse("lifecycle_sweep_secs = 86401")
        .unwrap_err()
        .to_string();
    assert!(e.contains("lifecycle_sweep_secs = 86401"), "{e}");
    let o = parse("").unwrap();
    assert_eq!(
        o.streams.segment_roll_interval,
        Some(Duration::from_secs(7200))
    );
    assert_eq!(
        o.streams.lifecycle_sweep_interval,
        Some(Duration::from_secs(300))
    );
    assert_eq!(
        (o.streams.retention_time, o.streams.retention_size_bytes),
        (None, None)
    );
    for (bad, key) in [
        ("retention_time_secs = 0", "retention_time_secs = 0"),
        ("retention_time_secs = 99999999999", "100 years"),
        ("retention_size_bytes = 0", "retention_size_bytes = 0"),
    ] {
        let e = parse(bad).unwrap_err().to_string();
        assert!(e.contains(key) && e.lines().count() == 1, "{e}");
    }
}

#[test]
fn proxy_txid_guard_setting_is_read() {
    // Goal: the txid guard is on at 2^40 unless configured; txid_jump_max sets it, 0 turns
    // it off, and the flag wins over the file. Method: parse small files, merge a flag.
    let file = |extra: &str, flags: &ProxyFlags| {
        proxy_file(&format!("{PROXY}{extra}"), flags)
            .unwrap()
            .resolve()
            .unwrap()
    };
    assert_eq!(
        file("", &proxy_flags()).streams.txid_jump_max,
        Some(1 << 40),
        "on by default"
    );
    assert_eq!(
        file("txid_jump_max = 1000", &proxy_flags())
            .streams
            .txid_jump_max,
        Some(1000)
    );
    assert_eq!(
        file("txid_jump_max = 0", &proxy_flags())
            .streams
            .txid_jump_max,
        None
    );
    let flags = ProxyFlags {
        txid_jump_max: Some(5),
        ..proxy_flags()
    };
    let o = file("txid_jump_max = 0", &flags);
    assert_eq!(o.streams.txid_jump_max, Some(5));
    assert!(proxy_file(&format!("{PROXY}txid_jump_max = -1"), &proxy_flags()).is_err());
}

#[test]
fn reorder_read_sequence_is_read_and_flags_win() {
    // Goal: [ledger] reorder_read_sequence (BookKeeper reorderReadSequenceEnabled) reaches the
    // proxy's ledger client settings: on by default, off from the file, the flag wins.
    assert!(proxy_from(PROXY).unwrap().placement.reorder_read_sequence);
    let text = format!("{PROXY}[ledger]\nreorder_read_sequence = false\n");
    let o = proxy_file(&text, &proxy_flags())
        .unwrap()
        .resolve()
        .unwrap();
    assert!(!o.placement.reorder_read_sequence);
    let flags = ProxyFlags {
        ledger: crate::flags::LedgerPlacementFlags {
            reorder_read_sequence: Some(true),
            ..Default::default()
        },
        ..proxy_flags()
    };
    let o = proxy_file(&text, &flags).unwrap().resolve().unwrap();
    assert!(o.placement.reorder_read_sequence);
}

#[test]
fn topology_labels_and_placement_are_read_and_checked() {
    // Issue 30. Goal: region and rack of a bookie and a proxy come from the top level of the
    // file or the flags (flags win); the [ledger] table sets the placement of the proxy and of
    // the bookie's autorecovery, flags win, a bad value names the key. Defaults: unlabelled,
    // random placement, durability enforced over 2 regions.
    let o = proxy_from(PROXY).unwrap();
    assert_eq!(o.labels, (None, None));
    assert_eq!(
        o.placement,
        quire_ledger::placement::PlacementSettings::default()
    );
    let text = "listen = \"127.0.0.1:4181\"\nregion = \"eu\"\nrack = \"r1\"\n[zookeeper]\nservers = \"h:1\"\n[ledger]\nplacement = \"region-aware\"\nmin_regions_for_durability = 3\n";
    let o = proxy_file(text, &proxy_flags()).unwrap().resolve().unwrap();
    assert_eq!(o.labels, (Some("eu".into()), Some("r1".into())));
    assert_eq!(
        o.placement.placement,
        quire_ledger::placement::Policy::RegionAware
    );
    assert_eq!(o.placement.min_regions_for_durability, 3);
    let flags = ProxyFlags {
        region: Some("us".into()),
        ledger: crate::flags::LedgerPlacementFlags {
            placement: Some(quire_ledger::placement::Policy::RackAware),
            enforce_min_racks: Some(true),
            ..Default::default()
        },
        ..proxy_flags()
    };
    let o = proxy_file(text, &flags).unwrap().resolve().unwrap();
    assert_eq!(o.labels.0.as_deref(), Some("us"));
    assert_eq!(
        o.placement.placement,
        quire_ledger::placement::Policy::RackAware
    );
    assert!(o.placement.enforce_min_racks);
    let e = proxy_from(&format!(
        "{PROXY}[ledger]\nmin_regions_for_durability = 0\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("ledger") && e.contains("min_regions_for_durability"),
        "{e}"
    );
    let e = proxy_file(
        &format!("{PROXY}[ledger]\nplacement = \"zone\"\n"),
        &proxy_flags(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("region-aware"), "{e}");
    let flags = BookieFlags {
        region: Some("eu".into()),
        ledger: crate::flags::LedgerPlacementFlags {
            placement: Some(quire_ledger::placement::Policy::RegionAware),
            ..Default::default()
        },
        ..bookie_flags()
    };
    let o = bookie_file(BOOKIE, &flags).unwrap().resolve().unwrap();
    assert_eq!(o.region.as_deref(), Some("eu"));
    assert_eq!(
        o.autorecovery.unwrap().placement.placement,
        quire_ledger::placement::Policy::RegionAware
    );
}

#[test]
fn proxy_memory_bounds_are_read_and_checked() {
    // Goal: the proxy port's memory bounds have their defaults unless configured, are read
    // from the file, and values below the frame limit or out of range are refused.
    let resolve = |extra: &str| proxy_from(&format!("{PROXY}[server]\n{extra}"));
    let d = resolve("").unwrap().server;
    assert_eq!(d.request_pool_bytes, 256 << 20);
    assert_eq!(d.connection_response_bytes_max, 16 << 20);
    assert_eq!(d.response_bytes_max, 256 << 20);
    assert_eq!(d.frame_timeout, Duration::from_secs(60));
    assert_eq!(d.send_timeout, Duration::from_secs(60));
    let o = resolve(
        "request_pool_bytes = 67108864\nframe_timeout_ms = 2000\n\
         connection_response_bytes_max = 8388608\nresponse_bytes_max = 33554432\n\
         send_timeout_ms = 5000\n",
    )
    .unwrap()
    .server;
    assert_eq!(o.request_pool_bytes, 64 << 20);
    assert_eq!(o.frame_timeout, Duration::from_secs(2));
    assert_eq!(o.connection_response_bytes_max, 8 << 20);
    assert_eq!(o.response_bytes_max, 32 << 20);
    assert_eq!(o.send_timeout, Duration::from_secs(5));
    for bad in [
        "request_pool_bytes = 1024",
        "connection_response_bytes_max = 1024",
        "response_bytes_max = 1024",
        "frame_timeout_ms = 10",
        "send_timeout_ms = 0",
    ] {
        let e = resolve(bad).unwrap_err().to_string();
        let key = bad.split(' ').next().unwrap();
        assert!(e.contains(&format!("server.{key}")), "{bad}: {e}");
    }
}

#[test]
fn example_files_parse() {
    // Goal: the shipped example files are valid.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let b: BookieFile = load(
        Some(&dir.join("bookie.toml")),
        &keys_of(BOOKIE_KEYS),
        &bookie_flags(),
    )
    .unwrap();
    b.resolve().unwrap();
    let p: ProxyFile = load(
        Some(&dir.join("proxy.toml")),
        &keys_of(PROXY_KEYS),
        &proxy_flags(),
    )
    .unwrap();
    p.resolve().unwrap();
    // Each names the cluster secret file; the test's own stands in for it (flags win).
    let b: BookieFile = load(
        Some(&dir.join("bookie.toml")),
        &keys_of(BOOKIE_KEYS),
        &BookieFlags::default(),
    )
    .unwrap();
    assert!(b.cluster_secret_file.is_some());
    let p: ProxyFile = load(
        Some(&dir.join("proxy.toml")),
        &keys_of(PROXY_KEYS),
        &ProxyFlags::default(),
    )
    .unwrap();
    assert!(p.cluster_secret_file.is_some());
}

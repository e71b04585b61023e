//! A cluster secret for tests that start `quire bookie`, `quire proxy` or `quire autorecovery`
//! processes: every real process path needs one (docs/protocol.md §2), so a test cluster writes
//! one the way an operator would (64 hexadecimal digits, mode 0600 in a 0700 directory) and
//! passes its path with `--cluster-secret-file`.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub use quire_wire::auth::ClusterSecret;

/// Writes `secret` to `dir/secrets/cluster-secret` and returns the file's path.
///
/// # Panics
/// If the file cannot be written (a test setup failure).
pub fn write_cluster_secret(dir: &Path, secret: &ClusterSecret) -> PathBuf {
    let secrets = dir.join("secrets");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&secrets)
        .expect("create the secrets directory");
    let path = secrets.join("cluster-secret");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .expect("create the cluster secret file");
    f.write_all(secret.to_hex().as_bytes())
        .expect("write the cluster secret");
    path
}

/// The flag that hands `path` to a `quire` process: `["--cluster-secret-file", path]`.
pub fn cluster_secret_flags(path: &Path) -> [String; 2] {
    ["--cluster-secret-file".into(), path.display().to_string()]
}

//! Secret files on disk (ledger secrets in the sandbox's metadata, TLS private keys, token
//! files, ZooKeeper digests, cluster secrets): written mode 0600 in directories of mode 0700,
//! and a warning at start when one that a process reads can be read by other users.
//!
//! Files are created with their final mode (never created readable and narrowed afterwards)
//! and replaced atomically: a temporary file in the same directory, `fdatasync`, `rename`.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use quire_wire::auth::ClusterSecret;

/// Mode of a secret file: read and write by its owner only.
pub const SECRET_FILE_MODE: u32 = 0o600;
/// Mode of a directory holding secret files: its owner only.
pub const SECRET_DIR_MODE: u32 = 0o700;

/// Creates `dir` (and missing parents) with mode 0700, and narrows an existing `dir` to 0700.
/// Parents that exist already are left as they are.
///
/// # Errors
/// The directory cannot be created or its mode changed.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(SECRET_DIR_MODE)
        .create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(SECRET_DIR_MODE))?;
    }
    Ok(())
}

/// Writes `bytes` to `path` durably, mode 0600, in its directory made private first
/// ([`create_private_dir`]). With `overwrite` false an existing file is an `AlreadyExists`
/// error and is left alone.
///
/// # Errors
/// The directory or the file cannot be written.
pub fn write_private(path: &Path, bytes: &[u8], overwrite: bool) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        create_private_dir(dir)?;
    }
    if !overwrite && path.exists() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists already", path.display()),
        ));
    }
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(SECRET_FILE_MODE)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_data()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir.unwrap_or(Path::new(".")))?.sync_all()
}

/// Whether `path` can be read or written by users other than its owner (group or other
/// bits), with its mode; `None` if it cannot be inspected.
pub fn exposed_mode(path: &Path) -> Option<u32> {
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then_some(mode)
}

/// Logs a warning when the secret file `path` (named by its setting `what`) can be read by
/// users other than its owner; returns whether it warned. The file is not changed: it is the
/// operator's, and other processes may need its mode.
pub fn warn_if_exposed(path: &Path, what: &str) -> bool {
    match exposed_mode(path) {
        Some(mode) => {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{mode:o}"),
                "{what} {} is readable by other users (mode {mode:o}); it holds a secret: chmod 600 it",
                path.display()
            );
            true
        }
        None => false,
    }
}

/// Reads the cluster secret (64 hexadecimal digits, `docs/protocol.md` §2) from `path`,
/// named in errors and warnings by its setting `what` (e.g. `cluster_secret_file`); warns
/// when other users can read it ([`warn_if_exposed`]).
///
/// # Errors
/// One line naming the setting and the file: it cannot be read, or does not hold a secret.
pub fn read_cluster_secret(path: &Path, what: &str) -> anyhow::Result<ClusterSecret> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("invalid setting {what}: cannot read {}", path.display()))?;
    warn_if_exposed(path, what);
    ClusterSecret::from_hex(&text)
        .with_context(|| format!("invalid setting {what}: {}", path.display()))
}

/// The cluster secret at `path`, made there first (32 random bytes as hex, mode 0600 in a
/// 0700 directory) when the file does not exist; returns it and whether it was made.
///
/// # Errors
/// The file cannot be written, or an existing one cannot be read or parsed.
pub fn create_cluster_secret(path: &Path, what: &str) -> anyhow::Result<(ClusterSecret, bool)> {
    use anyhow::Context;
    if path.exists() {
        return Ok((read_cluster_secret(path, what)?, false));
    }
    let secret = ClusterSecret::generate()?;
    match write_private(path, secret.to_hex().as_bytes(), false) {
        Ok(()) => Ok((secret, true)),
        // Made by a concurrent start: use that one.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Ok((read_cluster_secret(path, what)?, false))
        }
        Err(e) => Err(e).with_context(|| format!("cannot write {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    //! Goal: secret files are created 0600 in 0700 directories from the start, loose modes
    //! are reported. Method: real files in a temporary directory, with a umask that would
    //! otherwise make them world-readable.

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn secret_files_are_private_and_loose_ones_are_reported() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/secrets");
        let file = dir.join("key");
        write_private(&file, b"s3cret", false).unwrap();
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(std::fs::read(&file).unwrap(), b"s3cret");
        let again = write_private(&file, b"other", false).unwrap_err();
        assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists);
        write_private(&file, b"other", true).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"other");
        assert_eq!(mode(&file), 0o600);
        assert!(!warn_if_exposed(&file, "test_file"));

        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(exposed_mode(&file), Some(0o644));
        assert!(warn_if_exposed(&file, "test_file"));

        // An existing directory open to others is narrowed.
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&open).unwrap();
        assert_eq!(mode(&open), 0o700);
    }

    #[test]
    fn cluster_secret_is_made_once_private_and_read_back() {
        // Goal: the sandbox's secret is made 0600 on first start and kept after; a file that
        // holds no secret is an error naming the setting.
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("private/cluster-secret");
        let (s, made) = create_cluster_secret(&path, "cluster_secret_file").unwrap();
        assert!(made);
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        let (again, made) = create_cluster_secret(&path, "cluster_secret_file").unwrap();
        assert!(!made);
        assert_eq!(again, s);
        assert_eq!(read_cluster_secret(&path, "x").unwrap(), s);
        std::fs::write(&path, "not hex").unwrap();
        let e = format!(
            "{:#}",
            read_cluster_secret(&path, "cluster_secret_file").unwrap_err()
        );
        assert!(e.contains("cluster_secret_file"), "{e}");
    }
}

//! The bookie's cookie (BookKeeper's `Cookie`): the identity of a bookie's directories, kept
//! in the metadata store and as `COOKIE` in the journal and ledger directories. A starting
//! bookie checks it ([`check_cookie`]); `quire bookie delete-cookie` deletes a stopped bookie's
//! cookie from ZooKeeper ([`delete`]) so that it can start again on wiped or new disks.

use std::path::Path;

use anyhow::{bail, Context, Result};
use quire_metadata::{BookieId, Cookie, MetadataStore, COOKIE_FORMAT_VERSION};

pub use crate::autorecovery::DeleteCookieArgs;

/// Name of the cookie file kept in the journal directory and in the ledger directory.
pub const COOKIE_FILE: &str = "COOKIE";

/// Runs `quire bookie delete-cookie` (its logic is autorecovery's, which also deletes the cookie
/// at the end of a decommission).
pub fn delete(args: DeleteCookieArgs) -> Result<()> {
    crate::autorecovery::delete_cookie(args)
}

/// What [`check_cookie`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CookieOutcome {
    /// First start: the cookie was written to both directories and the metadata store.
    Created,
    /// Both directories and the store hold the same cookie.
    Matched,
}

/// What a directory holds.
#[derive(Debug)]
enum DirState {
    /// Missing or empty (a `lost+found` is ignored).
    Empty,
    /// Has a cookie; `only_cookie` if nothing else is there.
    Cookie { cookie: Cookie, only_cookie: bool },
    /// Holds files but no cookie.
    DataWithoutCookie,
}

fn dir_state(dir: &Path) -> Result<DirState> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DirState::Empty),
        Err(e) => {
            return Err(e).with_context(|| format!("cannot list directory {}", dir.display()))
        }
    };
    let mut others = 0usize;
    let mut has_cookie = false;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list directory {}", dir.display()))?;
        let name = entry.file_name();
        if name == COOKIE_FILE {
            has_cookie = true;
        } else if name != "lost+found" && name != "COOKIE.tmp" {
            others += 1;
        }
    }
    if !has_cookie {
        return Ok(if others == 0 {
            DirState::Empty
        } else {
            DirState::DataWithoutCookie
        });
    }
    let path = dir.join(COOKIE_FILE);
    let bytes = std::fs::read(&path)
        .with_context(|| format!("cannot read cookie file {}", path.display()))?;
    let cookie: Cookie = serde_json::from_slice(&bytes).map_err(|e| {
        anyhow::anyhow!(
            "cookie file {} is corrupt: {e}; refusing to start",
            path.display()
        )
    })?;
    Ok(DirState::Cookie {
        cookie,
        only_cookie: others == 0,
    })
}

/// Writes `DIR/COOKIE` atomically: a temporary file, synced, renamed over, directory synced.
fn write_cookie_file(dir: &Path, cookie: &Cookie) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create directory {}", dir.display()))?;
    let tmp = dir.join("COOKIE.tmp");
    let path = dir.join(COOKIE_FILE);
    let bytes = serde_json::to_vec_pretty(cookie)?;
    let write = || -> std::io::Result<()> {
        std::fs::write(&tmp, &bytes)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().with_context(|| format!("cannot write cookie file {}", path.display()))
}

fn path_string(dir: &Path) -> Result<String> {
    dir.to_str()
        .map(str::to_string)
        .with_context(|| format!("directory {} is not valid UTF-8", dir.display()))
}

/// Why `found` (a directory's cookie) is not `expected`, in words.
fn mismatch(found: &Cookie, expected: &Cookie) -> String {
    if found.instance_id != expected.instance_id {
        format!(
            "it holds the cookie of cluster {} (bookie {}), but this cluster's instance id is {}",
            found.instance_id, found.bookie, expected.instance_id
        )
    } else if found.bookie != expected.bookie {
        format!(
            "it holds the cookie of bookie {}, not of {}",
            found.bookie, expected.bookie
        )
    } else if found.journal_dir != expected.journal_dir {
        format!(
            "its cookie names journal directory {}, but {} is configured",
            found.journal_dir, expected.journal_dir
        )
    } else if found.ledger_dirs != expected.ledger_dirs {
        format!(
            "its cookie names ledger directories {:?}, but {:?} are configured",
            found.ledger_dirs, expected.ledger_dirs
        )
    } else {
        format!(
            "its cookie (format {}) differs from the metadata store's",
            found.format_version
        )
    }
}

/// Checks (and on first start writes) the bookie's cookie, following BookKeeper's `Cookie`
/// rules: the cookie (instance id, bookie id, journal directory, ledger directories) is kept in
/// the metadata store and as `COOKIE` in the journal directory and in the ledger directory.
///
/// * First start (no cookie anywhere, both directories empty): the cookie is written to both
///   directories, then created in the store. A start interrupted between the two (both
///   directories hold only this very cookie) completes the same way.
/// * Later starts: the store's cookie and both directories' cookies must exist and be equal to
///   the cookie of this configuration.
///
/// # Errors
/// One line naming the directory and the reason, when: a directory was emptied (wiped) or
/// replaced while the store has a cookie; a directory holds another bookie's or another
/// cluster's cookie; the configured directories differ from the ones the cookie names; a
/// directory holds data but no cookie; a cookie file is corrupt; or the store fails.
pub async fn check_cookie(
    store: &dyn MetadataStore,
    bookie: &BookieId,
    journal_dir: &Path,
    ledger_dir: &Path,
) -> Result<CookieOutcome> {
    let instance_id = store
        .instance_id()
        .await
        .context("cannot read the cluster's instance id")?;
    let expected = Cookie {
        format_version: COOKIE_FORMAT_VERSION,
        bookie: bookie.clone(),
        instance_id,
        journal_dir: path_string(journal_dir)?,
        ledger_dirs: vec![path_string(ledger_dir)?],
    };
    let stored = match store.read_cookie(bookie).await {
        Ok(v) => Some(v.value),
        Err(quire_metadata::Error::NotFound { .. }) => None,
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read the cookie of bookie {bookie}"))
        }
    };
    let dirs = [
        ("journal", journal_dir, dir_state(journal_dir)?),
        ("ledger", ledger_dir, dir_state(ledger_dir)?),
    ];
    match stored {
        Some(stored) => {
            // A directory holding someone else's cookie is named first: it is the likelier
            // mistake (a swapped directory) and the more useful message.
            for (kind, dir, state) in &dirs {
                if let DirState::Cookie { cookie, .. } = state {
                    if *cookie != expected {
                        bail!("{kind} directory {} does not belong to bookie {bookie}: {}; refusing to start", dir.display(), mismatch(cookie, &expected));
                    }
                }
            }
            if stored != expected {
                bail!(
                    "bookie {bookie} cannot start with this configuration: {}; refusing to start",
                    mismatch(&stored, &expected)
                );
            }
            for (kind, dir, state) in &dirs {
                match state {
                    DirState::Empty => bail!(
                        "{kind} directory {} has no cookie, but the metadata store has one for bookie {bookie}: the directory was emptied or replaced since the bookie last ran; refusing to start",
                        dir.display()
                    ),
                    DirState::DataWithoutCookie => bail!(
                        "{kind} directory {} holds data but no cookie, while the metadata store has one for bookie {bookie}: the directory was replaced; refusing to start",
                        dir.display()
                    ),
                    DirState::Cookie { cookie, .. } if *cookie != expected => {
                        bail!("{kind} directory {} does not belong to bookie {bookie}: {}; refusing to start", dir.display(), mismatch(cookie, &expected))
                    }
                    DirState::Cookie { .. } => {}
                }
            }
            Ok(CookieOutcome::Matched)
        }
        None => {
            let fresh = dirs.iter().all(|(_, _, state)| match state {
                DirState::Empty => true,
                DirState::Cookie {
                    cookie,
                    only_cookie,
                } => *only_cookie && *cookie == expected,
                DirState::DataWithoutCookie => false,
            });
            if !fresh {
                for (kind, dir, state) in &dirs {
                    match state {
                        DirState::Empty => {}
                        DirState::DataWithoutCookie => bail!(
                            "{kind} directory {} is not empty and has no cookie, and the metadata store has no cookie for bookie {bookie}: use empty directories for a new bookie; refusing to start",
                            dir.display()
                        ),
                        DirState::Cookie { cookie, .. } => bail!(
                            "{kind} directory {} holds a cookie (bookie {}, cluster {}), but the metadata store has no cookie for bookie {bookie}: the directory belongs to another bookie or cluster; refusing to start",
                            dir.display(),
                            cookie.bookie,
                            cookie.instance_id
                        ),
                    }
                }
            }
            for (_, dir, _) in &dirs {
                write_cookie_file(dir, &expected)?;
            }
            store
                .write_cookie(&expected, None)
                .await
                .with_context(|| format!("cannot store the cookie of bookie {bookie}"))?;
            Ok(CookieOutcome::Created)
        }
    }
}

#[cfg(test)]
mod tests {
    //! Goal: every cookie rule, decided in-process against the embedded store and real
    //! directories. Method: run `check_cookie` over prepared directory states.

    use std::path::PathBuf;

    use super::*;
    use quire_metadata::EmbeddedStore;

    struct Fixture {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        store: EmbeddedStore,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let store = EmbeddedStore::open(&root.join("meta")).unwrap();
        Fixture {
            _tmp: tmp,
            root,
            store,
        }
    }

    fn id(s: &str) -> BookieId {
        BookieId(s.to_string())
    }

    #[tokio::test]
    async fn first_start_writes_then_later_starts_match() {
        let f = fixture();
        let (j, l) = (f.root.join("j"), f.root.join("l"));
        assert_eq!(
            check_cookie(&f.store, &id("b:1"), &j, &l).await.unwrap(),
            CookieOutcome::Created
        );
        assert!(j.join(COOKIE_FILE).is_file() && l.join(COOKIE_FILE).is_file());
        std::fs::create_dir_all(j.join("shard-0")).unwrap();
        assert_eq!(
            check_cookie(&f.store, &id("b:1"), &j, &l).await.unwrap(),
            CookieOutcome::Matched
        );
        let stored = f.store.read_cookie(&id("b:1")).await.unwrap().value;
        assert_eq!(stored.journal_dir, j.to_str().unwrap());
        assert_eq!(stored.instance_id, f.store.instance_id().await.unwrap());
    }

    #[tokio::test]
    async fn wiped_journal_or_ledger_dir_is_refused() {
        let f = fixture();
        let (j, l) = (f.root.join("j"), f.root.join("l"));
        check_cookie(&f.store, &id("b:1"), &j, &l).await.unwrap();
        std::fs::remove_dir_all(&j).unwrap();
        let e = check_cookie(&f.store, &id("b:1"), &j, &l)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("journal directory {} has no cookie", j.display())),
            "{e}"
        );
        assert!(e.contains("emptied or replaced"), "{e}");

        let f = fixture();
        let (j, l) = (f.root.join("j"), f.root.join("l"));
        check_cookie(&f.store, &id("b:1"), &j, &l).await.unwrap();
        std::fs::remove_file(l.join(COOKIE_FILE)).unwrap();
        std::fs::write(l.join("data"), b"x").unwrap();
        let e = check_cookie(&f.store, &id("b:1"), &j, &l)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "ledger directory {} holds data but no cookie",
                l.display()
            )),
            "{e}"
        );
    }

    #[tokio::test]
    async fn swapped_dirs_and_other_clusters_are_refused() {
        let f = fixture();
        let (j1, l1, j2, l2) = (
            f.root.join("j1"),
            f.root.join("l1"),
            f.root.join("j2"),
            f.root.join("l2"),
        );
        check_cookie(&f.store, &id("b:1"), &j1, &l1).await.unwrap();
        check_cookie(&f.store, &id("b:2"), &j2, &l2).await.unwrap();
        // Bookie 1's journal cookie replaced by bookie 2's (a swapped disk).
        std::fs::copy(j2.join(COOKIE_FILE), j1.join(COOKIE_FILE)).unwrap();
        let e = check_cookie(&f.store, &id("b:1"), &j1, &l1)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "journal directory {} does not belong to bookie b:1",
                j1.display()
            )),
            "{e}"
        );
        assert!(e.contains("cookie of bookie b:2"), "{e}");

        // Configured with another bookie's directory: the store's cookie names another path.
        let e = check_cookie(&f.store, &id("b:2"), &j2, &l1)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("ledger directories"), "{e}");

        // A directory from another cluster, offered to a new bookie.
        let other = fixture();
        let (j3, l3) = (f.root.join("j3"), f.root.join("l3"));
        check_cookie(&other.store, &id("b:3"), &j3, &l3)
            .await
            .unwrap();
        let e = check_cookie(&f.store, &id("b:3"), &j3, &l3)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "journal directory {} holds a cookie",
                j3.display()
            )),
            "{e}"
        );
        assert!(e.contains("no cookie for bookie b:3"), "{e}");
    }

    #[tokio::test]
    async fn new_bookie_needs_empty_dirs_and_an_interrupted_first_start_completes() {
        let f = fixture();
        let (j, l) = (f.root.join("j"), f.root.join("l"));
        std::fs::create_dir_all(&j).unwrap();
        std::fs::write(j.join("journal-0000000000000001.qj"), b"old").unwrap();
        let e = check_cookie(&f.store, &id("b:1"), &j, &l)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not empty and has no cookie"), "{e}");

        // Files written, store not yet: the next start completes the first start.
        let f = fixture();
        let (j, l) = (f.root.join("j"), f.root.join("l"));
        let instance_id = f.store.instance_id().await.unwrap();
        let cookie = Cookie {
            format_version: COOKIE_FORMAT_VERSION,
            bookie: id("b:1"),
            instance_id,
            journal_dir: j.to_str().unwrap().into(),
            ledger_dirs: vec![l.to_str().unwrap().into()],
        };
        write_cookie_file(&j, &cookie).unwrap();
        write_cookie_file(&l, &cookie).unwrap();
        assert_eq!(
            check_cookie(&f.store, &id("b:1"), &j, &l).await.unwrap(),
            CookieOutcome::Created
        );
        assert_eq!(f.store.read_cookie(&id("b:1")).await.unwrap().value, cookie);
    }

    #[tokio::test]
    async fn corrupt_cookie_file_is_refused() {
        let f = fixture();
        let (j, l) = (f.root.join("j"), f.root.join("l"));
        check_cookie(&f.store, &id("b:1"), &j, &l).await.unwrap();
        std::fs::write(l.join(COOKIE_FILE), b"{not json").unwrap();
        let e = check_cookie(&f.store, &id("b:1"), &j, &l)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "cookie file {} is corrupt",
                l.join(COOKIE_FILE).display()
            )),
            "{e}"
        );
    }
}

//! Sets `QUIRE_GIT_COMMIT` (the `git_commit` label of `quire_build_info`) to the commit being
//! built, when the build runs in a git checkout and the variable is not set already (a
//! packager may set it). Without git it stays unset and the label reads `unknown`.
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-env-changed=QUIRE_GIT_COMMIT");
    if std::env::var_os("QUIRE_GIT_COMMIT").is_some() {
        return;
    }
    let Some(commit) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return;
    };
    println!("cargo:rustc-env=QUIRE_GIT_COMMIT={commit}");
    // Built again when HEAD moves (a commit, a checkout).
    for path in ["HEAD", "logs/HEAD"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            if std::path::Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        }
    }
}

//! A small ext4 filesystem for full-disk tests: an image file under `/tmp`, formatted with
//! `mkfs.ext4 -m 0` (no blocks reserved for root, since the tests run as root) and mounted with
//! `mount -o loop`. Needs root and the Debian packages `e2fsprogs` and `mount` (CI runs as
//! root). Unmounted, and its loop device detached, on drop, also when the test failed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A loop-mounted ext4 image; see the module documentation.
#[derive(Debug)]
pub struct LoopMount {
    dir: tempfile::TempDir,
    image: PathBuf,
    mount_point: PathBuf,
    mounted: bool,
}

/// Runs a system tool; `Err` says what failed and why.
fn sh(cmd: &str, args: &[&str]) -> Result<String, String> {
    // mkfs.ext4, losetup and mount live in /usr/sbin and /sbin, which a root PATH may lack.
    let path = format!(
        "{}:/usr/sbin:/sbin:/usr/bin:/bin",
        std::env::var("PATH").unwrap_or_default()
    );
    match Command::new(cmd).args(args).env("PATH", path).output() {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => Err(format!(
            "`{cmd} {}` exited with {}: {}",
            args.join(" "),
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("cannot run `{cmd}`: {e}")),
    }
}

impl LoopMount {
    /// Creates an image of `size_bytes`, formats it and mounts it at `mount_point` (an empty
    /// or missing directory, created if missing).
    ///
    /// # Panics
    /// This is a test helper: it panics, saying what is missing, when the image cannot be
    /// made or mounted.
    pub fn new_at(size_bytes: u64, mount_point: &Path) -> LoopMount {
        let dir = tempfile::Builder::new()
            .prefix("quire-loop-")
            .tempdir_in("/tmp")
            .expect("tempdir for the image");
        let image = dir.path().join("fs.img");
        std::fs::create_dir_all(mount_point).expect("create mount point");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(size_bytes))
            .expect("create image file");
        let mut m = LoopMount {
            dir,
            image,
            mount_point: mount_point.to_path_buf(),
            mounted: false,
        };
        let image = m.image.to_str().expect("utf-8 path").to_owned();
        let mnt = m.mount_point.to_str().expect("utf-8 path").to_owned();
        if let Err(e) = sh("mkfs.ext4", &["-q", "-F", "-m", "0", &image]) {
            panic!("full-disk test needs mkfs.ext4 (Debian package e2fsprogs): {e}");
        }
        if let Err(e) = sh("mount", &["-o", "loop", &image, &mnt]) {
            panic!(
                "full-disk test needs to loop-mount an ext4 image (as root, with /dev/loop* \
                 available; Debian package mount): {e}"
            );
        }
        m.mounted = true;
        m
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mount_point
    }
}

/// Writes a file at `path` until its filesystem has no block left, syncing as it goes, so that
/// the filesystem is 100 % used (for root too on a `LoopMount`, which reserves none).
///
/// # Panics
/// If the file cannot be created.
pub fn fill_file(path: &Path) {
    let mut f = std::fs::File::create(path).expect("create filler file");
    for chunk in [1 << 20, 4096] {
        let block = vec![0xf3u8; chunk];
        while f.write_all(&block).and_then(|()| f.sync_data()).is_ok() {}
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        let mnt = self.mount_point.to_str().unwrap_or_default().to_owned();
        if self.mounted {
            // A process that used the filesystem may need a moment to close its files.
            let mut last = Ok(String::new());
            for _ in 0..20 {
                last = sh("umount", &[&mnt]);
                if last.is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if let Err(e) = last {
                eprintln!("loop mount: {e}; unmounting lazily");
                if let Err(e) = sh("umount", &["-l", &mnt]) {
                    eprintln!("loop mount: {e}");
                }
            }
        }
        // `mount -o loop` sets autoclear; detach whatever still holds the image anyway.
        let image = self.image.to_str().unwrap_or_default().to_owned();
        if let Ok(out) = sh("losetup", &["-j", &image]) {
            for line in out.lines() {
                if let Some(dev) = line.split(':').next() {
                    if let Err(e) = sh("losetup", &["-d", dev]) {
                        eprintln!("loop mount: {e}");
                    }
                }
            }
        }
        let _ = &self.dir; // removed by its own drop, after the unmount above
    }
}

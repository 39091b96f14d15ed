//! Who may revoke: a process that may only read the database file (here through a read-only
//! bind mount of its directory, since tests run as root and root writes a file whatever its
//! mode) gets a permission error that says the database is read-only, and the holder keeps its
//! lease; a process that may write revokes it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use leasehold_core::Authority;

mod common;

use leasehold_conformance::kit;

use common::{connect, key, url};

/// `dir` mounted read-only at `at` until dropped.
struct ReadOnlyMount(PathBuf);

impl ReadOnlyMount {
    fn new(dir: &Path, at: &Path) -> Result<Self, String> {
        let run = |args: &[&str]| -> Result<(), String> {
            let out = Command::new("mount")
                .args(args)
                .output()
                .map_err(|e| format!("run mount {args:?}: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "mount {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ))
            }
        };
        let (dir, at_s) = (dir.display().to_string(), at.display().to_string());
        run(&["--bind", &dir, &at_s])?;
        let mounted = ReadOnlyMount(at.to_path_buf());
        run(&["-o", "remount,bind,ro", &at_s])?;
        Ok(mounted)
    }
}

impl Drop for ReadOnlyMount {
    /// The connections' threads close the file a moment after the pool says it is closed: until
    /// then the mount is busy. A lazy unmount at last, so none is left behind.
    fn drop(&mut self) {
        for _ in 0..100 {
            let unmounted = Command::new("umount")
                .arg(&self.0)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if unmounted {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_may_only_read_cannot_revoke_and_the_holder_keeps_its_lease(
) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (rw, ro) = (dir.path().join("rw"), dir.path().join("ro"));
    for d in [&rw, &ro] {
        std::fs::create_dir(d).map_err(|e| format!("create {}: {e}", d.display()))?;
    }
    let holder = connect(&url(&rw.join("leases.db"))).await?;
    let k = key("revoke-denied")?;
    let ttl = Duration::from_secs(10);
    let grant = holder
        .try_acquire(&k, ttl)
        .await
        .map_err(|e| format!("the holder acquires: {e}"))?
        .ok_or("the key must be free")?;

    let mount = ReadOnlyMount::new(&rw, &ro)?;
    let reader = connect(&url(&ro.join("leases.db"))).await?;
    let seen = reader
        .inspect(&k)
        .await
        .map_err(|e| format!("inspect through the read-only mount: {e}"))?;
    assert!(
        seen.held && seen.fence == Some(grant.fence()),
        "the reader sees {seen:?}"
    );
    kit::revoke_is_refused_and_the_holder_keeps_its_lease(
        &holder,
        &grant,
        ttl,
        &reader,
        "read-only",
        &[],
    )
    .await
    .map_err(|e| e.to_string())?;
    reader.close().await;
    drop(reader);
    drop(mount);

    let writer = connect(&url(&rw.join("leases.db"))).await?;
    kit::revoke_ends_the_holder(&holder, &grant, ttl, &writer)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

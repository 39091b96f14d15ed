//! Which filesystems a database may live on, against real mounts: the local ones this machine
//! and CI use are accepted, and a filesystem leasehold does not know as local (a FUSE mount,
//! here Debian's `bindfs`) is refused with an error that names its type and the override.
//!
//! The mounts are made by this test (it runs as root, as CI does) under a temporary directory
//! and taken down when the guard is dropped, also when the test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leasehold_core::time::saturating_add;
use leasehold_core::{Authority, Error, Instant, LockKey};
use leasehold_sqlite::SqliteAuthority;

/// A mount made for a test; unmounted (lazily, so a test that still has the file open cannot
/// keep it) when dropped, and its FUSE daemon, if any, stopped.
struct Mounted {
    point: PathBuf,
    daemon: Option<Child>,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.point).status();
        if let Some(daemon) = self.daemon.as_mut() {
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
    }
}

/// The type the mounts table gives the mount at exactly `point`, if any.
fn mounted_type(point: &Path) -> Result<Option<String>, String> {
    let table = std::fs::read_to_string("/proc/self/mounts")
        .map_err(|e| format!("/proc/self/mounts: {e}"))?;
    Ok(table.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (_, at, kind) = (fields.next()?, fields.next()?, fields.next()?);
        (Path::new(at) == point).then(|| kind.to_string())
    }))
}

fn mount(args: &[&str], point: &Path) -> Result<Mounted, String> {
    std::fs::create_dir_all(point).map_err(|e| format!("mkdir {}: {e}", point.display()))?;
    let status = Command::new("mount")
        .args(args)
        .arg(point)
        .status()
        .map_err(|e| format!("mount {args:?}: {e}"))?;
    if !status.success() {
        return Err(format!(
            "mount {args:?} {} failed ({status}): these tests run as root",
            point.display()
        ));
    }
    Ok(Mounted {
        point: point.to_path_buf(),
        daemon: None,
    })
}

/// `bindfs` (Debian's package, which scripts/test installs) shows `source` at `point` through
/// FUSE: a real filesystem that is not known as local.
fn bindfs(source: &Path, point: &Path) -> Result<Mounted, String> {
    std::fs::create_dir_all(point).map_err(|e| format!("mkdir {}: {e}", point.display()))?;
    let daemon = Command::new("bindfs")
        .arg("-f")
        .arg(source)
        .arg(point)
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| {
            format!("bindfs: {e}; install Debian's bindfs (scripts/test does) to run this test")
        })?;
    let mounted = Mounted {
        point: point.to_path_buf(),
        daemon: Some(daemon),
    };
    let until = saturating_add(Instant::now(), Duration::from_secs(10));
    while mounted_type(point)?.is_none() {
        if Instant::now() > until {
            return Err(format!("bindfs did not mount {} in 10 s", point.display()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(mounted)
}

fn url(dir: &Path, extra: &str) -> String {
    format!(
        "sqlite://{}?timeout_ms=1000{extra}",
        dir.join("locks.db").display()
    )
}

/// A lease taken and released on a database in `dir`.
async fn works_in(dir: &Path) -> Result<(), String> {
    let a = SqliteAuthority::connect(&url(dir, ""))
        .await
        .map_err(|e| format!("connect in {}: {e}", dir.display()))?;
    let key = LockKey::new("fs/works").map_err(|e| e.to_string())?;
    let g = a
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .map_err(|e| format!("try_acquire in {}: {e}", dir.display()))?
        .ok_or_else(|| format!("a fresh key in {} was held", dir.display()))?;
    let _ = a
        .release(&g)
        .await
        .map_err(|e| format!("release in {}: {e}", dir.display()))?;
    a.close().await;
    Ok(())
}

/// The filesystems these machines and CI keep state on: the temporary directory and the home
/// directory (ext4 here), `/dev/shm` and a fresh tmpfs, and an overlay like a container's root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_filesystems_are_accepted() -> Result<(), String> {
    let base = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let home_dir = match &home {
        Some(h) => Some(tempfile::tempdir_in(h).map_err(|e| format!("tempdir in home: {e}"))?),
        None => None,
    };
    let shm = tempfile::tempdir_in("/dev/shm").map_err(|e| format!("tempdir in /dev/shm: {e}"))?;
    let tmpfs_point = base.path().join("tmpfs");
    let _tmpfs = mount(&["-t", "tmpfs", "leasehold-test"], &tmpfs_point)?;
    let (lower, upper, work) = (
        base.path().join("lower"),
        base.path().join("upper"),
        base.path().join("work"),
    );
    for d in [&lower, &upper, &work] {
        std::fs::create_dir_all(d).map_err(|e| format!("mkdir {}: {e}", d.display()))?;
    }
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    let overlay_point = base.path().join("merged");
    let _overlay = mount(
        &["-t", "overlay", "overlay", "-o", &options],
        &overlay_point,
    )?;
    let mut dirs = vec![base.path().to_path_buf(), shm.path().to_path_buf()];
    dirs.extend(home_dir.as_ref().map(|d| d.path().to_path_buf()));
    dirs.push(tmpfs_point.clone());
    dirs.push(overlay_point.clone());
    for dir in dirs {
        works_in(&dir).await?;
    }
    for (point, kind) in [(&tmpfs_point, "tmpfs"), (&overlay_point, "overlay")] {
        let seen = mounted_type(point)?;
        if seen.as_deref() != Some(kind) {
            return Err(format!("{} is {seen:?}, not {kind}", point.display()));
        }
    }
    Ok(())
}

/// A FUSE filesystem (bindfs over a local directory) is not known to be local: the database is
/// refused with `InvalidConfig` naming the filesystem's type, where it is mounted, and the
/// override; with `allow_network_fs=true` the filesystem check lets it through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_not_known_as_local_is_refused_with_its_type() -> Result<(), String> {
    let base = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let source = base.path().join("source");
    std::fs::create_dir_all(&source).map_err(|e| format!("mkdir: {e}"))?;
    let point = base.path().join("fuse");
    let fuse = bindfs(&source, &point)?;
    let kind = mounted_type(&point)?.ok_or("bindfs is not mounted")?;
    let refused = SqliteAuthority::connect(&url(&point, "")).await;
    let err = match refused {
        Ok(_) => {
            return Err(format!(
                "a database on {kind} (FUSE, mounted at {}) was accepted",
                point.display()
            ))
        }
        Err(e) => e,
    };
    let says = err.to_string();
    if !matches!(err, Error::InvalidConfig { .. })
        || !says.contains(&format!("({kind} mounted at {}", point.display()))
        || !says.contains("allow_network_fs=true")
    {
        return Err(format!(
            "the refusal does not name {kind} and the override: {err:?}"
        ));
    }
    // Overridden: whatever SQLite then makes of the filesystem, it is not the filesystem check
    // that refuses it.
    match SqliteAuthority::connect(&url(&point, "&allow_network_fs=true")).await {
        Err(e @ Error::InvalidConfig { .. }) => {
            return Err(format!("allow_network_fs=true did not override: {e}"))
        }
        Err(e) => println!("on {kind} with allow_network_fs=true, SQLite says: {e}"),
        Ok(a) => {
            println!("on {kind} with allow_network_fs=true, the database opened");
            a.close().await;
        }
    }
    drop(fuse);
    Ok(())
}

//! SQLite, the CLI's default: one database file in the run's directory that every worker
//! process opens (`sqlite:///abs/path.db`). No server to fault: one machine, one file. Its
//! fault of its own is a worker killed inside a write transaction, caught by the lock SQLite
//! holds for it (see [`catch_writer`]).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_conformance::workload::FaultKind;
use leasehold_servers::ManagedProcess;

use super::{not_a_fault_of, DeploymentError, Form, Heal, Injected};

/// The byte of the `-shm` file that SQLite's WAL mode locks (`F_WRLCK`) for as long as a
/// connection is inside a write transaction: `WAL_WRITE_LOCK`, the first of the lock bytes at
/// offset 120 (sqlite3.c, `UNIX_SHM_BASE`). `BEGIN IMMEDIATE` takes it, `COMMIT` or
/// `ROLLBACK` gives it back.
const WAL_WRITE_LOCK_BYTE: u64 = 120;

/// The database file.
pub(super) struct SqliteFile {
    path: PathBuf,
}

impl SqliteFile {
    /// A fresh database path in `dir`; a file left by an earlier run there is removed (with
    /// its WAL and shared-memory files).
    pub(super) fn create(dir: &Path) -> Result<SqliteFile, DeploymentError> {
        use std::os::unix::fs::PermissionsExt;
        // Workers run under uids of their own, and every one of them opens the file for
        // writing: a directory and a database file everyone may write. SQLite gives the
        // `-wal` and `-shm` files it creates the database file's mode.
        let dir = dir.join("sqlite");
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
        let path = std::fs::canonicalize(&dir)?.join("authority.db");
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let file = PathBuf::from(format!("{}{suffix}", path.display()));
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Box::new(e)),
            }
        }
        std::fs::File::create(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
        Ok(SqliteFile { path })
    }
}

impl Form for SqliteFile {
    fn url(&self) -> String {
        format!("sqlite://{}?timeout_ms=1000", self.path.display())
    }

    fn faults(&self) -> Vec<FaultKind> {
        vec![FaultKind::KillWorkerInTransaction]
    }

    fn inject(&self, kind: FaultKind, _pick: usize) -> Result<Injected, DeploymentError> {
        Err(not_a_fault_of(
            kind,
            "SQLite (a worker fault: the runner injects it)",
        ))
    }

    fn heal(&self, heal: Heal) -> Result<(), DeploymentError> {
        Err(format!("{heal:?} does not heal SQLite").into())
    }

    fn write_lock_file(&self) -> Option<PathBuf> {
        Some(PathBuf::from(format!("{}-shm", self.path.display())))
    }
}

/// The pid holding SQLite's WAL write lock on the file with inode `inode`, from `/proc/locks`
/// (`N: POSIX ADVISORY WRITE PID MAJ:MIN:INODE START END`; waiters, marked `->`, are not
/// holders).
fn write_lock_holder(locks: &str, inode: u64) -> Option<u32> {
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields[..] {
            [_, "POSIX", _, "WRITE", pid, file, start, end]
                if start.parse() == Ok(WAL_WRITE_LOCK_BYTE)
                    && end.parse() == Ok(WAL_WRITE_LOCK_BYTE)
                    && file.rsplit(':').next().and_then(|i| i.parse().ok()) == Some(inode) =>
            {
                pid.parse().ok()
            }
            _ => None,
        }
    })
}

fn holder_now(shm: &Path) -> Option<u32> {
    let inode = std::fs::metadata(shm).ok()?.ino();
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    write_lock_holder(&locks, inode)
}

/// Watches `shm` (the database's `-shm` file) for up to `within` until one of `candidates`
/// holds the WAL write lock, stops it (`SIGSTOP`) and looks again: a process that still holds
/// the lock while stopped is inside a write transaction, and stays stopped for the caller to
/// kill. Returns its index among `candidates` and what was seen, or `None` if no candidate was
/// caught. A candidate that let go of the lock between the two looks is resumed.
pub fn catch_writer(
    shm: &Path,
    candidates: &[Arc<ManagedProcess>],
    within: Duration,
) -> Option<(usize, String)> {
    let give_up = Instant::now() + within;
    while Instant::now() < give_up {
        if let Some(pid) = holder_now(shm) {
            if let Some(i) = candidates.iter().position(|p| p.pid() == Some(pid)) {
                if candidates[i].pause().is_ok() {
                    if holder_now(shm) == Some(pid) {
                        return Some((
                            i,
                            format!(
                                "pid {pid} stopped holding the SQLite write lock (byte \
                                 {WAL_WRITE_LOCK_BYTE} of {}): inside a write transaction",
                                shm.display()
                            ),
                        ));
                    }
                    let _ = candidates[i].resume();
                }
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::write_lock_holder;

    #[test]
    fn finds_the_write_lock_holder_and_not_readers_or_waiters() {
        let locks = "1: POSIX  ADVISORY  READ 4242 08:02:777 128 128\n\
                     2: POSIX  ADVISORY  WRITE 4243 08:02:778 120 120\n\
                     2: -> POSIX  ADVISORY  WRITE 4244 08:02:777 120 120\n\
                     3: POSIX  ADVISORY  WRITE 4245 08:02:777 120 120\n";
        assert_eq!(write_lock_holder(locks, 777), Some(4245));
        assert_eq!(write_lock_holder(locks, 778), Some(4243));
        assert_eq!(write_lock_holder(locks, 779), None);
        let readers_only = "1: POSIX  ADVISORY  READ 4242 08:02:777 120 120\n";
        assert_eq!(write_lock_holder(readers_only, 777), None);
    }
}

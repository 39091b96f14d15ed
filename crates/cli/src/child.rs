//! The command run under the lease, in a process group of its own so it can be stopped whole,
//! and killed by the kernel if `leasehold` dies first.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::time::Duration;

use leasehold::{Fence, LockKey};
use tokio::io::AsyncWriteExt;

/// The hidden subcommand of the watcher process (see [`Watcher`]).
pub const WATCH_GROUP: &str = "__watch-group";

/// The running command.
pub struct Child {
    process: tokio::process::Child,
    group: Option<u32>,
    watcher: Option<Watcher>,
}

/// A second process that kills the command's whole process group if `leasehold` dies without
/// stopping it. The parent-death signal reaches only the command itself, not what the command
/// started in the background; this does. It reads a pipe from `leasehold`: a byte means "all
/// done, exit"; end of file without one means `leasehold` is gone (the kernel closes the pipe
/// whatever killed it), so it sends SIGKILL to the group. It has a process group of its own, so
/// a terminal's signals do not reach it.
struct Watcher {
    process: tokio::process::Child,
    pipe: Option<tokio::process::ChildStdin>,
}

impl Child {
    /// Starts `command` with the lease's key and fence in its environment.
    /// Starts the command; `fence` is `None` when it runs without a lock
    /// (`--if-unavailable run`): then it gets `LEASEHOLD_LOCK=unlocked` and no fence at all, so
    /// nothing it sends can pass for one.
    pub fn spawn(
        command: &[OsString],
        key: &LockKey,
        fence: Option<Fence>,
        backend: &str,
    ) -> io::Result<Child> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command"))?;
        let mut std_command = std::process::Command::new(program);
        set_parent_death_signal(&mut std_command);
        let mut command = tokio::process::Command::from(std_command);
        command
            .args(args)
            .env("LEASEHOLD_KEY", key.as_str())
            .env("LEASEHOLD_BACKEND", backend);
        match fence {
            Some(fence) => command
                .env("LEASEHOLD_LOCK", "held")
                .env("LEASEHOLD_FENCE", fence.value().to_string())
                .env("LEASEHOLD_FENCE_SAFETY", fence.safety().to_string()),
            // Not inherited either: a stale fence from an outer run must not leak in.
            None => command
                .env("LEASEHOLD_LOCK", "unlocked")
                .env_remove("LEASEHOLD_FENCE")
                .env_remove("LEASEHOLD_FENCE_SAFETY"),
        };
        let process = command
            // Its own process group: stopping it stops whatever it started too.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let group = process.id();
        let watcher = group.and_then(|g| match Watcher::spawn(g) {
            Ok(w) => Some(w),
            Err(e) => {
                say!(
                    "leasehold: cannot start the watcher of the command's process group \
                     (if leasehold is killed, only the command itself is): {e}"
                );
                None
            }
        });
        Ok(Child {
            process,
            group,
            watcher,
        })
    }

    /// Tells the watcher that `leasehold` is ending in order, so it leaves the group alone.
    pub async fn disarm(&mut self) {
        if let Some(mut watcher) = self.watcher.take() {
            if let Some(mut pipe) = watcher.pipe.take() {
                let _ = pipe.write_all(b"x").await;
            }
            let _ = watcher.process.wait().await;
        }
    }

    /// Waits for the command; its exit code, or 128 + the signal that ended it.
    pub async fn wait(&mut self) -> u8 {
        match self.process.wait().await {
            Ok(status) => match (status.code(), status.signal()) {
                (Some(code), _) => u8::try_from(code).unwrap_or(1),
                (None, Some(signal)) => 128u8.saturating_add(u8::try_from(signal).unwrap_or(0)),
                (None, None) => 1,
            },
            Err(e) => {
                say!("leasehold: waiting for the command failed: {e}");
                1
            }
        }
    }

    /// SIGTERM to the whole process group, SIGKILL after `grace` if the command is still there.
    pub async fn stop(&mut self, grace: Duration) {
        self.signal_group("-TERM");
        if tokio::time::timeout(grace, self.process.wait())
            .await
            .is_err()
        {
            self.signal_group("-KILL");
            let _ = self.process.kill().await;
        }
    }

    fn signal_group(&self, signal: &str) {
        // (Grandchildren in the group are not reached by the parent-death signal, only by this.)
        if let Some(group) = self.group {
            // Through kill(1), so that this crate needs no unsafe code for kill(2).
            let _ = std::process::Command::new("kill")
                .args([signal, "--", &format!("-{group}")])
                .status();
        }
    }
}

impl Watcher {
    fn spawn(group: u32) -> io::Result<Watcher> {
        // This very program (even if its file was replaced meanwhile).
        let mut process = tokio::process::Command::new("/proc/self/exe")
            .arg(WATCH_GROUP)
            .arg(group.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .process_group(0)
            .spawn()?;
        let pipe = process.stdin.take();
        Ok(Watcher { process, pipe })
    }
}

/// The watcher's side: waits for a byte or the end of its stdin; at the end without a byte,
/// SIGKILL to process group `group`. Blocking; runs in a process of its own.
pub fn watch_group(group: &str) -> u8 {
    let Ok(group) = group.parse::<u32>() else {
        return 64;
    };
    let mut byte = [0u8; 1];
    loop {
        match io::Read::read(&mut io::stdin(), &mut byte) {
            Ok(0) => break,
            Ok(_) => return 0,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .stderr(std::process::Stdio::null())
        .status();
    0
}

/// The exit status for a command that could not be started, as shells give it: 127 when it was
/// not found, 126 when it was found but could not be executed (no permission, not a program).
pub fn cannot_start_code(error: &io::Error) -> u8 {
    match error.kind() {
        io::ErrorKind::NotFound => 127,
        _ => 126,
    }
}

/// Makes the kernel SIGKILL the command when `leasehold` dies, however it dies (SIGKILL, a
/// crash): the lease is then no longer renewed and will pass to someone else, so the command
/// must not go on. SIGKILL, not SIGTERM: nobody is left to escalate if the command ignored a
/// polite signal. The signal fires when the *thread* that forked the command exits; the command
/// is spawned from the main thread (the one in `block_on`), which lives as long as the process.
#[allow(unsafe_code)]
fn set_parent_death_signal(command: &mut std::process::Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only calls the
    // async-signal-safe `prctl` and `getppid`, allocating nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // leasehold may have died between fork and prctl: then nobody would kill us.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_is_127_and_anything_else_126() {
        assert_eq!(
            cannot_start_code(&io::Error::from(io::ErrorKind::NotFound)),
            127
        );
        assert_eq!(
            cannot_start_code(&io::Error::from(io::ErrorKind::PermissionDenied)),
            126
        );
        // ENOEXEC: a file without a #! line or a binary for another machine.
        assert_eq!(
            cannot_start_code(&io::Error::from_raw_os_error(libc::ENOEXEC)),
            126
        );
    }
}

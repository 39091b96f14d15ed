//! The command run under the lease, in a process group of its own so it can be stopped whole,
//! and killed by the kernel if `leasehold` dies first.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::time::Duration;

use leasehold::{Fence, LockKey};
use rustix::process::Signal;

use crate::descendants;
use crate::terminal::Terminal;
use crate::watcher::{Confirmer, Watcher};

/// The running command.
pub struct Child {
    process: tokio::process::Child,
    /// The command's process group (its pid: it leads the group).
    group: Option<u32>,
    watcher: Option<Watcher>,
    /// The terminal the command was given, to take back when it ends.
    terminal: Option<Terminal>,
    /// Whether the command's exit was collected: from then on its group id may be reused, so
    /// only the processes found below leasehold are signalled (every member of the group was
    /// one of them).
    reaped: bool,
    /// The foreground group when the command was suspended, given back on resuming.
    foreground: Option<u32>,
}

impl Child {
    /// Starts `command` with the lease's key and fence in its environment; `fence` is `None`
    /// when it runs without a lock (`--if-unavailable run`): then it gets
    /// `LEASEHOLD_LOCK=unlocked` and no fence at all, so nothing it sends can pass for one.
    pub fn spawn(
        command: &[OsString],
        key: &LockKey,
        fence: Option<Fence>,
        backend: &str,
    ) -> io::Result<Child> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command"))?;
        // Whatever the command starts stays below leasehold, however it forks or detaches, so
        // it can be found and ended before the lease is given back.
        if let Err(e) = descendants::become_subreaper() {
            say!(
                "leasehold: cannot become the subreaper of the command's processes (those that \
                 detach from it will not be found): {e}"
            );
        }
        let terminal = Terminal::foreground();
        let mut std_command = std::process::Command::new(program);
        set_parent_death_signal(&mut std_command, terminal.is_some());
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
        let spawned = command
            // Its own process group: stopping it stops whatever it started too.
            .process_group(0)
            .kill_on_drop(true)
            .spawn();
        let process = match spawned {
            Ok(process) => process,
            Err(e) => {
                // It may have taken the terminal before its exec failed.
                if let Some(terminal) = &terminal {
                    terminal.take_back();
                }
                return Err(e);
            }
        };
        // (The command took the terminal itself before its exec: see `set_parent_death_signal`.)
        let group = process.id();
        let watcher = group.and_then(|g| match Watcher::spawn(g) {
            Ok(w) => Some(w),
            Err(e) => {
                say!(
                    "leasehold: cannot start the watcher of the command's process group \
                     (if leasehold is killed or stopped, only the command itself is ended): {e}"
                );
                None
            }
        });
        Ok(Child {
            process,
            group,
            watcher,
            terminal,
            reaped: false,
            foreground: None,
        })
    }

    /// Confirms the lease's deadlines to the watcher, which kills the command if one passes
    /// unconfirmed (leasehold stopped or dead); `None` without a watcher.
    pub fn confirmer(&self) -> Option<Confirmer> {
        self.watcher.as_ref().map(Watcher::confirmer)
    }

    /// Tells the watcher that `leasehold` is ending in order, so it leaves the group alone, and
    /// takes the terminal back from the command. Returns whether the watcher had already ended
    /// the command, at a deadline `leasehold` did not confirm in time.
    pub async fn disarm(&mut self) -> bool {
        if let (Some(terminal), Some(group)) = (&self.terminal, self.group) {
            let _ = terminal.take_back_from(group);
        }
        match self.watcher.take() {
            Some(watcher) => watcher.disarm().await,
            None => false,
        }
    }

    /// Waits for the command; its exit code, or 128 + the signal that ended it.
    pub async fn wait(&mut self) -> u8 {
        let status = self.process.wait().await;
        self.reaped = true;
        match status {
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

    /// What tells, without borrowing the command, whether Ctrl-Z at its terminal stopped it.
    pub fn job(&self) -> Job {
        Job {
            leader: self.group,
            watcher: self.watcher.as_ref().and_then(Watcher::pid),
            terminal: self.terminal.is_some(),
        }
    }

    /// Ends everything the command started: SIGTERM (and SIGCONT, so a stopped process can act
    /// on it) to the process group and to every descendant outside it; once `grace` is over,
    /// SIGKILL to whatever is left, whether or not the group's leader is still there. Returns
    /// when nothing the command started is alive.
    pub async fn stop(&mut self, grace: Duration) {
        self.signal_all(Signal::TERM);
        self.signal_all(Signal::CONT);
        let give_up = leasehold_core::time::saturating_add(tokio::time::Instant::now(), grace);
        while tokio::time::Instant::now() < give_up {
            if self.leader_gone() && self.rest().is_empty() {
                return;
            }
            tokio::time::sleep(
                POLL.min(give_up.saturating_duration_since(tokio::time::Instant::now())),
            )
            .await;
        }
        self.kill_all().await;
    }

    /// What the command left running when it exited (background jobs, daemons), ended as
    /// [`Child::stop`] ends it; nothing to do (one look at `/proc`) when it left nothing.
    pub async fn end_the_rest(&mut self, grace: Duration) {
        if self.rest().is_empty() {
            return;
        }
        self.stop(grace).await;
    }

    /// Stops everything the command started (SIGSTOP), for leasehold to stop too, taking the
    /// terminal back if the command has it.
    pub fn suspend(&mut self) {
        if let (Some(terminal), Some(group)) = (&self.terminal, self.group) {
            if terminal.take_back_from(group) {
                self.foreground = Some(group);
            }
        }
        self.signal_all(Signal::STOP);
    }

    /// Continues what [`Child::suspend`] stopped. The terminal goes back to the command only
    /// when it had it and leasehold was continued in the foreground (`fg`); continued in the
    /// background (`bg`), the shell keeps it.
    pub fn resume(&mut self) {
        if let (Some(terminal), Some(group)) = (&self.terminal, self.foreground.take()) {
            terminal.give_to(group);
        }
        self.signal_all(Signal::CONT);
    }

    fn leader_gone(&mut self) -> bool {
        let gone = !matches!(self.process.try_wait(), Ok(None));
        self.reaped |= gone;
        gone
    }

    /// The live processes below leasehold but the watcher.
    fn rest(&self) -> Vec<u32> {
        let watcher: Vec<u32> = self.watcher.iter().filter_map(Watcher::pid).collect();
        let mut keep = watcher.clone();
        keep.extend(self.group);
        descendants::below(std::process::id(), &watcher, &keep)
    }

    fn signal_all(&self, signal: Signal) {
        if let (Some(group), false) = (self.group, self.reaped) {
            descendants::signal_group(group, signal);
        }
        descendants::signal_each(std::process::id(), &self.rest(), signal);
    }

    /// SIGKILL to the group and every descendant until none is left (a process killed while it
    /// forked may leave a child the previous look missed), then reaps the command. Bounded: a
    /// process that is not ours to signal (one that changed its user, as `sudo` does) or is
    /// stuck in the kernel is named, not waited for forever.
    async fn kill_all(&mut self) {
        let give_up = leasehold_core::time::saturating_add(tokio::time::Instant::now(), KILL_FOR);
        loop {
            self.signal_all(Signal::KILL);
            let rest = self.rest();
            if rest.is_empty() {
                break;
            }
            if tokio::time::Instant::now() >= give_up {
                say!(
                    "leasehold: processes the command started outlived SIGKILL for {KILL_FOR:?} \
                     (another user's, or stuck in the kernel): {rest:?}"
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let _ = self.process.kill().await;
        self.reaped = true;
    }
}

/// How long SIGKILL is repeated before the processes that outlive it are given up on.
const KILL_FOR: Duration = Duration::from_secs(5);

/// The command as a terminal's job.
#[derive(Clone, Copy, Debug)]
pub struct Job {
    leader: Option<u32>,
    watcher: Option<u32>,
    /// Whether the command was given the terminal (leasehold runs in one, in the foreground).
    terminal: bool,
}

impl Job {
    /// Reaps the exited processes that were reparented to leasehold (it is their subreaper),
    /// so a long run whose command keeps starting daemons does not pile up zombies. Not the
    /// command or the watcher: their exit status is awaited elsewhere.
    pub fn reap_orphans(&self) {
        let keep: Vec<u32> = self.leader.into_iter().chain(self.watcher).collect();
        let spared: Vec<u32> = self.watcher.into_iter().collect();
        let _ = descendants::below(std::process::id(), &spared, &keep);
    }

    /// Whether the command has the terminal and is stopped (Ctrl-Z reached it, not leasehold).
    pub fn stopped_at_its_terminal(&self) -> bool {
        self.terminal
            && self
                .leader
                .is_some_and(|pid| descendants::state(pid) == Some('T'))
    }
}

/// How often a stop looks whether everything has exited.
const POLL: Duration = Duration::from_millis(20);

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
///
/// With `take_terminal`, the command also makes its own process group the terminal's
/// foreground group before it runs, so that it can read the terminal from its first
/// instruction (`leasehold` ignores SIGTTOU, which lets a background group do that; the
/// command gets the default back).
#[allow(unsafe_code)]
fn set_parent_death_signal(command: &mut std::process::Command, take_terminal: bool) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec (after its process group was
    // set) and only calls the async-signal-safe `prctl`, `getppid`, `getpid`, `tcsetpgrp` and
    // `signal`, allocating nothing.
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
            if take_terminal {
                libc::tcsetpgrp(libc::STDIN_FILENO, libc::getpid());
                libc::signal(libc::SIGTTOU, libc::SIG_DFL);
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

//! Everything the command started, wherever it went: the processes below `leasehold` in the
//! process tree, found by reading `/proc`.
//!
//! A process group is not enough to find them: a descendant can leave the group (`setsid`, a
//! daemon's double fork), and a group is reached by a signal only while one of its members is
//! alive. `leasehold` makes itself a *child subreaper* before starting the command, so a
//! descendant whose parent exits is reparented to `leasehold` instead of to init, and stays in
//! the tree; every live process below `leasehold` (but the watcher) is then the command's doing.
//!
//! Not covered: a descendant that got another process to start something for it (a service
//! manager, `at`, a container runtime): that is no longer below `leasehold`.

use std::io;

use rustix::process::{Pid, Signal, WaitOptions};

/// Makes this process the subreaper of its descendants (Linux `PR_SET_CHILD_SUBREAPER`).
pub fn become_subreaper() -> io::Result<()> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).map_err(io::Error::from)
}

/// One row of the process table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    pid: i32,
    parent: i32,
    /// Dead but not yet reaped by its parent: it can do nothing more.
    zombie: bool,
}

/// The pid, parent and state of a process from the text of its `/proc/PID/stat`. The command
/// name (in parentheses) may itself hold spaces and parentheses, so the fields are read after
/// the last `)`.
fn parse_stat(pid: i32, stat: &str) -> Option<Entry> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?;
    let parent = fields.next()?.parse().ok()?;
    Some(Entry {
        pid,
        parent,
        zombie: state == "Z" || state == "X",
    })
}

fn table() -> Vec<Entry> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        // A process that exits while the table is read is simply not in it.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        parse_stat(pid, &stat)
    })
    .collect()
}

/// The state letter of process `pid` (`T` stopped, `Z` dead and not yet reaped...); `None`
/// once it is gone.
pub fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// The processes below `root` (not `root` itself), skipping `spared` and everything below it:
/// `(live, zombie children of root)`.
fn below_in(table: &[Entry], root: i32, spared: &[i32]) -> (Vec<i32>, Vec<i32>) {
    let mut live = Vec::new();
    let mut zombies = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for entry in table.iter().filter(|e| e.parent == parent) {
            if spared.contains(&entry.pid) || entry.pid == root {
                continue;
            }
            if entry.zombie {
                if parent == root {
                    zombies.push(entry.pid);
                }
            } else {
                live.push(entry.pid);
            }
            // A zombie has no children left: they were reparented when it died.
            frontier.push(entry.pid);
        }
    }
    (live, zombies)
}

/// The live processes below `root`, except `spared` and its own descendants. Zombies that
/// were reparented to `root` are reaped on the way when `root` is this process, except those in
/// `keep` (children whose exit status someone still waits for).
pub fn below(root: u32, spared: &[u32], keep: &[u32]) -> Vec<u32> {
    let Ok(root_pid) = i32::try_from(root) else {
        return Vec::new();
    };
    let spared: Vec<i32> = spared
        .iter()
        .filter_map(|p| i32::try_from(*p).ok())
        .collect();
    let (live, zombies) = below_in(&table(), root_pid, &spared);
    if root == std::process::id() {
        for zombie in zombies {
            if keep.iter().any(|k| i32::try_from(*k).ok() == Some(zombie)) {
                continue;
            }
            if let Some(pid) = Pid::from_raw(zombie) {
                // Only this pid: a wait for any child would take the command's exit status
                // from the runtime that waits for it.
                let _ = rustix::process::waitpid(Some(pid), WaitOptions::NOHANG);
            }
        }
    }
    live.into_iter()
        .filter_map(|p| u32::try_from(p).ok())
        .collect()
}

/// Whether `root` is an ancestor of `pid`, by the parents in `/proc`.
fn is_below(root: i32, pid: i32) -> bool {
    let mut current = pid;
    // A chain longer than the pid space would be a loop read across a racing reparenting.
    for _ in 0..4_194_304 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{current}/stat")) else {
            return false;
        };
        match parse_stat(current, &stat) {
            Some(entry) if entry.parent == root => return true,
            Some(entry) if entry.parent > 1 => current = entry.parent,
            _ => return false,
        }
    }
    false
}

/// Sends `signal` to each of `pids` that is still below `root`; one that is already gone is no
/// error. The pids come from an earlier read of `/proc`: one that exited since may have been
/// given to a process that is not ours. So each is first pinned with a pidfd (which refers to
/// that one process for good, whatever becomes of its number), then checked to be below
/// `root`, and signalled through the pidfd. Where pidfds are missing (Linux before 5.3), the
/// check and a plain kill(2) remain, with the short race between them.
pub fn signal_each(root: u32, pids: &[u32], signal: Signal) {
    let Ok(root) = i32::try_from(root) else {
        return;
    };
    for pid in pids {
        let Some(pid) = i32::try_from(*pid).ok().and_then(Pid::from_raw) else {
            continue;
        };
        match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
            Ok(pidfd) => {
                if is_below(root, pid.as_raw_nonzero().get()) {
                    let _ = rustix::process::pidfd_send_signal(&pidfd, signal);
                }
            }
            Err(rustix::io::Errno::NOSYS) => {
                if is_below(root, pid.as_raw_nonzero().get()) {
                    let _ = rustix::process::kill_process(pid, signal);
                }
            }
            // Gone (ESRCH), or not ours to signal.
            Err(_) => {}
        }
    }
}

/// Sends `signal` to the process group `group`; a group with no member left is no error.
pub fn signal_group(group: u32, signal: Signal) {
    if let Some(pid) = i32::try_from(group).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_after_the_last_parenthesis() {
        let odd = "42 (a) b (c)) S 7 42 42 0 -1";
        assert_eq!(
            parse_stat(42, odd),
            Some(Entry {
                pid: 42,
                parent: 7,
                zombie: false
            })
        );
        let zombie = parse_stat(9, "9 (sh) Z 1 9 9").map(|e| e.zombie);
        assert_eq!(zombie, Some(true));
        assert_eq!(parse_stat(9, "9 (sh"), None);
    }

    /// A pid read from `/proc` earlier may belong to another process by the time it is
    /// signalled: only one still below the root is.
    #[test]
    fn only_processes_still_below_the_root_are_signalled() -> Result<(), String> {
        let spawn = || {
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .map_err(|e| format!("spawning sleep: {e}"))
        };
        let (mut root, mut other) = (spawn()?, spawn()?);
        // `other` is this process's child, not `root`'s: it must survive.
        signal_each(root.id(), &[other.id()], Signal::KILL);
        std::thread::sleep(std::time::Duration::from_millis(100));
        let survived = matches!(other.try_wait(), Ok(None));
        // Below this process it is signalled.
        signal_each(std::process::id(), &[other.id()], Signal::KILL);
        let killed = other
            .wait()
            .map_err(|e| format!("waiting for sleep: {e}"))?;
        let _ = root.kill();
        let _ = root.wait();
        if !survived {
            return Err("a process not below the root was signalled".into());
        }
        if killed.success() {
            return Err("a process below the root was not signalled".into());
        }
        Ok(())
    }

    #[test]
    fn the_tree_below_a_root_skips_the_spared_branch_and_collects_zombie_children() {
        let e = |pid, parent, zombie| Entry {
            pid,
            parent,
            zombie,
        };
        let table = [
            e(1, 0, false),
            e(10, 1, false),  // root
            e(11, 10, false), // the command
            e(12, 11, false), // its child
            e(13, 12, false), // a grandchild
            e(14, 10, false), // the watcher: spared, and its child with it
            e(15, 14, false),
            e(16, 10, true), // a reparented orphan that died
            e(17, 1, false), // someone else's
        ];
        let (mut live, zombies) = below_in(&table, 10, &[14]);
        live.sort_unstable();
        assert_eq!(live, [11, 12, 13]);
        assert_eq!(zombies, [16]);
    }
}

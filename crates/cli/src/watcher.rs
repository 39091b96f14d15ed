//! The watcher: a second process that ends the command when `leasehold` no longer can.
//!
//! `leasehold` may die (SIGKILL, a crash) or be stopped (SIGSTOP, which no process can catch)
//! while its command runs. Then nobody renews the lease, and nobody stops the command when the
//! lease runs out: the command would go on while another holder has the key. The watcher is a
//! dead man's switch for both. It reads a pipe from `leasehold`:
//!
//! * `deadline NS`: the lease's local deadline, as nanoseconds of `CLOCK_MONOTONIC` (one clock
//!   for every process of the machine, so no wall clock is compared). `leasehold` sends it at
//!   the start and after every renewal that moves it.
//! * `done`: `leasehold` has ended the command in order; the watcher exits.
//! * end of file without `done`: `leasehold` is gone (the kernel closes the pipe whatever killed
//!   it).
//!
//! When the deadline passes unconfirmed, or at end of file, the watcher sends SIGKILL to the
//! command's process group and, while `leasehold` is still its parent (stopped, not dead), to
//! every process below `leasehold` but itself. It has a process group of its own, so a
//! terminal's signals do not reach it.
//!
//! Not covered: when `leasehold` is dead, descendants that left the command's process group were
//! reparented away from it and are not found (the command itself gets the parent-death signal).

use std::io::{self, BufRead};
use std::sync::mpsc;
use std::time::Duration;

use rustix::process::Signal;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

use crate::descendants;

/// The hidden subcommand of the watcher process.
pub const WATCH_GROUP: &str = "__watch-group";

/// The watcher's exit status when it ended the command itself.
const FIRED: i32 = 3;

/// `leasehold`'s side of the watcher.
pub struct Watcher {
    process: tokio::process::Child,
    said: watch::Sender<Say>,
    writer: tokio::task::JoinHandle<()>,
}

/// What `leasehold` has last told the watcher; only the latest matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Say {
    /// Nothing yet, and for a command run without a lease: only end of file arms the switch.
    Nothing,
    /// The lease's local deadline, in nanoseconds of `CLOCK_MONOTONIC`.
    Deadline(u64),
    /// The command was ended in order: stand down.
    Done,
}

impl Watcher {
    /// Starts the watcher of process group `group`.
    pub fn spawn(group: u32) -> io::Result<Watcher> {
        // This very program (even if its file was replaced meanwhile).
        let mut process = tokio::process::Command::new("/proc/self/exe")
            .arg(WATCH_GROUP)
            .arg(group.to_string())
            .arg(std::process::id().to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .process_group(0)
            .spawn()?;
        let mut pipe = process
            .stdin
            .take()
            .ok_or_else(|| io::Error::other("the watcher has no stdin"))?;
        let (said, mut heard) = watch::channel(Say::Nothing);
        // One writer owns the pipe, so a confirmation never waits for the command or the lease.
        let writer = tokio::spawn(async move {
            while heard.changed().await.is_ok() {
                let line = match *heard.borrow_and_update() {
                    Say::Nothing => continue,
                    Say::Deadline(ns) => format!("deadline {ns}\n"),
                    Say::Done => "done\n".to_string(),
                };
                if pipe.write_all(line.as_bytes()).await.is_err() || line == "done\n" {
                    return;
                }
            }
        });
        Ok(Watcher {
            process,
            said,
            writer,
        })
    }

    /// The pid of the watcher process (not the command's: it is spared when the tree is ended).
    pub fn pid(&self) -> Option<u32> {
        self.process.id()
    }

    /// A handle that confirms the lease's deadlines, from any task.
    pub fn confirmer(&self) -> Confirmer {
        Confirmer(self.said.clone())
    }

    /// Tells the watcher that `leasehold` has ended the command in order, and waits for it.
    /// Returns whether the watcher had ended the command itself, at a deadline that passed
    /// unconfirmed.
    pub async fn disarm(mut self) -> bool {
        self.said.send_replace(Say::Done);
        let _ = (&mut self.writer).await;
        matches!(self.process.wait().await.map(|s| s.code()), Ok(Some(FIRED)))
    }
}

/// Confirms the lease's local deadline to a [`Watcher`]; once the watcher is disarmed, it says
/// nothing more.
#[derive(Clone)]
pub struct Confirmer(watch::Sender<Say>);

impl Confirmer {
    /// Confirms `deadline` (a `tokio` instant, which reads `CLOCK_MONOTONIC`).
    pub fn confirm(&self, deadline: tokio::time::Instant) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let ns = monotonic_ns().saturating_add(u64::try_from(left.as_nanos()).unwrap_or(u64::MAX));
        self.0.send_if_modified(|said| {
            if *said == Say::Done || *said == Say::Deadline(ns) {
                return false;
            }
            *said = Say::Deadline(ns);
            true
        });
    }
}

/// Nanoseconds of `CLOCK_MONOTONIC`, the clock `tokio`'s and `std`'s instants read on Linux.
fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(now.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(now.tv_nsec).unwrap_or(0))
}

/// What the pipe said.
enum Message {
    Deadline(u64),
    Done,
    /// End of file, or a pipe that cannot be read.
    Closed,
}

/// The watcher's side: `args` are the group and `leasehold`'s pid. Blocking; runs in a process
/// of its own.
pub fn watch_group(args: &[String]) -> u8 {
    let (Some(group), Some(parent)) = (
        args.first().and_then(|g| g.parse::<u32>().ok()),
        args.get(1).and_then(|p| p.parse::<u32>().ok()),
    ) else {
        return 64;
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let stdin = io::stdin();
        for line in stdin.lock().lines() {
            let message = match line {
                Ok(line) if line == "done" => Message::Done,
                Ok(line) => match line.strip_prefix("deadline ").map(str::parse) {
                    Some(Ok(ns)) => Message::Deadline(ns),
                    _ => continue,
                },
                Err(_) => break,
            };
            if tx.send(message).is_err() {
                return;
            }
        }
        let _ = tx.send(Message::Closed);
    });
    let mut deadline: Option<u64> = None;
    loop {
        let message = match deadline {
            None => rx.recv().unwrap_or(Message::Closed),
            Some(at) => {
                let left = Duration::from_nanos(at.saturating_sub(monotonic_ns()));
                if left.is_zero() {
                    break;
                }
                match rx.recv_timeout(left) {
                    Ok(m) => m,
                    Err(mpsc::RecvTimeoutError::Timeout) => continue,
                    Err(mpsc::RecvTimeoutError::Disconnected) => Message::Closed,
                }
            }
        };
        match message {
            Message::Deadline(at) => deadline = Some(at),
            Message::Done => return 0,
            Message::Closed => break,
        }
    }
    end_everything(group, parent);
    FIRED as u8
}

/// SIGKILL to the group and, while `leasehold` is still this process's parent, to everything
/// below `leasehold` but this watcher; a few rounds, for what was forked meanwhile.
fn end_everything(group: u32, parent: u32) {
    let me = std::process::id();
    for _ in 0..50 {
        descendants::signal_group(group, Signal::KILL);
        let parent_alive =
            rustix::process::getppid().map(|p| p.as_raw_pid().unsigned_abs()) == Some(parent);
        let rest = if parent_alive {
            descendants::below(parent, &[me], &[])
        } else {
            Vec::new()
        };
        if rest.is_empty() {
            return;
        }
        descendants::signal_each(parent, &rest, Signal::KILL);
        std::thread::sleep(Duration::from_millis(2));
    }
}

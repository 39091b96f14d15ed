//! The terminal, when `leasehold` runs in one: the command gets it as its foreground process
//! group, as a shell gives it to a job, so that it can read it (a background group that reads
//! its terminal is stopped by SIGTTIN) and Ctrl-C and Ctrl-Z reach it. `leasehold` takes it
//! back when the command ends or is stopped.

use rustix::process::Pid;

/// The terminal on stdin, handed between `leasehold`'s process group and the command's.
#[derive(Debug)]
pub struct Terminal {
    /// `leasehold`'s own process group, the terminal's foreground group when it started.
    own: Pid,
}

impl Terminal {
    /// `Some` when stdin is a terminal whose foreground group is `leasehold`'s own (it was
    /// started in the foreground, not with `&`). `leasehold` then ignores SIGTTOU, so it can
    /// hand the terminal on from the background.
    pub fn foreground() -> Option<Terminal> {
        let stdin = std::io::stdin();
        if !rustix::termios::isatty(&stdin) {
            return None;
        }
        let own = rustix::process::getpgrp();
        if rustix::termios::tcgetpgrp(&stdin).ok()? != own {
            return None;
        }
        ignore_sigttou();
        Some(Terminal { own })
    }

    /// Makes process group `group` the terminal's foreground group, if leasehold's own group
    /// has it (a leasehold continued in the background must not take it from the shell).
    pub fn give_to(&self, group: u32) {
        if self.foreground_group() != Some(self.own) {
            return;
        }
        if let Some(group) = pid(group) {
            let _ = rustix::termios::tcsetpgrp(std::io::stdin(), group);
        }
    }

    /// Makes leasehold's own group the foreground group again (when the command's group took
    /// it and could not run).
    pub fn take_back(&self) {
        let _ = rustix::termios::tcsetpgrp(std::io::stdin(), self.own);
    }

    /// Takes the terminal back if process group `group` has it; whether it did.
    pub fn take_back_from(&self, group: u32) -> bool {
        let has_it = self
            .foreground_group()
            .is_some_and(|now| Some(now) == pid(group));
        if has_it {
            self.take_back();
        }
        has_it
    }

    fn foreground_group(&self) -> Option<Pid> {
        rustix::termios::tcgetpgrp(std::io::stdin()).ok()
    }
}

fn pid(group: u32) -> Option<Pid> {
    i32::try_from(group).ok().and_then(Pid::from_raw)
}

/// A process in a background group that sets the terminal's foreground group gets SIGTTOU
/// (and is stopped) unless it ignores it.
#[allow(unsafe_code)]
fn ignore_sigttou() {
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler; SIGTTOU is not
    // one the runtime listens for.
    unsafe {
        libc::signal(libc::SIGTTOU, libc::SIG_IGN);
    }
}

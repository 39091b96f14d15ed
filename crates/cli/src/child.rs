//! The command run under the lease, in a process group of its own so it can be stopped whole.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use leasehold::{Fence, LockKey};

/// The running command.
pub struct Child {
    process: tokio::process::Child,
    group: Option<u32>,
}

impl Child {
    /// Starts `command` with the lease's key and fence in its environment.
    pub fn spawn(
        command: &[OsString],
        key: &LockKey,
        fence: Fence,
        backend: &str,
    ) -> std::io::Result<Child> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no command"))?;
        let process = tokio::process::Command::new(program)
            .args(args)
            .env("LEASEHOLD_KEY", key.as_str())
            .env("LEASEHOLD_FENCE", fence.value().to_string())
            .env("LEASEHOLD_FENCE_SAFETY", fence.safety().to_string())
            .env("LEASEHOLD_BACKEND", backend)
            // Its own process group: stopping it stops whatever it started too.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let group = process.id();
        Ok(Child { process, group })
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
        if let Some(group) = self.group {
            // Through kill(1), so that this crate needs no unsafe code for kill(2).
            let _ = std::process::Command::new("kill")
                .args([signal, "--", &format!("-{group}")])
                .status();
        }
    }
}

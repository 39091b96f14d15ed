//! Fault injection a backend's test harness offers to the scenarios.

use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{Error, LockKey, Result};

pub(crate) fn unsupported(operation: &str) -> Error {
    Error::Unsupported {
        backend: "fault harness",
        operation: operation.to_string(),
    }
}

/// What a backend's test can do to its server(s) behind the clients' backs.
///
/// Every method defaults to [`Error::Unsupported`]; a scenario that needs an unsupported fault
/// reports "not applicable" with the reason, so the report shows which faults were exercised.
#[async_trait]
pub trait Faults: Send + Sync {
    /// Crash the server (SIGKILL) and start it again on the same data; returns once it serves.
    async fn restart(&self) -> Result<()> {
        Err(unsupported("restart"))
    }

    /// Make the server unresponsive (SIGSTOP): requests hang, as in a partition seen from the
    /// client.
    async fn pause(&self) -> Result<()> {
        Err(unsupported("pause"))
    }

    /// Whether [`Faults::pause`] leaves the authority answering but kept busy by another
    /// client (SQLite: another connection holds the file's write lock) rather than unreachable
    /// (default: unreachable). Busy is contention: requests fail with a retryable error that is
    /// not `Unavailable`, and no policy runs work without a lock then.
    fn pause_is_contention(&self) -> bool {
        false
    }

    /// Undo [`Faults::pause`] (SIGCONT).
    async fn resume(&self) -> Result<()> {
        Err(unsupported("resume"))
    }

    /// Delete the lease on `key` at the server, as an operator or a session expiry would, so
    /// that the holder's next renewal is refused.
    async fn revoke(&self, key: &LockKey) -> Result<()> {
        let _ = key;
        Err(unsupported("revoke"))
    }

    /// Start a failover: the standby is promoted (a replica, or a new leader after the old one
    /// is killed) while the old primary may still answer clients that talk to it.
    async fn begin_failover(&self) -> Result<()> {
        Err(unsupported("failover"))
    }

    /// Finish the failover: clients now reach the promoted server.
    async fn complete_failover(&self) -> Result<()> {
        Err(unsupported("failover"))
    }

    /// Hold every reply back by `delay` after the server acted on it (zero: normal again).
    async fn slow_replies(&self, _delay: Duration) -> Result<()> {
        Err(unsupported("slow replies"))
    }
}

/// A backend without fault injection (for example servers someone else started).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoFaults;

impl Faults for NoFaults {}

/// A harness failure (a server that would not restart, a signal that could not be sent) as the
/// error a [`Faults`] method returns, so the scenario that asked for the fault fails with it.
pub fn harness_error(e: impl std::fmt::Display) -> Error {
    Error::Backend {
        backend: "harness",
        message: e.to_string(),
        retryable: false,
        source: None,
    }
}

/// Runs a blocking harness call (kill, pause, restart...) off the runtime's workers, with its
/// failure as the error a [`Faults`] method returns.
pub async fn harness_call<T: Send + 'static>(
    f: impl FnOnce() -> crate::servers::Result<T> + Send + 'static,
) -> leasehold_core::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(harness_error)?
        .map_err(harness_error)
}

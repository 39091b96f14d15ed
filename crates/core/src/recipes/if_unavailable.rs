//! Failing open or closed when the authority cannot be reached: a decision made in advance, at
//! the call site, instead of an accident of error handling.
//!
//! When the authority does not answer, nobody knows who holds the lock. Failing **closed**
//! (do not run) risks starving the work; failing **open** (run without the lock) risks doing it
//! twice. Work that the resource itself protects with an invariant (a unique key, a conditional
//! write, an idempotency key) can often fail open; work whose only protection is the lock must
//! fail closed. [`acquire_or`] makes the choice explicit, and what it returns for "proceeding
//! without a lock" carries no fence, so it cannot be sent to a resource as one.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::contract::authority::Authority;
use crate::contract::error::{Error, Result};
use crate::contract::key::LockKey;
use crate::lease::{Lease, LeaseOptions};

/// What to do when the authority cannot be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IfUnavailable {
    /// Do not proceed: the error is returned, as from [`Lease::acquire`].
    FailClosed,
    /// Proceed without the lock: [`Admission::Unlocked`], for work the resource protects by
    /// itself.
    FailOpen,
}

/// What [`acquire_or`] let the caller do.
#[derive(Debug)]
#[must_use = "a lease must be held while the work runs, and released after"]
pub enum Admission {
    /// The lease is held: proceed, and send its fence with every protected write.
    Leased(Lease),
    /// The authority could not be reached and the policy was [`IfUnavailable::FailOpen`]:
    /// proceed *without* a lock. There is no fence: the resource must protect itself.
    Unlocked(Unlocked),
}

impl Admission {
    /// The lease, if one is held.
    pub fn lease(&self) -> Option<&Lease> {
        match self {
            Admission::Leased(lease) => Some(lease),
            Admission::Unlocked(_) => None,
        }
    }

    /// Whether the work runs without a lock.
    pub fn is_unlocked(&self) -> bool {
        matches!(self, Admission::Unlocked(_))
    }
}

/// Proceeding without a lock, and why. It has no fence and no way to make one.
#[derive(Debug)]
pub struct Unlocked {
    key: LockKey,
    cause: Error,
}

impl Unlocked {
    /// The key that could not be locked.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// Why: the error that showed the authority unreachable.
    pub fn cause(&self) -> &Error {
        &self.cause
    }
}

impl fmt::Display for Unlocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "proceeding without a lock on `{}`: the authority is unavailable ({})",
            self.key, self.cause
        )
    }
}

/// Whether `error` means the authority could not be reached: [`Error::Unavailable`] only.
///
/// Everything else is an answer, and no policy turns an answer into running without a lock:
/// the key held, bad input, refused credentials, and the retryable errors of an authority that
/// answered but is busy (SQLite's write lock held by another connection, a PostgreSQL
/// serialization failure or lock timeout, throttling). Those are contention: another client may
/// be taking this very key at that moment, so running the work unlocked could run it twice.
pub fn is_unavailable(error: &Error) -> bool {
    matches!(error, Error::Unavailable { .. })
}

/// [`Lease::acquire`], with the choice of what to do when the authority cannot be reached made
/// here. A key held by someone else is never a reason to proceed: that stays
/// [`Error::Timeout`] under either policy.
pub async fn acquire_or(
    authority: Arc<dyn Authority>,
    key: &LockKey,
    ttl: Duration,
    max_wait: Duration,
    options: LeaseOptions,
    policy: IfUnavailable,
) -> Result<Admission> {
    let backend = authority.capabilities().backend;
    let attempt = if max_wait.is_zero() {
        // One request: a held key is contention, whatever the policy.
        Lease::try_acquire(authority, key, ttl, options)
            .await
            .and_then(|lease| {
                lease.ok_or_else(|| Error::Timeout {
                    key: key.to_string(),
                    waited: Duration::ZERO,
                })
            })
    } else {
        Lease::acquire(authority, key, ttl, max_wait, options).await
    };
    match attempt {
        Ok(lease) => Ok(Admission::Leased(lease)),
        Err(cause) if policy == IfUnavailable::FailOpen && is_unavailable(&cause) => {
            crate::telemetry::proceeded_unlocked(backend, key);
            tracing::warn!(%key, backend, error = %cause, "authority unavailable: proceeding without a lock (fail open)");
            Ok(Admission::Unlocked(Unlocked {
                key: key.clone(),
                cause,
            }))
        }
        Err(e) => Err(e),
    }
}

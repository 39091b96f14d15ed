//! One error type for every authority, so callers can decide fail-open or fail-closed explicitly.

use std::sync::Arc;
use std::time::Duration;

use crate::lost::LostReason;

/// A boxed error from a backend's client library, kept as the `source` of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias used throughout leasehold.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when asking an authority for a lease.
///
/// The variants separate three questions a caller must answer differently:
/// * *Is the input wrong?* ([`Error::InvalidKey`], [`Error::InvalidTtl`], [`Error::InvalidUrl`],
///   [`Error::InvalidConfig`]): permanent, fix the call.
/// * *Does someone else hold the lock?* `try_acquire` returns `Ok(None)`; `acquire` returns
///   [`Error::Timeout`] when `max_wait` ran out. The authority answered.
/// * *Is the authority reachable at all?* ([`Error::Unavailable`]): the authority did not answer,
///   so nobody knows who holds the lock. Whether to proceed without it (fail-open) or not
///   (fail-closed) is the caller's explicit decision, never ours.
///
/// [`Error::is_retryable`] tells whether the same call may succeed later.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock key is empty, too long, or contains characters outside the allowed set.
    #[error("invalid lock key: {reason}")]
    InvalidKey {
        /// What is wrong with the key.
        reason: String,
    },
    /// The TTL is zero, outside the backend's supported range, or not a multiple of its
    /// granularity. TTLs are never silently rounded.
    #[error("invalid TTL {ttl:?}: {reason}")]
    InvalidTtl {
        /// The TTL that was asked for.
        ttl: Duration,
        /// Why the backend cannot honour it.
        reason: String,
    },
    /// A connection URL could not be parsed or names an unknown scheme. The URL in the message
    /// has any password replaced by `***`.
    #[error("invalid URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL, redacted.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration value (epoch, safety margin, table name, ...) is out of range.
    #[error("invalid configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// `acquire` waited `max_wait` and the lock stayed held by someone else. The authority was
    /// reachable; this is contention, not an outage.
    #[error("lock `{key}` still held by another owner after waiting {waited:?}")]
    Timeout {
        /// The contended key.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The lease is no longer ours: the authority refused a renewal, or its validity ran out.
    /// Stop starting protected side effects.
    #[error("lease on `{key}` lost: {reason}")]
    LeaseLost {
        /// The key whose lease was lost.
        key: String,
        /// Why it was lost.
        reason: LostReason,
    },
    /// The lease is suspended: its last renewal's outcome is unknown (see
    /// [`crate::LeaseState::Suspended`]). Do not start a protected side effect now; renewal goes
    /// on, and the lease is held again or lost before its local deadline.
    #[error("lease on `{key}` suspended: the last renewal's outcome is unknown")]
    LeaseSuspended {
        /// The key whose lease is suspended.
        key: String,
    },
    /// The authority could not be reached or did not answer in time. Nobody knows who holds the
    /// lock right now.
    #[error("{backend} authority unavailable: {message}")]
    Unavailable {
        /// Which backend.
        backend: &'static str,
        /// A short description of what failed.
        message: String,
        /// The client library's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// The authority rejected the credentials (wrong password, unknown user, missing permission).
    #[error("{backend} authority refused the credentials: {message}")]
    Unauthorized {
        /// Which backend.
        backend: &'static str,
        /// What the server said, without secrets.
        message: String,
        /// The client library's error.
        #[source]
        source: Option<BoxError>,
    },
    /// The authority answered with an error that is none of the above (a missing table, a script
    /// error, a protocol violation).
    #[error("{backend} authority error: {message}")]
    Backend {
        /// Which backend.
        backend: &'static str,
        /// What went wrong.
        message: String,
        /// Whether the same call may succeed later.
        retryable: bool,
        /// The client library's error.
        #[source]
        source: Option<BoxError>,
    },
    /// The backend cannot do this at all (for example a feature it was not built with, or a
    /// renewal with a different TTL on a backend whose TTL is fixed per session).
    #[error("{operation} is not supported by the {backend} authority")]
    Unsupported {
        /// Which backend.
        backend: &'static str,
        /// What was asked.
        operation: String,
    },
    /// A backend's fence does not fit the stored fence layout (see [`crate::Fence`]).
    #[error("fence {raw} from the {backend} authority is outside 1..=2^48-1")]
    FenceOutOfRange {
        /// Which backend.
        backend: &'static str,
        /// The backend's raw number.
        raw: u64,
    },
    /// The operating system's random number generator failed, so no owner token could be made.
    #[error("the operating system's random number generator failed")]
    Entropy {
        /// The generator's error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// Whether the same call may succeed if tried again later.
    ///
    /// `Unavailable`, `Timeout` (contention), `LeaseSuspended` and retryable `Backend` errors
    /// are; invalid input,
    /// lost leases, refused credentials and unsupported operations are not.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Unavailable { .. } | Error::Timeout { .. } | Error::LeaseSuspended { .. } => {
                true
            }
            Error::Backend { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// Whether this error means the lease is no longer ours.
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. })
    }

    /// A short, stable name of the variant, for logs, metrics and reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidKey { .. } => "invalid_key",
            Error::InvalidTtl { .. } => "invalid_ttl",
            Error::InvalidUrl { .. } => "invalid_url",
            Error::InvalidConfig { .. } => "invalid_config",
            Error::Timeout { .. } => "timeout",
            Error::LeaseLost { .. } => "lease_lost",
            Error::LeaseSuspended { .. } => "lease_suspended",
            Error::Unavailable { .. } => "unavailable",
            Error::Unauthorized { .. } => "unauthorized",
            Error::Backend { .. } => "backend",
            Error::Unsupported { .. } => "unsupported",
            Error::FenceOutOfRange { .. } => "fence_out_of_range",
            Error::Entropy { .. } => "entropy",
        }
    }

    /// An [`Error::Unavailable`] with a source.
    pub fn unavailable(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Unavailable {
            backend,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A permanent [`Error::Backend`] with a source.
    pub fn backend(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Backend {
            backend,
            message: message.into(),
            retryable: false,
            source: Some(source.into()),
        }
    }

    /// A lost-lease error for `key`.
    pub fn lease_lost(key: impl Into<String>, reason: LostReason) -> Self {
        Error::LeaseLost {
            key: key.into(),
            reason,
        }
    }

    /// The request timed out (the authority did not answer within `after`).
    pub fn request_timeout(backend: &'static str, operation: &str, after: Duration) -> Self {
        Error::Unavailable {
            backend,
            message: format!("{operation} got no answer within {after:?}"),
            source: None,
        }
    }
}

/// Errors are shared between a lease's renewal task and everyone waiting on [`crate::Lease::lost`].
pub type SharedError = Arc<Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_split_is_what_callers_rely_on() {
        let unavailable = Error::Unavailable {
            backend: "x",
            message: "down".into(),
            source: None,
        };
        assert!(unavailable.is_retryable());
        assert!(Error::Timeout {
            key: "k".into(),
            waited: Duration::from_secs(1)
        }
        .is_retryable());
        assert!(!Error::InvalidKey { reason: "r".into() }.is_retryable());
        assert!(!Error::lease_lost("k", LostReason::Refused).is_retryable());
        assert!(Error::lease_lost("k", LostReason::Refused).is_lease_lost());
        assert_eq!(unavailable.kind(), "unavailable");
    }

    #[test]
    fn source_is_kept() {
        use std::error::Error as _;
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = Error::unavailable("redis", "connect", io);
        assert!(e.source().is_some());
        assert!(e.to_string().contains("redis authority unavailable"));
    }
}

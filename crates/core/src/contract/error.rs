//! One error type for every authority, so callers can decide fail-open or fail-closed explicitly.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::contract::lost::LostReason;

/// A boxed error from a backend's client library, as [`Error::unavailable`] and
/// [`Error::backend`] take it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A backend's client library error kept as the `source` of an [`Error`]: shared, so that an
/// error cloned for every member of a failed batch, or for everyone waiting on
/// [`crate::Lease::lost`], keeps the same source.
pub type ArcError = Arc<dyn std::error::Error + Send + Sync + 'static>;

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
/// [`Error::is_retryable`] tells whether the same call may succeed later. A clone shares the
/// original's source ([`ArcError`]), so it shows, chains and downcasts the same.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Error {
    /// The lock key is empty, too long, or contains characters outside the allowed set.
    InvalidKey {
        /// What is wrong with the key.
        reason: String,
    },
    /// The TTL is zero, outside the backend's supported range, or not a multiple of its
    /// granularity. TTLs are never silently rounded.
    InvalidTtl {
        /// The TTL that was asked for.
        ttl: Duration,
        /// Why the backend cannot honour it.
        reason: String,
    },
    /// A connection URL could not be parsed or names an unknown scheme. The URL in the message
    /// has any password replaced by `***`.
    InvalidUrl {
        /// The URL, redacted.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration value (epoch, safety margin, table name, ...) is out of range.
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// `acquire` waited `max_wait` and the lock stayed held by someone else. The authority was
    /// reachable; this is contention, not an outage.
    Timeout {
        /// The contended key.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The lease is no longer ours: the authority refused a renewal, or its validity ran out.
    /// Stop starting protected side effects.
    LeaseLost {
        /// The key whose lease was lost.
        key: String,
        /// Why it was lost.
        reason: LostReason,
    },
    /// The lease is suspended: its last renewal's outcome is unknown (see
    /// [`crate::LeaseState::Suspended`]). Do not start a protected side effect now; renewal goes
    /// on, and the lease is held again or lost before its local deadline.
    LeaseSuspended {
        /// The key whose lease is suspended.
        key: String,
    },
    /// The authority could not be reached or did not answer in time. Nobody knows who holds the
    /// lock right now.
    Unavailable {
        /// Which backend.
        backend: &'static str,
        /// A short description of what failed.
        message: String,
        /// The client library's error, when there is one.
        source: Option<ArcError>,
    },
    /// The authority rejected the credentials (wrong password, unknown user, missing permission).
    Unauthorized {
        /// Which backend.
        backend: &'static str,
        /// What the server said, without secrets.
        message: String,
        /// The client library's error.
        source: Option<ArcError>,
    },
    /// The authority answered with an error that is none of the above (a missing table, a script
    /// error, a protocol violation).
    Backend {
        /// Which backend.
        backend: &'static str,
        /// What went wrong.
        message: String,
        /// Whether the same call may succeed later.
        retryable: bool,
        /// The client library's error.
        source: Option<ArcError>,
    },
    /// The backend cannot do this at all (for example a feature it was not built with, or a
    /// renewal with a different TTL on a backend whose TTL is fixed per session).
    Unsupported {
        /// Which backend.
        backend: &'static str,
        /// What was asked.
        operation: String,
    },
    /// A backend's fence does not fit the stored fence layout (see [`crate::Fence`]).
    FenceOutOfRange {
        /// Which backend.
        backend: &'static str,
        /// The backend's raw number.
        raw: u64,
    },
    /// The operating system's random number generator failed, so no owner token could be made.
    Entropy {
        /// The generator's error.
        source: ArcError,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidKey { reason } => write!(f, "invalid lock key: {reason}"),
            Error::InvalidTtl { ttl, reason } => write!(f, "invalid TTL {ttl:?}: {reason}"),
            Error::InvalidUrl { url, reason } => write!(f, "invalid URL `{url}`: {reason}"),
            Error::InvalidConfig { reason } => write!(f, "invalid configuration: {reason}"),
            Error::Timeout { key, waited } => write!(
                f,
                "lock `{key}` still held by another owner after waiting {waited:?}"
            ),
            Error::LeaseLost { key, reason } => write!(f, "lease on `{key}` lost: {reason}"),
            Error::LeaseSuspended { key } => write!(
                f,
                "lease on `{key}` suspended: the last renewal's outcome is unknown"
            ),
            Error::Unavailable {
                backend, message, ..
            } => write!(f, "{backend} authority unavailable: {message}"),
            Error::Unauthorized {
                backend, message, ..
            } => write!(f, "{backend} authority refused the credentials: {message}"),
            Error::Backend {
                backend, message, ..
            } => write!(f, "{backend} authority error: {message}"),
            Error::Unsupported { backend, operation } => {
                write!(f, "{operation} is not supported by the {backend} authority")
            }
            Error::FenceOutOfRange { backend, raw } => write!(
                f,
                "fence {raw} from the {backend} authority is outside 1..=2^48-1"
            ),
            Error::Entropy { .. } => {
                f.write_str("the operating system's random number generator failed")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let source = match self {
            Error::Unavailable { source, .. }
            | Error::Unauthorized { source, .. }
            | Error::Backend { source, .. } => source.as_ref()?,
            Error::Entropy { source } => source,
            _ => return None,
        };
        // The client library's error itself, not the `Arc` around it (which shows and chains
        // the same but is another type), so callers can downcast it to the client's type.
        Some(&**source)
    }
}

// Batches and lease waiters hand out clones of one error; a source that stopped being shareable
// would break them all.
const _: () = {
    const fn shareable<T: Clone + Send + Sync + 'static>() {}
    shareable::<Error>();
};

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
            source: Some(Arc::from(source.into())),
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
            source: Some(Arc::from(source.into())),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An error and its sources, as a log line shows them.
    fn chain(e: &Error) -> String {
        let mut out = e.to_string();
        let mut next = std::error::Error::source(e);
        while let Some(s) = next {
            out.push_str(&format!(" <- {s}"));
            next = s.source();
        }
        out
    }

    /// A client library's error with a source of its own, as a connection error has.
    #[derive(Debug)]
    struct Client(std::io::Error);

    impl std::fmt::Display for Client {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("connection closed")
        }
    }

    impl std::error::Error for Client {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn clones_keep_the_variant_message_and_chain() -> std::result::Result<(), String> {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let original = Error::unavailable("x", "no answer", Client(io));
        let expected = "x authority unavailable: no answer <- connection closed <- reset by peer";
        if chain(&original) != expected {
            return Err(format!("the original shows `{}`", chain(&original)));
        }
        for copy in vec![original.clone(); 3] {
            if !matches!(copy, Error::Unavailable { .. }) || !copy.is_retryable() {
                return Err(format!("a clone changed variant: {copy:?}"));
            }
            if chain(&copy) != expected {
                return Err(format!("a clone shows `{}`", chain(&copy)));
            }
            if format!("{copy:?}") != format!("{original:?}") {
                return Err(format!("a clone debugs as {copy:?}, not {original:?}"));
            }
        }
        let lost = Error::lease_lost("k", LostReason::Refused);
        if !lost.clone().is_lease_lost() {
            return Err("a clone of a lost lease is not lease-lost".into());
        }
        Ok(())
    }

    #[test]
    fn the_source_of_a_clone_downcasts_to_the_client_error() -> std::result::Result<(), String> {
        use std::error::Error as _;
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let original = Error::backend("etcd", "lease revoke", io);
        for e in [original.clone(), original] {
            // Through `source()`, as a caller walking the chain sees it.
            let kind = e
                .source()
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .map(std::io::Error::kind)
                .ok_or_else(|| format!("source() of {e:?} is no io::Error"))?;
            if kind != std::io::ErrorKind::ConnectionRefused {
                return Err(format!(
                    "source() downcasts to an io::Error of kind {kind:?}"
                ));
            }
            // Through the field, as a backend looking for its client's error sees it.
            let Error::Backend { source, .. } = &e else {
                return Err(format!("not a backend error: {e:?}"));
            };
            if source
                .as_deref()
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .is_none()
            {
                return Err(format!("the source field of {e:?} is no io::Error"));
            }
        }
        Ok(())
    }

    #[test]
    fn every_variant_shows_its_message() -> std::result::Result<(), String> {
        let unavailable = Error::Unavailable {
            backend: "redis",
            message: "connect".into(),
            source: None,
        };
        let cases = [
            (
                Error::InvalidKey {
                    reason: "empty".into(),
                },
                "invalid lock key: empty",
            ),
            (
                Error::InvalidTtl {
                    ttl: Duration::from_millis(1500),
                    reason: "whole seconds only".into(),
                },
                "invalid TTL 1.5s: whole seconds only",
            ),
            (
                Error::InvalidUrl {
                    url: "redis://:***@h".into(),
                    reason: "no port".into(),
                },
                "invalid URL `redis://:***@h`: no port",
            ),
            (
                Error::InvalidConfig {
                    reason: "epoch 0".into(),
                },
                "invalid configuration: epoch 0",
            ),
            (
                Error::Timeout {
                    key: "k".into(),
                    waited: Duration::from_secs(2),
                },
                "lock `k` still held by another owner after waiting 2s",
            ),
            (
                Error::lease_lost("k", LostReason::RenewalFailed(Arc::new(unavailable))),
                "lease on `k` lost: renewal failed: redis authority unavailable: connect",
            ),
            (
                Error::LeaseSuspended { key: "k".into() },
                "lease on `k` suspended: the last renewal's outcome is unknown",
            ),
            (
                Error::Unauthorized {
                    backend: "postgres",
                    message: "password authentication failed".into(),
                    source: None,
                },
                "postgres authority refused the credentials: password authentication failed",
            ),
            (
                Error::Backend {
                    backend: "etcd",
                    message: "no leader".into(),
                    retryable: true,
                    source: None,
                },
                "etcd authority error: no leader",
            ),
            (
                Error::Unsupported {
                    backend: "zookeeper",
                    operation: "renewal with another TTL".into(),
                },
                "renewal with another TTL is not supported by the zookeeper authority",
            ),
            (
                Error::FenceOutOfRange {
                    backend: "redis",
                    raw: 1 << 48,
                },
                "fence 281474976710656 from the redis authority is outside 1..=2^48-1",
            ),
            (
                Error::Entropy {
                    source: Arc::from(BoxError::from("getrandom failed")),
                },
                "the operating system's random number generator failed",
            ),
        ];
        for (error, expected) in cases {
            let shown = error.to_string();
            if shown != expected {
                return Err(format!(
                    "{} shows `{shown}`, not `{expected}`",
                    error.kind()
                ));
            }
        }
        Ok(())
    }

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

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

/// One error's source, shared by the copies [`Error::into_copies`] makes: it shows and chains
/// exactly as the original did.
#[derive(Debug, Clone)]
struct SharedSource(Arc<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for SharedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedSource {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl Error {
    /// `n` copies of this error (the same variant, message and source chain), for a batch whose
    /// every member failed the same way ([`crate::Authority::renew_many`]).
    pub fn into_copies(self, n: usize) -> Vec<Error> {
        let share = |source: Option<BoxError>| -> Option<SharedSource> {
            source.map(|b| SharedSource(Arc::from(b)))
        };
        let boxed = |s: &Option<SharedSource>| -> Option<BoxError> {
            s.clone().map(|s| Box::new(s) as BoxError)
        };
        match self {
            Error::Unavailable {
                backend,
                message,
                source,
            } => {
                let source = share(source);
                (0..n)
                    .map(|_| Error::Unavailable {
                        backend,
                        message: message.clone(),
                        source: boxed(&source),
                    })
                    .collect()
            }
            Error::Unauthorized {
                backend,
                message,
                source,
            } => {
                let source = share(source);
                (0..n)
                    .map(|_| Error::Unauthorized {
                        backend,
                        message: message.clone(),
                        source: boxed(&source),
                    })
                    .collect()
            }
            Error::Backend {
                backend,
                message,
                retryable,
                source,
            } => {
                let source = share(source);
                (0..n)
                    .map(|_| Error::Backend {
                        backend,
                        message: message.clone(),
                        retryable,
                        source: boxed(&source),
                    })
                    .collect()
            }
            Error::Entropy { source } => {
                let source = share(Some(source));
                (0..n)
                    .map(|_| Error::Entropy {
                        source: boxed(&source).unwrap_or_else(|| "entropy".into()),
                    })
                    .collect()
            }
            Error::InvalidKey { reason } => (0..n)
                .map(|_| Error::InvalidKey {
                    reason: reason.clone(),
                })
                .collect(),
            Error::InvalidTtl { ttl, reason } => (0..n)
                .map(|_| Error::InvalidTtl {
                    ttl,
                    reason: reason.clone(),
                })
                .collect(),
            Error::InvalidUrl { url, reason } => (0..n)
                .map(|_| Error::InvalidUrl {
                    url: url.clone(),
                    reason: reason.clone(),
                })
                .collect(),
            Error::InvalidConfig { reason } => (0..n)
                .map(|_| Error::InvalidConfig {
                    reason: reason.clone(),
                })
                .collect(),
            Error::Timeout { key, waited } => (0..n)
                .map(|_| Error::Timeout {
                    key: key.clone(),
                    waited,
                })
                .collect(),
            Error::LeaseLost { key, reason } => (0..n)
                .map(|_| Error::LeaseLost {
                    key: key.clone(),
                    reason: reason.clone(),
                })
                .collect(),
            Error::LeaseSuspended { key } => (0..n)
                .map(|_| Error::LeaseSuspended { key: key.clone() })
                .collect(),
            Error::Unsupported { backend, operation } => (0..n)
                .map(|_| Error::Unsupported {
                    backend,
                    operation: operation.clone(),
                })
                .collect(),
            Error::FenceOutOfRange { backend, raw } => (0..n)
                .map(|_| Error::FenceOutOfRange { backend, raw })
                .collect(),
        }
    }

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
    fn copies_keep_the_variant_message_and_chain() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let original = Error::Unavailable {
            backend: "x",
            message: "no answer".into(),
            source: Some(Box::new(io)),
        };
        let chain = |e: &Error| {
            let mut out = e.to_string();
            let mut next = std::error::Error::source(e);
            while let Some(s) = next {
                out.push_str(&format!(" <- {s}"));
                next = s.source();
            }
            out
        };
        let expected = chain(&original);
        let copies = original.into_copies(3);
        assert_eq!(copies.len(), 3);
        for copy in &copies {
            assert!(matches!(copy, Error::Unavailable { .. }));
            assert!(copy.is_retryable());
            assert_eq!(chain(copy), expected);
        }
        assert_eq!(
            expected,
            "x authority unavailable: no answer <- reset by peer"
        );
        assert!(Error::lease_lost("k", LostReason::Refused)
            .into_copies(2)
            .iter()
            .all(Error::is_lease_lost));
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
                    source: BoxError::from("getrandom failed"),
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

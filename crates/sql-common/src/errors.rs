//! From the driver's errors to leasehold's, keeping "unreachable" apart from "refused": the
//! part every SQL backend shares; which server error is which is each backend's.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::backend::redact_url;
use leasehold_core::Error;
use sqlx::error::DatabaseError;

use crate::SqlDialect;

/// What an error the server answered with means to a caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerErrorKind {
    /// Bad credentials or missing privileges: `Unauthorized`.
    Unauthorized,
    /// The server is not serving us now (going away, out of resources, read-only):
    /// `Unavailable`, which is retryable; another server (the new primary) may serve.
    Unavailable,
    /// Rolled back for a conflict: changed nothing, and may be sent again.
    Retryable,
    /// Refused for good (a missing table, a statement the server rejects).
    Refused,
}

/// What the server's error says, as a backend reads it: its kind and the message to show.
pub type ServerError = (ServerErrorKind, String);

/// Maps a driver error met while doing `what`: an error the server answered with as `server`
/// classifies it, and the driver's own (no connection, a broken one, a bad configuration) the
/// same way for every backend.
pub fn map_error<D: SqlDialect>(
    error: sqlx::Error,
    what: &str,
    server: impl FnOnce(&dyn DatabaseError) -> ServerError,
) -> Error {
    let backend = D::BACKEND;
    if let Some(db) = error.as_database_error() {
        let (kind, message) = server(db);
        let source: Option<Arc<dyn std::error::Error + Send + Sync>> = Some(Arc::new(error));
        return match kind {
            ServerErrorKind::Unauthorized => Error::Unauthorized {
                backend,
                message,
                source,
            },
            ServerErrorKind::Unavailable => Error::Unavailable {
                backend,
                message,
                source,
            },
            ServerErrorKind::Retryable => Error::Backend {
                backend,
                message,
                retryable: true,
                source,
            },
            ServerErrorKind::Refused => Error::Backend {
                backend,
                message,
                retryable: false,
                source,
            },
        };
    }
    let message = redact_url(&format!("{what}: {error}"));
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => Error::Unavailable {
            backend,
            message,
            source: Some(Arc::new(error)),
        },
        sqlx::Error::Configuration(_) => Error::InvalidConfig { reason: message },
        _ => Error::Backend {
            backend,
            message,
            retryable: false,
            source: Some(Arc::new(error)),
        },
    }
}

/// The request got no answer within the timeout.
pub fn timed_out<D: SqlDialect>(what: &str, after: Duration) -> Error {
    Error::request_timeout(D::BACKEND, what, after)
}

/// A statement given up without its answer: its connection is closed, which is an outage as
/// the caller sees it (retryable).
pub fn unanswered(why: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, why))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The driver's own errors mean the same for every backend.
    #[test]
    fn the_drivers_errors_are_unavailable_or_refused() {
        let never = |_: &dyn DatabaseError| -> ServerError { unreachable!("no server error") };
        let cut = unanswered("no answer in time");
        let mapped = map_error::<Any>(cut, "acquire", never);
        assert!(
            matches!(mapped, Error::Unavailable { backend: "any", .. }) && mapped.is_retryable(),
            "{mapped:?}"
        );
        let mapped = map_error::<Any>(sqlx::Error::PoolTimedOut, "acquire", never);
        assert!(matches!(mapped, Error::Unavailable { .. }), "{mapped:?}");
        let bad = sqlx::Error::Configuration("postgres://u:s3cret@h".into());
        let mapped = map_error::<Any>(bad, "connect", never);
        assert!(matches!(mapped, Error::InvalidConfig { .. }), "{mapped:?}");
        assert!(!mapped.to_string().contains("s3cret"), "{mapped}");
        let mapped = map_error::<Any>(sqlx::Error::RowNotFound, "inspect", never);
        assert!(
            matches!(
                mapped,
                Error::Backend {
                    retryable: false,
                    ..
                }
            ),
            "{mapped:?}"
        );
        let timeout = timed_out::<Any>("renew", Duration::from_secs(1));
        assert!(matches!(timeout, Error::Unavailable { .. }), "{timeout:?}");
    }

    /// A connection that broke is closed; one that answered a statement's failure is kept.
    #[test]
    fn a_broken_connection_is_discarded() {
        assert!(Any::discards_connection(&unanswered("silent")));
        assert!(Any::discards_connection(&sqlx::Error::Protocol("x".into())));
        assert!(!Any::discards_connection(&sqlx::Error::RowNotFound));
        assert!(!Any::discards_connection(&sqlx::Error::PoolTimedOut));
    }

    struct Any;

    impl SqlDialect for Any {
        type Connection = sqlx::PgConnection;
        type Database = sqlx::Postgres;
        const BACKEND: &'static str = "any";
        const SERVER: &'static str = "Any";
        const SCHEMES: &'static [&'static str] = &["any"];
        const DRIVER_SCHEME: Option<&'static str> = None;
        const DRIVER_PARAMS: &'static [&'static str] = &[];

        fn with_password(
            options: sqlx::postgres::PgConnectOptions,
            password: &str,
        ) -> sqlx::postgres::PgConnectOptions {
            options.password(password)
        }

        fn is_conflict(_: &sqlx::Error) -> bool {
            false
        }

        fn server_discards_connection(_: &dyn DatabaseError) -> bool {
            true
        }
    }
}

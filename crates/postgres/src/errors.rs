//! From the driver's errors to leasehold's, keeping "unreachable" apart from "refused".

use std::time::Duration;

use leasehold_core::{redact_url, Error};

use crate::table::TableName;

pub(crate) const BACKEND: &str = "postgres";

/// Maps a driver error met while doing `what`.
pub(crate) fn map(error: sqlx::Error, what: &str, table: &TableName) -> Error {
    if let Some(db) = error.as_database_error() {
        let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
        let message = format!("{what}: {} (SQLSTATE {code})", db.message());
        return match code.as_str() {
            // invalid_authorization_specification, invalid_password
            "28000" | "28P01" => Error::Unauthorized {
                backend: BACKEND,
                message,
                source: Some(Box::new(error)),
            },
            // undefined_table
            "42P01" => Error::Backend {
                backend: BACKEND,
                message: format!(
                    "{what}: the lease table {} does not exist; run migrate() or apply the SQL in docs/postgres.md",
                    table.plain()
                ),
                retryable: false,
                source: Some(Box::new(error)),
            },
            // insufficient_privilege
            "42501" => Error::Unauthorized {
                backend: BACKEND,
                message,
                source: Some(Box::new(error)),
            },
            // connection exceptions, operator intervention (shutdown, crash recovery, cannot
            // connect now), insufficient resources: the server is not serving us right now.
            c if c.starts_with("08") || c.starts_with("57") || c.starts_with("53") => {
                Error::Unavailable {
                    backend: BACKEND,
                    message,
                    source: Some(Box::new(error)),
                }
            }
            // serialization failure, deadlock, lock not available: try again.
            "40001" | "40P01" | "55P03" => Error::Backend {
                backend: BACKEND,
                message,
                retryable: true,
                source: Some(Box::new(error)),
            },
            _ => Error::Backend {
                backend: BACKEND,
                message,
                retryable: false,
                source: Some(Box::new(error)),
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
            backend: BACKEND,
            message,
            source: Some(Box::new(error)),
        },
        sqlx::Error::Configuration(_) => Error::InvalidConfig { reason: message },
        _ => Error::Backend {
            backend: BACKEND,
            message,
            retryable: false,
            source: Some(Box::new(error)),
        },
    }
}

/// The request got no answer within the timeout.
pub(crate) fn timed_out(what: &str, after: Duration) -> Error {
    Error::request_timeout(BACKEND, what, after)
}

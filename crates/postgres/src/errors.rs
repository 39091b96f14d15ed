//! From the driver's errors to leasehold's, keeping "unreachable" apart from "refused".

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::Error;

use crate::table::TableName;
use leasehold_core::backend::redact_url;

pub(crate) const BACKEND: &str = "postgres";

/// SQLSTATE read_only_sql_transaction.
const READ_ONLY: &str = "25006";

/// The SQLSTATE of a driver error from the server, if it is one.
pub(crate) fn sqlstate(error: &sqlx::Error) -> Option<String> {
    error
        .as_database_error()
        .and_then(|db| db.code().map(|c| c.into_owned()))
}

/// A transaction the server rolled back for a conflict with a concurrent one (serialization
/// failure, deadlock): it changed nothing, and the same statement again gets a fresh snapshot.
/// Happens when `repeatable read` or `serializable` is the database's or role's default.
pub(crate) fn is_conflict(error: &sqlx::Error) -> bool {
    matches!(sqlstate(error).as_deref(), Some("40001" | "40P01"))
}

/// An error after which this connection should not be reused: it is broken, or it reaches a
/// server that no longer takes writes (a demoted primary; a new connection may reach the new
/// one).
pub(crate) fn discards_connection(error: &sqlx::Error) -> bool {
    match sqlstate(error) {
        Some(code) => code == READ_ONLY || code.starts_with("08") || code.starts_with("57"),
        None => matches!(
            error,
            sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_)
        ),
    }
}

/// SQLSTATE undefined_column.
const UNDEFINED_COLUMN: &str = "42703";

/// A statement named a column the table lacks: a table an older version created.
pub(crate) fn is_undefined_column(error: &sqlx::Error) -> bool {
    sqlstate(error).as_deref() == Some(UNDEFINED_COLUMN)
}

/// Maps a driver error met while running a statement on the lease table `table`: as [`map`],
/// and a missing column (a table created by an older version, whose columns `migrate` adds)
/// says to run migrate, instead of only naming the column. Only for the lease table: in a
/// guarded write's table, a missing column is the caller's own.
pub(crate) fn map_lease(error: sqlx::Error, what: &str, table: &TableName) -> Error {
    match sqlstate(&error).as_deref() {
        Some(UNDEFINED_COLUMN) => {
            let detail = error
                .as_database_error()
                .map(|db| db.message().to_string())
                .unwrap_or_default();
            Error::Backend {
                backend: BACKEND,
                message: format!(
                    "{what}: the lease table {} lacks a column of this version ({detail}); it was created by an older version: run migrate() again or apply the SQL in docs/postgres.md",
                    table.plain()
                ),
                retryable: false,
                source: Some(Arc::new(error)),
            }
        }
        _ => map(error, what, table),
    }
}

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
                source: Some(Arc::new(error)),
            },
            // invalid_sql_statement_name, duplicate_prepared_statement: a statement prepared
            // under a name on this connection is missing at the server, or another client's is
            // there under the same name. A transaction-pooling proxy does that to named
            // statements, which the authority only prepares when not told about one.
            "26000" | "42P05" => Error::Backend {
                backend: BACKEND,
                message: format!(
                    "{message}: a transaction-pooling proxy (such as PgBouncer with pool_mode = transaction) seems to be between this client and PostgreSQL; declare it with pooler=transaction in the URL (see docs/postgres.md)"
                ),
                retryable: false,
                source: Some(Arc::new(error)),
            },
            // undefined_table
            "42P01" => Error::Backend {
                backend: BACKEND,
                message: format!(
                    "{what}: the lease table {} does not exist; run migrate() or apply the SQL in docs/postgres.md",
                    table.plain()
                ),
                retryable: false,
                source: Some(Arc::new(error)),
            },
            // insufficient_privilege
            "42501" => Error::Unauthorized {
                backend: BACKEND,
                message,
                source: Some(Arc::new(error)),
            },
            // connection exceptions, operator intervention (shutdown, crash recovery, cannot
            // connect now), insufficient resources: the server is not serving us right now.
            // read_only_sql_transaction: a primary demoted to a standby (or a server put in
            // read-only mode) does not take writes now; another (the new primary) may, as with
            // Redis's READONLY.
            c if c.starts_with("08")
                || c.starts_with("57")
                || c.starts_with("53")
                || c == READ_ONLY =>
            {
                Error::Unavailable {
                    backend: BACKEND,
                    message,
                    source: Some(Arc::new(error)),
                }
            }
            // serialization failure, deadlock, lock not available: try again.
            "40001" | "40P01" | "55P03" => Error::Backend {
                backend: BACKEND,
                message,
                retryable: true,
                source: Some(Arc::new(error)),
            },
            _ => Error::Backend {
                backend: BACKEND,
                message,
                retryable: false,
                source: Some(Arc::new(error)),
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
            source: Some(Arc::new(error)),
        },
        sqlx::Error::Configuration(_) => Error::InvalidConfig { reason: message },
        _ => Error::Backend {
            backend: BACKEND,
            message,
            retryable: false,
            source: Some(Arc::new(error)),
        },
    }
}

/// The request got no answer within the timeout.
pub(crate) fn timed_out(what: &str, after: Duration) -> Error {
    Error::request_timeout(BACKEND, what, after)
}

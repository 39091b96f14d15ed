//! Which of the server's errors mean what: PostgreSQL's SQLSTATEs, for the mapping every SQL
//! backend shares ([`leasehold_sql_common::map_error`]).

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::Error;
use leasehold_sql_common::{map_error, ServerErrorKind, SqlDialect};
use sqlx::error::DatabaseError;

use crate::dialect::Postgres;
use crate::table::TableName;

pub(crate) const BACKEND: &str = <Postgres as SqlDialect>::BACKEND;

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

/// A server error after which its connection should not be reused: the connection is going
/// away (connection exception, operator intervention), or it reaches a server that no longer
/// takes writes (a demoted primary; a new connection may reach the new one).
pub(crate) fn server_discards_connection(error: &dyn DatabaseError) -> bool {
    error
        .code()
        .is_some_and(|code| code == READ_ONLY || code.starts_with("08") || code.starts_with("57"))
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
    map_error::<Postgres>(error, what, |db| {
        let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
        let message = format!("{what}: {} (SQLSTATE {code})", db.message());
        match code.as_str() {
            // invalid_authorization_specification, invalid_password
            "28000" | "28P01" => (ServerErrorKind::Unauthorized, message),
            // invalid_sql_statement_name, duplicate_prepared_statement: a statement prepared
            // under a name on this connection is missing at the server, or another client's is
            // there under the same name. A transaction-pooling proxy does that to named
            // statements, which the authority only prepares when not told about one.
            "26000" | "42P05" => (
                ServerErrorKind::Refused,
                format!(
                    "{message}: a transaction-pooling proxy (such as PgBouncer with pool_mode = transaction) seems to be between this client and PostgreSQL; declare it with pooler=transaction in the URL (see docs/postgres.md)"
                ),
            ),
            // undefined_table
            "42P01" => (
                ServerErrorKind::Refused,
                format!(
                    "{what}: the lease table {} does not exist; run migrate() or apply the SQL in docs/postgres.md",
                    table.plain()
                ),
            ),
            // insufficient_privilege
            "42501" => (ServerErrorKind::Unauthorized, message),
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
                (ServerErrorKind::Unavailable, message)
            }
            // serialization failure, deadlock, lock not available: try again.
            "40001" | "40P01" | "55P03" => (ServerErrorKind::Retryable, message),
            _ => (ServerErrorKind::Refused, message),
        }
    })
}

/// The request got no answer within the timeout.
pub(crate) fn timed_out(what: &str, after: Duration) -> Error {
    leasehold_sql_common::timed_out::<Postgres>(what, after)
}

//! From the driver's errors to leasehold's, keeping "unreachable" apart from "refused".

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::backend::redact_url;
use leasehold_core::Error;

use crate::table::TableName;

pub(crate) const BACKEND: &str = "mysql";

/// The server's error number of a driver error from the server, if it is one.
fn number(error: &sqlx::Error) -> Option<u16> {
    error
        .as_database_error()
        .and_then(|db| db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .map(|db| db.number())
}

/// ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT: the statement was rolled back for a conflict with a
/// concurrent transaction (a caller's own transaction on the lease table); it changed nothing
/// and may be run again.
pub(crate) fn is_conflict(error: &sqlx::Error) -> bool {
    matches!(number(error), Some(1213 | 1205))
}

/// The server does not take writes: started `--read-only` (ER_OPTION_PREVENTS_STATEMENT), a
/// read-only transaction, or read-only mode: a replica, or a primary demoted by a failover.
fn is_read_only(n: u16) -> bool {
    matches!(n, 1290 | 1792 | 1836)
}

/// The server is going away or refuses connections now: too many connections, shutdown in
/// progress, connection killed, net read/write errors and timeouts, server has gone away, lost
/// connection.
fn is_outage(n: u16) -> bool {
    matches!(
        n,
        1040 | 1053
            | 1077
            | 1152
            | 1153
            | 1154
            | 1155
            | 1156
            | 1157
            | 1158
            | 1159
            | 1160
            | 1161
            | 1927
            | 2002
            | 2003
            | 2006
            | 2013
            | 4031
    )
}

/// An error after which this connection should not be reused: it is broken, or it reaches a
/// server that takes no writes (a new connection may reach the new primary).
pub(crate) fn discards_connection(error: &sqlx::Error) -> bool {
    match number(error) {
        Some(n) => is_read_only(n) || is_outage(n),
        None => matches!(
            error,
            sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_)
        ),
    }
}

/// Maps a driver error met while doing `what` on the lease table `table`.
pub(crate) fn map(error: sqlx::Error, what: &str, table: &TableName) -> Error {
    if let Some(n) = number(&error) {
        let db_message = error
            .as_database_error()
            .map(|db| db.message().to_string())
            .unwrap_or_default();
        let message = redact_url(&format!("{what}: {db_message} (error {n})"));
        let source: Option<Arc<dyn std::error::Error + Send + Sync>> = Some(Arc::new(error));
        return match n {
            // access denied (user, database, table, command)
            1044 | 1045 | 1142 | 1143 | 1227 | 1698 => Error::Unauthorized {
                backend: BACKEND,
                message,
                source,
            },
            // no such table
            1146 => Error::Backend {
                backend: BACKEND,
                message: format!(
                    "{what}: the lease table {} does not exist; run migrate() or apply the SQL in docs/mysql.md",
                    table.plain()
                ),
                retryable: false,
                source,
            },
            n if is_read_only(n) || is_outage(n) => Error::Unavailable {
                backend: BACKEND,
                message,
                source,
            },
            1213 | 1205 => Error::Backend {
                backend: BACKEND,
                message,
                retryable: true,
                source,
            },
            _ => Error::Backend {
                backend: BACKEND,
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

/// A statement given up without its answer: its connection is closed, which is an outage as
/// the caller sees it (retryable).
pub(crate) fn unanswered(why: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, why))
}

//! Which of the server's errors mean what: MySQL's error numbers, for the mapping every SQL
//! backend shares ([`leasehold_sql_common::map_error`]).

use std::time::Duration;

use leasehold_core::backend::redact_url;
use leasehold_core::Error;
use leasehold_sql_common::{map_error, ServerErrorKind};
use sqlx::error::DatabaseError;

use crate::dialect::Mysql;
use crate::table::TableName;

pub(crate) const BACKEND: &str = <Mysql as leasehold_sql_common::SqlDialect>::BACKEND;

/// The server's error number of an error from the server.
fn number(error: &dyn DatabaseError) -> Option<u16> {
    error
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|db| db.number())
}

/// ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT: the statement was rolled back for a conflict with a
/// concurrent transaction (a caller's own transaction on the lease table); it changed nothing
/// and may be run again.
pub(crate) fn is_conflict(error: &sqlx::Error) -> bool {
    matches!(
        error.as_database_error().and_then(number),
        Some(1213 | 1205)
    )
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

/// A server error after which its connection should not be reused: it is going away, or it
/// reaches a server that takes no writes (a new connection may reach the new primary).
pub(crate) fn server_discards_connection(error: &dyn DatabaseError) -> bool {
    number(error).is_some_and(|n| is_read_only(n) || is_outage(n))
}

/// Maps a driver error met while doing `what` on the lease table `table`.
pub(crate) fn map(error: sqlx::Error, what: &str, table: &TableName) -> Error {
    map_error::<Mysql>(error, what, |db| {
        let n = number(db).unwrap_or_default();
        let message = redact_url(&format!("{what}: {} (error {n})", db.message()));
        match n {
            // access denied (user, database, table, command)
            1044 | 1045 | 1142 | 1143 | 1227 | 1698 => (ServerErrorKind::Unauthorized, message),
            // no such table
            1146 => (
                ServerErrorKind::Refused,
                format!(
                    "{what}: the lease table {} does not exist; run migrate() or apply the SQL in docs/mysql.md",
                    table.plain()
                ),
            ),
            n if is_read_only(n) || is_outage(n) => (ServerErrorKind::Unavailable, message),
            1213 | 1205 => (ServerErrorKind::Retryable, message),
            _ => (ServerErrorKind::Refused, message),
        }
    })
}

/// The request got no answer within the timeout.
pub(crate) fn timed_out(what: &str, after: Duration) -> Error {
    leasehold_sql_common::timed_out::<Mysql>(what, after)
}

//! From SQLite's errors to leasehold's, keeping "busy" (someone holds the file's write lock)
//! apart from "broken".

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::Error;

pub(crate) const BACKEND: &str = "sqlite";

/// SQLite's primary result code of a driver error (the extended code's low byte).
pub(crate) fn primary_code(error: &sqlx::Error) -> Option<i64> {
    let db = error.as_database_error()?;
    let code: i64 = db.code()?.parse().ok()?;
    Some(code & 0xff)
}

const SQLITE_PERM: i64 = 3;
const SQLITE_BUSY: i64 = 5;
const SQLITE_LOCKED: i64 = 6;
const SQLITE_NOMEM: i64 = 7;
const SQLITE_READONLY: i64 = 8;
const SQLITE_IOERR: i64 = 10;
const SQLITE_FULL: i64 = 13;
const SQLITE_CANTOPEN: i64 = 14;
const SQLITE_PROTOCOL: i64 = 15;

/// Another connection held the database's write lock for the whole busy timeout: a hung or
/// slow writer, not a refusal. Nothing was changed.
pub(crate) fn is_busy(error: &sqlx::Error) -> bool {
    matches!(
        primary_code(error),
        Some(SQLITE_BUSY | SQLITE_LOCKED | SQLITE_PROTOCOL)
    )
}

/// SQLite reports a missing column only in its message (under the generic SQLITE_ERROR):
/// "no such column" where a statement reads or matches it, "has no column named" where an
/// `INSERT` names it.
fn is_missing_column(error: &sqlx::Error) -> bool {
    error.as_database_error().is_some_and(|db| {
        let message = db.message();
        message.starts_with("no such column") || message.contains("has no column named")
    })
}

/// Maps a driver error met while doing `what` on the database at `path`.
pub(crate) fn map(error: sqlx::Error, what: &str, path: &str) -> Error {
    if let Some(code) = primary_code(&error) {
        let message = match error.as_database_error() {
            Some(db) => format!("{what} on {path}: {} (SQLite code {code})", db.message()),
            None => format!("{what} on {path}: {error}"),
        };
        return match code {
            // The file answered: another connection is writing (perhaps taking this very key),
            // which is contention, not an authority nobody can reach.
            SQLITE_BUSY | SQLITE_LOCKED | SQLITE_PROTOCOL => Error::Backend {
                backend: BACKEND,
                message: format!("{message}: another connection kept the database's write lock"),
                retryable: true,
                source: Some(Arc::new(error)),
            },
            SQLITE_IOERR | SQLITE_NOMEM => Error::Unavailable {
                backend: BACKEND,
                message,
                source: Some(Arc::new(error)),
            },
            SQLITE_FULL => Error::Backend {
                backend: BACKEND,
                message: format!("{message}: the disk is full"),
                retryable: true,
                source: Some(Arc::new(error)),
            },
            // This process may read the file but not write it (file or directory mode, a
            // read-only mount): a permission, as a server's refused grant is.
            SQLITE_PERM | SQLITE_READONLY => Error::Unauthorized {
                backend: BACKEND,
                message: format!(
                    "{message}: the database is read-only to this process; it needs write access to the file and its directory"
                ),
                source: Some(Arc::new(error)),
            },
            SQLITE_CANTOPEN => Error::Backend {
                backend: BACKEND,
                message: format!("{message}: check the file's and its directory's permissions"),
                retryable: false,
                source: Some(Arc::new(error)),
            },
            // The lease table lacks a column of this version: another program made (or
            // remade) it after this client opened the file, which is when columns are added.
            _ if is_missing_column(&error) => Error::Backend {
                backend: BACKEND,
                message: format!(
                    "{message}: the lease table was created by an older version; connect again (opening the database adds the missing columns, keeping the rows)"
                ),
                retryable: false,
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
    let message = format!("{what} on {path}: {error}");
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Error::Unavailable {
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

//! # leasehold-gate-sql
//!
//! The resource side of a lease, for rows of a SQL database: a **gate** that refuses writes
//! carrying a fence older than one the row has already seen, atomically with the write.
//!
//! A lease decides who may *try* to change a row; it cannot stop a holder that paused past its
//! lease from writing late. The row can: it keeps the greatest fence that has written to it, in
//! a fence column (`last_fence bigint NOT NULL DEFAULT 0` by default), and the gate's
//! [`SqlGate::claim`] raises that column to the caller's fence, inside the caller's own
//! transaction, as the first statement:
//!
//! * the row is locked until the transaction ends, so an older holder's claim waits, then sees
//!   the greater fence and is refused ([`Claimed::Stale`]);
//! * the caller's own statements that follow in the same transaction are then the only writes
//!   to the row under a fence that is not stale, and they commit or roll back with the claim.
//!
//! The answer tells a stale fence from a missing row ([`Claimed::Missing`]); whether the
//! caller's own precondition held (`WHERE state = 'open'`) is what its own `UPDATE` answers.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn pay(pool: &sqlx::PgPool, fence: leasehold_core::Fence) -> leasehold_core::Result<()> {
//! use leasehold_gate_sql::{Claimed, SqlGate};
//!
//! let invoices = SqlGate::new("invoices", "id")?;
//! let mut tx = pool.begin().await.map_err(leasehold_gate_sql::map_error)?;
//! match invoices.claim(&mut tx, "inv_72", fence).await? {
//!     Claimed::Claimed => {
//!         sqlx::query("UPDATE invoices SET state = 'paid' WHERE id = $1 AND state = 'open'")
//!             .bind("inv_72")
//!             .execute(&mut *tx)
//!             .await
//!             .map_err(leasehold_gate_sql::map_error)?;
//!         tx.commit().await.map_err(leasehold_gate_sql::map_error)?;
//!     }
//!     Claimed::Stale { newest } => { /* a newer holder (fence {newest}) got there: abandon */ }
//!     Claimed::Missing => { /* no such invoice */ }
//! }
//! # Ok(()) }
//! ```
//!
//! One statement per database, behind a feature each:
//!
//! | feature | claim |
//! |---|---|
//! | `postgres` | `UPDATE ... SET fence = $2 WHERE key = $1 AND fence <= $2 RETURNING fence` |
//! | `sqlite` | the same with `?1`, `?2` (SQLite 3.35 or later); begin the transaction with `BEGIN IMMEDIATE` (`pool.begin_with("BEGIN IMMEDIATE")`), which takes the file's write lock at once, so that a concurrent writer's commit cannot leave it with a stale snapshot |
//! | `mysql` | `SELECT fence ... FOR UPDATE`, compared, then `UPDATE` under that row lock (MySQL and MariaDB have no `UPDATE ... RETURNING`) |
//!
//! [`SqlRegister`] is the smallest fenced resource on top (a row with a value), which the
//! resource suite in `leasehold-conformance` runs against each database.
#![deny(missing_docs)]
// Without a database feature the gate's types exist but nothing runs them.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]

use std::fmt;

use async_trait::async_trait;
use leasehold_core::{telemetry, Error, Fence, Result};

// Without a database there is no register to build.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod register;

// Without a database there is no register to build.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use register::SqlRegister;

/// The fence column unless [`SqlGate::with_fence_column`] names another.
pub const DEFAULT_FENCE_COLUMN: &str = "last_fence";

/// What a claim found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claimed {
    /// The row's fence is now the caller's, and the row is locked until the transaction ends.
    Claimed,
    /// The row has seen a greater fence: the caller's lease is stale; abandon the work.
    Stale {
        /// The row's fence.
        newest: u64,
    },
    /// No row has that key.
    Missing,
}

/// An identifier checked once: 1-63 ASCII letters, digits or `_`, not starting with a digit,
/// optionally `schema.name`. Stricter than any of the databases, so that quoting it needs no
/// escaping and no input can become SQL.
#[derive(Clone, PartialEq, Eq)]
struct Ident(Vec<String>);

impl Ident {
    fn new(name: &str, what: &str, parts: usize) -> Result<Ident> {
        let split: Vec<&str> = name.split('.').collect();
        let valid = |p: &&str| {
            !p.is_empty()
                && p.len() <= 63
                && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !p.as_bytes()[0].is_ascii_digit()
        };
        if split.len() > parts || !split.iter().all(valid) {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "`{name}` is not a valid {what} name: 1-63 ASCII letters, digits or _, not \
                     starting with a digit{}",
                    if parts > 1 {
                        ", optionally schema.name"
                    } else {
                        ""
                    }
                ),
            });
        }
        Ok(Ident(split.into_iter().map(str::to_string).collect()))
    }

    /// Quoted with `quote` around each part.
    fn quoted(&self, quote: char) -> String {
        self.0
            .iter()
            .map(|p| format!("{quote}{p}{quote}"))
            .collect::<Vec<_>>()
            .join(".")
    }
}

impl fmt::Debug for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("."))
    }
}

/// A table whose rows carry a fence column, keyed by one text column.
#[derive(Clone, Debug)]
pub struct SqlGate {
    table: Ident,
    key: Ident,
    fence: Ident,
}

impl SqlGate {
    /// `table` (or `schema.table`) keyed by `key_column`, with the fence in [`DEFAULT_FENCE_COLUMN`].
    pub fn new(table: &str, key_column: &str) -> Result<SqlGate> {
        Ok(SqlGate {
            table: Ident::new(table, "table", 2)?,
            key: Ident::new(key_column, "column", 1)?,
            fence: Ident::new(DEFAULT_FENCE_COLUMN, "column", 1)?,
        })
    }

    /// Keeps the fence in `column` instead.
    pub fn with_fence_column(mut self, column: &str) -> Result<SqlGate> {
        self.fence = Ident::new(column, "column", 1)?;
        Ok(self)
    }

    /// Raises row `key`'s fence to `fence` unless the row has seen a greater one, as the first
    /// statement of the caller's transaction `tx` (the row stays locked until it ends). It takes
    /// a transaction, not a connection: outside one, the lock would end with the statement and
    /// the caller's writes after it would not be covered.
    pub async fn claim<DB: GateDatabase>(
        &self,
        tx: &mut sqlx::Transaction<'_, DB>,
        key: &str,
        fence: Fence,
    ) -> Result<Claimed> {
        let claimed = DB::claim_row(&mut **tx, self, key, fence.as_i64()).await?;
        if let Claimed::Stale { newest } = claimed {
            telemetry::fence_rejected(DB::REJECTED_BY, fence.value(), newest);
        }
        Ok(claimed)
    }

    /// The statement parts, quoted with `quote`: (table, key column, fence column).
    fn names(&self, quote: char) -> (String, String, String) {
        (
            self.table.quoted(quote),
            self.key.quoted(quote),
            self.fence.quoted(quote),
        )
    }
}

/// A database the gate speaks: `sqlx::Postgres`, `sqlx::Sqlite`, `sqlx::MySql` (each behind its
/// feature).
#[async_trait]
pub trait GateDatabase: sqlx::Database {
    /// The `resource` label of the fence rejections counted on this database
    /// (`leasehold_fence_rejections_total`): `postgres_table`, `sqlite_table`, `mysql_table`.
    const REJECTED_BY: &'static str;

    /// The database's claim statement(s); see [`SqlGate::claim`].
    #[doc(hidden)]
    async fn claim_row(
        conn: &mut Self::Connection,
        gate: &SqlGate,
        key: &str,
        fence: i64,
    ) -> Result<Claimed>;
}

/// What a row's fence column read back means: a negative value was never written by a gate.
fn newest(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// A database error as leasehold's: connection trouble, timeouts, lock waits, deadlocks,
/// serialization failures, a server shutting down or read-only after a failover are retryable
/// (`Unavailable`: nobody knows whether the statement ran, or it did not and may run later);
/// anything else (a missing table, a syntax error, a constraint) is not.
pub fn map_error(error: sqlx::Error) -> Error {
    let retryable = match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => database_error_is_transient(db.as_ref()),
        _ => false,
    };
    let message = format!("the gated statement: {error}");
    if retryable {
        Error::Unavailable {
            backend: "sql gate",
            message,
            source: Some(std::sync::Arc::new(error)),
        }
    } else {
        Error::Backend {
            backend: "sql gate",
            message,
            retryable: false,
            source: Some(std::sync::Arc::new(error)),
        }
    }
}

fn database_error_is_transient(db: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        return db.code().is_some_and(|c| sqlite_code_is_transient(&c));
    }
    #[cfg(feature = "mysql")]
    if let Some(mysql) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        if mysql_number_is_transient(mysql.number()) {
            return true;
        }
    }
    db.code().is_some_and(|c| sqlstate_is_transient(&c))
}

/// SQLSTATE (PostgreSQL, MySQL): connection exceptions (`08`), transaction rollbacks
/// (`40`: serialization failure, deadlock), insufficient resources (`53`), operator
/// intervention (`57`: shutdown, a terminated backend, a statement timeout), a lock not
/// available (`55P03`), a read-only transaction (`25006`, a standby).
fn sqlstate_is_transient(code: &str) -> bool {
    ["08", "40", "53", "57"]
        .iter()
        .any(|class| code.starts_with(class))
        || code == "55P03"
        || code == "25006"
}

/// SQLite's extended result code: `SQLITE_BUSY` (5) and `SQLITE_LOCKED` (6) and their
/// extensions (`SQLITE_BUSY_SNAPSHOT` is 517: 5 in the low byte).
#[cfg(any(feature = "sqlite", test))]
fn sqlite_code_is_transient(code: &str) -> bool {
    code.parse::<u32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6))
}

/// MySQL and MariaDB error numbers: too many connections (1040), shutdown in progress (1053),
/// lock wait timeout (1205), deadlock (1213), read-only (1290, 1836), connection killed (1927),
/// server gone or connection lost (2006, 2013).
#[cfg(any(feature = "mysql", test))]
fn mysql_number_is_transient(number: u16) -> bool {
    matches!(
        number,
        1040 | 1053 | 1205 | 1213 | 1290 | 1836 | 1927 | 2006 | 2013
    )
}

/// The claim where the database has `UPDATE ... RETURNING` (PostgreSQL, SQLite 3.35+): one
/// conditional raise, and only when it raised nothing a read that tells stale from missing.
/// `$key` and `$fence` are the database's placeholders for the two parameters.
macro_rules! returning_claim {
    ($feature:literal, $db:ty, $label:literal, $key:literal, $fence:literal) => {
        #[cfg(feature = $feature)]
        #[async_trait]
        impl GateDatabase for $db {
            const REJECTED_BY: &'static str = $label;

            async fn claim_row(
                conn: &mut Self::Connection,
                gate: &SqlGate,
                key: &str,
                fence: i64,
            ) -> Result<Claimed> {
                let (t, k, f) = gate.names('"');
                let (pk, pf) = ($key, $fence);
                let raise = format!(
                    "UPDATE {t} SET {f} = {pf} WHERE {k} = {pk} AND {f} <= {pf} RETURNING 1"
                );
                let raised: Option<i32> = sqlx::query_scalar(sqlx::AssertSqlSafe(raise))
                    .bind(key)
                    .bind(fence)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(map_error)?;
                if raised.is_some() {
                    return Ok(Claimed::Claimed);
                }
                let read = format!("SELECT {f} FROM {t} WHERE {k} = {pk}");
                let found: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(read))
                    .bind(key)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(map_error)?;
                Ok(found.map_or(Claimed::Missing, |n| Claimed::Stale { newest: newest(n) }))
            }
        }
    };
}

returning_claim!("postgres", sqlx::Postgres, "postgres_table", "$1", "$2");
returning_claim!("sqlite", sqlx::Sqlite, "sqlite_table", "?1", "?2");

#[cfg(feature = "mysql")]
#[async_trait]
impl GateDatabase for sqlx::MySql {
    const REJECTED_BY: &'static str = "mysql_table";

    async fn claim_row(
        conn: &mut Self::Connection,
        gate: &SqlGate,
        key: &str,
        fence: i64,
    ) -> Result<Claimed> {
        let (t, k, f) = gate.names('`');
        // No UPDATE ... RETURNING here: the row lock taken by the read is what makes the
        // compare and the raise one step, until the caller's transaction ends.
        let read = format!("SELECT {f} FROM {t} WHERE {k} = ? FOR UPDATE");
        let found: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(read))
            .bind(key)
            .fetch_optional(&mut *conn)
            .await
            .map_err(map_error)?;
        match found {
            None => Ok(Claimed::Missing),
            Some(n) if n > fence => Ok(Claimed::Stale { newest: newest(n) }),
            Some(_) => {
                // Conditional as well: on a table without transactions (MyISAM, Aria) the row
                // lock is gone with the read, and an unconditional raise could lower the fence.
                let raise = format!("UPDATE {t} SET {f} = ? WHERE {k} = ? AND {f} <= ?");
                sqlx::query(sqlx::AssertSqlSafe(raise))
                    .bind(fence)
                    .bind(key)
                    .bind(fence)
                    .execute(&mut *conn)
                    .await
                    .map_err(map_error)?;
                Ok(Claimed::Claimed)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passing_trouble_is_retryable_and_mistakes_are_not() {
        for code in [
            "08006", "40001", "40P01", "53300", "57P01", "57014", "55P03", "25006",
        ] {
            assert!(
                sqlstate_is_transient(code),
                "SQLSTATE {code} is passing trouble"
            );
        }
        for code in ["42P01", "42601", "23505", "22003", "HY000"] {
            assert!(!sqlstate_is_transient(code), "SQLSTATE {code} is a mistake");
        }
        for code in ["5", "6", "517", "261", "262"] {
            assert!(
                sqlite_code_is_transient(code),
                "SQLite {code} is passing trouble"
            );
        }
        for code in ["1", "19", "2067", "11"] {
            assert!(
                !sqlite_code_is_transient(code),
                "SQLite {code} is a mistake"
            );
        }
        for number in [1205, 1213, 1927, 1290, 1836, 2013] {
            assert!(
                mysql_number_is_transient(number),
                "MySQL {number} is passing trouble"
            );
        }
        for number in [1146, 1064, 1062] {
            assert!(
                !mysql_number_is_transient(number),
                "MySQL {number} is a mistake"
            );
        }
    }

    #[test]
    fn names_that_could_become_sql_are_refused() {
        for bad in ["", "a b", "t;drop", "1t", "a.b.c", "t\"", "`t`", "x-y"] {
            assert!(SqlGate::new(bad, "id").is_err(), "table {bad:?} was taken");
            assert!(SqlGate::new("t", bad).is_err(), "column {bad:?} was taken");
        }
        assert!(
            SqlGate::new("t", "a.b").is_err(),
            "a dotted column was taken"
        );
        let gate = SqlGate::new("app.invoices", "id").and_then(|g| g.with_fence_column("f"));
        let names = gate.map(|g| g.names('"'));
        assert_eq!(
            names.ok(),
            Some((
                "\"app\".\"invoices\"".to_string(),
                "\"id\"".to_string(),
                "\"f\"".to_string()
            ))
        );
    }
}

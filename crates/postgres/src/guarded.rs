//! The resource side in PostgreSQL: writes that refuse stale fences.
//!
//! An application table that a lease protects gets one more column, `last_fence bigint NOT NULL
//! DEFAULT 0`: the greatest fence that has written to the row. Every write under a lease goes
//! through [`FencedTable`], which adds `last_fence <= $fence` to the write's condition and raises
//! `last_fence` in the same statement, so a former holder that paused past its lease cannot
//! overwrite the work of the holder after it.
//!
//! Two patterns, both inside the caller's own transaction:
//! * **Claim first** ([`FencedTable::claim`]): right after acquiring, raise `last_fence` and read
//!   the row's state in one statement. From then on every older fence is refused, even for
//!   writes that were already on their way. Zero rows: a newer holder got there first; abandon.
//! * **Guarded update** ([`FencedTable::update`]): the caller's `SET` and precondition run only if
//!   the fence is not stale; the outcome tells "you are stale" from "your precondition did not
//!   hold" from "no such row".
//!
//! SQL fragments are `&'static str`: they are the developer's literals, never user input. Values
//! go in as bind parameters.
//!
//! The claim alone, the same on PostgreSQL, SQLite and MySQL/MariaDB, is `leasehold-gate-sql`'s
//! `SqlGate::claim`; [`PgFencedRegister`] is that crate's register.
//!
//! ```no_run
//! # use leasehold_postgres::guarded::{FencedTable, Guarded};
//! # async fn demo(tx: &mut sqlx::PgConnection, fence: leasehold_core::Fence) -> leasehold_core::Result<()> {
//! let invoices = FencedTable::new("invoices", "id")?;
//! let outcome = invoices
//!     .update(tx, "inv_72", fence, "state = 'paid', paid_amount = $3", "state = 'open'", |q| q.bind(4200_i64))
//!     .await?;
//! match outcome {
//!     Guarded::Applied => { /* charged, once */ }
//!     Guarded::Stale { newest } => { /* a newer holder exists (fence {newest}): abandon */ }
//!     Guarded::PreconditionFailed => { /* already paid: nothing to do */ }
//!     Guarded::Missing => { /* no such invoice */ }
//! }
//! # Ok(()) }
//! ```

use leasehold_core::{telemetry, Error, Fence, Result};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, FromRow, PgConnection, Postgres, SqlSafeStr};

use crate::errors;
use crate::table::TableName;

/// The `resource` label of the fence rejections a [`FencedTable`] counts.
const REJECTED_BY: &str = "postgres_table";

/// What a guarded statement did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guarded {
    /// The fence was current and the statement changed the row.
    Applied,
    /// The row has already seen a greater fence: the caller's lease is stale.
    Stale {
        /// The row's `last_fence`.
        newest: u64,
    },
    /// The fence was current, but the caller's precondition did not hold.
    PreconditionFailed,
    /// No row has that key.
    Missing,
}

/// What a claim found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claimed<T> {
    /// `last_fence` is now the caller's fence; here is the row's state.
    Claimed(T),
    /// A newer fence already claimed the row.
    Stale {
        /// The row's `last_fence`.
        newest: u64,
    },
    /// No row has that key.
    Missing,
}

/// An application table whose rows carry a fence column.
#[derive(Clone, Debug)]
pub struct FencedTable {
    table: TableName,
    key_column: TableName,
    fence_column: TableName,
}

impl FencedTable {
    /// `table` (optionally `schema.table`) keyed by `key_column`, with the fence in `last_fence`.
    pub fn new(table: &str, key_column: &str) -> Result<Self> {
        Ok(FencedTable {
            table: TableName::new(table)?,
            key_column: column(key_column)?,
            fence_column: column("last_fence")?,
        })
    }

    /// Uses another fence column than `last_fence`.
    pub fn with_fence_column(mut self, name: &str) -> Result<Self> {
        self.fence_column = column(name)?;
        Ok(self)
    }

    /// Claim first: raises the row's fence to `fence` unless it is already greater, and returns
    /// the `returning` columns of the row, in one statement.
    pub async fn claim<T>(
        &self,
        conn: &mut PgConnection,
        key: &str,
        fence: Fence,
        returning: &'static str,
    ) -> Result<Claimed<T>>
    where
        T: for<'r> FromRow<'r, PgRow> + Send + Unpin,
    {
        let (t, k, f) = (&self.table, &self.key_column, &self.fence_column);
        let sql =
            format!("UPDATE {t} SET {f} = $2 WHERE {k} = $1 AND {f} <= $2 RETURNING {returning}");
        let row: Option<T> = sqlx::query_as(AssertSqlSafe(sql).into_sql_str())
            .bind(key)
            .bind(fence.as_i64())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| errors::map(e, "claim", t))?;
        Ok(match row {
            Some(state) => Claimed::Claimed(state),
            None => match self.newest(conn, key).await? {
                Some(newest) => {
                    telemetry::fence_rejected(REJECTED_BY, fence.value(), newest);
                    Claimed::Stale { newest }
                }
                None => Claimed::Missing,
            },
        })
    }

    /// Guarded update: `UPDATE table SET <set>, last_fence = $2 WHERE key = $1 AND last_fence
    /// <= $2 AND (<precondition>)`. `$1` is the key and `$2` the fence; `bind` adds the caller's
    /// parameters from `$3` on.
    pub async fn update<'q, B>(
        &self,
        conn: &mut PgConnection,
        key: &'q str,
        fence: Fence,
        set: &'static str,
        precondition: &'static str,
        bind: B,
    ) -> Result<Guarded>
    where
        B: FnOnce(Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments>,
    {
        let (t, k, f) = (&self.table, &self.key_column, &self.fence_column);
        let sql = format!(
            "UPDATE {t} SET {set}, {f} = $2 WHERE {k} = $1 AND {f} <= $2 AND ({precondition})"
        );
        let query = sqlx::query(AssertSqlSafe(sql).into_sql_str())
            .bind(key)
            .bind(fence.as_i64());
        let done = bind(query)
            .execute(&mut *conn)
            .await
            .map_err(|e| errors::map(e, "guarded update", t))?;
        if done.rows_affected() > 0 {
            return Ok(Guarded::Applied);
        }
        // Nothing changed: find out why, from the latest committed state of the row.
        Ok(match self.newest(conn, key).await? {
            None => Guarded::Missing,
            Some(newest) if newest > fence.value() => {
                telemetry::fence_rejected(REJECTED_BY, fence.value(), newest);
                Guarded::Stale { newest }
            }
            Some(_) => Guarded::PreconditionFailed,
        })
    }

    async fn newest(&self, conn: &mut PgConnection, key: &str) -> Result<Option<u64>> {
        let (t, k, f) = (&self.table, &self.key_column, &self.fence_column);
        let sql = format!("SELECT {f} FROM {t} WHERE {k} = $1");
        let newest: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql).into_sql_str())
            .bind(key)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| errors::map(e, "read last_fence", t))?;
        Ok(newest.map(|n| n.max(0) as u64))
    }
}

/// A column name, validated and quoted like a table name without a schema.
fn column(name: &str) -> Result<TableName> {
    if name.contains('.') {
        return Err(Error::InvalidConfig {
            reason: format!("`{name}` is not a column name"),
        });
    }
    TableName::new(name)
}

/// A fenced register in a PostgreSQL table (`id text PRIMARY KEY, last_fence bigint, value
/// text`): a real-database [`FencedResource`](leasehold_core::FencedResource), the SQL gate's
/// register on PostgreSQL.
pub type PgFencedRegister = leasehold_gate_sql::SqlRegister<sqlx::Postgres>;

//! The smallest fenced resource on a SQL table: one row with a value, written under the gate.

use async_trait::async_trait;
use leasehold_core::{Fence, FencedResource, Guarded, Result};

use crate::{map_error, Claimed, SqlGate};

/// One row (`id`, `last_fence`, `value`) of a register table, as a [`FencedResource`]: a claim
/// is the gate's claim alone, a write is the claim and an `UPDATE` of the value in one
/// transaction. The resource suite of `leasehold-conformance` runs against it.
#[derive(Clone, Debug)]
pub struct SqlRegister<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    gate: SqlGate,
    id: String,
}

fn accepted(claimed: Claimed, id: &str) -> Result<Guarded> {
    match claimed {
        Claimed::Claimed => Ok(Guarded::Accepted),
        Claimed::Stale { newest } => Ok(Guarded::Stale { newest }),
        Claimed::Missing => Err(leasehold_core::Error::Backend {
            backend: "sql gate",
            message: format!("register row {id} is missing"),
            retryable: false,
            source: None,
        }),
    }
}

/// The register's statements for one database: `{t}` is the quoted table.
macro_rules! register_on {
    ($feature:literal, $db:ty, $begin:literal, $quote:literal, $create:literal, $reset:literal, $set:literal, $get:literal) => {
        #[cfg(feature = $feature)]
        impl SqlRegister<$db> {
            /// Creates `table` and row `id` if they are missing. An existing row keeps its fence:
            /// lowering it would let a stale holder through.
            pub async fn create(pool: &sqlx::Pool<$db>, table: &str, id: &str) -> Result<Self> {
                let gate = SqlGate::new(table, "id")?;
                let quoted = gate.table.quoted($quote);
                let create = $create.replace("{t}", &quoted);
                if sqlx::query(sqlx::AssertSqlSafe(create.clone()))
                    .execute(pool)
                    .await
                    .is_err()
                {
                    // Two registers creating the table at once: PostgreSQL can refuse the
                    // second `CREATE TABLE IF NOT EXISTS` (a unique violation in its catalog);
                    // once the first has committed, the statement succeeds.
                    sqlx::query(sqlx::AssertSqlSafe(create))
                        .execute(pool)
                        .await
                        .map_err(map_error)?;
                }
                sqlx::query(sqlx::AssertSqlSafe($reset.replace("{t}", &quoted)))
                    .bind(id)
                    .execute(pool)
                    .await
                    .map_err(map_error)?;
                Ok(SqlRegister {
                    pool: pool.clone(),
                    gate,
                    id: id.to_string(),
                })
            }

            /// The value the row holds now (`None` before any write).
            pub async fn value(&self) -> Result<Option<String>> {
                let sql = $get.replace("{t}", &self.gate.table.quoted($quote));
                let value: Option<Option<String>> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                    .bind(&self.id)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(map_error)?;
                Ok(value.flatten())
            }
        }

        #[cfg(feature = $feature)]
        #[async_trait]
        impl FencedResource for SqlRegister<$db> {
            async fn claim(&self, fence: Fence) -> Result<Guarded> {
                let mut tx = self.pool.begin_with($begin).await.map_err(map_error)?;
                let claimed = self.gate.claim(&mut tx, &self.id, fence).await?;
                tx.commit().await.map_err(map_error)?;
                accepted(claimed, &self.id)
            }

            async fn write(&self, fence: Fence, value: &str) -> Result<Guarded> {
                let mut tx = self.pool.begin_with($begin).await.map_err(map_error)?;
                let claimed = self.gate.claim(&mut tx, &self.id, fence).await?;
                if claimed == Claimed::Claimed {
                    let sql = $set.replace("{t}", &self.gate.table.quoted($quote));
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .bind(value)
                        .bind(&self.id)
                        .execute(&mut *tx)
                        .await
                        .map_err(map_error)?;
                }
                tx.commit().await.map_err(map_error)?;
                accepted(claimed, &self.id)
            }
        }
    };
}

register_on!(
    "postgres",
    sqlx::Postgres,
    "BEGIN",
    '"',
    "CREATE TABLE IF NOT EXISTS {t} (id text PRIMARY KEY, last_fence bigint NOT NULL DEFAULT 0, value text)",
    "INSERT INTO {t} (id) VALUES ($1) ON CONFLICT (id) DO NOTHING",
    "UPDATE {t} SET value = $1 WHERE id = $2",
    "SELECT value FROM {t} WHERE id = $1"
);

register_on!(
    "sqlite",
    sqlx::Sqlite,
    // The write lock at once: a deferred transaction that read first could not take it later
    // (SQLITE_BUSY_SNAPSHOT) once another connection committed.
    "BEGIN IMMEDIATE",
    '"',
    "CREATE TABLE IF NOT EXISTS {t} (id text PRIMARY KEY, last_fence integer NOT NULL DEFAULT 0, value text)",
    "INSERT INTO {t} (id) VALUES (?1) ON CONFLICT (id) DO NOTHING",
    "UPDATE {t} SET value = ?1 WHERE id = ?2",
    "SELECT value FROM {t} WHERE id = ?1"
);

register_on!(
    "mysql",
    sqlx::MySql,
    "BEGIN",
    '`',
    "CREATE TABLE IF NOT EXISTS {t} (id varchar(64) PRIMARY KEY, last_fence bigint NOT NULL DEFAULT 0, value text)",
    "INSERT INTO {t} (id) VALUES (?) ON DUPLICATE KEY UPDATE id = id",
    "UPDATE {t} SET value = ? WHERE id = ?",
    "SELECT value FROM {t} WHERE id = ?"
);

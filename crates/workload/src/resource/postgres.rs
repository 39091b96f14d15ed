//! The resource as a table on a PostgreSQL server.

use std::collections::BTreeMap;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Row};

use super::{Outcome, ResourceError, Rows, SetResource};

/// The resource as a table on a PostgreSQL server. Rows are namespaced by run, so one server can
/// hold the fenced run and its control side by side.
#[derive(Debug, Clone)]
pub struct PgSets {
    pool: PgPool,
    run: String,
}

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS leasehold_workload_sets (
    run text NOT NULL,
    key text NOT NULL,
    elements bigint[] NOT NULL DEFAULT '{}',
    last_fence bigint,
    PRIMARY KEY (run, key))";

fn to_db(n: u64) -> Result<i64, ResourceError> {
    i64::try_from(n).map_err(|_| format!("{n} does not fit a bigint").into())
}

fn from_db(n: i64) -> Result<u64, ResourceError> {
    u64::try_from(n).map_err(|_| format!("negative value {n} in the resource").into())
}

/// The `application_name` of the resource's clients, by which the nemesis finds the connections
/// to kill.
pub const WORKER_APPLICATION: &str = "leasehold-workload-worker";

impl PgSets {
    /// Connects to `url` (a small pool; each worker process has its own). The table must exist:
    /// see [`PgSets::create`].
    pub async fn connect(url: &str, run: &str) -> Result<Self, ResourceError> {
        let options: PgConnectOptions = url
            .parse::<PgConnectOptions>()?
            .application_name(WORKER_APPLICATION);
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(std::time::Duration::from_secs(10))
            .connect_with(options)
            .await?;
        Ok(PgSets {
            pool,
            run: run.to_string(),
        })
    }

    /// Connects and creates the table, once, before any worker starts: concurrent
    /// `CREATE TABLE IF NOT EXISTS` statements can fail in PostgreSQL with a unique violation
    /// in its catalog (seen when eight workers started at once).
    pub async fn create(url: &str, run: &str) -> Result<Self, ResourceError> {
        let sets = PgSets::connect(url, run).await?;
        sqlx::query(SCHEMA).execute(&sets.pool).await?;
        Ok(sets)
    }

    async fn newest(&self, key: &str) -> Result<u64, ResourceError> {
        let row = sqlx::query(
            "SELECT last_fence FROM leasehold_workload_sets WHERE run = $1 AND key = $2",
        )
        .bind(&self.run)
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        let newest: Option<i64> = match row {
            Some(row) => row.try_get(0)?,
            None => None,
        };
        newest.map(from_db).transpose().map(|n| n.unwrap_or(0))
    }
}

#[async_trait]
impl SetResource for PgSets {
    async fn read(
        &self,
        key: &str,
        fence: Option<u64>,
    ) -> Result<Outcome<Vec<u64>>, ResourceError> {
        let row = match fence {
            // One statement: the claim and the read are atomic, and a refused claim reads nothing.
            Some(fence) => {
                sqlx::query(
                    "INSERT INTO leasehold_workload_sets AS s (run, key, last_fence)
                     VALUES ($1, $2, $3)
                     ON CONFLICT (run, key) DO UPDATE SET last_fence = EXCLUDED.last_fence
                       WHERE s.last_fence IS NULL OR s.last_fence <= EXCLUDED.last_fence
                     RETURNING elements",
                )
                .bind(&self.run)
                .bind(key)
                .bind(to_db(fence)?)
                .fetch_optional(&self.pool)
                .await?
            }
            None => {
                sqlx::query(
                    "SELECT elements FROM leasehold_workload_sets WHERE run = $1 AND key = $2",
                )
                .bind(&self.run)
                .bind(key)
                .fetch_optional(&self.pool)
                .await?
            }
        };
        match row {
            Some(row) => {
                let elements: Vec<i64> = row.try_get(0)?;
                Ok(Outcome::Done(
                    elements
                        .into_iter()
                        .map(from_db)
                        .collect::<Result<_, _>>()?,
                ))
            }
            None if fence.is_some() => Ok(Outcome::Stale {
                newest: self.newest(key).await?,
            }),
            None => Ok(Outcome::Done(Vec::new())),
        }
    }

    async fn write(
        &self,
        key: &str,
        elements: &[u64],
        fence: u64,
        fenced: bool,
    ) -> Result<Outcome<Option<u64>>, ResourceError> {
        let elements = elements
            .iter()
            .map(|&e| to_db(e))
            .collect::<Result<Vec<_>, _>>()?;
        let fence_db = to_db(fence)?;
        if !fenced {
            // The control: the write lands whatever fence it carries (last_fence is kept only so
            // the final state shows the newest fence that wrote).
            sqlx::query(
                "INSERT INTO leasehold_workload_sets AS s (run, key, elements, last_fence)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (run, key) DO UPDATE SET elements = EXCLUDED.elements,
                   last_fence = GREATEST(s.last_fence, EXCLUDED.last_fence)",
            )
            .bind(&self.run)
            .bind(key)
            .bind(&elements)
            .bind(fence_db)
            .execute(&self.pool)
            .await?;
            return Ok(Outcome::Done(None));
        }
        // The guarded write: lock the row, compare, write, in one transaction, and report the
        // fence held before so the checker can judge each accept exactly.
        let mut tx = self.pool.begin().await?;
        let prior: Option<Option<i64>> = sqlx::query_scalar(
            "SELECT last_fence FROM leasehold_workload_sets WHERE run = $1 AND key = $2 FOR UPDATE",
        )
        .bind(&self.run)
        .bind(key)
        .fetch_optional(&mut *tx)
        .await?;
        let prior = prior.flatten().map(from_db).transpose()?;
        if let Some(newest) = prior.filter(|&p| p > fence) {
            tx.rollback().await?;
            return Ok(Outcome::Stale { newest });
        }
        sqlx::query(
            "INSERT INTO leasehold_workload_sets AS s (run, key, elements, last_fence)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (run, key) DO UPDATE SET elements = EXCLUDED.elements,
               last_fence = EXCLUDED.last_fence",
        )
        .bind(&self.run)
        .bind(key)
        .bind(&elements)
        .bind(fence_db)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Outcome::Done(prior))
    }

    async fn final_state(&self) -> Result<Rows, ResourceError> {
        let rows = sqlx::query(
            "SELECT key, elements, last_fence FROM leasehold_workload_sets WHERE run = $1",
        )
        .bind(&self.run)
        .fetch_all(&self.pool)
        .await?;
        let mut out = BTreeMap::new();
        for row in rows {
            let key: String = row.try_get(0)?;
            let elements: Vec<i64> = row.try_get(1)?;
            let last: Option<i64> = row.try_get(2)?;
            out.insert(
                key,
                (
                    elements
                        .into_iter()
                        .map(from_db)
                        .collect::<Result<_, _>>()?,
                    last.map(from_db).transpose()?,
                ),
            );
        }
        Ok(out)
    }
}

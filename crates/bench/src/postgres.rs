//! PostgreSQL: leasehold against the raw upsert + update pair, prepared, on the same server.

use async_trait::async_trait;
use leasehold::postgres::PostgresAuthority;
use sqlx::{AssertSqlSafe, PgPool, SqlSafeStr, SqlStr};

use crate::{BoxError, RawPair, Subject};

#[derive(Debug)]
struct Raw {
    pool: PgPool,
    upsert: SqlStr,
    update: SqlStr,
}

#[async_trait]
impl RawPair for Raw {
    fn name(&self) -> &'static str {
        "raw upsert + update (prepared)"
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let fence: Option<i64> = sqlx::query_scalar(self.upsert.clone())
            .bind(key)
            .bind("raw-owner")
            .fetch_optional(&self.pool)
            .await?;
        fence.ok_or("raw key held")?;
        sqlx::query(self.update.clone())
            .bind(key)
            .bind("raw-owner")
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

pub async fn subject(url: &str) -> Result<Subject, BoxError> {
    let authority = PostgresAuthority::connect(url).await?;
    authority.migrate().await?;
    let t = authority.table().to_string();
    let raw = Raw {
        pool: authority.pool().clone(),
        upsert: AssertSqlSafe(format!(
            "INSERT INTO {t} AS l (lock_key, owner, fence, expires_at) VALUES ($1, $2, 1, now() + interval '10 seconds') \
             ON CONFLICT (lock_key) DO UPDATE SET owner = excluded.owner, fence = l.fence + 1, expires_at = excluded.expires_at \
             WHERE l.expires_at <= now() RETURNING fence"
        ))
        .into_sql_str(),
        update: AssertSqlSafe(format!(
            "UPDATE {t} SET expires_at = now() WHERE lock_key = $1 AND owner = $2"
        ))
        .into_sql_str(),
    };
    Ok(Subject {
        authority: leasehold::connect(url).await?,
        raw: vec![Box::new(raw)],
        targets: true,
    })
}

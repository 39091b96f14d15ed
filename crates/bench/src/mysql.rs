//! MySQL/MariaDB: leasehold against the raw fenced pair (one `INSERT ... ON DUPLICATE KEY
//! UPDATE` that takes an expired row and raises its fence, the fence back in the reply's
//! `last_insert_id`, then the release `UPDATE`), prepared, on a **dedicated connection**, and
//! against `GET_LOCK`/`RELEASE_LOCK` (the named lock MySQL lock libraries use: no lease that
//! outlives the session's death, no fence), also on a dedicated connection.

use async_trait::async_trait;
use leasehold::mysql::MysqlAuthority;
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Connection, SqlSafeStr, SqlStr};
use tokio::sync::Mutex;

use crate::{Baseline, BoxError, RawPair, ServerOps, Subject};

/// "The lease on this row is over", by the server's clock.
const EXPIRED: &str = "expires_at <= UTC_TIMESTAMP(6)";

#[derive(Debug, Clone)]
struct Statements {
    take: SqlStr,
    free: SqlStr,
}

impl Statements {
    /// The cheapest statements that still hand out an ordered fence: the owner compared on
    /// release, expiry by the server's clock, no fence or expiry check on the release.
    fn new(table: &str) -> Self {
        let sql = |s: String| AssertSqlSafe(s).into_sql_str();
        Statements {
            take: sql(format!(
                "INSERT INTO {table} (lock_key, owner, fence, expires_at) \
                 VALUES (?, ?, LAST_INSERT_ID(1), UTC_TIMESTAMP(6) + INTERVAL 10 SECOND) \
                 ON DUPLICATE KEY UPDATE \
                   owner = IF({EXPIRED}, VALUES(owner), owner), \
                   fence = IF({EXPIRED}, LAST_INSERT_ID(fence + 1), fence + 0 * LAST_INSERT_ID(0)), \
                   expires_at = IF({EXPIRED}, VALUES(expires_at), expires_at)"
            )),
            free: sql(format!(
                "UPDATE {table} SET expires_at = UTC_TIMESTAMP(6) WHERE lock_key = ? AND owner = ?"
            )),
        }
    }

    async fn pair(&self, conn: &mut MySqlConnection, key: &str) -> Result<(), BoxError> {
        let owner = "raw-owner";
        let fence = sqlx::query(self.take.clone())
            .bind(key)
            .bind(owner)
            .execute(&mut *conn)
            .await?
            .last_insert_id();
        if fence == 0 {
            return Err("raw key held".into());
        }
        sqlx::query(self.free.clone())
            .bind(key)
            .bind(owner)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

/// The raw fenced pair on one connection of its own.
#[derive(Debug)]
struct Dedicated {
    conn: Mutex<MySqlConnection>,
    statements: Statements,
}

#[async_trait]
impl RawPair for Dedicated {
    fn name(&self) -> &'static str {
        "raw fenced upsert + update, own conn"
    }

    fn baseline(&self) -> Baseline {
        // The fence is one column raised in the same statement: it costs the protocol nothing.
        Baseline::Raw { fenced: true }
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let mut conn = self.conn.lock().await;
        self.statements.pair(&mut conn, key).await
    }
}

/// The same pair from a pool without per-checkout pings, for many concurrent tasks.
#[derive(Debug)]
struct Pooled {
    pool: MySqlPool,
    statements: Statements,
}

#[async_trait]
impl RawPair for Pooled {
    fn name(&self) -> &'static str {
        "raw fenced pair, pool of 10, no ping"
    }

    fn baseline(&self) -> Baseline {
        Baseline::Raw { fenced: true }
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let mut conn = self.pool.acquire().await?;
        self.statements.pair(&mut conn, key).await
    }
}

/// `GET_LOCK(key, 0)` + `RELEASE_LOCK(key)`: held by the session, gone with it, no fence.
#[derive(Debug)]
struct NamedLock(Mutex<MySqlConnection>);

#[async_trait]
impl RawPair for NamedLock {
    fn name(&self) -> &'static str {
        "GET_LOCK + RELEASE_LOCK (no fence)"
    }

    fn baseline(&self) -> Baseline {
        Baseline::Peer
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let mut conn = self.0.lock().await;
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
            .bind(key)
            .fetch_one(&mut *conn)
            .await?;
        if got != Some(1) {
            return Err("raw key held".into());
        }
        sqlx::query_scalar::<_, Option<i64>>("SELECT RELEASE_LOCK(?)")
            .bind(key)
            .fetch_one(&mut *conn)
            .await?;
        Ok(())
    }
}

/// Statements the server executed (`Questions`: every statement a client sent, the counting
/// query included).
struct Questions(Mutex<MySqlConnection>);

#[async_trait]
impl ServerOps for Questions {
    fn unit(&self) -> &'static str {
        "statements"
    }

    async fn count(&self) -> Result<u64, BoxError> {
        let mut conn = self.0.lock().await;
        let (_, value): (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
            .fetch_one(&mut *conn)
            .await?;
        Ok(value.parse()?)
    }
}

pub async fn subject(url: &str) -> Result<Subject, BoxError> {
    let authority = MysqlAuthority::connect(url).await?;
    authority.migrate().await?;
    let statements = Statements::new(&authority.table().to_string());
    // The baselines connect without leasehold's URL parameters.
    let base = url.split('?').next().unwrap_or(url);
    let connect = || MySqlConnection::connect(base);
    let pooled = Pooled {
        pool: MySqlPoolOptions::new()
            .max_connections(10)
            .test_before_acquire(false)
            .connect(base)
            .await?,
        statements: statements.clone(),
    };
    Ok(Subject {
        authority: leasehold::connect(url).await?,
        raw: vec![
            Box::new(Dedicated {
                conn: Mutex::new(connect().await?),
                statements,
            }),
            Box::new(NamedLock(Mutex::new(connect().await?))),
        ],
        concurrent_raw: Some(std::sync::Arc::new(pooled)),
        server_ops: Some(Box::new(Questions(Mutex::new(connect().await?)))),
        targets: true,
        // Waiters poll (MySQL has no notification a waiter could park on without holding a
        // connection): no raw hand-off to set leasehold's against.
        raw_handoff: None,
    })
}

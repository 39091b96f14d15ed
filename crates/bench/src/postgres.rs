//! PostgreSQL: leasehold against the raw fenced pair (the upsert that bumps the fence + the
//! release update), prepared, on a **dedicated connection** (no pool, so no per-checkout ping in
//! the baseline), and against session advisory locks (the PostgreSQL lock peers use: no lease,
//! no fence), also on a dedicated connection.

use async_trait::async_trait;
use leasehold::postgres::PostgresAuthority;
use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool, SqlSafeStr, SqlStr};
use tokio::sync::Mutex;

use std::time::Duration;

use crate::{Baseline, BoxError, RawHandoff, RawPair, ServerOps, Subject};

#[derive(Debug, Clone)]
struct Statements {
    upsert: SqlStr,
    update: SqlStr,
}

/// The same fenced pair whose release also announces itself with `pg_notify` to a listener, as
/// leasehold's does when somebody waits, so that the waiter wakes at once: what waking by
/// notification costs, on its own line (an uncontended leasehold release does not notify).
#[derive(Debug)]
struct Notifying {
    conn: Mutex<PgConnection>,
    statements: Statements,
}

#[async_trait]
impl RawPair for Notifying {
    fn name(&self) -> &'static str {
        "raw fenced + pg_notify to a listener"
    }

    fn baseline(&self) -> Baseline {
        Baseline::Reference
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let mut conn = self.conn.lock().await;
        self.statements.pair(&mut conn, key).await
    }
}

impl Statements {
    fn new(table: &str) -> Self {
        Statements {
            upsert: AssertSqlSafe(format!(
                "INSERT INTO {table} AS l (lock_key, owner, fence, expires_at) \
                 VALUES ($1, $2, 1, now() + interval '10 seconds') \
                 ON CONFLICT (lock_key) DO UPDATE SET owner = excluded.owner, fence = l.fence + 1, \
                 expires_at = excluded.expires_at WHERE l.expires_at <= now() RETURNING fence"
            ))
            .into_sql_str(),
            update: AssertSqlSafe(format!(
                "UPDATE {table} SET expires_at = now() WHERE lock_key = $1 AND owner = $2"
            ))
            .into_sql_str(),
        }
    }

    /// The upsert for `owner`: the fence if it took `key`, `None` if `key` is held.
    async fn take(
        &self,
        conn: &mut PgConnection,
        key: &str,
        owner: &str,
    ) -> Result<Option<i64>, BoxError> {
        Ok(sqlx::query_scalar(self.upsert.clone())
            .bind(key)
            .bind(owner)
            .fetch_optional(conn)
            .await?)
    }

    /// The release of `owner`'s lease on `key` (none: a no-op).
    async fn free(&self, conn: &mut PgConnection, key: &str, owner: &str) -> Result<(), BoxError> {
        sqlx::query(self.update.clone())
            .bind(key)
            .bind(owner)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn pair(&self, conn: &mut PgConnection, key: &str) -> Result<(), BoxError> {
        self.take(conn, key, "raw-owner")
            .await?
            .ok_or("raw key held")?;
        self.free(conn, key, "raw-owner").await
    }
}

/// The fenced pair written as leasehold writes it, on a dedicated connection: the upsert with the
/// TTL as a parameter on the server's clock, and the release that matches owner, fence and
/// expiry and returns whether it announced (nobody marked the key, so it does not). For
/// reference: the server's extra work for what leasehold's statements check, apart from the
/// client's. The statements are the authority's own (`hot_path_statements`), so they cannot
/// drift from what leasehold sends.
#[derive(Debug)]
struct AsLeasehold {
    conn: Mutex<PgConnection>,
    upsert: SqlStr,
    release: SqlStr,
    table: String,
}

#[async_trait]
impl RawPair for AsLeasehold {
    fn name(&self) -> &'static str {
        "raw, leasehold's statements, own conn"
    }

    fn baseline(&self) -> Baseline {
        Baseline::Reference
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let mut conn = self.conn.lock().await;
        let owner = "0123456789abcdef0123456789abcdef";
        let fence: Option<i64> = sqlx::query_scalar(self.upsert.clone())
            .bind(key)
            .bind(owner)
            .bind(10_000f64)
            .fetch_optional(&mut *conn)
            .await?;
        let fence = fence.ok_or("raw key held")?;
        let released: Option<bool> = sqlx::query_scalar(self.release.clone())
            .bind(key)
            .bind(owner)
            .bind(fence)
            .bind(&self.table)
            .fetch_optional(&mut *conn)
            .await?;
        released.ok_or("raw release found another holder")?;
        Ok(())
    }
}

/// The raw fenced pair on one connection of its own.
#[derive(Debug)]
struct Dedicated {
    conn: Mutex<PgConnection>,
    statements: Statements,
}

#[async_trait]
impl RawPair for Dedicated {
    fn name(&self) -> &'static str {
        "raw fenced upsert + update, own conn"
    }

    fn baseline(&self) -> Baseline {
        // The fence is one column bumped in the same upsert: it costs the protocol nothing.
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
    pool: PgPool,
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

/// Session advisory locks: `pg_try_advisory_lock` + `pg_advisory_unlock`.
#[derive(Debug)]
struct Advisory(Mutex<PgConnection>);

#[async_trait]
impl RawPair for Advisory {
    fn name(&self) -> &'static str {
        "advisory lock + unlock (no fence)"
    }

    fn baseline(&self) -> Baseline {
        Baseline::Peer
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let mut conn = self.0.lock().await;
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext($1))")
            .bind(key)
            .fetch_one(&mut *conn)
            .await?;
        if !got {
            return Err("raw key held".into());
        }
        sqlx::query_scalar::<_, bool>("SELECT pg_advisory_unlock(hashtext($1))")
            .bind(key)
            .fetch_one(&mut *conn)
            .await?;
        Ok(())
    }
}

/// PostgreSQL's own hand-off by notification, on three dedicated connections: the holder's
/// release announces itself with `pg_notify` (in its `RETURNING` clause, as leasehold's does),
/// a `LISTEN`ing connection reads the notification, and the waiter's upsert takes the key. One
/// task does the three in a row, so no wake-up of a parked task is in it: the protocol's
/// minimum for a notified hand-off, which leasehold's is set against (for reference).
struct Handoff {
    holder: Mutex<PgConnection>,
    waiter: Mutex<PgConnection>,
    listener: Mutex<PgListener>,
    statements: Statements,
    announce: SqlStr,
}

#[async_trait]
impl RawHandoff for Handoff {
    fn name(&self) -> &'static str {
        "raw hand-off: release + pg_notify, LISTEN, upsert"
    }

    async fn prepare(&self, key: &str) -> Result<(), BoxError> {
        let (mut holder, mut waiter) = (self.holder.lock().await, self.waiter.lock().await);
        // The last round's waiter holds the key (a no-op in the first round).
        self.statements.free(&mut waiter, key, "waiter").await?;
        let s = &self.statements;
        s.take(&mut holder, key, "holder")
            .await?
            .ok_or("the raw hand-off's key is held")?;
        if s.take(&mut waiter, key, "waiter").await?.is_some() {
            return Err("the raw hand-off's waiter took a held key".into());
        }
        Ok(())
    }

    async fn hand_off(&self, key: &str) -> Result<Duration, BoxError> {
        let (mut holder, mut waiter) = (self.holder.lock().await, self.waiter.lock().await);
        let mut listener = self.listener.lock().await;
        let t = std::time::Instant::now();
        sqlx::query(self.announce.clone())
            .bind(key)
            .bind("holder")
            .fetch_optional(&mut *holder)
            .await?
            .ok_or("the raw hand-off's holder lost the key")?;
        listener.recv().await?;
        let fence = self.statements.take(&mut waiter, key, "waiter").await?;
        let took = t.elapsed();
        fence.ok_or("the raw hand-off's waiter did not get the key")?;
        Ok(took)
    }
}

/// Transactions the database committed or rolled back (the stats lag by up to a second).
struct Transactions(Mutex<PgConnection>);

#[async_trait]
impl ServerOps for Transactions {
    fn unit(&self) -> &'static str {
        "transactions"
    }

    /// Server processes publish their statistics in their own time (at most once a second, and
    /// `pg_stat_force_next_flush` flushes only the caller's).
    fn immediate(&self) -> bool {
        false
    }

    async fn count(&self) -> Result<u64, BoxError> {
        let mut conn = self.0.lock().await;
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(&mut *conn)
            .await?;
        let n: i64 = sqlx::query_scalar(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database \
             WHERE datname = current_database()",
        )
        .fetch_one(&mut *conn)
        .await?;
        Ok(n as u64)
    }
}

pub async fn subject(url: &str) -> Result<Subject, BoxError> {
    let authority = PostgresAuthority::connect(url).await?;
    authority.migrate().await?;
    let statements = Statements::new(&authority.table().to_string());
    // The baselines connect without leasehold's URL parameters.
    let base = url.split('?').next().unwrap_or(url);
    let dedicated = Dedicated {
        conn: Mutex::new(PgConnection::connect(base).await?),
        statements: statements.clone(),
    };
    let table = authority.table().to_string();
    // A listener on the channel, as leasehold keeps one: delivering each notification to it is
    // part of what waking waiters costs.
    let mut listener = sqlx::postgres::PgListener::connect(base).await?;
    listener.listen("leasehold_bench").await?;
    tokio::spawn(async move { while listener.recv().await.is_ok() {} });
    let notifying = Notifying {
        conn: Mutex::new(PgConnection::connect(base).await?),
        statements: Statements {
            upsert: statements.upsert.clone(),
            update: AssertSqlSafe(format!(
                "WITH released AS (UPDATE {table} SET expires_at = now() \
               WHERE lock_key = $1 AND owner = $2 RETURNING lock_key) \
             SELECT count(*) FROM (SELECT pg_notify('leasehold_bench', lock_key) FROM released) n"
            ))
            .into_sql_str(),
        },
    };
    let (upsert, release) = authority.hot_path_statements();
    let as_leasehold = AsLeasehold {
        conn: Mutex::new(PgConnection::connect(base).await?),
        upsert: AssertSqlSafe(upsert.to_string()).into_sql_str(),
        release: AssertSqlSafe(release.to_string()).into_sql_str(),
        table: table.clone(),
    };
    let mut handoff_listener = PgListener::connect(base).await?;
    handoff_listener.listen("leasehold_bench_handoff").await?;
    let handoff = Handoff {
        holder: Mutex::new(PgConnection::connect(base).await?),
        waiter: Mutex::new(PgConnection::connect(base).await?),
        listener: Mutex::new(handoff_listener),
        statements: statements.clone(),
        announce: AssertSqlSafe(format!(
            "UPDATE {table} SET expires_at = now() WHERE lock_key = $1 AND owner = $2 \
             RETURNING pg_notify('leasehold_bench_handoff', lock_key)"
        ))
        .into_sql_str(),
    };
    let pooled = Pooled {
        pool: PgPoolOptions::new()
            .max_connections(10)
            .test_before_acquire(false)
            .connect(base)
            .await?,
        statements,
    };
    Ok(Subject {
        authority: leasehold::connect(url).await?,
        raw: vec![
            Box::new(dedicated),
            Box::new(as_leasehold),
            Box::new(notifying),
            Box::new(Advisory(Mutex::new(PgConnection::connect(base).await?))),
        ],
        concurrent_raw: Some(std::sync::Arc::new(pooled)),
        server_ops: Some(Box::new(Transactions(Mutex::new(
            PgConnection::connect(base).await?,
        )))),
        targets: true,
        raw_handoff: Some(Box::new(handoff)),
    })
}

//! The PostgreSQL authority: leases are rows, the database's clock decides expiry.

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    Authority, Capabilities, Error, FenceSafety, FencingToken, Grant, Instant, LockKey, LostReason,
    OwnerToken, Released, Result, TtlRange,
};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool, SqlSafeStr, SqlStr};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::PostgresConfig;
use crate::errors::{self, BACKEND};
use crate::notify::{self, Waiters};
use crate::table::TableName;
use crate::token::PgFence;

/// TTLs in whole milliseconds from 1 ms to 30 days: `timestamptz` has microsecond precision, and
/// a lease longer than a month is a configuration mistake, not a lock.
const TTL: TtlRange = TtlRange::new(
    Duration::from_millis(1),
    Duration::from_secs(30 * 24 * 3600),
    Duration::from_millis(1),
);

/// The statements, with the validated table name in place, prepared once per connection.
///
/// # Why `statement_timestamp()`
/// Only the database's clock decides expiry, and it must be read once per statement:
/// * `now()` is frozen at the start of the *transaction*. Inside a caller's long transaction, or
///   a transaction held open by a pooler, it can be far in the past: a renewal would then see an
///   expired lease as live.
/// * `clock_timestamp()` changes while the statement runs, so the expiry check and the new
///   expiry could be computed from two different instants.
/// * `statement_timestamp()` is one instant, taken when the statement arrived: after the client
///   sent it (so the client's deadline, counted from before sending, ends first), and before any
///   wait for a row lock (so a check after such a wait errs towards "still held").
#[derive(Debug, Clone)]
struct Statements {
    acquire: SqlStr,
    acquire_or_remaining: SqlStr,
    renew: SqlStr,
    release: SqlStr,
}

fn sql(s: String) -> SqlStr {
    // Every statement is built from constants and a `TableName`, whose parts are validated to
    // `[A-Za-z_][A-Za-z0-9_]*` and quoted: nothing from a user reaches the text unchecked.
    AssertSqlSafe(s).into_sql_str()
}

impl Statements {
    fn new(t: &TableName) -> Self {
        let upsert = format!(
            "INSERT INTO {t} AS l (lock_key, owner, fence, expires_at) \
             VALUES ($1, $2, 1, statement_timestamp() + $3::float8 * interval '1 millisecond') \
             ON CONFLICT (lock_key) DO UPDATE \
             SET owner = excluded.owner, fence = l.fence + 1, expires_at = excluded.expires_at \
             WHERE l.expires_at <= statement_timestamp() \
             RETURNING fence"
        );
        Statements {
            acquire: sql(upsert.clone()),
            // The CTE's insert is invisible to the outer SELECT, which therefore reads the
            // current holder's expiry: the waiter's fallback timer, in the same round trip.
            acquire_or_remaining: sql(format!(
                "WITH won AS ({upsert}) \
                 SELECT (SELECT fence FROM won), \
                        (SELECT greatest(0, ceil(extract(epoch FROM expires_at - statement_timestamp()) * 1000))::bigint \
                           FROM {t} WHERE lock_key = $1)"
            )),
            renew: sql(format!(
                "UPDATE {t} SET expires_at = statement_timestamp() + $4::float8 * interval '1 millisecond' \
                 WHERE lock_key = $1 AND owner = $2 AND fence = $3 AND expires_at > statement_timestamp()"
            )),
            // Release expires the row instead of deleting it, so the fence counter never
            // restarts, and announces the release to waiters when the transaction commits.
            release: sql(format!(
                "WITH released AS ( \
                   UPDATE {t} SET expires_at = statement_timestamp() \
                   WHERE lock_key = $1 AND owner = $2 AND fence = $3 AND expires_at > statement_timestamp() \
                   RETURNING lock_key) \
                 SELECT count(*) FROM (SELECT pg_notify('{channel}', $4 || ' ' || lock_key) FROM released) n",
                channel = notify::CHANNEL
            )),
        }
    }
}

/// The SQL that creates the lease table (what [`PostgresAuthority::migrate`] runs), for DBAs who
/// apply schema themselves.
pub fn schema_sql(table: &TableName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n\
         \x20   lock_key   text        PRIMARY KEY,\n\
         \x20   owner      text        NOT NULL,\n\
         \x20   fence      bigint      NOT NULL CHECK (fence > 0),\n\
         \x20   expires_at timestamptz NOT NULL\n\
         ) WITH (fillfactor = 70);"
    )
}

struct Inner {
    pool: PgPool,
    config: PostgresConfig,
    capabilities: Capabilities,
    statements: Statements,
    waiters: Arc<Waiters>,
    listener: Mutex<Option<(JoinHandle<()>, watch::Receiver<bool>)>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some((task, _)) = self.listener.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
    }
}

/// A PostgreSQL lease table as an [`Authority`].
///
/// * Acquire is one `INSERT ... ON CONFLICT DO UPDATE ... WHERE expires_at <= statement_timestamp()`:
///   zero rows means someone else holds the key. The row's `fence` counter goes up with every
///   acquisition and is the fence.
/// * Renew and release are `UPDATE`s matched on key, owner token and fence, and only while the
///   lease is live; release expires the row (the counter is kept) and `NOTIFY`s waiters.
/// * Waiting: one `LISTEN` connection per authority wakes waiters on release; a timer at the
///   holder's expiry (with jitter) covers holders that vanish.
/// * Leases are rows, not session advisory locks, so it works behind a transaction-pooling proxy
///   such as PgBouncer.
///
/// Clones share the pool and the listener.
#[derive(Clone)]
pub struct PostgresAuthority {
    inner: Arc<Inner>,
}

impl fmt::Debug for PostgresAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresAuthority")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl PostgresAuthority {
    /// Connects with a `postgres://` URL (see [`PostgresConfig::from_url`]). Fails with
    /// `Unauthorized` on bad credentials and `Unavailable` when the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::with_config(PostgresConfig::from_url(url)?).await
    }

    /// Connects with a parsed configuration.
    pub async fn with_config(config: PostgresConfig) -> Result<Self> {
        let timeout = config.client.request_timeout;
        let pool = PgPoolOptions::new()
            .max_connections(config.pool_size)
            .acquire_timeout(timeout)
            .connect_with(config.connect.clone());
        let pool = tokio::time::timeout(timeout, pool)
            .await
            .map_err(|_| errors::timed_out("connect", timeout))?
            .map_err(|e| errors::map(e, "connect", &config.table))?;
        let capabilities = Capabilities::new(BACKEND, FenceSafety::Linearizable, true, TTL);
        Ok(PostgresAuthority {
            inner: Arc::new(Inner {
                statements: Statements::new(&config.table),
                pool,
                config,
                capabilities,
                waiters: Arc::default(),
                listener: Mutex::new(None),
            }),
        })
    }

    /// Creates the lease table if it does not exist (idempotent, safe to run concurrently).
    /// The same SQL is in [`schema_sql`] and docs/postgres.md.
    pub async fn migrate(&self) -> Result<()> {
        let table = &self.inner.config.table;
        let work = async {
            let mut tx = self.inner.pool.begin().await?;
            // Concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog; serialise.
            sqlx::query("SELECT pg_advisory_xact_lock(hashtext('leasehold migrate ' || $1))")
                .bind(table.plain())
                .execute(&mut *tx)
                .await?;
            sqlx::query(sql(schema_sql(table)))
                .execute(&mut *tx)
                .await?;
            tx.commit().await
        };
        self.bounded("migrate", work).await
    }

    /// The connection pool (for guarded writes in the same database).
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The lease table.
    pub fn table(&self) -> &TableName {
        &self.inner.config.table
    }

    async fn bounded<T>(
        &self,
        what: &str,
        work: impl Future<Output = std::result::Result<T, sqlx::Error>>,
    ) -> Result<T> {
        let timeout = self.inner.config.client.request_timeout;
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| errors::timed_out(what, timeout))?
            .map_err(|e| errors::map(e, what, &self.inner.config.table))
    }

    fn grant(
        &self,
        key: &LockKey,
        owner: OwnerToken,
        raw: i64,
        ttl: Duration,
        sent: Instant,
    ) -> Result<Grant> {
        let token = PgFence::from_column(raw)?;
        let fence = token.to_fence(BACKEND, self.inner.config.client.epoch)?;
        let deadline = self.inner.config.client.safety_margin.deadline(sent, ttl);
        Ok(Grant::new(key.clone(), owner, fence, ttl, deadline))
    }

    /// Starts the listening connection on first use and waits (bounded) until it listens, so
    /// the first waiter does not miss a release that happens right away.
    async fn listening(&self) {
        let mut ready = {
            let mut slot = self
                .inner
                .listener
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match &*slot {
                Some((task, ready)) if !task.is_finished() => ready.clone(),
                _ => {
                    let (tx, rx) = watch::channel(false);
                    let task = tokio::spawn(notify::listen(
                        self.inner.pool.clone(),
                        self.inner.waiters.clone(),
                        self.inner.config.table.plain(),
                        tx,
                    ));
                    *slot = Some((task, rx.clone()));
                    rx
                }
            }
        };
        let timeout = self.inner.config.client.request_timeout;
        let _ = tokio::time::timeout(timeout, ready.wait_for(|r| *r)).await;
    }

    fn owner_matches(grant: &Grant) -> (String, String, i64) {
        (
            grant.key().as_str().to_string(),
            grant.owner().to_hex(),
            // A fence's raw part is at most 2^48-1, so it always fits.
            grant.fence().raw() as i64,
        )
    }
}

fn ttl_ms(ttl: Duration) -> f64 {
    ttl.as_millis() as f64
}

#[async_trait]
impl Authority for PostgresAuthority {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Grant>> {
        TTL.check(ttl)?;
        let owner = OwnerToken::generate()?;
        let owner_hex = owner.to_hex();
        let sent = Instant::now();
        let fence: Option<i64> = self
            .bounded(
                "acquire",
                sqlx::query_scalar(self.inner.statements.acquire.clone())
                    .bind(key.as_str())
                    .bind(&owner_hex)
                    .bind(ttl_ms(ttl))
                    .fetch_optional(&self.inner.pool),
            )
            .await?;
        fence
            .map(|raw| self.grant(key, owner, raw, ttl, sent))
            .transpose()
    }

    async fn acquire(&self, key: &LockKey, ttl: Duration, max_wait: Duration) -> Result<Grant> {
        TTL.check(ttl)?;
        let start = Instant::now();
        let give_up = start + max_wait;
        let notify = self.inner.waiters.for_key(key.as_str());
        self.listening().await;
        loop {
            // Register for the release notification before the attempt, so a release between
            // the attempt and the wait is not missed.
            let mut released = pin!(notify.notified());
            released.as_mut().enable();
            let owner = OwnerToken::generate()?;
            let owner_hex = owner.to_hex();
            let sent = Instant::now();
            let (fence, remaining_ms): (Option<i64>, Option<i64>) = self
                .bounded(
                    "acquire",
                    sqlx::query_as(self.inner.statements.acquire_or_remaining.clone())
                        .bind(key.as_str())
                        .bind(&owner_hex)
                        .bind(ttl_ms(ttl))
                        .fetch_one(&self.inner.pool),
                )
                .await?;
            if let Some(raw) = fence {
                return self.grant(key, owner, raw, ttl, sent);
            }
            let now = Instant::now();
            if now >= give_up {
                return Err(Error::Timeout {
                    key: key.to_string(),
                    waited: now - start,
                });
            }
            // Fallback for a holder that vanishes without releasing: look again when its lease
            // ends by the database's clock (a duration, never compared with our wall clock),
            // with jitter so waiters do not arrive together.
            let remaining = Duration::from_millis(remaining_ms.unwrap_or(0).max(0) as u64);
            let jitter =
                leasehold_core::Backoff::new(Duration::from_millis(2), Duration::from_millis(20))
                    .next_delay();
            let wake = (now + remaining + jitter).min(give_up);
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Instant> {
        TTL.check(ttl)?;
        let (key, owner, fence) = Self::owner_matches(grant);
        let sent = Instant::now();
        let done = self
            .bounded(
                "renew",
                sqlx::query(self.inner.statements.renew.clone())
                    .bind(&key)
                    .bind(&owner)
                    .bind(fence)
                    .bind(ttl_ms(ttl))
                    .execute(&self.inner.pool),
            )
            .await?;
        if done.rows_affected() != 1 {
            return Err(Error::lease_lost(key, LostReason::Refused));
        }
        Ok(self.inner.config.client.safety_margin.deadline(sent, ttl))
    }

    async fn release(&self, grant: &Grant) -> Result<Released> {
        let (key, owner, fence) = Self::owner_matches(grant);
        let released: i64 = self
            .bounded(
                "release",
                sqlx::query_scalar(self.inner.statements.release.clone())
                    .bind(&key)
                    .bind(&owner)
                    .bind(fence)
                    .bind(self.inner.config.table.plain())
                    .fetch_one(&self.inner.pool),
            )
            .await?;
        Ok(if released > 0 {
            Released::Released
        } else {
            Released::AlreadyGone
        })
    }
}

//! The MySQL/MariaDB authority: leases are rows, the server's clock decides expiry.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::backend::{claim_or_give_back, Backoff, Left};
use leasehold_core::time::saturating_add;
use leasehold_core::{
    Authority, Capabilities, Error, Fence, Grant, Inspection, Instant, KeyPrefix, LockKey,
    LostReason, OwnerId, OwnerToken, Released, Result, Revoked, TtlRange, WaitStrategy,
};
use leasehold_sql_common::{open_pool, plain, warn_if_overridden, Once, Sender};
use sqlx::{AssertSqlSafe, MySqlConnection, MySqlPool, Row, SqlStr};

use crate::config::MysqlConfig;
use crate::dialect::Mysql;
use crate::errors::{self, BACKEND};
use crate::replication::{declare, Settings, SETTINGS};
use crate::statements::{schema_sql, Statements};
use crate::table::TableName;

/// TTLs as every SQL lease table takes them (`DATETIME(6)` has microsecond precision).
const TTL: TtlRange = leasehold_sql_common::LEASE_TTL;

/// A waiter's polling delays: the first look again comes soon (a hand-off between processes
/// has no other signal), later ones back off with jitter so waiters do not arrive together.
const POLL_FIRST: Duration = Duration::from_millis(5);
const POLL_CAP: Duration = Duration::from_millis(250);

struct Inner {
    pool: MySqlPool,
    /// The lanes lease statements are sent on.
    sender: Arc<Sender<Mysql>>,
    config: MysqlConfig,
    capabilities: Capabilities,
    statements: Statements,
}

impl Inner {
    fn timeout(&self) -> Duration {
        self.config.client.request_timeout
    }

    /// A statement sent on this authority's lanes (see [`Sender::bounded`]), with this
    /// table's errors.
    async fn bounded<T: Send + 'static>(
        &self,
        what: &str,
        give_up: Instant,
        once: impl for<'c> Fn(&'c mut MySqlConnection) -> Once<'c, T> + Send + Sync + 'static,
    ) -> Result<T> {
        let table = &self.config.table;
        self.sender
            .bounded(what, give_up, self.timeout(), plain(once), |e| {
                errors::map(e, what, table)
            })
            .await
    }

    /// An `UPDATE` matched on the grant (`statement` takes `first` before the grant's key,
    /// owner and fence): whether it matched the row.
    async fn matched(
        &self,
        what: &str,
        statement: SqlStr,
        first: Option<First>,
        (key, owner, fence): (String, String, u64),
        give_up: Instant,
    ) -> Result<bool> {
        let found = self
            .bounded(what, give_up, move |c| {
                let (statement, first, key, owner) =
                    (statement.clone(), first.clone(), key.clone(), owner.clone());
                Box::pin(async move {
                    let query = sqlx::query(statement);
                    let query = match first {
                        Some(First::Ttl(us)) => query.bind(us),
                        Some(First::Value(value)) => query.bind(value),
                        None => query,
                    };
                    query
                        .bind(key)
                        .bind(owner)
                        .bind(fence)
                        .execute(c)
                        .await
                        .map(|done| done.rows_affected())
                })
            })
            .await?;
        // The driver asks for found rows: 1 when the grant's row matched, even if a renewal in
        // the same microsecond left it as it was.
        Ok(found == 1)
    }

    /// Releases a lease nobody was told about (its acquisition was cancelled, or its fence
    /// could not be used), so that the key is free at once instead of after its TTL (see
    /// [`leasehold_sql_common::give_back`]).
    async fn give_back(&self, key: String, owner: String, raw: u64, ttl: Duration) {
        leasehold_sql_common::give_back(ttl, self.timeout(), |give_up| {
            let grant = (key.clone(), owner.clone(), raw);
            let statement = self.statements.release.clone();
            self.matched("give back", statement, None, grant, give_up)
        })
        .await
    }
}

mod acquisition;
mod batch_renewal;
mod set_acquisition;

pub(crate) use set_acquisition::set_statements;

/// The parameter an `UPDATE` takes before the grant's.
#[derive(Clone)]
enum First {
    Ttl(u64),
    Value(Vec<u8>),
}

fn ttl_us(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX)
}

/// A MySQL/MariaDB lease table as an [`Authority`].
///
/// * Acquire is one `INSERT ... ON DUPLICATE KEY UPDATE` that takes the row only if its lease
///   is over by `UTC_TIMESTAMP(6)`, raising the row's `fence` counter, which is the fence (it
///   comes back as the reply's `last_insert_id`; 0 means someone else holds the key). The
///   statement runs to its answer even when its caller is cancelled, and a lease it took for
///   nobody is given back.
/// * Renew, release and proclaim are `UPDATE`s matched on key, owner token and fence, and only
///   while the lease is live; release expires the row (the counter is kept).
/// * Waiting is jittered polling ([`WaitStrategy::Polling`]): `GET_LOCK` would pin a
///   connection per waiter and per holder (see docs/mysql.md).
/// * Statements run on lanes (connections kept while they work) shared with the PostgreSQL
///   authority's design: every wait, for a lane or an answer, ends at the caller's time.
///
/// Clones share the lanes and the pool.
#[derive(Clone)]
pub struct MysqlAuthority {
    inner: Arc<Inner>,
}

impl fmt::Debug for MysqlAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlAuthority")
            .field("config", &self.inner.config)
            .field("fence_safety", &self.inner.capabilities.fence_safety)
            .field("durable_fences", &self.inner.capabilities.durable_fences)
            .finish_non_exhaustive()
    }
}

impl MysqlAuthority {
    /// Connects with a `mysql://` or `mariadb://` URL (see [`MysqlConfig::from_url`]). Fails
    /// with `Unauthorized` on bad credentials and `Unavailable` when the server cannot be
    /// reached.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::with_config(MysqlConfig::from_url(url)?).await
    }

    /// Connects with a parsed configuration, and reads what the server's settings promise for
    /// fences (see [`Capabilities::fence_safety`] and docs/mysql.md).
    pub async fn with_config(config: MysqlConfig) -> Result<Self> {
        let read_settings = |pool: MySqlPool| async move {
            // The text protocol: not every server prepares SHOW.
            let rows = sqlx::raw_sql(AssertSqlSafe(SETTINGS))
                .fetch_all(&pool)
                .await?;
            let mut settings = Settings::default();
            for row in rows {
                settings.0.push((row.try_get(0)?, row.try_get(1)?));
            }
            Ok(settings)
        };
        let (pool, settings) = open_pool::<Mysql, _, _>(
            &config.connect,
            config.pool_size,
            config.client.request_timeout,
            read_settings,
            |e| errors::map(e, "connect", &config.table),
        )
        .await?;
        let (safety, durable) = declare(&settings, config.fence_safety);
        warn_if_overridden(
            config.fence_safety,
            safety,
            "with innodb_flush_log_at_trx_commit=0 a crash can lose the last commits",
        );
        tracing::debug!(?settings, ?safety, durable, "fence safety read at connect");
        let capabilities = Capabilities::new(BACKEND, safety, durable, TTL)
            .with_wait(WaitStrategy::Polling)
            .with_batch_renewal(true)
            .with_atomic_acquire_all(true);
        Ok(MysqlAuthority {
            inner: Arc::new(Inner {
                statements: Statements::new(&config.table),
                sender: Arc::new(Sender::new(
                    config.connect.clone(),
                    config.pool_size as usize,
                )),
                pool,
                config,
                capabilities,
            }),
        })
    }

    /// Creates the lease table if it does not exist. Idempotent, safe to run concurrently and
    /// while leases are in use. The same SQL is in [`crate::schema_sql`] and docs/mysql.md.
    pub async fn migrate(&self) -> Result<()> {
        let table = &self.inner.config.table;
        let timeout = self.inner.timeout();
        let create = schema_sql(table);
        let work = async {
            let mut conn = self.inner.pool.acquire().await?;
            sqlx::raw_sql(AssertSqlSafe(create))
                .execute(&mut *conn)
                .await
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| errors::timed_out("migrate", timeout))?
            .map_err(|e| errors::map(e, "migrate", table))?;
        Ok(())
    }

    /// The connection pool (for guarded writes in the same database, and for tools).
    pub fn pool(&self) -> &MySqlPool {
        &self.inner.pool
    }

    /// The lease table.
    pub fn table(&self) -> &TableName {
        &self.inner.config.table
    }

    fn grant(
        &self,
        key: &LockKey,
        owner: OwnerToken,
        raw: u64,
        ttl: Duration,
        sent: Instant,
    ) -> Result<Grant> {
        let fence = Fence::compose(
            BACKEND,
            self.inner.config.client.epoch,
            raw,
            self.inner.capabilities.fence_safety,
        )?;
        let deadline = self.inner.config.client.safety_margin.deadline(sent, ttl);
        Ok(leasehold_core::backend::grant(
            key.clone(),
            owner,
            fence,
            ttl,
            deadline,
        ))
    }

    /// One acquisition attempt: the grant, or `None` when the key is held. This side waits for
    /// the statement's answer up to the request timeout; if it stops waiting first (cancelled),
    /// the statement finishes in a task of its own, and a lease it took is given back (see
    /// [`claim_or_give_back`]).
    async fn attempt(&self, key: &LockKey, ttl: Duration) -> Result<Option<Grant>> {
        let owner = OwnerToken::generate()?;
        let owner_hex = owner.to_hex();
        let sent = Instant::now();
        let give_up = saturating_add(sent, self.inner.timeout());
        let request = {
            let (inner, key, owner) = (
                self.inner.clone(),
                key.as_str().to_string(),
                owner_hex.clone(),
            );
            move |_: Left| async move { inner.acquire_statement(key, owner, ttl, give_up).await }
        };
        let give_back = {
            let (inner, key, owner) = (
                self.inner.clone(),
                key.as_str().to_string(),
                owner_hex.clone(),
            );
            move |raw: u64| {
                let (inner, key, owner) = (inner.clone(), key.clone(), owner.clone());
                async move { inner.give_back(key, owner, raw, ttl).await }
            }
        };
        let won = |taken: &std::result::Result<u64, sqlx::Error>| {
            taken.as_ref().ok().copied().filter(|raw| *raw > 0)
        };
        let taken = claim_or_give_back(request, give_up, won, give_back)
            .await
            .map_err(|why| why.into_error(BACKEND, "acquire", self.inner.timeout()))?
            .map_err(|e| errors::map(e, "acquire", &self.inner.config.table))?;
        if taken == 0 {
            return Ok(None);
        }
        match self.grant(key, owner, taken, ttl, sent) {
            Ok(grant) => Ok(Some(grant)),
            Err(e) => {
                let (inner, key) = (self.inner.clone(), key.as_str().to_string());
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move { inner.give_back(key, owner_hex, taken, ttl).await });
                }
                Err(e)
            }
        }
    }

    fn owner_matches(grant: &Grant) -> (String, String, u64) {
        (
            grant.key().as_str().to_string(),
            grant.owner().to_hex(),
            grant.fence().raw(),
        )
    }
}

#[async_trait]
impl Authority for MysqlAuthority {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Grant>> {
        TTL.check(ttl)?;
        self.attempt(key, ttl).await
    }

    /// One transaction over the set (see `set_acquisition`).
    async fn try_acquire_all(&self, keys: &[LockKey], ttl: Duration) -> Result<Option<Vec<Grant>>> {
        self.acquire_set(keys, ttl).await
    }

    /// Jittered polling: the acquisition statement again after 5 ms, backing off to 250 ms,
    /// never past `max_wait` (an attempt in flight at that moment is the "one request" the
    /// contract allows beyond it).
    async fn acquire(&self, key: &LockKey, ttl: Duration, max_wait: Duration) -> Result<Grant> {
        TTL.check(ttl)?;
        let start = Instant::now();
        let give_up = saturating_add(start, max_wait);
        let mut poll = Backoff::new(POLL_FIRST, POLL_CAP);
        loop {
            if let Some(grant) = self.attempt(key, ttl).await? {
                return Ok(grant);
            }
            let now = Instant::now();
            if now >= give_up {
                return Err(Error::Timeout {
                    key: key.to_string(),
                    waited: now - start,
                });
            }
            let next = saturating_add(now, poll.next_delay());
            tokio::time::sleep_until(next.min(give_up)).await;
        }
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Instant> {
        TTL.check(ttl)?;
        let sent = Instant::now();
        let renewed = self
            .inner
            .matched(
                "renew",
                self.inner.statements.renew.clone(),
                Some(First::Ttl(ttl_us(ttl))),
                Self::owner_matches(grant),
                saturating_add(sent, self.inner.timeout()),
            )
            .await?;
        if !renewed {
            return Err(Error::lease_lost(grant.key().as_str(), LostReason::Refused));
        }
        Ok(self.inner.config.client.safety_margin.deadline(sent, ttl))
    }

    /// Two statements per thousand grants (see `batch_renewal`).
    async fn renew_many(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
        self.inner.renew_batch(grants).await
    }

    async fn release(&self, grant: &Grant) -> Result<Released> {
        let released = self
            .inner
            .matched(
                "release",
                self.inner.statements.release.clone(),
                None,
                Self::owner_matches(grant),
                saturating_add(Instant::now(), self.inner.timeout()),
            )
            .await?;
        Ok(if released {
            Released::Released
        } else {
            Released::AlreadyGone
        })
    }

    /// One `UPDATE`, matched as renew is, that stamps the value with the grant's fence.
    async fn proclaim(&self, grant: &Grant, value: &[u8]) -> Result<()> {
        leasehold_core::backend::check_proclaimed(value)?;
        let proclaimed = self
            .inner
            .matched(
                "proclaim",
                self.inner.statements.proclaim.clone(),
                Some(First::Value(value.to_vec())),
                Self::owner_matches(grant),
                saturating_add(Instant::now(), self.inner.timeout()),
            )
            .await?;
        if !proclaimed {
            return Err(Error::lease_lost(grant.key().as_str(), LostReason::Refused));
        }
        Ok(())
    }

    /// One `UPDATE` (see the statement) that expires the live row and answers its fence; the
    /// holder's next renewal finds it expired and is refused.
    async fn revoke(&self, key: &LockKey) -> Result<Revoked> {
        let statement = self.inner.statements.revoke.clone();
        let name = key.as_str().to_string();
        let (found, raw) = self
            .inner
            .bounded(
                "revoke",
                saturating_add(Instant::now(), self.inner.timeout()),
                move |c| {
                    let (statement, name) = (statement.clone(), name.clone());
                    Box::pin(async move {
                        sqlx::query(statement)
                            .bind(name)
                            .execute(c)
                            .await
                            .map(|done| (done.rows_affected(), done.last_insert_id()))
                    })
                },
            )
            .await?;
        if found != 1 {
            return Ok(Revoked::WasFree);
        }
        let fence = Fence::compose(
            BACKEND,
            self.inner.config.client.epoch,
            raw,
            self.inner.capabilities.fence_safety,
        )?;
        Ok(Revoked::Revoked { fence })
    }

    /// Polling: nothing announces a change, so this sleeps one jittered poll interval (at most
    /// `max_wait`) and returns; the caller reads again.
    async fn wait_for_change(&self, key: &LockKey, max_wait: Duration) -> Result<()> {
        let _ = key;
        let poll = Backoff::new(POLL_CAP, POLL_CAP).next_delay();
        tokio::time::sleep(poll.min(max_wait)).await;
        Ok(())
    }

    /// Reads the key's row: the fence column is both the holder's fence (while live) and the
    /// last fence issued (release and expiry keep the row); liveness and the remaining time
    /// are the server's `UTC_TIMESTAMP(6)` against `expires_at`, never our clock.
    async fn inspect(&self, key: &LockKey) -> Result<Inspection> {
        let statement = self.inner.statements.inspect.clone();
        let name = key.as_str().to_string();
        type Row = (Vec<u8>, u64, i64, i64, Option<Vec<u8>>);
        let row: Option<Row> = self
            .inner
            .bounded(
                "inspect",
                saturating_add(Instant::now(), self.inner.timeout()),
                move |c| {
                    let (statement, name) = (statement.clone(), name.clone());
                    Box::pin(
                        async move { sqlx::query_as(statement).bind(name).fetch_optional(c).await },
                    )
                },
            )
            .await?;
        let Some((owner, raw, live, remaining_ms, value)) = row else {
            return Ok(Inspection::free(BACKEND, key.clone()));
        };
        let fence = Fence::compose(
            BACKEND,
            self.inner.config.client.epoch,
            raw,
            self.inner.capabilities.fence_safety,
        )?;
        let seen = if live == 1 {
            let owner = String::from_utf8_lossy(&owner);
            Inspection::held(BACKEND, key.clone(), OwnerId::from_stored(&owner))
                .with_fence(Some(fence))
                .with_remaining(Some(Duration::from_millis(remaining_ms.max(0) as u64)))
                .with_value(value)
        } else {
            Inspection::free(BACKEND, key.clone())
        };
        Ok(seen.with_last_fence(Some(fence)))
    }

    /// One plain read of the table's keys in the prefix's range: every key that was ever taken
    /// (rows outlive release), held or not.
    async fn list_keys(&self, prefix: &KeyPrefix, limit: usize) -> Result<Vec<LockKey>> {
        let statement = self.inner.statements.list_keys.clone();
        let start = prefix.as_str().as_bytes().to_vec();
        let upper = prefix.upper_bound().map(String::into_bytes);
        let limit = u64::try_from(limit).unwrap_or(u64::MAX);
        let names: Vec<Vec<u8>> = self
            .inner
            .bounded(
                "list_keys",
                saturating_add(Instant::now(), self.inner.timeout()),
                move |c| {
                    let (statement, start, upper) =
                        (statement.clone(), start.clone(), upper.clone());
                    Box::pin(async move {
                        sqlx::query_scalar(statement)
                            .bind(start)
                            .bind(upper.clone())
                            .bind(upper)
                            .bind(limit)
                            .fetch_all(c)
                            .await
                    })
                },
            )
            .await?;
        // A row some other program wrote that is not a valid key is not ours to list.
        Ok(names
            .into_iter()
            .filter_map(|name| String::from_utf8(name).ok())
            .filter_map(|name| LockKey::new(name).ok())
            .collect())
    }
}

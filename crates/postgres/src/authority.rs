//! The PostgreSQL authority: leases are rows, the database's clock decides expiry.

use std::fmt;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::backend::redact_url;
use leasehold_core::backend::{claim_or_give_back, Backoff, Left};
use leasehold_core::time::saturating_add;
use leasehold_core::{
    Authority, Capabilities, Error, FenceSafety, FencingToken, Grant, Inspection, Instant,
    KeyPrefix, LockKey, LostReason, OwnerId, OwnerToken, Released, Result, Revoked, TtlRange,
    WaitStrategy,
};
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row, SqlStr};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{FenceSafetyOption, Pooler, PostgresConfig};
use crate::dialect::Postgres;
use crate::errors::{self, BACKEND};
use crate::notify::{self, LastSeen, ListenConfig, Waiters};
use crate::statements::{
    add_columns_sql, create_sql, sql, Statements, ADDED, ADDED_COLUMNS, MARK_MAX,
};
use crate::table::TableName;
use crate::table_version::TableVersion;
use crate::token::PgFence;
use leasehold_sql_common::{open_pool, warn_if_overridden, Sender};

mod acquisition;
mod sending;
mod set_acquisition;

pub(crate) use set_acquisition::acquire_set_sql;

use acquisition::{spawn_give_back, won};

/// TTLs as every SQL lease table takes them (`timestamptz` has microsecond precision).
const TTL: TtlRange = leasehold_sql_common::LEASE_TTL;

/// While LISTEN is not in place, how often a [`Authority::wait_for_change`] looks again at
/// most: as waiters in `acquire` do, instead of waiting for a notification that cannot come.
const UNHEARD_POLL: Duration = Duration::from_millis(250);

struct Inner {
    pool: PgPool,
    /// The lanes lease statements are sent on, and acquisitions kept for their late answers.
    sender: Arc<Sender<Postgres>>,
    config: PostgresConfig,
    capabilities: Capabilities,
    statements: Statements,
    waiters: Arc<Waiters>,
    listener: Mutex<Option<(JoinHandle<()>, watch::Receiver<bool>)>>,
    /// Whether the table has `waited_until` (found by the statements that need it): the
    /// previous statements are used while it lacks it.
    version: Arc<TableVersion>,
    /// What inspect, attempts and marks last read of each key.
    seen: LastSeen,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some((task, _)) = self.listener.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
    }
}

impl Inner {
    fn timeout(&self) -> Duration {
        self.config.client.request_timeout
    }

    /// Whether lease statements are prepared under a name and kept on their connection (the
    /// driver's cache): not through a transaction-pooling proxy, where the next use of the name
    /// may reach a server connection that lacks it, or has another client's statement under it.
    fn named(&self) -> bool {
        self.config.pooler == Pooler::None
    }

    /// The release statement for one grant: how many rows it released (0 or 1). Notifies the
    /// key's waiters if one marked it.
    async fn release_statement(
        &self,
        what: &str,
        (key, owner, fence): (String, String, i64),
        give_up: Instant,
    ) -> Result<i64> {
        let (current, before) = (
            self.statements.release.clone(),
            self.statements.previous.release.clone(),
        );
        let (version, table, named) = (
            self.version.clone(),
            self.config.table.plain(),
            self.named(),
        );
        self.bounded(what, give_up, move |c| {
            let (current, before, key, owner, version, table) = (
                current.clone(),
                before.clone(),
                key.clone(),
                owner.clone(),
                version.clone(),
                table.clone(),
            );
            Box::pin(async move {
                let args = (key, owner, fence, table);
                if !version.release_sends_current() {
                    return release_once(before, named, &args, &mut *c).await;
                }
                match release_once(current, named, &args, &mut *c).await {
                    Err(e) if errors::is_undefined_column(&e) => {
                        version.found_previous(&args.3);
                        release_once(before, named, &args, &mut *c).await
                    }
                    other => {
                        if other.is_ok() {
                            version.found_current(&args.3);
                        }
                        other
                    }
                }
            })
        })
        .await
    }
}

/// The release statement (or its previous form): how many rows it released (its one column
/// says whether it notified, which nobody needs).
async fn release_once(
    statement: SqlStr,
    named: bool,
    (key, owner, fence, table): &(String, String, i64, String),
    c: &mut PgConnection,
) -> std::result::Result<i64, sqlx::Error> {
    sqlx::query_scalar::<_, bool>(statement)
        .persistent(named)
        .bind(key.clone())
        .bind(owner.clone())
        .bind(*fence)
        .bind(table.clone())
        .fetch_optional(c)
        .await
        .map(|row| i64::from(row.is_some()))
}

/// Which statement an acquisition attempt sends, and what a conflict with a concurrent
/// transaction that outlasts its retries means (see [`Inner::run`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// `try_acquire`: the plain upsert; such a conflict is an error.
    Try,
    /// `acquire`'s first look: the plain upsert, which takes a free key without a mark; such
    /// a conflict counts as held (the waiting form follows).
    First,
    /// A waiter's look: the upsert that takes the key or marks it waited on; such a conflict
    /// counts as held, and the waiter looks again soon.
    Waiting,
}

/// What one acquisition attempt found.
enum Attempt {
    Won(Grant),
    /// Held by someone else, for this long by the database's clock (`None`: not known, look
    /// again soon).
    Held(Option<Duration>),
}

/// Reads the server's replication settings and declares what its fences promise:
/// `(fence safety, durable across restart)`.
///
/// * `synchronous_commit = off`: a commit is acknowledged before its WAL is written, so even a
///   crash of this one server can lose the last acquisitions: neither failover-safe nor durable,
///   whatever the operator says.
/// * Otherwise a failover loses nothing only where every commit waits for a synchronous standby
///   to flush it (`synchronous_standby_names` set, `synchronous_commit` `on` or `remote_apply`);
///   `local` and `remote_write` (a standby's OS crash can lose it) do not count. An operator may
///   vouch for replication the settings cannot show (`fence_safety=linearizable`), or declare
///   fences unsafe regardless.
pub(crate) fn declare(
    synchronous_commit: &str,
    synchronous_standby_names: &str,
    option: FenceSafetyOption,
) -> (FenceSafety, bool) {
    if synchronous_commit == "off" {
        return (FenceSafety::FailoverUnsafe, false);
    }
    let waits_for_standby = !synchronous_standby_names.trim().is_empty()
        && matches!(synchronous_commit, "on" | "remote_apply");
    let safety = match option {
        FenceSafetyOption::Linearizable => FenceSafety::Linearizable,
        FenceSafetyOption::FailoverUnsafe => FenceSafety::FailoverUnsafe,
        FenceSafetyOption::Auto if waits_for_standby => FenceSafety::Linearizable,
        _ => FenceSafety::FailoverUnsafe,
    };
    (safety, true)
}

/// A PostgreSQL lease table as an [`Authority`].
///
/// * Acquire is one `INSERT ... ON CONFLICT DO UPDATE ... WHERE expires_at <= statement_timestamp()`:
///   zero rows means someone else holds the key. The row's `fence` counter goes up with every
///   acquisition and is the fence. The statement runs in its own task: a caller that is
///   cancelled or times out does not cut it off, and a lease it took for nobody is given back.
/// * Renew and release are `UPDATE`s matched on key, owner token and fence, and only while the
///   lease is live; release expires the row (the counter is kept) and `NOTIFY`s waiters.
/// * Waiting: one `LISTEN` connection per authority, outside the pool and checked every
///   `listen_check_ms`, wakes waiters on release; a timer at the holder's expiry (with jitter)
///   covers holders that vanish, and waiters re-try by timer while the listener is down.
/// * Proclaim is an `UPDATE` matched as renew is, that stores the value with the grant's fence
///   beside it (it counts only while that fence holds the row) and `NOTIFY`s like release, which
///   is what wakes `wait_for_change`.
/// * A conflict with a concurrent transaction (a `repeatable read` or `serializable` default)
///   is retried within the request timeout; a waiter treats it as "held".
/// * Leases are rows, not session advisory locks, so it can run behind a transaction-pooling
///   proxy such as PgBouncer, declared with `pooler=transaction` (see [`crate::Pooler`]):
///   unnamed statements, each in a transaction of its own, and waiters poll unless the
///   listening connection has a direct address.
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
            .field("fence_safety", &self.inner.capabilities.fence_safety)
            .field("durable_fences", &self.inner.capabilities.durable_fences)
            .finish_non_exhaustive()
    }
}

impl PostgresAuthority {
    /// Connects with a `postgres://` URL (see [`PostgresConfig::from_url`]). Fails with
    /// `Unauthorized` on bad credentials and `Unavailable` when the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::with_config(PostgresConfig::from_url(url)?).await
    }

    /// Connects with a parsed configuration, and reads what the server's replication settings
    /// promise for fences (see [`Capabilities::fence_safety`]).
    pub async fn with_config(config: PostgresConfig) -> Result<Self> {
        let listener_unverified = config
            .listen_connect
            .as_ref()
            .and_then(crate::config::unverified_tls);
        if let Some(mode) = crate::config::unverified_tls(&config.connect).or(listener_unverified) {
            tracing::warn!(
                url = %config.redacted_url,
                sslmode = mode,
                "the PostgreSQL server is not verified: anyone between here and it could answer \
                 as the lock authority; use sslmode=verify-full with sslrootcert"
            );
        } else if !matches!(
            config.connect.get_ssl_mode(),
            sqlx::postgres::PgSslMode::VerifyFull
        ) {
            tracing::debug!(
                url = %config.redacted_url,
                "the PostgreSQL server is not verified (a local connection)"
            );
        }
        let pooler = config.pooler;
        let read_settings = |pool: PgPool| async move {
            const SETTINGS: &str = "SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names')";
            match pooler {
                // The simple protocol through a transaction-pooling proxy: one message, so no
                // prepared statement whose parse and execution the proxy could split.
                Pooler::Transaction => {
                    let row = sqlx::raw_sql(AssertSqlSafe(SETTINGS))
                        .fetch_one(&pool)
                        .await?;
                    Ok((row.try_get(0)?, row.try_get(1)?))
                }
                _ => sqlx::query_as(SETTINGS).fetch_one(&pool).await,
            }
        };
        let (pool, (synchronous_commit, standby_names)): (_, (String, String)) =
            open_pool::<Postgres, _, _>(
                &config.connect,
                config.pool_size,
                config.client.request_timeout,
                read_settings,
                |e| errors::map(e, "connect", &config.table),
            )
            .await?;
        let (safety, durable) = declare(&synchronous_commit, &standby_names, config.fence_safety);
        warn_if_overridden(
            config.fence_safety,
            safety,
            "with synchronous_commit=off a crash can lose the last commits",
        );
        let wait = match (config.pooler, &config.listen_connect) {
            (Pooler::Transaction, None) => WaitStrategy::Polling,
            _ => WaitStrategy::Notification,
        };
        let capabilities = Capabilities::new(BACKEND, safety, durable, TTL)
            .with_batch_renewal(true)
            .with_atomic_acquire_all(true)
            .with_wait(wait);
        Ok(PostgresAuthority {
            inner: Arc::new(Inner {
                statements: Statements::new(&config.table),
                sender: Arc::new(Sender::new(
                    config.connect.clone(),
                    config.pool_size as usize,
                )),
                pool,
                config,
                capabilities,
                waiters: Arc::default(),
                listener: Mutex::new(None),
                version: Arc::default(),
                seen: LastSeen::default(),
            }),
        })
    }

    /// Creates the lease table if it does not exist, and adds the columns of this version to
    /// one an older version created (its rows are kept). Idempotent, safe to run concurrently
    /// and while leases are in use. The same SQL is in [`crate::schema_sql`] and docs/postgres.md.
    pub async fn migrate(&self) -> Result<()> {
        let table = &self.inner.config.table;
        let timeout = self.inner.timeout();
        // The column check below avoids ALTER TABLE when nothing is missing; when it runs, its
        // lock must not wait long behind a long transaction, or every lease statement on the
        // table queues behind it, and a timeout here would not stop the server's wait.
        let lock_ms = timeout.as_millis().clamp(1, i32::MAX as u128);
        let work = async {
            let mut tx = self.inner.pool.begin().await?;
            // Concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog; serialise.
            // Unnamed statements (`persistent(false)`): run once, and a name kept on the
            // connection would outlive it on a transaction-pooling proxy's server connection.
            sqlx::query("SELECT pg_advisory_xact_lock(hashtext('leasehold migrate ' || $1))")
                .persistent(false)
                .bind(table.plain())
                .execute(&mut *tx)
                .await?;
            sqlx::query(sql(format!("SET LOCAL lock_timeout = {lock_ms}")))
                .persistent(false)
                .execute(&mut *tx)
                .await?;
            sqlx::query(sql(create_sql(table)))
                .persistent(false)
                .execute(&mut *tx)
                .await?;
            let present: i64 = sqlx::query_scalar(ADDED_COLUMNS)
                .persistent(false)
                .bind(table.to_string())
                .fetch_one(&mut *tx)
                .await?;
            if present < ADDED {
                sqlx::query(sql(add_columns_sql(table)))
                    .persistent(false)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| errors::timed_out("migrate", timeout))?
            .map_err(|e| errors::map(e, "migrate", table))?;
        // The table has every column of this version now.
        self.inner.version.found_current(&table.plain());
        Ok(())
    }

    /// The connection pool (for guarded writes in the same database).
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The lease table.
    pub fn table(&self) -> &TableName {
        &self.inner.config.table
    }

    /// The uncontended acquisition and the release exactly as this authority sends them, for
    /// `leasehold-bench`'s reference pair (which must not drift from them). Parameters: key,
    /// owner, TTL in milliseconds (`float8`); key, owner, fence, table. Not a stable interface.
    #[doc(hidden)]
    pub fn hot_path_statements(&self) -> (&str, &str) {
        let statements = &self.inner.statements;
        (statements.acquire.as_str(), statements.release.as_str())
    }

    fn grant(
        &self,
        key: &LockKey,
        owner: OwnerToken,
        raw: i64,
        ttl: Duration,
        sent: Instant,
    ) -> Result<Grant> {
        let token = PgFence::from_column(raw, self.inner.capabilities.fence_safety)?;
        let fence = token.to_fence(BACKEND, self.inner.config.client.epoch)?;
        let deadline = self.inner.config.client.safety_margin.deadline(sent, ttl);
        Ok(leasehold_core::backend::grant(
            key.clone(),
            owner,
            fence,
            ttl,
            deadline,
        ))
    }

    /// One acquisition attempt. This side waits for the statement's answer up to the request
    /// timeout; if it stops waiting first, the statement finishes in a task of its own. Either
    /// way a lease the statement takes is handed over or given back (see
    /// [`claim_or_give_back`]).
    async fn attempt(&self, key: &LockKey, ttl: Duration, form: Form) -> Result<Attempt> {
        let waiting = form == Form::Waiting;
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
            move |_: Left| async move {
                inner
                    .acquire_statement(key, owner, ttl, waiting, give_up)
                    .await
            }
        };
        let give_back = {
            let (inner, key, owner) = (
                self.inner.clone(),
                key.as_str().to_string(),
                owner_hex.clone(),
            );
            move |raw: i64| {
                let (inner, key, owner) = (inner.clone(), key.clone(), owner.clone());
                async move { inner.give_back(key, owner, raw, ttl, false).await }
            }
        };
        let acquired = claim_or_give_back(request, give_up, won, give_back)
            .await
            .map_err(|why| why.into_error(BACKEND, "acquire", self.inner.timeout()))?;
        match acquired {
            Err(e) if form != Form::Try && errors::is_conflict(&e) => Ok(Attempt::Held(None)),
            Err(e) => Err(errors::map_lease(e, "acquire", &self.inner.config.table)),
            Ok((Some(raw), _)) => match self.grant(key, owner, raw, ttl, sent) {
                Ok(grant) => Ok(Attempt::Won(grant)),
                Err(e) => {
                    spawn_give_back(&self.inner, key.as_str(), &owner_hex, raw, ttl, false);
                    Err(e)
                }
            },
            Ok((None, remaining_ms)) => {
                self.inner.seen.record(key.as_str(), None, true);
                Ok(Attempt::Held(
                    remaining_ms.map(|ms| Duration::from_millis(ms.max(0) as u64)),
                ))
            }
        }
    }

    /// Starts the listening connection on first use (without waiting for it: when it starts
    /// listening it wakes every waiter, so a release before that is not missed) and returns
    /// whether it listens now.
    fn listening(&self) -> watch::Receiver<bool> {
        if self.inner.config.pooler == Pooler::Transaction
            && self.inner.config.listen_connect.is_none()
        {
            // No LISTEN through a transaction-pooling proxy: the session that listens is
            // whichever server connection the proxy gave `LISTEN` to, and its notifications go
            // to whichever client holds that connection later (measured on PgBouncer 1.18:
            // none arrived). Without a direct address to listen at (`listen_host`,
            // `listen_port`), waiters poll, as declared.
            return watch::channel(false).1;
        }
        let mut slot = self
            .inner
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match &*slot {
            Some((task, ready)) if !task.is_finished() => ready.clone(),
            _ => {
                let (tx, rx) = watch::channel(false);
                let config = ListenConfig {
                    connect: self
                        .inner
                        .config
                        .listen_connect
                        .clone()
                        .unwrap_or_else(|| self.inner.config.connect.clone()),
                    timeout: self.inner.timeout(),
                    check_every: self.inner.config.listen_check,
                    table: self.inner.config.table.plain(),
                };
                let task = tokio::spawn(notify::listen(config, self.inner.waiters.clone(), tx));
                *slot = Some((task, rx.clone()));
                rx
            }
        }
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
        Ok(match self.attempt(key, ttl, Form::Try).await? {
            Attempt::Won(grant) => Some(grant),
            Attempt::Held(_) => None,
        })
    }

    /// One statement over the set (see `set_acquisition`).
    async fn try_acquire_all(&self, keys: &[LockKey], ttl: Duration) -> Result<Option<Vec<Grant>>> {
        self.acquire_set(keys, ttl).await
    }

    async fn acquire(&self, key: &LockKey, ttl: Duration, max_wait: Duration) -> Result<Grant> {
        TTL.check(ttl)?;
        let start = Instant::now();
        let give_up = saturating_add(start, max_wait);
        let timed_out = |now: Instant| Error::Timeout {
            key: key.to_string(),
            waited: now - start,
        };
        // A free key is taken by the plain upsert, as `try_acquire` takes it: the waiting form
        // (which marks a held key and reads how long its holder has left) and the listening
        // connection are for a key that is held (measured: an uncontended `acquire()` pair
        // cost 1.10x `try_acquire()`'s with them; see docs/performance-log.md). A held key then
        // costs one more round trip, before the wait.
        if let Attempt::Won(grant) = self.attempt(key, ttl, Form::First).await? {
            return Ok(grant);
        }
        let now = Instant::now();
        if now >= give_up {
            return Err(timed_out(now));
        }
        let registered = self.inner.waiters.for_key(key.as_str());
        let listening = self.listening();
        // While the listener is down (or an attempt could not tell how long the holder has
        // left), look again after a short jittered delay.
        let mut poll = Backoff::new(Duration::from_millis(20), Duration::from_millis(250));
        loop {
            // Register for the release notification before the attempt, so a release between
            // the attempt and the wait is not missed.
            let mut released = pin!(registered.notify().notified());
            released.as_mut().enable();
            let remaining = match self.attempt(key, ttl, Form::Waiting).await? {
                Attempt::Won(grant) => return Ok(grant),
                Attempt::Held(remaining) => remaining,
            };
            let now = Instant::now();
            if now >= give_up {
                return Err(timed_out(now));
            }
            // Fallback for a holder that vanishes without releasing: look again when its lease
            // ends by the database's clock (a duration, never compared with our wall clock),
            // with jitter so waiters do not arrive together.
            let jitter =
                Backoff::new(Duration::from_millis(2), Duration::from_millis(20)).next_delay();
            let mut wake =
                saturating_add(now, remaining.unwrap_or_default().saturating_add(jitter));
            if remaining.is_none() || !*listening.borrow() {
                wake = wake.min(saturating_add(now, poll.next_delay()));
            } else {
                poll.reset();
            }
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep_until(wake.min(give_up)) => {}
            }
        }
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Instant> {
        TTL.check(ttl)?;
        let (key, owner, fence) = Self::owner_matches(grant);
        let sent = Instant::now();
        let statement = self.inner.statements.renew.clone();
        let named = self.inner.named();
        let done = self
            .inner
            .bounded(
                "renew",
                saturating_add(sent, self.inner.timeout()),
                move |c| {
                    let (statement, key, owner) = (statement.clone(), key.clone(), owner.clone());
                    Box::pin(async move {
                        sqlx::query(statement)
                            .persistent(named)
                            .bind(key)
                            .bind(owner)
                            .bind(fence)
                            .bind(ttl_ms(ttl))
                            .execute(c)
                            .await
                    })
                },
            )
            .await?;
        if done.rows_affected() != 1 {
            return Err(Error::lease_lost(grant.key().as_str(), LostReason::Refused));
        }
        Ok(self.inner.config.client.safety_margin.deadline(sent, ttl))
    }

    /// One statement renews the whole batch, each row checked as `renew` checks it.
    async fn renew_many(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
        if let Err(refused) = leasehold_core::backend::check_batch_ttls(grants, &TTL) {
            return refused;
        }
        let (mut keys, mut owners, mut fences, mut ttls) = (
            Vec::with_capacity(grants.len()),
            Vec::with_capacity(grants.len()),
            Vec::with_capacity(grants.len()),
            Vec::with_capacity(grants.len()),
        );
        for grant in grants {
            let (key, owner, fence) = Self::owner_matches(grant);
            keys.push(key);
            owners.push(owner);
            fences.push(fence);
            ttls.push(ttl_ms(grant.ttl()));
        }
        let sent = Instant::now();
        let statement = self.inner.statements.renew_many.clone();
        let named = self.inner.named();
        let renewed: Result<Vec<(String, i64)>> = self
            .inner
            .bounded(
                "renew",
                saturating_add(sent, self.inner.timeout()),
                move |c| {
                    let (statement, keys, owners, fences, ttls) = (
                        statement.clone(),
                        keys.clone(),
                        owners.clone(),
                        fences.clone(),
                        ttls.clone(),
                    );
                    Box::pin(async move {
                        sqlx::query_as(statement)
                            .persistent(named)
                            .bind(keys)
                            .bind(owners)
                            .bind(fences)
                            .bind(ttls)
                            .fetch_all(c)
                            .await
                    })
                },
            )
            .await;
        let renewed: std::collections::HashSet<(String, i64)> = match renewed {
            Ok(rows) => rows.into_iter().collect(),
            Err(e) => return leasehold_core::backend::batch_failed(e, grants.len()),
        };
        leasehold_core::backend::batch_answers(
            grants,
            sent,
            &self.inner.config.client.safety_margin,
            |_, grant| {
                let (key, _, fence) = Self::owner_matches(grant);
                renewed.contains(&(key, fence))
            },
        )
    }

    async fn release(&self, grant: &Grant) -> Result<Released> {
        let give_up = saturating_add(Instant::now(), self.inner.timeout());
        let released = self
            .inner
            .release_statement("release", Self::owner_matches(grant), give_up)
            .await?;
        Ok(if released > 0 {
            // Waiters of this authority need not wait for the notification to come back
            // through the listening connection (as Redis's release does too).
            self.inner.waiters.wake(grant.key().as_str());
            Released::Released
        } else {
            Released::AlreadyGone
        })
    }

    /// One conditional `UPDATE`, matched as renew is (owner token, fence, live by the
    /// database's clock), that stamps the value with the grant's fence and `NOTIFY`s the key's
    /// waiters in the same statement.
    async fn proclaim(&self, grant: &Grant, value: &[u8]) -> Result<()> {
        leasehold_core::backend::check_proclaimed(value)?;
        let (key, owner, fence) = Self::owner_matches(grant);
        let statement = self.inner.statements.proclaim.clone();
        let named = self.inner.named();
        let table = self.inner.config.table.plain();
        let value = value.to_vec();
        let proclaimed: i64 = self
            .inner
            .bounded(
                "proclaim",
                saturating_add(Instant::now(), self.inner.timeout()),
                move |c| {
                    let (statement, key, owner, value, table) = (
                        statement.clone(),
                        key.clone(),
                        owner.clone(),
                        value.clone(),
                        table.clone(),
                    );
                    Box::pin(async move {
                        sqlx::query_scalar(statement)
                            .persistent(named)
                            .bind(key)
                            .bind(owner)
                            .bind(fence)
                            .bind(value)
                            .bind(table)
                            .fetch_one(c)
                            .await
                    })
                },
            )
            .await?;
        if proclaimed != 1 {
            return Err(Error::lease_lost(grant.key().as_str(), LostReason::Refused));
        }
        Ok(())
    }

    /// One conditional `UPDATE` (see the statement): the live row expires now and its fence is
    /// returned; the holder's next renewal finds it expired and is refused.
    async fn revoke(&self, key: &LockKey) -> Result<Revoked> {
        let statement = self.inner.statements.revoke.clone();
        let named = self.inner.named();
        let table = self.inner.config.table.plain();
        let name = key.as_str().to_string();
        let row: Option<(i64, bool)> = self
            .inner
            .bounded(
                "revoke",
                saturating_add(Instant::now(), self.inner.timeout()),
                move |c| {
                    let (statement, name, table) = (statement.clone(), name.clone(), table.clone());
                    Box::pin(async move {
                        sqlx::query_as(statement)
                            .persistent(named)
                            .bind(name)
                            .bind(table)
                            .fetch_optional(c)
                            .await
                    })
                },
            )
            .await?;
        let Some((raw, _)) = row else {
            return Ok(Revoked::WasFree);
        };
        self.inner.waiters.wake(key.as_str());
        let fence = PgFence::from_column(raw, self.inner.capabilities.fence_safety)?
            .to_fence(BACKEND, self.inner.config.client.epoch)?;
        Ok(Revoked::Revoked { fence })
    }

    /// Woken by the key's release and proclaim notifications through the authority's one
    /// `LISTEN` connection. One `UPDATE` first marks the key waited on for as long as this wait
    /// lasts (at most an hour), so that its release notifies, and reads the newest version of
    /// the row: if it differs from this authority's last read of the key (a release or grant
    /// in between, which nobody announced), it returns at once. If the mark fails, the wait
    /// still happens, for at most 250 ms. A dropped wait gives up its local registration and
    /// leaves its mark, which holds nothing and blocks nobody: the key's releases notify until
    /// it runs out. A grant is not announced
    /// (acquire stays one plain upsert), nor an expiry: callers see those at their next read,
    /// within `max_wait`. While the listener is not in place, it looks again on a short timer.
    async fn wait_for_change(&self, key: &LockKey, max_wait: Duration) -> Result<()> {
        let now = Instant::now();
        let max_wait = max_wait.min(MARK_MAX);
        let mut until = saturating_add(now, max_wait);
        let registered = self.inner.waiters.for_key(key.as_str());
        let mut changed = pin!(registered.notify().notified());
        // Registered before looking at the listener: when it starts listening it wakes every
        // registered waiter, so nothing between the two is missed.
        changed.as_mut().enable();
        let listening = self.listening();
        // Marked even on a table found without `waited_until`: `migrate()` may have run in
        // another process since (on a table still old, the mark fails before it runs).
        {
            let statement = self.inner.statements.mark_waited.clone();
            let named = self.inner.named();
            let name = key.as_str().to_string();
            // Marked past the wait's end by the slack a waiter's own timer may need.
            let mark_ms = ttl_ms(max_wait.saturating_add(Duration::from_secs(1)));
            let give_up = until.min(saturating_add(now, self.inner.timeout()));
            let marked = self.inner.run(give_up, move |c| {
                let (statement, name) = (statement.clone(), name.clone());
                Box::pin(async move {
                    sqlx::query_as::<_, (i64, bool)>(statement)
                        .persistent(named)
                        .bind(name)
                        .bind(mark_ms)
                        .fetch_optional(c)
                        .await
                })
            });
            match tokio::time::timeout_at(give_up, marked).await {
                // Changed since the caller's read, before the mark could make it announced.
                Ok(Ok(Some((fence, live))))
                    if self.inner.seen.changed(key.as_str(), fence, live) =>
                {
                    self.inner
                        .version
                        .found_current(&self.inner.config.table.plain());
                    return Ok(());
                }
                Ok(Ok(_)) => self
                    .inner
                    .version
                    .found_current(&self.inner.config.table.plain()),
                Ok(Err(e)) if errors::is_undefined_column(&e) => {
                    self.inner
                        .version
                        .found_previous(&self.inner.config.table.plain());
                }
                // Unmarked, only this authority's own releases would wake it: look again soon.
                failed => {
                    let error = match failed {
                        Ok(Err(e)) => redact_url(&e.to_string()),
                        _ => "no answer in time".to_string(),
                    };
                    tracing::debug!(%error, "could not mark the key waited on; waiting anyway");
                    until = until.min(saturating_add(Instant::now(), UNHEARD_POLL));
                }
            }
        }
        if !*listening.borrow() {
            let poll = Backoff::new(UNHEARD_POLL, UNHEARD_POLL).next_delay();
            until = until.min(saturating_add(now, poll));
        }
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep_until(until) => {}
        }
        Ok(())
    }

    /// Reads the key's row: the fence column is both the holder's fence (while live) and the
    /// last fence issued (release and expiry keep the row), and liveness and the remaining time
    /// are the database's `statement_timestamp()` against `expires_at`, never our clock.
    async fn inspect(&self, key: &LockKey) -> Result<Inspection> {
        let statement = self.inner.statements.inspect.clone();
        let named = self.inner.named();
        let name = key.as_str().to_string();
        let row: Option<(String, i64, bool, i64, Option<Vec<u8>>)> = self
            .inner
            .bounded(
                "inspect",
                saturating_add(Instant::now(), self.inner.timeout()),
                move |c| {
                    let (statement, name) = (statement.clone(), name.clone());
                    Box::pin(async move {
                        sqlx::query_as(statement)
                            .persistent(named)
                            .bind(name)
                            .fetch_optional(c)
                            .await
                    })
                },
            )
            .await?;
        let Some((owner, raw, live, remaining_ms, value)) = row else {
            self.inner.seen.record(key.as_str(), None, false);
            return Ok(Inspection::free(BACKEND, key.clone()));
        };
        self.inner.seen.record(key.as_str(), Some(raw), live);
        let fence = PgFence::from_column(raw, self.inner.capabilities.fence_safety)?
            .to_fence(BACKEND, self.inner.config.client.epoch)?;
        let seen = if live {
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
        let named = self.inner.named();
        let (start, upper) = (prefix.as_str().to_string(), prefix.upper_bound());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let names: Vec<String> = self
            .inner
            .bounded(
                "list_keys",
                saturating_add(Instant::now(), self.inner.timeout()),
                move |c| {
                    let (statement, start, upper) =
                        (statement.clone(), start.clone(), upper.clone());
                    Box::pin(async move {
                        sqlx::query_scalar(statement)
                            .persistent(named)
                            .bind(start)
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
            .filter_map(|name| LockKey::new(name).ok())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_promise_what_the_replication_settings_say() {
        use FenceSafety::{FailoverUnsafe as Unsafe, Linearizable as Lin};
        use FenceSafetyOption::{Auto, FailoverUnsafe, Linearizable};
        for (commit, standbys, option, want) in [
            ("on", "", Auto, (Unsafe, true)),
            ("on", "s1", Auto, (Lin, true)),
            ("remote_apply", "ANY 1 (s1, s2)", Auto, (Lin, true)),
            ("remote_write", "s1", Auto, (Unsafe, true)),
            ("local", "s1", Auto, (Unsafe, true)),
            ("on", "  ", Auto, (Unsafe, true)),
            ("off", "s1", Auto, (Unsafe, false)),
            ("on", "", Linearizable, (Lin, true)),
            ("local", "", Linearizable, (Lin, true)),
            ("off", "", Linearizable, (Unsafe, false)),
            ("on", "s1", FailoverUnsafe, (Unsafe, true)),
        ] {
            assert_eq!(
                declare(commit, standbys, option),
                want,
                "{commit} {standbys:?} {option:?}"
            );
        }
    }
}

//! PostgreSQL's edges, each against a real server started by the harness: huge durations,
//! isolation levels set as a database default, cancelled and timed-out acquisitions, a
//! read-only (demoted) primary, and lanes whose connections were terminated. The listening
//! connection and connecting have test files of their own.
//!
//! Timing bounds are fractions of the TTL each test picks, never absolute guesses.

use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::kit::{self, LeaseTable, LockedRow};
use leasehold_core::{Authority, Error, Instant, LockKey, Released};
use leasehold_postgres::PostgresAuthority;
use sqlx::{PgPool, Postgres, Transaction};

mod common;

use common::{connect, exec, key, start_server, url, OrFail, Result};

/// Leases of `key` that are live by the database's clock.
async fn live_rows(a: &PostgresAuthority, key: &LockKey) -> Result<i64> {
    live_rows_in(a.pool(), key).await
}

/// Leases of `key` that are live by the database's clock, read on `pool`.
async fn live_rows_in(pool: &PgPool, key: &LockKey) -> Result<i64> {
    sqlx::query_scalar(
        "SELECT count(*) FROM leasehold_leases WHERE lock_key = $1 AND expires_at > statement_timestamp()",
    )
    .bind(key.as_str())
    .fetch_one(pool)
    .await
    .or_fail(format!("count the live leases of {key}"))
}

// ---------------------------------------------------------------------------------------------
// `Duration::MAX` and huge durations in the URL.

/// `acquire(.., Duration::MAX)` means "wait as long as it takes", not a panic, and huge
/// `timeout_ms` / `listen_check_ms` are "no limit", not an overflow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_max_waits_forever_instead_of_panicking() -> Result {
    let server = start_server().await?;
    let admin = connect(&url(&server)).await?;
    admin.migrate().await.or_fail("migrate")?;
    let ttl = Duration::from_secs(4);
    let k = key("forever")?;
    for waiter_url in [
        url(&server),
        format!("{}?timeout_ms={}", server.url(), u64::MAX),
        format!(
            "{}?listen_check_ms={}&timeout_ms=1000",
            server.url(),
            u64::MAX
        ),
        // A margin as large as the TTL: grants end at once locally, but nothing overflows.
        format!(
            "{}?safety_margin_ms={}&timeout_ms=1000",
            server.url(),
            u64::MAX
        ),
    ] {
        let holder = admin
            .try_acquire(&k, ttl)
            .await
            .or_fail(format!("{waiter_url}: hold the key"))?
            .or_fail(format!("{waiter_url}: hold the key: it was held"))?;
        let waiter = connect(&waiter_url).await?;
        let wait = {
            let (waiter, k) = (waiter.clone(), k.clone());
            tokio::spawn(async move { waiter.acquire(&k, ttl, Duration::MAX).await })
        };
        tokio::time::sleep(ttl / 8).await;
        assert!(
            !wait.is_finished(),
            "{waiter_url}: returned while the key was held"
        );
        let released_at = Instant::now();
        assert_eq!(
            admin
                .release(&holder)
                .await
                .or_fail(format!("{waiter_url}: release"))?,
            Released::Released
        );
        let got = tokio::time::timeout(ttl / 2, wait)
            .await
            .or_fail(format!(
                "{waiter_url}: no hand-off within TTL/2 of the release"
            ))?
            .or_fail(format!("{waiter_url}: the waiter's task"))?
            .or_fail(format!("{waiter_url}: the waiter"))?;
        assert!(got.fence() > holder.fence());
        assert!(released_at.elapsed() < ttl / 2);
        // The other entry points with the huge timeout too.
        let again = waiter
            .try_acquire(&k, ttl)
            .await
            .or_fail(format!("{waiter_url}: try_acquire"))?;
        assert!(again.is_none(), "{waiter_url}: the key is held by `got`");
        waiter
            .renew(&got, ttl)
            .await
            .or_fail(format!("{waiter_url}: renew"))?;
        assert_eq!(
            waiter
                .release(&got)
                .await
                .or_fail(format!("{waiter_url}: the waiter releases"))?,
            Released::Released
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Repeatable read / serializable as the database's default.

async fn contend(url: &str, k: &LockKey, workers: usize, rounds: usize) -> Result<Vec<u64>> {
    let ttl = Duration::from_secs(2);
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let a = connect(url).await?;
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            let mut fences = Vec::new();
            for _ in 0..rounds {
                // Bursts of try_acquire between the waiting acquisitions, to race on the row.
                for _ in 0..3 {
                    if let Some(g) = a.try_acquire(&k, ttl).await? {
                        fences.push(g.fence().value());
                        let _ = a.release(&g).await?;
                    }
                }
                let g = a.acquire(&k, ttl, ttl * 10).await?;
                fences.push(g.fence().value());
                a.renew(&g, ttl).await?;
                let _ = a.release(&g).await?;
            }
            Ok::<_, Error>(fences)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(
            t.await
                .or_fail("a contender's task")?
                .or_fail("a contender")?,
        );
    }
    Ok(all)
}

/// Under `repeatable read` and `serializable` set with `ALTER DATABASE`, contended acquisitions
/// neither fail with SQLSTATE 40001 nor hand out a fence twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_under_repeatable_read_and_serializable_defaults() -> Result {
    let server = start_server().await?;
    let admin = connect(&url(&server)).await?;
    admin.migrate().await.or_fail("migrate")?;
    for level in ["repeatable read", "serializable"] {
        exec(
            &admin,
            &format!("ALTER DATABASE postgres SET default_transaction_isolation = '{level}'"),
        )
        .await?;
        let probe = connect(&url(&server)).await?;
        let shown: String = sqlx::query_scalar("SHOW default_transaction_isolation")
            .fetch_one(probe.pool())
            .await
            .or_fail("SHOW default_transaction_isolation")?;
        assert_eq!(shown, level);
        let k = key(&format!("isolation-{}", level.replace(' ', "-")))?;
        let (workers, rounds) = (6, 6);
        let mut fences = contend(&url(&server), &k, workers, rounds).await?;
        let n = fences.len();
        assert!(n >= workers * rounds, "{level}: {n} grants");
        fences.sort_unstable();
        fences.dedup();
        assert_eq!(fences.len(), n, "{level}: a fence was handed out twice");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Cancelled and timed-out acquisitions give their lease back; a read-only server is
// an outage, not a permanent error.

/// The lease table, read and locked by an operator through the admin client's pool.
struct Table(PgPool);

/// A lease row an operator's transaction holds locked.
struct Locked(Transaction<'static, Postgres>, String);

#[async_trait]
impl LeaseTable for Table {
    async fn live_rows(&self, key: &LockKey) -> Result<i64> {
        live_rows_in(&self.0, key).await
    }

    async fn lock_row(&self, key: &LockKey) -> Result<Box<dyn LockedRow>> {
        let mut tx = self.0.begin().await.or_fail("the operator's begin")?;
        sqlx::query("SELECT 1 FROM leasehold_leases WHERE lock_key = $1 FOR UPDATE")
            .bind(key.as_str())
            .execute(&mut *tx)
            .await
            .or_fail("the operator locks the row")?;
        Ok(Box::new(Locked(tx, key.as_str().to_string())))
    }
}

#[async_trait]
impl LockedRow for Locked {
    async fn expire_and_commit(self: Box<Self>) -> Result {
        let Locked(mut tx, key) = *self;
        sqlx::query(
            "UPDATE leasehold_leases SET expires_at = statement_timestamp() - interval '1 hour' \
             WHERE lock_key = $1",
        )
        .bind(key)
        .execute(&mut *tx)
        .await
        .or_fail("the operator ends the lease")?;
        tx.commit().await.or_fail("the operator's commit")
    }
}

/// A server, its table migrated, and two clients of it: the admin and the one under test.
async fn clients() -> Result<(impl Sized, String, PostgresAuthority, PostgresAuthority)> {
    let server = start_server().await?;
    let url = url(&server);
    let admin = connect(&url).await?;
    admin.migrate().await.or_fail("migrate")?;
    let a = connect(&url).await?;
    Ok((server, url, admin, a))
}

/// [`kit::cancelled_acquisitions_leave_no_lease_behind`], 400 rounds: the acquire rounds'
/// attempt that wins is the waiter's form (which marks the key), cut at random moments too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_leave_no_lease_behind() -> Result {
    let (_server, url, admin, a) = clients().await?;
    let table = Table(admin.pool().clone());
    kit::cancelled_acquisitions_leave_no_lease_behind(&admin, &a, || connect(&url), &table, 400)
        .await
}

/// [`kit::a_timed_out_acquisition_is_given_back_when_it_lands`]: the row lock is an
/// administrator's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_acquisition_is_given_back_when_it_lands() -> Result {
    let (_server, url, admin, a) = clients().await?;
    let table = Table(admin.pool().clone());
    kit::a_timed_out_acquisition_is_given_back_when_it_lands(&admin, &a, || connect(&url), &table)
        .await
}

/// A server that refuses writes (a demoted primary: SQLSTATE 25006) is `Unavailable` and
/// retryable, like Redis's READONLY; when it takes writes again, the same client works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_unavailable_and_retryable() -> Result {
    let server = start_server().await?;
    let admin = connect(&url(&server)).await?;
    admin.migrate().await.or_fail("migrate")?;
    let a = connect(&url(&server)).await?;
    let ttl = Duration::from_secs(5);
    let (k, other) = (key("read-only")?, key("read-only-2")?);
    let held = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("hold the key")?
        .or_fail("hold the key: a fresh key was held")?;
    exec(
        &admin,
        "ALTER DATABASE postgres SET default_transaction_read_only = on",
    )
    .await?;
    // Existing sessions keep their setting; a new client sees the read-only server.
    let ro = connect(&url(&server)).await?;
    let refused = |what: &str, result: leasehold_core::Result<()>| match result {
        Ok(()) => Err(format!("{what} succeeded on a read-only server")),
        Err(e) => Ok(e),
    };
    let err = refused("try_acquire", ro.try_acquire(&other, ttl).await.map(|_| ()))?;
    assert!(
        matches!(err, Error::Unavailable { .. }) && err.is_retryable(),
        "{err:?}"
    );
    let err = refused("acquire", ro.acquire(&other, ttl, ttl).await.map(|_| ()))?;
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let err = refused("renew", ro.renew(&held, ttl).await.map(|_| ()))?;
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let err = refused("release", ro.release(&held).await.map(|_| ()))?;
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    exec(
        &admin,
        "ALTER DATABASE postgres RESET default_transaction_read_only",
    )
    .await?;
    // The writable server is back (as a new primary would be): the connections that met the
    // read-only one were closed, so the same client reaches it again.
    let started = Instant::now();
    let g = loop {
        match ro.try_acquire(&other, ttl).await {
            Ok(g) => break g.or_fail("nobody else holds it")?,
            Err(e @ Error::Unavailable { .. }) => {
                assert!(
                    started.elapsed() < ttl,
                    "still read-only after {:?}: {e}",
                    started.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(format!("{e:?}").into()),
        }
    };
    assert_eq!(
        ro.release(&g)
            .await
            .or_fail("release on the writable server")?,
        Released::Released
    );
    assert_eq!(
        a.release(&held).await.or_fail("release the first lease")?,
        Released::Released
    );
    Ok(())
}

/// Lease statements run on lanes (kept connections) instead of sqlx's pool, which
/// pinged every connection it took back. What the ping protected against still holds: with every
/// lane's server process terminated (an operator, a failover), a lane used within the last second
/// fails its next statement with a retryable error and connects afresh, so the call after it
/// succeeds; a lane idle for longer is pinged first and replaced before the statement, so the
/// call succeeds at once. Nothing is left held by mistake either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_recover_from_terminated_connections() -> Result {
    let server = start_server().await?;
    let url = url(&server);
    let a = connect(&format!("{url}&pool_size=2")).await?;
    a.migrate().await.or_fail("migrate")?;
    let admin = connect(&url).await?;
    let ttl = Duration::from_secs(5);
    let terminate = || async {
        let killed: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() \
               AND backend_type = 'client backend' AND query NOT ILIKE '%LISTEN%'",
        )
        .fetch_one(admin.pool())
        .await
        .or_fail("terminate the lanes' server processes")?;
        Ok::<_, common::Failure>(killed)
    };
    let (hot, idle) = (key("lane/hot")?, key("lane/idle")?);
    // A lane in use a moment ago.
    let g = a
        .try_acquire(&hot, ttl)
        .await
        .or_fail("acquire on a hot lane")?
        .or_fail("acquire on a hot lane: a fresh key was held")?;
    assert!(terminate().await? >= 1);
    let mut failed = 0;
    let released = loop {
        match a.release(&g).await {
            Ok(r) => break r,
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                failed += 1;
                assert!(failed <= 2, "the lane did not reconnect: {e}");
            }
        }
    };
    assert_eq!(released, Released::Released);
    assert_eq!(live_rows(&admin, &hot).await?, 0);
    // Lanes idle past the ping threshold are replaced before use.
    let g = a
        .try_acquire(&idle, ttl)
        .await
        .or_fail("acquire on an idle lane")?
        .or_fail("acquire on an idle lane: a fresh key was held")?;
    assert!(terminate().await? >= 1);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        a.release(&g).await.or_fail("release on a replaced lane")?,
        Released::Released
    );
    let again = a
        .try_acquire(&idle, ttl)
        .await
        .or_fail("acquire after the release")?;
    assert!(again.is_some(), "the key was left held");
    Ok(())
}

//! What an application's transactions through `SqliteAuthority::pool()` do to the leases of the
//! same file, against a real file: its connections are its own (holding all of them stalls no
//! lease request), but the file has one write lock, so a write transaction delays every lease
//! write on the file by as long as it holds the lock. Measured here, with the bounds the docs
//! state: a renewal waits out the transaction (up to the busy timeout, then it fails with a
//! retryable error that is not `Unavailable`: the file answered, busy),
//! a `Lease` rides out a transaction that ends before its deadline (suspended meanwhile if it
//! outlasts the busy timeout) and is lost to one that holds the lock past its deadline.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::time::saturating_add;
use leasehold_core::{Authority, Instant, Lease, LeaseOptions, LeaseState};
use leasehold_sqlite::SqliteAuthority;
use sqlx::Connection;

mod common;

use common::{connect, key};

fn url(path: &Path, query: &str) -> String {
    format!("sqlite://{}?{query}", path.display())
}

/// An application's write transaction through `pool()`, holding the file's write lock until it
/// is committed.
struct AppWrite {
    conn: sqlx::pool::PoolConnection<sqlx::Sqlite>,
}

impl AppWrite {
    async fn begin(a: &SqliteAuthority) -> Result<Self, String> {
        let mut conn = a
            .pool()
            .acquire()
            .await
            .map_err(|e| format!("the application's connection: {e}"))?;
        sqlx::query("CREATE TABLE IF NOT EXISTS app_rows (n INTEGER)")
            .execute(&mut *conn)
            .await
            .map_err(|e| format!("the application's table: {e}"))?;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .map_err(|e| format!("the application's BEGIN IMMEDIATE: {e}"))?;
        sqlx::query("INSERT INTO app_rows (n) VALUES (1)")
            .execute(&mut *conn)
            .await
            .map_err(|e| format!("the application's write: {e}"))?;
        Ok(AppWrite { conn })
    }

    /// Commits; returns when the commit was sent (the lock is held until then, and nobody
    /// else's write can land before it).
    async fn commit(mut self) -> Result<Instant, String> {
        let sent = Instant::now();
        sqlx::query("COMMIT")
            .execute(&mut *self.conn)
            .await
            .map_err(|e| format!("the application's COMMIT: {e}"))?;
        Ok(sent)
    }
}

/// A renewal sent right after an application's write transaction took the write lock waits
/// until that transaction commits, and lands then (plus at most one sleep of SQLite's busy
/// handler, which polls the lock at intervals up to 100 ms); one held past the busy timeout
/// (three quarters of the request timeout) makes the renewal fail, retryable but not
/// `Unavailable`, after the busy timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_transaction_through_pool_delays_renewals_by_its_length() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let timeout = Duration::from_millis(2000);
    let busy_timeout = timeout / 4 * 3;
    let a = connect(&url(
        &dir.path().join("locks.db"),
        &format!("timeout_ms={}", timeout.as_millis()),
    ))
    .await?;
    let a = Arc::new(a);
    let k = key("write-lock/renew")?;
    let ttl = Duration::from_secs(60);
    let grant = a
        .try_acquire(&k, ttl)
        .await
        .map_err(|e| format!("try_acquire: {e}"))?
        .ok_or("a fresh key was held")?;
    let mut measured = Vec::new();
    for hold in [timeout / 20, timeout / 4, timeout / 2] {
        let app = AppWrite::begin(&a).await?;
        let sent = Instant::now();
        let renewal = {
            let (a, grant) = (a.clone(), grant.clone());
            tokio::spawn(async move {
                let r = a.renew(&grant, ttl).await;
                (r, Instant::now())
            })
        };
        tokio::time::sleep(hold).await;
        let committed = app.commit().await?;
        let (renewed, landed) = renewal.await.map_err(|e| format!("join: {e}"))?;
        renewed.map_err(|e| format!("a renewal behind a {hold:?} transaction: {e}"))?;
        if landed < committed {
            return Err(format!(
                "a renewal landed while the application held the write lock ({hold:?})"
            ));
        }
        measured.push((hold, landed - sent, landed - committed));
    }
    for (hold, waited, after_commit) in &measured {
        println!(
            "application transaction held the write lock {hold:?}: the renewal waited {waited:?}, landing {after_commit:?} after the commit"
        );
    }
    // Past the busy timeout: the renewal gives up, retryable, and changed nothing.
    let app = AppWrite::begin(&a).await?;
    let sent = Instant::now();
    let err = a
        .renew(&grant, ttl)
        .await
        .err()
        .ok_or("a renewal landed while the application held the write lock")?;
    let waited = sent.elapsed();
    app.commit().await?;
    println!(
        "held past the busy timeout ({busy_timeout:?}): the renewal failed after {waited:?}: {err}"
    );
    if !err.is_retryable() || leasehold_core::is_unavailable(&err) || waited < busy_timeout {
        return Err(format!(
            "a renewal behind a transaction longer than the busy timeout: {err:?} after {waited:?}"
        ));
    }
    a.renew(&grant, ttl)
        .await
        .map_err(|e| format!("a renewal after the commit: {e}"))?;
    Ok(())
}

/// A `Lease` (TTL 3 s, renewing every second, busy timeout 300 ms) whose renewal falls into an
/// application transaction of 2 s is suspended once the renewal gives up, and held again with
/// the same fence when a retry lands after the commit, before its deadline. A transaction that
/// keeps the write lock past the lease's deadline loses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_rides_out_a_transaction_that_ends_before_its_deadline() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let a = Arc::new(connect(&url(&dir.path().join("locks.db"), "timeout_ms=300")).await?);
    let ttl = Duration::from_secs(3);
    let k = key("write-lock/lease")?;
    let lease = Lease::try_acquire(a.clone(), &k, ttl, LeaseOptions::default())
        .await
        .map_err(|e| format!("lease: {e}"))?
        .ok_or("a fresh key was held")?;
    let fence = lease.fence();
    let mut watch = lease.watch();
    // From now until two thirds of the TTL: the renewal due at a third gives up after the busy
    // timeout, its retries wait, and one lands after the commit, a third of the TTL (less the
    // safety margin) before the deadline.
    let app = AppWrite::begin(&a).await?;
    let began = Instant::now();
    let seen = tokio::time::timeout(ttl * 2 / 3, watch.changed())
        .await
        .map_err(|_| "the lease stayed held while its renewal could not get the write lock")?;
    if !matches!(seen, LeaseState::Suspended) {
        return Err(format!("while the write lock was held: {seen:?}"));
    }
    let suspended_after = began.elapsed();
    tokio::time::sleep_until(saturating_add(began, ttl * 2 / 3)).await;
    let committed = app.commit().await?;
    let seen = tokio::time::timeout(ttl / 3, watch.changed())
        .await
        .map_err(|_| "the lease was not held again within a third of the TTL of the commit")?;
    if !matches!(seen, LeaseState::Held) || lease.fence() != fence {
        return Err(format!(
            "after the commit: {seen:?}, fence {} (was {fence})",
            lease.fence()
        ));
    }
    println!(
        "suspended {suspended_after:?} into a 2 s transaction, held again {:?} after its commit",
        committed.elapsed()
    );
    // Held past the deadline: lost.
    let app = AppWrite::begin(&a).await?;
    let began = Instant::now();
    let lost = tokio::time::timeout(ttl * 2, lease.lost())
        .await
        .map_err(|_| "the lease outlived a write lock held for two TTLs")?;
    let after = began.elapsed();
    app.commit().await?;
    println!("lost {after:?} into a transaction that held the write lock: {lost}");
    if after < ttl / 3 {
        return Err(format!("lost only {after:?} into the transaction: {lost}"));
    }
    Ok(())
}

/// An application that holds every connection of `pool()` (here in open read transactions)
/// leaves the leases' own connections free: a renewal, an acquisition and an inspection all
/// answer at once, well within the request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_holding_every_pool_connection_stalls_no_lease_request() -> Result<(), String>
{
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let timeout = Duration::from_millis(1000);
    let a = connect(&url(
        &dir.path().join("locks.db"),
        &format!("pool_size=2&timeout_ms={}", timeout.as_millis()),
    ))
    .await?;
    let ttl = Duration::from_secs(30);
    let held = a
        .try_acquire(&key("pool/held")?, ttl)
        .await
        .map_err(|e| format!("try_acquire: {e}"))?
        .ok_or("a fresh key was held")?;
    let mut app = Vec::new();
    for _ in 0..2 {
        let mut conn = a
            .pool()
            .acquire()
            .await
            .map_err(|e| format!("the application's connection: {e}"))?;
        let mut tx = conn
            .begin()
            .await
            .map_err(|e| format!("the application's BEGIN: {e}"))?;
        let _: i64 = sqlx::query_scalar("SELECT count(*) FROM leasehold_leases")
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| format!("the application's read: {e}"))?;
        tx.commit()
            .await
            .map_err(|e| format!("the application's commit: {e}"))?;
        app.push(conn);
    }
    let started = Instant::now();
    a.renew(&held, ttl)
        .await
        .map_err(|e| format!("renew while the application holds every pool() connection: {e}"))?;
    let other = a
        .try_acquire(&key("pool/other")?, ttl)
        .await
        .map_err(|e| format!("try_acquire while the application holds pool(): {e}"))?
        .ok_or("a fresh key was held")?;
    let seen = a
        .inspect(held.key())
        .await
        .map_err(|e| format!("inspect while the application holds pool(): {e}"))?;
    let took = started.elapsed();
    if !seen.held || took > timeout / 2 {
        return Err(format!(
            "lease requests took {took:?} while the application held pool(): {seen:?}"
        ));
    }
    drop(app);
    for g in [held, other] {
        let _ = a.release(&g).await.map_err(|e| format!("release: {e}"))?;
    }
    Ok(())
}
